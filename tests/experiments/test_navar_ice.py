"""NAVAR-ICE experiment: end to end (short), resume, sharded == single device, CSV input, clear errors."""

import json
import os

import numpy as np
import pytest

from experiment_checks import check_end_to_end, check_resume, check_sharded_equals_single
from jaxlab import configs, registry
from jaxlab.causal import data as data_lib
from jaxlab.errors import ConfigError, DataError

# A small, fast version of the tiny variant: short series, 2 chunks of 15 steps, 1 bootstrap member.
SHORT = {"data.length": 200, "method.steps": 30, "method.chunk": 15, "num_steps": 2, "model.hidden": 8,
         "method.bootstrap": 1, "eval.grid": 9, "eval.keep_ice": 4, "eval.plots": False, "data.heterogeneity": False}


def test_tiny_end_to_end(tmp_path):
  s = check_end_to_end("navar_ice", tmp_path, {**SHORT, "eval.plots": True, "data.heterogeneity": True})
  assert np.array(s["edge_scores"]).shape == (8, 8) and s["variables"][0] == "d0"
  for key in ("auroc", "score/max_rel_dev", "curve/max_nrmse", "mech/correct", "var/fails", "het/ratio"):
    assert key in s
  e = s["edges"][0]
  assert len(e["pd"]) == 9 and len(e["band_low"]) == 9 and e["label"] in ("flat", "sign-changing", "threshold",
                                                                           "saturating", "monotone", "nonlinear")
  assert os.path.exists(tmp_path / "response_functions.png") and os.path.exists(tmp_path / "heterogeneity.png")
  z = np.load(tmp_path / "response_curves.npz")
  assert z["pd"].shape == (2, 8, 8, 9) and z["ice"].shape == (8, 8, 4, 9)


def test_resume(tmp_path):
  check_resume("navar_ice", tmp_path, SHORT)


def test_sharded_equals_single_device(tmp_path):
  # Windows are sharded over the data axis (zero-weight padding); parameters are replicated.
  check_sharded_equals_single("navar_ice", tmp_path, SHORT, rtol=1e-5)


def _panel_csv(path, units=6, years=30):
  sim = data_lib.panel_standin(np.random.default_rng(0), units, years)
  data_lib.write_csv(str(path), sim["units"], sim["variables"], sim["unit_names"], unit_column="country")
  truth = path.parent / "truth.csv"
  truth.write_text("\n".join(",".join(str(int(v)) for v in row) for row in sim["truth"]))
  return str(path), str(truth)


def test_csv_panel_input(tmp_path):
  csv, truth = _panel_csv(tmp_path / "panel.csv")
  exp = registry.load("navar_ice")
  c = exp.get_config("variant=tiny,data=csv")
  configs.apply_overrides(c, {**{k: v for k, v in SHORT.items() if not k.startswith("data.")}, "data.path": csv,
                              "data.truth_path": truth, "data.unit_column": "country", "data.lags": 2,
                              "data.val_fraction": 0.2, "eval.var_baseline": True})
  s = exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))
  assert s["variables"] == ["civil_society", "electoral", "liberal", "participatory"]
  assert np.array(s["edge_scores"]).shape == (4, 4) and 0 <= s["auroc"] <= 1 and "var/auroc" in s
  assert s["windows"] == {"train": 6 * 28 - 6 * 5, "val": 6 * 5, "units": 6}
  assert "eval/val_mse" in s
  saved = json.load(open(tmp_path / "run" / "summary.json"))
  assert saved["edges"][0]["source"] in s["variables"]


def _run(tmp_path, overrides, arg="variant=tiny,data=csv"):
  exp = registry.load("navar_ice")
  c = exp.get_config(arg)
  configs.apply_overrides(c, {**{k: v for k, v in SHORT.items() if not k.startswith("data.")}, **overrides})
  return exp.train_module.train_and_evaluate(c, str(tmp_path / "run"))


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


def test_bad_config_is_a_clear_error(tmp_path):
  with pytest.raises(ConfigError, match="needs --config.data.path"):
    _run(tmp_path, {})
  with pytest.raises(ConfigError, match="data.name='nope'"):
    _run(tmp_path, {"data.name": "nope"}, "tiny")
  with pytest.raises(ConfigError, match="positive multiple of config.method.chunk"):
    _run(tmp_path, {"method.steps": 31}, "tiny")
  with pytest.raises(ConfigError, match="must equal method.steps / method.chunk"):
    _run(tmp_path, {"num_steps": 5}, "tiny")
  with pytest.raises(ConfigError, match="eval.lag=4"):
    _run(tmp_path, {"eval.lag": 4}, "tiny")
  with pytest.raises(ConfigError, match="unknown config argument"):
    registry.load("navar_ice").get_config("variant=tiny,dataset=x")


def test_variants_build():
  exp = registry.load("navar_ice")
  for arg in ("tiny", "small", "full", "variant=tiny,data=panel", "variant=full,data=dream3",
              "variant=full,data=causeme", "variant=full,data=vdem"):
    c = exp.get_config(arg)
    assert c.num_steps == c.method.steps // c.method.chunk
  assert exp.get_config("variant=full,data=dream3").data.split_length == 21
