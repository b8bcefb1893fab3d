"""DF-Mamba's pieces for the experiment: data per task, the model factory, the loss, the ZOH identity check.

The model and the auxiliary losses live in `jaxlab.nn.multiscale` (reusable); this module holds the glue:

* `make_data(config)`: train source (random-access windows) + evaluation arrays at every eval length,
  z-scored with the training split's statistics (forecasting) or pixel sequences in Hilbert order (images);
  for the synthetic task also the finer-rate test set (`fine_data`: the same time span sampled
  `data.fine_rate` times finer, the same coarse targets).
* `loss_fn`: L = L_task + lambda_rec L_rec + lambda_cons L_cons (task: MSE, or cross-entropy for images).
* `zoh_check(config)`: the closed-form Delta-scaling identity: for an LTI SSM with exact ZOH,
  A_bar = exp(Delta A), B_bar = (Delta A)^-1 (exp(Delta A) - 1) B, r steps at Delta on an input constant
  over each window of r equal one step at r Delta; with Mamba's Euler rule (B_bar = Delta B, what the
  selective scan computes) the identity is approximate, error <= r Delta |A|_max / 2 + 1e-3 (relative).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.data import pipeline, synthetic, timeseries
from jaxlab.errors import ConfigError
from jaxlab.kernels.selective_scan import selective_scan
from jaxlab.nn import multiscale

IMAGE_TASKS = ("digits", "patch_camelyon")


@dataclasses.dataclass
class Data:
  """Task data: `train` (a Source of {"x", "y"}), `evals` {length label: {"x", "y"} arrays}, and sizes.

  `fine` (synthetic forecasting with `data.fine_rate` > 1, else None): {"x": (n, L m, C) the lookback span
  sampled m = fine_rate times finer, "x_sub": (n, L, C) the same taken every m-th sample (the training
  rate), "y": (n, H, C) the coarse targets}, z-scored with the training statistics.
  """
  train: Any
  evals: dict[str, dict[str, np.ndarray]]
  in_features: int
  out_features: int
  classification: bool
  info: dict[str, Any]
  fine: dict[str, np.ndarray] | None = None


def fine_data(c, rng: np.random.Generator, scaler: timeseries.Scaler) -> dict[str, np.ndarray]:
  """The finer-rate test set: `data.test_series` series of the synthetic generator at step 1 / m (m = fine_rate).

  Fine sample i lies at time i / m. The lookback is the L m samples at times c - L + 1/m .. c (c = L, an
  integer time); every m-th of them, at the integer times c - L + 1 .. c, is a training-rate lookback of L
  steps (exactly distributed as the training series); the targets are the H samples at times c + 1 .. c + H.

  Returns:
    {"x": (n, L m, C), "x_sub": (n, L, C), "y": (n, H, C)} float32, z-scored by `scaler`.
  """
  d, m = c.data, int(c.data.fine_rate)
  lb, h = d.lookback, d.horizon
  f = timeseries.multiscale_series(rng, d.test_series, (lb + h) * m + 1, d.channels, periods=tuple(d.periods),
                                   rho=d.rho, sigma=d.sigma, step=1.0 / m)
  f = scaler.transform(f)
  x = f[:, 1:lb * m + 1]
  return {"x": x, "x_sub": x[:, m - 1::m], "y": f[:, lb * m + m::m][:, :h]}


def _forecast_data(c, train_values, test_values, info, fine_rng=None) -> Data:
  """Train windows at the training lookback; test windows carry the longest eval lookback."""
  d = c.data
  scaler = timeseries.Scaler(np.concatenate([v.reshape(-1, v.shape[-1]) for v in train_values]))
  train = timeseries.WindowSource([scaler.transform(v) for v in train_values], d.lookback, d.horizon)
  longest = max(d.eval_lookbacks)
  test = timeseries.WindowSource([scaler.transform(v) for v in test_values], longest, d.horizon,
                                 stride=max(1, d.horizon // 2) if d.name != "synthetic" else 1)
  full = test[np.arange(len(test))]
  evals = {str(lb): {"x": full["x"][:, longest - lb:], "y": full["y"]} for lb in d.eval_lookbacks}
  ch = 1 if c.model.channel_independent else train_values[0].shape[-1]
  fine = fine_data(c, fine_rng, scaler) if fine_rng is not None else None
  info = {**info, "train_windows": len(train), "test_windows": len(test)}
  if fine is not None:
    info["fine_test_windows"] = len(fine["y"])
  return Data(train, evals, ch, d.horizon * ch, False, info, fine)


def _image_data(c) -> Data:
  d = c.data
  if d.name == "digits":
    tr, te = synthetic.digits("train"), synthetic.digits("test")
    prep = lambda im: im.astype(np.float32)[..., None] if im.ndim == 3 else im.astype(np.float32)
    train_im, test_im = prep(tr["image"]), prep(te["image"])
    train_y, test_y, classes = tr["label"], te["label"], 10
  else:  # patch_camelyon (tfds; full scale, the user's TFDS data_dir)
    from jaxlab.data.tfds import TfdsSource  # pylint: disable=g-import-not-at-top
    kw = dict(data_dir=d.data_dir or None, keys=("image", "label"))
    tr = TfdsSource("patch_camelyon", "train", **kw)
    te = TfdsSource("patch_camelyon", "test", **kw)
    tr, te = tr[np.arange(len(tr))], te[np.arange(len(te))]
    train_im, test_im = tr["image"].astype(np.float32) / 255.0, te["image"].astype(np.float32) / 255.0
    train_y, test_y, classes = tr["label"], te["label"], 2
  base = train_im.shape[1]
  if base != d.image_size:
    raise ConfigError(f"config.data.image_size={d.image_size} but the {d.name} images are {base}x{base}")
  mean, std = train_im.mean(), train_im.std()
  seq = lambda im, size: timeseries.images_to_sequences(
      (np.kron(im, np.ones((1, size // base, size // base, 1), np.float32)) - mean) / std, d.patch)
  train = pipeline.ArraySource({"x": seq(train_im, base), "y": np.asarray(train_y, np.int32)})
  evals = {str(s): {"x": seq(test_im, s), "y": np.asarray(test_y, np.int32)} for s in d.eval_image_sizes}
  return Data(train, evals, d.patch * d.patch * train_im.shape[-1], classes, True,
              {"train_images": len(train), "test_images": len(test_y)})


def make_data(c) -> Data:
  """Builds the task's data from `config.data` (see the config's docstring for the names)."""
  d = c.data
  if d.name in IMAGE_TASKS:
    return _image_data(c)
  if d.name == "synthetic":
    rng = np.random.default_rng([c.seed, 7])
    kw = dict(periods=tuple(d.periods), rho=d.rho, sigma=d.sigma)
    train = timeseries.multiscale_series(rng, d.train_series, d.train_length, d.channels, **kw)
    test = timeseries.multiscale_series(rng, d.test_series, max(d.eval_lookbacks) + d.horizon, d.channels, **kw)
    fine_rng = np.random.default_rng([c.seed, 7, 1]) if d.fine_rate > 1 else None   # its own stream
    return _forecast_data(c, list(train), list(test), {}, fine_rng)
  if d.name == "co2":
    values, names = timeseries.co2_series(), ["co2"]
  else:
    if not d.path:
      raise ConfigError("config.data.name='csv' needs --config.data.path=FILE.csv (e.g. ETTh1.csv, weather.csv)")
    values, names = timeseries.read_csv(d.path, tuple(d.columns) or None)
  borders = timeseries.split_borders(d.path or d.name, len(values), max(d.eval_lookbacks))
  (a0, a1), (t0, t1) = borders["train"], borders["test"]
  return _forecast_data(c, [values[a0:a1]], [values[t0:t1]], {"columns": names})


def make_model(c, mode: str, data: Data, rngs) -> multiscale.FractalMamba:
  """The model for one of config.model.models."""
  m = c.model
  return multiscale.FractalMamba(
      data.in_features, data.out_features, m.d_model, mode=mode, ratio=m.ratio, min_len=m.min_len,
      pool="mean" if data.classification else "last", aggregate=m.aggregate, flat_layers=m.flat_layers,
      tau=m.tau, chunk=m.chunk, d_state=m.d_state, d_conv=m.d_conv, expand=m.expand, scan_impl=m.scan_impl,
      discretization=m.discretization, rngs=rngs)


def channels_first(x_blc: jax.Array) -> jax.Array:
  """Channel independence: (b, L, C) -> (b C, L, 1), every channel a univariate series."""
  b, l, c = x_blc.shape
  return jnp.transpose(x_blc, (0, 2, 1)).reshape(b * c, l, 1)


def model_inputs(c, data: Data, x):
  """The model's input sequences for a batch (channel-independent forecasting when configured)."""
  return channels_first(x) if (c.model.channel_independent and not data.classification) else x


