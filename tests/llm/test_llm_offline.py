"""Offline backends: scripted rules, recorded replays, and the on-disk cache (hits, damage, concurrent writers)."""

import json
import os
import subprocess
import sys
import threading

import pytest

from jaxlab.errors import ConfigError, DataError
from jaxlab.llm import (CachingBackend, Completion, ReplayBackend, ReplayMissError, ScriptedBackend, prompt_key,
                        write_replay)

CHAT = [{"role": "system", "content": "solve"}, {"role": "user", "content": "2+3="}]


def test_scripted_rules_are_deterministic_and_recorded():
  b = ScriptedBackend([(r"(?P<a>\d+)\+(?P<b>\d+)=", "{a} plus {b} STOP more"), (r"^hello", ["h1", "h2"])])
  assert [c.text for c in b.complete(CHAT, n=2, stop=["STOP"])] == ["2 plus 3 ", "2 plus 3 "]
  assert [c.text for c in b.complete("hello there", n=3)] == ["h1", "h2", "h1"]
  c = b.complete("hello", max_tokens=1)[0]
  assert c.text == "h" and c.finish_reason == "length"
  assert [rid for _, rid in b.calls] == [None, None, None]
  with pytest.raises(ReplayMissError, match="no rule matches the prompt 'goodbye'"):
    b.complete("goodbye")
  by_call = ScriptedBackend(lambda prompt, rid, i: f"{rid}:{i}")
  assert [c[0].text for c in by_call.complete_batch(["a", "b"], request_ids=["x", "y"])] == ["x:0", "y:1"]
  with pytest.raises(ConfigError, match="rule 0 must be a"):
    ScriptedBackend(["not a pair"])
  with pytest.raises(ConfigError, match="not a valid regex"):
    ScriptedBackend([("(", "x")])


def test_prompt_and_sampling_validation():
  b = ScriptedBackend([(".*", "x")])
  with pytest.raises(DataError, match="message 1 must be an object with string 'role' and 'content'"):
    b.complete([{"role": "user", "content": "a"}, {"role": "user"}])
  with pytest.raises(DataError, match="empty string"):
    b.complete("")
  with pytest.raises(DataError, match="takes a list of prompts"):
    b.complete_batch("abc")
  for kw, msg in [({"n": 0}, "n must be >= 1"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                  ({"max_tokens": 0}, "max_tokens"), ({"stop": [""]}, "stop must be")]:
    with pytest.raises(ConfigError, match=msg):
      b.complete("a", **kw)


def test_replay_by_id_and_by_prompt_hash(tmp_path):
  path = str(tmp_path / "rec.jsonl")
  n = write_replay(path, [{"id": "q1", "completions": ["one", "uno"]},
                          {"prompt": CHAT, "completions": [Completion("five", tokens=2, logprobs=(-0.1, -0.2))]}])
  assert n == 2
  r = ReplayBackend(path)
  assert [c.text for c in r.complete("anything", n=2, request_id="q1")] == ["one", "uno"]
  got = r.complete([dict(m) for m in CHAT])[0]                   # found by the prompt's hash
  assert got == Completion("five", tokens=2, logprobs=(-0.1, -0.2))
  with pytest.raises(ReplayMissError, match=r"no recording for prompt 'user: 2\+4='"):
    r.complete([{"role": "user", "content": "2+4="}])
  with pytest.raises(ReplayMissError, match="recorded 2 completions .* asked for n=3"):
    r.complete("x", n=3, request_id="q1")
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"id": "a", "completions": ["x"]}\n{"id": "b", "completions": []}\n')
  with pytest.raises(DataError, match=r"bad.jsonl:2: needs a non-empty list 'completions'"):
    ReplayBackend(str(bad))


