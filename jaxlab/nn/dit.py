"""A multi-stream patch diffusion transformer in the JiT style (Flax NNX); JiT is the one-stream case.

JiT (Li & He 2025, arXiv 2511.13720) and Latent Forcing (arXiv 2602.11401, whose code builds on JiT): a
pixel-space DiT with large patches, x-prediction (`jaxlab.diffusion.flow`), and these parts:

* Streams `{name: (channels, patch)}` on one token grid (gh, gw): stream s is a (B, gh p_s, gw p_s, C_s)
  NHWC array, embedded by a bottleneck patch embedding (the p x p patch, flattened, -> `bottleneck` -> hidden,
  i.e. a stride-p conv then a 1x1 conv) into gh * gw tokens; the streams' embeddings are SUMMED per token,
  then a fixed 2-D sin-cos position embedding is added.
* Conditioning c = sum_s TimestepEmbedder_s(t_s) + LabelEmbed(y): one timestep embedder PER STREAM
  (sinusoidal features of 1000 t, `freq_dim` of them, -> MLP), a label table with one extra row, the null
  class `num_classes`, for classifier-free guidance (`drop_labels`).
* Blocks: pre-RMSNorm attention and SwiGLU MLP, each modulated by adaLN-Zero from c (shift, scale, gate; the
  modulation is zero-initialised, so a fresh block is the identity on its residual stream); qk-norm
  (RMSNorm over head_dim on q and k); 2-D RoPE (the first half of head_dim rotated by the token's row, the
  second by its column, rotate-half convention); optional cross-attention to a context sequence (zero-init
  output projection) whose pre-softmax logits pass through a hook `logits -> logits` (B, heads, L, S).
* `class_tokens` in-context class tokens (the label embedding plus a learned per-token embedding, RoPE
  position (0, 0)) are prepended before block `in_context_start` and dropped after the trunk.
* Per-stream decoder heads: with head_depth > 0, Linear(hidden -> head_hidden) + head_depth blocks + a final
  layer; else a final layer on the trunk (adaLN shift / scale, RMSNorm, zero-initialised linear to p*p*C).

Self-attention runs through `jaxlab.nn.attention.attention` (impl as `DiTConfig.attention`: "auto" picks the
fused kernel per backend); blocks are scanned (`scan_layers`, parameters stacked on a "layers" axis) with
optional remat; parameters carry logical axis names ("embed", "heads", "mlp", "layers") and the token stream
is constrained to (batch, length, embed) under a mesh; compute in `dtype`, norms and softmax in float32.

Reconstructed (not fixed by the sources read): the 1000 t scaling of the sinusoid (DiT's), RoPE position (0,
0) for class tokens, SwiGLU width int(2/3 mlp_ratio hidden) rounded to a multiple of 8, in_context_start of
the S and LM sizes (the spec gives B 4, L 8, H 10), init N(0, init_std) for embeddings and projections.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.errors import ConfigError
from jaxlab.nn import attention as attention_lib
from jaxlab.nn import layers

ACT = ("batch", "length", "embed")
# Model zoo at patch 16 (Latent Forcing / JiT): size -> (depth, hidden, heads, bottleneck, in_context_start).
ZOO = {"S": (12, 384, 6, 128, 4), "B": (12, 768, 12, 128, 4), "L": (24, 1024, 16, 128, 8),
       "LM": (20, 1024, 16, 128, 8), "H": (32, 1280, 16, 256, 10)}


@dataclasses.dataclass(frozen=True)
class DiTConfig:
  """Architecture of a `DiT` (frozen, hashable).

  Attributes:
    streams: ((name, channels, patch), ...); a dict {name: (channels, patch)} is converted.
    grid: (gh, gw) token grid shared by every stream.
    hidden, depth, heads: trunk width, blocks, attention heads.
    mlp_ratio: SwiGLU width = int(2/3 mlp_ratio hidden), rounded up to a multiple of 8.
    bottleneck: patch-embedding bottleneck width.
    num_classes: label classes (0: unconditional; the label table always has the null row).
    class_tokens: in-context class tokens (0: none).
    in_context_start: the block before which they are inserted.
    head_depth, head_hidden: per-stream decoder heads (head_depth 0: a final layer on the trunk).
    context_dim: width of a cross-attention context (None: no cross-attention).
    freq_dim: sinusoidal timestep features.
    rope_theta: RoPE base.
    dtype, param_dtype: compute / parameter dtypes.
    attention: self-attention impl (`jaxlab.nn.attention.IMPLS`).
    scan_layers, remat, remat_policy: scanned blocks, `jax.checkpoint` of each block and its policy.
    init_std: std of the normal init of embeddings and projections.
  """
  streams: Any
  grid: tuple[int, int] = (16, 16)
  hidden: int = 384
  depth: int = 12
  heads: int = 6
  mlp_ratio: float = 4.0
  bottleneck: int = 128
  num_classes: int = 1000
  class_tokens: int = 32
  in_context_start: int = 4
  head_depth: int = 0
  head_hidden: int | None = None
  context_dim: int | None = None
  freq_dim: int = 256
  rope_theta: float = 10000.0
  dtype: str = "float32"
  param_dtype: str = "float32"
  attention: str = "auto"
  scan_layers: bool = True
  remat: bool = False
  remat_policy: str = "nothing_saveable"
  init_std: float = 0.02

  def __post_init__(self):
    def bad(msg):
      raise ConfigError(f"DiTConfig: {msg}")
    streams = self.streams
    if isinstance(streams, Mapping):
      streams = tuple((str(k), int(v[0]), int(v[1])) for k, v in streams.items())
    streams = tuple(tuple(s) for s in streams)
    if not streams or any(len(s) != 3 or s[1] < 1 or s[2] < 1 for s in streams):
      bad(f"streams must be {{name: (channels, patch)}} with positive sizes, got {self.streams!r}")
    if len({s[0] for s in streams}) != len(streams):
      bad(f"stream names must be distinct, got {[s[0] for s in streams]}")
    object.__setattr__(self, "streams", streams)
    object.__setattr__(self, "grid", tuple(int(g) for g in self.grid))
    if self.hidden % self.heads or (self.hidden // self.heads) % 4:
      bad(f"hidden={self.hidden} / heads={self.heads} must give a head_dim divisible by 4 (2-D RoPE)")
    if not 0 <= self.in_context_start <= self.depth:
      bad(f"in_context_start={self.in_context_start} must be within [0, depth={self.depth}]")
    hh = self.head_hidden or self.hidden
    if self.head_depth and hh % (self.hidden // self.heads):
      bad(f"head_hidden={hh} must be a multiple of head_dim={self.hidden // self.heads}")
    if self.attention not in attention_lib.IMPLS:
      bad(f"attention={self.attention!r} is not one of {attention_lib.IMPLS}")
    if self.remat_policy not in layers.REMAT_POLICIES:
      bad(f"remat_policy={self.remat_policy!r} is not one of {layers.REMAT_POLICIES}")

  @property
  def head_dim(self) -> int:
    return self.hidden // self.heads

  @property
  def mlp_hidden(self) -> int:
    return _swiglu_width(self.hidden, self.mlp_ratio)

  def stream_shape(self, name: str) -> tuple[int, int, int]:
    """(H, W, C) of stream `name`'s input."""
    for n, c, p in self.streams:
      if n == name:
        return (self.grid[0] * p, self.grid[1] * p, c)
    raise ConfigError(f"DiTConfig: no stream {name!r} (streams: {[s[0] for s in self.streams]})")


