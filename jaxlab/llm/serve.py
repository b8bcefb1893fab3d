"""A small OpenAI-compatible server answering from a `LocalBackend` (one machine; tests and single users).

    python -m jaxlab.llm.serve --model CHECKPOINT_DIR [--port 8000] [--host 127.0.0.1] [--name NAME]
        [--max_requests N] [--idle_timeout S] [--max_tokens_cap 4096] [--batch_size 64]
        [--api_key_env VAR] [--fail_first K --fail_status 429]

Endpoints: `GET /v1/models`, `GET /health`, `POST /v1/chat/completions`, `POST /v1/completions`, with the
OpenAI request and answer formats (n, temperature, top_p, top_k, max_tokens, stop, seed, logprobs; streaming
is refused with HTTP 400). Errors answer `{"error": {"message", "type", "code"}}`: 404 for a model it does not
serve, 400 for a bad request or a prompt too long for the context (code "context_length_exceeded"), 413 for
a body over 1 MiB, 401 without the key when `--api_key_env VAR` names an environment variable holding one
(clients send `Authorization: Bearer <key>`). Requests are answered one at a time (the model is not shared
between threads).

Bounded: it binds 127.0.0.1 unless `--host` says otherwise, and stops by itself after `--max_requests`
completion requests or `--idle_timeout` seconds without one (0: never). `--port 0` picks a free port. Once
the model is loaded it prints one line, `jaxlab.llm.serve: serving NAME at http://HOST:PORT/v1`, which
scripts can wait for. `--fail_first K` answers the first K completion requests with `--fail_status` (and
`Retry-After: 0`): a test flag for clients' retry logic.
"""

from __future__ import annotations

import argparse
import hmac
import http.server
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

from jaxlab.errors import ConfigError, DataError, JaxlabError
from jaxlab.llm.base import Backend, ContextTooLongError, check_prompt

MAX_BODY_BYTES = 1 << 20


class _Refusal(Exception):

  def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: Any = None):
    super().__init__(message)
    self.status, self.message, self.kind, self.code = status, message, kind, code


class Server(http.server.ThreadingHTTPServer):
  """The HTTP server; `serve_forever()` returns after `shutdown()`, `max_requests` or the idle timeout.

  Args:
    backend: the model to answer with (`LocalBackend`, or any `Backend`).
    name: the served model name.
    host / port: where to listen (port 0: a free one; `server_address` tells which).
    max_requests: completion requests to answer before stopping (0: no limit).
    idle_timeout: stop after this many seconds without a request (0: never).
    max_tokens_cap: the largest max_tokens a request may ask for.
    fail_first / fail_status: answer the first `fail_first` completion requests with HTTP `fail_status`.
    api_key: the key requests must carry (None: none needed).
  """

  daemon_threads = False     # request threads are joined by server_close(): none is left running at exit
  block_on_close = True

  def __init__(self, backend: Backend, name: str, host: str = "127.0.0.1", port: int = 0, *,
               max_requests: int = 0, idle_timeout: float = 0.0, max_tokens_cap: int = 4096, fail_first: int = 0,
               fail_status: int = 429, api_key: str | None = None):
    super().__init__((host, port), _Handler)
    self.backend, self.name = backend, name
    self.max_requests, self.idle_timeout, self.max_tokens_cap = max_requests, idle_timeout, max_tokens_cap
    self.fail_left, self.fail_status = fail_first, fail_status
    self.answered = 0
    self.api_key = api_key
    self.last_request = time.monotonic()
    self.model_lock = threading.Lock()
    self.state_lock = threading.Lock()
    self._stopping = False
    self._stopper: threading.Thread | None = None

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://{host}:{port}/v1"

  def stop_soon(self) -> None:
    """Shuts down from a request thread (shutdown() would wait for the loop that runs the request)."""
    with self.state_lock:
      if self._stopping:
        return
      self._stopping = True
      self._stopper = threading.Thread(target=self.shutdown)
      self._stopper.start()

  def server_close(self) -> None:
    """Closes the socket and waits for the request threads and the stopper (so the process exits cleanly)."""
    super().server_close()
    if self._stopper is not None:
      self._stopper.join()

  def service_actions(self) -> None:   # called by serve_forever between requests
    if self.idle_timeout and time.monotonic() - self.last_request > self.idle_timeout:
      self.stop_soon()


