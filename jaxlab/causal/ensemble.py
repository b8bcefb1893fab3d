"""Training an ensemble of NAVAR models at once: member 0 on the data, the others on bootstrap resamples.

All members share the windows; each has its own window weights (member 0: ones on the training windows;
member m > 0: multinomial bootstrap counts over them) and its own initialisation, and they train in one
compiled step: the retrainings behind the bootstrap bands cost no extra compile. Full-batch gradient steps (the
windows fit in memory for the data sets NAVAR is used on); the window axis may be sharded over the "data"
mesh axis (the loss is a weighted mean, so the sharded gradient equals the single-device one).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.causal.navar import Navar, navar_loss


def bootstrap_weights(rng: np.random.Generator, train_mask_b: np.ndarray, members: int) -> np.ndarray:
  """(members, B) float32 window weights: row 0 = the training mask, rows 1.. = bootstrap counts over it."""
  idx = np.flatnonzero(train_mask_b)
  w = np.zeros((members, len(train_mask_b)), np.float32)
  w[0, idx] = 1.0
  for m in range(1, members):
    w[m, idx] = rng.multinomial(len(idx), np.full(len(idx), 1.0 / len(idx)))
  return w


def init(model: Navar, tx: optax.GradientTransformation, key: jax.Array | np.random.Generator, members: int) -> dict:
  """{"params": stacked (members, ...) parameters, "opt": stacked optimizer state}.

  `key` may be a numpy Generator (host-side init, members drawn in turn; no compile).
  """
  if isinstance(key, np.random.Generator):
    params = jax.tree.map(lambda *a: jnp.stack(a), *[model.init(key) for _ in range(members)])
  else:
    params = jax.vmap(model.init)(jax.random.split(key, members))
  return {"params": params, "opt": jax.vmap(tx.init)(params)}


MEMBER_LOOPS = ("map", "vmap")


def make_chunk_step(model: Navar, tx: optax.GradientTransformation, lam: float, steps: int, members: str = "map"):
  """`(state, data) -> (state, metrics)` running `steps` full-batch updates of every member.

  Each member is a `lax.scan` over its updates. `members="map"` runs members one after the other
  (`lax.map`): on CPU about twice as fast as `"vmap"` (XLA CPU's batched small matmuls); on an accelerator
  `"vmap"` fills the device better (`python -m jaxlab.bench navar` times both).

  Args:
    model: the architecture.
    tx: optax transformation (applied per member).
    lam: L1 strength on the contributions.
    steps: updates per call.
    members: "map" or "vmap" over ensemble members (same result up to float rounding).

  `data` = {"x": (B, N, K), "y": (B, N), "w": (M, B) training weights, "v": (B,) validation weights}.
  Metrics (member 0): "loss", "mse", "l1" at the last update's gradient evaluation, "val_mse" (0 when no
  validation windows).
  """

  def run_member(params, opt, x, y, w):
    def update(carry, _):
      params, opt = carry
      (loss, aux), grads = jax.value_and_grad(lambda p: navar_loss(model, p, x, y, w, lam), has_aux=True)(params)
      updates, opt = tx.update(grads, opt, params)
      return (optax.apply_updates(params, updates), opt), {"loss": loss, **aux}

    (params, opt), m = jax.lax.scan(update, (params, opt), None, length=steps)
    return params, opt, jax.tree.map(lambda a: a[-1], m)

  if members not in MEMBER_LOOPS:
    raise ValueError(f"members={members!r}: use one of {MEMBER_LOOPS}")

  def chunk(state: dict[str, Any], data: dict[str, jax.Array]):
    if members == "map":
      params, opt, m = jax.lax.map(lambda a: run_member(a[0], a[1], data["x"], data["y"], a[2]),
                                   (state["params"], state["opt"], data["w"]))
    else:
      params, opt, m = jax.vmap(run_member, in_axes=(0, 0, None, None, 0))(state["params"], state["opt"],
                                                                            data["x"], data["y"], data["w"])
    p0 = jax.tree.map(lambda a: a[0], params)
    _, val = navar_loss(model, p0, data["x"], data["y"], data["v"], 0.0)
    metrics = {k: v[0] for k, v in m.items()}
    metrics["val_mse"] = jnp.where(data["v"].sum() > 0, val["mse"], 0.0)
    return {"params": params, "opt": opt}, metrics

  return chunk


@functools.partial(jax.jit, static_argnums=0)
def _contributions(model: Navar, params, x_bnk):
  return model.contributions(params, x_bnk)


def contributions(model: Navar, params, x_bnk, batch: int = 4096) -> np.ndarray:
  """(B, N, N) contributions of one model, computed in batches (numpy; one compile per model and batch shape)."""
  x = np.asarray(x_bnk)
  return np.concatenate([np.asarray(_contributions(model, params, jnp.asarray(x[i:i + batch])))
                         for i in range(0, len(x), batch)])
