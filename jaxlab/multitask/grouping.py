"""Task grouping by gradient similarity (the grouping of TaskLoom's first stage; MoW, arXiv 2602.01270, clusters
tasks by their gradients the same way).

    g = task_gradients(loss_fn, params, batches)          # (T, P): each task's mean gradient, flattened
    s = cosine_matrix(g)                                  # (T, T)
    labels = cluster(s, num_groups=3)                     # or cluster(s, threshold=0.5)
    adjusted_rand_index(labels, true_families)

`cluster` runs scikit-learn's agglomerative clustering (average linkage) or spectral clustering on the
cosine similarities (distance 1 - S); the groups are relabelled by first appearance so equal partitions give
equal labels.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError


def flat(tree, exclude: Sequence[str] = ()) -> jax.Array:
  """All leaves of a pytree (except top-level keys in `exclude`) concatenated into one vector."""
  if isinstance(tree, dict):
    tree = {k: v for k, v in tree.items() if k not in exclude}
  return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])


def task_gradients(loss_fn: Callable, params, batches: dict, *, exclude: Sequence[str] = ("emb",)) -> jax.Array:
  """(T, P) mean gradient of `loss_fn(params, batch) -> scalar` per task.

  Args:
    loss_fn: the shared model's loss on one batch.
    params: the shared parameters.
    batches: a pytree whose leaves have leading axes (T, K, ...): K batches per task.
    exclude: top-level parameter keys left out of the vectors (task-specific parameters such as embeddings).
  """
  grad = jax.grad(loss_fn)

  def per_task(task_batches):
    gs = jax.vmap(lambda b: flat(grad(params, b), exclude))(task_batches)
    return gs.mean(0)
  return jax.lax.map(per_task, batches)


def cosine_matrix(g: jax.Array) -> np.ndarray:
  """(T, T) cosine similarities of the rows of g."""
  g = np.asarray(g, np.float64)
  unit = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12)
  return np.clip(unit @ unit.T, -1.0, 1.0)


def _relabel(labels) -> np.ndarray:
  seen: dict[int, int] = {}
  return np.array([seen.setdefault(int(x), len(seen)) for x in labels], np.int32)


def cluster(similarity: np.ndarray, num_groups: int | None = None, *, threshold: float | None = None,
            method: str = "agglomerative", seed: int = 0) -> np.ndarray:
  """Group labels (T,) from a similarity matrix: a fixed number of groups, or (agglomerative) every merge
  whose average similarity is at least `threshold`."""
  from sklearn import cluster as sk  # pylint: disable=g-import-not-at-top
  s = np.asarray(similarity, np.float64)
  t = s.shape[0]
  if (num_groups is None) == (threshold is None):
    raise ConfigError("cluster: give exactly one of num_groups or threshold")
  if num_groups is not None and not 1 <= num_groups <= t:
    raise ConfigError(f"cluster: num_groups={num_groups} must be in [1, {t}] (the number of tasks)")
  if num_groups == 1 or t == 1:
    return np.zeros(t, np.int32)
  if num_groups == t:
    return np.arange(t, dtype=np.int32)
  dist = np.clip(1.0 - s, 0.0, 2.0)
  if method == "agglomerative":
    kw = {"n_clusters": num_groups} if num_groups is not None else {"n_clusters": None,
                                                                     "distance_threshold": 1.0 - threshold}
    model = sk.AgglomerativeClustering(metric="precomputed", linkage="average", **kw)
    return _relabel(model.fit_predict(dist))
  if method == "spectral":
    if num_groups is None:
      raise ConfigError("cluster: spectral clustering needs num_groups")
    affinity = np.clip(s, 0.0, 1.0)
    model = sk.SpectralClustering(n_clusters=num_groups, affinity="precomputed", random_state=seed)
    return _relabel(model.fit_predict(affinity))
  raise ConfigError(f"cluster: method must be 'agglomerative' or 'spectral', got {method!r}")


def adjusted_rand_index(labels, truth) -> float:
  """sklearn's adjusted Rand index of two partitions."""
  from sklearn import metrics  # pylint: disable=g-import-not-at-top
  return float(metrics.adjusted_rand_score(np.asarray(truth), np.asarray(labels)))
