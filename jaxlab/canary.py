"""Canaries: prove that a change to the code changes no number a claim could read, in minutes.

Every experiment declares a canary in its config.py: `CANARY`, dotted overrides that shrink its tiny variant
(one seed, `SEEDS[0]`, a few steps per stage, small data) so that the run still passes through every stage, arm
and claim function of the claim run, in about a minute or less on 2 CPU cores. Values may name `{tmp}`, a
scratch folder of the run (e.g. a cache path). `CANARY_VOLATILE` (optional) lists further regular expressions
of keys that are timings (see `VOLATILE`).

The canary's fingerprint is a sha256 over everything the run writes that a claim could read: every
metrics.jsonl row, summary.json and other JSON outputs (timings excluded), the arrays of stage outputs
(`stages/*.npz`), the newest checkpoint of every run and sub-run (its arrays restored with Orbax, so parameters
and optimizer state count bit for bit; its metadata JSON too), other files by their bytes, and the claims
measured on the one seed. Plots and TensorBoard event files are left out (they are drawn from the rows above
and carry wall times).

    python -m jaxlab.reproduce --verify [PAPER ...]     # default: every experiment whose ledger is stale

For each experiment, `verify` finds the baseline: a commit whose copy of the ledger's `sources` has exactly
the ledger's digests (HEAD first, then the ledger's own commit and its later commits). It runs the canary there
(in a temporary `git worktree`, with this interpreter and these installed packages) and on the working tree,
on this machine, with one persistent compilation cache for both (an unchanged program compiles once; a
changed one compiles anew, so the cache cannot hide a difference). Equal fingerprints re-stamp the ledger's
`sources` with today's digests and append a `verified` record ({"from", "to", "dirty", "canary", "machine",
"date"}); otherwise it prints the first output that differs (file, step, key) and leaves the ledger stale, so
that experiment needs `python -m jaxlab.reproduce PAPER`. Baseline fingerprints are kept under
`--out` (default results/verify), and verified experiments are no longer stale, so an interrupted verify
resumes where it stopped.

This file runs in two roles. Imported (`jaxlab.canary`), it is the parent: `verify`. Run as a script by the
parent (`_child_main`), it is the canary of one tree: it points `jaxlab` at that tree before importing it,
so its own top-level imports are the standard library and numpy only.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

VOLATILE = (r"wall", r"per_sec", r"per_s($|[/_])", r"_s$", r"(^|/)speed", r"(^|/)resumes$", r"(^|[/_])time",
            r"(^|[/_])ms($|[/_])", r"seconds", r"(^|/)date$")   # timings: keys matching any of these
# Checksums a checkpoint records of its own arrays and of the stage files (`checkpoint.checksums`, run_stages'
# `stage_checksums`): derived from outputs the fingerprint already holds bit for bit, and newer than some ledgers.
DERIVED = (r"(^|/)(stage_)?checksums$",)
SKIP_SUFFIXES = (".png", ".pdf", ".svg", ".gif", ".jpg", ".tmp", ".lock", ".log")
CHILD_TIMEOUT_S = 1800
_GIT = threading.Lock()     # git commands of the parent, one at a time
SCRATCH = "{tmp}"


# ------------------------------------------------------------------------------------ fingerprint (child)


def _volatile(key: str, extra: Sequence[str] = ()) -> bool:
  return any(re.search(p, key) for p in (*VOLATILE, *DERIVED, *extra))


def _clean(obj: Any, extra: Sequence[str], prefix: str = "") -> Any:
  """JSON data without timing keys (at any depth), floats as their exact repr (NaN and inf included)."""
  if isinstance(obj, dict):
    return {k: _clean(v, extra, f"{prefix}{k}/") for k, v in sorted(obj.items())
            if not _volatile(f"{prefix}{k}", extra)}
  if isinstance(obj, (list, tuple)):
    return [_clean(v, extra, prefix) for v in obj]
  if isinstance(obj, float):
    return repr(obj)
  return obj


def _array_digest(x) -> str:
  a = np.ascontiguousarray(np.asarray(x))
  h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
  h.update(a.tobytes())
  return h.hexdigest()[:32]


def _checkpoint(step_dir: str, extra: Sequence[str]) -> dict[str, Any]:
  """{item: {leaf path: digest}} of a checkpoint step folder (array items restored; JSON items cleaned)."""
  import warnings  # pylint: disable=g-import-not-at-top
  out = {}
  for item in sorted(os.listdir(step_dir)):
    path = os.path.join(step_dir, item)
    if not os.path.isdir(path):
      continue
    if os.path.exists(os.path.join(path, "_METADATA")):
      import jax  # pylint: disable=g-import-not-at-top
      import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = ocp.PyTreeCheckpointer().restore(path)
      leaves = jax.tree_util.tree_flatten_with_path(tree)[0]

      def data(x):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
          return jax.random.key_data(x)
        return x
      out[item] = {jax.tree_util.keystr(p): _array_digest(data(x)) for p, x in leaves}
    else:
      out[item] = {f: _file(os.path.join(path, f), extra) for f in sorted(os.listdir(path))
                   if f != "commit_success.txt" and os.path.isfile(os.path.join(path, f))}
  return out


def _file(path: str, extra: Sequence[str]) -> Any:
  if path.endswith(".jsonl"):
    with open(path) as f:
      return [_clean(json.loads(line), extra) for line in f if line.strip()]
  if path.endswith(".npz") or path.endswith(".npy"):
    try:
      with np.load(path, allow_pickle=False) as z:
        return {k: _array_digest(z[k]) for k in sorted(z.files)}
    except (ValueError, AttributeError):     # .npy: no context manager / files
      return {"": _array_digest(np.load(path, allow_pickle=False))}
  with open(path, "rb") as f:
    data = f.read()
  try:
    return _clean(json.loads(data), extra)
  except ValueError:
    return hashlib.sha256(data).hexdigest()[:32]


def manifest(workdir: str, extra: Sequence[str] = ()) -> dict[str, Any]:
  """{relative path: normalized content} of everything under `workdir` a claim could read (see the module)."""
  out = {}
  for here, dirs, files in os.walk(workdir):
    dirs.sort()
    rel = os.path.relpath(here, workdir)
    if os.path.basename(here) == "checkpoints":
      steps = sorted((d for d in dirs if d.isdigit()), key=int)
      if steps:
        out[os.path.join(rel, steps[-1])] = _checkpoint(os.path.join(here, steps[-1]), extra)
      dirs[:] = [d for d in dirs if not d.isdigit()]
    for f in sorted(files):
      if f.endswith(SKIP_SUFFIXES) or f.startswith("events.out.tfevents") or _volatile(f, extra):
        continue
      out[os.path.normpath(os.path.join(rel, f))] = _file(os.path.join(here, f), extra)
  return out


def fingerprint(m: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()


def first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
  """Where two manifests first differ, in words (file, step, key), or None when equal."""
  for key in sorted(set(a) | set(b), key=lambda k: (k != "claims", k)):
    if key not in a or key not in b:
      return f"{key}: only in the {'baseline' if key in a else 'working tree'} run"
    x, y = a[key], b[key]
    if x == y:
      continue
    if isinstance(x, list) and isinstance(y, list):
      for i, (r, s) in enumerate(zip(x, y)):
        if r != s:
          where = f"row {i + 1}" + (f", step {r.get('step')}" if isinstance(r, dict) and "step" in r else "")
          if isinstance(r, dict) and isinstance(s, dict):
            k = next(k for k in sorted(set(r) | set(s)) if r.get(k) != s.get(k))
            return f"{key}, {where}, {k}: {r.get(k)} (baseline) vs {s.get(k)} (working tree)"
          return f"{key}, {where}: {r} vs {s}"
      return f"{key}: {len(x)} rows (baseline) vs {len(y)} (working tree)"
    if isinstance(x, dict) and isinstance(y, dict):
      inner = first_difference(x, y)
      return f"{key}/{inner}"
    return f"{key}: {str(x)[:80]} (baseline) vs {str(y)[:80]} (working tree)"
  return None


class _TreeFinder:
  """Maps the jaxlab namespace (setup.py's package_dir) to the folders of one tree, ahead of the installed one."""

  def __init__(self, root: str):
    self.folders = {"jaxlab": os.path.join(root, "jaxlab"), "jaxlab.kernels": os.path.join(root, "kernels"),
                    "jaxlab.experiments": os.path.join(root, "experiments")}

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    import importlib.util  # pylint: disable=g-import-not-at-top
    folder = self.folders.get(fullname)
    if folder is None:
      return None
    return importlib.util.spec_from_file_location(fullname, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])


