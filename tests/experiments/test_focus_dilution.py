"""Focus-dilution experiment: end to end (short), resume, sharded == single device, real text, config errors."""

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError

# 4 chunks of 60 GD steps on 32 sequences: long enough to pass the condensation point.
SHORT = {"method.steps": 240, "method.chunk": 60, "data.n_seq": 32, "train.checkpoint_every": 2}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("focus_dilution", tmp_path, SHORT)
  for key in ("cond/share_E", "cond/qk_ratio", "cond/cos_u_pi", "control/share_E", "final/loss"):
    assert key in s
  assert s["cond/qk_ratio"] <= 2.0 and s["final/loss"] < 2.99  # attention still frozen, loss below log(20)
  assert s["gd_steps"] == 240 and [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1, 2, 3, 4]
  # summary.json is written once, with the derived keys (not the loop's own step / train keys)
  assert metrics.read_json(str(tmp_path / "summary.json")) == metrics.jsonable(s)
  assert "step" not in s and "train/loss" not in s and "resumes" in s


def test_resume(tmp_path):
  check_resume("focus_dilution", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # The 64 sequences are split over the data axis (4 shards); parameters are replicated.
  check_sharded_equals_single("focus_dilution", tmp_path, {**SHORT, "method.steps": 120, "method.control": False},
                              rtol=1e-4)


def test_real_text_pydoc_runs(tmp_path):
  s = check_end_to_end("focus_dilution", tmp_path, {**SHORT, "data.source": "pydoc", "data.vocab": 65,
                                                    "method.steps": 120, "method.control": False})
  assert "cond/cos_u_pi" not in s and s["final/loss"] < 4.2  # log(65) = 4.17


def _train(tmp_path, overrides):
  exp = registry.load("focus_dilution")
  c = exp.get_config("tiny", overrides)
  return exp.train_module.train_and_evaluate(c, str(tmp_path))


def test_steps_alone_set_the_run_length():
  exp = registry.load("focus_dilution")
  c = exp.get_config("tiny", {"method.steps": 4000})     # no derived step count to keep in sync
  assert exp.config_module.num_chunks(c) == 20
  assert sorted(c.train) == ["async_checkpoint", "checkpoint_every", "keep_checkpoints", "log_every"]
  c = exp.get_config("tiny")
  configs.apply_overrides(c, {"method.chunk": 100})
  assert exp.config_module.num_chunks(c) == 240
  with pytest.raises(ConfigError, match="multiple of config.method.chunk=200.*--config.method.steps=400"):
    exp.get_config("tiny", {"method.steps": 500})


def test_bad_config_is_a_clear_error(tmp_path):
  for key in ("num_steps", "batch_size", "train.batch_size"):    # full batch, step count from method.steps
    with pytest.raises(ConfigError, match="unknown config key"):
      _train(tmp_path, {key: 32})
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    _train(tmp_path, {"data.source": "file"})
  with pytest.raises(ConfigError, match="use gd or adam"):
    _train(tmp_path, {"method.optimizer": "sgd"})
  with pytest.raises(ConfigError, match="top_k"):
    _train(tmp_path, {"data.top_k": 20})
  with pytest.raises(FileNotFoundError, match="not found"):
    _train(tmp_path, {"data.source": "file", "data.path": str(tmp_path / "none.txt")})


def test_variants_build_and_full_names_the_real_dataset():
  exp = registry.load("focus_dilution")
  for v in ("tiny", "small", "full"):
    exp.config_module.validate(exp.get_config(v))
  full = exp.get_config("full")
  assert full.data.source == "wikitext" and full.data.tfds_name.startswith("wikitext/")
  assert full.model.d == 256 and full.data.length == 128 and full.method.steps == 50000
  assert exp.config_module.num_chunks(full) == 100
