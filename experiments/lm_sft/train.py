"""LM SFT: masked-prompt supervised fine-tuning on the shared loop, scored by greedy KV-cache generation.

Launch: python -m jaxlab.main --config experiments/lm_sft/config.py:tiny --workdir /tmp/lm_sft
Expected (tiny, 2 CPU cores, a few minutes): >= 95% exact match of greedy generations on held-out 1-3 digit
additions (train and eval problems are disjoint).
"""

from __future__ import annotations

import logging

import numpy as np

from jaxlab import checkpoint
from jaxlab.data import ArraySource
from jaxlab.errors import ConfigError, DataError
from jaxlab.lm import generate, hf, lora, sft, sft_data, tasks
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.lm.tokenizer import check_fits, load_tokenizer
from jaxlab.state import ModelDef
from jaxlab.train import fit

from . import config as config_lib


def tokenizer_for(config):
  spec = config.data.tokenizer
  return load_tokenizer(config.model.hf_path if spec == "hf" else spec)


def examples(config):
  """(train, eval) lists of sft_data.Example."""
  d = config.data
  if d.source == "addition":
    return tasks.addition_split(d.n_train, d.n_eval, min_digits=d.min_digits, max_digits=d.max_digits,
                              seed=config.seed, reverse_answer=d.reverse_answer, pad_operands=d.pad_operands)
  data = sft_data.read_jsonl(d.path)
  if len(data) < 2:
    raise ConfigError(f"config.data.path={d.path!r} holds {len(data)} example(s); need at least 2")
  trained = [any(text.strip() for text, train in e.spans if train) for e in data]
  if not any(trained):
    # Nothing to learn, and an empty target is matched by any generation that stops at once (exact match 1.0).
    raise DataError(f"{d.path}: every one of the {len(data)} completions is empty, so there is nothing to train "
                    "on or score; give each record a non-empty 'completion'")
  if not all(trained):
    logging.getLogger("jaxlab").warning("%s: %d of %d completions are empty; they train only the end-of-sequence "
                                        "token", d.path, trained.count(False), len(data))
  rng = np.random.default_rng(config.seed)
  order = rng.permutation(len(data))
  n_eval = max(1, int(round(d.eval_fraction * len(data))))
  return [data[i] for i in order[n_eval:]], [data[i] for i in order[:n_eval]]


def model_config(config, tok) -> TransformerConfig:
  m = config.model
  if m.hf_path:
    cfg = hf.config_from_hf(m.hf_path, dtype=m.dtype, remat=m.remat)
    check_fits(tok, cfg.vocab_size, f"the checkpoint {m.hf_path}")   # before anything trains or is written
    return cfg
  vocab = -(-tok.vocab_size // 8) * 8  # a multiple of 8 so the vocabulary shards evenly
  return TransformerConfig(arch=m.arch, vocab_size=vocab, hidden=m.hidden, n_layers=m.n_layers, n_heads=m.n_heads,
                           n_kv_heads=m.n_kv_heads, mlp_hidden=m.mlp_hidden, max_position=m.max_position,
                           dtype=m.dtype, remat=m.remat, tie_embeddings=True)


def build_model_fn(config, mcfg):
  """rngs -> Transformer (with LoRA adapters when config.model.lora_rank > 0)."""
  m = config.model

  def model_fn(rngs):
    model = Transformer(mcfg, rngs=rngs)
    if m.lora_rank:
      lora.apply_lora(model, m.lora_rank, m.lora_alpha, tuple(m.lora_targets), rngs=rngs)
    return model
  return model_fn


def load_trained(config, workdir: str):
  """(model in eval mode, tokenizer) from a finished run's newest checkpoint, for sampling."""
  tok = tokenizer_for(config)
  md = ModelDef(build_model_fn(config, model_config(config, tok)))
  model = md.merge(*checkpoint.load_params(workdir, md))
  model.eval()
  return model, tok


def train_and_evaluate(config, workdir: str) -> dict:
  """Builds data, model (optionally from a HF checkpoint, optionally LoRA), trains, scores generations.

  The summary is fit's (train metrics of the last logging window, token-weighted; eval/* teacher-forced over
  the held-out rows) plus the greedy-generation score and the number of training rows.
  """
  config_lib.check_inputs(config)
  tok = tokenizer_for(config)
  train_ex, eval_ex = examples(config)
  d = config.data
  build = sft_data.build_packed if d.packed else sft_data.build_padded
  train = build(train_ex, tok, d.seq_len, truncation=d.truncation)
  evals = sft_data.build_padded(eval_ex, tok, d.seq_len, truncation=d.truncation)
  mcfg = model_config(config, tok)
  m = config.model
  model_fn = build_model_fn(config, mcfg)
  initial = None
  if m.hf_path:
    initial = hf.load_hf_params(m.hf_path, mcfg)
  def summarise(state, summary):   # runs inside fit's mesh context: the sampler shards its batch over it
    model = ModelDef(model_fn).merge(state.params, state.model_state)
    model.eval()
    return {**summary, **generation_eval(config, model, tok, eval_ex), "num_train_rows": int(train["inputs"].shape[0])}

  result = fit(config, workdir, model_fn=model_fn, loss_fn=sft.make_loss_fn(), train_source=ArraySource(train),
               eval_fn=sft.make_eval_fn(), eval_source=ArraySource(evals),
               wrap_optimizer=lora.freeze_base if m.lora_rank else None, initial_params=initial, summarise=summarise)
  return result.summary


def generation_eval(config, model, tok, eval_ex) -> dict:
  """Greedy KV-cache generation on held-out prompts; exact match of the decoded completion."""
  g = config.generate
  exs = eval_ex[: g.examples]
  hits = 0
  for start in range(0, len(exs), g.batch):
    batch = exs[start:start + g.batch]
    prompts = [sft_data.prompt_ids(e, tok) for e in batch]
    out = generate(model, prompts, g.max_new_tokens, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
    toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
    for e, row, n in zip(batch, toks, lens):
      ids = [int(t) for t in row[:n] if int(t) != tok.eos_id]
      hits += tok.decode(ids) == sft_data.as_example(e).completion
  return {"eval/gen_exact_match": hits / max(len(exs), 1), "eval/gen_examples": len(exs)}