def fine_offset(c) -> int:
  """j with data.fine_rate = model.ratio^j: the finer test input's scale offset (0 without one)."""
  rate, r = int(c.data.fine_rate), int(c.model.ratio)
  j = 0
  while rate > 1 and rate % r == 0:
    rate //= r
    j += 1
  if rate > 1:
    raise ConfigError(f"config.data.fine_rate={c.data.fine_rate} must be a power of model.ratio={r} (or 0 / 1)")
  return j


def predict(c, data: Data, model, x, out=None, max_levels=None, **call_kw):
  """(b, L, C) -> forecasts (b, H, C) or logits (b, classes).

  `out` is the model's raw output when already computed; `max_levels` caps the model's levels;
  `call_kw` (offset, fine, readout) go to the model (a finer-sampled input, see `FractalMamba.levels`).
  """
  out = model(model_inputs(c, data, x), max_levels, **call_kw) if out is None else out
  if data.classification:
    return out
  b, _, ch = x.shape
  if c.model.channel_independent:
    return jnp.transpose(out.reshape(b, ch, -1), (0, 2, 1))
  return out.reshape(b, -1, ch)


def task_loss(out, y, classification: bool):
  """Per-example task loss: cross-entropy (images) or MSE over horizon and channels (forecasting)."""
  if classification:
    return optax.softmax_cross_entropy_with_integer_labels(out, y)
  return jnp.mean((out.reshape(y.shape) - y) ** 2, axis=(1, 2))


