"""t = 1-clean flow matching (`jaxlab.diffusion.flow`), guidance and the Frechet distance, against closed forms:
Heun with the exact x-predictor of a Gaussian reaches the data distribution; scipy's sqrtm FID formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from jaxlab.diffusion import flow, guidance
from jaxlab.errors import ConfigError, DataError
from jaxlab.evals import feature_stats, frechet_distance, frechet_from_features


def test_interpolant_velocity_and_v_loss():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x, eps = jax.random.normal(k1, (5, 3, 4)), jax.random.normal(k2, (5, 3, 4))
  t = jax.random.uniform(k3, (5,), maxval=0.9)
  z = flow.interpolate(x, eps, t)
  np.testing.assert_allclose(z, t[:, None, None] * x + (1 - t[:, None, None]) * eps, rtol=1e-6)
  np.testing.assert_allclose(flow.velocity(x, z, t), x - eps, rtol=1e-4, atol=1e-5)    # dz/dt
  z1 = flow.interpolate(x, eps, jnp.full((5,), 0.99))                                   # clamped near clean
  np.testing.assert_allclose(flow.velocity(x, z1, jnp.full((5,), 0.99)), (x - z1) / 0.05, rtol=1e-5)
  assert float(flow.v_loss(x, x, z, t)) == 0.0
  x_hat = x + 0.1
  per = np.mean(((0.1 / np.maximum(1 - np.asarray(t), 0.05))[:, None, None] * np.ones((5, 3, 4))) ** 2,
                axis=(1, 2))
  np.testing.assert_allclose(flow.v_loss(x_hat, x, z, t), per.mean(), rtol=1e-5)
  w = np.array([1, 0, 1, 0, 1.0])
  np.testing.assert_allclose(flow.v_loss(x_hat, x, z, t, weight=w), (per * w).sum() / 5, rtol=1e-5)


def test_time_samplers_and_shift():
  t = flow.logit_normal(jax.random.key(1), (200_000,), mean=-0.8, std=0.8)
  logit = np.log(np.asarray(t) / (1 - np.asarray(t)))
  assert abs(logit.mean() + 0.8) < 0.01 and abs(logit.std() - 0.8) < 0.01
  u = np.linspace(0, 1, 11)
  np.testing.assert_allclose(flow.shift(u, 1.0), u)
  np.testing.assert_allclose(flow.shift(flow.shift(u, 0.4), 1 / 0.4), u, atol=1e-12)
  assert flow.shift(0.0, 3.0) == 0.0 and flow.shift(1.0, 3.0) == 1.0 and flow.shift(0.5, 0.5) < 0.5
  u = np.asarray(flow.uniform(jax.random.key(2), (1000,), 0.75, 1.0))
  assert u.min() >= 0.75 and u.max() <= 1.0


def test_schedules():
  c = flow.cascaded_times(("latent", "pixel"), (2, 3))
  np.testing.assert_allclose(c["latent"], [0, 0.5, 1, 1, 1, 1])
  np.testing.assert_allclose(c["pixel"], [0, 0, 0, 1 / 3, 2 / 3, 1])
  c = flow.cascaded_times(("a", "b"), (2, 2), final={"a": 0.8})
  np.testing.assert_allclose(c["a"], [0, 0.4, 0.8, 0.8, 0.8])
  o = flow.offset_times({"a": 0.0, "b": 0.5}, 3)
  np.testing.assert_allclose(o["a"], [0, 0.5, 1, 1])
  np.testing.assert_allclose(o["b"], [0, 0, 0.5, 1])
  j = flow.joint_times(("p", "l"), 4, shifts={"l": 0.5})
  np.testing.assert_allclose(j["p"], np.linspace(0, 1, 5))
  np.testing.assert_allclose(j["l"], flow.shift(np.linspace(0, 1, 5), 0.5))
  with pytest.raises(ConfigError, match="unknown streams"):
    flow.joint_times(("p",), 4, shifts={"q": 2.0})
  with pytest.raises(ConfigError, match="positive integer"):
    flow.cascaded_times(("a",), (0,))


# Two independent Gaussian streams x_s ~ N(mu_s, sd_s^2) per coordinate: E[x | z_t] is linear in z_t.
GAUSS = {"pixel": (0.7, 1.3), "latent": (-0.4, 0.5)}


def _exact_denoiser(z, t):
  out = {}
  for s, zs in z.items():
    mu, sd = GAUSS[s]
    tb = t[s].reshape(t[s].shape + (1,) * (zs.ndim - 1))
    gain = tb * sd ** 2 / (tb ** 2 * sd ** 2 + (1 - tb) ** 2)
    out[s] = mu + gain * (zs - tb * mu)
  return out


def _final_gaussian(table, method, t_eps):
  """Every step is affine in z, so z_final = a eps + b exactly: run the sampler on eps = 0 and eps = 1."""
  noise = {s: jnp.asarray([[0.0], [1.0]]) for s in GAUSS}
  z = flow.sample(_exact_denoiser, noise, table, method=method, t_eps=t_eps)
  return {s: (float(z[s][0, 0]), float(z[s][1, 0] - z[s][0, 0])) for s in GAUSS}


@pytest.mark.parametrize("schedule", ["joint", "cascaded"])
def test_heun_with_the_exact_predictor_reaches_the_data_distribution(schedule):
  if schedule == "joint":
    table = flow.joint_times(tuple(GAUSS), 50)
  else:
    table = flow.cascaded_times(("latent", "pixel"), (25, 25))
  fd = {}
  for method, t_eps in (("heun", 1e-3), ("euler", 1e-3), ("heun_jit_clamp", flow.T_EPS)):
    got = _final_gaussian(table, method.split("_")[0], t_eps)
    fd[method] = sum(frechet_distance([b], [[a ** 2]], [GAUSS[s][0]], [[GAUSS[s][1] ** 2]])
                     for s, (b, a) in got.items())
  # An inference clamp below the last step size (1 / 25 here) leaves the exact flow intact.
  assert fd["heun"] <= 1e-3 and fd["heun"] < fd["euler"] / 5, fd
  # JiT's training clamp (0.05) at sampling damps the last steps' velocity: a small, measurable bias.
  assert fd["heun_jit_clamp"] > 2 * fd["heun"], fd


def test_each_stream_integrates_with_its_own_time():
  """A stream held at time 0 by the schedule does not move; the denoiser receives each stream's own time."""
  seen = []

  def denoise(z, t):
    seen.append({s: float(v[0]) for s, v in t.items()})
    return {s: jnp.ones_like(v) * (3.0 if s == "a" else -2.0) for s, v in z.items()}
  table = {"a": np.array([0.0, 0.5, 1.0]), "b": np.array([0.0, 0.0, 0.0])}
  z = flow.sample(denoise, {"a": jnp.zeros((2, 3)), "b": jnp.full((2, 3), 0.25)}, table, jit=False)
  np.testing.assert_allclose(z["b"], 0.25)                       # dt = 0: unchanged
  assert seen[0] == {"a": 0.0, "b": 0.0} and seen[1] == {"a": 0.5, "b": 0.0}
  np.testing.assert_allclose(z["a"], 3.0, rtol=1e-5)             # a constant x_hat is reached exactly
  with pytest.raises(ConfigError, match="non-decreasing"):
    flow.sample(denoise, {"a": jnp.zeros((1, 1))}, {"a": np.array([0.5, 0.2])})


