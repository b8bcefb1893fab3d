"""Strong-branching sample collection in worker processes of their own, cached as one `.npz` shard per instance.

SCIP work is CPU-bound and single-threaded, so collection runs one instance per worker process at a time. The
workers are plain `python -m jaxlab.milp.collect --jobs FILE` processes, not `multiprocessing` children: a spawned
multiprocessing child re-imports the parent's main module (which imports JAX), and a forked one would inherit
JAX's threads; these workers import numpy, scipy and PySCIPOpt only (each shard records that JAX was not loaded).

A job names an instance (a generator with its sizes and seed, or a `.lp`/`.mps` file) and how to sample it; its
shard `<out_dir>/<index:05d>.npz` is written atomically when the instance is done, so a killed collection resumes
with the instances it had not finished. A progress bar counts finished instances.

Shard format: per-sample arrays concatenated along their first axis with a `<field>_len` array of per-sample
lengths (`row_feats`, `col_feats`, `edge_feats`, `edge_index` as (E, 2), `cands`, `scores`; the edges once when
every node has the same ones, `edges_shared`), plus per-sample `depth` and `node_feats`, and instance-level
`meta` (JSON: nodes, SCIP time, strong-branching time, samples).
`load` turns shards back into a list of sample dicts (the format of `jaxlab.milp.gcnn.pack`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

import numpy as np

RAGGED = ("row_feats", "col_feats", "edge_feats", "edge_index", "cands", "scores")


def job(index: int, *, generator: str | None = None, sizes: dict | None = None, seed: Sequence[int] = (0,),
        path: str | None = None, settings: dict | None = None, p_expert: float = 0.15, explore: str = "random",
        itlim: int | None = None, max_samples: int | None = None, all_depth_le: int = -1,
        record_tied: bool = False, transform: dict | None = None) -> dict:
  """One instance's collection job (JSON-serialisable).

  Args:
    index: the shard number (unique within an output folder).
    generator, sizes, seed: a `jaxlab.milp.generators` kind, its keyword sizes, and the numpy seed sequence.
    path: instead of a generator, a user's `.lp` / `.mps` file.
    settings: `jaxlab.milp.scip_env.Settings` fields.
    p_expert, explore, itlim, max_samples, all_depth_le, record_tied: the sampling rule
      (`scip_env.make_recorder`); the rule's coin flips use the seed sequence extended by 1.
    transform: optional {"kind": "equivalent" | "perturb", "seed": [...], **kwargs}: collect on a transformed copy
      (`jaxlab.milp.augment`).
  """
  if (generator is None) == (path is None):
    raise ValueError("a collection job needs exactly one of generator= and path=")
  return dict(index=int(index), generator=generator, sizes=dict(sizes or {}), seed=[int(s) for s in seed],
              path=path, settings=dict(settings or {}), p_expert=float(p_expert), explore=explore,
              itlim=itlim, max_samples=max_samples, all_depth_le=int(all_depth_le),
              record_tied=bool(record_tied), transform=transform)


def make_instance(j: dict):
  """The instance of a job (generated or read, then transformed when the job says so)."""
  from jaxlab.milp import augment, generators, instance  # pylint: disable=g-import-not-at-top
  if j.get("path"):
    inst = instance.read(j["path"])
  else:
    inst = generators.generate(j["generator"], np.random.default_rng(j["seed"]), **j["sizes"])
  t = j.get("transform")
  if t:
    kw = {k: v for k, v in t.items() if k not in ("kind", "seed")}
    rng = np.random.default_rng(t["seed"])
    if t["kind"] == "equivalent":
      inst, _ = augment.equivalent(inst, rng, **kw)
    elif t["kind"] == "perturb":
      inst = augment.perturb(inst, rng, **kw)
    else:
      raise ValueError(f"transform kind {t['kind']!r} must be 'equivalent' or 'perturb'")
  return inst


def shard_path(out_dir: str, index: int) -> str:
  return os.path.join(out_dir, f"{index:05d}.npz")


def run_job(j: dict, out_dir: str) -> dict:
  """Collects one instance and writes its shard; returns the shard's meta."""
  from jaxlab.milp import scip_env  # pylint: disable=g-import-not-at-top
  inst = make_instance(j)
  settings = scip_env.Settings(**j["settings"])
  model, _ = scip_env.build_model(inst, settings)
  rule = scip_env.make_recorder(model, p_expert=j["p_expert"], rng=np.random.default_rng(j["seed"] + [1]),
                                explore=j["explore"], itlim=j["itlim"], max_samples=j["max_samples"],
                                all_depth_le=j["all_depth_le"], record_tied=j["record_tied"])
  t0 = time.perf_counter()
  model.optimize()
  meta = {"index": j["index"], "samples": len(rule.samples), "nodes": int(model.getNNodes()),
          "scip_time": float(model.getSolvingTime()), "wall": time.perf_counter() - t0, "sb_time": rule.sb_time,
          "tied": rule.tied, "status": model.getStatus(), "jax_imported": "jax" in sys.modules, "rows": inst.num_rows,
          "cols": inst.num_cols}
  model.freeProb()
  save_shard(shard_path(out_dir, j["index"]), rule.samples, meta)
  return meta


