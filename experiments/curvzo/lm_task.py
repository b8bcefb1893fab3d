"""Full-scale CurvZO: prompt-based ZO fine-tuning of a decoder LM (OPT / Llama) on SST-2 and SuperGLUE tasks.

MeZO's protocol (princeton-nlp/MeZO, `large_models/`): each example becomes a prompt and a few candidate
completions (label words or answer options); the model scores a candidate by the summed log-probability of
its tokens; training minimises the cross-entropy over candidates, evaluation reports the accuracy of the
top-scoring candidate. 1000 training examples and 500 dev examples sampled from the train split, 1000
evaluation examples from the validation split (GLUE / SuperGLUE test labels are hidden).

Data: TFDS (`glue/sst2`, `super_glue/{rte,cb,boolq,copa,wic,wsc.fixed,multirc}`; prepare once with
`tfds build ...`, which needs TensorFlow for these builders), or JSONL files `<data_dir>/<split>.jsonl` with the
same fields (`config.task.source = "jsonl"`). Nothing is downloaded.

Templates below are written for this codebase in the spirit of MeZO's `templates.py` (same kind of prompt
and the same label words where we know them); they are not a copy.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab import configs
from jaxlab import mesh as mesh_lib
from jaxlab.data.jsonl import iter_jsonl
from jaxlab.errors import DataError, MissingDependencyError
from jaxlab.state import ModelDef, param_count, tree_shardings
from jaxlab.train import run_loop

from . import method as method_lib


def _t(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _yes_no(label: int, yes_label: int) -> int:
  return 0 if int(label) == yes_label else 1


# task -> (TFDS name, fields, record -> (prompt, candidates, label index))
TASKS: dict[str, tuple[str, tuple[str, ...], Callable[[dict], tuple[str, list[str], int]]]] = {
    "sst2": ("glue/sst2", ("sentence", "label"),
             lambda r: (f"{_t(r['sentence']).strip()} It was", [" terrible", " great"], int(r["label"]))),
    "rte": ("super_glue/rte", ("premise", "hypothesis", "label"),
            lambda r: (f"{_t(r['premise'])}\nDoes this mean that \"{_t(r['hypothesis'])}\" is true? Yes or No?\n",
                       ["Yes", "No"], int(r["label"]))),                     # 0 entailment, 1 not_entailment
    "cb": ("super_glue/cb", ("premise", "hypothesis", "label"),
           lambda r: (f"Suppose {_t(r['premise'])} Can we infer that \"{_t(r['hypothesis'])}\"? Yes, No, or Maybe?\n",
                      ["Yes", "No", "Maybe"], int(r["label"]))),             # entailment, contradiction, neutral
    "boolq": ("super_glue/boolq", ("passage", "question", "label"),
              lambda r: (f"{_t(r['passage'])} {_t(r['question'])}?", [" No", " Yes"], int(r["label"]))),
    "copa": ("super_glue/copa", ("premise", "choice1", "choice2", "question", "label"),
             lambda r: (_t(r["premise"]).rstrip(".") + (" so" if _t(r["question"]) == "effect" else " because"),
                        [" " + _t(r["choice1"])[:1].lower() + _t(r["choice1"])[1:],
                         " " + _t(r["choice2"])[:1].lower() + _t(r["choice2"])[1:]], int(r["label"]))),
    "wic": ("super_glue/wic", ("word", "sentence1", "sentence2", "label"),
            lambda r: (f"Does the word \"{_t(r['word'])}\" have the same meaning in these two sentences? Yes, No?\n"
                       f"{_t(r['sentence1'])}\n{_t(r['sentence2'])}\n", ["No", "Yes"], int(r["label"]))),
    "wsc": ("super_glue/wsc.fixed", ("text", "span1_text", "span2_text", "label"),
            lambda r: (f"{_t(r['text'])}\nIn the previous sentence, does the pronoun \"{_t(r['span2_text']).lower()}\" "
                       f"refer to {_t(r['span1_text'])}? Yes or No?\n", ["No", "Yes"], int(r["label"]))),
    "multirc": ("super_glue/multirc", ("paragraph", "question", "answer", "label"),
                lambda r: (f"{_t(r['paragraph'])}\nQuestion: {_t(r['question'])}\nI found this answer "
                           f"\"{_t(r['answer'])}\". Is that correct? Yes or No?\n", ["No", "Yes"], int(r["label"]))),
}


def tfds_name(task: str) -> str:
  """The TFDS dataset of a task."""
  return TASKS[task][0]


def load_records(task: str, split: str, source: str, data_dir: str) -> list[dict]:
  """Records of one split, from TFDS (`source="tfds"`) or `<data_dir>/<split>.jsonl`.

  Raises:
    DataError: missing files / dataset, a malformed JSONL line (with its number), missing fields.
    MissingDependencyError: TFDS's GLUE / SuperGLUE builders need TensorFlow.
  """
  name, fields, _ = TASKS[task]
  if source == "jsonl":
    path = os.path.join(data_dir, f"{split}.jsonl")
    if not os.path.exists(path):
      raise DataError(f"{path} does not exist; config.task.source='jsonl' reads <data_dir>/{{train,validation}}.jsonl")
    out = []
    for i, rec in iter_jsonl(path):
      missing = [k for k in fields if k not in rec]
      if missing:
        raise DataError(f"{path}:{i}: record lacks field(s) {missing} needed by task {task!r} (fields {fields})")
      out.append(rec)
    return out
  if importlib.util.find_spec("tensorflow") is None:
    raise MissingDependencyError(f"TFDS's {name} builder needs TensorFlow: pip install tensorflow (and prepare the "
                                 f"data once with `tfds build {name} --data_dir=DIR`), or use "
                                 "config.task.source='jsonl'")
  from jaxlab.data.tfds import TfdsSource  # pylint: disable=g-import-not-at-top
  src = TfdsSource(name, split, data_dir=data_dir or None)
  recs = src[np.arange(len(src))]
  return [{k: recs[k][i] for k in fields} for i in range(len(src))]


def encode(records: list[dict], task: str, tokenizer, max_length: int) -> dict[str, np.ndarray]:
  """Candidate sequences of every example.

  Returns:
    {"inputs", "targets": int32 (N, C, L), "mask": float32 (N, C, L) on the candidate's target tokens,
     "label": int32 (N,)}; C = the task's number of candidates, L = max_length. Prompts are cut from the left.
  """
  fn = TASKS[task][2]
  first = fn(records[0]) if records else ("", ["x"], 0)
  c = len(first[1])
  pad = getattr(tokenizer, "pad_id", 0) or 0
  n = len(records)
  inputs = np.full((n, c, max_length), pad, np.int32)
  targets = np.full((n, c, max_length), pad, np.int32)
  mask = np.zeros((n, c, max_length), np.float32)
  labels = np.zeros((n,), np.int32)
  for i, rec in enumerate(records):
    prompt, cands, label = fn(rec)
    if not 0 <= label < len(cands):
      raise DataError(f"{task} example {i}: label {label} is not one of {len(cands)} candidates")
    labels[i] = label
    p_ids = tokenizer.encode(prompt, add_bos=True)
    for j, cand in enumerate(cands):
      c_ids = tokenizer.encode(cand)[: max_length - 1]
      ids = (p_ids + c_ids)[-(max_length + 1):]
      k = len(ids) - 1
      inputs[i, j, :k] = ids[:-1]
      targets[i, j, :k] = ids[1:]
      mask[i, j, k - len(c_ids):k] = 1.0
  return {"inputs": inputs, "targets": targets, "mask": mask, "label": labels}


def candidate_scores(model, batch) -> jax.Array:
  """(B, C) summed log-probabilities of each candidate's tokens."""
  b, c, l = batch["inputs"].shape
  logits = model(batch["inputs"].reshape(b * c, l))
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  tok = jnp.take_along_axis(logp, batch["targets"].reshape(b * c, l, 1), axis=-1)[..., 0]
  return jnp.sum(tok * batch["mask"].reshape(b * c, l), axis=-1).reshape(b, c)


