"""Audio: spectrograms in JAX, a multi-stem synthesiser with ground truth, metrics, a timbre classifier, a
text-to-spectrogram diffusion model, and multitrack data.

* `spectral`: STFT / inverse STFT, mel filterbanks, log features, ideal ratio masks, Griffin-Lim, WAV writing.
* `features`: `LogMel`, the log-mel features the models run on (and the way back to a waveform).
* `metrics`: log-spectral distance, SDR / SI-SDR, BSS-Eval SDR, Frechet audio distance on judge embeddings.
* `synth`: oscillator instruments, notes, ADSR, mixtures, re-timbred stems (the ground-truth edit).
* `timbre`: harmonic features and the logistic-regression timbre classifier.
* `model`: `TextToSpec`, the DiT core over a spectrogram with cross-attention to instrument tokens and an
  attention-controller hook (`jaxlab.diffusion.controllers`); sampled and inverted by `jaxlab.diffusion.ddpm`.
* `multitrack`: MUSDB18-HQ / MoisesDB folders of stem WAVs, per-host slices, clips, host-side features.
* `separation`: stem priors for attention calibration: an imperfect separator's version of the oracle mask, and
  Demucs (the optional `demucs` extra) in a subprocess.
"""
