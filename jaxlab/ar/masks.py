"""Attention masks of the two-stream self-token transformer, built from a group-id vector, and group schedules.

Sequence layout (`jaxlab.ar.model`): [C_1..C_m | R_1..R_N | P_1..P_N] with m prefix (class) tokens, N
reference tokens R (the clean tokens, the only context; KV-cacheable) and N prediction ("self") tokens P, where
P_i predicts the token at its OWN position i from a learned query and position i's embedding (no content).
With g(i) the group of position i (groups are generated in order 0, 1, ...), the self-token mask ("sar") is

    C -> C                 always;            R, P -> C   always
    R_i -> R_j   iff g(j) <= g(i)             (block-causal, bidirectional inside a group)
    P_i -> R_j   iff g(j) <  g(i)             (strictly earlier groups: never its own clean token)
    P_i -> P_j   iff g(j) == g(i) and intra_pred, or i == j
    C, R -> P    never

(the spec's reconstruction from the reviews of "Autoregression with Self-Token Prediction", ICML 2026). So the
tokens of one group are predicted in parallel in one step, and a prediction depends on nothing at or after
its group: the leakage test of `tests/ar/test_masks.py` perturbs those tokens and checks bit-identical outputs.

Variants from the same builder (`KINDS`):
* "sar": the rules above (`intra_pred` is the flag `intra_group_pred_visibility`);
* "lpd": "sar" with mutual visibility inside a group forced on (Locality-aware Parallel Decoding, arXiv
  2507.01957: position queries of one parallel group see each other and the earlier tokens);
* "mar": MAR-style bidirectional context (Li et al. 2024, arXiv 2406.11838): every reference token sees every
  other (so no KV cache is possible and a prediction reads later groups through them), P_i -> R_j iff g(j) <
  g(i), every P sees every P;
* "causal": a plain token-causal mask on the same layout (R_i -> R_j and P_i -> R_j iff j <= i): P_i reads its
  own clean token (identity leakage);
* "full": everything sees everything.
The last three fail the leakage test (negative controls). "ref_causal" is the one-stream GPT mask of next-token
regression: R_i -> R_j iff j <= i (the prediction streams are unused).

Group schedules: `fixed_sizes` (k per step), `linear_sizes` (sizes growing linearly), `cosine_sizes` (MAR's
cosine schedule: after step s, N cos(pi/2 (s + 1) / S) tokens remain), `groups_from_sizes`, and
`random_groups` (random partitions into consecutive groups for training, sizes drawn per group).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.errors import ConfigError

KINDS = ("sar", "lpd", "mar", "causal", "full", "ref_causal")
SCHEDULES = ("fixed", "linear", "cosine")


def two_stream_mask(groups, *, num_prefix: int = 1, kind: str = "sar", intra_pred: bool = True) -> jax.Array:
  """The boolean mask (T, T) or (B, T, T), T = num_prefix + 2N, of the module docstring (True = attend).

  Args:
    groups: (N,) or (B, N) int group ids of the positions (any integers; only their order matters).
    num_prefix: prefix (class) tokens before the reference stream.
    kind: one of `KINDS`.
    intra_pred: prediction tokens of one group see each other ("sar" only; "lpd" forces it).
  """
  if kind not in KINDS:
    raise ConfigError(f"two_stream_mask: kind={kind!r} is not one of {KINDS}")
  g = jnp.asarray(groups)
  n, m = g.shape[-1], int(num_prefix)
  gi, gj = g[..., :, None], g[..., None, :]
  pos = jnp.arange(n)
  eye = pos[:, None] == pos[None, :]
  le = pos[None, :] <= pos[:, None]
  shape = g.shape[:-1] + (n, n)
  none = jnp.zeros(shape, bool)
  if kind in ("sar", "lpd"):
    rr, pr = gj <= gi, gj < gi
    pp = (gj == gi) if (intra_pred or kind == "lpd") else jnp.broadcast_to(eye, shape)
  elif kind == "mar":
    rr, pr, pp = jnp.ones(shape, bool), gj < gi, jnp.ones(shape, bool)
  elif kind == "causal":
    rr = pr = jnp.broadcast_to(le, shape)
    pp = jnp.broadcast_to(eye, shape)
  elif kind == "full":
    rr = pr = pp = jnp.ones(shape, bool)
  else:   # ref_causal
    rr, pr, pp = jnp.broadcast_to(le, shape), none, jnp.broadcast_to(eye, shape)
  rr, pr, pp = (jnp.broadcast_to(a, shape) for a in (rr, pr, pp))
  top = jnp.concatenate([jnp.ones(g.shape[:-1] + (m, m), bool), jnp.zeros(g.shape[:-1] + (m, 2 * n), bool)], -1)
  pre = jnp.ones(g.shape[:-1] + (n, m), bool)
  ref = jnp.concatenate([pre, rr, none], -1)
  if kind == "full":
    ref = jnp.concatenate([pre, rr, jnp.ones(shape, bool)], -1)
  pred = jnp.concatenate([pre, pr, pp], -1)
  return jnp.concatenate([top, ref, pred], -2)


def groups_from_sizes(sizes: Sequence[int]) -> np.ndarray:
  """(sum(sizes),) group id of each position for consecutive groups of the given sizes."""
  return np.repeat(np.arange(len(sizes)), np.asarray(sizes, int)).astype(np.int32)


def check_sizes(sizes, n: int) -> tuple[int, ...]:
  """The group sizes as ints; ConfigError unless they are >= 1 and sum to the n tokens."""
  if sum(sizes) != n or min(sizes) < 1:
    raise ConfigError(f"group sizes {sizes} must be >= 1 and sum to the {n} tokens")
  return tuple(int(s) for s in sizes)


def fixed_sizes(n: int, k: int) -> tuple[int, ...]:
  """k tokens per step (the last step takes the remainder)."""
  if k < 1:
    raise ConfigError(f"tokens per step must be >= 1, got {k}")
  return check_sizes([k] * (n // k) + ([n % k] if n % k else []), n)


def linear_sizes(n: int, steps: int) -> tuple[int, ...]:
  """`steps` groups whose sizes grow linearly (few tokens first, many last), summing to n."""
  _check_steps(n, steps)
  w = np.arange(1, steps + 1, dtype=np.float64)
  return _round_sizes(n * w / w.sum(), n)


def cosine_sizes(n: int, steps: int) -> tuple[int, ...]:
  """MAR's cosine schedule: after step s (0-based) N cos(pi/2 (s + 1) / steps) tokens remain unknown."""
  _check_steps(n, steps)
  left = [n] + [n * math.cos(math.pi / 2 * (s + 1) / steps) for s in range(steps)]
  return _round_sizes(np.diff(-np.asarray(left)), n)


