"""VR-Thinker: a video reward model that thinks with images, selecting frames with a tool, under a visual memory
window; cold start -> rejection-sampling fine-tuning -> GRPO.

Wang, Liu, ..., Yue, Liu, "VR-Thinker: Boosting Video Reward Models through Thinking-with-Image Reasoning", ICML
2026 (arXiv 2510.10518). The policy is a vision-language model (`jaxlab.lm.vlm`: a ViT/SigLIP tower, LLaVA's
projector and the LM core's decoder, visual tokens addressed by id); the task, tool, traces and rewards are
`jaxlab.posttrain.frame_select`; the stages run on the post-training trainers (`jaxlab.posttrain.trainers`):

* `cold_tool`: SFT on scripted visual chain-of-thought traces that call `select_frames` (a share of noisy ones
  that answer without looking), observations loss-masked, the memory window applied as in the rollouts;
* `cold_notool`: the same SFT budget on traces that answer from the initial frames (the no-tool model);
* `rft`: rejection sampling from `cold_tool` (correct and well-formed traces kept), SFT on them;
* `rft_grpo`: GRPO from `rft` (the paper's pipeline); `grpo`: GRPO from `cold_tool` directly;
* `notool_grpo`: GRPO from `cold_notool` without the tool (one turn), the same budget;

each scored on held-out pairs (sampled at the rollout temperature, and greedily) with per-pair correctness,
format rate, tool calls per pair and the largest visual context of any rollout.

Variants: tiny (8 x 8 digit frames, 8 per video, a 2-layer decoder and a 1-layer SigLIP-style tower from scratch,
CPU minutes), small (16 frames per video, wider), full (a composed VLM from local checkpoints: a Qwen2 / Llama
decoder `--config.model.hf_path=DIR` and a ViT / SigLIP tower `--config.model.vision_path=DIR`, preference data
`--config.data.path=FILE.jsonl` in VideoGen-RewardBench's layout; see the README).
"""

import ml_collections
import numpy as np

from jaxlab import claims, configs

SEEDS = (0, 1, 2)
ARMS = ("rft", "rft_grpo", "grpo", "notool_grpo")


# ------------------------------------------------------------------------------------------------ claims

def _bits(s: str) -> np.ndarray:
  return (np.frombuffer(s.encode(), np.uint8) - ord("0")).astype(np.float64)


def paired(runs, a: str, b: str | None = None, *, reps: int = 4000, level: float = 0.95) -> tuple[float, float, float]:
  """Mean over seeds of acc(a) (- acc(b)) from the per-pair correctness strings, and the two-sided paired
  bootstrap 95% interval (pairs resampled within each seed, the same draw for both arms)."""
  rng = np.random.default_rng(0)
  point, boots = 0.0, np.zeros(reps)
  for r in runs:
    d = _bits(r[f"eval/correct_{a}"]) - (0 if b is None else _bits(r[f"eval/correct_{b}"]))
    point += d.mean() / len(runs)
    boots += d[rng.integers(0, len(d), size=(reps, len(d)))].mean(axis=1) / len(runs)
  lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
  return float(point), float(lo), float(hi)


def _above_target(runs):
  """acc(rft_grpo) minus the claim-1 target c + (A* - c) / 2 (mean over seeds)."""
  r = runs[0]
  return paired(runs, "rft_grpo")[0] - (r["anchor/bayes_no_tool"]
                                       + 0.5 * (r["anchor/oracle"] - r["anchor/bayes_no_tool"]))


def _notool_excess(runs):
  """acc(notool_grpo) minus the no-tool Bayes ceiling c (mean over seeds)."""
  return paired(runs, "notool_grpo")[0] - runs[0]["anchor/bayes_no_tool"]


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`vr_thinker` (Wang et al., ICML 2026: a video reward model thinking with images)",
    claim=("image frames, a select_frames tool with a memory window: after cold start -> RFT -> GRPO the tool-using "
           "VLM closes >= half the gap from the no-tool Bayes ceiling c to the oracle A* and beats its cold start "
           "by >= 0.05; a no-tool model stays <= c + 0.03; the visual context never exceeds the window bound"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.n_cold": 48, "data.n_train": 32, "data.n_test": 24, "cold.num_steps": 4, "cold.batch_size": 16,
          "model.hidden": 32, "model.mlp_hidden": 64, "model.n_layers": 1, "grpo.num_generations": 2,
          "train.batch_size": 4, "train.num_steps": 2, "train.checkpoint_every": 1, "train.log_every": 1,
          "train.optimizer.warmup_steps": 1, "rft.prompts": 8, "rft.samples": 2, "rft.num_steps": 2,
          "eval.batch_bucket": 8, "eval.row_bucket": 8}

