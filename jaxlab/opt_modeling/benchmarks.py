"""Loaders for public optimisation-modelling benchmarks from local JSONL files (nothing is downloaded).

Each record becomes a `Problem` (id, natural-language description, ground-truth objective value or None when
the problem has no optimal solution, the format it was read as, and the record's other fields). Field names are
those of the public releases:

- "mamo": MAMO (EasyLP / ComplexLP): `Question`, `Answer`.
- "orlm": the ORLM repository's benchmark and result files, e.g. IndustryOR (github.com/Cardinal-Operations/
  ORLM; Tang et al., "ORLM: A Customizable Framework in Training Large Models for Automated Optimization
  Modeling", arXiv 2405.17743): `en_question`, `en_answer`, optional `id`.
- "nl4opt": cleaned NL4Opt releases: the question in `question`, `en_question` or `description`; the answer in
  `answer`, `en_answer`, `Answer`, `optimal_value` or `results` (first present, in that order).
- "optibench": OptiBench-style files: the same question fields; the answer in `results` (a dict whose single
  value is the objective value) unless an explicit `optimal_value`, `answer`, `en_answer` or `Answer` is given
  (first present, in that order).

`fmt="auto"` decides from the first record: `Question`+`Answer` is MAMO, `en_question`+`en_answer` is ORLM, a
question field with `results` is OptiBench, a question field with another answer field is NL4Opt; every record
must then fit that format. Answers are normalised with `scoring.normalize_answer`, so ORLM's "No Best Solution"
(and "infeasible", "unbounded", null, "") become None. A record's `id` field (string or integer) is its id, else
"<file stem>:<line>". A file whose first character is "[" is read as one JSON array (OptiBench's e-opt.json is
one); item numbers (from 1) then stand in for line numbers.

An errata file (`errata=`: JSONL objects with `id` and `answer`, or a CSV file with an `id,answer` header)
replaces the answers of the problems it names (the old answer, when it could be read, is kept in
`extra["answer_before_errata"]`); an id that is not in the benchmark is an error. An OptiBench `results` dict
with several entries (variable values next to the objective) cannot be scored: such a record is an error unless
an erratum gives its answer.

Every bad input raises one `jaxlab.errors.DataError` line naming the file and line, what is wrong and what was
expected. This module does not import JAX at import time (reading a file goes through `jaxlab.data.jsonl`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Any, Iterator

from jaxlab.errors import DataError
from jaxlab.opt_modeling.scoring import normalize_answer

FORMATS = ("auto", "mamo", "orlm", "nl4opt", "optibench")

_Q_FIELDS = ("question", "en_question", "description")
QUESTION_FIELDS = {"mamo": ("Question",), "orlm": ("en_question",), "nl4opt": _Q_FIELDS, "optibench": _Q_FIELDS}
"""Per format, the fields that may hold the problem text (the first present one is used)."""

ANSWER_FIELDS = {
    "mamo": ("Answer",),
    "orlm": ("en_answer",),
    "nl4opt": ("answer", "en_answer", "Answer", "optimal_value", "results"),
    "optibench": ("optimal_value", "answer", "en_answer", "Answer", "results"),
}
"""Per format, the fields that may hold the ground-truth objective value (the first present one is used)."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """One benchmark problem.

  Attributes:
    id: the record's `id`, else "<file stem>:<line>".
    description: the natural-language problem statement.
    answer: the optimal objective value, or None when the problem has no optimal solution.
    source: the format the record was read as ("mamo", "orlm", "nl4opt" or "optibench").
    extra: the record's other fields (and "answer_before_errata" when an erratum replaced the answer).
  """
  id: str
  description: str
  answer: float | None
  source: str
  extra: dict = dataclasses.field(default_factory=dict)


def _fields(fields) -> str:
  return ", ".join(repr(f) for f in fields)


def _needs(fields) -> str:
  return f"the field {fields[0]!r}" if len(fields) == 1 else f"one of {_fields(fields)}"


def _keys(obj: dict) -> str:
  keys = list(obj)
  shown = _fields(keys[:12]) + (f" and {len(keys) - 12} more" if len(keys) > 12 else "")
  return shown or "none"


def _detect(obj: dict, where: str) -> str:
  has_q = any(f in obj for f in _Q_FIELDS)
  if "Question" in obj and "Answer" in obj:
    return "mamo"
  if "en_question" in obj and "en_answer" in obj:
    return "orlm"
  if has_q and "results" in obj:
    return "optibench"
  if has_q and any(f in obj for f in ANSWER_FIELDS["nl4opt"]):
    return "nl4opt"
  raise DataError(f"{where}: cannot tell the benchmark format from the fields {_keys(obj)}; expected 'Question' + "
                  "'Answer' (MAMO), 'en_question' + 'en_answer' (ORLM / IndustryOR), or one of 'question', "
                  "'en_question', 'description' with 'answer', 'en_answer', 'Answer', 'optimal_value' (NL4Opt) or "
                  "'results' (OptiBench); or pass fmt= explicitly")


def _records(path: str) -> Iterator[tuple[int, str, dict]]:
  """(number, location for messages, object) per record of a JSONL file or a JSON array file."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file; give the local path of the benchmark's JSONL file (nothing is "
                    "downloaded)")
  with open(path, "rb") as f:
    head = f.read(4096).lstrip()
    while not head:
      chunk = f.read(4096)
      if not chunk:
        break
      head = chunk.lstrip()
  if head.startswith(b"\xef\xbb\xbf"):
    raise DataError(f"{path}: starts with a UTF-8 byte-order mark; save it as UTF-8 without BOM")
  if head.startswith(b"["):
    from jaxlab.data.jsonl import load_json  # pylint: disable=g-import-not-at-top
    items = load_json(path)
    if not isinstance(items, list):
      raise DataError(f"{path}: expected a JSON array of objects or one JSON object per line")
    for no, obj in enumerate(items, 1):
      if not isinstance(obj, dict):
        raise DataError(f"{path}: item {no}: expected a JSON object, got {type(obj).__name__}")
      yield no, f"{path}: item {no}", obj
    return
  from jaxlab.data.jsonl import iter_jsonl  # pylint: disable=g-import-not-at-top
  for no, obj in iter_jsonl(path):
    yield no, f"{path}:{no}", obj


