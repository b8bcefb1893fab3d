"""spectro_diffusion experiment: end to end (short) + resume with the checks stage's exactness on the trained
model, config errors and variants; behind the slow marker: sharded == single device, SIGTERM resume, the
multitrack (full-scale) path on a tiny fake MUSDB18-HQ folder."""

import os
import shutil

import numpy as np
import pytest
from scipy.io import wavfile

from experiment_checks import (_run, _strip, canary_covered, check_end_to_end, check_sharded_equals_single,
                               check_sigterm_resume)
from jaxlab import registry
from jaxlab.errors import ConfigError

NAME = "spectro_diffusion"
ONE_DEVICE = {"mesh": (("data", 1), ("model", 1))}


def short(**extra):
  """A small version of the tiny variant: width 32, 2 blocks, 16 steps, 300 clips, 16 samples of 10 steps."""
  return {"model.hidden": 32, "model.depth": 2, "model.heads": 2, "model.bottleneck": 16, "model.freq_dim": 32,
          "data.num_train": 300, "data.num_held": 100, "train.num_steps": 16, "train.optimizer.warmup_steps": 4,
          "train.checkpoint_every": 8, "train.log_every": 8, "train.batch_size": 16, "sample.num": 16,
          "sample.batch_size": 16, "sample.steps": 10, "checks.num": 4, "checks.start": 6, **extra}


@canary_covered
def test_end_to_end_and_resume(tmp_path):
  wd = tmp_path / "run"
  s = check_end_to_end(NAME, wd, short(**ONE_DEVICE))
  assert s["stages"] == ["classifier", "train", "checks", "sample"]
  assert s["acc/held_real"] >= 0.95                                      # the classifier on rendered clips
  for k in ("acc/generated", "acc_drums/generated", "fd/harmonic", "fd/harmonic_floor", "train/loss"):
    assert np.isfinite(s[k]) and s[k] >= 0, k
  assert s["checks/edit_friendly_max_abs/cfg1"] < 1e-4 and s["checks/edit_friendly_max_abs/cfg1.5"] < 1e-4
  assert s["checks/noop_controller_max_abs"] == 0.0
  assert len(os.listdir(wd / "stages" / "sample" / "wav")) == 4
  ckpt = wd / "stages" / "train" / "checkpoints"
  last = max(int(p) for p in os.listdir(ckpt) if p.isdigit())
  shutil.rmtree(ckpt / str(last))
  os.remove(wd / "summary.json")
  assert _strip(_run(NAME, wd, short(**ONE_DEVICE))) == _strip(s)


def test_prompts_are_balanced():
  exp = registry.load(NAME)
  tokens, label, drums = exp.train_module.method.prompts(16)
  assert np.bincount(label).tolist() == [4, 4, 4, 4] and drums.sum() == 8
  assert set(map(tuple, tokens[drums].tolist())) == {(i, 4) for i in range(4)}
  assert set(map(tuple, tokens[~drums].tolist())) == {(i, -1) for i in range(4)}


def test_bad_config_is_a_clear_error():
  exp = registry.load(NAME)
  for over, match in (({"model.patch": 3}, "must divide"),
                      ({"sample.cfg": 2.0, "diffusion.prompt_drop": 0.0}, "needs an unconditional branch"),
                      ({"checks.start": 99}, "must be in \\[1, sample.steps"),
                      ({"data.num_pitched": 2}, "use 1"),
                      ({"diffusion.prediction": "score"}, "config.diffusion.prediction"),
                      ({"data.name": "musdb"}, "use one of")):
    with pytest.raises(ConfigError, match=match):
      exp.get_config("tiny", over)


def test_variants_build():
  exp = registry.load(NAME)
  for v in ("tiny", "small", "full"):
    c = exp.get_config(v)
    assert c.data.name == ("multitrack" if v == "full" else "synth")
  with pytest.raises(ConfigError, match="config.data.path"):
    exp.config_module.require_data(exp.get_config("full"))


def _fake_musdb(root, songs=3, seconds=2.5, sr=8000):
  rng = np.random.default_rng(0)
  t = np.arange(int(seconds * sr)) / sr
  for i in range(songs):
    d = root / "train" / f"song{i}"
    d.mkdir(parents=True)
    for j, stem in enumerate(("vocals", "drums", "bass", "other")):
      x = 0.2 * np.sin(2 * np.pi * (110 * (j + 1) + 20 * i) * t) if (i + j) % 3 else 0.05 * rng.normal(size=t.size)
      wavfile.write(d / f"{stem}.wav", sr, (x * 32767).astype(np.int16))


@pytest.mark.slow   # the full-scale path on a tiny folder (tens of seconds)
def test_multitrack_path_trains_and_writes_samples(tmp_path):
  _fake_musdb(tmp_path / "musdb")
  over = {**short(**ONE_DEVICE), "data.name": "multitrack", "data.path": str(tmp_path / "musdb"),
          "data.hop_seconds": 0.5, "sample.num": 4, "sample.batch_size": 4}
  s = _run(NAME, tmp_path / "run", over)
  assert s["stages"] == ["train", "sample"] and s["data/clips"] > 0
  with np.load(s["samples_path"]) as z:
    assert z["logmel"].shape == (4, 32, 16) and z["tokens"].shape == (4, 4)


@pytest.mark.slow
def test_sharded_equals_single_device(tmp_path):
  check_sharded_equals_single(NAME, tmp_path, short())


@pytest.mark.slow
def test_sigterm_resume(tmp_path):
  check_sigterm_resume(NAME, tmp_path, short(**ONE_DEVICE))
