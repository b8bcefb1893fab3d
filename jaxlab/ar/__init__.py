"""Autoregressive image generation on continuous tokens: SAR's two-stream self-token transformer.

* `masks`: the grouped two-stream attention masks (SAR, LPD, MAR, causal, full) and group schedules.
* `model`: `SelfTokenTransformer` (masked forward, KV-cached grouped decoding, EMA teacher for JEPA).
* `head`: the per-token flow-matching MLP head, its loss and sampler with CFG.
* `generate`: `SAR` and the next-token regression baseline, losses and grouped samplers.
* `tokenizers`: patch and PCA tokens of small images, precomputed latents from a path.
* `kl_vae`: the KL-16 VAE decoder of MAR (LDM AutoencoderKL) in NNX, loaded from a local checkpoint.
* `speed`: `python -m jaxlab.ar.speed`, sampling images/s against tokens per step.
"""
