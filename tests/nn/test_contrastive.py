"""SupCon with arbitrary positive masks against a brute-force loop over anchors (Khosla et al. 2020, eq. 2)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.nn import contrastive


def brute(z, pos, tau, w):
  z, pos, w = np.asarray(z, np.float64), np.asarray(pos), np.asarray(w, np.float64)
  total, weight = 0.0, 0.0
  for i in range(len(z)):
    if w[i] == 0:
      continue
    others = [a for a in range(len(z)) if a != i and w[a] > 0]
    ps = [p for p in others if pos[i, p]]
    if not ps:
      continue
    denom = np.log(sum(np.exp(z[i] @ z[a] / tau) for a in others))
    total += w[i] * -np.mean([z[i] @ z[p] / tau - denom for p in ps])
    weight += w[i]
  return total / weight if weight else 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_supcon_equals_brute_force(seed):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(12, 5))
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  strata, decision = rng.integers(0, 3, 12), rng.integers(0, 2, 12)
  pos = np.asarray(contrastive.same_label_mask(jnp.asarray(strata), jnp.asarray(decision)))
  w = (rng.random(12) > 0.2).astype(np.float64) * rng.uniform(0.5, 2, 12)
  got = float(contrastive.supcon_loss(jnp.asarray(z, jnp.float32), jnp.asarray(pos), 0.2, jnp.asarray(w)))
  assert got == pytest.approx(brute(z, pos, 0.2, w), rel=1e-5)


def test_supcon_edge_cases_and_gradient():
  z = jnp.eye(4)
  none = jnp.zeros((4, 4), bool)
  assert float(contrastive.supcon_loss(z, none)) == 0.0        # no anchor has a positive
  # Two tight pairs: the loss falls when positives move together, and its gradient is finite.
  pos = contrastive.same_label_mask(jnp.array([0, 0, 1, 1]))
  apart = jnp.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
  close = jnp.array([[1.0, 0.0], [0.995, 0.0998], [-1.0, 0.0], [-0.995, -0.0998]])
  assert float(contrastive.supcon_loss(close, pos)) < float(contrastive.supcon_loss(apart, pos))
  g = jax.grad(lambda x: contrastive.supcon_loss(x / jnp.linalg.norm(x, axis=1, keepdims=True), pos))(apart)
  assert np.isfinite(np.asarray(g)).all()


def test_projection_head_is_normalised():
  head = contrastive.ProjectionHead(8, 16, 4, rngs=nnx.Rngs(0))
  z = head(jnp.asarray(np.random.default_rng(0).normal(size=(5, 8)), jnp.float32))
  np.testing.assert_allclose(np.linalg.norm(np.asarray(z), axis=1), 1.0, rtol=1e-5)
