"""NAVAR-ICE experiment: end to end (short), SIGTERM (between stages and inside the training loop), resume,
sharded == single device, CSV input, keys without effect, clear errors."""

import json
import os

import numpy as np
import pytest

from experiment_checks import (VOLATILE, check_end_to_end, check_resume, check_sharded_equals_single,
                               check_sigterm_resume, sigterm_on_write)
from jaxlab import configs, metrics, registry
from jaxlab.causal import data as data_lib
from jaxlab.errors import ConfigError, DataError
from jaxlab.train import Preempted

NAME = "navar_ice"
# A small, fast version of the tiny variant: short series, 2 chunks of 15 steps, 1 bootstrap member;
# stages: train, evaluate/main.
SHORT = {"data.length": 200, "method.steps": 30, "method.chunk": 15, "model.hidden": 8, "method.bootstrap": 1,
         "eval.grid": 9, "eval.keep_ice": 4, "eval.plots": False, "data.heterogeneity": False}
# ... with the heterogeneity pair and the plots: stages train, evaluate/main, evaluate/het, plots.
FOUR = {**SHORT, "eval.plots": True, "data.heterogeneity": True}


def _strip(summary):
  return {k: v for k, v in summary.items() if k not in VOLATILE}


def _train(name, workdir, overrides):
  exp = registry.load(name)
  c = exp.get_config("tiny", overrides)
  configs.check_devices(c, 8)
  return exp.train_module.train_and_evaluate(c, str(workdir))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted FOUR run: (workdir, summary)."""
  wd = tmp_path_factory.mktemp("navar") / "reference"
  return wd, check_end_to_end(NAME, wd, FOUR)


def test_tiny_end_to_end(reference):
  wd, s = reference
  assert s["stages"] == ["train", "evaluate/main", "evaluate/het", "plots"]
  assert np.array(s["edge_scores"]).shape == (8, 8) and s["variables"][0] == "d0"
  for key in ("auroc", "score/max_rel_dev", "curve/max_nrmse", "mech/correct", "var/fails", "het/ratio",
              "train/loss", "het/mse"):
    assert key in s
  assert s["step"] == 2      # training chunks (method.steps / method.chunk), as in a run_loop summary
  e = s["edges"][0]
  assert len(e["pd"]) == 9 and len(e["band_low"]) == 9 and e["label"] in ("flat", "sign-changing", "threshold",
                                                                           "saturating", "monotone", "nonlinear")
  assert os.path.exists(wd / "response_functions.png") and os.path.exists(wd / "heterogeneity.png")
  z = np.load(wd / "response_curves.npz")
  assert z["pd"].shape == (2, 8, 8, 9) and z["ice"].shape == (8, 8, 4, 9)
  rows = metrics.read_metrics(str(wd))
  assert [r["stage"] for r in rows] == s["stages"] and rows[0]["train/loss"] == s["train/loss"]
  assert [r["step"] for r in metrics.read_metrics(str(wd / "stages" / "train"))] == [1, 2]   # one row per chunk
  assert json.load(open(wd / "summary.json"))["het/ratio"] == s["het/ratio"]


def test_sigterm_between_and_inside_stages_resumes(tmp_path, reference):
  check_sigterm_resume(NAME, tmp_path, FOUR, inside=1, reference=reference[1])


def test_sigterm_inside_the_training_loop_resumes_it(tmp_path, reference):
  """SIGTERM while the train stage's run_loop runs: it checkpoints its chunk and stops; the rerun continues it."""
  wd = tmp_path / "run"
  # SIGTERM once the training loop logged its first chunk.
  with sigterm_on_write(lambda _, step, values: "stage" not in values and step == 1):
    with pytest.raises(Preempted, match="in stage 1 \\(train\\)") as stopped:
      _train(NAME, wd, FOUR)
  assert not os.path.exists(wd / "summary.json")
  assert sorted(os.listdir(wd / "stages" / "train" / "checkpoints")) == ["1"]
  # The one line names what the stage's own run saved (not "nothing saved yet").
  from jaxlab import cli
  line = cli.interrupt_message(stopped.value, "CMD")
  assert "checkpoint of step 1 of stage 1's run stages/train saved" in line and "nothing saved" not in line, line
  final = _train(NAME, wd, FOUR)
  assert _strip(final) == _strip(reference[1])
  assert metrics.read_json(str(wd / "stages" / "train" / "summary.json"))["resumes"] == 1   # the loop resumed
  assert final["resumes"] == 1                                       # and the run as a whole says so too
  assert [r["step"] for r in metrics.read_metrics(str(wd / "stages" / "train"))] == [1, 2]


