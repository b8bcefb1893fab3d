"""Image datasets of varying sizes for diffusion models: TFDS `imagenet2012`, center-cropped on the host.

`ImageNetSource` is a random-access source (like `TfdsSource`) whose rows are already resized and cropped to
`image_size` x `image_size` uint8 RGB, so `Batcher` can stack them; with `Batcher` every process reads and
decodes only its own rows of each global batch (`Batcher.local_batch(step, process_rows(...))`).
`to_value_range` is the host transform to float32 in [-1, 1]; random horizontal flips are left to the
training step (a key per step, so a resumed run flips exactly as an uninterrupted one).

ImageNet needs a manual download (its licence): put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar in
a manual dir, then prepare it once as ArrayRecord for `tfds.data_source`:

    tfds build imagenet2012 --manual_dir=DIR --data_dir=DATA --file_format=array_record

The crop is ADM's `center_crop_arr` (Dhariwal & Nichol 2021, guided-diffusion; also JiT's and Latent
Forcing's ImageNet pipeline): halve with a box filter while the short side is >= 2x the target, resize the
short side to the target with bicubic interpolation, then crop the center.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from jaxlab.errors import DataError


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """ADM's center crop of an (H, W, 3) uint8 image to (size, size, 3) (see the module docstring)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top  (pillow ships with matplotlib)
  arr = np.asarray(image)
  if arr.ndim == 2:
    arr = np.repeat(arr[..., None], 3, axis=-1)
  if arr.ndim != 3 or arr.shape[-1] not in (1, 3):
    raise DataError(f"center_crop: expected an (H, W, 3) image, got shape {arr.shape}")
  if arr.shape[-1] == 1:
    arr = np.repeat(arr, 3, axis=-1)
  img = Image.fromarray(arr.astype(np.uint8))
  while min(img.size) >= 2 * size:
    img = img.resize(tuple(s // 2 for s in img.size), resample=Image.BOX)
  scale = size / min(img.size)
  img = img.resize(tuple(max(size, round(s * scale)) for s in img.size), resample=Image.BICUBIC)
  out = np.asarray(img)
  top, left = (out.shape[0] - size) // 2, (out.shape[1] - size) // 2
  return out[top:top + size, left:left + size]


class ImageNetSource:
  """Random-access view of a prepared TFDS `imagenet2012` split, each row center-cropped to image_size.

  Args:
    split: TFDS split string ("train", "validation", "train[:1%]", ...).
    image_size: output side (e.g. 256).
    data_dir: TFDS data directory holding the prepared ArrayRecord files (default: TFDS's default).
    name: the TFDS name (imagenet2012; imagenet2012_subset etc. also work).

  Rows: {"image": uint8 (n, image_size, image_size, 3), "label": int32 (n,)}.
  """

  def __init__(self, split: str, *, image_size: int = 256, data_dir: str | None = None,
               name: str = "imagenet2012"):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (slow to import)
    if int(image_size) < 1:
      raise DataError(f"ImageNetSource: image_size must be >= 1, got {image_size}")
    self.image_size = int(image_size)
    try:
      self._ds = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # tfds raises several types here (missing builder, files, split)
      raise DataError(
          f"TFDS dataset '{name}' split '{split}' is not prepared in data_dir={data_dir or 'default'} "
          f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); ImageNet needs a manual download: put the "
          f"ILSVRC2012 tars in DIR and run `tfds build {name} --manual_dir=DIR --data_dir=DATA "
          "--file_format=array_record`, then set config.data.data_dir=DATA") from None

  def __len__(self) -> int:
    return len(self._ds)

  def __getitem__(self, indices) -> dict[str, np.ndarray]:
    records = [self._ds[int(i)] for i in np.asarray(indices).reshape(-1)]
    n, s = len(records), self.image_size
    images = np.zeros((n, s, s, 3), np.uint8)
    for j, r in enumerate(records):
      images[j] = center_crop(r["image"], s)
    return {"image": images, "label": np.asarray([int(r["label"]) for r in records], np.int32)}


def to_value_range(batch: Mapping[str, np.ndarray], value_range: tuple[float, float] = (-1.0, 1.0)) -> dict:
  """Host transform: uint8 "image" in [0, 255] -> float32 in value_range; other keys unchanged."""
  lo, hi = (float(v) for v in value_range)
  out = dict(batch)
  out["image"] = (lo + (hi - lo) * (np.asarray(batch["image"], np.float32) / 255.0)).astype(np.float32)
  return out
