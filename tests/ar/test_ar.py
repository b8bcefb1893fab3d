"""jaxlab.ar: the grouped two-stream masks against a brute-force loop, schedules, KV-cached decoding == the full
masked forward, the leakage test (and its negative controls), the EMA teacher, the flow head, the tokenizers."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.ar import generate as gen
from jaxlab.ar import head as head_lib
from jaxlab.ar import masks
from jaxlab.ar import model as model_lib
from jaxlab.ar import tokenizers
from jaxlab.errors import ConfigError, DataError


def brute_mask(groups, m, kind, intra):
  """The rules of `jaxlab.ar.masks` written as a loop over (query, key) pairs."""
  n = len(groups)
  t = m + 2 * n

  def role(a):
    return ("C", a) if a < m else ("R", a - m) if a < m + n else ("P", a - m - n)
  out = np.zeros((t, t), bool)
  for a, b in itertools.product(range(t), range(t)):
    (sa, i), (sb, j) = role(a), role(b)
    if sb == "C":
      ok = True
    elif sa == "C":
      ok = False
    elif kind in ("sar", "lpd"):
      ok = {("R", "R"): groups[j] <= groups[i], ("P", "R"): groups[j] < groups[i], ("R", "P"): False,
            ("P", "P"): i == j or ((intra or kind == "lpd") and groups[j] == groups[i])}[(sa, sb)]
    elif kind == "mar":
      ok = {("R", "R"): True, ("P", "R"): groups[j] < groups[i], ("R", "P"): False, ("P", "P"): True}[(sa, sb)]
    elif kind == "causal":
      ok = {("R", "R"): j <= i, ("P", "R"): j <= i, ("R", "P"): False, ("P", "P"): i == j}[(sa, sb)]
    elif kind == "full":
      ok = True
    else:
      ok = {("R", "R"): j <= i, ("P", "R"): False, ("R", "P"): False, ("P", "P"): i == j}[(sa, sb)]
    out[a, b] = ok
  return out


@pytest.mark.parametrize("kind", masks.KINDS)
@pytest.mark.parametrize("intra", [True, False])
def test_mask_matches_brute_force(kind, intra):
  groups = np.array([0, 0, 1, 2, 2, 2, 3])
  got = np.asarray(masks.two_stream_mask(groups, num_prefix=2, kind=kind, intra_pred=intra))
  np.testing.assert_array_equal(got, brute_mask(groups, 2, kind, intra))
  batched = np.asarray(masks.two_stream_mask(np.stack([groups, groups[::-1] * 0]), num_prefix=2, kind=kind,
                                             intra_pred=intra))
  np.testing.assert_array_equal(batched[0], got)
  np.testing.assert_array_equal(batched[1], brute_mask(groups * 0, 2, kind, intra))


def test_schedules():
  assert masks.fixed_sizes(16, 4) == (4, 4, 4, 4)
  assert masks.fixed_sizes(10, 4) == (4, 4, 2)
  for n, s in [(16, 4), (16, 16), (256, 64), (7, 3)]:
    for kind in ("linear", "cosine"):
      sizes = masks.schedule(n, kind, steps=s)
      assert len(sizes) == s and sum(sizes) == n and min(sizes) >= 1, (kind, n, s, sizes)
    cos = masks.cosine_sizes(n, s)
    assert cos[0] <= cos[-1]                              # few tokens first, many last (MAR)
  np.testing.assert_array_equal(masks.groups_from_sizes((1, 3, 2)), [0, 1, 1, 1, 2, 2])
  with pytest.raises(ConfigError, match="steps=0"):
    masks.cosine_sizes(16, 0)
  with pytest.raises(ConfigError, match="kind="):
    masks.schedule(16, "zigzag")


def test_random_groups_are_consecutive_partitions():
  g = np.asarray(masks.random_groups(jax.random.key(0), 256, 16, (1, 2, 4, 8)))
  assert g.shape == (256, 16) and (g[:, 0] == 0).all()
  steps = np.diff(g, axis=1)
  assert set(np.unique(steps)) <= {0, 1}
  for row in g:
    sizes = np.bincount(row)
    assert set(sizes[:-1]) <= {1, 2, 4, 8}                # the last group may be cut at n
  assert len({tuple(r) for r in g}) > 100                 # random per example


def _sar(intra=True, teacher=True, seed=0):
  c = model_lib.ARConfig(token_dim=3, grid=(3, 4), hidden=32, depth=2, heads=4, num_classes=5, num_prefix=2,
                         intra_pred=intra, teacher=teacher)
  return gen.SAR(c, head_lib.HeadConfig(3, 32, width=32, depth=2), rngs=nnx.Rngs(seed))


def _data(b=4, n=12, d=3, seed=1):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return jax.random.normal(k1, (b, n, d)), jax.random.randint(k2, (b,), 0, 6)


@pytest.mark.parametrize("intra", [True, False])
@pytest.mark.parametrize("sizes", [(1,) * 12, (4, 4, 4), (2, 3, 7), (12,), (1, 1, 2, 8)])
def test_kv_cached_decoding_equals_full_forward(intra, sizes):
  model = _sar(intra)
  x, y = _data()
  g = jnp.asarray(masks.groups_from_sizes(sizes))
  _, full = model.net(x, y, g)
  inc = model_lib.incremental_features(model.net, x, y, sizes)
  assert float(jnp.max(jnp.abs(inc - full))) < 1e-5


def test_no_leakage_and_negative_controls():
  model = _sar()
  x, y = _data(b=8)
  groups = masks.random_groups(jax.random.key(3), 8, 12, (1, 2, 4))
  for g_star in range(4):
    later = (groups >= g_star)[..., None]
    noisy = x + later * 5.0
    keep = groups <= g_star
    for kind in ("sar", "lpd", "causal", "full", "mar"):
      a = model.net(x, y, groups, kind=kind)[1]
      b = model.net(noisy, y, groups, kind=kind)[1]
      moved = bool(jnp.any((a != b) & keep[..., None]))
      assert moved == (kind in ("causal", "full", "mar")), (kind, g_star)


def test_prediction_never_sees_its_own_token():
  model = _sar()
  x, y = _data()
  g = jnp.arange(12)                     # one token per group: P_i sees R_j for j < i only
  _, f = model.net(x, y, g)
  _, f2 = model.net(x.at[:, 5].set(9.0), y, g)
  assert bool(jnp.all(f[:, :6] == f2[:, :6])) and not bool(jnp.all(f[:, 6:] == f2[:, 6:]))


def test_teacher_is_state_not_params_and_tracks_the_trunk():
  model = _sar()
  n_trunk = model_lib.num_params(model.net.trunk)
  assert model_lib.num_params(model.net) == n_trunk + model_lib.num_params(model.net.predictor)
  teach = nnx.to_pure_dict(nnx.state(model.net.teacher, model_lib.Teacher))
  trunk = nnx.to_pure_dict(nnx.state(model.net.trunk, nnx.Param))
  jax.tree.map(np.testing.assert_array_equal, teach, trunk)          # starts as a copy
  old = jax.tree.map(np.asarray, teach)
  nnx.update(model.net.trunk, jax.tree.map(lambda a: a + 1.0, trunk))
  model.net.update_teacher(0.9)
  new = nnx.to_pure_dict(nnx.state(model.net.teacher, model_lib.Teacher))
  jax.tree.map(lambda n, o: np.testing.assert_allclose(n, o + 0.1, rtol=1e-6, atol=1e-6), new, old)


def test_sar_loss_trains_and_updates_the_teacher_through_the_train_step_merge():
  from jaxlab.state import ModelDef
  md = ModelDef(lambda rngs: _sar(seed=0))
  params, rest = md.init(jax.random.key(0))
  x, y = _data()

  def objective(p):
    m = md.merge(p, rest)
    loss, metrics = gen.sar_loss(m, x, y, jax.random.key(0), group_sizes=(1, 2, 4), jepa_weight=0.5, ema_decay=0.5)
    return loss, (metrics, md.split(m)[1])
  (loss, (metrics, new_rest)), grads = jax.jit(jax.value_and_grad(objective, has_aux=True))(params)
  assert np.isfinite(float(loss)) and set(metrics) == {"loss_flow", "loss_jepa"}
  assert "teacher" not in grads["net"] and "teacher" in new_rest["net"]
  assert float(optax_norm(grads)) > 0
  # the teacher moved halfway to the (unchanged) trunk: equal to it, since it started as a copy
  jax.tree.map(np.testing.assert_allclose, new_rest["net"]["teacher"], params["net"]["trunk"])


def optax_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree)))


def test_grouped_sampler_shapes_and_determinism():
  model = _sar()
  s = gen.GroupedSampler(model, head_steps=3, cfg=1.5)
  a = s(jnp.arange(3), (4, 4, 4), jax.random.key(0))
  b = s(jnp.arange(3), (4, 4, 4), jax.random.key(0))
  assert a.shape == (3, 12, 3) and bool(jnp.all(a == b)) and bool(jnp.all(jnp.isfinite(a)))
  with pytest.raises(ConfigError, match="sum to the 12"):
    s(jnp.arange(3), (4, 4), jax.random.key(0))


def test_regression_sampler_matches_teacher_forcing():
  c = model_lib.ARConfig(token_dim=3, grid=(3, 4), hidden=32, depth=2, heads=4, num_classes=5)
  model = gen.NextTokenRegressor(c, rngs=nnx.Rngs(0))
  out = gen.RegressionSampler(model)(jnp.arange(4))
  np.testing.assert_allclose(np.asarray(model(out, jnp.arange(4))), np.asarray(out), atol=1e-5)


def test_flow_head_pieces():
  hc = head_lib.HeadConfig(token_dim=2, cond_dim=4, width=16, depth=2)
  head = head_lib.FlowHead(hc, rngs=nnx.Rngs(0))
  z, f = jnp.ones((5, 2)), jnp.ones((5, 4))
  assert bool(jnp.all(head(z, jnp.full((5,), 0.3), f) == 0))          # zero-initialised output
  g = head_lib.time_grid(10, 0.5)
  assert g[0] == 0 and g[-1] == 1 and np.all(np.diff(g) > 0) and g[5] < 0.5    # shift < 1: more steps near noise
  # a zero head: the ODE leaves the noise as it is; CFG with scale 1 is the conditional velocity
  out = head_lib.sample(head, f, jax.random.key(0), steps=4, temperature=0.5)
  np.testing.assert_allclose(np.asarray(out), 0.5 * np.asarray(jax.random.normal(jax.random.key(0), (5, 2))),
                             rtol=1e-6)
  x = jnp.zeros((5, 2))
  loss = head_lib.flow_loss(head, x, f, jax.random.key(1), batch_mul=2000)   # E||x - eps||^2 / D = 1
  assert abs(float(loss) - 1.0) < 0.05


@pytest.mark.parametrize("shift", [1.0, 0.5])
def test_euler_with_the_exact_velocity_samples_the_gaussian(shift):
  """Rectified flow (t = 1 clean) of x ~ N(mu, s^2): v(z, t) = E[x - eps | z_t] in closed form; integrating it
  from the noise gives N(mu, s^2)."""
  mu, s = 1.5, 0.4

  def v(z, t):
    t = t[:, None]
    var = t ** 2 * s ** 2 + (1 - t) ** 2
    r = (z - t * mu) / var
    return (mu + t * s ** 2 * r) - (1 - t) * r
  z0 = jax.random.normal(jax.random.key(0), (20000, 1))
  out = head_lib.integrate(v, z0, head_lib.time_grid(400, shift))
  assert abs(float(out.mean()) - mu) < 0.01 and abs(float(out.std()) - s) < 0.01


def test_tokenizers(tmp_path):
  x = np.random.default_rng(0).normal(size=(6, 8, 8, 1)).astype(np.float32)
  pt = tokenizers.PatchTokenizer(2, (8, 8, 1))
  t = pt.encode(x)
  assert t.shape == (6, 16, 4) and pt.grid == (4, 4)
  np.testing.assert_array_equal(np.asarray(pt.decode(t)), x)
  np.testing.assert_array_equal(np.asarray(t[0, 1]), x[0, 0:2, 2:4, 0].reshape(-1))   # raster order, row-major
  full = tokenizers.PCATokenizer.fit(x, 2, 4)
  np.testing.assert_allclose(np.asarray(full.decode(full.encode(x))), x, atol=1e-4)
  from sklearn.decomposition import PCA
  pca = PCA(2).fit(np.asarray(t).reshape(-1, 4))
  two = tokenizers.PCATokenizer.fit(x, 2, 2)
  np.testing.assert_allclose(np.abs(two.basis.T), np.abs(pca.components_), atol=1e-4)
  np.testing.assert_allclose(two.std ** 2, pca.explained_variance_, rtol=1e-4)
  with pytest.raises(ConfigError, match="dims=5"):
    tokenizers.PCATokenizer.fit(x, 2, 5)
  np.savez(tmp_path / "lat.npz", latent=np.ones((3, 2, 2, 4)), label=np.arange(3))
  lat = tokenizers.load_latents(str(tmp_path / "lat.npz"), 0.5)
  assert lat["tokens"].shape == (3, 4, 4) and lat["grid"] == (2, 2) and float(lat["tokens"][0, 0, 0]) == 0.5
  np.savez(tmp_path / "bad.npz", latent=np.ones((3, 2, 2, 4)))
  with pytest.raises(DataError, match="lacks \\['label'\\]"):
    tokenizers.load_latents(str(tmp_path / "bad.npz"))
  with pytest.raises(DataError, match="does not exist"):
    tokenizers.load_latents(str(tmp_path / "nope.npz"))


def test_config_errors():
  with pytest.raises(ConfigError, match="divisible"):
    model_lib.ARConfig(token_dim=3, hidden=30, heads=4)
  with pytest.raises(ConfigError, match="mask="):
    model_lib.ARConfig(token_dim=3, mask="zigzag")
  with pytest.raises(ConfigError, match="two-stream mask needs"):
    model_lib.ARConfig(token_dim=3, attention="splash")


def test_speed_cli(tmp_path, capsys):
  from jaxlab.ar import speed
  assert speed.main(["--case", "tiny", "--batch", "2", "--tokens_per_step", "1,8", "--repeats", "1",
                     "--json", str(tmp_path / "rows.json")]) == 0
  out = capsys.readouterr().out
  assert "| tiny | 2 | 8 | 2 |" in out
  import json
  rows = json.loads((tmp_path / "rows.json").read_text())
  assert [r["steps"] for r in rows] == [16, 2] and rows[0]["speedup"] == 1.0 and rows[1]["images_per_s"] > 0
  assert speed.main(["--batch", "two"]) == 2
  assert "comma-separated integers" in capsys.readouterr().err
  assert speed.main(["--batch", "1", "--tokens_per_step", "4", "--repeats", "1", "--head_steps", "1",
                     "--json", str(tmp_path / "h1.json")]) == 0
  assert json.loads((tmp_path / "h1.json").read_text())[0]["head_steps"] == 1
  assert speed.main(["--head_steps", "-1"]) == 2
  assert "--head_steps" in capsys.readouterr().err
