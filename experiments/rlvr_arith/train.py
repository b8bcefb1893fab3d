"""RLVR arithmetic: SFT to a partial start, then GRPO (true or shuffled rewards) from it; greedy accuracy.

Launch: python -m jaxlab.main --config experiments/rlvr_arith/config.py:tiny --workdir /tmp/rlvr_arith
The run is a sequence of stages (`jaxlab.train.run_stages`; each recorded once, a rerun skips the finished ones):

* `sft`: masked-prompt SFT on the shared loop (`fit`, resumable sub-run in workdir/stages/sft/), stopping
  early at the target dev accuracy (of a moving average of the parameters with sft.ema_decay > 0); absent
  when config.sft.num_steps = 0 (start from model.hf_path);
* `eval_sft`: greedy accuracy of the start on the held-out problems (+ parameter and problem counts);
* one stage per arm of config.method.arms, each training from the start in its own resumable sub-run
  (workdir/stages/<arm>/) and then scoring it (greedy accuracy, format rate, gain over the start, KL to the
  start): `grpo` (GRPO with the answer + trace reward, `run_loop`), `shuffled` (the same with rewards permuted
  across the batch: a control with the same reward distribution but no signal), `rft` (rejection-sampling
  fine-tuning: SFT on the model's own correct samples).

summary.json (written once, at the end) holds every stage's results.
"""

from __future__ import annotations

import functools
import os

import jax
import ml_collections
import numpy as np

from jaxlab import configs, mesh as mesh_lib, metrics
from jaxlab.data import ArraySource
from jaxlab.errors import ConfigError
from jaxlab.lm import generate, hf, sft, sft_data
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.lm.tokenizer import check_fits, load_tokenizer
from jaxlab.posttrain import arith, rewards as rewards_lib
from jaxlab.posttrain.advantages import multi_reward_advantages
from jaxlab.posttrain.grpo import make_grpo_loss_fn, make_logps_fn, per_token_logps
from jaxlab.posttrain.rft import rejection_sample
from jaxlab.posttrain.rollout import decode_completion, single_turn
from jaxlab.state import ModelDef, create_train_state, param_count
from jaxlab.train import fit, optim, run_loop, run_stages, step as step_lib

from . import config as config_lib


def tokenizer_for(config):
  return arith.tokenizer() if not config.model.hf_path else load_tokenizer(config.model.hf_path)


