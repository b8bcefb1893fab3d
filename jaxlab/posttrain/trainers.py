"""Post-training trainers: cold-start SFT -> rejection-sampling fine-tuning (RFT) -> GRPO, single- or multi-turn.

Each trainer is a thin function over the shared loops, so every run resumes exactly like the others
(checkpoints, metrics.jsonl, summary.json, progress bar, Ctrl-C / SIGTERM saves and stops):

* `sft(config, workdir, modeldef, rows, ...)`: masked SFT on `jaxlab.train.fit` over rows built by
  `jaxlab.lm.sft_data` (`build_padded` of prompt / completion records, or `pad_rows` of token sequences,
  e.g. `RolloutBatch.sequences()`), with optional parameter EMA and an early stop checked every
  `stop_every` steps (a `fit` hook: the stop survives resume).
* `rejection_finetune(...)`: samples k rollouts per prompt (`RolloutSpec`, tool turns included), keeps those
  whose reward reaches a threshold, that stopped on their own and that pass an optional filter (e.g. a
  correct judgement), then SFT on the kept token rows with the loss on the model's own tokens only (prompts
  and observations are context); the selection statistics go to `workdir/rft_stats.json`.
* `grpo(...)`: GRPO on `jaxlab.train.run_loop` with Tunix semantics (`GRPOConfig`: group advantages, clipped
  ratio, KL to a reference, loss aggregation, num_iterations > 1 with the old log-probs), rollouts from
  `RolloutSpec` (multi-turn with a `ToolEnv`, a turn limit and a memory window), rewards from a
  `CompositeReward` (each component logged as `rollout/<name>`), optionally shuffled across the batch (the
  no-signal control). Metrics: rollout/reward, reward_std, <component>, length, truncated (1 - stopped), and
  with tools rollout/turns and rollout/turn_limited (episodes the turn limit cut inside a tool call).

Batches and rollout keys are functions of (seed, step) only, so a resumed run equals an uninterrupted one.
The library's trainers take the run's config for its `train` section (optimizer, num_steps, batch_size,
checkpointing) and its mesh; the method's settings come as arguments.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab import configs, mesh as mesh_lib, metrics
from jaxlab.data import ArraySource
from jaxlab.errors import ConfigError
from jaxlab.lm import sft as sft_lib
from jaxlab.lm import sft_data
from jaxlab.posttrain.advantages import multi_reward_advantages
from jaxlab.posttrain.grpo import GRPOConfig, make_grpo_loss_fn, make_logps_fn, model_inputs
from jaxlab.posttrain.rewards import CompositeReward
from jaxlab.posttrain.rollout import (RolloutBatch, ToolEnv, _is_policy, decode_completion, multi_turn,
                                      sampler_policy)
from jaxlab.state import ModelDef, create_train_state, param_count
from jaxlab.train import accumulate, fit, optim, run_loop


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
  """How a policy is sampled (GRPO, RFT): `jaxlab.posttrain.rollout.multi_turn` settings.

  Attributes:
    num_generations: G rollouts per prompt.
    max_new_tokens: tokens per turn.
    temperature, top_k, top_p: sampling settings of the KV-cache sampler.
    stop_tokens: the sampler's stop tokens (e.g. (eos_id,)); a rollout counts as stopped when one ends it. With
      several turns, sampling also stops at tool_end_id (the turn hands over to the environment).
    pad_id: padding token.
    env: a `ToolEnv` answering tool calls (needed with max_turns > 1).
    max_turns: the turn limit.
    tool_end_id: the token closing a tool call.
    memory_window: observations kept in later contexts (None = all).
    memory_placeholder: tokens standing in for each forgotten observation (None = drop them).
    width: training-row width (default: the longest prompt + max_new_tokens with one turn; required with
      several turns, whose observations have no known bound).
    batch_bucket: the sampler's batch is padded to a multiple of this (fewer compiled shapes over turns).
    row_bucket: GRPO's training rows are padded to a multiple of this with empty rows (no loss tokens, so the
      loss is unchanged): with a memory window the number of rows (one per turn) varies from step to step,
      and every new count would compile the update again.
  """
  num_generations: int = 8
  max_new_tokens: int = 64
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  stop_tokens: tuple[int, ...] = ()
  pad_id: int = 0
  env: ToolEnv | None = None
  max_turns: int = 1
  tool_end_id: int | None = None
  memory_window: int | None = None
  memory_placeholder: tuple[int, ...] | None = None
  width: int | None = None
  batch_bucket: int = 1
  row_bucket: int = 1

  def __post_init__(self):
    if self.num_generations < 1 or self.max_new_tokens < 1 or self.max_turns < 1:
      raise ConfigError(f"RolloutSpec: num_generations, max_new_tokens and max_turns must be >= 1, got "
                        f"{self.num_generations}, {self.max_new_tokens}, {self.max_turns}")
    if self.max_turns > 1 and (self.env is None or self.tool_end_id is None):
      raise ConfigError("RolloutSpec: max_turns > 1 needs env= (a ToolEnv) and tool_end_id= (the token closing "
                        "a tool call)")
    if self.max_turns > 1 and self.width is None:
      raise ConfigError("RolloutSpec: set width= (training-row tokens: prompt + turns + observations) when "
                        "max_turns > 1")

  def row_width(self, prompts: Sequence[Sequence[int]]) -> int:
    """The training-row width for these prompts."""
    return self.width if self.width is not None else max(len(p) for p in prompts) + self.max_new_tokens

  def rollout(self, model, prompts: Sequence[Sequence[int]], key: jax.Array,
              num_generations: int | None = None, width: int | None = None,
              prompt_inputs: dict[str, np.ndarray] | None = None) -> RolloutBatch:
    """Rollouts of `model` (a `jaxlab.lm.Transformer` / `VisionLM` or a policy callable) on `prompts`, with
    optional per-prompt model inputs (e.g. images, (num_prompts, ...))."""
    policy = model
    if not _is_policy(model):
      # A turn also ends at the tool-call close tag (the environment answers it); the episode at a stop token.
      turn_ends = tuple(self.stop_tokens) + ((self.tool_end_id,) if self.max_turns > 1 else ())
      policy = sampler_policy(model, self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, stop_tokens=turn_ends, pad_id=self.pad_id,
                              batch_bucket=self.batch_bucket)
    return multi_turn(policy, prompts, num_generations or self.num_generations, key=key, env=self.env,
                      max_turns=self.max_turns, tool_end_id=self.tool_end_id, memory_window=self.memory_window,
                      memory_placeholder=self.memory_placeholder, width=width, pad_id=self.pad_id,
                      stop_tokens=self.stop_tokens, prompt_inputs=prompt_inputs)


# ----------------------------------------------------------------------------------------------------- SFT


def sft_config(config: ml_collections.ConfigDict, *, num_steps: int, learning_rate: float, batch_size: int,
               warmup_steps: int = 0) -> ml_collections.ConfigDict:
  """The config of an SFT sub-run (`fit`): the run's config with a complete train section for SFT.

  Warm-up + cosine to `num_steps` at `learning_rate`; the other optimizer settings (name, b2, clip, weight
  decay) and the checkpoint settings are the run's (`config.train`); logs every min(50, num_steps) steps.
  """
  t = config.train
  c = ml_collections.ConfigDict(config.to_dict())
  c.train = configs.train_config(
      batch_size=batch_size, num_steps=num_steps, log_every=min(50, num_steps), eval_every=0, checkpoint_every=0,
      keep_checkpoints=t.keep_checkpoints, async_checkpoint=t.async_checkpoint,
      optimizer=dict(t.optimizer.to_dict(), learning_rate=learning_rate, schedule="warmup_cosine",
                     warmup_steps=min(warmup_steps, num_steps)))
  c = configs.finalize(c)
  configs.set_experiment_name(c, configs.experiment_name(config))
  return c


def _apply(model, batch):
  """The SFT forward: `jaxlab.lm.sft.default_apply` plus the batch's extra model inputs (e.g. images)."""
  return model(batch["inputs"], batch["positions"], segment_ids_bl=batch["segment_ids"], **model_inputs(batch))


