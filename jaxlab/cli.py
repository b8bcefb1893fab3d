"""Shared plumbing of the command-line tools: logging, one-line errors, `--config.key=value` overrides."""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable, Sequence

from jaxlab.errors import JaxlabError


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Separates `--config.key=value` / `--config.key value` overrides from the other arguments."""
  rest, overrides = [], []
  argv = list(argv)
  i = 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config."):
      body = a[len("--config."):]
      if "=" not in body:
        if i + 1 >= len(argv):
          raise JaxlabError(f"{a} needs a value: {a}=VALUE")
        body = f"{body}={argv[i + 1]}"
        i += 1
      overrides.append(body)
    else:
      rest.append(a)
    i += 1
  return rest, overrides


def main_wrapper(fn: Callable[[list[str]], int]) -> None:
  """Runs `fn(argv)`; user errors print one `error: ...` line and exit 2."""
  logging.basicConfig(level=os.environ.get("JAXLAB_LOGLEVEL", "INFO"),
                      format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
  for noisy in ("absl", "jax._src", "orbax", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  try:
    code = fn(sys.argv[1:])
  except JaxlabError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  sys.exit(code or 0)
