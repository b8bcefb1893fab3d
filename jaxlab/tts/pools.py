"""Answer pools in the official PETS JSONL format: reading (with line-numbered errors) and atomic writing.

One JSON object per line (blank lines skipped):

    {"id": "q1", "answers": ["A", "C", "A", ...], "final": "A", "answer": "A",
     "trace_confidence": [{"mean_confidence": 15.2, ...}, ...]}

* `answers` (required): the sampled trajectories' extracted answers (strings or numbers).
* `final` (optional): the pool's majority (the self-consistency pseudo-label); missing, null or "" -> the
  majority vote of the pool is used, its ties broken by `read_pools(tie_break=...)` (default: the smallest
  option index, the rule the votes scored against it should use too).
* `answer` or `correct_answer` (optional): the gold answer (accuracy); multiple-choice files may give an
  option index (`answer_index` too).
* `trace_confidence` (optional): one entry per answer, a number or a dict holding `conf_metric` (default
  `mean_confidence`; a nested `conf_summary` dict is merged in, as the official plugin writes).
* `id` (optional, unique): defaults to `line<N>`.

Multiple choice (`choices=("A", "B", "C", "D")`): answers are upper-cased and matched to the choices; answers
outside them are dropped from the pool (counted in `skipped_answers`; the official loader does the same).
Free form (`choices=None`, AIME-style): a question's options are its distinct answers in order of first
appearance, at most `max_options` of them; further distinct answers are dropped (counted). Empty answers are
dropped in both modes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from jaxlab.data.jsonl import iter_jsonl  # noqa: F401  (re-exported: pools.iter_jsonl)
from jaxlab.errors import DataError

MISSING = -1      # label not given
UNMATCHED = -2    # gold answer given but not among the question's options (never predicted)


@dataclasses.dataclass
class AnswerPools:
  """Pools of K questions as padded arrays.

  Attributes:
    ids: K question ids.
    answers: (K, N) int32 option indices in file order, -1 after each pool's end.
    lengths: (K,) int32 pool lengths.
    confidences: (K, N) float32 per-answer confidences (1.0 when the file has none).
    labels: (K,) int32 pseudo-labels (`final`, or the pool majority), -1 for an empty pool.
    gold: (K,) int32 gold answers (-1 missing, -2 not among the options).
    options: per question, the option names (index -> answer string).
    num_options: M.
    has_confidence: whether any line gave trace_confidence.
    skipped_answers: answers dropped (not a choice / beyond max_options / empty).
    source: the file read (or "<memory>").
  """
  ids: list[str]
  answers: np.ndarray
  lengths: np.ndarray
  confidences: np.ndarray
  labels: np.ndarray
  gold: np.ndarray
  options: list[list[str]]
  num_options: int
  has_confidence: bool = False
  skipped_answers: int = 0
  source: str = "<memory>"

  @property
  def num_questions(self) -> int:
    return len(self.ids)


def _norm(x: Any, upper: bool) -> str:
  s = str(x).strip()
  return s.upper() if upper else s


def _confidence(entry: Any, metric: str, where: str) -> float:
  if isinstance(entry, bool):
    raise DataError(f"{where}: a trace_confidence entry must be a number or an object, got {entry!r}")
  if isinstance(entry, (int, float)):
    v = float(entry)
  elif isinstance(entry, Mapping):
    src = dict(entry)
    if isinstance(src.get("conf_summary"), Mapping):
      src.update(src["conf_summary"])
    v = src.get(metric, src.get("mean_confidence"))
    if v is None:
      raise DataError(f"{where}: trace_confidence entry has no '{metric}' (keys: {sorted(src)[:6]})")
    try:
      v = float(v)
    except (TypeError, ValueError):
      raise DataError(f"{where}: trace_confidence '{metric}' is not a number: {v!r}") from None
  else:
    raise DataError(f"{where}: a trace_confidence entry must be a number or an object, got {type(entry).__name__}")
  if not math.isfinite(v) or v < 0:
    raise DataError(f"{where}: trace_confidence must be finite and >= 0, got {v}")
  return v


def read_pools(path: str, *, choices: Sequence[str] | None = ("A", "B", "C", "D"), max_options: int = 8,
               conf_metric: str = "mean_confidence", relabel_mv: bool = False, tie_break: str = "min") -> AnswerPools:
  """Reads a PETS JSONL answer-pool file.

  Args:
    path: the file.
    choices: option names of a multiple-choice benchmark, or None / () for free-form answers.
    max_options: free form: options kept per question.
    conf_metric: key of the confidence used from dict-valued trace_confidence entries.
    relabel_mv: ignore `final` and use the pool majority as the pseudo-label (the official multi-run mode).
    tie_break: ties of the pool majority (when `final` is missing or ignored): "min" (smallest option index,
      as the official online code relabels) or "first" (earliest answer in the file).

  Returns:
    AnswerPools.

  Raises:
    DataError: a malformed line (naming the file and line), duplicate ids, or no questions.
  """
  choices = [_norm(c, True) for c in (choices or ())]
  upper = bool(choices)
  if upper and len(set(choices)) != len(choices):
    raise DataError(f"choices {choices} repeat an option")
  rows = []
  seen: dict[str, int] = {}
  skipped = 0
  any_conf = False
  for no, obj in iter_jsonl(path):
    where = f"{path}:{no}"
    qid = obj.get("id")
    qid = f"line{no}" if qid in (None, "") else str(qid)
    if qid in seen:
      raise DataError(f"{where}: duplicate id {qid!r} (first on line {seen[qid]})")
    seen[qid] = no
    raw = obj.get("answers")
    if not isinstance(raw, list):
      got = type(raw).__name__ if raw is not None else "nothing"
      raise DataError(f"{where}: 'answers' must be a list of answers, got {got}")
    for a in raw:
      if isinstance(a, bool) or (a is not None and not isinstance(a, (str, int, float))):
        raise DataError(f"{where}: answers must be strings or numbers, got {a!r}")
    tc = obj.get("trace_confidence")
    if tc is not None:
      if not isinstance(tc, list) or len(tc) != len(raw):
        raise DataError(f"{where}: 'trace_confidence' must be a list with one entry per answer "
                        f"({len(raw)}), got {len(tc) if isinstance(tc, list) else type(tc).__name__}")
      confs = [_confidence(e, conf_metric, f"{where}: trace_confidence[{i}]") for i, e in enumerate(tc)]
      any_conf = True
    else:
      confs = [1.0] * len(raw)
    options = list(choices)
    ans, cf = [], []
    for a, c in zip(raw, confs):
      s = "" if a is None else _norm(a, upper)
      if s and s not in options and not upper and len(options) < max_options:
        options.append(s)
      if s and s in options:
        ans.append(options.index(s))
        cf.append(c)
      else:
        skipped += 1
    final = obj.get("final")
    label = MISSING
    if final not in (None, "") and not relabel_mv:
      s = _norm(final, upper)
      if s not in options:
        raise DataError(f"{where}: 'final' {final!r} is not one of the question's options {options}")
      label = options.index(s)
    gold = MISSING
    g = next((obj[k] for k in ("answer", "correct_answer", "answer_index") if obj.get(k) not in (None, "")), None)
    if g is not None:
      if upper and isinstance(g, int) and not isinstance(g, bool):
        if not 0 <= g < len(choices):
          raise DataError(f"{where}: answer index {g} is outside the {len(choices)} choices")
        gold = g
      else:
        s = _norm(g, upper)
        if upper and s not in choices:
          raise DataError(f"{where}: gold answer {g!r} is not one of the choices {choices}")
        gold = options.index(s) if s in options else UNMATCHED
    rows.append((qid, ans, cf, label, gold, options))
  if not rows:
    raise DataError(f"{path}: no questions (the file is empty)")
  k = len(rows)
  n = max(1, max(len(r[1]) for r in rows))
  m = len(choices) if upper else max_options
  answers = np.full((k, n), -1, np.int32)
  conf = np.ones((k, n), np.float32)
  lengths = np.zeros((k,), np.int32)
  for i, (_, a, c, *_rest) in enumerate(rows):
    answers[i, :len(a)] = a
    conf[i, :len(c)] = c
    lengths[i] = len(a)
  labels = np.array([r[3] for r in rows], np.int32)
  need = labels == MISSING
  if need.any():
    labels[need] = pool_majority(answers[need], m, tie_break=tie_break)
  return AnswerPools(ids=[r[0] for r in rows], answers=answers, lengths=lengths, confidences=conf, labels=labels,
                     gold=np.array([r[4] for r in rows], np.int32), options=[r[5] for r in rows], num_options=m,
                     has_confidence=any_conf, skipped_answers=skipped, source=path)


def pool_majority(answers_kn: np.ndarray, num_options: int, weights_kn: np.ndarray | None = None,
                  tie_break: str = "min") -> np.ndarray:
  """(K,) int32 (weighted) majority of each pool; -1 for an empty pool.

  Ties go to the smallest option index ("min") or to the earliest answer ("first"), as in
  `self_consistency.vote` (a numpy reference of it, for host-side labels).
  """
  if tie_break not in ("min", "first"):
    raise ValueError(f"tie_break={tie_break!r}: use 'min' or 'first'")
  answers_kn = np.asarray(answers_kn)
  w = np.ones(answers_kn.shape) if weights_kn is None else np.asarray(weights_kn, np.float64)
  out = np.full(len(answers_kn), -1, np.int32)
  for i, (row, wr) in enumerate(zip(answers_kn, w)):
    ok = row >= 0
    if not ok.any():
      continue
    tot = np.bincount(row[ok], weights=wr[ok], minlength=num_options)
    best = np.flatnonzero(tot == tot.max())
    if tie_break == "min":
      out[i] = best[0]
    else:
      firsts = [int(np.flatnonzero(row == b)[0]) for b in best]
      out[i] = best[int(np.argmin(firsts))]
  return out


def majority_answer(answers: Sequence[str], unique: bool = False) -> str | None:
  """Most frequent non-empty answer string; None when there is none.

  Ties go to the earliest answer, or, with `unique`, give None (a tied pool has no majority to write as
  `final`; `read_pools` then labels it by its own tie rule, the one the votes use).
  """
  counts: dict[str, int] = {}
  for a in answers:
    if a:
      counts[a] = counts.get(a, 0) + 1
  if not counts:
    return None
  top = max(counts.values())
  if unique and sum(c == top for c in counts.values()) > 1:
    return None
  return next(a for a in answers if a and counts[a] == top)


def write_pools(path: str, records: Iterable[Mapping[str, Any]]) -> int:
  """Writes records as PETS JSONL atomically: a temp file in the same folder, renamed over `path` at the end.

  On any error (a bad record, a full disk, an interrupt) the temp file is removed and `path` is untouched.

  Args:
    path: output file.
    records: dicts with at least `answers` (a list); `id`, `final`, `answer`, `trace_confidence`, ... kept.

  Returns:
    number of lines written.

  Raises:
    DataError: a record without an `answers` list or not JSON-serialisable (naming its index).
  """
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
  count = 0
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for i, rec in enumerate(records):
        if not isinstance(rec, Mapping) or not isinstance(rec.get("answers"), list):
          raise DataError(f"record {i}: needs an 'answers' list")
        try:
          line = json.dumps(dict(rec), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
          raise DataError(f"record {i}: not JSON-serialisable ({e})") from None
        f.write(line + "\n")
        count += 1
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return count
