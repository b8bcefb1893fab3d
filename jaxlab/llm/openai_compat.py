"""`OpenAICompatBackend`: any OpenAI-compatible server (vLLM, vllm-tpu, llama.cpp, SGLang, `jaxlab.llm.serve`).

    backend = OpenAICompatBackend("http://127.0.0.1:8000", "Qwen/Qwen3-8B", api_key_env="VLLM_API_KEY")
    backend.complete([{"role": "user", "content": "..."}], n=4, temperature=0.7, max_tokens=512, seed=0)

Chat messages go to `POST {base_url}/v1/chat/completions`, a raw string prompt to `POST .../v1/completions`;
streaming is off. The API key is read from the environment variable `api_key_env` at each request (never
from code or config files; a missing variable sends no key, as local servers expect) and is never printed.

Reliability: `complete_batch` sends up to `max_concurrency` requests at once (threads). A connection failure,
a timeout, HTTP 429 and HTTP 5xx are retried up to `max_retries` times with exponential backoff
(`backoff * 2**attempt` seconds, jittered, capped at `max_backoff`, or the server's `Retry-After`). What is
left raises one clear error: `ServerUnavailableError` (down, unreachable, or still failing), or at once,
without retry, `ModelNotServedError` (HTTP 404 for the model; the message lists the served names),
`ContextTooLongError` (the server's context-length error), `BackendError` (a refused key, another 4xx, a
malformed answer). `top_k` > 0 is sent as the `top_k` extension vLLM accepts.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from jaxlab.errors import ConfigError
from jaxlab.llm.base import (Backend, BackendError, Completion, ContextTooLongError, ModelNotServedError, Prompt,
                             Sampling, ServerUnavailableError, progress_bar)

RETRY_STATUS = (408, 429, 500, 502, 503, 504)
_CONTEXT_WORDS = ("context length", "context_length", "maximum context", "too long", "max_model_len")


class OpenAICompatBackend(Backend):
  """An OpenAI-compatible HTTP server behind the `Backend` interface (see the module docstring).

  Args:
    base_url: the server's address, e.g. "http://127.0.0.1:8000" or ".../v1".
    model: the served model name (`/v1/models` lists them).
    api_key_env: environment variable holding the API key (None: never send one).
    max_concurrency: requests in flight at once in `complete_batch`.
    max_retries: retries of a failed request (connection error, timeout, 408/429/5xx).
    timeout: seconds to wait for one answer.
    backoff / max_backoff: the first retry's delay and the cap (seconds).
  """

  def __init__(self, base_url: str, model: str, *, api_key_env: str | None = "OPENAI_API_KEY",
               max_concurrency: int = 8, max_retries: int = 4, timeout: float = 120.0, backoff: float = 0.5,
               max_backoff: float = 20.0):
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
      raise ConfigError(f"base_url must be an http(s) address such as http://127.0.0.1:8000, got {base_url!r}")
    if not model:
      raise ConfigError("model must name a served model (GET {base_url}/v1/models lists them)")
    if int(max_concurrency) < 1 or int(max_retries) < 0 or not timeout > 0:
      raise ConfigError("max_concurrency must be >= 1, max_retries >= 0 and timeout > 0")
    url = base_url.rstrip("/")
    self.base_url = url if url.endswith("/v1") else url + "/v1"
    self.model = self.model_id = model
    self.api_key_env = api_key_env
    self.max_concurrency, self.max_retries = int(max_concurrency), int(max_retries)
    self.timeout, self.backoff, self.max_backoff = float(timeout), float(backoff), float(max_backoff)
    self.retries = 0          # retried attempts so far (all threads)
    self._lock = threading.Lock()

  # -- HTTP -------------------------------------------------------------------------------------------------

  def _headers(self) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "application/json"}
    key = os.environ.get(self.api_key_env) if self.api_key_env else None
    if key:
      h["Authorization"] = f"Bearer {key}"
    return h

  def _send(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=self._headers())
    try:
      with urllib.request.urlopen(req, timeout=self.timeout) as r:
        return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
      return e.code, dict(e.headers or {}), e.read() or b""

  def request(self, path: str, body: dict | None = None, method: str = "POST") -> dict[str, Any]:
    """One API call with retries; the parsed JSON answer (errors as in the module docstring)."""
    last = ""
    for attempt in range(self.max_retries + 1):
      wait = None
      try:
        status, headers, raw = self._send(method, path, body)
      except (urllib.error.URLError, ConnectionError, http.client.HTTPException, socket.timeout, TimeoutError,
              OSError) as e:
        reason = getattr(e, "reason", e)
        last = ("timed out after %.0f s (raise timeout=)" % self.timeout
                if isinstance(reason, (socket.timeout, TimeoutError)) else f"{type(reason).__name__}: {reason}")
      else:
        if status == 200:
          try:
            return json.loads(raw.decode("utf-8"))
          except (UnicodeDecodeError, json.JSONDecodeError):
            raise BackendError(f"{self.base_url}{path} answered HTTP 200 with a body that is not JSON: "
                               f"{raw[:120]!r}") from None
        message = _error_message(raw)
        if status not in RETRY_STATUS:
          raise self._client_error(status, message, path)
        last = f"HTTP {status}: {message}"
        wait = _retry_after(headers)
      if attempt == self.max_retries:
        break
      with self._lock:
        self.retries += 1
      delay = self.backoff * 2 ** attempt * (0.5 + random.random() / 2)
      time.sleep(min(self.max_backoff, delay if wait is None else wait))
    raise ServerUnavailableError(
        f"the server at {self.base_url} did not answer {path} after {self.max_retries + 1} tries (last: {last}); "
        "is it running and serving? start one with `python -m jaxlab.llm.serve --model DIR --port P` or "
        "`vllm serve MODEL`, or raise max_retries / timeout")

  def _client_error(self, status: int, message: str, path: str) -> BackendError:
    low = message.lower()
    if status == 404 and "model" in low:
      served = self.served_models(quiet=True)
      listed = f"; it serves {served}" if served else ""
      return ModelNotServedError(f"{self.base_url} does not serve model {self.model!r}{listed}; pass one of "
                                 "those names as model=")
    if status in (400, 413, 422) and any(w in low for w in _CONTEXT_WORDS):
      return ContextTooLongError(f"{self.model}: {message} (lower max_tokens or shorten the prompt)")
    if status in (401, 403):
      env = self.api_key_env or "(no api_key_env)"
      return BackendError(f"{self.base_url} refused the request (HTTP {status}: {message}); put a valid key in "
                          f"the environment variable {env}")
    return BackendError(f"{self.base_url}{path} answered HTTP {status}: {message}")

  def served_models(self, quiet: bool = False) -> list[str]:
    """The model names the server lists at GET /v1/models ([] on failure when `quiet`)."""
    try:
      status, _, raw = self._send("GET", "/models")
      if status != 200:
        raise BackendError(f"GET {self.base_url}/models answered HTTP {status}")
      return [m["id"] for m in json.loads(raw)["data"]]
    except Exception:    # pylint: disable=broad-except
      if quiet:
        return []
      raise

  # -- completions ------------------------------------------------------------------------------------------

  def body(self, prompt: Prompt, sampling: Sampling) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of one request."""
    body: dict[str, Any] = {"model": self.model, "n": sampling.n, "temperature": sampling.temperature,
                            "top_p": sampling.top_p, "max_tokens": sampling.max_tokens, "stream": False}
    if sampling.stop:
      body["stop"] = list(sampling.stop)
    if sampling.seed is not None:
      body["seed"] = sampling.seed
    if sampling.top_k:
      body["top_k"] = sampling.top_k
    if isinstance(prompt, str):
      body["prompt"] = prompt
      if sampling.logprobs:
        body["logprobs"] = 1
      return "/completions", body
    body["messages"] = [dict(m) for m in prompt]
    if sampling.logprobs:
      body["logprobs"] = True
    return "/chat/completions", body

  def _one(self, prompt: Prompt, sampling: Sampling) -> list[Completion]:
    path, body = self.body(prompt, sampling)
    answer = self.request(path, body)
    try:
      choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
      usage = answer.get("usage") or {}
      out = [_parse_choice(c, chat=not isinstance(prompt, str)) for c in choices]
    except (KeyError, TypeError, AttributeError, ValueError) as e:
      raise BackendError(f"{self.base_url}{path}: malformed answer ({type(e).__name__}: {e}): "
                         f"{json.dumps(answer)[:200]}") from None
    if len(out) != sampling.n:
      raise BackendError(f"{self.base_url}{path}: asked for n={sampling.n} choices, got {len(out)}")
    if sampling.n == 1 and out[0].tokens is None and isinstance(usage.get("completion_tokens"), int):
      out[0] = Completion(out[0].text, usage["completion_tokens"], out[0].finish_reason, out[0].logprobs)
    if not sampling.logprobs:
      out = [Completion(c.text, c.tokens, c.finish_reason) for c in out]
    return out

  def _complete_batch(self, prompts, sampling, request_ids):
    if len(prompts) == 1 or self.max_concurrency == 1:
      return [self._one(p, sampling) for p in prompts]
    out: list = [None] * len(prompts)
    with concurrent.futures.ThreadPoolExecutor(min(self.max_concurrency, len(prompts))) as pool, \
        progress_bar(len(prompts), f"{self.model}: {len(prompts)} requests") as bar:
      futures = {pool.submit(self._one, p, sampling): i for i, p in enumerate(prompts)}
      try:
        for f in concurrent.futures.as_completed(futures):
          out[futures[f]] = f.result()
          bar.update(1)
      except BaseException:
        for f in futures:
          f.cancel()
        raise
    return out


def _parse_choice(c: dict, chat: bool) -> Completion:
  reason = c.get("finish_reason") or "stop"
  lp = c.get("logprobs")
  if chat:
    text = (c.get("message") or {}).get("content") or ""
    values = None if not lp or lp.get("content") is None else [float(t["logprob"]) for t in lp["content"]]
  else:
    text = c["text"]
    values = None if not lp or lp.get("token_logprobs") is None else [float(x) for x in lp["token_logprobs"]]
  return Completion(text=text, tokens=None if values is None else len(values),
                    finish_reason="length" if reason == "length" else "stop",
                    logprobs=None if values is None else tuple(values))


def _error_message(raw: bytes) -> str:
  try:
    obj = json.loads(raw.decode("utf-8"))
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    msg = err.get("message", err) if isinstance(err, dict) else err
    return str(msg)[:300]
  except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
    return raw[:300].decode("utf-8", "replace") or "(empty body)"


def _retry_after(headers: dict[str, str]) -> float | None:
  for k, v in headers.items():
    if k.lower() == "retry-after":
      try:
        return max(0.0, float(v))
      except ValueError:
        return None
  return None
