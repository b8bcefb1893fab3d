"""`jaxlab.calibration`: ECE against scikit-learn's `calibration_curve` and a hand-computed table, weights as
repeats, classwise ECE against a loop, MMCE against a double loop, the soft-binned surrogate, bootstrap
intervals, the calibrated noise floor, temperature scaling against a grid search and per-expert fits."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.calibration import calibration_curve

from jaxlab import calibration as cal
from jaxlab.calibration import plots
from jaxlab.errors import ConfigError


def _reference_ece(conf, correct, n_bins):
  """ECE from scikit-learn's reliability curve (uniform bins) and the bin counts."""
  prob_true, prob_pred = calibration_curve(correct, conf, n_bins=n_bins, strategy="uniform")
  edges = np.linspace(0, 1, n_bins + 1)
  counts = np.histogram(conf, bins=edges)[0]
  counts = counts[counts > 0]
  return float(np.sum(counts / len(conf) * np.abs(prob_true - prob_pred)))


def test_ece_matches_sklearn_calibration_curve():
  rng = np.random.default_rng(0)
  conf = rng.uniform(0.05, 1.0, 5000)
  correct = (rng.uniform(size=5000) < conf ** 1.5).astype(np.float64)        # over-confident
  for n_bins in (10, 15):
    np.testing.assert_allclose(float(cal.ece(conf, correct, n_bins=n_bins)), _reference_ece(conf, correct, n_bins),
                               rtol=1e-5)


def test_ece_hand_computed_table():
  # 4 bins of width 0.25; bin edges are (lo, hi]: 0.25 -> bin 0, 0.5 -> bin 1, 1.0 -> bin 3, 0.0 -> bin 0.
  conf = np.array([0.0, 0.25, 0.3, 0.5, 0.9, 1.0])
  correct = np.array([0, 1, 0, 1, 1, 0])
  np.testing.assert_array_equal(np.asarray(cal.bin_index(conf, 4)), [0, 0, 1, 1, 3, 3])
  # bin 0: conf mean 0.125, acc 0.5 -> |gap| 0.375, weight 2/6; bin 1: conf 0.4, acc 0.5 -> 0.1, 2/6;
  # bin 3: conf 0.95, acc 0.5 -> 0.45, 2/6.   ECE = (0.375 + 0.1 + 0.45) / 3
  np.testing.assert_allclose(float(cal.ece(conf, correct, n_bins=4)), (0.375 + 0.1 + 0.45) / 3, rtol=1e-6)
  r = cal.reliability(conf, correct, n_bins=4)
  np.testing.assert_allclose(np.asarray(r["share"]), [1 / 3, 1 / 3, 0, 1 / 3], rtol=1e-6)
  assert np.isnan(float(r["acc"][2])) and float(r["conf"][3]) == pytest.approx(0.95)


def test_integer_weights_equal_repeated_rows_and_top_label():
  rng = np.random.default_rng(1)
  probs = rng.dirichlet(np.ones(5) * 0.5, size=400)
  labels = rng.integers(0, 5, 400)
  w = rng.integers(0, 4, 400)
  rep = np.repeat(np.arange(400), w)
  np.testing.assert_allclose(float(cal.top_label_ece(probs, labels, w)),
                             float(cal.top_label_ece(probs[rep], labels[rep])), rtol=1e-5)
  conf, correct = cal.top_label(probs, labels)
  np.testing.assert_allclose(np.asarray(conf), probs.max(1), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(correct), (probs.argmax(1) == labels).astype(float))
  np.testing.assert_allclose(float(cal.accuracy(probs, labels, w)), np.mean(probs[rep].argmax(1) == labels[rep]),
                             rtol=1e-6)


def test_classwise_ece_is_the_mean_of_per_class_eces():
  rng = np.random.default_rng(2)
  probs = rng.dirichlet(np.ones(4), size=3000)
  labels = np.array([rng.choice(4, p=p) for p in probs])
  want = np.mean([_reference_ece(probs[:, k], (labels == k).astype(float), 15) for k in range(4)])
  np.testing.assert_allclose(float(cal.classwise_ece(probs, labels)), want, rtol=1e-5)


def test_mmce_matches_a_double_loop():
  rng = np.random.default_rng(3)
  r = rng.uniform(0.3, 1, 60)
  c = (rng.uniform(size=60) < r).astype(float)
  w = rng.uniform(0.5, 2, 60)
  tot = sum(w[i] * w[j] * (c[i] - r[i]) * (c[j] - r[j]) * np.exp(-abs(r[i] - r[j]) / 0.4)
            for i in range(60) for j in range(60))
  np.testing.assert_allclose(float(cal.mmce(r, c, w)), np.sqrt(tot) / w.sum(), rtol=1e-5)


