"""Verifiable rewards: a reward function maps completions (and their reference answers) to numbers.

Interface: `reward_fn(completions: Sequence[str], answers: Sequence[str]) -> np.ndarray (N,) float32`.
Completions are the decoded generated text (the stop token excluded); `answers` may be any per-completion
references (strings, or problem records for rewards that read several fields). The tagged format used
throughout is

    <think> ...reasoning... </think><answer> ...final answer... </answer>

(whitespace around the blocks is allowed, nothing else outside them); `parse_answer_only` reads the
answer-only format `<answer> ... </answer>` of No-Thinking arms. A judgement over several dimensions, e.g.
VR-Thinker's "TA: 1, VQ: 2, MQ: 0, OA: 1" (Wang et al. 2025, arXiv 2510.10518: text alignment, visual quality,
motion quality, overall), is parsed by `parse_labels` and scored per dimension by `dimension_rewards`, one
`CompositeReward` component each, so every dimension's accuracy shows in the metrics.
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


_ANSWER_ONLY = re.compile(r"^\s*<answer>(.*?)</answer>\s*$", re.DOTALL)


def parse_answer_only(text: str) -> Parsed:
  """Parses the answer-only format `<answer>...</answer>` (tags exactly once, no think block)."""
  m = _ANSWER_ONLY.match(text)
  if m is None or text.count("<answer>") != 1 or text.count("</answer>") != 1 or "<think>" in text:
    return Parsed(None, None)
  return Parsed(None, m.group(1).strip())


def parse_raw(text: str) -> Parsed:
  """The whole completion (stripped) is the answer; always valid."""
  return Parsed(None, text.strip())


Parser = Callable[[str], Parsed]


def format_reward(completions: Sequence[str], answers: Sequence[str] | None = None, *,
                  parse: Parser = parse_tagged) -> np.ndarray:
  """1 for a completion the parser accepts (default: the tagged format), else 0."""
  del answers
  return np.asarray([float(parse(c).valid) for c in completions], np.float32)


def weighted_format_reward(valid: float, invalid: float, parse: Parser = parse_tagged) -> RewardFn:
  """A format reward worth `valid` for an accepted completion and `invalid` otherwise (e.g. VR-Thinker-style
  +0.1 / -0.5)."""
  def fn(completions, answers=None):
    del answers
    return np.asarray([valid if parse(c).valid else invalid for c in completions], np.float32)
  return fn


def _same(got: str, want: str, numeric: bool, tol: float) -> bool:
  got, want = got.strip(), want.strip()
  if numeric and _NUMBER.match(got) and _NUMBER.match(want):
    return abs(float(got) - float(want)) <= tol
  return got == want


def answer_reward(completions: Sequence[str], answers: Sequence[str], *, numeric: bool = True, tol: float = 0.0,
                  require_format: bool = True, parse: Parser | None = None) -> np.ndarray:
  """1 where the completion's answer equals the reference answer, else 0.

  Args:
    completions: decoded completions.
    answers: reference answers (same length).
    numeric: compare numbers by value ("007" == "7", "2.50" == "2.5") within `tol`; other text exactly
      (after stripping whitespace).
    tol: absolute tolerance of numeric answers.
    require_format: read the answer from the `<answer>` block (an invalid format scores 0); False: the whole
      completion is the answer.
    parse: the parser reading the answer (overrides require_format), e.g. `parse_answer_only`.
  """
  if len(completions) != len(answers):
    raise ValueError(f"answer_reward: {len(completions)} completions but {len(answers)} answers")
  if parse is None:
    parse = parse_tagged if require_format else (lambda c: Parsed(None, c))
  out = []
  for c, a in zip(completions, answers):
    got = parse(c).answer
    out.append(float(got is not None and _same(got, str(a), numeric, tol)))
  return np.asarray(out, np.float32)


def tool_call_reward(completions: Sequence[str], answers: Sequence[str] | None = None, *,
                     open_tag: str = "<tool>", close_tag: str = "</tool>") -> np.ndarray:
  """1 for a completion containing at least one complete tool call `<tool>...</tool>`, else 0 (a bonus)."""
  del answers
  return np.asarray([float(open_tag in c and close_tag in c.split(open_tag, 1)[1]) for c in completions], np.float32)


_LABEL = re.compile(r"([A-Za-z][\w-]*)\s*[:=]\s*([^,;\n]+)")


def parse_labels(text: str, parse: Parser = parse_tagged) -> dict[str, str] | None:
  """{dimension: label} of a judgement such as "TA: 1, VQ: 2, MQ: 0, OA: 1" (inside the answer block the
  parser reads; pairs separated by ",", ";" or newlines), or None when the format is invalid."""
  answer = parse(text).answer
  if answer is None:
    return None
  return {k: v.strip() for k, v in _LABEL.findall(answer)}


def dimension_rewards(dims: Sequence[str], *, parse: Parser = parse_tagged, labels_key: str = "labels"
                      ) -> list[tuple[str, RewardFn]]:
  """One accuracy reward per judgement dimension: (name "acc_<dim>", fn) pairs for `CompositeReward.of`.

  fn(completions, references) is 1 where the completion's label of `dim` equals the reference's, 0 when it
  differs, is missing or the format is invalid; a reference is a mapping {dim: label} or a record holding one
  under `labels_key`.
  """
  def make(dim):
    def fn(completions, references):
      out = []
      for c, ref in zip(completions, references):
        want = ref.get(labels_key, ref) if isinstance(ref, dict) else ref
        got = parse_labels(c, parse)
        out.append(float(got is not None and dim in got and got[dim] == str(want[dim]).strip()))
      return np.asarray(out, np.float32)
    return fn
  return [(f"acc_{d}", make(d)) for d in dims]


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

  @classmethod
  def of(cls, terms: Sequence[tuple[str, RewardFn, float]]) -> "CompositeReward":
    """From (name, fn, weight) triples, e.g. `[*[(n, f, 1 / 4) for n, f in dimension_rewards(dims)],
    ("format", format_reward, 0.1)]`."""
    return cls(tuple(t[0] for t in terms), tuple(t[1] for t in terms), tuple(float(t[2]) for t in terms))

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
