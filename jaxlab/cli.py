"""Shared plumbing of the command-line tools: logging, one-line errors, interrupts, `--config.key=value` overrides.

`main_wrapper(fn, resume=...)` runs a tool's `main(argv)`:

* a user error (`jaxlab.errors.JaxlabError`) prints one `error: ...` line and exits with 2;
* Ctrl-C or SIGTERM prints one line saying where the run stopped, what was saved and the exact command that
  resumes it, and exits with 130 (Ctrl-C) or 143 (SIGTERM), without a traceback. SIGTERM outside a
  training loop (e.g. while data loads) is turned into the same clean stop;
* a full disk (ENOSPC anywhere in the exception's chain, orbax's wrapped errors included) prints one line naming
  the device and the file it was writing, and exits with 1: the rerun resumes from the last checkpoint.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import signal
import sys
import warnings
from typing import Callable, Sequence

from jaxlab.errors import ConfigError, Interrupted, JaxlabError, Preempted


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates `--config.key=value` / `--config.key value` overrides from the other arguments."""
  rest, overrides = [], []
  argv = list(argv)
  i = 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config."):
      body = a[len("--config."):]
      if "=" not in body:
        if i + 1 >= len(argv):
          raise JaxlabError(f"{a} needs a value: {a}=VALUE")
        body = f"{body}={argv[i + 1]}"
        i += 1
      overrides.append(body)
    else:
      rest.append(a)
    i += 1
  return rest, overrides


def parse_seeds(text: str | None) -> list[int] | None:
  """`--seeds 0,1,2` -> [0, 1, 2] (None stays None).

  Raises:
    ConfigError: on an empty item, a non-integer, a negative or a repeated seed.
  """
  if text is None:
    return None
  items = [s.strip() for s in text.split(",")]
  if not text.strip() or any(not s for s in items):
    raise ConfigError(f"--seeds {text!r} has an empty entry; give comma-separated integers, e.g. --seeds 0,1,2")
  try:
    seeds = [int(s) for s in items]
  except ValueError:
    raise ConfigError(f"--seeds {text!r}: every seed must be an integer, e.g. --seeds 0,1,2") from None
  if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
    raise ConfigError(f"--seeds {text!r}: seeds must be distinct non-negative integers")
  return seeds


def main_wrapper(fn: Callable[[list[str]], int], resume: Callable[[list[str]], list[str]] | None = None) -> None:
  """Runs `fn(argv)` with one-line user errors and clean interrupts (see the module docstring).

  Args:
    fn: the tool's `main(argv) -> exit code`.
    resume: `argv -> argv` of the command that resumes an interrupted run (default: the same argv).
  """
  logging.basicConfig(level=os.environ.get("JAXLAB_LOGLEVEL", "INFO"),
                      format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
  for noisy in ("absl", "jax._src", "orbax", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  argv = sys.argv[1:]
  signal.signal(signal.SIGTERM, _sigterm)
  try:
    code = fn(argv)
  except JaxlabError as e:
    print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)
    # Reads that a failed checkpoint restore abandoned before they started report themselves as "coroutine ...
    # was never awaited" when the interpreter exits; the line above is the whole story.
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    sys.exit(2)
  except KeyboardInterrupt as e:
    print(interrupt_message(e, _command(resume(argv) if resume else argv)), file=sys.stderr, flush=True)
    sys.exit(128 + (e.signum if isinstance(e, Interrupted) else signal.SIGINT))
  except Exception as e:  # pylint: disable=broad-except
    full = no_space(e)
    if full is None:
      raise
    where = f" while writing {full.filename}" if full.filename else ""
    print(f"error: no space left on the device{where}; free some space and rerun the same command: the run resumes "
          "from its last checkpoint", file=sys.stderr, flush=True)
    sys.exit(1)
  sys.exit(code or 0)


def no_space(e: BaseException) -> OSError | None:
  """The ENOSPC error in `e`'s chain of causes (a full disk), or None."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return e
    e = e.__cause__ or e.__context__
  return None


def interrupt_message(e: BaseException, command: str) -> str:
  """The one line printed when a run stops on Ctrl-C / SIGTERM."""
  what = "SIGTERM" if isinstance(e, Interrupted) and e.signum == signal.SIGTERM else "Ctrl-C"
  if not isinstance(e, Interrupted) or e.workdir is None:
    return f"stopped by {what} before any checkpoint was written; rerun to start again: {command}"
  saved = (f"checkpoint of step {e.checkpoint} saved" if e.checkpoint is not None else "nothing saved yet")
  return f"stopped by {what} ({e}); {saved} in {e.workdir}; resume with: {command}"


def reproduce_resume_argv(argv: list[str]) -> list[str]:
  """The `jaxlab.reproduce` argv that resumes: the same with `--resume` (without it a rerun starts over)."""
  return argv if "--resume" in argv else [*argv, "--resume"]


def _command(argv: list[str]) -> str:
  module = sys.modules["__main__"].__spec__.name if getattr(sys.modules["__main__"], "__spec__", None) else "jaxlab"
  return shlex.join(["python", "-m", module, *argv])


def _sigterm(signum, frame):
  raise Preempted("SIGTERM")
