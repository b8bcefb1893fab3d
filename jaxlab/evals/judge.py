"""A judge classifier for small-image generators: its last hidden features give a Frechet distance, its
predictions the class accuracy and the class-histogram entropy (mode coverage) of samples.

The judge is an MLP on the flattened image (ReLU), trained once per data split and judge setting with
`jaxlab.train.classifier.train_classifier` and cached (`jaxlab.cache`), so every run and every experiment that
scores the same data with the same judge gets the same network. Its architecture differs from the models it
scores (a DiT, a convolutional latent encoder), as an independent judge should.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab import cache
from jaxlab.evals import frechet
from jaxlab.nn import MLP
from jaxlab.train.classifier import train_classifier


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
  """The judge's settings (what its cache key covers, with the data description).

  Attributes:
    in_features: flattened image size.
    num_classes: classes.
    hidden: hidden widths (the last one is the feature size).
    steps, batch_size, learning_rate, weight_decay: its training (AdamW).
    seed: init and minibatch seed.
  """
  in_features: int
  num_classes: int
  hidden: Sequence[int] = (256, 64)
  steps: int = 3000
  batch_size: int = 128
  learning_rate: float = 1e-3
  weight_decay: float = 1e-4
  seed: int = 0


def make(c: JudgeConfig, rngs: nnx.Rngs) -> MLP:
  with nnx.use_eager_sharding(False):    # small and unsharded, whatever the run's mesh
    return MLP(int(c.in_features), tuple(int(h) for h in c.hidden), int(c.num_classes), rngs=rngs,
               activation=jax.nn.relu)


def features(judge: MLP, x) -> jax.Array:
  """The last hidden layer (after its ReLU) on images (N, ...): (N, hidden[-1])."""
  h = jnp.asarray(x, jnp.float32).reshape(len(x), -1)
  for layer in judge.layers[:-1]:
    h = jax.nn.relu(layer(h))
  return h


def logits(judge: MLP, x) -> jax.Array:
  return judge.layers[-1](features(judge, x))


def train(c: JudgeConfig, images, labels) -> MLP:
  """A fresh judge trained on (images, labels); deterministic given c.seed."""
  model = make(c, nnx.Rngs(int(c.seed)))
  return train_classifier(model, images, labels, steps=c.steps, batch_size=c.batch_size,
                          learning_rate=c.learning_rate, weight_decay=c.weight_decay, seed=c.seed, logits=logits)


def load_or_train(c: JudgeConfig, images, labels, *, name: str, data_spec: Any, cache_dir: str = "",
                  version: int = 1) -> tuple[MLP, bool, str]:
  """(judge, loaded from the cache, cache file): trained on first use, then read from
  `cache_dir/judges/<name>_<digest>.npz`, the digest covering `data_spec`, the judge's settings and `version`."""
  key = cache.digest({"data": data_spec, "judge": dataclasses.asdict(c), "version": version})
  file = cache.path("judges", f"{name}_{key}.npz", cache_dir)
  judge, cached = cache.load_or_build(file, lambda: make(c, nnx.Rngs(0)), lambda: train(c, images, labels),
                                      what="judge")
  return judge, cached, file


def entropy(pred: np.ndarray, num_classes: int) -> float:
  """Entropy (nats) of the histogram of predicted classes; log(num_classes) when every class is equally often
  predicted, 0 when one class takes all."""
  p = np.bincount(np.asarray(pred, np.int64), minlength=num_classes) / max(len(pred), 1)
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


def score(judge: MLP, samples, reference, *, batch: int = 4096) -> dict[str, Any]:
  """Judge-feature Frechet distance of samples to reference images, the judge's predicted classes of the
  samples, their histogram entropy and mean max-softmax confidence."""
  f = jax.jit(lambda x: features(judge, x))
  head = jax.jit(lambda h: judge.layers[-1](h))

  def feats(a):
    a = np.asarray(a, np.float32)
    return np.concatenate([np.asarray(f(jnp.asarray(a[i:i + batch]))) for i in range(0, len(a), batch)])
  f_gen, f_ref = feats(samples), feats(reference)
  lg = np.asarray(head(jnp.asarray(f_gen)))
  pred = lg.argmax(-1)
  conf = np.asarray(jax.nn.softmax(jnp.asarray(lg), -1)).max(-1)
  return {"fd": frechet.frechet_from_features(f_gen, f_ref), "pred": pred,
          "entropy": entropy(pred, lg.shape[-1]), "confidence": float(conf.mean())}
