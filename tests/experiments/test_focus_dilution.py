"""Focus-dilution experiment: end to end (short), resume (between and inside stages), sharded == single device,
real text, the cycle claim's count, config errors."""

import os

import numpy as np
import pytest

from experiment_checks import (check_end_to_end, check_resume, check_sharded_equals_single, check_sigterm_resume,
                               sigterm_on_write)
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError
from jaxlab.train import Preempted

NAME = "focus_dilution"
# Stages s1 (2 chunks of 60 GD steps, W_V = I), control, train (4 chunks, W_V trained), cycles on 32 sequences:
# long enough to pass the W_V = I condensation point.
SHORT = {"method.steps": 240, "method.chunk": 60, "method.s1_steps": 120, "data.n_seq": 32,
         "train.checkpoint_every": 2}


def _train(tmp_path, overrides):
  exp = registry.load(NAME)
  c = exp.get_config("tiny", overrides)
  return exp.train_module.train_and_evaluate(c, str(tmp_path))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted SHORT run (its workdir and summary), shared by the end-to-end and resume tests."""
  wd = tmp_path_factory.mktemp("reference")
  return wd, check_end_to_end(NAME, wd, SHORT)


def test_tiny_end_to_end(reference):
  wd, s = reference
  for key in ("s1/share_E", "s1/qk_ratio", "s1/cos_u_pi", "s1/cos_v_pi", "control/share_E", "cond/share_E",
              "cond/cos_u_pi", "cycle/present", "final/loss"):
    assert key in s, key
  assert s["s1/qk_ratio"] <= 2.0 and s["s1/share_E"] > s["control/share_E"]   # W_V = I condenses, std 0.25 not
  assert s["control/gd_steps"] == s["s1/gd_steps"] and s["final/loss"] < 2.996     # loss below log(20)
  assert s["gd_steps"] == 240 and s["cycle/present"] is False                        # 240 steps: no cycle yet
  assert [r["step"] for r in metrics.read_metrics(str(wd / "stages" / "train"))] == [1, 2, 3, 4]
  assert [r["step"] for r in metrics.read_metrics(str(wd / "stages" / "s1"))] == [1, 2]
  assert [r["stage"] for r in metrics.read_metrics(str(wd))] == ["s1", "control", "train", "cycles"]
  sub = metrics.read_json(str(wd / "stages" / "s1" / "config.json"))
  assert sub["model"]["value_identity"] is True and sub["method"]["steps"] == 120
  # summary.json is written once, with the derived keys (not the loops' own step / train keys)
  assert metrics.read_json(str(wd / "summary.json")) == metrics.jsonable(s)
  assert "step" not in s and "train/loss" not in s and "resumes" in s


def test_resume(tmp_path):
  check_resume(NAME, tmp_path, SHORT)


def test_sigterm_between_and_inside_stages_resumes(tmp_path, reference):
  check_sigterm_resume(NAME, tmp_path, SHORT, inside=1, reference=reference[1])


def test_sigterm_inside_the_training_loop_resumes_it(tmp_path, reference):
  """SIGTERM while the train stage's run_loop runs: it checkpoints its chunk and stops; the rerun continues it."""
  in_train_loop = lambda w, step, values: (  # noqa: E731
      "stage" not in values and step == 3 and os.path.join("stages", "train") in w.path)
  with sigterm_on_write(in_train_loop):
    with pytest.raises(Preempted, match=r"in stage 3 \(train\)"):
      _train(tmp_path, SHORT)
  s = _train(tmp_path, SHORT)
  strip = lambda d: {k: v for k, v in d.items() if k not in ("wall_s", "resumes")}  # noqa: E731
  assert strip(metrics.jsonable(s)) == strip(metrics.jsonable(reference[1]))


def test_sharded_equals_single_device(tmp_path):
  # The 32 sequences are split over the data axis (4 shards); parameters are replicated.
  over = {**SHORT, "method.steps": 120, "method.control": False}
  check_sharded_equals_single(NAME, tmp_path, over, rtol=1e-4)
  for sub in ("s1", "train"):          # the two models' logged dynamics, not only the stage rows
    a, b = (metrics.read_metrics(os.path.join(tmp_path, label, "stages", sub)) for label in ("sharded", "single"))
    keys = [k for k in a[0] if k.startswith(("dyn/", "train/loss"))]
    np.testing.assert_allclose([[r[k] for k in keys] for r in a], [[r[k] for k in keys] for r in b],
                               rtol=1e-4, atol=1e-7, err_msg=sub)


