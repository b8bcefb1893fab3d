"""VR-Thinker: anchors, loss-mask check, cold starts, RFT, GRPO arms; multi-turn scores on held-out pairs.

Launch: python -m jaxlab.main --config experiments/vr_thinker/config.py:tiny --workdir /tmp/vr_thinker
The run is a sequence of stages (`jaxlab.train.run_stages`; each recorded once, a rerun skips the finished ones):

* `anchors`: the closed-form no-tool Bayes ceiling c and oracle tool accuracy A* of the task, and the scripted
  oracle run through the real environment and rollout loop on the test pairs (its measured accuracy and
  largest visual context);
* `check`: the gradient of the SFT and GRPO losses with respect to the logits at prompt and observation
  positions (must be exactly 0: tool outputs are context, never targets);
* `cold_tool` / `cold_notool`: SFT on scripted traces with / without the tool (sub-runs in stages/<name>/);
* `eval_cold`: both cold starts scored;
* one stage per arm of config.method.arms (rft, rft_grpo, grpo, notool_grpo), each trained in its own
  resumable sub-run and scored.

Scores of a model (`eval/<name>` keys): per-pair correctness of one sampled rollout per test pair at the GRPO
temperature (`eval/correct_<name>`, a 0/1 string; `eval/acc_<name>`), the greedy accuracy, the format-valid
rate, tool calls per pair and the largest visual context over all turns (tracked against
the bound (2 N_in + p K) V, `eval/window_excess_<name>`).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import metrics
from jaxlab.encoders.vision_tower import VisionTower, VisionTowerConfig
from jaxlab.lm import hf, sft_data
from jaxlab.errors import ConfigError
from jaxlab.lm.model import TransformerConfig
from jaxlab.lm.tokenizer import check_fits
from jaxlab.lm.vlm import VisionLM, VLMConfig
from jaxlab.posttrain import frame_select as fs
from jaxlab.posttrain import rewards as rewards_lib, trainers
from jaxlab.posttrain.grpo import grpo_loss
from jaxlab.posttrain.rollout import decode_completion
from jaxlab.state import ModelDef, param_count
from jaxlab.train import run_stages

from . import config as config_lib

# ------------------------------------------------------------------------------------------------ model

def model_config(config, task, tok) -> VLMConfig:
  m = config.model
  if m.hf_path:
    dec = hf.config_from_hf(m.hf_path, dtype=m.dtype, remat=m.remat)
    check_fits(tok, dec.vocab_size, f"the checkpoint {m.hf_path}")
    vis = VisionTowerConfig.from_hf(m.vision_path)
  else:
    dec = TransformerConfig(vocab_size=-(-tok.vocab_size // 8) * 8, hidden=m.hidden, n_layers=m.n_layers,
                            n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, mlp_hidden=m.mlp_hidden,
                            max_position=m.max_position, dtype=m.dtype, tie_embeddings=True, remat=m.remat)
    vis = VisionTowerConfig(arch="siglip", hidden_size=m.vision_hidden, num_hidden_layers=m.vision_layers,
                            num_attention_heads=m.vision_heads, intermediate_size=m.vision_mlp, patch_size=m.patch,
                            image_size=task.image_size, num_channels=1, layer_norm_eps=1e-6,
                            hidden_act="gelu_pytorch_tanh")
  return VLMConfig(decoder=dec, vision=vis, image_token_base=dec.vocab_size, max_images=task.num_images,
                   remat_vision=m.remat)


def initial_params(config, vcfg: VLMConfig, modeldef: ModelDef):
  """The composed VLM's starting parameters from local checkpoints (full), or None (fresh init)."""
  m = config.model
  if not m.hf_path:
    return None
  from flax import nnx  # pylint: disable=g-import-not-at-top
  decoder = hf.from_pretrained(m.hf_path, dtype=m.dtype)
  tower = VisionTower.from_pretrained(m.vision_path)
  return ModelDef.split(VisionLM(vcfg, rngs=nnx.Rngs(config.seed), vision=tower, decoder=decoder))[0]


# ------------------------------------------------------------------------------------------------ data

