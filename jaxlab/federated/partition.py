"""Client partitions for federated experiments: one domain per client, with Dirichlet label skew.

SLOT-Align's protocol (its official code's `partitioning.py`): every domain is one client;
for each class c a vector p_c ~ Dirichlet(alpha 1_K) over the K clients is drawn and client k keeps the
fraction p_c[k] of ITS OWN domain's class-c samples. alpha = 0 is the domain-shift-only setting (every client
keeps its whole domain).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxlab.errors import DataError


def domain_per_client(domain_ids: np.ndarray) -> list[np.ndarray]:
  """One client per domain.

  Args:
    domain_ids: (n,) integer domain of each sample (domains 0..K-1, each non-empty).

  Returns:
    K index arrays (sorted) into the n samples.
  """
  domain_ids = np.asarray(domain_ids)
  if domain_ids.ndim != 1 or domain_ids.size == 0:
    raise DataError(f"domain_ids must be a non-empty (n,) array, got shape {domain_ids.shape}")
  k = int(domain_ids.max()) + 1
  out = [np.flatnonzero(domain_ids == i) for i in range(k)]
  empty = [i for i, o in enumerate(out) if o.size == 0]
  if empty:
    raise DataError(f"domains {empty} have no samples; number domains 0..K-1 without gaps")
  return out


def dirichlet_proportions(num_classes: int, num_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
  """(C, K) rows p_c ~ Dirichlet(alpha 1_K) (alpha = 0: all ones, i.e. no label skew).

  Very small alpha can make every gamma draw underflow to 0; such a row becomes one-hot on a uniformly
  chosen client (the alpha -> 0 limit of the Dirichlet).
  """
  if alpha < 0 or not np.isfinite(alpha):
    raise ValueError(f"alpha must be >= 0 (0 = no label skew), got {alpha}")
  if alpha == 0:
    return np.ones((num_classes, num_clients))
  g = rng.gamma(alpha, size=(num_classes, num_clients))
  s = g.sum(axis=1, keepdims=True)
  dead = s[:, 0] <= 0
  g[dead] = np.eye(num_clients)[rng.integers(num_clients, size=int(dead.sum()))]
  return g / g.sum(axis=1, keepdims=True)


def dirichlet_label_skew(labels_by_client: Sequence[np.ndarray], num_classes: int, alpha: float,
                         rng: np.random.Generator, min_samples: int = 2) -> list[np.ndarray]:
  """Label skew inside a domain-per-client partition.

  Client k keeps floor(p_c[k] * n_{k,c}) of its own class-c samples (chosen at random), with
  p_c ~ Dirichlet(alpha 1_K). A client left with fewer than `min_samples` samples is topped up with random
  samples of its own domain (reconstructed: the official code's handling of empty clients is not known;
  statistics need at least 2 samples).

  Args:
    labels_by_client: K arrays (n_k,) of integer labels in [0, num_classes).
    num_classes: C.
    alpha: Dirichlet concentration (0: keep everything).
    rng: numpy Generator (the partition is a pure function of its state).
    min_samples: smallest client size.

  Returns:
    K sorted index arrays, each into its client's own samples.
  """
  k = len(labels_by_client)
  if k == 0:
    raise DataError("need at least one client")
  p = dirichlet_proportions(num_classes, k, alpha, rng)
  out = []
  for i, y in enumerate(labels_by_client):
    y = np.asarray(y)
    if y.ndim != 1 or (y.size and (y.min() < 0 or y.max() >= num_classes)):
      raise DataError(f"client {i}: labels must be a (n,) array of ints in [0, {num_classes}), got shape {y.shape}")
    keep = []
    for c in range(num_classes):
      idx = np.flatnonzero(y == c)
      n_keep = len(idx) if alpha == 0 else int(np.floor(p[c, i] * len(idx)))
      keep.append(rng.permutation(idx)[:n_keep])
    keep = np.concatenate(keep) if keep else np.zeros((0,), np.int64)
    if len(keep) < min_samples:
      if len(y) < min_samples:
        raise DataError(f"client {i} has {len(y)} samples; at least {min_samples} are needed")
      rest = np.setdiff1d(np.arange(len(y)), keep)
      keep = np.concatenate([keep, rng.permutation(rest)[: min_samples - len(keep)]])
    out.append(np.sort(keep).astype(np.int64))
  return out