class _Handler(http.server.BaseHTTPRequestHandler):
  server: Server
  protocol_version = "HTTP/1.1"
  timeout = 30        # an idle keep-alive connection is closed after this many seconds

  def log_message(self, fmt, *args):   # quiet: one line per request only on errors
    pass

  def _send(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.end_headers()
    self.wfile.write(data)

  def _error(self, r: _Refusal, headers=None) -> None:
    self._send(r.status, {"error": {"message": r.message, "type": r.kind, "code": r.code or r.status}}, headers)

  def _authorised(self) -> bool:
    key = self.server.api_key
    if key is None:
      return True
    given = self.headers.get("Authorization") or ""
    if hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
      return True
    self._error(_Refusal(401, "missing or wrong API key (send Authorization: Bearer <key>)",
                         "authentication_error"))
    return False

  def do_GET(self):   # noqa: N802
    self.server.last_request = time.monotonic()
    if not self._authorised():
      return
    if self.path.rstrip("/") in ("/v1/models", "/models"):
      self._send(200, {"object": "list", "data": [{"id": self.server.name, "object": "model", "created": 0,
                                                   "owned_by": "jaxlab"}]})
    elif self.path.rstrip("/") in ("/health", ""):
      self._send(200, {"status": "ok"})
    else:
      self._error(_Refusal(404, f"no route GET {self.path}", "not_found_error"))

  def do_POST(self):   # noqa: N802
    srv = self.server
    srv.last_request = time.monotonic()
    path = self.path.rstrip("/")
    try:
      length = int(self.headers.get("Content-Length") or 0)
      if length > MAX_BODY_BYTES:
        self.close_connection = True
        raise _Refusal(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}")
      raw = self.rfile.read(length)
      if not self._authorised():
        return
      if path not in ("/v1/chat/completions", "/v1/completions"):
        raise _Refusal(404, f"no route POST {self.path}; use /v1/chat/completions or /v1/completions",
                       "not_found_error")
      with srv.state_lock:
        if srv.fail_left > 0:
          srv.fail_left -= 1
          self._error(_Refusal(srv.fail_status, "injected failure (--fail_first)", "rate_limit_error"),
                      {"Retry-After": "0"})
          return
      try:
        body = json.loads(raw.decode("utf-8"))
      except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _Refusal(400, f"the request body is not JSON ({e})") from None
      if not isinstance(body, dict):
        raise _Refusal(400, "the request body must be a JSON object")
      answer = self._complete(body, chat=path.endswith("chat/completions"))
      self._send(200, answer)
    except _Refusal as r:
      self._error(r)
      return
    with srv.state_lock:
      srv.answered += 1
      done = bool(srv.max_requests and srv.answered >= srv.max_requests)
    if done:
      self.close_connection = True
      srv.stop_soon()

  def _complete(self, body: dict, chat: bool) -> dict[str, Any]:
    srv = self.server
    if body.get("model") != srv.name:
      raise _Refusal(404, f"The model `{body.get('model')}` does not exist. This server serves `{srv.name}`.",
                     "not_found_error", "model_not_found")
    if body.get("stream"):
      raise _Refusal(400, "streaming is not supported by jaxlab.llm.serve; send stream=false")
    try:
      prompt = check_prompt(body.get("messages") if chat else body.get("prompt"),
                            "messages" if chat else "prompt")
      stop = body.get("stop") or ()
      logprobs = bool(body.get("logprobs"))
      max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or (256 if chat else 16))
      if max_tokens > srv.max_tokens_cap:
        raise _Refusal(400, f"max_tokens={max_tokens} is over this server's cap of {srv.max_tokens_cap}")
      with srv.model_lock:
        comps = srv.backend.complete(prompt, n=int(body.get("n") or 1), temperature=float(
            body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)), top_k=int(body.get("top_k") or 0),
                                     max_tokens=max_tokens, seed=body.get("seed"), stop=stop, logprobs=logprobs)
        prompt_tokens = len(srv.backend.encode(prompt)) if hasattr(srv.backend, "encode") else 0
    except ContextTooLongError as e:
      raise _Refusal(400, f"This model's maximum context length is exceeded: {e}", code="context_length_exceeded"
                     ) from None
    except (JaxlabError, ValueError, TypeError) as e:
      raise _Refusal(400, str(e)) from None
    tok = getattr(srv.backend, "tokenizer", None)
    choices = []
    for i, c in enumerate(comps):
      choice: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason, "logprobs": None}
      strings = ([tok.decode([t]) for t in c.token_ids] if tok is not None and c.token_ids is not None
                 else [""] * len(c.logprobs or ()))
      if chat:
        choice["message"] = {"role": "assistant", "content": c.text}
        if logprobs and c.logprobs is not None:
          choice["logprobs"] = {"content": [{"token": s, "logprob": lp, "top_logprobs": []}
                                            for s, lp in zip(strings, c.logprobs)]}
      else:
        choice["text"] = c.text
        if logprobs and c.logprobs is not None:
          choice["logprobs"] = {"tokens": strings, "token_logprobs": list(c.logprobs), "top_logprobs": None,
                                "text_offset": []}
      choices.append(choice)
    used = sum(c.tokens or 0 for c in comps)
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": srv.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used}}


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxlab.llm.serve", description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", required=True, help="a Hugging Face checkpoint folder or a jaxlab run directory")
  parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
  parser.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed when ready)")
  parser.add_argument("--name", default=None, help="served model name (default: the folder's name)")
  parser.add_argument("--experiment", default=None, help="experiment of a run directory (default: its run.json)")
  parser.add_argument("--max_requests", type=int, default=0, help="stop after this many completion requests")
  parser.add_argument("--idle_timeout", type=float, default=0.0, help="stop after this many idle seconds")
  parser.add_argument("--max_tokens_cap", type=int, default=4096)
  parser.add_argument("--batch_size", type=int, default=64, help="sequences per sampler call")
  parser.add_argument("--api_key_env", default=None, help="environment variable holding the key clients must send")
  parser.add_argument("--fail_first", type=int, default=0, help="test flag: fail the first K completion requests")
  parser.add_argument("--fail_status", type=int, default=429, help="HTTP status of those failures")
  args = parser.parse_args(argv)
  if args.max_requests < 0 or args.idle_timeout < 0 or args.fail_first < 0:
    raise ConfigError("--max_requests, --idle_timeout and --fail_first must be >= 0")
  if not 400 <= args.fail_status <= 599:
    raise ConfigError(f"--fail_status must be an HTTP error status (400-599), got {args.fail_status}")
  api_key = None
  if args.api_key_env:
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
      raise ConfigError(f"--api_key_env {args.api_key_env}: that environment variable is not set or empty")
  from jaxlab.llm.local import LocalBackend  # pylint: disable=g-import-not-at-top
  backend = LocalBackend(args.model, batch_size=args.batch_size, experiment=args.experiment, name=args.name)
  try:
    server = Server(backend, backend.model_id, args.host, args.port, max_requests=args.max_requests,
                    idle_timeout=args.idle_timeout, max_tokens_cap=args.max_tokens_cap, fail_first=args.fail_first,
                    fail_status=args.fail_status, api_key=api_key)
  except OSError as e:
    raise DataError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pick another --port "
                    "(0 picks a free one)") from None
  print(f"jaxlab.llm.serve: serving {backend.model_id} at {server.url}", flush=True)
  try:
    server.serve_forever(poll_interval=0.2)
  except KeyboardInterrupt:        # Ctrl-C or SIGTERM: a server has nothing to resume
    pass
  finally:
    server.server_close()
  print(f"jaxlab.llm.serve: stopped after {server.answered} requests", file=sys.stderr, flush=True)
  return 0


if __name__ == "__main__":
  from jaxlab import cli  # pylint: disable=g-import-not-at-top
  cli.main_wrapper(main)
