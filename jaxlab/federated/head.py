"""One-shot FedAvg of a linear classification head on frozen features.

Every client trains the same linear head (from the same initialisation) on its own (aligned) features; the
server averages the parameters once (one communication round, O-FedAvg). Clients are stacked on a leading
axis (padded to a common number of rows with a 0/1 mask) and trained with `jax.vmap`, so the client axis can
be sharded over a device mesh.

Local optimiser: SGD with momentum and weight decay, PyTorch convention
(v <- mu v + g + wd p; p <- p - lr v). `batch_size = 0` is full-batch gradient descent; otherwise each
step draws `batch_size` rows uniformly with replacement from the client's valid rows (reconstructed: the
official code uses a shuffled DataLoader). `loss = "softmax_ce"` reproduces the official head's quirk
(cross-entropy applied on top of softmax outputs); "ce" is the ordinary softmax cross-entropy.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

LOSSES = ("ce", "softmax_ce")


def init_head(dim: int, num_classes: int, key: jax.Array | None = None, scale: float = 0.0,
              dtype=jnp.float32) -> dict[str, jax.Array]:
  """Linear head {"w": (d, C), "b": (C,)}; zeros when key is None or scale == 0."""
  w = jnp.zeros((dim, num_classes), dtype)
  if key is not None and scale > 0:
    w = scale * jax.random.normal(key, (dim, num_classes), dtype)
  return {"w": w, "b": jnp.zeros((num_classes,), dtype)}


def logits(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
  """(..., d) -> (..., C)."""
  return x @ params["w"] + params["b"]


def head_loss(params, x_nd: jax.Array, y_n: jax.Array, mask_n: jax.Array, kind: str = "ce") -> jax.Array:
  """Masked mean cross-entropy over valid rows (mask 1)."""
  z = logits(params, x_nd)
  if kind == "softmax_ce":
    z = jax.nn.softmax(z, axis=-1)  # the official head returns probabilities; CrossEntropyLoss re-softmaxes them
  logp = jax.nn.log_softmax(z, axis=-1)
  nll = -jnp.take_along_axis(logp, y_n[:, None], axis=-1)[:, 0]
  return jnp.sum(nll * mask_n) / jnp.maximum(jnp.sum(mask_n), 1.0)


def local_train(params, x_nd, y_n, mask_n, key, *, steps: int, lr: float, momentum: float = 0.0,
                weight_decay: float = 0.0, batch_size: int = 0, loss: str = "ce", client_steps=None):
  """Trains one client's head.

  Args:
    params: initial head.
    x_nd: (n, d) features (padded rows allowed); y_n: (n,) int labels; mask_n: (n,) 0/1 valid rows (with
      minibatches the valid rows must come first: `compact_rows`).
    key: PRNG key (minibatch sampling).
    steps: optimiser steps (static).
    lr, momentum, weight_decay: SGD hyperparameters.
    batch_size: 0 = full batch, else rows per step (sampled from valid rows).
    loss: "ce" or "softmax_ce".
    client_steps: optional traced int; steps at or beyond it leave the parameters unchanged (per-client
      epoch budgets under vmap).

  Returns:
    The trained head.
  """
  grad_fn = jax.grad(head_loss)
  n_valid = jnp.sum(mask_n)
  tx = optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(lr, momentum or None))

  def body(i, carry):
    p, s = carry
    if batch_size:
      u = jax.random.uniform(jax.random.fold_in(key, i), (batch_size,))
      idx = jnp.minimum(jnp.floor(u * n_valid), n_valid - 1).astype(jnp.int32)
      g = grad_fn(p, x_nd[idx], y_n[idx], jnp.ones((batch_size,), x_nd.dtype), loss)
    else:
      g = grad_fn(p, x_nd, y_n, mask_n, loss)
    upd, s_new = tx.update(g, s, p)
    p_new = optax.apply_updates(p, upd)
    if client_steps is not None:
      live = i < client_steps
      p_new, s_new = jax.tree.map(lambda a, b: jnp.where(live, a, b), (p_new, s_new), (p, s))
    return p_new, s_new

  p, _ = jax.lax.fori_loop(0, steps, body, (params, tx.init(params)))
  return p


def compact_rows(mask_kn, *arrays):
  """Moves each client's valid rows (mask 1) to the front, keeping their order; returns (mask, *arrays).

  Args:
    mask_kn: (K, n) 0/1 numpy mask; arrays: numpy arrays with leading (K, n) axes.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top  (host-side helper)
  order = np.argsort(np.asarray(mask_kn) <= 0, axis=1, kind="stable")
  take = lambda a: np.take_along_axis(a, order.reshape(order.shape + (1,) * (a.ndim - 2)), axis=1)
  return (take(np.asarray(mask_kn)),) + tuple(take(np.asarray(a)) for a in arrays)


def train_clients(params, x_knd, y_kn, mask_kn, keys, client_steps=None, **kw):
  """`local_train` vmapped over a leading client axis (the same initial params for every client).

  Returns:
    Stacked heads {"w": (K, d, C), "b": (K, C)}.
  """
  fn = functools.partial(local_train, **kw)
  if client_steps is None:
    return jax.vmap(lambda x, y, m, k: fn(params, x, y, m, k))(x_knd, y_kn, mask_kn, keys)
  return jax.vmap(lambda x, y, m, k, s: fn(params, x, y, m, k, client_steps=s))(x_knd, y_kn, mask_kn, keys,
                                                                                 client_steps)


def fedavg(stacked: Any, weights: jax.Array) -> Any:
  """One-shot parameter averaging: sum_k w_k theta_k / sum_k w_k over the leading client axis.

  Args:
    stacked: pytree with leaves (K, ...).
    weights: (K,) non-negative (equal weights for O-FedAvg; zeros drop padding clients).

  Returns:
    The averaged pytree (leaves (...)).
  """
  w = weights / jnp.sum(weights)
  return jax.tree.map(lambda t: jnp.tensordot(w.astype(t.dtype), t, axes=1), stacked)


def macro_accuracy(correct_kn: jax.Array, mask_kn: jax.Array, domain_weights: jax.Array) -> dict[str, jax.Array]:
  """Per-domain accuracy, their mean (macro accuracy) and std over domains.

  Args:
    correct_kn: (K, n) 0/1 correctness; mask_kn: (K, n) valid test rows; domain_weights: (K,) 1 for real
      domains, 0 for padding.

  Returns:
    {"per_domain": (K,), "macro": (), "std": ()}.
  """
  acc = jnp.sum(correct_kn * mask_kn, axis=1) / jnp.maximum(jnp.sum(mask_kn, axis=1), 1.0)
  k = jnp.sum(domain_weights)
  macro = jnp.sum(acc * domain_weights) / k
  std = jnp.sqrt(jnp.sum(domain_weights * (acc - macro) ** 2) / k)
  return {"per_domain": acc, "macro": macro, "std": std}
