"""SC-MILP's training pieces: the ramped contrastive weight, coarse-to-fine node strata, the positive mask and the
joint loss (imitation + supervised contrast on node embeddings).

SC-MILP (Lu, Ma, Tao, "SC-MILP: Dynamic Stratified Contrastive Training Framework for MILP Branching", ICML 2026,
arXiv 2511.21107) publishes no code; its abstract names K-means strata of node feature distributions, "dynamic"
stratified contrastive training that progressively separates nodes across strata, and upstream-augmented
derivations. The schedule and loss below are OUR reconstruction (assumption):

* `lambda_at(step, num_steps, lam_max, ramp)`: the contrastive weight ramps linearly from 0 to `lam_max` over the
  first `ramp` share of the steps, then stays.
* `k_at(step, num_steps, k_start, k_final, ramp)`: the number of strata goes coarse to fine, from `k_start` to
  `k_final` over the first `ramp` share of the steps (a step function of the step).
* `DynamicStrata`: K-means fits (`strata.fit_strata`) for every k from `k_start` to the elbow's k on the training
  nodes' summary features (`node_feats`), made once; `labels(step)` are the samples' strata at a step and
  `assign(x, step)` those of new nodes. Re-estimating = switching to the next fit as k grows.
* `positive_mask(stratum, decision, origin)`: j is a positive of i when both are in the same stratum (and, when
  given, take the same branching decision), or when they are views of the same original node (an equivalent or
  perturbed instance of it: the strongest positives).
* `sc_loss(model, head, batch, lam, tau)`: `gcnn.imitation_loss + lam * contrastive.supcon_loss` of
  `head(model.node_embedding(batch))` under that mask; the batch carries "stratum" and optionally "decision"
  and "origin" (B,) int arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flax import nnx

from jaxlab.milp import gcnn, strata as strata_lib
from jaxlab.nn import contrastive


def _progress(step, num_steps: int, ramp: float):
  """min(1, step / (ramp * num_steps)): a float for an int step (no device work in a host loop), a float32 array
  for a traced one."""
  if not 0 <= ramp <= 1:
    raise ValueError(f"ramp={ramp} must be in [0, 1] (the share of the steps the schedule takes)")
  if ramp == 0 or num_steps <= 0:
    return 1.0
  if isinstance(step, (int, np.integer)):
    return min(max(step / (ramp * num_steps), 0.0), 1.0)
  return jnp.clip(jnp.asarray(step, jnp.float32) / (ramp * num_steps), 0.0, 1.0)


def lambda_at(step, num_steps: int, lam_max: float, ramp: float = 0.3):
  """The contrastive weight at `step` (an int or a traced scalar): lam_max * min(1, step / (ramp * num_steps))."""
  return lam_max * _progress(step, num_steps, ramp)


def k_at(step: int, num_steps: int, k_start: int, k_final: int, ramp: float = 0.5) -> int:
  """The number of strata at `step`: k_start at step 0, k_final from step ramp * num_steps on, linear between
  (rounded down)."""
  if not 1 <= k_start <= k_final:
    raise ValueError(f"need 1 <= k_start={k_start} <= k_final={k_final}")
  return int(k_start + np.floor((k_final - k_start) * _progress(int(step), num_steps, ramp) + 1e-6))


@dataclasses.dataclass
class DynamicStrata:
  """Coarse-to-fine strata of training nodes: one K-means fit per k (k_start..k_final), the elbow choosing k_final.

  Attributes:
    fits: {k: strata.Strata} for every k in k_start..k_final.
    train_labels: {k: (N,) stratum ids of the training nodes} (stratum 0 = the shallowest on average).
    num_steps, ramp: the schedule (see `k_at`).
  """
  fits: dict
  train_labels: dict
  num_steps: int
  ramp: float

  @classmethod
  def fit(cls, node_feats: np.ndarray, depth: np.ndarray, num_steps: int, *, k_start: int = 2,
          ks: Sequence[int] = tuple(range(2, 9)), k_final: int | None = None, ramp: float = 0.5,
          seed: int = 0) -> DynamicStrata:
    """Fits the strata on (N, F) summary features; `k_final` None: the elbow over `ks` (each k fitted once)."""
    x = np.asarray(node_feats, np.float64)
    fits = {}
    if k_final is None:
      tried = [k for k in ks if k <= len(x)]
      fits = {k: strata_lib.fit_strata(x, depth, seed=seed, k=k) for k in tried}
      inertias = [fits[k].inertias[k] for k in tried]
      k_final = strata_lib.elbow(inertias, tried) if len(tried) >= 3 else tried[0]
    k_final = max(k_final, k_start)
    fits = {k: fits.get(k) or strata_lib.fit_strata(x, depth, seed=seed, k=k) for k in range(k_start, k_final + 1)}
    labels = {k: f.assign(x) for k, f in fits.items()}
    return cls(fits, labels, num_steps, ramp)

  @property
  def k_start(self) -> int:
    return min(self.fits)

  @property
  def k_final(self) -> int:
    return max(self.fits)

  def k(self, step: int) -> int:
    return k_at(step, self.num_steps, self.k_start, self.k_final, self.ramp)

  def labels(self, step: int) -> np.ndarray:
    """(N,) strata of the training nodes at `step`."""
    return self.train_labels[self.k(step)]

  def assign(self, node_feats: np.ndarray, step: int | None = None) -> np.ndarray:
    """(N,) strata of new nodes at `step` (None: the final, finest strata)."""
    k = self.k_final if step is None else self.k(step)
    return self.fits[k].assign(np.asarray(node_feats, np.float64))


def positive_mask(stratum: jax.Array, decision: jax.Array | None = None, origin: jax.Array | None = None
                  ) -> jax.Array:
  """(B, B) positives: same stratum (AND same decision when given) OR same origin (views of one node)."""
  mask = contrastive.same_label_mask(stratum) if decision is None else contrastive.same_label_mask(stratum, decision)
  if origin is not None:
    mask = mask | contrastive.same_label_mask(origin)
  return mask


def sc_loss(model: gcnn.BipartiteGCNN, head: contrastive.ProjectionHead, batch: Mapping[str, Any], lam,
            tau: float = 0.1, ties: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Imitation loss + lam * SupCon on the projected node embeddings.

  Args:
    model, head: the GCNN and the projection head (only the auxiliary loss sees the head).
    batch: a packed batch (`gcnn.pack`) with "stratum" (B,) ints and optionally "decision" and "origin" (B,).
    lam: the contrastive weight (`lambda_at`; a traced scalar is fine).
    tau: SupCon temperature.
    ties: `gcnn.imitation_loss`'s tie handling.

  Returns:
    (loss, metrics): the imitation metrics plus "contrastive" (the unweighted SupCon term) and "lambda".
  """
  logits, emb = model.logits_and_embedding(batch)                        # one encoder pass for both terms
  loss, metrics = gcnn.imitation_loss(lambda *graph: logits, batch, ties=ties)
  z = head(emb)
  pos = positive_mask(batch["stratum"], batch.get("decision"), batch.get("origin"))
  con = contrastive.supcon_loss(z, pos, tau, weights=batch["sample_weight"])
  lam = jnp.asarray(lam, loss.dtype)
  return loss + lam * con, dict(metrics, contrastive=con, **{"lambda": lam})


class GCNNWithHead(nnx.Module):
  """The GCNN (`gcnn`) and the contrastive projection head (`head`, on its (2 emb) node embedding) as one module,
  for the training state; the GCNN is built first from the same rngs, so its initialisation does not depend on
  whether the head is used."""

  def __init__(self, row_dim: int, col_dim: int, edge_dim: int, *, emb: int, proj_dim: int, rngs: nnx.Rngs):
    self.gcnn = gcnn.BipartiteGCNN(row_dim, col_dim, edge_dim, emb=emb, rngs=rngs)
    self.head = contrastive.ProjectionHead(2 * emb, 2 * emb, proj_dim, rngs=rngs)
