"""Temperature scaling (Guo et al. 2017): one scalar T per predictor, fit by the (weighted) validation NLL of
softmax(logits / T).

`fit_temperature` fits one; `fit_expert_temperatures` fits one per expert of a mixture, each on the validation
rows weighted by that expert's routing weight: the one-hot route for hard routing (each expert calibrated on
the inputs routed to it), the gate g_k(x) for soft routing (the gate-weighted NLL). The NLL is convex in 1/T, so
a bounded scalar search over log T finds the optimum (scipy's `minimize_scalar`, bounded Brent).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

from jaxlab.errors import ConfigError

LOG_T_BOUNDS = (float(np.log(0.05)), float(np.log(20.0)))


@jax.jit
def weighted_nll(log_t, logits, labels, weights):
  """sum_i w_i * CE(softmax(logits_i / T), y_i) / sum_i w_i, T = exp(log_t)."""
  logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32) / jnp.exp(log_t), axis=-1)
  nll = -jnp.take_along_axis(logp, jnp.asarray(labels)[:, None], axis=-1)[:, 0]
  return jnp.sum(weights * nll) / jnp.maximum(jnp.sum(weights), 1e-30)


def fit_temperature(logits, labels, weights=None, bounds=LOG_T_BOUNDS, xatol: float = 1e-6) -> float:
  """The T minimising the (weighted) NLL of softmax(logits / T) on (logits (N, C), labels (N,))."""
  logits = jnp.asarray(logits, jnp.float32)
  if logits.ndim != 2 or logits.shape[0] != len(labels):
    raise ConfigError(f"fit_temperature needs logits (N, C) and N labels; got {logits.shape} and {len(labels)}")
  w = jnp.ones(logits.shape[0], jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
  if float(jnp.sum(w)) <= 0:
    raise ConfigError("fit_temperature: the weights sum to 0 (an expert that no validation row is routed to); "
                      "use more validation data or fewer experts")
  labels = jnp.asarray(labels)
  res = optimize.minimize_scalar(lambda lt: float(weighted_nll(jnp.float32(lt), logits, labels, w)),
                                 bounds=bounds, method="bounded", options={"xatol": xatol})
  return float(np.exp(res.x))


def fit_expert_temperatures(expert_logits, labels, route_weights) -> np.ndarray:
  """One temperature per expert: expert_logits (N, K, C), route_weights (N, K) (one-hot for hard routing, the
  gate for soft routing). Returns (K,) temperatures."""
  expert_logits = jnp.asarray(expert_logits, jnp.float32)
  route_weights = jnp.asarray(route_weights, jnp.float32)
  if expert_logits.ndim != 3 or route_weights.shape != expert_logits.shape[:2]:
    raise ConfigError(f"fit_expert_temperatures needs expert logits (N, K, C) and route weights (N, K); got "
                      f"{expert_logits.shape} and {route_weights.shape}")
  return np.array([fit_temperature(expert_logits[:, k], labels, route_weights[:, k])
                   for k in range(expert_logits.shape[1])], np.float64)
