"""The `Backend` interface: chat messages (or a raw prompt) in, sampled completions out.

A prompt is either a raw text (a `str`: sent as-is to a completion endpoint, or encoded as BOS + text by a
local model) or a list of chat messages `[{"role": "system"|"user"|"assistant"|..., "content": str}, ...]`
(rendered with the model's chat template). Every backend answers

    backend.complete(prompt, *, n=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=256, seed=None,
                     stop=(), logprobs=False, request_id=None) -> list[Completion]        # n completions
    backend.complete_batch(prompts, *, ..., request_ids=None) -> list[list[Completion]]  # one list per prompt

with the OpenAI conventions: `stop` strings end a completion and are not part of its text; `finish_reason`
is "stop" (an end-of-sequence token or a stop string) or "length" (`max_tokens` reached); `temperature` 0 is
greedy. `request_id` is a caller's name for the request (e.g. a problem id); backends that key recorded
outputs by it (`ReplayBackend`, `ScriptedBackend`) read it, the others ignore it.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import math
import os
import sys
from typing import Any, Mapping, Sequence, Union

from jaxlab.errors import ConfigError, DataError, JaxlabError

Message = Mapping[str, Any]
Prompt = Union[str, Sequence[Message]]


class BackendError(JaxlabError, RuntimeError):
  """A backend could not answer (the message says why and what to do)."""


class ServerUnavailableError(BackendError, ConnectionError):
  """The server is down, unreachable, or kept failing after every retry."""


class ModelNotServedError(BackendError, LookupError):
  """The server does not serve the requested model name."""


class ContextTooLongError(BackendError, ValueError):
  """The prompt plus `max_tokens` does not fit the model's context."""


class ReplayMissError(BackendError, LookupError):
  """A recorded-output backend has no answer for a request."""


@dataclasses.dataclass(frozen=True)
class Completion:
  """One sampled completion.

  Attributes:
    text: the generated text (without the end-of-sequence token or the stop string that ended it).
    tokens: number of generated tokens (the end-of-sequence token included, as servers count it); None when
      the backend cannot tell (an OpenAI server returning n > 1 choices without log-probabilities).
    finish_reason: "stop" (end-of-sequence token or stop string) or "length" (max_tokens reached).
    logprobs: log-probability of each generated token under the model (when asked for and available).
    token_ids: the generated token ids (local models only).
  """
  text: str
  tokens: int | None = None
  finish_reason: str = "stop"
  logprobs: tuple[float, ...] | None = None
  token_ids: tuple[int, ...] | None = None

  def to_json(self) -> dict[str, Any]:
    """A JSON-ready dict (omits fields that are None)."""
    out = {"text": self.text, "tokens": self.tokens, "finish_reason": self.finish_reason,
           "logprobs": None if self.logprobs is None else list(self.logprobs),
           "token_ids": None if self.token_ids is None else list(self.token_ids)}
    return {k: v for k, v in out.items() if v is not None}

  @classmethod
  def from_json(cls, obj: Any, where: str = "completion") -> "Completion":
    """From `to_json`'s dict, or a bare string (its text)."""
    if isinstance(obj, str):
      return cls(text=obj)
    if not isinstance(obj, Mapping) or not isinstance(obj.get("text"), str):
      raise DataError(f"{where}: a completion must be a string or an object with a string 'text', got "
                      f"{str(obj)[:80]!r}")
    lp, ids = obj.get("logprobs"), obj.get("token_ids")
    return cls(text=obj["text"], tokens=obj.get("tokens"), finish_reason=str(obj.get("finish_reason", "stop")),
               logprobs=None if lp is None else tuple(float(x) for x in lp),
               token_ids=None if ids is None else tuple(int(x) for x in ids))


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Sampling settings of one request (validated by `checked`)."""
  n: int = 1
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  max_tokens: int = 256
  seed: int | None = None
  stop: tuple[str, ...] = ()
  logprobs: bool = False

  def checked(self) -> "Sampling":
    """Self with `stop` as a tuple; raises ConfigError naming the bad setting."""
    stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
    if any(not isinstance(s, str) or not s for s in stop):
      raise ConfigError(f"stop must be non-empty strings, got {list(stop)!r}")
    if int(self.n) < 1:
      raise ConfigError(f"n must be >= 1 completions per prompt, got {self.n}")
    if int(self.max_tokens) < 1:
      raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
    if not (math.isfinite(self.temperature) and self.temperature >= 0):
      raise ConfigError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
    if int(self.top_k) < 0:
      raise ConfigError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
    return dataclasses.replace(self, n=int(self.n), max_tokens=int(self.max_tokens), top_k=int(self.top_k),
                               temperature=float(self.temperature), top_p=float(self.top_p), stop=stop,
                               seed=None if self.seed is None else int(self.seed), logprobs=bool(self.logprobs))

  def as_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "stop": list(self.stop)}


def check_prompt(prompt: Any, where: str = "prompt") -> Prompt:
  """A validated prompt: a non-empty string, or a tuple of message dicts with string role and content.

  Raises:
    DataError: naming the bad message.
  """
  if isinstance(prompt, str):
    if not prompt:
      raise DataError(f"{where}: the prompt is an empty string")
    return prompt
  if isinstance(prompt, Mapping) or not isinstance(prompt, Sequence) or not prompt:
    raise DataError(f"{where}: a prompt must be a string or a non-empty list of {{'role', 'content'}} messages, "
                    f"got {type(prompt).__name__}")
  out = []
  for i, m in enumerate(prompt):
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
      raise DataError(f"{where}: message {i} must be an object with string 'role' and 'content', got "
                      f"{str(m)[:80]!r}")
    out.append(dict(m))
  return tuple(out)


def prompt_text(prompt: Prompt) -> str:
  """The prompt as one text for matching and messages: the raw string, or "role: content" lines."""
  return prompt if isinstance(prompt, str) else "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def prompt_key(prompt: Prompt) -> str:
  """sha256 (hex) of a prompt's canonical JSON: the key of recorded outputs."""
  data = prompt if isinstance(prompt, str) else [dict(m) for m in prompt]
  return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
  """(text before the earliest stop string, whether one occurred)."""
  cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
  return (text, False) if cut < 0 else (text[:cut], True)