def sft(config: ml_collections.ConfigDict, workdir: str, modeldef: ModelDef, rows: dict[str, np.ndarray], *,
        num_steps: int, learning_rate: float, batch_size: int, warmup_steps: int = 0, init_params: Any = None,
        ema_decay: float = 0.0, stop_every: int = 0, stop_when: Callable[[Any], bool] | None = None
        ) -> tuple[Any, dict]:
  """Masked SFT (`jaxlab.lm.sft` loss) of `modeldef` on `rows`; returns (params as host arrays, summary).

  Args:
    config: the run's config (train section: optimizer, checkpoints; mesh and sharding rules).
    workdir: the sub-run's directory (resumed when it holds a checkpoint).
    modeldef: the model.
    rows: {"inputs", "targets", "loss_mask", "positions", "segment_ids"} (`jaxlab.lm.sft_data`), plus any extra
      model inputs per row (`grpo.MODEL_INPUT_KEYS`, e.g. a VLM's "images").
    num_steps, learning_rate, batch_size, warmup_steps: the schedule (`sft_config`).
    init_params: starting parameters (None: fresh init from config.seed).
    ema_decay: > 0: train with a parameter moving average (`optim.with_param_ema`) and return it.
    stop_every, stop_when: every `stop_every` steps, `stop_when(model)` (the returned parameters merged, eval
      mode) may end the run early.
  """
  c = sft_config(config, num_steps=num_steps, learning_rate=learning_rate, batch_size=batch_size,
                 warmup_steps=warmup_steps)

  def params_of(state):
    return optim.param_ema(state.opt_state) if ema_decay else state.params

  def reached(step, state):
    if stop_when is None or stop_every <= 0 or step % stop_every:
      return False
    model = modeldef.merge(params_of(state), state.model_state)
    model.eval()
    return bool(stop_when(model))

  wrap = (lambda tx: optim.with_param_ema(tx, ema_decay)) if ema_decay else None
  res = fit(c, workdir, model_fn=modeldef.model_fn, loss_fn=sft_lib.make_loss_fn(_apply),
            train_source=ArraySource(rows),
            initial_params=init_params, hooks=(reached,), wrap_optimizer=wrap)
  return jax.device_get(params_of(res.state)), res.summary


