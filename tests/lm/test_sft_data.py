"""SFT data (JSONL, padded / packed rows, loss masks), loss and eval, the addition task, and LoRA."""

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxlab import configs
from jaxlab import mesh as mesh_lib
from jaxlab.data import ArraySource
from jaxlab.errors import ConfigError, DataError
from jaxlab.lm import lora, sft, sft_data, tasks
from jaxlab.lm.tokenizer import ByteTokenizer
from jaxlab.state import ModelDef, create_train_state
from jaxlab.train import fit
from jaxlab.train import step as step_lib

TOK = ByteTokenizer(["<obs>", "</obs>"])
RECORDS = [{"prompt": "12+345=", "completion": "357"}, {"prompt": "1+1=", "completion": "2"},
           {"prompt": "What is 2+2?\n", "completion": "four"}, {"prompt": "héllo ", "completion": "wörld 😀"}]


class PositionwiseLM(nnx.Module):
  """Stand-in LM with the transformer's call signature whose logits at t depend on (token_t, position_t) only."""

  def __init__(self, vocab, dim, max_len, rngs):
    self.embed = nnx.Embed(vocab, dim, rngs=rngs)
    self.pos = nnx.Embed(max_len, dim, rngs=rngs)
    self.q_proj = nnx.Linear(dim, dim, rngs=rngs)
    self.head = nnx.Linear(dim, vocab, rngs=rngs)

  def __call__(self, tokens_bl, positions_bl=None, *, segment_ids_bl=None, cache=None, cache_index=None):
    if positions_bl is None:
      positions_bl = jnp.broadcast_to(jnp.arange(tokens_bl.shape[1]), tokens_bl.shape)
    h = self.embed(tokens_bl) + self.pos(positions_bl)
    return self.head(jnp.tanh(self.q_proj(h)))


def example_rows(arrays):
  """[(row, segment, decoded inputs+last target, decoded loss-masked targets)] of every segment."""
  out = []
  for r in range(len(arrays["inputs"])):
    seg = arrays["segment_ids"][r]
    for s in sorted(set(seg[seg > 0].tolist())):
      idx = np.flatnonzero(seg == s)
      assert np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))), "segment not contiguous"
      assert np.array_equal(arrays["positions"][r, idx], np.arange(len(idx))), "positions must restart at 0"
      inp, tgt = arrays["inputs"][r, idx], arrays["targets"][r, idx]
      assert np.array_equal(inp[1:], tgt[:-1]), "targets are inputs shifted by one"
      full = np.concatenate([inp, tgt[-1:]])
      trained = tgt[arrays["loss_mask"][r, idx] > 0]
      out.append((r, s, full, trained))
  return out


# ------------------------------------------------------------------------------------------------- JSONL

def test_read_jsonl_formats(tmp_path):
  path = tmp_path / "d.jsonl"
  lines = [json.dumps(RECORDS[0]), "", json.dumps({"messages": [
      {"role": "system", "content": "add"}, {"role": "user", "content": "1+2"},
      {"role": "assistant", "content": "3"}]}),
      json.dumps({"prompt": "q", "completion": [{"text": "call()", "train": True},
                                                {"text": "<obs>out</obs>", "train": False},
                                                {"text": "done"}]})]
  path.write_text("\n".join(lines) + "\n")
  exs = sft_data.read_jsonl(str(path))
  assert len(exs) == 3
  assert exs[0].prompt == "12+345=" and exs[0].completion == "357"
  assert exs[1].prompt == "system: add\nuser: 1+2\nassistant: " and exs[1].completion == "3\n"
  assert exs[2].spans == (("q", False), ("call()", True), ("<obs>out</obs>", False), ("done", True))
  ids, train = sft_data.tokenize(exs[2], TOK)
  assert TOK.decode(ids[train]) == "call()done<|eos|>"


