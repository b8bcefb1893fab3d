"""LM SFT: supervised fine-tuning of a decoder-only transformer (Llama/Qwen2/OPT family) on prompt/completion pairs.

The shared LM stack's reference run (not a paper): a tiny Llama-style model learns multi-digit addition
from scratch with masked-prompt SFT on the shared loop, and its greedy KV-cache generations are scored by
exact match on held-out problems. `full` fine-tunes a local Hugging Face checkpoint on a local JSONL.

Variants: tiny (byte tokenizer, 2-layer 128-wide Llama, 1-3 digit addition, CPU minutes), small (4 layers,
up to 5 digits), full (`--config.model.hf_path=DIR --config.data.path=FILE.jsonl`, bf16, optional LoRA).
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2)

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
  c.optimizer.name = "adamw"
  c.optimizer.learning_rate = 3e-3
  c.optimizer.schedule = "warmup_cosine"
  c.optimizer.warmup_steps = 100
  c.optimizer.weight_decay = 0.01
  c.optimizer.clip_norm = 1.0
  c.optimizer.b2 = 0.98
  c.batch_size = 64
  c.num_steps = 5000
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 1000
  if arg.variant == "small":
    c.data.max_digits = 5
    c.data.seq_len = 32
    c.model.n_layers = 4
    c.model.hidden = 256
    c.model.mlp_hidden = 1024
    c.num_steps = 8000
  elif arg.variant == "full":
    c.data.source = "jsonl"
    c.data.tokenizer = "hf"
    c.data.seq_len = 1024
    c.data.packed = True
    c.model.dtype = "bfloat16"
    c.model.remat = True
    c.mesh = (("data", -1), ("model", 1))
    c.sharding_rules = (("batch", "data"), ("embed", "data"), ("mlp", "model"), ("heads", "model"), ("kv", None),
                        ("vocab", "model"), ("state", None), ("length", None))  # FSDP over data
    c.optimizer.learning_rate = 2e-5
    c.optimizer.warmup_steps = 100
    c.batch_size = 32
    c.num_steps = 2000
    c.generate.examples = 200
    c.generate.max_new_tokens = 256
  return configs.finalize(c)


def validate(c):
  """Experiment-specific checks (called by train_and_evaluate)."""
  from jaxlab.errors import ConfigError
  if c.data.source not in ("addition", "jsonl"):
    raise ConfigError(f"config.data.source={c.data.source!r}: use addition or jsonl")
  if c.data.source == "jsonl" and not c.data.path:
    raise ConfigError("config.data.source='jsonl' needs --config.data.path=FILE.jsonl ({prompt, completion} lines)")
  if c.data.tokenizer == "hf" and not c.model.hf_path:
    raise ConfigError("config.data.tokenizer='hf' reads tokenizer.json from config.model.hf_path; set it, or use "
                      "'byte' or a tokenizer path")
  if c.model.arch not in ("llama", "opt"):
    raise ConfigError(f"config.model.arch={c.model.arch!r}: use llama or opt (or model.hf_path)")


def sweep(arg=None):
  """Learning rate x width."""
  return [{"optimizer.learning_rate": lr, "model.hidden": h} for lr in (1e-3, 3e-3) for h in (64, 128)]
