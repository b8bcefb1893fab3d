"""NAVAR-MLP / NAVAR-LSTM against brute-force numpy loops; the loss against the official formula."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.causal import ensemble
from jaxlab.causal.navar import Navar, navar_loss


def _np_mlp(p, x, layers):
  """Per-source loop: relu(x_i W1_i + b1_i) [-> hidden layers] -> W2_i + b2_i."""
  b, n, k = x.shape
  c = np.zeros((b, n, n))
  for i in range(n):
    h = np.maximum(0, x[:, i, :] @ p["w1"][i] + p["b1"][i])
    for layer in range(layers - 1):
      h = np.maximum(0, h @ p["wh"][i][layer] + p["bh"][i][layer])
    c[:, i, :] = h @ p["w2"][i] + p["b2"][i]
  return c


def _np_lstm(p, x, hdim):
  """Per-source, per-window, per-time-step LSTM loop (gates i, f, g, o)."""
  sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
  b, n, k = x.shape
  c_out = np.zeros((b, n, n))
  for i in range(n):
    for r in range(b):
      h, c = np.zeros(hdim), np.zeros(hdim)
      for t in range(k):
        z = x[r, i, t] * p["wx"][i] + h @ p["wh"][i] + p["b"][i]
        gi, gf, gg, go = z[:hdim], z[hdim:2 * hdim], z[2 * hdim:3 * hdim], z[3 * hdim:]
        c = sig(gf) * c + sig(gi) * np.tanh(gg)
        h = sig(go) * np.tanh(c)
      c_out[r, i, :] = h @ p["w2"][i] + p["b2"][i]
  return c_out


@pytest.mark.parametrize("layers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_mlp_matches_numpy_loop(layers):
  m = Navar(n=4, lags=3, hidden=5, kind="mlp", layers=layers)
  params = m.init(jax.random.key(0))
  x = np.random.default_rng(0).normal(size=(7, 4, 3)).astype(np.float32)
  pred, c = jax.jit(m)(params, jnp.asarray(x))
  p = jax.tree.map(np.asarray, params["src"])
  ref = _np_mlp(p, x.astype(np.float64), layers)
  np.testing.assert_allclose(np.asarray(c), ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(pred), ref.sum(1) + np.asarray(params["bias"]), rtol=1e-5, atol=1e-5)


def test_lstm_matches_numpy_loop():
  m = Navar(n=3, lags=4, hidden=6, kind="lstm")
  params = m.init(np.random.default_rng(1))
  x = np.random.default_rng(2).normal(size=(5, 3, 4)).astype(np.float32)
  c = jax.jit(m.contributions)(params, jnp.asarray(x))
  ref = _np_lstm(jax.tree.map(np.asarray, params["src"]), x.astype(np.float64), 6)
  np.testing.assert_allclose(np.asarray(c), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["mlp", "lstm"])
def test_additive_contributions_depend_on_own_source_only(kind):
  m = Navar(n=4, lags=2, hidden=4, kind=kind)
  params = m.init(jax.random.key(3))
  x = np.random.default_rng(3).normal(size=(6, 4, 2)).astype(np.float32)
  x2 = x.copy()
  x2[:, 1, :] += 1.0
  f = jax.jit(m.contributions)
  c1, c2 = np.asarray(f(params, x)), np.asarray(f(params, x2))
  changed = np.abs(c1 - c2).max(axis=(0, 2))
  assert changed[1] > 1e-4 and np.all(changed[[0, 2, 3]] == 0)


def test_loss_matches_official_formula_and_weights_are_repeats():
  m = Navar(n=3, lags=2, hidden=4)
  params = m.init(jax.random.key(4))
  rng = np.random.default_rng(4)
  x, y = rng.normal(size=(10, 3, 2)).astype(np.float32), rng.normal(size=(10, 3)).astype(np.float32)
  lam = 0.3
  loss_fn = jax.jit(lambda p, x, y, w: navar_loss(m, p, x, y, w, lam)[0])
  loss = loss_fn(params, x, y, jnp.ones(10))
  pred, c = map(np.asarray, jax.jit(m)(params, x))
  official = np.mean((pred - y) ** 2) + lam / 3 * np.mean(np.abs(c.reshape(10, -1)).sum(1))
  np.testing.assert_allclose(float(loss), official, rtol=1e-5)
  counts = rng.integers(0, 3, size=10)
  counts[0] = 1
  loss_w = loss_fn(params, x, y, jnp.asarray(counts, jnp.float32))
  rep = np.repeat(np.arange(10), counts)
  loss_r = loss_fn(params, x[rep], y[rep], jnp.ones(len(rep)))
  np.testing.assert_allclose(float(loss_w), float(loss_r), rtol=1e-5)


def test_ensemble_members_train_independently():
  """Member 0 of an ensemble ends exactly where a lone model with the same init ends."""
  m = Navar(n=3, lags=2, hidden=4)
  tx = optax.adam(1e-2)
  rng = np.random.default_rng(5)
  x, y = rng.normal(size=(40, 3, 2)).astype(np.float32), rng.normal(size=(40, 3)).astype(np.float32)
  w = ensemble.bootstrap_weights(np.random.default_rng(0), np.ones(40, bool), 3)
  assert w[0].sum() == 40 and np.all(w.sum(1) == 40) and not np.array_equal(w[1], w[0])
  data = {"x": jnp.asarray(x), "y": jnp.asarray(y), "w": jnp.asarray(w), "v": jnp.zeros(40)}
  st = ensemble.init(m, tx, np.random.default_rng(7), 3)
  step = jax.jit(ensemble.make_chunk_step(m, tx, 0.1, 5))
  out, met = step(st, data)
  lone = ensemble.init(m, tx, np.random.default_rng(7), 1)
  lone_out, _ = step(lone, {**data, "w": data["w"][:1]})
  for a, b in zip(jax.tree.leaves(out["params"]), jax.tree.leaves(lone_out["params"])):
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(b[0]), rtol=1e-6, atol=1e-7)
  vout, _ = jax.jit(ensemble.make_chunk_step(m, tx, 0.1, 5, members="vmap"))(st, data)
  for a, b in zip(jax.tree.leaves(out["params"]), jax.tree.leaves(vout["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  first, _ = jax.jit(lambda p: navar_loss(m, p, x, y, jnp.ones(40), 0.1))(jax.tree.map(lambda a: a[0], st["params"]))
  assert float(met["loss"]) < float(first)
