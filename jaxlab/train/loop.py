"""The training loop: resume -> steps -> metrics / NaN guard -> eval -> checkpoints -> summary.

Two entry points:

* `fit(config, workdir, model_fn=..., loss_fn=..., train_source=...)`: supervised gradient training of an
  NNX model; builds mesh, optimizer, sharded TrainState, jitted steps and the input pipeline.
* `run_loop(config, workdir, state, shardings, step_fn, get_batch, ...)`: the loop alone, for
  experiments with their own update (zeroth-order, RL rollouts, non-gradient algorithms): any state
  pytree, any `step_fn(state, batch) -> (state, metrics)`.

Both resume from `workdir`'s newest checkpoint, else take parameters from `config.init_from`, else start
from scratch; a resumed run ends bit-identical to an uninterrupted one (batches and keys depend on the
step only). Ctrl-C or SIGTERM (preemption) saves a checkpoint at the current step before stopping.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxlab import checkpoint as ckpt_lib
from jaxlab import configs
from jaxlab import mesh as mesh_lib
from jaxlab import metrics as metrics_lib
from jaxlab import progress
from jaxlab.data import pipeline
from jaxlab.errors import NonFiniteError
from jaxlab.state import ModelDef, TrainState, abstract_with_shardings, create_train_state, param_count
from jaxlab.train import optim, step as step_lib

log = logging.getLogger("jaxlab")

Hook = Callable[[int, Any], None]


class Preempted(KeyboardInterrupt):
  """Raised after a SIGTERM once the checkpoint of the current step is written."""


@dataclasses.dataclass
class FitResult:
  """What `fit` returns: the final state, the summary dict and what is needed to use the model."""
  state: TrainState
  summary: dict
  modeldef: ModelDef
  mesh: Mesh
  shardings: TrainState

  def model(self) -> nnx.Module:
    """The trained NNX module (eval mode)."""
    m = self.modeldef.merge(self.state.params, self.state.model_state)
    m.eval()
    return m


def run_loop(config: ml_collections.ConfigDict, workdir: str, state: Any, shardings: Any,
             step_fn: Callable[[Any, Any], tuple[Any, Mapping[str, jax.Array]]],
             get_batch: Callable[[int], Any], *,
             evaluate: Callable[[Any], Mapping[str, float]] | None = None,
             hooks: Sequence[Hook] = (), extra_summary: Mapping[str, Any] | None = None) -> tuple[Any, dict]:
  """Runs `config.num_steps` steps of `step_fn` with resume, logging, eval and checkpoints.

  Args:
    config: a validated config (uses num_steps, log_every, eval_every, checkpoint_every,
      keep_checkpoints, async_checkpoint, init_from, tensorboard).
    workdir: run directory (config.json, metrics.jsonl, summary.json, checkpoints/).
    state: freshly initialised, sharded state (replaced by the checkpoint when resuming).
    shardings: NamedShardings matching `state` (restore target).
    step_fn: jitted `(state, batch) -> (state, {name: scalar})`; donated state is fine.
    get_batch: `step -> global batch` (a pure function of the step for exact resume).
    evaluate: optional `state -> {"eval/name": float}` run every `eval_every` steps and at the end.
    hooks: callables `(step, state)` run after each step (e.g. tests, custom logging). A hook that returns
      True stops the run early: the step is checkpointed, summary.json gets `"stopped_early": true`, and a
      rerun returns that result instead of training on (early stopping that survives resume).
    extra_summary: entries added to summary.json (e.g. parameter count).

  Returns:
    (final state, summary dict). The summary is also written to `workdir/summary.json`.
  """
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  _write_config(config, workdir)
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.keep_checkpoints,
                               async_save=config.async_checkpoint)
  target = abstract_with_shardings(shardings, state)
  start = ckpt.latest_step()
  if start is not None:
    items, _ = ckpt.restore(start, target)
    state = ckpt_lib.from_items(items, state)
    log.info("resumed %s from step %d", workdir, start)
  else:
    start = 0
    if config.init_from:
      src, src_step = ckpt_lib.resolve_init_from(config.init_from)
      part = ("model",) if isinstance(state, TrainState) else None
      items, _ = src.restore(src_step, target, items=part)
      state = ckpt_lib.from_items({**ckpt_lib.to_items(state), **items}, state)
      src.close()
      log.info("initialised from %s step %d", config.init_from, src_step)
  summary_path = os.path.join(workdir, "summary.json")
  if os.path.exists(summary_path):
    done = metrics_lib.read_json(summary_path)
    if start >= config.num_steps or (done.get("stopped_early") and done.get("step") == start):
      ckpt.close()
      log.info("%s already finished at step %d", workdir, start)
      return state, done
  writer = metrics_lib.MetricWriter(workdir, resume_step=start, tensorboard=config.tensorboard)
  meta = {"config": config.to_dict()}
  summary: dict[str, Any] = dict(extra_summary or {})
  last_train: dict[str, float] = {}
  last_eval: dict[str, float] = {}
  pending: list[tuple[int, Mapping[str, jax.Array]]] = []
  t_log = time.time()
  step = start
  sigterm = _SigtermFlag()
  bar = progress.bar(config.num_steps, initial=start, desc=os.path.basename(os.path.normpath(workdir)))
  try:
    with sigterm:
      while step < config.num_steps:
        state, m = step_fn(state, get_batch(step))
        step += 1
        pending.append((step, m))
        bar.update(1)
        last = step == config.num_steps
        if step % config.log_every == 0 or last:
          last_train = _flush(pending, writer, step, time.time() - t_log)
          pending, t_log = [], time.time()
          bar.set_postfix({k.split("/")[-1]: f"{v:.4g}" for k, v in list(last_train.items())[:2]})
        evaluated = evaluate is not None and bool(last or (config.eval_every and step % config.eval_every == 0))
        if evaluated:
          last_eval = dict(evaluate(state))
          writer.write(step, last_eval)
        if last or (config.checkpoint_every and step % config.checkpoint_every == 0):
          ckpt.save(step, state, meta, force=last)
        stop = False
        for hook in hooks:
          stop = bool(hook(step, state)) or stop
        if stop:
          if pending:
            last_train = _flush(pending, writer, step, time.time() - t_log)
            pending = []
          if ckpt.latest_step() != step:
            ckpt.save(step, state, meta, force=True)
          if evaluate is not None and not evaluated:
            last_eval = dict(evaluate(state))
            writer.write(step, last_eval)
          summary["stopped_early"] = True
          log.info("%s: a hook stopped the run at step %d", workdir, step)
          break
        if sigterm.raised:
          raise Preempted(f"SIGTERM at step {step}")
  except KeyboardInterrupt:
    if pending:  # keep what was logged
      _flush(pending, writer, step, time.time() - t_log, check=False)
    if ckpt.latest_step() != step and not _deleted(state):
      ckpt.save(step, state, meta, force=True)
      log.warning("interrupted at step %d; checkpoint saved, rerun the same command to resume", step)
    raise
  finally:
    ckpt.close()
    bar.close()
    writer.close()
  summary.update(step=step, **last_train, **last_eval, wall_s=time.time() - t_start)
  metrics_lib.write_json(summary_path, summary)
  return state, summary


def fit(config: ml_collections.ConfigDict, workdir: str, *, model_fn: Callable[[nnx.Rngs], nnx.Module],
        loss_fn: step_lib.LossFn, train_source: pipeline.Source, eval_fn: step_lib.EvalFn | None = None,
        eval_source: pipeline.Source | None = None, transform: Callable[[dict], dict] | None = None,
        hooks: Sequence[Hook] = (), devices: Sequence[Any] | None = None,
        wrap_optimizer: Callable[[Any], Any] | None = None, initial_params: Any = None) -> FitResult:
  """Supervised training of an NNX model on a device mesh, with eval and checkpoint/resume.

  Args:
    config: validated config built on `configs.base_config()`.
    workdir: run directory.
    model_fn: `rngs -> nnx.Module`; parameters may carry logical partitioning
      (`nnx.with_partitioning(init, ("embed", "mlp"))`) mapped by `config.sharding_rules`.
    loss_fn: `(model, batch, key) -> (loss, {name: scalar})`.
    train_source: random-access training data (`ArraySource`, `TfdsSource`, ...).
    eval_fn: `(model, batch) -> {name: per-example values (batch,)}`, averaged over `eval_source`.
    eval_source: evaluation data (required with `eval_fn`).
    transform: host-side batch transform applied to train and eval batches.
    hooks: per-step callables `(step, state)`.
    devices: devices of the mesh (default: all).
    wrap_optimizer: optional `tx -> tx` applied to the optimizer built from `config.optimizer` (e.g. LoRA's
      `jaxlab.lm.lora.freeze_base`, which leaves the base weights untouched).
    initial_params: optional pure-dict params (e.g. a converted pretrained checkpoint) placed on the mesh
      instead of the random init; a checkpoint in `workdir` (resume) or `config.init_from` still wins.

  Returns:
    FitResult with the final state and the summary (also in `workdir/summary.json`).
  """
  num_devices = len(devices) if devices is not None else jax.device_count()
  configs.validate(config, num_devices=num_devices)
  mesh = mesh_lib.make_mesh(config.mesh, devices)
  rules = config.sharding_rules
  modeldef = ModelDef(model_fn)
  tx, schedule = optim.make_optimizer(config.optimizer, config.num_steps)
  if wrap_optimizer is not None:
    tx = wrap_optimizer(tx)
  state, shardings = create_train_state(modeldef, tx, mesh, rules, config.seed)
  if initial_params is not None:
    _check_params_match(initial_params, state.params)
    state = state.replace(params=jax.device_put(initial_params, shardings.params))
  bsh = mesh_lib.batch_sharding(mesh, rules)
  train_step = step_lib.make_train_step(modeldef, loss_fn, tx, schedule, shardings, bsh)
  batcher = pipeline.Batcher(train_source, config.batch_size, seed=config.seed, transform=transform)
  rows = pipeline.process_rows(bsh, config.batch_size)

  def get_batch(step):
    return pipeline.to_global(batcher.local_batch(step, rows), bsh, config.batch_size)

  evaluate = None
  if eval_fn is not None:
    if eval_source is None:
      raise ValueError("fit: eval_fn needs eval_source")
    eval_step = step_lib.make_eval_step(modeldef, eval_fn, shardings, bsh)
    eb = config.eval_batch_size or config.batch_size
    erows = pipeline.process_rows(bsh, eb)

    def evaluate(st):
      totals, count = None, 0.0
      for local, mask in pipeline.eval_batches(eval_source, eb, erows, transform):
        g = pipeline.to_global(local, bsh, eb)
        gmask = pipeline.to_global({"m": mask}, bsh, eb)["m"]
        sums, n = eval_step(st, g, gmask)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        count = count + n
      totals, count = jax.device_get((totals, count))
      return {f"eval/{k}": float(v) / float(count) for k, v in totals.items()}

  extra = {"num_params": param_count(state.params), "num_devices": num_devices,
           "mesh": dict(mesh.shape)}
  state, summary = run_loop(config, workdir, state, shardings, train_step, get_batch, evaluate=evaluate,
                            hooks=hooks, extra_summary=extra)
  return FitResult(state=state, summary=summary, modeldef=modeldef, mesh=mesh, shardings=shardings)


# ------------------------------------------------------------------------------------------- helpers


def _flush(pending, writer, step, seconds, check=True) -> dict[str, float]:
  """Fetches pending step metrics (one host sync), checks them, writes their mean."""
  values = jax.device_get([m for _, m in pending])
  if check:
    for (s, _), row in zip(pending, values):
      for k, v in row.items():
        if not np.all(np.isfinite(v)):
          raise NonFiniteError(
              f"{k} became {float(np.asarray(v).ravel()[0])} at step {s}; lower config.optimizer.learning_rate, "
              "set config.optimizer.clip_norm, or check the data")
  mean = {k: float(np.mean([row[k] for row in values])) for k in values[0]} if values else {}
  if values:
    mean["train/steps_per_sec"] = len(values) / max(seconds, 1e-9)
    writer.write(step, mean)
  return mean


def _check_params_match(given, expected):
  from jaxlab.checkpoint import check_signature, signature  # pylint: disable=g-import-not-at-top
  check_signature(signature({"params": given}), signature({"params": expected}), "initial_params")


def _write_config(config, workdir):
  path = os.path.join(workdir, "config.json")
  if metrics_lib.is_main_process():
    if os.path.exists(path):
      old = configs.flatten(metrics_lib.read_json(path))
      new = configs.flatten(config.to_dict())
      changed = sorted(k for k in set(old) | set(new) if _norm(old.get(k)) != _norm(new.get(k)))
      if changed:
        log.warning("workdir %s was started with a different config; changed keys: %s", workdir,
                    ", ".join(changed[:10]))
    with open(path, "w") as f:
      f.write(configs.to_json(config))


def _norm(v):
  return [_norm(x) for x in v] if isinstance(v, (list, tuple)) else v


def _deleted(state) -> bool:
  return any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state))


class _SigtermFlag:
  """Within the block, SIGTERM sets `raised` instead of killing the process (main thread only)."""

  def __init__(self):
    self.raised = False
    self._old = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._old = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    self.raised = True

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)
    return False