def datasets(config, task, vocab, image_cfg) -> dict[str, dict]:
  """{"cold", "train", "test"} -> {"images" (n, 2T, S, S, C), "problems" (reward references), "prompts"}.

  Generator: video pairs (`frame_select.make_pairs`), data seeds derived from config.seed. JSON: the
  preference records of data.path (`frame_select.load_preference_json`), frames resized and normalised for the
  tower (`vision_tower.preprocess`), the last data.n_test records held out; no cold-start split (the scripted
  traces need the generator's defect positions: start from a cold-started checkpoint, cold.num_steps = 0).
  """
  d, s = config.data, int(config.seed)
  if d.source == "generator":
    out = {}
    for j, (name, n) in enumerate((("cold", d.n_cold), ("train", d.n_train), ("test", d.n_test))):
      pairs = fs.make_pairs(task, n, 1000 * s + j)
      out[name] = {"images": pairs["images"], "problems": fs.problems(task, pairs), "prompts": [vocab.prompt()] * n}
    return out
  from jaxlab.encoders.vision_tower import preprocess  # pylint: disable=g-import-not-at-top
  recs = fs.load_preference_json(d.path, frames_per_video=task.frames, dimensions=task.dimensions,
                                 root=d.root or None)
  if len(recs) <= d.n_test:
    raise ConfigError(f"config.data.path={d.path!r} holds {len(recs)} records; need more than data.n_test="
                      f"{d.n_test} (the last n_test are held out)")
  def split(rs):
    frames = np.stack([r["frames"].reshape((-1,) + r["frames"].shape[2:]) for r in rs])    # (n, 2T, H, W, C)
    n, k = frames.shape[:2]
    images = np.asarray(jax.device_get(preprocess(frames.reshape((n * k,) + frames.shape[2:]), image_cfg)))
    return {"images": images.reshape((n, k) + images.shape[1:]),
            "problems": [{"labels": r["labels"], "defect": None} for r in rs],
            "prompts": [vocab.prompt(r["prompt"]) for r in rs]}
  return {"train": split(recs[:-d.n_test]), "test": split(recs[-d.n_test:])}


def tokenizer_for(config, task):
  """The word-level format tokenizer, or a checkpoint's tokenizer holding the format's words as specials."""
  if not config.model.hf_path:
    return fs.tokenizer(task)
  from jaxlab.lm.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  tok = load_tokenizer(config.model.tokenizer or config.model.hf_path)
  missing = fs.missing_format_tokens(task, tok)
  if missing:
    raise ConfigError(f"the tokenizer of {config.model.tokenizer or config.model.hf_path} lacks {len(missing)} of the "
                      f"trace format's words as special tokens (e.g. {missing[:3]}); write a copy with them: "
                      "python -c 'from jaxlab.posttrain import frame_select as fs; fs.add_format_tokens(fs.FrameTask("
                      "...), SRC, DST)' and pass --config.model.tokenizer=DST")
  return tok


def reward_fn(config, task) -> rewards_lib.CompositeReward:
  """Per-dimension accuracy (weights summing to accuracy_weight) + format (valid / invalid), optional tool bonus."""
  g = config.grpo
  parse = fs.parse_trace(task)
  dims = rewards_lib.dimension_rewards(task.dimensions, parse=parse)
  terms = [(n, f, g.accuracy_weight / len(dims)) for n, f in dims]
  terms.append(("format", rewards_lib.weighted_format_reward(g.format_valid, g.format_invalid, parse=parse), 1.0))
  if g.tool_bonus:
    terms.append(("tool", rewards_lib.tool_call_reward, g.tool_bonus))
  return rewards_lib.CompositeReward.of(terms)


# ------------------------------------------------------------------------------------------------ stages

def train_and_evaluate(config, workdir: str) -> dict:
  """Anchors, the loss-mask check, both cold starts, their scores, then every arm of config.method.arms."""
  config_lib.check_inputs(config)
  task = config_lib.task(config)
  tok = tokenizer_for(config, task)
  vcfg = model_config(config, task, tok)
  run = _Run(config, task, tok, vcfg)
  stages = {"anchors": run.anchors, "check": run.check} if config.data.source == "generator" else {}
  arms = tuple(config.method.arms)
  if config.cold.num_steps:
    stages["cold_tool"] = functools.partial(run.cold, tool=True)
    stages["cold_notool"] = functools.partial(run.cold, tool=False)
  stages["eval_cold"] = run.eval_cold
  for arm in arms:
    stages[arm] = functools.partial(run.arm, arm=arm)
  return run_stages(config, workdir, stages)


