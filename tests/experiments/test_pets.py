"""PETS experiment: end to end (short), resume, sharded == single device, user pool files, clear errors."""

import json

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, registry
from jaxlab.errors import ConfigError, DataError

# A small, fast version of the tiny variant: 24 questions, 16-answer pools, two offline budgets, one online.
SHORT = {"data.num_questions": 24, "data.pool_size": 16, "method.budgets": (2, 4), "method.nsamples": 64,
         "online.train_size": 8, "online.budgets": (4, 8), "online.subsample_draws": 100,
         "online.max_per_question": 16, "num_steps": 3, "mesh": (("data", 4), ("model", 2))}


def _run(tmp_path, overrides):
  exp = registry.load("pets")
  c = exp.get_config("tiny")
  configs.apply_overrides(c, overrides)
  return exp.train_module.train_and_evaluate(c, str(tmp_path))


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("pets", tmp_path, SHORT)
  for kind in ("uniform", "offline"):
    for b in (2, 4):
      assert 0.0 <= s[f"sc_rate/{kind}/B{b}"] <= 1.0
  assert s["offline/spent/B4"] == 4.0                       # the budget is spent exactly
  for kind in ("online", "uniform_test"):
    assert 0.0 <= s[f"sc_rate/{kind}/B8"] <= 1.0
  assert s["budget/online_spent/B8"] <= 8.0 and s["budget/online_planned/B8"] <= 8.0


def test_resume(tmp_path):
  # Offline stages only, so the resumed stage continues the OKG state restored from the stage-1 checkpoint.
  check_resume("pets", tmp_path, {**SHORT, "online.enabled": False, "num_steps": 2})


def test_sharded_equals_single_device(tmp_path):
  # Questions (24, padded to a multiple of 4) are sharded over the data axis; gains use per-question keys.
  check_sharded_equals_single("pets", tmp_path, SHORT)


def test_pool_file(tmp_path):
  # 24 questions of 16 answers (the SHORT shapes, so the compiled allocator is reused); line 3 has 15 + "E".
  letters = "ABCD"
  lines = [{"id": f"q{i}", "answers": [letters[(i * j) % 4 if j % 3 else 0] for j in range(16)], "answer": "A",
            "trace_confidence": [{"mean_confidence": 1.0 + j} for j in range(16)]} for i in range(24)]
  lines[2]["answers"][5] = "E"
  path = tmp_path / "pools.jsonl"
  path.write_text("".join(json.dumps(x) + "\n" for x in lines))
  s = _run(tmp_path / "run", {**SHORT, "data.pool_file": str(path), "data.shuffle": True})
  assert s["num_questions"] == 24 and s["max_pool"] == 16 and s["skipped_answers"] == 1
  for key in ("sc_rate/uniform/B2", "sc_rate/offline/B4", "sc_rate/online/B8", "acc/offline/B4"):
    assert 0.0 <= s[key] <= 1.0, key


def test_malformed_pool_file_is_a_clear_error(tmp_path):
  path = tmp_path / "pools.jsonl"
  path.write_text('{"answers": ["A", "B"]}\n{"answers": ["A", "B"], "final": "E"}\n')
  with pytest.raises(DataError, match=r"pools.jsonl:2: 'final' 'E' is not one of"):
    _run(tmp_path / "run", {"data.pool_file": str(path)})


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load("pets")
  for overrides, message in (({"num_steps": 3}, "must equal the number of stages"),
                             ({"method.budgets": (8, 4), "num_steps": 3}, "strictly increasing"),
                             ({"method.budgets": (2, 128), "num_steps": 3}, "pools hold"),
                             ({"online.curve": "spline"}, "online.curve"),
                             ({"online.budgets": (2, 8)}, "online.k0"),
                             ({"data.easy_alpha": (1.0, 1.0)}, "easy_alpha"),
                             ({"method.warm_up": 5}, "warm_up")):
    c = exp.get_config("tiny")
    configs.apply_overrides(c, overrides)
    with pytest.raises(ConfigError, match=message):
      exp.train_module.train_and_evaluate(c, str(tmp_path))
  with pytest.raises(ConfigError, match="pool_file"):
    exp.train_module.train_and_evaluate(exp.get_config("full"), str(tmp_path))
