"""PETS experiment: end to end (short), resume, SIGTERM inside a stage, sharded == single device, user pool
files, one tie rule on hand-built tied pools, the budget-saving statistic and its claims, clear errors."""

import json

import numpy as np
import pytest
from scipy import stats

import jax
from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single, check_sigterm_resume
from jaxlab import registry
from jaxlab.errors import ConfigError, DataError
from jaxlab.tts import pools as pools_lib, self_consistency as sc

# A small, fast version of the tiny variant: 24 questions, 16-answer pools, two offline budgets, one online.
SHORT = {"data.num_questions": 24, "data.pool_size": 16, "method.budgets": (2, 4), "method.nsamples": 64,
         "online.train_size": 8, "online.budgets": (4, 8), "online.subsample_draws": 100,
         "online.max_per_question": 16, "mesh": (("data", 4), ("model", 2))}


def _run(tmp_path, overrides):
  exp = registry.load("pets")
  return exp.train_module.train_and_evaluate(exp.get_config("tiny", overrides), str(tmp_path))


def _pool_file(path, sizes, skip=()):
  """A PETS JSONL pool file: question i has sizes[i] answers (A-D, then an unusable "E" on the lines in skip)."""
  letters = "ABCD"
  lines = [{"id": f"q{i}", "answers": [letters[(i * j) % 4 if j % 3 else 0] for j in range(n)], "answer": "A",
            "trace_confidence": [{"mean_confidence": 1.0 + j} for j in range(n)]} for i, n in enumerate(sizes)]
  for i in skip:
    lines[i]["answers"].append("E")
    lines[i]["trace_confidence"].append({"mean_confidence": 1.0})
  path.write_text("".join(json.dumps(x) + "\n" for x in lines))
  return str(path)


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("pets", tmp_path, SHORT)
  assert s["stages"] == ["offline@B2", "offline@B4", "online"]
  for kind in ("uniform", "offline"):
    for b in (2, 4):
      assert 0.0 <= s[f"sc_rate/{kind}/B{b}"] <= 1.0
  assert s["offline/spent/B4"] == 4.0                       # the budget is spent exactly
  for kind in ("online", "uniform_test"):
    assert 0.0 <= s[f"sc_rate/{kind}/B8"] <= 1.0
  assert s["budget/online_spent/B8"] <= 8.0 and s["budget/online_planned/B8"] <= 8.0
  for key in ("budget_at_sc1/uniform", "budget_at_sc1/offline", "saving_sc1/offline", "budget_at_sc1/uniform_test",
              "budget_at_sc1/online", "spend_at_sc1/online", "saving_sc1/online", "saving_sc1/online_unguarded"):
    assert key in s, key


def test_resume(tmp_path):
  # Offline stages only, so the resumed stage continues the OKG state restored from the stage-1 checkpoint.
  check_resume("pets", tmp_path, {**SHORT, "online.enabled": False})


def test_sigterm_inside_a_stage_resumes(tmp_path):
  # Four offline stages: SIGTERM inside offline@B4, then between offline@B6 and offline@B8; the carried
  # (question-sharded) OKG state continues across both restarts.
  check_sigterm_resume("pets", tmp_path, {**SHORT, "online.enabled": False, "method.budgets": (2, 4, 6, 8)})


def test_sharded_equals_single_device(tmp_path):
  # Questions (24, padded to a multiple of 4) are sharded over the data axis; gains use per-question keys.
  check_sharded_equals_single("pets", tmp_path, SHORT)