def classification_loss(scores, labels) -> jax.Array:
  """Cross-entropy over candidates."""
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(scores, -1), labels[:, None], axis=-1))


def build_model(config, tokenizer):
  """(ModelDef, params, model_state): a local HF checkpoint (model.hf_path) or a fresh small model."""
  from jaxlab.lm.model import Transformer, TransformerConfig  # pylint: disable=g-import-not-at-top
  mc = config.model
  if mc.hf_path:
    from jaxlab.lm import hf  # pylint: disable=g-import-not-at-top
    module = hf.from_pretrained(mc.hf_path, dtype=mc.dtype, scan_layers=False)   # per-tensor ZO blocks
    cfg = module.config
    md = ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))
    params, rest = md.split(module)
    return md, params, rest
  cfg = TransformerConfig(vocab_size=max(mc.vocab_size, tokenizer.vocab_size), hidden=mc.hidden,
                          n_layers=mc.n_layers, n_heads=mc.n_heads, mlp_hidden=mc.mlp_hidden, arch=mc.arch,
                          max_position=max(config.task.max_length, 8), dtype=mc.dtype, scan_layers=False)
  md = ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))
  params, rest = md.init(jax.random.key(config.seed))
  return md, params, rest


def _sample(n_total: int, n: int, rng) -> np.ndarray:
  return rng.permutation(n_total)[: min(n, n_total)]


