"""Markov-chain generator vs scipy (Zipf pmf, eigenvector stationary law) and empirical frequencies."""

import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from jaxlab.dynamics import markov


def test_zipf_matches_scipy():
  np.testing.assert_allclose(markov.zipf(20, 1.0), scipy.stats.zipfian(1.0, 20).pmf(np.arange(1, 21)), rtol=1e-12)


def test_chain_is_stochastic_and_stationary_matches_eigenvector():
  p = markov.make_chain(12, alpha=0.5, seed=3)
  np.testing.assert_allclose(p.sum(1), 1.0)
  w, vl = scipy.linalg.eig(p, left=True, right=False)
  ref = np.real(vl[:, np.argmin(np.abs(w - 1))])
  ref /= ref.sum()
  np.testing.assert_allclose(markov.stationary(p), ref, atol=1e-10)
  # alpha = 0 is i.i.d. Zipf: the stationary law is exactly Zipf.
  np.testing.assert_allclose(markov.stationary(markov.make_chain(12, alpha=0.0)), markov.zipf(12), atol=1e-12)


def test_samples_follow_the_chain():
  p = markov.make_chain(5, alpha=0.6, seed=1)
  x = markov.sample(p, 4000, 30, seed=2)
  assert x.shape == (4000, 30) and x.dtype == np.int32 and x.min() >= 0 and x.max() < 5
  counts = np.zeros((5, 5))
  np.add.at(counts, (x[:, :-1].ravel(), x[:, 1:].ravel()), 1)
  np.testing.assert_allclose(counts / counts.sum(1, keepdims=True), p, atol=0.01)
  np.testing.assert_allclose(np.bincount(x[:, 0], minlength=5) / 4000, markov.stationary(p), atol=0.025)


def test_bad_inputs():
  with pytest.raises(ValueError, match="alpha"):
    markov.make_chain(5, alpha=1.5)
  with pytest.raises(ValueError, match="sum to 1"):
    markov.stationary(np.ones((3, 3)))
