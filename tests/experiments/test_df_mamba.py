"""DF-Mamba experiment: end to end (short), resume, sharded == single device, other tasks, config errors."""

import importlib

import numpy as np
import pytest

from experiment_checks import canary_covered, check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError

# A short version of the tiny variant: fewer, shorter series, a few steps, lookbacks 32 -> 64 (2 -> 3 levels).
SHORT = {"data.train_series": 8, "data.train_length": 128, "data.test_series": 8, "data.lookback": 32,
         "data.eval_lookbacks": (32, 64), "data.horizon": 8, "model.d_model": 8, "model.d_state": 4,
         "model.min_len": 16, "train.batch_size": 8, "train.num_steps": 4, "train.log_every": 2,
         "train.checkpoint_every": 2}
ONE = {**SHORT, "model.models": ("fractal",), "data.fine_rate": 0}   # the finer-rate test: test_tiny_end_to_end


@canary_covered
def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("df_mamba", tmp_path, SHORT)
  for m in ("fractal", "no_delta_scale", "flat"):
    assert s[f"mse32/{m}"] > 0 and s[f"mse64/{m}"] > 0
  assert s["zoh/max_err"] < 1e-5 and s["euler/rel_err"] <= s["euler/bound"]
  assert s["params/fractal"] == s["params/no_delta_scale"] > s["params/flat"]
  assert s["mse64/fractal"] == s["eval/mse64/fractal"] and s["step"] == 4
  # the finer-rate test (lookback 32 sampled 4x finer, 128 samples): every model, every placement
  for m in ("fractal", "no_delta_scale", "flat"):
    assert s[f"mse_fine/{m}"] > 0 and s[f"mse_sub/{m}"] > 0
  for m in ("fractal", "no_delta_scale"):
    assert s[f"mse_fine/{m}"] == s[f"mse_fine_refine_all/{m}"]          # the declared placement
    assert s[f"mse_fine_levels_all/{m}"] > 0 and s[f"mse_fine_levels_coarse/{m}"] > 0
    assert all(s[f"fine_dev{k}_{f}/{m}"] >= 0 for k in range(2) for f in ("levels", "refine"))
  assert s["fine_test_windows"] == 8
  # summary.json is written once, by the loop, with the claim keys already in it
  assert metrics.read_json(str(tmp_path / "summary.json")) == metrics.jsonable(s)


def test_resume(tmp_path):
  check_resume("df_mamba", tmp_path, ONE)
  exp = registry.load("df_mamba")          # the trained models load back from the run (the notebook's path)
  assert list(exp.train_module.load_models(exp.get_config("tiny", ONE), str(tmp_path))) == ["fractal"]


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("df_mamba", tmp_path, ONE, rtol=1e-4)


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_digits_zero_shot_resolution_smoke(tmp_path):
  s = check_end_to_end("df_mamba", tmp_path, {
      "data.name": "digits", "model.min_len": 32, "model.d_model": 8, "model.d_state": 4, "train.batch_size": 8,
      "train.num_steps": 2, "train.log_every": 1, "model.models": ("fractal",)})
  assert 0.0 <= s["acc8/fractal"] <= 1.0 and 0.0 <= s["acc16/fractal"] <= 1.0


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_real_series_smoke(tmp_path):
  pytest.importorskip("statsmodels")
  s = check_end_to_end("df_mamba", tmp_path, {**ONE, "data.name": "co2"})
  assert np.isfinite(s["mse64/fractal"]) and s["test_windows"] > 0


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
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
  assert (c.train.batch_size, c.train.num_steps) == (16, 250)
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
                           ({"model.discretization": "zoh", "model.scan_impl": "interpret"}, "Pallas kernels"),
                           ({"data.fine_rate": 3}, "must be 0 \\(none\\) or a power of"),
                           ({"model.fine": "finer"}, "use fine in"),
                           ({"model.readout": "coarse"}, "applies to model.fine='levels' only")):
    with pytest.raises(ConfigError, match=match):     # refused when the config is built (validated once)
      exp.get_config("tiny", overrides)
    c = exp.get_config("tiny")
    with pytest.raises(ConfigError, match=match):     # and when a finalized config is changed
      configs.apply_overrides(c, overrides)


def test_fine_data_is_the_test_span_sampled_finer():
  """With the noise off, the fine set's every 4th sample and its targets are the step-1 generator's values at the
  integer times 1 .. L and L + 1 .. L + H (the same draws), after the training z-scoring."""
  from jaxlab.data import timeseries
  exp = registry.load("df_mamba")
  c = exp.get_config("tiny", {**SHORT, "data.rho": 0.0, "data.sigma": 1e-9})
  scaler = timeseries.Scaler(np.array([[0.5], [2.5]]))                  # mean 1.5, std 1 (one z-scoring)
  method = importlib.import_module(f"{exp.package}.method")
  f = method.fine_data(c, np.random.default_rng(5), scaler)
  lb, h, m = 32, 8, 4
  assert f["x"].shape == (8, lb * m, 4) and f["x_sub"].shape == (8, lb, 4) and f["y"].shape == (8, h, 4)
  unit = timeseries.multiscale_series(np.random.default_rng(5), 8, lb + h + 1, 4, periods=(8, 64, 512), rho=0.0,
                                      sigma=1e-9)
  z = (unit - 1.5) / 1.0
  np.testing.assert_allclose(f["x_sub"], z[:, 1:lb + 1], atol=1e-4)
  np.testing.assert_allclose(f["y"], z[:, lb + 1:], atol=1e-4)
  np.testing.assert_array_equal(f["x_sub"], f["x"][:, m - 1::m])
  assert method.fine_offset(c) == 2


def test_log_ratio_upper_bound_matches_the_closed_form():
  exp = registry.load("df_mamba")
  runs = [{"a": a, "b": b} for a, b in ((1.0, 2.0), (3.0, 2.0), (0.5, 0.5), (2.0, 1.0))]
  d = np.log([0.5, 1.5, 1.0, 2.0])
  t95_3 = 2.353363434801822                                           # t quantile, 3 degrees of freedom
  want = d.mean() + t95_3 * np.sqrt(np.sum((d - d.mean()) ** 2) / 3) / 2
  assert abs(exp.config_module.log_ratio_upper("a", "b")(runs) - want) < 1e-9
  with pytest.raises(ValueError, match="needs >= 2 values"):
    exp.config_module.log_ratio_upper("a", "b")(runs[:1])


def test_jitted_functions_are_reused_across_seeds_only():
  exp = registry.load("df_mamba")
  train = exp.train_module
  method = importlib.import_module(f"{exp.package}.method")
  c0, c1 = exp.get_config("tiny", {**SHORT, "seed": 0}), exp.get_config("tiny", {**SHORT, "seed": 1})
  c2 = exp.get_config("tiny", {**SHORT, "seed": 0, "model.d_state": 2})
  data = method.make_data(c0)
  calls = []
  build = lambda: calls.append(1) or object()
  a = train._reuse("test", c0, data, "fractal", build)
  assert train._reuse("test", c1, data, "fractal", build) is a            # another seed: the same function
  assert train._reuse("test", c2, data, "fractal", build) is not a        # another config: built anew
  assert train._reuse("test", c0, data, "flat", build) is not a           # another model
  assert len(calls) == 3
