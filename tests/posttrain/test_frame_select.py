"""Frame selection (`jaxlab.posttrain.frame_select`): closed-form anchors == brute force over every defect
position, the windowed visual-token bound under random tool use, SFT rows == rollout rows, the trace parser
and per-dimension rewards, the tokenizer's round trip, the digit pairs, the preference loader and FrameTask
validation."""

import itertools
import json
import os

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from jaxlab.errors import ConfigError, DataError
from jaxlab.posttrain import frame_select as fs
from jaxlab.posttrain import rewards
from jaxlab.posttrain.rollout import multi_turn

BASE, V = 1000, 4          # the fake VLM's image_token_base and visual tokens per frame


def _image_tokens(k):
  return [BASE + V * k + j for j in range(V)]


def _vocab(task):
  tok = fs.tokenizer(task)
  return fs.Vocab(task, tok, _image_tokens), tok


def _ref(task, defect):
  y = "2" if defect < task.frames else "1"
  return {"labels": {d: y for d in task.dimensions}, "defect": defect}


def _text(trace):
  return "".join(t for t, _ in trace)


class _Fixed:
  """A stand-in Generator whose `integers` always returns y (enumerates the noisy / no-tool guess)."""

  def __init__(self, y):
    self.y = y

  def integers(self, lo, hi):
    assert lo <= self.y < hi
    return self.y


def _grid():
  for t, n, k, m in itertools.product(range(6, 13), range(1, 4), range(1, 6), range(1, 5)):
    yield fs.FrameTask(frames=t, initial=n, per_call=k, max_turns=m)


# ------------------------------------------------------------------------------------------- anchors


def test_anchors_equal_brute_force_over_defect_positions():
  """Oracle / no-tool accuracy averaged over all 2T defect positions (and both guesses) == the closed form."""
  rng = np.random.default_rng(0)
  for task in _grid():
    a = fs.anchors(task)
    defects = range(task.num_images)
    refs = [_ref(task, d) for d in defects]
    oracle = [fs.scripted_trace(task, d, rng, "oracle") for d in defects]
    acc = fs.judgement_correct(task, [_text(tr) for tr in oracle], refs).astype(np.float64).mean()
    assert abs(acc - a["oracle"]) < 1e-12, (task, acc, a)
    for tr in oracle:                          # calls: at most max_turns - 1, K distinct unseen frames each
      calls = [f for _, f in tr[:-1]]
      assert len(calls) <= task.max_turns - 1 and tr[-1][1] == []
      flat = [f for c in calls for f in c]
      assert all(1 <= len(c) <= task.per_call for c in calls) and len(set(flat)) == len(flat)
      assert not set(flat) & set(task.initial_frames())
    for kind in ("no_tool", "noisy"):
      texts = [_text(fs.scripted_trace(task, d, _Fixed(y), kind)) for y in (1, 2) for d in defects]
      acc = fs.judgement_correct(task, texts, refs * 2).astype(np.float64).mean()
      assert abs(acc - a["bayes_no_tool"]) < 1e-12, (task, kind, acc, a)
    u = task.frames - task.initial
    assert a["unseen"] == u and a["examined"] == min(u, (task.max_turns - 1) * task.per_call)
    assert (abs(a["oracle"] - 1) < 1e-12) == ((task.max_turns - 1) * task.per_call >= u)
    assert a["q"] == task.initial / task.frames


def test_anchors_multi_dimension_and_default_gap():
  """Several dimensions score the same pair accuracy; the default task's tool gain A* - c exceeds 0.3."""
  rng = np.random.default_rng(1)
  task = fs.FrameTask(frames=9, initial=2, per_call=2, max_turns=3, dimensions=("TA", "VQ"))
  refs = [_ref(task, d) for d in range(task.num_images)]
  texts = [_text(fs.scripted_trace(task, d, rng, "oracle")) for d in range(task.num_images)]
  assert abs(fs.judgement_correct(task, texts, refs).mean() - fs.anchors(task)["oracle"]) < 1e-6
  a = fs.anchors(fs.FrameTask())
  assert a["oracle"] - a["bayes_no_tool"] > 0.3
  for kind in ("noisy", "no_tool"):          # an unseen defect: a uniform guess, drawn from the rng
    assert _text(fs.scripted_trace(task, 1, _Fixed(1), kind)) == " ok<answer> TA: 1 VQ: 1</answer>"
    guesses = [_text(fs.scripted_trace(task, 1, rng, kind))[-10] for _ in range(200)]
    assert set(guesses) == {"1", "2"} and abs(guesses.count("1") - 100) < 5 * np.sqrt(50)
    assert _text(fs.scripted_trace(task, 9, rng, kind)) == " bad f9<answer> TA: 1 VQ: 1</answer>"   # in view
  with pytest.raises(ValueError, match="kind"):
    fs.scripted_trace(task, 0, rng, "greedy")