def _child_main(argv: Sequence[str]) -> int:
  """Runs one canary: argv = ROOT PAPER WORKDIR SPEC_JSON OUT_JSON [plan]; with `plan`, also lists the stages of
  the claim run (`planned_stages`)."""
  root, paper, workdir, spec_json, out_json, *plan = argv
  spec = json.loads(spec_json)
  sys.meta_path.insert(0, _TreeFinder(root))
  import jaxlab  # pylint: disable=g-import-not-at-top
  if not os.path.abspath(jaxlab.__file__).startswith(os.path.abspath(root) + os.sep):
    raise SystemExit(f"canary: jaxlab came from {jaxlab.__file__}, not from {root}")
  from jaxlab import registry  # pylint: disable=g-import-not-at-top
  scratch = os.path.join(workdir, "scratch")
  overrides = {k: (v.replace(SCRATCH, scratch) if isinstance(v, str) else v) for k, v in spec["overrides"].items()}
  exp = registry.load(paper)
  config = exp.get_config(spec.get("variant", "tiny"), (overrides, {"seed": spec["seed"]}))
  run = os.path.join(workdir, "run")
  summary = exp.train_module.train_and_evaluate(config, run)
  extra = spec.get("volatile", ())
  claims = []
  for c in exp.claims:
    r = c.check([summary])
    timing = _volatile(r["name"], extra)      # a claim on a timing (e.g. "speed"): its value and verdict vary
    claims.append({"name": r["name"], "passed": None if timing else r["passed"], "error": r.get("error"),
                   "measured": None if timing else repr(r["measured"])})
  from jaxlab import metrics  # pylint: disable=g-import-not-at-top
  stages = [row["stage"] for row in metrics.read_metrics(run) if "stage" in row]
  result = {"manifest": {"claims": claims, **manifest(run, extra)}, "stages": stages}
  if plan:
    result["claim_stages"] = planned_stages(paper)
  result["fingerprint"] = fingerprint(result["manifest"])
  tmp = out_json + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f, sort_keys=True)
  os.replace(tmp, out_json)
  return 0


