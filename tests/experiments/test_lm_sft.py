"""LM SFT experiment: end to end (short), resume, sharded == single device, JSONL input, LoRA, errors."""

import json

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, registry
from jaxlab.errors import ConfigError

SHORT = {"num_steps": 20, "log_every": 5, "eval_every": 10, "checkpoint_every": 10, "data.n_train": 512,
         "data.n_eval": 32, "generate.examples": 16, "generate.batch": 16, "model.hidden": 32,
         "model.mlp_hidden": 64, "optimizer.warmup_steps": 2}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("lm_sft", tmp_path, SHORT)
  assert 0.0 <= s["eval/gen_exact_match"] <= 1.0 and s["eval/gen_examples"] == 16
  assert s["train/loss"] < 5.6  # below log(vocab) = log(264): it is learning


def test_resume(tmp_path):
  check_resume("lm_sft", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("lm_sft", tmp_path, {**SHORT, "num_steps": 10})


def test_jsonl_input_and_lora(tmp_path):
  path = tmp_path / "data.jsonl"
  with open(path, "w") as f:
    for i in range(200):
      f.write(json.dumps({"prompt": f"echo {i}:", "completion": f" {i}"}) + "\n")
  s = check_end_to_end("lm_sft", tmp_path / "run", {**SHORT, "data.source": "jsonl", "data.path": str(path),
                                                    "data.packed": True, "model.lora_rank": 4})
  assert s["num_train_rows"] < 190  # packed: several examples per row


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load("lm_sft")
  c = exp.get_config("tiny")
  configs.apply_overrides(c, {"data.source": "jsonl"})
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    exp.train_module.train_and_evaluate(c, str(tmp_path))
