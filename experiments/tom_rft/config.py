"""ToM RFT: shortcut audit, then Thinking-RFT vs No-Thinking-RFT vs SFT on shortcut-free belief questions.

Zhong, Lai, Li, Li, Liu, Dariush, Psounis, Lo, "From Shortcuts to Reasoning: Robust Post-Training of Theory of
Mind with RL", ICML 2026 (arXiv 2606.09092). The data and the audit are `jaxlab.tom`; the arms run on the
post-training trainers (`jaxlab.posttrain.trainers`): a cold start by SFT on belief orders <= 1 (with a
reasoning trace for the thinking arms, the bare answer for the others), then on orders <= 2

* `sft`: SFT on the gold answers (the no-thinking cold start continued; as many labelled prompts as GRPO sees),
* `nothink`: No-Thinking-RFT, GRPO with the equality reward on `<answer>c</answer>`,
* `think`: Thinking-RFT, GRPO with format (+-0.5) + answer (1 / 0) rewards on `<think>..</think><answer>..`,
* `shuffled`: `think` with rewards permuted across the batch (the no-signal control),
* `rft`: rejection-sampling fine-tuning from the thinking cold start,

and every arm is scored greedily on shortcut-free test questions of orders 0-4 (3-4 never trained on),
with the counterfactual twins' pair consistency.

Variants: tiny (symbolic stories, a word-level tokenizer, a 3-layer Llama from scratch, CPU minutes), small
(wider, more steps), full (a local Hugging Face checkpoint, `--config.model.hf_path=DIR`, data from
`--config.data.train_path` / `test_path` JSONL files with {"prompt", "answer", "trace"?, "order", "twin_id"?}
lines, e.g. `jaxlab.tom.stories.write_jsonl` output or Hi-ToM / ToMi CSVs converted with `jaxlab.tom.hitom_files`).
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

SEEDS = (10, 11, 12)   # v2 claim seeds, never run before (v1's were 0-2; validation seeds 100+, README)
SEEDS_V1 = (0, 1, 2)
ARMS = ("sft", "nothink", "think", "shuffled", "rft")
GRPO_ARMS = ("nothink", "think", "shuffled")


# ------------------------------------------------------------------------------------------------ claims

def _bits(s: str) -> np.ndarray:
  return np.frombuffer(s.encode(), np.uint8) - ord("0")


def _orders(run, orders) -> np.ndarray:
  o = _bits(run["eval/test_orders"])
  return np.isin(o, orders)


def _require_arm(run, arm: str, key: str) -> None:
  """A clear error when `arm` has no `key` because the competence gate skipped it on this seed."""
  if key not in run and run.get("gate/pass") is False:
    raise ValueError(f"arm {arm!r} did not run: the competence gate failed on this seed (gate/* in the summary)")


def per_question(run, arm: str, orders, fb: bool = False) -> np.ndarray:
  """Greedy correctness (0/1) of an arm on the test questions of the given orders (fb: false-belief ones only,
  where the answer is not the object's real location)."""
  _require_arm(run, arm, f"eval/correct_{arm}")
  keep = _orders(run, orders)
  if fb:
    keep &= _bits(run["eval/test_fb"]) == 1
  return _bits(run[f"eval/correct_{arm}"])[keep].astype(np.float64)


def paired_interval(runs, a: str, b: str, orders, *, fb: bool = False, reps: int = 4000,
                    level: float = 0.95) -> tuple[float, float, float]:
  """Mean over seeds of acc(a) - acc(b) on `orders` (fb: false-belief questions only), and the lower and upper
  ends of its two-sided paired bootstrap interval (questions resampled within each seed, the same draw for both
  arms)."""
  rng = np.random.default_rng(0)
  point, boots = 0.0, np.zeros(reps)
  for r in runs:
    d = per_question(r, a, orders, fb) - per_question(r, b, orders, fb)
    point += d.mean() / len(runs)
    boots += d[rng.integers(0, len(d), size=(reps, len(d)))].mean(axis=1) / len(runs)
  low, high = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
  return point, float(low), float(high)


def paired_diff(runs, a: str, b: str, orders, *, reps: int = 4000, level: float = 0.95) -> tuple[float, float]:
  """(mean difference, lower interval end) of `paired_interval` on all questions of `orders` (claims v1)."""
  return paired_interval(runs, a, b, orders, reps=reps, level=level)[:2]


def _diff(a, b, orders):
  return lambda runs: paired_diff(runs, a, b, orders)[0]


def _diff_low(a, b, orders):
  return lambda runs: paired_diff(runs, a, b, orders)[1]


def _fb_low(a, b, orders):
  return lambda runs: paired_interval(runs, a, b, orders, fb=True)[1]


def _fb_high(a, b, orders):
  return lambda runs: paired_interval(runs, a, b, orders, fb=True)[2]


def _arm_min(arm, key):
  def metric(runs):
    for r in runs:
      _require_arm(r, arm, key)
    return claims.minimum(key)(runs)
  return metric


def _gate_min(prefix):
  return lambda runs: float(min(v for r in runs for k, v in r.items() if k.startswith(prefix)))


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`tom_rft` (Zhong et al., ICML 2026: ToM post-training, shortcuts vs reasoning)",
    claim=("v2: shortcut audit (naive data solvable by a heuristic, shortcut-free data not); a competence gate "
           "(base order 0 >= 0.98, cold starts >= 0.4 on order-1 false beliefs); on false-belief questions "
           "Thinking-RFT (GRPO, format + answer) beats its cold start, No-Thinking-RFT and SFT on order 2 and SFT "
           "on held-out orders 3-4, keeps its format, and the shuffled-reward control does not improve"),
    note=("blocked at the gate: the base passes order 0 (0.999) but its cold starts answer the real location on "
          "order-1 false beliefs (0.08-0.20; 2 x 64 and 4 x 128 alike), so no arm ran; v1 and the gate "
          "calibration in the README"),
)

