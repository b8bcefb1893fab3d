"""sft_difficulty experiment (synthetic arm): end to end + resume, the model against a brute-force loop, the
claims' toys (always-hard / always-easy preferences fail claim 1), config errors."""

import jax
import ml_collections
import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume
from jaxlab import configs, registry
from jaxlab.errors import ConfigError
from jaxlab.selection import pac_bayes

# a small version of the tiny variant: 4 levels x 3 budgets, few training sets
SHORT = {"synthetic.levels": 4, "synthetic.budgets": (8, 32, 128), "synthetic.repeats": 3,
         "synthetic.target_inputs": 256}


def _claims():
  return {c.name: c for c in registry.load("sft_difficulty").claims}


def test_tiny_end_to_end_and_resume(tmp_path):
  s = check_end_to_end("sft_difficulty", tmp_path / "a", SHORT)
  assert s["stages"] == ["synthetic/n8", "synthetic/n32", "synthetic/n128"]
  assert len(s["dstar"]) == 3 and all(1 <= d <= 4 for d in s["dstar"])
  t = np.asarray(s["grid/target_err"])
  np.testing.assert_allclose(np.asarray(s["grid/train_err"]) + np.asarray(s["grid/gen_gap"])
                             + np.asarray(s["grid/extrap_gap"]), t, rtol=1e-6, atol=1e-9)
  assert s["dstar"] == [int(d) for d in np.argmin(t, axis=1) + 1]
  assert np.all(np.asarray(s["grid/extrap_gap"])[:, -1] == pytest.approx(0.0, abs=1e-5))   # d = L is the target
  check_resume("sft_difficulty", tmp_path / "b", SHORT)


# the small variant's LM arm, seconds-sized (the synthetic arm shortened as above)
LM_SHORT = {**SHORT, "synthetic.budgets": (8, 32), "lm.enabled": True,
            "lm.model.hidden": 32, "lm.model.n_layers": 1, "lm.model.n_heads": 2, "lm.model.n_kv_heads": 1,
            "lm.model.mlp_hidden": 64, "lm.pretrain.n_examples": 400, "lm.pretrain.steps": 20,
            "lm.pretrain.batch": 16, "lm.pretrain.warmup": 5, "lm.pretrain.log_every": 10,
            "lm.pretrain.checkpoint_every": 0, "lm.difficulties": (2, 3), "lm.budgets": (8, 16),
            "lm.target_digits": (2, 3, 4), "lm.sft.steps": 4, "lm.sft.batch": 8, "lm.sft.warmup": 1,
            "lm.eval.n_id": 8, "lm.eval.n_target": 8, "lm.eval.batch": 8,
            "lm.mesh": (("data", 1), ("model", 1))}


def test_small_variant_lm_arm_end_to_end(tmp_path):
  s = check_end_to_end("sft_difficulty", tmp_path, LM_SHORT)
  assert s["stages"] == ["synthetic/n8", "synthetic/n32", "lm/pretrain", "lm/d2/n8", "lm/d2/n16", "lm/d3/n8",
                         "lm/d3/n16"]
  gen, ext = np.asarray(s["lm/grid/gen_gap"]), np.asarray(s["lm/grid/extrap_gap"])
  assert gen.shape == ext.shape == (2, 2) and np.all(np.isfinite(gen))
  np.testing.assert_allclose(np.asarray(s["lm/grid/id_loss"]) - np.asarray(s["lm/grid/train_loss"]), gen, atol=1e-9)
  assert all(d in (2, 3) for d in s["lm/dstar"]) and 0.0 <= s["lm/base/target_err"] <= 1.0
  from jaxlab.experiments.sft_difficulty import train
  paths = train.plot([s], [str(tmp_path)], str(tmp_path / "plots"))
  assert [p.rsplit("/", 1)[-1] for p in paths] == ["sft_difficulty_grid.png", "sft_difficulty_lm_target_err.png",
                                                   "sft_difficulty_lm_target_loss.png", "sft_difficulty_lm_gen_gap.png", "sft_difficulty_lm_extrap_gap.png"]


