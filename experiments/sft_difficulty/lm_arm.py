"""LM arm of sft_difficulty: a small transformer pretrained on easy addition, SFT on n examples of difficulty d.

The (n, d) grid of "Data Difficulty and the Generalization-Extrapolation Tradeoff in LLM Fine-Tuning"
(arXiv 2605.12906) on a language model:

1. `pretrain`: a tiny Llama is trained from scratch on easy addition (1-2 digit operands by default) with the
   masked SFT loss on the shared loop (`jaxlab.train.fit`, resumable); the result is saved in Hugging Face
   format (`workdir/final`) and loaded from there on the next call. With `lm.model.hf_path` the local
   checkpoint is the base model instead.
2. `sft_cell(lm, base, d, n, seed)`: a copy of the base model is fine-tuned on the first n examples of a
   per-(seed, d) pool of difficulty-d problems (d-digit operands; pools of max(budgets) examples, so budgets
   are nested), then scored on the n training examples, on held-out difficulty-d problems (in-distribution,
   ID) and on a fixed harder target mix (uniform over `target_digits`, whose largest level lies beyond every
   training difficulty: extrapolation).

Metrics of a cell (losses are the mean over examples of the per-token completion NLL, EOS included, teacher
forced; errors are 1 - exact match of the greedy KV-cache generation):

    gen_gap    = id_loss - train_loss        (in-distribution generalisation gap: grows with d, falls with n)
    extrap_gap = target_loss - id_loss       (extrapolation gap: falls with d)

Data. Synthetic addition (`lm.data.source = "addition"`): "a+b=" -> the digits of a + b, least significant
first (`reverse_answer`), optionally in the fixed-width format of Lee et al. 2023 (`pad_operands`: operands
zero-padded to the widest level, the sum to one more digit), which aligns digit positions across levels. A
d-digit operand is uniform in [10^(d-1), 10^d), or with `leading_zeros` in [0, 10^d) (every digit position
uniform, zero included, so a d-digit problem also exercises the zero digits of easier levels). Or
user data (`"jsonl"`): `lm.data.path` holds `{"prompt", "completion", <difficulty_key>: int}` lines (the pool
of level d is its records with difficulty d) and `lm.data.target_path` the target mix (`<difficulty_key>`
optional there; it names the per-level breakdown). Evaluation problems never occur in pretraining or SFT
data, and the ID and target sets are disjoint from every training pool.

Everything runs jit-compiled once per shape: rows are padded to one `seq_len`, SFT batches have one size,
and the jitted SFT / eval steps are shared by every cell of a grid.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab import configs
from jaxlab import mesh as mesh_lib
from jaxlab import workdir as workdir_lib
from jaxlab.data import ArraySource, Batcher, eval_batches, process_rows, to_global
from jaxlab.data.jsonl import iter_json_lines
from jaxlab.errors import ConfigError, DataError
from jaxlab.lm import generate, hf, sft, sft_data
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.lm.tokenizer import check_fits, load_tokenizer
from jaxlab.posttrain.rollout import decode_completion
from jaxlab.state import ModelDef, TrainState, train_state_shardings
from jaxlab.train import fit, optim
from jaxlab.train import step as step_lib

EXPERIMENT = "sft_difficulty"
METRICS = ("train_loss", "id_loss", "id_err", "id_acc", "target_loss", "target_err", "target_acc", "gen_gap",
           "extrap_gap", "seconds")
_FINAL = "final"            # workdir/final: the pretrained base model (Hugging Face format)
_STAMP = "pretrain.json"    # workdir/final/pretrain.json: the settings it was trained with
_CHUNK = 512                # problems drawn per round of a problem stream (fixed: streams do not depend on sizes)


# ----------------------------------------------------------------------------------------------- config

def default_config() -> ml_collections.ConfigDict:
  """The LM arm's settings (held by the experiment config as `config.lm`).

  Sized so that pretraining plus the 4 x 4 grid run in about 5 minutes on 2 CPU cores (seed 0: 318 s, of
  which pretraining 60 s and 12-19 s per cell).
  """
  return ml_collections.ConfigDict(dict(
      model=dict(hf_path="", arch="llama", hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=256,
                 max_position=32, dtype="float32"),
      tokenizer="byte",                 # "byte", a tokenizer.json path, or "hf" (the one of model.hf_path)
      data=dict(source="addition", path="", target_path="", difficulty_key="difficulty", reverse_answer=True,
                pad_operands=True, leading_zeros=True, seq_len=0),   # seq_len 0: fitted to the widest problem
      # Base model: addition with min..max digit operands (each operand's digit count uniform in the range).
      pretrain=dict(min_digits=1, max_digits=2, n_examples=20000, steps=2000, batch=64, lr=3e-3, warmup=100,
                    weight_decay=0.01, log_every=250, checkpoint_every=500),
      difficulties=(2, 3, 4, 5),        # d: both operands have d digits
      budgets=(32, 128, 512, 2048),     # n: SFT examples (nested: the first n of the pool of max(budgets))
      # A fixed number of steps per cell whatever n (compute-matched: small n are seen for many epochs).
      sft=dict(steps=1000, batch=32, lr=3e-3, warmup=50, schedule="warmup_cosine", weight_decay=0.0,
               clip_norm=1.0),
      target_digits=(2, 3, 4, 5, 6),    # target mix: uniform over these levels (6: beyond every difficulty)
      eval=dict(n_id=256, n_target=128, batch=128, max_new_tokens=0),   # n_target per level; 0: auto
      seeds=dict(pretrain=0, pools=1, target=2, sft=3),                 # offsets added to the run seed
      mesh=mesh_lib.DEFAULT_MESH, sharding_rules=mesh_lib.DEFAULT_RULES))


def validate(lm: ml_collections.ConfigDict) -> None:
  """Checks the LM arm's settings.

  Raises:
    ConfigError: one line naming the key, what is wrong and how to fix it.
  """
  def positive_int(key, value, low=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise ConfigError(f"config.lm.{key} must be an integer >= {low}, got {value!r}")

  def levels(key, values, allow_empty=False, low=1):
    values = tuple(values)
    if not values and not allow_empty:
      raise ConfigError(f"config.lm.{key} is empty; give at least one value, e.g. (2, 3)")
    for v in values:
      positive_int(key, v, low)
    if len(set(values)) != len(values):
      raise ConfigError(f"config.lm.{key}={values} repeats a value; list each once")
    return values

  m, d, p, s, e = lm.model, lm.data, lm.pretrain, lm.sft, lm.eval
  if d.source not in ("addition", "jsonl"):
    raise ConfigError(f"config.lm.data.source={d.source!r}: use addition or jsonl")
  if m.arch not in ("llama", "opt"):
    raise ConfigError(f"config.lm.model.arch={m.arch!r}: use llama or opt (or model.hf_path)")
  for key in ("hidden", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "max_position"):
    positive_int(f"model.{key}", m[key])
  if m.n_heads % m.n_kv_heads or m.hidden % m.n_heads:
    raise ConfigError(f"config.lm.model: n_kv_heads={m.n_kv_heads} must divide n_heads={m.n_heads}, which must "
                      f"divide hidden={m.hidden}")
  # addition: operand digits (>= 1); jsonl: the records' difficulty labels, e.g. the score command's buckets 0, 1, 2
  difficulties = levels("difficulties", lm.difficulties, low=0 if d.source == "jsonl" else 1)
  levels("budgets", lm.budgets)
  targets = levels("target_digits", lm.target_digits, allow_empty=d.source == "jsonl")
  for key in ("min_digits", "max_digits", "n_examples", "steps", "batch", "log_every"):
    positive_int(f"pretrain.{key}", p[key])
  if p.min_digits > p.max_digits:
    raise ConfigError(f"config.lm.pretrain.min_digits={p.min_digits} exceeds max_digits={p.max_digits}")
  for key in ("steps", "batch"):
    positive_int(f"sft.{key}", s[key])
  for key in ("n_id", "n_target", "batch"):
    positive_int(f"eval.{key}", e[key])
  for section, name in ((p, "pretrain"), (s, "sft")):
    if not (section.lr > 0 and np.isfinite(section.lr)):
      raise ConfigError(f"config.lm.{name}.lr must be positive and finite, got {section.lr!r}")
    if not 0 <= section.warmup <= section.steps:
      raise ConfigError(f"config.lm.{name}.warmup={section.warmup} must be in [0, {name}.steps={section.steps}]")
  if s.schedule not in configs.SCHEDULES:
    raise ConfigError(f"config.lm.sft.schedule={s.schedule!r} is not one of {configs.SCHEDULES}")
  if e.max_new_tokens < 0:
    raise ConfigError(f"config.lm.eval.max_new_tokens must be >= 0 (0 = fitted to the data), got {e.max_new_tokens}")
  if d.source == "jsonl":
    if not d.seq_len:
      raise ConfigError("config.lm.data.source='jsonl' needs config.lm.data.seq_len > 0 (the row length)")
    need, what = d.seq_len + 1, f"data.seq_len + 1 = {d.seq_len + 1}"
  else:
    widest = max(difficulties + targets + (p.max_digits,))
    need, what = _addition_tokens(widest), f"a {widest}-digit addition with BOS and EOS"
    if d.seq_len and d.seq_len + 1 < need:
      raise ConfigError(f"config.lm.data.seq_len={d.seq_len} is too short for {what} ({need} tokens); set it to "
                        f">= {need - 1} or 0 (fitted)")
  if not m.hf_path and d.source == "addition" and need > m.max_position:
    raise ConfigError(f"config.lm.model.max_position={m.max_position} is shorter than {what} ({need} tokens); "
                      f"raise it to >= {need} or lower the digit levels")


def _addition_tokens(digits: int) -> int:
  """Tokens of a byte-tokenized `digits`-digit addition: BOS, "a+b=" (2 d + 2), the sum (d + 1), EOS."""
  return 3 * digits + 5


def seq_len(lm: ml_collections.ConfigDict) -> int:
  """The row length of every batch (one shape for the whole grid)."""
  if lm.data.seq_len:
    return int(lm.data.seq_len)
  return _addition_tokens(_widest(lm)) - 1


def _widest(lm) -> int:
  return max(tuple(lm.difficulties) + tuple(lm.target_digits) + (lm.pretrain.max_digits,))


def check_runnable(lm: ml_collections.ConfigDict) -> None:
  """The checks that need the user's paths (a `full` config names them only when it is launched).

  Raises:
    ConfigError: tokenizer "hf" without `model.hf_path`; jsonl rows longer than a from-scratch model's positions.
  """
  if lm.tokenizer == "hf" and not lm.model.hf_path:
    raise ConfigError("config.lm.tokenizer='hf' reads tokenizer.json from config.lm.model.hf_path; set it or use "
                      "'byte'")
  m, d = lm.model, lm.data
  if d.source == "jsonl" and not m.hf_path and d.seq_len + 1 > m.max_position:
    raise ConfigError(f"config.lm.model.max_position={m.max_position} is shorter than data.seq_len + 1 = "
                      f"{d.seq_len + 1}; set config.lm.model.hf_path to a checkpoint, or raise max_position")


def tokenizer_for(lm: ml_collections.ConfigDict):
  """The arm's tokenizer (`lm.tokenizer`)."""
  check_runnable(lm)
  return load_tokenizer(lm.model.hf_path if lm.tokenizer == "hf" else lm.tokenizer)