def test_resume(tmp_path):
  check_resume(NAME, tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # Windows are sharded over the data axis (zero-weight padding); parameters are replicated.
  check_sharded_equals_single(NAME, tmp_path, SHORT, rtol=1e-5)


def _panel_csv(path, units=6, years=30):
  sim = data_lib.panel_standin(np.random.default_rng(0), units, years)
  data_lib.write_csv(str(path), sim["units"], sim["variables"], sim["unit_names"], unit_column="country")
  truth = path.parent / "truth.csv"
  truth.write_text("\n".join(",".join(str(int(v)) for v in row) for row in sim["truth"]))
  return str(path), str(truth)


def _run(tmp_path, overrides, arg="variant=tiny,data=csv"):
  exp = registry.load(NAME)
  c = exp.get_config(arg, {**{k: v for k, v in SHORT.items() if not k.startswith("data.")}, **overrides})
  return exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))


def test_csv_panel_input(tmp_path):
  csv, truth = _panel_csv(tmp_path / "panel.csv")
  s = _run(tmp_path, {"data.path": csv, "data.truth_path": truth, "data.unit_column": "country", "data.lags": 2,
                      "data.val_fraction": 0.2, "eval.var_baseline": True})
  assert s["variables"] == ["civil_society", "electoral", "liberal", "participatory"]
  assert np.array(s["edge_scores"]).shape == (4, 4) and 0 <= s["auroc"] <= 1 and "var/auroc" in s
  assert s["windows"] == {"train": 6 * 28 - 6 * 5, "val": 6 * 5, "units": 6}
  assert "eval/val_mse" in s and s["stages"] == ["train", "evaluate/main"]
  saved = json.load(open(tmp_path / "run" / "summary.json"))
  assert saved["edges"][0]["source"] in s["variables"]


def test_a_model_no_better_than_the_mean_warns_and_null_edges_are_marked(tmp_path, caplog):
  """Independent noise columns: validation R^2 below MIN_VAL_R2 gives one warning line, and every edge whose band
  holds the flat curve 0 at all grid points is marked null_in_band (checked against the band arrays)."""
  import logging
  rng = np.random.default_rng(1)
  path = tmp_path / "noise.csv"
  path.write_text("a,b,c\n" + "".join(",".join(f"{v:.5f}" for v in row) + "\n" for row in rng.normal(size=(120, 3))))
  with caplog.at_level(logging.WARNING, logger="jaxlab"):
    s = _run(tmp_path, {"data.path": str(path), "data.val_fraction": 0.25, "method.bootstrap": 3})
  assert s["eval/val_r2"] < registry.load(NAME).train_module.MIN_VAL_R2
  assert s["eval/val_r2"] == pytest.approx(1 - s["eval/val_mse"] / s["eval/val_mse_of_mean"])
  warned = [r.getMessage() for r in caplog.records if "no better than predicting" in r.getMessage()]
  assert len(warned) == 1 and "\n" not in warned[0], warned
  for e in s["edges"]:
    low, high = np.array(e["band_low"]), np.array(e["band_high"])
    assert e["null_in_band"] == bool(np.all((low <= 0) & (high >= 0)))
  assert any(e["null_in_band"] for e in s["edges"])


def test_bad_csv_is_a_clear_error(tmp_path):
  (tmp_path / "missing.csv").write_text("a,b\n1,2\n2,\n3,4\n")
  with pytest.raises(DataError, match=r"line 3, column 'b': missing value"):
    _run(tmp_path, {"data.path": str(tmp_path / "missing.csv")})
  (tmp_path / "const.csv").write_text("a,b\n" + "".join(f"{i % 3},5\n" for i in range(20)))
  with pytest.raises(DataError, match=r"constant column\(s\) \['b'\]"):
    _run(tmp_path, {"data.path": str(tmp_path / "const.csv")})
  (tmp_path / "short.csv").write_text("a,b\n1,2\n2,1\n")
  with pytest.raises(DataError, match=r"too short for data.lags=3"):
    _run(tmp_path, {"data.path": str(tmp_path / "short.csv")})
  assert not os.path.exists(tmp_path / "run")      # refused before the workdir was written