# ----------------------------------------------------------------------------------------------------- RFT


def rejection_finetune(config: ml_collections.ConfigDict, workdir: str, model, modeldef: ModelDef,
                       prompts: Sequence[Sequence[int]], problems: Sequence[Any], reward: CompositeReward,
                       tokenizer, *, spec: RolloutSpec, key: jax.Array, seq_len: int, num_steps: int,
                       learning_rate: float, batch_size: int, warmup_steps: int = 0, threshold: float = 1.0,
                       keep: Callable[[Sequence[str], Sequence[Any]], np.ndarray] | None = None,
                       max_per_prompt: int | None = None, dedupe: bool = True, init_params: Any = None,
                       prompt_inputs: dict[str, np.ndarray] | None = None) -> tuple[Any, dict]:
  """Rejection-sampling fine-tuning: SFT on the model's own rewarded rollouts.

  `spec.num_generations` rollouts per prompt are drawn from `model` with `key`; a rollout is kept when its
  total reward is >= `threshold`, it stopped on its own, `keep(texts, problems)` (optional, e.g. a correct
  judgement on every dimension) holds, and (with `dedupe`) no earlier kept rollout of the same prompt has the
  same tokens; at most `max_per_prompt` per prompt. The kept rollouts' token rows (one per trajectory, or
  one per turn with a memory window) become SFT rows with the loss on generated tokens only. Per-prompt model
  `prompt_inputs` (e.g. a VLM's images, (num_prompts, ...)) go to the rollouts and, row by row, into the SFT rows.

  Returns:
    (params, stats): the fine-tuned parameters (`init_params` when nothing was kept) and {"kept", "sampled",
    "prompts_covered", "reward_mean", "rows"}, also written to `workdir/rft_stats.json`.
  """
  if len(prompts) != len(problems):
    raise ConfigError(f"rejection_finetune: {len(prompts)} prompts but {len(problems)} problems")
  g = spec.num_generations
  roll = spec.rollout(model, prompts, key, prompt_inputs=prompt_inputs)
  texts = [decode_completion(tokenizer, t) for t in roll.generated]
  refs = [p for p in problems for _ in range(g)]
  total = np.asarray(reward(texts, refs), np.float32)
  ok = (total >= threshold) & roll.stopped
  if keep is not None:
    ok &= np.asarray(keep(texts, refs), bool)
  chosen = np.zeros(len(texts), bool)
  covered = 0
  for p in range(len(prompts)):
    seen: list[tuple[int, ...]] = []
    for i in range(p * g, (p + 1) * g):
      toks = tuple(roll.generated[i])
      if ok[i] and not (dedupe and toks in seen) and (max_per_prompt is None or len(seen) < max_per_prompt):
        seen.append(toks)
        chosen[i] = True
    covered += bool(seen)
  seqs = roll.sequences(chosen)
  stats = {"kept": int(chosen.sum()), "sampled": len(texts), "prompts_covered": covered,
           "reward_mean": float(total.mean()) if total.size else 0.0, "rows": len(seqs)}
  os.makedirs(workdir, exist_ok=True)
  metrics.write_json(os.path.join(workdir, "rft_stats.json"), stats)
  if not seqs:
    return init_params, stats
  long = max(len(ids) for ids, _ in seqs)
  if long > seq_len + 1:
    raise ConfigError(f"rejection_finetune: a kept rollout has {long} tokens > seq_len + 1 = {seq_len + 1}; raise "
                      "seq_len")
  rows = dict(sft_data.pad_rows(seqs, seq_len, spec.pad_id), **roll.row_inputs(prompt_inputs, chosen, g))
  params, _ = sft(config, workdir, modeldef, rows, num_steps=num_steps, learning_rate=learning_rate,
                  batch_size=batch_size, warmup_steps=warmup_steps, init_params=init_params)
  return params, stats


