"""Data for one-shot federated experiments: a synthetic multi-domain generator and frozen-feature files.

`gaussian_domains` is our synthetic multi-domain benchmark for SLOT-Align (arXiv 2606.16655; reconstructed): latent class-conditional Gaussians
z | y = c ~ N(mu_c, I), mu_c ~ N(0, class_scale^2 I), seen by domain k through an SPD distortion and a shift,
x = P_k z + s_k with P_k = Q_k diag(exp(distortion * xi)) Q_k^T (Q_k Haar-orthogonal, xi ~ N(0, I)) and
s_k ~ N(0, shift^2 I). The generated x plays the role of frozen-encoder features (the encoder is the
identity): a shared class geometry seen through a different affine map per domain.

`load_feature_npz` reads features a frozen encoder produced offline (one (n, d) array and one label array
per domain), the input of the full-scale configs.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from jaxlab.errors import DataError


def _haar_orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
  q, r = np.linalg.qr(rng.normal(size=(d, d)))
  return q * np.sign(np.diag(r))[None, :]


def gaussian_domains(seed: int, num_domains: int = 4, dim: int = 16, num_classes: int = 10,
                     class_scale: float = 1.2, distortion: float = 0.4, shift: float = 1.5,
                     train_per_class: int = 300, test_per_class: int = 100) -> dict[str, np.ndarray]:
  """Multi-domain classification features with a shared latent class geometry.

  Returns:
    {"train_x": (K, C * train_per_class, d) float32, "train_y": (K, C * train_per_class) int32,
     "test_x": (K, C * test_per_class, d), "test_y": (K, C * test_per_class), "class_means": (C, d)}.
  """
  if min(num_domains, dim, num_classes, train_per_class, test_per_class) < 1:
    raise ValueError("num_domains, dim, num_classes, train_per_class and test_per_class must be >= 1")
  rng = np.random.default_rng(seed)
  mu = class_scale * rng.normal(size=(num_classes, dim))
  maps = []
  for _ in range(num_domains):
    q = _haar_orthogonal(rng, dim)
    p = (q * np.exp(distortion * rng.normal(size=dim))[None, :]) @ q.T
    maps.append((p, shift * rng.normal(size=dim)))

  def sample(per_class):
    xs, ys = [], []
    for p, s in maps:
      y = np.repeat(np.arange(num_classes), per_class)
      z = mu[y] + rng.normal(size=(len(y), dim))
      xs.append(z @ p.T + s)
      ys.append(y)
    return np.stack(xs).astype(np.float32), np.stack(ys).astype(np.int32)

  train_x, train_y = sample(train_per_class)
  test_x, test_y = sample(test_per_class)
  return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y, "class_means": mu}


def load_feature_npz(path: str, domains: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Frozen-encoder features per domain from an .npz with arrays `<domain>_x` (n, d) and `<domain>_y` (n,).

  Raises:
    DataError: missing file or keys, wrong shapes, non-finite features, mismatched dimensions.
  """
  if not path or not os.path.exists(path):
    raise DataError(f"feature file {path!r} not found; extract features with a frozen encoder first "
                    "(see experiments/slot_align/README.md, 'Full scale')")
  try:
    z = np.load(path)
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: not a readable .npz ({e})") from None
  out, dim = {}, None
  for dom in domains:
    for key in (f"{dom}_x", f"{dom}_y"):
      if key not in z.files:
        raise DataError(f"{path}: no array '{key}' (has {sorted(z.files)[:8]}...)")
    x, y = np.asarray(z[f"{dom}_x"], np.float32), np.asarray(z[f"{dom}_y"])
    if x.ndim != 2 or y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
      raise DataError(f"{path}: '{dom}_x' must be (n, d) and '{dom}_y' (n,) integers; "
                      f"got {x.shape}, {y.shape} {y.dtype}")
    if not np.all(np.isfinite(x)):
      raise DataError(f"{path}: '{dom}_x' has non-finite values")
    if dim is not None and x.shape[1] != dim:
      raise DataError(f"{path}: domain {dom} has {x.shape[1]}-d features, the others {dim}-d")
    dim = x.shape[1]
    out[dom] = (x, y.astype(np.int32))
  return out


def train_test_split(x: np.ndarray, y: np.ndarray, test_fraction: float, rng: np.random.Generator):
  """Random split of one domain (Office-Home's protocol: 70/30). Returns (x_tr, y_tr, x_te, y_te)."""
  perm = rng.permutation(len(x))
  n_te = int(round(test_fraction * len(x)))
  te, tr = perm[:n_te], perm[n_te:]
  return x[tr], y[tr], x[te], y[te]
