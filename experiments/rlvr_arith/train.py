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

from jaxlab import metrics
from jaxlab.errors import ConfigError
from jaxlab.lm import hf, sft_data
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.lm.tokenizer import check_fits, load_tokenizer
from jaxlab.posttrain import arith, evaluate, rewards as rewards_lib, trainers
from jaxlab.state import ModelDef, param_count
from jaxlab.train import run_stages

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
    cfg = hf.config_from_hf(m.hf_path, dtype=m.dtype, remat=m.remat)
    check_fits(tok, cfg.vocab_size, f"the checkpoint {m.hf_path}")   # before anything trains or is written
    return cfg
  return TransformerConfig(vocab_size=-(-tok.vocab_size // 8) * 8, hidden=m.hidden, n_layers=m.n_layers,
                           n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, mlp_hidden=m.mlp_hidden,
                           max_position=m.max_position, dtype=m.dtype, tie_embeddings=True, remat=m.remat)


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
  return evaluate.greedy_eval(model, tok, [sft_data.encode_prompt(e["prompt"], tok) for e in evals], evals,
                              {"acc": _answer, "format": _format}, batch=batch, max_new_tokens=max_new_tokens)


def kl_to_reference(model, ref, tok, evals, config, prompts: int = 64, samples: int = 4) -> float:
  """Monte Carlo KL(pi || ref) per completion (k1) of the sampling policies on `prompts` held-out problems."""
  g = config.grpo
  return evaluate.kl_to_reference(
      model, ref, [sft_data.encode_prompt(e["prompt"], tok) for e in evals[:prompts]], samples=samples,
      key=jax.random.key(config.seed + 11), max_new_tokens=g.max_new_tokens, temperature=g.temperature,
      stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)


def run_sft(config, workdir, modeldef, tok, examples, num_steps, learning_rate, init_params=None, *, dev=None,
            stop_at=0.0, check_every=0, ema_decay=0.0, screen=0, screen_at=0.0):
  """Masked-prompt SFT (`trainers.sft`); returns (trained params as host arrays, the run's summary).

  With `stop_at` > 0, greedy accuracy on `dev` is measured every `check_every` steps (once the first `screen`
  dev problems reach `screen_at`) and training stops at the first check that reaches `stop_at`.
  """
  rows = sft_data.build_padded([{"prompt": e["prompt"], "completion": e["completion"]} for e in examples], tok,
                               config.data.seq_len)

  def accuracy(model, problems):
    return greedy_eval(model, tok, problems, len(problems), config.grpo.max_new_tokens)["acc"]

  def reached(model):
    if screen and accuracy(model, dev[:screen]) < screen_at:
      return False
    return accuracy(model, dev) >= stop_at

  s = config.sft
  return trainers.sft(config, workdir, modeldef, rows, num_steps=num_steps, learning_rate=learning_rate,
                      batch_size=s.batch_size, warmup_steps=s.warmup_steps, init_params=init_params,
                      ema_decay=ema_decay, stop_every=check_every if stop_at > 0 else 0, stop_when=reached)


def rollout_spec(config, tok, num_generations=None) -> trainers.RolloutSpec:
  g = config.grpo
  return trainers.RolloutSpec(num_generations=num_generations or g.num_generations, max_new_tokens=g.max_new_tokens,
                              temperature=g.temperature, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)


def run_grpo(config, workdir, modeldef, ref_params, tok, train, *, shuffle: bool):
  """GRPO from `ref_params` (the SFT model, also the KL reference), `trainers.grpo`; returns the final TrainState."""
  prompt_ids = [sft_data.encode_prompt(e["prompt"], tok) for e in train]
  return trainers.grpo(config, workdir, modeldef, ref_params, prompt_ids, train, reward_fn(config), tok,
                       gcfg=config_lib.grpo_config(config), spec=rollout_spec(config, tok),
                       key=jax.random.key(config.seed + 7919 * (1 + shuffle)), shuffle_rewards=shuffle)


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
  """Rejection-sampling fine-tuning (`trainers.rejection_finetune`): SFT from the start on its own correct,
  well-formatted samples."""
  r, g = config.rft, config.grpo
  idx = np.random.default_rng([config.seed, 2]).choice(len(train), size=min(r.prompts, len(train)), replace=False)
  probs = [train[i] for i in idx]
  params, _ = trainers.rejection_finetune(
      config, workdir, model, modeldef, [sft_data.encode_prompt(p["prompt"], tok) for p in probs], probs,
      reward_fn(config), tok, spec=rollout_spec(config, tok, r.samples), key=jax.random.key(config.seed + 3),
      seq_len=config.data.seq_len, num_steps=r.num_steps, learning_rate=r.learning_rate,
      batch_size=config.sft.batch_size, warmup_steps=config.sft.warmup_steps,
      threshold=g.answer_weight + g.trace_weight, init_params=start_params)
  return start_params if params is None else params


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

