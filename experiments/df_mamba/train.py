"""DF-Mamba experiment: DF-Mamba, its no-Delta-scaling ablation and flat Mamba trained side by side.

Launch: python -m jaxlab.main --config experiments/df_mamba/config.py:tiny --workdir /tmp/df_mamba
Expected (tiny, 2 CPU cores, a few minutes per seed): the exact ZOH identity holds to 1e-6; trained at
lookback 128, DF-Mamba evaluated zero-shot at 512 (two extra levels, no new parameters) is tested against its
own error at 128, the no-Delta-scaling ablation and flat Mamba (the length transfer does not reproduce), and
on the same span sampled 4x finer (scale offset 2) against the input subsampled back to the training rate,
the ablation and flat Mamba (see README for the measured numbers).

All models see the same batches (one `run_loop` over `config.train`, one checkpoint holding every model's
TrainState, so an interrupted run resumes exactly); the run works inside the config's mesh
(`jaxlab.mesh.use_config`), and summary.json is written once, with the claim keys added (`summarise`).
Evaluation computes each model's test loss at every eval length (forecasting: MSE at lookback 128 and 512;
images: accuracy at 8x8 and 16x16), the cross-scale consistency loss of the trained model with its
trained vs. an untrained coarse-graining, and (synthetic forecasting with `data.fine_rate` > 1) the finer-rate
test: every model on the fine input and on it subsampled back, every placement of `FractalMamba(..., fine=)`.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import checkpoint, configs
from jaxlab import mesh as mesh_lib
from jaxlab.data import pipeline
from jaxlab.nn import multiscale
from jaxlab.errors import CheckpointError
from jaxlab.state import ModelDef, abstract_with_shardings, create_train_state
from jaxlab.train import make_train_step, optim, run_loop

from . import config as config_lib  # noqa: E402  (relative: works for installed and path-loaded experiments)
from . import method


_JITTED: collections.OrderedDict = collections.OrderedDict()   # see `_reuse`
_JITTED_MAX = 64


def _reuse(kind: str, config, data, name: str, build):
  """`build()` (a jitted function), reused across the seeds of one process instead of built (and compiled) anew.

  The key is everything the function depends on except the seed: `kind`, the model name, the config without
  `seed`, the data's sizes and flags and the mesh in context. The closures built here read `data` for its sizes
  and flags only (no arrays), and parameters, batches and keys are arguments, so the function of seed 0 is the
  function of seed 1; reusing it skips the recompilation (about a third of a seed's wall time at the tiny
  scale). At most `_JITTED_MAX` functions are kept (least recently used dropped).
  """
  cfg = config.to_dict()
  cfg.pop("seed", None)
  key = (kind, name, json.dumps(cfg, sort_keys=True, default=repr), data.in_features, data.out_features,
         data.classification, data.fine is None, repr(mesh_lib.current_mesh()))
  if key in _JITTED:
    _JITTED.move_to_end(key)
    return _JITTED[key]
  fn = _JITTED[key] = build()
  while len(_JITTED) > _JITTED_MAX:
    _JITTED.popitem(last=False)
  return fn


def _eval_fn(config, data, modeldef, max_levels=None, with_cons=False):
  """Jitted (params, model_state, x, y) -> (sum of task losses, sum of correct, cons trained, cons untrained).

  `max_levels` caps the levels (a diagnostic: a longer input with only the training input's levels);
  `with_cons` also computes the consistency loss with the trained and an untrained coarse-graining (zeros
  otherwise).
  """
  def f(params, model_state, x, y):
    model = modeldef.merge(params, model_state)
    model.eval()
    classification = data.classification
    out = method.predict(config, data, model, x, max_levels=max_levels)
    loss = method.task_loss(out, y, classification)
    correct = (jnp.argmax(out, -1) == y).sum() if classification else jnp.zeros(())
    x = method.model_inputs(config, data, x)
    if model.mode == "flat" or not with_cons:
      return loss.sum(), correct, jnp.zeros(()), jnp.zeros(())
    xs, _ = model.levels(x)
    cons = multiscale.consistency_loss(model, xs)
    fresh = multiscale.CoarseGrain(model.coarse.value.shape[0], model.ratio, model.coarse.tau,
                                   rngs=None) if config.method.lambda_cons else None
    if fresh is not None:   # the same model with an untrained (window-averaging) coarse-graining
      trained = model.coarse
      model.coarse = fresh
      xs_u, _ = model.levels(x)
      cons_u = multiscale.consistency_loss(model, xs_u)
      model.coarse = trained
    else:
      cons_u = cons
    n = y.shape[0]
    return loss.sum(), correct, cons * n, cons_u * n
  return jax.jit(f)


FINE_VARIANTS = (("levels", "all"), ("levels", "coarse"), ("refine", "all"))   # every one is reported


def _fine_eval_fn(config, data, modeldef):
  """Jitted (params, model_state, x_fine, x_sub, y) -> {name: sum over the batch} for the finer-rate test.

  Names: "sub" (task loss on the input taken back to the training rate), "fine/<fine>_<readout>" for each
  of FINE_VARIANTS (the flat model: "fine", the raw fine input), and for the fractal modes
  "dev<k>_<fine>" / "norm<k>": the squared distance between level k's read-out (last position) on the
  fine input and on the subsampled one, and the latter's squared norm (k over the trained levels).
  """
  offset = method.fine_offset(config)

  def f(params, model_state, x_fine, x_sub, y):
    model = modeldef.merge(params, model_state)
    model.eval()
    b, _, ch = x_fine.shape
    loss = lambda raw: method.task_loss(method.predict(config, data, model, x_fine, raw), y, False).sum()
    if model.mode == "flat":
      return {"sub": loss(model(method.model_inputs(config, data, x_sub))),
              "fine": loss(model(method.model_inputs(config, data, x_fine)))}
    _, ys_sub = model.levels(method.model_inputs(config, data, x_sub))
    out = {"sub": loss(model.head_output(ys_sub))}
    for k, y_k in enumerate(ys_sub):
      out[f"norm{k}"] = jnp.sum(y_k[:, -1] ** 2) / ch
    for fine in dict(FINE_VARIANTS):
      _, ys = model.levels(method.model_inputs(config, data, x_fine), offset=offset, fine=fine)
      for f_, readout in FINE_VARIANTS:
        if f_ == fine:
          out[f"fine/{fine}_{readout}"] = loss(model.head_output(ys, model.readout_skip(offset, fine, readout)))
      trained = ys[len(ys) - len(ys_sub):]       # the levels at the trained scales
      for k, (a, b_) in enumerate(zip(trained, ys_sub)):
        out[f"dev{k}_{fine}"] = jnp.sum((a[:, -1] - b_[:, -1]) ** 2) / ch
    return out
  return jax.jit(f)


def _build(config, data):
  """(optimizer, schedule, {name: ModelDef}, {name: TrainState}, {name: shardings}) for every model, on the
  mesh in context (`jaxlab.mesh.use_config(config)`)."""
  mesh = mesh_lib.current_mesh()
  tx, schedule = optim.make_optimizer(config.train.optimizer, config.train.num_steps)
  defs, states, shardings = {}, {}, {}
  for name in config.model.models:
    defs[name] = ModelDef(functools.partial(method.make_model, config, name, data))
    states[name], shardings[name] = create_train_state(defs[name], tx, mesh, mesh_lib.current_rules(), config.seed)
  return tx, schedule, defs, states, shardings


def load_models(config, workdir: str, data=None) -> dict:
  """The trained models of a run: {name: nnx.Module} from the newest checkpoint in `workdir`."""
  data = data or method.make_data(config)
  configs.check_devices(config, jax.device_count())
  with mesh_lib.use_config(config):
    _, _, defs, states, shardings = _build(config, data)
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    step = ckpt.latest_step()
    if step is None:
      ckpt.close()
      raise CheckpointError(f"{workdir} has no checkpoint; train first (python -m jaxlab.main ... --workdir DIR)")
    items, _ = ckpt.restore(step, abstract_with_shardings(shardings, states))
    ckpt.close()
    states = checkpoint.from_items(items, states)
    return {name: defs[name].merge(states[name].params, states[name].model_state) for name in defs}


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains every model in config.model.models and returns the summary (see `summarise`)."""
  configs.check_devices(config, jax.device_count())
  data = method.make_data(config)
  with mesh_lib.use_config(config):
    return _train(config, workdir, data)


def _train(config, workdir: str, data) -> dict:
  t = config.train
  tx, schedule, defs, states, shardings = _build(config, data)
  bsh = mesh_lib.batch_sharding()
  loss_fn = method.make_loss_fn(config, data)
  names = tuple(config.model.models)
  steps = {name: _reuse("train", config, data, name, lambda name=name: make_train_step(
      defs[name], loss_fn, tx, schedule, shardings[name], bsh)) for name in names}
  batcher = pipeline.Batcher(data.train, t.batch_size, seed=config.seed)
  rows = pipeline.process_rows(bsh, t.batch_size)

  def get_batch(step):
    return pipeline.to_global(batcher.local_batch(step, rows), bsh, t.batch_size)

  def step_fn(state, batch):
    new, out = {}, {}
    for name in names:
      new[name], m = steps[name](state[name], batch)
      out.update({f"{k}/{name}": v for k, v in m.items() if k in ("train/loss", "train/task", "train/cons")})
    return new, out

  train_len = (config.data.image_size // config.data.patch) ** 2 if data.classification else config.data.lookback
  k_train = multiscale.num_levels(train_len, config.model.ratio, config.model.min_len)
  train_label = str(config.data.image_size if data.classification else config.data.lookback)
  reuse = lambda kind, name, build: _reuse(kind, config, data, name, build)
  evals = {name: reuse("eval", name, lambda name=name: _eval_fn(config, data, defs[name])) for name in names}
  evals_cons = {name: reuse("eval_cons", name, lambda name=name: _eval_fn(config, data, defs[name], with_cons=True))
                for name in names}
  capped = {name: reuse("capped", name, lambda name=name: _eval_fn(config, data, defs[name], k_train))
            for name in names if name != "flat"}
  fine_evals = ({name: reuse("fine", name, lambda name=name: _fine_eval_fn(config, data, defs[name]))
                 for name in names} if data.fine else {})
  eval_bs = t.eval_batch_size or 256

  def run_eval(fn, st, arrays, keys=("x", "y")):
    """Sums of the eval function's outputs over the eval set (batches of `eval_bs`): one host sync."""
    sums = [fn(st.params, st.model_state, *(arrays[k][i:i + eval_bs] for k in keys))
            for i in range(0, len(arrays["y"]), eval_bs)]
    return jax.tree.map(lambda v: np.asarray(v, np.float64), jax.device_get(jax.tree.map(lambda *v: sum(v), *sums)))

  def evaluate(state):
    out = {}
    for label, arrays in data.evals.items():
      n = len(arrays["y"])
      for name in names:
        tot = np.asarray(run_eval((evals_cons if label == train_label else evals)[name], state[name], arrays))
        if name in capped and label != train_label:
          metric = "acc" if data.classification else "mse"
          t2 = np.asarray(run_eval(capped[name], state[name], arrays))
          out[f"eval/{metric}{label}_k{k_train}/{name}"] = (t2[1] if data.classification else t2[0]) / n
        if data.classification:
          out[f"eval/acc{label}/{name}"] = tot[1] / n
          out[f"eval/ce{label}/{name}"] = tot[0] / n
        else:
          out[f"eval/mse{label}/{name}"] = tot[0] / n
        if name != "flat" and label == train_label:
          out[f"eval/cons/{name}"] = tot[2] / n
          out[f"eval/cons_untrained_phi/{name}"] = tot[3] / n
    if data.fine:
      out.update(_fine_summary(config, data, {name: run_eval(fine_evals[name], state[name], data.fine,
                                                             ("x", "x_sub", "y")) for name in names}))
    return out

  n_params = {f"params/{name}": multiscale.count_params(defs[name].merge(states[name].params,
                                                                         states[name].model_state))
              for name in names}
  extra = {**n_params, **method.zoh_check(config, jax.random.key(config.seed)), **data.info}
  _, summary = run_loop(config, workdir, states, shardings, step_fn, get_batch, evaluate=evaluate,
                        extra_summary=extra, summarise=lambda state, summary: summarise(summary))
  return summary


def _fine_summary(config, data, sums: dict) -> dict:
  """Finer-rate metrics from the summed outputs of `_fine_eval_fn` per model.

  eval/mse_sub/<model> (the input taken back to the training rate), eval/mse_fine/<model> (the configured
  model.fine / model.readout; flat Mamba: the raw fine input), eval/mse_fine_<fine>_<readout>/<model> for
  every variant, and eval/fine_dev<k>_<fine>/<model>: level k's relative squared read-out change,
  sum ||p_k(fine) - p_k(sub)||^2 / sum ||p_k(sub)||^2.
  """
  n = len(data.fine["y"])
  chosen = f"fine/{config.model.fine}_{config.model.readout}"
  out = {}
  for name, s in sums.items():
    out[f"eval/mse_sub/{name}"] = float(s["sub"]) / n
    if name == "flat":
      out[f"eval/mse_fine/{name}"] = float(s["fine"]) / n
      continue
    out[f"eval/mse_fine/{name}"] = float(s[chosen]) / n
    for key, v in s.items():
      if key.startswith("fine/"):
        out[f"eval/mse_fine_{key[len('fine/'):]}/{name}"] = float(v) / n
      elif key.startswith("dev"):
        k = key[3:].split("_")[0]
        out[f"eval/fine_{key}/{name}"] = float(v) / float(s[f"norm{k}"])
  return out


def summarise(summary: dict) -> dict:
  """Adds the claim keys (`mse<L>/<model>`, `acc<size>/<model>`): the eval entries without `eval/`."""
  out = dict(summary)
  for k, v in summary.items():
    if k.startswith("eval/"):
      out[k[len("eval/"):]] = v
  return out


def plot(runs, workdirs, out_dir):
  """Test MSE (or accuracy) of each model at each eval length, mean and spread over seeds; forecasts."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  del workdirs
  pattern = re.compile(r"^(mse|acc)(\d+)/")
  keys = sorted({k for r in runs for k in r if pattern.match(k)})
  if not keys:
    return []
  metric = pattern.match(keys[0]).group(1)
  lengths = sorted({pattern.match(k).group(2) for k in keys if k.startswith(metric)}, key=int)
  models = [m for m in config_lib.MODELS if any(k.endswith("/" + m) for k in keys)]
  fig, ax = plt.subplots(figsize=(6, 3.8))
  width = 0.8 / max(1, len(models))
  for i, m in enumerate(models):
    vals = np.array([[r.get(f"{metric}{lb}/{m}", np.nan) for lb in lengths] for r in runs])
    ax.bar(np.arange(len(lengths)) + i * width, np.nanmean(vals, 0), width, yerr=np.nanstd(vals, 0), label=m,
           capsize=3)
  ax.set_xticks(np.arange(len(lengths)) + width * (len(models) - 1) / 2)
  ax.set_xticklabels([f"eval at {lb}" for lb in lengths])
  ax.set_ylabel("test MSE (z-scored)" if metric == "mse" else "test accuracy")
  ax.set_title("trained at the first length; longer = zero-shot")
  ax.legend()
  path = save(fig, out_dir, "df_mamba_zero_shot.png")
  return [path]
