"""DF-Mamba's accelerator steps for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/df_mamba/config.py:full [--config.data.channels=21]

The run (train.py `_train`) trains every model of config.model.models (DF-Mamba, the no-Delta-scaling ablation,
flat Mamba) side by side on the same batches, each with its own `make_train_step`: one train target per model,
and one evaluation target, DF-Mamba zero-shot at the longest eval lookback (its extra levels). The full
variant reads an ETT / Weather CSV; no file is read here: the batch has config.data.channels columns (7: the
ETT files; weather.csv has 21). Its scan is the one the full config selects: `discretization="zoh"` makes
`selective_scan` take the XLA scan (`lax.scan` over time) on every backend, since the Pallas kernels implement
Mamba's Euler rule only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxlab import compile_check
from jaxlab.errors import ConfigError
from jaxlab.nn import multiscale

from . import method

TOPOLOGY = "v5e-4"   # the slice `compile_check --all` proves the full config on (a ~0.1 M-parameter model)


def _data(config) -> tuple[method.Data, int]:
  """(the sizes `method.make_data` gives a forecasting task, the series' channels); no arrays: the steps read
  sizes and flags only."""
  d, m = config.data, config.model
  if d.name in method.IMAGE_TASKS:
    raise ConfigError(f"experiments/df_mamba/aot.py covers the forecasting tasks, not data.name={d.name!r}")
  channels = 1 if d.name == "co2" else int(d.channels)
  ch = 1 if m.channel_independent else channels
  return method.Data(None, {}, ch, d.horizon * ch, False, {}), channels


def _weighted_tokens(config, data, mode: str, length: int, train: bool) -> float:
  """Sum over the model's matrix multiplies of (weights x tokens) for one input sequence of `length` steps.

  The shared Mamba layer (in_proj, x_proj, dt_proj, out_proj) runs on every level (lengths L / r^k) and, in
  training, again for the consistency loss on the coarsened levels; the coarse-graining's value map (d x d)
  on every level but the last (twice in training), the decoder (d x r d) on the coarse levels (training), the
  top-down map per level, the embedding and the head. The selective scan's recurrence (elementwise) is left out.
  """
  m = config.model
  d, e = m.d_model, int(m.expand * m.d_model)
  rank = -(-d // 16)
  layer = d * 2 * e + e * (rank + 2 * m.d_state) + rank * e + e * d
  ends = data.in_features * d * length + d * data.out_features
  if mode == "flat":
    return ends + m.flat_layers * layer * length
  k = multiscale.num_levels(length, m.ratio, m.min_len)
  lengths = [length // m.ratio ** i for i in range(k)]
  coarse = sum(lengths[1:])          # tokens of levels 1 .. K-1
  total = ends + layer * sum(lengths) + d * d * sum(lengths[:-1]) + d * d * k
  if train:
    total += layer * coarse + d * d * sum(lengths[:-1]) + m.ratio * d * d * coarse
  return total


def compile_targets(config):
  """Per model: its train step on a batch of train.batch_size windows; DF-Mamba's zero-shot eval step."""
  data, ch = _data(config)
  b, lb, h = config.train.batch_size, config.data.lookback, config.data.horizon
  seqs = b * (ch if config.model.channel_independent else 1)
  batch = {"x": jax.ShapeDtypeStruct((b, lb, ch), jnp.float32), "y": jax.ShapeDtypeStruct((b, h, ch), jnp.float32)}
  loss_fn = method.make_loss_fn(config, data)
  targets = []
  for name in config.model.models:
    model_fn = functools.partial(method.make_model, config, name, data)
    # 6 x (weights x tokens) per sequence x sequences (forward + backward matmuls)
    flops = 6.0 * seqs * _weighted_tokens(config, data, name, lb, train=True)
    targets.append(compile_check.train_target(config, model_fn, loss_fn, batch, model_flops=flops,
                                              name=f"train_step/{name}"))
  if "fractal" in config.model.models:
    longest, eb = max(config.data.eval_lookbacks), config.train.eval_batch_size or 256   # as train.py evaluates
    eval_seqs = eb * (ch if config.model.channel_independent else 1)

    def zero_shot(model, x, y):   # summed test MSE of a batch of windows (train.py `_eval_fn`, without cons)
      model.eval()
      return method.task_loss(method.predict(config, data, model, x), y, False).sum()

    args = (jax.ShapeDtypeStruct((eb, longest, ch), jnp.float32), jax.ShapeDtypeStruct((eb, h, ch), jnp.float32))
    train = targets[list(config.model.models).index("fractal")]
    targets.append(compile_check.forward_target(
        f"eval_step/fractal@{longest}", train, functools.partial(method.make_model, config, "fractal", data),
        zero_shot, args, model_flops=2.0 * eval_seqs * _weighted_tokens(config, data, "fractal", longest, False)))
  return targets
