"""ToM RFT: audit, cold starts, then SFT / No-Thinking-RFT / Thinking-RFT / shuffled control / RFT; greedy scores.

Launch: python -m jaxlab.main --config experiments/tom_rft/config.py:tiny --workdir /tmp/tom_rft
The run is a sequence of stages (`jaxlab.train.run_stages`; each recorded once, a rerun skips the finished ones):

* `audit` (generated data only): the shortcut audit (`jaxlab.tom.audit`) of naive and shortcut-free data;
* `pretrain` (no model.hf_path): the base, order-0 questions in both formats (the prompt ends with the format
  request, data.instruction_think / instruction_nothink), cached across runs;
* `cold_think` / `cold_nothink`: SFT on data.cold_orders with the reasoning trace / the bare answer (resumable
  sub-runs in workdir/stages/<name>/); only those the arms need;
* `eval_cold`: greedy scores of the cold starts on the test questions;
* `gate`: the competence gate (config.gate, pre-registered): the base's held-out order-0 accuracy in each format
  and each cold start's order-1 false-belief accuracy; a failing gate skips every arm (a warning names the
  numbers; the summary keeps gate/*) unless gate.enforce is off;
* one stage per arm of config.method.arms, each from its cold start in its own resumable sub-run, then scored:
  per-question greedy correctness on every test order, format-valid rate, pair consistency of the
  counterfactual twins and, for the GRPO arms, the Monte Carlo KL to the cold start.

summary.json (written once, at the end) holds every stage's results; `eval/correct_<arm>` are strings of 0/1
per test question (orders in `eval/test_orders`, false beliefs in `eval/test_fb`), from which the claims' paired
bootstrap intervals are drawn.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import logging
import os

import jax
import ml_collections
import numpy as np

from jaxlab import metrics
from jaxlab.errors import ConfigError
from jaxlab.lm import hf, sft_data
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.lm.tokenizer import check_fits, load_tokenizer
from jaxlab.posttrain import evaluate, rewards as rewards_lib, trainers
from jaxlab.state import ModelDef, param_count
from jaxlab.train import run_stages

from . import config as config_lib

THINK_ARMS = ("think", "shuffled", "rft")


# ------------------------------------------------------------------------------------------------ data

def _gen(config, n, seed, orders, mode="shortcut_free"):
  from jaxlab.tom import stories  # pylint: disable=g-import-not-at-top
  d = config.data
  return stories.generate(n, seed=seed, mode=mode, orders=tuple(orders), num_agents=d.num_agents,
                          num_containers=d.num_containers, num_events=d.num_events,
                          max_distractors=d.max_distractors)


def anchor(example) -> str:
  """The anchor cue of a belief question: the chain agent whose EXIT comes first ("none" when no chain agent
  leaves, e.g. order 0): the object's location at that exit is the answer."""
  chain = set(example.question.chain)
  return next((e.agent for e in example.story.events if e.kind == "exit" and e.agent in chain), "none")


def _records(config, examples, tag=""):
  from jaxlab.tom import stories, tokens  # pylint: disable=g-import-not-at-top
  if config.data.names == "canonical":
    examples = [tokens.canonical(e) for e in examples]
  out = stories.to_records(examples)
  for r, ex in zip(out, examples):
    r["pair"] = None if r["twin_id"] is None else f"{tag}{r['twin_id']}"
    if config.data.trace == "anchor":
      r["trace"] = f"{stories._sym(anchor(ex))} -> {r['answer']}"  # pylint: disable=protected-access
  return out


def _read(path, what):
  from jaxlab.data.jsonl import iter_jsonl  # pylint: disable=g-import-not-at-top
  rows = []
  for line_no, rec in iter_jsonl(path):
    if not isinstance(rec, dict) or not {"prompt", "answer", "order"} <= set(rec):
      raise ConfigError(f"{path}:{line_no}: each {what} line needs 'prompt', 'answer' and 'order' (optional "
                        "'trace', 'twin_id')")
    r = {"prompt": str(rec["prompt"]), "answer": str(rec["answer"]), "order": int(rec["order"]),
         "trace": None if rec.get("trace") is None else str(rec["trace"])}
    r["pair"] = None if rec.get("twin_id") is None else str(rec["twin_id"])
    r["false_belief"] = rec.get("false_belief")
    rows.append(r)
  return rows


