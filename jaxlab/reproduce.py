"""Reproduces papers' claims: runs each paper's variant over seeds and checks its CLAIMS.

    python -m jaxlab.reproduce quickstart                 # tiny variant, the paper's default seeds
    python -m jaxlab.reproduce PAPER [PAPER ...] [--variant tiny] [--seeds 0,1,2] [--out DIR]
    python -m jaxlab.reproduce --all | --list

For each paper it writes `OUT/<paper>/results.json` ({"paper", "variant", "seeds", "claims": [{"name",
"text", "measured", "target", "passed"}], "runs": [summaries], "wall_s"}), per-seed run directories
`OUT/<paper>/<variant>/seed_<s>/`, and plots (training curves, plus the experiment's own `plot`). It prints
a table (paper, claim, measured, target, PASS/FAIL, wall time) and exits 0 only when every claim passed.
Runs start fresh unless `--resume` is given (then finished seeds are reused and unfinished ones resumed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from jaxlab import cli, distributed

DEFAULT_PAPER = "quickstart"


def reproduce(paper: str, variant: str = "tiny", seeds=None, out: str = "results/reproduce",
              resume: bool = False, overrides=()) -> dict:
  """Runs one paper over seeds, checks its claims and writes results.json; returns that dict."""
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
    config = exp.get_config(variant)
    configs.apply_overrides(config, overrides)
    configs.apply_overrides(config, {"seed": seed})
    configs.validate(config, num_devices=jax.device_count())
    workdir = os.path.join(base, variant, f"seed_{seed}")
    if not resume and os.path.isdir(workdir) and jax.process_index() == 0:
      shutil.rmtree(workdir)
    print(f"[{exp.name}] variant={variant} seed={seed} -> {workdir}", file=sys.stderr, flush=True)
    runs.append(exp.train_module.train_and_evaluate(config, workdir))
    workdirs.append(workdir)
  results = {
      "paper": exp.name, "variant": variant, "seeds": seeds,
      "claims": [c.check(runs) for c in exp.claims], "runs": runs, "wall_s": time.time() - t0}
  plots = []
  if jax.process_index() == 0:
    p = plotting.plot_curves(workdirs, ("train/loss",) + tuple(_eval_keys(runs)),
                             os.path.join(base, "curves.png"), labels=[f"seed {s}" for s in seeds],
                             title=f"{exp.name} ({variant})")
    plots += [p] if p else []
    plot_fn = getattr(exp.train_module, "plot", None)
    if plot_fn is not None:
      plots += list(plot_fn(runs, workdirs, base) or [])
  results["plots"] = [os.path.relpath(p, base) for p in plots]
  metrics.write_json(os.path.join(base, "results.json"), results)
  return results


def _eval_keys(runs: list[dict]) -> list[str]:
  return sorted({k for r in runs for k in r if k.startswith("eval/")})[:3]


def format_table(all_results: list[dict]) -> str:
  """The claims table printed by the command."""
  head = ("paper", "claim", "measured", "target", "result", "wall")
  rows = []
  for r in all_results:
    for c in r["claims"]:
      m = "error" if c["measured"] is None else f"{c['measured']:.4g}"
      rows.append((r["paper"], c["name"], m, c["target"], "PASS" if c["passed"] else "FAIL", f"{r['wall_s']:.0f}s"))
  widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
  line = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths))  # noqa: E731
  out = [line(head), line(["-" * w for w in widths])] + [line(row) for row in rows]
  for r in all_results:
    for c in r["claims"]:
      if "error" in c:
        out.append(f"{r['paper']}/{c['name']}: {c['error']}")
  return "\n".join(out)


def main(argv: list[str]) -> int:
  argv, overrides = cli.split_overrides(argv)
  parser = argparse.ArgumentParser(prog="python -m jaxlab.reproduce", description=__doc__.split("\n\n")[0])
  parser.add_argument("papers", nargs="*", help=f"experiment names or folders (default: {DEFAULT_PAPER})")
  parser.add_argument("--all", action="store_true", help="every experiment")
  parser.add_argument("--list", action="store_true", help="list experiments and exit")
  parser.add_argument("--variant", default="tiny")
  parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the paper's SEEDS)")
  parser.add_argument("--out", default="results/reproduce")
  parser.add_argument("--resume", action="store_true", help="reuse finished seeds, resume unfinished ones")
  args = parser.parse_args(argv)
  from jaxlab import registry
  if args.list:
    for name in registry.names():
      print(f"{name:24s} {registry.load(name).description}")
    return 0
  distributed.initialize()
  papers = registry.names() if args.all else (args.papers or [DEFAULT_PAPER])
  seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
  results = [reproduce(p, args.variant, seeds, args.out, args.resume, overrides) for p in papers]
  print(format_table(results))
  ok = all(c["passed"] for r in results for c in r["claims"])
  print(f"\n{'all claims passed' if ok else 'SOME CLAIMS FAILED'}; results under {args.out}/")
  return 0 if ok else 1


if __name__ == "__main__":
  cli.main_wrapper(main)
