"""Progress bars: tqdm on process 0 when stderr is a terminal or the code runs in a notebook.

Set `JAXLAB_PROGRESS=0` to turn bars off everywhere or `JAXLAB_PROGRESS=1` to force them on.
"""

from __future__ import annotations

import os
import sys

import jax
from tqdm.auto import tqdm


def in_notebook() -> bool:
  """True inside a Jupyter / Colab kernel."""
  try:
    from IPython import get_ipython  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  shell = get_ipython()
  return shell is not None and type(shell).__name__ in ("ZMQInteractiveShell", "Shell")


def enabled() -> bool:
  """Whether progress bars show on this process."""
  env = os.environ.get("JAXLAB_PROGRESS")
  if env is not None:
    return env not in ("0", "false", "False", "") and jax.process_index() == 0
  return jax.process_index() == 0 and (sys.stderr.isatty() or in_notebook())


def bar(total: int, initial: int = 0, desc: str | None = None) -> tqdm:
  """A tqdm bar over steps (disabled where `enabled()` is False)."""
  return tqdm(total=total, initial=initial, desc=desc, disable=not enabled(), dynamic_ncols=True, leave=False)


def postfix(metrics: dict, n: int = 2) -> dict[str, str]:
  """The few metrics a bar shows: losses first (e.g. train/loss), then the others, short names."""
  keys = sorted(metrics, key=lambda k: ("loss" not in k, k.endswith("steps_per_sec")))[:n]
  return {k.split("/")[-1]: f"{metrics[k]:.4g}" for k in keys if isinstance(metrics[k], (int, float))}
