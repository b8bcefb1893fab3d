"""Fractal Mamba (DF-Mamba) modules and losses against brute-force references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.nn import multiscale


_levels = nnx.jit(lambda m, x: m.levels(x))
_layer = nnx.jit(lambda m, x, k: m.layers[0](x, k), static_argnums=2)


def _model(mode="fractal", **kw):
  return multiscale.FractalMamba(3, 8, 16, mode=mode, d_state=4, min_len=8, rngs=nnx.Rngs(0), **kw)


def test_num_levels():
  assert multiscale.num_levels(128, 2, 32) == 3
  assert multiscale.num_levels(512, 2, 32) == 5
  assert multiscale.num_levels(32, 2, 32) == 1
  assert multiscale.num_levels(96, 2, 12) == 4
  with pytest.raises(ValueError, match="must be min_len"):
    multiscale.num_levels(100, 2, 32)


def test_coarse_grain_matches_brute_force():
  cg = multiscale.CoarseGrain(5, ratio=3, tau=0.7, rngs=nnx.Rngs(0))
  y = np.random.default_rng(0).normal(size=(2, 9, 5)).astype(np.float32)
  # Untrained: plain window averaging.
  np.testing.assert_allclose(cg(jnp.asarray(y)), y.reshape(2, 3, 3, 5).mean(2), rtol=1e-6, atol=1e-6)
  a = np.random.default_rng(1).normal(size=5).astype(np.float32)
  v = np.random.default_rng(2).normal(size=(5, 5)).astype(np.float32)
  cg.score[...] = jnp.asarray(a)
  cg.value[...] = jnp.asarray(v)
  want = np.zeros((2, 3, 5))
  for b in range(2):
    for j in range(3):
      win = y[b, 3 * j:3 * j + 3]
      ln = (win - win.mean(-1, keepdims=True)) / np.sqrt(win.var(-1, keepdims=True) + 1e-6)
      s = ln @ a / 0.7
      w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
      want[b, j] = sum(w[i] * (win[i] @ v) for i in range(3))
  np.testing.assert_allclose(cg(jnp.asarray(y)), want, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="not divisible"):
    cg(jnp.ones((1, 10, 5)))


def test_levels_share_one_block_and_scale_delta():
  m = _model()
  xs, ys = _levels(m, jnp.ones((2, 32, 3)))
  assert [x.shape[1] for x in xs] == [32, 16, 8]
  # A longer input adds levels with the same parameters.
  n = multiscale.count_params(m)
  xs, ys = _levels(m, jax.random.normal(jax.random.key(0), (2, 64, 3)))
  assert [y.shape[1] for y in ys] == [64, 32, 16, 8] and multiscale.count_params(m) == n
  # Level k is the shared layer at Delta * r^k (and at Delta for the ablation).
  for k in (0, 3):
    np.testing.assert_allclose(ys[k], _layer(m, xs[k], 2.0 ** k), rtol=1e-6)
  ab = _model("no_delta_scale")
  xa, ya = _levels(ab, jax.random.normal(jax.random.key(0), (2, 64, 3)))
  assert not np.allclose(ya[3], ys[3], rtol=1e-3)   # same init, different time scales
  np.testing.assert_allclose(ya[3], _layer(ab, xa[3], 1.0), rtol=1e-6)
  assert not np.allclose(ya[3], _layer(ab, xa[3], 8.0), rtol=1e-3)


def test_flat_baseline_has_no_recursion_params():
  flat, frac = _model("flat"), _model()
  assert flat.coarse is None and multiscale.count_params(flat) < multiscale.count_params(frac)
  xs, ys = _levels(flat, jnp.ones((2, 64, 3)))
  assert len(ys) == 1 and ys[0].shape == (2, 64, 16)
  out, aux = nnx.jit(lambda m, x: m.forward_with_aux(x))(flat, jnp.ones((2, 64, 3)))
  assert out.shape == (2, 8) and float(aux["rec"]) == 0.0 and float(aux["cons"]) == 0.0
  deep = _model("flat", flat_layers=3)
  assert multiscale.count_params(deep) > multiscale.count_params(flat)


def test_aggregation_is_a_convex_combination_of_pooled_levels():
  m = _model()
  m.level_score[...] = jnp.linspace(-1, 1, 16)
  _, ys = _levels(m, jax.random.normal(jax.random.key(1), (3, 32, 3)))
  feats, alpha = m.features(ys)
  np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)
  want = sum(alpha[:, k, None] * ys[k][:, -1] for k in range(len(ys)))
  np.testing.assert_allclose(feats, want, rtol=1e-5, atol=1e-6)


def test_auxiliary_losses_match_their_definitions():
  m = _model()
  m.coarse.score[...] = jnp.linspace(-1, 1, 16)
  x = jax.random.normal(jax.random.key(2), (2, 32, 3))
  xs, ys = _levels(m, x)
  rec = np.mean([np.mean((np.asarray(m.decoder(xs[k + 1])).reshape(ys[k].shape) - np.asarray(ys[k])) ** 2)
                 for k in range(2)])
  cg = nnx.jit(lambda m, x: m.coarse(x))
  cons = np.mean([np.mean((np.asarray(cg(m, _layer(m, xs[k], 2.0 ** k)))
                           - np.asarray(_layer(m, cg(m, xs[k]), 2.0 ** (k + 1)))) ** 2) for k in range(2)])
  np.testing.assert_allclose(nnx.jit(multiscale.reconstruction_loss)(m, xs, ys), rec, rtol=1e-5)
  np.testing.assert_allclose(nnx.jit(multiscale.consistency_loss)(m, xs), cons, rtol=1e-5)
  # The reconstruction target is stop-gradient: no gradient flows into the level outputs through it.
  g = jax.jit(jax.grad(lambda ys_: multiscale.reconstruction_loss(m, xs, ys_)))(ys)
  assert all(float(jnp.abs(t).max()) == 0.0 for t in g)


def test_upsample_repeats():
  y = jnp.arange(6.0).reshape(1, 3, 2)
  np.testing.assert_array_equal(multiscale.upsample(y, 2), np.repeat(np.asarray(y), 2, axis=1))


def test_bad_arguments():
  with pytest.raises(ValueError, match="mode must be"):
    _model("fractals")
  with pytest.raises(ValueError, match="must be min_len"):
    _model()(jnp.ones((1, 48, 3)))


def test_chunked_levels_read_out_is_invariant_to_a_longer_past():
  m = _model(chunk=8)
  x = jax.random.normal(jax.random.key(3), (2, 64, 3))
  _, long_ys = _levels(m, x)                 # 4 levels: 64, 32, 16, 8
  _, short_ys = _levels(m, x[:, -32:])       # 3 levels: 32, 16, 8
  for k in range(3):
    np.testing.assert_allclose(long_ys[k][:, -1], short_ys[k][:, -1], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="must be 0 or divide"):
    _model(chunk=3)
