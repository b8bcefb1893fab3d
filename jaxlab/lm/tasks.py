"""Synthetic tasks for tests and tiny experiments: multi-digit addition ("12+345=" -> "357").

Records are `{"prompt", "completion"}` dicts, the input of `jaxlab.lm.sft_data` (`build_padded`, ...).
"""

from __future__ import annotations

import numpy as np

from jaxlab.errors import DataError


def operand(rng: np.random.Generator, digits: int) -> int:
  """A uniform random integer with exactly `digits` digits (0-9 for one digit)."""
  lo = 0 if digits == 1 else 10 ** (digits - 1)
  return int(rng.integers(lo, 10 ** digits))


def addition_examples(n: int, *, min_digits: int = 1, max_digits: int = 3, seed: int = 0,
                      reverse_answer: bool = False, pad_operands: bool = False) -> list[dict[str, str]]:
  """Synthetic multi-digit addition: {"prompt": "12+345=", "completion": "357"}.

  Each operand's digit count is uniform in [min_digits, max_digits], then the operand is uniform among
  numbers of that many digits. Deterministic given the arguments.

  Args:
    n: number of examples.
    min_digits, max_digits: operand digit range (1 <= min_digits <= max_digits).
    seed: numpy seed.
    reverse_answer: write the sum's digits least-significant first (easier for small transformers).
    pad_operands: fixed-width format: operands zero-padded to max_digits and the sum to max_digits + 1
      ("012+345=" -> "0357"), which aligns digit positions (Lee et al. 2023, "Teaching arithmetic to small
      transformers", show reversed, padded formats are learned far faster).

  Returns:
    list of n {"prompt": str, "completion": str} dicts (may repeat for small digit ranges).
  """
  if not 1 <= min_digits <= max_digits:
    raise DataError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    da, db = rng.integers(min_digits, max_digits + 1, size=2)
    a, b = operand(rng, int(da)), operand(rng, int(db))
    answer = str(a + b).zfill(max_digits + 1) if pad_operands else str(a + b)
    prompt = f"{a:0{max_digits}d}+{b:0{max_digits}d}=" if pad_operands else f"{a}+{b}="
    out.append({"prompt": prompt, "completion": answer[::-1] if reverse_answer else answer})
  return out


def addition_split(n_train: int, n_eval: int, *, min_digits: int = 1, max_digits: int = 3, seed: int = 0,
                   reverse_answer: bool = False, pad_operands: bool = False
                   ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
  """Disjoint train / eval sets of the addition task (no eval prompt appears in train; each set unique).

  Args:
    n_train, n_eval: sizes.
    min_digits, max_digits, seed, reverse_answer, pad_operands: as in `addition_examples`.

  Raises:
    DataError: the digit range has too few distinct problems for the requested sizes.
  """
  need = n_train + n_eval
  seen: dict[str, dict[str, str]] = {}
  chunk, tries = max(need, 64), 0
  while len(seen) < need:
    if tries > 50:
      raise DataError(f"only {len(seen)} distinct addition problems found for digits {min_digits}..{max_digits}; "
                      f"asked for {need}; widen the digit range or ask for fewer")
    for r in addition_examples(chunk, min_digits=min_digits, max_digits=max_digits, seed=seed * 1000003 + tries,
                               reverse_answer=reverse_answer, pad_operands=pad_operands):
      if len(seen) < need:
        seen.setdefault(r["prompt"], r)
    tries += 1
  records = list(seen.values())
  return records[n_eval:], records[:n_eval]