# --------------------------------------------------------------------------------------- environment


def test_select_frames_env_parses_calls():
  """Valid calls observe their frames; no frame, more than K, repeats, out-of-vocabulary tokens, an unclosed
  call or no call observe nothing."""
  task = fs.FrameTask(frames=8, per_call=3)
  vocab, tok = _vocab(task)
  env = fs.SelectFramesEnv(vocab)
  ok = tok.encode(" bad f2<tool> f1 f10 f3</tool>")
  assert env.parse_call(ok) == [1, 10, 3]
  assert env.observe(0, ok) == [vocab.obs] + vocab.frame(1) + vocab.frame(10) + vocab.frame(3) + [vocab.obs_end]
  assert env.parse_call(tok.encode(" ok<tool> f15</tool>")) == [15]
  assert env.parse_call(tok.encode("<tool> f4</tool><tool> f5 f6</tool>")) == [5, 6]     # the last call
  for bad in ("<tool></tool>", "<tool> f1 f2 f3 f4</tool>", "<tool> f1 f1</tool>", "<tool> f1 x</tool>",
              "<tool> f1 ok</tool>", "<tool> f1", " f1</tool>", " ok<answer> VQ: 1</answer>", ""):
    ids = tok.encode(bad)
    assert env.parse_call(ids) is None, bad
    assert env.observe(3, ids) == [vocab.obs, vocab.obs_end], bad


def _random_policy(task, vocab, tok, rng):
  """Per context: a valid call of 1..K frames, an invalid call (K + 1 frames, a repeat, junk bytes, no frame),
  an answer + eos, or a truncated turn."""
  k, n = task.per_call, task.num_images
  head = tok.encode(" ok<tool>")

  def policy(contexts, key):
    del key
    gens = []
    for _ in contexts:
      r = rng.integers(0, 7)
      if r <= 2:
        frames = rng.choice(n, size=int(rng.integers(1, k + 1)), replace=False)
        g = head + [vocab.frame_ids[f] for f in frames] + [vocab.tool_end]
      elif r == 3:
        g = head + [vocab.frame_ids[f] for f in rng.choice(n, size=k + 1, replace=False)] + [vocab.tool_end]
      elif r == 4:
        f = int(rng.integers(0, n))
        body = [[vocab.frame_ids[f]] * 2, tok.encode(" f1 zz"), []][int(rng.integers(0, 3))]
        g = head + body + [vocab.tool_end]
      elif r == 5:
        g = tok.encode(f" ok<answer> VQ: {int(rng.integers(0, 3))}</answer>") + [tok.eos_id]
      else:
        g = tok.encode(" bad f1 hmm")
      gens.append(g)
    return gens, [np.zeros(len(g), np.float32) for g in gens]

  return policy


def _expected_obs(task, vocab, gen):
  """The observation the env owes a generated call (independent of `parse_call`)."""
  body = gen[gen.index(vocab.tool) + 1:-1]
  ok = (body and all(t in vocab.frame_of for t in body) and len(body) <= task.per_call
        and len(set(body)) == len(body))
  return vocab.observation([vocab.frame_of[t] for t in body] if ok else [])


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(window=st.sampled_from([0, 1, 2]), per_call=st.integers(1, 4), initial=st.integers(1, 3),
                  frames=st.integers(6, 10), max_turns=st.integers(2, 5), seed=st.integers(0, 2**31 - 1))