def _swiglu_width(width: int, ratio: float) -> int:
  return -(-int(2 * ratio * width / 3) // 8) * 8


def zoo(size: str, streams, grid=(16, 16), **overrides) -> DiTConfig:
  """A model-zoo size ("S", "B", "L", "LM", "H": JiT / Latent Forcing at patch 16) as a `DiTConfig`."""
  if size not in ZOO:
    raise ConfigError(f"unknown DiT size {size!r}; one of {', '.join(ZOO)}")
  depth, hidden, heads, bottleneck, start = ZOO[size]
  kw = dict(depth=depth, hidden=hidden, heads=heads, bottleneck=bottleneck, in_context_start=start)
  kw.update(overrides)
  return DiTConfig(streams=streams, grid=grid, **kw)


def drop_labels(key: jax.Array, y: jax.Array, rate: float, num_classes: int) -> jax.Array:
  """Labels replaced by the null class `num_classes` with probability `rate` (classifier-free training)."""
  return jnp.where(jax.random.uniform(key, y.shape) < rate, num_classes, y)


# ------------------------------------------------------------------------------------------- pieces


def _dense(i, o, names, c: DiTConfig, rngs, *, bias=True, zero=False):
  init = layers.zeros() if zero else layers.normal(c.init_std)
  return layers.dense(i, o, names=names, kernel_init=init, use_bias=bias, dtype=jnp.dtype(c.dtype),
                      param_dtype=jnp.dtype(c.param_dtype), rngs=rngs)


def _rms(x, w=None, eps=1e-6):
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (y if w is None else y * w[...].astype(jnp.float32)).astype(x.dtype)


def sincos_2d(gh: int, gw: int, dim: int) -> np.ndarray:
  """(gh * gw, dim) fixed 2-D sin-cos position embedding (MAE / DiT): half the channels encode the row,
  half the column, each as [sin(p w_i), cos(p w_i)] with w_i = 10000^(-i / (dim / 4))."""
  if dim % 4:
    raise ConfigError(f"sincos_2d: dim={dim} must be divisible by 4")
  w = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim // 4))
  rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
  def enc(p):
    a = p.reshape(-1, 1) * w[None]
    return np.concatenate([np.sin(a), np.cos(a)], axis=1)
  return np.concatenate([enc(rows), enc(cols)], axis=1).astype(np.float32)


def rope_2d(x: jax.Array, rows: jax.Array, cols: jax.Array, theta: float) -> jax.Array:
  """2-D rotate-half RoPE of x (B, L, H, D): the first D/2 channels rotated by the row, the rest by the column."""
  d = x.shape[-1]
  q = d // 4
  inv = 1.0 / theta ** (np.arange(q, dtype=np.float32) / q)
  x32 = x.astype(jnp.float32)

  def rot(part, pos):
    ang = pos.astype(jnp.float32)[:, None] * inv[None]             # (L, q)
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    a, b = part[..., :q], part[..., q:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
  return jnp.concatenate([rot(x32[..., :d // 2], rows), rot(x32[..., d // 2:], cols)], axis=-1).astype(x.dtype)


class TimestepEmbedder(nnx.Module):
  """t (B,) in [0, 1] -> (B, hidden): sinusoidal features of 1000 t, then Linear-SiLU-Linear."""

  def __init__(self, c: DiTConfig, rngs: nnx.Rngs):
    self.freq_dim = c.freq_dim
    self.fc1 = _dense(c.freq_dim, c.hidden, (None, "embed"), c, rngs)
    self.fc2 = _dense(c.hidden, c.hidden, ("embed", None), c, rngs)

  def __call__(self, t):
    half = self.freq_dim // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    a = 1000.0 * t.astype(jnp.float32)[:, None] * freqs[None]
    return self.fc2(jax.nn.silu(self.fc1(jnp.concatenate([jnp.cos(a), jnp.sin(a)], axis=-1))))


class PatchEmbed(nnx.Module):
  """Bottleneck patch embedding: (B, gh p, gw p, C) -> (B, gh gw, hidden) via p*p*C -> bottleneck -> hidden."""

  def __init__(self, channels: int, patch: int, c: DiTConfig, rngs: nnx.Rngs):
    self.patch = patch
    self.proj = _dense(patch * patch * channels, c.bottleneck, (None, None), c, rngs, bias=False)
    self.out = _dense(c.bottleneck, c.hidden, (None, "embed"), c, rngs)

  def __call__(self, x):
    return self.out(self.proj(patchify(x, self.patch)))


def patchify(x: jax.Array, p: int) -> jax.Array:
  """(B, H, W, C) -> (B, (H/p)(W/p), p*p*C), patches in row-major order, each flattened (p, p, C)."""
  b, h, w, ch = x.shape
  x = x.reshape(b, h // p, p, w // p, p, ch).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // p) * (w // p), p * p * ch)


def unpatchify(x: jax.Array, p: int, grid: tuple[int, int], channels: int) -> jax.Array:
  """The inverse of `patchify`: (B, gh gw, p*p*C) -> (B, gh p, gw p, C)."""
  b = x.shape[0]
  gh, gw = grid
  x = x.reshape(b, gh, gw, p, p, channels).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, gh * p, gw * p, channels)


class Block(nnx.Module):
  """A JiT block of width `width`: adaLN-Zero-modulated attention (qk-norm, 2-D RoPE) and SwiGLU, optional
  cross-attention to a context (zero-init output)."""

  def __init__(self, c: DiTConfig, width: int, rngs: nnx.Rngs):
    heads, hd = width // c.head_dim, c.head_dim
    self.theta, self.impl = c.rope_theta, c.attention
    self.ada = _dense(c.hidden, (6, width), (None, None, "embed"), c, rngs, zero=True)
    self.q = _dense(width, (heads, hd), ("embed", "heads", None), c, rngs)
    self.k = _dense(width, (heads, hd), ("embed", "heads", None), c, rngs)
    self.v = _dense(width, (heads, hd), ("embed", "heads", None), c, rngs)
    self.o = _dense((heads, hd), width, ("heads", None, "embed"), c, rngs)
    self.q_norm = layers.param(layers.ones(), (None,), None, (hd,), jnp.dtype(c.param_dtype))
    self.k_norm = layers.param(layers.ones(), (None,), None, (hd,), jnp.dtype(c.param_dtype))
    m = _swiglu_width(width, c.mlp_ratio)
    self.gate = _dense(width, m, ("embed", "mlp"), c, rngs)
    self.up = _dense(width, m, ("embed", "mlp"), c, rngs)
    self.down = _dense(m, width, ("mlp", "embed"), c, rngs)
    self.cross = c.context_dim is not None
    if self.cross:
      self.cq = _dense(width, (heads, hd), ("embed", "heads", None), c, rngs)
      self.ck = _dense(c.context_dim, (heads, hd), (None, "heads", None), c, rngs)
      self.cv = _dense(c.context_dim, (heads, hd), (None, "heads", None), c, rngs)
      self.co = _dense((heads, hd), width, ("heads", None, "embed"), c, rngs, zero=True)

  def __call__(self, h, cond, pos, context=None, context_mask=None, logit_hook=None, self_logit_hook=None):
    """`logit_hook` / `self_logit_hook`: functions of the float32 pre-softmax logits (B, H, L, S) of the cross- /
    self-attention (`cross_attention`); unset, the self-attention is the fused `attention_lib.attention`."""
    rows, cols = pos
    sa, ca, ga, sm, cm, gm = [m[:, None] for m in jnp.moveaxis(self.ada(jax.nn.silu(cond)), 1, 0)]
    x = _rms(h) * (1 + ca) + sa
    q, k, v = self.q(x), self.k(x), self.v(x)
    q, k = rope_2d(_rms(q, self.q_norm), rows, cols, self.theta), rope_2d(_rms(k, self.k_norm), rows, cols, self.theta)
    if self_logit_hook is None:
      a = attention_lib.attention(q, k, v, causal=False, impl=self.impl)
    else:                   # the logits made explicit for the hook (an attention editor's source interpolation)
      a = cross_attention(q, k, v, None, self_logit_hook)
    h = h + ga * self.o(a).astype(h.dtype)
    if self.cross and context is not None:
      h = h + self.co(cross_attention(self.cq(_rms(h)), self.ck(context), self.cv(context), context_mask,
                                      logit_hook)).astype(h.dtype)
    x = _rms(h) * (1 + cm) + sm
    return h + gm * self.down(jax.nn.silu(self.gate(x)) * self.up(x)).astype(h.dtype)


def cross_attention(q, k, v, mask=None, logit_hook: Callable | None = None):
  """softmax(hook(q k^T / sqrt(d)) + mask) v with q (B, L, H, D), k / v (B, S, H, D); the hook sees and
  returns the float32 pre-softmax logits (B, H, L, S); mask (B, S) bool (True = attend)."""
  logits = jnp.einsum("blhd,bshd->bhls", q.astype(jnp.float32), k.astype(jnp.float32)) / math.sqrt(q.shape[-1])
  if logit_hook is not None:
    logits = logit_hook(logits)
  if mask is not None:
    logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
  return jnp.einsum("bhls,bshd->blhd", jax.nn.softmax(logits, axis=-1), v.astype(jnp.float32)).astype(v.dtype)


class FinalLayer(nnx.Module):
  """adaLN (shift, scale; zero init) + RMSNorm + zero-initialised linear to the stream's patch values."""

  def __init__(self, c: DiTConfig, width: int, out: int, rngs: nnx.Rngs):
    self.ada = _dense(c.hidden, (2, width), (None, None, "embed"), c, rngs, zero=True)
    self.out = _dense(width, out, ("embed", None), c, rngs, zero=True)

  def __call__(self, h, cond):
    shift, scale = [m[:, None] for m in jnp.moveaxis(self.ada(jax.nn.silu(cond)), 1, 0)]
    return self.out(_rms(h) * (1 + scale) + shift)


class _Stack(nnx.Module):
  """Blocks run in order: stacked and scanned (`scan`) or unrolled."""

  def __init__(self, blocks: list, scan: bool):
    self.scan = scan and len(blocks) > 1
    self.blocks = layers.stack_blocks(blocks) if self.scan else nnx.List(blocks)

  def __call__(self, h, cond, pos, c: DiTConfig, **kw):
    if not self.scan:
      for b in self.blocks:
        h = b(layers.constrain(h, ACT), cond, pos, **kw)
      return h

    def apply(block, h, _):
      return block(layers.constrain(h, ACT), cond, pos, **kw), None
    return layers.scan_blocks(self.blocks, h, apply, remat_policy=c.remat_policy if c.remat else None)[0]


class Head(nnx.Module):
  """One stream's decoder head: (Linear to head_hidden + head_depth blocks) + final layer."""

  def __init__(self, c: DiTConfig, out: int, rngs: nnx.Rngs):
    width = c.head_hidden or c.hidden
    self.proj = _dense(c.hidden, width, ("embed", None), c, rngs) if c.head_depth else None
    self.stack = _Stack([Block(c, width, rngs) for _ in range(c.head_depth)], c.scan_layers) if c.head_depth else None
    self.final = FinalLayer(c, width, out, rngs)

  def __call__(self, h, cond, pos, c):
    if self.proj is not None:
      h = self.stack(self.proj(h), cond, pos, c)
    return self.final(h, cond)


class DiT(nnx.Module):
  """Multi-stream JiT diffusion transformer (see the module docstring). Keeps no `nnx.Rngs`."""

  def __init__(self, config: DiTConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    with nnx.use_eager_sharding(False):
      self.embed = nnx.Dict({n: PatchEmbed(ch, p, c, rngs) for n, ch, p in c.streams})
      self.t_embed = nnx.Dict({n: TimestepEmbedder(c, rngs) for n, _, _ in c.streams})
      self.label = layers.embed(c.num_classes + 1, c.hidden, names=(None, "embed"), init=layers.normal(c.init_std),
                                dtype=jnp.dtype(c.param_dtype), param_dtype=jnp.dtype(c.param_dtype), rngs=rngs)
      self.ctx_pos = (layers.param(layers.normal(c.init_std), (None, "embed"), rngs.params(),
                                   (c.class_tokens, c.hidden), jnp.dtype(c.param_dtype)) if c.class_tokens else None)
      self.pre = _Stack([Block(c, c.hidden, rngs) for _ in range(c.in_context_start)], c.scan_layers)
      self.post = _Stack([Block(c, c.hidden, rngs) for _ in range(c.depth - c.in_context_start)], c.scan_layers)
      self.heads = nnx.Dict({n: Head(c, p * p * ch, rngs) for n, ch, p in c.streams})

  def condition(self, t: Mapping[str, jax.Array], y: jax.Array) -> jax.Array:
    """c = sum_s TimestepEmbedder_s(t_s) + LabelEmbed(y): (B, hidden) float32."""
    c = self.config
    missing = {n for n, _, _ in c.streams} - set(t)
    if missing:
      raise ConfigError(f"DiT: no time for streams {sorted(missing)}")
    cond = self.label(jnp.asarray(y, jnp.int32)).astype(jnp.float32)
    for n, _, _ in c.streams:
      cond = cond + self.t_embed[n](jnp.asarray(t[n])).astype(jnp.float32)
    return cond

  def __call__(self, x: Mapping[str, jax.Array], t: Mapping[str, jax.Array], y: jax.Array, *,
               context: jax.Array | None = None, context_mask: jax.Array | None = None,
               logit_hook: Callable | None = None,
               self_logit_hook: Callable | None = None) -> dict[str, jax.Array]:
    """Predicted clean streams {name: (B, H, W, C)} from noisy ones at times t {name: (B,)} and labels y (B,)
    (the null class `num_classes` for the unconditional branch). `logit_hook` / `self_logit_hook` see every
    block's cross- / self-attention logits (`Block`); with neither the network is unchanged."""
    c = self.config
    dt = jnp.dtype(c.dtype)
    for n, _, _ in c.streams:
      want = c.stream_shape(n)
      if n not in x or tuple(x[n].shape[1:]) != want:
        raise ConfigError(f"DiT: stream {n!r} must be (batch, {', '.join(map(str, want))}), got "
                          f"{None if n not in x else tuple(x[n].shape)}")
    cond = self.condition(t, y).astype(dt)
    h = sum(self.embed[n](x[n].astype(dt)) for n, _, _ in c.streams)
    h = h + jnp.asarray(sincos_2d(*c.grid, c.hidden), dt)[None]
    gh, gw = c.grid
    rows = jnp.repeat(jnp.arange(gh), gw)
    cols = jnp.tile(jnp.arange(gw), gh)
    kw = dict(context=None if context is None else context.astype(dt), context_mask=context_mask,
              logit_hook=logit_hook, self_logit_hook=self_logit_hook)
    h = self.pre(h, cond, (rows, cols), c, **kw)
    n_ctx = c.class_tokens
    if n_ctx:
      tokens = self.label(jnp.asarray(y, jnp.int32))[:, None].astype(dt) + self.ctx_pos[...].astype(dt)[None]
      h = jnp.concatenate([tokens, h], axis=1)
      zeros = jnp.zeros((n_ctx,), rows.dtype)
      pos = (jnp.concatenate([zeros, rows]), jnp.concatenate([zeros, cols]))
    else:
      pos = (rows, cols)
    h = self.post(h, cond, pos, c, **kw)[:, n_ctx:]
    out = {}
    for n, ch, p in c.streams:
      out[n] = unpatchify(self.heads[n](h, cond, (rows, cols), c).astype(jnp.float32), p, c.grid, ch)
    return out


def count_params(config: DiTConfig) -> int:
  """Parameters of `DiT(config)` (from the abstract model; nothing is allocated)."""
  model = nnx.eval_shape(lambda: DiT(config, rngs=nnx.Rngs(0)))
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def flops_per_image(config: DiTConfig) -> float:
  """Model FLOPs of one TRAINING image (forward + backward = 3x the forward's matmul and attention FLOPs).

  Per block of width w, MLP width m and T tokens: 2 T (4 w^2 + 3 w m) for the projections and SwiGLU,
  4 T^2 w for the attention scores and values, 2 w 6w for the adaLN modulation (once per image); plus the
  patch embeddings (2 T (p^2 C b + b h) per stream), the final layers (2 T w p^2 C + 2 w 2w per stream). The
  timestep and label embedders and the norms are left out (under 0.1% at the zoo sizes). Cross-attention is
  not counted (the benchmark runs without a context).
  """
  c = config
  n = c.grid[0] * c.grid[1]

  def block(w, tokens):
    m = _swiglu_width(w, c.mlp_ratio)
    return 2 * tokens * (4 * w * w + 3 * w * m) + 4 * tokens * tokens * w + 2 * w * 6 * w

  fwd = c.in_context_start * block(c.hidden, n) + (c.depth - c.in_context_start) * block(c.hidden, n + c.class_tokens)
  hh = c.head_hidden or c.hidden
  for _, ch, p in c.streams:
    fwd += 2 * n * (p * p * ch * c.bottleneck + c.bottleneck * c.hidden)
    width = hh if c.head_depth else c.hidden
    if c.head_depth:
      fwd += 2 * n * c.hidden * hh + c.head_depth * block(hh, n)
    fwd += 2 * n * width * p * p * ch + 2 * width * 2 * width
  return 3.0 * fwd
