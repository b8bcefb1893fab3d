"""`LocalBackend`: a jaxlab or Hugging Face checkpoint answering through the LM core's KV-cache sampler.

    backend = LocalBackend("path/to/checkpoint")        # an HF folder or a jaxlab run directory
    backend.complete([{"role": "user", "content": "2+3="}], max_tokens=8)

What it loads (nothing is downloaded):

* a Hugging Face checkpoint folder (`config.json` with `model_type` / `architectures`, `*.safetensors`,
  `tokenizer.json`): `jaxlab.lm.from_pretrained` and `HFTokenizer.from_file`;
* a jaxlab run directory (`config.json`, `checkpoints/`; `run.json` names the experiment, else `experiment=`):
  the experiment's `load_trained(config, workdir)`, e.g. an `lm_sft` run;
* or a model and tokenizer already in memory: `LocalBackend(model=..., tokenizer=...)`.

Prompts: chat messages are rendered with the checkpoint's chat template (`jaxlab.llm.chat`; the plain
"role: content" format when there is none) and encoded without added specials (the template writes BOS
itself); a raw string is encoded as BOS + text, the SFT prompt format. Each prompt is repeated `n` times and
the rows go to `jaxlab.lm.generate` in chunks of `batch_size`; chunk c samples with
`fold_in(key(seed), c)` (seed 0 when none is given), so a request is reproducible. Generation stops at the
tokenizer's EOS token; stop strings are applied to the decoded text afterwards (the sampler runs to
`max_tokens` or EOS, then the text is cut at the first stop string, as OpenAI servers do). `tokens` counts
the generated tokens up to and including the EOS token (or the token completing a stop string), and
`logprobs` are those tokens' log-probabilities under the model.

The sampler runs on the default device, or sharded over the mesh in context (`jaxlab.mesh.use`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from jaxlab.errors import CheckpointError, ConfigError
from jaxlab.llm import chat
from jaxlab.llm.base import (Backend, Completion, ContextTooLongError, Prompt, Sampling, cut_at_stop,
                             progress_bar)


def is_hf_checkpoint(folder: str) -> bool:
  """Whether `folder` holds a Hugging Face model config (model_type or architectures in config.json)."""
  file = os.path.join(folder, "config.json")
  if not os.path.isfile(file):
    return False
  try:
    with open(file) as f:
      cfg = json.load(f)
  except (OSError, json.JSONDecodeError):
    return False
  return isinstance(cfg, dict) and ("model_type" in cfg or "architectures" in cfg)


def load_run(workdir: str, experiment: str | None = None):
  """(model in eval mode, tokenizer) of a jaxlab run directory, through its experiment's `load_trained`.

  Args:
    workdir: a finished run's directory (config.json, checkpoints/).
    experiment: the experiment that trained it (default: run.json's, else "lm_sft").

  Raises:
    CheckpointError: no config.json; ConfigError: an experiment without `load_trained`.
  """
  from jaxlab import configs, registry  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise CheckpointError(f"{workdir} has no config.json; pass the run directory of a finished training run "
                          "or a Hugging Face checkpoint folder")
  if experiment is None:
    run_file = os.path.join(workdir, "run.json")
    if os.path.isfile(run_file):
      with open(run_file) as f:
        experiment = json.load(f).get("experiment")
  exp = registry.load(experiment or "lm_sft")
  loader = getattr(exp.train_module, "load_trained", None)
  if loader is None:
    raise ConfigError(f"experiment {exp.name!r} has no load_trained(config, workdir); use an LM experiment "
                      "such as lm_sft")
  with open(path) as f:
    saved = json.load(f)
  config = exp.get_config(str(saved.get("variant", "tiny")))

  def tupled(v):
    return tuple(tupled(x) for x in v) if isinstance(v, list) else v

  known = configs.flatten(config)
  configs.apply_overrides(config, {k: tupled(v) for k, v in configs.flatten(saved).items() if k in known})
  return loader(config, workdir)


def _special_tokens(folder: str, tokenizer) -> dict[str, Any]:
  """The template's special-token variables: the tokenizer's roles, then every "*_token" of its config."""
  names = chat.special_tokens_of(tokenizer)
  file = os.path.join(folder, "tokenizer_config.json")
  if os.path.isfile(file):
    with open(file, encoding="utf-8") as f:
      cfg = json.load(f)
    for k, v in cfg.items():
      if k.endswith("_token") and isinstance(v, (str, dict)):
        names[k] = v.get("content") if isinstance(v, dict) else v
  return names


class LocalBackend(Backend):
  """A local jaxlab `Transformer` behind the `Backend` interface (see the module docstring).

  A batch is sampled as one sequence of sampler rows, so a prompt's sampled answers depend on its place in
  the batch (`independent_requests` is False); greedy answers do not.

  Args:
    model_dir: a Hugging Face checkpoint folder or a jaxlab run directory (or None with `model`).
    model: a `jaxlab.lm.Transformer` (instead of `model_dir`).
    tokenizer: its tokenizer (with `model`).
    chat_template: a Jinja chat template overriding the checkpoint's (None: the checkpoint's, else plain).
    batch_size: sequences per sampler call.
    experiment: the experiment of a run directory (default: its run.json, else "lm_sft").
    name: the model's name in cache keys and server answers (default: the folder name).
  """

  def __init__(self, model_dir: str | None = None, *, model=None, tokenizer=None, chat_template: str | None = None,
               batch_size: int = 64, experiment: str | None = None, name: str | None = None):
    from jaxlab.lm import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
    if (model_dir is None) == (model is None):
      raise ConfigError("LocalBackend takes either model_dir or model= (with tokenizer=), not both or neither")
    if int(batch_size) < 1:
      raise ConfigError(f"LocalBackend: batch_size must be >= 1, got {batch_size}")
    template, specials = chat_template, None
    if model_dir is not None:
      if not os.path.isdir(model_dir):
        raise CheckpointError(f"model directory {model_dir!r} does not exist; pass a Hugging Face checkpoint "
                              "folder (config.json, *.safetensors, tokenizer.json) or a jaxlab run directory")
      if is_hf_checkpoint(model_dir):
        from jaxlab.lm import hf  # pylint: disable=g-import-not-at-top
        model = hf.from_pretrained(model_dir)
        tokenizer = tok_lib.HFTokenizer.from_file(model_dir)
      else:
        model, tokenizer = load_run(model_dir, experiment)
      if template is None:
        template = chat.read_template(model_dir)
      specials = _special_tokens(model_dir, tokenizer)
      name = name or os.path.basename(os.path.normpath(model_dir))
    elif tokenizer is None:
      raise ConfigError("LocalBackend(model=...) needs tokenizer= too")
    tok_lib.check_fits(tokenizer, model.config.vocab_size, model_dir or "the model")
    model.eval()
    self.model, self.tokenizer = model, tokenizer
    self.template = chat.ChatTemplate(template, specials or chat.special_tokens_of(tokenizer),
                                      where=f"{model_dir or 'model'} chat template")
    self.batch_size = int(batch_size)
    self.model_id = name or "local"
    self.context = int(model.config.max_position)
    self.independent_requests = False

  def encode(self, prompt: Prompt) -> list[int]:
    """The token ids a prompt is sent as (see the module docstring)."""
    from jaxlab.lm import sft_data  # pylint: disable=g-import-not-at-top
    if isinstance(prompt, str):
      return sft_data.encode_prompt(prompt, self.tokenizer)
    return list(self.tokenizer.encode(self.template.render(prompt, add_generation_prompt=True)))

  def _complete_batch(self, prompts: list[Prompt], sampling: Sampling,
                      request_ids: list[str | None]) -> list[list[Completion]]:
    encoded = [self.encode(p) for p in prompts]
    for i, ids in enumerate(encoded):
      if len(ids) + sampling.max_tokens > self.context:
        raise ContextTooLongError(
            f"prompt {i} has {len(ids)} tokens; with max_tokens={sampling.max_tokens} that is "
            f"{len(ids) + sampling.max_tokens} > the model's context of {self.context} tokens; lower max_tokens "
            "or shorten the prompt")
    rows = [(i, ids) for i, ids in enumerate(encoded) for _ in range(sampling.n)]
    out: list[list[Completion]] = [[] for _ in prompts]
    starts = range(0, len(rows), self.batch_size)
    with progress_bar(len(starts), f"sampling {len(rows)} sequences") as bar:
      for c, start in enumerate(starts):
        chunk = rows[start:start + self.batch_size]
        for (i, _), comp in zip(chunk, self.sample([ids for _, ids in chunk], sampling, chunk_index=c)):
          out[i].append(comp)
        bar.update(1)
    return out

  def sample(self, rows: Sequence[Sequence[int]], sampling: Sampling, chunk_index: int = 0) -> list[Completion]:
    """One sampler call over token-id prompts: a completion per row."""
    import jax  # pylint: disable=g-import-not-at-top
    from jaxlab.lm import generate  # pylint: disable=g-import-not-at-top
    tok = self.tokenizer
    key = jax.random.fold_in(jax.random.key(0 if sampling.seed is None else sampling.seed), chunk_index)
    res = generate(self.model, [list(r) for r in rows], sampling.max_tokens, temperature=sampling.temperature,
                   top_p=sampling.top_p, top_k=sampling.top_k, stop_tokens=(tok.eos_id,), pad_id=tok.pad_id,
                   key=key)
    toks, lens, lps, stopped = (np.asarray(x) for x in (res.tokens, res.lengths, res.logprobs, res.stopped))
    return [self._completion(toks[b, :lens[b]], lps[b, :lens[b]], bool(stopped[b]), sampling)
            for b in range(len(rows))]

  def decode(self, ids: Sequence[int]) -> str:
    """Text of generated ids (specials dropped). Ids past the tokenizer's vocabulary (a model whose embedding
    table is padded beyond it, untrained) decode as U+FFFD instead of failing."""
    limit = self.tokenizer.vocab_size
    out, run = [], []
    for t in ids:
      if 0 <= t < limit:
        run.append(t)
        continue
      out.append(self.tokenizer.decode(run, skip_special=True) + "\ufffd")
      run = []
    return "".join(out) + self.tokenizer.decode(run, skip_special=True)

  def _completion(self, ids: np.ndarray, lps: np.ndarray, eos: bool, sampling: Sampling) -> Completion:
    ids = [int(t) for t in ids]
    body = ids[:-1] if eos else ids
    text, hit = cut_at_stop(self.decode(body), sampling.stop)
    count = len(ids)
    if hit:   # the shortest prefix whose text reaches a stop string
      count = next(k for k in range(1, len(body) + 1) if cut_at_stop(self.decode(body[:k]), sampling.stop)[1])
    return Completion(text=text, tokens=count, finish_reason="stop" if eos or hit else "length",
                      logprobs=tuple(float(x) for x in lps[:count]) if sampling.logprobs else None,
                      token_ids=tuple(ids[:count]))