def test_visual_tokens_of_every_row_within_window_bound(window, per_call, initial, frames, max_turns, seed):
  """Every training row holds at most (2 N_in + p K) V visual ids, all with loss_mask 0; observations are the
  called frames (nothing for a malformed call) and never trained on."""
  task = fs.FrameTask(frames=frames, initial=initial, per_call=per_call, max_turns=max_turns, window=window)
  vocab, tok = _vocab(task)
  env = fs.SelectFramesEnv(vocab)
  prompt = vocab.prompt()
  rb = multi_turn(_random_policy(task, vocab, tok, np.random.default_rng(seed)), [prompt, prompt], 3,
                  key=jax.random.key(seed % 1000), env=env, max_turns=task.max_turns, tool_end_id=vocab.tool_end,
                  memory_window=task.window, memory_placeholder=(vocab.forgotten,), pad_id=tok.pad_id,
                  stop_tokens=(tok.eos_id,))
  bound = (2 * task.initial + task.window * task.per_call) * V
  context_only = {vocab.obs, vocab.obs_end, vocab.forgotten}
  for r in range(rb.tokens.shape[0]):
    n = int(rb.segment_ids[r].sum())
    row, mask = rb.tokens[r, :n], rb.loss_mask[r, :n]
    assert vocab.visual_count(row, BASE) <= bound
    assert np.all(mask[row >= BASE] == 0) and all(mask[j] == 0 for j in range(n) if row[j] in context_only)
    assert list(row[:len(prompt)]) == prompt and np.all(mask[:len(prompt)] == 0)
    assert np.all(mask[len(prompt):] <= 1) and mask[n - 1] == 1        # each row ends with its turn's tokens
  for resp in rb.responses:                  # turns and observations alternate; each observation is owed
    j = 0
    while vocab.obs in resp[j:]:
      o = resp.index(vocab.obs, j)
      e = resp.index(vocab.obs_end, o)
      gen = resp[j:o]
      assert gen[-1] == vocab.tool_end and resp[o:e + 1] == _expected_obs(task, vocab, gen)
      j = e + 1


# ------------------------------------------------------------------------------------ SFT == rollout


def _replay(trace, tok, vocab):
  """A policy replaying a scripted trace: turn j = number of </tool> in the context; the last turn + eos."""
  turns = [tok.encode(text) + ([vocab.eos] if j == len(trace) - 1 else []) for j, (text, _) in enumerate(trace)]

  def policy(contexts, key):
    del key
    gens = [turns[sum(t == vocab.tool_end for t in c)] for c in contexts]
    return gens, [np.zeros(len(g), np.float32) for g in gens]

  return policy


@pytest.mark.parametrize("task", [fs.FrameTask(), fs.FrameTask(window=0), fs.FrameTask(window=None),
                                  fs.FrameTask(frames=10, initial=2, per_call=2, max_turns=4, window=1),
                                  fs.FrameTask(frames=10, initial=3, per_call=1, max_turns=4, window=2,
                                               dimensions=("TA", "VQ"))],
                         ids=["default", "window0", "no_window", "four_turns", "window2"])
