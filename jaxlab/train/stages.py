"""The third run shape: an ordered sequence of named stages, each recorded, checkpointed and skipped on rerun.

For experiments that are not one optimizer over batches: estimator sweeps, solver runs, evaluations at a
list of budgets, a training stage followed by analysis stages. ::

    def train_and_evaluate(config, workdir):
      stages = {f"walks{w}": functools.partial(estimate, walks=w) for w in config.method.walks}
      stages["downstream"] = downstream
      return run_stages(config, workdir, stages)

    def estimate(ctx, walks):                 # ctx: StageContext
      ...
      return {"err/swing": 0.12, "k_hat": np.ndarray}   # scalars/lists -> JSON, arrays -> stages/<name>.npz

Each stage function takes a `StageContext` and returns a mapping of its results: JSON values (numbers,
strings, bools, None, lists and dicts of them) and numpy / jax arrays (small arrays; nested dicts allowed).
After a stage returns, its arrays go to `workdir/stages/<index>_<name>.npz`, its JSON values to one row
of metrics.jsonl (`{"step": index + 1, "stage": name, ...}`), and a checkpoint records every finished
stage's JSON results plus the carried state (`ctx.state`, any pytree of arrays, for stages that continue
each other's work). A rerun restores the newest checkpoint, skips the finished stages (their results are
read back into `ctx.results`) and runs the rest; an interrupted stage runs again from the start, unless
it keeps its own resumable sub-run in `ctx.subdir()` (e.g. a `run_loop` over many steps). SIGTERM or
Ctrl-C inside a stage lets the stage finish and be recorded, then stops (a second Ctrl-C drops the stage at
once); the next run resumes from there and ends identical to an uninterrupted run. summary.json is written once,
at the end, from the stages' results (`summarise`), and a finished run returns it without rerunning.
The run works inside the config's mesh and logical rules (`jaxlab.mesh.use_config`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Any, Callable, Mapping

import jax
import ml_collections
import numpy as np

from jaxlab import checkpoint as ckpt_lib
from jaxlab import configs
from jaxlab import faults
from jaxlab import mesh as mesh_lib
from jaxlab import metrics as metrics_lib
from jaxlab import progress
from jaxlab import workdir as workdir_lib
from jaxlab.errors import CheckpointError, ConfigError, Interrupted
from jaxlab.state import abstract_with_shardings
from jaxlab.train import loop as loop_lib

log = logging.getLogger("jaxlab")

Results = dict[str, dict[str, Any]]


@dataclasses.dataclass
class StageContext:
  """What a stage function sees.

  Attributes:
    config: the run's config.
    workdir: the run directory.
    name: this stage's name.
    index: this stage's position (0-based).
    results: {stage name: results} of the stages finished before this one (arrays as numpy).
    state: the carried state (the `state` given to `run_stages`, as left by the previous stage); a stage
      that continues it assigns `ctx.state = new_state`.
    mesh: the run's mesh (also in context: `jaxlab.mesh.current_mesh()`).
  """
  config: ml_collections.ConfigDict
  workdir: str
  name: str
  index: int
  results: Results
  state: Any
  mesh: Any

  def subdir(self) -> str:
    """`workdir/stages/<name>/`, created: the place for a stage's own resumable sub-run."""
    path = os.path.join(self.workdir, "stages", _safe(self.name))
    os.makedirs(path, exist_ok=True)
    return path

  def key(self) -> jax.Array:
    """A PRNG key for this stage: `fold_in(key(config.seed), index)`."""
    return jax.random.fold_in(jax.random.key(self.config.seed), self.index)


StageFn = Callable[[StageContext], Mapping[str, Any]]