def progress_bar(total: int, desc: str):
  """A tqdm bar over `total` items, shown as `jaxlab.progress` shows bars (JAXLAB_PROGRESS, a terminal) when
  there is more than one item; this module does not import JAX, so it reads the setting itself."""
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  env = os.environ.get("JAXLAB_PROGRESS")
  on = env not in ("0", "false", "False", "") if env is not None else sys.stderr.isatty()
  return tqdm(total=total, desc=desc, disable=not on or total <= 1, leave=False, dynamic_ncols=True)


class Backend(abc.ABC):
  """An LLM that completes prompts (see the module docstring for the conventions).

  Subclasses implement `_complete_batch`; `model_id` names the model in cache keys and messages;
  `independent_requests` is False for a backend whose answer to one prompt depends on the others sent with it
  (a local sampler's rows share random keys), so wrappers must not split its batches.
  """

  model_id: str = "unknown"
  independent_requests: bool = True

  def complete(self, prompt: Prompt, *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               max_tokens: int = 256, seed: int | None = None, stop: Sequence[str] | str = (),
               logprobs: bool = False, request_id: str | None = None) -> list[Completion]:
    """`n` completions of one prompt (a string or chat messages)."""
    return self.complete_batch([prompt], n=n, temperature=temperature, top_p=top_p, top_k=top_k,
                               max_tokens=max_tokens, seed=seed, stop=stop, logprobs=logprobs,
                               request_ids=[request_id])[0]

  def complete_batch(self, prompts: Sequence[Prompt], *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                     top_k: int = 0, max_tokens: int = 256, seed: int | None = None, stop: Sequence[str] | str = (),
                     logprobs: bool = False, request_ids: Sequence[str | None] | None = None
                     ) -> list[list[Completion]]:
    """`n` completions of each prompt, in order (backends batch or parallelise them as they can)."""
    if isinstance(prompts, (str, Mapping)):
      raise DataError("complete_batch takes a list of prompts; use complete() for a single prompt")
    prompts = [check_prompt(p, f"prompt {i}") for i, p in enumerate(prompts)]
    ids = [None] * len(prompts) if request_ids is None else list(request_ids)
    if len(ids) != len(prompts):
      raise ConfigError(f"complete_batch: {len(ids)} request_ids for {len(prompts)} prompts")
    sampling = Sampling(n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed,
                        stop=stop, logprobs=logprobs).checked()
    if not prompts:
      return []
    out = self._complete_batch(prompts, sampling, ids)
    assert len(out) == len(prompts) and all(len(c) == sampling.n for c in out), "backend returned a wrong count"
    return out

  @abc.abstractmethod
  def _complete_batch(self, prompts: list[Prompt], sampling: Sampling,
                      request_ids: list[str | None]) -> list[list[Completion]]:
    """`sampling.n` completions per prompt; prompts and settings are already validated."""

  def close(self) -> None:
    """Releases resources (connections, models); the default has none."""

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
