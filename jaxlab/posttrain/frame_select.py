"""Frame selection for video reward models (VR-Thinker, Wang et al. 2025, arXiv 2510.10518): a paired-video
preference task whose frames are images, the `select_frames` tool environment, scripted visual chain-of-thought
traces, the trace format's parser and rewards, and the closed-form accuracy anchors.

The task (FrameSelect-Pair with image frames). A pair of videos of T frames each (8 x 8 grayscale frames: an
sklearn digit per video, each frame shifted by up to one pixel and noised; Pedregosa et al. 2011). Exactly one
video has one defect frame (the frame inverted), uniformly placed; it is the worse video on the visual-quality
dimension, so the label names the other one (1 or 2). The prompt shows N_in evenly spaced frames per video (as
VR-Thinker's initial view, 4 of 96-128 per video); frame k of the pair's 2T frames (video 1: 0..T-1, video 2:
T..2T-1) is the text token " f<k>" followed by its visual tokens (`jaxlab.lm.vlm`: the ids of image k of the
row, whose pixels travel as the row's `images`).

The trace format (word tokens; the model's turns, observations in between):

    turn   := verdict "<tool>" (" f<k>"){1..K} "</tool>"          a select_frames call (K frames at most)
    final  := verdict "<answer>" (" <DIM>:" " <label>")+ "</answer>" EOS
    verdict:= " ok" | " bad f<k>"                                  the round's inclination (VR-Thinker's
                                                                    recommend answer), on the latest frames

and the environment answers a call with "<obs>" (" f<k>" + visual tokens of frame k)* "</obs>". With a memory
window p only the p most recent observations stay in later contexts, older ones become one "<forgotten>"
token (VR-Thinker's windowed visual memory), so the visual tokens of any context are at most
(2 N_in + p K) V, V visual tokens per frame; the verdicts, being the model's own text, stay.

Anchors (closed form, `anchors`): with q = N_in / T, a model without tools sees the defect with probability q
and otherwise can only guess, so its Bayes ceiling is c = q + (1 - q) / 2. A tool policy examining e of the
U = T - N_in unseen frames of ONE video per pair finds the defect with probability (1 - q) e / (2U) beyond the
initial view, and otherwise answers for the video with the more unexamined frames; examining all U of them
decides every pair (no defect there means it is in the other video). So with e = min(U, (turns - 1) K):
A* = c + (1 - q) e / (2U), = 1 when (turns - 1) K >= U. Spreading e over both videos does no better.

Scripted traces (`scripted_trace`): the oracle scans video 1's unseen frames K at a time (topping a call up
with video 2's), stops at the defect; a `noisy` trace answers at once with a guess (a teacher that answers
without looking, the noise of distilled chain-of-thought); a `no_tool` trace answers from the initial view.

The VideoGen-Reward-style loader (`load_preference_json`) reads the full-scale data: records with a prompt,
two videos (frame folders or .npy arrays) and per-dimension preferences (A / B / same, or 1 / 2 / 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Sequence

import numpy as np

from jaxlab.errors import ConfigError, DataError
from jaxlab.lm.tokenizer import ByteTokenizer
from jaxlab.posttrain.rewards import Parsed

TAGS = ("<tool>", "</tool>", "<obs>", "</obs>", "<answer>", "</answer>", "<forgotten>", "<pair>", "<judge>")
VERDICTS = (" ok", " bad")
LABELS = (" 0", " 1", " 2")
PAPER_DIMENSIONS = ("TA", "VQ", "MQ", "OA")     # VR-Thinker's released prompts (text, visual, motion, overall)


@dataclasses.dataclass(frozen=True)
class FrameTask:
  """The task's sizes.

  Attributes:
    frames: T, frames per video.
    initial: N_in, evenly spaced frames per video in the prompt.
    per_call: K, most frames per select_frames call (VR-Thinker's limit: 8).
    max_turns: generated turns (tool calls + the final answer).
    window: p, observations kept in later contexts (None: all).
    image_size: frame side in pixels.
    noise: pixel noise std (pixels in [0, 1] before normalisation).
    dimensions: the judged dimensions (the defect decides each; several only exercise per-dimension output).
  """
  frames: int = 8
  initial: int = 2
  per_call: int = 4
  max_turns: int = 3
  window: int | None = 1
  image_size: int = 8
  noise: float = 0.1
  dimensions: tuple[str, ...] = ("VQ",)

  def __post_init__(self):
    if not 1 <= self.initial < self.frames:
      raise ConfigError(f"FrameTask: need 1 <= initial < frames, got initial={self.initial}, frames={self.frames}")
    if self.per_call < 1 or self.max_turns < 1 or (self.window is not None and self.window < 0):
      raise ConfigError(f"FrameTask: per_call and max_turns must be >= 1 and window >= 0, got {self.per_call}, "
                        f"{self.max_turns}, {self.window}")
    if not self.dimensions or any(not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", d) for d in self.dimensions):
      raise ConfigError(f"FrameTask: dimensions must be identifiers like 'VQ', got {self.dimensions}")

  @property
  def num_images(self) -> int:
    return 2 * self.frames

  def initial_frames(self) -> list[int]:
    """The prompt's frames (pair indices): N_in evenly spaced per video, starting at frame 0."""
    per = [int(i * self.frames // self.initial) for i in range(self.initial)]
    return per + [self.frames + i for i in per]


# -------------------------------------------------------------------------------------------- anchors


def anchors(task: FrameTask) -> dict[str, float]:
  """{"q", "bayes_no_tool" c, "oracle" A*, "examined" e, "unseen" U} (module docstring)."""
  t, n = task.frames, task.initial
  u = t - n
  e = min(u, max(task.max_turns - 1, 0) * task.per_call)
  # c = q + (1 - q) / 2 and A* = c + (1 - q) e / (2U), written over the common denominator 2T (exact at A* = 1)
  return {"q": n / t, "bayes_no_tool": (2 * n + u) / (2 * t), "oracle": (2 * n + u + e) / (2 * t),
          "examined": float(e), "unseen": float(u)}


# ----------------------------------------------------------------------------------------------- data


def _digits() -> np.ndarray:
  from sklearn.datasets import load_digits
  return (load_digits().images / 16.0).astype(np.float32)          # (1797, 8, 8) in [0, 1]


def make_pairs(task: FrameTask, n: int, seed: int) -> dict[str, np.ndarray]:
  """n video pairs: {"images" (n, 2T, S, S, 1) float32 in [-1, 1], "defect_video" (n,) 0/1, "defect_frame"
  (n,) in [0, T), "label" (n,) the better video 1/2}. Content digits are drawn independently of the label."""
  if task.image_size != 8:
    raise ConfigError(f"make_pairs: the digit frames are 8 x 8, got image_size={task.image_size}")
  rng = np.random.default_rng(seed)
  digits = _digits()
  t = task.frames
  content = digits[rng.integers(0, len(digits), size=(n, 2))]                  # (n, 2, 8, 8)
  frames = np.repeat(content[:, :, None], t, axis=2)                            # (n, 2, T, 8, 8)
  shifts = rng.integers(-1, 2, size=(n, 2, t, 2))
  for a in range(2):                      # per-frame shift of up to one pixel along each axis
    for s in (-1, 1):
      hit = shifts[..., a] == s
      frames = np.where(hit[..., None, None], np.roll(frames, s, axis=3 + a), frames)
  frames = frames + task.noise * rng.standard_normal(frames.shape).astype(np.float32)
  video = rng.integers(0, 2, size=n)
  frame = rng.integers(0, t, size=n)
  rows = np.arange(n)
  frames[rows, video, frame] = 1.0 - frames[rows, video, frame]                 # the defect: an inverted frame
  images = np.clip(frames, 0.0, 1.0).reshape(n, 2 * t, 8, 8, 1) * 2.0 - 1.0
  return {"images": images.astype(np.float32), "defect_video": video.astype(np.int32),
          "defect_frame": frame.astype(np.int32), "label": (2 - video).astype(np.int32)}


def problems(task: FrameTask, pairs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
  """Per-pair reward references: {"labels": {dim: "1"/"2"}, "defect": pair index of the defect frame}."""
  out = []
  for v, f, y in zip(pairs["defect_video"], pairs["defect_frame"], pairs["label"]):
    out.append({"labels": {d: str(int(y)) for d in task.dimensions}, "defect": int(v) * task.frames + int(f)})
  return out


# ------------------------------------------------------------------------------------------ tokenizer


def vocabulary(task: FrameTask) -> list[str]:
  """The word tokens: tags, verdicts, frame names " f<k>", dimension names " <DIM>:" and labels."""
  frames = [f" f{k}" for k in range(task.num_images)]
  dims = [f" {d}:" for d in dict.fromkeys(tuple(task.dimensions) + PAPER_DIMENSIONS)]
  return list(dict.fromkeys(list(TAGS) + list(VERDICTS) + frames + dims + list(LABELS)))


def tokenizer(task: FrameTask) -> ByteTokenizer:
  """The LM core's ByteTokenizer with every word of the format as one token (exact round trip)."""
  return ByteTokenizer(extra_specials=vocabulary(task))


def missing_format_tokens(task: FrameTask, tok) -> list[str]:
  """The format's words a tokenizer lacks as special tokens (a Hugging Face tokenizer for full-scale runs must
  hold them: `add_format_tokens`)."""
  have = getattr(tok, "special_ids", {})
  return [w for w in vocabulary(task) if w not in have]


def add_format_tokens(task: FrameTask, src: str, dst: str) -> int:
  """Writes a copy of the Hugging Face tokenizer.json `src` (a file or a folder holding one) to `dst` with the
  format's words added as special tokens (ids after the existing ones: a checkpoint's padded embedding rows,
  e.g. Qwen2.5's 271, or rows to be added). Returns the new vocabulary size."""
  from tokenizers import AddedToken, Tokenizer  # pylint: disable=g-import-not-at-top
  path = os.path.join(src, "tokenizer.json") if os.path.isdir(src) else src
  tok = Tokenizer.from_file(path)
  tok.add_special_tokens([AddedToken(w, special=True, normalized=False) for w in vocabulary(task)])
  os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
  tok.save(dst)
  return tok.get_vocab_size(with_added_tokens=True)


class Vocab:
  """Token ids of the format for one tokenizer and a VLM's visual ids (`image_tokens(k)`)."""

  def __init__(self, task: FrameTask, tok: ByteTokenizer, image_tokens):
    self.task, self.tok, self.image_tokens = task, tok, image_tokens
    sid = tok.special_ids
    self.tool, self.tool_end = sid["<tool>"], sid["</tool>"]
    self.obs, self.obs_end = sid["<obs>"], sid["</obs>"]
    self.forgotten = sid["<forgotten>"]
    self.frame_ids = [sid[f" f{k}"] for k in range(task.num_images)]
    self.frame_of = {i: k for k, i in enumerate(self.frame_ids)}
    self.eos = tok.eos_id

  def frame(self, k: int) -> list[int]:
    """" f<k>" + the visual tokens of frame k."""
    return [self.frame_ids[k]] + list(self.image_tokens(k))

  def prompt(self, text: str | None = None) -> list[int]:
    """The prompt: <pair>, the videos' text prompt (real data; none for the synthetic pairs, whose prompts are
    the same ids for every pair, the pixels differing), the initial frames, <judge>. The text is encoded without
    special-token parsing (with a byte tokenizer), so words of the format inside it stay text."""
    ids = [self.tok.special_ids["<pair>"]]
    if text:
      t = " " + text.strip()
      ids += list(t.encode("utf-8")) if isinstance(self.tok, ByteTokenizer) else self.tok.encode(t)
    for k in self.task.initial_frames():
      ids += self.frame(k)
    return ids + [self.tok.special_ids["<judge>"]]

  def observation(self, frames: Sequence[int]) -> list[int]:
    ids = [self.obs]
    for k in frames:
      ids += self.frame(k)
    return ids + [self.obs_end]

  def visual_count(self, ids: Sequence[int], base: int) -> int:
    """Visual tokens among `ids` (ids >= the VLM's image_token_base)."""
    return sum(1 for i in ids if i >= base)


class SelectFramesEnv:
  """The `select_frames` tool (`jaxlab.posttrain.rollout.ToolEnv`): a call "<tool> f<a> f<b> ...</tool>"
  returns the observation of those frames; a malformed call (no frame, more than K, repeats, other tokens)
  returns "<obs></obs>" (nothing seen; the format reward penalises it). Stateless: the pixels of frame k are
  row input k, so one env serves every batch."""

  def __init__(self, vocab: Vocab):
    self.vocab = vocab

  def parse_call(self, call_tokens: Sequence[int]) -> list[int] | None:
    v = self.vocab
    toks = list(call_tokens)
    if v.tool not in toks or not toks or toks[-1] != v.tool_end:
      return None
    body = toks[len(toks) - toks[::-1].index(v.tool):-1]       # after the last <tool>, before </tool>
    frames = [v.frame_of.get(t) for t in body]
    if not frames or None in frames or len(frames) > v.task.per_call or len(set(frames)) != len(frames):
      return None
    return frames

  def observe(self, prompt_index: int, call_tokens: list[int]) -> list[int]:
    del prompt_index
    frames = self.parse_call(call_tokens)
    return self.vocab.observation(frames or [])


# --------------------------------------------------------------------------------------------- traces


def scripted_trace(task: FrameTask, defect: int, rng: np.random.Generator, kind: str = "oracle"
                   ) -> list[tuple[str, list[int]]]:
  """A scripted trace: [(turn text, frames the call selects)] (the last turn is the answer, no frames).

  kind: "oracle" (scan video 1's unseen frames, K per call, topped up with video 2's; stop at the defect;
  answer by elimination after video 1 is clean), "noisy" (answer at once with a uniform guess unless the
  defect is in view) or "no_tool" (the same without ever calling: the Bayes-optimal no-tool policy).
  """
  if kind not in ("oracle", "noisy", "no_tool"):
    raise ValueError(f"scripted_trace: kind must be oracle, noisy or no_tool, got {kind!r}")
  t, k = task.frames, task.per_call
  seen = task.initial_frames()
  label = 2 if defect < t else 1

  def answer(verdict, y):
    return (verdict + "<answer>" + "".join(f" {d}: {y}" for d in task.dimensions) + "</answer>", [])

  if defect in seen:
    return [answer(f" bad f{defect}", label)]
  if kind != "oracle":
    return [answer(" ok", int(rng.integers(1, 3)))]
  todo1 = [f for f in range(t) if f not in seen]
  todo2 = [f for f in range(t, 2 * t) if f not in seen]
  turns, verdict = [], " ok"
  for _ in range(task.max_turns - 1):
    call = (todo1 + todo2)[:k]
    turns.append((verdict + "<tool>" + "".join(f" f{f}" for f in call) + "</tool>", call))
    todo1 = [f for f in todo1 if f not in call]
    todo2 = [f for f in todo2 if f not in call]
    if defect in call:
      return turns + [answer(f" bad f{defect}", label)]
    if not todo1:
      return turns + [answer(" ok", 1)]
    verdict = " ok"
  # Turns ran out before video 1 was clean: the video with more unexamined frames is the likelier culprit.
  return turns + [answer(" ok", 1 if len(todo2) > len(todo1) else 2)]


def trace_rows(task: FrameTask, vocab: Vocab, trace: Sequence[tuple[str, list[int]]], *, window: int | None,
               placeholder: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
  """The SFT rows of a scripted trace exactly as the rollout builds them (`multi_turn`): one row with every
  observation when window is None, else one row per turn with the window applied to its context. Returns
  (ids, train) pairs for `jaxlab.lm.sft_data.pad_rows`: train is True on the turn's tokens only."""
  tok = vocab.tok
  prompt = vocab.prompt()
  segs: list[tuple[str, list[int]]] = []
  rows = []
  for j, (text, frames) in enumerate(trace):
    ids = tok.encode(text) + ([vocab.eos] if j == len(trace) - 1 else [])
    if window is not None:
      ctx = prompt + _visible(segs, window, [vocab.forgotten] if placeholder else [])
      rows.append((np.asarray(ctx + ids, np.int32), np.asarray([False] * len(ctx) + [True] * len(ids))))
    segs.append(("gen", ids))
    if frames:
      segs.append(("obs", vocab.observation(frames)))
  if window is None:
    ids = prompt + [t for _, s in segs for t in s]
    train = [False] * len(prompt) + [kind == "gen" for kind, s in segs for _ in s]
    rows.append((np.asarray(ids, np.int32), np.asarray(train)))
  return rows


def _visible(segs, window, placeholder):
  obs = [j for j, s in enumerate(segs) if s[0] == "obs"]
  drop = set(obs[:max(len(obs) - window, 0)])
  return [t for j, s in enumerate(segs) for t in (placeholder if j in drop else s[1])]


# --------------------------------------------------------------------------------------- parse / reward

_VERDICT = r" (?:ok|bad f\d+)"


def parse_trace(task: FrameTask):
  """A `jaxlab.posttrain.rewards` Parser of generated text (turns concatenated): valid iff the text is
  turn* final of the module docstring with at most max_turns - 1 calls, each of 1..K distinct frames in range,
  and one label per dimension; the answer is the labels' text ("VQ: 1, ...")."""
  call = re.compile(_VERDICT + r"<tool>((?: f\d+)+)</tool>")
  final = re.compile(_VERDICT + r"<answer>((?: [A-Za-z]\w*: [012])+)</answer>\Z")
  verdict_frame = re.compile(r" bad f(\d+)")

  def parse(text: str) -> Parsed:
    pos, calls = 0, 0
    while True:
      m = call.match(text, pos)
      if m is None:
        break
      frames = [int(f) for f in m.group(1).split(" f")[1:]]
      if len(frames) > task.per_call or len(set(frames)) != len(frames) or max(frames) >= task.num_images:
        return Parsed(None, None)
      calls, pos = calls + 1, m.end()
    m = final.match(text, pos)
    if m is None or calls > task.max_turns - 1:
      return Parsed(None, None)
    if any(int(f) >= task.num_images for f in verdict_frame.findall(text)):
      return Parsed(None, None)
    pairs = re.findall(r" ([A-Za-z]\w*): ([012])", m.group(1))
    if sorted(d for d, _ in pairs) != sorted(task.dimensions):
      return Parsed(None, None)
    return Parsed(text[:m.start(1)], ", ".join(f"{d}: {y}" for d, y in pairs))
  return parse


def judgement_correct(task: FrameTask, texts: Sequence[str], refs: Sequence[dict]) -> np.ndarray:
  """1 where the trace is valid and every dimension's label is right (the pair-level accuracy)."""
  parse = parse_trace(task)
  out = []
  for text, ref in zip(texts, refs):
    p = parse(text)
    got = dict(s.split(": ") for s in p.answer.split(", ")) if p.valid else {}
    out.append(float(p.valid and all(got.get(d) == ref["labels"][d] for d in task.dimensions)))
  return np.asarray(out, np.float32)


# ------------------------------------------------------------------------------------ full-scale data

_PREF = {"a": 1, "1": 1, "b": 2, "2": 2, "same": 0, "tie": 0, "0": 0}


def _frames_of(path: str, num: int) -> np.ndarray:
  """(num, H, W, C) float32 in [0, 1], evenly down-sampled, from a .npy array (T, H, W[, C]) or a folder of
  images (sorted names)."""
  if path.endswith(".npy"):
    if not os.path.isfile(path):
      raise DataError(f"{path}: no such video array (paths are relative to the data file's folder or root=)")
    arr = np.load(path)
  elif os.path.isdir(path):
    from PIL import Image
    names = sorted(n for n in os.listdir(path) if n.lower().endswith((".png", ".jpg", ".jpeg")))
    if not names:
      raise DataError(f"{path}: no .png / .jpg frames in the folder")
    arr = np.stack([np.asarray(Image.open(os.path.join(path, n)).convert("RGB")) for n in names])
  else:
    raise DataError(f"{path}: a video must be a .npy array (T, H, W[, C]) or a folder of frame images; decode "
                    "video files to frames first (e.g. ffmpeg -i video.mp4 frames/%05d.png)")
  raw = np.asarray(arr)
  arr = raw.astype(np.float32)
  if np.issubdtype(raw.dtype, np.integer):          # 8-bit frames; float arrays are taken as [0, 1] already
    arr = arr / 255.0
  if arr.ndim == 3:
    arr = arr[..., None]
  if arr.ndim != 4 or len(arr) == 0:
    raise DataError(f"{path}: frames must be (T, H, W[, C]), got shape {arr.shape}")
  idx = np.linspace(0, len(arr) - 1, num).round().astype(int)
  return arr[idx]


def load_preference_json(path: str, *, frames_per_video: int, dimensions: Sequence[str] = PAPER_DIMENSIONS,
                         root: str | None = None, load_frames: bool = True) -> list[dict[str, Any]]:
  """VideoGen-RewardBench-style preference records from a .json list or .jsonl file.

  Each record needs "prompt", "path_A" and "path_B" (relative to `root`, default the file's folder) and a
  preference per dimension under the dimension's name ("VQ": "A" / "B" / "same", or 1 / 2 / 0; "Overall" is read
  as "OA"). Returns [{"prompt", "labels": {dim: "1"/"2"/"0"}, "frames": (2, frames_per_video, H, W, C)}]
  (frames only with load_frames).
  """
  root = os.path.dirname(os.path.abspath(path)) if root is None else root
  with open(path) as f:
    text = f.read()
  try:
    recs = json.loads(text) if path.endswith(".json") else [json.loads(l) for l in text.splitlines() if l.strip()]
  except json.JSONDecodeError as e:
    raise DataError(f"{path}: not valid JSON ({e}); expected a list of records (.json) or one per line (.jsonl)")
  if not isinstance(recs, list):
    raise DataError(f"{path}: expected a list of records (.json) or one record per line (.jsonl), got "
                    f"{type(recs).__name__}")
  out = []
  for i, r in enumerate(recs):
    if not isinstance(r, dict):
      raise DataError(f"{path}: record {i} is {type(r).__name__}, not an object with prompt, path_A, path_B")
    if "OA" not in r and "Overall" in r:
      r = dict(r, OA=r["Overall"])
    missing = [k for k in ("prompt", "path_A", "path_B", *dimensions) if k not in r]
    if missing:
      raise DataError(f"{path}: record {i} lacks {missing}; each needs prompt, path_A, path_B and a preference "
                      f"per dimension {list(dimensions)}")
    labels = {}
    for d in dimensions:
      v = str(r[d]).strip().lower()
      if v not in _PREF:
        raise DataError(f"{path}: record {i} has {d}={r[d]!r}; use A / B / same (or 1 / 2 / 0)")
      labels[d] = str(_PREF[v])
    rec = {"prompt": r["prompt"], "labels": labels}
    if load_frames:
      a, b = (_frames_of(os.path.join(root, r[k]), frames_per_video) for k in ("path_A", "path_B"))
      if a.shape != b.shape:
        raise DataError(f"{path}: record {i}: videos A and B have frame shapes {a.shape} and {b.shape}; resize "
                        "them to one size and channel count")
      rec["frames"] = np.stack([a, b])
    out.append(rec)
  return out