RL = (0, 1, 2)
HELD_OUT = (3, 4)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.n_cold": 64, "data.n_train": 64, "data.n_test_per_order": 8, "cold.num_steps": 4,
          "cold.batch_size": 16, "model.hidden": 32, "model.mlp_hidden": 64, "model.n_layers": 1,
          "grpo.num_generations": 2, "grpo.max_new_tokens": 8, "train.batch_size": 4, "train.num_steps": 2,
          "train.checkpoint_every": 1, "train.log_every": 1, "train.optimizer.warmup_steps": 1, "rft.prompts": 8,
          "rft.samples": 2, "rft.num_steps": 2, "audit.n_train": 200, "audit.n_test": 100, "eval.batch": 40,
          "eval.kl_prompts": 4, "pretrain.num_steps": 3, "pretrain.batch_size": 8, "pretrain.n_per_length": 8,
          "pretrain.lengths": (2, 4), "pretrain.warmup_steps": 1,
          "pretrain.n_test_length": 8, "pretrain.curriculum_steps": 1, "gate.enforce": False}

# Claims v2 (issue 74; v1 and its audit stay in the README): the audit claims as in v1; the competence gate; then
# every comparison on FALSE-BELIEF questions (the answer is not the real location, so the shortcut that scored
# 0.50 on v1's orders 1-4 scores 0), each a paired bootstrap 95% interval over seeds and questions.
CLAIMS = [
    claims.Claim("naive_shortcut", "naive data: the best heuristic probe's accuracy on false-belief questions minus "
                 "chance (smallest over seeds)", claims.minimum("audit/naive_best_heuristic_gap"), ">=", 0.30),
    claims.Claim("free_heuristics", "shortcut-free data: the best heuristic probe minus chance on false-belief "
                 "questions (largest over seeds)", claims.maximum("audit/free_best_heuristic_gap"), "<=", 0.05),
    claims.Claim("free_learned_probe", "shortcut-free data: the EXIT-deleted learned probe minus chance on "
                 "false-belief questions (largest over seeds)", claims.maximum("audit/free_no_exits_gap"), "<=",
                 0.10),
    claims.Claim("gate_base_o0", "competence gate: the base's held-out order-0 accuracy, smallest over formats and "
                 "seeds", _gate_min("gate/base_o0_"), ">=", 0.98),
    claims.Claim("gate_cold_o1_fb", "competence gate: the cold starts' order-1 false-belief accuracy, smallest "
                 "over both starts and seeds (chance 0.2)", _gate_min("gate/cold_"), ">=", 0.40),
    claims.Claim("think_gain_fb", "false-belief questions of orders 1-2: lower end of the 95% interval of "
                 "Thinking-RFT minus its cold start", _fb_low("think", "cold_think", (1, 2)), ">", 0.0),
    claims.Claim("think_vs_nothink_o2_fb", "order-2 false-belief questions: lower end of the 95% interval of "
                 "Thinking-RFT minus No-Thinking-RFT", _fb_low("think", "nothink", (2,)), ">", 0.0),
    claims.Claim("think_vs_sft_o2_fb", "order-2 false-belief questions: lower end of the 95% interval of "
                 "Thinking-RFT minus SFT", _fb_low("think", "sft", (2,)), ">", 0.0),
    claims.Claim("heldout_vs_sft_fb", "held-out orders 3-4, false-belief questions: lower end of the 95% "
                 "interval of Thinking-RFT minus SFT", _fb_low("think", "sft", HELD_OUT), ">", 0.0),
    claims.Claim("think_format", "format-valid rate of Thinking-RFT's greedy outputs (smallest over seeds)",
                 _arm_min("think", "eval/format_think"), ">=", 0.98),
    claims.Claim("shuffled_no_gain_fb", "false-belief questions of orders 1-2: upper end of the 95% interval of "
                 "the shuffled-reward control minus its cold start", _fb_high("shuffled", "cold_think", (1, 2)),
                 "<", 0.03),
]


