"""Error types raised on bad user input.

Every error here carries a one-line message that says what is wrong and how to fix it. The command-line
tools (`jaxlab.main`, `jaxlab.reproduce`, `jaxlab.sweep`, `jaxlab.bench`) print such errors as a single
`error: ...` line and exit with status 2 instead of showing a traceback.
"""


class JaxlabError(Exception):
  """Base class of the user-facing errors of jaxlab."""


class ConfigError(JaxlabError, ValueError):
  """A config key or value is unknown or invalid."""


class CheckpointError(JaxlabError, ValueError):
  """A checkpoint is missing, corrupt, or was written by a different model."""


class DamagedCheckpoint(CheckpointError):
  """A checkpoint's files cannot be read, or its arrays do not match the checksums recorded when it was saved."""


class SaveFailed(JaxlabError, RuntimeError):
  """Writing a checkpoint failed for a reason other than the disk (the command-line tools end the process at once:
  the save's background threads could otherwise keep it from exiting)."""


class DataError(JaxlabError, ValueError):
  """Input data has the wrong shape, type or content."""


class NonFiniteError(JaxlabError, FloatingPointError):
  """A logged metric became NaN or infinite during training."""


class MissingDependencyError(JaxlabError, ImportError):
  """An optional package needed by the requested feature is not installed."""


def require(module: str, extra: str):
  """Imports an optional module or raises a MissingDependencyError naming the pip extra.

  Args:
    module: importable module name, e.g. "ott".
    extra: the jaxlab extra that installs it, e.g. "ot".

  Returns:
    The imported module.
  """
  import importlib
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise MissingDependencyError(
        f"optional package '{module}' is not installed; install it with "
        f"pip install 'jaxlab[{extra}]' (or pip install -e '.[{extra}]' in a checkout)") from e


class Interrupted(KeyboardInterrupt):
  """A run stopped on Ctrl-C or SIGTERM, after writing the checkpoint of the step it reached (if any).

  The command-line tools print it as one line (where it stopped, what was saved, the command that resumes)
  and exit with 130 (Ctrl-C) or 143 (SIGTERM).

  Attributes:
    workdir: the run directory (None when unknown).
    step: the step (or number of finished stages) reached.
    checkpoint: the step of the newest checkpoint on disk, None when there is none.
    signum: 2 (SIGINT, Ctrl-C) or 15 (SIGTERM).
  """

  def __init__(self, message: str = "interrupted", *, workdir: str | None = None, step: int | None = None,
               checkpoint: int | None = None, signum: int = 2):
    super().__init__(message)
    self.workdir, self.step, self.checkpoint, self.signum = workdir, step, checkpoint, signum


class Preempted(Interrupted):
  """Raised after a SIGTERM (preemption) once the checkpoint of the current step is written."""

  def __init__(self, message: str = "SIGTERM", **kwargs):
    kwargs.setdefault("signum", 15)
    super().__init__(message, **kwargs)
