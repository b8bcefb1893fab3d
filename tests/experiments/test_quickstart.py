"""Quickstart experiment: end to end, resume, sharded == single device, the config layout (train section)."""

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import registry
from jaxlab.errors import ConfigError

SHORT = {"train.num_steps": 40, "train.log_every": 10, "train.eval_every": 20, "train.checkpoint_every": 20}


def test_tiny_end_to_end(tmp_path):
  summary = check_end_to_end("quickstart", tmp_path, SHORT)
  assert summary["step"] == 40 and summary["eval/accuracy"] > 0.5  # well above chance (0.1) already


def test_resume(tmp_path):
  check_resume("quickstart", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("quickstart", tmp_path, {**SHORT, "train.num_steps": 20})


def test_training_keys_live_in_the_train_section():
  exp = registry.load("quickstart")
  c = exp.get_config("tiny", {"train.optimizer.learning_rate": 0.01, "train.batch_size": 32})
  assert c.train.optimizer.learning_rate == 0.01 and c.train.batch_size == 32
  assert "num_steps" not in c and "optimizer" not in c
  with pytest.raises(ConfigError, match="did you mean 'train.num_steps'"):
    exp.get_config("tiny", {"num_steps": 5})
  with pytest.raises(ConfigError, match="model.hidden"):
    exp.get_config("tiny", {"model.hidden": (128, 0)})
