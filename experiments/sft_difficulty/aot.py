"""SFT-difficulty's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/sft_difficulty/config.py:full [--config.lm.model.hf_path=DIR]

The full variant runs the LM arm only (the synthetic arm is off; it is numpy on the host anyway). Its base model is
the user's checkpoint (`lm.model.hf_path`, loaded by `hf.from_pretrained`: no pretraining `fit` runs), so the one
accelerator-trained model kind is the SFT'd Transformer of every (difficulty, budget) cell: `lm_arm.sft_cell` runs
the jitted step `lm_arm._steps` builds (`make_train_step` with `sft.make_loss_fn()`, the lm.sft optimizer) on
padded rows of lm.data.seq_len tokens, lm.sft.batch rows a step. Without hf_path the checkpoint's config.json
(no weights are read) is Llama 3.2 1B's shape (`compile_check.LLAMA_3_2_1B`).

Attention: the model's "auto" resolves by `jax.default_backend()`, which is the CPU here, so it would compile the
einsum reference with (L, L) scores, not the splash kernel a TPU run takes; the target uses "chunked" (online
softmax, no (L, L) scores) as the nearest impl that compiles here (`ATTENTION`).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_collections

from jaxlab import compile_check, configs
from jaxlab.errors import ConfigError
from jaxlab.lm import hf, sft
from jaxlab.lm.model import Transformer

from . import lm_arm

TOPOLOGY = "v5p-64"   # the smallest v5p slice the SFT step fits as configured (fp32, no remat, 64 x 4096 rows):
                      # 2 rows a chip; v5p-32 needs 100 GiB a chip, v5p-8 288 GiB
ATTENTION = "chunked"   # stands in for the TPU run's splash attention (see the module docstring)


def _sft_settings(lm) -> dict:
  """The optimizer, steps, mesh and rules `lm_arm._steps_for` builds the SFT steps with."""
  sf = lm.sft
  opt = dict(configs.OPTIMIZER_DEFAULTS, name="adamw", learning_rate=sf.lr, schedule=sf.schedule,
             warmup_steps=sf.warmup, weight_decay=sf.weight_decay, clip_norm=sf.clip_norm, b2=0.98)
  rules = tuple((str(k), tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in lm.sharding_rules)
  return dict(optimizer=opt, num_steps=int(sf.steps), mesh=tuple(map(tuple, lm.mesh)), rules=rules)


def compile_targets(config):
  """The SFT train step of a cell and the teacher-forced evaluation forward (lm.eval.batch rows)."""
  lm = config.lm
  if not lm.enabled:
    raise ConfigError("config.lm.enabled is False: no accelerator step to compile (the synthetic arm is numpy)")
  # as `hf.from_pretrained(lm.model.hf_path, dtype=lm.model.dtype)` builds the base model's config
  mcfg = hf.config_from_hf(lm.model.hf_path or compile_check.LLAMA_3_2_1B, dtype=jnp.dtype(lm.model.dtype).name)
  mcfg = dataclasses.replace(mcfg, attention=ATTENTION)
  got = _sft_settings(lm)
  rules = tuple((str(k), tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in config.sharding_rules)
  if (got["mesh"], got["rules"]) != (tuple(map(tuple, config.mesh)), rules):
    raise ConfigError("compile_check enters config.mesh / config.sharding_rules, but the LM arm runs on config.lm.mesh"
                      " / config.lm.sharding_rules: give both the same values (e.g. --config.sharding_rules=fsdp "
                      "--config.lm.sharding_rules=fsdp)")
  run = ml_collections.ConfigDict(dict(seed=config.seed, train=dict(optimizer=got["optimizer"],
                                                                    num_steps=got["num_steps"])))
  s, b, eb = lm_arm.seq_len(lm), int(lm.sft.batch), int(lm.eval.batch)
  model_fn = lambda rngs: Transformer(mcfg, rngs=rngs)  # noqa: E731
  train = compile_check.train_target(run, model_fn, sft.make_loss_fn(), compile_check.lm_batch(b, s),
                                     name="sft_train_step")
  n = compile_check.num_params(train)
  # 6 N per token + attention scores (every padded row position is computed, so tokens = rows x seq_len)
  train.model_flops = compile_check.transformer_flops(n, b * s, mcfg.n_layers, s, mcfg.hidden)
  eval_fn = sft.make_eval_fn()

  def teacher_forced(model, batch):   # per-row loss / token accuracy / exact match (`lm_arm._teacher_forced`)
    model.eval()
    return eval_fn(model, batch)

  evaluation = compile_check.forward_target(
      "eval_step", train, model_fn, teacher_forced, (compile_check.lm_batch(eb, s),),
      model_flops=compile_check.transformer_flops(n, eb * s, mcfg.n_layers, s, mcfg.hidden, backward=False))
  return [train, evaluation]
