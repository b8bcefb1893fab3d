"""The library trainers and evaluation: a scripted two-turn tool environment trains end to end with GRPO and
resumes bit-identically after SIGTERM mid-run; RFT keeps rewarded multi-turn rollouts and trains on the
model's tokens only; loss masks of a hand-built episode; the memory window's context bound (property test);
pass@k against brute force; majority vote; per-dimension and answer-only rewards."""

import itertools
import math
import os
import signal
from unittest import mock

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from flax import nnx

from jaxlab import configs, mesh as mesh_lib, metrics
from jaxlab.errors import ConfigError, Preempted
from jaxlab.lm import sft_data
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.posttrain import evaluate, rewards, trainers
from jaxlab.posttrain.grpo import GRPOConfig
from jaxlab.posttrain.rollout import multi_turn
from jaxlab.state import ModelDef

V = 16
BOS, CALL, END, OBS, EOS, PAD = 1, 10, 11, 12, 13, 0


class _Tok:
  """Token ids as text: "3 4 5" (decode_completion drops EOS)."""
  vocab_size, eos_id, pad_id, bos_id = V, EOS, PAD, BOS

  def decode(self, ids):
    return " ".join(str(int(t)) for t in ids)


class _LookupEnv:
  """A tool call CALL x END is answered with OBS (x + prompt) % 8 + 2 OBS."""

  def observe(self, prompt_index, call_tokens):
    x = call_tokens[-2] if len(call_tokens) >= 2 else 0
    return [OBS, (int(x) + prompt_index) % 8 + 2, OBS]


def _reward_used_tool(texts, problems):
  """1 when the episode called the tool and then ended with the problem's answer token."""
  del problems
  return np.asarray([float(str(CALL) in t.split() and t.split()[-1:] != [str(END)]) for t in texts], np.float32)


def _config(**train):
  c = configs.base_config()
  c.mesh = (("data", 1), ("model", 1))
  c.train = configs.train_config(batch_size=2, num_steps=3, log_every=1, checkpoint_every=1, keep_checkpoints=5,
                                 async_checkpoint=False, optimizer=dict(name="adamw", learning_rate=1e-2,
                                                                         schedule="constant", warmup_steps=0))
  c.train.update(train)
  c = configs.finalize(c)
  configs.set_experiment_name(c, "posttrain_test")
  return c


def _modeldef():
  cfg = TransformerConfig(vocab_size=V, hidden=16, n_layers=1, n_heads=2, mlp_hidden=32, max_position=64,
                          init_std=0.5)
  return ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))


SPEC = trainers.RolloutSpec(num_generations=4, max_new_tokens=4, temperature=1.0, stop_tokens=(EOS,), pad_id=PAD,
                            env=_LookupEnv(), max_turns=2, tool_end_id=END, memory_window=1,
                            memory_placeholder=(OBS,), width=24)
PROMPTS = [[BOS, 2], [BOS, 3], [BOS, 4]]


def _grpo(workdir):
  md = _modeldef()
  params, _ = md.init(jax.random.key(0))
  reward = rewards.CompositeReward.of([("tool", _reward_used_tool, 1.0)])
  mesh = mesh_lib.make_mesh((("data", 1), ("model", 1)))
  with mesh_lib.use(mesh):
    state = trainers.grpo(_config(), str(workdir), md, params, PROMPTS, [{}] * 3, reward, _Tok(),
                          gcfg=GRPOConfig(num_generations=4, beta=0.04, num_iterations=2), spec=SPEC,
                          key=jax.random.key(5))
  return jax.device_get(state.params)


def test_two_turn_tool_grpo_trains_and_resumes_bit_identically_after_sigterm(tmp_path):
  ref = _grpo(tmp_path / "ref")
  rows = metrics.read_metrics(str(tmp_path / "ref"))
  assert [r["step"] for r in rows] == [1, 2, 3]
  for key in ("rollout/tool", "rollout/turns", "rollout/turn_limited", "rollout/truncated", "train/loss"):
    assert all(np.isfinite(r[key]) for r in rows), key
  assert any(r["rollout/turns"] > 1 for r in rows)          # some episodes did call the tool
  real_write = metrics.MetricWriter.write

  def write(self, step, values):
    real_write(self, step, values)
    if step == 2 and "rollout/tool" in values:
      os.kill(os.getpid(), signal.SIGTERM)
  with mock.patch.object(metrics.MetricWriter, "write", write), pytest.raises(Preempted):
    _grpo(tmp_path / "cut")
  again = _grpo(tmp_path / "cut")
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)
  assert [r["step"] for r in metrics.read_metrics(str(tmp_path / "cut"))] == [1, 2, 3]


class _Scripted:
  """Turn 0: CALL <prompt token> END; turn 1: the observed value, then EOS. Records contexts."""

  def __init__(self):
    self.seen = []

  def __call__(self, contexts, key):
    del key
    self.seen.append([list(c) for c in contexts])
    out = []
    for c in contexts:
      out.append([CALL, c[1], END] if CALL not in c else [c[-2] if c[-1] == OBS else 5, EOS])
    return out, [np.full(len(o), -0.25, np.float32) for o in out]


