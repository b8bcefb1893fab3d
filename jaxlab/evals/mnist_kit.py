"""The evaluation kit of image generators on 28x28 MNIST (`jaxlab.data.mnist`): one judge, one cache key.

A small convolutional classifier (the judge) is trained once on the kit's training split (4,500 digits) and
cached under a key covering the split and the judge's settings, so every experiment that scores samples of this
data scores them with the same network. Its last hidden layer (64 features after a ReLU) gives the Frechet
distance (FD) of samples to the training images; its predictions give the class-histogram entropy (mode
coverage) and the accuracy on a conditioning class. The judge is a CNN, unlike the DiT and the AR trunk it
scores; its held-out accuracy is part of the kit's statistics (MNIST CNNs reach >= 97% on 4,500 training digits).

The FD has a floor: held-out real digits are not at FD 0 from the training digits, and a sample of n images
carries sampling noise. `Kit.floor` reports FD(held-out 500, train 4,500) and the spread of the FD of n real
images drawn from all 5,000 against the training split over random draws (`noise_floor`), so a claim on FD
can be sized against it.

    kit = mnist_kit.load(cache_dir="")          # trains once (about a minute on 2 CPU cores), then reads
    s = kit.score(samples, labels)              # samples (N, 28, 28, 1) or (N, 32, 32, 1) in [-1, 1]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab import cache
from jaxlab.data import mnist as mnist_lib
from jaxlab.errors import DataError
from jaxlab.evals import frechet
from jaxlab.evals import judge as judge_lib
from jaxlab.train.classifier import train_classifier

VERSION = 1   # bump when the judge's code changes what a cached judge means


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
  """The CNN judge (what the cache key covers, with the data split).

  Attributes:
    channels: the two convolution blocks' widths (3x3, ReLU, each block followed by a 2x2 max-pool).
    features: width of the last hidden layer (the FD's feature space).
    steps, batch_size, learning_rate, weight_decay: its AdamW training.
    seed: init and minibatch seed.
  """
  channels: tuple[int, int] = (32, 64)
  features: int = 64
  steps: int = 2000
  batch_size: int = 128
  learning_rate: float = 1e-3
  weight_decay: float = 1e-4
  seed: int = 0


class ConvJudge(nnx.Module):
  """conv3x3(c1)-ReLU-pool2 -> conv3x3(c2)-ReLU-pool2 -> dense(features)-ReLU -> dense(classes), on 28x28x1."""

  def __init__(self, c: JudgeConfig, num_classes: int, *, rngs: nnx.Rngs):
    c1, c2 = (int(v) for v in c.channels)
    self.conv1 = nnx.Conv(1, c1, (3, 3), padding="SAME", rngs=rngs)
    self.conv2 = nnx.Conv(c1, c2, (3, 3), padding="SAME", rngs=rngs)
    self.dense = nnx.Linear(7 * 7 * c2, int(c.features), rngs=rngs)
    self.out = nnx.Linear(int(c.features), int(num_classes), rngs=rngs)

  def features(self, x_bhwc: jax.Array) -> jax.Array:
    """(B, 28, 28, 1) in [-1, 1] -> (B, features)."""
    h = nnx.max_pool(jax.nn.relu(self.conv1(x_bhwc)), (2, 2), (2, 2))
    h = nnx.max_pool(jax.nn.relu(self.conv2(h)), (2, 2), (2, 2))
    return jax.nn.relu(self.dense(h.reshape(h.shape[0], -1)))

  def __call__(self, x_bhwc: jax.Array) -> jax.Array:
    return self.out(self.features(x_bhwc))


def to_judge_input(images) -> np.ndarray:
  """(N, s, s[, 1]) images in [-1, 1] with s >= 28 -> the centred (N, 28, 28, 1) float32 the judge reads."""
  x = np.asarray(images, np.float32)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4 or x.shape[-1] != 1 or x.shape[1] != x.shape[2] or x.shape[1] < mnist_lib.SIZE \
      or (x.shape[1] - mnist_lib.SIZE) % 2:
    raise DataError(f"the MNIST judge reads (N, 28, 28, 1) or centred padded (N, 32, 32, 1) images, got shape "
                    f"{x.shape}")
  b = (x.shape[1] - mnist_lib.SIZE) // 2
  return x[:, b:b + mnist_lib.SIZE, b:b + mnist_lib.SIZE] if b else x


def noise_floor(feats_real: np.ndarray, feats_train: np.ndarray, n: int, reps: int, seed: int = 0,
                labels: np.ndarray | None = None) -> dict:
  """FD of `n` real images drawn (without replacement) from `feats_real` against `feats_train`, `reps` draws:
  {"n", "mean", "sd", "min", "max"}. With `labels` (of feats_real) every draw holds n / classes of each class,
  as class-balanced conditional samples do (the judge's features separate the classes, so the class mix of an
  unbalanced draw alone moves its FD by several units)."""
  rng = np.random.default_rng(seed)
  mu_t, c_t = frechet.feature_stats(feats_train)
  vals = []
  for _ in range(int(reps)):
    if labels is None:
      idx = rng.choice(len(feats_real), int(n), replace=False)
    else:
      classes = np.unique(labels)
      idx = np.concatenate([rng.choice(np.flatnonzero(labels == c), int(n) // len(classes), replace=False)
                            for c in classes])
    mu, c = frechet.feature_stats(feats_real[idx])
    vals.append(frechet.frechet_distance(mu, c, mu_t, c_t))
  v = np.asarray(vals)
  return {"n": int(n), "mean": float(v.mean()), "sd": float(v.std(ddof=1)), "min": float(v.min()),
          "max": float(v.max())}


@dataclasses.dataclass
class Kit:
  """A trained judge with its data split and statistics (`load`)."""
  judge: ConvJudge
  train: dict[str, np.ndarray]          # {"image": (4500, 28, 28, 1), "label"}
  test: dict[str, np.ndarray]           # {"image": (500, 28, 28, 1), "label"}
  cached: bool
  file: str

  def __post_init__(self):
    self._f = jax.jit(lambda x: self.judge.features(x))
    self._head = jax.jit(lambda h: self.judge.out(h))
    self._train_feats = self.features(self.train["image"])
    self._train_stats = frechet.feature_stats(self._train_feats)

  def features(self, images, batch: int = 1000) -> np.ndarray:
    x = to_judge_input(images)
    return np.concatenate([np.asarray(self._f(jnp.asarray(x[i:i + batch]))) for i in range(0, len(x), batch)])

  def score(self, samples, labels=None) -> dict[str, Any]:
    """FD of the samples to the training images in judge features, the judge's predicted classes, their
    histogram entropy (nats), mean max-softmax confidence and, with `labels`, the accuracy on them."""
    f = self.features(samples)
    mu, c = frechet.feature_stats(f)
    lg = np.asarray(self._head(jnp.asarray(f)))
    pred = lg.argmax(-1)
    out = {"fd": frechet.frechet_distance(mu, c, *self._train_stats), "pred": pred,
           "entropy": judge_lib.entropy(pred, lg.shape[-1]),
           "confidence": float(np.asarray(jax.nn.softmax(jnp.asarray(lg), -1)).max(-1).mean())}
    if labels is not None:
      out["judge_acc"] = float(np.mean(pred == np.asarray(labels)))
    return out

  def held_accuracy(self) -> float:
    return float(np.mean(self.score(self.test["image"])["pred"] == self.test["label"]))

  def floor(self, n: int = 500, reps: int = 20, balanced: bool = True) -> dict[str, Any]:
    """The FD floor: FD(held-out real, train) (class-balanced, 50 per class) and the spread of FD(n real, train)
    over `reps` draws of n of the 5,000 real digits, class-balanced or not (the training digits included, so a
    little below a generator's floor)."""
    real = np.concatenate([self.features(self.test["image"]), self._train_feats])
    labels = np.concatenate([self.test["label"], self.train["label"]]) if balanced else None
    return {"held_fd": self.score(self.test["image"])["fd"],
            "draws": noise_floor(real, self._train_feats, n, reps, labels=labels)}


def load(*, cache_dir: str = "", held_per_class: int = 50, split_seed: int = 0,
         judge: JudgeConfig = JudgeConfig()) -> Kit:
  """The kit of the split: the judge is read from `cache_dir/judges/mnist5k_judge_<key>.npz` (or
  $JAXLAB_CACHE_DIR / ~/.cache/jaxlab) or trained once and written there."""
  train = mnist_lib.mnist("train", held_per_class=held_per_class, seed=split_seed)
  test = mnist_lib.mnist("test", held_per_class=held_per_class, seed=split_seed)
  key = cache.digest({"data": mnist_lib.spec(held_per_class, split_seed), "judge": dataclasses.asdict(judge),
                      "version": VERSION})
  file = cache.path("judges", f"mnist5k_judge_{key}.npz", cache_dir)

  def build():
    model = ConvJudge(judge, mnist_lib.NUM_CLASSES, rngs=nnx.Rngs(int(judge.seed)))
    return train_classifier(model, train["image"], train["label"], steps=int(judge.steps),
                            batch_size=int(judge.batch_size), learning_rate=float(judge.learning_rate),
                            weight_decay=float(judge.weight_decay), seed=int(judge.seed))
  with nnx.use_eager_sharding(False):    # small and unsharded, whatever the run's mesh
    model, cached = cache.load_or_build(
        file, lambda: ConvJudge(judge, mnist_lib.NUM_CLASSES, rngs=nnx.Rngs(0)), build, what="MNIST judge")
  return Kit(model, train, test, cached, file)