def _answer(value: Any, field: str, where: str) -> float | None:
  try:
    v = normalize_answer(value)
  except DataError as e:
    raise DataError(f"{where}: field {field!r}: {e}") from None
  if v is not None and not math.isfinite(v):
    raise DataError(f"{where}: field {field!r} is {value!r}; a ground truth must be a finite number, or "
                    "'No Best Solution' when the problem has none")
  return v


def _id(obj: dict, stem: str, no: int, where: str) -> str:
  raw = obj.get("id")
  if raw is None:
    return f"{stem}:{no}"
  if isinstance(raw, bool) or not isinstance(raw, (str, int)) or (isinstance(raw, str) and not raw.strip()):
    raise DataError(f"{where}: field 'id' is {raw!r}; an id must be a non-empty string or an integer (or leave it "
                    "out for '<file stem>:<line>')")
  return str(raw)


def _parse(obj: dict, fmt: str, stem: str, no: int, where: str) -> tuple[Problem, str | None]:
  """The problem of one record and, when its answer cannot be read, the error (an erratum may still give it)."""
  qf = next((f for f in QUESTION_FIELDS[fmt] if f in obj), None)
  if qf is None:
    raise DataError(f"{where}: no question field; a {fmt} record needs {_needs(QUESTION_FIELDS[fmt])} "
                    f"(found: {_keys(obj)})")
  text = obj[qf]
  if not isinstance(text, str) or not text.strip():
    raise DataError(f"{where}: field {qf!r} must be a non-empty string, got {type(text).__name__}")
  af = next((f for f in ANSWER_FIELDS[fmt] if f in obj), None)
  if af is None:
    raise DataError(f"{where}: no answer field; a {fmt} record needs {_needs(ANSWER_FIELDS[fmt])} "
                    f"(found: {_keys(obj)})")
  pid = _id(obj, stem, no, where)
  answer, error = None, None
  raw = obj[af]
  if af == "results" and isinstance(raw, dict):
    if len(raw) == 1:
      answer = _answer(next(iter(raw.values())), af, where)
    else:
      error = (f"{where}: field 'results' has {len(raw)} entries ({_keys(raw)}); cannot tell which one is the "
               f"objective value: give it in 'optimal_value' or in an errata row for id {pid!r}")
  elif isinstance(raw, (dict, list)):
    raise DataError(f"{where}: field {af!r} is a {type(raw).__name__}; expected a number, a numeric string or "
                    "'No Best Solution'" + (" (or for 'results', a dict with one entry)" if af == "results" else ""))
  else:
    answer = _answer(raw, af, where)
  extra = {k: v for k, v in obj.items() if k not in (qf, af, "id")}
  return Problem(id=pid, description=text, answer=answer, source=fmt, extra=extra), error


