"""Edge scores, AUROC and the linear VAR baseline against sklearn / numpy / statsmodels."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from jaxlab.causal import scores


def test_auroc_matches_sklearn_with_ties_and_ignored_diagonal():
  rng = np.random.default_rng(0)
  for _ in range(5):
    s = np.round(rng.normal(size=(7, 7)), 1)                  # ties
    t = (rng.random((7, 7)) < 0.3).astype(int)
    t[0, 1], t[1, 0] = 1, 0
    off = ~np.eye(7, dtype=bool)
    assert scores.auroc(s, t) == pytest.approx(roc_auc_score(t[off], s[off]), abs=1e-12)
    assert scores.auroc(s, t, ignore_self_links=False) == pytest.approx(roc_auc_score(t.ravel(), s.ravel()), abs=1e-12)


def test_auroc_perfect_and_single_class():
  t = np.zeros((3, 3))
  t[0, 1] = 1
  s = t * 5 + np.eye(3) * 100                                 # a huge self link must not matter
  assert scores.auroc(s, t) == 1.0
  assert np.isnan(scores.auroc(s, np.zeros((3, 3))))


def test_edge_scores_are_weighted_std():
  c = np.random.default_rng(1).normal(size=(50, 3, 3))
  np.testing.assert_allclose(scores.edge_scores(c), c.std(0), rtol=1e-12)
  w = np.r_[np.ones(30), np.zeros(20)]
  np.testing.assert_allclose(scores.edge_scores(c, w), c[:30].std(0), rtol=1e-12)


def test_linear_var_matches_statsmodels():
  sm = pytest.importorskip("statsmodels.tsa.api")
  rng = np.random.default_rng(2)
  t, n, k = 400, 3, 2
  a1 = np.array([[0.5, 0.2, 0.0], [0.0, 0.4, 0.0], [0.3, 0.0, 0.2]])   # y_t = a1 y_{t-1} + a2 y_{t-2} (row = target)
  a2 = np.array([[0.0, 0.0, 0.1], [0.2, 0.0, 0.0], [0.0, 0.0, 0.1]])
  v = np.zeros((t, n))
  for i in range(2, t):
    v[i] = a1 @ v[i - 1] + a2 @ v[i - 2] + rng.normal(size=n)
  x = np.stack([v[i - k:i].T for i in range(k, t)])               # (B, N, K), oldest first
  y = v[k:]
  fit = scores.fit_linear_var(x, y)
  res = sm.VAR(v).fit(k, trend="c")
  # statsmodels coefs[l - 1][target, source]; ours coef[source, l - 1, target].
  np.testing.assert_allclose(fit["coef"][:, 0, :], res.coefs[0].T, atol=1e-8)
  np.testing.assert_allclose(fit["coef"][:, 1, :], res.coefs[1].T, atol=1e-8)
  np.testing.assert_allclose(fit["intercept"], res.intercept, atol=1e-8)
  np.testing.assert_allclose(fit["score"], np.abs(res.coefs[0].T), atol=1e-8)
