"""The two-stream self-token transformer of SAR ("Autoregression with Self-Token Prediction", ICML 2026), with a
KV cache for grouped incremental decoding and an EMA teacher for the JEPA feature-alignment loss (Flax NNX).

Inputs are continuous tokens x (B, N, token_dim) on a (gh, gw) grid (raster order) and class labels y (B,).

    C    = ClassEmbed(y) + prefix_pos                  (num_prefix tokens; label `num_classes` = null, for CFG)
    R_i  = W_in x_i + pos_i                            reference (clean) token i
    P_i  = q + pos_i                                   prediction ("self") token i: a learned query, no content
    h    = Blocks([C | R | P], mask)                   pre-RMSNorm attention + SwiGLU, `jaxlab.ar.masks` mask
    f_i  = RMSNorm(h)[P_i]                             the head's conditioning feature for token i

The mask (`masks.two_stream_mask`) lets P_i read only the clean tokens of strictly earlier groups, so f_i never
sees x_i (no identity collapse) and one group's tokens are predicted in parallel. Generation appends each sampled
group as reference tokens to a KV cache (`init_cache`, `prefill`, `extend`): `extend` runs the trunk on the
previous group's reference tokens and the next group's prediction tokens only, which gives the same features
as the full masked forward (the exactness test and claim 3 of `experiments/sar`).

JEPA (the paper's regulariser, reconstructed from the reviews): a teacher, an exponential moving average of the
trunk (`update_teacher`), reads the clean tokens with bidirectional attention (`teacher_features`); the student's
prediction features pass a small predictor MLP (`predict_teacher`) and are aligned to the teacher's reference
features (`jaxlab.ar.losses.jepa_loss`). The teacher's variables are `Teacher` (not `nnx.Param`): no gradient, no
optimizer state; they travel in the model state, checkpointed with the run.

Parameters carry logical axis names ("embed", "heads", "mlp"); the token stream is constrained to (batch, length,
embed) under a mesh. Reconstructed (not fixed by the public sources): learned absolute position embeddings
shared by the two streams, SwiGLU blocks with RMSNorm, the predictor's shape.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.ar import masks as masks_lib
from jaxlab.errors import ConfigError
from jaxlab.nn import attention as attention_lib
from jaxlab.nn import dit
from jaxlab.nn import layers

ACT = ("batch", "length", "embed")


class Teacher(nnx.Variable):
  """A variable of the EMA teacher (updated by `SelfTokenTransformer.update_teacher`, never differentiated)."""


@dataclasses.dataclass(frozen=True)
class ARConfig:
  """Architecture of a `SelfTokenTransformer` (frozen, hashable).

  Attributes:
    token_dim: channels of a continuous token.
    grid: (gh, gw) token grid (N = gh * gw tokens, raster order).
    hidden, depth, heads: trunk width, blocks, attention heads.
    mlp_ratio: SwiGLU width = int(2/3 mlp_ratio hidden) rounded up to a multiple of 8.
    num_classes: classes (the label table has one more row, the null class, for classifier-free guidance).
    num_prefix: class (prefix) tokens.
    mask: the training / full-forward mask kind (`jaxlab.ar.masks.KINDS`).
    intra_pred: prediction tokens of one group see each other (the spec's `intra_group_pred_visibility`).
    teacher: build the EMA teacher and the JEPA predictor.
    dtype, param_dtype: compute / parameter dtypes.
    attention: attention impl (`jaxlab.nn.attention.IMPLS`; the explicit mask needs "xla" or "chunked").
    init_std: std of the normal init of embeddings and projections.
  """
  token_dim: int
  grid: tuple[int, int] = (4, 4)
  hidden: int = 64
  depth: int = 4
  heads: int = 4
  mlp_ratio: float = 4.0
  num_classes: int = 10
  num_prefix: int = 1
  mask: str = "sar"
  intra_pred: bool = True
  teacher: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  attention: str = "xla"
  init_std: float = 0.02

  def __post_init__(self):
    object.__setattr__(self, "grid", tuple(int(g) for g in self.grid))
    if self.hidden % self.heads:
      raise ConfigError(f"ARConfig: hidden={self.hidden} must be divisible by heads={self.heads}")
    if self.mask not in masks_lib.KINDS:
      raise ConfigError(f"ARConfig: mask={self.mask!r} is not one of {masks_lib.KINDS}")
    if self.attention not in ("xla", "chunked"):
      raise ConfigError(f"ARConfig: attention={self.attention!r}: the two-stream mask needs 'xla' or 'chunked'")
    if min(self.token_dim, self.depth, self.num_prefix) < 1:
      raise ConfigError("ARConfig: token_dim, depth and num_prefix must be >= 1")

  @property
  def num_tokens(self) -> int:
    return self.grid[0] * self.grid[1]

  @property
  def head_dim(self) -> int:
    return self.hidden // self.heads


@flax.struct.dataclass
class Cache:
  """KV cache of the reference stream (a pytree): k, v (depth, batch, max_len, heads, head_dim), `length` the
  filled slots (int32 scalar; slots >= length are masked)."""
  k: jax.Array
  v: jax.Array
  length: jax.Array


def _dense(i, o, names, c: ARConfig, rngs, *, bias=False, zero=False):
  init = layers.zeros() if zero else layers.normal(c.init_std)
  return layers.dense(i, o, names=names, kernel_init=init, use_bias=bias, dtype=jnp.dtype(c.dtype),
                      param_dtype=jnp.dtype(c.param_dtype), rngs=rngs)


class Block(nnx.Module):
  """Pre-RMSNorm attention with an explicit mask (optionally after cached keys) and a SwiGLU MLP."""

  def __init__(self, c: ARConfig, rngs: nnx.Rngs):
    dt, pdt = jnp.dtype(c.dtype), jnp.dtype(c.param_dtype)
    self.impl = c.attention
    self.attn_norm = layers.RMSNorm(c.hidden, eps=1e-6, dtype=dt, param_dtype=pdt)
    self.q = _dense(c.hidden, (c.heads, c.head_dim), ("embed", "heads", None), c, rngs)
    self.k = _dense(c.hidden, (c.heads, c.head_dim), ("embed", "heads", None), c, rngs)
    self.v = _dense(c.hidden, (c.heads, c.head_dim), ("embed", "heads", None), c, rngs)
    self.o = _dense((c.heads, c.head_dim), c.hidden, ("heads", None, "embed"), c, rngs)
    self.mlp_norm = layers.RMSNorm(c.hidden, eps=1e-6, dtype=dt, param_dtype=pdt)
    m = dit._swiglu_width(c.hidden, c.mlp_ratio)  # pylint: disable=protected-access  (the DiT's SwiGLU width)
    self.gate = _dense(c.hidden, m, ("embed", "mlp"), c, rngs)
    self.up = _dense(c.hidden, m, ("embed", "mlp"), c, rngs)
    self.down = _dense(m, c.hidden, ("mlp", "embed"), c, rngs)

  def __call__(self, h, mask, past=None):
    """h (B, L, hidden), mask (B or 1, L, S) with S = L (+ cached slots first when `past` = (k, v) is given).
    Returns the new h and this call's (k, v) (B, L, heads, head_dim)."""
    x = self.attn_norm(h)
    q, k, v = self.q(x), self.k(x), self.v(x)
    ks, vs = (k, v) if past is None else (jnp.concatenate([past[0], k], 1), jnp.concatenate([past[1], v], 1))
    a = attention_lib.attention(q, ks.astype(q.dtype), vs.astype(q.dtype), causal=False, mask=mask, impl=self.impl)
    h = h + self.o(a).astype(h.dtype)
    x = self.mlp_norm(h)
    return h + self.down(jax.nn.silu(self.gate(x)) * self.up(x)).astype(h.dtype), (k, v)


class Trunk(nnx.Module):
  """Embeddings, blocks and the final norm (the part the EMA teacher copies)."""

  def __init__(self, c: ARConfig, rngs: nnx.Rngs):
    self.c = c
    pdt = jnp.dtype(c.param_dtype)
    std = layers.normal(c.init_std)
    self.tok_in = _dense(c.token_dim, c.hidden, (None, "embed"), c, rngs, bias=True)
    self.pos = layers.param(std, (None, "embed"), rngs.params(), (c.num_tokens, c.hidden), pdt)
    self.query = layers.param(std, ("embed",), rngs.params(), (c.hidden,), pdt)
    self.cls = layers.embed(c.num_classes + 1, c.num_prefix * c.hidden, names=(None, "embed"), init=std,
                            dtype=jnp.dtype(c.dtype), param_dtype=pdt, rngs=rngs)
    self.prefix_pos = layers.param(std, (None, "embed"), rngs.params(), (c.num_prefix, c.hidden), pdt)
    self.blocks = nnx.List([Block(c, rngs) for _ in range(c.depth)])
    self.norm = layers.RMSNorm(c.hidden, eps=1e-6, dtype=jnp.dtype(c.dtype), param_dtype=pdt)

  def prefix(self, y):
    c = self.c
    e = self.cls(y).reshape(y.shape[0], c.num_prefix, c.hidden)
    return e + self.prefix_pos[...].astype(e.dtype)

  def ref(self, x, pos_idx):
    dt = jnp.dtype(self.c.dtype)
    return self.tok_in(x.astype(dt)) + self.pos[...].astype(dt)[pos_idx]

  def pred(self, batch: int, pos_idx):
    dt = jnp.dtype(self.c.dtype)
    e = self.query[...].astype(dt) + self.pos[...].astype(dt)[pos_idx]
    return jnp.broadcast_to(e, (batch,) + e.shape)

  def run(self, h, mask, past=None):
    """Blocks then the final norm; with `past` ((depth, B, S, heads, d) k and v) the keys of each layer are
    the cached ones followed by this call's. Returns (features, [(k, v) per layer])."""
    kvs = []
    for i, blk in enumerate(self.blocks):
      h, kv = blk(layers.constrain(h, ACT), mask, None if past is None else (past[0][i], past[1][i]))
      kvs.append(kv)
    return self.norm(h), kvs


def _to_teacher(module: nnx.Module) -> nnx.Module:
  """Turns every `nnx.Param` of `module` into a `Teacher` variable (same value and metadata)."""
  for _, node in nnx.iter_graph(module):
    if isinstance(node, nnx.Module):
      for name, v in list(vars(node).items()):
        if isinstance(v, nnx.Param):
          setattr(node, name, Teacher(v.get_value(), **v.get_metadata()))
  return module


class SelfTokenTransformer(nnx.Module):
  """The two-stream model (see the module docstring). Build under `nnx.use_eager_sharding(False)` or let
  `jaxlab.state` build it; the module keeps no `nnx.Rngs`."""

  def __init__(self, config: ARConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    with nnx.use_eager_sharding(False):
      self.trunk = Trunk(c, rngs)
      self.teacher = nnx.data(_to_teacher(nnx.clone(self.trunk)) if c.teacher else None)
      self.predictor = nnx.data(nnx.List([_dense(c.hidden, c.hidden, ("embed", None), c, rngs, bias=True),
                                          _dense(c.hidden, c.hidden, (None, "embed"), c, rngs, bias=True)])
                                if c.teacher else None)

  # -- full (training) forward ---------------------------------------------------------------------------

  def __call__(self, x, y, groups, *, kind: str | None = None):
    """Features of both streams under the mask of `groups`.

    Args:
      x: (B, N, token_dim) clean tokens.
      y: (B,) int labels (`num_classes` = null).
      groups: (N,) or (B, N) int group ids.
      kind: mask kind (default `config.mask`); "ref_causal" runs the reference stream only.

    Returns:
      (ref features (B, N, hidden), pred features (B, N, hidden)); for "ref_causal" (next-token regression)
      (next-token features (B, N, hidden): row i is the feature of the token BEFORE i (the last prefix token
      for i = 0), None).
    """
    c = self.config
    kind = c.mask if kind is None else kind
    b, n = x.shape[0], c.num_tokens
    if x.shape[1:] != (n, c.token_dim):
      raise ValueError(f"SelfTokenTransformer: tokens must be (batch, {n}, {c.token_dim}), got {x.shape}")
    idx = jnp.arange(n)
    parts = [self.trunk.prefix(y), self.trunk.ref(x, idx)]
    if kind != "ref_causal":
      parts.append(self.trunk.pred(b, idx))
    mask = masks_lib.two_stream_mask(groups, num_prefix=c.num_prefix, kind=kind, intra_pred=c.intra_pred)
    if mask.ndim == 2:
      mask = mask[None]
    t = c.num_prefix + n * (len(parts) - 1)
    h, _ = self.trunk.run(jnp.concatenate(parts, 1), mask[:, :t, :t])
    m = c.num_prefix
    if kind == "ref_causal":
      return h[:, m - 1:m + n - 1], None
    return h[:, m:m + n], h[:, m + n:]

  # -- JEPA teacher -------------------------------------------------------------------------------------

  def teacher_features(self, x, y):
    """(B, N, hidden) reference features of the EMA teacher with bidirectional attention (stop-gradient)."""
    if self.teacher is None:
      raise ConfigError("teacher_features: the model was built with teacher=False")
    c = self.config
    idx = jnp.arange(c.num_tokens)
    h = jnp.concatenate([self.teacher.prefix(y), self.teacher.ref(x, idx)], 1)
    out, _ = self.teacher.run(h, None)
    return jax.lax.stop_gradient(out[:, c.num_prefix:])

  def predict_teacher(self, f):
    """The JEPA predictor: (..., hidden) student features -> (..., hidden)."""
    return self.predictor[1](jax.nn.gelu(self.predictor[0](f)))

  def update_teacher(self, decay: float) -> None:
    """teacher <- decay * teacher + (1 - decay) * trunk (the current parameters, stop-gradient)."""
    if self.teacher is None:
      return
    t = nnx.to_pure_dict(nnx.state(self.teacher, Teacher))
    s = nnx.to_pure_dict(nnx.state(self.trunk, nnx.Param))
    nnx.update(self.teacher, jax.tree.map(lambda a, b: decay * a + (1.0 - decay) * jax.lax.stop_gradient(b), t, s))

  # -- KV-cached grouped decoding -----------------------------------------------------------------------

  def init_cache(self, batch: int, max_len: int | None = None) -> Cache:
    """An empty cache for `batch` sequences (default max_len: the prefix and every token)."""
    c = self.config
    max_len = c.num_prefix + c.num_tokens if max_len is None else int(max_len)
    shape = (c.depth, batch, max_len, c.heads, c.head_dim)
    return Cache(k=jnp.zeros(shape, jnp.dtype(c.dtype)), v=jnp.zeros(shape, jnp.dtype(c.dtype)),
                 length=jnp.zeros((), jnp.int32))

  def prefill(self, cache: Cache, y):
    """Writes the prefix (class) tokens of labels y (B,) into an empty cache: (prefix features (B, m, hidden),
    cache)."""
    h = self.trunk.prefix(y)
    m = h.shape[1]
    out, kvs = self.trunk.run(h, jnp.ones((1, m, m), bool))
    return out, self._write(cache, kvs, m)

  def extend(self, cache: Cache, ref_tokens, ref_pos, pred_pos, *, ref_causal: bool = False):
    """One decoding step: the previous group's reference tokens and the next group's prediction tokens.

    Args:
      cache: the cache holding every earlier group (and the prefix).
      ref_tokens: (B, k_r, token_dim) clean tokens of the group just sampled (k_r may be 0).
      ref_pos: (k_r,) their positions.
      pred_pos: (k_p,) positions of the next group (k_p may be 0).
      ref_causal: the reference tokens attend causally among themselves (next-token regression) instead of
        bidirectionally (one group).

    Returns:
      (ref features (B, k_r, hidden), pred features (B, k_p, hidden), the cache with the reference tokens
      appended).
    """
    c = self.config
    b, kr, kp = cache.k.shape[1], ref_tokens.shape[1], pred_pos.shape[0]
    parts = []
    if kr:
      parts.append(self.trunk.ref(ref_tokens, ref_pos))
    if kp:
      parts.append(self.trunk.pred(b, pred_pos))
    h = jnp.concatenate(parts, 1)
    slots = cache.k.shape[2]
    past = jnp.broadcast_to(jnp.arange(slots)[None, :] < cache.length, (kr + kp, slots))
    rr = jnp.tril(jnp.ones((kr, kr), bool)) if ref_causal else jnp.ones((kr, kr), bool)
    pp = jnp.ones((kp, kp), bool) if c.intra_pred else jnp.eye(kp, dtype=bool)
    new = jnp.concatenate([jnp.concatenate([rr, jnp.zeros((kr, kp), bool)], 1),
                           jnp.concatenate([jnp.ones((kp, kr), bool), pp], 1)], 0)
    mask = jnp.concatenate([past, new], 1)[None]
    out, kvs = self.trunk.run(h, mask, (cache.k, cache.v))
    cache = self._write(cache, [(k[:, :kr], v[:, :kr]) for k, v in kvs], kr) if kr else cache
    return out[:, :kr], out[:, kr:], cache

  def _write(self, cache: Cache, kvs, count: int) -> Cache:
    k = jnp.stack([kv[0] for kv in kvs]).astype(cache.k.dtype)
    v = jnp.stack([kv[1] for kv in kvs]).astype(cache.v.dtype)
    start = (0, 0, cache.length, 0, 0)
    return Cache(k=jax.lax.dynamic_update_slice(cache.k, k, start),
                 v=jax.lax.dynamic_update_slice(cache.v, v, start), length=cache.length + count)


def incremental_features(model: SelfTokenTransformer, x, y, sizes) -> jax.Array:
  """(B, N, hidden) prediction features computed group by group through the KV cache (the teacher-forced
  decoding of clean tokens x with group `sizes`): equal to `model(x, y, groups)[1]` up to float rounding."""
  _, cache = model.prefill(model.init_cache(x.shape[0]), y)
  feats, start, prev = [], 0, None
  for k in sizes:
    pos = jnp.arange(start, start + k)
    ref = x[:, :0] if prev is None else x[:, prev]
    _, f, cache = model.extend(cache, ref, jnp.arange(0) if prev is None else prev, pos)
    feats.append(f)
    prev, start = pos, start + k
  return jnp.concatenate(feats, 1)


def num_params(model: nnx.Module) -> int:
  """Trainable parameters (the teacher excluded)."""
  return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


