"""Vision-language model: a vision tower + a projector + a `jaxlab.lm.Transformer` decoder, with visual tokens
interleaved with text tokens in the decoder's input (LLaVA's recipe, Liu et al. 2023; Qwen2-VL's layout).

Visual tokens are addressed by token id, so everything that moves token ids around (the KV-cache sampler,
multi-turn rollouts with a memory window, SFT rows, loss masks) works unchanged:

    rows carry `images` (batch, num_images, H, W, C) (channels last, normalised)
    bank  = projector(vision(images))                    (batch, num_images * tokens_per_image, hidden)
    id >= image_token_base  ->  embedding bank[row, id - image_token_base]
    id <  image_token_base  ->  the decoder's token embedding

so token `image_token_base + i * tokens_per_image + k` is the k-th visual token of the row's image i. A text
environment inserts an image by appending its ids (`VLMConfig.image_tokens(i)`); dropping them forgets it.
The ids are never predicted (the decoder's head covers the text vocabulary only); their positions carry loss
mask 0, and the visual tokens' embeddings get gradients through the bank (tower and projector train).

How: the decoder's embedding module is a `VisualEmbed`, which holds the decoder's own embedding table (same
parameter, same path `decoder/embed/embedding`, so Hugging Face loading and tied heads work) and, when bound,
a bank (`VisualBank` variable). `VisionLM.__call__(tokens, ..., images=...)` computes the bank, binds it for
that forward and unbinds it after (so the module's state, and its checkpoints, never hold a bank);
`VisionLM.bind(images=...)` computes it once and returns a copy of the decoder with it bound: a plain
`Transformer` that `jaxlab.lm.generate` samples from unchanged (prefill and every decoding step read the bank).

The vision tower is `jaxlab.encoders.vision_tower.VisionTower`: a Hugging Face ViT / SigLIP tower loaded from
a local checkpoint (full scale), or the same architecture initialised from scratch (a small ViT of our own for
tiny runs). The projector is LLaVA-1.5's two-layer GELU MLP (vision width -> hidden -> hidden).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.encoders.vision_tower import VisionTower, VisionTowerConfig
from jaxlab.errors import ConfigError
from jaxlab.lm.model import KVCache, Transformer, TransformerConfig
from jaxlab.nn import layers


@dataclasses.dataclass(frozen=True)
class VLMConfig:
  """A vision-language model.

  Attributes:
    decoder: the text decoder.
    vision: the vision tower.
    image_token_base: the first visual token id (>= the text vocabulary; ids at or above it are visual).
    max_images: images per row (the bank's size).
    drop_cls: drop the tower's CLS token (ViT) from the visual tokens.
    remat_vision: rematerialise the tower's layers in the backward pass (`vision_tower.forward(remat=True)`):
      a row's frames then keep only each layer's input alive, not its attention maps and MLP activations.
  """
  decoder: TransformerConfig
  vision: VisionTowerConfig
  image_token_base: int
  max_images: int
  drop_cls: bool = True
  remat_vision: bool = False

  def __post_init__(self):
    if self.image_token_base < self.decoder.vocab_size or self.max_images < 1:
      raise ConfigError(f"VLMConfig: image_token_base={self.image_token_base} must be >= the decoder's vocab_size="
                        f"{self.decoder.vocab_size} (visual ids never collide with text ids) and max_images="
                        f"{self.max_images} >= 1")

  @property
  def tokens_per_image(self) -> int:
    """Visual tokens per image (the tower's tokens, CLS dropped with `drop_cls`)."""
    cls = self.vision.num_tokens - self.vision.num_patches
    return self.vision.num_tokens - (cls if self.drop_cls else 0)

  @property
  def max_position(self) -> int:
    return self.decoder.max_position

  @property
  def num_ids(self) -> int:
    """Text + visual token ids (the id space the model reads)."""
    return self.image_token_base + self.max_images * self.tokens_per_image

  def image_tokens(self, image: int) -> list[int]:
    """The token ids of image `image` of a row."""
    if not 0 <= image < self.max_images:
      raise ValueError(f"image index {image} outside [0, {self.max_images})")
    start = self.image_token_base + image * self.tokens_per_image
    return list(range(start, start + self.tokens_per_image))


class Projector(nnx.Module):
  """LLaVA-1.5's projector: Linear(vision -> hidden), GELU, Linear(hidden -> the decoder's embedding width)."""

  def __init__(self, vision_dim: int, hidden: int, out: int, init_std: float, *, rngs: nnx.Rngs):
    kw = dict(kernel_init=layers.normal(init_std), use_bias=True, rngs=rngs)
    with nnx.use_eager_sharding(False):      # logical names are mapped to a mesh by jaxlab.state
      self.fc1 = layers.dense(vision_dim, hidden, names=(None, "mlp"), **kw)
      self.fc2 = layers.dense(hidden, out, names=("mlp", "embed"), **kw)

  def __call__(self, x):
    return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class VisualBank(nnx.Variable):
  """The projected visual tokens bound to a decoder's `VisualEmbed` (not a parameter; empty when unbound)."""


class VisualEmbed(nnx.Module):
  """The decoder's token embedding, reading ids >= `base` from a bound bank of visual tokens.

  Args:
    embed: the decoder's `nnx.Embed` (its table is kept as the same parameter).
    base: the first visual token id.
  """

  def __init__(self, embed: nnx.Embed, base: int):
    self.embedding = embed.embedding
    self.num_embeddings, self.features = embed.num_embeddings, embed.features
    self.dtype = embed.dtype or embed.param_dtype
    self.base = base
    self.bank: VisualBank | None = nnx.data(None)

  def __call__(self, ids: jax.Array) -> jax.Array:
    ids = jnp.asarray(ids)
    visual = ids >= self.base
    out = jnp.take(self.embedding[...], jnp.where(visual, 0, ids), axis=0).astype(self.dtype)
    if self.bank is None:
      return out
    bank = self.bank[...]
    if bank.shape[0] != ids.shape[0]:
      raise ValueError(f"VisualEmbed: the bound bank has {bank.shape[0]} rows for a batch of {ids.shape[0]}")
    slot = jnp.clip(ids - self.base, 0, bank.shape[1] - 1)
    vis = jnp.take_along_axis(bank, slot.reshape(slot.shape[0], -1, 1), axis=1).reshape(ids.shape + (-1,))
    return jnp.where(visual[..., None], vis.astype(self.dtype), out)


class VisionLM(nnx.Module):
  """Vision tower + projector + decoder (see the module docstring).

  Args:
    config: the VLM.
    rngs: initialisation randomness.
    vision: an already built tower (e.g. `VisionTower.from_pretrained(path)`); default: a fresh one.
    decoder: an already built decoder (e.g. `jaxlab.lm.from_pretrained`); default: a fresh one. Its embedding
      becomes a `VisualEmbed` over the same table.
  """

  def __init__(self, config: VLMConfig, *, rngs: nnx.Rngs, vision: VisionTower | None = None,
               decoder: Transformer | None = None):
    self.config = config
    self.vision = vision if vision is not None else VisionTower(config.vision, rngs=rngs)
    d = config.decoder
    self.projector = Projector(config.vision.hidden_size, d.hidden, d.word_embed_proj_dim, d.init_std, rngs=rngs)
    self.decoder = decoder if decoder is not None else Transformer(config.decoder, rngs=rngs)
    if not isinstance(self.decoder.embed, VisualEmbed):
      self.decoder.embed = VisualEmbed(self.decoder.embed, config.image_token_base)

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    return self.decoder.init_cache(batch, max_len, dtype)

  def visual_bank(self, images: jax.Array) -> jax.Array:
    """(batch, num_images, H, W, C) -> (batch, num_images * tokens_per_image, hidden) projected visual tokens."""
    c = self.config
    images = jnp.asarray(images, jnp.float32)
    if images.ndim != 5 or images.shape[1] != c.max_images:
      raise ValueError(f"VisionLM: images must be (batch, {c.max_images}, H, W, C), got shape {images.shape}")
    b, n = images.shape[:2]
    feats = self.vision(images.reshape((b * n,) + images.shape[2:]), remat=c.remat_vision)
    if c.drop_cls:
      feats = feats[:, feats.shape[1] - c.tokens_per_image:]
    return self.projector(feats).reshape(b, n * c.tokens_per_image, -1).astype(jnp.float32)

  def bind(self, images: jax.Array) -> Transformer:
    """A copy of the decoder with these rows' visual tokens bound (computed once): a `Transformer` to sample
    from with `jaxlab.lm.generate` (batch = len(images)). It shares this model's parameter arrays; this model
    is left as it was."""
    bank = self.visual_bank(images)
    bound = nnx.merge(*nnx.split(self.decoder))
    bound.embed.bank = nnx.data(VisualBank(bank))
    return bound

  def __call__(self, tokens_bl: jax.Array, positions_bl: jax.Array | None = None, *,
               segment_ids_bl: jax.Array | None = None, cache: KVCache | None = None,
               cache_index: jax.Array | int | None = None, images: jax.Array | None = None):
    """Logits (and the updated cache) as `Transformer.__call__`, with visual tokens read from `images`
    (batch, max_images, H, W, C); without images, the decoder reads text only (visual ids then embed as id 0:
    pass images, or sample from `bind(images)`)."""
    kw = dict(segment_ids_bl=segment_ids_bl, cache=cache, cache_index=cache_index)
    if images is None:
      return self.decoder(tokens_bl, positions_bl, **kw)
    embed = self.decoder.embed
    embed.bank = nnx.data(VisualBank(self.visual_bank(images)))
    try:
      return self.decoder(tokens_bl, positions_bl, **kw)
    finally:        # the module's state keeps its structure (no bank) for the caller's split
      embed.bank = nnx.data(None)