class _Run:
  """The stages of one run (shared task, tokenizer, model definition and data)."""

  def __init__(self, config, task, tok, vcfg):
    self.config, self.task, self.tok, self.vcfg = config, task, tok, vcfg
    self.vocab = fs.Vocab(task, tok, vcfg.image_tokens)
    self.env = fs.SelectFramesEnv(self.vocab)
    self.modeldef = ModelDef(lambda rngs: VisionLM(vcfg, rngs=rngs))
    self.data = datasets(config, task, self.vocab, vcfg.vision)
    self.problems = {k: v["problems"] for k, v in self.data.items()}
    self.width = config.data.seq_len + 1

  # -- helpers ------------------------------------------------------------------------------------------

  def spec(self, tool: bool, *, num_generations=None, temperature=None) -> trainers.RolloutSpec:
    g, t = self.config.grpo, self.task
    kw = dict(env=self.env, max_turns=t.max_turns, tool_end_id=self.vocab.tool_end, memory_window=t.window,
              memory_placeholder=(self.vocab.forgotten,) if t.window is not None else None) if tool else {}
    return trainers.RolloutSpec(num_generations=num_generations or g.num_generations, max_new_tokens=g.max_new_tokens,
                                temperature=g.temperature if temperature is None else temperature,
                                stop_tokens=(self.tok.eos_id,), pad_id=self.tok.pad_id, width=self.width,
                                batch_bucket=self.config.eval.batch_bucket, row_bucket=self.config.eval.row_bucket,
                                **kw)

  def bound(self) -> int:
    """The window bound on visual tokens in any context: (2 N_in + p K) V (all observations when p is None)."""
    t = self.task
    p = t.window if t.window is not None else t.max_turns - 1
    return (2 * t.initial + p * t.per_call) * self.vcfg.tokens_per_image

  def rows(self, split: str, kinds) -> dict[str, np.ndarray]:
    """SFT rows of scripted traces of `split`'s pairs (one kind per pair), each with its pair's images."""
    rng = np.random.default_rng([int(self.config.seed), 5])
    seqs, owner = [], []
    window = self.task.window if any(k != "no_tool" for k in kinds) else None
    for i, (p, kind) in enumerate(zip(self.problems[split], kinds)):
      trace = fs.scripted_trace(self.task, p["defect"], rng, kind)
      for r in fs.trace_rows(self.task, self.vocab, trace, window=window):
        seqs.append(r)
        owner.append(i)
    rows = sft_data.pad_rows(seqs, self.config.data.seq_len, self.tok.pad_id)
    rows["images"] = self.data[split]["images"][np.asarray(owner)]
    return rows

  def merged(self, params):
    """The eval-mode VLM of `params` (its model state: the empty visual bank)."""
    state = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), self.modeldef.abstract()[1])
    model = self.modeldef.merge(params, state)
    model.eval()
    return model

  def score(self, model, name: str, tool: bool) -> dict:
    """Held-out scores of one model under `eval/..._<name>` keys (module docstring)."""
    c, t = self.config, self.task
    test, refs = self.data["test"], self.problems["test"]
    prompts = test["prompts"]
    inputs = {"images": test["images"]}
    parse = fs.parse_trace(t)
    out = {}
    for mode, temp in (("", None), ("greedy_", 0.0)):
      roll = self.spec(tool, num_generations=1, temperature=temp).rollout(
          model, prompts, jax.random.key(int(c.seed) + 101), prompt_inputs=inputs)
      texts = [decode_completion(self.tok, g) for g in roll.generated]
      correct = fs.judgement_correct(t, texts, refs) > 0
      valid = np.asarray([parse(x).valid for x in texts])
      visual = int((roll.tokens >= self.vcfg.image_token_base).sum(axis=1).max())
      out.update({f"eval/{mode}acc_{name}": float(correct.mean()), f"eval/{mode}format_{name}": float(valid.mean()),
                  f"eval/{mode}calls_{name}": float(np.mean([x.count("<tool>") for x in texts])),
                  f"eval/{mode}max_visual_{name}": visual})
      if not mode:
        out[f"eval/correct_{name}"] = "".join("1" if x else "0" for x in correct)
    if tool:
      out[f"eval/window_excess_{name}"] = max(out[f"eval/max_visual_{name}"], out[f"eval/greedy_max_visual_{name}"]
                                              ) - self.bound()
    return out

  # -- stages -------------------------------------------------------------------------------------------

  def anchors(self, ctx):
    """The closed-form anchors and the scripted oracle through the real environment and rollout loop."""
    a = fs.anchors(self.task)
    refs = self.problems["test"]
    rng = np.random.default_rng(0)
    traces = [fs.scripted_trace(self.task, p["defect"], rng) for p in refs]
    end = self.vocab.tool_end

    def oracle(contexts, key, inputs):
      """Replays each pair's scripted turn; the turn is the number of calls already in the context."""
      del key
      out = []
      for ids, i in zip(contexts, inputs["pair"]):
        turn = sum(1 for x in ids if x == end)
        out.append(self.tok.encode(traces[i][turn][0]) + ([self.tok.eos_id] if turn == len(traces[i]) - 1 else []))
      return out, [np.zeros(len(o), np.float32) for o in out]

    roll = self.spec(True, num_generations=1).rollout(oracle, self.data["test"]["prompts"], jax.random.key(0),
                                                      prompt_inputs={"pair": np.arange(len(refs))})
    texts = [decode_completion(self.tok, g) for g in roll.generated]
    return {"anchor/q": a["q"], "anchor/bayes_no_tool": a["bayes_no_tool"], "anchor/oracle": a["oracle"],
            "anchor/oracle_simulated": float(fs.judgement_correct(self.task, texts, refs).mean()),
            "anchor/oracle_max_visual": int((roll.tokens >= self.vcfg.image_token_base).sum(axis=1).max()),
            "anchor/window_bound": self.bound(), "num_test": len(refs)}

  def check(self, ctx):
    """d loss / d logits at context (prompt, observation, placeholder) positions: SFT and GRPO losses."""
    from jaxlab.lm import sft as sft_lib  # pylint: disable=g-import-not-at-top
    params, state = self.modeldef.init(jax.random.key(int(self.config.seed)))
    model = self.modeldef.merge(params, state)
    rows = self.rows("cold", ["oracle"] * 16)
    batch = {k: jnp.asarray(v[:16]) for k, v in rows.items()}
    logits = model(batch["inputs"], batch["positions"], segment_ids_bl=batch["segment_ids"], images=batch["images"])
    g_sft = jax.grad(lambda lg: sft_lib.sft_loss(lg, batch["targets"], batch["loss_mask"])[0])(logits)
    ctx_pos = np.asarray(batch["loss_mask"]) == 0
    gcfg = config_lib.grpo_config(self.config)
    tokens = jnp.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
    mask = jnp.pad(batch["loss_mask"], ((0, 0), (1, 0)))
    adv = jnp.linspace(-1.0, 1.0, tokens.shape[0])

    def grpo_of(lg):
      lp = -sft_lib.token_stats(lg, tokens[:, 1:])[0]
      lp = jnp.pad(lp, ((0, 0), (1, 0)))
      return grpo_loss(lp, None, None, adv, mask, gcfg)[0]

    g_grpo = jax.grad(grpo_of)(logits)         # tokens[:, :-1] are the SFT inputs: the same forward
    worst = max(float(jnp.abs(g_sft)[ctx_pos].max()), float(jnp.abs(g_grpo)[ctx_pos].max()))
    return {"check/obs_grad_max": worst, "check/target_grad_max": float(jnp.abs(g_sft)[~ctx_pos].max()),
            "check/context_tokens": int(ctx_pos.sum())}

  def cold(self, ctx, tool: bool):
    """Cold start: SFT on scripted traces (tool: oracle with a noisy share; no tool: answer from the view)."""
    k, d = self.config.cold, self.config.data
    n = len(self.problems["cold"])
    if tool:
      noisy = np.random.default_rng([int(self.config.seed), 4]).random(n) < d.noisy_share
      kinds = ["noisy" if x else "oracle" for x in noisy]
    else:
      kinds = ["no_tool"] * n
    params, info = trainers.sft(self.config, ctx.subdir(), self.modeldef, self.rows("cold", kinds),
                                num_steps=k.num_steps, learning_rate=k.learning_rate, batch_size=k.batch_size,
                                warmup_steps=k.warmup_steps, init_params=initial_params(self.config, self.vcfg,
                                                                                        self.modeldef))
    return {f"{ctx.name}/steps": info["step"], f"{ctx.name}/loss": info.get("train/loss"), "params": params}

  def start(self, ctx, name: str):
    """(params, eval-mode model) of a finished stage (or the initial checkpoint when cold.num_steps = 0)."""
    if name in ctx.results:
      params = ctx.results[name]["params"]
    else:
      params = initial_params(self.config, self.vcfg, self.modeldef)
    return params, self.merged(params)

  def eval_cold(self, ctx):
    out = {"num_train": len(self.problems["train"]), "num_cold": len(self.problems.get("cold", ()))}
    for name, tool in (("cold_tool", True), ("cold_notool", False)):
      params, model = self.start(ctx, name)
      out.update(self.score(model, name, tool))
      out["num_params"] = param_count(params)
    out["num_test"] = len(self.problems["test"])
    return out

  def arm(self, ctx, arm: str):
    c = self.config
    tool = arm != "notool_grpo"
    source = {"rft": "cold_tool", "rft_grpo": "rft", "grpo": "cold_tool", "notool_grpo": "cold_notool"}[arm]
    start_params, start_model = self.start(ctx, source)
    train = self.data["train"]
    prompts, refs = train["prompts"], self.problems["train"]
    inputs = {"images": train["images"]}
    out = {}
    if arm == "rft":
      r, g = c.rft, c.grpo
      idx = np.random.default_rng([int(c.seed), 2]).choice(len(refs), size=min(r.prompts, len(refs)), replace=False)
      params, stats = trainers.rejection_finetune(
          c, ctx.subdir(), start_model, self.modeldef, [prompts[i] for i in idx], [refs[i] for i in idx],
          reward_fn(c, self.task), self.tok, spec=self.spec(True, num_generations=r.samples),
          key=jax.random.key(int(c.seed) + 3), seq_len=c.data.seq_len, num_steps=r.num_steps,
          learning_rate=r.learning_rate, batch_size=c.cold.batch_size, warmup_steps=c.cold.warmup_steps,
          threshold=g.accuracy_weight + g.format_valid, init_params=start_params,
          prompt_inputs={"images": train["images"][idx]})
      params = start_params if params is None else params
      out.update({"rft/kept": stats["kept"], "rft/sampled": stats["sampled"]})
    else:
      state = trainers.grpo(c, ctx.subdir(), self.modeldef, start_params, prompts, refs, reward_fn(c, self.task),
                            self.tok, gcfg=config_lib.grpo_config(c), spec=self.spec(tool),
                            key=jax.random.key(int(c.seed) + 7919 * (1 + config_lib.ARMS.index(arm))),
                            prompt_inputs=inputs)
      params = jax.device_get(state.params)
    out.update(self.score(self.merged(params), arm, tool))
    out["params"] = params
    return out


