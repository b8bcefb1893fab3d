"""The competence gate's calibration: the base and the cold starts on validation seeds, stopped after the gate.

  python -m jaxlab.experiments.tom_rft.calibrate --seed 100 --workdir /tmp/tom_gate/s100 \
      --set model.hidden=128 --set model.n_layers=4

Runs the stages up to `gate` (`train.train_and_evaluate(until="gate")`, resumable, gate.enforce off so a failing
setting is recorded rather than raised) and prints the gate's numbers with each cold start's accuracy per order
and on false-belief questions. Validation seeds are >= 100; the claim seeds (config.SEEDS) are never used here.
"""

from __future__ import annotations

import argparse
import ast
import json

from jaxlab import registry


def _value(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seed", type=int, required=True, help="a validation seed (>= 100)")
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--variant", default="tiny")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
  args = ap.parse_args(argv)
  exp = registry.load("tom_rft")
  if args.seed in exp.config_module.SEEDS or args.seed < 100:
    ap.error(f"--seed {args.seed} is not a validation seed: use 100 or more (claim seeds "
             f"{exp.config_module.SEEDS} are run once, by jaxlab.reproduce)")
  overrides = {"seed": args.seed, "gate.enforce": False}
  for kv in args.set:
    if "=" not in kv:
      ap.error(f"--set {kv!r}: use KEY=VALUE, e.g. --set model.hidden=128")
    k, v = kv.split("=", 1)
    overrides[k] = _value(v)
  config = exp.get_config(args.variant, overrides)
  s = exp.train_module.train_and_evaluate(config, args.workdir, until="gate")
  keys = sorted(k for k in s if k.startswith("gate/") or (k.startswith("eval/acc_cold") and "_o" in k))
  print(json.dumps({k: s[k] for k in keys}, indent=1))


if __name__ == "__main__":
  main()
