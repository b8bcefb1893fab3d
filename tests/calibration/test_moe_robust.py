"""`jaxlab.nn.moe` (router, stacked experts, hard / soft / top-k mixtures) and `jaxlab.calibration.robust`
(the exponential tilt of the calibrated-MoE paper and its filtered variant), against loops and closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlab.calibration import robust
from jaxlab.errors import ConfigError
from jaxlab.nn import moe


def _model(routing="soft", top_k=1):
  return moe.MoEClassifier(6, 3, 4, rngs=nnx.Rngs(0), router_hidden=(16,), expert_hidden=(8,), routing=routing,
                           top_k=top_k)


def test_experts_are_stacked_and_equal_a_loop_over_their_slices():
  m = _model()
  x = jax.random.normal(jax.random.key(1), (5, 6))
  z = m.expert_logits(x)
  assert z.shape == (5, 4, 3)
  graph, state = nnx.split(m.experts)
  for k in range(4):
    one = nnx.merge(graph, jax.tree.map(lambda a, k=k: a[k], state))
    np.testing.assert_allclose(np.asarray(one(x)), np.asarray(z[:, k]), rtol=1e-5, atol=1e-6)
  names = {v.sharding_names[0] for v in jax.tree.leaves(nnx.state(m.experts, nnx.Param),
                                                         is_leaf=lambda v: isinstance(v, nnx.Variable))}
  assert names == {moe.EXPERT_AXIS}
  experts_distinct = np.asarray(z[:, 0] - z[:, 1])
  assert np.abs(experts_distinct).max() > 1e-3               # independently initialised


def test_hard_soft_and_top_k_mixtures():
  x = jax.random.normal(jax.random.key(2), (7, 6))
  m = _model()
  out = {r: m(x, routing=r) for r in ("hard", "soft")}
  r_logits, z = out["soft"]["router_logits"], out["soft"]["expert_logits"]
  pk = jax.nn.softmax(z, axis=-1)
  hard = np.asarray(pk)[np.arange(7), np.asarray(jnp.argmax(r_logits, -1))]
  np.testing.assert_allclose(np.asarray(out["hard"]["probs"]), hard, rtol=1e-6)
  g = np.asarray(jax.nn.softmax(r_logits, -1))
  np.testing.assert_allclose(np.asarray(out["soft"]["probs"]), np.einsum("bk,bkc->bc", g, np.asarray(pk)),
                             rtol=1e-5)
  np.testing.assert_allclose(np.asarray(out["soft"]["probs"]).sum(-1), 1.0, rtol=1e-6)
  gk = np.asarray(moe.gates_from_logits(r_logits, "top_k", 2))
  assert np.all((gk > 0).sum(-1) == 2) and np.allclose(gk.sum(-1), 1.0)
  top2 = np.argsort(-np.asarray(r_logits), -1)[:, :2]
  for b in range(7):
    e = np.exp(np.asarray(r_logits)[b, top2[b]])
    np.testing.assert_allclose(gk[b, top2[b]], e / e.sum(), rtol=1e-5)
  t = jnp.array([0.5, 1.0, 2.0, 4.0])
  np.testing.assert_allclose(np.asarray(m(x, temperatures=t)["probs"]),
                             np.einsum("bk,bkc->bc", g, np.asarray(jax.nn.softmax(z / t[:, None], -1))), rtol=1e-5)
  with pytest.raises(ConfigError, match="routing='dense'"):
    moe.MoEClassifier(6, 3, 4, rngs=nnx.Rngs(0), routing="dense")
  with pytest.raises(ConfigError, match="top_k=5"):
    moe.gates_from_logits(r_logits, "top_k", 5)


def test_tilted_loss_limits_and_gradients():
  l = jnp.array([0.1, 0.5, 2.0, 0.3])
  np.testing.assert_allclose(float(robust.tilted_loss(l, 0.0)), float(l.mean()), rtol=1e-6)
  np.testing.assert_allclose(float(robust.tilted_loss(l, 200.0)), 2.0, rtol=1e-5)
  q = np.asarray(jax.nn.softmax(2.0 * l))
  lbar = float(np.sum(q * np.asarray(l)))
  g = np.asarray(jax.grad(lambda v: robust.tilted_loss(v, 2.0))(l))             # not detached (official code)
  np.testing.assert_allclose(g, q * (1 + 2.0 * (np.asarray(l) - lbar)), rtol=1e-5)
  gd = np.asarray(jax.grad(lambda v: robust.tilted_loss(v, 2.0, detach=True))(l))
  np.testing.assert_allclose(gd, q, rtol=1e-5)


def test_routing_relevant_and_the_filtered_loss():
  labels = jnp.array([0, 0, 1])
  expert_probs = jnp.array([[[0.9, 0.1], [0.9, 0.1]],      # experts agree, mixture = best expert: not relevant
                            [[0.9, 0.1], [0.2, 0.8]],      # disagree: relevant
                            [[0.5, 0.5], [0.5, 0.5]]])
  gates = jnp.array([[0.5, 0.5], [0.5, 0.5], [1.0, 0.0]])
  probs = jnp.einsum("bk,bkc->bc", gates, expert_probs)
  rel = np.asarray(robust.routing_relevant(probs, expert_probs, gates, labels))
  np.testing.assert_array_equal(rel, [False, True, False])
  losses = robust.mixture_nll(probs, labels)
  np.testing.assert_allclose(float(robust.filtered_tilted_loss(losses, jnp.asarray(rel), 2.0)),
                             float(losses.mean() + losses[1]), rtol=1e-6)
  none = jnp.zeros(3, bool)
  v, g = jax.value_and_grad(lambda l: robust.filtered_tilted_loss(l, none, 2.0))(losses)
  np.testing.assert_allclose(float(v), 2 * float(losses.mean()), rtol=1e-6)
  assert np.all(np.isfinite(np.asarray(g)))
