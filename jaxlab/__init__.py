"""jaxlab: an accelerator-first JAX/Flax research codebase for a set of ICML 2026 papers.

The shared library (configs, meshes, sharded train states, the resumable loop, checkpoints, metrics,
data pipelines) lives here; Pallas kernels under `jaxlab.kernels`; one experiment per paper under
`jaxlab.experiments`. The library never imports the experiments.
"""

__version__ = "0.1.0"


def _leave_libtpu_out() -> None:
  """Keeps libtpu quiet on machines without a TPU.

  With libtpu installed (the `tpu-aot` extra, which the `test` extra includes, for `jaxlab.compile_check`) jax
  initialises its TPU plugin at the first device query on any machine, and on one without TPU chips that prints
  about five lines of start-up errors ("Failed to find host bounds ...", "unexpected worker hostname ...") before
  falling back to the CPU. When the user has not chosen platforms (JAX_PLATFORMS), libtpu is installed, the
  machine shows no TPU chip (no /dev/accel* or /dev/vfio/<n>, the device files of TPU VMs) and no GPU plugin is
  installed, jax is pointed at the CPU directly. `jaxlab.compile_check` needs no TPU platform: it compiles
  through libtpu's compile-only client.
  """
  import glob  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import pkgutil  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  if "JAX_PLATFORMS" in os.environ or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  try:
    if importlib.util.find_spec("libtpu") is None:
      return
    plugins = importlib.util.find_spec("jax_plugins")
  except (ImportError, ValueError):
    return
  if plugins is not None and any(True for _ in pkgutil.iter_modules(plugins.submodule_search_locations or [])):
    return                                                       # a GPU (or other) plugin: leave jax to choose
  if any(m.name.startswith(("jax_cuda", "jax_rocm")) for m in pkgutil.iter_modules()):
    return
  if "jax" in sys.modules:
    sys.modules["jax"].config.update("jax_platforms", "cpu")
  else:
    os.environ["JAX_PLATFORMS"] = "cpu"


_leave_libtpu_out()

