"""Offline OKG allocator: Monte Carlo h(alpha) vs quadrature, allocation invariants vs numpy references."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

from jaxlab.tts import allocation, self_consistency as sc


def _exact_i(alpha):
  """I(alpha)_m = P(X_m = max_j X_j), X_j ~ Gamma(alpha_j) independent, by 1-D quadrature."""
  out = []
  for m, a in enumerate(alpha):
    others = [b for j, b in enumerate(alpha) if j != m]
    f = lambda x, a=a, others=others: (np.exp((a - 1) * np.log(x) - x - special.gammaln(a)) *
                                       np.prod(special.gammainc(others, x)))
    out.append(integrate.quad(f, 0, np.inf, limit=200)[0])
  return np.array(out)


def _exact_gain(alpha, c=1.0):
  h0 = _exact_i(alpha).max()
  return max(_exact_i(np.asarray(alpha) + c * np.eye(len(alpha))[m]).max() for m in range(len(alpha))) - h0


def test_h_matches_quadrature():
  alphas = jnp.array([[3.0, 1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0], [6.0, 2.0, 1.0, 1.0], [4.0, 2.0, 1e-3, 1e-3]])
  h = np.asarray(allocation.h_values(jax.random.key(0), alphas, 30_000))
  np.testing.assert_allclose(h[:3], [_exact_i(a).max() for a in np.asarray(alphas[:3])], atol=0.012)
  # Two live options (the others ~never win): P(theta_1 > theta_2) = P(Beta(4, 2) > 1/2).
  assert h[3] == pytest.approx(stats.beta.sf(0.5, 4, 2), abs=0.012)


@pytest.mark.parametrize("coupled", [False, True])
def test_optimistic_gain_matches_quadrature(coupled):
  alphas = [[2.0, 1.0, 1.0], [3.0, 3.0, 1.0], [5.0, 1.0, 1.0]]
  est = allocation.optimistic_gains(jax.random.key(2), jnp.array(alphas), nsamples=30_000, coupled=coupled)
  # Independent estimates of h carry ~0.002 noise each (the max over M adds a small upward bias).
  np.testing.assert_allclose(np.asarray(est), [_exact_gain(a) for a in alphas], atol=0.016 if not coupled else 0.008)


def _pools(seed=0, k=12, n=10):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, n + 1, k).astype(np.int32)
  answers = rng.integers(0, 3, (k, n)).astype(np.int32)
  answers[np.arange(n)[None, :] >= lengths[:, None]] = -1
  return answers, lengths


@pytest.mark.parametrize("batch_size,warm_up", [(1, 0), (3, 1)])
def test_allocation_invariants_against_numpy(batch_size, warm_up):
  answers, lengths = _pools()
  alloc = allocation.OKGAllocator(num_options=3, nsamples=2000, batch_size=batch_size, warm_up=warm_up, coupled=True)
  key = jax.random.key(0)
  st = alloc.init(key, answers, lengths)
  assert int(st["draws"]) == warm_up * len(lengths)
  st = alloc.allocate(st, key, answers, lengths, 25)
  ptr = np.asarray(st["ptr"])
  assert int(st["draws"]) == warm_up * len(lengths) + 25 == ptr.sum()
  assert np.all(ptr <= lengths) and np.all(ptr >= warm_up)
  counts = np.stack([[np.sum(a[:p] == m) for m in range(3)] for a, p in zip(answers, ptr)])
  np.testing.assert_array_equal(np.asarray(st["votes"]), counts)          # draws are each pool's prefix
  np.testing.assert_array_equal(np.asarray(st["alpha"]), 1.0 + counts)    # Dirichlet(1) prior + counts
  want_min = [-1 if p == 0 else int(np.argmax(counts[i])) for i, p in enumerate(ptr)]
  np.testing.assert_array_equal(np.asarray(alloc.predict(st)), want_min)  # default ties: the smallest option
  want_first = [-1 if p == 0 else next(x for x in a[:p] if np.sum(a[:p] == x) == counts[i].max())
                for i, (a, p) in enumerate(zip(answers, ptr))]
  first = dataclasses.replace(alloc, tie_break="first")
  np.testing.assert_array_equal(np.asarray(first.predict(st)), want_first)  # "first": earliest collected answer


def test_allocation_splits_into_stages_and_stops_when_exhausted():
  answers, lengths = _pools(1)
  alloc = allocation.OKGAllocator(num_options=3, nsamples=2000, coupled=True)   # as above: compiled once
  key = jax.random.key(5)
  one = alloc.allocate(alloc.init(key, answers, lengths), key, answers, lengths, 30)
  two = alloc.init(key, answers, lengths)
  two = alloc.allocate(alloc.allocate(two, key, answers, lengths, 11), key, answers, lengths, 19)
  for k in one:
    np.testing.assert_array_equal(np.asarray(one[k]), np.asarray(two[k]), err_msg=k)
  full = alloc.allocate(one, key, answers, lengths, 10_000)
  np.testing.assert_array_equal(np.asarray(full["ptr"]), lengths)
  assert int(full["draws"]) == lengths.sum()


def test_okg_prefers_uncertain_questions():
  # Questions 0-5: unanimous pools; 6-11: 50/50 splits. After a 2-answer warm-up the exact gains (quadrature)
  # are R+(3, 1, 1) = 0.100 vs R+(2, 2, 1) = 0.201, and a split question's gain stays >= 0.12 while it keeps
  # splitting, so the exact OKG would spend all 30 answers on the splits; the (low-noise) Monte Carlo one nearly so.
  answers = np.array([[0] * 10] * 6 + [[0, 1] * 5] * 6, np.int32)
  lengths = np.full(12, 10, np.int32)
  alloc = allocation.OKGAllocator(num_options=3, nsamples=2000, warm_up=2, coupled=True)
  key = jax.random.key(0)
  st = alloc.allocate(alloc.init(key, answers, lengths), key, answers, lengths, 30)
  extra = np.asarray(st["ptr"]) - 2
  assert extra[:6].sum() <= 3, extra


def test_weighted_variant_uses_confidences():
  answers, lengths = _pools(3)
  conf = np.random.default_rng(0).integers(1, 33, answers.shape).astype(np.float32)
  alloc = allocation.OKGAllocator(num_options=3, nsamples=2000, warm_up=3, weighted=True, conf_scale=16.0, coupled=True)
  st = alloc.init(jax.random.key(0), answers, lengths, conf)
  tot = np.stack([[conf[i, :3][answers[i, :3] == m].sum() for m in range(3)] for i in range(len(answers))])
  np.testing.assert_allclose(np.asarray(st["alpha"]), 1.0 + tot / 16.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(st["votes"]), tot)
  np.testing.assert_array_equal(np.asarray(alloc.predict(st)), np.argmax(tot, axis=1))   # ties: smallest option


def test_uniform_vote_and_shuffle_rows():
  answers, lengths = _pools(2)
  got = np.asarray(allocation.uniform_vote(answers, 3, 4, tie_break="min"))
  np.testing.assert_array_equal(got, np.asarray(sc.vote(answers[:, :4], 3, tie_break="min")))
  shuffled, = allocation.shuffle_rows(jax.random.key(0), answers, lengths)
  for a, s, n in zip(answers, shuffled, lengths):
    assert sorted(a[:n]) == sorted(s[:n]) and np.all(s[n:] == -1)
  assert not np.array_equal(shuffled, answers)


def test_bad_settings():
  with pytest.raises(ValueError, match="tie_break"):
    allocation.OKGAllocator(num_options=4, tie_break="last")
  with pytest.raises(ValueError, match="bad settings"):
    allocation.OKGAllocator(num_options=4, batch_size=0)