@pytest.mark.parametrize("line, match", [
    ('{"prompt": "a", "completion": "b"', r"d\.jsonl:3:\d+: not valid JSON"),
    ('{"prompt": "a"}', r"d\.jsonl:3: a record needs 'prompt' and 'completion'"),
    ('{"prompt": 1, "completion": "b"}', r"d\.jsonl:3: 'prompt' must be a string"),
    ('{"prompt": "a", "completion": 5}', r"d\.jsonl:3: 'completion' must be a string or a list"),
    ('{"prompt": "a", "completion": [{"txt": "b"}]}', r"d\.jsonl:3: completion\[0\]"),
    ('{"messages": [{"role": "user"}]}', r"d\.jsonl:3: messages\[0\]"),
    ('[1, 2]', r"d\.jsonl:3: expected a JSON object"),
])
def test_read_jsonl_errors_name_the_line(tmp_path, line, match):
  path = tmp_path / "d.jsonl"
  path.write_text(json.dumps(RECORDS[0]) + "\n\n" + line + "\n" + json.dumps(RECORDS[1]) + "\n")
  with pytest.raises(DataError, match=match) as e:
    sft_data.read_jsonl(str(path))
  assert "\n" not in str(e.value)


def test_read_jsonl_missing_and_empty(tmp_path):
  with pytest.raises(DataError, match="does not exist"):
    sft_data.read_jsonl(str(tmp_path / "nope.jsonl"))
  (tmp_path / "e.jsonl").write_text("\n\n")
  with pytest.raises(DataError, match="no records"):
    sft_data.read_jsonl(str(tmp_path / "e.jsonl"))


# ---------------------------------------------------------------------------------------- padded/packed

def test_padded_rows_mask_exactly_the_completion():
  arrays = sft_data.build_padded(RECORDS, TOK, 24)
  assert set(arrays) == set(sft_data.KEYS)
  assert all(arrays[k].dtype == np.int32 for k in sft_data.KEYS if k != "loss_mask")
  assert arrays["loss_mask"].dtype == np.float32 and arrays["inputs"].shape == (4, 24)
  segs = example_rows(arrays)
  assert [r for r, *_ in segs] == [0, 1, 2, 3]
  for (_, s, full, trained), rec in zip(segs, RECORDS):
    assert s == 1
    assert TOK.decode(full) == "<|bos|>" + rec["prompt"] + rec["completion"] + "<|eos|>"
    assert TOK.decode(trained) == rec["completion"] + "<|eos|>"
  pad = arrays["segment_ids"] == 0
  assert np.all(arrays["inputs"][pad] == TOK.pad_id) and np.all(arrays["loss_mask"][pad] == 0)
  assert np.all(arrays["positions"][pad] == 0)
  ArraySource(arrays)  # ready for the pipeline


def test_packed_rows_segments_positions_and_masks():
  recs = tasks.addition_examples(40, min_digits=1, max_digits=4, seed=3) + RECORDS
  arrays, stats = sft_data.build_packed(recs, TOK, 32, return_stats=True)
  segs = example_rows(arrays)
  assert len(segs) == len(recs) and len(arrays["inputs"]) < len(recs) / 2
  got = sorted(TOK.decode(full) for _, _, full, _ in segs)
  assert got == sorted("<|bos|>" + r["prompt"] + r["completion"] + "<|eos|>" for r in recs)
  want = {"<|bos|>" + r["prompt"] + r["completion"] + "<|eos|>": r["completion"] + "<|eos|>" for r in recs}
  for _, _, full, trained in segs:
    assert TOK.decode(trained) == want[TOK.decode(full)]
  for r in range(len(arrays["inputs"])):  # segment ids 1..k then padding 0
    seg = arrays["segment_ids"][r]
    k = seg.max()
    n_real = int((seg > 0).sum())
    assert np.array_equal(np.unique(seg[:n_real]), np.arange(1, k + 1)) and np.all(seg[n_real:] == 0)
    assert np.all(np.diff(seg[:n_real]) >= 0)
  assert stats["rows"] == len(arrays["inputs"]) and stats["truncated"] == stats["dropped"] == 0
  assert stats["loss_tokens"] == int(arrays["loss_mask"].sum())
  assert stats["tokens"] == sum(len(full) - 1 for _, _, full, _ in segs)


def test_pack_assignment_fits_and_keeps_every_item():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 65, size=500).tolist()
  rows = sft_data.pack_assignment(lengths, 64)
  assert sorted(i for row in rows for i in row) == list(range(500))
  assert all(sum(lengths[i] for i in row) <= 64 for row in rows)
  assert all(row == sorted(row) for row in rows)
  assert len(rows) <= 1.25 * np.ceil(sum(lengths) / 64)  # best fit wastes little