def datasets(config):
  """(cold, train, test) record lists: {"prompt", "answer", "trace", "order", "pair"} (+ generator metadata).

  Generated: cold = n_cold stories of data.cold_orders, train = n_train of data.rl_orders, test =
  n_test_per_order of each data.test_orders order, with data seeds derived from config.seed (a claim seed never
  shares a story stream with a validation seed). JSONL: cold / train = the train file's records of those
  orders (cold: the first n_cold), test = the test file.
  """
  d, s = config.data, int(config.seed)
  if d.source == "generator":
    cold = _records(config, _gen(config, d.n_cold, 1000 * s + 1, d.cold_orders))
    train = _records(config, _gen(config, d.n_train, 1000 * s + 2, d.rl_orders))
    test = []
    for k in d.test_orders:
      test += _records(config, _gen(config, d.n_test_per_order, 1000 * s + 10 + k, (k,)), tag=f"{k}:")
    return cold, train, test
  rows = _read(d.train_path, "training")
  cold = [r for r in rows if r["order"] in tuple(d.cold_orders)][:d.n_cold]
  train = [r for r in rows if r["order"] in tuple(d.rl_orders)]
  test = _read(d.test_path, "test")
  if not cold or len(train) < config.train.batch_size or not test:
    raise ConfigError(f"config.data.train_path={d.train_path!r} has {len(cold)} records of orders "
                      f"{tuple(d.cold_orders)} and {len(train)} of {tuple(d.rl_orders)} (need >= 1 and >= "
                      f"train.batch_size={config.train.batch_size}); test_path has {len(test)}")
  return cold, train, test


