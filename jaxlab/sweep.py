"""Runs the hyper-parameter sweep an experiment's config declares.

    python -m jaxlab.sweep --config experiments/<paper>/config.py:<variant> --workdir DIR [--dry_run] [--index i]

`sweep(arg)` in the config module returns a list of override dicts (dotted keys). `--dry_run` validates
every point (with the experiment's own `validate`, as a run would) and prints them; `--index i` runs point i only (one point per job on a cluster); otherwise all
points run in turn, each in `DIR/<i>` (resumable), and `DIR/sweep.json` collects their summaries.
"""

from __future__ import annotations

import argparse
import json
import os

from jaxlab import cli, distributed


def points(config_spec: str) -> list[dict]:
  """The experiment's sweep points for this config argument (validated against the config)."""
  from jaxlab import registry
  from jaxlab.errors import ConfigError
  target, _, arg = config_spec.partition(":")
  exp = registry.load(target)
  fn = getattr(exp.config_module, "sweep", None)
  if fn is None:
    raise ConfigError(f"{exp.name}/config.py defines no sweep(arg)")
  pts = [dict(p) for p in fn(arg or None)]
  for i, p in enumerate(pts):
    try:
      exp.get_config(arg or None, p)   # the library's and the experiment's own validation
    except ConfigError as e:
      raise ConfigError(f"sweep point {i} {p}: {e}") from None
  return pts


def main(argv: list[str]) -> int:
  argv, overrides = cli.split_overrides(argv)
  parser = argparse.ArgumentParser(
      prog="python -m jaxlab.sweep", description=__doc__.split("\n\n")[0],
      epilog="Overrides: --config.KEY=VALUE applies to every point (see python -m jaxlab.main --help); a point's "
             "own values win over them.", formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="experiments/<paper>/config.py:<variant> (or <paper>:<variant>); "
                      "the grid is that config module's sweep(variant)")
  parser.add_argument("--workdir", default=None, help="sweep directory: point i runs (and resumes) in WORKDIR/<i>/, "
                      "WORKDIR/sweep.json collects the summaries (required unless --dry_run)")
  parser.add_argument("--dry_run", action="store_true", help="validate every point with the experiment's own checks "
                      "and list them; runs nothing")
  parser.add_argument("--index", type=int, default=None, help="run point i only (0-based; one point per cluster job)")
  args = parser.parse_args(argv)
  pts = points(args.config)
  if args.dry_run:
    for i, p in enumerate(pts):
      print(f"{i:4d}  " + ", ".join(f"{k}={v}" for k, v in p.items()))
    print(f"{len(pts)} points")
    return 0
  if not args.workdir:
    parser.error("--workdir is required unless --dry_run")
  from jaxlab import workdir as workdir_lib
  workdir_lib.check_output_dir(args.workdir, "--workdir")
  from jaxlab import main as main_lib, metrics
  from jaxlab.errors import ConfigError
  if args.index is not None and not 0 <= args.index < len(pts):
    raise ConfigError(f"--index {args.index} is outside the sweep's {len(pts)} points (0..{len(pts) - 1})")
  distributed.initialize()
  todo = range(len(pts)) if args.index is None else [args.index]
  results = []
  for i in todo:
    summary = main_lib.run(args.config, os.path.join(args.workdir, str(i)), overrides, pts[i])
    results.append({"index": i, "overrides": pts[i], "summary": summary})
    print(json.dumps(results[-1], default=str))
  if args.index is None:
    metrics.write_json(os.path.join(args.workdir, "sweep.json"), results)
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
