"""Offline datasets: synthetic generators and small real datasets that pip packages ship.

Nothing here downloads. Every function returns a dict of numpy arrays ready for `ArraySource`.
"""

from __future__ import annotations

import numpy as np


def digits(split: str = "train", test_fraction: float = 0.25, seed: int = 0,
           value_range: tuple[float, float] = (0.0, 1.0)) -> dict[str, np.ndarray]:
  """scikit-learn's 8x8 handwritten digits (1797 images, 10 classes), scaled to [0, 1] (or `value_range`).

  Args:
    split: "train" or "test" (a fixed stratified split, independent of the run seed by default).
    test_fraction: fraction held out for "test".
    seed: split seed.
    value_range: (lo, hi) the pixel range 0..16 is mapped onto linearly; (-1, 1) for diffusion models.

  Returns:
    {"image": float32 (N, 8, 8, 1), "label": int32 (N,)}.
  """
  from sklearn.datasets import load_digits
  d = load_digits()
  lo, hi = (float(v) for v in value_range)
  if not lo < hi:
    raise ValueError(f"digits value_range must be (lo, hi) with lo < hi, got {tuple(value_range)}")
  x = d.images / 16.0
  if (lo, hi) != (0.0, 1.0):
    x = lo + (hi - lo) * x
  x = x.astype(np.float32)[..., None]
  y = d.target.astype(np.int32)
  rng = np.random.default_rng(seed)
  test = np.zeros(len(y), bool)
  for c in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == c))
    test[idx[: int(round(test_fraction * len(idx)))]] = True
  if split not in ("train", "test"):
    raise ValueError(f"digits split must be 'train' or 'test', got {split!r}")
  keep = test if split == "test" else ~test
  return {"image": x[keep], "label": y[keep]}


def gaussian_blobs(n: int, dim: int, num_classes: int, *, sep: float = 3.0, seed: int = 0) -> dict[str, np.ndarray]:
  """Isotropic Gaussian classes with random unit-norm means scaled by `sep`.

  Returns:
    {"x": float32 (n, dim), "label": int32 (n,)}.
  """
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(num_classes, dim))
  means *= sep / np.linalg.norm(means, axis=1, keepdims=True)
  y = rng.integers(0, num_classes, size=n)
  x = means[y] + rng.normal(size=(n, dim))
  return {"x": x.astype(np.float32), "label": y.astype(np.int32)}


def linear_regression(n: int, dim: int, *, noise: float = 0.1, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """y = x @ w + noise with x ~ N(0, I); returns ({"x", "y"}, true w)."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(dim,))
  x = rng.normal(size=(n, dim))
  y = x @ w + noise * rng.normal(size=n)
  return {"x": x.astype(np.float32), "y": y.astype(np.float32)}, w.astype(np.float32)
