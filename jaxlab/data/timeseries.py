"""Time-series data: a multi-scale synthetic generator, CSV readers with the standard forecasting splits,
train-split normalisation, random-access forecasting windows, and an offline real series (statsmodels' co2).

Forecasting windows follow the usual long-range forecasting protocol (Informer / Autoformer / S-Mamba):
a window starting at t has the lookback `values[t : t + lookback]` and the target
`values[t + lookback : t + lookback + horizon]`; validation and test windows may look back into the previous
split (their *targets* lie inside the split); every split is z-scored with the TRAIN split's statistics.
"""

from __future__ import annotations

import csv
import os
from typing import Sequence

import numpy as np

from jaxlab.errors import DataError, require

# Borders of the standard splits (in rows): ETT-hour 12/4/4 months of 30 days, ETT-minute the same in 15-min
# steps; every other dataset (Weather, Electricity, Traffic, ...) 70% / 10% / 20% in time order.
_ETT_MONTH_ROWS = {"h": 30 * 24, "m": 30 * 24 * 4}


def multiscale_series(rng: np.random.Generator, n_series: int, length: int, channels: int,
                      periods: Sequence[float] = (8, 64, 512), amplitude: tuple[float, float] = (0.5, 1.5),
                      rho: float = 0.9, sigma: float = 0.1, step: float = 1.0) -> np.ndarray:
  """Sums of sinusoids at several periods plus AR(1) noise (DF-Mamba's synthetic multi-scale benchmark; reconstructed).

  x(t) = sum_p a_p sin(2 pi t / p + phi_p) + e(t) sampled at t = 0, step, 2 step, ...; e is the stationary
  Ornstein-Uhlenbeck process whose samples one time unit apart are the AR(1) e_t = rho e_{t-1} + sigma eps_t.
  At sampling step s its samples are the AR(1) with coefficient rho^s and innovation scale
  sigma sqrt((1 - rho^(2 s)) / (1 - rho^2)) (the same stationary variance sigma^2 / (1 - rho^2)), so a series
  sampled at step 1 / m, taken every m-th sample, has exactly the distribution of the series at step 1
  (the same time span sampled m times finer). a_p ~ U(amplitude) and phi_p ~ U(0, 2 pi) are drawn
  independently per series, channel and period; step = 1 is the discrete-time generator (same draws).

  Args:
    rng: numpy generator.
    n_series, length, channels: output shape (length samples, `step` time units apart).
    periods: the periods p (time units).
    amplitude: (low, high) of the uniform amplitude distribution.
    rho, sigma: AR(1) coefficient and innovation scale at step 1 (0 <= rho < 1 when step != 1).
    step: sampling step in time units (> 0).

  Returns:
    (n_series, length, channels) float32.
  """
  if not abs(rho) < 1:
    raise DataError(f"multiscale_series: |rho| must be < 1 for a stationary AR(1) noise, got {rho}")
  if not step > 0:
    raise DataError(f"multiscale_series: step must be > 0, got {step}")
  if step != 1 and rho < 0:
    raise DataError(f"multiscale_series: a negative rho={rho} has no continuous-time (step={step}) version")
  rho_s = rho ** step if step != 1 else rho
  sigma_s = sigma * np.sqrt((1 - rho_s ** 2) / (1 - rho ** 2)) if step != 1 else sigma
  t = np.arange(length, dtype=np.float64) * step
  x = np.zeros((n_series, length, channels))
  for p in periods:
    a = rng.uniform(*amplitude, size=(n_series, 1, channels))
    phi = rng.uniform(0, 2 * np.pi, size=(n_series, 1, channels))
    x += a * np.sin(2 * np.pi * t[None, :, None] / p + phi)
  eps = rng.normal(size=(n_series, length, channels)) * sigma_s
  e = np.empty_like(eps)
  e[:, 0] = eps[:, 0] / np.sqrt(1 - rho_s ** 2)
  for i in range(1, length):
    e[:, i] = rho_s * e[:, i - 1] + eps[:, i]
  return (x + e).astype(np.float32)


