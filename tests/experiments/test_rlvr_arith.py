"""RLVR arithmetic: SFT -> GRPO / shuffled control / RFT end to end (short), resume of every stage, the SFT
early stop and its resume, sharded (4x2) == single device, clear config errors."""

import os
import shutil

import numpy as np
import pytest

from experiment_checks import VOLATILE
from jaxlab import configs, metrics, registry
from jaxlab.errors import ConfigError

SHORT = {"data.n_train": 160, "data.n_eval": 16, "sft.num_steps": 6, "sft.batch_size": 16, "sft.target_accuracy": 0.0,
         "sft.dev_size": 16, "model.hidden": 32, "model.mlp_hidden": 64, "grpo.num_generations": 4,
         "grpo.max_new_tokens": 10, "batch_size": 4, "num_steps": 3, "checkpoint_every": 1, "log_every": 1,
         "eval.batch": 16, "optimizer.warmup_steps": 1, "rft.prompts": 8, "rft.samples": 4, "rft.num_steps": 2,
         "mesh": (("data", 4), ("model", 2))}


def _run(workdir, overrides):
  exp = registry.load("rlvr_arith")
  c = exp.get_config("tiny")
  configs.apply_overrides(c, overrides)
  configs.validate(c, num_devices=8)
  return exp.train_module.train_and_evaluate(c, str(workdir))


def _stable(summary):
  return {k: v for k, v in summary.items() if k not in VOLATILE}


def test_end_to_end_every_arm_and_resume(tmp_path):
  over = {**SHORT, "method.arms": ("grpo", "shuffled", "rft")}
  first = _run(tmp_path, over)
  for arm in ("sft", "grpo", "shuffled", "rft"):
    assert 0.0 <= first[f"eval/acc_{arm}"] <= 1.0 and 0.0 <= first[f"eval/format_{arm}"] <= 1.0
  for arm in ("grpo", "shuffled", "rft"):
    assert np.isfinite(first[f"eval/kl_{arm}"])
  for arm in ("grpo", "shuffled"):
    rows = metrics.read_metrics(str(tmp_path / arm))
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("rollout/answer", "rollout/trace", "rollout/length", "train/entropy", "train/clip_low", "train/loss"):
      assert np.isfinite(rows[-1][key]), key
  assert os.path.exists(tmp_path / "rft" / "rft_stats.json")
  # Resume: drop the last GRPO checkpoint and the summary; the rerun continues from step 2 and ends identical.
  ckpts = tmp_path / "grpo" / "checkpoints"
  shutil.rmtree(ckpts / str(max(int(s) for s in os.listdir(ckpts) if s.isdigit())))
  os.remove(tmp_path / "grpo" / "summary.json")
  os.remove(tmp_path / "summary.json")
  assert _stable(_run(tmp_path, over)) == _stable(first)


def test_sft_early_stop_and_its_resume(tmp_path, monkeypatch):
  train = registry.load("rlvr_arith").train_module
  real = train.greedy_eval
  calls = []

  def fake(model, tok, evals, batch, max_new_tokens):    # dev checks report success at the 2nd check
    out = real(model, tok, evals, batch, max_new_tokens)
    calls.append(len(evals))
    return {**out, "acc": 1.0} if len(evals) == 16 and len(calls) >= 2 else out

  monkeypatch.setattr(train, "greedy_eval", fake)
  over = {**SHORT, "sft.target_accuracy": 0.5, "sft.check_every": 2, "sft.num_steps": 20, "data.n_eval": 24,
          "method.arms": ("grpo",), "num_steps": 1}
  first = _run(tmp_path, over)
  assert first["sft/steps"] == 4
  assert metrics.read_json(str(tmp_path / "sft" / "summary.json"))["stopped_early"] is True
  os.remove(tmp_path / "summary.json")
  calls.clear()
  assert _stable(_run(tmp_path, over)) == _stable(first)     # reloads the stopped checkpoint, trains no further


def test_sharded_equals_single_device(tmp_path):
  runs = {}
  for label, mesh in (("sharded", (("data", 4), ("model", 2))), ("single", (("data", 1), ("model", 1)))):
    _run(tmp_path / label, {**SHORT, "mesh": mesh, "method.arms": ("grpo",), "num_steps": 2})
    runs[label] = metrics.read_metrics(str(tmp_path / label / "grpo"))
  for a, b in zip(runs["sharded"], runs["single"]):
    keys = [k for k in a if k not in VOLATILE and k != "step"]
    np.testing.assert_allclose([a[k] for k in keys], [b[k] for k in keys], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("overrides,msg", [
    ({"method.arms": ("ppo",)}, "method.arms"),
    ({"data.source": "jsonl"}, "data.path"),
    ({"grpo.num_generations": 1}, "num_generations"),
    ({"grpo.loss_agg_mode": "mean"}, "loss_agg_mode"),
    ({"grpo.temperature": 0.0}, "temperature"),
    ({"data.min_digits": 3, "data.max_digits": 2}, "min_digits"),
])
def test_bad_config_values_are_clear_errors(overrides, msg):
  exp = registry.load("rlvr_arith")
  c = exp.get_config("tiny")
  configs.apply_overrides(c, overrides)
  with pytest.raises(ConfigError, match=msg):
    exp.config_module.validate(c)
