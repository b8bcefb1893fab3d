"""Rollouts: G completions per prompt, single- or multi-turn with tool calls, as right-padded training rows.

A *policy* turns a batch of contexts into continuations:
`policy(contexts: list[list[int]], key) -> (generated: list[list[int]], logps: list[np.ndarray])`, where each
generated list ends with its stop token (if one was produced) and logps are the policy's log-probabilities of
those tokens. `sampler_policy` wraps the jaxlab KV-cache sampler (`jaxlab.lm.generate`); any other engine
(vLLM, sglang-jax, a scripted test policy) fits the same protocol. With per-prompt model inputs (`prompt_inputs=`,
e.g. a VLM's images) the policy is called as `policy(contexts, key, inputs=rows)`, rows[k] (batch, ...) being
the inputs of each context's prompt.

Multi-turn: after each turn, a trajectory whose last generated token is `tool_end_id` (the close tag of a tool
call) gets an observation from the environment, `env.observe(prompt_index, call_tokens) -> tokens`, appended
to its context; the next turn continues from there. The episode ends on any other ending (answer + EOS, or the
token limit) or after `max_turns` generated turns. Observation tokens are context only: loss_mask 0.

Training rows (`RolloutBatch`): without a memory window, one row per trajectory, prompt + every turn and
observation in order, exactly the context each turn was generated from, so teacher-forced log-probs equal the
sampler's. With `memory_window = p`, each turn's context keeps only the p most recent observations (older
ones are dropped, or each replaced by the `memory_placeholder` tokens when given, e.g. one "<forgotten>" token
as in VR-Thinker's windowed visual memory; the model's own turns stay). Turns then saw different contexts, so
each turn becomes its own row (its context as seen + its tokens), and the rows of a trajectory share its
advantage (`trajectory`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Protocol, Sequence

import jax
import numpy as np

from jaxlab import mesh as mesh_lib

Policy = Callable[[list[list[int]], jax.Array], tuple[list[list[int]], list[np.ndarray]]]


class ToolEnv(Protocol):
  """An environment answering tool calls."""

  def observe(self, prompt_index: int, call_tokens: list[int]) -> list[int]:
    """The observation tokens appended after a tool call of a trajectory of prompt `prompt_index`."""


@dataclasses.dataclass
class RolloutBatch:
  """Rollouts as right-padded training rows plus per-trajectory results.

  Attributes:
    tokens: (rows, T) int32 prompt + response tokens, `pad_id` after the end.
    positions: (rows, T) int32 positions 0.. (0 on padding).
    segment_ids: (rows, T) int32 1 on real tokens, 0 on padding.
    loss_mask: (rows, T) float32 1 on generated tokens, 0 on prompt, observations and padding.
    sampler_logps: (rows, T) float32 the policy's log-probs of generated tokens (0 elsewhere).
    trajectory: (rows,) int32 trajectory of each row; trajectory k = prompt k // G, generation k % G.
    responses: per trajectory, every token after the prompt (turns and observations, in order).
    generated: per trajectory, the generated tokens only (turns concatenated).
    num_turns: (trajectories,) int32 generated turns.
    stopped: (trajectories,) bool, the last turn ended on its own (see `multi_turn`'s stop_tokens), not at the
      token limit or inside a tool call.
    turn_limited: (trajectories,) bool, the turn limit cut the episode while it was still calling tools (its
      last turn ends with the tool-call close token).
  """
  tokens: np.ndarray
  positions: np.ndarray
  segment_ids: np.ndarray
  loss_mask: np.ndarray
  sampler_logps: np.ndarray
  trajectory: np.ndarray
  responses: list[list[int]]
  generated: list[list[int]]
  num_turns: np.ndarray
  stopped: np.ndarray
  turn_limited: np.ndarray | None = None

  def __post_init__(self):
    if self.turn_limited is None:
      self.turn_limited = np.zeros(len(self.responses), bool)

  def row_inputs(self, inputs: dict[str, np.ndarray] | None, keep: Sequence[bool] | np.ndarray | None = None,
                 num_generations: int | None = None) -> dict[str, np.ndarray]:
    """Per-prompt model inputs {name: (num_prompts, ...)} expanded to the training rows (of the kept
    trajectories, in row order, as `sequences(keep)`); trajectory k belongs to prompt k // num_generations
    (default: len(responses) / num_prompts)."""
    if not inputs:
      return {}
    g = num_generations or len(self.responses) // len(next(iter(inputs.values())))
    rows = self.trajectory
    if keep is not None:
      rows = rows[np.asarray(keep, bool)[rows]]
    return {k: np.asarray(v)[rows // g] for k, v in inputs.items()}

  def sequences(self, keep: Sequence[bool] | np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, train) pairs of the rows of the kept trajectories (all by default), in row order: the real
    tokens and a bool per token, True on generated ones (`jaxlab.lm.sft_data.pad_rows` input: SFT on them
    trains on the model's tokens only, never on the prompt or an observation)."""
    keep = np.ones(len(self.responses), bool) if keep is None else np.asarray(keep, bool)
    out = []
    for r in range(self.tokens.shape[0]):
      if keep[self.trajectory[r]]:
        n = int(self.segment_ids[r].sum())
        out.append((self.tokens[r, :n].copy(), self.loss_mask[r, :n] > 0))
    return out

  def train_batch(self, advantages: Sequence[float] | np.ndarray) -> dict[str, np.ndarray]:
    """The GRPO batch: row arrays + each row's trajectory advantage ("advantages" (rows,) float32)."""
    adv = np.asarray(advantages, np.float32).reshape(-1)
    if adv.shape[0] != len(self.responses):
      raise ValueError(f"train_batch: {adv.shape[0]} advantages for {len(self.responses)} trajectories")
    return {"tokens": self.tokens, "positions": self.positions, "segment_ids": self.segment_ids,
            "loss_mask": self.loss_mask, "advantages": adv[self.trajectory]}


def decode_completion(tokenizer, ids) -> str:
  """Text of generated ids: stop token (`tokenizer.eos_id`) dropped; ids of padded vocabulary rows
  (>= tokenizer.vocab_size, e.g. a vocab rounded up to a multiple of 8 for sharding) become U+FFFD, so a sample
  that picked one is scored as wrong instead of crashing the decoder."""
  ids = [int(t) for t in ids if int(t) != tokenizer.eos_id]
  if all(t < tokenizer.vocab_size for t in ids):
    return tokenizer.decode(ids)
  return "".join(tokenizer.decode([t]) if t < tokenizer.vocab_size else "\ufffd" for t in ids)


def sampler_policy(model, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   stop_tokens: Sequence[int] = (), pad_id: int = 0, bucket: int = 16, batch_bucket: int = 1) -> Policy:
  """A policy sampling with `jaxlab.lm.generate` (KV cache, jitted while-loop decode).

  The KV cache holds the longest context rounded up to a multiple of `bucket`, plus max_new_tokens; the
  prefill is as wide as the longest context, so each distinct longest-context length compiles once.
  With a multi-device mesh in context (`jaxlab.mesh.use`), `generate` shards the batch over its data axes
  (padding a batch that does not divide; see `jaxlab.lm.sampler`). Called with per-row `inputs` (a VLM's
  images), the policy samples from `model.bind(**inputs)`, the decoder with those rows' visual tokens bound.
  With `batch_bucket` > 1 the batch is padded (copies of its last context, results dropped) to a multiple of
  it, so multi-turn rollouts, whose later turns have fewer active contexts, compile a few batch sizes only.
  """
  from jaxlab.lm.sampler import generate

  def policy(contexts: list[list[int]], key, inputs=None):
    n, m = len(contexts), model
    if inputs and not hasattr(model, "bind"):
      raise ValueError(f"sampler_policy: per-row model inputs {sorted(inputs)} need a model with bind(**inputs) "
                       f"(e.g. jaxlab.lm.vlm.VisionLM), got {type(model).__name__}")
    multiple = batch_bucket
    if inputs and mesh_lib.multi_device():            # generate pads the prompts to the data split, not the inputs
      multiple = math.lcm(multiple, mesh_lib.data_split())
    extra = -n % multiple
    contexts = list(contexts) + [contexts[-1]] * extra
    if inputs:
      m = model.bind(**{k: np.concatenate([v, np.repeat(v[-1:], extra, axis=0)]) for k, v in inputs.items()})
    longest = max(len(c) for c in contexts)
    cache = -(-longest // bucket) * bucket + max_new_tokens
    out = generate(m, contexts, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   stop_tokens=stop_tokens, pad_id=pad_id, key=key, max_len=cache)
    toks, lens, lps = jax.device_get((out.tokens, out.lengths, out.logprobs))
    return ([[int(t) for t in toks[i, :lens[i]]] for i in range(n)],
            [np.asarray(lps[i, :lens[i]], np.float32) for i in range(n)])

  return policy


def multi_turn(policy: Policy, prompts: Sequence[Sequence[int]], num_generations: int, *, key: jax.Array,
               env: ToolEnv | None = None, max_turns: int = 1, tool_end_id: int | None = None,
               memory_window: int | None = None, memory_placeholder: Sequence[int] | None = None,
               width: int | None = None, pad_id: int = 0, stop_tokens: Sequence[int] = (),
               prompt_inputs: dict[str, np.ndarray] | None = None) -> RolloutBatch:
  """Rolls out G trajectories per prompt, with tool turns when `env` is given.

  Args:
    policy: see the module docstring.
    prompts: prompt token lists (each >= 1 token).
    num_generations: G trajectories per prompt (consecutive: trajectory k belongs to prompt k // G).
    key: PRNG key; turn t uses fold_in(key, t), so a rollout is reproducible given the key.
    env: answers tool calls (needed when max_turns > 1).
    max_turns: most generated turns per trajectory (1 = single turn).
    tool_end_id: token that closes a tool call and hands control to `env`.
    memory_window: keep only this many most recent observations in later contexts (None = all).
    memory_placeholder: with a memory window, tokens standing in for each forgotten observation (context
      only); None drops forgotten observations.
    width: row width T (default: the longest row); a row longer than `width` raises ValueError.
    pad_id: padding token.
    stop_tokens: the policy's stop tokens; when given, a trajectory counts as stopped only if its last turn
      ends with one of them (otherwise it hit the token limit). Without them, any last turn that does not
      end with tool_end_id counts as stopped.
    prompt_inputs: per-prompt extra model inputs {name: (num_prompts, ...)} (e.g. a VLM's images), handed to the
      policy row by row (`policy(contexts, key, inputs=...)`); training rows take them from
      `RolloutBatch.row_inputs`.

  Returns:
    RolloutBatch.
  """
  if num_generations < 1 or max_turns < 1:
    raise ValueError(f"num_generations and max_turns must be >= 1, got {num_generations}, {max_turns}")
  if max_turns > 1 and (env is None or tool_end_id is None):
    raise ValueError("multi_turn: max_turns > 1 needs env= (answers tool calls) and tool_end_id=")
  if memory_window is not None and memory_window < 0:
    raise ValueError(f"memory_window must be >= 0 or None, got {memory_window}")
  if memory_placeholder is not None and memory_window is None:
    raise ValueError("multi_turn: memory_placeholder needs a memory_window (the number of observations kept)")
  placeholder = [int(t) for t in memory_placeholder] if memory_placeholder is not None else []
  prompts = [list(map(int, p)) for p in prompts]
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("multi_turn: need at least one prompt, each with >= 1 token")
  for k, v in (prompt_inputs or {}).items():
    if len(v) != len(prompts):
      raise ValueError(f"multi_turn: prompt_inputs[{k!r}] has {len(v)} rows for {len(prompts)} prompts")
  n = len(prompts) * num_generations
  hist: list[list[tuple[str, list[int], np.ndarray | None]]] = [[] for _ in range(n)]
  turn_rows: list[tuple[int, list[int], list[int], np.ndarray]] = []
  active = np.ones(n, bool)
  stopped = np.zeros(n, bool)
  cut = np.zeros(n, bool)
  num_turns = np.zeros(n, np.int32)

  def visible(segs):
    obs_idx = [j for j, s in enumerate(segs) if s[0] == "obs"]
    if memory_window is None:
      drop = set()
    else:
      drop = set(obs_idx[:len(obs_idx) - memory_window]) if memory_window < len(obs_idx) else set()
    return [t for j, s in enumerate(segs) for t in (placeholder if j in drop else s[1])]

  for turn in range(max_turns):
    idx = np.flatnonzero(active)
    if idx.size == 0:
      break
    contexts = [prompts[i // num_generations] + visible(hist[i]) for i in idx]
    if prompt_inputs:
      rows_in = {k: np.asarray(v)[idx // num_generations] for k, v in prompt_inputs.items()}
      gens, lps = policy(contexts, jax.random.fold_in(key, turn), inputs=rows_in)
    else:
      gens, lps = policy(contexts, jax.random.fold_in(key, turn))
    if len(gens) != len(idx) or len(lps) != len(idx):
      raise ValueError(f"policy returned {len(gens)} continuations for {len(idx)} contexts")
    for j, i in enumerate(idx):
      g, lp = list(map(int, gens[j])), np.asarray(lps[j], np.float32).reshape(-1)
      if lp.shape[0] != len(g):
        raise ValueError(f"policy returned {lp.shape[0]} log-probs for {len(g)} tokens")
      hist[i].append(("gen", g, lp))
      turn_rows.append((int(i), contexts[j], g, lp))
      num_turns[i] += 1
      if tool_end_id is not None and g and g[-1] == tool_end_id and turn < max_turns - 1:
        obs = [int(t) for t in env.observe(int(i) // num_generations, g)]
        hist[i].append(("obs", obs, None))
      else:
        active[i] = False
        ends = g[-1] in stop_tokens if stop_tokens else tool_end_id is None or g[-1] != tool_end_id
        stopped[i] = bool(g) and ends
        cut[i] = bool(g) and tool_end_id is not None and g[-1] == tool_end_id
  rows = []   # (trajectory, tokens, mask, logps)
  if memory_window is None:
    for i in range(n):
      toks = list(prompts[i // num_generations])
      mask, lp = [0.0] * len(toks), [0.0] * len(toks)
      for kind, t, l in hist[i]:
        toks += t
        mask += [1.0 if kind == "gen" else 0.0] * len(t)
        lp += list(l) if kind == "gen" else [0.0] * len(t)
      rows.append((i, toks, mask, lp))
  else:
    for i, ctx, g, l in turn_rows:
      rows.append((i, ctx + g, [0.0] * len(ctx) + [1.0] * len(g), [0.0] * len(ctx) + list(l)))
  longest = max(len(r[1]) for r in rows)
  width = longest if width is None else int(width)
  if longest > width:
    raise ValueError(f"a rollout row has {longest} tokens > width={width}; raise the width (prompt + turns)")
  m = len(rows)
  out = dict(tokens=np.full((m, width), pad_id, np.int32), positions=np.zeros((m, width), np.int32),
             segment_ids=np.zeros((m, width), np.int32), loss_mask=np.zeros((m, width), np.float32),
             sampler_logps=np.zeros((m, width), np.float32))
  for r, (_, toks, mask, lp) in enumerate(rows):
    k = len(toks)
    out["tokens"][r, :k] = toks
    out["positions"][r, :k] = np.arange(k)
    out["segment_ids"][r, :k] = 1
    out["loss_mask"][r, :k] = mask
    out["sampler_logps"][r, :k] = lp
  return RolloutBatch(**out, trajectory=np.asarray([r[0] for r in rows], np.int32),
                      responses=[[t for _, s, _ in hist[i] for t in s] for i in range(n)],
                      generated=[[t for kind, s, _ in hist[i] if kind == "gen" for t in s] for i in range(n)],
                      num_turns=num_turns, stopped=stopped, turn_limited=cut)


def single_turn(model_or_policy: Any, prompts: Sequence[Sequence[int]], num_generations: int, *, key: jax.Array,
                max_new_tokens: int = 64, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                stop_tokens: Sequence[int] = (), pad_id: int = 0, width: int | None = None) -> RolloutBatch:
  """G sampled completions per prompt (one turn): `multi_turn` with max_turns=1.

  Args:
    model_or_policy: a `jaxlab.lm.Transformer` (sampled with `sampler_policy`) or a policy callable.
    prompts, num_generations, key, width, pad_id: as in `multi_turn`.
    max_new_tokens, temperature, top_k, top_p, stop_tokens: sampling settings (`sampler_policy`; the mesh
      comes from the context).
  """
  policy = model_or_policy
  if not _is_policy(model_or_policy):
    policy = sampler_policy(model_or_policy, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            stop_tokens=stop_tokens, pad_id=pad_id)
  return multi_turn(policy, prompts, num_generations, key=key, max_turns=1, width=width, pad_id=pad_id,
                    stop_tokens=stop_tokens)


def _is_policy(obj) -> bool:
  """A policy callable, as opposed to a model to sample from (a `Transformer`, a `VisionLM`: NNX modules)."""
  from flax import nnx
  return callable(obj) and not isinstance(obj, nnx.Module)