def read_csv(path: str, columns: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
  """Reads a forecasting CSV (header row; an optional first `date` column; numeric columns).

  Args:
    path: CSV file, e.g. ETTh1.csv / weather.csv from the Autoformer release.
    columns: the columns to keep (default: every numeric column except a leading date/time column).

  Returns:
    (values (T, C) float32, column names).

  Raises:
    DataError: missing file, no header, non-numeric or missing values (with the line number), unknown
      columns, a constant column, or fewer than 2 rows.
  """
  if not os.path.exists(path):
    raise DataError(f"{path}: no such file (pass --config.data.path=FILE.csv, e.g. ETTh1.csv)")
  with open(path, newline="", encoding="utf-8", errors="replace") as f:
    reader = csv.reader(f)
    rows = [(reader.line_num, r) for r in reader if any(c.strip() for c in r)]   # blank lines skipped
  if len(rows) < 3:
    raise DataError(f"{path}: needs a header row and at least 2 data rows, got {len(rows)} non-blank lines")
  header = [h.strip() for h in rows[0][1]]
  if any(not h for h in header) or len(set(header)) != len(header):
    raise DataError(f"{path}, line {rows[0][0]}: the header needs distinct, non-empty column names, got {header}")
  skip_first = header[0].lower() in ("date", "time", "datetime", "timestamp")
  names = header[1:] if skip_first else header
  keep = list(range(1 if skip_first else 0, len(header)))
  if columns:
    missing = [c for c in columns if c not in header]
    if missing:
      raise DataError(f"{path}: unknown columns {missing}; the header has {header}")
    keep = [header.index(c) for c in columns]
    names = list(columns)
  if not keep:
    raise DataError(f"{path}: no value columns besides {header[0]!r}")
  values = np.empty((len(rows) - 1, len(keep)), np.float64)
  for i, (line, row) in enumerate(rows[1:]):
    if len(row) != len(header):
      raise DataError(f"{path}, line {line}: {len(row)} fields, the header has {len(header)}")
    for j, col in enumerate(keep):
      cell = row[col].strip()
      try:
        values[i, j] = float(cell)
      except ValueError:
        raise DataError(f"{path}, line {line}, column {header[col]!r}: {cell!r} is not a number "
                        "(fill or drop missing values first)") from None
      if not np.isfinite(values[i, j]):
        raise DataError(f"{path}, line {line}, column {header[col]!r}: non-finite value {cell!r}")
  std = values.std(0)
  if np.any(std == 0):
    raise DataError(f"{path}: constant columns {[n for n, s in zip(names, std) if s == 0]} cannot be z-scored; "
                    "drop them with --config.data.columns")
  return values.astype(np.float32), names


def split_borders(name: str, length: int, lookback: int) -> dict[str, tuple[int, int]]:
  """Row ranges (start, end) of the train / val / test splits, lookback included for val and test.

  ETTh1/ETTh2: 12 / 4 / 4 months of hourly rows; ETTm1/ETTm2: the same in 15-minute rows; any other name:
  70% / 10% / 20% in time order. Val and test ranges start `lookback` rows early (their first window's
  lookback lies in the previous split; every target lies inside the split).

  Args:
    name: dataset name (file stem), e.g. "ETTh1", "weather".
    length: number of rows T.
    lookback: the model's lookback L.

  Returns:
    {"train": (0, a), "val": (a - L, b), "test": (b - L, c)}.
  """
  stem = os.path.splitext(os.path.basename(name))[0]
  if stem.upper().startswith("ETT") and len(stem) >= 4 and stem[3].lower() in _ETT_MONTH_ROWS:
    month = _ETT_MONTH_ROWS[stem[3].lower()]
    a, b, c = 12 * month, 16 * month, 20 * month
  else:
    a, c = int(0.7 * length), length
    b = c - int(0.2 * length)
  if c > length or a <= lookback:
    raise DataError(f"{name}: {length} rows are too few for the standard splits with lookback {lookback}")
  return {"train": (0, a), "val": (a - lookback, b), "test": (b - lookback, c)}


class Scaler:
  """Per-channel z-scoring with statistics of the training split.

  Args:
    train_values: (..., C) training values.
  """

  def __init__(self, train_values: np.ndarray):
    flat = np.asarray(train_values, np.float64).reshape(-1, train_values.shape[-1])
    self.mean = flat.mean(0).astype(np.float32)
    self.std = flat.std(0).astype(np.float32)
    if np.any(self.std == 0):
      raise DataError(f"Scaler: constant channels {np.flatnonzero(self.std == 0).tolist()} in the training split")

  def transform(self, x: np.ndarray) -> np.ndarray:
    """(..., C) -> z-scored float32."""
    return ((x - self.mean) / self.std).astype(np.float32)

  def inverse(self, z: np.ndarray) -> np.ndarray:
    """Undo `transform`."""
    return (z * self.std + self.mean).astype(np.float32)


class WindowSource:
  """Random-access forecasting windows over one or several series (a `jaxlab.data` Source).

  Item i is {"x": (lookback, C) lookback, "y": (horizon, C) target} of window i; windows are enumerated
  series by series with the given stride.

  Args:
    series: (T, C) array or a sequence of them (e.g. (N, T, C)).
    lookback, horizon: window sizes.
    stride: distance between window starts.
  """

  def __init__(self, series, lookback: int, horizon: int, stride: int = 1):
    arrays = ([series] if isinstance(series, np.ndarray) and series.ndim == 2 else [np.asarray(s) for s in series])
    self.series, self.lookback, self.horizon = arrays, int(lookback), int(horizon)
    span = self.lookback + self.horizon
    counts = [max(0, (len(s) - span) // stride + 1) for s in arrays]
    if sum(counts) == 0:
      raise DataError(f"WindowSource: series of lengths {[len(s) for s in arrays]} hold no window of "
                      f"lookback {lookback} + horizon {horizon}")
    self.stride = stride
    self._offsets = np.concatenate([[0], np.cumsum(counts)])

  def __len__(self) -> int:
    return int(self._offsets[-1])

  def __getitem__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    indices = np.asarray(indices)
    sid = np.searchsorted(self._offsets, indices, side="right") - 1
    starts = (indices - self._offsets[sid]) * self.stride
    span = self.lookback + self.horizon
    w = np.stack([self.series[s][t:t + span] for s, t in zip(sid, starts)])
    return {"x": w[:, :self.lookback], "y": w[:, self.lookback:]}


def co2_series() -> np.ndarray:
  """Weekly Mauna Loa CO2 (1958-2001, 2284 rows) from statsmodels, gaps linearly interpolated.

  Returns:
    (T, 1) float32 (ppm).

  Raises:
    MissingDependencyError: statsmodels is not installed (pip install -e ".[timeseries]").
  """
  require("statsmodels", "timeseries")
  from statsmodels.datasets import co2  # pylint: disable=g-import-not-at-top
  v = np.asarray(co2.load().data["co2"], np.float64)
  idx = np.arange(len(v))
  ok = np.isfinite(v)
  v = np.interp(idx, idx[ok], v[ok])
  return v[:, None].astype(np.float32)


def hilbert_order(n: int) -> np.ndarray:
  """Visiting order of an n x n grid along the Hilbert curve (n a power of 2).

  The curve is self-similar: for the 2n x 2n grid, the 2 x 2 blocks are visited in the n x n curve's order
  with each block's 4 cells consecutive, so a nearest-upsampled image in Hilbert order is the coarse
  sequence with every element repeated 4 times.

  Returns:
    (n * n,) int array of flat indices (row * n + col) in visiting order.
  """
  if n < 1 or n & (n - 1):
    raise DataError(f"hilbert_order: n must be a power of 2, got {n}")
  order = np.empty(n * n, np.int64)
  for d in range(n * n):
    x = y = 0
    t = d
    s = 1
    while s < n:
      rx = 1 & (t // 2)
      ry = 1 & (t ^ rx)
      if ry == 0:
        if rx == 1:
          x, y = s - 1 - x, s - 1 - y
        x, y = y, x
      x += s * rx
      y += s * ry
      t //= 4
      s *= 2
    order[d] = y * n + x
  return order


def images_to_sequences(images: np.ndarray, patch: int = 1) -> np.ndarray:
  """(N, H, W, C) images -> (N, (H/p) (W/p), p p C) patch sequences in Hilbert order (H = W, H/p a power of 2)."""
  n, h, w, c = images.shape
  if h != w or h % patch:
    raise DataError(f"images_to_sequences: need square images divisible by patch={patch}, got {h}x{w}")
  g = h // patch
  x = images.reshape(n, g, patch, g, patch, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, g * g, patch * patch * c)
  return x[:, hilbert_order(g)]