def _generator_digest() -> str:
  """The generator's source (a change to it invalidates a cached base)."""
  from jaxlab.tom import stories  # pylint: disable=g-import-not-at-top
  with open(stories.__file__, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


def prompt_of(config, rec, think: bool) -> str:
  d = config.data
  return rec["prompt"] + (d.instruction_think if think else d.instruction_nothink)


def completion_of(rec, think: bool) -> str:
  """The target completion. A space before the trace and the answer makes each container the same token as in
  the story (the word-level tokenizer's " c3"), so the model copies it; the reward strips it."""
  if not think:
    return f"<answer> {rec['answer']}</answer>"
  if rec.get("trace") is None:
    raise ConfigError("a thinking arm's cold start needs a 'trace' for every record (the witnessed locations, "
                      "e.g. from jaxlab.tom.stories.to_records); drop the thinking arms or set cold.num_steps=0")
  return f"<think> {rec['trace']}</think><answer> {rec['answer']}</answer>"


def tokenizer_for(config, records=()):
  if config.model.hf_path:
    return load_tokenizer(config.model.hf_path)
  from jaxlab.tom import tokens  # pylint: disable=g-import-not-at-top
  tok = tokens.tokenizer()
  unknown = tokens.unknown_bytes(tok, [r["prompt"] for r in records[:200]])
  if unknown:
    raise ConfigError(f"the word-level ToM tokenizer does not cover these prompts ({unknown} byte tokens in the "
                      "first 200): it reads generated symbolic stories; for other text set config.model.hf_path")
  return tok


def model_config(config, tok) -> TransformerConfig:
  m = config.model
  if m.hf_path:
    cfg = hf.config_from_hf(m.hf_path, dtype=m.dtype, remat=m.remat)
    check_fits(tok, cfg.vocab_size, f"the checkpoint {m.hf_path}")
    return cfg
  return TransformerConfig(vocab_size=-(-tok.vocab_size // 8) * 8, hidden=m.hidden, n_layers=m.n_layers,
                           n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, mlp_hidden=m.mlp_hidden,
                           max_position=m.max_position, dtype=m.dtype, tie_embeddings=True, remat=m.remat)


# ------------------------------------------------------------------------------------------------ rewards

def _answer_think(completions, problems):
  return rewards_lib.answer_reward(completions, [p["answer"] for p in problems], numeric=False)


def _answer_nothink(completions, problems):
  return rewards_lib.answer_reward(completions, [p["answer"] for p in problems], numeric=False,
                                   parse=rewards_lib.parse_answer_only)


def reward_fn(config, think: bool) -> rewards_lib.CompositeReward:
  """Thinking-RFT: answer (1 / 0) + format (+-0.5, the tags in order); No-Thinking-RFT: answer equality only."""
  g = config.grpo
  if not think:
    return rewards_lib.CompositeReward(("answer",), (_answer_nothink,), (g.answer_weight,))
  fmt = rewards_lib.weighted_format_reward(g.format_valid, g.format_invalid)
  return rewards_lib.CompositeReward(("answer", "format"), (_answer_think, fmt), (g.answer_weight, 1.0))


def _valid(think: bool):
  parse = rewards_lib.parse_tagged if think else rewards_lib.parse_answer_only
  return lambda completions, problems=None: np.asarray([parse(c).valid for c in completions], np.float32)


# ------------------------------------------------------------------------------------------------ scores

def pair_consistency(records, correct) -> float:
  """Share of counterfactual twin pairs with both members answered correctly (NaN without pairs)."""
  groups = collections.defaultdict(list)
  for r, c in zip(records, correct):
    if r.get("pair") is not None:
      groups[r["pair"]].append(c)
  pairs = [all(v) for v in groups.values() if len(v) >= 2]
  return float(np.mean(pairs)) if pairs else float("nan")


def score(config, model, tok, test, name: str, think: bool) -> dict:
  """Greedy scores of one model on the test records under `eval/..._<name>` keys."""
  c = config
  prompts = [sft_data.encode_prompt(prompt_of(c, r, think), tok) for r in test]
  texts = evaluate.greedy_completions(model, tok, prompts, batch=c.eval.batch, max_new_tokens=c.grpo.max_new_tokens)
  fn = _answer_think if think else _answer_nothink
  correct = np.asarray(fn(texts, test)) > 0
  valid = _valid(think)(texts)
  orders = np.asarray([r["order"] for r in test])
  fb = np.asarray([bool(r.get("false_belief")) for r in test])
  out = {f"eval/correct_{name}": "".join("1" if x else "0" for x in correct),
         f"eval/acc_{name}": float(correct.mean()), f"eval/format_{name}": float(valid.mean()),
         f"eval/pairs_{name}": pair_consistency(test, correct)}
  for k in sorted(set(orders.tolist())):
    out[f"eval/acc_{name}_o{k}"] = float(correct[orders == k].mean())
    if (fb & (orders == k)).any():    # false-belief questions: the real-location rule scores 0 on them
      out[f"eval/acc_{name}_o{k}_fb"] = float(correct[fb & (orders == k)].mean())
  return out


# ------------------------------------------------------------------------------------------------ stages

def rollout_spec(config, tok, num_generations=None) -> trainers.RolloutSpec:
  g = config.grpo
  return trainers.RolloutSpec(num_generations=num_generations or g.num_generations, max_new_tokens=g.max_new_tokens,
                              temperature=g.temperature, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)


def train_and_evaluate(config, workdir: str, until: str | None = None) -> dict:
  """Audit, the base, the cold starts the arms need, their scores, the competence gate, then every arm of
  config.method.arms (`until="gate"`: stop after the gate, the calibration's runs)."""
  config_lib.check_inputs(config)
  cold, train, test = datasets(config)
  tok = tokenizer_for(config, cold + train + test)
  mcfg = model_config(config, tok)
  run = _Run(config, tok, ModelDef(lambda rngs: Transformer(mcfg, rngs=rngs)), mcfg, cold, train, test)
  stages = {}
  if config.data.source == "generator" and until != "gate":     # the gate's calibration skips the audit
    stages["audit"] = run.audit
  arms = tuple(config.method.arms)
  colds = [k for k, need in (("cold_think", any(a in THINK_ARMS for a in arms)),
                             ("cold_nothink", any(a not in THINK_ARMS for a in arms))) if need]
  if config.pretrain.num_steps and not config.model.hf_path:
    stages["pretrain"] = run.pretrain
  if config.cold.num_steps:
    for k in colds:
      stages[k] = functools.partial(run.cold, think=k == "cold_think")
  stages["eval_cold"] = functools.partial(run.eval_cold, colds=colds)
  stages["gate"] = functools.partial(run.gate, colds=colds)
  if until != "gate":
    for arm in arms:
      stages[arm] = functools.partial(run.arm, arm=arm)
  return run_stages(config, workdir, stages)


class _Run:
  """The stages of one run (shared data, tokenizer and model definition)."""

  def __init__(self, config, tok, modeldef, mcfg, cold, train, test):
    self.config, self.tok, self.modeldef, self.mcfg = config, tok, modeldef, mcfg
    self.cold_data, self.train, self.test = cold, train, test
    self._stop_recs = None

  def audit(self, ctx):
    """Claim 1: heuristic and EXIT-deleted learned probes on naive and shortcut-free false-belief questions."""
    from jaxlab.tom import audit as audit_lib  # pylint: disable=g-import-not-at-top
    c, s = self.config, int(self.config.seed)
    orders = tuple(sorted(set(c.data.rl_orders) | set(c.data.test_orders)))
    out = {}
    for mode in ("naive", "shortcut_free"):
      rep = audit_lib.audit(_gen(c, c.audit.n_train, 1000 * s + 3, orders, mode),
                            _gen(c, c.audit.n_test, 1000 * s + 4, orders, mode), ablations=("no_exits",))
      heur = {n: rep.probes[n].accuracy for n in [*audit_lib.HEURISTICS, *audit_lib.FITTED_HEURISTICS]}
      best = max(heur, key=heur.get)
      tag = "naive" if mode == "naive" else "free"
      out.update({f"audit/{tag}_chance": rep.chance.uniform, f"audit/{tag}_best_heuristic": best,
                  f"audit/{tag}_best_heuristic_gap": heur[best] - rep.chance.uniform,
                  f"audit/{tag}_no_exits_gap": rep.probes["learned:no_exits"].accuracy - rep.chance.uniform})
    return out

  def _initial(self, ctx=None):
    """The starting parameters of the cold starts: the checkpoint, the pretrained base, or None (fresh)."""
    m = self.config.model
    if m.hf_path:
      return hf.load_hf_params(m.hf_path, self.mcfg)
    if ctx is not None and "pretrain" in ctx.results:
      return ctx.results["pretrain"]["params"]
    return None

  def pretrain(self, ctx):
    """The base model: order-0 questions over a length curriculum, trained once per settings and cached."""
    from flax import nnx  # pylint: disable=g-import-not-at-top
    from jaxlab import cache  # pylint: disable=g-import-not-at-top
    from jaxlab.tom import stories  # pylint: disable=g-import-not-at-top
    c, p, d = self.config, self.config.pretrain, self.config.data
    spec = {"what": "tom_rft base v3", "pretrain": {k: v for k, v in p.to_dict().items() if k != "cache_dir"},
            "model": dataclasses.asdict(self.mcfg), "data": {k: d[k] for k in (
                "num_agents", "num_containers", "names", "seq_len", "num_events", "max_distractors", "trace",
                "instruction_think", "instruction_nothink")},
            "optimizer": c.train.optimizer.to_dict(), "generator": _generator_digest()}
    file = cache.path("tom_rft", f"base_{cache.digest(spec)}.npz", p.cache_dir)

    def build():
      # the length mix (short stories with <= pretrain.max_distractors: they break the loss plateau), then stories
      # of the test's length and distractors (data.num_events, data.max_distractors)
      parts = [(n_events, p.max_distractors, p.n_per_length) for n_events in p.lengths]
      parts += [(d.num_events, d.max_distractors, p.n_test_length)] if p.n_test_length else []
      recs, short = [], []
      for j, (n_events, distractors, n) in enumerate(parts):
        ex = stories.generate(n, seed=10_000 * p.seed + j, orders=tuple(p.orders), num_agents=d.num_agents,
                              num_containers=d.num_containers, num_events=n_events, max_distractors=distractors)
        recs += ex
        short += [j < len(p.lengths)] * n
      order = np.random.default_rng(p.seed).permutation(len(recs))
      rows = _records(c, [recs[i] for i in order])   # the think format's trace is data.trace, as in the cold start
      think = [p.formats[i % len(p.formats)] == "think" for i in range(len(rows))]
      pc = ml_collections.ConfigDict(c.to_dict())
      pc.seed = p.seed
      # curriculum: the first curriculum_steps on the short stories alone in pretrain.curriculum_format, the rest
      # on the whole mix in every format
      # (at pretrain.mix_learning_rate: the new format's first gradients are large, and at the first phase's rate
      # they undo what it learned)
      phases = [(np.flatnonzero(np.asarray(short)[order]), p.curriculum_steps, "short",
                 [p.curriculum_format == "think"] * len(rows), p.learning_rate)] if p.curriculum_steps else []
      phases.append((np.arange(len(rows)), p.num_steps - p.curriculum_steps, "mix", think,
                     p.mix_learning_rate if p.curriculum_steps and p.mix_learning_rate else p.learning_rate))
      params = None
      for idx, steps, name, fmt, lr in phases:
        stop = self._base_reached if p.stop_at and name == "mix" else None
        params, _ = trainers.sft(pc, os.path.join(ctx.subdir(), name), self.modeldef,
                                 self._rows([rows[i] for i in idx], [fmt[i] for i in idx]), num_steps=steps,
                                 learning_rate=lr, batch_size=p.batch_size,
                                 warmup_steps=p.warmup_steps, init_params=params, stop_every=p.stop_every,
                                 stop_when=stop)
      return self.modeldef.merge(params, {})

    model, cached = cache.load_or_build(file, lambda: Transformer(self.mcfg, rngs=nnx.Rngs(0)), build,
                                        what="ToM base")
    return {"pretrain/cached": bool(cached), "params": jax.device_get(ModelDef.split(model)[0])}

  def _base_reached(self, model) -> bool:
    """The base's early stop: greedy order-0 accuracy >= pretrain.stop_at in every format on stop_n held-out
    stories of the test's length and distractors (a generator seed no other data uses)."""
    from jaxlab.tom import stories, tokens  # pylint: disable=g-import-not-at-top
    c, p = self.config, self.config.pretrain
    if self._stop_recs is None:       # generated once, scored at every check
      ex = _gen(c, p.stop_n, 10_000 * p.seed + 9_999, (0,))
      self._stop_recs = stories.to_records([tokens.canonical(e) for e in ex] if c.data.names == "canonical" else ex)
    return all(score(c, model, self.tok, self._stop_recs, "stop", fmt == "think")["eval/acc_stop"] >= p.stop_at
               for fmt in p.formats)

  def _rows(self, records, think):
    """Padded SFT rows; `think` is one flag for all records or one per record."""
    flags = think if isinstance(think, (list, tuple)) else [think] * len(records)
    recs = [{"prompt": prompt_of(self.config, r, t), "completion": completion_of(r, t)}
            for r, t in zip(records, flags)]
    return sft_data.build_padded(recs, self.tok, self.config.data.seq_len)

  def cold(self, ctx, think: bool):
    """The cold start: SFT on data.cold_orders, with the trace (think) or the bare answer."""
    k = self.config.cold
    init = self._initial(ctx)
    if init is not None and (k.shrink != 1 or k.perturb):
      from flax import nnx  # pylint: disable=g-import-not-at-top
      fresh = ModelDef.split(Transformer(self.mcfg, rngs=nnx.Rngs(self.config.seed + 7)))[0]
      init = jax.tree.map(lambda b, f: k.shrink * b + k.perturb * f, init, fresh)
    params, info = trainers.sft(self.config, ctx.subdir(), self.modeldef, self._rows(self.cold_data, think),
                                num_steps=k.num_steps, learning_rate=k.learning_rate, batch_size=k.batch_size,
                                warmup_steps=k.warmup_steps, init_params=init)
    return {f"{ctx.name}/steps": info["step"], f"{ctx.name}/loss": info.get("train/loss"), "params": params}

  def start(self, ctx, think: bool):
    """(params, eval-mode model) of a cold start (the pretrained checkpoint when cold.num_steps = 0)."""
    name = "cold_think" if think else "cold_nothink"
    params = ctx.results[name]["params"] if self.config.cold.num_steps else self._initial(ctx)
    model = self.modeldef.merge(params, {})
    model.eval()
    return params, model

  def eval_cold(self, ctx, colds):
    out = {"eval/test_orders": "".join(str(min(r["order"], 9)) for r in self.test),
           "eval/test_fb": "".join("1" if r.get("false_belief") else "0" for r in self.test),
           "num_test": len(self.test), "num_train": len(self.train), "num_cold": len(self.cold_data),
           "rl_max_order": max(r["order"] for r in self.train)}
    for name in colds:
      params, model = self.start(ctx, name == "cold_think")
      out.update(score(self.config, model, self.tok, self.test, name, name == "cold_think"))
      out["num_params"] = param_count(params)
    return out

  def gate(self, ctx, colds):
    """The competence gate (pre-registered, checked before any arm runs): the base's held-out order-0 accuracy in
    each pretraining format >= gate.order0, and each cold start's accuracy on order-1 false-belief questions
    (chance 1/num_containers; the real-location rule scores 0) >= gate.false_belief_o1."""
    c, g = self.config, self.config.gate
    out, failed = {}, []
    if "pretrain" in ctx.results:
      model = self.modeldef.merge(ctx.results["pretrain"]["params"], {})
      model.eval()
      test0 = [r for r in self.test if r["order"] == 0]
      for fmt in c.pretrain.formats:
        s = score(c, model, self.tok, test0, "base", fmt == "think")
        out[f"gate/base_o0_{fmt}"], out[f"gate/base_format_{fmt}"] = s["eval/acc_base"], s["eval/format_base"]
        if s["eval/acc_base"] < g.order0:
          failed.append(f"the base's order-0 accuracy ({fmt}) {s['eval/acc_base']:.3f} < {g.order0}")
    for name in colds:
      acc = ctx.results["eval_cold"].get(f"eval/acc_{name}_o1_fb", float("nan"))
      out[f"gate/{name}_o1_fb"] = acc
      if not acc >= g.false_belief_o1:
        failed.append(f"{name}'s order-1 false-belief accuracy {acc:.3f} < {g.false_belief_o1}")
    out["gate/pass"] = not failed
    if failed and g.enforce:
      logging.warning("competence gate failed (%s): the arms are not run (no arm is compared on a model that cannot "
                      "do the task); raise model.hidden / model.n_layers or the pretrain / cold steps (README, "
                      "calibration), or set gate.enforce=False to run them anyway", "; ".join(failed))
    return out

  def arm(self, ctx, arm: str):
    """One arm from its cold start (sub-run in stages/<arm>/), then its scores (and KL to the start)."""
    c = self.config
    if c.gate.enforce and not ctx.results["gate"]["gate/pass"]:
      return {f"{arm}/skipped": "competence gate failed"}
    think = arm in THINK_ARMS
    start_params, start_model = self.start(ctx, think)
    problems = self.train
    prompts = [sft_data.encode_prompt(prompt_of(c, r, think), self.tok) for r in problems]
    out = {}
    if arm == "sft":
      g = c.grpo
      params, _ = trainers.sft(c, ctx.subdir(), self.modeldef, self._rows(problems, False),
                               num_steps=c.train.num_steps * g.num_iterations, learning_rate=c.sft.learning_rate,
                               batch_size=c.train.batch_size, warmup_steps=c.train.optimizer.warmup_steps,
                               init_params=start_params)
    elif arm == "rft":
      r = c.rft
      idx = np.random.default_rng([c.seed, 2]).choice(len(problems), size=min(r.prompts, len(problems)),
                                                      replace=False)
      g = c.grpo
      params, stats = trainers.rejection_finetune(
          c, ctx.subdir(), start_model, self.modeldef, [prompts[i] for i in idx], [problems[i] for i in idx],
          reward_fn(c, True), self.tok, spec=rollout_spec(c, self.tok, r.samples), key=jax.random.key(c.seed + 3),
          seq_len=c.data.seq_len, num_steps=r.num_steps, learning_rate=r.learning_rate,
          batch_size=c.cold.batch_size, warmup_steps=c.cold.warmup_steps,
          threshold=g.answer_weight + g.format_valid, init_params=start_params)
      params = start_params if params is None else params
      out["rft/kept"] = stats["kept"]
    else:
      state = trainers.grpo(c, ctx.subdir(), self.modeldef, start_params, prompts, problems, reward_fn(c, think),
                            self.tok, gcfg=config_lib.grpo_config(c), spec=rollout_spec(c, self.tok),
                            key=jax.random.key(c.seed + 7919 * (1 + config_lib.GRPO_ARMS.index(arm))),
                            shuffle_rewards=arm == "shuffled")
      params = jax.device_get(state.params)
    m = self.modeldef.merge(params, {})
    m.eval()
    out.update(score(c, m, self.tok, self.test, arm, think))
    if arm in config_lib.GRPO_ARMS:
      g = c.grpo
      kl_prompts = [sft_data.encode_prompt(prompt_of(c, r, think), self.tok) for r in self.test[:c.eval.kl_prompts]]
      out[f"eval/kl_{arm}"] = evaluate.kl_to_reference(
          m, start_model, kl_prompts, samples=4, key=jax.random.key(c.seed + 11), max_new_tokens=g.max_new_tokens,
          temperature=g.temperature, stop_tokens=(self.tok.eos_id,), pad_id=self.tok.pad_id)
    return out


# ------------------------------------------------------------------------------------------------ plots

def plot(runs, workdirs, out_dir):
  """Greedy accuracy on false-belief questions per test order for the cold starts and each arm (mean over seeds;
  the claims' statistic) and the GRPO reward curves (or, when the competence gate stopped the run, its note)."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  os.makedirs(out_dir, exist_ok=True)
  names = [a for a in ("cold_nothink", "cold_think", *config_lib.ARMS) if f"eval/acc_{a}" in runs[0]]
  orders = sorted({int(k[len(f"eval/acc_{names[0]}_o"):-len("_fb")]) for k in runs[0]
                   if k.startswith(f"eval/acc_{names[0]}_o") and k.endswith("_fb")})
  fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
  for j, a in enumerate(names):
    ys = [np.mean([r[f"eval/acc_{a}_o{k}_fb"] for r in runs]) for k in orders]
    ax[0].plot(orders, ys, "o-" if not a.startswith("cold") else "o:", color=f"C{j}", label=a)
  if "audit/free_chance" in runs[0]:   # 1 / containers; a false-belief answer is one of the others
    ax[0].axhline(1 / (1 / runs[0]["audit/free_chance"] - 1), color="0.5", lw=0.8, ls="--", label="chance")
  ax[0].axvspan(runs[0].get("rl_max_order", 2) + 0.5, orders[-1] + 0.3, color="0.9")
  ax[0].set_ylim(-0.02, 1.02)
  if runs[0].get("gate/pass") is False and not set(names) & set(config_lib.ARMS):
    ax[1].text(0.5, 0.5, "competence gate failed:\nthe arms were not run", ha="center", va="center",
               transform=ax[1].transAxes)
  ax[0].set_ylabel("greedy accuracy, false-belief questions")
  ax[0].set_xlabel("belief order (shaded: never trained on)")
  ax[0].set_xticks(orders)
  ax[0].legend(fontsize=8)
  for k, wd in enumerate(workdirs):
    for arm, style in (("think", "-"), ("shuffled", "--"), ("nothink", ":")):
      rows = [x for x in metrics.read_metrics(os.path.join(wd, "stages", arm)) if "rollout/answer" in x]
      if rows:
        ax[1].plot([x["step"] for x in rows], [x["rollout/answer"] for x in rows], style, color=f"C{k}",
                   label=f"{arm} (seed {k})")
  ax[1].set_xlabel("GRPO step")
  ax[1].set_ylabel("sampled answer reward")
  if ax[1].get_lines():
    ax[1].legend(fontsize=7, ncol=2)
  return [save(fig, out_dir, "tom_rft.png", dpi=120)]
