"""PETS experiment: end to end (short), resume, SIGTERM inside a stage, sharded == single device, user pool
files, clear errors."""

import json

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single, check_sigterm_resume
from jaxlab import registry
from jaxlab.errors import ConfigError, DataError

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


def test_simulated_pools_smaller_than_the_budget_are_a_clear_error():
  exp = registry.load("pets")
  for overrides, key in (({"method.budgets": (2, 128)}, "method.budgets"),
                         ({"online.max_per_question": 96}, "online.max_per_question"),
                         ({"data.pool_size": 24, "method.budgets": (2, 4, 8, 16)}, "online.max_per_question")):
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
