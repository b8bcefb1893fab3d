"""SC-MILP's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/sc_milp/config.py:full

The full run trains each arm's GCNN (+ projection head) on packed batches padded to one bucket over the training,
test and derived upstream samples; the derived instances keep the set cover's shape, so the buckets are those of
learn2branch's full data (`experiments/learn2branch/aot.py`: set cover 500 x 1000 with root cuts).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab.experiments.learn2branch.aot import BUCKETS, gcnn_batch, gcnn_flops
from jaxlab import compile_check
from jaxlab.milp import imitation
from jaxlab.milp.scip_env import COL_FEATURES, EDGE_FEATURES, ROW_FEATURES

from .train import _loss_fn, make_model

TOPOLOGY = "v5e-4"


def arm_batch(batch_size: int) -> dict:
  """An arm's step batch: the packed graphs, each sample's stratum (contrastive arms) and the weight lambda(t)."""
  b = gcnn_batch(batch_size, BUCKETS)
  b["stratum"] = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
  b["lam"] = jax.ShapeDtypeStruct((batch_size,), jnp.float32)
  return b


def compile_targets(config):
  """The contrastive arm's ("sc") and the plain arm's train steps at train.batch_size, and the acc@k evaluation of
  a trained GCNN at eval.batch_size."""
  dims = (len(ROW_FEATURES), len(COL_FEATURES), len(EDGE_FEATURES))
  model_fn = lambda rngs: make_model(config, dims, rngs)  # noqa: E731
  b, emb = int(config.train.batch_size), int(config.model.emb)
  # the GCNN's matmuls; the projection head (B x 2 emb -> 2 emb -> proj) and SupCon's B x B similarities are < 0.1%
  flops = gcnn_flops(emb, b, BUCKETS)
  sc = compile_check.train_target(config, model_fn, _loss_fn(config, True), arm_batch(b), model_flops=flops,
                                  name="train_step_sc")
  plain = compile_check.train_target(config, model_fn, _loss_fn(config, False), arm_batch(b), model_flops=flops,
                                     name="train_step_plain")
  ks = tuple(int(k) for k in config.eval.ks)
  eb = int(config.eval.batch_size)
  acc = imitation._eval_fn(ks)
  evaluate = compile_check.forward_target("eval_step", sc, model_fn, lambda m, batch: acc(m.gcnn, batch),
                                          (gcnn_batch(eb, BUCKETS),),
                                          model_flops=gcnn_flops(emb, eb, BUCKETS, backward=False))
  return [sc, plain, evaluate]
