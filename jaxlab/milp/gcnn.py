"""Bipartite graph convolutional policy for learned MILP branching (Gasse et al., NeurIPS 2019, "Exact
Combinatorial Optimization with Graph Convolutional Neural Networks"), with host-side padding into static
power-of-two buckets so a jitted forward compiles once per bucket, not once per branch-and-bound node.

A node's LP is a bipartite graph: rows (constraints) and columns (variables) are the two vertex sets, the
nonzeros of the constraint matrix are edges. The model embeds rows, columns and edges, runs two half
convolutions (columns -> rows, then rows -> columns) and scores every column; the scores of the branching
candidates are trained with cross-entropy against the strong-branching argmax (`imitation_loss`).

Architecture, as in the paper (Sec. 4, "Policy parametrization", and its supplementary material):

* `PreNorm` layers: an affine map y = (x - shift) * scale whose shift / scale are NOT trained but fitted from
  the training data before training (`fit_prenorm`, the paper's "pre-training" of these layers), layer by layer
  in forward order. They are stored as `PreNormStat` variables (model state, not parameters).
* row / column embedding: PreNorm(F), Dense(emb), relu, Dense(emb), relu; edge embedding: PreNorm(Fe) only.
* a half convolution onto targets i from sources j over edges (i, j):
    message_ij = Dense(emb)(relu(PreNorm_1(W_t h_i + b + W_e e_ij + W_s h_j)))
    agg_i      = sum_j message_ij                     (a sum, as in the paper, not a mean)
    out_i      = Dense(emb)(relu(Dense(emb)(concat(PreNorm_1(agg_i), h_i))))
  followed by a relu in the policy. PreNorm_1 is a scale-only PreNorm with one unit shared by all `emb`
  features (the paper's normalisation of the un-normalised sum, needed because node degrees vary by orders
  of magnitude). The single bias sits on the target term; since every edge gets exactly one copy of it, where
  it sits does not change the function.
* head per column: Dense(emb), relu, Dense(1, no bias). All Dense kernels use orthogonal init, biases zero.

Choices where the paper leaves room: the output module of a half convolution is Dense, relu, Dense on
concat(normalised sum, target embedding), and the policy applies a relu after each half convolution; the
scale-only PreNorm's scale is 1 / std (std about the mean, though no shift is applied); PreNorm subtracts a
stored mean (rather than adding a stored negated mean); the three input PreNorms, which do not depend on each
other, are fitted in one pass; a unit with (numerically) zero std keeps scale 1.

Batches are padded (`pack`): R, C, E, K are powers of two; padded edges point at node 0 and are masked
(their messages are multiplied by zero), padded rows / columns receive no messages and are masked out of
every statistic. Dense layers act on the (B, N, F) arrays directly; gathers and `segment_sum`s (static
`num_segments` = R or C) are `jax.vmap`ped over graphs, so the batch axis stays explicit and a batch sharded
over a data-parallel mesh axis needs no communication (`pad_batch` makes B divide that axis).
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

GRAPH_KEYS = ("row_feats", "col_feats", "edge_index", "edge_feats", "edge_mask")
MASKED_LOGIT = -1e30     # finite: softmax weights and gradients of padded candidates are exactly zero, never NaN
MIN_BUCKET = 8
# Fill values of padded slots (everything else pads with zeros / False).
PAD_VALUES = {"scores": -np.inf}

_TRACES: collections.Counter = collections.Counter()


def trace_count(name: str) -> int:
  """How many times the jitted function `name` ("col_logits" or "predict") has been traced (compiled)."""
  return _TRACES[name]


# -------------------------------------------------------------------------------------------------- layers


class PreNormStat(nnx.Variable):
  """Shift or scale of a `PreNorm` layer: fitted from data by `fit_prenorm`, never trained by the optimizer."""


class PreNorm(nnx.Module):
  """y = (x - shift) * scale over the trailing axis (`features` units; 1 unit broadcasts over all features).

  Args:
    features: number of units (1 = one statistic shared by every feature).
    shift: whether the layer has a shift (scale-only layers keep the sign and the zero of their input).
  """

  def __init__(self, features: int, shift: bool = True):
    self.features = features
    self.shift = PreNormStat(jnp.zeros((features,), jnp.float32)) if shift else None
    self.scale = PreNormStat(jnp.ones((features,), jnp.float32))

  def __call__(self, x: jax.Array) -> jax.Array:
    if self.shift is not None:
      x = x - self.shift[...]
    return x * self.scale[...]


def _dense(fan_in: int, fan_out: int, rngs: nnx.Rngs, use_bias: bool = True) -> nnx.Linear:
  return nnx.Linear(fan_in, fan_out, use_bias=use_bias, kernel_init=nnx.initializers.orthogonal(),
                    bias_init=nnx.initializers.zeros_init(), rngs=rngs)


class HalfConv(nnx.Module):
  """One half of Gasse's bipartite convolution: messages from sources j to targets i along edges (i, j).

  Args:
    emb: embedding size of both node sets.
    edge_dim: edge feature size.
    rngs: initialisation randomness.
  """

  def __init__(self, emb: int, edge_dim: int, *, rngs: nnx.Rngs):
    self.target = _dense(emb, emb, rngs)
    self.edge = _dense(edge_dim, emb, rngs, use_bias=False)
    self.source = _dense(emb, emb, rngs, use_bias=False)
    self.msg_norm = PreNorm(1, shift=False)
    self.msg = _dense(emb, emb, rngs)
    self.agg_norm = PreNorm(1, shift=False)
    self.out1 = _dense(2 * emb, emb, rngs)
    self.out2 = _dense(emb, emb, rngs)

  def __call__(self, h_tgt: jax.Array, h_src: jax.Array, edges: jax.Array, tgt: jax.Array, src: jax.Array,
               mask: jax.Array, taps: dict | None = None, prefix: str = "") -> jax.Array:
    """h_tgt (B, Nt, emb), h_src (B, Ns, emb), edges (B, E, Fe), tgt / src (B, E) indices, mask (B, E) ->
    (B, Nt, emb)."""
    joint = _gather(self.target(h_tgt), tgt) + self.edge(edges) + _gather(self.source(h_src), src)
    act = jax.nn.relu(_tapped(self.msg_norm, joint, taps, f"{prefix}msg_norm"))
    m = mask[..., None].astype(act.dtype)
    # Gasse's per-edge Dense(emb) of the message, summed over the edges, is linear: sum_e (a_e W + b) =
    # (sum_e a_e) W + deg b. Applying it after the scatter is the same function at 1/E of the matmul cost.
    agg = _scatter_sum(act * m, tgt, h_tgt.shape[1]) @ self.msg.kernel[...]
    agg = agg + _scatter_sum(m, tgt, h_tgt.shape[1]) * self.msg.bias[...]
    agg = _tapped(self.agg_norm, agg, taps, f"{prefix}agg_norm")
    return self.out2(jax.nn.relu(self.out1(jnp.concatenate([agg, h_tgt], axis=-1))))


def _gather(h: jax.Array, idx: jax.Array) -> jax.Array:
  """(B, N, F), (B, E) -> (B, E, F): per-graph rows of h."""
  return jax.vmap(lambda a, i: a[i])(h, idx)


def _scatter_sum(x: jax.Array, idx: jax.Array, num: int) -> jax.Array:
  """(B, E, F), (B, E) -> (B, num, F): per-graph sums of x onto segments idx (`num` static)."""
  return jax.vmap(lambda a, i: jax.ops.segment_sum(a, i, num_segments=num))(x, idx)


def _tapped(layer: PreNorm, x: jax.Array, taps: dict | None, name: str) -> jax.Array:
  """Applies a PreNorm layer, recording its input under `name` when `taps` is given (for `fit_prenorm`)."""
  if taps is not None:
    taps[name] = x
  return layer(x)


class BipartiteGCNN(nnx.Module):
  """Gasse et al.'s GCNN branching policy on padded bipartite graphs.

  Calls take either one padded graph (row_feats (R, Fr), ..., -> (C,)) or a batch with a leading B axis
  (row_feats (B, R, Fr), ..., -> (B, C)).

  Args:
    row_dim, col_dim, edge_dim: feature sizes Fr, Fc, Fe (see `from_data`).
    emb: embedding size (64 in the paper).
    rngs: initialisation randomness (not stored).
  """

  def __init__(self, row_dim: int, col_dim: int, edge_dim: int, *, emb: int = 64, rngs: nnx.Rngs):
    self.emb = emb
    self.row_norm, self.col_norm, self.edge_norm = PreNorm(row_dim), PreNorm(col_dim), PreNorm(edge_dim)
    self.row_fc1, self.row_fc2 = _dense(row_dim, emb, rngs), _dense(emb, emb, rngs)
    self.col_fc1, self.col_fc2 = _dense(col_dim, emb, rngs), _dense(emb, emb, rngs)
    self.conv_c2r = HalfConv(emb, edge_dim, rngs=rngs)
    self.conv_r2c = HalfConv(emb, edge_dim, rngs=rngs)
    self.head1 = _dense(emb, emb, rngs)
    self.head2 = _dense(emb, 1, rngs, use_bias=False)

  @classmethod
  def from_data(cls, data: Mapping[str, Any], *, emb: int = 64, rngs: nnx.Rngs) -> BipartiteGCNN:
    """A model sized by the trailing feature axes of a sample or a packed batch."""
    return cls(data["row_feats"].shape[-1], data["col_feats"].shape[-1], data["edge_feats"].shape[-1], emb=emb,
               rngs=rngs)

  def _encode(self, row_feats, col_feats, edge_index, edge_feats, edge_mask, taps=None):
    """Batched final (cols (B, C, emb), rows (B, R, emb)) embeddings."""
    rows = _tapped(self.row_norm, row_feats, taps, "row_norm")
    rows = jax.nn.relu(self.row_fc2(jax.nn.relu(self.row_fc1(rows))))
    cols = _tapped(self.col_norm, col_feats, taps, "col_norm")
    cols = jax.nn.relu(self.col_fc2(jax.nn.relu(self.col_fc1(cols))))
    edges = _tapped(self.edge_norm, edge_feats, taps, "edge_norm")
    ridx, cidx = edge_index[:, 0], edge_index[:, 1]
    rows = jax.nn.relu(self.conv_c2r(rows, cols, edges, ridx, cidx, edge_mask, taps, "conv_c2r."))
    cols = jax.nn.relu(self.conv_r2c(cols, rows, edges, cidx, ridx, edge_mask, taps, "conv_r2c."))
    return cols, rows

  def embeddings(self, row_feats, col_feats, edge_index, edge_feats, edge_mask) -> tuple[jax.Array, jax.Array]:
    """Final node embeddings (cols (B, C, emb), rows (B, R, emb)); unbatched inputs give (C, emb), (R, emb)."""
    graph = (row_feats, col_feats, edge_index, edge_feats, edge_mask)
    if row_feats.ndim == 2:
      cols, rows = self._encode(*(jnp.asarray(x)[None] for x in graph))
      return cols[0], rows[0]
    return self._encode(*graph)

  def _logits(self, cols: jax.Array) -> jax.Array:
    return self.head2(jax.nn.relu(self.head1(cols)))[..., 0]

  def __call__(self, row_feats, col_feats, edge_index, edge_feats, edge_mask) -> jax.Array:
    """Column logits (B, C) (or (C,) for one unbatched graph)."""
    cols, _ = self.embeddings(row_feats, col_feats, edge_index, edge_feats, edge_mask)
    return self._logits(cols)

  def node_embedding(self, batch: Mapping[str, Any]) -> jax.Array:
    """(B, 2 * emb) graph embedding: masked mean of column embeddings || masked mean of row embeddings."""
    return self.logits_and_embedding(batch)[1]

  def logits_and_embedding(self, batch: Mapping[str, Any]) -> tuple[jax.Array, jax.Array]:
    """(column logits (B, C), node embedding (B, 2 * emb)) of a packed batch from one encoder pass."""
    cols, rows = self.embeddings(*(batch[k] for k in GRAPH_KEYS))
    emb = jnp.concatenate([_masked_mean(cols, batch["col_mask"]), _masked_mean(rows, batch["row_mask"])], -1)
    return self._logits(cols), emb


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  m = jnp.asarray(mask, x.dtype)[..., None]
  return (x * m).sum(-2) / jnp.maximum(m.sum(-2), 1.0)


# ------------------------------------------------------------------------------------------ PreNorm fitting

# Each stage's layers only read layers of earlier stages, so fitting stage by stage (one pass over the data
# each) is the paper's layer-by-layer procedure; the three input layers are independent and share a pass.
# Entries: (layer path, mask key of the entries its input is indexed by).
PRENORM_STAGES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("row_norm", "row_mask"), ("col_norm", "col_mask"), ("edge_norm", "edge_mask")),
    (("conv_c2r.msg_norm", "edge_mask"),),
    (("conv_c2r.agg_norm", "row_mask"),),
    (("conv_r2c.msg_norm", "edge_mask"),),
    (("conv_r2c.agg_norm", "col_mask"),),
)
_PRENORM_MASKS = {name: key for stage in PRENORM_STAGES for name, key in stage}


def _layer(model: nnx.Module, path: str) -> PreNorm:
  return functools.reduce(getattr, path.split("."), model)


@nnx.jit
def _prenorm_batch_stats(model: BipartiteGCNN, graph: dict, masks: dict) -> dict:
  """Per PreNorm layer: (count, mean, centered sum of squares) of its input over real entries, per unit."""
  taps: dict = {}
  model._encode(*(graph[k] for k in GRAPH_KEYS), taps=taps)
  out = {}
  for name, x in taps.items():
    units = _layer(model, name).features
    w = jnp.broadcast_to(masks[_PRENORM_MASKS[name]].reshape(x.shape[:-1])[..., None], x.shape)
    x, w = x.reshape(-1, units), w.reshape(-1, units).astype(x.dtype)
    n = w.sum(0)
    mean = (w * x).sum(0) / jnp.maximum(n, 1.0)
    out[name] = (n, mean, (w * (x - mean) ** 2).sum(0))
  return out


def fit_prenorm(model: BipartiteGCNN, batches: Iterable[Mapping[str, Any]], rel_tol: float = 1e-6) -> BipartiteGCNN:
  """Sets every PreNorm's shift (mean) and scale (1 / std) from packed training batches, in forward order.

  Stage by stage (`PRENORM_STAGES`), one pass over `batches` per stage: the inputs of a stage's layers are
  computed with the already-fitted earlier layers; statistics cover real rows / columns / edges only and are
  merged across batches in float64 (Chan et al.'s pairwise update). A unit whose std is zero (below
  `rel_tol * max(1, |mean|)`, float32 noise of a constant feature) keeps scale 1; a layer that saw no entry
  keeps its values.

  Args:
    model: the model (updated in place and returned).
    batches: packed batches (`pack`); iterated once per stage, so it is first made a list.
    rel_tol: relative threshold under which a std counts as zero.
  """
  batches = list(batches)
  for stage in PRENORM_STAGES:
    acc = {name: (0.0, 0.0, 0.0) for name, _ in stage}
    for batch in batches:
      graph = {k: batch[k] for k in GRAPH_KEYS}
      masks = {k: batch[k] for k in ("row_mask", "col_mask", "edge_mask")}
      stats = _prenorm_batch_stats(model, graph, masks)
      for name, _ in stage:
        nb, mb, m2b = (np.asarray(s, np.float64) for s in stats[name])
        na, ma, m2a = acc[name]
        n = na + nb
        delta = mb - ma
        safe = np.maximum(n, 1.0)
        acc[name] = (n, ma + delta * nb / safe, m2a + m2b + delta ** 2 * na * nb / safe)
    for name, _ in stage:
      n, mean, m2 = (np.broadcast_to(a, (_layer(model, name).features,)) for a in acc[name])
      if not np.all(n > 0):
        continue
      std = np.sqrt(m2 / n)
      scale = np.where(std > rel_tol * np.maximum(1.0, np.abs(mean)), 1.0 / np.where(std > 0, std, 1.0), 1.0)
      layer = _layer(model, name)
      if layer.shift is not None:
        layer.shift[...] = jnp.asarray(mean, jnp.float32)
      layer.scale[...] = jnp.asarray(scale, jnp.float32)
  return model


# ------------------------------------------------------------------------------------- padding and batching


def bucket(x: int) -> int:
  """The next power of two >= max(x, 8)."""
  return max(MIN_BUCKET, 1 << max(0, int(x) - 1).bit_length())


def _full(shape: Sequence[int], key: str, dtype) -> np.ndarray:
  return np.full(shape, PAD_VALUES.get(key, 0), dtype)


def pack(samples: Sequence[Mapping[str, Any]], sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
  """Pads and stacks unpadded node samples into one batch (numpy, host side).

  Args:
    samples: dicts with row_feats (m, Fr), col_feats (n, Fc), edge_index (2, E) (row ids, col ids),
      edge_feats (E, Fe), cands (k,), scores (k,), depth ().
    sizes: optional forced buckets {"R", "C", "E", "K"} (each >= the batch's maximum); missing ones are
      `bucket(max over the batch)`.

  Returns:
    row_feats (B, R, Fr), row_mask (B, R), col_feats (B, C, Fc), col_mask (B, C), edge_index (B, 2, E)
    (padded edges point at node 0), edge_feats (B, E, Fe), edge_mask (B, E), cands (B, K) (padded: 0),
    cand_mask (B, K), scores (B, K) (padded: -inf), label (B,) (index in cands of the first best score),
    depth (B,), sample_weight (B,) (1, or 0 for a sample without candidates). Masks are bool.
  """
  if not samples:
    raise ValueError("pack needs at least one sample")
  dims = {"R": [s["row_feats"].shape[0] for s in samples], "C": [s["col_feats"].shape[0] for s in samples],
          "E": [s["edge_index"].shape[1] for s in samples], "K": [len(s["cands"]) for s in samples]}
  sizes = dict(sizes or {})
  size = {}
  for k, v in dims.items():
    size[k] = int(sizes.get(k) or bucket(max(v)))
    if size[k] < max(v):
      raise ValueError(f"pack: sizes[{k!r}]={size[k]} is smaller than the batch's largest graph ({max(v)})")
  B, (R, C, E, K) = len(samples), (size[k] for k in "RCEK")
  s0 = samples[0]
  fr, fc, fe = s0["row_feats"].shape[1], s0["col_feats"].shape[1], s0["edge_feats"].shape[1]
  shapes = {"row_feats": ((R, fr), np.float32), "row_mask": ((R,), bool), "col_feats": ((C, fc), np.float32),
            "col_mask": ((C,), bool), "edge_index": ((2, E), np.int32), "edge_feats": ((E, fe), np.float32),
            "edge_mask": ((E,), bool), "cands": ((K,), np.int32), "cand_mask": ((K,), bool),
            "scores": ((K,), np.float32), "label": ((), np.int32), "depth": ((), np.int32),
            "sample_weight": ((), np.float32)}
  out = {k: _full((B,) + shape, k, dtype) for k, (shape, dtype) in shapes.items()}
  for b, s in enumerate(samples):
    m, n, e, k = (dims[x][b] for x in "RCEK")
    out["row_feats"][b, :m], out["row_mask"][b, :m] = s["row_feats"], True
    out["col_feats"][b, :n], out["col_mask"][b, :n] = s["col_feats"], True
    out["edge_index"][b, :, :e], out["edge_feats"][b, :e] = s["edge_index"], s["edge_feats"]
    out["edge_mask"][b, :e] = True
    out["cands"][b, :k], out["cand_mask"][b, :k], out["scores"][b, :k] = s["cands"], True, s["scores"]
    out["label"][b] = int(np.argmax(s["scores"])) if k else 0
    out["depth"][b] = int(s.get("depth", 0))
    out["sample_weight"][b] = 1.0 if k else 0.0
  return out


def pad_batch(batch: Mapping[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Appends empty graphs (all masks False, weight 0) so the batch size divides `multiple`."""
  b = len(batch["sample_weight"])
  extra = -b % int(multiple)
  if not extra:
    return dict(batch)
  return {k: np.concatenate([np.asarray(v), _full((extra,) + np.shape(v)[1:], k, np.asarray(v).dtype)])
          for k, v in batch.items()}


# ------------------------------------------------------------------------------------------ losses, metrics


def col_logits(model: BipartiteGCNN, batch: Mapping[str, Any]) -> jax.Array:
  """(B, C) column logits of a packed batch."""
  return model(*(batch[k] for k in GRAPH_KEYS))


def candidate_logits(logits: jax.Array, cands: jax.Array, cand_mask: jax.Array) -> jax.Array:
  """(B, K) logits of the candidates; padded slots are `MASKED_LOGIT` (finite, so losses stay NaN-free)."""
  return jnp.where(cand_mask, jnp.take_along_axis(logits, cands, axis=-1), MASKED_LOGIT)


def topk_accuracy(cand_logits: jax.Array, scores: jax.Array, cand_mask: jax.Array,
                  ks: Sequence[int] = (1, 5, 10)) -> dict[int, jax.Array]:
  """Gasse's top-k accuracy per sample: {k: (B,) float}, 1 where the best true score among the k highest-scored
  real candidates equals the best true score of all real candidates (ties count as correct). With fewer than k
  real candidates all of them count (so it is 1); a sample without candidates scores 0."""
  logits = jnp.where(cand_mask, cand_logits, -jnp.inf)
  true = jnp.where(cand_mask, scores, -jnp.inf)
  best = true.max(-1, keepdims=True)
  kmax = min(max(ks), logits.shape[-1])
  _, order = jax.lax.top_k(logits, kmax)    # padded slots sort last; their true score is -inf
  picked = jnp.take_along_axis(true, order, axis=-1)
  real = cand_mask.any(-1)
  return {k: (jnp.any(picked[:, :min(k, kmax)] >= best, -1) & real).astype(jnp.float32) for k in ks}


def imitation_loss(model: BipartiteGCNN, batch: Mapping[str, Any], ties: bool = False
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Weighted mean softmax cross-entropy of candidate logits against the strong-branching label.

  Args:
    model, batch: the GCNN and a packed batch.
    ties: False: cross-entropy against the first best candidate (Gasse et al. 2019). True: the negative log of the
      probability mass on the set of best candidates, -log sum_{j best} p_j (the likelihood of the event that
      acc@1 scores, so tied best candidates are not arbitrary labels).

  Returns:
    (loss, metrics): metrics "loss", "acc1", "acc5", "acc10" (Gasse's top-k accuracies, weighted means).
  """
  cl = candidate_logits(col_logits(model, batch), batch["cands"], batch["cand_mask"])
  w = jnp.asarray(batch["sample_weight"], cl.dtype)
  denom = jnp.maximum(w.sum(), 1e-12)
  if ties:
    logp = jax.nn.log_softmax(cl, axis=-1)
    scores = batch["scores"]
    best = batch["cand_mask"] & (scores >= jnp.max(scores, axis=-1, keepdims=True))
    best = best | (jnp.arange(cl.shape[-1]) == batch["label"][:, None]) & ~best.any(-1, keepdims=True)
    per = -jax.nn.logsumexp(jnp.where(best, logp, -jnp.inf), axis=-1)
  else:
    per = optax.softmax_cross_entropy_with_integer_labels(cl, batch["label"])
  loss = (w * per).sum() / denom
  acc = topk_accuracy(jax.lax.stop_gradient(cl), batch["scores"], batch["cand_mask"])
  metrics = {"loss": loss, **{f"acc{k}": (w * v).sum() / denom for k, v in acc.items()}}
  return loss, metrics


# -------------------------------------------------------------------------------------------------- jitted


@nnx.jit
def jit_col_logits(model: BipartiteGCNN, graph: dict) -> jax.Array:
  """Jitted `col_logits` on the GRAPH_KEYS of a packed batch (compiled once per bucket; see `trace_count`)."""
  _TRACES["col_logits"] += 1
  return col_logits(model, graph)


@nnx.jit
def _predict_batch(model: BipartiteGCNN, graph: dict) -> jax.Array:
  _TRACES["predict"] += 1
  cl = candidate_logits(col_logits(model, graph), graph["cands"], graph["cand_mask"])
  return jnp.take_along_axis(graph["cands"], jnp.argmax(cl, -1)[:, None], axis=-1)[:, 0]


def predict(model: BipartiteGCNN, sample: Mapping[str, Any]) -> int:
  """The column id of the best-scored candidate of one unpadded sample (jitted; one compile per bucket)."""
  batch = pack([sample])
  return int(_predict_batch(model, {k: batch[k] for k in GRAPH_KEYS + ("cands", "cand_mask")})[0])
