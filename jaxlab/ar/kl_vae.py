"""The KL-regularised autoencoder decoder of MAR (KL-16), ported to Flax NNX: 16x16x16 latents -> 256x256x3 images.

MAR (Li, Tian, Li, Deng, He 2024, "Autoregressive Image Generation without Vector Quantization",
arXiv:2406.11838) models ImageNet 256 in the latent space of a KL-16 autoencoder whose architecture is the
Latent Diffusion `AutoencoderKL` (Rombach et al. 2022, https://github.com/CompVis/latent-diffusion). The
reference code is https://github.com/LTH14/mar, `models/vae.py`; its checkpoint is `kl16.ckpt`. Only the
decoding path is ported here: `post_quant_conv` (1x1) and `Decoder`.

Architecture (torch names in brackets; they are the checkpoint's keys):

* conv_in 3x3 (z_channels -> ch * ch_mult[-1]);
* mid: ResnetBlock [block_1], single-head AttnBlock [attn_1], ResnetBlock [block_2];
* up levels i = L-1 .. 0 [up.i]: num_res_blocks + 1 ResnetBlocks [block.j] to ch * ch_mult[i] channels, each
  followed by an AttnBlock [attn.j] when the level's resolution is in `attn_resolutions`; every level but 0
  ends with nearest-neighbour x2 upsampling and a 3x3 conv [upsample.conv];
* norm_out (GroupNorm), swish, conv_out 3x3 -> out_ch.

ResnetBlock: norm1, swish, conv1 3x3, norm2, swish, (dropout), conv2 3x3, plus the input (through a 1x1
`nin_shortcut` when the channel count changes). AttnBlock: norm, 1x1 convs q, k, v, softmax over the spatial
positions of q.k * C^-0.5, 1x1 `proj_out`, plus the input. GroupNorm: `norm_groups` groups (32), eps 1e-6,
affine, computed here in float32 with torch's two-pass (biased) variance. Swish is x * sigmoid(x).

Details checked against the official `models/vae.py` (commit e0cccf8) and `engine_mar.py` / `main_mar.py`:

* MAR builds `AutoencoderKL(embed_dim=16, ch_mult=(1, 1, 2, 2, 4))`: ch 128, num_res_blocks 2, z_channels =
  embed_dim = 16, resolution 256, dropout 0.0 (so the dropout of the ResnetBlocks is the identity and is not
  modelled here), no timestep embedding (`temb_ch = 0`, so no `temb_proj`), `resamp_with_conv=True`.
* `attn_resolutions`: the official `Encoder` defaults to (16,), but `Decoder` defaults to () and
  `AutoencoderKL` passes neither, so MAR's KL-16 DECODER HAS NO ATTENTION IN ITS UP LEVELS: its only
  AttnBlock is `mid.attn_1`. `KL16` therefore has attn_resolutions=() (LDM's own kl-f16 config uses [16]).
  `load_decoder(strict=True)` rejects decoder keys the config does not use (e.g. `decoder.up.4.attn.0.*`),
  as a check that the config matches; MAR itself loads with `strict=False` and would drop them silently.
* `post_quant_conv` is Conv2d(embed_dim, embed_dim, 1) in MAR (LDM: embed_dim -> z_channels; equal here).
* Latent scale: MAR trains on `posterior.sample() * 0.2325` (`engine_mar.train_one_epoch`, "normalize the std
  of latent to be 1") and decodes generated tokens with `vae.decode(sampled_tokens / 0.2325)`
  (`engine_mar.evaluate`). `KLDecoder.__call__` takes the RAW latent (the decode's input, after the division);
  `MAR_LATENT_SCALE` is the constant, and `KLDecoder.decode_normalized` divides by it first.
* The decode returns images in roughly [-1, 1] (no clamp in the model); MAR maps them with (x + 1) / 2 and
  clips to [0, 1] when saving.

Layout: latents and images are NHWC here (torch uses NCHW); conv kernels are (kh, kw, in, out) here, (out, in,
kh, kw) in torch. Nothing is downloaded: `load_decoder` reads a local `.safetensors` file, or a torch pickle
(`.ckpt` / `.pt` / `.pth`) when torch is installed.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.errors import ConfigError, DataError, MissingDependencyError, require

MAR_LATENT_SCALE = 0.2325     # MAR multiplies the KL-16 latents by this for training; decode divides by it
_TORCH_SUFFIXES = (".ckpt", ".pt", ".pth")


# ------------------------------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class KLConfig:
  """Decoder hyper-parameters, named as in the LDM / MAR `Decoder` (see the module docstring).

  Attributes:
    ch: base channel count.
    ch_mult: channel multiplier per level, from the full resolution (level 0) to the latent one (level L-1).
    num_res_blocks: the decoder uses num_res_blocks + 1 ResnetBlocks per up level.
    attn_resolutions: resolutions (image side) whose up level has an AttnBlock after each ResnetBlock.
    z_channels: channels into the decoder's conv_in (post_quant_conv's output).
    embed_dim: channels of the latent (post_quant_conv's input).
    out_ch: image channels.
    resolution: image side; the latent side is resolution // 2**(L-1).
    norm_groups: GroupNorm groups (must divide every channel count).
    norm_eps: GroupNorm epsilon.
    dtype: compute dtype of the convolutions and attention matmuls (norms and softmax run in float32).
  """
  ch: int = 128
  ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
  num_res_blocks: int = 2
  attn_resolutions: tuple[int, ...] = ()
  z_channels: int = 16
  embed_dim: int = 16
  out_ch: int = 3
  resolution: int = 256
  norm_groups: int = 32
  norm_eps: float = 1e-6
  dtype: str = "float32"

  def __post_init__(self):
    object.__setattr__(self, "ch_mult", tuple(int(m) for m in self.ch_mult))
    object.__setattr__(self, "attn_resolutions", tuple(int(r) for r in self.attn_resolutions))
    for name in ("ch", "z_channels", "embed_dim", "out_ch", "resolution", "norm_groups"):
      if int(getattr(self, name)) < 1:
        raise ConfigError(f"KLConfig: {name}={getattr(self, name)} must be a positive integer")
    if self.num_res_blocks < 0:
      raise ConfigError(f"KLConfig: num_res_blocks={self.num_res_blocks} must be >= 0")
    if not self.ch_mult or min(self.ch_mult) < 1:
      raise ConfigError(f"KLConfig: ch_mult={self.ch_mult} must be a non-empty tuple of positive integers")
    factor = 2 ** (len(self.ch_mult) - 1)
    if self.resolution % factor:
      raise ConfigError(f"KLConfig: resolution={self.resolution} must be divisible by 2**(len(ch_mult)-1)={factor}")
    for c in sorted({self.ch * m for m in self.ch_mult}):
      if c % self.norm_groups:
        raise ConfigError(f"KLConfig: norm_groups={self.norm_groups} does not divide the channel count {c} "
                          f"(ch={self.ch} x ch_mult={self.ch_mult})")
    bad = [r for r in self.attn_resolutions if r not in self.level_resolutions]
    if bad:
      raise ConfigError(f"KLConfig: attn_resolutions {bad} are not decoder resolutions {self.level_resolutions}")
    if self.norm_eps <= 0:
      raise ConfigError(f"KLConfig: norm_eps={self.norm_eps} must be > 0")
    try:
      jnp.dtype(self.dtype)
    except TypeError as e:
      raise ConfigError(f"KLConfig: dtype={self.dtype!r} is not a jax dtype name (e.g. 'float32')") from e

  @property
  def latent_size(self) -> int:
    """Side of the latent grid (16 for KL-16 at 256)."""
    return self.resolution // 2 ** (len(self.ch_mult) - 1)

  @property
  def level_resolutions(self) -> tuple[int, ...]:
    """Resolution of each up level i (index i = level), level 0 being the full image."""
    return tuple(self.resolution // 2 ** i for i in range(len(self.ch_mult)))


KL16 = KLConfig()   # MAR's KL-16: AutoencoderKL(embed_dim=16, ch_mult=(1, 1, 2, 2, 4)); decoder without up attention


# ------------------------------------------------------------------------------------------------ modules


def _swish(x):
  return x * jax.nn.sigmoid(x)


def _conv(cin: int, cout: int, k: int, c: KLConfig, rngs: nnx.Rngs) -> nnx.Conv:
  """A stride-1 'same' conv with torch's zero padding (k // 2 on each side)."""
  p = k // 2
  return nnx.Conv(cin, cout, (k, k), padding=((p, p), (p, p)), dtype=jnp.dtype(c.dtype), rngs=rngs)


class GroupNorm(nnx.Module):
  """torch.nn.GroupNorm on NHWC input, in float32: per (sample, group) mean and biased variance over H, W and the
  group's channels; `weight` / `bias` (torch's names) per channel. Returns the input's dtype."""

  def __init__(self, channels: int, groups: int, eps: float):
    self.groups, self.eps = groups, eps
    self.weight = nnx.Param(jnp.ones((channels,), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((channels,), jnp.float32))

  def __call__(self, x):
    b, h, w, ch = x.shape
    g = x.astype(jnp.float32).reshape(b, h, w, self.groups, ch // self.groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = jnp.square(g - mean).mean(axis=(1, 2, 4), keepdims=True)
    y = ((g - mean) * jax.lax.rsqrt(var + self.eps)).reshape(b, h, w, ch)
    return (y * self.weight[...] + self.bias[...]).astype(x.dtype)


class ResnetBlock(nnx.Module):
  """norm1, swish, conv1 3x3, norm2, swish, conv2 3x3, plus the (1x1-projected when cin != cout) input."""

  def __init__(self, cin: int, cout: int, c: KLConfig, rngs: nnx.Rngs):
    self.norm1 = GroupNorm(cin, c.norm_groups, c.norm_eps)
    self.conv1 = _conv(cin, cout, 3, c, rngs)
    self.norm2 = GroupNorm(cout, c.norm_groups, c.norm_eps)
    self.conv2 = _conv(cout, cout, 3, c, rngs)
    self.nin_shortcut = _conv(cin, cout, 1, c, rngs) if cin != cout else None

  def __call__(self, x):
    h = self.conv1(_swish(self.norm1(x)))
    h = self.conv2(_swish(self.norm2(h)))
    skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
    return skip + h


class AttnBlock(nnx.Module):
  """Single-head self-attention over the H*W positions with 1x1-conv q, k, v, proj_out, plus the input."""

  def __init__(self, ch: int, c: KLConfig, rngs: nnx.Rngs):
    self.norm = GroupNorm(ch, c.norm_groups, c.norm_eps)
    self.q = _conv(ch, ch, 1, c, rngs)
    self.k = _conv(ch, ch, 1, c, rngs)
    self.v = _conv(ch, ch, 1, c, rngs)
    self.proj_out = _conv(ch, ch, 1, c, rngs)

  def __call__(self, x):
    b, h, w, ch = x.shape
    y = self.norm(x)
    q, k, v = (m(y).reshape(b, h * w, ch) for m in (self.q, self.k, self.v))
    logits = jnp.einsum("bic,bjc->bij", q, k, preferred_element_type=jnp.float32) * (ch ** -0.5)
    att = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum("bij,bjc->bic", att, v).reshape(b, h, w, ch)
    return x + self.proj_out(out)


class Upsample(nnx.Module):
  """Nearest-neighbour x2 (each pixel repeated 2x2, as torch's interpolate(scale_factor=2, 'nearest')), conv 3x3."""

  def __init__(self, ch: int, c: KLConfig, rngs: nnx.Rngs):
    self.conv = _conv(ch, ch, 3, c, rngs)

  def __call__(self, x):
    return self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))


class _Mid(nnx.Module):

  def __init__(self, ch: int, c: KLConfig, rngs: nnx.Rngs):
    self.block_1 = ResnetBlock(ch, ch, c, rngs)
    self.attn_1 = AttnBlock(ch, c, rngs)
    self.block_2 = ResnetBlock(ch, ch, c, rngs)

  def __call__(self, x):
    return self.block_2(self.attn_1(self.block_1(x)))


class _UpLevel(nnx.Module):

  def __init__(self, cin: int, cout: int, attn: bool, upsample: bool, c: KLConfig, rngs: nnx.Rngs):
    chans = [cin] + [cout] * (c.num_res_blocks + 1)
    self.block = nnx.List([ResnetBlock(a, b, c, rngs) for a, b in zip(chans[:-1], chans[1:])])
    self.attn = nnx.List([AttnBlock(cout, c, rngs) for _ in range(c.num_res_blocks + 1)] if attn else [])
    self.upsample = Upsample(cout, c, rngs) if upsample else None

  def __call__(self, x):
    for j, block in enumerate(self.block):
      x = block(x)
      if len(self.attn):
        x = self.attn[j](x)
    return x if self.upsample is None else self.upsample(x)


class Decoder(nnx.Module):
  """The LDM decoder without post_quant_conv: (B, h, w, z_channels) -> (B, H, W, out_ch)."""

  def __init__(self, c: KLConfig, rngs: nnx.Rngs):
    levels = len(c.ch_mult)
    block_in = c.ch * c.ch_mult[-1]
    self.conv_in = _conv(c.z_channels, block_in, 3, c, rngs)
    self.mid = _Mid(block_in, c, rngs)
    up = [None] * levels
    for i in reversed(range(levels)):       # built lowest resolution first, stored by level index like torch
      block_out = c.ch * c.ch_mult[i]
      up[i] = _UpLevel(block_in, block_out, c.level_resolutions[i] in c.attn_resolutions, i != 0, c, rngs)
      block_in = block_out
    self.up = nnx.List(up)
    self.norm_out = GroupNorm(block_in, c.norm_groups, c.norm_eps)
    self.conv_out = _conv(block_in, c.out_ch, 3, c, rngs)

  def __call__(self, z):
    h = self.mid(self.conv_in(z))
    for level in reversed(range(len(self.up))):
      h = self.up[level](h)
    return self.conv_out(_swish(self.norm_out(h)))


class KLDecoder(nnx.Module):
  """`post_quant_conv` then `Decoder`: MAR's `AutoencoderKL.decode` on NHWC arrays.

  Parameters mirror the torch module tree (`post_quant_conv`, `decoder.conv_in`, `decoder.up[i].block[j]`, ...),
  with conv `kernel`s in (kh, kw, in, out) and GroupNorm `weight` / `bias`.
  """

  def __init__(self, config: KLConfig, *, rngs: nnx.Rngs):
    """Builds the decoder with random (flax-default) conv weights and unit / zero norms.

    Args:
      config: the architecture (`KL16` for MAR).
      rngs: key source for the conv initialisers.
    """
    self.config = config
    with nnx.use_eager_sharding(False):
      self.post_quant_conv = _conv(config.embed_dim, config.z_channels, 1, config, rngs)
      self.decoder = Decoder(config, rngs)

  def __call__(self, z):
    """Decodes RAW latents (MAR's `vae.decode` input, i.e. tokens already divided by `MAR_LATENT_SCALE`).

    Args:
      z: (B, h, w, embed_dim) latents, NHWC.

    Returns:
      (B, h * 2**(L-1), w * 2**(L-1), out_ch) float32 images, roughly in [-1, 1] (not clipped).
    """
    c = self.config
    z = jnp.asarray(z)
    if z.ndim != 4 or z.shape[-1] != c.embed_dim:
      raise DataError(f"KLDecoder: latents must be NHWC (B, h, w, {c.embed_dim}), got shape {tuple(z.shape)}")
    h = self.decoder(self.post_quant_conv(z.astype(jnp.dtype(c.dtype))))
    return h.astype(jnp.float32)

  def decode_normalized(self, tokens):
    """Decodes latents in MAR's training scale (latent * 0.2325, unit std): `self(tokens / MAR_LATENT_SCALE)`."""
    return self(jnp.asarray(tokens) / MAR_LATENT_SCALE)


# ------------------------------------------------------------------------------------ checkpoint conversion


def _torch_key(path: tuple) -> str:
  *mods, leaf = (str(p) for p in path)
  return ".".join(mods + [{"kernel": "weight"}.get(leaf, leaf)])


def _abstract(config: KLConfig):
  """(graphdef, flat Param state) of an abstractly built decoder (no values computed)."""
  model = nnx.eval_shape(lambda: KLDecoder(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  return graphdef, nnx.to_flat_state(state)


def _torch_shape(shape: tuple) -> tuple[int, ...]:
  return (shape[3], shape[2], shape[0], shape[1]) if len(shape) == 4 else tuple(shape)


def expected_shapes(config: KLConfig = KL16) -> dict[str, tuple[int, ...]]:
  """The torch state-dict keys the decoder reads, each with its torch shape (conv weights (out, in, kh, kw))."""
  return {_torch_key(path): _torch_shape(tuple(var.shape)) for path, var in _abstract(config)[1]}


def _used(key: str) -> bool:
  return key.startswith(("decoder.", "post_quant_conv."))


def _convert(state_dict: Mapping[str, Any], config: KLConfig, strict: bool):
  graphdef, flat = _abstract(config)
  want = {_torch_key(path): _torch_shape(tuple(var.shape)) for path, var in flat}
  if strict:
    extra = sorted(k for k in state_dict if _used(k) and k not in want)
    if extra:
      raise DataError(f"KL decoder checkpoint: unexpected key '{extra[0]}' ({len(extra)} in all) for this config "
                      f"(attn_resolutions={config.attn_resolutions}); check the config or pass strict=False")
  values = []
  for path, var in flat:
    key = _torch_key(path)
    if key not in state_dict:
      raise DataError(f"KL decoder checkpoint: missing key '{key}' (expected shape {want[key]})")
    arr = _to_numpy(state_dict[key])
    if tuple(arr.shape) != want[key]:
      raise DataError(f"KL decoder checkpoint: key '{key}' has shape {tuple(arr.shape)}, expected {want[key]}")
    if arr.ndim == 4:
      arr = arr.transpose(2, 3, 1, 0)         # torch (out, in, kh, kw) -> flax (kh, kw, in, out)
    values.append((path, var.replace(jnp.asarray(arr, jnp.float32))))
  return graphdef, nnx.from_flat_state(values)


def state_dict_to_params(state_dict: Mapping[str, Any], config: KLConfig = KL16, *, strict: bool = True) -> nnx.State:
  """Converts a torch-named state dict (numpy arrays or torch tensors) into the decoder's Param state.

  Keys outside `decoder.*` / `post_quant_conv.*` (encoder, quant_conv, loss) are ignored.

  Args:
    state_dict: torch key -> array, in torch layout.
    config: the architecture the weights are for.
    strict: also reject `decoder.*` / `post_quant_conv.*` keys the config does not use (a config mismatch,
      e.g. attention blocks the config lacks); False ignores them, like MAR's `load_state_dict(strict=False)`.

  Returns:
    An `nnx.State` for `nnx.merge(graphdef, state)` / `nnx.update(decoder, state)`, float32 parameters.

  Raises:
    DataError: naming the first missing, mis-shaped or (when strict) unexpected key.
  """
  return _convert(state_dict, config, strict)[1]


def params_to_state_dict(decoder: KLDecoder) -> dict[str, np.ndarray]:
  """The decoder's parameters as a torch-named, torch-layout dict of float32 numpy arrays (inverse of
  `state_dict_to_params`); suitable for `safetensors.numpy.save_file`."""
  out = {}
  for path, var in nnx.to_flat_state(nnx.state(decoder, nnx.Param)):
    arr = np.asarray(var[...], np.float32)
    out[_torch_key(path)] = np.ascontiguousarray(arr.transpose(3, 2, 0, 1) if arr.ndim == 4 else arr)
  return out


def _to_numpy(x) -> np.ndarray:
  if hasattr(x, "detach"):                      # a torch tensor (bfloat16 has no numpy dtype: go through float32)
    return x.detach().cpu().float().numpy()
  return np.asarray(x)


def _conversion_command(path: str) -> str:
  out = os.path.splitext(path)[0] + ".safetensors"
  return ("python -c \"import torch, safetensors.torch as st; sd = torch.load('" + path + "', map_location='cpu', "
          "weights_only=False); sd = sd.get('model', sd.get('state_dict', sd)); st.save_file({k: v.float()"
          ".contiguous() for k, v in sd.items() if k.startswith(('decoder.', 'post_quant_conv.'))}, '" + out + "')\"")


def read_state_dict(path: str) -> dict[str, Any]:
  """Reads a torch-named state dict from a local `.safetensors` file or (with torch installed) a torch pickle.

  Torch pickles may hold the state dict directly or under "model" (MAR's kl16.ckpt) or "state_dict" (LDM).

  Raises:
    DataError: the file is missing, has an unknown suffix, or cannot be read.
    MissingDependencyError: a torch pickle without torch installed (the message has the conversion command).
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise DataError(f"KL decoder checkpoint not found: {path} (nothing is downloaded; pass a local file)")
  if path.endswith(".safetensors"):
    st_numpy = require("safetensors.numpy", "hf")
    try:
      return dict(st_numpy.load_file(path))
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f"KL decoder checkpoint {path} is not a readable safetensors file: {e}") from e
  if not path.endswith(_TORCH_SUFFIXES):
    raise DataError(f"KL decoder checkpoint {path}: expected a .safetensors, .ckpt, .pt or .pth file")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise MissingDependencyError(f"reading the torch checkpoint {path} needs torch, which is not installed; convert "
                                 f"it once to safetensors where torch is available: {_conversion_command(path)}") from e
  try:
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f"KL decoder checkpoint {path} could not be read with torch.load(weights_only=True) ({e}); if "
                    f"you trust the file, convert it: {_conversion_command(path)}") from e
  for name in ("model", "state_dict"):
    if isinstance(obj, Mapping) and isinstance(obj.get(name), Mapping):
      obj = obj[name]
      break
  if not isinstance(obj, Mapping):
    raise DataError(f"KL decoder checkpoint {path} holds a {type(obj).__name__}, not a state dict")
  return dict(obj)


def load_decoder(path: str, config: KLConfig = KL16, *, strict: bool = True) -> KLDecoder:
  """Builds a `KLDecoder` with the weights of a local checkpoint (MAR's kl16.ckpt, or its safetensors conversion).

  Args:
    path: a `.safetensors` file, or a torch `.ckpt` / `.pt` / `.pth` file (needs torch).
    config: the architecture (`KL16` for MAR).
    strict: see `state_dict_to_params`.

  Returns:
    The decoder; no random initialisation is run.

  Raises:
    DataError: unreadable file, missing / mis-shaped / unexpected keys (the first one is named).
    MissingDependencyError: a torch file without torch (the message gives the one-line conversion command).
  """
  return nnx.merge(*_convert(read_state_dict(path), config, strict))
