"""Frozen latent encoders for latent-conditioned diffusion (Latent Forcing, arXiv 2602.11401), one interface.

An encoder maps images (B, H, W, C) in [-1, 1] to a latent grid (B, h, w, c) (`encode`); `LatentNormalizer`
standardises each latent channel with dataset statistics and rescales the result to the pixels' RMS, as the
official code does with its RAE statistics and the 0.485 factor (the RMS of ImageNet pixels in [-1, 1] is
about 0.485 per channel, so a standardised latent times 0.485 has the pixels' norm).

* `PixelDownsample`: area-pooled pixels, space-to-depth onto the token grid (the paper's non-semantic
  control, its "64 x 64 pixels" latent: 256 -> 64 area downsample, 4 x 4 patches -> 48 channels on 16 x 16).
* `TinySemanticEncoder`: a two-conv classifier trained in-process on the training images; its stride-2
  feature map is the latent (a stand-in for DINOv2 at digits scale).
* `Dinov2Encoder`: DINOv2-B with registers from a local Hugging Face checkpoint (the paper's latent), patch
  tokens after the final LayerNorm without affine, CLS and registers dropped (`jaxlab.encoders.dinov2`).
* `PrecomputedLatents`: latents read from a local .npz (e.g. DINOv2 features computed once offline), by row.
"""

from jaxlab.encoders.base import (Encoder, LatentNormalizer, PrecomputedLatents, encode_batched,  # noqa: F401
                                  match_pixel_norm)
from jaxlab.encoders.dinov2 import Dinov2Encoder  # noqa: F401
from jaxlab.encoders.pixel import PixelDownsample  # noqa: F401
from jaxlab.encoders.semantic import TinySemanticEncoder, train_semantic_encoder  # noqa: F401
