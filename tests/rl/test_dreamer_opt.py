"""DreamerV3's LaProp + per-tensor AGC (`jaxlab.rl.dreamer.opt`) against a NumPy loop of the official rule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.errors import ConfigError
from jaxlab.rl.dreamer import opt


def _numpy_laprop(params, grads_seq, lr, agc, eps, b1, b2, warmup, pmin=1e-3):
  """danijar/dreamerv3 `embodied/jax/opt.py`: clip_by_agc -> scale_by_rms -> scale_by_momentum -> -lr(t)."""
  p = {k: np.array(v, np.float64) for k, v in params.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  for t, g in enumerate(grads_seq, start=1):
    rate = lr * min((t - 1) / warmup, 1.0) if warmup else lr
    for k in p:
      u = np.array(g[k], np.float64)
      if agc:
        upper = agc * max(pmin, np.linalg.norm(p[k].ravel()))
        u = u / max(1.0, np.linalg.norm(u.ravel()) / upper)
      nu[k] = b2 * nu[k] + (1 - b2) * u * u
      u = u / (np.sqrt(nu[k] / (1 - b2 ** t)) + eps)
      mu[k] = b1 * mu[k] + (1 - b1) * u
      p[k] = p[k] - rate * mu[k] / (1 - b1 ** t)
  return p


@pytest.mark.parametrize("agc,warmup", [(0.3, 3), (0.0, 0), (1e-3, 0)])
def test_laprop_matches_the_official_rule(agc, warmup):
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=(3,)).astype(np.float32)}
  grads_seq = [{k: (5.0 * rng.normal(size=v.shape)).astype(np.float32) for k, v in params.items()}
               for _ in range(6)]
  tx = opt.laprop(1e-2, agc=agc, eps=1e-20, warmup=warmup)
  p = jax.tree.map(jnp.asarray, params)
  state = tx.init(p)
  for g in grads_seq:
    upd, state = tx.update(jax.tree.map(jnp.asarray, g), state, p)
    p = optax.apply_updates(p, upd)
  want = _numpy_laprop(params, grads_seq, 1e-2, agc, 1e-20, 0.9, 0.999, warmup)
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), want[k], rtol=2e-5, atol=1e-6)


def test_agc_clips_each_tensor_to_its_parameter_norm():
  p = {"a": jnp.full((2, 2), 1.0), "tiny": jnp.zeros((3,))}
  g = {"a": jnp.full((2, 2), 10.0), "tiny": jnp.full((3,), 1.0)}
  out, _ = opt.clip_by_agc(0.3).update(g, opt.clip_by_agc(0.3).init(p), p)
  assert float(jnp.linalg.norm(out["a"])) == pytest.approx(0.3 * 2.0, rel=1e-6)       # |p| = 2
  assert float(jnp.linalg.norm(out["tiny"])) == pytest.approx(0.3 * 1e-3, rel=1e-6)   # pmin for a zero tensor
  small = {"a": jnp.full((2, 2), 1e-3), "tiny": jnp.full((3,), 1e-5)}
  same, _ = opt.clip_by_agc(0.3).update(small, (), p)
  np.testing.assert_array_equal(same["a"], small["a"])                              # under the bound: unchanged


def test_warmup_and_errors():
  s = opt.warmup_constant(4e-5, 1000)
  assert float(s(0)) == 0.0 and float(s(500)) == pytest.approx(2e-5) and float(s(5000)) == pytest.approx(4e-5)
  with pytest.raises(ConfigError, match="laprop: need lr > 0"):
    opt.laprop(0.0)
  with pytest.raises(ConfigError, match="needs the parameters"):
    opt.clip_by_agc(0.3).update({"a": jnp.ones(2)}, ())