def train_and_evaluate(config, workdir: str) -> dict:
  """ZO fine-tuning on config.task.name with config.method.method; returns the summary (dev / eval accuracy)."""
  from jaxlab.lm.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  t = config.task
  tok = load_tokenizer(config.model.hf_path or "byte")
  train_all = load_records(t.name, "train", t.source, t.data_dir)
  eval_all = load_records(t.name, "validation", t.source, t.data_dir)
  rng = np.random.default_rng(config.seed)
  perm = rng.permutation(len(train_all))
  train_idx, dev_idx = perm[: t.n_train], perm[t.n_train: t.n_train + t.n_dev]
  tc = config.train
  if len(train_idx) < tc.batch_size:
    raise DataError(f"{t.name}: {len(train_idx)} training examples < config.train.batch_size={tc.batch_size}")
  train = encode([train_all[i] for i in train_idx], t.name, tok, t.max_length)
  dev = encode([train_all[i] for i in dev_idx], t.name, tok, t.max_length) if len(dev_idx) else None
  evl = encode([eval_all[i] for i in _sample(len(eval_all), t.n_eval, rng)], t.name, tok, t.max_length)

  configs.check_devices(config, jax.device_count())
  with mesh_lib.use_config(config) as mesh:     # the ZO optimizer and the model read the mesh from context
    md, params, rest = build_model(config, tok)
    p_sh = tree_shardings(md.param_specs, params, mesh, mesh_lib.current_rules())
    params = jax.device_put(params, p_sh)
    rest = jax.device_put(rest, mesh_lib.replicated(mesh))
    bsh = mesh_lib.batch_sharding()
    lr = config.method.learning_rate
    opt = method_lib.make_optimizer(config.method.method, params, lambda step: jnp.float32(lr), config.method)

    def loss_fn(p, batch):
      model = md.merge(p, rest)
      return classification_loss(candidate_scores(model, batch), batch["label"])

    repl = mesh_lib.replicated(mesh)
    state = {"params": params, "opt": jax.device_put(opt.init(config.seed), repl)}
    shardings = {"params": p_sh, "opt": jax.tree.map(lambda _: repl, state["opt"])}

    def train_step(state, batch):
      p, o, mets = opt.step(loss_fn, state["params"], state["opt"], batch)
      return {"params": p, "opt": o}, {f"train/{k}": v for k, v in mets.items()}
    step = jax.jit(train_step, donate_argnums=0, out_shardings=(shardings, None))

    def get_batch(i):
      idx = np.random.default_rng([config.seed, i]).choice(len(train["label"]), tc.batch_size, replace=False)
      return jax.device_put({k: v[idx] for k, v in train.items()}, bsh)

    @jax.jit
    def correct(p, batch):
      return jnp.argmax(candidate_scores(md.merge(p, rest), batch), -1) == batch["label"]

    def accuracy(p, data):
      n = len(data["label"])
      bs = tc.eval_batch_size or tc.batch_size
      hits = 0
      for s in range(0, n, bs):
        chunk = {k: v[s:s + bs] for k, v in data.items()}
        m = len(chunk["label"])
        if m < bs:  # pad the last batch with copies of its first row; only the first m rows count
          chunk = {k: np.concatenate([v, np.repeat(v[:1], bs - m, 0)]) for k, v in chunk.items()}
        hits += int(np.sum(np.asarray(jax.device_get(correct(p, jax.device_put(chunk, bsh))))[:m]))
      return hits / max(n, 1)

    def evaluate(st):
      out = {"eval/accuracy": accuracy(st["params"], evl)}
      if dev is not None:
        out["eval/dev_accuracy"] = accuracy(st["params"], dev)
      return out

    extra = {"num_params": param_count(params), "task": t.name, "tfds": tfds_name(t.name),
             "method": config.method.method, "opt_state_floats": int(sum(np.prod(x.shape) for x in
                                                                         jax.tree.leaves(state["opt"])))}
    _, summary = run_loop(config, workdir, state, shardings, step, get_batch, evaluate=evaluate,
                          extra_summary=extra)
  return summary
