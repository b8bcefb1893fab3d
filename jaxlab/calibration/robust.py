"""The adversarial reweighting of calibrated MoEs (Wong et al., "Toward Calibrated Mixture-of-Experts Under
Distribution Shift", ICML 2026, arXiv 2606.20544), as its public code computes it (ginawong/calibrated_moe,
`training.py`): an adversary that reweights the examples of a minibatch to maximise the mixture's proper loss,
penalised by the KL divergence of its weights from uniform, has the closed form q_i ∝ exp(eta l_i) (an
exponential tilt), and the model minimises sum_i q_i l_i.

* `tilted_loss`: sum_i softmax(eta l)_i l_i over the batch. The official code does not stop the gradient
  through the weights (`detach=False`, the default), so the gradient is sum_i q_i (1 + eta (l_i - sum_j q_j l_j))
  grad l_i; `detach=True` gives the tilted-ERM gradient sum_i q_i grad l_i.
* `routing_relevant`: the "filtered" variant's mask: an example counts when the mixture's loss exceeds the best
  single expert's (regret > tol) or when the experts disagree under the router (sum_k g_k ||p_k - p||^2 > tau).
* `filtered_tilted_loss`: mean loss over the batch + the tilted loss over the relevant examples only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def tilted_weights(losses: jax.Array, eta: float, mask: jax.Array | None = None) -> jax.Array:
  """softmax(eta * losses) over the batch (over the rows where `mask` is true; zero elsewhere)."""
  z = eta * losses
  if mask is not None:       # a large finite floor, not -inf: an all-masked batch stays finite (and uniform)
    z = jnp.where(mask, z, -1e30)
  return jax.nn.softmax(z)


def tilted_loss(losses: jax.Array, eta: float, detach: bool = False) -> jax.Array:
  """sum_i q_i l_i with q = softmax(eta l): the mean at eta = 0, the maximum as eta -> inf."""
  q = tilted_weights(losses, eta)
  if detach:
    q = jax.lax.stop_gradient(q)
  return jnp.sum(q * losses)


def mixture_nll(probs: jax.Array, labels: jax.Array, eps: float = 1e-12) -> jax.Array:
  """Per-example -log p(y | x) of a mixture's probabilities (batch, C)."""
  return -jnp.log(jnp.take_along_axis(probs, labels[:, None], axis=-1)[:, 0] + eps)


def routing_relevant(probs: jax.Array, expert_probs: jax.Array, gates: jax.Array, labels: jax.Array,
                     regret_tol: float = 1e-6, disagreement_tol: float = 0.01) -> jax.Array:
  """(batch,) bool: the mixture is worse than its best expert, or the routed experts disagree."""
  l_mix = mixture_nll(probs, labels)
  l_exp = jax.vmap(mixture_nll, in_axes=(1, None), out_axes=1)(expert_probs, labels)     # (batch, K)
  regret = jax.nn.relu(l_mix - jnp.min(l_exp, axis=-1))
  disagreement = jnp.sum(gates * jnp.sum((expert_probs - probs[:, None, :]) ** 2, axis=-1), axis=-1)
  return (regret > regret_tol) | (disagreement > disagreement_tol)


def filtered_tilted_loss(losses: jax.Array, relevant: jax.Array, eta: float, detach: bool = False) -> jax.Array:
  """mean_i l_i + sum_{i relevant} q_i l_i (q the tilt over the relevant rows); with no relevant row the second
  term is the plain mean (as the official code falls back)."""
  q = tilted_weights(losses, eta, relevant)
  q = jnp.where(jnp.any(relevant), q, jnp.full_like(losses, 1.0 / losses.shape[0]))
  if detach:
    q = jax.lax.stop_gradient(q)
  return jnp.mean(losses) + jnp.sum(q * losses)
