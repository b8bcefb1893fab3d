"""Readers for Hi-ToM / ToMi question files (CSV, e.g. bigai-ai/ToM-RL's `data/cleaned_tom/*.csv`).

`load_csv` is a tolerant reader: it finds the story, question and answer columns (and, where present, the
question order, the deception flag and the answer choices) by common names, case-insensitively. The files
themselves are not shipped; point it at a user-provided copy.

`parse_english` turns one record's Hi-ToM-style English story into our `Story` + `Question` (best effort) so
that `jaxlab.tom.simulator` can re-derive, and so check, the file's label. Understood sentences:

* "A, B and C entered the R." / "A entered the R." (before the object is placed: the agents at the start;
  later: an ENTER event of an agent that had left; an agent first seen later is modelled as leaving before
  the first event, i.e. it saw only the initial container);
* "The O is in the C." (the first one: the initial container; a later one is kept as a distractor when it
  tells the present agents nothing new, and the story is rejected otherwise: our types have no "observe");
* "A moved the O to the C.", "A exited the R.", "A likes / dislikes the C.", "A made no movements and stayed
  in the R for 1 minute.";
* questions "Where is the O really?", "Where does A think [B thinks ...] the O is?", "Where will A look for
  the O?", "Where does A think that B searches for the O?".

Anything else (deception: "A privately told B ...", "Where was the O at the beginning?", ...) gives None.
"""

from __future__ import annotations

import ast
import csv
import os
import re
from typing import Any

from jaxlab.errors import DataError
from jaxlab.tom.types import Event, Example, Question, Story

STORY_COLUMNS = ("story", "context", "narrative", "passage", "stories", "text", "story_text")
QUESTION_COLUMNS = ("question", "query", "questions", "q")
ANSWER_COLUMNS = ("answer", "label", "answers", "gold", "target", "ground_truth", "correct_answer", "a")
ORDER_COLUMNS = ("order", "question_order", "level", "tom_order", "qorder", "question_level", "orders")
CHOICES_COLUMNS = ("choices", "options", "candidates", "answer_choices", "containers", "choice")
DECEPTION_COLUMNS = ("deception", "deceptive", "has_deception", "lie")