def test_mask_markers_mask_observations():
  ex = {"prompt": "Q? ", "completion": "think <obs>tool says 4</obs> so 4"}
  for tok in (TOK, ByteTokenizer()):  # markers as special tokens or as plain text
    ids, train = sft_data.tokenize(ex, tok, mask_markers=[("<obs>", "</obs>")])
    assert tok.decode(ids[train]) == "think  so 4<|eos|>"
  ids, train = sft_data.tokenize({"prompt": "Q", "completion": "a<obs>never closed"}, TOK,
                            mask_markers=[("<obs>", "</obs>")])
  assert TOK.decode(ids[train]) == "a"  # unclosed: masked to the end, and no EOS target after it
  rows = sft_data.build_padded([ex], TOK, 40, mask_markers=[("<obs>", "</obs>")])
  (_, _, _, trained), = example_rows(rows)
  assert TOK.decode(trained) == "think  so 4<|eos|>"


def test_truncation_policies_and_warning(caplog):
  long = {"prompt": "p" * 20, "completion": "c" * 10}
  recs = [long, RECORDS[1]]
  with caplog.at_level(logging.WARNING, logger="jaxlab"):
    right, st = sft_data.build_padded(recs, TOK, 16, truncation="right", return_stats=True)
  assert st["truncated"] == 1 and "1 of 2 examples" in caplog.text
  (_, _, full, trained), _ = example_rows(right)
  assert TOK.decode(full) == "<|bos|>" + "p" * 16  # completion and EOS cut off: nothing to learn
  assert len(trained) == 0
  left = sft_data.build_padded(recs, TOK, 16, truncation="left")
  (_, _, full, trained), _ = example_rows(left)
  assert TOK.decode(full) == "<|bos|>" + "p" * 5 + "c" * 10 + "<|eos|>"  # BOS kept, prompt start cut
  assert TOK.decode(trained) == "c" * 10 + "<|eos|>"
  dropped, st = sft_data.build_packed(recs, TOK, 16, truncation="drop", return_stats=True)
  assert st["dropped"] == 1 and len(example_rows(dropped)) == 1
  with pytest.raises(DataError, match="example 0 has 32 tokens"):
    sft_data.build_padded(recs, TOK, 16, truncation="error")
  with pytest.raises(DataError, match="truncation='middle' is unknown"):
    sft_data.build_padded(recs, TOK, 16, truncation="middle")


# --------------------------------------------------------------------------------------------- loss/eval

def numpy_ce(logits, targets, mask):
  logits = np.asarray(logits, np.float64)
  m = logits.max(-1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  ce = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  return (ce * mask).sum() / mask.sum()


def test_loss_matches_numpy_cross_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 7, 11)).astype(np.float32) * 3
  targets = rng.integers(0, 11, size=(3, 7)).astype(np.int32)
  mask = (rng.random((3, 7)) < 0.5).astype(np.float32)
  loss, m = sft.sft_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask))
  np.testing.assert_allclose(float(loss), numpy_ce(logits, targets, mask), rtol=1e-5)
  hits = (logits.argmax(-1) == targets)
  np.testing.assert_allclose(float(m["token_accuracy"]), (hits * mask).sum() / mask.sum(), rtol=1e-6)
  assert float(m["tokens"]) == mask.sum()
  loss16, _ = sft.sft_loss(jnp.asarray(logits, jnp.bfloat16), jnp.asarray(targets), jnp.asarray(mask))
  assert loss16.dtype == jnp.float32
  zero, _ = sft.sft_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.zeros((3, 7)))
  assert float(zero) == 0.0