# ------------------------------------------------------------------------------------------ verify (parent)


def spec(paper: str) -> dict[str, Any]:
  """The canary of experiment `paper` as the working tree declares it (raises ConfigError without one)."""
  from jaxlab import registry  # pylint: disable=g-import-not-at-top
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  mod = registry.load(paper).config_module
  overrides = getattr(mod, "CANARY", None)
  if overrides is None:
    raise ConfigError(f"experiments/{paper}/config.py declares no CANARY; add the overrides that shrink its tiny "
                      "variant to a run of about a minute through every stage and claim")
  return {"variant": "tiny", "seed": int(tuple(getattr(mod, "SEEDS", (0,)))[0]),
          "overrides": {k: _jsonable(v) for k, v in dict(overrides).items()},
          "volatile": list(getattr(mod, "CANARY_VOLATILE", ()))}


def _jsonable(v):
  return [_jsonable(x) for x in v] if isinstance(v, (list, tuple)) else v


class _Enumerated(Exception):
  pass


def planned_stages(paper: str, overrides: Mapping[str, Any] | None = None, scratch: str = "") -> list[str]:
  """The top-level stage names a run of `paper` (tiny, `SEEDS[0]`, `overrides`) would record, without running
  them: `run_stages` is intercepted at its first call, and `run_loop` too ([] for an experiment that trains
  one loop and has no stages)."""
  import importlib  # pylint: disable=g-import-not-at-top
  from unittest import mock  # pylint: disable=g-import-not-at-top
  from jaxlab import registry  # pylint: disable=g-import-not-at-top
  exp = registry.load(paper)
  seed = int(tuple(getattr(exp.config_module, "SEEDS", (0,)))[0])
  overrides = {k: (v.replace(SCRATCH, scratch) if isinstance(v, str) else v) for k, v in (overrides or {}).items()}
  config = exp.get_config("tiny", (overrides, {"seed": seed}))
  found = []

  def capture(config, workdir, stages, *args, **kwargs):
    del config, workdir, args, kwargs
    found.extend(stages)
    raise _Enumerated

  def loop(*args, **kwargs):
    del args, kwargs
    raise _Enumerated

  train = exp.train_module
  targets = [(importlib.import_module(m), n) for m in ("jaxlab.train.stages", "jaxlab.train") for n in ("run_stages",)]
  targets += [(importlib.import_module(m), "run_loop") for m in ("jaxlab.train.loop", "jaxlab.train")]
  targets += [(train, n) for n in ("run_stages", "run_loop") if hasattr(train, n)]
  with tempfile.TemporaryDirectory() as workdir, contextlib.ExitStack() as stack:
    for module, name in targets:
      stack.enter_context(mock.patch.object(module, name, capture if name == "run_stages" else loop))
    try:
      train.train_and_evaluate(config, workdir)
    except _Enumerated:
      pass
  return found


