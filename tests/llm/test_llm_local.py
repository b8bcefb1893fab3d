"""`LocalBackend`: greedy output equals `jaxlab.lm.generate`'s; chat templates, seeds, stop strings, limits."""

import numpy as np
import pytest

from jaxlab.errors import CheckpointError, ConfigError
from jaxlab.llm import ContextTooLongError

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2+3?"}]


@pytest.fixture(scope="module")
def backend(tiny_hf):
  from jaxlab.llm import LocalBackend
  return LocalBackend(tiny_hf, batch_size=4)


def _generate(backend, rows, max_new):
  from jaxlab.lm import generate
  tok = backend.tokenizer
  out = generate(backend.model, rows, max_new, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
  return [[int(t) for t in row[:n]] for row, n in zip(np.asarray(out.tokens), np.asarray(out.lengths))]


def test_greedy_equals_generate(backend):
  prompts = ["the sum of", "hello", CHAT]
  got = backend.complete_batch(prompts, max_tokens=12, logprobs=True)
  tok = backend.tokenizer
  rows = [[tok.bos_id] + tok.encode("the sum of"), [tok.bos_id] + tok.encode("hello"),
          tok.encode(backend.template.render(CHAT))]
  assert rows[2][0] == tok.special_ids["<|im_start|>"]                 # ChatML from tokenizer_config.json
  want = _generate(backend, rows, 12)
  for [c], ids in zip(got, want):
    assert list(c.token_ids) == ids and c.tokens == len(ids) and len(c.logprobs) == len(ids)
    eos = ids[-1] == tok.eos_id
    assert c.finish_reason == ("stop" if eos else "length")
    assert c.text == tok.decode(ids[:-1] if eos else ids, skip_special=True)
  assert backend.model_id == "tiny-chat"


def test_sampling_is_seeded_and_batched_rows_are_independent(backend):
  a = backend.complete("hello", n=6, temperature=1.0, max_tokens=8, seed=1)     # 6 rows over 2 sampler calls
  b = backend.complete("hello", n=6, temperature=1.0, max_tokens=8, seed=1)
  c = backend.complete("hello", n=6, temperature=1.0, max_tokens=8, seed=2)
  assert a == b and a != c and len({x.token_ids for x in a}) > 1


def test_stop_strings_cut_the_text_and_count_tokens(backend):
  [full] = backend.complete("the sum of", max_tokens=16)
  text = full.text
  k = next(i for i in range(2, len(text)) if text[i:i + 2].strip() and text[i:i + 2] not in text[:i])
  stop = text[k:k + 2]
  [cut] = backend.complete("the sum of", max_tokens=16, stop=[stop, "never-there"])
  assert cut.text == text[:k] and cut.finish_reason == "stop"
  prefix = backend.decode(full.token_ids[:cut.tokens])
  assert stop in prefix and stop not in backend.decode(full.token_ids[:cut.tokens - 1])


def test_context_too_long_is_one_clear_error(backend):
  with pytest.raises(ContextTooLongError, match=r"prompt 0 has \d+ tokens; with max_tokens=90 .* > the model's "
                     r"context of 96 tokens"):
    backend.complete(CHAT, max_tokens=90)


def test_bad_model_dirs(tmp_path):
  from jaxlab.llm import LocalBackend
  with pytest.raises(CheckpointError, match="does not exist"):
    LocalBackend(str(tmp_path / "nope"))
  with pytest.raises(CheckpointError, match="has no config.json"):
    LocalBackend(str(tmp_path))
  with pytest.raises(ConfigError, match="either model_dir or model="):
    LocalBackend()