def save_shard(path: str, samples: list[dict], meta: dict) -> None:
  arrays: dict[str, Any] = {"meta": np.array(json.dumps(meta))}
  # Without cuts every node of an instance has the same rows, so the edges are stored once when they repeat.
  shared = len(samples) > 1 and all(np.array_equal(s[f], samples[0][f]) for s in samples[1:]
                                    for f in ("edge_index", "edge_feats"))
  arrays["edges_shared"] = np.array(shared)
  for f in RAGGED:
    rows = samples[:1] if shared and f in ("edge_index", "edge_feats") else samples
    parts = [np.asarray(s[f]).T if f == "edge_index" else np.asarray(s[f]) for s in rows]
    arrays[f"{f}_len"] = np.array([len(p) for p in parts], np.int64)
    if parts:
      arrays[f] = np.concatenate(parts, 0)
  arrays["depth"] = np.array([int(s["depth"]) for s in samples], np.int32)
  from jaxlab.milp.scip_env import NODE_FEATURES  # pylint: disable=g-import-not-at-top
  arrays["node_feats"] = np.array([s["node_feats"] for s in samples], np.float32).reshape(len(samples),
                                                                                          len(NODE_FEATURES))
  tmp = path + ".tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


def load_shard(path: str) -> tuple[list[dict], dict]:
  """(samples, meta) of one shard."""
  with np.load(path) as z:
    meta = json.loads(str(z["meta"]))
    n = len(z["depth"])
    cut = {f: np.concatenate([[0], np.cumsum(z[f"{f}_len"])]) for f in RAGGED}
    data = {f: z[f] if n else None for f in RAGGED}
    shared = bool(z["edges_shared"]) if "edges_shared" in z else False
    samples = []
    for i in range(n):
      s = {f: data[f][cut[f][j]:cut[f][j + 1]]
           for f in RAGGED for j in [0 if shared and f in ("edge_index", "edge_feats") else i]}
      s["edge_index"] = np.ascontiguousarray(s["edge_index"].T)
      s["depth"] = np.int32(z["depth"][i])
      s["node_feats"] = z["node_feats"][i]
      s["instance"] = int(meta["index"])
      samples.append(s)
  return samples, meta


def load(out_dir: str, indices: Sequence[int] | None = None) -> tuple[list[dict], list[dict]]:
  """(samples, metas) of the shards in `out_dir` (all, or those of `indices`), in index order."""
  if indices is None:
    indices = sorted(int(f[:-4]) for f in os.listdir(out_dir) if f.endswith(".npz") and f[:-4].isdigit())
  samples, metas = [], []
  for i in indices:
    s, m = load_shard(shard_path(out_dir, i))
    samples += s
    metas.append(m)
  return samples, metas