def stage_kind(name: str) -> str:
  """A stage name with its numbers masked ("kde/D32_k3_M3@128" -> "kde/D#_k#_M#@#"): a canary may shrink the grid
  a stage name counts, not leave out the kind of stage."""
  return re.sub(r"\d+(\.\d+)?", "#", name)


def skipped_stages(claim: Sequence[str], canary: Sequence[str]) -> list[str]:
  """The kinds of stage the claim run has and the canary does not."""
  have = {stage_kind(s) for s in canary}
  return sorted({stage_kind(s) for s in claim} - have)


def run(root: str, paper: str, canary: Mapping[str, Any], workdir: str, out_json: str,
        env: Mapping[str, str] | None = None, timeout: float = CHILD_TIMEOUT_S, plan: bool = False) -> dict[str, Any]:
  """Runs `paper`'s canary on the tree at `root` in a fresh process; returns {"manifest", "fingerprint", "stages"}
  (and "claim_stages", the stages of the claim run, with `plan`).

  Raises:
    RuntimeError: the run failed (the message ends with the last lines it printed).
  """
  if os.path.isdir(workdir):
    shutil.rmtree(workdir)
  os.makedirs(workdir)
  boot = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__canary__')"
  env = dict(os.environ if env is None else env)
  env.setdefault("JAX_PLATFORMS", "cpu")
  env["JAXLAB_PROGRESS"] = "0"
  env["JAXLAB_CACHE_DIR"] = os.path.join(workdir, "scratch", "jaxlab_cache")   # each run builds its own helpers
  env.pop("PYTHONPATH", None)
  proc = subprocess.run([sys.executable, "-c", boot, os.path.abspath(__file__), root, paper, workdir,
                         json.dumps(canary), out_json, *(["plan"] if plan else [])], cwd=workdir, env=env,
                        capture_output=True, text=True,
                        timeout=timeout, check=False)
  if proc.returncode != 0 or not os.path.exists(out_json):
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
    raise RuntimeError(f"the canary exited {proc.returncode}: {tail}")
  with open(out_json) as f:
    return json.load(f)


