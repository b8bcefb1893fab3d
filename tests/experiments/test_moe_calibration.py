"""MoE calibration experiment: end to end (small sizes), resume, the world against closed forms, the
aggregate-only toy failing claim 1, config errors."""

import numpy as np
import pytest

from experiment_checks import canary_covered, check_end_to_end, check_resume
from jaxlab import metrics, registry
from jaxlab.errors import ConfigError

SHORT = {"data.train_size": 20_000, "data.val_size": 5_000, "data.test_size": 20_000, "eval.n_boot": 20,
         "robust.train_size": 512, "robust.val_size": 2_000, "robust.test_size": 2_000, "robust.hidden": 16,
         "robust.epochs": 3, "robust.warmup_epochs": 1}
TRAINED = ("vanilla", "mocae", "robust", "robust_ts", "filtered", "filtered_ts", "filtered_w1", "filtered_w1_ts")


def _method():
  return registry.load("moe_calibration").train_module.method


@canary_covered
def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("moe_calibration", tmp_path, SHORT)
  for arm in ("hard", "soft", "soft_global_ts", "oracle") + TRAINED:
    for shift in ("S0", "S1", "S2"):
      lo, e, hi = (s[f"{arm}/{shift}/{k}"] for k in ("ece_lo", "ece", "ece_hi"))
      assert 0 <= lo <= hi <= 1 and 0 <= e <= 1 and 0.5 <= s[f"{arm}/{shift}/acc"] <= 1
  assert s["test/S2/size"] == 20_000 and 0 < s["test/S2/accept_rate"] < 1
  # Even at this size the boundary shift separates the soft aggregate from the hard one.
  assert s["soft/S2/ece"] > s["hard/S2/ece"] + 0.005
  assert metrics.read_json(str(tmp_path / "summary.json")) == s
  exp = registry.load("moe_calibration")
  rel = exp.train_module.reliability_data(str(tmp_path))
  assert set(rel) == {f"{a}/{sh}" for a in ("hard", "soft", "soft_global_ts", "oracle") for sh in ("S0", "S1", "S2")}
  assert np.isclose(np.nansum(rel["hard/S0"]["share"]), 1.0)
  rel = exp.train_module.reliability_data(str(tmp_path), "robust")
  assert set(rel) == {f"{a}/{sh}" for a in TRAINED for sh in ("S0", "S1", "S2")}
  assert s["stages"] == ["data", "theory", "robust"]
  assert 0 < s["robust/train/tilt_ess"] <= 1 and 0 <= s["vanilla/train/relevant"] <= 1


def _trainer(**kw):
  import ml_collections
  training = registry.load("moe_calibration").train_module.training
  t = ml_collections.ConfigDict(dict(hidden=8, num_experts=4, train_size=256, batch_size=64, epochs=4,
                                     warmup_epochs=1, lr=1e-3, weight_decay=1e-4, eta=2.0))
  t.update(kw)
  return training, training.Trainer(5, t)


def _toy(n_worlds, n=256, d=5, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n_worlds, n, d)).astype(np.float32)
  return x, (x[..., 0] + 0.5 * rng.normal(size=(n_worlds, n)) > 0).astype(np.int32)


