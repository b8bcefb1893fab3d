"""Test setup: 8 fake CPU devices BEFORE jax is imported, no progress bars, shared fixtures."""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXLAB_PROGRESS"] = "0"

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


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_code(request):
  """Drops jax's compilation caches after every test module.

  Each compiled XLA:CPU executable keeps its own memory mappings for its machine code; one process running
  the whole suite compiles thousands of them and reaches Linux's `vm.max_map_count` (65530 by default),
  after which LLVM's allocations fail inside a compile (a segmentation fault). Freeing the executables of
  finished modules keeps the count bounded.
  """
  yield
  import gc
  import jax
  log = os.environ.get("JAXLAB_MAPS_LOG")     # optional: "<module> <mappings before> <after>" per module
  before = _mapping_count() if log else None
  jax.clear_caches()
  gc.collect()
  if log:
    with open(log, "a") as f:
      f.write(f"{request.module.__name__} {before} {_mapping_count()}\n")
