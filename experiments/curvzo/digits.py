"""Digits fine-tuning (report only, `small` variant): a backprop-pretrained MLP adapted by ZO to new classes.

An MLP 64 -> hidden (tanh) -> 10 is trained with Adam on sklearn digits of classes 0-4 only, then every
parameter is fine-tuned by a zeroth-order method on all 10 classes (cross-entropy, minibatches of
`batch`, `steps` ZO steps = 2 steps forward passes). Each method's lr is chosen from `lrs` by accuracy on a
validation split of the training images; the test accuracy at that lr is reported (a secondary,
report-only experiment). All lrs run as one vmapped program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.data import synthetic

from . import method as method_lib


def _data(seed: int):
  tr, te = synthetic.digits("train"), synthetic.digits("test")
  x, y = tr["image"].reshape(len(tr["label"]), -1), tr["label"]
  rng = np.random.default_rng(seed)
  perm = rng.permutation(len(y))
  n_val = len(y) // 5
  val, train = perm[:n_val], perm[n_val:]
  return (x[train], y[train]), (x[val], y[val]), (te["image"].reshape(len(te["label"]), -1), te["label"])


def _init(key, hidden: int):
  k1, k2 = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (64, hidden)) / 8.0, "b1": jnp.zeros((hidden,)),
          "w2": jax.random.normal(k2, (hidden, 10)) / np.sqrt(hidden), "b2": jnp.zeros((10,))}


def _logits(p, x):
  return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def _ce(p, x, y):
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(_logits(p, x), y))


def _acc(p, x, y):
  return jnp.mean(jnp.argmax(_logits(p, x), -1) == y)


def pretrain(seed: int, hidden: int, steps: int):
  """Adam on classes 0-4 (full batch); returns the params."""
  (x, y), _, _ = _data(seed)
  keep = y < 5
  x, y = jnp.asarray(x[keep]), jnp.asarray(y[keep])
  params = _init(jax.random.key(seed), hidden)
  tx = optax.adam(1e-2)

  @jax.jit
  def train(params):
    def body(c, _):
      p, s = c
      g = jax.grad(_ce)(p, x, y)
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    (p, _), _ = jax.lax.scan(body, (params, tx.init(params)), None, length=steps)
    return p
  return train(params)


def finetune(name: str, config, mesh=None) -> dict:
  """ZO fine-tuning with method `name`; returns {"lr", "val_acc", "test_acc", "test_acc_before", "test_acc_new"}."""
  dg, m = config.digits, config.method
  (x, y), (xv, yv), (xt, yt) = _data(config.seed)
  params = pretrain(config.seed, dg.hidden, dg.pretrain_steps)
  x, y, xv, yv, xt, yt = (jnp.asarray(a) for a in (x, y, xv, yv, xt, yt))
  n = x.shape[0]
  mm = m.copy_and_resolve_references()
  with mm.unlocked():
    mm.block_size = dg.block_size
    mm.row_blocks = False

  def run(lr):
    opt = method_lib.make_optimizer(name, params, lr, mm)
    key = jax.random.key(config.seed + 77)

    def body(c, t):
      p, st = c
      idx = jax.random.randint(jax.random.fold_in(key, t), (dg.batch,), 0, n)
      p, st, _ = opt.step(lambda q, b: _ce(q, *b), p, st, (x[idx], y[idx]))
      return (p, st), None
    (p, _), _ = jax.lax.scan(body, (params, opt.init(config.seed)), jnp.arange(dg.steps))
    return _acc(p, xv, yv), _acc(p, xt, yt), jnp.mean(jnp.where(yt >= 5, jnp.argmax(_logits(p, xt), -1) == yt, 0.0))

  lrs = jnp.asarray(np.array(dg.lrs, np.float32))
  val, test, new = (np.asarray(a) for a in jax.jit(jax.vmap(run))(lrs))
  val = np.where(np.isfinite(val), val, -1.0)
  best = int(np.argmax(val))
  frac_new = float(np.mean(np.asarray(yt) >= 5))
  return {"lr": float(dg.lrs[best]), "val_acc": float(val[best]), "test_acc": float(test[best]),
          "test_acc_new_classes": float(new[best]) / frac_new, "test_acc_before": float(_acc(params, xt, yt))}
