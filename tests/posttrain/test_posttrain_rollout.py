"""Rollouts (single/multi-turn, tool observations masked, memory window), sampler/teacher-forcing log-prob
parity, reproducibility given a key, rejection sampling, and a GRPO step sharded (4x2) == single device."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxlab import mesh as mesh_lib
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.lm.tokenizer import ByteTokenizer
from jaxlab.posttrain import rewards
from jaxlab.posttrain.grpo import GRPOConfig, make_grpo_loss_fn, per_token_logps
from jaxlab.posttrain.rft import rejection_sample
from jaxlab.posttrain.rollout import multi_turn, sampler_policy, single_turn
from jaxlab.state import ModelDef, create_train_state
from jaxlab.train import step as step_lib

V = 24
CALL, END, OBS, EOS, PAD = 20, 21, 22, 23, 0


def _model(seed=0, vocab=V):
  cfg = TransformerConfig(vocab_size=vocab, hidden=16, n_layers=1, n_heads=2, mlp_hidden=32, max_position=96,
                          init_std=0.5)
  return Transformer(cfg, rngs=nnx.Rngs(seed))


def test_sampler_logps_equal_teacher_forced_logps():
  model = _model()
  prompts = [[1, 2, 3], [4, 5], [6]]
  roll = single_turn(model, prompts, 3, key=jax.random.key(0), max_new_tokens=10, temperature=1.0,
                     stop_tokens=(EOS,), pad_id=PAD)
  assert roll.tokens.shape[0] == 9 and list(roll.trajectory) == list(range(9))
  lp = np.asarray(per_token_logps(model, roll.tokens, roll.positions, roll.segment_ids))
  on = roll.loss_mask > 0
  assert on.sum() == sum(len(g) for g in roll.generated) > 0
  np.testing.assert_allclose(lp[on], roll.sampler_logps[on], atol=2e-5)
  for k in range(9):                                   # rows: prompt, then the generated tokens, then padding
    p = prompts[k // 3]
    n = len(p) + len(roll.generated[k])
    assert list(roll.tokens[k, :len(p)]) == p and list(roll.tokens[k, len(p):n]) == roll.generated[k]
    assert np.all(roll.loss_mask[k, :len(p)] == 0) and np.all(roll.segment_ids[k, n:] == 0)


class _ScriptedPolicy:
  """Calls a tool on the first two turns (token 10 + turn), then answers; records every context it saw."""

  def __init__(self):
    self.seen = []

  def __call__(self, contexts, key):
    self.seen.append([list(c) for c in contexts])
    salt = int(jax.random.randint(key, (), 0, 3))
    out = []
    for c in contexts:
      turn = sum(t == CALL for t in c)
      out.append([CALL, 10 + turn + salt, END] if turn < 2 else [5, EOS])
    return out, [np.full(len(o), -0.5, np.float32) for o in out]


class _Env:
  def observe(self, prompt_index, call_tokens):
    return [OBS, 30 + prompt_index, call_tokens[1], OBS]


def test_multi_turn_masks_observations_and_keeps_order():
  pol = _ScriptedPolicy()
  roll = multi_turn(pol, [[1, 2], [3]], 2, key=jax.random.key(1), env=_Env(), max_turns=5, tool_end_id=END,
                    pad_id=PAD)
  assert list(roll.num_turns) == [3, 3, 3, 3] and roll.stopped.all()
  k = 2                                                 # prompt 1, first generation
  toks = roll.tokens[k][roll.segment_ids[k] > 0].tolist()
  mask = roll.loss_mask[k][roll.segment_ids[k] > 0].tolist()
  s, u = toks[2], toks[9]                              # the (key-salted) tool arguments of turns 0 and 1
  assert 10 <= s <= 12 and 11 <= u <= 13
  assert toks == [3, CALL, s, END, OBS, 31, s, OBS, CALL, u, END, OBS, 31, u, OBS, 5, EOS]
  assert mask == [0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1]
  assert roll.generated[k] == [CALL, s, END, CALL, u, END, 5, EOS]
  assert roll.responses[k] == toks[1:]
  np.testing.assert_allclose(roll.sampler_logps[k][roll.loss_mask[k] > 0], -0.5)


def test_stopped_means_a_stop_token_ended_the_trajectory():
  """With stop tokens, a trajectory that ran into the token limit is not "stopped" (it was truncated)."""
  def scripted(contexts, key):
    del key
    gens = [[5, 6, 7] if i % 2 else [5, EOS] for i in range(len(contexts))]
    return gens, [np.zeros(len(g), np.float32) for g in gens]

  roll = single_turn(scripted, [[1, 2]], 4, key=jax.random.key(0), stop_tokens=(EOS,))
  assert list(roll.stopped) == [True, False, True, False]
  assert single_turn(scripted, [[1, 2]], 4, key=jax.random.key(0)).stopped.all()   # no stop tokens given


def test_encode_prompt_adds_bos_only_when_the_tokenizer_has_one():
  from jaxlab.lm import sft_data
  tok = ByteTokenizer()
  assert sft_data.encode_prompt("ab", tok) == [tok.bos_id] + tok.encode("ab")
  assert sft_data.encode_prompt("ab", tok, add_bos=False) == tok.encode("ab")

  class NoBos:
    bos_id = None
    encode = staticmethod(tok.encode)
  assert sft_data.encode_prompt("ab", NoBos()) == tok.encode("ab")


def test_memory_window_drops_old_observations():
  pol = _ScriptedPolicy()
  roll = multi_turn(pol, [[1, 2]], 1, key=jax.random.key(1), env=_Env(), max_turns=5, tool_end_id=END,
                    memory_window=1, pad_id=PAD)
  third = pol.seen[2][0]
  assert third.count(OBS) == 2 and third.count(CALL) == 2     # one observation (2 markers) but both calls
  assert roll.tokens.shape[0] == 3 and list(roll.trajectory) == [0, 0, 0]   # one row per turn
  batch = roll.train_batch([0.7])
  np.testing.assert_allclose(batch["advantages"], [0.7, 0.7, 0.7])
  with pytest.raises(ValueError, match="advantages"):
    roll.train_batch([0.1, 0.2])


def test_turn_limit_and_argument_errors():
  roll = multi_turn(_ScriptedPolicy(), [[1]], 1, key=jax.random.key(0), env=_Env(), max_turns=2, tool_end_id=END)
  assert list(roll.num_turns) == [2] and not roll.stopped[0]   # still calling a tool when the limit hit
  with pytest.raises(ValueError, match="env"):
    multi_turn(_ScriptedPolicy(), [[1]], 1, key=jax.random.key(0), max_turns=2)
  with pytest.raises(ValueError, match="width"):
    multi_turn(_ScriptedPolicy(), [[1]], 1, key=jax.random.key(0), env=_Env(), max_turns=3, tool_end_id=END,
               width=4)


def test_real_model_rollouts_with_tools_are_reproducible_given_the_key():
  model = _model(1)
  pol = sampler_policy(model, 6, temperature=1.0, stop_tokens=(EOS, END), pad_id=PAD)

  def run(seed):
    return multi_turn(pol, [[1, 2, 3], [4]], 2, key=jax.random.key(seed), env=_Env(), max_turns=3,
                      tool_end_id=END, pad_id=PAD)

  a, b, c = run(0), run(0), run(1)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
  assert not np.array_equal(a.tokens, c.tokens)
  lp = np.asarray(per_token_logps(model, a.tokens, a.positions, a.segment_ids))
  on = a.loss_mask > 0
  np.testing.assert_allclose(lp[on], a.sampler_logps[on], atol=2e-5)   # observations do not break parity


def test_rejection_sample_keeps_rewarded_completions():
  tok = ByteTokenizer(extra_specials=("<think>", "</think>", "<answer>", "</answer>"))

  def policy(contexts, key):
    outs = []
    for i, c in enumerate(contexts):
      text = "<think>x</think><answer>" + ("4" if i % 2 == 0 else "5") + "</answer>"
      outs.append(tok.encode(text) + [tok.eos_id])
    return outs, [np.zeros(len(o), np.float32) for o in outs]

  recs, stats = rejection_sample(policy, ["2+2=", "1+3="], ["4", "4"], tok, rewards.answer_reward, k=4,
                                 key=jax.random.key(0), max_new_tokens=30)
  assert stats["sampled"] == 8 and stats["prompts_covered"] == 2
  assert [r["prompt"] for r in recs] == ["2+2=", "1+3="]              # deduplicated: one distinct per prompt
  assert all(r["completion"].endswith("<answer>4</answer>") for r in recs)


def test_grpo_step_sharded_equals_single_device():
  cfg = TransformerConfig(vocab_size=V, hidden=16, n_layers=1, n_heads=2, mlp_hidden=32, max_position=32)
  md = ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))
  rng = np.random.default_rng(0)
  b, t = 16, 12
  batch = {"tokens": rng.integers(1, V, (b, t)).astype(np.int32),
           "positions": np.tile(np.arange(t, dtype=np.int32), (b, 1)), "segment_ids": np.ones((b, t), np.int32),
           "loss_mask": (np.arange(t)[None] >= 4).astype(np.float32) * (rng.random((b, t)) < 0.9),
           "advantages": rng.normal(size=b).astype(np.float32), "ref_logps": -rng.random((b, t)).astype(np.float32),
           "old_logps": -rng.random((b, t)).astype(np.float32)}
  gcfg = GRPOConfig(num_generations=4, num_iterations=2, beta=0.05, kl_loss_mode="k3")
  tx = optax.adam(1e-2)
  rules = mesh_lib.RULES["tensor_parallel"]
  out = {}
  for label, shape in (("sharded", (("data", 4), ("model", 2))), ("single", (("data", 1), ("model", 1)))):
    mesh = mesh_lib.make_mesh(shape, jax.devices()[:8] if label == "sharded" else jax.devices()[:1])
    state, sh = create_train_state(md, tx, mesh, rules, 0)
    bsh = mesh_lib.batch_sharding(mesh, rules)
    step = step_lib.make_train_step(md, make_grpo_loss_fn(gcfg, 0.8), tx, lambda s: 1e-2, sh, bsh)
    state, m = step(state, jax.device_put(batch, bsh))
    state, m = step(state, jax.device_put(batch, bsh))
    out[label] = (jax.device_get(m), jax.device_get(state.params))
  value = lambda m: getattr(m, "value", m)  # noqa: E731  (train metrics may come as jaxlab.metrics.Weighted)
  for k in ("train/loss", "train/kl", "train/ratio", "train/entropy"):
    np.testing.assert_allclose(value(out["sharded"][0][k]), value(out["single"][0][k]), rtol=1e-5, err_msg=k)
  jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5), out["sharded"][1],
               out["single"][1])