def test_hand_built_episode_masks_exactly_the_model_tokens_and_rft_trains_on_them(tmp_path):
  roll = multi_turn(_Scripted(), [[BOS, 3]], 1, key=jax.random.key(0), env=_LookupEnv(), max_turns=2,
                    tool_end_id=END, stop_tokens=(EOS,), pad_id=PAD)
  n = int(roll.segment_ids[0].sum())
  obs = (3 + 0) % 8 + 2
  assert roll.tokens[0, :n].tolist() == [BOS, 3, CALL, 3, END, OBS, obs, OBS, obs, EOS]
  assert roll.loss_mask[0, :n].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 1, 1]
  (ids, train), = roll.sequences()
  assert train.tolist() == [bool(x) for x in roll.loss_mask[0, :n]]
  rows = sft_data.pad_rows(roll.sequences(), 12, PAD)           # targets trained = the model's tokens
  assert rows["targets"][0][rows["loss_mask"][0] > 0].tolist() == [CALL, 3, END, obs, EOS]

  # RFT keeps the rewarded episodes (the second prompt's are filtered out) and fine-tunes on their rows.
  md = _modeldef()
  params, _ = md.init(jax.random.key(0))
  spec = trainers.RolloutSpec(num_generations=2, max_new_tokens=4, stop_tokens=(EOS,), pad_id=PAD,
                              env=_LookupEnv(), max_turns=2, tool_end_id=END, width=16)
  reward = rewards.CompositeReward.of([("tool", _reward_used_tool, 1.0)])
  mesh = mesh_lib.make_mesh((("data", 1), ("model", 1)))
  with mesh_lib.use(mesh):
    new, stats = trainers.rejection_finetune(
        _config(), str(tmp_path / "rft"), _Scripted(), md, [[BOS, 3], [BOS, 4]], [{"ok": 1}, {"ok": 0}], reward,
        _Tok(), spec=spec, key=jax.random.key(1), seq_len=12, num_steps=2, learning_rate=1e-2, batch_size=1,
        keep=lambda texts, probs: np.asarray([p["ok"] for p in probs], bool), init_params=params)
  assert stats == {"kept": 1, "sampled": 4, "prompts_covered": 1, "reward_mean": 1.0, "rows": 1}   # deduped
  assert metrics.read_json(str(tmp_path / "rft" / "rft_stats.json")) == stats
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new)))


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(obs_lens=st.lists(st.integers(1, 5), min_size=1, max_size=6), window=st.integers(0, 3),
                  placeholder=st.booleans(), prompt_len=st.integers(1, 4))
def test_memory_window_bounds_every_context(obs_lens, window, placeholder, prompt_len):
  """Turn t's context = prompt + every earlier turn + the `window` most recent observations in full + one
  placeholder per older one: never more observation tokens than the window's."""
  turns = len(obs_lens) + 1
  seen = []

  def policy(contexts, key):
    del key
    seen.append(list(contexts[0]))
    return [[CALL, END]], [np.zeros(2, np.float32)]

  class Env:
    def __init__(self):
      self.k = 0

    def observe(self, prompt_index, call_tokens):
      tokens = [100 + self.k] * obs_lens[self.k]            # observation k: its own token, obs_lens[k] times
      self.k += 1
      return tokens
  ph = (OBS,) if placeholder else None
  multi_turn(policy, [[BOS] * prompt_len], 1, key=jax.random.key(0), env=Env(), max_turns=turns, tool_end_id=END,
             memory_window=window, memory_placeholder=ph)
  assert len(seen) == turns
  for t, ctx in enumerate(seen):
    older = max(0, t - window)
    kept = obs_lens[older:t]
    assert sum(1 for x in ctx if x >= 100) == sum(kept) <= window * max(obs_lens)
    assert {x - 100 for x in ctx if x >= 100} == set(range(older, t))
    assert len(ctx) == prompt_len + 2 * t + sum(kept) + (older if placeholder else 0)


def test_pass_at_k_equals_brute_force_and_majority_vote():
  for n in range(1, 8):
    for c in range(n + 1):
      for k in range(1, n + 1):
        subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert evaluate.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
        assert evaluate.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
  with pytest.raises(ValueError, match="k <= n"):
    evaluate.pass_at_k(3, 1, 4)
  answers = [["4", "5", "4", None], [None, None], ["1", "2"], ["7"]]
  want = {0: "4", 1: "x", 2: "1", 3: "8"}
  # prompt 0: "4" wins; 1: no valid answer; 2: a tie goes to the first seen ("1"); 3: wrong
  assert evaluate.majority_vote(answers, lambda p, a: want[p] == a) == pytest.approx(2 / 4)


