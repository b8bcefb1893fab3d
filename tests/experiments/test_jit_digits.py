"""JiT-on-digits experiment: end to end (short) + resume, the judge cache, config errors; behind the slow marker
(each runs the experiment 2-4 times, ~30-60 s): sharded == single device, SIGTERM resume, the ImageNet path
under tfds mock data."""

import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiment_checks import (_run, _strip, canary_covered, check_end_to_end, check_sharded_equals_single,
                               check_sigterm_resume)
from jaxlab import configs, registry
from jaxlab.errors import ConfigError, DataError

NAME = "jit_digits"


def short(tmp_path, **extra):
  """A small version of the tiny variant: 2 blocks of width 32, 24 steps, 4 Heun steps, a 100-step judge."""
  return {"model.hidden": 32, "model.depth": 2, "model.in_context_start": 1, "model.class_tokens": 2,
          "train.num_steps": 24, "train.optimizer.warmup_steps": 4, "train.checkpoint_every": 12,
          "train.log_every": 12, "sample.steps": 4, "judge.steps": 100, "judge.cache_dir": str(tmp_path / "cache"),
          **extra}


@canary_covered
def test_end_to_end_resume_and_judge_cache(tmp_path):
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, short(tmp_path))
  assert s["stages"] == ["judge", "train", "sample"]
  for k in ("fd", "fd_floor", "fd_ratio", "judge_acc", "pixel_fd", "train/loss", "judge/held_acc"):
    assert np.isfinite(s[k]), k
  assert s["fd_floor"] == s["judge/floor_fd"] > 0 and s["fd_ratio"] == pytest.approx(s["fd"] / s["fd_floor"])
  assert s["judge/held_acc"] > 0.8 and 0 <= s["judge_acc"] <= 1
  cached = [f for f in os.listdir(tmp_path / "cache" / "judges") if f.endswith(".npz")]
  assert len(cached) == 1                      # trained once, written once (atomically: no temp file left)
  # resume: drop the last stage's checkpoint and the summary; the rerun redoes the sample stage from the
  # train stage's finished fit (restored, not retrained) and the cached judge, bit-identical
  ckpt = wd / "checkpoints"
  last = max(int(p) for p in os.listdir(ckpt) if p.isdigit())
  shutil.rmtree(ckpt / str(last))
  os.remove(wd / "summary.json")
  assert _strip(_run(NAME, wd, short(tmp_path))) == _strip(s)


def test_judge_cache_is_keyed_and_checked(tmp_path):
  exp = registry.load(NAME)
  method = exp.train_module.method
  c = exp.get_config("tiny", short(tmp_path))
  train, _ = method.digits(c)
  a, cached_a = method.load_or_train_judge(c, train)
  b, cached_b = method.load_or_train_judge(c, train)
  assert (cached_a, cached_b) == (False, True)
  x = train["image"][:16]
  np.testing.assert_array_equal(np.asarray(method.judge_features(a, x)), np.asarray(method.judge_features(b, x)))
  folder = tmp_path / "cache" / "judges"
  files = sorted(os.listdir(folder))
  method.load_or_train_judge(exp.get_config("tiny", short(tmp_path, seed=5)), train)     # not keyed by the seed
  assert sorted(os.listdir(folder)) == files
  other = exp.get_config("tiny", short(tmp_path, **{"data.split_seed": 1}))
  method.load_or_train_judge(other, method.digits(other)[0])                            # keyed by the split
  assert len(os.listdir(folder)) == 2
  np.savez(folder / files[0], junk=np.zeros(3))
  with pytest.raises(DataError, match="does not match the current settings"):
    method.load_or_train_judge(c, train)


@pytest.mark.slow
def test_imagenet_path_under_mock_data(tmp_path):
  # the full variant's data path (tfds imagenet2012, center crop, [-1, 1], flips) at 32 x 32, patch 16
  over = {"data.image_size": 32, "model.hidden": 32, "model.depth": 1, "model.heads": 2, "model.bottleneck": 8,
          "model.class_tokens": 2, "model.in_context_start": 1, "model.dtype": "float32", "model.remat": False,
          "train.batch_size": 8, "train.num_steps": 2, "train.optimizer.warmup_steps": 1,
          "train.checkpoint_every": 2, "train.log_every": 1, "sample.steps": 2, "sample.num": 12,
          "sample.batch_size": 8, "mesh": (("data", 8), ("model", 1))}
  exp = registry.load(NAME)
  c = exp.get_config("full", over)
  with tfds.testing.mock_data(num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE):
    s = exp.train_module.train_and_evaluate(c, str(tmp_path))
  with np.load(s["samples_path"]) as f:
    assert f["arr_0"].shape == (12, 32, 32, 3) and f["arr_0"].dtype == np.uint8
    np.testing.assert_array_equal(f["labels"], np.arange(12) % 1000)
  assert np.isfinite(s["train/loss"]) and "fid" not in s


def test_bad_config_is_a_clear_error():
  exp = registry.load(NAME)
  for over, match in (({"model.patch": 3}, "must divide the image size 8"),
                      ({"sample.method": "dpm"}, "use one of heun, euler"),
                      ({"model.channels": 3}, "digits are 1-channel"),
                      ({"method.label_drop": 0.0, "sample.cfg_scale": 2.0}, "needs an unconditional branch"),
                      ({"sample.cfg_interval": (0.5, 0.2)}, "0 <= lo <= hi <= 1"),
                      ({"data.name": "cifar"}, "use one of digits, imagenet2012")):
    with pytest.raises(ConfigError, match=match):
      exp.get_config("tiny", over)
    with pytest.raises(ConfigError, match=match):
      configs.apply_overrides(exp.get_config("tiny"), over)


def test_variants_and_sweep_validate():
  exp = registry.load(NAME)
  for v in ("tiny", "small", "full"):
    exp.get_config(v)
  assert len(exp.config_module.sweep()) == 9
  from jaxlab.nn import dit
  cfg = exp.train_module.method.dit_config(exp.get_config("full"))
  assert (cfg.hidden, cfg.depth, cfg.heads, cfg.grid) == (768, 12, 12, (16, 16))   # JiT-B/16 at 256 x 256
  assert dit.ZOO["B"][:3] == (12, 768, 12)


@pytest.mark.slow
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single(NAME, tmp_path, short(tmp_path), rtol=1e-3)


@pytest.mark.slow
def test_sigterm_inside_and_between_stages_resumes(tmp_path):
  check_sigterm_resume(NAME, tmp_path, short(tmp_path), inside=0)
