"""Input pipeline: deterministic batches, epoch coverage, per-process rows, eval padding, TFDS sources."""

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import data as data_lib
from jaxlab import mesh as mesh_lib
from jaxlab.data.tfds import TfdsSource
from jaxlab.errors import DataError


def test_batches_are_a_pure_function_of_the_step_and_cover_each_epoch():
  src = data_lib.ArraySource({"i": np.arange(10)})
  b1, b2 = data_lib.Batcher(src, 4, seed=3), data_lib.Batcher(src, 4, seed=3)
  seq = np.concatenate([b1.local_batch(s)["i"] for s in range(5)])  # 20 samples = 2 epochs
  assert sorted(seq[:10]) == list(range(10)) and sorted(seq[10:]) == list(range(10))
  assert not np.array_equal(seq[:10], seq[10:])  # reshuffled per epoch
  np.testing.assert_array_equal(b2.local_batch(3)["i"], seq[12:16])  # random access == sequential
  assert not np.array_equal(data_lib.Batcher(src, 4, seed=4).indices(0), b1.indices(0))


def test_process_rows_and_global_assembly():
  m = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  sh = NamedSharding(m, P("data"))
  rows = data_lib.process_rows(sh, 16)
  assert rows == slice(0, 16)  # a single process holds every row
  batch = {"x": np.arange(32, dtype=np.float32).reshape(16, 2)}
  g = data_lib.to_global(batch, sh, 16)["x"]
  assert g.sharding == sh and g.shape == (16, 2)
  np.testing.assert_array_equal(np.asarray(g), batch["x"])


def test_eval_batches_cover_every_example_once_with_mask():
  src = data_lib.ArraySource({"i": np.arange(10)})
  seen = []
  for batch, mask in data_lib.eval_batches(src, 4, slice(None)):
    assert len(batch["i"]) == 4
    seen += list(batch["i"][mask > 0])
  assert seen == list(range(10))


def test_array_source_rejects_ragged_input():
  with pytest.raises(DataError, match="equal-length"):
    data_lib.ArraySource({"a": np.zeros(3), "b": np.zeros(4)})


def test_tfds_source_under_mock_data_feeds_the_sharded_pipeline():
  with tfds.testing.mock_data(num_examples=24, policy=tfds.testing.MockPolicy.USE_CODE):
    src = TfdsSource("mnist", "train", keys=("image", "label"))
    assert len(src) == 24
    m = mesh_lib.make_mesh((("data", 8), ("model", 1)))
    sh = mesh_lib.batch_sharding(m, (("batch", "data"),))
    b = data_lib.Batcher(src, 8, seed=0)
    g = data_lib.to_global(b.local_batch(0, data_lib.process_rows(sh, 8)), sh, 8)
    assert g["image"].shape == (8, 28, 28, 1) and g["image"].dtype == np.uint8
    assert g["label"].shape == (8,) and len(g["image"].sharding.device_set) == 8


def test_tfds_missing_dataset_is_a_clear_error(tmp_path):
  with pytest.raises(DataError, match="tfds build mnist --data_dir"):
    TfdsSource("mnist", "train", data_dir=str(tmp_path))


def test_digits_split_is_stratified_and_disjoint():
  tr, te = data_lib.digits("train"), data_lib.digits("test")
  assert len(tr["label"]) + len(te["label"]) == 1797 and te["image"].shape[1:] == (8, 8, 1)
  assert set(np.unique(te["label"])) == set(range(10))
  assert 0.0 <= tr["image"].min() and tr["image"].max() <= 1.0


def test_digits_value_range_maps_pixels_linearly():
  base, pm = data_lib.digits("train"), data_lib.digits("train", value_range=(-1, 1))
  np.testing.assert_allclose(pm["image"], 2 * base["image"] - 1, atol=1e-6)
  assert pm["image"].min() == -1.0 and pm["image"].max() == 1.0
  np.testing.assert_array_equal(pm["label"], base["label"])
  with pytest.raises(ValueError, match="lo < hi"):
    data_lib.digits(value_range=(1, 1))


def test_center_crop_follows_adm():
  from PIL import Image
  from jaxlab.data import images
  rng = np.random.default_rng(0)
  img = rng.integers(0, 256, (300, 500, 3), dtype=np.uint8)
  out = images.center_crop(img, 64)
  # ADM: box-halve while the short side >= 2 x 64 (300 -> 150 -> 75), bicubic to short side 64, center crop
  ref = Image.fromarray(img).resize((250, 150), resample=Image.BOX).resize((125, 75), resample=Image.BOX)
  ref = np.asarray(ref.resize((round(125 * 64 / 75), 64), resample=Image.BICUBIC))
  left = (ref.shape[1] - 64) // 2
  np.testing.assert_array_equal(out, ref[:, left:left + 64])
  assert images.center_crop(img[:64, :64], 64).tolist() == img[:64, :64].tolist()   # already the size
  assert images.center_crop(img[:, :, 0], 32).shape == (32, 32, 3)                   # grayscale -> RGB
  x = images.to_value_range({"image": np.array([[0, 255]], np.uint8), "label": np.array([1])})
  np.testing.assert_allclose(x["image"], [[-1.0, 1.0]]) and x["label"].tolist() == [1]


def test_imagenet_source_under_mock_data_crops_each_row():
  from jaxlab.data import images
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    src = images.ImageNetSource("train", image_size=16)
    assert len(src) == 6
    rows = src[np.arange(4)]
    assert rows["image"].shape == (4, 16, 16, 3) and rows["image"].dtype == np.uint8
    assert rows["label"].dtype == np.int32 and rows["label"].shape == (4,)
    b = data_lib.Batcher(src, 4, seed=0, transform=images.to_value_range)
    local = b.local_batch(0, slice(0, 2))          # a process reads only its rows
    assert local["image"].shape == (2, 16, 16, 3) and local["image"].min() >= -1


def test_imagenet_missing_is_a_clear_error(tmp_path):
  from jaxlab.data import images
  with pytest.raises(DataError, match="manual download"):
    images.ImageNetSource("train", data_dir=str(tmp_path))
