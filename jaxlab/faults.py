"""Fault injection at the write boundaries of a run, for the crash-consistency tests.

Every place where a run makes durable state (the workdir lock, config.json and the other JSON files, each
metrics row, the rewrite of metrics.jsonl on resume, each checkpoint, each stage's arrays) calls
`boundary(name)` just before the write and, where the write has a visible end, `boundary(name + "/done")` just
after it. Unset, a boundary costs one environment lookup and does nothing.

    JAXLAB_FAULT_LOG=PATH          append the name of every boundary passed to PATH (one per line): a run's
                                   list of boundaries, in order
    JAXLAB_FAULT="NAME#N=ACTION"   at the N-th pass (1-based) through boundary NAME, do ACTION:
                                   `kill` (SIGKILL to this process: nothing after it runs, no cleanup),
                                   `raise` (RuntimeError, e.g. a save that fails for a reason other than
                                   the disk)

`tests/test_crash_consistency.py` kills a tiny run and a tiny staged run at every boundary in turn and checks
that the rerun ends identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import signal

_PASSES: dict[str, int] = {}


def boundary(name: str) -> None:
  """Marks a write boundary (see the module docstring)."""
  log, fault = os.environ.get("JAXLAB_FAULT_LOG"), os.environ.get("JAXLAB_FAULT")
  if not log and not fault:
    return
  n = _PASSES[name] = _PASSES.get(name, 0) + 1
  if log:
    with open(log, "a") as f:
      f.write(f"{name}#{n}\n")
  if fault:
    where, _, action = fault.partition("=")
    if where == f"{name}#{n}":
      if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
      raise RuntimeError(f"fault injected at write boundary {where} (JAXLAB_FAULT)")
