"""Kernel benchmarks: median time after warm-up and the fraction of the roofline reached.

    python -m jaxlab.bench [NAME ...] [--iters 20] [--peak_tflops X --peak_gbps Y] [--json OUT]

Each kernel package `jaxlab.kernels.<op>` may define `BENCHMARKS` (a list of `Benchmark`) in its
`bench.py`; `matmul` is built in as a calibration point. The roofline time of a case is
max(flops / peak FLOP/s, bytes / peak bandwidth); the peaks come from a table of known accelerators
(override with --peak_tflops / --peak_gbps; on CPU there is no default, so the fraction is left blank).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import pkgutil
import statistics
import time
from typing import Any, Callable, Sequence

from jaxlab import cli

# Dense peak (TFLOP/s in the dtype most kernels use: bf16) and HBM bandwidth (GB/s) by device kind.
PEAKS = {
    "H200": (989.0, 4800.0), "H100": (989.0, 3350.0), "A100": (312.0, 2039.0),
    "TPU v4": (275.0, 1228.0), "TPU v5 lite": (197.0, 819.0), "TPU v5e": (197.0, 819.0),
    "TPU v5p": (459.0, 2765.0), "TPU v6 lite": (918.0, 1640.0), "TPU v6e": (918.0, 1640.0),
}


@dataclasses.dataclass
class Benchmark:
  """One benchmark case.

  Attributes:
    name: "<kernel>/<case>", e.g. "selective_scan/b8_l2048_d1024".
    setup: `() -> {impl_name: zero-arg callable returning arrays}`; each callable is timed.
    flops: floating-point operations of one call.
    bytes: bytes that must move to/from memory in one call (the memory-bound roofline).
  """
  name: str
  setup: Callable[[], dict[str, Callable[[], Any]]]
  flops: float
  bytes: float


def _matmul(n: int = 1024) -> Benchmark:
  def setup():
    import jax
    import jax.numpy as jnp
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    return {"xla": lambda: f(a)}
  return Benchmark(f"matmul/n{n}_f32", setup, flops=2.0 * n ** 3, bytes=3 * 4.0 * n * n)


def discover() -> list[Benchmark]:
  """Built-in benchmarks plus `BENCHMARKS` of every `jaxlab.kernels.<op>.bench` module."""
  found = [_matmul()]
  kernels = importlib.import_module("jaxlab.kernels")
  for m in pkgutil.iter_modules(kernels.__path__):
    if not m.ispkg:
      continue
    try:
      mod = importlib.import_module(f"jaxlab.kernels.{m.name}.bench")
    except ModuleNotFoundError as e:
      if e.name != f"jaxlab.kernels.{m.name}.bench":
        raise
      continue
    found += list(getattr(mod, "BENCHMARKS", []))
  return found


def peaks(device_kind: str) -> tuple[float | None, float | None]:
  """(TFLOP/s, GB/s) for a device kind from PEAKS, or (None, None)."""
  for key, val in PEAKS.items():
    if key.lower() in device_kind.lower():
      return val
  return None, None


def time_call(fn: Callable[[], Any], iters: int = 20, warmup: int = 2) -> float:
  """Median wall time (seconds) of `fn()` over `iters` calls after `warmup` (blocking on results)."""
  import jax
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(iters):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def run(names: Sequence[str] = (), iters: int = 20, peak_tflops: float | None = None,
        peak_gbps: float | None = None) -> list[dict]:
  """Runs the selected benchmarks (all when `names` is empty or contains "all"); returns result rows."""
  import jax
  from jaxlab.errors import ConfigError
  kind = jax.devices()[0].device_kind
  pf, pb = peaks(kind)
  pf, pb = peak_tflops or pf, peak_gbps or pb
  selected = [b for b in discover()
              if not names or "all" in names or any(b.name == n or b.name.startswith(n + "/") for n in names)]
  if not selected:
    raise ConfigError(f"no benchmark matches {list(names)}; available: {', '.join(b.name for b in discover())}")
  rows = []
  for b in selected:
    roof = max(b.flops / (pf * 1e12), b.bytes / (pb * 1e9)) if pf and pb else None
    for impl, fn in b.setup().items():
      t = time_call(fn, iters)
      rows.append({"name": b.name, "impl": impl, "device": kind, "median_s": t,
                   "tflops": b.flops / t / 1e12, "gbps": b.bytes / t / 1e9,
                   "roofline_fraction": (roof / t) if roof else None})
  return rows


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxlab.bench", description=__doc__.split("\n\n")[0])
  parser.add_argument("names", nargs="*", help="kernel or benchmark names (default: all)")
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--peak_tflops", type=float, default=None)
  parser.add_argument("--peak_gbps", type=float, default=None)
  parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
  args = parser.parse_args(argv)
  rows = run(args.names, args.iters, args.peak_tflops, args.peak_gbps)
  print(f"{'benchmark':40s} {'impl':10s} {'median':>10s} {'TFLOP/s':>9s} {'GB/s':>8s} {'roofline':>9s}")
  for r in rows:
    frac = "" if r["roofline_fraction"] is None else f"{100 * r['roofline_fraction']:.1f}%"
    print(f"{r['name']:40s} {r['impl']:10s} {r['median_s'] * 1e3:9.3f}ms {r['tflops']:9.3f} {r['gbps']:8.1f} {frac:>9s}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
