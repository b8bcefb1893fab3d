"""`python -m jaxlab.ar.speed`: SAR sampling throughput (images/s) against tokens per step, as a table.

Random weights (the cost of sampling does not depend on them): `--case tiny` is the digits model of
experiments/sar (16 tokens of dim 4, trunk 4 x 64, head 3 x 128, 20 head steps), `--case full` the ImageNet 256
model of its full variant (16 x 16 KL-16 latents of dim 16, trunk 24 x 768 with 64 class tokens, head 6 x 1024,
64 head steps, bfloat16, CFG 3 so the batch is doubled). Each (batch, tokens per step) cell is compiled once,
then timed as the best of `--repeats` calls (`jaxlab.ar.generate.images_per_second`). Prints a markdown table
and, with `--json PATH`, writes the cells.

    python -m jaxlab.ar.speed --case tiny --batch 1,32,256 --tokens_per_step 1,2,4,8
    python -m jaxlab.ar.speed --case tiny --batch 1 --tokens_per_step 1,4 --head_steps 1   # without the head
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlab.ar import generate as gen
from jaxlab.ar import head as head_lib
from jaxlab.ar import masks
from jaxlab.ar import model as model_lib

CASES = {
    "tiny": dict(ar=dict(token_dim=4, grid=(4, 4), hidden=64, depth=4, heads=4, num_classes=10, teacher=False),
                 head=dict(width=128, depth=3), head_steps=20, cfg=1.0),
    "full": dict(ar=dict(token_dim=16, grid=(16, 16), hidden=768, depth=24, heads=12, num_classes=1000, num_prefix=64,
                         teacher=False, dtype="bfloat16"),
                 head=dict(width=1024, depth=6), head_steps=64, cfg=3.0),
}


def build(case: str, head_steps: int | None = None) -> tuple[gen.GroupedSampler, model_lib.ARConfig]:
  """The case's sampler (random weights); `head_steps` overrides the case's number of head Euler steps."""
  spec = CASES[case]
  ar = model_lib.ARConfig(**spec["ar"])
  sar = gen.SAR(ar, head_lib.HeadConfig(ar.token_dim, ar.hidden, **spec["head"]), rngs=nnx.Rngs(0))
  return gen.GroupedSampler(sar, head_steps=head_steps or spec["head_steps"], cfg=spec["cfg"]), ar


def table(case: str, batches, ks, repeats: int = 3, head_steps: int | None = None) -> list[dict]:
  head_steps = head_steps or CASES[case]["head_steps"]
  sampler, ar = build(case, head_steps)
  rows = []
  for b in batches:
    labels = jnp.arange(b) % ar.num_classes
    base = None
    for k in ks:
      sizes = masks.fixed_sizes(ar.num_tokens, k)
      ips = gen.images_per_second(lambda sizes=sizes: sampler(labels, sizes, jax.random.key(0)), b, repeats=repeats)
      base = ips if base is None else base
      rows.append({"case": case, "batch": b, "tokens_per_step": k, "steps": len(sizes), "images_per_s": ips,
                   "speedup": ips / base, "head_steps": head_steps, "device": jax.devices()[0].device_kind})
      print(f"| {case} | {b} | {k} | {len(sizes)} | {ips:.1f} | {ips / base:.2f}x |", flush=True)
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--case", choices=sorted(CASES), default="tiny")
  p.add_argument("--batch", default="1,32", help="comma-separated images per call")
  p.add_argument("--tokens_per_step", default="1,2,4,8", help="comma-separated k (the first is the baseline)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--head_steps", type=int, default=0,
                 help="head Euler steps per group (default: the case's); 1 isolates the trunk and the dispatch")
  p.add_argument("--json", default="", help="also write the rows here")
  a = p.parse_args(argv)
  try:
    batches = [int(v) for v in a.batch.split(",")]
    ks = [int(v) for v in a.tokens_per_step.split(",")]
  except ValueError:
    print("error: --batch and --tokens_per_step take comma-separated integers, e.g. --batch 1,32", file=sys.stderr)
    return 2
  if a.head_steps < 0:
    print(f"error: --head_steps={a.head_steps} must be >= 1 (or 0 for the case's default)", file=sys.stderr)
    return 2
  print(f"device: {jax.devices()[0].device_kind}\n| case | batch | tokens/step | steps | images/s | vs first |\n"
        "|---|---|---|---|---|---|")
  rows = table(a.case, batches, ks, a.repeats, a.head_steps or None)
  if a.json:
    with open(a.json, "w") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