def test_per_dimension_answer_only_and_weighted_format_rewards():
  texts = ["<think>x</think><answer>TA: 1, VQ: 2; MQ: 0\nOA: 1</answer>", "<answer>TA: 1, OA: 2</answer>",
           "TA: 1"]
  refs = [{"labels": {"TA": 1, "VQ": 2, "MQ": 1, "OA": 1}}] * 3
  comp = rewards.CompositeReward.of([*[(n, f, 0.25) for n, f in rewards.dimension_rewards(("TA", "VQ", "MQ", "OA"))],
                                     ("format", rewards.weighted_format_reward(0.1, -0.5), 1.0)])
  got = comp.components(texts, refs)
  np.testing.assert_allclose(got, [[1, 1, 0, 1, 0.1], [0, 0, 0, 0, -0.5], [0, 0, 0, 0, -0.5]], rtol=1e-6)
  answer_only = dict(rewards.dimension_rewards(("TA", "OA"), parse=rewards.parse_answer_only))
  np.testing.assert_array_equal(answer_only["acc_TA"](texts, refs), [0, 1, 0])
  np.testing.assert_array_equal(rewards.answer_reward(["<answer> 7 </answer>", "<think>a</think><answer>7</answer>"],
                                                      ["7", "7"], parse=rewards.parse_answer_only), [1, 0])
  np.testing.assert_array_equal(rewards.format_reward(["<answer>1</answer>"], parse=rewards.parse_answer_only), [1])


def test_rollout_spec_errors():
  with pytest.raises(ConfigError, match="env"):
    trainers.RolloutSpec(max_turns=2)
  with pytest.raises(ConfigError, match="width"):
    trainers.RolloutSpec(max_turns=2, env=_LookupEnv(), tool_end_id=END)
  with pytest.raises(ValueError, match="memory_window"):
    multi_turn(_Scripted(), [[BOS, 3]], 1, key=jax.random.key(0), memory_placeholder=(OBS,))


def test_sampled_eval_reports_accuracy_pass_at_k_and_majority():
  """A scripted sampler with a fixed table of answers per prompt; the correct answer is "2"."""
  table = {0: [2, 2, 2, 2], 1: [2, 3, 2, 3], 3: [3, 2, 3, 4]}

  def policy(contexts, key):
    del key
    counter = {}
    out = []
    for c in contexts:
      p = c[1]
      j = counter.get(p, 0)
      counter[p] = j + 1
      out.append([table[p][j], EOS])
    return out, [np.zeros(2, np.float32) for _ in out]

  tok = _Tok()
  prompts = [[BOS, 0], [BOS, 1], [BOS, 3]]
  correct = lambda texts, refs: np.asarray([t == "2" for t in texts], np.float32)
  got = evaluate.sampled_eval(policy, tok, prompts, [None] * 3, correct=correct, extract=lambda t: t, samples=4,
                              ks=(1, 2), key=jax.random.key(0), max_new_tokens=2, valid=correct)
  assert got["sampled_acc"] == pytest.approx((4 + 2 + 1) / 12)
  assert got["pass@1"] == pytest.approx((1 + 0.5 + 0.25) / 3)
  assert got["pass@2"] == pytest.approx((1 + (1 - 1 / 6) + (1 - 3 / 6)) / 3)
  assert got["maj@4"] == pytest.approx(2 / 3)   # "2"; a 2-2 tie goes to the first seen ("2"); "3" is wrong
  assert got["length"] == 2.0 and got["format"] == pytest.approx(7 / 12)


def test_micro_batched_grpo_takes_the_same_first_update(tmp_path):
  """grpo.micro_batches = 2 on a 2-way data split: rows padded to a multiple of 4, the reference / old-policy
  passes and the update micro-batched; step 1 (same rollouts) has the one-pass loss and gradient norm."""
  md = _modeldef()
  reward = rewards.CompositeReward.of([("tool", _reward_used_tool, 1.0)])
  rows = {}
  for micro in (1, 2):
    params, _ = md.init(jax.random.key(0))
    mesh = mesh_lib.make_mesh((("data", 2), ("model", 1)), jax.devices()[:2])
    c = _config(num_steps=micro)                 # the one-pass reference is compared at step 1 only
    c.mesh = (("data", 2), ("model", 1))
    with mesh_lib.use(mesh):
      trainers.grpo(c, str(tmp_path / str(micro)), md, params, PROMPTS, [{}] * 3, reward, _Tok(),
                    gcfg=GRPOConfig(num_generations=4, beta=0.04, num_iterations=2, micro_batches=micro),
                    spec=SPEC, key=jax.random.key(5))
    rows[micro] = metrics.read_metrics(str(tmp_path / str(micro)))
  assert [r["step"] for r in rows[2]] == [1, 2]
  for key in ("train/loss", "train/grad_norm", "train/kl"):
    np.testing.assert_allclose(rows[2][0][key], rows[1][0][key], rtol=1e-4, atol=1e-6)
  assert all(np.isfinite(r["train/loss"]) for r in rows[2])