def test_trainer_identities():
  """The uniform tilt (eta = 0) is ERM; worlds trained together equal worlds trained alone; the learning rate is
  torch's CosineAnnealingLR stepped per epoch (constant inside an epoch); unit temperatures give the mixture."""
  import jax
  training, tr = _trainer()
  x, y = _toy(2)
  keys = jax.random.split(jax.random.key(1), 2)
  ekeys = jax.vmap(lambda k: jax.random.split(k, 2))(keys)
  start = lambda: tr.init(keys)                                         # noqa: E731
  erm = tr.run(start(), x, y, ekeys, "erm", 0.0)[0]
  flat = tr.run(start(), x, y, ekeys, "robust", 0.0)[0]
  for a, b in zip(jax.tree.leaves(erm), jax.tree.leaves(flat)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  tilted = tr.run(start(), x, y, ekeys, "robust", 2.0)[0]
  assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(erm), jax.tree.leaves(tilted)))
  one = tr.run(jax.tree.map(lambda v: v[1:], start()), x[1:], y[1:], ekeys[1:], "erm", 0.0)[0]
  for a, b in zip(jax.tree.leaves(erm), jax.tree.leaves(one)):
    np.testing.assert_allclose(np.asarray(a)[1:], np.asarray(b), rtol=2e-5, atol=1e-6)
  spe, lr, epochs = tr.steps_per_epoch, tr.t.lr, tr.t.epochs
  sched = tr.tx_schedule
  for step in (0, spe - 1, spe, 3 * spe + 1):
    want = lr * 0.5 * (1 + np.cos(np.pi * (step // spe) / epochs))
    np.testing.assert_allclose(float(sched(step)), want, rtol=1e-6)
  out = tr.forward(erm, x)
  np.testing.assert_allclose(training.calibrated({k: v[0] for k, v in out.items()}, np.ones(4)), out["probs"][0],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["probs"].sum(-1), 1.0, rtol=1e-5)
  diag = training.tilt_diagnostics(tr, erm, x, y, eta=0.0)
  assert all(abs(d["tilt_ess"] - 1.0) < 1e-6 for d in diag)           # no tilt: every row weighs the same
  p = out["probs"][0]
  np.testing.assert_allclose(diag[0]["nll"], -np.mean(np.log(p[np.arange(len(y[0])), y[0]])), rtol=1e-5)


def test_train_arms_share_the_warm_up():
  """Every arm continues the same warm-up; the w == 1 filter ablation differs from the tilted filter."""
  import jax
  training, tr = _trainer(epochs=3, warmup_epochs=2)
  x, y = _toy(1, seed=2)
  arms = tr.train_arms(x, y, [7])
  assert set(arms) == set(training.TRAINED_ARMS)
  warm = tr.run(tr.init(jax.random.split(jax.random.key(7), 2)[None, 0]), x, y,
                jax.random.split(jax.random.split(jax.random.key(7), 2)[1], 3)[None, :2], "erm", 0.0)[0]
  lead = lambda p: np.concatenate([np.ravel(v) for v in jax.tree.leaves(p)])      # noqa: E731
  d = {a: np.max(np.abs(lead(p) - lead(warm))) for a, p in arms.items()}
  assert all(0 < v < 0.05 for v in d.values()), d      # one epoch past the shared warm-up
  assert not np.allclose(lead(arms["filtered"]), lead(arms["filtered_w1"]))


def test_resume(tmp_path):
  check_resume("moe_calibration", tmp_path, {**SHORT, "data.train_size": 5_000, "data.val_size": 2_000,
                                              "data.test_size": 5_000})


def test_world_regions_labels_and_shifts():
  m = _method()
  world = m.make_world(0, sep=2.0, slope=1.0)
  rng = np.random.default_rng(0)
  x = np.array([[1.0, 2.0], [-3.0, 0.5], [-0.2, -0.1], [0.3, -4.0]])
  np.testing.assert_array_equal(m.region(world, x), [0, 1, 2, 3])     # quadrants (equal priors, equal spread)
  r = m.region(world, x)
  want = 1 / (1 + np.exp(-(np.sum(world.slopes[r] * x, 1) + world.offsets[r])))
  np.testing.assert_allclose(m.true_prob(world, x), want)
  s1 = m.draw_shift(world, rng, "S1", 40_000, (0.7, 0.1, 0.1, 0.1))
  np.testing.assert_allclose(np.bincount(s1["cluster"], minlength=4) / 40_000, [0.7, 0.1, 0.1, 0.1], atol=0.01)
  s0, s2 = (m.draw_shift(world, rng, s, 40_000, None) for s in ("S0", "S2"))
  h = lambda d: np.mean(m.shifts.routing_entropy(m.cluster_posterior(world, d["x"])))   # noqa: E731
  assert h(s2) > 2 * h(s0)          # the boundary shift moves mass to where the router is uncertain


def test_aggregate_only_calibration_fails_claim_one():
  """One temperature on the soft aggregate calibrates the source on average, not the shifted sets: its ECE moves
  by far more than claim 1's 0.005 under the boundary shift, while the hard arm's stays put."""
  m = _method()
  world = m.make_world(3, sep=2.0, slope=1.0)
  rng = np.random.default_rng(3)
  draw = m.draw_source(world)
  train, val = draw(rng, 100_000), draw(rng, 50_000)
  tests = {s: m.draw_shift(world, rng, s, 100_000, (0.7, 0.1, 0.1, 0.1)) for s in ("S0", "S2")}
  arms = m.fit_theory(world, train, val)
  ece = {}
  for s, t in tests.items():
    for a, p in m.theory_probs(world, arms, t["x"]).items():
      ece[a, s] = float(m.metrics.ece(*m.metrics.top_label(p, t["y"])))
  assert ece["soft_global_ts", "S2"] - ece["soft_global_ts", "S0"] > 0.005
  assert abs(ece["hard", "S2"] - ece["hard", "S0"]) < 0.005


@pytest.mark.parametrize("override,match", [
    ({"data.sep": 0.0}, "data.sep=0.0 must be > 0"),
    ({"data.region_prior": (0.5, 0.5, 0.5, 0.5)}, "summing to 1"),
    ({"data.test_size": 10}, "must be >= 1000"),
    ({"eval.n_boot": 1}, "n_boot=1"),
    ({"robust.warmup_epochs": 50}, "warmup_epochs=50 must be in"),
    ({"robust.train_size": 100}, "train_size=100 must be >= batch_size=128"),
])
def test_bad_config_is_a_clear_error(override, match):
  with pytest.raises(ConfigError, match=match):
    registry.load("moe_calibration").get_config("tiny", override)