CLAIMS = [
    claims.Claim("oracle_gap", "closed form: oracle tool accuracy A* minus the no-tool Bayes ceiling c (checked "
                 "before anything runs)", lambda runs: runs[0]["anchor/oracle"] - runs[0]["anchor/bayes_no_tool"],
                 ">", 0.3),
    claims.Claim("tool_vs_target", "RFT -> GRPO accuracy minus c + (A* - c) / 2 (sampled rollouts, mean over seeds)",
                 _above_target, ">=", 0.0),
    claims.Claim("grpo_vs_cold", "RFT -> GRPO minus its cold start (paired, mean over seeds)",
                 lambda runs: paired(runs, "rft_grpo", "cold_tool")[0], ">=", 0.05),
    claims.Claim("grpo_vs_cold_ci", "lower end of the paired bootstrap 95% interval of RFT -> GRPO minus the cold "
                 "start", lambda runs: paired(runs, "rft_grpo", "cold_tool")[1], ">", 0.0),
    claims.Claim("notool_ceiling", "no-tool model after GRPO minus the Bayes ceiling c (mean over seeds; must not "
                 "exceed 0.03, else the environment leaks the label)", _notool_excess, "<=", 0.03),
    claims.Claim("window_bound", "largest visual context of any evaluated rollout minus the window bound "
                 "(2 N_in + p K) V (largest over seeds and tool-using models)",
                 lambda runs: max(v for r in runs for k, v in r.items() if k.startswith("eval/window_excess_")), "<=",
                 0),
    claims.Claim("obs_grad", "largest |d loss / d logit| at observation and prompt positions, SFT and GRPO losses "
                 "(largest over seeds)", claims.maximum("check/obs_grad_max"), "<=", 0.0),
    claims.Claim("rft_then_grpo", "RFT -> GRPO minus GRPO from the cold start (paired, mean over seeds; the "
                 "paper's pipeline vs skipping RFT)", lambda runs: paired(runs, "rft_grpo", "grpo")[0], ">", 0.0),
]


# ------------------------------------------------------------------------------------------------ config

def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=full,seed=1")."""
  c, arg = configs.variant_config(arg)
  # The task (`jaxlab.posttrain.frame_select.FrameTask`): frames per video, initial frames per video, frames per
  # call (K), generated turns, memory window (p), judged dimensions. Data seeds derive from config.seed.
  c.data = ml_collections.ConfigDict(dict(
      source="generator",       # generator | json (VideoGen-RewardBench-style records, full)
      path="", root="",
      frames=8, initial=2, per_call=4, max_turns=3, window=1, noise=0.1, dimensions=("VQ",),
      n_cold=2000, n_train=2000, n_test=2000,
      noisy_share=0.5,          # cold-start traces that answer at once with a guess (the teacher's noise)
      seq_len=80))
  c.model = ml_collections.ConfigDict(dict(
      hf_path="", vision_path="", tokenizer="", hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=256,
      max_position=128,
      dtype="float32", remat=False, vision_hidden=32, vision_layers=1, vision_heads=2, vision_mlp=64, patch=4))
  c.cold = ml_collections.ConfigDict(dict(num_steps=400, batch_size=32, learning_rate=3e-3, warmup_steps=25))
  # micro_batches: each update and log-prob pass takes a step's rows in this many micro-batches (the same
  # gradient, `jaxlab.train.accumulate`); full sets it so one step fits a chip (`python -m jaxlab.compile_check`).
  c.grpo = ml_collections.ConfigDict(dict(
      micro_batches=1,
      num_generations=8, num_iterations=1, beta=0.0, epsilon=0.2, epsilon_high=0.28, epsilon_c=0.0,
      kl_loss_mode="low_var_kl", loss_agg_mode="sequence-mean-token-mean", advantage_estimator="grpo",
      per_reward_normalize=False, temperature=1.0, max_new_tokens=12,
      # VR-Thinker's rule-based rewards (the research notes: 1[correct] + 0.1 1[format] - 0.5 1[invalid]);
      # tool_bonus (PixelReasoner-style curiosity) is off as in the notes.
      accuracy_weight=1.0, format_valid=0.1, format_invalid=-0.5, tool_bonus=0.0))
  c.rft = ml_collections.ConfigDict(dict(samples=4, prompts=256, num_steps=100, learning_rate=1e-3))
  c.method = ml_collections.ConfigDict(dict(arms=ARMS))
  # The sampler's batch and GRPO's training rows (one per turn under the memory window) are padded to these
  # multiples, so the varying counts of multi-turn rollouts compile a few shapes only.
  c.eval = ml_collections.ConfigDict(dict(batch_bucket=64, row_bucket=128))
  c.train = configs.train_config(
      batch_size=16, num_steps=30, log_every=10, checkpoint_every=10, eval_batch_size=None, eval_every=None,
      init_from=None, optimizer=dict(name="adamw", learning_rate=3e-4, schedule="warmup_constant", warmup_steps=5,
                                     b2=0.98, clip_norm=1.0))
  if arg.variant == "small":
    c.data.update(frames=16, initial=2, per_call=4, max_turns=5, window=2, n_cold=8000, n_train=8000,
                  seq_len=144)
    c.model.update(hidden=128, n_layers=4, mlp_hidden=512, max_position=192, vision_hidden=64, vision_layers=2)
    c.cold.num_steps = 2000
    c.rft.update(prompts=2048, num_steps=400)
    c.train.num_steps = 200
  elif arg.variant == "full":
    # The paper's settings (model card `qunwang13/vrthinker`: 4 initial frames per video, up to 8 frames per
    # call in the released prompt, 6 turns); 448-pixel frames through the tower.
    c.data.update(source="json", frames=96, initial=4, per_call=8, max_turns=6, window=2, dimensions=(
        "TA", "VQ", "MQ", "OA"), seq_len=16384)
    c.model.dtype = "bfloat16"
    c.cold.update(num_steps=0)
    c.grpo.update(num_generations=8, beta=0.04, max_new_tokens=512)
    # A step's 1536 rows (32 prompts x 8 trajectories x 6 turns) on a v5p-64 slice (32 chips): one row per chip
    # per micro-batch, the decoder and the tower rematerialised; 54 GiB per chip (`python -m jaxlab.compile_check`,
    # README "Full configs compiled ahead of time"). A v5p-8 chip cannot hold its 384 rows' float32 frames.
    c.grpo.micro_batches = 48
    c.model.remat = True
    c.rft.update(prompts=8192, num_steps=1000, learning_rate=1e-6)
    c.train.update(batch_size=32, num_steps=500)
    c.train.optimizer.learning_rate = 1e-6
  return configs.finalize(c, validate)


