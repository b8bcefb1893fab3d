"""Multi-process (multi-host) start-up through `jax.distributed`.

Call `initialize()` before any other JAX call (the command-line tools do). It starts the distributed
runtime when the environment asks for it:

* `JAXLAB_COORDINATOR=host:port`, `JAXLAB_NUM_PROCESSES=N`, `JAXLAB_PROCESS_ID=i`: explicit (any
  platform; on CPU the gloo collectives are selected, which is how the tests run two local processes);
* `JAXLAB_DISTRIBUTED=auto`: JAX's cluster auto-detection (Cloud TPU pods, SLURM, Open MPI, ...).

Otherwise it does nothing and the run is single-process. After start-up every process runs the same
program on its slice of the data; only process 0 writes metrics, configs and summaries.
"""

from __future__ import annotations

import os

import jax

_STARTED = False


def requested() -> bool:
  """Whether the environment asks for a multi-process run."""
  return bool(os.environ.get("JAXLAB_COORDINATOR") or os.environ.get("JAXLAB_DISTRIBUTED") == "auto")


def initialize() -> None:
  """Starts `jax.distributed` when the environment asks for it (idempotent)."""
  global _STARTED
  if _STARTED or not requested():
    return
  if os.environ.get("JAXLAB_COORDINATOR"):
    # Only used by the CPU backend (harmless elsewhere): cross-process collectives for CPU runs.
    jax.config.update("jax_cpu_collectives_implementation", os.environ.get("JAXLAB_CPU_COLLECTIVES", "gloo"))
    jax.distributed.initialize(
        coordinator_address=os.environ["JAXLAB_COORDINATOR"],
        num_processes=int(os.environ["JAXLAB_NUM_PROCESSES"]),
        process_id=int(os.environ["JAXLAB_PROCESS_ID"]))
  else:
    jax.distributed.initialize()
  _STARTED = True
