"""Time-series data: generator statistics, CSV reader errors, standard splits, windows, Hilbert order."""

import numpy as np
import pytest

from jaxlab.data import timeseries
from jaxlab.errors import DataError


def test_ar1_noise_statistics():
  x = timeseries.multiscale_series(np.random.default_rng(0), 64, 4000, 2, periods=(), rho=0.9, sigma=0.1)
  assert x.shape == (64, 4000, 2) and x.dtype == np.float32
  np.testing.assert_allclose(x.var(), 0.01 / (1 - 0.81), rtol=0.05)
  lag1 = np.mean(x[:, 1:] * x[:, :-1]) / np.mean(x * x)
  np.testing.assert_allclose(lag1, 0.9, atol=0.01)


def test_sinusoid_periods():
  x = timeseries.multiscale_series(np.random.default_rng(1), 1, 512, 1, periods=(64,), sigma=1e-9, rho=0.0)[0, :, 0]
  spec = np.abs(np.fft.rfft(x))
  assert np.argmax(spec) == 512 // 64


def test_finer_step_is_the_same_process_sampled_finer():
  """step = 1 / m: every m-th sample has the distribution of the step-1 series (the same time span, m x finer)."""
  m = 4
  x = timeseries.multiscale_series(np.random.default_rng(2), 64, 4000 * m, 1, periods=(), rho=0.9, sigma=0.1,
                                   step=1 / m)
  sub = x[:, m - 1::m]
  np.testing.assert_allclose(sub.var(), 0.01 / (1 - 0.81), rtol=0.05)        # stationary variance kept
  lag = lambda v: np.mean(v[:, 1:] * v[:, :-1]) / np.mean(v * v)
  np.testing.assert_allclose(lag(sub), 0.9, atol=0.01)                        # rho per time unit
  np.testing.assert_allclose(lag(x), 0.9 ** (1 / m), atol=0.005)             # rho^(1/m) per fine step
  # The sinusoids: the same draws, sampled at t = i / m (noise off).
  kw = dict(periods=(8, 64), rho=0.0, sigma=1e-9)
  unit = timeseries.multiscale_series(np.random.default_rng(3), 3, 64, 2, **kw)
  fine = timeseries.multiscale_series(np.random.default_rng(3), 3, 64 * m, 2, step=1 / m, **kw)
  np.testing.assert_allclose(fine[:, ::m], unit, atol=1e-5)
  t = np.arange(64 * m) / m                                                     # brute force, one channel
  a_phi = np.random.default_rng(3)
  want = np.zeros(64 * m)
  for p in (8, 64):
    a, phi = a_phi.uniform(0.5, 1.5, size=(3, 1, 2)), a_phi.uniform(0, 2 * np.pi, size=(3, 1, 2))
    want += a[1, 0, 0] * np.sin(2 * np.pi * t / p + phi[1, 0, 0])
  np.testing.assert_allclose(fine[1, :, 0], want, atol=1e-5)
  assert np.array_equal(timeseries.multiscale_series(np.random.default_rng(4), 2, 50, 1),
                        timeseries.multiscale_series(np.random.default_rng(4), 2, 50, 1, step=1.0))
  with pytest.raises(DataError, match="step must be > 0"):
    timeseries.multiscale_series(np.random.default_rng(0), 1, 8, 1, step=0)
  with pytest.raises(DataError, match="negative rho"):
    timeseries.multiscale_series(np.random.default_rng(0), 1, 8, 1, rho=-0.5, step=0.5)


def _write(path, rows):
  path.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
  return str(path)


