"""NAVAR: Neural Additive Vector AutoRegression (Bussmann, Nys, Latre 2021), MLP and LSTM backbones.

    x_j,t = beta_j + sum_i f_{i->j}(x_i,t-K..t-1) + eta_j,t

One small network per SOURCE variable i reads only i's K lags and outputs N contributions c_{i->j}, one per
target j; the prediction is the sum of contributions over sources plus a bias. The per-source network is
written for one source and `jax.vmap`ped over sources (parameters stacked on a leading source axis), so an
edge's contribution depends on its source's own history only: the model is additive and every contribution
is a function we can probe (ICE, `jaxlab.causal.ice`).

Parameters are plain pytrees, `{"src": {... leading axis N ...}, "bias": (N,)}`, so that an ensemble of
retrainings (bootstrap bands) is one more `vmap`. Training objective (official `train_NAVAR.py`):

    loss = mean_{b,j} (pred_bj - y_bj)^2 + (lambda / N) mean_b sum_{i,j} |c_bij|     (L1 on contributions)

Differences from the official code (deliberate): windows are weighted (bootstrap / padding / validation
masks) instead of gathered, the LSTM reads the K-lag window and predicts the next step from its last state
(the official LSTM predicts every step of a sequence), and nothing hard-codes a device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Params = Any
KINDS = ("mlp", "lstm")


@dataclasses.dataclass(frozen=True)
class Navar:
  """A NAVAR architecture (hyperparameters only; parameters are separate pytrees).

  Attributes:
    n: number of variables N.
    lags: K.
    hidden: hidden units H per source network.
    kind: "mlp" (K -> H ReLU [-> H ReLU]* -> N) or "lstm" (LSTM(1 -> H) over the K lags, then Linear(H -> N)).
    layers: hidden layers of the MLP (>= 1; the LSTM uses one layer).
  """
  n: int
  lags: int
  hidden: int = 32
  kind: str = "mlp"
  layers: int = 1

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"Navar.kind={self.kind!r}: use one of {KINDS}")

  # ---------------------------------------------------------------------------------------- parameters

  def init(self, key: jax.Array | np.random.Generator) -> Params:
    """Random parameters (PyTorch-default uniform(+-1/sqrt(fan_in)) per layer; output bias 1e-4 like the original).

    Args:
      key: a JAX key, or a numpy Generator (host-side init: no compile, handy for many small models).
    """
    n, k, h = self.n, self.lags, self.hidden
    if isinstance(key, np.random.Generator):
      rng = key

      def uni(_, shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return jnp.asarray(rng.uniform(-bound, bound, size=shape), jnp.float32)

      keys = iter([None] * 16)
    else:

      def uni(key, shape, fan_in):
        bound = 1.0 / jnp.sqrt(fan_in)
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound)

      keys = iter(jax.random.split(key, 16))
    if self.kind == "mlp":
      src = {"w1": uni(next(keys), (n, k, h), k), "b1": uni(next(keys), (n, h), k)}
      if self.layers > 1:
        src["wh"] = uni(next(keys), (n, self.layers - 1, h, h), h)
        src["bh"] = uni(next(keys), (n, self.layers - 1, h), h)
    else:
      src = {"wx": uni(next(keys), (n, 4 * h), h), "wh": uni(next(keys), (n, h, 4 * h), h),
             "b": uni(next(keys), (n, 4 * h), h)}
    src["w2"] = uni(next(keys), (n, h, n), h)
    src["b2"] = uni(next(keys), (n, n), h)
    return {"src": src, "bias": jnp.full((n,), 1e-4, jnp.float32)}

  # --------------------------------------------------------------------------------------------- apply

  def source_contributions(self, p_src: Params, x_bk: jax.Array) -> jax.Array:
    """One source's network.

    Args:
      p_src: that source's parameters (the "src" leaves without the source axis).
      x_bk: (B, K) float32, its K lags, oldest first.

    Returns:
      (B, N) its contributions to every target.
    """
    if self.kind == "mlp":
      h = jax.nn.relu(x_bk @ p_src["w1"] + p_src["b1"])
      for layer in range(self.layers - 1):
        h = jax.nn.relu(h @ p_src["wh"][layer] + p_src["bh"][layer])
    else:
      hdim = self.hidden

      def cell(carry, x_b):
        h, c = carry
        z = x_b[:, None] * p_src["wx"] + h @ p_src["wh"] + p_src["b"]
        i, f, g, o = (z[:, :hdim], z[:, hdim:2 * hdim], z[:, 2 * hdim:3 * hdim], z[:, 3 * hdim:])
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), None

      zeros = jnp.zeros((x_bk.shape[0], hdim), x_bk.dtype)
      (h, _), _ = jax.lax.scan(cell, (zeros, zeros), x_bk.T)
    return h @ p_src["w2"] + p_src["b2"]

  def contributions(self, params: Params, x_bnk: jax.Array) -> jax.Array:
    """All contributions, vmapped over sources.

    Args:
      params: model parameters.
      x_bnk: (B, N, K) float32 windows.

    Returns:
      (B, N_src, N_tgt) float32, [b, i, j] = c_{i->j} for window b.
    """
    c_nbj = jax.vmap(self.source_contributions, in_axes=(0, 1))(params["src"], x_bnk)
    return jnp.transpose(c_nbj, (1, 0, 2))

  def __call__(self, params: Params, x_bnk: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(pred (B, N), contributions (B, N, N)): pred_bj = sum_i c_bij + bias_j."""
    c = self.contributions(params, x_bnk)
    return c.sum(1) + params["bias"], c

  def num_params(self) -> int:
    shapes = jax.eval_shape(self.init, jax.random.key(0))
    return int(sum(x.size for x in jax.tree.leaves(shapes)))


def source_params(params: Params, i: int | jax.Array) -> Params:
  """Parameters of source i's network (the "src" leaves at index i)."""
  return jax.tree.map(lambda a: a[i], params["src"])


def navar_loss(model: Navar, params: Params, x_bnk: jax.Array, y_bn: jax.Array, w_b: jax.Array,
               lam: float) -> tuple[jax.Array, dict]:
  """Weighted NAVAR objective: MSE + (lambda / N) * sum_ij |c_ij|, averaged over windows with weights w.

  Args:
    model: the architecture.
    params: its parameters.
    x_bnk: (B, N, K) windows.
    y_bn: (B, N) targets.
    w_b: (B,) non-negative window weights (1 = use, 0 = padding / validation, counts = bootstrap).
    lam: the L1 strength lambda.

  Returns:
    (loss, {"mse", "l1"}), each a weighted mean over windows.
  """
  pred, c = model(params, x_bnk)
  mse_b = jnp.mean((pred - y_bn) ** 2, axis=1)
  l1_b = jnp.sum(jnp.abs(c), axis=(1, 2)) * (lam / model.n)
  wsum = jnp.maximum(w_b.sum(), 1e-12)
  mse = jnp.sum(w_b * mse_b) / wsum
  l1 = jnp.sum(w_b * l1_b) / wsum
  return mse + l1, {"mse": mse, "l1": l1}
