"""Focus-dilution's accelerator step for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/focus_dilution/config.py:full

One step of the run's loop is a chunk of method.chunk full-batch optimiser steps on all data.n_seq windows (the
tokens sharded over the data axis, the parameters replicated), followed by the logged dynamics metrics
(`method.make_chunk_step`, jitted as `train.compiled_chunk`). The text is tokenized on the host; Markov data adds
the chain's stationary law (pi), text has none. The S1 companion (W_V = I, method.s1_steps) and the control run
the same step with other settings; the control's one chunk of the S1 model's condensation step count is left out.

The metrics take singular values of the (V, V) map Phi = (W_E W_V) W_P from its factors
(`instrument.product_svd`: QR of each factor, then the SVD of a d x d core). A dense 4096 x 4096 SVD there did not
finish compiling for TPU (> 20 min); the factored one compiles in about 30 s on a laptop CPU.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.nn import attention_only as ao

from . import method
from .train import compiled_chunk

TOPOLOGY = "v5e-4"


def gd_step_flops(vocab: int, d: int, batch: int, length: int) -> float:
  """Matmul FLOPs of one full-batch GD step through the token tables (`ao.logits_from_tables`): the score table
  (E W_Q)(E W_K)^T and Phi = E W_V W_P (2 (3 V d^2 + 2 V^2 d)), the logits sum_s A_ts Phi[x_s] (2 B T^2 V over
  the T = length - 1 input positions), x3 with the backward pass."""
  t = length - 1
  return 3.0 * (2.0 * (3 * vocab * d * d + 2 * vocab * vocab * d) + 2.0 * batch * t * t * vocab)


def compile_targets(config):
  """One chunk of the main model (method.chunk GD steps + the metrics) on the full batch."""
  mesh = mesh_lib.current_mesh()
  repl = NamedSharding(mesh, P())
  put = lambda tree, sh=repl: jax.tree.map(  # noqa: E731
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree)
  mc, dc = config.model, config.data
  std = ao.init_std(mc.d, mc.init_std, mc.init_gamma)
  state = put(jax.eval_shape(lambda: method.init_state(config, jax.random.key(config.seed), std)))
  tokens = put(jax.ShapeDtypeStruct((dc.n_seq, dc.length), jnp.int32), NamedSharding(mesh, P("data")))
  top = put(jax.ShapeDtypeStruct((dc.top_k,), jnp.int32))
  pi = put(jax.ShapeDtypeStruct((dc.vocab,), jnp.float32)) if dc.source == "markov" else None
  step = compiled_chunk(tuple(sorted(method.chunk_args(config).items())), repl)
  flops = config.method.chunk * gd_step_flops(dc.vocab, mc.d, dc.n_seq, dc.length)
  report = types.SimpleNamespace(params=state["params"], opt_state=state["opt"])
  return [compile_check.Target("train_chunk", step, (state, tokens, top, pi), state=report, model_flops=flops)]