def test_read_csv_and_errors(tmp_path):
  good = _write(tmp_path / "weather.csv", [["date", "a", "b"]] + [[f"2020-01-{i}", i, i * i % 7] for i in range(30)])
  v, names = timeseries.read_csv(good)
  assert names == ["a", "b"] and v.shape == (30, 2) and v[3, 0] == 3
  v, names = timeseries.read_csv(good, columns=("b",))
  assert names == ["b"] and v.shape == (30, 1)
  bad = _write(tmp_path / "bad.csv", [["date", "a"], ["x", 1], ["y", ""], ["z", 3]])
  with pytest.raises(DataError, match="line 3, column 'a'"):
    timeseries.read_csv(bad)
  const = _write(tmp_path / "const.csv", [["a", "b"], [1, 2], [1, 3], [1, 4]])
  with pytest.raises(DataError, match="constant columns \\['a'\\]"):
    timeseries.read_csv(const)
  with pytest.raises(DataError, match="no such file"):
    timeseries.read_csv(str(tmp_path / "missing.csv"))
  with pytest.raises(DataError, match="unknown columns"):
    timeseries.read_csv(good, columns=("c",))


def test_standard_splits():
  assert timeseries.split_borders("ETTh1", 17420, 96) == {
      "train": (0, 8640), "val": (8640 - 96, 11520), "test": (11520 - 96, 14400)}
  assert timeseries.split_borders("/data/ETTm2.csv", 69680, 96)["train"] == (0, 34560)
  b = timeseries.split_borders("weather.csv", 1000, 96)
  assert b == {"train": (0, 700), "val": (604, 800), "test": (704, 1000)}
  with pytest.raises(DataError, match="too few"):
    timeseries.split_borders("ETTh1", 5000, 96)


def test_window_source_matches_brute_force():
  rng = np.random.default_rng(0)
  series = [rng.normal(size=(20, 2)), rng.normal(size=(15, 2))]
  src = timeseries.WindowSource(series, 4, 3, stride=2)
  want = [(s, t) for s in range(2) for t in range(0, len(series[s]) - 7 + 1, 2)]
  assert len(src) == len(want)
  got = src[np.arange(len(src))]
  for i, (s, t) in enumerate(want):
    np.testing.assert_array_equal(got["x"][i], series[s][t:t + 4])
    np.testing.assert_array_equal(got["y"][i], series[s][t + 4:t + 7])
  with pytest.raises(DataError, match="hold no window"):
    timeseries.WindowSource(np.zeros((5, 1)), 4, 3)


def test_scaler():
  x = np.random.default_rng(0).normal(3.0, 2.0, size=(1000, 2)).astype(np.float32)
  s = timeseries.Scaler(x)
  z = s.transform(x)
  np.testing.assert_allclose(z.mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(z.std(0), 1, rtol=1e-3)
  np.testing.assert_allclose(s.inverse(z), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_hilbert_order_is_a_continuous_self_similar_curve(n):
  order = timeseries.hilbert_order(n)
  assert sorted(order) == list(range(n * n))
  rc = np.stack([order // n, order % n], 1)
  assert np.all(np.abs(np.diff(rc, axis=0)).sum(1) == 1)
  # Nearest 2x upsampling in Hilbert order == the coarse Hilbert sequence with each element repeated 4 times.
  img = np.random.default_rng(n).normal(size=(1, n, n, 1))
  up = np.kron(img, np.ones((1, 2, 2, 1)))
  np.testing.assert_array_equal(timeseries.images_to_sequences(up)[0, :, 0],
                                np.repeat(timeseries.images_to_sequences(img)[0, :, 0], 4))
  with pytest.raises(DataError, match="power of 2"):
    timeseries.hilbert_order(6)


def test_patch_sequences():
  img = np.arange(4 * 4 * 2, dtype=np.float32).reshape(1, 4, 4, 2)
  seq = timeseries.images_to_sequences(img, patch=2)
  assert seq.shape == (1, 4, 8)
  first = timeseries.hilbert_order(2)[0]
  r, c = divmod(first, 2)
  np.testing.assert_array_equal(seq[0, 0], img[0, 2 * r:2 * r + 2, 2 * c:2 * c + 2].reshape(-1))


def test_co2_series():
  pytest.importorskip("statsmodels")
  v = timeseries.co2_series()
  assert v.shape == (2284, 1) and np.all(np.isfinite(v)) and 300 < v.mean() < 400