def _errata_rows(path: str) -> Iterator[tuple[str, Any, Any]]:
  """(location, id, answer) per row of an errata file."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such errata file; give a JSONL or CSV file of id,answer rows")
  ext = os.path.splitext(path)[1].lower()
  if ext == ".csv":
    try:
      with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if "id" not in header or "answer" not in header:
          raise DataError(f"{path}:1: the CSV header must name the columns id,answer "
                          f"(found: {_fields(header) or 'none'})")
        for row in reader:
          yield f"{path}:{reader.line_num}", row["id"], row["answer"]
    except UnicodeDecodeError:
      raise DataError(f"{path}: not UTF-8 text; save the errata file as UTF-8") from None
    except csv.Error as e:
      raise DataError(f"{path}: not a readable CSV file ({e})") from None
  elif ext in (".jsonl", ".json"):
    from jaxlab.data.jsonl import iter_jsonl  # pylint: disable=g-import-not-at-top
    for no, obj in iter_jsonl(path):
      missing = [k for k in ("id", "answer") if k not in obj]
      if missing:
        raise DataError(f"{path}:{no}: an erratum needs the fields 'id' and 'answer' (missing: {_fields(missing)})")
      yield f"{path}:{no}", obj["id"], obj["answer"]
  else:
    raise DataError(f"{path}: unknown errata file type {ext or '(none)'!r}; use .jsonl (objects with id and answer) "
                    "or .csv (header id,answer)")


def load_errata(path: str) -> dict[str, float | None]:
  """{id: corrected answer} from an errata file (JSONL objects with `id`, `answer`, or CSV with header id,answer).

  Raises:
    DataError: missing file, unknown file type, a row without id or answer, a bad answer or a repeated id.
  """
  path = os.fspath(path)
  out: dict[str, float | None] = {}
  seen: dict[str, str] = {}
  for where, raw_id, raw_answer in _errata_rows(path):
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or not str(raw_id).strip():
      raise DataError(f"{where}: erratum id {raw_id!r} must be a non-empty string or an integer")
    pid = str(raw_id).strip() if isinstance(raw_id, str) else str(raw_id)
    if pid in seen:
      raise DataError(f"{where}: id {pid!r} is corrected twice (first at {seen[pid]}); keep one row per id")
    seen[pid] = where
    out[pid] = _answer(raw_answer, "answer", where)
  return out


def load_benchmark(path: str, *, fmt: str = "auto", errata: str | None = None,
                   limit: int | None = None) -> list[Problem]:
  """The problems of a benchmark file, in file order (see the module docstring for formats and fields).

  Args:
    path: a local JSONL file (or JSON array file) of the benchmark.
    fmt: "auto", "mamo", "orlm", "nl4opt" or "optibench".
    errata: optional JSONL / CSV file of id,answer rows that replace answers.
    limit: keep only the first `limit` problems (the whole file is still read and checked).

  Raises:
    DataError: an unknown format, a missing or unreadable file, a record without the expected fields or with a
      bad answer, repeated ids, an unknown id in the errata, or an empty file (each one line with file:line).
  """
  path = os.fspath(path)
  if fmt not in FORMATS:
    raise DataError(f"unknown benchmark format {fmt!r}; use one of {', '.join(FORMATS)}")
  if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
    raise DataError(f"limit={limit!r} must be an integer >= 0 (or None for all problems)")
  stem = os.path.splitext(os.path.basename(path))[0]
  fixes = load_errata(errata) if errata is not None else {}
  problems: list[Problem] = []
  errors: list[tuple[str, str]] = []  # (id, message) of answers that only an erratum can give
  seen: dict[str, str] = {}
  chosen = None if fmt == "auto" else fmt
  for no, where, obj in _records(path):
    if chosen is None:
      chosen = _detect(obj, where)
    problem, error = _parse(obj, chosen, stem, no, where)
    if problem.id in seen:
      raise DataError(f"{where}: duplicate id {problem.id!r} (first at {seen[problem.id]}); ids must be unique")
    seen[problem.id] = where
    problems.append(problem)
    if error is not None:
      errors.append((problem.id, error))
  if not problems:
    raise DataError(f"{path}: no records; expected one JSON object per line with a question and an answer field")
  unknown = [pid for pid in fixes if pid not in seen]
  if unknown:
    shown = ", ".join(repr(u) for u in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    raise DataError(f"{errata}: {len(unknown)} erratum id(s) not in {path}: {shown}; use the problem ids "
                    f"(the record's 'id', else '<file stem>:<line>', e.g. '{stem}:1')")
  for pid, message in errors:
    if pid not in fixes:
      raise DataError(message)
  if fixes:
    unreadable = {pid for pid, _ in errors}
    problems = [p if p.id not in fixes else dataclasses.replace(
        p, answer=fixes[p.id], extra=p.extra if p.id in unreadable else {**p.extra, "answer_before_errata": p.answer})
        for p in problems]
  return problems if limit is None else problems[:limit]
