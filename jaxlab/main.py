"""Runs one experiment from its config.

    python -m jaxlab.main --config experiments/<paper>/config.py:<variant> --workdir DIR \
        [--config.key=value ...]

The config is locked (a misspelt `--config.` key is an error with a suggestion), validated against the
devices present, written to DIR/config.json, and passed to the experiment's
`train_and_evaluate(config, workdir)`; its summary is printed as JSON. Rerunning the same command resumes
from DIR's newest checkpoint. Multi-host: see `jaxlab.distributed`.
"""

from __future__ import annotations

import argparse
import json

from jaxlab import cli, distributed


def run(config_spec: str, workdir: str, overrides=(), values=None) -> dict:
  """Loads, validates and runs an experiment config; returns its summary.

  Args:
    config_spec: `experiments/<paper>/config.py:<arg>` or `<paper>:<arg>`.
    workdir: run directory.
    overrides: "key=value" strings (converted to the existing value's type).
    values: {dotted key: value} applied after `overrides` (typed values, e.g. from a sweep).
  """
  import jax  # after distributed.initialize
  from jaxlab import configs, registry
  exp, config = registry.load_config(config_spec, overrides)
  configs.apply_overrides(config, values or {})
  configs.validate(config, num_devices=jax.device_count())
  config.lock()
  return exp.train_module.train_and_evaluate(config, workdir)


def main(argv: list[str]) -> int:
  argv, overrides = cli.split_overrides(argv)
  parser = argparse.ArgumentParser(prog="python -m jaxlab.main", description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="experiments/<paper>/config.py:<variant> (or <paper>:<variant>)")
  parser.add_argument("--workdir", required=True, help="run directory (resumed if it holds a checkpoint)")
  args = parser.parse_args(argv)
  distributed.initialize()
  summary = run(args.config, args.workdir, overrides)
  print(json.dumps(summary, indent=2, sort_keys=True, default=str))
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