def schedule(n: int, kind: str, *, k: int = 1, steps: int = 0) -> tuple[int, ...]:
  """Group sizes for sampling N tokens: kind "fixed" (k per step), "linear" or "cosine" (over `steps` steps)."""
  if kind == "fixed":
    return fixed_sizes(n, k)
  if kind == "linear":
    return linear_sizes(n, steps)
  if kind == "cosine":
    return cosine_sizes(n, steps)
  raise ConfigError(f"schedule kind={kind!r} is not one of {SCHEDULES}")


def _check_steps(n, steps):
  if not 1 <= steps <= n:
    raise ConfigError(f"steps={steps} must be in [1, {n}] for {n} tokens")


def _round_sizes(real, n) -> tuple[int, ...]:
  """Integer sizes >= 1 summing to n closest to the real-valued `real` (cumulative rounding)."""
  steps = len(real)
  edges = np.round(np.cumsum(real)).astype(int)
  edges = np.minimum(np.maximum(edges, np.arange(1, steps + 1)), n - np.arange(steps - 1, -1, -1))
  edges = np.maximum.accumulate(edges)
  edges[-1] = n
  sizes = np.diff(np.concatenate([[0], edges]))
  for i in range(steps):                 # repair zero-size groups from below
    if sizes[i] < 1:
      j = int(np.argmax(sizes))
      sizes[j] -= 1 - sizes[i]
      sizes[i] = 1
  return check_sizes(sizes.tolist(), n)


def random_groups(key: jax.Array, batch: int, n: int, sizes: Sequence[int]) -> jax.Array:
  """(batch, n) int32 group ids of random partitions into consecutive groups, each group's size drawn
  uniformly from `sizes` (the last group is cut at n). Inside jit."""
  choices = jnp.asarray(sizes, jnp.int32)
  draw = choices[jax.random.randint(key, (batch, n), 0, len(sizes))]
  ends = jnp.cumsum(draw, axis=-1)                              # (B, n) exclusive end of group k
  pos = jnp.arange(n)
  return jnp.sum(ends[:, None, :] <= pos[None, :, None], axis=-1).astype(jnp.int32)
