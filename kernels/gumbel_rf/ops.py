"""Public op: `walk_step(..., impl="auto" | "xla" | "pallas" | "interpret")` (see reference.py).

"auto" is "pallas" on GPU and "xla" elsewhere. The kernel gathers rows with per-walker indices, which
Pallas-Triton lowers (GPU) but Pallas-Mosaic (TPU) does not support; on TPU "auto" runs the XLA reference
and "pallas" raises a ValueError saying so.
"""

from __future__ import annotations

import jax

from jaxlab.kernels.gumbel_rf import reference

IMPLS = ("auto", "xla", "pallas", "interpret")


def resolve_impl(impl: str) -> str:
  if impl not in IMPLS:
    raise ValueError(f"gumbel_rf: impl={impl!r} is not one of {IMPLS}")
  platform = jax.default_backend()
  if impl == "auto":
    return "pallas" if platform in ("gpu", "cuda") else "xla"
  if impl == "pallas" and platform not in ("gpu", "cuda"):
    raise ValueError(f"gumbel_rf: impl='pallas' needs a GPU (this backend is {platform!r}; the kernel's per-walker "
                     "gathers do not lower on TPU/Mosaic); use impl='xla', or 'interpret' to run the kernel on CPU")
  return impl


def walk_step(cur, load, walker_ids, seed, step, log_phi, log_s, cdf, x, *, impl="auto", block_walkers=128, **kw):
  """One fused SWING step for a batch of walkers; see `reference.walk_step_ref` for arguments.

  Raises:
    ValueError: inconsistent shapes or an unsupported impl.
  """
  n, m = log_phi.shape
  if cur.ndim != 1 or load.shape != cur.shape or walker_ids.shape != cur.shape:
    raise ValueError(f"gumbel_rf: cur, load, walker_ids must be (walkers,), got {cur.shape}, {load.shape}, "
                     f"{walker_ids.shape}")
  if log_s.shape != (m,) or cdf.shape != (m, n) or x.ndim != 2 or x.shape[0] != n:
    raise ValueError(f"gumbel_rf: tables disagree: log_phi {log_phi.shape}, log_s {log_s.shape} (want ({m},)), "
                     f"cdf {cdf.shape} (want ({m}, {n})), x {x.shape} (want ({n}, d))")
  if kw.get("kind", "rbf") not in reference.KINDS:
    raise ValueError(f"gumbel_rf: kind={kw['kind']!r} is not one of {reference.KINDS}")
  impl = resolve_impl(impl)
  if impl == "xla":
    return reference.walk_step_ref(cur, load, walker_ids, seed, step, log_phi, log_s, cdf, x, **kw)
  from jaxlab.kernels.gumbel_rf import kernel  # pylint: disable=g-import-not-at-top
  return kernel.walk_step(cur, load, walker_ids, seed, step, log_phi, log_s, cdf, x, block_walkers=block_walkers,
                          interpret=impl == "interpret", **kw)