def run_stages(config: ml_collections.ConfigDict, workdir: str, stages: Mapping[str, StageFn] , *,
               state: Any = None, shardings: Any = None,
               summarise: Callable[[Results], Mapping[str, Any]] | None = None,
               extra_summary: Mapping[str, Any] | None = None) -> dict:
  """Runs the stages in order; resumable, each stage recorded once.

  Args:
    config: a finalized config (uses seed, mesh, sharding_rules, tensorboard).
    workdir: run directory (config.json, metrics.jsonl, summary.json, checkpoints/, stages/).
    stages: ordered mapping stage name -> `fn(ctx: StageContext) -> results mapping`. Names are unique and
      may use any characters (file names replace the unsafe ones).
    state: optional carried state (a pytree of arrays) the stages continue (`ctx.state`); checkpointed
      after every stage.
    shardings: NamedShardings matching `state` (default: replicated on the run's mesh); the state is put
      there before the first stage and restored there on resume.
    summarise: `results -> summary` (default: the union of the stages' JSON results, later stages winning).
    extra_summary: entries added to the summary.

  Returns:
    The summary dict (also `workdir/summary.json`), with `stages` (the names), `wall_s` (over all sessions
    of the run) and `resumes` added.

  Raises:
    CheckpointError: the workdir holds a run of another experiment or with other stages.
    ConfigError: the workdir was started with a different config.
  """
  names = list(stages)
  if len(set(names)) != len(names):
    raise ConfigError(f"run_stages: stage names must be unique, got {names}")
  t_start = time.time()
  configs.check_devices(config, jax.device_count())
  workdir_lib.check(config, workdir)              # refusals come before anything is written
  summary_path = os.path.join(workdir, "summary.json")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  with mesh_lib.use_config(config) as mesh:
    if state is not None:   # the carried state lives on the run's mesh (replicated unless told otherwise)
      if shardings is None:
        shardings = jax.tree.map(lambda _: mesh_lib.replicated(mesh), state)
      state = jax.device_put(state, shardings)
    ckpt, claimed = None, False
    try:
      if os.path.isdir(ckpt_dir):
        ckpt = ckpt_lib.Checkpointer(ckpt_dir, keep=2, async_save=False)
        done, results, state, clock = _restore(ckpt, workdir, names, state, shardings)
      else:   # no stage finished yet; a config.json says an earlier session started (its stages may have resumed)
        done, results, clock = [], {}, _Clock(0.0, int(os.path.exists(os.path.join(workdir, "config.json"))))
      if len(done) == len(names):
        finished = metrics_lib.read_json_or_none(summary_path, "it is written anew from the stages' records")
        if finished is not None:
          log.info("%s already finished (%d stages)", workdir, len(names))
          return finished
      workdir_lib.claim(config, workdir)     # takes the workdir's lock (refused while another process holds it)
      claimed = True
      if ckpt is None:
        ckpt = ckpt_lib.Checkpointer(ckpt_dir, keep=2, async_save=False)
      summary = _run(config, workdir, stages, names, done, results, state, mesh, ckpt, t_start, clock)
    except BaseException:
      if claimed:
        workdir_lib.release(workdir)
      raise
    finally:
      if ckpt is not None:
        ckpt.close()
  try:
    summary = dict(summarise(summary) if summarise is not None else union(summary))
    summary.update(extra_summary or {})
    summary.update(stages=names, wall_s=clock.wall_before + time.time() - t_start, resumes=clock.resumes)
    metrics_lib.write_json(summary_path, summary)
  finally:
    workdir_lib.release(workdir)
  return summary


def stage_arrays(workdir: str, index: int, name: str, sha256: str | None = None) -> dict[str, Any]:
  """The arrays a finished stage returned (nested dicts of numpy arrays; {} when it returned none).

  Args:
    sha256: the file's digest recorded in the stage's checkpoint (checked when given).
  """
  path = _npz_path(workdir, index, name)
  if not os.path.exists(path):
    return {}
  try:
    if sha256 is not None and metrics_lib.file_sha256(path) != sha256:
      raise ValueError("its bytes do not match the checksum recorded in the stage's checkpoint")
    with np.load(path, allow_pickle=False) as z:
      return _unflatten({k: z[k] for k in z.files})
  except Exception as e:  # pylint: disable=broad-except  (zip, pickle and JSON key errors of a damaged file)
    why = str(e) if str(e).startswith("its bytes") else type(e).__name__
    raise CheckpointError(f"{path}, the arrays of stage {index + 1} ({name}), is damaged ({why}); "
                          f"delete {os.path.join(workdir, 'checkpoints')} to recompute the stages, or use another "
                          "--workdir") from None


# ------------------------------------------------------------------------------------------- helpers


