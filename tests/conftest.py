"""Test setup: 8 fake CPU devices BEFORE jax is imported, no progress bars, shared fixtures."""

import os
import sys

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXLAB_PROGRESS"] = "0"

import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "tests", "fixtures", "toy")


@pytest.fixture(scope="session")
def toy():
  """The test-only experiment (tests/fixtures/toy): config and train modules."""
  from jaxlab import registry
  exp = registry.load(TOY)
  return exp


@pytest.fixture(scope="session")
def root():
  return ROOT


def _mapping_count() -> int:
  try:
    with open("/proc/self/maps") as f:
      return sum(1 for _ in f)
  except OSError:
    return -1


# Mappings above which a finished module's compiled code is dropped (a third of Linux's default limit).
_MAPS_HIGH = int(os.environ.get("JAXLAB_TEST_MAPS_HIGH", "22000"))


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_code(request):
  """Drops jax's compilation caches after a test module once the process holds many memory mappings.

  Each compiled XLA:CPU executable keeps its own memory mappings for its machine code; one process running
  the whole suite compiles thousands of them and reaches Linux's `vm.max_map_count` (65530 by default),
  after which LLVM's allocations fail inside a compile (a segmentation fault). Freeing the executables of
  finished modules when the count passes `_MAPS_HIGH` keeps it bounded; below that the caches are kept, so the
  next modules reuse what is traced, lowered and compiled already (eager operations, shared library
  functions). Where the count cannot be read (not Linux), the caches are dropped after every module.
  """
  yield
  log = os.environ.get("JAXLAB_MAPS_LOG")     # optional: "<module> <mappings before> <after>" per module
  before = _mapping_count()
  if 0 <= before < _MAPS_HIGH:
    if log:
      with open(log, "a") as f:
        f.write(f"{request.module.__name__} {before} kept\n")
    return
  import gc
  import jax
  jax.clear_caches()
  gc.collect()
  if log:
    with open(log, "a") as f:
      f.write(f"{request.module.__name__} {before} {_mapping_count()}\n")


_COMPILE_CACHE = []


def _fast_compiles(config) -> None:
  """The default run (`-m "not slow"`) compiles with LLVM optimisation level 0.

  Compiling, not running, dominates the default tests (small shapes, a few steps each); level 0 takes about a
  third off an experiment's end-to-end test. Claim runs (`-m slow`, and `python -m jaxlab.reproduce`, which
  does not go through pytest) keep XLA's default level, so measured claims never depend on this. It is set
  here, before any test starts a backend (XLA reads the flags then), and inherited by the subprocesses tests
  start. `JAXLAB_TEST_FAST_COMPILE=0`, or an explicit level in XLA_FLAGS, leaves XLA's default.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if (config.getoption("markexpr", "") != "not slow" or os.environ.get("JAXLAB_TEST_FAST_COMPILE", "1") == "0"
      or "xla_backend_optimization_level" in flags):
    return
  os.environ["XLA_FLAGS"] = (flags + " --xla_backend_optimization_level=0").strip()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
  """The whole default suite (`python -m pytest`, no paths given) runs on two pytest-xdist workers, each a
  process with its own 8 fake devices and compilation cache, one test file per worker at a time (a file's
  module fixtures are built once). Named files or tests, `-m slow` (claim runs, whose timings a second worker
  would disturb), an explicit `-n`, or `JAXLAB_TEST_WORKERS=0` run as before; `JAXLAB_TEST_WORKERS=N` sets
  the count."""
  workers = int(os.environ.get("JAXLAB_TEST_WORKERS", "2"))
  if (workers < 2 or not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
      or config.getoption("numprocesses", None) or config.getoption("markexpr", "") != "not slow"
      or config.args_source != pytest.Config.ArgsSource.TESTPATHS):
    return
  config.option.numprocesses = workers
  config.option.dist = "loadfile"


def pytest_configure(config):
  """Fast compiles for the default run (`_fast_compiles`), and a persistent compilation cache for this test
  session (a fresh temporary folder, removed at the end).

  Experiment tests run the same programs several times (end to end, then resumed, interrupted, sharded), each
  time through fresh closures that jax's in-memory cache cannot match; the on-disk cache is keyed by the
  compiled program itself, so the reruns load the executable instead of compiling it (about a quarter of an
  experiment file's time). The subprocesses that tests start with this environment (the command-line tools,
  killed and rerun) use it too, through JAX_COMPILATION_CACHE_DIR: the same toy run is started there dozens of
  times. `JAXLAB_TEST_COMPILE_CACHE=0` turns it off.
  """
  try:
    import jax
  except ImportError:
    raise pytest.UsageError(
        f"jax is not installed for {sys.executable}: run the tests from the environment the project is installed "
        "in (python3 -m venv .venv && .venv/bin/pip install -e '.[all,test]' && .venv/bin/python -m pytest)"
    ) from None
  _fast_compiles(config)
  if os.environ.get("JAXLAB_TEST_COMPILE_CACHE", "1") == "0":
    return
  folder = tempfile.mkdtemp(prefix="jaxlab_test_xla_cache_")
  _COMPILE_CACHE.append(folder)
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  if os.environ.get("JAXLAB_TEST_SUBPROCESS_CACHE", "1") != "0":
    os.environ.update(JAX_COMPILATION_CACHE_DIR=folder, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def pytest_unconfigure(config):
  del config
  for folder in _COMPILE_CACHE:
    shutil.rmtree(folder, ignore_errors=True)
