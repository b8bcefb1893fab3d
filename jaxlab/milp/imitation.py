"""Imitation of strong branching: batches, accuracies against heuristics, breakdowns by depth, the SCIP policy.

* `Batches`: deterministic training batches over a list of samples (`step -> packed batch`, a pure function of
  the step for exact resume), padded to one fixed bucket so the jitted step compiles once.
* `heuristic_accuracy(samples, ks)`: acc@k of most-fractional branching (the candidate whose LP value is nearest
  to .5) and the exact expectation of a uniformly random candidate (ties at the best score count as correct,
  as in Gasse et al. 2019).
* `policy_accuracy(model, samples, ...)`: acc@k of a GCNN on samples, per sample.
* `by_depth(values, depths, max_bin)`: means per depth (the last bin collects depth >= max_bin).
* `GCNNPolicy`: `sample -> candidate index` for `jaxlab.milp.scip_env.make_policy_rule`, one compile per bucket.
"""

from __future__ import annotations

import functools
from math import comb
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.milp import gcnn
from jaxlab.milp.scip_env import COL_FEATURES

SOL_FRAC = COL_FEATURES.index("sol_frac")


def buckets(samples: Sequence[Mapping]) -> dict[str, int]:
  """One bucket (powers of two) that fits every sample: {"R", "C", "E", "K"} for `gcnn.pack(sizes=...)`."""
  return {"R": gcnn.bucket(max(len(s["row_feats"]) for s in samples)),
          "C": gcnn.bucket(max(len(s["col_feats"]) for s in samples)),
          "E": gcnn.bucket(max(s["edge_index"].shape[1] for s in samples)),
          "K": gcnn.bucket(max(len(s["cands"]) for s in samples))}


class Batches:
  """`batch(step)`: `batch_size` samples drawn without replacement within epochs of a seeded permutation."""

  def __init__(self, samples: Sequence[Mapping], batch_size: int, seed: int, sizes: Mapping[str, int] | None = None):
    self.samples, self.batch_size, self.seed = list(samples), int(batch_size), int(seed)
    self.sizes = dict(sizes or buckets(self.samples))
    if len(self.samples) < self.batch_size:
      raise ValueError(f"{len(self.samples)} training samples < batch size {self.batch_size}: collect more "
                       "(config.data.train_instances / max_samples) or lower config.train.batch_size")
    self._per_epoch = len(self.samples) // self.batch_size
    self._perm: dict[int, np.ndarray] = {}

  def indices(self, step: int) -> np.ndarray:
    epoch, i = divmod(int(step), self._per_epoch)
    if epoch not in self._perm:
      self._perm = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.samples))}
    return self._perm[epoch][i * self.batch_size:(i + 1) * self.batch_size]

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    return gcnn.pack([self.samples[j] for j in self.indices(step)], self.sizes)


def _random_topk(n: int, ties: int, k: int) -> float:
  """P(a uniformly random k-subset of n candidates holds one of `ties` best ones)."""
  k = min(k, n)
  return 1.0 - comb(n - ties, k) / comb(n, k)


def heuristic_accuracy(samples: Sequence[Mapping], ks: Sequence[int] = (1, 5, 10)) -> dict[str, np.ndarray]:
  """Per-sample acc@k of "mostfrac" (ties by candidate order) and "random" (exact expectation)."""
  out = {f"{a}/acc{k}": np.zeros(len(samples)) for a in ("mostfrac", "random") for k in ks}
  for i, s in enumerate(samples):
    scores = np.asarray(s["scores"], np.float64)
    best = scores >= scores.max() * (1 - 1e-12) if scores.max() > 0 else scores == scores.max()
    f = np.asarray(s["col_feats"])[np.asarray(s["cands"]), SOL_FRAC]
    infeas = np.minimum(f, 1 - f)
    order = np.argsort(-infeas, kind="stable")
    for k in ks:
      out[f"mostfrac/acc{k}"][i] = float(best[order[:k]].any())
      out[f"random/acc{k}"][i] = _random_topk(len(scores), int(best.sum()), k)
  return out


def policy_accuracy(model, samples: Sequence[Mapping], ks: Sequence[int] = (1, 5, 10), batch_size: int = 32,
                    sizes: Mapping[str, int] | None = None, multiple: int = 1) -> dict[str, np.ndarray]:
  """Per-sample acc@k of the GCNN `model` (batches padded to `sizes` and to a multiple of `multiple` graphs)."""
  sizes = dict(sizes or buckets(samples))
  fwd = _eval_fn(tuple(int(k) for k in ks))
  out = {f"acc{k}": [] for k in ks}
  for start in range(0, len(samples), batch_size):
    chunk = samples[start:start + batch_size]
    batch = gcnn.pad_batch(gcnn.pack(chunk, sizes), max(multiple, 1))
    acc = jax.device_get(fwd(model, batch))
    for k in ks:
      out[f"acc{k}"].append(np.asarray(acc[k])[:len(chunk)])
  return {k: np.concatenate(v) for k, v in out.items()}


@functools.lru_cache(maxsize=None)
def _eval_fn(ks: tuple[int, ...]):
  import flax.nnx as nnx  # pylint: disable=g-import-not-at-top

  def fwd(model, batch):
    logits = gcnn.candidate_logits(gcnn.col_logits(model, batch), batch["cands"], batch["cand_mask"])
    return gcnn.topk_accuracy(logits, batch["scores"], batch["cand_mask"], ks)
  return nnx.jit(fwd)


def by_depth(values: np.ndarray, depths: np.ndarray, max_bin: int) -> tuple[list[float | None], list[int]]:
  """(mean, count) per depth 0..max_bin (the last bin: depth >= max_bin; empty bins: None, JSON's null)."""
  d = np.minimum(np.asarray(depths), max_bin)
  v = np.asarray(values, np.float64)
  means = [float(v[d == b].mean()) if np.any(d == b) else None for b in range(max_bin + 1)]
  return means, [int(np.sum(d == b)) for b in range(max_bin + 1)]


class GCNNPolicy:
  """`policy(sample) -> candidate index` with a GCNN (jitted once per bucket of the node's sizes).

  `sample` is `jaxlab.milp.scip_env.node_sample(...)` (no scores needed). `sizes`: minimum buckets (e.g. the
  training ones), so that most nodes share one compiled shape; a larger node gets its own bucket.
  """

  def __init__(self, model, sizes: Mapping[str, int] | None = None):
    self.sizes = dict(sizes or {})
    import flax.nnx as nnx  # pylint: disable=g-import-not-at-top
    graphdef, state = nnx.split(model)
    self.state = jax.device_put(state)       # placed once: each call only moves the node's arrays

    @jax.jit
    def choose(state, batch):
      m = nnx.merge(graphdef, state)
      logits = gcnn.candidate_logits(gcnn.col_logits(m, batch), batch["cands"], batch["cand_mask"])
      return jnp.argmax(logits[0])
    self._choose = choose

  def __call__(self, sample: Mapping) -> int:
    s = dict(sample)
    s.setdefault("scores", np.zeros(len(s["cands"]), np.float32))
    need = buckets([s])
    sizes = {k: max(v, self.sizes.get(k, 0)) for k, v in need.items()}
    return int(self._choose(self.state, gcnn.pack([s], sizes)))