# ------------------------------------------------------------------------------------------------ plots

def plot(runs, workdirs, out_dir):
  """Sampled accuracy per arm against the anchors (mean over seeds), and the GRPO reward curves."""
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (headless Agg backend)
  os.makedirs(out_dir, exist_ok=True)
  names = [a for a in ("cold_notool", "notool_grpo", "cold_tool", "rft", "grpo", "rft_grpo")
           if f"eval/acc_{a}" in runs[0]]
  fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
  ys = [np.mean([r[f"eval/acc_{a}"] for r in runs]) for a in names]
  ax[0].bar(range(len(names)), ys, color=["0.6" if "notool" in a else "C0" for a in names])
  r0 = runs[0]
  ax[0].axhline(r0["anchor/bayes_no_tool"], color="k", ls=":", label="no-tool Bayes ceiling c")
  ax[0].axhline(r0["anchor/oracle"], color="C2", ls="--", label="oracle tool policy A*")
  ax[0].set_xticks(range(len(names)))
  ax[0].set_xticklabels(names, rotation=20, fontsize=8)
  ax[0].set_ylim(0.4, 1.02)
  ax[0].set_ylabel("accuracy (sampled, held-out pairs)")
  ax[0].legend(fontsize=8)
  for k, wd in enumerate(workdirs):
    for arm, style in (("rft_grpo", "-"), ("grpo", "--"), ("notool_grpo", ":")):
      rows = [x for x in metrics.read_metrics(os.path.join(wd, "stages", arm)) if "rollout/reward" in x]
      if rows:
        ax[1].plot([x["step"] for x in rows], [x["rollout/reward"] for x in rows], style, color=f"C{k}",
                   label=f"{arm} (seed {k})")
  ax[1].set_xlabel("GRPO step")
  ax[1].set_ylabel("mean rollout reward")
  ax[1].legend(fontsize=7, ncol=2)
  return [save(fig, out_dir, "vr_thinker.png", dpi=120)]