def _cat(commit: str, paths: Sequence[str], root: str) -> dict[str, bytes | None]:
  """{path: bytes at `commit`, or None where the commit has no such file} in one `git cat-file --batch`."""
  try:
    proc = subprocess.run(["git", "cat-file", "--batch"], cwd=root, capture_output=True, check=False,
                          input="".join(f"{commit}:{p}\n" for p in paths).encode(), timeout=120)
  except (OSError, subprocess.SubprocessError):      # no git, or not a checkout: no commit holds anything
    return dict.fromkeys(paths)
  out, buf = {}, proc.stdout
  for p in paths:
    head, _, buf = buf.partition(b"\n")
    if head.endswith(b" missing") or not head:
      out[p] = None
      continue
    size = int(head.split()[2])
    out[p], buf = buf[:size], buf[size + 1:]
  return out


def candidates(led: Mapping[str, Any], root: str, limit: int = 400) -> list[str]:
  """Commits that may hold the ledger's sources, most likely first: HEAD, those of its verified records, its
  own commit, then the history of HEAD newest first."""
  from jaxlab import ledger  # pylint: disable=g-import-not-at-top
  git = ledger._git  # pylint: disable=protected-access
  history = (git("rev-list", f"--max-count={limit}", "HEAD", root=root) or "").split()
  first = [c for c in [*(history[:1]), *(r.get("to") for r in reversed(led.get("verified", []))), led.get("commit")]
           if c]
  seen, out = set(), []
  for c in first + history:
    if c not in seen:
      seen.add(c)
      out.append(c)
  return out


def baseline(led: Mapping[str, Any], root: str, cache: dict | None = None) -> str | None:
  """The first of `candidates` whose copies of the ledger's sources have exactly its digests, or None."""
  from jaxlab import ledger  # pylint: disable=g-import-not-at-top
  want = led.get("sources", {})
  cache = {} if cache is None else cache
  for commit in candidates(led, root):
    missing = [p for p in want if (commit, p) not in cache]
    if missing:
      for p, data in _cat(commit, missing, root).items():
        cache[(commit, p)] = None if data is None else ledger.code_digest(data, p)
    if all(cache[(commit, p)] == d for p, d in want.items()):
      return commit
  return None


class _Worktrees:
  """Temporary `git worktree`s, one per commit, removed on exit."""

  def __init__(self, root: str):
    self.root, self.trees, self.lock = root, {}, threading.Lock()

  def get(self, commit: str) -> str:
    with self.lock:
      return self._get(commit)

  def _get(self, commit: str) -> str:
    if commit not in self.trees:
      path = tempfile.mkdtemp(prefix=f"jaxlab_canary_{commit[:8]}_")
      r = subprocess.run(["git", "worktree", "add", "--detach", "--force", path, commit], cwd=self.root,
                         capture_output=True, text=True, check=False, timeout=300)
      if r.returncode != 0:
        raise RuntimeError(f"git worktree add {commit[:8]} failed: {r.stderr.strip()}")
      self.trees[commit] = path
    return self.trees[commit]

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for path in self.trees.values():
      subprocess.run(["git", "worktree", "remove", "--force", path], cwd=self.root, capture_output=True, check=False)
      shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=self.root, capture_output=True, check=False)


def _machine() -> str:
  """The CPU model and thread count (a canary's fingerprint is this machine's: XLA's CPU numerics differ)."""
  from jaxlab import ledger  # pylint: disable=g-import-not-at-top
  cpu, threads = ledger.cpu_and_threads()
  return f"{cpu}, {threads} threads"