def test_cache_hits_are_byte_identical_and_skip_the_model(tmp_path):
  inner = ScriptedBackend(lambda p, rid, i: [f"answer ü {i}", f"second {i}"])
  cache = CachingBackend(inner, str(tmp_path / "cache"))
  first = cache.complete_batch(["a", CHAT], n=2, temperature=0.7, seed=3)
  files = sorted(os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "cache") for f in fs)
  before = {f: open(f, "rb").read() for f in files}
  again = cache.complete_batch(["a", CHAT], n=2, temperature=0.7, seed=3)
  assert again == first and [c.text.encode() for c in again[0]] == [b"answer \xc3\xbc 0", b"second 0"]
  assert len(inner.calls) == 2 and (cache.hits, cache.misses) == (2, 2)
  assert {f: open(f, "rb").read() for f in files} == before          # a hit rewrites nothing
  cache.complete("a", n=2, temperature=0.7, seed=4)                  # other settings: another entry
  assert len(inner.calls) == 3
  # A damaged entry is a miss and is rewritten.
  open(files[0], "wb").write(b'{"request": ')
  cache.complete_batch(["a", CHAT], n=2, temperature=0.7, seed=3)
  assert len(inner.calls) == 4 and json.loads(open(files[0]).read())["completions"]
  # Entries export as a replay file that answers the same requests.
  out = str(tmp_path / "replay.jsonl")
  write_replay(out, cache.entries())
  assert ReplayBackend(out).complete(CHAT, n=2) == first[1]


WRITER = r"""
import sys
from jaxlab.llm import CachingBackend, ScriptedBackend
b = CachingBackend(ScriptedBackend(lambda p, rid, i: "x" * 20000 + p), sys.argv[1])
for round in range(3):
  b.complete_batch([f"prompt {k}" for k in range(40)], temperature=1.0, max_tokens=30000)
"""


def test_concurrent_writers_do_not_corrupt_the_cache(tmp_path):
  folder = str(tmp_path / "shared")
  procs = [subprocess.Popen([sys.executable, "-c", WRITER, folder]) for _ in range(3)]

  def write():
    cache = CachingBackend(ScriptedBackend(lambda p, r, i: "x" * 20000 + p), folder)
    cache.complete_batch([f"prompt {k}" for k in range(40)], temperature=1.0, max_tokens=30000)
  threads = [threading.Thread(target=write) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert all(p.wait(timeout=120) == 0 for p in procs)
  names = [f for _, _, fs in os.walk(folder) for f in fs]
  assert len(names) == 40 and not [f for f in names if f.startswith(".tmp-")]
  probe = ScriptedBackend(lambda p, r, i: pytest.fail("a complete entry was missing"))
  out = CachingBackend(probe, folder).complete_batch([f"prompt {k}" for k in range(40)], temperature=1.0,
                                                     max_tokens=30000)
  assert [c[0].text for c in out] == ["x" * 20000 + f"prompt {k}" for k in range(40)]


def test_prompt_key_is_canonical():
  assert prompt_key(CHAT) == prompt_key([{"content": m["content"], "role": m["role"]} for m in CHAT])
  assert prompt_key("a") != prompt_key([{"role": "user", "content": "a"}])


def test_an_interrupted_batch_keeps_what_was_answered(tmp_path):
  def flaky(prompt, rid, i):
    if prompt == "p37" and not flaky.healed:
      raise KeyboardInterrupt
    return prompt.upper()
  flaky.healed = False
  inner = ScriptedBackend(flaky)
  cache = CachingBackend(inner, str(tmp_path), group=8)
  prompts = [f"p{k}" for k in range(40)]
  with pytest.raises(KeyboardInterrupt):
    cache.complete_batch(prompts)
  assert sum(len(fs) for _, _, fs in os.walk(tmp_path)) == 32         # four whole groups were written
  flaky.healed = True
  asked = len(inner.calls)
  out = cache.complete_batch(prompts)
  assert [c[0].text for c in out] == [p.upper() for p in prompts] and len(inner.calls) - asked == 8