def test_real_text_pydoc_runs(tmp_path):
  s = check_end_to_end(NAME, tmp_path, {**SHORT, "data.source": "pydoc", "data.vocab": 65, "method.steps": 120,
                                        "method.s1_steps": 0})
  assert "cond/cos_u_pi" not in s and s["final/loss"] < 4.2  # log(65) = 4.17
  assert "s1/share_E" not in s and s["control/gd_steps"] == s["cond/gd_steps"]  # no s1: control on the main model


def test_cycle_claim_counts_chains():
  exp = registry.load(NAME)
  claim = {c.name: c for c in exp.claims}["cycle"]
  runs = [{"cycle/present": i < 10} for i in range(12)]
  assert claim.check(runs)["passed"] and claim.check(runs)["measured"] == 10
  assert not claim.check(runs[1:])["passed"]
  assert exp.config_module.SEEDS == tuple(range(300, 312))
  # the S1 claims read the W_V = I run, the cycle claim the trained-W_V run
  texts = {c.name: c.text for c in exp.claims}
  assert all("W_V = I" in texts[n] for n in ("condense", "frozen_qk", "closed_form_u", "closed_form_v", "control"))
  assert "W_V trained" in texts["cycle"]


@pytest.mark.slow
def test_full_tiny_run_on_a_validation_chain(tmp_path):
  """The claims' config end to end on validation chain 100 (never a claim seed): about 90 s on 2 CPU cores."""
  s = _train(tmp_path, {"seed": 100})
  assert s["s1/share_E"] >= 0.9 and s["s1/qk_ratio"] <= 2.0 and min(s["s1/cos_u_pi"], s["s1/cos_v_pi"]) >= 0.9
  assert s["control/share_E"] < 0.6 and s["cycle/present"] is True
  # the validation run recorded in the README: first peak 1.180 at chunk 113, trough 1.085, second peak 1.209
  assert (s["cycle1/peak_step"], s["cycle1/trough_step"], s["cycle2/peak_step"]) == (113, 125, 212)
  np.testing.assert_allclose([s["cycle1/peak"], s["cycle1/trough"], s["cycle2/peak"]], [1.180, 1.085, 1.209],
                             atol=2e-3)


def test_steps_alone_set_the_run_length():
  exp = registry.load(NAME)
  c = exp.get_config("tiny", {"method.steps": 4000})     # no derived step count to keep in sync
  assert exp.config_module.num_chunks(c) == 20
  assert sorted(c.train) == ["async_checkpoint", "checkpoint_every", "keep_checkpoints", "log_every"]
  c = exp.get_config("tiny")
  configs.apply_overrides(c, {"method.chunk": 100})
  assert exp.config_module.num_chunks(c) == c.method.steps // 100
  with pytest.raises(ConfigError, match="multiple of config.method.chunk=200.*--config.method.steps=400"):
    exp.get_config("tiny", {"method.steps": 500})
  with pytest.raises(ConfigError, match="s1_steps=300 must be 0 or a positive multiple"):
    exp.get_config("tiny", {"method.s1_steps": 300})


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
  assert not os.listdir(tmp_path)   # refused runs write nothing


def test_variants_build_and_full_names_the_real_dataset():
  exp = registry.load(NAME)
  for v in ("tiny", "small", "full"):
    exp.config_module.validate(exp.get_config(v))
  tiny = exp.get_config("tiny")
  assert tiny.model.value_identity is False and tiny.method.s1_steps > 0   # trained W_V + the W_V = I S1 run
  full = exp.get_config("full")
  assert full.data.source == "wikitext" and full.data.tfds_name.startswith("wikitext/")
  assert full.model.d == 256 and full.data.length == 128 and full.method.steps == 50000
  assert exp.config_module.num_chunks(full) == 100
