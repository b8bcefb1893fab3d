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