def test_guidance_scale_one_interval_and_autoguidance():
  cond = lambda z, t: {s: v + 1.0 for s, v in z.items()}
  uncond = lambda z, t: {s: v - 1.0 for s, v in z.items()}
  z = {"p": jnp.zeros((4, 2)), "l": jnp.zeros((4, 2))}
  t = {"p": jnp.array([0.0, 0.3, 0.6, 0.9]), "l": jnp.full((4,), 0.5)}
  out = guidance.guided(cond, uncond, {"p": 1.0, "l": 1.0})(z, t)
  for s in z:
    np.testing.assert_array_equal(out[s], cond(z, t)[s])       # scale 1: the conditional model exactly
  out = guidance.guided(cond, uncond, {"p": 2.0, "l": 3.0}, intervals={"p": (0.25, 0.75)})(z, t)
  np.testing.assert_allclose(out["p"][:, 0], [1.0, 3.0, 3.0, 1.0])   # -1 + 2 * 2 inside, cond outside
  np.testing.assert_allclose(out["l"], 5.0)                           # -1 + 3 * 2 everywhere
  with pytest.raises(ConfigError, match="unknown streams"):
    guidance.combine(cond(z, t), uncond(z, t), t, {"q": 2.0})


def test_frechet_distance_equals_scipy_sqrtm_formula():
  rng = np.random.default_rng(0)
  a = rng.standard_normal((400, 12))
  b = rng.standard_normal((300, 12)) @ rng.standard_normal((12, 12)) * 0.4 + 0.3
  m1, c1 = np.mean(a, 0), np.cov(a, rowvar=False)
  m2, c2 = np.mean(b, 0), np.cov(b, rowvar=False)
  ref = np.sum((m1 - m2) ** 2) + np.trace(c1 + c2 - 2 * scipy.linalg.sqrtm(c1 @ c2).real)
  assert frechet_from_features(a, b) == pytest.approx(ref, rel=1e-9)
  assert frechet_from_features(a, a) == pytest.approx(0.0, abs=1e-9)
  mu, cov = feature_stats(a)
  np.testing.assert_allclose(cov, c1)
  with pytest.raises(DataError, match="n >= 2"):
    feature_stats(a[:1])
  with pytest.raises(DataError, match="NaN"):
    feature_stats(np.full((3, 2), np.nan))


