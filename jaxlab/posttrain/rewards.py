"""Verifiable rewards: a reward function maps completions (and their reference answers) to numbers.

Interface: `reward_fn(completions: Sequence[str], answers: Sequence[str]) -> np.ndarray (N,) float32`.
Completions are the decoded generated text (the stop token excluded). The tagged format used throughout is

    <think> ...reasoning... </think><answer> ...final answer... </answer>

(whitespace around the blocks is allowed, nothing else outside them).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

import numpy as np

RewardFn = Callable[[Sequence[str], Sequence[str]], np.ndarray]

_TAGGED = re.compile(r"^\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclasses.dataclass(frozen=True)
class Parsed:
  """A completion split into its blocks: think / answer are None when the format is invalid."""
  think: str | None
  answer: str | None

  @property
  def valid(self) -> bool:
    return self.answer is not None


def parse_tagged(text: str) -> Parsed:
  """Parses `<think>...</think><answer>...</answer>`; each tag exactly once, in that order."""
  m = _TAGGED.match(text)
  if m is None or any(text.count(t) != 1 for t in ("<think>", "</think>", "<answer>", "</answer>")):
    return Parsed(None, None)
  return Parsed(m.group(1), m.group(2).strip())


def format_reward(completions: Sequence[str], answers: Sequence[str] | None = None) -> np.ndarray:
  """1 for a completion in the tagged format, else 0."""
  del answers
  return np.asarray([float(parse_tagged(c).valid) for c in completions], np.float32)


def _same(got: str, want: str, numeric: bool, tol: float) -> bool:
  got, want = got.strip(), want.strip()
  if numeric and _NUMBER.match(got) and _NUMBER.match(want):
    return abs(float(got) - float(want)) <= tol
  return got == want


def answer_reward(completions: Sequence[str], answers: Sequence[str], *, numeric: bool = True, tol: float = 0.0,
                  require_format: bool = True) -> np.ndarray:
  """1 where the completion's answer equals the reference answer, else 0.

  Args:
    completions: decoded completions.
    answers: reference answers (same length).
    numeric: compare numbers by value ("007" == "7", "2.50" == "2.5") within `tol`; other text exactly
      (after stripping whitespace).
    tol: absolute tolerance of numeric answers.
    require_format: read the answer from the `<answer>` block (an invalid format scores 0); False: the whole
      completion is the answer.
  """
  if len(completions) != len(answers):
    raise ValueError(f"answer_reward: {len(completions)} completions but {len(answers)} answers")
  out = []
  for c, a in zip(completions, answers):
    got = parse_tagged(c).answer if require_format else c
    out.append(float(got is not None and _same(got, str(a), numeric, tol)))
  return np.asarray(out, np.float32)


def tool_call_reward(completions: Sequence[str], answers: Sequence[str] | None = None, *,
                     open_tag: str = "<tool>", close_tag: str = "</tool>") -> np.ndarray:
  """1 for a completion containing at least one complete tool call `<tool>...</tool>`, else 0 (a bonus)."""
  del answers
  return np.asarray([float(open_tag in c and close_tag in c.split(open_tag, 1)[1]) for c in completions], np.float32)


@dataclasses.dataclass(frozen=True)
class CompositeReward:
  """A weighted sum of named reward functions; components are kept for separate normalisation and logging.

  Attributes:
    names: component names (metric keys `reward/<name>`).
    fns: reward functions `(completions, answers) -> (N,)`.
    weights: one weight per component.
  """
  names: tuple[str, ...]
  fns: tuple[RewardFn, ...]
  weights: tuple[float, ...]

  def __post_init__(self):
    if not (len(self.names) == len(self.fns) == len(self.weights)) or not self.names:
      raise ValueError(f"CompositeReward needs as many names, fns and weights (>= 1), got {len(self.names)}, "
                       f"{len(self.fns)}, {len(self.weights)}")

  def components(self, completions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """(N, R) float32 component rewards."""
    cols = []
    for name, fn in zip(self.names, self.fns):
      r = np.asarray(fn(completions, answers), np.float32).reshape(-1)
      if r.shape[0] != len(completions):
        raise ValueError(f"reward {name!r} returned {r.shape[0]} values for {len(completions)} completions")
      cols.append(r)
    return np.stack(cols, axis=1)

  def __call__(self, completions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """(N,) float32 weighted sum."""
    return (self.components(completions, answers) @ np.asarray(self.weights, np.float32)).astype(np.float32)
