"""The judge of the small image generators (SAR, Latent Forcing) behind one interface, for both of their data.

* MNIST (`data.name == "mnist"`): the 28x28 kit (`jaxlab.evals.mnist_kit`): its CNN, FD against its 4,500
  training digits; 32 x 32 samples are cropped to the centred 28 x 28.
* scikit-learn's 8x8 digits (`"digits"`, the v1 setting): the digits judge MLP on the 64 pixels
  (`jaxlab.evals.judge`), trained once per data split and judge setting, FD against the training split.

A config uses it through two groups: `data` (name, split_seed, and held_per_class / pad_to for MNIST or
test_fraction / num_classes for digits) and `judge` (steps, batch_size, learning_rate, weight_decay, cache_dir and,
for digits, hidden).

    train, held = image_scorer.splits(config.data)
    s = image_scorer.scorer(config, train).score(samples, labels)   # built once per process
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxlab.data import mnist as mnist_lib
from jaxlab.data import synthetic
from jaxlab.evals import judge as judge_lib
from jaxlab.evals import mnist_kit


def splits(data) -> tuple[dict, dict]:
  """(train, held-out) images in [-1, 1]: {"image": (N, s, s, 1) float32, "label": (N,) int32}: MNIST (4,500 /
  500 by default, zero-padded to data.pad_to) or sklearn's 8x8 digits."""
  if data.name == "mnist":
    kw = dict(held_per_class=int(data.held_per_class), seed=int(data.split_seed), pad_to=int(data.pad_to))
    return mnist_lib.mnist("train", **kw), mnist_lib.mnist("test", **kw)
  kw = dict(test_fraction=float(data.test_fraction), seed=int(data.split_seed), value_range=(-1.0, 1.0))
  return synthetic.digits("train", **kw), synthetic.digits("test", **kw)


def digits_spec(data) -> dict:
  """What the 8x8 digits split depends on (the cache key of its judge, and of anything else trained on it)."""
  return {"name": "digits", "split_seed": int(data.split_seed), "test_fraction": float(data.test_fraction)}


def digits_judge_config(judge, data) -> judge_lib.JudgeConfig:
  """The digits judge MLP on the 64 pixels, seeded by the data split (not the run seed)."""
  return judge_lib.JudgeConfig(in_features=64, num_classes=int(data.num_classes), hidden=tuple(judge.hidden),
                               steps=int(judge.steps), batch_size=int(judge.batch_size),
                               learning_rate=float(judge.learning_rate), weight_decay=float(judge.weight_decay),
                               seed=int(data.split_seed))


class Scorer:
  """`score(images, labels=None)` -> {"fd" (to the training images, in the judge's features), "pred", "entropy"
  (class histogram of the predictions, nats), "confidence" and, with labels, "judge_acc"}; `floor(held, n)` ->
  the judge's held-out accuracy, FD(held-out real, train) and, on MNIST, the FD of n real digits over 20 draws."""

  def __init__(self, judge, data, train: dict):
    self.data, self.train = data, train
    if data.name == "mnist":
      jc = mnist_kit.JudgeConfig(steps=int(judge.steps), batch_size=int(judge.batch_size),
                                 learning_rate=float(judge.learning_rate), weight_decay=float(judge.weight_decay))
      self.kit = mnist_kit.load(cache_dir=judge.cache_dir, held_per_class=int(data.held_per_class),
                                split_seed=int(data.split_seed), judge=jc)
      self.cached = self.kit.cached
    else:
      self.kit = None
      self.judge, self.cached, _ = judge_lib.load_or_train(
          digits_judge_config(judge, data), train["image"], train["label"], name="digits_judge",
          data_spec=digits_spec(data), cache_dir=judge.cache_dir)

  def score(self, images, labels=None) -> dict[str, Any]:
    if self.kit is not None:
      return self.kit.score(images, labels)
    s = judge_lib.score(self.judge, images, self.train["image"])
    if labels is not None:
      s["judge_acc"] = float(np.mean(s["pred"] == np.asarray(labels)))
    return s

  def floor(self, held: dict, n: int, *, balanced: bool) -> dict[str, Any]:
    """{"judge/held_acc", "fd_floor" (held-out real vs train), "entropy_floor"} and, on MNIST, the FD of n real
    digits drawn from all 5,000 over 20 draws ("fd_floor_draws/n", "/mean", "/sd"): class-balanced for a
    class-conditional generator's balanced samples, at random (`balanced=False`) for an unconditional one's."""
    s = self.score(held["image"], held["label"])
    out = {"judge/held_acc": s["judge_acc"], "fd_floor": s["fd"], "entropy_floor": s["entropy"]}
    if self.kit is not None:
      d = self.kit.floor(n=min(int(n), mnist_lib.NUM), reps=20, balanced=balanced)["draws"]
      out.update({"fd_floor_draws/n": d["n"], "fd_floor_draws/mean": d["mean"], "fd_floor_draws/sd": d["sd"]})
    return out


_SCORERS: dict = {}   # (judge settings, data split) -> the Scorer of this process (one judge load per run)


def scorer(config, train: dict) -> Scorer:
  """The `Scorer` of `config.judge` and `config.data`, built once per process (a run's stages share it)."""
  key = (config.judge.to_json(), config.data.to_json())
  if key not in _SCORERS:
    _SCORERS.clear()
    _SCORERS[key] = Scorer(config.judge, config.data, train)
  return _SCORERS[key]