def collect(jobs: Sequence[dict], out_dir: str, workers: int = 2, desc: str = "collect", poll_s: float = 0.25,
            timeout_s: float | None = None) -> list[dict]:
  """Runs the jobs whose shards are missing in `workers` processes; returns every job's meta (index order).

  Resumable: finished shards are kept, a rerun does the rest. A worker that fails raises RuntimeError with the end
  of its error output (the shards it finished stay).
  """
  from jaxlab import progress  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  if len({j["index"] for j in jobs}) != len(jobs):
    raise ValueError("collection jobs need distinct indices (one shard each)")
  todo = [j for j in jobs if not os.path.exists(shard_path(out_dir, j["index"]))]
  if todo:
    workers = max(1, min(int(workers), len(todo)))
    procs = []
    for w in range(workers):
      spec = os.path.join(out_dir, f".jobs{w}.json")
      with open(spec, "w") as f:
        json.dump({"out_dir": out_dir, "jobs": todo[w::workers]}, f)
      env = dict(os.environ, JAX_PLATFORMS="cpu")
      procs.append(subprocess.Popen([sys.executable, "-m", "jaxlab.milp.collect", "--jobs", spec],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env))
    t0 = time.time()
    try:
      with progress.bar(total=len(jobs), initial=len(jobs) - len(todo), desc=desc) as bar:
        while True:
          done = sum(os.path.exists(shard_path(out_dir, j["index"])) for j in jobs)
          bar.update(done - bar.n)
          if all(p.poll() is not None for p in procs):
            break
          if timeout_s is not None and time.time() - t0 > timeout_s:
            raise TimeoutError(f"collection into {out_dir} ran past {timeout_s} s; rerun to continue")
          time.sleep(poll_s)
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
      errors = [(p.wait(), p.stderr.read().decode(errors="replace")) for p in procs]
    bad = [e for code, e in errors if code != 0]
    if bad:
      raise RuntimeError(f"a collection worker failed (finished shards in {out_dir} are kept; rerun to continue):\n"
                         + bad[0][-3000:])
  return [json.loads(str(np.load(shard_path(out_dir, j["index"]))["meta"])) for j in jobs]


def collect_splits(splits: Mapping[str, tuple[Sequence[dict], str]], workers: int = 2) -> tuple[dict, list[dict]]:
  """Collects each split's jobs into its folder ({split: (jobs, out_dir)}, in order); returns (the summary
  entries "collect/<split>/samples" and "/instances", "collect/jax_in_workers" and the `throughput` keys, every
  job's meta). A split whose instances gave no labelled sample is a clear error."""
  out, metas = {}, []
  for split, (jobs, out_dir) in splits.items():
    m = collect(jobs, out_dir, workers, desc=f"collect {split}")
    metas += m
    n = sum(x["samples"] for x in m)
    if n == 0:
      raise RuntimeError(f"the {split} instances gave no strong-branching samples (every instance solved at the "
                         "root?): use larger instances or a higher config.data.p_expert")
    out[f"collect/{split}/samples"] = n
    out[f"collect/{split}/instances"] = len(m)
  out["collect/jax_in_workers"] = any(x["jax_imported"] for x in metas)
  out.update({f"collect/{k}": v for k, v in throughput(metas).items()})
  return out, metas


def throughput(metas: Sequence[dict]) -> dict[str, float]:
  """Labelled samples per second of worker time (= per core), and the strong-branching share of that time."""
  samples = sum(m["samples"] for m in metas)
  wall = sum(m["wall"] for m in metas)
  return {"samples": samples, "samples_per_s_per_core": samples / max(wall, 1e-9),
          "sb_share": sum(m["sb_time"] for m in metas) / max(wall, 1e-9), "worker_s": wall}


def _main(argv=None) -> None:
  p = argparse.ArgumentParser(description="jaxlab MILP collection worker (started by jaxlab.milp.collect.collect)")
  p.add_argument("--jobs", required=True, help="JSON file {out_dir, jobs}")
  args = p.parse_args(argv)
  with open(args.jobs) as f:
    spec = json.load(f)
  for j in spec["jobs"]:
    if not os.path.exists(shard_path(spec["out_dir"], j["index"])):
      run_job(j, spec["out_dir"])


if __name__ == "__main__":
  _main()
