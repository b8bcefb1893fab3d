"""RLVR arithmetic (staged: sft, eval_sft, one stage per arm): end to end with every arm, resume of a stage,
SIGTERM inside / between stages and inside a GRPO sub-run, the SFT early stop and its resume, sharded (4x2) ==
single device, clear config errors."""

import os
import shutil
import signal
from unittest import mock

import numpy as np
import pytest

from experiment_checks import (VOLATILE, canary_covered, check_end_to_end, check_resume, check_sharded_equals_single,
                               check_sigterm_resume)
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError
from jaxlab.train import Preempted

SHORT = {"data.n_train": 160, "data.n_eval": 16, "sft.num_steps": 6, "sft.batch_size": 16, "sft.stop_at": 0.0, "sft.screen": 0,
         "sft.dev_size": 16, "model.hidden": 32, "model.mlp_hidden": 64, "grpo.num_generations": 4,
         "grpo.max_new_tokens": 10, "train.batch_size": 4, "train.num_steps": 3, "train.checkpoint_every": 1,
         "train.log_every": 1, "eval.batch": 16, "train.optimizer.warmup_steps": 1, "rft.prompts": 8,
         "rft.samples": 4, "rft.num_steps": 2, "mesh": (("data", 4), ("model", 2))}
ALL_ARMS = {**SHORT, "method.arms": ("grpo", "shuffled", "rft")}   # stages: sft, eval_sft, grpo, shuffled, rft


def _run(workdir, overrides):
  exp = registry.load("rlvr_arith")
  c = exp.get_config("tiny", overrides)
  configs.check_devices(c, 8)
  return exp.train_module.train_and_evaluate(c, str(workdir))


def _stable(summary):
  return {k: v for k, v in summary.items() if k not in VOLATILE}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """A run with every arm, its last stage rerun from the previous stage's checkpoint (`check_resume`):
  (workdir, summary)."""
  wd = tmp_path_factory.mktemp("rlvr") / "reference"
  check_resume("rlvr_arith", wd, ALL_ARMS)
  return wd, check_end_to_end("rlvr_arith", wd, ALL_ARMS)   # finished: returns its summary, checks the files


@canary_covered
def test_end_to_end_every_arm_and_resume(reference):
  wd, s = reference
  assert s["stages"] == ["sft", "eval_sft", "grpo", "shuffled", "rft"] and s["resumes"] == 1
  for arm in ("sft", "grpo", "shuffled", "rft"):
    assert 0.0 <= s[f"eval/acc_{arm}"] <= 1.0 and 0.0 <= s[f"eval/format_{arm}"] <= 1.0
  for arm in ("grpo", "shuffled", "rft"):
    assert np.isfinite(s[f"eval/kl_{arm}"])
    assert s[f"eval/gain_{arm}"] == s[f"eval/acc_{arm}"] - s["eval/acc_sft"]
  assert s["sft/steps"] == 6 and s["num_eval"] == 16
  rows = metrics.read_metrics(str(wd))
  assert [r["stage"] for r in rows] == s["stages"] and [r["step"] for r in rows] == [1, 2, 3, 4, 5]
  for arm in ("grpo", "shuffled"):
    rows = metrics.read_metrics(str(wd / "stages" / arm))
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("rollout/answer", "rollout/trace", "rollout/length", "train/entropy", "train/clip_low", "train/loss"):
      assert np.isfinite(rows[-1][key]), key
  assert os.path.exists(wd / "stages" / "rft" / "rft_stats.json")


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sigterm_inside_and_between_stages(tmp_path, reference):
  check_sigterm_resume("rlvr_arith", tmp_path, ALL_ARMS, inside=1, reference=reference[1])


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sft_early_stop_and_sigterm_inside_grpo(tmp_path, monkeypatch):
  """SFT stops early at its 2nd dev check. A second run, stopped by SIGTERM at GRPO step 2 (the sub-run
  checkpoints step 2) and with the run's own checkpoints dropped, reruns the sft stage (which reloads the
  stopped SFT checkpoint and trains no further), continues GRPO from step 2 and ends identical to the first."""
  train = registry.load("rlvr_arith").train_module
  real = train.greedy_eval
  calls = []

  def fake(model, tok, evals, batch, max_new_tokens):    # dev checks (16 problems) succeed at the 2nd check
    out = real(model, tok, evals, batch, max_new_tokens)
    calls.append(len(evals))
    return {**out, "acc": 1.0} if len(evals) == 16 and calls.count(16) >= 2 else out

  monkeypatch.setattr(train, "greedy_eval", fake)
  over = {**SHORT, "sft.stop_at": 0.5, "sft.check_every": 2, "sft.num_steps": 20, "data.n_eval": 24,
          "method.arms": ("grpo",)}
  first = _run(tmp_path / "first", over)
  assert first["sft/steps"] == 4
  assert metrics.read_json(str(tmp_path / "first" / "stages" / "sft" / "summary.json"))["stopped_early"] is True

  real_write = metrics.MetricWriter.write

  def write(self, step, values):
    real_write(self, step, values)
    if "rollout/answer" in values and step == 2 and os.path.basename(os.path.dirname(self.path)) == "grpo":
      os.kill(os.getpid(), signal.SIGTERM)

  wd = tmp_path / "second"
  calls.clear()
  with mock.patch.object(metrics.MetricWriter, "write", write), pytest.raises(Preempted, match="grpo"):
    _run(wd, over)
  assert [r["stage"] for r in metrics.read_metrics(str(wd))] == ["sft", "eval_sft"]
  assert [r["step"] for r in metrics.read_metrics(str(wd / "stages" / "grpo"))] == [1, 2]
  shutil.rmtree(wd / "checkpoints")
  calls.clear()
  assert _stable(_run(wd, over)) == _stable(first)
  assert 16 not in calls                                     # no dev check ran: SFT did not train on
  assert [r["step"] for r in metrics.read_metrics(str(wd / "stages" / "grpo"))] == [1, 2, 3]


