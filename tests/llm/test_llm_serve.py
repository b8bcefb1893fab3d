"""`python -m jaxlab.llm.serve` in a subprocess on 127.0.0.1, and the real `OpenAICompatBackend` against it:
request formats, n > 1, stop strings, errors, injected 429s and retries, stopping by itself, a killed server;
PETS' sample_pools from the served model."""

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from jaxlab.llm import (BackendError, ContextTooLongError, ModelNotServedError, OpenAICompatBackend,
                        ServerUnavailableError)

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2+3?"}]


KEY = "jaxlab-test-key-1234"


def start_server(model_dir, *extra, timeout=180):
  """(process, base url) of a server on a free loopback port, once it prints its ready line."""
  env = {**os.environ, "JAXLAB_PROGRESS": "0", "JAX_PLATFORMS": "cpu", "JAXLAB_SERVE_KEY": KEY}
  proc = subprocess.Popen([sys.executable, "-m", "jaxlab.llm.serve", "--model", model_dir, "--port", "0",
                           "--host", "127.0.0.1", "--idle_timeout", "300", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    ready, _, _ = select.select([proc.stdout], [], [], 1.0)
    if ready:
      line = proc.stdout.readline()
      if line.startswith("jaxlab.llm.serve: serving"):
        return proc, line.split(" at ")[1].strip()
    if proc.poll() is not None:
      raise AssertionError(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
  proc.kill()
  raise AssertionError("the server did not start in time")


@pytest.fixture(scope="module")
def servers(tiny_hf):
  """Two servers: one that needs an API key, and one failing its first 2 requests with 429 that stops by itself
  after answering 2."""
  procs = []
  try:
    plain = start_server(tiny_hf, "--api_key_env", "JAXLAB_SERVE_KEY")
    procs.append(plain[0])
    flaky = start_server(tiny_hf, "--fail_first", "2", "--fail_status", "429", "--max_requests", "2")
    procs.append(flaky[0])
    yield {"plain": plain, "flaky": flaky}
  finally:
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
          p.wait(timeout=10)
        except subprocess.TimeoutExpired:
          p.kill()


@pytest.fixture(autouse=True)
def _client_key(monkeypatch):
  monkeypatch.setenv("JAXLAB_TEST_KEY", KEY)


@pytest.fixture(scope="module")
def local(tiny_hf):
  from jaxlab.llm import LocalBackend
  return LocalBackend(tiny_hf)


def test_round_trip_matches_the_local_model(servers, local):
  _, url = servers["plain"]
  client = OpenAICompatBackend(url, "tiny-chat", api_key_env="JAXLAB_TEST_KEY")
  assert client.served_models() == ["tiny-chat"]
  # chat/completions: greedy, logprobs
  [got] = client.complete(CHAT, max_tokens=10, logprobs=True)
  [want] = local.complete(CHAT, max_tokens=10, logprobs=True)
  assert (got.text, got.tokens, got.finish_reason) == (want.text, want.tokens, want.finish_reason)
  assert got.logprobs == pytest.approx(want.logprobs, abs=1e-6)
  # completions: a raw prompt, n > 1 sampled with a seed, stop strings
  got = client.complete("hello", n=3, temperature=1.0, max_tokens=8, seed=5)
  want = local.complete("hello", n=3, temperature=1.0, max_tokens=8, seed=5)
  assert [c.text for c in got] == [c.text for c in want] and len({c.text for c in got}) > 1
  assert all(c.logprobs is None for c in got)
  [full] = local.complete("the sum of", max_tokens=12)
  stop = full.text[4:6]
  [cut] = client.complete("the sum of", max_tokens=12, stop=[stop])
  assert cut.text == full.text[:full.text.find(stop)] and cut.finish_reason == "stop"
  # complete_batch sends requests concurrently and keeps their order
  batch = client.complete_batch(["hello", CHAT, "the sum of"], max_tokens=6)
  assert [b[0].text for b in batch] == [c[0].text for c in local.complete_batch(["hello", CHAT, "the sum of"],
                                                                                max_tokens=6)]


def test_server_errors_become_clear_client_errors(servers):
  _, url = servers["plain"]
  with pytest.raises(ModelNotServedError, match=r"does not serve model 'gpt-x'; it serves \['tiny-chat'\]"):
    OpenAICompatBackend(url, "gpt-x", api_key_env="JAXLAB_TEST_KEY").complete(CHAT)
  with pytest.raises(BackendError, match="refused the request \\(HTTP 401: missing or wrong API key.*environment "
                     "variable NO_SUCH_KEY_VAR") as e:
    OpenAICompatBackend(url, "tiny-chat", api_key_env="NO_SUCH_KEY_VAR").complete(CHAT)
  assert KEY not in str(e.value)
  client = OpenAICompatBackend(url, "tiny-chat", api_key_env="JAXLAB_TEST_KEY")
  with pytest.raises(ContextTooLongError, match="maximum context length"):
    client.complete(CHAT, max_tokens=95)
  with pytest.raises(BackendError, match="streaming is not supported"):
    client.request("/chat/completions", {"model": "tiny-chat", "messages": CHAT, "stream": True})
  with pytest.raises(BackendError, match="HTTP 400: messages: message 0 must be an object"):
    client.request("/chat/completions", {"model": "tiny-chat", "messages": [{"role": "user"}]})


def test_retries_on_429_then_stops_by_itself(servers):
  proc, url = servers["flaky"]
  client = OpenAICompatBackend(url, "tiny-chat", max_retries=3, backoff=0.01)
  [c] = client.complete("hello", max_tokens=4)                 # two 429s, then an answer
  assert client.retries == 2 and isinstance(c.text, str)
  client.complete("hello", max_tokens=4)                       # the second answer: --max_requests 2
  assert proc.wait(timeout=30) == 0, proc.stderr.read()[-2000:]
  with pytest.raises(ServerUnavailableError, match=r"did not answer /completions after 2 tries \(last: "
                     r"(ConnectionRefusedError|.*refused)"):
    OpenAICompatBackend(url, "tiny-chat", max_retries=1, backoff=0.01).complete("hello")


def test_sample_pools_from_the_served_model(servers, tiny_hf, tmp_path):
  from jaxlab.tts import sample_pools
  _, url = servers["plain"]
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(["hello", "the"])))
  common = ["--prompts", str(prompts), "--n", "2", "--max_new_tokens", "5", "--temperature", "0"]
  served, here = str(tmp_path / "served.jsonl"), str(tmp_path / "local.jsonl")
  assert sample_pools.main(common + ["--base_url", url, "--served_model", "tiny-chat", "--out", served,
                                     "--api_key_env", "JAXLAB_TEST_KEY",
                                     "--cache", str(tmp_path / "cache")]) == 0
  assert sample_pools.main(common + ["--model", tiny_hf, "--out", here]) == 0
  a, b = ([json.loads(x) for x in open(f)] for f in (served, here))
  assert [x["answers"] for x in a] == [x["answers"] for x in b]
  for x, y in zip(a, b):
    assert [t["mean_logprob"] for t in x["trace_confidence"]] == pytest.approx(
        [t["mean_logprob"] for t in y["trace_confidence"]], abs=1e-5)


def test_a_killed_server_gives_a_clear_error(servers):
  proc, url = servers["plain"]
  proc.kill()
  proc.wait(timeout=10)
  t = time.monotonic()
  with pytest.raises(ServerUnavailableError, match=r"is it running and serving\? start one with"):
    OpenAICompatBackend(url, "tiny-chat", max_retries=2, backoff=0.01, api_key_env="JAXLAB_TEST_KEY").complete(CHAT)
  assert time.monotonic() - t < 10


def test_serve_bad_flags_are_one_line(tmp_path):
  from jaxlab.errors import CheckpointError, ConfigError
  from jaxlab.llm import serve
  with pytest.raises(ConfigError, match="--fail_status must be an HTTP error status"):
    serve.main(["--model", str(tmp_path), "--fail_status", "200"])
  with pytest.raises(CheckpointError, match="has no config.json"):
    serve.main(["--model", str(tmp_path), "--port", "0"])
