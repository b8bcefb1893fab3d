"""Pallas selective-scan kernels for GPU (Triton lowering); they also run in the Pallas interpreter.

(Filled in below: chunked two-pass forward and chunk-recompute backward.)
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tiling of the selective-scan kernels (None = the backend's default).

  Attributes:
    block_d: channels per program in the forward (GPU default 16; TPU default 128, a lane multiple).
    chunk: time steps per program (a power of two; GPU default 128, TPU default 128). The forward runs
      two passes over chunks: local chunk states, then outputs from the true chunk-initial states.
    sub_chunk: the backward's recompute granularity: the forward saves a state every `sub_chunk` steps
      and the backward recomputes the states in between (GPU default 16, TPU default 8).
    block_d_bwd: channels per program in the backward (GPU default 32; TPU default 128).
    num_warps: Triton warps per program (GPU only; default 1).
    num_stages: Triton pipelining stages (GPU only; default 1).
  """
  block_d: int | None = None
  chunk: int | None = None
  sub_chunk: int | None = None
  block_d_bwd: int | None = None
  num_warps: int | None = None
  num_stages: int | None = None