def test_masked_positions_get_exactly_zero_gradient():
  arrays = sft_data.build_packed(tasks.addition_examples(12, seed=1) + RECORDS, TOK, 24)
  masked = arrays["loss_mask"] == 0
  scrambled = dict(arrays, inputs=np.where(masked, (arrays["inputs"] * 7 + 3) % 256, arrays["inputs"]))
  graphdef, params = nnx.split(PositionwiseLM(TOK.vocab_size, 16, 24, nnx.Rngs(0)))
  loss_fn = sft.make_loss_fn()

  @jax.jit
  def grads(params, batch, scrambled):
    logits = sft.default_apply(nnx.merge(graphdef, params), batch)
    # Extreme logits on masked-out positions must not leak into the gradient either.
    logits = jnp.where(batch["loss_mask"][..., None] == 0, logits * 1e4, logits)
    g_logits = jax.grad(lambda lg: sft.sft_loss(lg, batch["targets"], batch["loss_mask"])[0])(logits)
    of_params = jax.value_and_grad(lambda p, b: loss_fn(nnx.merge(graphdef, p), b, None)[0])
    return g_logits, of_params(params, batch), of_params(params, scrambled)

  g, (l1, g1), (l2, g2) = grads(params, arrays, scrambled)
  g = np.asarray(g)
  assert np.all(np.isfinite(g))
  assert np.all(g[masked] == 0.0)
  assert np.all(np.abs(g[~masked]).sum(-1) > 0)
  # Through the model: what sits at masked positions changes neither the loss nor the parameter gradient.
  assert float(l1) == float(l2)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), g1, g2)


def test_loss_fn_reports_its_token_weight():
  """make_loss_fn returns the reserved "weight" metric: the loss tokens its means are over (float32)."""
  arrays = sft_data.build_padded(tasks.addition_examples(6, seed=2), TOK, 16)
  model = PositionwiseLM(TOK.vocab_size, 16, 16, nnx.Rngs(0))
  loss, m = sft.make_loss_fn()(model, arrays, None)
  want, _ = sft.sft_loss(sft.default_apply(model, arrays), arrays["targets"], arrays["loss_mask"])
  assert float(loss) == float(want)
  assert m["weight"].dtype == jnp.float32 and m["weight"].shape == ()
  assert float(m["weight"]) == float(m["tokens"]) == float(arrays["loss_mask"].sum()) > 0


def test_eval_exact_match_on_a_toy_case():
  arrays = sft_data.build_padded(RECORDS + [{"prompt": "x", "completion": ""}], TOK, 24)
  batch = {k: jnp.asarray(v) for k, v in arrays.items()}
  wrong_row, wrong_col = 2, int(np.flatnonzero(arrays["loss_mask"][2])[1])

  def oracle(model, b):  # perfect predictions except one completion token of row 2
    t = b["targets"].at[wrong_row, wrong_col].set(7)
    return jax.nn.one_hot(t, TOK.vocab_size) * 10.0

  eval_fn = jax.jit(lambda b: sft.make_eval_fn(oracle)(None, b))
  out = eval_fn(batch)
  assert set(out) == {"loss", "token_accuracy", "exact_match"}
  np.testing.assert_array_equal(np.asarray(out["exact_match"]), [1, 1, 0, 1, 1])
  n2 = arrays["loss_mask"][2].sum()
  np.testing.assert_allclose(np.asarray(out["token_accuracy"]), [1, 1, (n2 - 1) / n2, 1, 1], rtol=1e-6)
  assert out["loss"].shape == (5,) and float(out["loss"][2]) > float(out["loss"][0])
  # A row with no completion tokens scores 0 everywhere.
  empty = dict(batch, loss_mask=batch["loss_mask"].at[0].set(0.0))
  out = eval_fn(empty)
  assert float(out["exact_match"][0]) == float(out["token_accuracy"][0]) == float(out["loss"][0]) == 0.0


def test_fit_on_packed_sft_data(tmp_path):
  """The pieces plug into the shared loop: ArraySource rows, loss_fn, eval_fn, 8-device data mesh."""
  train, test = tasks.addition_split(128, 16, max_digits=2, seed=0)
  train_src = ArraySource(sft_data.build_packed(train, TOK, 32))
  eval_src = ArraySource(sft_data.build_padded(test, TOK, 16))
  c = configs.base_config()
  c.train = configs.train_config(batch_size=8, num_steps=30, log_every=10, async_checkpoint=False,
                                 optimizer={"learning_rate": 1e-2})
  c.tensorboard = False
  res = fit(c, str(tmp_path), model_fn=lambda rngs: PositionwiseLM(TOK.vocab_size, 32, 32, rngs),
            loss_fn=sft.make_loss_fn(), train_source=train_src, eval_fn=sft.make_eval_fn(), eval_source=eval_src)
  s = res.summary
  assert {"train/loss", "train/token_accuracy", "train/tokens", "eval/loss", "eval/exact_match"} <= set(s)
  assert s["train/loss"] < 2.5 and s["train/tokens"] > 0  # from ~5.6 = log(vocab)


