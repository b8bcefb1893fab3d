"""Learn2branch's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/learn2branch/config.py:full

The full run trains the GCNN on packed batches padded to one bucket (`jaxlab.milp.imitation.buckets`: powers of two
over every collected sample). The buckets come from the data, which compile_check does not collect: `BUCKETS` holds
those of Gasse's set cover 500 x 1000 with root cuts (a probe of 39 instances under the full collection settings,
355 samples, gave at most 534 LP rows, 1000 columns, 46.8k nonzeros and 111 candidates).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxlab import compile_check
from jaxlab.milp import gcnn, imitation
from jaxlab.milp.scip_env import COL_FEATURES, EDGE_FEATURES, ROW_FEATURES

from .train import _loss_fn, make_model

TOPOLOGY = "v5e-4"
# {"R": LP rows, "C": columns, "E": nonzeros, "K": branching candidates} of set cover 500 x 1000 + root cuts.
BUCKETS = {"R": 1024, "C": 1024, "E": 65536, "K": 128}


def gcnn_batch(batch_size: int, sizes=None) -> dict:
  """The abstract packed batch (`gcnn.pack`) of `batch_size` graphs padded to `sizes` (default `BUCKETS`)."""
  sizes = dict(sizes or BUCKETS)
  r, c, e, k = (sizes[x] for x in "RCEK")
  one = {"row_feats": np.zeros((r, len(ROW_FEATURES)), np.float32),
         "col_feats": np.zeros((c, len(COL_FEATURES)), np.float32),
         "edge_index": np.zeros((2, e), np.int32), "edge_feats": np.zeros((e, len(EDGE_FEATURES)), np.float32),
         "cands": np.zeros(k, np.int32), "scores": np.zeros(k, np.float32), "depth": 0}
  packed = gcnn.pack([one] * batch_size, sizes)    # numpy, host side: the real batch's shapes and dtypes
  return {name: jax.ShapeDtypeStruct(v.shape, v.dtype) for name, v in packed.items()}


def gcnn_flops(emb: int, batch_size: int, sizes=None, backward: bool = True) -> float:
  """Matmul FLOPs of the GCNN on padded graphs: 2 x sum over layers of (rows it is applied to) x fan_in x fan_out
  (row / column embeddings, per half convolution the target / source / message / output layers on nodes and the
  edge layer on edges, the head on columns), x3 with the backward pass, x batch_size."""
  sizes = dict(sizes or BUCKETS)
  r, c, e = sizes["R"], sizes["C"], sizes["E"]
  fr, fc, fe = len(ROW_FEATURES), len(COL_FEATURES), len(EDGE_FEATURES)
  embed = r * (fr + emb) * emb + c * (fc + emb) * emb

  def half(nt, ns):  # target, source, message (after the sum), out1 (2 emb -> emb), out2; edge features
    return nt * emb * emb + ns * emb * emb + nt * emb * emb + nt * 3 * emb * emb + e * fe * emb
  macs = embed + half(r, c) + half(c, r) + c * (emb * emb + emb)
  return (6.0 if backward else 2.0) * macs * batch_size


def compile_targets(config):
  """The imitation train step at train.batch_size graphs and the acc@k evaluation step at eval.batch_size."""
  dims = (len(ROW_FEATURES), len(COL_FEATURES), len(EDGE_FEATURES))
  model_fn = lambda rngs: make_model(config, dims, rngs)  # noqa: E731
  b, emb = int(config.train.batch_size), int(config.model.emb)
  train = compile_check.train_target(config, model_fn, _loss_fn(config.method.loss == "ties"), gcnn_batch(b),
                                     model_flops=gcnn_flops(emb, b))
  ks = tuple(int(k) for k in config.eval.ks)
  eb = int(config.eval.batch_size)
  evaluate = compile_check.forward_target("eval_step", train, model_fn, imitation._eval_fn(ks), (gcnn_batch(eb),),
                                          model_flops=gcnn_flops(emb, eb, backward=False))
  return [train, evaluate]