# ---------------------------------------------------------------------------------------------------- GRPO


def _pad_rows(batch: dict[str, np.ndarray], multiple: int, pad_id: int) -> dict[str, np.ndarray]:
  """Rows padded to a multiple of `multiple` with empty rows (tokens pad_id, everything else 0: no loss tokens,
  segment 0, advantage 0)."""
  extra = -len(batch["tokens"]) % multiple
  if not extra:
    return batch
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    fill = np.full((extra,) + v.shape[1:], pad_id if k == "tokens" else 0, v.dtype)
    out[k] = np.concatenate([v, fill])
  return out


def grpo_update_step(modeldef: ModelDef, gcfg: GRPOConfig, temperature: float, tx, schedule, shardings, bsh,
                     micro_batches: int = 1):
  """The jitted GRPO policy update `grpo` runs (and `jaxlab.compile_check` compiles): `make_grpo_loss_fn` under
  `jaxlab.train.accumulate` (the whole batch's gradient from `micro_batches` micro-batches; 1 = one pass)."""
  return accumulate.make_accumulating_train_step(modeldef, make_grpo_loss_fn(gcfg, temperature), tx, schedule,
                                                 shardings, bsh, micro_batches=micro_batches)


def grpo(config: ml_collections.ConfigDict, workdir: str, modeldef: ModelDef, ref_params: Any,
         prompts: Sequence[Sequence[int]], problems: Sequence[Any], reward: CompositeReward, tokenizer, *,
         gcfg: GRPOConfig, spec: RolloutSpec, key: jax.Array, seed: int | None = None,
         shuffle_rewards: bool = False, init_params: Any = None,
         prompt_inputs: dict[str, np.ndarray] | None = None) -> Any:
  """GRPO from `init_params` (default: `ref_params`, which are also the KL reference); returns the final
  TrainState.

  Each step draws `config.train.batch_size` distinct prompts (rng [seed, step]), G = spec.num_generations
  rollouts each (key fold_in(key, step)), scores them with `reward` (over the generated text, the model's
  tokens only), turns the components into group advantages (`multi_reward_advantages`; with
  `shuffle_rewards` the rows of components are permuted across the batch first, rng [seed, step, 1]) and
  takes gcfg.num_iterations optimizer steps on the batch (`make_grpo_loss_fn`; with gcfg.micro_batches = k > 1
  each step and each log-prob pass takes the rows in k micro-batches, the batch padded with empty rows
  to a multiple of k x the data split: the same update, about 1/k of the activations). The optimizer is
  `config.train.optimizer` over config.train.num_steps * num_iterations updates. Runs in the mesh and rules
  in context (the sampler and the log-prob passes read them from there too). Per-prompt model `prompt_inputs` (e.g.
  a VLM's images, (num_prompts, ...)) go to the rollouts and to each training row.
  """
  t = config.train
  seed = config.seed if seed is None else int(seed)
  if len(prompts) != len(problems):
    raise ConfigError(f"grpo: {len(prompts)} prompts but {len(problems)} problems")
  if t.batch_size > len(prompts):
    raise ConfigError(f"grpo: config.train.batch_size={t.batch_size} exceeds the {len(prompts)} prompts")
  mesh, rules = mesh_lib.current_mesh(), mesh_lib.current_rules()
  tx, schedule = optim.make_optimizer(t.optimizer, t.num_steps * gcfg.num_iterations)  # per update
  state, shardings = create_train_state(modeldef, tx, mesh, rules, seed)
  # Fresh copies: the steps donate the state, and the caller's arrays and the reference must survive. A jitted
  # copy, since jax.device_put(..., may_alias=False) onto a replicated multi-device sharding still shares the
  # source's buffer on the source's device (jax 0.10), so donating the state deleted the reference too.
  copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree), out_shardings=shardings.params)
  start = ref_params if init_params is None else init_params
  state = state.replace(params=copy(jax.device_put(start, shardings.params)))
  ref = copy(jax.device_put(ref_params, shardings.params))
  bsh = mesh_lib.batch_sharding(mesh, rules)
  micro = gcfg.micro_batches
  update = grpo_update_step(modeldef, gcfg, spec.temperature, tx, schedule, shardings, bsh, micro)
  logps_fn = make_logps_fn(modeldef, spec.temperature, micro)
  rows_multiple = math.lcm(spec.row_bucket, mesh_lib.data_split(mesh, rules) * micro)
  width = spec.row_width(prompts)
  g = spec.num_generations

  def get_batch(step):
    rng = np.random.default_rng([seed, step])
    return step, rng.choice(len(prompts), size=t.batch_size, replace=False)

  def step_fn(state, batch_idx):
    step, idx = batch_idx
    model = modeldef.merge(state.params, state.model_state)
    model.eval()
    step_inputs = {k: np.asarray(v)[idx] for k, v in (prompt_inputs or {}).items()}
    roll = spec.rollout(model, [prompts[i] for i in idx], jax.random.fold_in(key, step), width=width,
                        prompt_inputs=step_inputs)
    texts = [decode_completion(tokenizer, r) for r in roll.generated]
    refs = [problems[i] for i in idx for _ in range(g)]
    comps = reward.components(texts, refs)
    used = comps
    if shuffle_rewards:
      used = comps[np.random.default_rng([seed, step, 1]).permutation(len(texts))]
    adv = multi_reward_advantages(used, reward.weights, g, gcfg.advantage_estimator, gcfg.per_reward_normalize)
    batch = dict(roll.train_batch(adv), **roll.row_inputs(step_inputs, None, g))
    batch = jax.device_put(_pad_rows(batch, rows_multiple, spec.pad_id), bsh)
    if gcfg.beta > 0:
      batch["ref_logps"] = logps_fn(ref, state.model_state, batch)
    if gcfg.num_iterations > 1:
      batch["old_logps"] = logps_fn(state.params, state.model_state, batch)
    for _ in range(gcfg.num_iterations):
      state, m = update(state, batch)
    lengths = roll.loss_mask.sum(axis=1)
    m = dict(m)
    total = comps @ np.asarray(reward.weights)
    m.update({"rollout/reward": float(np.mean(total)), "rollout/reward_std": float(np.std(total)),
              **{f"rollout/{n}": float(comps[:, j].mean()) for j, n in enumerate(reward.names)},
              "rollout/length": float(lengths.mean()), "rollout/truncated": float(1 - roll.stopped.mean())})
    if spec.max_turns > 1:
      m.update({"rollout/turns": float(roll.num_turns.mean()),
                "rollout/turn_limited": float(roll.turn_limited.mean())})
    return state, m

  state, _ = run_loop(config, workdir, state, shardings, step_fn, get_batch,
                      extra_summary={"num_params": param_count(state.params)})
  return state