def restamp(paper: str, base: str, fp: str, root: str) -> None:
  """Re-stamps a verified ledger: today's source digests and a `verified` record."""
  from jaxlab import ledger  # pylint: disable=g-import-not-at-top
  led = ledger.read(paper, root)
  sources = ledger.import_closure(paper, root)
  git = ledger._git  # pylint: disable=protected-access
  dirty = git("status", "--porcelain", "--", *sources, root=root)
  led["sources"] = ledger.digests(sources, root)
  led.setdefault("verified", []).append({
      "from": base, "to": git("rev-parse", "HEAD", root=root), "dirty": bool(dirty),
      "canary": fp, "machine": _machine(),
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})
  path = ledger.ledger_path(paper, root)
  with open(path + ".tmp", "w") as f:
    json.dump(led, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(path + ".tmp", path)


def verify(papers: Sequence[str], out: str = "results/verify", root: str | None = None, jobs: int | None = None,
           log=print) -> dict[str, str]:
  """Verifies each experiment's stale ledger by its canary (see the module); returns {paper: outcome}.

  Outcomes: "verified" (re-stamped), "current" (not stale: nothing to do), "differs: <where>", or
  "not verified: <why>" (no ledger, no canary, no baseline commit, a canary that failed to run or skips a stage
  of the claim run). `jobs` experiments run at once (default: one per CPU core, at most 8), each its baseline
  canary then its working-tree canary, so the second loads what the first compiled.
  """
  from jaxlab import ledger, progress  # pylint: disable=g-import-not-at-top
  root = root or ledger.ROOT
  out = os.path.abspath(out)
  env = dict(os.environ)
  env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(out, "xla_cache")
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  jobs = max(1, jobs or min(8, os.cpu_count() or 1))
  stale = ledger.stale(papers, root)
  results, digest_cache, bases, lock = {}, {}, {}, threading.Lock()
  with _Worktrees(root) as trees, progress.bar(total=len(papers), desc="verify") as bar:
    for paper in papers:          # baselines first, in order (git is not asked from several threads)
      led = ledger.read(paper, root) if paper in stale else None
      if led is not None:
        bases[paper] = baseline(led, root, digest_cache)

    def one(paper):
      t0 = time.time()
      outcome = _verify_one(paper, paper in stale, out, root, env, trees, bases.get(paper))
      with lock:
        results[paper] = outcome
        log(f"[verify] {paper:22s} {outcome} ({time.time() - t0:.0f} s)")
        bar.update(1)

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
      for f in [pool.submit(one, p) for p in papers]:
        f.result()
  return {p: results[p] for p in papers}


def _verify_one(paper, is_stale, out, root, env, trees, base) -> str:
  from jaxlab import ledger  # pylint: disable=g-import-not-at-top
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if not is_stale:
    return "current"
  led = ledger.read(paper, root)
  if led is None:
    return f"not verified: no ledger; run python -m jaxlab.reproduce {paper}"
  try:
    canary = spec(paper)
  except ConfigError as e:
    return f"not verified: {e}"
  if base is None:
    return ("not verified: no commit in this repository's history holds the sources this ledger was made from; "
            f"run python -m jaxlab.reproduce {paper}")
  with open(os.path.abspath(__file__), "rb") as f:   # a kept baseline counts only under the same fingerprint code
    key = hashlib.sha256(json.dumps(canary, sort_keys=True).encode() + f.read()).hexdigest()[:12]
  keep = os.path.join(out, "baseline", base, paper, key, "canary.json")
  workdir = os.path.join(out, "run", paper)
  try:
    if os.path.exists(keep):
      with open(keep) as f:
        old = json.load(f)
    else:
      os.makedirs(os.path.dirname(keep), exist_ok=True)
      old = run(trees.get(base), paper, canary, workdir, keep + ".partial", env)
      os.replace(keep + ".partial", keep)
    new = run(root, paper, canary, workdir, os.path.join(out, "run", f"{paper}.json"), env, plan=True)
  except (RuntimeError, subprocess.SubprocessError) as e:
    return f"not verified: {str(e)[:300]}"
  skipped = skipped_stages(new["claim_stages"], new["stages"])
  if skipped:
    return (f"not verified: the canary skips stage(s) {', '.join(skipped)} of the claim run; add them to "
            f"experiments/{paper}/config.py's CANARY")
  if old["fingerprint"] != new["fingerprint"]:
    return f"differs: {first_difference(old['manifest'], new['manifest'])}; run python -m jaxlab.reproduce {paper}"
  with _GIT:
    restamp(paper, base, new["fingerprint"], root)
  return "verified"


if __name__ == "__canary__":
  sys.exit(_child_main(sys.argv[1:]))