def task(c):
  """The `FrameTask` of a config."""
  from jaxlab.posttrain.frame_select import FrameTask  # pylint: disable=g-import-not-at-top
  d = c.data
  return FrameTask(frames=d.frames, initial=d.initial, per_call=d.per_call, max_turns=d.max_turns,
                   window=None if d.window is None or d.window < 0 else d.window, noise=d.noise,
                   dimensions=tuple(d.dimensions))


def validate(c):
  """Experiment-specific checks (run once by configs.finalize, again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d, g = c.data, c.grpo
  if d.source not in ("generator", "json"):
    raise ConfigError(f"config.data.source={d.source!r}: use generator or json")
  bad = [a for a in c.method.arms if a not in ARMS]
  if bad or len(set(c.method.arms)) != len(c.method.arms):
    raise ConfigError(f"config.method.arms={tuple(c.method.arms)}: each must be one of {ARMS}, at most once")
  if "rft_grpo" in c.method.arms and "rft" not in c.method.arms:
    raise ConfigError("config.method.arms: rft_grpo starts from rft; list rft too")
  if not 0.0 <= d.noisy_share <= 1.0:
    raise ConfigError(f"config.data.noisy_share={d.noisy_share} must be in [0, 1]")
  if min(d.n_cold, d.n_train, d.n_test) < 2:
    raise ConfigError("config.data.n_cold, n_train and n_test must be >= 2")
  if g.temperature <= 0 or g.max_new_tokens < 1:
    raise ConfigError("config.grpo.temperature must be > 0 (sampling) and grpo.max_new_tokens >= 1")
  if c.cold.num_steps < 0 or c.cold.batch_size < 1:
    raise ConfigError("config.cold.num_steps must be >= 0 and cold.batch_size >= 1")
  if d.source == "json" and c.cold.num_steps:
    raise ConfigError("config.data.source='json' has no scripted cold-start traces (they need the generator's "
                      "defect positions): set cold.num_steps=0 and start from a cold-started checkpoint")
  task(c)
  try:
    grpo_config(c)
  except ValueError as e:
    raise ConfigError(f"config.grpo: {e}") from None


def check_inputs(c):
  """What a run needs beyond the config's own values (checked when it starts, so `full` builds without them)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d, m = c.data, c.model
  if d.source == "json" and not d.path:
    raise ConfigError("config.data.source='json' needs --config.data.path=FILE.json[l] (records with prompt, "
                      "path_A, path_B and a preference per dimension)")
  if bool(m.hf_path) != bool(m.vision_path):
    raise ConfigError("a composed VLM needs both --config.model.hf_path=DIR (decoder) and "
                      "--config.model.vision_path=DIR (ViT / SigLIP tower), or neither (from scratch)")
  if not c.cold.num_steps and not m.hf_path:
    raise ConfigError("config.cold.num_steps=0 needs a pretrained start: set config.model.hf_path")


def grpo_config(c):
  """The library `GRPOConfig` of a config."""
  from jaxlab.posttrain.grpo import GRPOConfig  # pylint: disable=g-import-not-at-top
  return GRPOConfig.from_config(c.grpo)


def sweep(arg=None):
  """GRPO learning rate x the cold start's noisy share."""
  return [{"train.optimizer.learning_rate": lr, "data.noisy_share": s} for lr in (3e-4, 1e-3) for s in (0.3, 0.5)]
