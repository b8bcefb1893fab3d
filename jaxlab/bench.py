"""Kernel benchmarks: median time after warm-up and the fraction of the roofline reached.

    python -m jaxlab.bench [NAME ...] [--iters 20] [--peak_tflops X --peak_gbps Y] [--json OUT]

Each kernel package `jaxlab.kernels.<op>` may define `BENCHMARKS` in its `bench.py`: a list of dicts with
the fields of `Benchmark` (plain dicts, since kernels do not import the library); `matmul` is built in as a calibration point. The roofline time of a case is
max(flops / peak FLOP/s, bytes / peak bandwidth, transcendentals / peak special-function rate); the peaks
come from a table of known accelerators (override with --peak_tflops / --peak_gbps / --peak_tsps; on CPU
there is no default, so the fraction is left blank). Each row also reports the compiled program's temporary
memory (XLA's memory analysis: the extra device memory beyond inputs and outputs) and, when the
benchmark has several impls, the speed-up over its baseline (the first impl unless it names another).
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

# Dense peak (TFLOP/s in the dtype most kernels use: bf16), HBM bandwidth (GB/s) and special-function
# (exp, ...) throughput (T/s; NVIDIA: 16 MUFU ops/clock/SM, ~3.9 T/s on H100/H200 as quoted by the
# FlashAttention-3 paper, ~2.4 T/s on A100; unknown on TPU) by device kind.
PEAKS = {
    "H200": (989.0, 4800.0, 3.9), "H100": (989.0, 3350.0, 3.9), "A100": (312.0, 2039.0, 2.4),
    "TPU v4": (275.0, 1228.0, None), "TPU v5 lite": (197.0, 819.0, None), "TPU v5e": (197.0, 819.0, None),
    "TPU v5p": (459.0, 2765.0, None), "TPU v6 lite": (918.0, 1640.0, None), "TPU v6e": (918.0, 1640.0, None),
}


@dataclasses.dataclass
class Benchmark:
  """One benchmark case.

  Attributes:
    name: "<kernel>/<case>", e.g. "selective_scan/fwd".
    setup: `() -> {impl_name: (jitted fn, args)}`; `fn(*args)` is timed.
    flops: floating-point operations of one call.
    bytes: bytes that must move to/from memory in one call (the memory-bound roofline).
    transcendentals: special-function evaluations (exp, log, ...) of one call.
    baseline: impl name the others' speed-up is reported against (default: the first impl of `setup`).
    shape: text describing the problem size (shown in the report).
    count, unit: items processed per call (e.g. 16384 "tok") for a throughput column (optional).
  """
  name: str
  setup: Callable[[], dict[str, tuple[Callable[..., Any], tuple]]]
  flops: float
  bytes: float
  transcendentals: float = 0.0
  baseline: str | None = None
  shape: str = ""
  count: float = 0.0
  unit: str = ""


def _matmul(n: int = 1024) -> Benchmark:
  def setup():
    import jax
    import jax.numpy as jnp
    a = jnp.ones((n, n), jnp.float32)
    return {"xla": (jax.jit(lambda x: x @ x), (a,))}
  return Benchmark(f"matmul/n{n}_f32", setup, flops=2.0 * n ** 3, bytes=3 * 4.0 * n * n, shape=f"{n}x{n}")


# Library modules with BENCHMARKS (scaling studies that are not single kernels).
LIBRARY_BENCH_MODULES = ("jaxlab.causal.bench", "jaxlab.diffusion.bench", "jaxlab.graphs.bench", "jaxlab.lm.bench",
                         "jaxlab.nn.bench", "jaxlab.ot.bench")


def discover() -> list[Benchmark]:
  """Built-in benchmarks, `BENCHMARKS` of every `jaxlab.kernels.<op>.bench`, and the library's."""
  found = [_matmul()]
  for name in LIBRARY_BENCH_MODULES:
    found += [b if isinstance(b, Benchmark) else Benchmark(**b)
              for b in getattr(importlib.import_module(name), "BENCHMARKS", [])]
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
    found += [b if isinstance(b, Benchmark) else Benchmark(**b) for b in getattr(mod, "BENCHMARKS", [])]
  return found


def peaks(device_kind: str) -> tuple[float | None, float | None, float | None]:
  """(TFLOP/s, GB/s, special-function T/s) for a device kind from PEAKS, or Nones."""
  for key, val in PEAKS.items():
    if key.lower() in device_kind.lower():
      return val
  return None, None, None


def roofline_seconds(b: Benchmark, pf, pb, pt) -> float | None:
  """Lower bound on one call's time from the peaks (None when the FLOP or bandwidth peak is unknown)."""
  if not (pf and pb):
    return None
  t = max(b.flops / (pf * 1e12), b.bytes / (pb * 1e9))
  if pt and b.transcendentals:
    t = max(t, b.transcendentals / (pt * 1e12))
  return t