def test_one_tie_rule_makes_perfect_consistency_reachable_on_tied_pools(tmp_path):
  # Hand-built pools, no `final`: q10 ("B A B A ...") and q11 ("D C D C ...") are 8-8 ties whose earliest
  # answer is the larger option, so a label broken to the earliest answer (B, D) differs from a vote broken to
  # the smallest option (A, C) even on the whole pool. With one rule ("min") for the labels and every vote, each
  # method that holds a whole pool (budget 16 = the pool) votes its label, whatever order it drew the answers in.
  letters = "ABCD"
  lines = []
  for i in range(24):
    if i == 10:
      ans = ["B", "A"] * 8
    elif i == 11:
      ans = ["D", "C"] * 8
    else:   # 7/5/2/2 counts of a rotated option order: every 4-answer count pattern can occur in calibration
      ans = [letters[(j + i) % 4] for j in [0] * 7 + [1] * 5 + [2, 2, 3, 3]]
      ans = ans[i % 16:] + ans[:i % 16]
    lines.append({"id": f"q{i}", "answers": ans})
  path = tmp_path / "tied.jsonl"
  path.write_text("".join(json.dumps(x) + "\n" for x in lines))
  tied = np.array([[1, 0] * 8, [3, 2] * 8])     # the defect: earliest-answer labels vs smallest-option votes
  np.testing.assert_array_equal(pools_lib.pool_majority(tied, 4, tie_break="first"), [1, 3])
  np.testing.assert_array_equal(sc.vote(tied, 4, tie_break="min"), [0, 2])
  overrides = {**SHORT, "data.pool_file": str(path), "data.shuffle": True, "method.budgets": (2, 16),
               "online.budgets": (4, 16)}
  exp = registry.load("pets")
  data = exp.train_module.method.load_pools(exp.get_config("tiny", overrides), jax.random.key(0))
  assert data["labels"][10] == 0 and data["labels"][11] == 2          # A and C: ties to the smallest option
  s = _run(tmp_path / "run", overrides)
  for kind in ("uniform", "offline", "uniform_test", "online", "online_unguarded"):
    assert s[f"sc_rate/{kind}/B16"] == 1.0, kind
  assert s["budget_at_sc1/online"] is not None and s["budget_at_sc1/offline"] is not None


def _fake_run(uniform, method_rates, spend=None):
  """A summary with offline curves on budgets 1..len: rates per budget, spend = budget unless given."""
  out = {}
  for b, (u, m) in enumerate(zip(uniform, method_rates), start=1):
    out.update({f"sc_rate/uniform/B{b}": u, f"sc_rate/offline/B{b}": m,
                f"offline/spent/B{b}": float(b if spend is None else spend[b - 1])})
  return out


def test_budget_savings_and_the_saving_claims():
  method = registry.load("pets").train_module.method
  run = _fake_run([0.5, 0.9, 1.0, 0.95, 1.0, 1.0, 1.0, 1.0], [0.8, 1.0, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0],
                  spend=[1, 1.5, 3, 4, 5, 6, 7, 8])
  s = method.budget_savings(run, "offline", "uniform", range(1, 9), "offline/spent")
  # uniform first reaches SC = 1 at 3, the method at 2 (realised spend 1.5): saving 1 - 1.5 / 3.
  assert s["budget_at_sc1/uniform"] == 3 and s["budget_at_sc1/offline"] == 2 and s["spend_at_sc1/offline"] == 1.5
  assert s["saving_sc1/offline"] == pytest.approx(0.5) and s["nominal_saving_sc1/offline"] == pytest.approx(1 / 3)
  never = method.budget_savings(_fake_run([0.5, 1.0], [0.5, 0.9]), "offline", "uniform", (1, 2), "offline/spent")
  assert never["budget_at_sc1/offline"] is None and never["saving_sc1/offline"] is None
  # The claims: t lower bound against scipy's one-sided interval; a seed that never reaches SC = 1 fails them.
  cfg = registry.load("pets").config_module
  v = np.array([0.3, 0.5, 0.45, 0.2, 0.6])
  ref = stats.ttest_1samp(v, 0.0, alternative="greater").confidence_interval(0.95).low
  assert cfg.t_lower_bound(v) == pytest.approx(ref, rel=1e-12)
  claims = {c.name: c for c in cfg.CLAIMS}
  runs = [{"saving_sc1/offline": x, "budget_at_sc1/offline": 8} for x in v]
  assert claims["okg_saving_sc1"].check(runs)["measured"] == pytest.approx(v.mean())
  assert claims["okg_saving_sc1_lb95"].check(runs)["measured"] == pytest.approx(ref)
  runs[2] = {"saving_sc1/offline": None, "budget_at_sc1/offline": None}
  for name in ("okg_reaches_sc1", "okg_saving_sc1", "okg_saving_sc1_lb95"):
    assert not claims[name].check(runs)["passed"], name
  table = method.saving_table([{**run, **s}, {**run, **s}], ["a", "b"])
  assert "| a | 3 | 2 | 0.500 |" in table and "| mean |" in table and "lower bound" in table


def test_budgets_alone_set_the_stages(tmp_path):
  # No step count to keep in line: --config.method.budgets alone changes the run's stages.
  c = registry.load("pets").get_config("tiny", {"method.budgets": (2, 4, 8, 16)})
  assert "train" not in c and "num_steps" not in c


