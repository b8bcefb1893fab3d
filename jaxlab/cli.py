"""Shared plumbing of the command-line tools: logging, one-line errors, interrupts, `--config.key=value` overrides.

`main_wrapper(fn, resume=...)` runs a tool's `main(argv)`:

* a user error (`jaxlab.errors.JaxlabError`) prints one `error: ...` line and exits with 2;
* Ctrl-C or SIGTERM prints one line saying where the run stopped, what was saved and the exact command that
  resumes it, and exits with 130 (Ctrl-C) or 143 (SIGTERM), without a traceback. SIGTERM outside a
  training loop (e.g. while data loads) is turned into the same clean stop;
* a full disk (ENOSPC anywhere in the exception's chain, orbax's wrapped errors included) prints one line naming
  the file system (its mount point and free space), the file it was writing and the step the rerun resumes from
  (`write_failure_message`; a read-only or unwritable path likewise), and exits with 1 at once
  (`_exit_after_a_failed_write`). A checkpoint save that fails for any other reason (`SaveFailed`) is one line
  and the same immediate exit.
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

from jaxlab.errors import ConfigError, Interrupted, JaxlabError, Preempted, SaveFailed


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
  for handler in logging.getLogger().handlers:
    handler.addFilter(_not_a_failed_write)
  argv = sys.argv[1:]
  signal.signal(signal.SIGTERM, _sigterm)
  try:
    code = fn(argv)
  except SaveFailed as e:   # orbax's save threads may be left running: one line, then end the process at once
    print("error: " + " ".join(str(e).splitlines()), file=sys.stderr, flush=True)
    _exit_after_a_failed_write(1)
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
    failed = write_failure(e)
    if failed is None:
      raise
    print(write_failure_message(failed, _flag(argv, "--workdir")), file=sys.stderr, flush=True)
    _exit_after_a_failed_write(1)
  sys.exit(code or 0)


# errno of a failed write -> what the one line calls it; ENOSPC / EDQUOT are a full disk, the rest a path
# that cannot be written (a read-only mount, a checkpoints directory without write permission).
_WRITE_ERRNOS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only",
                 errno.EACCES: "permission denied", errno.EPERM: "permission denied"}


def no_space(e: BaseException) -> OSError | None:
  """The ENOSPC error in `e`'s chain of causes (a full disk), or None."""
  found = write_failure(e)
  return found if found is not None and found.errno == errno.ENOSPC else None


def write_failure(e: BaseException) -> OSError | None:
  """The OSError of a failed write (full disk, quota, read-only or unwritable path) in `e`'s chain, or None."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
      return e
    e = e.__cause__ or e.__context__
  return None


_WRITE_FAILURE_TEXT = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied",
                       "RESOURCE_EXHAUSTED")


def _not_a_failed_write(record: logging.LogRecord) -> bool:
  """Drops the log records (with tracebacks) that orbax's save threads write when a write fails (full disk,
  read-only path): the one line that `main_wrapper` prints says it all."""
  error = record.exc_info[1] if record.exc_info else None
  text = record.getMessage()
  return not ((error is not None and write_failure(error) is not None) or any(s in text for s in _WRITE_FAILURE_TEXT))


def _exit_after_a_failed_write(code: int) -> None:
  """Ends the process with `code` at once, after the one line: a failed write leaves orbax's asynchronous save
  threads behind, which at interpreter exit print their own copies of the failure (thread tracebacks, "Event
  loop is closed" from the storage layer's callbacks) and can keep the process waiting for good. The workdir
  locks this process holds are given back first (the atexit handlers do not run)."""
  from jaxlab import workdir
  logging.disable(logging.CRITICAL)
  workdir._release_all()   # pylint: disable=protected-access  (its atexit handler)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def write_failure_message(e: OSError, workdir: str | None = None) -> str:
  """The one line printed when a write fails: for a full disk the file system (mount point and free space), else
  the path that cannot be written; the file being written; and the step the rerun resumes from (the newest
  checkpoint in `workdir`, when known)."""
  path = e.filename or workdir
  where = f" while writing {e.filename}" if e.filename else ""
  device, free = "the device", ""
  if path:
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
      probe = os.path.dirname(probe)
    device = probe
    while not os.path.ismount(device):
      device = os.path.dirname(device)
    try:
      st = os.statvfs(probe)
      free = f" ({st.f_bavail * st.f_frsize / 2**20:.1f} MiB free of {st.f_blocks * st.f_frsize / 2**20:.1f})"
    except OSError:
      pass
  resume = "from its last checkpoint"
  if workdir:
    root = os.path.join(workdir, "checkpoints")
    steps = [int(d) for d in (os.listdir(root) if os.path.isdir(root) else []) if d.isdigit()]
    resume = f"from step {max(steps)}" if steps else "from the start (no checkpoint was written)"
  if e.errno in (errno.ENOSPC, errno.EDQUOT):
    return (f"error: {_WRITE_ERRNOS[e.errno]} on {device}{free}{where}; free some space and rerun the same "
            f"command: the run resumes {resume}")
  what = f"{e.filename} cannot be written" if e.filename else f"a file under {device} cannot be written"
  return (f"error: {what} ({_WRITE_ERRNOS[e.errno]}: {e.strerror or e}); make it writable (or use another "
          f"--workdir) and rerun the same command: the run resumes {resume}")


def _flag(argv: Sequence[str], name: str) -> str | None:
  """The value of `--name VALUE` / `--name=VALUE` in argv, or None."""
  for i, a in enumerate(argv):
    if a == name and i + 1 < len(argv):
      return argv[i + 1]
    if a.startswith(name + "="):
      return a.split("=", 1)[1]
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