_ORDER_WORDS = {"zero": 0, "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5}


def _find(fields: list[str], names: tuple[str, ...]) -> str | None:
  low = {f.strip().lower(): f for f in fields if f is not None}
  for n in names:
    if n in low:
      return low[n]
  return None


def _parse_order(v: str) -> int | None:
  v = (v or "").strip().lower()
  if not v or v in ("nan", "none", "null"):
    return None
  m = re.search(r"-?\d+(?:\.0*)?", v)
  if m:
    return int(float(m.group(0)))
  for w, k in _ORDER_WORDS.items():
    if w in v:
      return k
  return None


def _parse_choices(v: str) -> list[str] | None:
  v = (v or "").strip()
  if not v or v.lower() in ("nan", "none", "null", "[]"):
    return None
  if v[0] in "[(":
    try:
      parsed = ast.literal_eval(v)
      if isinstance(parsed, (list, tuple)):
        return [_clean_answer(str(x)) for x in parsed if str(x).strip()]
    except (ValueError, SyntaxError):
      pass
  parts = re.split(r"[,;|\n]", v.strip("[]()"))
  out = [_clean_answer(p) for p in parts]
  return [p for p in out if p] or None


def _clean_answer(v: str) -> str:
  """Strips quotes, a leading choice letter ("A. ", "(b) "), spaces and a final period."""
  v = v.strip().strip("'\"").strip()
  v = re.sub(r"^(?:\(?[A-Za-z]\)|[A-Za-z][.:])\s+", "", v)
  return v.rstrip(".").strip()


def _parse_bool(v: str) -> bool | None:
  v = (v or "").strip().lower()
  if v in ("1", "true", "yes", "y", "t", "1.0"):
    return True
  if v in ("0", "false", "no", "n", "f", "0.0"):
    return False
  return None


def load_csv(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Reads a Hi-ToM / ToMi CSV (or TSV) of questions.

  Args:
    path: the file; the delimiter is sniffed (comma, tab, semicolon).

  Returns:
    list of {"story": str, "question": str, "answer": str, "order": int | None, "choices": list[str] | None,
    "deception": bool | None} records, one per row with a story.

  Raises:
    DataError: the file is missing, empty, or lacks a story / question / answer column.
  """
  path = os.fspath(path)
  try:
    with open(path, newline="", encoding="utf-8-sig") as f:
      text = f.read()
  except OSError as e:
    raise DataError(f"cannot read {path}: {e.strerror}; pass the path of a Hi-ToM / ToMi CSV file") from e
  if not text.strip():
    raise DataError(f"{path} is empty; pass a CSV with a header row (story, question, answer, ...)")
  try:
    dialect = csv.Sniffer().sniff(text[:4096], delimiters=",\t;")
  except csv.Error:
    dialect = csv.excel_tab if path.endswith(".tsv") else csv.excel
  csv.field_size_limit(1 << 30)
  reader = csv.DictReader(text.splitlines(keepends=True), dialect=dialect)
  fields = list(reader.fieldnames or [])
  cols = {}
  for key, names in (("story", STORY_COLUMNS), ("question", QUESTION_COLUMNS), ("answer", ANSWER_COLUMNS)):
    cols[key] = _find(fields, names)
    if cols[key] is None:
      raise DataError(f"{path} has no {key} column (looked for {', '.join(names)}; found {fields}); "
                      f"rename the {key} column to '{key}'")
  order_col, choices_col = _find(fields, ORDER_COLUMNS), _find(fields, CHOICES_COLUMNS)
  deception_col = _find(fields, DECEPTION_COLUMNS)
  out = []
  for row in reader:
    story = (row.get(cols["story"]) or "").strip()
    if not story:
      continue
    out.append({"story": story, "question": (row.get(cols["question"]) or "").strip(),
                "answer": _clean_answer(row.get(cols["answer"]) or ""),
                "order": _parse_order(row.get(order_col, "")) if order_col else None,
                "choices": _parse_choices(row.get(choices_col, "")) if choices_col else None,
                "deception": _parse_bool(row.get(deception_col, "")) if deception_col else None})
  return out


# ----------------------------------------------------------------------------------------------------------
# English parsing.

_NAME = r"[A-Z][A-Za-z'-]*"
_THING = r"[A-Za-z0-9_'-]+(?: [A-Za-z0-9_'-]+)*?"
_RE_ENTER = re.compile(rf"^((?:{_NAME})(?:, {_NAME})*(?:,? and {_NAME})?) (?:entered|enters|is in|are in) "
                       rf"the ({_THING})$")
_RE_EXIT = re.compile(rf"^({_NAME}) (?:exited|exits|left) the ({_THING})$")
_RE_MOVE = re.compile(rf"^({_NAME}) (?:moved|moves) the ({_THING}) to the ({_THING})$")
_RE_IS_IN = re.compile(rf"^The ({_THING}) (?:is|was) in the ({_THING})$")
_RE_LIKES = re.compile(rf"^({_NAME}) (likes|dislikes|loves|hates) the ({_THING})$")
_RE_STAYED = re.compile(rf"^({_NAME}) made no movements? and stayed in the ({_THING}) for \d+ minutes?$")
_RE_Q_REAL = re.compile(rf"^Where is the ({_THING}) really\??$")
_RE_Q_BELIEF = re.compile(rf"^Where does ({_NAME}) think((?: (?:that )?{_NAME} thinks)*) the ({_THING}) is\??$")
_RE_Q_LOOK = re.compile(rf"^Where will ({_NAME}) look for the ({_THING})\??$")
_RE_Q_SEARCH = re.compile(rf"^Where does ({_NAME}) think that ({_NAME}) searches for the ({_THING})\??$")


def _sentences(text: str) -> list[str]:
  out = []
  for line in re.split(r"\n+|(?<=[.!?])\s+", text.strip()):
    line = re.sub(r"^\d+\s+", "", line.strip()).strip()   # ToMi numbers its lines
    if line:
      out.append(line.rstrip(".").strip())
  return out


def _split_names(group: str) -> list[str]:
  return [n for n in re.split(r",\s*|\s+and\s+", group) if n and n != "and"]


def parse_question(question: str) -> tuple[str, tuple[str, ...]] | None:
  """(object, chain) of a Hi-ToM / ToMi belief question, or None when it is not one."""
  q = question.strip().splitlines()[0].strip() if question.strip() else ""
  if m := _RE_Q_REAL.match(q):
    return m.group(1), ()
  if m := _RE_Q_BELIEF.match(q):
    rest = re.findall(rf"(?:that )?({_NAME}) thinks", m.group(2))
    return m.group(3), (m.group(1), *rest)
  if m := _RE_Q_LOOK.match(q):
    return m.group(2), (m.group(1),)
  if m := _RE_Q_SEARCH.match(q):
    return m.group(3), (m.group(1), m.group(2))
  return None


def parse_english(record: dict[str, Any]) -> Example | None:
  """Best-effort parse of a record's English story and question into an `Example` (see the module doc).

  Args:
    record: {"story", "question", "answer", ...} (a `load_csv` record; "order" and "choices" are optional).

  Returns:
    An Example whose `answer` is the record's label (not re-derived) and whose meta holds "order" (the
    file's order, else the chain length), "choices" and "source": "file"; or None when a sentence or the
    question is not understood.
  """
  parsed_q = parse_question(str(record.get("question") or ""))
  if parsed_q is None:
    return None
  q_obj, chain = parsed_q
  agents: list[str] = []
  present: set[str] = set()
  events: list[Event] = []
  obj = room = init = None
  loc = None
  left_at: dict[str, str] = {}       # the object's container when an agent last left the room
  stale: set[str] = set()            # present agents who re-entered after the object moved
  containers: list[str] = []
  liked: list[str] = []
  late: list[str] = []               # agents first seen after the start

  def note(c: str):
    if c not in containers:
      containers.append(c)

  for sent in _sentences(str(record.get("story") or "")):
    if m := _RE_ENTER.match(sent):
      room = room or m.group(2)
      for a in _split_names(m.group(1)):
        if init is None:
          if a not in agents:
            agents.append(a)
          present.add(a)
        elif a in present:
          continue
        else:
          if a not in agents:
            agents.append(a)
            late.append(a)
            left_at[a] = init
          events.append(Event("enter", a))
          present.add(a)
          if left_at.get(a) != loc:
            stale.add(a)
      continue
    if m := _RE_IS_IN.match(sent):
      o, c = m.group(1), m.group(2)
      if init is None:
        obj, init, loc = o, c, c
        note(c)
      elif o != obj or c != loc or stale & present:
        return None
      else:
        events.append(Event("distractor", min(present) if present else agents[0], c, "is_in"))
      continue
    if init is None:
      return None                      # events before the object is placed
    if m := _RE_MOVE.match(sent):
      a, o, c = m.groups()
      if o != obj or a not in present or c == loc:
        return None
      events.append(Event("move", a, c))
      loc = c
      note(c)
      stale -= present                 # everyone present sees the new location
      continue
    if m := _RE_EXIT.match(sent):
      a = m.group(1)
      if a not in present:
        return None
      room = room or m.group(2)
      events.append(Event("exit", a))
      present.discard(a)
      stale.discard(a)
      left_at[a] = loc
      continue
    if m := _RE_LIKES.match(sent):
      a, kind, c = m.groups()
      if a not in agents:
        agents.append(a)
      events.append(Event("distractor", a, c, "likes" if kind in ("likes", "loves") else "dislikes"))
      liked.append(c)
      continue
    if m := _RE_STAYED.match(sent):
      if m.group(1) not in agents:
        return None
      events.append(Event("distractor", m.group(1), None, "stayed"))
      continue
    return None
  if init is None or q_obj != obj or any(a not in agents for a in chain):
    return None
  # Agents first seen later were absent from the start: they leave before the first event.
  events = [Event("exit", a) for a in late] + events
  choices = record.get("choices")
  cand = list(choices) if choices else []
  for c in containers + ([] if choices else liked):
    if c not in cand:
      cand.append(c)
  # Distractor containers that are not answer candidates ("X likes the apple") name no container.
  events = [Event(e.kind, e.agent, None, e.text) if e.kind == "distractor" and e.container not in cand else e
            for e in events]
  story = Story(obj=obj, room=room or "room", agents=tuple(agents), containers=tuple(cand), init=init,
                events=tuple(events))
  order = record.get("order")
  meta = {"order": order if order is not None else len(chain), "choices": choices, "source": "file",
          "deception": record.get("deception"), "question_type": "belief"}
  return Example(story=story, question=Question(tuple(chain)), answer=str(record.get("answer") or ""),
                 meta=meta)
