"""Reproduces papers' claims: runs each paper's variant over seeds and checks its CLAIMS.

    python -m jaxlab.reproduce quickstart                 # tiny variant, the paper's default seeds
    python -m jaxlab.reproduce PAPER [PAPER ...] [--variant tiny] [--seeds 0,1,2] [--out DIR] [--resume]
    python -m jaxlab.reproduce --all | --list
    python -m jaxlab.reproduce --stale                    # experiments whose ledger is out of date (exit 1 if any)
    python -m jaxlab.reproduce --table                    # the README's results table from the ledgers
    python -m jaxlab.reproduce --verify [PAPER ...]       # re-stamp stale ledgers whose canary is unchanged

For each paper it writes `OUT/<paper>/results.json` ({"paper", "variant", "seeds", "claims": [{"name",
"text", "measured", "target", "passed"}], "runs": [summaries], "wall_s"}), per-seed run directories
`OUT/<paper>/<variant>/seed_<s>/`, and plots (training curves, plus the experiment's own `plot`). It prints
a table (paper, claim, measured, target, PASS/FAIL, wall time) and exits 0 only when every claim passed.
Runs start fresh unless `--resume` is given (then finished seeds are reused and unfinished ones resumed, and the
wall time reported is the runs' own, summed over their sessions).
A run of the claims as declared (tiny variant, the paper's SEEDS, no overrides) also writes the paper's
ledger `experiments/<paper>/claims.json` (see `jaxlab.ledger`): what the README's results table shows.
`--verify` proves that a change to the code changes no number of a stale ledger by running the experiment's
canary before and after the change (see `jaxlab.canary`); it exits 0 only when every ledger it checked is
current or verified.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from jaxlab import cli, distributed, ledger

DEFAULT_PAPER = "quickstart"


def reproduce(paper: str, variant: str = "tiny", seeds=None, out: str = "results/reproduce",
              resume: bool = False, overrides=(), write_ledger: bool = False) -> dict:
  """Runs one paper over seeds, checks its claims and writes results.json; returns that dict.

  With `write_ledger` (maintainers, in a source checkout) and the declared claims setting (tiny, the paper's
  SEEDS, no overrides), also writes `experiments/<paper>/claims.json`; `main` refuses `--ledger` otherwise before
  any run starts.
  """
  import jax
  from jaxlab import configs, metrics, plotting, registry
  exp = registry.load(paper)
  if not exp.claims:
    from jaxlab.errors import ConfigError
    raise ConfigError(f"{exp.name}/config.py declares no CLAIMS; add them to make it reproducible")
  seeds = list(seeds if seeds is not None else getattr(exp.config_module, "SEEDS", (0, 1, 2)))
  base = os.path.join(out, exp.name)
  t0 = time.time()
  runs, workdirs = [], []
  for seed in seeds:
    config = exp.get_config(variant, (overrides, {"seed": seed}))
    configs.check_devices(config, jax.device_count())
    workdir = os.path.join(base, variant, f"seed_{seed}")
    if not resume and os.path.isdir(workdir) and jax.process_index() == 0:
      shutil.rmtree(workdir)
    print(f"[{exp.name}] variant={variant} seed={seed} -> {workdir}", file=sys.stderr, flush=True)
    runs.append(exp.train_module.train_and_evaluate(config, workdir))
    workdirs.append(workdir)
  checked = [c.check(runs, jax.default_backend()) for c in exp.claims]
  for c in checked:
    if c["passed"] is None:   # a claim this backend cannot check: the last accelerator ledger's value beside it
      c["accelerator"] = ledger.accelerator_value(exp.name, c["name"])
  results = {
      "paper": exp.name, "variant": variant, "seeds": seeds,
      "claims": checked, "runs": runs, "wall_s": time.time() - t0}
  if resume:   # reused seeds cost nothing now: report what the runs took (each summed over its sessions)
    results["wall_s"] = max(results["wall_s"], sum(float(r.get("wall_s", 0.0)) for r in runs))
  plots = []
  if jax.process_index() == 0:
    labels = [f"seed {s}" for s in seeds]
    p = plotting.plot_curves(workdirs, ("train/loss",) + tuple(_eval_keys(runs)),
                             os.path.join(base, "curves.png"), labels=labels, title=f"{exp.name} ({variant})",
                             levels=claim_levels(exp.claims))
    plots += [p] if p else []
    for sub in _sub_runs(workdirs):   # the training curves of staged runs' sub-runs (workdir/stages/<name>/)
      p = plotting.plot_curves([os.path.join(w, "stages", sub) for w in workdirs], ("train/loss",),
                               os.path.join(base, f"curves_{sub}.png"), labels=labels,
                               title=f"{exp.name} ({variant}): stage {sub}")
      plots += [p] if p else []
    plot_fn = getattr(exp.train_module, "plot", None)
    if plot_fn is not None:
      plots += list(plot_fn(runs, workdirs, base) or [])
  results["plots"] = [os.path.relpath(p, base) for p in plots]
  metrics.write_json(os.path.join(base, "results.json"), results)
  declared = variant == "tiny" and list(seeds) == list(getattr(exp.config_module, "SEEDS", (0, 1, 2)))
  if declared and not any(overrides) and write_ledger and jax.process_index() == 0 \
      and exp.package.startswith(registry.PACKAGE + "."):
    path = ledger.write(exp.name, results)
    print(f"[{exp.name}] ledger: {os.path.relpath(path)}", file=sys.stderr, flush=True)
  return results


def claim_levels(claims) -> dict[str, list[tuple[float, str]]]:
  """{metric key: [(target, "claim NAME: OP TARGET")]} for the claims whose measure is one metric reduced over
  seeds (`claims.mean` / `minimum` / `maximum`): the levels the curves must reach."""
  out: dict[str, list[tuple[float, str]]] = {}
  for c in claims:
    key = getattr(c.measure, "key", None)
    if key is None:
      continue
    targets = c.target if c.op == "in" else (c.target,)
    out.setdefault(key, []).extend((float(t), f"claim {c.name}: {c.target_text()}") for t in targets)
  return out


def _check_ledger_run(papers, variant, seeds, overrides) -> None:
  """`--ledger` before any run: a source checkout, and the declared claim run of experiments of this repository."""
  from jaxlab import registry  # pylint: disable=g-import-not-at-top
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  ledger.require_checkout("--ledger")
  for p in papers:
    exp = registry.load(p)
    declared = tuple(getattr(exp.config_module, "SEEDS", (0, 1, 2)))
    if variant != "tiny" or (seeds is not None and tuple(seeds) != declared) or any(overrides) \
        or not exp.package.startswith(registry.PACKAGE + "."):
      raise ConfigError(f"--ledger records the declared claim run only (an experiment of experiments/, variant tiny, "
                        f"its SEEDS {list(declared)}, no --config overrides); drop --variant/--seeds/--config.* or "
                        "--ledger")


def results_table() -> str:
  """The README's results table, generated from every experiment's ledger and `RESULTS` metadata."""
  from jaxlab import registry
  names = sorted(registry.names(), key=lambda n: (n != DEFAULT_PAPER, n))
  metas = {n: getattr(registry.load(n).config_module, "RESULTS", None) for n in names}
  return ledger.table(names, {n: m for n, m in metas.items() if m})


def _sub_runs(workdirs: list[str]) -> list[str]:
  """Names of the stage sub-runs (folders with a metrics.jsonl under workdir/stages/) every workdir has."""
  found = None
  for w in workdirs:
    root = os.path.join(w, "stages")
    names = {d for d in (os.listdir(root) if os.path.isdir(root) else [])
             if os.path.isfile(os.path.join(root, d, "metrics.jsonl"))}
    found = names if found is None else found & names
  return sorted(found or ())


def _eval_keys(runs: list[dict]) -> list[str]:
  return sorted({k for r in runs for k in r if k.startswith("eval/")})[:3]


def format_table(all_results: list[dict]) -> str:
  """The claims table printed by the command."""
  head = ("paper", "claim", "measured", "target", "result", "wall")
  rows = []
  for r in all_results:
    for c in r["claims"]:
      m = "error" if c["measured"] is None else f"{c['measured']:.4g}"
      verdict = {True: "PASS", False: "FAIL", None: "not checked here"}[c["passed"]]
      rows.append((r["paper"], c["name"], m, c["target"], verdict, f"{r['wall_s']:.0f}s"))
  widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
  line = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths))  # noqa: E731
  out = [line(head), line(["-" * w for w in widths])] + [line(row) for row in rows]
  for r in all_results:
    for c in r["claims"]:
      if "error" in c:
        out.append(f"{r['paper']}/{c['name']}: {c['error']}")
      if c["passed"] is None:
        out.append(f"{r['paper']}/{c['name']}: {ledger.accelerator_text(c.get('accelerator'))}")
  return "\n".join(out)


def _verify(papers: list[str], out: str, jobs: int | None) -> int:
  """`--verify`: bad input refused in one line before any work, then `jaxlab.canary.verify`."""
  from jaxlab import canary, registry, workdir as workdir_lib
  from jaxlab.errors import ConfigError
  known = registry.names()
  for p in papers:
    if p not in known:
      raise ConfigError(f"unknown experiment {p!r}; known: {', '.join(known)}")
  if jobs is not None and jobs < 1:
    raise ConfigError(f"--jobs={jobs}: give at least 1 (experiments verified at once)")
  workdir_lib.check_output_dir(out, "--out")
  papers = papers or sorted(ledger.stale(known))
  if not papers:
    print("every ledger is up to date: nothing to verify")
    return 0
  print(f"verifying {len(papers)} ledger(s): {', '.join(papers)}", file=sys.stderr, flush=True)
  results = canary.verify(papers, out, jobs=jobs)
  bad = {p: r for p, r in results.items() if r not in ("verified", "current")}
  print(f"{len(results) - len(bad)} of {len(results)} verified or current" +
        (f"; re-run: python -m jaxlab.reproduce {' '.join(bad)}" if bad else ""))
  return 1 if bad else 0


def main(argv: list[str]) -> int:
  argv, overrides = cli.split_overrides(argv)
  parser = argparse.ArgumentParser(
      prog="python -m jaxlab.reproduce", description=__doc__.split("\n\n")[0],
      epilog="Overrides: --config.KEY=VALUE applies to every seed's config (see python -m jaxlab.main --help).",
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("papers", nargs="*", help=f"experiment names or folders (default: {DEFAULT_PAPER})")
  parser.add_argument("--all", action="store_true", help="every experiment")
  parser.add_argument("--list", action="store_true", help="list experiments and exit")
  parser.add_argument("--variant", default="tiny", help="config variant (default: tiny, the one the claims are on)")
  parser.add_argument("--seeds", default=None, help="comma-separated seeds, e.g. 0,1,2 (default: the paper's SEEDS)")
  parser.add_argument("--out", default=None, help="output directory (default: results/reproduce; with --verify: "
                      "results/verify)")
  parser.add_argument("--resume", action="store_true", help="reuse finished seeds, resume unfinished ones "
                      "(without it every seed starts over)")
  parser.add_argument("--stale", action="store_true", help="list the experiments whose ledger "
                      "(experiments/<paper>/claims.json) predates a change to a file they import, and exit "
                      "(1 when any is stale)")
  parser.add_argument("--table", action="store_true", help="print the README's results table from the ledgers "
                      "and exit (with --write_readme: also replace the table in README.md)")
  parser.add_argument("--write_readme", action="store_true", help="with --table: write it into README.md")
  parser.add_argument("--verify", action="store_true", help="run the canaries of the stale experiments (or of "
                      "PAPERs) at the ledger's commit and on the working tree; re-stamp the ledgers whose outputs "
                      "are equal bit for bit, name the first difference of the others")
  parser.add_argument("--jobs", type=int, default=None, help="with --verify: experiments verified at once "
                      "(default: one per CPU core, at most 8)")
  parser.add_argument("--ledger", action="store_true", help="maintainers, in a source checkout: also write the "
                      "ledger experiments/<paper>/claims.json (the declared claim run only: tiny, the paper's SEEDS, "
                      "no overrides)")
  parser.add_argument("--no_ledger", action="store_true", help=argparse.SUPPRESS)   # the default now
  args = parser.parse_args(argv)
  from jaxlab import registry
  from jaxlab import workdir as workdir_lib
  if args.list:
    for name in registry.names():
      print(f"{name:24s} {registry.load(name).description}")
    return 0
  if args.table:
    table = results_table()
    print(table)
    if args.write_readme:
      ledger.require_checkout("--table --write_readme")
      path = os.path.join(ledger.ROOT, "README.md")
      with open(path) as f:
        text = f.read()
      old = ledger.readme_table(text)
      if old is None:
        from jaxlab.errors import ConfigError
        raise ConfigError(f"{path} has no results-table markers ({ledger.TABLE_BEGIN} ... {ledger.TABLE_END})")
      with open(path, "w") as f:
        f.write(text.replace(old, table))
    return 0
  if args.stale:
    ledger.require_checkout("--stale")
    old = ledger.stale(args.papers or registry.names())
    for name, files in old.items():
      print(f"{name:24s} {', '.join(files[:4])}{f' (+{len(files) - 4} more)' if len(files) > 4 else ''}")
    print(f"{len(old)} stale" if old else "every ledger is up to date")
    return 1 if old else 0
  if args.verify:
    ledger.require_checkout("--verify")
    return _verify(args.papers, args.out or "results/verify", args.jobs)
  args.out = args.out or "results/reproduce"
  seeds = cli.parse_seeds(args.seeds)
  workdir_lib.check_output_dir(args.out, "--out")
  papers = registry.names() if args.all else (args.papers or [DEFAULT_PAPER])
  if args.ledger:
    _check_ledger_run(papers, args.variant, seeds, overrides)
  distributed.initialize()
  results = [reproduce(p, args.variant, seeds, args.out, args.resume, overrides, args.ledger) for p in papers]
  print(format_table(results))
  ok = all(c["passed"] is not False for r in results for c in r["claims"])
  unchecked = sum(c["passed"] is None for r in results for c in r["claims"])
  verdict = "SOME CLAIMS FAILED" if not ok else (
      "every claim checked here passed" if unchecked else "all claims passed")
  if unchecked:
    verdict += f" ({unchecked} not checked here: needs an accelerator)"
  print(f"\n{verdict}; results under {args.out}/")
  return 0 if ok else 1


if __name__ == "__main__":
  cli.main_wrapper(main, resume=cli.reproduce_resume_argv)