def test_fid_from_local_statistics_files(tmp_path):
  from jaxlab.evals import frechet
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((200, 6)), rng.standard_normal((150, 6)) + 0.5
  np.savez(tmp_path / "samples.npz", features=a)                     # raw features
  np.savez(tmp_path / "ref.npz", mu=b.mean(0), sigma=np.cov(b, rowvar=False))   # ADM / pytorch-fid stats
  np.savez(tmp_path / "single.npz", b)                               # one unnamed array: features
  want = frechet_from_features(a, b)
  assert frechet.fid_from_files(str(tmp_path / "samples.npz"), str(tmp_path / "ref.npz")) == pytest.approx(want)
  assert frechet.fid_from_files(str(tmp_path / "samples.npz"), str(tmp_path / "single.npz")) == pytest.approx(want)
  np.savez(tmp_path / "bad.npz", x=a, y=b)
  with pytest.raises(DataError, match="expected 'mu' and 'sigma'"):
    frechet.load_stats(str(tmp_path / "bad.npz"))
  with pytest.raises(DataError, match="nothing is downloaded"):
    frechet.load_stats(str(tmp_path / "missing.npz"))


def _brute_balanced(shifts, n):
  """The official sampler's construction spelled out: the grids on which each stream is uniform, merged, every
  k-th point kept; stream i's time is its shift of that clock."""
  y = [i / n for i in range(n + 1)]
  merged = sorted(a * 0 + (yy / a) / (1 + (1 / a - 1) * yy) for a in shifts.values() for yy in y)
  clock = merged[::len(shifts)]
  return {s: [a * u / (1 + (a - 1) * u) for u in clock] for s, a in shifts.items()}


@pytest.mark.parametrize("alpha", [16.0, 1 / 16, 1.0, 9.0])
def test_balanced_times_match_the_construction_and_the_relative_shift(alpha):
  r = alpha ** 0.5
  t = flow.balanced_times({"latent": r, "pixel": 1 / r}, 20)
  ref = _brute_balanced({"latent": r, "pixel": 1 / r}, 20)
  for s in t:
    np.testing.assert_allclose(t[s], ref[s], atol=1e-12)
    assert t[s][0] == 0 and t[s][-1] == 1 and np.all(np.diff(t[s]) >= 0) and len(t[s]) == 21
  np.testing.assert_allclose(flow.shift(t["pixel"], alpha), t["latent"], atol=1e-12)   # relative shift alpha
  if alpha > 1:
    assert np.all(t["latent"][1:-1] > t["pixel"][1:-1])                              # the latent leads
  with pytest.raises(ConfigError, match="one shift > 0"):
    flow.balanced_times({"a": 0.0}, 4)


def test_scanned_sampler_equals_the_unrolled_loop_and_takes_traced_tables():
  def den(z, t):
    return {k: jnp.tanh(v) * 0.5 + t[k].reshape(-1, *([1] * (v.ndim - 1))) * 0.1 for k, v in z.items()}
  ka, kb = jax.random.split(jax.random.key(0))
  noise = {"a": jax.random.normal(ka, (5, 3)), "b": jax.random.normal(kb, (5, 2, 2))}
  table = flow.cascaded_times(["a", "b"], [3, 4])
  for method in ("heun", "euler"):
    want = flow.sample(den, noise, table, method=method)
    got = flow.sample(den, noise, table, method=method, scan=True)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
  other = flow.joint_times(["a", "b"], 7, {"a": 2.0})
  run = jax.jit(lambda tab: flow.sample(den, noise, tab, jit=False, scan=True))       # one compile, two tables
  for tab in (table, other):
    got = run({k: jnp.asarray(v) for k, v in tab.items()})
    want = flow.sample(den, noise, tab)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
  assert run._cache_size() == 1


def test_euler_at_one_lands_a_cascaded_stream_on_its_prediction():
  # a denoiser whose clean prediction is a constant: the latent's last Heun step in a cascade goes only half-way
  # (the clamped velocity at t = 1 of z_e = x_hat is 0); with euler_at_one it lands on the prediction
  def den(z, t):
    return {"lat": jnp.full_like(z["lat"], 0.5), "pix": jnp.zeros_like(z["pix"]) + z["lat"].mean()}
  noise = {"lat": jnp.ones((2, 3)), "pix": jnp.zeros((2, 3))}
  table = flow.cascaded_times(["lat", "pix"], [4, 4])
  half = flow.sample(den, noise, table)
  full = flow.sample(den, noise, table, euler_at_one=True, scan=True)
  np.testing.assert_allclose(full["lat"], 0.5, rtol=1e-6)
  np.testing.assert_allclose(full["pix"], 0.5, rtol=1e-6)              # decoded from the finished latent
  assert float(half["lat"][0, 0]) > 0.5 + 1e-3                         # the official trapezoid stops short
  joint = flow.joint_times(["lat", "pix"], 5)                          # only the last step reaches 1: no change
  a, b = flow.sample(den, noise, joint), flow.sample(den, noise, joint, euler_at_one=True)
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
