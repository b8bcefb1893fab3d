"""DF-Mamba experiment: end to end (short), resume, sharded == single device, other tasks, config errors."""

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError

# A short version of the tiny variant: fewer, shorter series, a few steps, lookbacks 32 -> 64 (2 -> 3 levels).
SHORT = {"data.train_series": 8, "data.train_length": 128, "data.test_series": 8, "data.lookback": 32,
         "data.eval_lookbacks": (32, 64), "data.horizon": 8, "model.d_model": 8, "model.d_state": 4,
         "model.min_len": 16, "train.batch_size": 8, "train.num_steps": 4, "train.log_every": 2,
         "train.checkpoint_every": 2}
ONE = {**SHORT, "model.models": ("fractal",)}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("df_mamba", tmp_path, SHORT)
  for m in ("fractal", "no_delta_scale", "flat"):
    assert s[f"mse32/{m}"] > 0 and s[f"mse64/{m}"] > 0
  assert s["zoh/max_err"] < 1e-5 and s["euler/rel_err"] <= s["euler/bound"]
  assert s["params/fractal"] == s["params/no_delta_scale"] > s["params/flat"]
  assert s["mse64/fractal"] == s["eval/mse64/fractal"] and s["step"] == 4
  # summary.json is written once, by the loop, with the claim keys already in it
  assert metrics.read_json(str(tmp_path / "summary.json")) == metrics.jsonable(s)


def test_resume(tmp_path):
  check_resume("df_mamba", tmp_path, ONE)
  exp = registry.load("df_mamba")          # the trained models load back from the run (the notebook's path)
  assert list(exp.train_module.load_models(exp.get_config("tiny", ONE), str(tmp_path))) == ["fractal"]


def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("df_mamba", tmp_path, ONE, rtol=1e-4)


def test_digits_zero_shot_resolution_smoke(tmp_path):
  s = check_end_to_end("df_mamba", tmp_path, {
      "data.name": "digits", "model.min_len": 32, "model.d_model": 8, "model.d_state": 4, "train.batch_size": 8,
      "train.num_steps": 2, "train.log_every": 1, "model.models": ("fractal",)})
  assert 0.0 <= s["acc8/fractal"] <= 1.0 and 0.0 <= s["acc16/fractal"] <= 1.0


def test_real_series_smoke(tmp_path):
  pytest.importorskip("statsmodels")
  s = check_end_to_end("df_mamba", tmp_path, {**ONE, "data.name": "co2"})
  assert np.isfinite(s["mse64/fractal"]) and s["test_windows"] > 0


def test_csv_task(tmp_path):
  rng = np.random.default_rng(0)
  rows = ["date,a,b"] + [f"t{i},{np.sin(i / 5) + rng.normal() * 0.1:.4f},{rng.normal():.4f}" for i in range(700)]
  path = tmp_path / "weather.csv"
  path.write_text("\n".join(rows) + "\n")
  s = check_end_to_end("df_mamba", tmp_path / "run", {**ONE, "data.name": "csv", "data.path": str(path)})
  assert s["columns"] == ["a", "b"] and s["test_windows"] > 0


def test_train_keys_live_in_the_train_section():
  exp = registry.load("df_mamba")
  c = exp.get_config("tiny", {"train.optimizer.learning_rate": 1e-3})
  assert c.train.optimizer.learning_rate == 1e-3 and c.train.optimizer.clip_norm == 1.0
  assert (c.train.batch_size, c.train.num_steps) == (16, 800)
  with pytest.raises(ConfigError, match="did you mean 'train.num_steps'"):
    exp.get_config("tiny", {"num_steps": 5})


def test_bad_config_is_a_clear_error(tmp_path):
  exp = registry.load("df_mamba")
  c = exp.get_config("tiny", {"data.name": "csv"})     # the path is checked when the data is read
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    exp.train_module.train_and_evaluate(c, str(tmp_path / "csv"))
  assert not (tmp_path / "csv").exists()                # refused before anything was written
  for overrides, match in (({"data.eval_lookbacks": (128, 500)}, "must be min_len"),
                           ({"model.models": ("fractal", "tree")}, "each must be one of"),
                           ({"data.name": "ett"}, "use one of"),
                           ({"model.discretization": "bilinear"}, "use 'euler'"),
                           ({"model.discretization": "zoh", "model.scan_impl": "interpret"}, "Pallas kernels")):
    with pytest.raises(ConfigError, match=match):     # refused when the config is built (validated once)
      exp.get_config("tiny", overrides)
    c = exp.get_config("tiny")
    with pytest.raises(ConfigError, match=match):     # and when a finalized config is changed
      configs.apply_overrides(c, overrides)
