"""jaxlab.diffusion.ddpm: targets and their inverse, edit-friendly inversion exact for any denoiser, DDIM inversion
of a Gaussian with the exact score against the closed-form discretisation and the exact flow map, ancestral
sampling of a Gaussian, SDEdit, guidance, clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.diffusion import ddpm
from jaxlab.errors import ConfigError

M, S = 0.7, 0.5      # the Gaussian data N(M, S^2) of the closed-form tests


def gaussian_eps(schedule):
  """The exact E[eps | x_t] of N(M, S^2) data: sqrt(1 - a) (x - sqrt(a) M) / (a S^2 + 1 - a)."""
  ab = jnp.asarray(schedule.alphas_cumprod, jnp.float32)

  def fn(x, t):
    a = ab[t].reshape((-1,) + (1,) * (x.ndim - 1))
    eps = jnp.sqrt(1 - a) * (x - jnp.sqrt(a) * M) / (a * S * S + 1 - a)
    if schedule.prediction == "eps":
      return eps
    x0 = (x - jnp.sqrt(1 - a) * eps) / jnp.sqrt(a)
    return jnp.sqrt(a) * eps - jnp.sqrt(1 - a) * x0 if schedule.prediction == "v" else x0
  return fn


def random_net(key, dim):
  """An untrained nonlinear 'denoiser' that depends on x and t."""
  k1, k2, k3 = jax.random.split(key, 3)
  w1 = jax.random.normal(k1, (dim, 64)) / np.sqrt(dim)
  w2 = jax.random.normal(k2, (64, dim)) / 8
  emb = jax.random.normal(k3, (1000, 64))

  def fn(x, t):
    h = jnp.tanh(x.reshape(x.shape[0], -1) @ w1 + emb[t])
    return (h @ w2).reshape(x.shape)
  return fn


@pytest.mark.parametrize("prediction", ddpm.PREDICTIONS)
def test_split_inverts_target(prediction):
  k1, k2 = jax.random.split(jax.random.key(0))
  x0, eps = jax.random.normal(k1, (4, 6)), jax.random.normal(k2, (4, 6))
  ab = jnp.asarray([0.9, 0.5, 0.1, 0.01])
  xt = ddpm.q_sample(x0, ab, eps)
  x0h, epsh = ddpm.split(ddpm.target(x0, eps, ab, prediction), xt, ab, prediction)
  np.testing.assert_allclose(x0h, x0, atol=2e-4)
  np.testing.assert_allclose(epsh, eps, atol=2e-4)


def test_timesteps_and_schedules():
  s = ddpm.Schedule(num_train_steps=100)
  np.testing.assert_array_equal(ddpm.timesteps(s, 4), [76, 51, 26, 1])
  np.testing.assert_array_equal(ddpm.timesteps(s, 4, start=2), [26, 1])
  np.testing.assert_array_equal(ddpm.timesteps(ddpm.Schedule(num_train_steps=4, steps_offset=0), 4), [3, 2, 1, 0])
  with pytest.raises(ConfigError, match="steps_offset=0"):
    ddpm.timesteps(ddpm.Schedule(num_train_steps=4), 4)
  for kind in ddpm.BETA_SCHEDULES:
    ab = ddpm.Schedule(kind=kind, num_train_steps=100).alphas_cumprod
    assert np.all(np.diff(ab) < 0) and 0 < ab[-1] < ab[0] < 1
  assert ddpm.Schedule(final_alpha="one").final == 1.0
  assert ddpm.Schedule().final == pytest.approx(1 - 1e-4)


@pytest.mark.parametrize("prediction,start", [("eps", 20), ("v", None), ("x0", 7)])
def test_edit_friendly_inversion_is_exact_for_any_denoiser(prediction, start):
  s = ddpm.Schedule(num_train_steps=1000, prediction=prediction)
  fn = random_net(jax.random.key(1), 3 * 4)
  x0 = jax.random.normal(jax.random.key(2), (2, 3, 4))
  x_start, zs = jax.jit(lambda x, k: ddpm.edit_friendly_inversion(fn, s, x, k, num_steps=50, start=start))(
      x0, jax.random.key(3))
  assert zs.shape == ((start or 50),) + x0.shape
  out = jax.jit(lambda x, z: ddpm.reverse(fn, s, x, num_steps=50, start=start, zs=z))(x_start, zs)
  np.testing.assert_allclose(out, x0, atol=2e-5)
  # Another denoiser with the same noise maps does NOT reproduce the input: the maps carry the edit.
  other = ddpm.reverse(random_net(jax.random.key(9), 12), s, x_start, num_steps=50, start=start, zs=zs)
  assert float(jnp.max(jnp.abs(other - x0))) > 1e-2


def test_edit_friendly_inversion_error_is_rounding_only():
  """An eps-network at the noisiest levels multiplies errors by up to sqrt(abar_p / abar_t) per step (158x over a
  1000-step linear schedule): float32 rounding then grows, float64 shows the scheme itself is exact."""
  def err():
    s = ddpm.Schedule(num_train_steps=1000, prediction="eps")
    fn = random_net(jax.random.key(1), 12)
    x0 = jax.random.normal(jax.random.key(2), (2, 3, 4), jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    x_start, zs = ddpm.edit_friendly_inversion(fn, s, x0, jax.random.key(3), num_steps=50)
    return float(jnp.max(jnp.abs(ddpm.reverse(fn, s, x_start, num_steps=50, zs=zs) - x0)))
  e32 = err()
  with jax.enable_x64(True):
    e64 = err()
  assert e64 < 1e-9 and e32 < 1e-2


def _affine_inversion(schedule, ts_desc, x):
  """float64 composition of the DDIM inversion steps with the exact Gaussian eps (each step is affine)."""
  ab = schedule.alphas_cumprod
  ts = ts_desc[::-1]
  low = np.concatenate([[schedule.final], ab[ts[:-1]]])
  x = np.asarray(x, np.float64)
  for t, a_low in zip(ts, low):
    a = ab[t]
    eps = np.sqrt(1 - a) * (x - np.sqrt(a) * M) / (a * S * S + 1 - a)
    x0h = (x - np.sqrt(1 - a_low) * eps) / np.sqrt(a_low)
    x = np.sqrt(a) * x0h + np.sqrt(1 - a) * eps
  return x


def test_ddim_inversion_of_a_gaussian_is_exact_up_to_its_discretisation():
  s = ddpm.Schedule(num_train_steps=1000, final_alpha="one")
  fn = gaussian_eps(s)
  x0 = M + S * jax.random.normal(jax.random.key(0), (64, 3))
  errs = []
  for n in (25, 50, 100):
    ts = ddpm.timesteps(s, n)
    got = np.asarray(ddpm.ddim_invert(fn, s, x0, num_steps=n))
    np.testing.assert_allclose(got, _affine_inversion(s, ts, x0), rtol=1e-4, atol=1e-4)   # the known scheme
    a = s.alphas_cumprod[ts[0]]
    exact = np.sqrt(a) * M + np.sqrt(a * S * S + 1 - a) / S * (np.asarray(x0, np.float64) - M)  # the exact flow
    errs.append(float(np.max(np.abs(got - exact))))
  assert errs[0] > errs[1] > errs[2]
  assert 1.6 < errs[0] / errs[1] < 2.6 and 1.6 < errs[1] / errs[2] < 2.6    # first order
  # DDIM back down (eta = 0) from the inversion returns the input up to the same order.
  back = ddpm.reverse(fn, s, ddpm.ddim_invert(fn, s, x0, num_steps=200), num_steps=200, eta=0.0)
  assert float(jnp.max(jnp.abs(back - x0))) < 0.05



def test_ddim_inversion_clips_the_x0_estimate_as_reverse_does():
  """With `clip`, each step's x0 estimate is clipped and eps re-derived from it (a float64 loop); a clip that
  never binds changes nothing."""
  s = ddpm.Schedule(num_train_steps=1000, final_alpha="one")
  fn = gaussian_eps(s)
  x0 = M + S * jax.random.normal(jax.random.key(1), (32, 3))
  ts = ddpm.timesteps(s, 20)
  wide = np.asarray(ddpm.ddim_invert(fn, s, x0, num_steps=20, clip=(-1e6, 1e6)))
  np.testing.assert_allclose(wide, np.asarray(ddpm.ddim_invert(fn, s, x0, num_steps=20)), rtol=1e-6, atol=1e-6)
  lo, hi = M - 0.5 * S, M + 0.5 * S
  ab = s.alphas_cumprod
  asc = ts[::-1]
  x = np.asarray(x0, np.float64)
  for t, a_low in zip(asc, np.concatenate([[s.final], ab[asc[:-1]]])):
    a = ab[t]
    eps = np.sqrt(1 - a) * (x - np.sqrt(a) * M) / (a * S * S + 1 - a)
    x0c = np.clip((x - np.sqrt(1 - a) * eps) / np.sqrt(a), lo, hi)
    eps = (x - np.sqrt(a) * x0c) / np.sqrt(1 - a)
    x = np.sqrt(a) * (x - np.sqrt(1 - a_low) * eps) / np.sqrt(a_low) + np.sqrt(1 - a) * eps
  got = np.asarray(ddpm.ddim_invert(fn, s, x0, num_steps=20, clip=(lo, hi)))
  np.testing.assert_allclose(got, x, rtol=1e-4, atol=1e-4)
  assert float(np.max(np.abs(got - wide))) > 1e-2

@pytest.mark.parametrize("prediction", ["eps", "v"])
def test_ancestral_sampling_of_a_gaussian(prediction):
  s = ddpm.Schedule(num_train_steps=1000, prediction=prediction)
  x = ddpm.sample(gaussian_eps(s), s, (4000, 1), jax.random.key(0), num_steps=100)
  assert float(jnp.mean(x)) == pytest.approx(M, abs=0.03)            # se 0.008
  assert float(jnp.std(x)) == pytest.approx(S, abs=0.03)
  xd = ddpm.sample(gaussian_eps(s), s, (4000, 1), jax.random.key(0), num_steps=100, eta=0.0)
  assert float(jnp.std(xd)) == pytest.approx(S, abs=0.03)


def test_sdedit_keeps_the_input_at_a_small_start():
  s = ddpm.Schedule(num_train_steps=1000)
  x0 = M + S * jax.random.normal(jax.random.key(0), (256, 2))
  near = ddpm.sdedit(gaussian_eps(s), s, x0, jax.random.key(1), num_steps=100, start=3)
  far = ddpm.sdedit(gaussian_eps(s), s, x0, jax.random.key(1), num_steps=100, start=100)
  d_near, d_far = float(jnp.mean(jnp.abs(near - x0))), float(jnp.mean(jnp.abs(far - x0)))
  assert d_near < 0.1 < d_far


def test_cfg_and_training_loss():
  s = ddpm.Schedule(num_train_steps=100)
  cond, uncond = (lambda x, t: x + 1.0), (lambda x, t: x * 0.0)
  assert ddpm.cfg(cond, uncond, 1.0) is cond
  x = jnp.ones((2, 3))
  out = ddpm.cfg(cond, uncond, jnp.asarray([1.0, 3.0]))(x, jnp.zeros((2,), jnp.int32))
  np.testing.assert_allclose(out, [[2, 2, 2], [6, 6, 6]])
  exact = gaussian_eps(s)
  x0 = M + S * jax.random.normal(jax.random.key(0), (512, 4))
  good = ddpm.training_loss(exact, s, x0, jax.random.key(1))
  bad = ddpm.training_loss(lambda x, t: jnp.zeros_like(x), s, x0, jax.random.key(1))
  assert float(good) < 0.6 * float(bad)


def test_clear_errors():
  s = ddpm.Schedule(num_train_steps=100)
  with pytest.raises(ConfigError, match="use one of"):
    ddpm.Schedule(prediction="score")
  with pytest.raises(ConfigError, match="num_steps=200"):
    ddpm.timesteps(s, 200)
  with pytest.raises(ConfigError, match="start=11"):
    ddpm.timesteps(s, 10, start=11)
  with pytest.raises(ConfigError, match="zero variance"):
    ddpm.edit_friendly_inversion(lambda x, t: x, ddpm.Schedule(num_train_steps=100, final_alpha="one"),
                                 jnp.zeros((1, 2)), jax.random.key(0), num_steps=10)
  with pytest.raises(ConfigError, match="invert with the same num_steps"):
    ddpm.reverse(lambda x, t: x, s, jnp.zeros((1, 2)), num_steps=10, zs=jnp.zeros((5, 1, 2)))
  with pytest.raises(ConfigError, match="pass key"):
    ddpm.reverse(lambda x, t: x, s, jnp.zeros((1, 2)), num_steps=10)


def test_clipped_x0_keeps_samples_in_range_and_inversion_exact():
  s = ddpm.Schedule(num_train_steps=1000, prediction="v")
  fn = random_net(jax.random.key(1), 12)
  x = ddpm.sample(fn, s, (64, 3, 4), jax.random.key(0), num_steps=20, clip=(-0.5, 0.5))
  assert float(jnp.min(x)) > -0.7 and float(jnp.max(x)) < 0.7        # the last step's noise is small
  x0 = jnp.clip(jax.random.normal(jax.random.key(2), (2, 3, 4)), -0.5, 0.5)
  xs, zs = ddpm.edit_friendly_inversion(fn, s, x0, jax.random.key(3), num_steps=20, clip=(-0.5, 0.5))
  np.testing.assert_allclose(ddpm.reverse(fn, s, xs, num_steps=20, zs=zs, clip=(-0.5, 0.5)), x0, atol=2e-5)