@pytest.mark.slow   # heavy (tens of seconds): runs with pytest -m slow, not in the default run
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single("rlvr_arith", tmp_path, {**SHORT, "method.arms": ("grpo",), "train.num_steps": 2},
                              rtol=1e-4)


def test_sft_sub_config_has_a_complete_train_section():
  exp = registry.load("rlvr_arith")
  c = exp.get_config("tiny", {"train.num_steps": 500, "sft.warmup_steps": 30})
  from jaxlab.posttrain import trainers
  sub = trainers.sft_config(c, num_steps=20, learning_rate=1e-3, batch_size=c.sft.batch_size,
                            warmup_steps=c.sft.warmup_steps)
  t = sub.train
  assert (t.num_steps, t.batch_size, t.log_every, t.checkpoint_every, t.eval_every) == (20, 64, 20, 0, 0)
  assert (t.optimizer.learning_rate, t.optimizer.schedule, t.optimizer.warmup_steps) == (1e-3, "warmup_cosine", 20)
  assert (t.optimizer.b2, t.optimizer.clip_norm) == (c.train.optimizer.b2, c.train.optimizer.clip_norm)
  assert configs.experiment_name(sub) == "rlvr_arith" and c.train.num_steps == 500


@pytest.mark.parametrize("overrides,msg", [
    ({"method.arms": ("ppo",)}, "method.arms"),
    ({"method.arms": ("grpo", "grpo")}, "at most once"),
    ({"grpo.num_generations": 1}, "num_generations"),
    ({"grpo.loss_agg_mode": "mean"}, "loss_agg_mode"),
    ({"grpo.temperature": 0.0}, "temperature"),
    ({"data.min_digits": 3, "data.max_digits": 2}, "min_digits"),
    ({"batch_size": 8}, "unknown config key 'batch_size'"),
])
def test_bad_config_values_are_clear_errors(overrides, msg):
  with pytest.raises(ConfigError, match=msg):
    registry.load("rlvr_arith").get_config("tiny", overrides)


def test_missing_inputs_are_clear_errors_before_anything_is_written(tmp_path):
  exp = registry.load("rlvr_arith")
  exp.get_config("full")                                       # builds without model.hf_path / data.path
  for overrides, msg in (({"data.source": "jsonl"}, "data.path"), ({"sft.num_steps": 0}, "pretrained start")):
    with pytest.raises(ConfigError, match=msg):
      exp.train_module.train_and_evaluate(exp.get_config("tiny", overrides), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