@pytest.mark.parametrize("placeholder", [True, False])
def test_trace_rows_equal_rollout_rows(task, placeholder):
  """`trace_rows` of oracle / noisy / no-tool traces == the rows `multi_turn` builds replaying them (tokens and
  train == loss_mask > 0), per turn with a window and one row per trajectory without."""
  if task.window is None and not placeholder:
    pytest.skip("no placeholder without a window")
  vocab, tok = _vocab(task)
  rng = np.random.default_rng(0)
  t = task.frames
  seen = task.initial_frames()
  defects = sorted({seen[0], 1 if 1 not in seen else 3, t - 1, t + 1, 2 * t - 1, t // 2 + 1})
  n_calls = set()
  for defect, kind in itertools.product(defects, ("oracle", "noisy", "no_tool")):
    trace = fs.scripted_trace(task, defect, rng, kind)
    n_calls.add(len(trace) - 1)
    want = fs.trace_rows(task, vocab, trace, window=task.window, placeholder=placeholder)
    rb = multi_turn(_replay(trace, tok, vocab), [vocab.prompt()], 1, key=jax.random.key(0),
                    env=fs.SelectFramesEnv(vocab), max_turns=task.max_turns, tool_end_id=vocab.tool_end,
                    memory_window=task.window,
                    memory_placeholder=(vocab.forgotten,) if placeholder and task.window is not None else None,
                    pad_id=tok.pad_id, stop_tokens=(tok.eos_id,))
    got = rb.sequences()
    assert len(got) == len(want) == (1 if task.window is None else len(trace)), (defect, kind)
    for (gi, gt), (wi, wt) in zip(got, want):
      assert gi.tolist() == wi.tolist(), (defect, kind)
      assert gt.tolist() == wt.tolist(), (defect, kind)
    assert bool(rb.stopped[0]) and int(rb.num_turns[0]) == len(trace)
    assert tok.decode(rb.generated[0][:-1]) == _text(trace)
  assert max(n_calls) >= 1


# -------------------------------------------------------------------------------------------- parser


def test_parse_trace_accepts_every_scripted_trace():
  """Every oracle / noisy / no-tool trace parses; its answer is "VQ: y" with the trace's label."""
  for task in [fs.FrameTask(), fs.FrameTask(frames=12, initial=1, per_call=5, max_turns=4),
               fs.FrameTask(frames=6, initial=3, per_call=1, max_turns=2, dimensions=("TA", "VQ", "MQ"))]:
    parse = fs.parse_trace(task)
    rng = np.random.default_rng(2)
    for defect, kind in itertools.product(range(task.num_images), ("oracle", "noisy", "no_tool")):
      trace = fs.scripted_trace(task, defect, rng, kind)
      p = parse(_text(trace))
      assert p.valid, (task, _text(trace))
      y = trace[-1][0].split("</answer>")[0][-1]
      assert p.answer == ", ".join(f"{d}: {y}" for d in task.dimensions)
      assert p.think is not None and _text(trace).startswith(p.think)


@pytest.mark.parametrize("text", [
    " ok<tool> f1 f2 f3 f5 f6</tool> ok<answer> VQ: 1</answer>",            # more than K = 4 frames
    " ok<tool> f1 f1</tool> ok<answer> VQ: 1</answer>",                     # a repeated frame
    " ok<tool> f16</tool> ok<answer> VQ: 1</answer>",                       # frame index >= 2T
    " ok<tool></tool> ok<answer> VQ: 1</answer>",                           # an empty call
    " ok<tool> f1</tool> ok<tool> f2</tool> ok<tool> f3</tool> ok<answer> VQ: 1</answer>",   # 3 > max_turns - 1
    " ok<answer></answer>",                                                 # no label
    " ok<answer> TA: 1</answer>",                                           # the wrong dimension
    " ok<answer> VQ: 1 TA: 1</answer>",                                     # an extra dimension
    " ok<answer> VQ: 1 VQ: 2</answer>",                                     # a repeated dimension
    " ok<answer> VQ: 3</answer>",                                           # label not in 0/1/2
    " ok<answer> VQ: 12</answer>",
    " ok<answer> VQ: 1</answer> ok",                                        # text after </answer>
    " ok<answer> VQ: 1</answer><tool> f1</tool>",
    "<answer> VQ: 1</answer>",                                              # no verdict
    " ok<tool> f1</tool><answer> VQ: 1</answer>",                           # no verdict before the answer
    " ok<tool> f1</tool> ok",                                               # no final answer
    " ok<tool> f1</tool>",
    " maybe<answer> VQ: 1</answer>",
    " ok<answer> VQ:1</answer>",
    "",
])
def test_parse_trace_rejects_malformed(text):
  """Malformed traces are invalid (Parsed(None, None)) for the default task (T=8, K=4, 3 turns, VQ)."""
  p = fs.parse_trace(fs.FrameTask())(text)
  assert not p.valid and p.think is None and p.answer is None


def test_parse_trace_rejects_trailing_newline():
  """A newline after </answer> is text after the answer too."""
  assert not fs.parse_trace(fs.FrameTask())(" ok<answer> VQ: 1</answer>\n").valid


def test_parse_trace_multi_dimension_rewards():
  """dims (TA, VQ) parse into "TA: x, VQ: y" (any order) and `dimension_rewards` scores each dimension."""
  task = fs.FrameTask(dimensions=("TA", "VQ"))
  parse = fs.parse_trace(task)
  texts = [" ok<tool> f1 f2</tool> bad f2<answer> TA: 2 VQ: 1</answer>", " ok<answer> VQ: 2 TA: 2</answer>",
           " ok<answer> TA: 0 VQ: 1</answer>", " ok<answer> TA: 2</answer>", " ok<answer> TA: 2 VQ: 2</answer>x"]
  assert parse(texts[0]).answer == "TA: 2, VQ: 1" and parse(texts[1]).answer == "VQ: 2, TA: 2"
  assert [parse(t).valid for t in texts] == [True, True, True, False, False]
  refs = [{"labels": {"TA": "2", "VQ": "2"}}] * len(texts)
  fns = dict(rewards.dimension_rewards(task.dimensions, parse=parse))
  assert sorted(fns) == ["acc_TA", "acc_VQ"]
  assert fns["acc_TA"](texts, refs).tolist() == [1, 1, 0, 0, 0]
  assert fns["acc_VQ"](texts, refs).tolist() == [0, 1, 0, 0, 0]
  assert fs.judgement_correct(task, texts, refs).tolist() == [0, 1, 0, 0, 0]
  assert rewards.format_reward(texts, parse=parse).tolist() == [1, 1, 1, 0, 0]


# ----------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_and_single_token_words():
  """Trace texts and observation words round-trip exactly; every word of the format is one id (" f1" and
  " f10".." f15" distinct), so a scripted trace encodes to special ids only."""
  task = fs.FrameTask(dimensions=("TA", "VQ"))
  tok = fs.tokenizer(task)
  words = fs.vocabulary(task)
  ids = [tok.encode(w) for w in words]
  assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(words)
  f1, f10 = tok.encode(" f1"), tok.encode(" f10")
  assert len(f1) == len(f10) == 1 and f1 != f10
  assert tok.encode(" f1 f10 f15 f1") == [tok.special_ids[w] for w in (" f1", " f10", " f15", " f1")]
  assert len({tok.encode(f" f{k}")[0] for k in [1] + list(range(10, 16))}) == 7
  rng = np.random.default_rng(3)
  for defect, kind in itertools.product(range(task.num_images), ("oracle", "noisy", "no_tool")):
    for text, _ in fs.scripted_trace(task, defect, rng, kind):
      enc = tok.encode(text)
      assert tok.decode(enc) == text and all(i >= 256 for i in enc), text
  for frames in ([0], [1, 10, 15], list(range(16))):
    text = "<obs>" + "".join(f" f{k}" for k in frames) + "</obs><forgotten>Q ?"
    assert tok.decode(tok.encode(text)) == text
  for text in (" VQ: 1, TA: 2", " ok  f1x f100 ?", "Q f1 f11 f111"):
    assert tok.decode(tok.encode(text)) == text


# ---------------------------------------------------------------------------------------------- data


def test_make_pairs():
  """Shapes, dtypes, labels = 2 - defect video, balance, the inverted defect frame, determinism."""
  task = fs.FrameTask()
  n, t = 400, task.frames
  d = fs.make_pairs(task, n, seed=0)
  assert d["images"].shape == (n, 2 * t, 8, 8, 1) and d["images"].dtype == np.float32
  for k in ("defect_video", "defect_frame", "label"):
    assert d[k].shape == (n,) and d[k].dtype == np.int32
  assert d["images"].min() >= -1 and d["images"].max() <= 1
  assert set(d["label"].tolist()) == {1, 2} and np.all(d["label"] == 2 - d["defect_video"])
  assert set(d["defect_video"].tolist()) == {0, 1} and d["defect_frame"].min() >= 0 and d["defect_frame"].max() < t
  assert abs(d["defect_video"].sum() - n / 2) < 5 * np.sqrt(n) / 2
  assert abs(d["defect_frame"].mean() - (t - 1) / 2) < 5 * np.sqrt((t * t - 1) / 12 / n)
  rows = np.arange(n)
  pos = d["defect_video"] * t + d["defect_frame"]
  means = d["images"].reshape(n, 2 * t, -1).mean(-1)
  assert np.all(means.argmax(1) == pos)                             # digits are mostly dark: inverted is bright
  others = np.where(np.arange(2 * t)[None] == pos[:, None], np.nan, means)
  assert np.mean(means[rows, pos] - np.nanmean(others, 1)) > 0.5
  # The defect negates the video's rendering (in [-1, 1], up to noise): against another frame of the same video
  # re-aligned (frames are circular shifts of one digit by <= 1 px per axis, so some relative roll matches).
  x = d["images"][rows, pos, ..., 0]
  other = d["images"][rows, d["defect_video"] * t + (d["defect_frame"] + 1) % t, ..., 0]
  rolls = list(itertools.product(range(-2, 3), repeat=2))
  err = np.asarray([min(np.abs(-x[i] - np.roll(other[i], r, axis=(0, 1))).mean() for r in rolls) for i in range(n)])
  plain = np.asarray([min(np.abs(x[i] - np.roll(other[i], r, axis=(0, 1))).mean() for r in rolls) for i in range(n)])
  assert err.max() < 0.3 and np.median(err) < 0.2 and np.all(err < plain) and np.median(plain) > 0.6
  refs = fs.problems(task, d)
  assert [r["defect"] for r in refs] == pos.tolist()
  assert all(r["labels"] == {"VQ": str(y)} and (y == 2) == (r["defect"] < t) for r, y in zip(refs, d["label"]))
  e, e2 = fs.make_pairs(task, 5, seed=7), fs.make_pairs(task, 5, seed=7)
  assert all(np.array_equal(e[k], e2[k]) for k in e)
  assert not np.array_equal(e["images"], fs.make_pairs(task, 5, seed=8)["images"])
  with pytest.raises(ConfigError, match="8 x 8"):
    fs.make_pairs(fs.FrameTask(image_size=16), 2, seed=0)


# ---------------------------------------------------------------------------------------- loader


def _png_folder(path, frames):
  from PIL import Image
  os.makedirs(path)
  for i, f in enumerate(frames):
    Image.fromarray(f).save(os.path.join(path, f"frame_{i:03d}.png"))
  with open(os.path.join(path, "notes.txt"), "w") as fh:       # non-image files are ignored
    fh.write("x")


def _dataset(tmp_path):
  """Two records: (a) .npy (T, H, W) videos with letter labels and "Overall"; (b) a (T, H, W, 3) .npy and a PNG
  folder with numeric labels."""
  h, w = 5, 6
  ramp = np.repeat(np.arange(10, dtype=np.uint8)[:, None, None] * 25, h * w).reshape(10, h, w)     # frame t = 25 t
  np.save(tmp_path / "a.npy", ramp)
  rnd = np.random.default_rng(0).integers(0, 256, size=(9, h, w), dtype=np.uint8)
  rnd[0, 0, 0] = 255
  np.save(tmp_path / "b.npy", rnd)
  rgb = np.random.default_rng(1).integers(0, 256, size=(7, h, w, 3), dtype=np.uint8)
  np.save(tmp_path / "c.npy", rgb)
  png = np.stack([np.full((h, w, 3), 30 * i, np.uint8) for i in range(7)])                          # frame t = 30 t
  _png_folder(str(tmp_path / "frames_d"), png)
  recs = [{"prompt": "a cat", "path_A": "a.npy", "path_B": "b.npy", "TA": "A", "VQ": "B", "MQ": "same",
           "Overall": "A"},
          {"prompt": "a dog", "path_A": "c.npy", "path_B": "frames_d", "TA": 1, "VQ": " b ", "MQ": 0, "OA": "2",
           "Overall": "A"}]
  return recs, ramp, rnd, rgb, png


def test_load_preference_json(tmp_path):
  """.jsonl and .json give the same records: labels mapped to "1"/"2"/"0", frames evenly down-sampled to
  (2, F, H, W, C) in [0, 1] from .npy arrays and PNG folders."""
  recs, ramp, rnd, rgb, png = _dataset(tmp_path)
  (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
  (tmp_path / "d.json").write_text(json.dumps(recs))
  out = fs.load_preference_json(str(tmp_path / "d.jsonl"), frames_per_video=4)
  out2 = fs.load_preference_json(str(tmp_path / "d.json"), frames_per_video=4)
  assert [r["prompt"] for r in out] == ["a cat", "a dog"]
  assert out[0]["labels"] == {"TA": "1", "VQ": "2", "MQ": "0", "OA": "1"}
  assert out[1]["labels"] == {"TA": "1", "VQ": "2", "MQ": "0", "OA": "2"}           # OA wins over Overall
  for r, r2 in zip(out, out2):
    assert r["labels"] == r2["labels"] and np.array_equal(r["frames"], r2["frames"])
  f0, f1 = out[0]["frames"], out[1]["frames"]
  assert f0.shape == (2, 4, 5, 6, 1) and f1.shape == (2, 4, 5, 6, 3) and f0.dtype == f1.dtype == np.float32
  assert all(f.min() >= 0 and f.max() <= 1 for f in (f0, f1))
  np.testing.assert_allclose(f0[0, :, 0, 0, 0], np.array([0, 3, 6, 9]) * 25 / 255, atol=1e-6)   # linspace(0, 9, 4)
  np.testing.assert_allclose(f0[1, ..., 0], rnd[[0, 3, 5, 8]] / 255, atol=1e-6)                   # linspace(0, 8, 4)
  np.testing.assert_allclose(f1[0], rgb[[0, 2, 4, 6]] / 255, atol=1e-6)
  np.testing.assert_allclose(f1[1], png[[0, 2, 4, 6]] / 255, atol=1e-6)
  sub = tmp_path / "meta"
  sub.mkdir()
  (sub / "d.jsonl").write_text(json.dumps(recs[0]))
  r = fs.load_preference_json(str(sub / "d.jsonl"), frames_per_video=2, dimensions=("VQ",), root=str(tmp_path))
  assert r[0]["labels"] == {"VQ": "2"} and r[0]["frames"].shape == (2, 2, 5, 6, 1)
  r = fs.load_preference_json(str(sub / "d.jsonl"), frames_per_video=2, load_frames=False)
  assert "frames" not in r[0] and r[0]["labels"]["OA"] == "1"


@pytest.mark.parametrize("case, match", [
    ("missing_key", "lacks"), ("missing_dim", "lacks"), ("bad_label", "use A / B / same"),
    ("bad_json", "not valid JSON"), ("bad_jsonl", "not valid JSON"), ("video_file", "must be a .npy array"),
    ("no_path", "must be a .npy array"), ("empty_folder", "no .png"), ("bad_shape", "frames must be"),
])
def test_load_preference_json_bad_inputs(tmp_path, case, match):
  """Each bad input raises DataError with a message saying what is wrong."""
  recs, *_ = _dataset(tmp_path)
  rec = dict(recs[0])
  name, text = "d.jsonl", None
  if case == "missing_key":
    del rec["path_B"]
  elif case == "missing_dim":
    del rec["Overall"]
  elif case == "bad_label":
    rec["VQ"] = "C"
  elif case == "bad_json":
    name, text = "d.json", '[{"prompt": "x",'
  elif case == "bad_jsonl":
    text = json.dumps(rec) + "\n{oops\n"
  elif case == "video_file":
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 16)
    rec["path_B"] = "clip.mp4"
  elif case == "no_path":
    rec["path_A"] = "nowhere"
  elif case == "empty_folder":
    (tmp_path / "empty").mkdir()
    rec["path_A"] = "empty"
  elif case == "bad_shape":
    np.save(tmp_path / "flat.npy", np.zeros(7, np.uint8))
    rec["path_A"] = "flat.npy"
  (tmp_path / name).write_text(json.dumps(rec) if text is None else text)
  with pytest.raises(DataError, match=match) as e:
    fs.load_preference_json(str(tmp_path / name), frames_per_video=2)
  assert "\n" not in str(e.value)


def test_load_preference_json_dark_uint8_video(tmp_path):
  """A uint8 video is scaled by 1/255 whatever its values (a near-black clip stays near black)."""
  np.save(tmp_path / "dark.npy", np.ones((4, 5, 6), np.uint8))
  np.save(tmp_path / "b.npy", np.full((4, 5, 6), 200, np.uint8))
  rec = {"prompt": "p", "path_A": "dark.npy", "path_B": "b.npy", "VQ": "B"}
  (tmp_path / "d.jsonl").write_text(json.dumps(rec))
  f = fs.load_preference_json(str(tmp_path / "d.jsonl"), frames_per_video=2, dimensions=("VQ",))[0]["frames"]
  np.testing.assert_allclose(f[0], 1 / 255, atol=1e-6)


@pytest.mark.parametrize("path_b", ["missing.npy", "rgb.npy"])
def test_load_preference_json_bad_video_pair(tmp_path, path_b):
  """A missing .npy or videos A / B of different frame shapes raise DataError."""
  np.save(tmp_path / "gray.npy", np.zeros((4, 5, 6), np.uint8))
  np.save(tmp_path / "rgb.npy", np.zeros((4, 5, 6, 3), np.uint8))
  rec = {"prompt": "p", "path_A": "gray.npy", "path_B": path_b, "VQ": "B"}
  (tmp_path / "d.jsonl").write_text(json.dumps(rec))
  with pytest.raises(DataError):
    fs.load_preference_json(str(tmp_path / "d.jsonl"), frames_per_video=2, dimensions=("VQ",))


# ----------------------------------------------------------------------------------------- FrameTask


@pytest.mark.parametrize("kwargs", [dict(initial=0), dict(initial=8), dict(initial=9), dict(frames=1, initial=1),
                                    dict(per_call=0), dict(max_turns=0), dict(window=-1), dict(dimensions=()),
                                    dict(dimensions=("1A",)), dict(dimensions=("V Q",)), dict(dimensions=("VQ:",)),
                                    dict(dimensions=("VQ", ""))])
def test_frame_task_validation(kwargs):
  """Bad sizes and dimension names raise ConfigError."""
  with pytest.raises(ConfigError, match="FrameTask"):
    fs.FrameTask(**kwargs)


def test_frame_task_valid_settings():
  """Valid settings construct; the prompt's frames are evenly spaced, the same in both videos."""
  assert fs.FrameTask(window=None, dimensions=("TA", "VQ", "MQ", "OA")).num_images == 16
  assert fs.FrameTask().initial_frames() == [0, 4, 8, 12]
  assert fs.FrameTask(frames=10, initial=3).initial_frames() == [0, 3, 6, 10, 13, 16]
  assert fs.FrameTask(frames=6, initial=5).initial_frames() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
  task = fs.FrameTask(frames=6, initial=2)
  vocab, tok = _vocab(task)
  assert vocab.prompt() == ([tok.special_ids["<pair>"]] + vocab.frame(0) + vocab.frame(3) + vocab.frame(6)
                            + vocab.frame(9) + [tok.special_ids["<judge>"]])
  assert vocab.visual_count(vocab.prompt(), BASE) == 4 * V


def test_prompt_with_text():
  """A real record's text prompt sits between <pair> and the initial frames (stripped, one leading space)."""
  task = fs.FrameTask(frames=6, initial=2)
  vocab, tok = _vocab(task)
  frames = vocab.frame(0) + vocab.frame(3) + vocab.frame(6) + vocab.frame(9)
  q, end = tok.special_ids["<pair>"], tok.special_ids["<judge>"]
  assert vocab.prompt("  a cat runs ") == [q] + list(b" a cat runs") + frames + [end]
  assert vocab.prompt("") == vocab.prompt(None) == vocab.prompt()


def test_prompt_text_never_becomes_format_tokens():
  """The user's text is plain text: its ids are its bytes, never the format's special tokens."""
  vocab, _ = _vocab(fs.FrameTask())
  text = " Quiet road, car 1 turns ok near f3"
  assert vocab.prompt(text.strip())[1:1 + len(text.encode())] == list(text.encode())