def test_pool_file(tmp_path):
  # 24 questions of 16 usable answers (the SHORT shapes, so the compiled allocator is reused); line 3 has an
  # extra unusable "E".
  path = _pool_file(tmp_path / "pools.jsonl", [16] * 24, skip=(2,))
  s = _run(tmp_path / "run", {**SHORT, "data.pool_file": path, "data.shuffle": True})
  assert s["num_questions"] == 24 and s["max_pool"] == 16 and s["skipped_answers"] == 1
  for key in ("sc_rate/uniform/B2", "sc_rate/offline/B4", "sc_rate/online/B8", "acc/offline/B4"):
    assert 0.0 <= s[key] <= 1.0, key


@pytest.mark.parametrize("overrides,key,need", [
    ({}, "online.max_per_question", 16),
    ({"online.enabled": False, "method.budgets": (2, 12)}, "method.budgets", 12),
    ({"online.max_per_question": 10}, "online.max_per_question", 10),
    ({"online.budgets": (4, 12), "online.max_per_question": 12}, "online.budgets", 12),
])
def test_pools_smaller_than_the_budget_are_a_clear_error(tmp_path, overrides, key, need):
  # Question q1 holds only 9 usable answers (one more is an "E", not a choice).
  path = _pool_file(tmp_path / "small.jsonl", [16, 9] + [16] * 6, skip=(1,))
  with pytest.raises(DataError, match=rf"small.jsonl: the smallest pool \(question 'q1'\) holds 9 usable answers but "
                                      rf"config.{key} asks for {need} per question; lower config.{key} to <= 9"):
    _run(tmp_path / "run", {**SHORT, "online.train_size": 2, "data.pool_file": path, **overrides})
  assert not (tmp_path / "run").exists()                   # refused before anything was written


def test_too_few_questions_for_the_online_stage_is_refused_before_any_stage(tmp_path):
  """Fewer usable questions than the online calibration takes: one line naming the key and a value that works,
  before the offline stages run (the workdir is not created)."""
  path = _pool_file(tmp_path / "few.jsonl", [16] * 8)
  with pytest.raises(DataError, match=r"few.jsonl: 8 questions have >= online.k0=\d+ answers, but the online stage "
                                      r"calibrates on online.train_size=\d+ of them and needs more to test on; set "
                                      r"--config.online.train_size=4 \(half of them calibrate, half test\), or "
                                      r"--config.online.enabled=false"):
    _run(tmp_path / "run", {**SHORT, "data.pool_file": path, "online.train_size": 30})
  assert not (tmp_path / "run").exists()
  s = _run(tmp_path / "run", {**SHORT, "data.pool_file": path, "online.train_size": 4})
  assert s["online/test_questions"] == 4


def test_simulated_pools_smaller_than_the_budget_are_a_clear_error():
  exp = registry.load("pets")
  for overrides, key in (({"method.budgets": (2, 128)}, "method.budgets"),
                         ({"online.max_per_question": 96}, "online.max_per_question"),
                         ({"data.pool_size": 24, "method.budgets": (2, 4, 8, 16), "online.budgets": (4, 8, 16)},
                          "online.max_per_question")):
    with pytest.raises(ConfigError, match=rf"simulated pools hold data.pool_size=\d+ answers per question but "
                                          rf"config.{key} asks for"):
      exp.get_config("tiny", overrides)


def test_malformed_pool_file_is_a_clear_error(tmp_path):
  path = tmp_path / "pools.jsonl"
  path.write_text('{"answers": ["A", "B"]}\n{"answers": ["A", "B"], "final": "E"}\n')
  with pytest.raises(DataError, match=r"pools.jsonl:2: 'final' 'E' is not one of"):
    _run(tmp_path / "run", {"data.pool_file": str(path)})


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load("pets")
  for overrides, message in (({"method.budgets": (8, 4)}, "strictly increasing"),
                             ({"online.curve": "spline"}, "online.curve"),
                             ({"online.budgets": (2, 8)}, "online.k0"),
                             ({"data.easy_alpha": (1.0, 1.0)}, "easy_alpha"),
                             ({"method.warm_up": 5}, "warm_up")):
    with pytest.raises(ConfigError, match=message):
      exp.get_config("tiny", overrides)
  with pytest.raises(ConfigError, match="pool_file"):
    exp.train_module.train_and_evaluate(exp.get_config("full"), str(tmp_path / "full"))
  assert not (tmp_path / "full").exists()
