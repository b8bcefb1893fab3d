"""TFDS datasets through `tfds.data_source` (ArrayRecord random access; TensorFlow is not needed).

Use with `Batcher` for training (each process reads only its rows of each global batch) and with
`eval_batches` for evaluation. Tests run it under `tfds.testing.mock_data`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxlab.errors import DataError


class TfdsSource:
  """Random-access view of one split of a prepared TFDS dataset.

  Args:
    name: TFDS name, e.g. "mnist" or "patch_camelyon".
    split: split string, e.g. "train" or "train[:90%]".
    data_dir: TFDS data directory (default: TFDS's own default, ~/tensorflow_datasets).
    keys: feature names to keep (default: all).
    download: let TFDS download and prepare the dataset when it is missing (off by default: tests and
      offline machines must never download).
  """

  def __init__(self, name: str, split: str, data_dir: str | None = None, keys: Sequence[str] | None = None,
               download: bool = False):
    import tensorflow_datasets as tfds  # imported lazily: slow to import
    try:
      self._ds = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
    except Exception as e:  # tfds raises several types here (missing builder, files, split)
      raise DataError(
          f"TFDS dataset '{name}' split '{split}' is not available in data_dir={data_dir or 'default'} "
          f"({type(e).__name__}: {str(e).splitlines()[0][:160]}); prepare it once with "
          f"`tfds build {name} --data_dir=DIR` and set config.data.data_dir=DIR") from None
    self.keys = tuple(keys) if keys else None

  def __len__(self) -> int:
    return len(self._ds)

  def __getitem__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    records = [self._ds[int(i)] for i in np.asarray(indices)]
    if not records:
      return {}
    keys = self.keys or tuple(records[0].keys())
    return {k: np.stack([np.asarray(r[k]) for r in records]) for k in keys}