def test_bad_config_is_a_clear_error(tmp_path):
  # a file data name without a file: a valid config (the full variant's default), refused when the run starts
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    _run(tmp_path, {})
  assert not os.path.exists(tmp_path / "run")
  exp = registry.load(NAME)
  for over, match in (({"data.name": "nope"}, "data.name='nope'"),
                      ({"method.steps": 31}, "positive multiple of config.method.chunk"),
                      ({"eval.lag": 4}, "eval.lag=4"),
                      ({"train.optimizer.warmup_steps": 4000}, "exceeds config.method.steps=3000"),
                      ({"num_steps": 6}, "unknown config key 'num_steps'"),
                      ({"train.num_steps": 6}, "unknown config key 'train.num_steps'")):
    with pytest.raises(ConfigError, match=match):
      exp.get_config("tiny", over)
  with pytest.raises(ConfigError, match="unknown config argument"):
    exp.get_config("variant=tiny,dataset=x")


def test_keys_without_effect_are_errors():
  """A data key the chosen data.name does not read is refused in one line naming the key that would use it."""
  exp = registry.load(NAME)
  files = "set data.name=csv \\(or the preset vdem, dream3, causeme\\)"
  for arg, over, match in (
      ("tiny", ["data.path=my.csv"], f"config.data.path='my.csv' has no effect with data.name='synthetic'.*{files}"),
      ("tiny", {"data.truth_path": "gt.txt"}, f"data.truth_path=.*{files}"),
      ("tiny", {"data.columns": ("a", "b")}, f"data.columns=.*{files}"),
      ("tiny", {"data.delimiter": ";"}, f"data.delimiter=.*{files}"),
      ("tiny", {"data.time_column": "year"}, f"data.time_column=.*{files}"),
      ("variant=tiny,data=panel", {"data.unit_column": "country"}, f"data.name='panel'.*{files}"),
      ("variant=tiny,data=panel", {"data.split_length": 10}, f"data.split_length=.*{files}"),
      ("variant=tiny,data=csv", {"data.length": 300}, "data.length=300 has no effect with data.name='csv'.*"
       "belongs to data.name=synthetic"),
      ("variant=full,data=dream3", {"data.heterogeneity": False}, "data.heterogeneity=.*data.name=synthetic"),
      ("variant=tiny,data=csv", {"data.units": 20}, "data.units=20 .*belongs to data.name=panel"),
      ("tiny", {"data.years": 20}, "data.years=20 has no effect with data.name='synthetic'.*data.name=panel"),
      ("variant=tiny,data=panel", {"data.length": 300}, "data.length=.*data.name='panel'.*data.name=synthetic"),
      ("variant=full,data=vdem", {"data.name": "synthetic"}, f"data.time_column='year'.*{files}")):
    with pytest.raises(ConfigError, match=match) as err:
      exp.get_config(arg, over)
    assert "\n" not in str(err.value)
  with pytest.raises(ConfigError, match="data.path='my.csv' has no effect"):   # the CLI's way in
    registry.load_config(f"{NAME}:tiny", ["data.path=my.csv"])
  with pytest.raises(ConfigError, match="data.units=5 has no effect"):         # changing a finalized config
    configs.apply_overrides(exp.get_config("variant=tiny,data=csv"), {"data.units": 5})
  # the same keys are fine where they are read, and presets that set them validate
  exp.get_config("tiny", {"data.name": "csv", "data.path": "my.csv", "data.unit_column": "country"})
  exp.get_config("variant=tiny,data=panel", {"data.units": 20, "data.years": 30})
  exp.get_config("tiny", {"data.length": 300, "data.heterogeneity": False})
  for arg in ("variant=full,data=vdem", "variant=full,data=dream3", "variant=full,data=causeme"):
    exp.get_config(arg, {"data.path": "x.csv"})


def test_variants_build_and_steps_alone_set_the_chunks():
  exp = registry.load(NAME)
  for arg in ("tiny", "small", "full", "variant=tiny,data=panel", "variant=full,data=dream3",
              "variant=full,data=causeme", "variant=full,data=vdem"):
    c = exp.get_config(arg)
    assert sorted(c.train) == ["async_checkpoint", "checkpoint_every", "keep_checkpoints", "log_every", "optimizer"]
  assert exp.get_config("variant=full,data=dream3").data.split_length == 21
  assert exp.get_config("variant=full,data=dream3").train.optimizer.learning_rate == 5e-4
  c = exp.get_config("tiny", ["method.steps=500"])     # --config.method.steps=500 alone: one chunk of 500
  assert c.method.steps // c.method.chunk == 1
  assert len(exp.config_module.sweep()) == 9 and all(exp.get_config("tiny", p) for p in exp.config_module.sweep())
