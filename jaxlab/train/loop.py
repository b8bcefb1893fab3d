"""The training loops: resume -> steps -> metrics / NaN guard -> eval -> checkpoints -> summary.

Two of the three run shapes (the third, `run_stages`, is in `jaxlab.train.stages`):

* `fit(config, workdir, model_fn=..., loss_fn=..., train_source=...)`: supervised gradient training of an
  NNX model; enters the config's mesh, builds the optimizer, the sharded TrainState, jitted steps and the
  input pipeline.
* `run_loop(config, workdir, state, shardings, step_fn, get_batch, ...)`: the loop alone, for experiments
  with their own update (zeroth-order, RL rollouts, several models trained side by side, full-batch
  chunks): any state pytree, any `step_fn(state, batch) -> (state, metrics)`.

Both read their settings from the `config.train` section (`jaxlab.configs.train_config`): num_steps (or
`run_loop(num_steps=...)` when the count follows from the method), log_every, eval_every, checkpoint_every,
keep_checkpoints, async_checkpoint, init_from. They resume from `workdir`'s newest checkpoint, else take
parameters from `config.train.init_from`, else start from scratch; a resumed run ends bit-identical to an
uninterrupted one (batches and keys depend on the step only). Ctrl-C or SIGTERM (preemption) saves a
checkpoint at the current step before stopping. Train metrics are averaged over each logging window, by
weight for `jaxlab.metrics.Weighted` ones (see `jaxlab.train.step`).
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
from jaxlab import workdir as workdir_lib
from jaxlab.errors import Interrupted, NonFiniteError, Preempted
from jaxlab.state import ModelDef, TrainState, abstract_with_shardings, create_train_state, param_count
from jaxlab.train import optim, step as step_lib

log = logging.getLogger("jaxlab")

Hook = Callable[[int, Any], None]


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
             get_batch: Callable[[int], Any], *, num_steps: int | None = None,
             evaluate: Callable[[Any], Mapping[str, float]] | None = None,
             hooks: Sequence[Hook] = (), extra_summary: Mapping[str, Any] | None = None,
             summarise: Callable[[Any, dict], Mapping[str, Any]] | None = None) -> tuple[Any, dict]:
  """Runs `num_steps` steps of `step_fn` with resume, logging, eval and checkpoints.

  Args:
    config: a finalized config with a `train` section holding log_every, checkpoint_every,
      keep_checkpoints, async_checkpoint (+ num_steps unless passed, eval_every with `evaluate`, and
      optionally init_from: for a `TrainState` its parameters and model state only; any other state is taken
      from that checkpoint whole, step counters and optimizer states included).
    workdir: run directory (config.json, metrics.jsonl, summary.json, checkpoints/).
    state: freshly initialised, sharded state (replaced by the checkpoint when resuming).
    shardings: NamedShardings matching `state` (restore target).
    step_fn: jitted `(state, batch) -> (state, {name: scalar or jaxlab.metrics.Weighted})`; donated state is
      fine.
    get_batch: `step -> global batch` (a pure function of the step for exact resume).
    num_steps: the number of steps (default: `config.train.num_steps`).
    evaluate: optional `state -> {"eval/name": float}` run every `eval_every` steps and at the end.
    hooks: callables `(step, state)` run after each step (e.g. tests, custom logging). A hook that returns
      True stops the run early: the step is checkpointed, summary.json gets `"stopped_early": true`, and a
      rerun returns that result instead of training on (early stopping that survives resume).
    extra_summary: entries added to summary.json (e.g. parameter count).
    summarise: optional `(final state, summary) -> summary` applied before summary.json is written (once),
      e.g. to add an experiment's derived claim keys or a final evaluation.

  Returns:
    (final state, summary dict). The summary is also written to `workdir/summary.json`.
  """
  need = ["log_every", "checkpoint_every", "keep_checkpoints", "async_checkpoint"]
  need += [] if num_steps is not None else ["num_steps"]
  need += ["eval_every"] if evaluate is not None else []
  t = configs.require_train_keys(config, need, "run_loop")
  num_steps = int(t.num_steps if num_steps is None else num_steps)
  eval_every = t.eval_every if evaluate is not None else 0
  init_from = t.get("init_from", "")
  t_start = time.time()
  workdir_lib.check(config, workdir)              # refusals come before anything is written
  target = abstract_with_shardings(shardings, state)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  ckpt = (ckpt_lib.Checkpointer(ckpt_dir, keep=t.keep_checkpoints, async_save=t.async_checkpoint)
          if os.path.isdir(ckpt_dir) else None)
  start = None
  wall_before, resumes = 0.0, 0
  try:
    found = ckpt.restore_newest(target) if ckpt is not None else None   # a damaged newest: the one before it
    if found is not None:
      start, items, meta = found
      state = ckpt_lib.from_items(items, state)
      wall_before, resumes = float(meta.get("wall_s", 0.0)), int(meta.get("resumes", 0)) + 1
      log.info("resumed %s from step %d", workdir, start)
    else:
      start = 0
      if init_from:
        src, src_step = ckpt_lib.resolve_init_from(init_from)
        part = ("model",) if isinstance(state, TrainState) else None
        items, _ = src.restore(src_step, target, items=part)
        state = ckpt_lib.from_items({**ckpt_lib.to_items(state), **items}, state)
        src.close()
        log.info("initialised from %s step %d", init_from, src_step)
  except BaseException:
    if ckpt is not None:
      try:
        ckpt.close()
      except Exception:  # pylint: disable=broad-except  (a failed restore may leave orbax half closed)
        pass
    raise
  summary_path = os.path.join(workdir, "summary.json")
  done = metrics_lib.read_json_or_none(summary_path, "the run's final step writes it anew")
  if done is not None:
    if start >= num_steps or (done.get("stopped_early") and done.get("step") == start):
      if ckpt is not None:
        ckpt.close()
      log.info("%s already finished at step %d", workdir, start)
      return state, done
  try:
    workdir_lib.claim(config, workdir)      # takes the workdir's lock (refused while another process holds it)
  except BaseException:
    if ckpt is not None:
      ckpt.close()
    raise
  try:   # the workdir's lock is held from here to the summary
    if ckpt is None:
      ckpt = ckpt_lib.Checkpointer(ckpt_dir, keep=t.keep_checkpoints, async_save=t.async_checkpoint)
    writer = metrics_lib.MetricWriter(workdir, resume_step=start, tensorboard=config.tensorboard)
    config_dict = config.to_dict()

    def meta():
      return {"config": config_dict, "wall_s": wall_before + time.time() - t_start, "resumes": resumes}

    summary: dict[str, Any] = dict(extra_summary or {})
    last_train: dict[str, float] = {}
    last_eval: dict[str, float] = {}
    pending: list[tuple[int, Mapping[str, jax.Array]]] = []
    t_log = time.time()
    step = start
    stop_flag = StopFlag()
    bar = None   # made after the first (compiling) step, so its rate and ETA are those of compiled steps
    if start >= num_steps:   # finished, but killed before summary.json: the summary from the final rows
      last_train, last_eval = _final_rows(workdir, start)
      if evaluate is not None and not last_eval:
        last_eval = dict(evaluate(state))
        writer.write(start, last_eval)
      log.info("%s: finished at step %d without a summary; writing it from the final step", workdir, start)
    try:
      with stop_flag:
        while step < num_steps:
          state, m = step_fn(state, get_batch(step))
          step += 1
          pending.append((step, m))
          if bar is None:
            bar = progress.bar(num_steps, initial=step, desc=os.path.basename(os.path.normpath(workdir)))
          else:
            bar.update(1)
          last = step == num_steps
          if step % t.log_every == 0 or last:
            last_train = _flush(pending, writer, step, time.time() - t_log)
            pending, t_log = [], time.time()
            bar.set_postfix(progress.postfix(last_train))
          evaluated = evaluate is not None and bool(last or (eval_every and step % eval_every == 0))
          if evaluated:
            last_eval = dict(evaluate(state))
            writer.write(step, last_eval)
          if last or (t.checkpoint_every and step % t.checkpoint_every == 0):
            ckpt.save(step, state, meta(), force=last)
          stop = False
          for hook in hooks:
            stop = bool(hook(step, state)) or stop
          if stop:
            if pending:
              last_train = _flush(pending, writer, step, time.time() - t_log)
              pending = []
            if ckpt.latest_step() != step:
              ckpt.save(step, state, meta(), force=True)
            if evaluate is not None and not evaluated:
              last_eval = dict(evaluate(state))
              writer.write(step, last_eval)
            summary["stopped_early"] = True
            log.info("%s: a hook stopped the run at step %d", workdir, step)
            break
          if stop_flag.raised and not last:
            stop_flag.stop(f"at step {step}")
    except KeyboardInterrupt as e:   # Ctrl-C, or the SIGTERM above: save the step reached, then stop
      if pending:  # keep what was logged
        _flush(pending, writer, step, time.time() - t_log, check=False)
      if ckpt.latest_step() != step and not _deleted(state):
        ckpt.save(step, state, meta(), force=True)
      ckpt.wait()
      if not isinstance(e, Interrupted):
        e = Interrupted(f"Ctrl-C at step {step}")
      if e.workdir is None:
        e.workdir, e.step, e.checkpoint = workdir, step, ckpt.latest_step()
      raise e from None
    finally:
      ckpt.close()
      if bar is not None:
        bar.close()
      writer.close()
    summary.update(step=step, **last_train, **last_eval, wall_s=wall_before + time.time() - t_start,
                   resumes=resumes)
    if summarise is not None:
      summary = dict(summarise(state, summary))
    metrics_lib.write_json(summary_path, summary)
    return state, summary
  finally:
    workdir_lib.release(workdir)


def fit(config: ml_collections.ConfigDict, workdir: str, *, model_fn: Callable[[nnx.Rngs], nnx.Module],
        loss_fn: step_lib.LossFn, train_source: pipeline.Source, eval_fn: step_lib.EvalFn | None = None,
        eval_source: pipeline.Source | None = None, transform: Callable[[dict], dict] | None = None,
        hooks: Sequence[Hook] = (), devices: Sequence[Any] | None = None,
        wrap_optimizer: Callable[[Any], Any] | None = None, initial_params: Any = None,
        summarise: Callable[[Any, dict], Mapping[str, Any]] | None = None) -> FitResult:
  """Supervised training of an NNX model on a device mesh, with eval and checkpoint/resume.

  Args:
    config: finalized config with a full `train` section (`jaxlab.configs.train_config()`).
    workdir: run directory.
    model_fn: `rngs -> nnx.Module`; parameters may carry logical partitioning
      (`nnx.with_partitioning(init, ("embed", "mlp"))`) mapped by `config.sharding_rules`.
    loss_fn: `(model, batch, key) -> (loss, {name: scalar})`; the optional metric "weight" is the number of
      units (e.g. tokens) the loss averages over (default: the batch's examples), used to average the logged
      train metrics over a logging window.
    train_source: random-access training data (`ArraySource`, `TfdsSource`, ...).
    eval_fn: `(model, batch) -> {name: per-example values (batch,)}`, averaged over `eval_source`.
    eval_source: evaluation data (required with `eval_fn`).
    transform: host-side batch transform applied to train and eval batches.
    hooks: per-step callables `(step, state)`.
    devices: devices of the mesh (default: all).
    wrap_optimizer: optional `tx -> tx` applied to the optimizer built from `config.train.optimizer` (e.g.
      LoRA's `jaxlab.lm.lora.freeze_base`, which leaves the base weights untouched).
    initial_params: optional pure-dict params (e.g. a converted pretrained checkpoint) placed on the mesh
      instead of the random init; a checkpoint in `workdir` (resume) or `config.train.init_from` still wins.
    summarise: optional `(final TrainState, summary) -> summary` run before summary.json is written (once),
      e.g. a generation-based evaluation of the trained model (see `run_loop`).

  Returns:
    FitResult with the final state and the summary (also in `workdir/summary.json`).
  """
  t = configs.require_train_keys(config, ("batch_size", "eval_batch_size", "num_steps", "optimizer"), "fit")
  num_devices = len(devices) if devices is not None else jax.device_count()
  configs.check_devices(config, num_devices)
  with mesh_lib.use_config(config, devices) as mesh:
    rules = mesh_lib.current_rules()
    modeldef = ModelDef(model_fn)
    tx, schedule = optim.make_optimizer(t.optimizer, t.num_steps)
    if wrap_optimizer is not None:
      tx = wrap_optimizer(tx)
    state, shardings = create_train_state(modeldef, tx, mesh, rules, config.seed)
    if initial_params is not None:
      _check_params_match(initial_params, state.params)
      state = state.replace(params=jax.device_put(initial_params, shardings.params))
    bsh = mesh_lib.batch_sharding(mesh, rules)
    train_step = step_lib.make_train_step(modeldef, loss_fn, tx, schedule, shardings, bsh)
    batcher = pipeline.Batcher(train_source, t.batch_size, seed=config.seed, transform=transform)
    rows = pipeline.process_rows(bsh, t.batch_size)

    def get_batch(step):
      return pipeline.to_global(batcher.local_batch(step, rows), bsh, t.batch_size)

    evaluate = None
    if eval_fn is not None:
      if eval_source is None:
        raise ValueError("fit: eval_fn needs eval_source")
      eval_step = step_lib.make_eval_step(modeldef, eval_fn, shardings, bsh)
      eb = t.eval_batch_size or t.batch_size
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

    extra = {"num_params": param_count(state.params), "num_devices": num_devices, "mesh": dict(mesh.shape)}
    state, summary = run_loop(config, workdir, state, shardings, train_step, get_batch, evaluate=evaluate,
                              hooks=hooks, extra_summary=extra, summarise=summarise)
  return FitResult(state=state, summary=summary, modeldef=modeldef, mesh=mesh, shardings=shardings)


# ------------------------------------------------------------------------------------------- helpers


def _flush(pending, writer, step, seconds, check=True) -> dict[str, float]:
  """Fetches pending step metrics (one host sync), checks them, writes their window average."""
  values = jax.device_get([m for _, m in pending])
  if check:
    for (s, _), row in zip(pending, values):
      for k, v in row.items():
        v = v.value if isinstance(v, metrics_lib.Weighted) else v
        if not np.all(np.isfinite(v)):
          raise NonFiniteError(
              f"{k} became {float(np.asarray(v).ravel()[0])} at step {s}; lower the learning rate "
              "(config.train.optimizer.learning_rate), set config.train.optimizer.clip_norm, or check the data")
  mean = metrics_lib.aggregate(values)
  if values:
    mean["train/steps_per_sec"] = len(values) / max(seconds, 1e-9)
    writer.write(step, mean)
  return mean


def _final_rows(workdir: str, step: int) -> tuple[dict, dict]:
  """(train, eval) metrics of `step` as its rows recorded them: the train window's row (the one with
  train/steps_per_sec) and the evaluation's row ({} where there is none)."""
  rows = [r for r in metrics_lib.read_metrics(workdir) if r.get("step") == step]
  strip = lambda r: {k: v for k, v in r.items() if k != "step"}  # noqa: E731
  train = next((strip(r) for r in reversed(rows) if "train/steps_per_sec" in r), {})
  evals = next((strip(r) for r in reversed(rows) if "train/steps_per_sec" not in r), {})
  return train, evals


def _check_params_match(given, expected):
  from jaxlab.checkpoint import check_signature, signature  # pylint: disable=g-import-not-at-top
  check_signature(signature({"params": given}), signature({"params": expected}), "initial_params")


def _deleted(state) -> bool:
  return any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state))


class StopFlag:
  """Within the block, SIGTERM and Ctrl-C (SIGINT) set `signum` instead of interrupting (main thread only).

  The runners check it between steps (stages): they checkpoint, then raise `Preempted` (SIGTERM) or
  `Interrupted` (Ctrl-C), so the signal never lands inside a checkpoint write or a compile. A second Ctrl-C
  interrupts at once (the step in progress is then not saved).
  """

  def __init__(self):
    self.signum = None
    self._old = {}

  @property
  def raised(self) -> bool:
    return self.signum is not None

  def stop(self, where: str) -> None:
    """Raises the interrupt the flag holds (call after the checkpoint is written)."""
    if self.signum == signal.SIGTERM:
      raise Preempted(f"SIGTERM {where}")
    raise Interrupted(f"Ctrl-C {where}")

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._old[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    if signum == signal.SIGINT and self.signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.signum = signum

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
    return False
