"""JSON Lines input: one JSON object per line, errors that name the file and line."""

from __future__ import annotations

import json
import os
from typing import Iterator

from jaxlab.errors import DataError


def iter_jsonl(path: str) -> Iterator[tuple[int, dict]]:
  """Yields (line number, object) for every non-blank line of a JSONL file.

  Raises:
    DataError: missing file, invalid JSON or a line that is not a JSON object (naming the line).
  """
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file")
  with open(path, encoding="utf-8") as f:
    for no, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{path}:{no}: not valid JSON ({e.msg} at column {e.colno})") from None
      if not isinstance(obj, dict):
        raise DataError(f"{path}:{no}: expected a JSON object, got {type(obj).__name__}")
      yield no, obj