def test_soft_binned_ece_tends_to_binned_ece_and_has_gradients():
  rng = np.random.default_rng(4)
  # confidences near bin centres, so the nearest-centre soft binning is the hard binning
  centres = (np.arange(10) + 0.5) / 10
  conf = centres[rng.integers(0, 10, 2000)] + rng.uniform(-0.02, 0.02, 2000)
  correct = (rng.uniform(size=2000) < conf ** 2).astype(float)
  hard = float(cal.ece(conf, correct, n_bins=10))
  np.testing.assert_allclose(float(cal.soft_binned_ece(conf, correct, n_bins=10, temperature=1e-4)), hard,
                             rtol=1e-3)
  g = jax.grad(lambda x: cal.soft_binned_ece(x, jnp.asarray(correct), n_bins=10))(jnp.asarray(conf, jnp.float32))
  assert np.all(np.isfinite(np.asarray(g))) and float(jnp.abs(g).sum()) > 0


def test_calibrated_floor_and_bootstrap_interval():
  key = jax.random.key(0)
  conf = np.asarray(jax.random.uniform(key, (20000,), minval=0.5, maxval=1.0))
  mean, sd = cal.calibrated_floor(jax.random.key(1), conf, n_bins=15, n_sims=50)
  assert 0.002 < mean < 0.012 and sd < 0.005                   # about 0.006 at n = 20k, 15 bins
  correct = np.asarray(jax.random.bernoulli(jax.random.key(2), conf ** 3)).astype(float)   # over-confident
  point, lo, hi = cal.bootstrap_ece(jax.random.key(3), conf, correct, n_boot=200)
  assert lo < point < hi and hi - lo < 0.02
  assert lo > 5 * mean                                         # far above the floor


def _tempered_data(t_true, n, c=5, seed=0):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(n, c)) * 3.0
  p = jax.nn.softmax(jnp.asarray(logits) / t_true, axis=-1)
  labels = np.asarray(jax.random.categorical(jax.random.key(seed), jnp.log(p)))
  return logits.astype(np.float32), labels


def test_temperature_recovers_the_generating_temperature_and_matches_a_grid():
  logits, labels = _tempered_data(2.0, 20000)
  t = cal.fit_temperature(logits, labels)
  assert abs(t - 2.0) < 0.1
  grid = np.exp(np.linspace(np.log(1.5), np.log(2.6), 221))
  nll = [float(cal.weighted_nll(jnp.log(g), logits, labels, jnp.ones(len(labels)))) for g in grid]
  assert abs(t - grid[int(np.argmin(nll))]) < 0.01
  conf, correct = cal.top_label(jax.nn.softmax(logits / t), labels)
  raw_conf, raw_correct = cal.top_label(jax.nn.softmax(logits), labels)
  assert float(cal.ece(conf, correct)) < 0.3 * float(cal.ece(raw_conf, raw_correct))


def test_expert_temperatures_hard_routes_equal_separate_fits_and_soft_gates_are_weights():
  la, ya = _tempered_data(0.5, 4000, seed=1)
  lb, yb = _tempered_data(3.0, 4000, seed=2)
  logits = np.concatenate([la, lb])
  labels = np.concatenate([ya, yb])
  expert_logits = np.stack([logits, logits], axis=1)                      # (N, 2, C)
  route = np.zeros((8000, 2), np.float32)
  route[:4000, 0] = 1
  route[4000:, 1] = 1
  ts = cal.fit_expert_temperatures(expert_logits, labels, route)
  # float32 NLL sums resolve log T to about 1e-3 near the (flat) optimum, hence rtol 5e-3
  np.testing.assert_allclose(ts, [cal.fit_temperature(la, ya), cal.fit_temperature(lb, yb)], rtol=5e-3)
  assert ts[0] < 0.7 and ts[1] > 2.5
  soft = cal.fit_expert_temperatures(expert_logits, labels, np.full((8000, 2), 0.5, np.float32))
  np.testing.assert_allclose(soft[0], soft[1], rtol=1e-5)
  np.testing.assert_allclose(soft[0], cal.fit_temperature(logits, labels), rtol=5e-3)
  with pytest.raises(ConfigError, match="weights sum to 0"):
    cal.fit_expert_temperatures(expert_logits, labels, np.zeros((8000, 2), np.float32))
  with pytest.raises(ConfigError, match=r"\(N, K, C\)"):
    cal.fit_expert_temperatures(logits, labels, route)


def test_reliability_diagram_writes_a_png(tmp_path):
  rng = np.random.default_rng(5)
  conf = rng.uniform(0.2, 1, 1000)
  panels = {"calibrated": (conf, rng.uniform(size=1000) < conf),
            "over-confident": (conf, rng.uniform(size=1000) < conf ** 3, np.ones(1000))}
  path = plots.reliability_diagram(panels, str(tmp_path / "rel.png"), title="test")
  assert os.path.getsize(path) > 1000
