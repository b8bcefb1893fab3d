"""spectro_diffusion's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/spectro_diffusion/config.py:full

The full variant trains on a multitrack folder: normalised log-mel clips {"spec": (B, n_mels, frames) float32,
"tokens": (B, len(data.stems)) int32} (prompt = the stems present, -1 pads; vocab and prompt length are both the
number of stems, as `train._multitrack_run` builds the model). The sampling target is one guided denoiser
evaluation (cond and null prompts in one batch) at sample.batch_size, the unit `ddpm.sample` repeats
sample.steps times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab.audio import model as model_lib
from jaxlab.train import optim

from . import method

TOPOLOGY = "v5e-4"


def _per_token_params(params) -> int:
  """Parameters applied to every spectrogram token: the blocks' self-attention, cross-attention query / output
  and MLP, the patch embedding and the output layer (adaLN modulation is per example and the cross-attention
  keys / values per prompt token: left out)."""
  total = 0
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    s = jax.tree_util.keystr(path)
    if ("blocks" in s and not any(f"['{k}']" in s for k in ("ada", "ck", "cv"))) or "['embed']" in s or \
        "['final']['out']" in s:
      total += x.size
  return total


def _guided_denoiser(cfg: float):
  """`(model, x (B, F, T), t (B,), tokens (B, S)) -> x0 estimate (B, F, T)` with classifier-free guidance."""
  return lambda model, x, t, tokens: model_lib.guided_denoiser(model, tokens, cfg)(x, t)


def compile_targets(config):
  """The DDPM train step and one guided denoiser evaluation of the sampler."""
  stems = len(config.data.stems)
  f, frames = int(config.features.n_mels), int(config.features.frames)
  b, p = int(config.train.batch_size), int(config.model.patch)
  depth, d = int(config.model.depth), int(config.model.hidden)
  batch = {"spec": jax.ShapeDtypeStruct((b, f, frames), jnp.float32),
           "tokens": jax.ShapeDtypeStruct((b, stems), jnp.int32)}
  model_fn = method.make_model_fn(config, stems, stems)
  ema = lambda tx: optim.with_param_ema(tx, float(config.diffusion.ema_decay))  # noqa: E731  (as train.py)
  train = compile_check.train_target(config, model_fn, method.make_loss_fn(config), batch, wrap_optimizer=ema)
  # Model FLOPs: a DiT on L = (F / p)(T / p) tokens, 2 N per token (N: the per-token parameters) plus 4 depth L d
  # of self-attention per token, x3 with the backward pass (cross-attention to <= len(stems) prompt tokens and
  # the per-example adaLN left out).
  n, seq = _per_token_params(train.state.params), (f // p) * (frames // p)
  train.model_flops = compile_check.transformer_flops(n, b * seq, depth, seq, d)
  s = config.sample
  bs, guided = int(s.batch_size), float(s.cfg) != 1.0
  rows = bs * (2 if guided else 1)   # guidance runs the conditional and null prompts in one batch
  sample = compile_check.forward_target(
      "guided_denoiser", train, model_fn, _guided_denoiser(float(s.cfg)),
      (jax.ShapeDtypeStruct((bs, f, frames), jnp.float32), jax.ShapeDtypeStruct((bs,), jnp.int32),
       jax.ShapeDtypeStruct((bs, stems), jnp.int32)),
      model_flops=compile_check.transformer_flops(n, rows * seq, depth, seq, d, backward=False))
  return [train, sample]
