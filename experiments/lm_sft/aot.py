"""LM SFT's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/lm_sft/config.py:full [--config.model.hf_path=DIR]

The full variant fine-tunes a user's checkpoint: its config.json (no weights are read) gives the model, and
without one the shape of Llama 3.2 1B (`compile_check.LLAMA_3_2_1B`) stands in.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab.lm import sft
from jaxlab.lm.model import Transformer

TOPOLOGY = "v5p-8"


def compile_targets(config):
  """The SFT train step on packed rows of data.seq_len tokens (FSDP over the slice, remat per block)."""
  mcfg = compile_check.lm_model_config(config)
  b, s = int(config.train.batch_size), int(config.data.seq_len)
  model_fn = lambda rngs: Transformer(mcfg, rngs=rngs)  # noqa: E731
  train = compile_check.train_target(config, model_fn, sft.make_loss_fn(), compile_check.lm_batch(b, s))
  n = compile_check.num_params(train)
  train.model_flops = compile_check.transformer_flops(n, b * s, mcfg.n_layers, s, mcfg.hidden)
  return [train]
