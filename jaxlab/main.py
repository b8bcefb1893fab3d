"""Runs one experiment from its config.

    python -m jaxlab.main --config experiments/<paper>/config.py:<variant> --workdir DIR \
        [--config.key=value ...]

The overrides are applied before the config is validated (once) and locked (a misspelt `--config.` key is an
error with a suggestion); it is checked against the devices present, written to DIR/config.json, and passed
to the experiment's `train_and_evaluate(config, workdir)`. It prints a short JSON summary: the path of
DIR/summary.json (which holds everything), the step, and the values the experiment's claims read (scalars; at
most `SHORT_SUMMARY_KEYS`). Rerunning the same command resumes from DIR's newest checkpoint. Multi-host: see
`jaxlab.distributed`.
"""

from __future__ import annotations

import argparse
import json
import os

from jaxlab import cli, distributed


SHORT_SUMMARY_KEYS = 24


class _Reads(dict):
  """A summary that records which keys are read (by a claim's measure)."""

  def __init__(self, data):
    super().__init__(data)
    self.read = []

  def __getitem__(self, key):
    self.read.append(key)
    return super().__getitem__(key)

  def get(self, key, default=None):
    self.read.append(key)
    return super().get(key, default)


def short_summary(summary: dict, claims, path: str) -> dict:
  """{"summary": path, "step": ..., and the scalar values `claims` read from `summary`} (the first
  `SHORT_SUMMARY_KEYS` scalars when no claim reads any); "more" counts what only summary.json shows."""
  tracked = _Reads(summary)
  for c in claims:
    try:
      c.check([tracked])
    except Exception:  # pylint: disable=broad-except  (a claim over seeds may not compute on one run)
      pass
  scalar = lambda v: isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 80)  # noqa: E731
  keys = [k for k in dict.fromkeys(tracked.read) if k in summary and scalar(summary[k])]
  if not keys:
    keys = [k for k in sorted(summary) if scalar(summary[k])]
  keys = [k for k in ("step", "stages") if k in summary and k not in keys] + keys
  out = {"summary": path, **{k: summary[k] for k in keys[:SHORT_SUMMARY_KEYS]}}
  if len(summary) > len(out) - 1:
    out["more"] = f"{len(summary) - (len(out) - 1)} further entries in {path}"
  return out


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
  exp, config = registry.load_config(config_spec, overrides, values)
  configs.check_devices(config, jax.device_count())
  return exp.train_module.train_and_evaluate(config, workdir)


HELP_EPILOG = """\
config overrides:
  --config.KEY=VALUE    set any key of the experiment's config (dotted path), e.g.
                        --config.train.num_steps=500 --config.train.optimizer.learning_rate=3e-4
                        --config.model.hidden=256 --config.mesh="(('data', 4), ('model', 2))"
                        --config.sharding_rules=fsdp   (presets: tensor_parallel, data_parallel, fsdp)
                        values are converted to the type of the key's default; a misspelt key is an error
                        with a suggestion.

variants (the text after ':' in --config):
  tiny                  CPU minutes: the variant whose claims `python -m jaxlab.reproduce` checks
  small                 a larger CPU / single-accelerator run
  full                  the paper's scale (TPU slice / GPU cluster)
  variant=V,seed=S      named form (some experiments take more, e.g. navar_ice's data=csv)

experiments: python -m jaxlab.reproduce --list
"""


def main(argv: list[str]) -> int:
  argv, overrides = cli.split_overrides(argv)
  parser = argparse.ArgumentParser(prog="python -m jaxlab.main", description=__doc__.split("\n\n")[0],
                                   epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="experiments/<paper>/config.py:<variant> (or <paper>:<variant>)")
  parser.add_argument("--workdir", required=True, help="run directory (resumed if it holds a checkpoint)")
  args = parser.parse_args(argv)
  from jaxlab import workdir as workdir_lib
  workdir_lib.check_output_dir(args.workdir, "--workdir")
  distributed.initialize()
  summary = run(args.config, args.workdir, overrides)
  from jaxlab import registry  # pylint: disable=g-import-not-at-top
  exp = registry.load(args.config.partition(":")[0])
  short = short_summary(summary, exp.claims, os.path.join(args.workdir, "summary.json"))
  print(json.dumps(short, indent=2, default=str))
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