def temp_bytes(fn, args) -> int | None:
  """Temporary device memory of the compiled call (XLA memory analysis), if the backend reports it."""
  try:
    return int(fn.lower(*args).compile().memory_analysis().temp_size_in_bytes)
  except Exception:  # not every backend implements memory_analysis
    return None


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
        peak_gbps: float | None = None, peak_tsps: float | None = None) -> list[dict]:
  """Runs the selected benchmarks (all when `names` is empty or contains "all"); returns result rows."""
  import jax
  from jaxlab.errors import ConfigError
  kind = jax.devices()[0].device_kind
  pf, pb, pt = peaks(kind)
  pf, pb, pt = peak_tflops or pf, peak_gbps or pb, peak_tsps or pt
  selected = [b for b in discover()
              if not names or "all" in names or any(b.name == n or b.name.startswith(n + "/") for n in names)]
  if not selected:
    raise ConfigError(f"no benchmark matches {list(names)}; available: {', '.join(b.name for b in discover())}")
  rows = []
  for b in selected:
    roof = roofline_seconds(b, pf, pb, pt)
    case = []
    for impl, entry in b.setup().items():
      if isinstance(entry, str):  # the benchmark refused this impl at this size (e.g. would not fit)
        case.append({"name": b.name, "shape": b.shape, "impl": impl, "device": kind, "median_s": None,
                     "tflops": None, "gbps": None, "roofline_fraction": None, "temp_bytes": None, "note": entry})
        continue
      fn, args = entry
      t = time_call(lambda: fn(*args), iters)  # noqa: B023
      case.append({"name": b.name, "shape": b.shape, "impl": impl, "device": kind, "median_s": t,
                   "tflops": b.flops / t / 1e12, "gbps": b.bytes / t / 1e9, "note": "",
                   "throughput": (b.count / t) if b.count else None, "unit": b.unit,
                   "roofline_fraction": (roof / t) if roof else None, "temp_bytes": temp_bytes(fn, args)})
    baseline = b.baseline or (case[0]["impl"] if len(case) > 1 else None)   # default: the first impl listed
    base = next((r["median_s"] for r in case if r["impl"] == baseline), None)
    for r in case:
      r["speedup_vs_baseline"] = base / r["median_s"] if base and r["median_s"] else None
    rows += case
  return rows


def main(argv: list[str]) -> int:
  epilog = None
  if "-h" in argv or "--help" in argv:   # listing the benchmarks imports every kernel package: only for --help
    names = [b.name for b in discover()]
    epilog = "benchmarks (a name or its kernel prefix selects them):\n  " + "\n  ".join(names)
  parser = argparse.ArgumentParser(prog="python -m jaxlab.bench", description=__doc__.split("\n\n")[0],
                                   epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("names", nargs="*", help="kernel or benchmark names, e.g. selective_scan or "
                      "selective_scan/fwd (default: all; see the list below)")
  parser.add_argument("--iters", type=int, default=20, help="timed calls per case (median reported)")
  parser.add_argument("--peak_tflops", type=float, default=None, help="peak TFLOP/s of the device (default: known table)")
  parser.add_argument("--peak_gbps", type=float, default=None, help="peak memory bandwidth, GB/s")
  parser.add_argument("--peak_tsps", type=float, default=None, help="peak special-function rate, T/s")
  parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
  args = parser.parse_args(argv)
  rows = run(args.names, args.iters, args.peak_tflops, args.peak_gbps, args.peak_tsps)
  print(f"{'benchmark':28s} {'impl':12s} {'median':>11s} {'TFLOP/s':>8s} {'GB/s':>8s} {'roofline':>9s} "
        f"{'temp MiB':>9s} {'speed-up':>9s} {'rate':>14s}  shape")
  for r in rows:
    if r["median_s"] is None:
      print(f"{r['name']:28s} {r['impl']:12s} {r['note']}")
      continue
    frac = "" if r["roofline_fraction"] is None else f"{100 * r['roofline_fraction']:.1f}%"
    mem = "" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 2**20:.1f}"
    up = "" if r["speedup_vs_baseline"] is None else f"{r['speedup_vs_baseline']:.2f}x"
    rate = "" if not r.get("throughput") else f"{r['throughput']:.4g} {r['unit']}/s"
    print(f"{r['name']:28s} {r['impl']:12s} {r['median_s'] * 1e3:9.3f}ms {r['tflops']:8.3f} {r['gbps']:8.1f} "
          f"{frac:>9s} {mem:>9s} {up:>9s} {rate:>14s}  {r['shape']}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)
  return 0


if __name__ == "__main__":
  cli.main_wrapper(main)
