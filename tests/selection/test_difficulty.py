"""jaxlab.selection.difficulty: reference loss against a numpy log-softmax loop, pass rate through the sampler,
length and field scores, quantile buckets against pandas.qcut / hand tables, budgeted and mixed selection."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from jaxlab.errors import ConfigError, DataError
from jaxlab.lm import Transformer, TransformerConfig, from_pretrained, save_pretrained, sft_data
from jaxlab.lm.tokenizer import ByteTokenizer
from jaxlab.selection import difficulty

TOK = ByteTokenizer()
RECORDS = [
    {"prompt": "12+345=", "completion": "357"},
    {"prompt": "1+1=", "completion": "2"},
    {"prompt": "What is 2+2?\n", "completion": "four, as everyone knows"},
    {"prompt": "héllo ", "completion": "wörld 😀"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]},
    {"prompt": "tool: ", "completion": [{"text": "call", "train": True}, {"text": " -> 7", "train": False},
                                        {"text": " so 7", "train": True}]},
]


def tiny_config() -> TransformerConfig:
  """Hidden 32, 2 layers; the byte tokenizer's vocabulary rounded up to a multiple of 8."""
  return TransformerConfig(vocab_size=-(-TOK.vocab_size // 8) * 8, hidden=32, n_layers=2, n_heads=4, mlp_hidden=64,
                           max_position=96)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  """A random tiny Llama, saved as a Hugging Face checkpoint and loaded back (as the CLI loads it)."""
  path = tmp_path_factory.mktemp("ckpt")
  save_pretrained(Transformer(tiny_config(), rngs=nnx.Rngs(3)), str(path))
  return from_pretrained(str(path))


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  m = x.max(axis=-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens):
  return nnx.merge(graphdef, state)(tokens)


def _brute_loss(model, ids: np.ndarray, train: np.ndarray) -> tuple[float, int]:
  """Mean NLL of the trained targets from one unpadded forward pass and a numpy log-softmax."""
  logits = np.asarray(_forward(*nnx.split(model), ids[None, :-1]))[0]
  lp = _log_softmax(logits)[np.arange(len(ids) - 1), ids[1:]]
  mask = train[1:]
  return float(-lp[mask].mean()) if mask.any() else float("nan"), int(mask.sum())


# --------------------------------------------------------------------------------------------- scorers

def test_reference_loss_matches_numpy_loop(model):
  got = difficulty.reference_loss(model, TOK, RECORDS, batch=4)
  assert got["loss"].shape == got["perplexity"].shape == got["tokens"].shape == (len(RECORDS),)
  for i, rec in enumerate(RECORDS):
    ids, train = sft_data.tokenize(rec, TOK)
    want, n = _brute_loss(model, ids, train)
    np.testing.assert_allclose(got["loss"][i], want, atol=1e-5, rtol=0)
    assert got["tokens"][i] == n
  np.testing.assert_allclose(got["perplexity"], np.exp(got["loss"]))
  # Examples objects, another batch size (other padding / batch composition): the same numbers.
  again = difficulty.reference_loss(model, TOK, [sft_data.as_example(r) for r in RECORDS], batch=3)
  np.testing.assert_allclose(again["loss"], got["loss"], atol=1e-5, rtol=0)


def test_reference_loss_truncation_and_empty_completion(model):
  rec = {"prompt": "a long prompt that will not fit " * 2, "completion": "short"}
  got = difficulty.reference_loss(model, TOK, [rec], batch=2, seq_len=16)          # left: keep the completion
  ids, train = sft_data.tokenize(rec, TOK)
  ids, train = np.concatenate([ids[:1], ids[-16:]]), np.concatenate([train[:1], train[-16:]])
  want, n = _brute_loss(model, ids, train)
  np.testing.assert_allclose(got["loss"][0], want, atol=1e-5, rtol=0)
  assert got["tokens"][0] == n == len("short") + 1
  cut = difficulty.reference_loss(model, TOK, [rec], batch=2, seq_len=16, truncation="right")
  assert cut["tokens"][0] == 0 and np.isnan(cut["loss"][0])                         # only prompt tokens left
  empty = difficulty.reference_loss(model, TOK, [{"prompt": "x", "completion": ""}, RECORDS[1]], batch=2,
                                    add_eos=False)
  assert empty["tokens"][0] == 0 and np.isnan(empty["loss"][0]) and np.isfinite(empty["loss"][1])
  with pytest.raises(ConfigError, match="truncation"):
    difficulty.reference_loss(model, TOK, [rec], truncation="drop")
  with pytest.raises(DataError, match="example 0"):
    difficulty.reference_loss(model, TOK, [{"prompt": "x"}])


PROMPTS = [f"q{i}: " for i in range(5)]        # one prompt length: one compiled sampler for every test


def test_pass_rate_always_and_never(model):
  key = jax.random.key(0)
  kw = dict(k=3, max_new_tokens=4, batch=4, key=key)           # 15 rows: the last batch is filled up
  ones = difficulty.pass_rate(model, TOK, PROMPTS, list(range(5)),
                              reward=lambda c, a: np.ones(len(c), np.float32), **kw)
  zeros = difficulty.pass_rate(model, TOK, PROMPTS, list(range(5)),
                               reward=lambda c, a: np.zeros(len(c), np.float32), **kw)
  assert ones.dtype == np.float64 and np.array_equal(ones, np.ones(5)) and np.array_equal(zeros, np.zeros(5))
  # A reward of exactly the threshold passes, just below does not.
  half = difficulty.pass_rate(model, TOK, PROMPTS, list(range(5)), reward=lambda c, a: np.full(len(c), 0.5), **kw)
  below = difficulty.pass_rate(model, TOK, PROMPTS, list(range(5)), reward=lambda c, a: np.full(len(c), 0.49), **kw)
  assert np.array_equal(half, np.ones(5)) and np.array_equal(below, np.zeros(5))


def test_pass_rate_fractions_follow_the_samples(model):
  k, calls = 4, []

  def reward(completions, answers):      # passes completions of even length; logs what it saw
    calls.append((list(completions), list(answers)))
    return np.asarray([float(len(c) % 2 == 0) for c in completions], np.float32)

  got = difficulty.pass_rate(model, TOK, PROMPTS, list(range(5)), k=k, max_new_tokens=4, batch=4,
                             key=jax.random.key(1), reward=reward)
  seen = {i: [] for i in range(5)}
  for completions, answers in calls:
    for c, a in zip(completions, answers):
      seen[a].append(float(len(c) % 2 == 0))
  assert all(len(v) == k for v in seen.values())                 # k samples per prompt, filler rows dropped
  np.testing.assert_array_equal(got, [np.mean(seen[i]) for i in range(5)])
  assert set(np.round(got * k, 6)) <= set(range(k + 1))
  again = difficulty.pass_rate(model, TOK, PROMPTS, list(range(5)), k=k, max_new_tokens=4, batch=4,
                               key=jax.random.key(1), reward=reward)
  np.testing.assert_array_equal(again, got)                      # deterministic given the key
  assert len({c for cs, _ in calls for c in cs}) > 1               # samples differ (temperature 1)


def test_pass_rate_with_answer_reward_and_records(model):
  recs = [{"prompt": p, "completion": "x"} for p in PROMPTS[:2]]
  got = difficulty.pass_rate(model, TOK, recs, ["1", "2"], k=2, max_new_tokens=4, batch=4, key=jax.random.key(2))
  assert got.shape == (2,) and np.all(got == 0)              # a random model does not write <answer> blocks


def test_pass_rate_errors(model):
  key = jax.random.key(0)
  with pytest.raises(DataError, match="2 prompts but 1 answers"):
    difficulty.pass_rate(model, TOK, ["a", "b"], ["1"], k=1, max_new_tokens=2, key=key)
  with pytest.raises(DataError, match="prompt 1 has .* max_position=96"):
    difficulty.pass_rate(model, TOK, ["a", "b" * 90], ["1", "2"], k=1, max_new_tokens=8, key=key)
  with pytest.raises(ConfigError, match="k, batch and max_new_tokens"):
    difficulty.pass_rate(model, TOK, ["a"], ["1"], k=0, max_new_tokens=2, key=key)


def test_length_tokens_and_characters():
  np.testing.assert_array_equal(difficulty.length(RECORDS[:4]), [3, 1, 23, 7])
  toks = difficulty.length(RECORDS, TOK)
  assert toks.dtype == np.int64
  np.testing.assert_array_equal(toks[:4], [3, 1, 23, len("wörld 😀".encode())])
  assert toks[4] == len("hello there\n") and toks[5] == len("call so 7")          # masked span excluded
  assert difficulty.length(RECORDS[5:]) == len("call so 7")


def test_field_reads_numbers_and_names_bad_records():
  recs = [{"level": 3}, {"level": 1.5}, {"meta": {"level": 2}, "level": 0}]
  np.testing.assert_array_equal(difficulty.field(recs, "level"), [3.0, 1.5, 0.0])
  np.testing.assert_array_equal(difficulty.field([{"meta": {"level": 2}}], "meta.level"), [2.0])
  with pytest.raises(DataError, match=r"data.jsonl:7: no 'level' field"):
    difficulty.field([{"level": 1}, {"x": 1}], "level", where=["data.jsonl:3", "data.jsonl:7"])
  for bad in (True, "3", None, float("nan")):
    with pytest.raises(DataError, match="record 0: field 'level' must be a finite number"):
      difficulty.field([{"level": bad}], "level")


# --------------------------------------------------------------------------------------------- buckets

def _qcut(x: np.ndarray, b: int) -> np.ndarray:
  """pandas.qcut labels when pandas is there, else the same rule written with np.quantile."""
  try:
    import pandas as pd
  except ImportError:
    edges = np.quantile(x, np.linspace(0, 1, b + 1))
    return np.clip(np.searchsorted(edges, x, side="left") - 1, 0, b - 1)
  return np.asarray(pd.qcut(x, b, labels=False), np.int64)


@pytest.mark.parametrize("n,b", [(10, 3), (6, 4), (7, 3), (50, 5), (9, 9), (101, 10)])
def test_quantile_buckets_match_qcut_on_distinct_scores(n, b):
  x = np.random.default_rng(n * 10 + b).permutation(n).astype(np.float64) * 0.37 - 2.0
  for ties in difficulty.TIES:
    got = difficulty.quantile_buckets(x, b, ties=ties)
    np.testing.assert_array_equal(got, _qcut(x, b))
    easy_first = difficulty.quantile_buckets(x, b, higher_is_harder=False, ties=ties)
    np.testing.assert_array_equal(easy_first, _qcut(-x, b))
  counts = np.bincount(got, minlength=b)
  assert got.dtype == np.int64 and counts.max() - counts.min() <= 1


def test_quantile_buckets_hand_tables_and_ties():
  np.testing.assert_array_equal(difficulty.quantile_buckets([0, 1, 2, 3, 4, 5], 4), [0, 0, 1, 2, 3, 3])
  np.testing.assert_array_equal(difficulty.quantile_buckets([2.5], 1), [0])
  np.testing.assert_array_equal(difficulty.quantile_buckets([5, 4, 3, 2, 1, 0], 4), [3, 3, 2, 1, 0, 0])
  # Pass rates of k = 2: "order" keeps equal counts (ties in input order), "group" keeps ties together.
  pr = [1.0, 0.5, 1.0, 0.0, 0.5, 1.0]
  np.testing.assert_array_equal(difficulty.quantile_buckets(pr, 3, higher_is_harder=False), [0, 1, 0, 2, 2, 1])
  np.testing.assert_array_equal(difficulty.quantile_buckets(pr, 3, higher_is_harder=False, ties="group"),
                                [0, 1, 0, 2, 1, 0])
  same = difficulty.quantile_buckets(np.zeros(7), 3)
  np.testing.assert_array_equal(same, [0, 0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(difficulty.quantile_buckets(np.zeros(7), 3, ties="group"), np.zeros(7))


def test_quantile_buckets_errors():
  with pytest.raises(DataError, match="score 1 is nan"):
    difficulty.quantile_buckets([1.0, np.nan], 1)
  with pytest.raises(DataError, match="cannot split 2 scores into 3 buckets"):
    difficulty.quantile_buckets([1.0, 2.0], 3)
  with pytest.raises(ConfigError, match="num_buckets"):
    difficulty.quantile_buckets([1.0], 0)
  with pytest.raises(ConfigError, match="ties"):
    difficulty.quantile_buckets([1.0], 1, ties="random")


# ------------------------------------------------------------------------------------------- selection

BUCKETS = difficulty.quantile_buckets(np.random.default_rng(0).normal(size=40), 4)      # 10 per bucket


def test_select_budget_draws_from_one_bucket():
  got = difficulty.select_budget(BUCKETS, 6, 2, seed=0)
  assert got.dtype == np.int64 and len(got) == len(set(got)) == 6 and np.all(BUCKETS[got] == 2)
  assert np.all(np.diff(got) > 0)
  np.testing.assert_array_equal(got, difficulty.select_budget(BUCKETS, 6, 2, seed=0))
  assert not np.array_equal(got, difficulty.select_budget(BUCKETS, 6, 2, seed=1))
  assert set(difficulty.select_budget(BUCKETS, 3, 2, seed=0)) <= set(got)        # nested in n for one seed
  assert set(difficulty.select_budget(BUCKETS, 10, 2, seed=5)) == set(np.flatnonzero(BUCKETS == 2))
  assert difficulty.select_budget(BUCKETS, 0, 1).shape == (0,)
  with pytest.raises(DataError, match=r"bucket 3 holds 10 examples, fewer than the 11 requested") as e:
    difficulty.select_budget(BUCKETS, 11, 3)
  assert "\n" not in str(e.value)
  with pytest.raises(DataError, match="bucket 7 holds 0 examples"):
    difficulty.select_budget(BUCKETS, 1, 7)
  with pytest.raises(ConfigError):
    difficulty.select_budget(BUCKETS, -1, 0)


def test_mix_counts_largest_remainder():
  assert difficulty.mix_counts(10, [1 / 3, 1 / 3, 1 / 3]) == {0: 4, 1: 3, 2: 3}
  assert difficulty.mix_counts(7, {0: 0.5, 2: 0.5}) == {0: 4, 2: 3}
  assert difficulty.mix_counts(5, {1: 0.1, 3: 0.9}) == {1: 1, 3: 4}        # 0.5 / 4.5: the tie goes to bucket 1
  assert difficulty.mix_counts(9, [0.2, 0.3, 0.5]) == {0: 2, 1: 3, 2: 4}     # 1.8, 2.7, 4.5
  for n in range(0, 30):
    assert sum(difficulty.mix_counts(n, [0.15, 0.35, 0.2, 0.3]).values()) == n
  with pytest.raises(ConfigError, match="sums to 0.9"):
    difficulty.mix_counts(4, [0.5, 0.4])
  with pytest.raises(ConfigError, match=">= 0"):
    difficulty.mix_counts(4, [1.5, -0.5])


def test_select_mix():
  got = difficulty.select_mix(BUCKETS, 12, {0: 0.5, 3: 0.25, 1: 0.25}, seed=3)
  assert len(got) == len(set(got)) == 12 and np.all(np.diff(got) > 0)
  np.testing.assert_array_equal(np.bincount(BUCKETS[got], minlength=4), [6, 3, 0, 3])
  np.testing.assert_array_equal(got, difficulty.select_mix(BUCKETS, 12, {0: 0.5, 3: 0.25, 1: 0.25}, seed=3))
  seq = difficulty.select_mix(BUCKETS, 8, [0.25, 0.25, 0.25, 0.25], seed=0)
  np.testing.assert_array_equal(np.bincount(BUCKETS[seq], minlength=4), [2, 2, 2, 2])
  with pytest.raises(DataError, match="needs 11 of the 11 examples from bucket 0, which holds 10"):
    difficulty.select_mix(BUCKETS, 11, {0: 1.0})
