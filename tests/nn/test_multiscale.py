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


# --- a finer-sampled input: the scale offset ------------------------------------------------------------

def _trained_like(m, seed=0, delta=0.4):
  """Moves a fresh model away from its init so that the identities below are not trivial: Delta ~ `delta`
  (so a wrong scale shows), non-uniform coarse-graining weights, a non-identity value map."""
  rng = np.random.default_rng(seed)
  mixer = m.layers[0].mixer
  d_inner = mixer.dt_proj.bias.shape[0]
  mixer.dt_proj.bias[...] = jnp.full((d_inner,), np.log(np.expm1(delta)), jnp.float32)
  if m.coarse is not None:
    d = m.coarse.score.shape[0]
    m.coarse.score[...] = jnp.asarray(rng.normal(size=d), jnp.float32)
    m.coarse.value[...] = jnp.asarray(np.eye(d) + 0.3 * rng.normal(size=(d, d)), jnp.float32)
  return m


_fine_levels = nnx.jit(lambda m, x, offset, fine: m.levels(x, offset=offset, fine=fine), static_argnums=(2, 3))


def test_finer_input_adds_finer_levels_and_keeps_the_trained_scales():
  m = _trained_like(_model())
  x = jax.random.normal(jax.random.key(4), (2, 128, 3))       # 4x the training length 32 (3 levels)
  xs, ys = _fine_levels(m, x, 2, "levels")
  assert [y.shape[1] for y in ys] == [128, 64, 32, 16, 8]
  # Levels 0, 1 are new (Delta / 4, Delta / 2); levels 2.. keep the trained 1, 2, 4.
  for k, s in enumerate((0.25, 0.5, 1.0, 2.0, 4.0)):
    assert m.scale(k, 2) == s
  for k in (0, 2, 4):                                          # a new level, the finest and coarsest trained
    np.testing.assert_allclose(ys[k], _layer(m, xs[k], m.scale(k, 2)), rtol=1e-6, atol=1e-6)
  # Without the offset the same input is a longer one: the finest level runs at 1, the coarsest at 16.
  _, ys_long = _levels(m, x)
  assert not np.allclose(ys_long[0], ys[0], atol=1e-3)
  ab = _model("no_delta_scale")
  assert [ab.scale(k, 2) for k in range(5)] == [1.0] * 5      # the ablation scales nothing


_held = nnx.jit(lambda m, u, fine: (m.levels(u)[1], m.levels(fine, offset=2, fine="refine")[1],
                                     m.levels(fine, offset=1, fine="refine")[1], m(u),
                                     m(fine, offset=2, fine="refine")))


def test_refine_reproduces_the_trained_rate_model_on_a_held_input():
  """ZOH, input held over each trained step: the fine-rate model's level states equal the trained-rate model's."""
  m = _trained_like(_model(discretization="zoh", aggregate="top_down"))
  u = jax.random.normal(jax.random.key(5), (2, 32, 3))         # trained rate: 3 levels (32, 16, 8)
  fine = jnp.repeat(u, 4, axis=1)                              # the same span sampled 4x finer, held
  ys, yf, y_wrong, out, out_fine = _held(m, u, fine)
  assert [y.shape[1] for y in yf] == [32, 16, 8]
  for a, b in zip(yf, ys):                                     # every level at every trained step
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  np.testing.assert_allclose(out_fine, out, rtol=0, atol=1e-5)
  # A wrong offset (Delta / 2 on the 4x finer input) or Mamba's Euler rule for B break it.
  assert float(jnp.max(jnp.abs(y_wrong[0][:, 1::2] - ys[0]))) > 1e-2
  e = _trained_like(_model(discretization="euler", aggregate="top_down"))
  ye, yef, _, _, _ = _held(e, u, fine)
  assert float(jnp.max(jnp.abs(yef[0] - ye[0]))) > 1e-3


def test_levels_mode_matches_the_trained_level_only_at_its_own_level():
  """fine="levels": the finest level (Delta / 4) read at the trained steps equals the trained level 0 (a
  pointwise conv, so the held window is all the conv sees); its coarser levels then see its outputs, which
  vary inside a held step, so they differ from the trained model's."""
  m = _trained_like(_model(discretization="zoh", d_conv=1))
  u = jax.random.normal(jax.random.key(6), (2, 32, 3))
  _, ys = _levels(m, u)
  _, yq = _fine_levels(m, jnp.repeat(u, 4, axis=1), 2, "levels")
  np.testing.assert_allclose(yq[0][:, 3::4], ys[0], rtol=0, atol=1e-5)
  assert not np.allclose(yq[2], ys[0], atol=1e-3)


def test_dilated_conv_matches_brute_force_and_the_block_conv():
  m = _model(d_conv=4)
  conv = m.layers[0].mixer.conv1d
  conv.bias[...] = jnp.linspace(-1, 1, conv.bias.shape[0])
  x = jax.random.normal(jax.random.key(7), (2, 24, conv.kernel.shape[1]))
  np.testing.assert_array_equal(multiscale.DilatedConv(conv, 1)(x), conv(x))
  w, b = np.asarray(conv.kernel[...]), np.asarray(conv.bias[...])
  xn = np.asarray(x)
  want = np.zeros_like(xn)
  for t in range(24):
    want[:, t] = b + sum(w[j] * xn[:, t - (3 - j) * 3] for j in range(4) if t - (3 - j) * 3 >= 0)
  np.testing.assert_allclose(multiscale.DilatedConv(conv, 3)(x), want, rtol=1e-5, atol=1e-6)
  # On a 3x finer sequence, every 3rd output is the block's conv of the subsampled sequence, bit for bit.
  np.testing.assert_array_equal(multiscale.DilatedConv(conv, 3)(x)[:, 2::3], conv(x[:, 2::3]))
  # The layer call restores the block's own conv.
  _fine_levels(m, jnp.ones((1, 64, 3)), 1, "refine")
  assert type(m.layers[0].mixer.conv1d).__name__ == "_CausalConv1d"


_readouts = nnx.jit(lambda m, x: (m.levels(x, offset=2, fine="levels")[1], m(x, offset=2, fine="levels",
                                   readout="coarse"), m(x, offset=2, fine="levels", readout="all")))


def test_coarse_readout_aggregates_the_trained_levels_only():
  m = _trained_like(_model(aggregate="top_down"))
  x = jax.random.normal(jax.random.key(8), (2, 128, 3))
  ys, coarse, every = _readouts(m, x)
  feats, _ = m.features(ys[2:])
  np.testing.assert_allclose(coarse, m.head(m.head_norm(feats)), rtol=1e-5, atol=1e-6)
  assert not np.allclose(every, coarse, atol=1e-4)
  assert m.readout_skip(2, "refine", "coarse") == 0 and m.readout_skip(2, "levels", "coarse") == 2


def test_finer_input_bad_arguments():
  m = _model()
  with pytest.raises(ValueError, match="fine must be one of"):
    m.levels(jnp.ones((1, 32, 3)), offset=1, fine="finer")
  with pytest.raises(ValueError, match="readout must be one of"):
    m(jnp.ones((1, 32, 3)), readout="fine")
  with pytest.raises(ValueError, match="offset must be >= 0"):
    m.levels(jnp.ones((1, 32, 3)), offset=-1)
  with pytest.raises(ValueError, match="not divisible by ratio"):
    m.levels(jnp.ones((1, 34, 3)), offset=2, fine="refine")