def make_loss_fn(c, data: Data):
  """(model, batch, key) -> (loss, metrics): L_task + lambda_rec L_rec + lambda_cons L_cons."""
  lam_rec, lam_cons = c.method.lambda_rec, c.method.lambda_cons

  def loss_fn(model, batch, key):
    n_active = None
    if c.model.level_dropout > 0 and model.mode != "flat":   # [A] train the level recursion on truncations
      k_all = multiscale.num_levels(batch["x"].shape[1], model.ratio, model.min_len)
      k1, k2 = jax.random.split(key)
      n_active = jnp.where(jax.random.bernoulli(k1, c.model.level_dropout),
                           jax.random.randint(k2, (), 1, k_all + 1), k_all)
    raw, aux = model.forward_with_aux(model_inputs(c, data, batch["x"]), n_active=n_active)
    out = predict(c, data, model, batch["x"], raw)
    task = jnp.mean(task_loss(out, batch["y"], data.classification))
    total = task + lam_rec * aux["rec"] + lam_cons * aux["cons"]
    return total, {"task": task, "rec": aux["rec"], "cons": aux["cons"]}
  return loss_fn


# --- the closed-form Delta-scaling identity -------------------------------------------------------------

def zoh_discretise(a_n: jax.Array, b_n: jax.Array, delta: float | jax.Array) -> tuple[jax.Array, jax.Array]:
  """Exact zero-order hold for a diagonal LTI SSM: (A_bar, B_bar) = (exp(dA), (dA)^-1 (exp(dA) - 1) B)."""
  da = delta * a_n
  return jnp.exp(da), jnp.expm1(da) / a_n * b_n


def lti_scan(a_bar: jax.Array, b_bar: jax.Array, u_l: jax.Array) -> jax.Array:
  """States h_t = a_bar h_{t-1} + b_bar u_t for t = 1..L (h_0 = 0): (L,) input -> (L, N) states."""
  def step(h, u):
    h = a_bar * h + b_bar * u
    return h, h
  return jax.lax.scan(step, jnp.zeros_like(a_bar), u_l)[1]


def zoh_check(c, key) -> dict[str, float]:
  """Fine (r steps at Delta) vs coarse (1 step at r Delta) on window-constant inputs.

  Returns:
    {"zoh/max_err": exact-ZOH max |h_fine[r j] - h_coarse[j]|, "euler/rel_err": the same (relative) for
    Mamba's Euler rule through the library's selective scan, "euler/bound": r Delta |A|_max / 2 + 1e-3}.
  """
  r, delta, n, windows = int(c.method.zoh_ratio), float(c.method.zoh_delta), 16, 64
  k1, k2 = jax.random.split(key)
  a_n = -jnp.arange(1, n + 1, dtype=jnp.float32)                     # Mamba's S4D-real init
  b_n = jax.random.normal(k1, (n,))
  u_coarse = jax.random.normal(k2, (windows,))
  u_fine = jnp.repeat(u_coarse, r)
  h_fine = lti_scan(*zoh_discretise(a_n, b_n, delta), u_fine)[r - 1::r]
  h_coarse = lti_scan(*zoh_discretise(a_n, b_n, r * delta), u_coarse)
  out = {"zoh/max_err": float(jnp.max(jnp.abs(h_fine - h_coarse)))}
  # Euler rule (Mamba): the selective scan with delta and delta * r; states read through C = e_i.
  a = a_n[None, :]
  eye = jnp.eye(n, dtype=jnp.float32)

  def states(u_l, d):
    length = u_l.shape[0]
    u = jnp.broadcast_to(u_l[None, None, :, None], (n, 1, length, 1)).reshape(n, length, 1)
    bb = jnp.broadcast_to(b_n, (n, length, n))
    cc = jnp.broadcast_to(eye[:, None, :], (n, length, n))
    dd = jnp.full((n, length, 1), d, jnp.float32)
    y = selective_scan(u, dd, a, bb, cc, impl=c.model.scan_impl)   # (n, length, 1): state i in row i
    return y[:, :, 0].T                                             # (length, n)
  e_fine = states(u_fine, delta)[r - 1::r]
  e_coarse = states(u_coarse, r * delta)
  rel = jnp.linalg.norm(e_fine - e_coarse) / jnp.linalg.norm(e_fine)
  out["euler/rel_err"] = float(rel)
  out["euler/bound"] = r * delta * float(jnp.max(jnp.abs(a_n))) / 2 + 1e-3
  return out
