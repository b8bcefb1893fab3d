"""Fractal (multi-scale, shared-operator) Mamba: DF-Mamba's recursion as reusable NNX modules and losses.

Dynamic Fractal Mamba (ICML 2026) applies ONE Mamba block at every scale of a recursive coarse-graining
pyramid, with the time step Delta scaled by r^k at level k (one step at level k stands for r^k input steps),
a learned content-aware coarse-graining between levels, an aggregation of all levels, and auxiliary
reconstruction and cross-scale consistency losses. Only the abstract is public; the formalisation below is
our reconstruction (experiments/df_mamba/README.md lists what is confirmed) and is marked [A] where reconstructed:

    x^(0) = Embed(input)                                            (b, L, d)
    y^(k) = x^(k) + MambaBlock_theta(RMSNorm(x^(k)); delta_scale = s_k)     SAME theta at every level
            s_k = r^k ("fractal"), 1 ("no_delta_scale" ablation)
    x^(k+1) = CoarseGrain_phi(y^(k)):  x_j = sum_{i in window j} softmax_i(a . LN(y_i) / tau) V y_i   [A]
    levels k = 0 .. K-1 with K = 1 + log_r(L / min_len): a longer input adds levels, no new parameters.
    pooled_k = pool(y^(k)) ("last" position or "mean"), then one of two aggregations              [A]
      "softmax":  alpha = softmax_k(g . RMSNorm(pooled_k)), features = sum_k alpha_k pooled_k
                  (the pooled form of sum_k alpha_k Up_{r^k}(y^(k)))
      "top_down": s_K = 0, s_k = RMSNorm(pooled_k) + M s_{k+1} (M shared by all levels), features = s_0
                  (a recursion over levels like the one over scales: extra levels extend it)
    L_rec  = mean_k || Dec_psi(x^(k+1)) - sg(y^(k)) ||^2,  Dec = linear map to r steps        [A]
    L_cons = mean_k || CoarseGrain_phi(F_k(x^(k))) - F_{k+1}(CoarseGrain_phi(x^(k))) ||^2        [A]
            (F_k = the shared residual layer at scale s_k: "run then coarsen" ~ "coarsen then run at r Delta")

`mode="flat"` is the flat-Mamba baseline: `flat_layers` stacked layers on the input length, no recursion.

Finer sampling (the scale offset). A model trained on inputs sampled at step dt, applied to the same time
span sampled at dt / r^j (`offset=j`), must keep the time scale of every level: a level whose step is
r^m dt runs at Delta * r^m whatever the input's rate. Two ways of placing the finer input [A]:
    fine="levels"  (K + j levels) the j new finest levels run at Delta r^-j .. Delta r^-1 and are
                   coarse-grained into the K trained levels, which keep their scales 1 .. r^(K-1);
                   readout="all" aggregates every level, readout="coarse" only the K trained ones.
    fine="refine"  (K levels) level 0 runs on the fine input at Delta r^-j with its causal conv's taps
                   r^j steps apart (the trained taps, dt apart), and is read every r^j-th step (at the
                   trained steps); levels 1 .. K-1 follow as trained.
With exact ZOH (`discretization="zoh"`) and an input held constant over each trained step, "refine"
reproduces the trained-rate model exactly: r^j steps at Delta r^-j are one step at Delta, so every level's
states and the output equal the trained-rate model's. "levels" does not (its new levels' outputs vary
inside a held step, so their coarse-graining is not the trained input); for it the identity holds level by
level: the finest level read at the trained steps equals the trained level 0 when the conv is pointwise.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.nn.layers import RMSNorm
from jaxlab.nn.mamba import MambaLayer

MODES = ("fractal", "no_delta_scale", "flat")
FINE = ("levels", "refine")
READOUTS = ("all", "coarse")


def num_levels(length: int, ratio: int, min_len: int) -> int:
  """K = 1 + log_r(length / min_len): levels of lengths length, length / r, ..., min_len.

  Raises:
    ValueError: `length` is not min_len * r^j for an integer j >= 0.
  """
  k, n = 1, length
  while n > min_len and n % ratio == 0:
    n //= ratio
    k += 1
  if n != min_len:
    raise ValueError(f"input length {length} must be min_len * ratio^j (min_len={min_len}, ratio={ratio}); "
                     "pad or crop the lookback, or change model.min_len")
  return k


def upsample(y_bld: jax.Array, factor: int) -> jax.Array:
  """Repeats every step `factor` times: (b, l, d) -> (b, l * factor, d)."""
  return jnp.repeat(y_bld, factor, axis=1)


class CoarseGrain(nnx.Module):
  """Content-aware windowed softmax pooling over non-overlapping windows of `ratio` steps [A].

  x_j = sum_{i in window j} w_i V y_i,  w = softmax over the window of (a . LayerNorm(y_i)) / tau.
  Initialised to plain window averaging (a = 0, V = I).

  Args:
    d_model: width.
    ratio: window length r.
    tau: softmax temperature.
    rngs: unused randomness (kept for a uniform constructor signature).
  """

  def __init__(self, d_model: int, ratio: int = 2, tau: float = 1.0, *, rngs: nnx.Rngs):
    del rngs
    self.ratio, self.tau = int(ratio), float(tau)
    self.norm = nnx.LayerNorm(d_model, rngs=nnx.Rngs(0))
    self.score = nnx.Param(jnp.zeros((d_model,), jnp.float32))
    self.value = nnx.Param(jnp.eye(d_model, dtype=jnp.float32))

  def weights(self, y_bld: jax.Array) -> jax.Array:
    """(b, l, d) -> per-window softmax weights (b, l / r, r)."""
    b, l, _ = y_bld.shape
    s = self.norm(y_bld) @ self.score[...] / self.tau
    return jax.nn.softmax(s.reshape(b, l // self.ratio, self.ratio), axis=-1)

  def __call__(self, y_bld: jax.Array) -> jax.Array:
    """(b, l, d) -> (b, l / r, d); l must be divisible by r."""
    b, l, d = y_bld.shape
    if l % self.ratio:
      raise ValueError(f"CoarseGrain: length {l} is not divisible by the ratio {self.ratio}")
    v = (y_bld @ self.value[...]).reshape(b, l // self.ratio, self.ratio, d)
    return jnp.einsum("bjr,bjrd->bjd", self.weights(y_bld), v)


class DilatedConv(nnx.Module):
  """A Mamba block's causal depthwise conv with its taps `dilation` steps apart (the same kernel and bias).

  out_t = sum_j w_j x_{t - (k - 1 - j) dilation} + b (zero left padding), the taps summed in the order of
  the block's own conv, so at dilation m on a sequence sampled m times finer the outputs at every m-th step
  equal the block's conv on the subsampled sequence bit for bit.

  Args:
    conv: the block's conv (`MambaBlock.conv1d`: `kernel` (k, dim), optional `bias` (dim,), `width` k).
    dilation: distance between taps (steps).
  """

  def __init__(self, conv: nnx.Module, dilation: int):
    self.kernel, self.bias, self.width, self.dilation = conv.kernel, conv.bias, conv.width, int(dilation)

  def __call__(self, x_bld: jax.Array) -> jax.Array:
    """(batch, length, dim) -> (batch, length, dim) float32."""
    length, m = x_bld.shape[1], self.dilation
    xp = jnp.pad(x_bld, ((0, 0), ((self.width - 1) * m, 0), (0, 0)))
    w = self.kernel[...]
    acc = xp[:, :length].astype(jnp.float32) * w[0]
    for j in range(1, self.width):
      acc = acc + xp[:, j * m:j * m + length].astype(jnp.float32) * w[j]
    if self.bias is not None:
      acc = acc + self.bias[...]
    return acc


class FractalMamba(nnx.Module):
  """DF-Mamba backbone + a task head (forecasting or classification).

  Args:
    in_features: input features per step (channels, or pixels per patch).
    out_features: outputs of the head (horizon * channels, or classes).
    d_model: width.
    mode: "fractal" (Delta * r^k), "no_delta_scale" (the ablation: scale 1 at every level) or "flat".
    ratio: coarse-graining ratio r.
    min_len: length of the coarsest level (the number of levels follows from the input length).
    pool: "last" (forecasting) or "mean" (classification) read-out of each level.
    aggregate: "softmax" or "top_down" level aggregation (see the module docstring).
    flat_layers: stacked layers for mode="flat" (the fractal modes always use ONE shared layer).
    tau: coarse-graining softmax temperature.
    chunk: 0, or a window W: every level's scan restarts every W of its steps (aligned to the sequence end),
      so a level's receptive field is W of its own steps (W r^k input steps) and the receptive field grows
      only through depth [A]. A longer input then leaves the read-out of the training levels unchanged.
    d_state, d_conv, expand: Mamba block sizes.
    scan_impl: selective-scan impl (see `jaxlab.kernels.selective_scan`).
    discretization: "euler" (Mamba's B_bar = Delta B) or "zoh" (exact for B too, so that one step at
      r^k Delta is exactly r^k steps at Delta for a held input; see `MambaBlock`).
    rngs: initialisation randomness.
  """

  def __init__(self, in_features: int, out_features: int, d_model: int = 32, *, mode: str = "fractal",
               ratio: int = 2, min_len: int = 32, pool: str = "last", aggregate: str = "softmax",
               flat_layers: int = 1, tau: float = 1.0, chunk: int = 0, d_state: int = 16, d_conv: int = 4,
               expand: float = 2, scan_impl: str = "auto", discretization: str = "euler", rngs: nnx.Rngs):
    if mode not in MODES:
      raise ValueError(f"FractalMamba: mode must be one of {MODES}, got {mode!r}")
    if pool not in ("last", "mean"):
      raise ValueError(f"FractalMamba: pool must be 'last' or 'mean', got {pool!r}")
    if aggregate not in ("softmax", "top_down"):
      raise ValueError(f"FractalMamba: aggregate must be 'softmax' or 'top_down', got {aggregate!r}")
    if ratio < 2 or min_len < 1:
      raise ValueError(f"FractalMamba: need ratio >= 2 and min_len >= 1, got {ratio}, {min_len}")
    self.mode, self.ratio, self.min_len, self.pool = mode, int(ratio), int(min_len), pool
    self.aggregate = aggregate
    self.chunk = int(chunk)
    if self.chunk < 0 or (self.chunk and min_len % self.chunk):
      raise ValueError(f"FractalMamba: chunk={chunk} must be 0 or divide min_len={min_len}")
    with nnx.use_eager_sharding(False):   # logical names are mapped to the mesh by jaxlab.state
      self.embed = nnx.Linear(in_features, d_model, rngs=rngs)
      n_layers = flat_layers if mode == "flat" else 1
      self.layers = nnx.List([MambaLayer(d_model, eps=1e-5, dtype=jnp.float32, rngs=rngs, d_state=d_state,
                                         d_conv=d_conv, expand=expand, scan_impl=scan_impl,
                                         discretization=discretization)
                              for _ in range(n_layers)])
      fractal = mode != "flat"   # the flat baseline has no coarse-graining, decoder or level weights
      self.coarse = CoarseGrain(d_model, ratio, tau, rngs=rngs) if fractal else None
      self.decoder = nnx.Linear(d_model, ratio * d_model, rngs=rngs) if fractal else None
      self.level_norm = RMSNorm(d_model) if fractal else None
      self.level_score = nnx.Param(jnp.zeros((d_model,), jnp.float32)) if fractal else None
      self.top_down = (nnx.Param(0.5 * jnp.eye(d_model, dtype=jnp.float32))
                       if fractal and aggregate == "top_down" else None)
      self.head_norm = RMSNorm(d_model)
      self.head = nnx.Linear(d_model, out_features, rngs=rngs)

  def scale(self, k: int, offset: int = 0) -> float:
    """The Delta multiplier of level k: r^(k - offset) (an input sampled r^offset times finer than in
    training, see the module docstring), 1 for the ablation."""
    return float(self.ratio) ** (k - offset) if self.mode == "fractal" else 1.0

  def layer(self, x_bld: jax.Array, k: int, offset: int = 0, dilation: int = 1) -> jax.Array:
    """F_k: the shared residual Mamba layer at level k's time scale (scanned per chunk when `chunk`).

    Args:
      x_bld: (b, l, d) level input.
      k: level index (its Delta multiplier is `scale(k, offset)`).
      offset: the input's sampling offset (see `scale`).
      dilation: distance between the causal conv's taps (`DilatedConv`); 1 is the block's own conv.
    """
    b, l, d = x_bld.shape
    layer, scale = self.layers[0], self.scale(k, offset)
    chunk = self.chunk * dilation
    conv = layer.mixer.conv1d
    if dilation > 1:   # the same parameters, read with spread taps for this call only
      layer.mixer.conv1d = DilatedConv(conv, dilation)
    try:
      if chunk and l > chunk:
        return layer(x_bld.reshape(b * (l // chunk), chunk, d), scale).reshape(b, l, d)
      return layer(x_bld, scale)
    finally:
      layer.mixer.conv1d = conv

  def levels(self, inputs_blc: jax.Array, max_levels: int | None = None, offset: int = 0,
             fine: str = "levels") -> tuple[list[jax.Array], list[jax.Array]]:
    """Runs the recursion: ([x^(0..K-1)] level inputs, [y^(0..K-1)] level outputs), lengths L / r^k.

    Args:
      inputs_blc: (b, L, in_features).
      max_levels: optional cap on K (the coarsest levels are not computed).
      offset: j >= 0: the input is sampled r^j times finer than the training input (scale offset; see the
        module docstring). 0 is the training rate.
      fine: "levels" or "refine", how a finer input is placed (used when offset > 0). With "refine",
        level 0's entries are read at the trained steps (length L / r^j).
    """
    if fine not in FINE:
      raise ValueError(f"FractalMamba: fine must be one of {FINE}, got {fine!r}")
    if offset < 0:
      raise ValueError(f"FractalMamba: offset must be >= 0, got {offset}")
    x = self.embed(inputs_blc)
    if self.mode == "flat":
      for layer in self.layers:
        x = layer(x, None)
      return [x], [x]
    length = inputs_blc.shape[1]
    refine = fine == "refine" and offset > 0
    m = self.ratio ** offset
    if refine and length % m:
      raise ValueError(f"FractalMamba: input length {length} is not divisible by ratio^offset = {m}")
    k_levels = num_levels(length // m if refine else length, self.ratio, self.min_len)
    if max_levels is not None:
      k_levels = max(1, min(k_levels, int(max_levels)))
    xs, ys = [], []
    for k in range(k_levels):
      if refine and k == 0:   # level 0 on the fine input at Delta r^-j, read at the trained steps
        y = self.layer(x, 0, offset, dilation=m)[:, m - 1::m]
        x = x[:, m - 1::m]
      else:
        y = self.layer(x, k, 0 if refine else offset)
      xs.append(x)
      ys.append(y)
      if k + 1 < k_levels:
        x = self.coarse(y)
    return xs, ys

  def features(self, ys: Sequence[jax.Array], n_active: jax.Array | int | None = None, skip: int = 0
               ) -> tuple[jax.Array, jax.Array]:
    """Level aggregation: (features (b, d), alpha (b, K'); alpha is zeros for "top_down") from the levels.

    Args:
      ys: level outputs (finest first).
      n_active: optional (traced) number of finest levels to aggregate (level dropout in training [A]).
      skip: leave the `skip` finest levels out (readout="coarse" for a finer input); K' = K - skip.
    """
    ys = list(ys)[skip:]
    pooled = jnp.stack([y[:, -1] if self.pool == "last" else y.mean(1) for y in ys], axis=1)   # (b, K', d)
    if len(ys) == 1:
      return pooled[:, 0], jnp.ones(pooled.shape[:2], pooled.dtype)
    active = jnp.arange(len(ys)) < (len(ys) if n_active is None else n_active)       # (K',)
    if self.aggregate == "top_down":
      normed = self.level_norm(pooled)
      s = jnp.zeros_like(pooled[:, 0])
      for k in reversed(range(len(ys))):
        s = jnp.where(active[k], normed[:, k] + s @ self.top_down[...], 0.0)
      return s, jnp.zeros(pooled.shape[:2], pooled.dtype)
    logits = jnp.where(active, self.level_norm(pooled) @ self.level_score[...], -jnp.inf)
    alpha = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bk,bkd->bd", alpha, pooled), alpha

  def __call__(self, inputs_blc: jax.Array, max_levels: int | None = None, offset: int = 0,
               fine: str = "levels", readout: str = "all") -> jax.Array:
    """(b, L, in_features) -> (b, out_features).

    Args:
      inputs_blc: (b, L, in_features).
      max_levels: optional cap on the levels (see `levels`).
      offset, fine: a finer-sampled input (see `levels` and the module docstring).
      readout: "all" levels aggregated, or "coarse": the `offset` new finest levels of fine="levels" left
        out of the aggregation (they reach the trained levels through the coarse-graining only).
    """
    if readout not in READOUTS:
      raise ValueError(f"FractalMamba: readout must be one of {READOUTS}, got {readout!r}")
    ys = self.levels(inputs_blc, max_levels, offset, fine)[1]
    return self.head_output(ys, self.readout_skip(offset, fine, readout))

  def readout_skip(self, offset: int, fine: str, readout: str) -> int:
    """How many finest levels the aggregation leaves out: `offset` for fine="levels", readout="coarse"."""
    return offset if (readout == "coarse" and fine == "levels" and self.mode != "flat") else 0

  def head_output(self, ys: Sequence[jax.Array], skip: int = 0) -> jax.Array:
    """The head on the aggregated levels (see `features`): (b, out_features)."""
    return self.head(self.head_norm(self.features(ys, skip=min(skip, len(ys) - 1))[0]))

  def forward_with_aux(self, inputs_blc: jax.Array, max_levels: int | None = None,
                       n_active: jax.Array | int | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Head output and the auxiliary losses {"rec", "cons"} (zeros for a single level); see `levels`.

    Args:
      inputs_blc: (b, L, in_features) at the training rate.
      max_levels: optional cap on the number of levels computed.
      n_active: optional (traced) number of levels aggregated (see `features`).
    """
    xs, ys = self.levels(inputs_blc, max_levels)
    out = self.head(self.head_norm(self.features(ys, n_active)[0]))
    return out, {"rec": reconstruction_loss(self, xs, ys), "cons": consistency_loss(self, xs)}


def reconstruction_loss(model: FractalMamba, xs: Sequence[jax.Array], ys: Sequence[jax.Array]) -> jax.Array:
  """mean_k || Dec(x^(k+1)) - stop_gradient(y^(k)) ||^2 (per element) [A]: coarse levels keep fine detail."""
  if len(xs) < 2:
    return jnp.zeros((), jnp.float32)
  terms = []
  for k in range(len(xs) - 1):
    b, l, d = ys[k].shape
    rec = model.decoder(xs[k + 1]).reshape(b, l, d)
    terms.append(jnp.mean((rec - jax.lax.stop_gradient(ys[k])) ** 2))
  return jnp.mean(jnp.stack(terms))


def consistency_loss(model: FractalMamba, xs: Sequence[jax.Array]) -> jax.Array:
  """mean_k || CG(F_k(x^(k))) - F_{k+1}(CG(x^(k))) ||^2 (per element) [A].

  "Run at scale k then coarsen" should commute with "coarsen then run at scale k + 1" (self-similarity);
  CG(F_k(x^(k))) is the next level's input x^(k+1).
  """
  if len(xs) < 2:
    return jnp.zeros((), jnp.float32)
  terms = [jnp.mean((xs[k + 1] - model.layer(model.coarse(xs[k]), k + 1)) ** 2) for k in range(len(xs) - 1)]
  return jnp.mean(jnp.stack(terms))


def count_params(model: nnx.Module) -> int:
  """Number of parameters of an NNX module."""
  return int(sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param))))
