"""Mechanism labels on analytic curves; indicators against scipy / closed forms."""

import numpy as np
import pytest
from scipy import stats

from jaxlab.causal import mechanisms

V = np.linspace(-1.6, 1.6, 25)


@pytest.mark.parametrize("f,expected", [
    (lambda x: 0.7 * x, "monotone"),
    (lambda x: -2 * x + 0.1 * x ** 3, "monotone"),
    (lambda x: np.maximum(0, x - 0.5), "threshold"),
    (lambda x: -np.maximum(0, 0.3 - x), "threshold"),
    (lambda x: np.tanh(2 * x), "saturating"),
    (lambda x: x ** 2 - 1, "sign-changing"),
    (lambda x: np.sin(3 * x), "sign-changing"),
    (lambda x: 1e-4 * x, "flat"),
])
def test_labels_of_analytic_curves(f, expected):
  assert mechanisms.classify(V, f(V))[0] == expected


def test_spearman_matches_scipy():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=30), np.round(rng.normal(size=30), 1)
  assert mechanisms.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


def test_hinge_fit_finds_the_break_and_slopes():
  f = np.where(V < V[15], 0.2 * (V - V[15]), 1.5 * (V - V[15])) + 3.0
  h = mechanisms.hinge_fit(V, f)
  assert h["break_index"] == 15
  assert h["left_slope"] == pytest.approx(0.2) and h["right_slope"] == pytest.approx(1.5)
  assert h["sse"] == pytest.approx(0.0, abs=1e-20)


def test_indicators_closed_forms():
  ind = mechanisms.indicators(V, V ** 2)
  assert ind["minority"] == pytest.approx(0.5, abs=1e-9) and ind["sign_changes"] == 1
  assert abs(ind["rho"]) < 0.1 and ind["amplitude"] == pytest.approx(V.max() ** 2)
  lin = mechanisms.indicators(V, 3 * V)
  assert lin["end_ratio"] == pytest.approx(1.0) and lin["asymmetry"] == pytest.approx(0.0, abs=1e-9)
  assert mechanisms.indicators(V, np.maximum(V, 0))["asymmetry"] > 0.9
