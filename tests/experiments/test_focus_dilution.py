"""Focus-dilution experiment: end to end (short), resume, sharded == single device, real text, config errors."""

import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, registry
from jaxlab.errors import ConfigError

# 4 chunks of 60 GD steps on 32 sequences: long enough to pass the condensation point.
SHORT = {"num_steps": 4, "method.chunk": 60, "data.n_seq": 32, "batch_size": 32, "checkpoint_every": 2}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("focus_dilution", tmp_path, SHORT)
  for key in ("cond/share_E", "cond/qk_ratio", "cond/cos_u_pi", "control/share_E", "final/loss"):
    assert key in s
  assert s["cond/qk_ratio"] <= 2.0 and s["final/loss"] < 2.99  # attention still frozen, loss below log(20)


def test_resume(tmp_path):
  check_resume("focus_dilution", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # The 64 sequences are split over the data axis (4 shards); parameters are replicated.
  check_sharded_equals_single("focus_dilution", tmp_path, {**SHORT, "num_steps": 2, "method.control": False},
                              rtol=1e-4)


def test_real_text_pydoc_runs(tmp_path):
  s = check_end_to_end("focus_dilution", tmp_path, {**SHORT, "data.source": "pydoc", "data.vocab": 65,
                                                    "num_steps": 2, "method.control": False})
  assert "cond/cos_u_pi" not in s and s["final/loss"] < 4.2  # log(65) = 4.17


def _train(tmp_path, overrides):
  exp = registry.load("focus_dilution")
  c = exp.get_config("tiny")
  configs.apply_overrides(c, overrides)
  return exp.train_module.train_and_evaluate(c, str(tmp_path))


def test_bad_config_is_a_clear_error(tmp_path):
  with pytest.raises(ConfigError, match="must equal config.data.n_seq"):
    _train(tmp_path, {"batch_size": 32})
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
  assert full.model.d == 256 and full.data.length == 128 and full.num_steps * full.method.chunk == 50000
