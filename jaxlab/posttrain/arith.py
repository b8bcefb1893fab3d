"""A verifiable arithmetic task with a reasoning trace: multi-digit addition, column by column.

    prompt:      "<bos>47+85="
    completion:  "<think>7+5+0=12,4+8+1=13</think><answer>132</answer><eos>"

The trace adds the columns from the least significant digit: `x+y+c=s` with the incoming carry c and the
column total s (the next carry is s // 10); a shorter operand contributes 0 digits. The reward reads the
`<answer>` block only, so a model may reach the right answer with a wrong trace (the reward does not check it).
"""

from __future__ import annotations

import numpy as np

from jaxlab.errors import DataError
from jaxlab.lm import tasks
from jaxlab.lm.tokenizer import ByteTokenizer

SPECIALS = ("<think>", "</think>", "<answer>", "</answer>")


def tokenizer() -> ByteTokenizer:
  """Byte tokenizer with the four tag tokens as single ids."""
  return ByteTokenizer(extra_specials=SPECIALS)


def trace(a: int, b: int) -> str:
  """Column-by-column addition trace of a + b (see the module docstring)."""
  if a < 0 or b < 0:
    raise DataError(f"the arithmetic task adds non-negative integers, got {a}, {b}")
  return _trace(str(a), str(b))


def _trace(sa: str, sb: str) -> str:
  da, db = sa[::-1], sb[::-1]
  carry, cols = 0, []
  for i in range(max(len(da), len(db))):
    x = int(da[i]) if i < len(da) else 0
    y = int(db[i]) if i < len(db) else 0
    s = x + y + carry
    cols.append(f"{x}+{y}+{carry}={s}")
    carry = s // 10
  return ",".join(cols)


def problem(a: int, b: int, width: int = 0) -> dict[str, str]:
  """{"prompt", "completion", "answer"} for a + b; width > 0 zero-pads the operands to that many digits.

  Zero padding aligns digit positions ("047+085="), which small transformers learn much faster (Lee et al.
  2023, "Teaching arithmetic to small transformers"); the trace then has `width` columns.
  """
  if width and max(a, b) >= 10 ** width:
    raise DataError(f"operands {a}, {b} do not fit in width={width} digits")
  sa, sb = (f"{a:0{width}d}", f"{b:0{width}d}") if width else (str(a), str(b))
  return {"prompt": f"{sa}+{sb}=", "completion": f"<think>{_trace(sa, sb)}</think><answer>{a + b}</answer>",
          "answer": str(a + b)}


def split(n_train: int, n_eval: int, *, min_digits: int = 1, max_digits: int = 3, pad_operands: bool = False,
          seed: int = 0) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
  """Disjoint train / eval problems; each operand's digit count is uniform in [min_digits, max_digits].

  With `pad_operands`, operands are zero-padded to max_digits (see `problem`).

  Raises:
    DataError: bad digit range or too few distinct problems for the requested sizes.
  """
  if not 1 <= min_digits <= max_digits:
    raise DataError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
  rng = np.random.default_rng(seed)
  seen: dict[tuple[int, int], None] = {}
  need, tries = n_train + n_eval, 0
  while len(seen) < need:
    if tries > 100 * need:
      raise DataError(f"only {len(seen)} distinct problems with {min_digits}..{max_digits} digits; asked for {need}")
    da, db = rng.integers(min_digits, max_digits + 1, size=2)
    pair = (tasks.operand(rng, int(da)), tasks.operand(rng, int(db)))
    seen.setdefault(pair, None)
    tries += 1
  pairs = list(seen)
  w = max_digits if pad_operands else 0
  return [problem(*p, width=w) for p in pairs[n_eval:]], [problem(*p, width=w) for p in pairs[:n_eval]]


def trace_reward(completions, problems) -> "np.ndarray":
  """1 where the completion's `<think>` block is the exact column trace of its problem, else 0.

  The trace is verifiable too: rewarding it keeps reinforcement from building on right answers reached by
  wrong reasoning (an answer-only reward lets the trace drift).

  Args:
    completions: decoded completions.
    problems: the problem records ({"completion": reference, ...}), one per completion; a record without a
      reference completion scores 0.
  """
  from jaxlab.posttrain.rewards import parse_tagged  # pylint: disable=g-import-not-at-top
  if len(completions) != len(problems):
    raise ValueError(f"trace_reward: {len(completions)} completions but {len(problems)} problems")
  out = []
  for c, p in zip(completions, problems):
    think = parse_tagged(c).think
    want = parse_tagged(p.get("completion", "")).think
    out.append(float(think is not None and think == want))
  return np.asarray(out, np.float32)