# ------------------------------------------------------------------------------------------------- tasks

def test_addition_generator_is_deterministic_and_correct(tmp_path):
  a = tasks.addition_examples(200, min_digits=2, max_digits=5, seed=7)
  assert a == tasks.addition_examples(200, min_digits=2, max_digits=5, seed=7)
  assert a != tasks.addition_examples(200, min_digits=2, max_digits=5, seed=8)
  for r in a:
    x, y = r["prompt"][:-1].split("+")
    assert r["prompt"].endswith("=") and int(r["completion"]) == int(x) + int(y)
    assert all(2 <= len(v) <= 5 and not v.startswith("0") for v in (x, y))
  digits = {len(r["prompt"].split("+")[0]) for r in a}
  assert digits == {2, 3, 4, 5}
  rev = tasks.addition_examples(5, seed=7, reverse_answer=True)
  assert [r["completion"][::-1] for r in rev] == [r["completion"] for r in tasks.addition_examples(5, seed=7)]
  tr, ev = tasks.addition_split(300, 50, max_digits=2, seed=1)
  assert len(tr) == 300 and len(ev) == 50
  assert not {r["prompt"] for r in tr} & {r["prompt"] for r in ev}
  assert len({r["prompt"] for r in tr}) == 300
  with pytest.raises(DataError, match="distinct addition problems"):
    tasks.addition_split(90, 20, max_digits=1)
  path = tmp_path / "sub" / "add.jsonl"
  sft_data.write_jsonl(str(path), a[:10])
  assert [(e.prompt, e.completion) for e in sft_data.read_jsonl(str(path))] == [
      (r["prompt"], r["completion"]) for r in a[:10]]
  assert np.array_equal(sft_data.load_sft_data(str(path), TOK, 16, packed=True)["inputs"],
                        sft_data.build_packed(a[:10], TOK, 16)["inputs"])
  assert sft_data.prompt_ids(a[0], TOK) == [TOK.bos_id] + TOK.encode(a[0]["prompt"])


# -------------------------------------------------------------------------------------------------- LoRA

def _lora_model(seed=0):
  model = PositionwiseLM(TOK.vocab_size, 16, 24, nnx.Rngs(seed))
  return lora.apply_lora(model, rank=4, alpha=8.0, targets=("q_proj", "head"), rngs=nnx.Rngs(1))


def test_lora_init_is_identity_and_merge_matches():
  base = PositionwiseLM(TOK.vocab_size, 16, 24, nnx.Rngs(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 10)), jnp.int32)
  y_base = base(tokens)
  model = _lora_model()
  assert lora.lora_targets(PositionwiseLM(TOK.vocab_size, 16, 24, nnx.Rngs(0)), ["q_proj", "head"]) == [
      "head", "q_proj"]
  np.testing.assert_array_equal(np.asarray(model(tokens)), np.asarray(y_base))  # B = 0: exactly the base
  assert model.q_proj.lora_a[...].shape == (16, 4) and model.head.lora_b[...].shape == (4, TOK.vocab_size)
  n_lora, n_all = lora.count_lora_params(model)
  assert n_lora == 16 * 4 + 4 * 16 + 16 * 4 + 4 * TOK.vocab_size
  for m in (model.q_proj, model.head):
    m.lora_b[...] = jax.random.normal(jax.random.key(2), m.lora_b[...].shape) * 0.1
  y_lora = model(tokens)
  assert float(jnp.abs(y_lora - y_base).max()) > 1e-2
  lora.merge_lora(model)
  assert type(model.q_proj) is nnx.Linear and not hasattr(model.q_proj, "lora_a")
  np.testing.assert_allclose(np.asarray(model(tokens)), np.asarray(y_lora), atol=1e-5)
  assert lora.count_lora_params(model) == (0, n_all - n_lora)
  with pytest.raises(ConfigError, match="match no linear layer"):
    lora.apply_lora(model, 2, 2.0, ["nothing_here"], rngs=nnx.Rngs(0))