def problems(config):
  """(train, eval) lists of {"prompt", "completion", "answer"} (completion may be absent for jsonl)."""
  d = config.data
  if d.source == "addition":
    return arith.split(d.n_train, d.n_eval, min_digits=d.min_digits, max_digits=d.max_digits,
                       pad_operands=d.pad_operands, seed=config.seed)
  from jaxlab.data.jsonl import iter_jsonl
  rows = []
  for line_no, rec in iter_jsonl(d.path):
    if not isinstance(rec, dict) or "prompt" not in rec or "answer" not in rec:
      raise ConfigError(f"{d.path}:{line_no}: each line needs 'prompt' and 'answer' (optional 'completion')")
    rows.append({k: str(v) for k, v in rec.items() if k in ("prompt", "answer", "completion")})
  if len(rows) < 2:
    raise ConfigError(f"config.data.path={d.path!r} holds {len(rows)} problem(s); need at least 2")
  order = np.random.default_rng(config.seed).permutation(len(rows))
  n_eval = min(d.n_eval, len(rows) // 2)
  return [rows[i] for i in order[n_eval:]], [rows[i] for i in order[:n_eval]]


def model_config(config, tok) -> TransformerConfig:
  m = config.model
  if m.hf_path:
    cfg = hf.config_from_hf(m.hf_path, dtype=m.dtype)
    check_fits(tok, cfg.vocab_size, f"the checkpoint {m.hf_path}")   # before anything trains or is written
    return cfg
  return TransformerConfig(vocab_size=-(-tok.vocab_size // 8) * 8, hidden=m.hidden, n_layers=m.n_layers,
                           n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, mlp_hidden=m.mlp_hidden,
                           max_position=m.max_position, dtype=m.dtype, tie_embeddings=True)


def _answer(completions, problems):
  return rewards_lib.answer_reward(completions, [p["answer"] for p in problems])


def _format(completions, problems):
  return rewards_lib.format_reward(completions)


def reward_fn(config):
  """Composite reward over (completions, problem records): answer, verified trace, format."""
  g = config.grpo
  return rewards_lib.CompositeReward(("answer", "trace", "format"), (_answer, arith.trace_reward, _format),
                                     (g.answer_weight, g.trace_weight, g.format_weight))


def greedy_eval(model, tok, evals, batch: int, max_new_tokens: int) -> dict[str, float]:
  """Greedy KV-cache generation on held-out problems: answer accuracy and format-valid rate."""
  hits, valid = [], []
  for s in range(0, len(evals), batch):
    chunk = evals[s:s + batch]
    out = generate(model, [sft_data.encode_prompt(e["prompt"], tok) for e in chunk], max_new_tokens,
                   stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
    toks, lens = jax.device_get((out.tokens, out.lengths))
    texts = [decode_completion(tok, toks[i, :lens[i]]) for i in range(len(chunk))]
    hits += list(rewards_lib.answer_reward(texts, [e["answer"] for e in chunk]))
    valid += list(rewards_lib.format_reward(texts))
  return {"acc": float(np.mean(hits)), "format": float(np.mean(valid))}


def kl_to_reference(model, ref, tok, evals, config, prompts: int = 64, samples: int = 4) -> float:
  """Monte Carlo KL(pi || ref) per completion of the sampling policies (softmax(logits / T)), in nats.

  Completions of `prompts` held-out problems (`samples` each, fixed key) are drawn from `model`; the estimate is
  the mean over completions of sum_t (log pi - log ref) (k1: unbiased for the sequence-level KL).
  """
  g = config.grpo
  ids = [sft_data.encode_prompt(e["prompt"], tok) for e in evals[:prompts]]
  roll = single_turn(model, ids, samples, key=jax.random.key(config.seed + 11), max_new_tokens=g.max_new_tokens,
                     temperature=g.temperature, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
  args = (roll.tokens, roll.positions, roll.segment_ids)
  diff = (per_token_logps(model, *args, temperature=g.temperature)
          - per_token_logps(ref, *args, temperature=g.temperature))
  return float(np.mean(np.sum(np.asarray(diff) * roll.loss_mask, axis=1)))


def sft_config(config, num_steps: int, learning_rate: float) -> ml_collections.ConfigDict:
  """The config of an SFT sub-run (`fit`): the run's config with a complete train section for SFT.

  batch_size and warm-up come from config.sft, the step count and learning rate from the caller (SFT start or
  RFT); warm-up + cosine; the other optimizer settings (adamw, b2, clip, ...) and the checkpoint settings
  are the run's (config.train).
  """
  s, t = config.sft, config.train
  c = ml_collections.ConfigDict(config.to_dict())
  c.train = configs.train_config(
      batch_size=s.batch_size, num_steps=num_steps, log_every=min(50, num_steps), eval_every=0, checkpoint_every=0,
      keep_checkpoints=t.keep_checkpoints, async_checkpoint=t.async_checkpoint,
      optimizer=dict(t.optimizer.to_dict(), learning_rate=learning_rate, schedule="warmup_cosine",
                     warmup_steps=min(s.warmup_steps, num_steps)))
  c = configs.finalize(c)
  configs.set_experiment_name(c, configs.experiment_name(config))
  return c


def run_sft(config, workdir, modeldef, tok, examples, num_steps, learning_rate, init_params=None, *, dev=None,
            stop_at=0.0, check_every=0, ema_decay=0.0, screen=0, screen_at=0.0):
  """Masked-prompt SFT on the shared loop; returns (trained params as host arrays, the run's summary).

  With `ema_decay` > 0 the returned params are the run's parameter average (`optim.with_param_ema`). With
  `stop_at` > 0, greedy accuracy of those params on `dev` is measured every `check_every` steps (once the first
  `screen` dev problems reach `screen_at`) and training stops at the first check that reaches `stop_at` (a
  run_loop hook returning True: the stop survives resume).
  """
  c = sft_config(config, num_steps, learning_rate)
  data = sft_data.build_padded([{"prompt": e["prompt"], "completion": e["completion"]} for e in examples], tok,
                          config.data.seq_len)

  def params_of(state):
    return optim.param_ema(state.opt_state) if ema_decay else state.params

  def accuracy(state, problems):
    model = modeldef.merge(params_of(state), state.model_state)
    model.eval()
    return greedy_eval(model, tok, problems, len(problems), config.grpo.max_new_tokens)["acc"]

  def reached(step, state):
    if stop_at <= 0 or step % check_every:
      return False
    if screen and accuracy(state, dev[:screen]) < screen_at:
      return False
    return accuracy(state, dev) >= stop_at

  wrap = (lambda tx: optim.with_param_ema(tx, ema_decay)) if ema_decay else None
  res = fit(c, workdir, model_fn=modeldef.model_fn, loss_fn=sft.make_loss_fn(), train_source=ArraySource(data),
            initial_params=init_params, hooks=(reached,), wrap_optimizer=wrap)
  return jax.device_get(params_of(res.state)), res.summary


def run_grpo(config, workdir, modeldef, ref_params, tok, train, *, shuffle: bool):
  """GRPO from `ref_params` (the SFT model, also the KL reference); returns the final TrainState.

  Runs in the mesh and rules in context (the sampler and the log-prob passes read them from there too).
  """
  g, gcfg, t = config.grpo, config_lib.grpo_config(config), config.train
  mesh, rules = mesh_lib.current_mesh(), mesh_lib.current_rules()
  tx, schedule = optim.make_optimizer(t.optimizer, t.num_steps * gcfg.num_iterations)  # per update
  state, shardings = create_train_state(modeldef, tx, mesh, rules, config.seed)
  state = state.replace(params=jax.device_put(ref_params, shardings.params))
  ref = jax.device_put(ref_params, shardings.params)
  bsh = mesh_lib.batch_sharding(mesh, rules)
  update = step_lib.make_train_step(modeldef, make_grpo_loss_fn(gcfg, g.temperature), tx, schedule, shardings, bsh)
  logps_fn = make_logps_fn(modeldef, g.temperature)
  reward = reward_fn(config)
  prompt_ids = [sft_data.encode_prompt(e["prompt"], tok) for e in train]
  width = max(len(p) for p in prompt_ids) + g.max_new_tokens
  base_key = jax.random.key(config.seed + 7919 * (1 + shuffle))

  def get_batch(step):
    rng = np.random.default_rng([config.seed, step])
    return step, rng.choice(len(train), size=t.batch_size, replace=False)

  def step_fn(state, batch_idx):
    step, idx = batch_idx
    model = modeldef.merge(state.params, state.model_state)
    model.eval()
    roll = single_turn(model, [prompt_ids[i] for i in idx], g.num_generations,
                       key=jax.random.fold_in(base_key, step), max_new_tokens=g.max_new_tokens,
                       temperature=g.temperature, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id, width=width)
    texts = [decode_completion(tok, r) for r in roll.generated]
    problems = [train[i] for i in idx for _ in range(g.num_generations)]
    comps = reward.components(texts, problems)
    used = comps
    if shuffle:
      used = comps[np.random.default_rng([config.seed, step, 1]).permutation(len(texts))]
    adv = multi_reward_advantages(used, reward.weights, g.num_generations, gcfg.advantage_estimator,
                                  gcfg.per_reward_normalize)
    batch = jax.device_put(roll.train_batch(adv), bsh)
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
    return state, m

  state, _ = run_loop(config, workdir, state, shardings, step_fn, get_batch,
                      extra_summary={"num_params": param_count(state.params)})
  return state


def train_and_evaluate(config, workdir: str) -> dict:
  """SFT start, then every arm of config.method.arms from it; greedy accuracy of each on held-out problems."""
  config_lib.check_inputs(config)
  tok = tokenizer_for(config)
  train, evals = problems(config)
  mcfg = model_config(config, tok)
  run = _Run(config, tok, ModelDef(lambda rngs: Transformer(mcfg, rngs=rngs)), mcfg, train, evals)
  stages = {}
  if config.sft.num_steps:
    stages["sft"] = run.sft
  stages["eval_sft"] = run.eval_sft
  for arm in config.method.arms:
    stages[arm] = functools.partial(run.arm, arm=arm)
  return run_stages(config, workdir, stages)


class _Run:
  """The stages of one run (shared data, tokenizer and model definition)."""

  def __init__(self, config, tok, modeldef, mcfg, train, evals):
    self.config, self.tok, self.modeldef, self.mcfg, self.evals = config, tok, modeldef, mcfg, evals
    s = config.sft
    # SFT's dev set (its early-stop checks) is cut from the training problems; the RL arms train on the rest.
    self.dev, self.train = (train[:s.dev_size], train[s.dev_size:]) if s.num_steps else ([], train)

  def _initial(self):
    m = self.config.model
    return hf.load_hf_params(m.hf_path, self.mcfg) if m.hf_path else None

  def start_params(self, ctx):
    """The start of the arms as host arrays: the SFT stage's parameters (its average, at the early stop; kept
    with the stage's results), else the pretrained checkpoint."""
    if not self.config.sft.num_steps:
      return self._initial()
    return ctx.results["sft"]["start_params"]

  def _start_model(self, ctx):
    params = self.start_params(ctx)
    model = self.modeldef.merge(params, {})
    model.eval()
    return params, model

  def sft(self, ctx):
    """Masked-prompt SFT from scratch (or model.hf_path) until the dev accuracy target (sub-run in stages/sft/)."""
    s = self.config.sft
    params, info = run_sft(self.config, ctx.subdir(), self.modeldef, self.tok, self.train, s.num_steps,
                           s.learning_rate, self._initial(), dev=self.dev, stop_at=s.stop_at,
                           check_every=s.check_every, ema_decay=s.ema_decay, screen=s.screen, screen_at=s.screen_at)
    return {"sft/steps": info["step"], "sft/loss": info.get("train/loss"), "start_params": params}

  def eval_sft(self, ctx):
    """Greedy accuracy and format rate of the start on the held-out problems."""
    c = self.config
    params, model = self._start_model(ctx)
    r = greedy_eval(model, self.tok, self.evals, c.eval.batch, c.grpo.max_new_tokens)
    return {"eval/acc_sft": r["acc"], "eval/format_sft": r["format"], "num_params": param_count(params),
            "num_eval": len(self.evals)}

  def arm(self, ctx, arm: str):
    """One arm from the start (sub-run in stages/<arm>/), then its greedy accuracy, gain and KL to the start."""
    c = self.config
    start_params, model = self._start_model(ctx)
    if arm == "rft":
      params = _rft(c, ctx.subdir(), model, self.modeldef, self.tok, self.train, start_params)
    else:
      params = jax.device_get(run_grpo(c, ctx.subdir(), self.modeldef, start_params, self.tok, self.train,
                                       shuffle=arm == "shuffled").params)
    m = self.modeldef.merge(params, {})
    m.eval()
    r = greedy_eval(m, self.tok, self.evals, c.eval.batch, c.grpo.max_new_tokens)
    return {f"eval/acc_{arm}": r["acc"], f"eval/format_{arm}": r["format"],
            f"eval/gain_{arm}": r["acc"] - ctx.results["eval_sft"]["eval/acc_sft"],
            f"eval/kl_{arm}": kl_to_reference(m, model, self.tok, self.evals, c)}


def _rft(config, workdir, model, modeldef, tok, train, start_params):
  """Rejection-sampling fine-tuning: SFT from the start on its own correct, well-formatted samples."""
  r = config.rft
  idx = np.random.default_rng([config.seed, 2]).choice(len(train), size=min(r.prompts, len(train)), replace=False)
  g = config.grpo
  recs, stats = rejection_sample(model, [train[i]["prompt"] for i in idx], [train[i] for i in idx], tok,
                                 reward_fn(config), k=r.samples, key=jax.random.key(config.seed + 3),
                                 max_new_tokens=g.max_new_tokens, temperature=g.temperature,
                                 threshold=g.answer_weight + g.trace_weight)
  os.makedirs(workdir, exist_ok=True)
  metrics.write_json(os.path.join(workdir, "rft_stats.json"), stats)
  if not recs:
    return start_params
  return run_sft(config, workdir, modeldef, tok, recs, r.num_steps, r.learning_rate, start_params)[0]


def plot(runs, workdirs, out_dir):
  """Greedy accuracy per arm (bars over seeds) and the GRPO reward curves; returns the PNG paths."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  arms = ["sft"] + [a for a in config_lib.ARMS if f"eval/acc_{a}" in runs[0]]
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
  for k, r in enumerate(runs):
    ax[0].plot(arms, [r[f"eval/acc_{a}"] for a in arms], "o-", alpha=0.7, label=f"seed {k}")
  ax[0].set_ylabel("greedy accuracy (held out)")
  ax[0].legend()
  for k, wd in enumerate(workdirs):
    for arm, style in (("grpo", "-"), ("shuffled", "--")):
      rows = [x for x in metrics.read_metrics(os.path.join(wd, "stages", arm)) if "rollout/answer" in x]
      if rows:
        ax[1].plot([x["step"] for x in rows], [x["rollout/answer"] for x in rows], style, color=f"C{k}",
                   label=f"{arm} ({'solid' if style == '-' else 'dashed'})" if k == 0 else None)
  ax[1].set_xlabel("GRPO step")
  ax[1].set_ylabel("sampled answer reward")
  ax[1].legend()
  path = save(fig, out_dir, "rlvr_arith.png", dpi=120)
  paths.append(path)
  return paths

