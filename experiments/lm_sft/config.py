"""LM SFT: supervised fine-tuning of a decoder-only transformer (Llama/Qwen2/OPT family) on prompt/completion pairs.

The shared LM stack's reference run (not a paper): a tiny Llama-style model learns multi-digit addition
from scratch with masked-prompt SFT on the shared loop, and its greedy KV-cache generations are scored by
exact match on held-out problems. `full` fine-tunes a local Hugging Face checkpoint on a local JSONL.

Variants: tiny (byte tokenizer, 2-layer 128-wide Llama, 1-3 digit addition, CPU minutes), small (4 layers,
up to 5 digits), full (`--config.model.hf_path=DIR --config.data.path=FILE.jsonl`, bf16, optional LoRA).
"""

import ml_collections

from jaxlab import claims, configs, mesh as mesh_lib

SEEDS = (0, 1, 2)

RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`lm_sft` (LM core reference: SFT + KV-cache sampling, not a paper)",
    claim=("a 0.5M-param Llama trained from scratch solves >= 95% of held-out 1-3 digit additions by greedy "
           "generation on every seed"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"train.num_steps": 20, "train.log_every": 5, "train.eval_every": 10, "train.checkpoint_every": 10,
          "data.n_train": 512, "data.n_eval": 32, "generate.examples": 16, "generate.batch": 16, "model.hidden": 32,
          "model.mlp_hidden": 64, "train.optimizer.warmup_steps": 2}

CLAIMS = [
    claims.Claim("exact_match", "greedy generations solve >= 95% of held-out addition problems on every seed",
                 claims.minimum("eval/gen_exact_match"), ">=", 0.95),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=full,seed=1")."""
  c, arg = configs.variant_config(arg)
  c.data = ml_collections.ConfigDict(dict(
      source="addition", path="", tokenizer="byte", seq_len=24, packed=False, n_train=20000, n_eval=400,
      min_digits=1, max_digits=3, reverse_answer=True, pad_operands=False, eval_fraction=0.05, truncation="right"))
  c.model = ml_collections.ConfigDict(dict(
      hf_path="", arch="llama", hidden=128, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=512, max_position=64,
      dtype="float32", remat=False, lora_rank=0, lora_alpha=16.0, lora_targets=("q", "v")))
  c.generate = ml_collections.ConfigDict(dict(examples=400, max_new_tokens=8, batch=200))
  c.train = configs.train_config(
      batch_size=64, num_steps=5000, log_every=100, eval_every=1000, checkpoint_every=1000,
      optimizer=dict(name="adamw", learning_rate=3e-3, schedule="warmup_cosine", warmup_steps=100,
                     weight_decay=0.01, clip_norm=1.0, b2=0.98))
  if arg.variant == "small":
    c.data.max_digits = 5
    c.data.seq_len = 32
    c.model.n_layers = 4
    c.model.hidden = 256
    c.model.mlp_hidden = 1024
    c.train.num_steps = 8000
  elif arg.variant == "full":
    c.data.source = "jsonl"
    c.data.tokenizer = "hf"
    c.data.seq_len = 1024
    c.data.packed = True
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.mesh = (("data", -1), ("model", 1))
    c.sharding_rules = mesh_lib.RULES["fsdp"]   # FSDP over data (+ tensor parallel over model)
    c.train.optimizer.learning_rate = 2e-5
    c.train.optimizer.warmup_steps = 100
    c.train.batch_size = 32
    c.train.num_steps = 2000
    c.generate.examples = 200
    c.generate.max_new_tokens = 256
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run once by configs.finalize, again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if c.data.source not in ("addition", "jsonl"):
    raise ConfigError(f"config.data.source={c.data.source!r}: use addition or jsonl")
  if c.data.truncation not in ("right", "left", "drop", "error"):
    raise ConfigError(f"config.data.truncation={c.data.truncation!r}: use right, left, drop or error")
  if c.model.arch not in ("llama", "opt"):
    raise ConfigError(f"config.model.arch={c.model.arch!r}: use llama or opt (or model.hf_path)")
  if c.model.hf_path and c.model.lora_rank:
    raise ConfigError("LoRA on a pretrained checkpoint: load it with model.hf_path and lora_rank=0 first "
                      "(adapters on imported weights are not wired yet)")


def check_inputs(c):
  """The files a run needs are named (checked when the run starts, so `full` builds without them)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if c.data.source == "jsonl" and not c.data.path:
    raise ConfigError("config.data.source='jsonl' needs --config.data.path=FILE.jsonl ({prompt, completion} lines)")
  if c.data.tokenizer == "hf" and not c.model.hf_path:
    raise ConfigError("config.data.tokenizer='hf' reads tokenizer.json from config.model.hf_path; set it, or use "
                      "'byte' or a tokenizer path")


def sweep(arg=None):
  """Learning rate x width."""
  return [{"train.optimizer.learning_rate": lr, "model.hidden": h} for lr in (1e-3, 3e-3) for h in (64, 128)]