def test_lora_trains_only_adapters():
  arrays = sft_data.build_packed(tasks.addition_examples(24, seed=1), TOK, 24)
  batch = {k: jnp.asarray(v[:8]) for k, v in arrays.items()}
  loss_fn = sft.make_loss_fn()
  model = _lora_model()
  for m in (model.q_proj, model.head):  # leave the B = 0 start so that A gets a gradient too
    m.lora_b[...] = jax.random.normal(jax.random.key(3), m.lora_b[...].shape) * 0.1
  # NNX: gradients w.r.t. the adapter filter only.
  grads = nnx.jit(nnx.grad(lambda m: loss_fn(m, batch, None)[0],
                           argnums=nnx.DiffState(0, lora.lora_param_filter)))(model)
  paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(grads)}
  assert paths == {"q_proj/lora_a", "q_proj/lora_b", "head/lora_a", "head/lora_b"}
  params = nnx.state(model, nnx.Param).to_pure_dict()
  assert lora.lora_mask(params)["q_proj"] == {"kernel": False, "bias": False, "lora_a": True, "lora_b": True}
  # The shared train step on the 8-device mesh (pure param dicts): base weights stay bit-identical, with
  # weight decay and clipping inside the optimizer.
  inner = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
  md = ModelDef(lambda rngs: _lora_model())
  mesh = mesh_lib.make_mesh((("data", -1), ("model", 1)))
  rules = mesh_lib.DEFAULT_RULES
  tx = lora.freeze_base(inner)
  state, shardings = create_train_state(md, tx, mesh, rules, 0)
  # The frozen base carries no optimizer moments: Adam's state is 2 x the adapter parameters (+ counters).
  n_lora, _ = lora.count_lora_params(state.params)
  assert sum(x.size for x in jax.tree.leaves(state.opt_state)) <= 2 * n_lora + 4
  step = step_lib.make_train_step(md, loss_fn, tx, lambda s: 1e-2, shardings,
                                  mesh_lib.batch_sharding(mesh, rules), donate=False)
  new, metrics = step(state, batch)
  new, metrics = step(new, batch)
  assert float(metrics["train/grad_norm"]) > 0

  def check(before, after):
    flat0 = dict(jax.tree_util.tree_leaves_with_path(before))
    for path, v in jax.tree_util.tree_leaves_with_path(after):
      assert bool(jnp.any(v != flat0[path])) == lora.is_lora_path(path), jax.tree_util.keystr(path)
  check(state.params, new.params)
  # compact=False: the same updates with full-shape (zero) moments for the frozen weights.
  g = jax.tree.map(jnp.ones_like, params)
  full = lora.freeze_base(inner, compact=False)
  opt = full.init(params)
  assert sum(x.size for x in jax.tree.leaves(opt)) > sum(x.size for x in jax.tree.leaves(tx.init(params)))
  updates, _ = jax.jit(full.update)(g, opt, params)
  compact_updates, _ = jax.jit(tx.update)(g, tx.init(params), params)
  check(params, optax.apply_updates(params, updates))
  for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(compact_updates)):
    np.testing.assert_array_equal(a, b)


def test_lora_on_the_transformer():
  from jaxlab.lm import Transformer, TransformerConfig
  from jaxlab.state import ModelDef
  cfg = TransformerConfig(vocab_size=64, hidden=16, n_layers=1, n_heads=2, mlp_hidden=32)

  def model_fn(rngs):
    return lora.apply_lora(Transformer(cfg, rngs=rngs), 2, 4.0, ("q", "v", "o", "down"), rngs=rngs)
  md = ModelDef(model_fn)  # shape-first, as in fit()
  base = ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))
  attn = md.abstract()[0]["layers"][0]["attn"]
  assert attn["o"]["lora_a"].shape == (2, 8, 2) and attn["o"]["lora_b"].shape == (2, 16)  # (heads, head_dim) in
  assert md.param_specs["layers"][0]["attn"]["q"]["lora_b"] == jax.sharding.PartitionSpec(None, "heads", None)
  tokens = jnp.arange(14, dtype=jnp.int32).reshape(2, 7)

  @jax.jit
  def outputs(key):
    (p, r), (bp, br) = md.init(key), base.init(key)
    return md.merge(p, r)(tokens), base.merge(bp, br)(tokens)
  y, y_base = outputs(jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y_base))