def _run(config, workdir, stages, names, done, results, state, mesh, ckpt, t_start, clock) -> Results:
  writer = metrics_lib.MetricWriter(workdir, resume_step=len(done), tensorboard=config.tensorboard,
                                    replay=lambda rows: _missing_rows(rows, done, results))
  run_name = os.path.basename(os.path.normpath(workdir))
  bar = progress.bar(len(names), initial=len(done), desc=run_name)
  stop_flag = loop_lib.StopFlag()
  index = len(done)
  try:
    with stop_flag:
      for index in range(len(done), len(names)):
        name = names[index]
        bar.set_description(f"{run_name}: {name}")
        ctx = StageContext(config=config, workdir=workdir, name=name, index=index, results=results,
                           state=state, mesh=mesh)
        t0 = time.time()
        out = stages[name](ctx)
        if out is None:
          out = {}
        if not isinstance(out, Mapping):
          raise TypeError(f"run_stages: stage {name!r} must return a mapping of results, got {type(out).__name__}")
        reserved = sorted(set(out) & {"step", "stage", "wall_s"})
        if reserved:
          raise ValueError(f"run_stages: stage {name!r} returned the reserved key(s) {reserved} (each metrics row "
                           "has its own step, stage and wall_s); rename them")
        scalars, arrays = _split(dict(out))
        state = ctx.state
        if arrays and metrics_lib.is_main_process():
          path = _npz_path(workdir, index, name)
          _save_npz(path, arrays)
          clock.array_checksums[os.path.basename(path)] = metrics_lib.file_sha256(path)
        results[name] = _merge(scalars, jax.tree.map(np.asarray, arrays))
        meta = {"config": config.to_dict(), "stages": names[:index + 1],
                "results": metrics_lib.jsonable({n: _split(results[n])[0] for n in names[:index + 1]}),
                "wall_s": clock.wall_before + time.time() - t_start, "resumes": clock.resumes,
                "stage_checksums": dict(clock.array_checksums)}
        ckpt.save(index + 1, state, meta, force=True)
        writer.write(index + 1, {"stage": name, **_flat_numbers(scalars), "wall_s": time.time() - t0})
        bar.update(1)
        if stop_flag.raised and index + 1 < len(names):
          try:
            stop_flag.stop(f"after stage {index + 1} ({name})")
          except Interrupted as e:
            e.workdir, e.step, e.checkpoint = workdir, index + 1, index + 1
            raise
  except KeyboardInterrupt as e:   # Ctrl-C inside a stage: that stage is dropped, the finished ones are kept
    if not isinstance(e, Interrupted):
      e = Interrupted(f"Ctrl-C in stage {index + 1} ({names[index]})")
    elif e.workdir != workdir:     # raised by a stage's own sub-run (which saved its step): say what it saved
      sub = (f"{e.checkpoint} of stage {index + 1}'s run {os.path.relpath(e.workdir, workdir)}"
             if e.workdir is not None and e.checkpoint is not None else None)
      e = type(e)(f"{e} in stage {index + 1} ({names[index]})", signum=e.signum)
      if sub is not None:
        e.workdir, e.step, e.checkpoint = workdir, index, sub
    if e.workdir is None:
      e.workdir, e.step, e.checkpoint = workdir, index, ckpt.latest_step()
    raise e from None
  finally:
    bar.close()
    writer.close()
  return results


def _missing_rows(rows, done, results) -> list[dict]:
  """The metrics rows of finished stages that metrics.jsonl lacks (a kill between a stage's checkpoint and its
  row), rebuilt from the checkpoint's record of the stage (its wall time is not recorded: null)."""
  have = {r.get("step") for r in rows if "stage" in r}
  return [{"step": i + 1, "stage": name, **_flat_numbers(_split(results[name])[0]), "wall_s": None}
          for i, name in enumerate(done) if i + 1 not in have]