# ------------------------------------------------------------------------------------------------ config

def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=full,seed=1")."""
  c, arg = configs.variant_config(arg)
  # Stories: `jaxlab.tom.stories.generate` (shortcut-free; data seeds derived from config.seed) or JSONL files.
  c.data = ml_collections.ConfigDict(dict(
      source="generator",        # generator | jsonl
      train_path="", test_path="",
      num_agents=4, num_containers=6, num_events=10, max_distractors=4,
      names="canonical",         # canonical (containers c1..cN, agents a1..aK) | named (Hi-ToM-style names)
      # The thinking arms' reasoning: "anchor" = the anchor cue, the chain agent that leaves first ("none" if none
      # does), then the object's location at that exit ("a2 -> c6"); "path" = every location the chain witnessed
      # ("c3 -> c1 -> c6", Hi-ToM-style state tracking).
      trace="anchor",
      cold_orders=(0, 1), rl_orders=(0, 1, 2), test_orders=(0, 1, 2, 3, 4),
      n_cold=8000, n_train=4000, n_test_per_order=1000,
      # appended to prompts: the format request (tiny: one word of the tokenizer, jaxlab.tom.tokens.FORMAT_WORDS;
      # full: an instruct model's sentence), so one base answers in either format when asked
      instruction_think=" THINK", instruction_nothink=" ANSWER",
      seq_len=112))
  c.model = ml_collections.ConfigDict(dict(
      hf_path="", hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=256, max_position=128,
      dtype="float32", remat=False))
  # The base model (the paper starts from a pretrained LLM): SFT from scratch on order-0 questions ("where is the
  # object really": world-state tracking, no beliefs) in both output formats (`formats`, alternating; the prompt
  # ends with the format request) over stories of num_events in `lengths` with at most `max_distractors`
  # mid-story distractors plus n_test_length stories of the test's length and distractors. A curriculum (README,
  # calibration): the first curriculum_steps on the short stories alone in curriculum_format (on the whole mix,
  # or with both formats from the start, the answer loss sits at its plateau for 2,000+ steps), then the whole mix
  # at mix_learning_rate (at 3e-3 the new format's first gradients undo the first phase).
  # Trained once per settings (seed `seed`) and cached (`jaxlab.cache`, under cache_dir / $JAXLAB_CACHE_DIR);
  # every claim seed post-trains the same base, as the paper's runs share one pretrained model. num_steps = 0 or a
  # model.hf_path: no pretraining.
  c.pretrain = ml_collections.ConfigDict(dict(
      num_steps=5000, batch_size=32, learning_rate=3e-3, warmup_steps=25, orders=(0,),
      lengths=(2, 3, 4, 5, 6, 8, 10), max_distractors=1, n_per_length=1500, n_test_length=6000,
      curriculum_steps=1000, curriculum_format="nothink", mix_learning_rate=1e-3,
      stop_at=0.0, stop_every=250, stop_n=200,
      formats=("nothink", "think"), seed=0, cache_dir=""))
  # The competence gate (pre-registered; checked after the cold starts, before any arm runs): the base's held-out
  # order-0 accuracy in each format >= order0 and each cold start's order-1 false-belief accuracy >=
  # false_belief_o1 (chance 1/6; "answer the real location" scores 0). enforce=False runs the arms anyway.
  c.gate = ml_collections.ConfigDict(dict(order0=0.98, false_belief_o1=0.4, enforce=True))
  # The cold starts (SFT from the base, or from model.hf_path) on data.cold_orders.
  # shrink / perturb: the cold starts begin at shrink * base + perturb * a fresh initialisation (Ash & Adams 2020,
  # "On Warm-Starting Neural Network Training": a converged warm start fits new data without generalising);
  # 1 / 0 = the base as it is
  c.cold = ml_collections.ConfigDict(dict(num_steps=1500, batch_size=32, learning_rate=3e-3, warmup_steps=25,
                                          shrink=1.0, perturb=0.0))
  # Arm `sft`: continues the no-thinking cold start on data.rl_orders with gold answers; batch = train.batch_size
  # and num_steps = train.num_steps * grpo.num_iterations (as many updates as GRPO, at least as many prompts).
  c.sft = ml_collections.ConfigDict(dict(learning_rate=1e-3))
  # micro_batches: each update and log-prob pass takes a step's rows in this many micro-batches (the same
  # gradient, `jaxlab.train.accumulate`); full sets it so one step fits a chip (`python -m jaxlab.compile_check`).
  c.grpo = ml_collections.ConfigDict(dict(
      micro_batches=1,
      num_generations=8, num_iterations=2, beta=0.02, epsilon=0.2, epsilon_high=0.28, epsilon_c=0.0,
      kl_loss_mode="low_var_kl", loss_agg_mode="sequence-mean-token-mean", advantage_estimator="grpo",
      per_reward_normalize=False, temperature=1.0, max_new_tokens=32, answer_weight=1.0, format_valid=0.5,
      format_invalid=-0.5))
  c.rft = ml_collections.ConfigDict(dict(samples=4, prompts=256, num_steps=40, learning_rate=1e-3))
  c.audit = ml_collections.ConfigDict(dict(n_train=4000, n_test=2000))
  c.method = ml_collections.ConfigDict(dict(arms=ARMS))
  c.eval = ml_collections.ConfigDict(dict(batch=1000, kl_prompts=64))
  c.train = configs.train_config(
      batch_size=8, num_steps=300, log_every=10, checkpoint_every=50, eval_batch_size=None, eval_every=None,
      init_from=None, optimizer=dict(name="adamw", learning_rate=3e-4, schedule="warmup_constant", warmup_steps=10,
                                     b2=0.98, clip_norm=1.0))
  if arg.variant == "small":
    c.data.update(n_cold=10000, n_train=30000, num_events=12, seq_len=136)
    c.model.update(hidden=192, n_layers=6, n_heads=6, n_kv_heads=3, mlp_hidden=768, max_position=160)
    c.cold.num_steps = 1500
    c.pretrain.update(num_steps=4000, batch_size=64, lengths=(2, 4, 6, 8, 10, 12))
    c.cold.update(batch_size=64)
    c.train.num_steps = 800
    c.rft.update(samples=8, prompts=4096, num_steps=600)
  elif arg.variant == "full":
    c.data.source = "jsonl"
    c.data.seq_len = 3072
    c.data.instruction_think = ("\nThink step by step inside <think></think>, then give the container inside "
                                "<answer></answer>.")
    c.data.instruction_nothink = "\nGive only the container inside <answer></answer>."
    c.model.dtype = "bfloat16"
    c.pretrain.num_steps = 0
    c.cold.update(num_steps=200, batch_size=32, learning_rate=1e-5)
    c.sft.learning_rate = 1e-6
    # ToM-RL's GRPO (bigai-ai/ToM-RL tom_grpo.sh): 16 rollouts, 8 prompts, lr 5e-7, k3 KL at 0.001, 2048 tokens.
    c.grpo.update(num_generations=16, num_iterations=1, beta=0.001, max_new_tokens=2048)
    c.grpo.micro_batches = 32        # 128 rows x 3072 tokens: 71 GiB of a v5p chip's 95 (16 micro-batches: 110)
    c.rft.update(prompts=2048, num_steps=500, learning_rate=1e-6)
    c.train.update(batch_size=8, num_steps=1000)
    c.train.optimizer.learning_rate = 5e-7
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run once by configs.finalize, again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d, g = c.data, c.grpo
  if d.source not in ("generator", "jsonl"):
    raise ConfigError(f"config.data.source={d.source!r}: use generator or jsonl")
  if d.trace not in ("anchor", "path"):
    raise ConfigError(f"config.data.trace={d.trace!r}: use anchor or path")
  if d.names not in ("canonical", "named"):
    raise ConfigError(f"config.data.names={d.names!r}: use canonical (c1..cN, a1..aK) or named")
  bad = [a for a in c.method.arms if a not in ARMS]
  if bad or not c.method.arms or len(set(c.method.arms)) != len(c.method.arms):
    raise ConfigError(f"config.method.arms={tuple(c.method.arms)}: each must be one of {ARMS}, at most once")
  for name in ("cold_orders", "rl_orders", "test_orders"):
    o = tuple(getattr(d, name))
    if not o or min(o) < 0 or max(o) > 9 or len(set(o)) != len(o):
      raise ConfigError(f"config.data.{name}={o}: distinct belief orders in 0..9, at least one")
  if d.source == "generator" and max(d.test_orders) > d.num_agents:
    raise ConfigError(f"config.data.test_orders go up to {max(d.test_orders)} but data.num_agents="
                      f"{d.num_agents}: raise num_agents or drop the high orders")
  if min(d.n_cold, d.n_train, d.n_test_per_order) < 2:
    raise ConfigError("config.data.n_cold, n_train and n_test_per_order must be >= 2")
  if c.pretrain.curriculum_format not in ("think", "nothink"):
    raise ConfigError(f"config.pretrain.curriculum_format={c.pretrain.curriculum_format!r}: use think or nothink")
  if not c.pretrain.formats or set(c.pretrain.formats) - {"think", "nothink"} or not c.pretrain.lengths:
    raise ConfigError(f"config.pretrain.formats={tuple(c.pretrain.formats)} must name think / nothink and "
                      f"pretrain.lengths={tuple(c.pretrain.lengths)} at least one story length")
  if not (0 <= c.gate.order0 <= 1 and 0 <= c.gate.false_belief_o1 <= 1):
    raise ConfigError(f"config.gate.order0={c.gate.order0} and gate.false_belief_o1={c.gate.false_belief_o1} are "
                      "accuracies: use values in [0, 1]")
  p = c.pretrain
  if p.n_test_length < 0 or p.curriculum_steps < 0 or (p.num_steps and p.curriculum_steps >= p.num_steps):
    raise ConfigError(f"config.pretrain.n_test_length={c.pretrain.n_test_length} must be >= 0 and "
                      f"pretrain.curriculum_steps={c.pretrain.curriculum_steps} in [0, pretrain.num_steps)")
  if c.cold.num_steps < 0 or c.cold.batch_size < 1:
    raise ConfigError("config.cold.num_steps must be >= 0 and cold.batch_size >= 1")
  if not 0 < c.cold.shrink <= 1 or c.cold.perturb < 0:
    raise ConfigError(f"config.cold.shrink={c.cold.shrink}, cold.perturb={c.cold.perturb}: use 0 < shrink <= 1 "
                      "and perturb >= 0 (1 and 0 start from the base as it is)")
  if g.temperature <= 0 or g.max_new_tokens < 1:
    raise ConfigError("config.grpo.temperature must be > 0 (sampling) and grpo.max_new_tokens >= 1")
  try:
    grpo_config(c)
  except ValueError as e:
    raise ConfigError(f"config.grpo: {e}") from None


def check_inputs(c):
  """What a run needs beyond the config's own values (checked when it starts, so `full` builds without them)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d = c.data
  if d.source == "jsonl" and not (d.train_path and d.test_path):
    raise ConfigError("config.data.source='jsonl' needs --config.data.train_path=FILE.jsonl and "
                      "--config.data.test_path=FILE.jsonl ({prompt, answer, order[, trace, twin_id]} lines)")
  if d.source == "jsonl" and not c.model.hf_path:
    raise ConfigError("config.data.source='jsonl' needs a model with a tokenizer: --config.model.hf_path=DIR")
  if not c.cold.num_steps and not c.model.hf_path:
    raise ConfigError("config.cold.num_steps=0 needs a pretrained start: set config.model.hf_path")


def grpo_config(c):
  """The library `GRPOConfig` of a config."""
  from jaxlab.posttrain.grpo import GRPOConfig
  return GRPOConfig.from_config(c.grpo)


def sweep(arg=None):
  """GRPO learning rate x KL coefficient (the calibration grid of the spec's section 4.3)."""
  return [{"train.optimizer.learning_rate": lr, "grpo.beta": b} for lr in (3e-4, 1e-3) for b in (0.0, 0.02)]
