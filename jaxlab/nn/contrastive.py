"""Supervised contrastive learning: the SupCon loss with arbitrary positive masks, and a projection head.

`supcon_loss(z, positives, tau, weights)` is the "L_out" form of P. Khosla et al., "Supervised Contrastive
Learning", NeurIPS 2020 (eq. 2): for each anchor i with at least one positive,

    l_i = -1/|P(i)| sum_{p in P(i)} log( exp(z_i.z_p / tau) / sum_{a != i} exp(z_i.z_a / tau) ),

averaged over the anchors that have positives (weighted by `weights`, e.g. 0 for padded rows). Positives are any
boolean (B, B) mask (its diagonal is ignored): same class (`same_label_mask`), same class AND same stratum (SC-MILP's
same stratum + same branching decision), or an augmented view of the anchor (SimCLR's positives). Padded rows are
excluded from every denominator through `weights`.

`ProjectionHead`: Dense -> relu -> Dense then L2 normalisation, the SimCLR-style head used only by the auxiliary
loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def same_label_mask(*labels: jax.Array) -> jax.Array:
  """(B, B) mask of pairs equal in every given (B,) label array (e.g. stratum and decision)."""
  mask = None
  for lab in labels:
    m = lab[:, None] == lab[None, :]
    mask = m if mask is None else mask & m
  return mask


def supcon_loss(z: jax.Array, positives: jax.Array, tau: float = 0.1, weights: jax.Array | None = None
                ) -> jax.Array:
  """The supervised contrastive loss of normalised embeddings `z` (B, D) under a (B, B) positive mask.

  Args:
    z: embeddings, L2-normalised along the last axis (not re-normalised here).
    positives: bool (B, B); positives[i, j] means j is a positive of anchor i (the diagonal is ignored).
    tau: temperature.
    weights: optional (B,) weights; rows with weight 0 are neither anchors nor in any denominator.

  Returns:
    The weighted mean over anchors with >= 1 positive (0 when no anchor has one).
  """
  b = z.shape[0]
  w = jnp.ones((b,), z.dtype) if weights is None else jnp.asarray(weights, z.dtype)
  valid = w > 0
  not_self = ~jnp.eye(b, dtype=bool)
  others = not_self & valid[None, :]
  logits = (z @ z.T) / tau
  logits = jnp.where(others, logits, -jnp.inf)
  log_prob = logits - jax.nn.logsumexp(logits, axis=1, keepdims=True)
  pos = positives & others
  n_pos = pos.sum(1)
  per_anchor = -jnp.where(pos, log_prob, 0.0).sum(1) / jnp.maximum(n_pos, 1)
  anchor_w = jnp.where((n_pos > 0) & valid, w, 0.0)
  return (anchor_w * per_anchor).sum() / jnp.maximum(anchor_w.sum(), 1e-12)


class ProjectionHead(nnx.Module):
  """z = normalize(W2 relu(W1 h + b1) + b2): the auxiliary head whose outputs the contrastive loss sees."""

  def __init__(self, features: int, hidden: int, out: int, *, rngs: nnx.Rngs):
    self.fc1 = nnx.Linear(features, hidden, rngs=rngs)
    self.fc2 = nnx.Linear(hidden, out, rngs=rngs)

  def __call__(self, h: jax.Array) -> jax.Array:
    z = self.fc2(jax.nn.relu(self.fc1(h)))
    return z / jnp.maximum(jnp.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
