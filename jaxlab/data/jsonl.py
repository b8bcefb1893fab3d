"""JSON and JSON Lines input with errors that name the file, line and column."""

from __future__ import annotations

import json
import os
from typing import Iterator

from jaxlab.errors import DataError


def iter_json_lines(path: str) -> Iterator[tuple[int, object]]:
  """Yields (line number, parsed value) for every non-blank line of a JSON Lines file.

  Raises:
    DataError: missing file, a line that is not UTF-8 or not valid JSON (naming line and column).
  """
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file")
  with open(path, "rb") as f:
    for no, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{path}:{no}:{e.start + 1}: not UTF-8 text") from None
      if not line.strip():
        continue
      try:
        yield no, json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{path}:{no}:{e.colno}: not valid JSON ({e.msg})") from None


def iter_jsonl(path: str) -> Iterator[tuple[int, dict]]:
  """Yields (line number, object) for every non-blank line of a JSONL file of JSON objects.

  Raises:
    DataError: missing file, invalid JSON or a line that is not a JSON object (naming the line).
  """
  for no, obj in iter_json_lines(path):
    if not isinstance(obj, dict):
      raise DataError(f"{path}:{no}: expected a JSON object, got {type(obj).__name__}")
    yield no, obj


def load_json(path: str):
  """The parsed JSON document in `path`.

  Raises:
    DataError: missing / unreadable file, or invalid JSON (naming the line and column of the error).
  """
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot be read as UTF-8 text ({type(e).__name__})") from None
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise DataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
