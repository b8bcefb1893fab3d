"""The Frechet distance between two feature sets (Heusel et al. 2017, FID; the same for any features).

With the Gaussian fits (mu_1, C_1), (mu_2, C_2) of two feature sets,

    FD = ||mu_1 - mu_2||^2 + tr(C_1 + C_2 - 2 (C_1^{1/2} C_2 C_1^{1/2})^{1/2}),

which is the squared 2-Wasserstein (Bures) distance between the Gaussians: computed by
`jaxlab.ot.gaussian.bures_wasserstein2`, here in float64 (the usual FID implementations use float64 too).
Covariances use ddof = 1 (numpy's `np.cov`, as pytorch-fid does). The features come from any extractor: a
judge network for small data, Inception-v3 pool features read from a local file for ImageNet (nothing is
downloaded); `feature_stats` of the reference set can be computed once and reused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import DataError
from jaxlab.ot.gaussian import bures_wasserstein2


def feature_stats(features) -> tuple[np.ndarray, np.ndarray]:
  """(mean (d,), covariance (d, d), ddof 1) of (n, d) features, float64.

  Raises:
    DataError: fewer than 2 rows, not 2-D, or non-finite values.
  """
  f = np.asarray(features, np.float64)
  if f.ndim != 2 or f.shape[0] < 2:
    raise DataError(f"frechet: features must be (n >= 2, d), got shape {f.shape}")
  if not np.isfinite(f).all():
    raise DataError("frechet: the features contain NaN or inf")
  return f.mean(axis=0), np.cov(f, rowvar=False, ddof=1).reshape(f.shape[1], f.shape[1])


def frechet_distance(mu1, c1, mu2, c2) -> float:
  """The Frechet distance of N(mu1, c1) and N(mu2, c2) (float64), clipped at 0 against round-off."""
  mu1, mu2, c1, c2 = (np.asarray(a, np.float64) for a in (mu1, mu2, c1, c2))
  if mu1.shape != mu2.shape or c1.shape != c2.shape or c1.shape != mu1.shape * 2:
    raise DataError(f"frechet: mismatched statistics {mu1.shape}, {c1.shape} vs {mu2.shape}, {c2.shape}")
  with jax.enable_x64(True):
    d = bures_wasserstein2(jnp.asarray(mu1), jnp.asarray(c1), jnp.asarray(mu2), jnp.asarray(c2))
    return max(float(d), 0.0)


def frechet_from_features(a, b) -> float:
  """The Frechet distance of two (n, d) feature sets."""
  return frechet_distance(*feature_stats(a), *feature_stats(b))


def load_stats(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(mean, covariance) from a local .npz: either precomputed statistics under "mu" and "sigma" (the format
  of ADM's ImageNet reference batches, e.g. VIRTUAL_imagenet256_labeled.npz, and of pytorch-fid's saved
  stats) or raw (n, d) features under "features" (or the single array of the file), e.g. Inception-v3 pool
  features of generated samples computed with any local Inception.

  Raises:
    DataError: a missing file or neither layout.
  """
  import os  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    raise DataError(f"frechet: no statistics file {path} (nothing is downloaded: compute the Inception "
                    "features locally and save them as .npz with 'features', or 'mu' and 'sigma')")
  with np.load(path) as f:
    if "mu" in f.files and "sigma" in f.files:
      return np.asarray(f["mu"], np.float64), np.asarray(f["sigma"], np.float64)
    key = "features" if "features" in f.files else (f.files[0] if len(f.files) == 1 else None)
    if key is None:
      raise DataError(f"frechet: {path} holds {f.files}; expected 'mu' and 'sigma', or 'features' (n, d)")
    return feature_stats(f[key])


def fid_from_files(samples: str, reference: str) -> float:
  """The Frechet distance of two local statistics / feature files (`load_stats` layouts)."""
  return frechet_distance(*load_stats(samples), *load_stats(reference))