def test_cell_against_a_brute_force_loop():
  """One training set, one (d, n): ridge toward w0, the excess errors and the exact KL recomputed in numpy."""
  from jaxlab.experiments.sft_difficulty import method
  c = registry.load("sft_difficulty").get_config("tiny", SHORT)
  s, b = ml_collections.FrozenConfigDict(c.synthetic), ml_collections.FrozenConfigDict(c.bound)
  w_star, w0 = method.world(jax.random.key(3), s)
  w_star, w0 = np.asarray(w_star, np.float64), np.asarray(w0, np.float64)
  rng = np.random.default_rng(0)
  u = rng.normal(size=(128, 8)).astype(np.float32)
  eps = rng.normal(size=128).astype(np.float32)
  v = rng.normal(size=(256, 8)).astype(np.float32)
  d, n = 3, 32
  cell = jax.jit(method._cell, static_argnames=("s", "b"))  # pylint: disable=protected-access
  got = cell(u, eps, v, w_star.astype(np.float32), w0.astype(np.float32), d, n, s=s, b=b)
  lev = method.levels(4)
  keep = lev <= d
  x = u[:n, keep].astype(np.float64)
  y = u[:n].astype(np.float64) @ np.where(keep, w_star, 0) + eps[:n]
  mu = w0.copy()
  mu[keep] = w0[keep] + np.linalg.solve(x.T @ x + c.synthetic.ridge * np.eye(keep.sum()), x.T @ (y - x @ w0[keep]))
  err = mu - w_star
  assert float(got["target_err"]) == pytest.approx(np.sum(err ** 2), rel=1e-4)
  assert float(got["id_err"]) == pytest.approx(np.sum(err[keep] ** 2), rel=1e-4)
  train = np.mean((y - x @ mu[keep]) ** 2 - eps[:n] ** 2)
  assert float(got["train_err"]) == pytest.approx(train, rel=1e-3, abs=1e-5)
  # the posterior over the excited coordinates only: the others equal the prior and add nothing to the KL
  cov = np.linalg.inv(x.T @ x / c.synthetic.noise ** 2 + np.eye(keep.sum()) / c.bound.prior_var)
  dm = mu[keep] - w0[keep]
  k = keep.sum()
  kl = 0.5 * (np.trace(cov) / c.bound.prior_var + dm @ dm / c.bound.prior_var - k
              + k * np.log(c.bound.prior_var) - np.linalg.slogdet(cov)[1])
  assert float(got["kl"]) == pytest.approx(kl, rel=1e-3)
  assert float(got["bound_catoni"]) == pytest.approx(
      float(pac_bayes.catoni_bound(float(got["emp_gibbs"]), kl, n, c.bound.delta, c.bound.catoni_c)), rel=1e-4)


def _toy_runs(prefer: str, seeds: int = 5, budgets=(16, 64, 256), levels: int = 6):
  """Per-seed summaries of a learner whose target error always prefers hard (or easy) data."""
  runs = []
  for seed in range(seeds):
    rng = np.random.default_rng(seed)
    d = np.arange(1, levels + 1)
    grid = np.array([(1.0 / d if prefer == "hard" else d / 10.0) + 0.01 * rng.random(levels) + 1.0 / n
                     for n in budgets])
    dstar = [int(x) for x in np.argmin(grid, axis=1) + 1]
    runs.append({"grid/target_err": grid.tolist(), "dstar/nmin": dstar[0], "dstar/nmax": dstar[-1]})
  return runs


@pytest.mark.parametrize("prefer", ["hard", "easy"])
def test_claim_one_rejects_a_fixed_preference(prefer):
  c = _claims()
  runs = _toy_runs(prefer)
  assert c["dstar_never_easier"].check(runs)["passed"]        # a constant d* is (trivially) non-decreasing ...
  assert not c["dstar_harder"].check(runs)["passed"]          # ... but never harder at n_max: claim 1 fails


def test_bad_config_is_a_clear_error():
  exp = registry.load("sft_difficulty")
  cases = [({"synthetic.levels": 1}, "at least 2 difficulty levels"),
           ({"synthetic.budgets": (64, 16)}, "increasing order"),
           ({"synthetic.pretrained_levels": 8}, "pretrained_levels=8"),
           ({"synthetic.ridge": 0.0}, "must be > 0"),
           ({"bound.delta": 1.0}, "delta in \\(0, 1\\)"),
           ({"synthetic.enabled": False}, "both arms are off"),
           ({"lm.enabled": True, "lm.budgets": ()}, "config.lm.budgets is empty")]
  for over, msg in cases:
    with pytest.raises(ConfigError, match=msg):
      exp.get_config("tiny", over)
  c = exp.get_config("tiny")
  with pytest.raises(ConfigError, match="increasing order"):
    configs.apply_overrides(c, {"synthetic.budgets": (8, 8)})
