"""Quickstart experiment: end to end, resume, sharded == single device, offline data."""

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single

SHORT = {"num_steps": 40, "log_every": 10, "eval_every": 20, "checkpoint_every": 20}


def test_tiny_end_to_end(tmp_path):
  summary = check_end_to_end("quickstart", tmp_path, SHORT)
  assert summary["step"] == 40 and summary["eval/accuracy"] > 0.5  # well above chance (0.1) already


def test_resume(tmp_path):
  check_resume("quickstart", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("quickstart", tmp_path, {**SHORT, "num_steps": 20})