def model_config(lm: ml_collections.ConfigDict, tok) -> TransformerConfig:
  """The base model's architecture (vocabulary rounded up to a multiple of 8)."""
  m = lm.model
  vocab = -(-tok.vocab_size // 8) * 8
  return TransformerConfig(arch=m.arch, vocab_size=vocab, hidden=m.hidden, n_layers=m.n_layers, n_heads=m.n_heads,
                           n_kv_heads=m.n_kv_heads, mlp_hidden=m.mlp_hidden, max_position=m.max_position,
                           dtype=m.dtype, tie_embeddings=True)


# ------------------------------------------------------------------------------------------------- data

def _format(a: int, b: int, lm) -> dict[str, str]:
  """One addition record in the arm's answer format."""
  if lm.data.pad_operands:
    w = _widest(lm)
    prompt, answer = f"{a:0{w}d}+{b:0{w}d}=", str(a + b).zfill(w + 1)
  else:
    prompt, answer = f"{a}+{b}=", str(a + b)
  return {"prompt": prompt, "completion": answer[::-1] if lm.data.reverse_answer else answer}


def _draw(rng: np.random.Generator, n: int, lo_digits: int, hi_digits: int, leading_zeros: bool = False
          ) -> tuple[np.ndarray, np.ndarray]:
  """n operand pairs; each operand's digit count uniform in [lo_digits, hi_digits], then the operand uniform
  among numbers of that many digits (0-9 for one digit), as in `jaxlab.lm.tasks.addition_examples`; with
  `leading_zeros`, uniform in [0, 10^digits) (every digit position uniform, zero included)."""
  out = []
  for _ in range(2):
    digits = rng.integers(lo_digits, hi_digits + 1, size=n)
    lo = np.where((digits == 1) | leading_zeros, 0, 10 ** (digits - 1))
    out.append(rng.integers(lo, 10 ** digits))
  return out[0], out[1]


def pretrain_examples(lm: ml_collections.ConfigDict, seed: int) -> list[dict[str, str]]:
  """The base model's training problems (repeats allowed), deterministic given the seed."""
  p = lm.pretrain
  rng = np.random.default_rng([seed, lm.seeds.pretrain, 0])
  a, b = _draw(rng, p.n_examples, p.min_digits, p.max_digits, lm.data.leading_zeros)
  return [_format(int(x), int(y), lm) for x, y in zip(a, b)]


def _stream(lm, digits: int, seed: int, tag: int, exclude: set[str]) -> Iterator[dict[str, str]]:
  """Distinct problems with two `digits`-digit operands, none in `exclude`, in a fixed order (seed, tag)."""
  seen = set(exclude)
  for round_ in range(10_000):
    rng = np.random.default_rng([seed, tag, digits, round_])
    new = 0
    for x, y in zip(*_draw(rng, _CHUNK, digits, digits, lm.data.leading_zeros)):
      r = _format(int(x), int(y), lm)
      if r["prompt"] not in seen:
        seen.add(r["prompt"])
        new += 1
        yield r
    if not new and round_ > 20:
      return


def _take(stream: Iterator[dict[str, str]], n: int, what: str) -> list[dict[str, str]]:
  out = []
  for r in stream:
    out.append(r)
    if len(out) == n:
      return out
  raise DataError(f"only {len(out)} distinct {what} exist outside pretraining and the evaluation sets; need {n}: "
                  "lower config.lm.budgets / config.lm.eval sizes or use harder levels")


@functools.lru_cache(maxsize=4)
def _pretrain_prompts(key: str) -> frozenset[str]:
  lm, seed = _unkey(key)
  if lm.data.source != "addition" or lm.model.hf_path:
    return frozenset()
  return frozenset(r["prompt"] for r in pretrain_examples(lm, seed))


def _key(lm, seed: int) -> str:
  return json.dumps([lm.to_dict(), seed], sort_keys=True, default=str)


def _unkey(key: str):
  d, seed = json.loads(key)
  return ml_collections.ConfigDict(d), seed


@functools.lru_cache(maxsize=8)
def _target_cached(key: str) -> tuple[tuple[int, dict[str, str]], ...]:
  lm, seed = _unkey(key)
  if lm.data.source == "jsonl":
    recs = _read_records(lm.data.target_path, lm.data.difficulty_key, required=False)
    return tuple((-1 if lvl is None else lvl, r) for lvl, r in recs)
  out, exclude = [], set(_pretrain_prompts(_key(lm, seed)))
  for level in lm.target_digits:
    got = _take(_stream(lm, level, seed, 10 + lm.seeds.target, exclude), lm.eval.n_target,
                f"{level}-digit target problems")
    out += [(level, r) for r in got]
  return tuple(out)


def target_set(lm: ml_collections.ConfigDict, seed: int) -> list[tuple[int, dict[str, str]]]:
  """The fixed target mix: [(level, {"prompt", "completion"})], `eval.n_target` problems per level of
  `target_digits` (addition), or the records of `data.target_path` (jsonl; level -1 when unlabelled)."""
  return list(_target_cached(_key(lm, seed)))


@functools.lru_cache(maxsize=16)
def _pools_cached(key: str, d: int) -> tuple[tuple[dict[str, str], ...], tuple[dict[str, str], ...]]:
  lm, seed = _unkey(key)
  pool_size = max(lm.budgets)
  targets = {r["prompt"] for _, r in _target_cached(key)}
  if lm.data.source == "jsonl":
    recs = [r for lvl, r in _read_records(lm.data.path, lm.data.difficulty_key, required=True)
            if lvl == d and r["prompt"] not in targets]
    order = np.random.default_rng([seed, lm.seeds.pools, d]).permutation(len(recs))
    recs = [recs[i] for i in order]
    need = lm.eval.n_id + pool_size
    if len(recs) < need:
      raise DataError(f"{lm.data.path}: {len(recs)} records of difficulty {d} outside the target set; need "
                      f"eval.n_id + max(budgets) = {need}")
    return tuple(recs[lm.eval.n_id:need]), tuple(recs[:lm.eval.n_id])
  stream = _stream(lm, d, seed, 20 + lm.seeds.pools, set(_pretrain_prompts(key)) | targets)
  held = _take(stream, lm.eval.n_id, f"{d}-digit problems")
  pool = _take(stream, pool_size, f"{d}-digit problems")
  return tuple(pool), tuple(held)


def cell_data(lm: ml_collections.ConfigDict, d: int, n: int, seed: int
              ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
  """(the n SFT examples of difficulty d, the held-out difficulty-d problems).

  The SFT examples are the first n of the per-(seed, d) pool of max(budgets) problems, so a smaller budget's
  set is a prefix of a larger one's; the held-out set depends on (seed, d) only. Both are disjoint from each
  other, from the target mix and (addition) from the pretraining problems.
  """
  if n > max(lm.budgets):
    raise ConfigError(f"n={n} exceeds max(config.lm.budgets)={max(lm.budgets)}, the pool size; add it to budgets")
  pool, held = _pools_cached(_key(lm, seed), int(d))
  return list(pool[:n]), list(held)


def _read_records(path: str, key: str, *, required: bool) -> list[tuple[int | None, dict[str, str]]]:
  """[(difficulty, {"prompt", "completion"})] of a JSONL file (difficulty None when absent and not required)."""
  if not path:
    raise ConfigError("config.lm.data.source='jsonl' needs config.lm.data.path (SFT pool) and "
                      "config.lm.data.target_path (target mix)")
  out = []
  for lineno, rec in iter_json_lines(path):
    where = f"{path}:{lineno}"
    ex = sft_data.as_example(rec, where=where)
    level = rec.get(key) if isinstance(rec, Mapping) else None
    if level is None and required or level is not None and (not isinstance(level, int) or isinstance(level, bool)):
      raise DataError(f"{where}: needs an integer {key!r} field (the difficulty bucket)")
    out.append((level, {"prompt": ex.prompt, "completion": ex.completion}))
  if not out:
    raise DataError(f"{path} holds no records")
  return out


def build_rows(lm: ml_collections.ConfigDict, records: Sequence[Mapping[str, Any]], tok) -> dict[str, np.ndarray]:
  """Padded SFT rows of the arm's one row length (`seq_len`)."""
  return sft_data.build_padded(list(records), tok, seq_len(lm), truncation="error")


# --------------------------------------------------------------------------------------------- pretrain

def _pretrain_run_config(lm, seed: int, tok) -> ml_collections.ConfigDict:
  """The `fit` config of the base model's training (its own run, checked on resume)."""
  p = lm.pretrain
  c = configs.base_config()
  c.seed = seed + lm.seeds.pretrain
  c.mesh, c.sharding_rules, c.tensorboard = tuple(map(tuple, lm.mesh)), tuple(map(tuple, lm.sharding_rules)), False
  c.model = ml_collections.ConfigDict(dataclasses.asdict(model_config(lm, tok)))
  c.data = ml_collections.ConfigDict(dict(tokenizer=lm.tokenizer, seq_len=seq_len(lm), min_digits=p.min_digits,
                                          max_digits=p.max_digits, n_examples=p.n_examples,
                                          reverse_answer=lm.data.reverse_answer, pad_operands=lm.data.pad_operands,
                                          leading_zeros=lm.data.leading_zeros,
                                          widest=_widest(lm) if lm.data.pad_operands else 0,
                                          data_seed=lm.seeds.pretrain))
  c.train = configs.train_config(
      batch_size=p.batch, num_steps=p.steps, log_every=min(p.log_every, p.steps),
      checkpoint_every=p.checkpoint_every, keep_checkpoints=1,
      optimizer=dict(name="adamw", learning_rate=p.lr, schedule="warmup_cosine", warmup_steps=p.warmup,
                     weight_decay=p.weight_decay, clip_norm=1.0, b2=0.98))
  c = configs.finalize(c)
  configs.set_experiment_name(c, EXPERIMENT)
  return c


def pretrain(lm: ml_collections.ConfigDict, seed: int, workdir: str) -> Transformer:
  """The base model: `lm.model.hf_path` if set, else a model trained on easy addition (deterministic in seed).

  The training is a resumable `jaxlab.train.fit` run in `workdir`; the trained model is written to
  `workdir/final` (Hugging Face format) with the settings it was trained with, and a later call with the same
  settings loads it from there instead of training.

  Raises:
    ConfigError: `workdir` holds a pretraining run with other settings.
  """
  validate(lm)
  tok = tokenizer_for(lm)
  if lm.model.hf_path:
    model = hf.from_pretrained(lm.model.hf_path, dtype=lm.model.dtype)
    check_fits(tok, model.config.vocab_size, f"the checkpoint {lm.model.hf_path}")
    return model
  config = _pretrain_run_config(lm, seed, tok)
  workdir_lib.check(config, workdir)       # another run's workdir is refused before anything is loaded
  final = os.path.join(workdir, _FINAL)
  stamp = json.loads(configs.to_json(config))
  if os.path.exists(os.path.join(final, _STAMP)):
    with open(os.path.join(final, _STAMP)) as f:
      if json.load(f) == stamp:
        return hf.from_pretrained(final, dtype=lm.model.dtype)
  mcfg = model_config(lm, tok)
  train = build_rows(lm, pretrain_examples(lm, seed), tok)
  result = fit(config, workdir, model_fn=lambda rngs: Transformer(mcfg, rngs=rngs), loss_fn=sft.make_loss_fn(),
               train_source=ArraySource(train))
  model = result.model()
  hf.save_pretrained(model, final)
  tmp = os.path.join(final, _STAMP + ".tmp")
  with open(tmp, "w") as f:
    json.dump(stamp, f, indent=2, sort_keys=True)
  os.replace(tmp, os.path.join(final, _STAMP))
  return hf.from_pretrained(final, dtype=lm.model.dtype)   # the same weights whether trained or loaded


# -------------------------------------------------------------------------------------------------- SFT

@dataclasses.dataclass
class _Steps:
  """The jitted pieces shared by every cell with the same model, optimizer and mesh."""
  mesh: Any
  rules: tuple
  modeldef: ModelDef
  shardings: TrainState
  batch_sharding: Any
  train_step: Any
  eval_step: Any
  init: Any


@functools.lru_cache(maxsize=4)
def _steps(mcfg: TransformerConfig, opt_items: tuple, num_steps: int, mesh_spec: tuple, rules: tuple) -> _Steps:
  mesh = mesh_lib.make_mesh(mesh_spec)
  with mesh_lib.use(mesh, rules):
    modeldef = ModelDef(lambda rngs: Transformer(mcfg, rngs=rngs))
    tx, schedule = optim.make_optimizer(ml_collections.ConfigDict(dict(opt_items)), num_steps)
    shardings = train_state_shardings(modeldef, tx, mesh, rules)
    bsh = mesh_lib.batch_sharding(mesh, rules)
    train_step = step_lib.make_train_step(modeldef, sft.make_loss_fn(), tx, schedule, shardings, bsh)
    eval_step = step_lib.make_eval_step(modeldef, sft.make_eval_fn(), shardings, bsh)

    def init(params, model_state, seed):   # fresh buffers (the steps donate the state; the base stays intact)
      params = jax.tree.map(jnp.copy, params)
      return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=jax.tree.map(jnp.copy, model_state),
                        opt_state=tx.init(params), rng=jax.random.key_data(jax.random.key(seed)))
    init = jax.jit(init, out_shardings=shardings)
  return _Steps(mesh, rules, modeldef, shardings, bsh, train_step, eval_step, init)


def _steps_for(lm, mcfg: TransformerConfig) -> _Steps:
  s = lm.sft
  opt = dict(configs.OPTIMIZER_DEFAULTS, name="adamw", learning_rate=s.lr, schedule=s.schedule,
             warmup_steps=s.warmup, weight_decay=s.weight_decay, clip_norm=s.clip_norm, b2=0.98)
  rules = tuple((str(k), tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in lm.sharding_rules)
  steps = _steps(mcfg, tuple(sorted(opt.items())), int(s.steps), tuple(map(tuple, lm.mesh)), rules)
  split = mesh_lib.data_split(steps.mesh, rules)
  for key, value in (("sft.batch", s.batch), ("eval.batch", lm.eval.batch)):
    if value % split:
      raise ConfigError(f"config.lm.{key}={value} is not divisible by the {split}-way data split of mesh "
                        f"{dict(steps.mesh.shape)}; use a multiple of {split} or change config.lm.mesh")
  return steps


def _placed(steps: _Steps, base: Transformer) -> tuple[Any, Any]:
  """The base model's (params, model_state) on the steps' mesh (wherever the base lives)."""
  params, model_state = ModelDef.split(base)
  return (jax.device_put(params, steps.shardings.params),
          jax.device_put(model_state, steps.shardings.model_state))


def _teacher_forced(steps: _Steps, state: TrainState, data: dict[str, np.ndarray], batch: int) -> dict[str, float]:
  """Means over examples of `jaxlab.lm.sft.make_eval_fn`'s per-row loss / token_accuracy / exact_match."""
  source, erows = ArraySource(data), process_rows(steps.batch_sharding, batch)
  totals, count = None, 0.0
  for local, mask in eval_batches(source, batch, erows):
    g = to_global(local, steps.batch_sharding, batch)
    sums, k = steps.eval_step(state, g, to_global({"m": mask}, steps.batch_sharding, batch)["m"])
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    count = count + k
  totals, count = jax.device_get((totals, count))
  return {k: float(v) / float(count) for k, v in totals.items()}


def greedy_hits(model: Transformer, tok, records: Sequence[Mapping[str, str]], *, batch: int,
                max_new_tokens: int) -> np.ndarray:
  """1.0 where greedy KV-cache generation reproduces the completion exactly (per record).

  Every call to `jaxlab.lm.generate` gets `batch` prompts (the last chunk is filled with copies of its last
  prompt, whose results are dropped), so each prompt width compiles once.
  """
  prompts = [sft_data.prompt_ids(r, tok) for r in records]
  hits = np.zeros(len(records), np.float32)
  for s in range(0, len(prompts), batch):
    chunk = prompts[s:s + batch]
    real = len(chunk)
    chunk = chunk + [chunk[-1]] * (batch - real)
    out = generate(model, chunk, max_new_tokens, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
    toks, lens = jax.device_get((out.tokens, out.lengths))
    for i in range(real):
      hits[s + i] = decode_completion(tok, toks[i, :lens[i]]) == records[s + i]["completion"]
  return hits


def _max_new_tokens(lm, tok, records) -> int:
  """Generation length: `eval.max_new_tokens`, else the longest possible sum + EOS (addition), else the
  longest completion of `records` + EOS."""
  if lm.eval.max_new_tokens:
    return int(lm.eval.max_new_tokens)
  if lm.data.source == "addition":
    return _widest(lm) + 2
  return max(len(tok.encode(r["completion"])) for r in records) + 1


def evaluate(lm: ml_collections.ConfigDict, steps: _Steps, state: TrainState, tok, records, batch: int,
             max_new_tokens: int) -> dict[str, float]:
  """{"loss", "err", "acc"} of a model state on records: teacher-forced NLL, greedy exact match."""
  tf = _teacher_forced(steps, state, build_rows(lm, records, tok), batch)
  model = steps.modeldef.merge(state.params, state.model_state)
  model.eval()
  acc = float(np.mean(greedy_hits(model, tok, records, batch=batch, max_new_tokens=max_new_tokens)))
  return {"loss": tf["loss"], "acc": acc, "err": 1.0 - acc}


def _target_metrics(lm, steps: _Steps, state: TrainState, tok, targets, batch: int, max_new_tokens: int
                    ) -> dict[str, float]:
  """"target_loss", "target_acc", "target_err" over the mix (each level's share = its count) and, per level,
  "target_loss_k<level>" / "target_err_k<level>"."""
  out, loss, acc = {}, 0.0, 0.0
  for level in sorted({lvl for lvl, _ in targets}):
    recs = [r for lvl, r in targets if lvl == level]
    got = evaluate(lm, steps, state, tok, recs, batch, max_new_tokens)
    loss, acc = loss + got["loss"] * len(recs), acc + got["acc"] * len(recs)
    if level >= 0:
      out[f"target_loss_k{level}"], out[f"target_err_k{level}"] = got["loss"], got["err"]
  out["target_loss"], out["target_acc"] = loss / len(targets), acc / len(targets)
  out["target_err"] = 1.0 - out["target_acc"]
  return out


def sft_cell(lm: ml_collections.ConfigDict, base: Transformer, d: int, n: int, seed: int) -> dict[str, float]:
  """SFT of a copy of `base` on n difficulty-d examples, scored on them, on held-out d and on the target mix.

  Deterministic given (seed, d, n) (and the settings); `base` is not changed.

  Returns:
    {"d", "n", "train_loss", "id_loss", "id_err", "id_acc", "target_loss", "target_err", "target_acc",
     "gen_gap" = id_loss - train_loss, "extrap_gap" = target_loss - id_loss, "seconds"} plus the target mix
    per level: "target_err_k<level>" and "target_loss_k<level>".
  """
  t0 = time.time()
  validate(lm)
  tok = tokenizer_for(lm)
  train_recs, held = cell_data(lm, d, n, seed)
  targets = target_set(lm, seed)
  steps = _steps_for(lm, base.config)
  s, eb = lm.sft, int(lm.eval.batch)
  params, model_state = _placed(steps, base)
  sft_seed = int(np.random.default_rng([seed, lm.seeds.sft, d, n]).integers(2**31 - 1))
  with mesh_lib.use(steps.mesh, steps.rules):
    state = steps.init(params, model_state, jnp.uint32(sft_seed))
    batcher = Batcher(ArraySource(build_rows(lm, train_recs, tok)), s.batch, seed=sft_seed)
    brows = process_rows(steps.batch_sharding, s.batch)
    for i in range(s.steps):
      state, _ = steps.train_step(state, to_global(batcher.local_batch(i, brows), steps.batch_sharding, s.batch))
    max_new = _max_new_tokens(lm, tok, list(held) + [r for _, r in targets])
    train = _teacher_forced(steps, state, build_rows(lm, train_recs, tok), eb)
    ident = evaluate(lm, steps, state, tok, held, eb, max_new)
    out: dict[str, float] = {"d": float(d), "n": float(n), "train_loss": train["loss"], "id_loss": ident["loss"],
                             "id_err": ident["err"], "id_acc": ident["acc"]}
    out.update(_target_metrics(lm, steps, state, tok, targets, eb, max_new))
  out["gen_gap"] = out["id_loss"] - out["train_loss"]
  out["extrap_gap"] = out["target_loss"] - out["id_loss"]
  out["seconds"] = time.time() - t0
  return out


def base_metrics(lm: ml_collections.ConfigDict, base: Transformer, seed: int) -> dict[str, float]:
  """The base model (no SFT) on the target mix (a reference row): the target metrics of `sft_cell`."""
  tok = tokenizer_for(lm)
  targets = target_set(lm, seed)
  steps = _steps_for(lm, base.config)
  params, model_state = _placed(steps, base)
  eb = int(lm.eval.batch)
  with mesh_lib.use(steps.mesh, steps.rules):
    state = steps.init(params, model_state, jnp.uint32(0))
    return _target_metrics(lm, steps, state, tok, targets, eb, _max_new_tokens(lm, tok, [r for _, r in targets]))


# ---------------------------------------------------------------------------------------- grid and plots

def grid_arrays(rows: Sequence[Mapping[str, float]], difficulties: Sequence[int], budgets: Sequence[int]
                ) -> dict[str, np.ndarray]:
  """Per metric, a (len(budgets), len(difficulties)) float array (NaN where no row has that cell).

  Rows are matched to cells by their "d" and "n" entries; every numeric key of the rows becomes an array.

  Raises:
    DataError: a row without "d" / "n", or two rows for one cell.
  """
  col = {int(d): j for j, d in enumerate(difficulties)}
  row = {int(n): i for i, n in enumerate(budgets)}
  keys = sorted({k for r in rows for k, v in r.items() if k not in ("d", "n") and np.isscalar(v)})
  out = {k: np.full((len(budgets), len(difficulties)), np.nan) for k in keys}
  seen = set()
  for r in rows:
    if "d" not in r or "n" not in r:
      raise DataError(f"grid_arrays: a row needs 'd' and 'n' (as sft_cell returns), got keys {sorted(r)}")
    d, n = int(r["d"]), int(r["n"])
    if d not in col or n not in row:
      continue
    if (d, n) in seen:
      raise DataError(f"grid_arrays: two rows for cell d={d}, n={n}")
    seen.add((d, n))
    for k in keys:
      if k in r:
        out[k][row[n], col[d]] = float(r[k])
  return out


def heatmap(arrays: Mapping[str, np.ndarray], difficulties: Sequence[int], budgets: Sequence[int], metric: str,
            path: str, title: str | None = None) -> str:
  """Writes a PNG heat map of `arrays[metric]`: n on the y axis, d on the x axis, each cell annotated.

  The best (lowest) cell of each row (budget) is boxed when the metric is an error or a loss.

  Returns:
    The path written.
  """
  from jaxlab.plotting import plt, save  # pylint: disable=g-import-not-at-top  (sets the headless backend)
  if metric not in arrays:
    raise DataError(f"heatmap: no metric {metric!r}; have {sorted(arrays)}")
  a = np.asarray(arrays[metric], float)
  fig, ax = plt.subplots(figsize=(1.1 * len(difficulties) + 2.2, 0.7 * len(budgets) + 1.6))
  im = ax.imshow(a, origin="lower", cmap="viridis", aspect="auto")
  fig.colorbar(im, ax=ax, label=metric)
  ax.set_xticks(range(len(difficulties)), [str(d) for d in difficulties])
  ax.set_yticks(range(len(budgets)), [str(n) for n in budgets])
  ax.set_xlabel("difficulty d (operand digits)")
  ax.set_ylabel("SFT examples n")
  finite = a[np.isfinite(a)]
  mid = float(np.mean([finite.min(), finite.max()])) if finite.size else 0.0
  for i in range(a.shape[0]):
    for j in range(a.shape[1]):
      if np.isfinite(a[i, j]):
        ax.text(j, i, f"{a[i, j]:.2f}", ha="center", va="center", fontsize=8,
                color="black" if a[i, j] > mid else "white")
  if metric.endswith(("err", "loss")):
    for i in range(a.shape[0]):
      if np.isfinite(a[i]).any():
        j = int(np.nanargmin(a[i]))
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
  ax.set_title(title or metric)
  return save(fig, os.path.dirname(os.path.abspath(path)), os.path.basename(path))
