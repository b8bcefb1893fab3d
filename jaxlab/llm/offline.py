"""Backends without a live model: recorded outputs (`ReplayBackend`), rules (`ScriptedBackend`), and an
on-disk cache around any backend (`CachingBackend`). None of them imports JAX.

Replay files are JSON Lines; each line is one prompt's recorded completions:

    {"id": "q17", "prompt": "..." or [{"role": ..., "content": ...}, ...],
     "completions": ["text", ...] or [{"text": ..., "tokens": ..., "finish_reason": ..., "logprobs": ...}, ...]}

A request is looked up by its `request_id` when the line has an "id", else by the sha256 of its prompt
(`jaxlab.llm.base.prompt_key`); `write_replay` writes such a file, e.g. from a `CachingBackend`'s folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

from jaxlab.errors import ConfigError, DataError
from jaxlab.llm.base import (Backend, BackendError, Completion, Prompt, ReplayMissError, Sampling, check_prompt,
                             cut_at_stop, prompt_key, prompt_text)


class ReplayBackend(Backend):
  """Answers from recorded outputs (see the module docstring); a request with no record is a `ReplayMissError`.

  Args:
    path: the replay JSONL file.
    id_field / prompt_field / completions_field: the field names of a line (for files in another layout).
    model_id: the name of the model that produced the recordings.
  """

  def __init__(self, path: str, *, id_field: str = "id", prompt_field: str = "prompt",
               completions_field: str = "completions", model_id: str | None = None):
    from jaxlab.data.jsonl import iter_jsonl  # pylint: disable=g-import-not-at-top
    self.path = path
    self.model_id = model_id or f"replay:{os.path.basename(path)}"
    self.by_id: dict[str, list[Completion]] = {}
    self.by_prompt: dict[str, list[Completion]] = {}
    for no, obj in iter_jsonl(path):
      where = f"{path}:{no}"
      comps = obj.get(completions_field)
      if not isinstance(comps, list) or not comps:
        raise DataError(f"{where}: needs a non-empty list {completions_field!r} of completions (strings or "
                        "objects with 'text')")
      comps = [Completion.from_json(c, where) for c in comps]
      if obj.get(id_field) is None and obj.get(prompt_field) is None:
        raise DataError(f"{where}: needs an {id_field!r} or a {prompt_field!r} to be looked up by")
      if obj.get(id_field) is not None:
        rid = str(obj[id_field])
        if rid in self.by_id:
          raise DataError(f"{where}: duplicate {id_field} {rid!r}")
        self.by_id[rid] = comps
      if obj.get(prompt_field) is not None:
        self.by_prompt[prompt_key(check_prompt(obj[prompt_field], where))] = comps
    if not self.by_id and not self.by_prompt:
      raise DataError(f"{path}: no recorded completions")

  def _complete_batch(self, prompts, sampling, request_ids):
    out = []
    for p, rid in zip(prompts, request_ids):
      comps = self.by_id.get(str(rid)) if rid is not None else None
      if comps is None:
        comps = self.by_prompt.get(prompt_key(p))
      if comps is None:
        what = f"request id {rid!r} nor prompt" if rid is not None else "prompt"
        raise ReplayMissError(f"{self.path} has no recording for {what} {prompt_text(p)[:60]!r} "
                              f"(key {prompt_key(p)[:12]}; {len(self.by_id) + len(self.by_prompt)} keys recorded); "
                              "record it first, e.g. through CachingBackend and write_replay")
      if len(comps) < sampling.n:
        raise ReplayMissError(f"{self.path} recorded {len(comps)} completions for {prompt_text(p)[:40]!r}, "
                              f"asked for n={sampling.n}; ask for n <= {len(comps)} or record more")
      out.append(list(comps[:sampling.n]))
    return out


Rule = tuple[str, Any]


class ScriptedBackend(Backend):
  """Deterministic answers for tests and simulations.

  Args:
    rules: a callable `(prompt, request_id, call_index) -> str | list[str] | Completion` (call_index counts
      this backend's requests from 0), or a list of (regex, response) pairs tried in order against the
      prompt's text (`prompt_text`): the first whose regex matches (re.search) answers with its response, a
      string (formatted with the match's named groups when it holds "{...}"), a list of strings (completion
      i of n is entry i mod len), or a callable(match, prompt) returning either.
    model_id: name in cache keys.

  `calls` records every (prompt, request_id) asked, in order. A prompt no rule matches is a `ReplayMissError`.
  Stop strings and max_tokens (counted in characters) apply to the scripted text as to a model's.
  """

  def __init__(self, rules: Callable[..., Any] | Sequence[Rule], *, model_id: str = "scripted"):
    if callable(rules):
      self._fn, self._rules = rules, None
    else:
      self._fn = None
      self._rules = []
      for i, rule in enumerate(rules):
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
          raise ConfigError(f"ScriptedBackend rule {i} must be a (regex, response) pair, got {rule!r}")
        try:
          self._rules.append((re.compile(rule[0], re.S), rule[1]))
        except re.error as e:
          raise ConfigError(f"ScriptedBackend rule {i}: {rule[0]!r} is not a valid regex ({e})") from None
    self.model_id = model_id
    self.calls: list[tuple[Prompt, str | None]] = []
    self._lock = threading.Lock()

  def _answer(self, prompt, rid, index):
    if self._fn is not None:
      return self._fn(prompt, rid, index)
    text = prompt_text(prompt)
    for pattern, response in self._rules:
      m = pattern.search(text)
      if m:
        if callable(response):
          return response(m, prompt)
        if isinstance(response, str) and "{" in response:
          return response.format(**m.groupdict())
        return response
    raise ReplayMissError(f"ScriptedBackend: no rule matches the prompt {text[:80]!r}; add a rule for it")

  def _complete_batch(self, prompts, sampling, request_ids):
    out = []
    for p, rid in zip(prompts, request_ids):
      with self._lock:
        index = len(self.calls)
        self.calls.append((p, rid))
      ans = self._answer(p, rid, index)
      items = ans if isinstance(ans, list) else [ans]
      if not items:
        raise ConfigError("ScriptedBackend: a rule answered with an empty list")
      out.append([_scripted(items[j % len(items)], sampling) for j in range(sampling.n)])
    return out


def _scripted(item, sampling: Sampling) -> Completion:
  if isinstance(item, Completion):
    return item
  if not isinstance(item, str):
    raise ConfigError(f"ScriptedBackend: a response must be a string, a list of strings or a Completion, got "
                      f"{type(item).__name__}")
  text, hit = cut_at_stop(item, sampling.stop)
  length = len(text) > sampling.max_tokens
  text = text[:sampling.max_tokens]
  return Completion(text=text, tokens=len(text), finish_reason="length" if length and not hit else "stop")


def _atomic_write(path: str, data: bytes) -> None:
  folder = os.path.dirname(path)
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)      # atomic: a reader sees the old file or the whole new one, never a part
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


class CachingBackend(Backend):
  """Any backend with an on-disk cache: a request asked before is answered from disk, byte for byte.

  The key is the sha256 of (model id, prompt, sampling settings, request id); an entry is one JSON file
  `cache_dir/<key[:2]>/<key>.json` holding the request and its completions, written to a temporary file and
  renamed, so concurrent writers (threads or processes) never leave a partial file and the last complete
  write wins. An unreadable entry (a damaged disk) is a miss and is rewritten. `hits` and `misses` count
  prompts. Misses go to the inner backend `group` prompts at a time, each group written before the next is
  asked, so an interrupted batch keeps what was answered (a backend whose batches must stay whole, a local
  sampler, gets all its misses at once).

  Args:
    inner: the backend to ask on a miss.
    cache_dir: the cache folder (created).
    model_id: the model's name in keys (default: `inner.model_id`); give it when the inner backend's name
      does not pin the weights (e.g. a served model updated under the same name).
    key_request_id: include the request id in the key (default True: scripted / replayed backends answer by
      id).
    group: prompts per inner call when the inner backend's requests are independent.
  """

  def __init__(self, inner: Backend, cache_dir: str, *, model_id: str | None = None, key_request_id: bool = True,
               group: int = 32):
    if not isinstance(inner, Backend):
      raise ConfigError(f"CachingBackend wraps a jaxlab.llm Backend, got {type(inner).__name__}")
    self.inner, self.cache_dir = inner, cache_dir
    self.model_id = model_id or inner.model_id
    self.key_request_id = key_request_id
    self.group = max(1, int(group))
    self.independent_requests = inner.independent_requests
    self.hits = self.misses = 0
    self._lock = threading.Lock()
    os.makedirs(cache_dir, exist_ok=True)

  def request(self, prompt: Prompt, sampling: Sampling, request_id: str | None) -> dict[str, Any]:
    """The JSON-ready request a cache key is the hash of."""
    return {"model": self.model_id, "prompt": prompt if isinstance(prompt, str) else [dict(m) for m in prompt],
            "sampling": sampling.as_dict(), "request_id": request_id if self.key_request_id else None}

  def path(self, request: Mapping[str, Any]) -> str:
    key = hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return os.path.join(self.cache_dir, key[:2], f"{key}.json")

  def _read(self, path: str, request) -> list[Completion] | None:
    try:
      with open(path, "rb") as f:
        entry = json.loads(f.read().decode("utf-8"))
      if entry.get("request") != json.loads(json.dumps(request)):
        return None       # a hash collision or a foreign file: not ours
      return [Completion.from_json(c, path) for c in entry["completions"]]
    except FileNotFoundError:
      return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, DataError):
      return None

  def _complete_batch(self, prompts, sampling, request_ids):
    requests = [self.request(p, sampling, rid) for p, rid in zip(prompts, request_ids)]
    paths = [self.path(r) for r in requests]
    found = [self._read(p, r) for p, r in zip(paths, requests)]
    todo = [i for i, f in enumerate(found) if f is None]
    with self._lock:
      self.hits += len(prompts) - len(todo)
      self.misses += len(todo)
    size = self.group if self.inner.independent_requests else max(len(todo), 1)
    for start in range(0, len(todo), size):
      part = todo[start:start + size]
      fresh = self.inner._complete_batch([prompts[i] for i in part], sampling,   # pylint: disable=protected-access
                                         [request_ids[i] for i in part])
      for i, comps in zip(part, fresh):
        entry = {"request": requests[i], "completions": [c.to_json() for c in comps]}
        _atomic_write(paths[i], json.dumps(entry, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        found[i] = self._read(paths[i], requests[i]) or comps
    return found

  def entries(self) -> Iterable[dict[str, Any]]:
    """Every readable cache entry ({"request", "completions"}), in file-name order."""
    for sub in sorted(os.listdir(self.cache_dir)):
      folder = os.path.join(self.cache_dir, sub)
      if not os.path.isdir(folder):
        continue
      for name in sorted(os.listdir(folder)):
        if name.endswith(".json") and not name.startswith(".tmp-"):
          try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
              yield json.load(f)
          except (OSError, ValueError):
            continue

  def close(self) -> None:
    self.inner.close()


def write_replay(path: str, records: Iterable[Mapping[str, Any]]) -> int:
  """Writes a replay JSONL (atomically) from records {"prompt" and/or "id", "completions"}; returns the count.

  `CachingBackend.entries()` can be passed directly: their request's prompt and id are used.
  """
  lines = []
  for r in records:
    if "request" in r:
      req = r["request"]
      r = {"id": req.get("request_id"), "prompt": req["prompt"], "completions": r["completions"]}
    comps = [c.to_json() if isinstance(c, Completion) else c for c in r["completions"]]
    rec = {k: v for k, v in (("id", r.get("id")), ("prompt", r.get("prompt"))) if v is not None}
    if not rec:
      raise DataError("write_replay: a record needs an 'id' or a 'prompt'")
    lines.append(json.dumps({**rec, "completions": comps}, ensure_ascii=False))
  _atomic_write(os.path.abspath(path), "".join(x + "\n" for x in lines).encode("utf-8"))
  return len(lines)


__all__ = ["ReplayBackend", "ScriptedBackend", "CachingBackend", "write_replay", "BackendError"]