def _restore(ckpt, workdir, names, state, shardings):
  """(finished stage names, their results, the carried state) from the newest checkpoint."""
  def same_stages(meta):
    done = list(meta.get("stages", []))
    if done != names[:len(done)]:
      raise CheckpointError(
          f"{workdir} holds a run whose stages ({', '.join(done[:4])}{', ...' if len(done) > 4 else ''}) are not "
          f"those of this config ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}); use another --workdir")

  target = abstract_with_shardings(shardings, state) if state is not None else None
  found = ckpt.restore_newest(target, check_meta=same_stages)     # a damaged newest: the one before it
  if found is None:
    return [], {}, state, _Clock(0.0, int(os.path.exists(os.path.join(workdir, "config.json"))))
  _, items, meta = found
  done = list(meta.get("stages", []))
  if state is not None:
    state = ckpt_lib.from_items(items, state)
  results = {}
  sums = dict(meta.get("stage_checksums", {}))    # absent in checkpoints written before they were recorded
  for i, name in enumerate(done):
    sha = sums.get(os.path.basename(_npz_path(workdir, i, name)))
    results[name] = _merge(meta["results"].get(name, {}), stage_arrays(workdir, i, name, sha))
  log.info("resumed %s after stage %d (%s)", workdir, len(done), done[-1] if done else "-")
  return done, results, state, _Clock(float(meta.get("wall_s", 0.0)), int(meta.get("resumes", 0)) + 1, sums)


@dataclasses.dataclass
class _Clock:
  wall_before: float   # wall time of the earlier sessions of this run
  resumes: int         # how many times the run was resumed
  array_checksums: dict = dataclasses.field(default_factory=dict)   # stages/*.npz file name -> sha256


def _split(out: Mapping[str, Any]) -> tuple[dict, dict]:
  """(JSON part, array part) of a stage's results; numpy / jax scalars count as JSON numbers."""
  scalars, arrays = {}, {}
  for k, v in out.items():
    if isinstance(v, Mapping):
      s, a = _split(v)
      if s:
        scalars[k] = s
      if a:
        arrays[k] = a
    elif isinstance(v, (np.ndarray, jax.Array)) and np.ndim(v) > 0:
      arrays[k] = v
    elif isinstance(v, (np.generic, jax.Array)) or (isinstance(v, np.ndarray) and v.ndim == 0):
      scalars[k] = np.asarray(v).item()
    else:
      scalars[k] = v
  return scalars, arrays


def _flat_numbers(scalars: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """The numbers / bools / strings of a stage's JSON results, nested keys joined by '/' (one metrics row)."""
  out = {}
  for k, v in scalars.items():
    if isinstance(v, Mapping):
      out.update(_flat_numbers(v, f"{prefix}{k}/"))
    elif isinstance(v, (int, float, bool, str)) or v is None:
      out[f"{prefix}{k}"] = v
  return out


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
  """Deep merge of two nested dicts (b's leaves win)."""
  out = dict(a)
  for k, v in b.items():
    out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
  return out


def union(results: Results) -> dict[str, Any]:
  """The default summary of a staged run: the union of its stages' JSON results (later stages win); a custom
  `summarise` can start from it."""
  out: dict[str, Any] = {}
  for r in results.values():
    out.update(_split(r)[0])
  return out


def _safe(name: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.@=-]+", "_", name)


def _npz_path(workdir: str, index: int, name: str) -> str:
  return os.path.join(workdir, "stages", f"{index:03d}_{_safe(name)}.npz")


def _save_npz(path: str, arrays: Mapping[str, Any]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  flat = {json.dumps([_key_of(p) for p in keys]): np.asarray(v)
          for keys, v in jax.tree_util.tree_flatten_with_path(jax.device_get(dict(arrays)))[0]}
  tmp = path[:-len(".npz")] + ".tmp.npz"
  faults.boundary("stage_arrays")
  np.savez(tmp, **flat)
  os.replace(tmp, path)
  faults.boundary("stage_arrays/done")


def _key_of(entry) -> str | int:
  key = getattr(entry, "key", getattr(entry, "idx", entry))
  return key if isinstance(key, (str, int)) else str(key)


def _unflatten(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """Inverse of `_save_npz`'s flattening: the file keys are JSON lists of the nested keys (ints stay ints, as
  in NNX parameter dicts)."""
  out: dict[str, Any] = {}
  for key, v in flat.items():
    node = out
    *parents, leaf = json.loads(key)
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out
