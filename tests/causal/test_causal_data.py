"""CSV / panel readers (clear errors), windows against a manual loop, synthetic systems' effect sizes."""

import numpy as np
import pytest

from jaxlab.causal import data
from jaxlab.errors import DataError


def _write(path, text):
  path.write_text(text)
  return str(path)


def test_windows_match_manual_loop_and_never_cross_units():
  rng = np.random.default_rng(0)
  units = [rng.normal(size=(14, 2)), rng.normal(size=(9, 2))]
  p = data.Panel(units, ["a", "b"], ["u0", "u1"], "test")
  w = data.make_windows(p, 3, "none", val_fraction=0.34)
  xs, ys = [], []
  for u in units:
    for t in range(3, len(u)):
      xs.append(u[t - 3:t].T)
      ys.append(u[t])
  np.testing.assert_allclose(w.x, np.stack(xs), rtol=1e-6)
  np.testing.assert_allclose(w.y, np.stack(ys), rtol=1e-6)
  assert list(w.unit) == [0] * 11 + [1] * 6
  assert list(w.val) == [False] * 8 + [True] * 3 + [False] * 4 + [True] * 2   # floor(0.34 * 11), floor(0.34 * 6)


def test_normalisation_uses_training_rows():
  rng = np.random.default_rng(1)
  u = rng.normal(size=(40, 2)) * [2.0, 5.0] + [1.0, -3.0]
  w = data.make_windows(data.Panel([u], ["a", "b"], ["u"], "t"), 2, "global", val_fraction=0.25)
  train_rows = u[:40 - 9]                                      # floor(0.25 * 38) = 9 validation windows
  np.testing.assert_allclose(w.mean, train_rows.mean(0))
  np.testing.assert_allclose(w.std, train_rows.std(0))
  pu = data.make_windows(data.Panel([u, u * 3 + 1], ["a", "b"], ["u", "v"], "t"), 2, "unit")
  np.testing.assert_allclose(pu.x[: len(pu.x) // 2], pu.x[len(pu.x) // 2:], atol=1e-5)   # unit effects removed


def test_read_csv_panel_and_unit_column(tmp_path):
  f = _write(tmp_path / "p.csv", "country,year,x,y\nA,1,1,2\nA,2,2,3\nB,1,5,1\nA,3,3,1\nB,2,4,0\nB,3,1,2\n")
  p = data.read_panel(f, unit_column="country", time_column="year")
  assert p.variables == ["x", "y"] and p.unit_names == ["A", "B"]
  np.testing.assert_array_equal(p.units[0], [[1, 2], [2, 3], [3, 1]])
  np.testing.assert_array_equal(p.units[1], [[5, 1], [4, 0], [1, 2]])


def test_read_several_files_and_whitespace_without_header(tmp_path):
  a = _write(tmp_path / "a.csv", "time,x,y\n0,1,2\n1,2,3\n2,4,1\n")
  _write(tmp_path / "b.csv", "time,x,y\n0,5,1\n1,4,0\n2,1,2\n")
  p = data.read_panel(str(tmp_path))
  assert p.unit_names == ["a", "b"] and p.variables == ["x", "y"] and len(p.units) == 2
  assert data.read_panel(a + "," + str(tmp_path / "b.csv")).unit_names == ["a", "b"]
  t = _write(tmp_path / "c.txt", "1.0 2.0 3.0\n2.0 1.0 0.5\n3.0 3.0 1.0\n")
  q = data.read_panel(t, header=False, time_column="")
  assert q.variables == ["x0", "x1", "x2"] and q.units[0].shape == (3, 3)


@pytest.mark.parametrize("text,match", [
    ("a,b\n1,2\n3,\n5,6\n", r"line 3, column 'b': missing value"),
    ("a,b\n1,2\nNA,4\n5,6\n", r"line 3, column 'a': missing value 'NA'"),
    ("a,b\n1,2\n3,x7\n5,6\n", r"line 3, column 'b': 'x7' is not a number"),
    ("a,b\n1,2\n3,4,5\n", r"line 3: 3 fields but the header has 2"),
    ("a,b\n", r"no data rows"),
])
def test_malformed_csv_errors_name_line_and_column(tmp_path, text, match):
  f = _write(tmp_path / "bad.csv", text)
  with pytest.raises(DataError, match=match):
    data.read_panel(f)


def test_constant_and_short_errors(tmp_path):
  f = _write(tmp_path / "c.csv", "a,b,c\n1,7,2\n2,7,3\n3,7,1\n4,7,5\n")
  with pytest.raises(DataError, match=r"constant column\(s\) \['b'\]"):
    data.make_windows(data.read_panel(f), 1)
  g = _write(tmp_path / "s.csv", "unit,a,b\nA,1,2\nA,2,1\nA,3,3\nA,1,1\nB,1,2\nB,2,1\n")
  with pytest.raises(DataError, match=r"too short for data.lags=2: 1 unit\(s\) have fewer than 3 rows: 'B' \(2 rows\)"):
    data.make_windows(data.read_panel(g, unit_column="unit"), 2)
  h = _write(tmp_path / "u.csv", "unit,a,b\nA,1,2\nA,2,1\nA,3,3\nB,1,2\nB,1,1\nB,1,3\n")
  with pytest.raises(DataError, match=r"\['a'\] are constant within unit 'B'"):
    data.make_windows(data.read_panel(h, unit_column="unit"), 1, "unit")
  with pytest.raises(DataError, match="no such file"):
    data.read_panel(str(tmp_path / "missing.csv"))


def test_overflow_and_underflow_are_named_not_zeroed_or_called_constant(tmp_path):
  """A column near 1e200 (its variance overflows float64: normalising would zero it) and one near 1e-300 (its
  variance underflows: it would be called constant) are refused before any window is built, with the fix."""
  rows = "".join(f"{i % 3 + 1},{(i % 4 + 1) * 1e200},{(i % 5 + 1) * 1e-300},{i % 7}\n" for i in range(20))
  f = _write(tmp_path / "scale.csv", "a,big,tiny,c\n" + rows)
  panel = data.read_panel(f)
  with pytest.raises(DataError, match=r"\['big'\] overflow \(values up to 4e\+200.*divide them by a power of ten"):
    data.make_windows(panel, 1)
  g = _write(tmp_path / "tiny.csv", "a,tiny,c\n" + "".join(r.split(",", 2)[0] + "," + r.split(",", 2)[2]
                                                          for r in rows.splitlines(True)))
  with pytest.raises(DataError, match=r"\['tiny'\] vary .* underflows to 0 in float64.*multiply them"):
    data.make_windows(data.read_panel(g), 1)
  h = _write(tmp_path / "f32.csv", "a,b\n" + "".join(f"{i % 3},{(i % 4 + 1) * 1e39}\n" for i in range(20)))
  data.make_windows(data.read_panel(h), 1)                       # normalised: fine in float32
  with pytest.raises(DataError, match=r"\['b'\] overflow .*normalise='none'"):
    data.make_windows(data.read_panel(h), 1, "none")


def test_too_few_windows_and_one_column_are_refused(tmp_path):
  f = _write(tmp_path / "five.csv", "a,b\n1,2\n2,1\n3,3\n1,1\n2,5\n")
  with pytest.raises(DataError, match=r"2 window\(s\) of 3 lags give 2 for training and 0 for validation.*need >= 10 "
                                      r"for training and >= 1 for validation"):
    data.make_windows(data.read_panel(f), 3, val_fraction=0.2)
  rng = np.random.default_rng(0)
  p = data.Panel([rng.normal(size=(14, 2))], ["a", "b"], ["u"], "t")
  with pytest.raises(DataError, match=r"0 for validation"):
    data.make_windows(p, 3, val_fraction=0.05)                  # floor(0.05 * 11) = 0 validation windows
  assert data.make_windows(p, 3).x.shape[0] == 11
  g = _write(tmp_path / "one.csv", "a\n1\n2\n3\n")
  with pytest.raises(DataError, match=r"1 variable column \(a\); causal discovery needs at least 2 variables"):
    data.make_windows(data.read_panel(g), 1)


def test_truth_files(tmp_path):
  variables = ["G1", "G2", "G3"]
  f = _write(tmp_path / "gt.txt", "G2\tG1\t1\nG1\tG3\t1\nG3\tG2\t0\n")
  t = data.read_truth(f, variables)
  assert t[1, 0] == 1 and t[0, 2] == 1 and t.sum() == 2
  m = _write(tmp_path / "m.csv", "0,1,0\n0,0,1\n0,0,0\n")
  assert data.read_truth(m, variables)[0, 1] == 1
  with pytest.raises(DataError, match="shape"):
    data.read_truth(m, ["a", "b"])


def test_split_units_like_dream3():
  p = data.Panel([np.arange(42.0).reshape(42, 1)], ["g"], ["e"], "t")
  s = data.split_units(p, 21)
  assert len(s.units) == 2 and s.units[1][0, 0] == 21
  with pytest.raises(DataError, match="not a multiple"):
    data.split_units(p, 20)


def test_synthetic_effect_sizes_are_equal():
  sim = data.four_mechanisms(np.random.default_rng(0), 40000)
  d = sim["values"]
  for src, _, kind, s in sim["edges"]:
    assert np.std(s * data.MECHANISMS[kind](d[:, src])) == pytest.approx(0.5, rel=0.05)
  assert sim["truth"].sum() == 4 and np.trace(sim["truth"]) == 0
  het = data.regime_system(np.random.default_rng(1), 40000)
  v = het["values"]
  s_r = het["edges"][0][3]
  assert np.std(s_r * v[1:-1, 0] * (v[:-2, 0] > 0)) == pytest.approx(0.5, rel=0.05)
