"""Multivariate time series for causal discovery: CSV / panel readers, windows, normalisation, synthetic systems.

A data set is a `Panel`: one or more *units* (a single series, the countries of a panel, the trajectories of a
DREAM3 experiment), each a (T_u, N) array over the same N variables. NAVAR sees windows: the window ending at
row t of a unit has inputs `values[t - K : t]` (K lags, oldest first) and target `values[t]`; windows never
cross a unit boundary (NAVAR's `split_timeseries`, which the official code needs for concatenated panels).

Readers raise `jaxlab.errors.DataError` naming the file, line and column of a missing or non-numeric cell,
the constant columns, and the units too short for the chosen lags.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import os
from typing import Sequence

import numpy as np

from jaxlab.errors import DataError

MISSING = ("", "na", "nan", "n/a", "null", "none", "?", "-", ".", "missing")
TIME_NAMES = ("time", "date", "datetime", "timestamp", "year", "t")
NORMALISE = ("global", "unit", "none")


@dataclasses.dataclass
class Panel:
  """Raw multivariate series.

  Attributes:
    units: list of (T_u, N) float64 arrays (rows in time order).
    variables: the N variable names.
    unit_names: one name per unit.
    source: where the data came from (for error messages).
  """
  units: list
  variables: list
  unit_names: list
  source: str = ""

  @property
  def n(self) -> int:
    return len(self.variables)


@dataclasses.dataclass
class Windows:
  """NAVAR's inputs.

  Attributes:
    x: (B, N, K) float32 lagged inputs, K lags oldest first (x[..., -1] is lag 1).
    y: (B, N) float32 targets.
    unit: (B,) int32 unit index of each window.
    val: (B,) bool, True for validation windows (the last `val_fraction` of each unit's windows).
    mean, std: (N,) normalisation statistics of the global mode (unit mode: per-unit, (U, N)).
    variables: names.
  """
  x: np.ndarray
  y: np.ndarray
  unit: np.ndarray
  val: np.ndarray
  mean: np.ndarray
  std: np.ndarray
  variables: list


# ----------------------------------------------------------------------------------------------- reading


def resolve_paths(path: str) -> list[str]:
  """A file, a folder (its *.csv / *.tsv / *.txt files, sorted), a glob pattern, or a comma-separated list.

  Raises:
    DataError: when nothing matches.
  """
  if not path:
    raise DataError("no data path given: pass --config.data.path=FILE.csv (or a folder / glob of CSVs, one per unit)")
  out = []
  for part in [p.strip() for p in path.split(",") if p.strip()]:
    if os.path.isdir(part):
      found = sorted(f for ext in ("csv", "tsv", "txt") for f in glob.glob(os.path.join(part, f"*.{ext}")))
      if not found:
        raise DataError(f"{part}: folder holds no .csv/.tsv/.txt files")
      out += found
    elif any(ch in part for ch in "*?["):
      found = sorted(glob.glob(part))
      if not found:
        raise DataError(f"{part}: pattern matches no file")
      out += found
    elif os.path.isfile(part):
      out.append(part)
    else:
      raise DataError(f"{part}: no such file (pass --config.data.path=FILE.csv)")
  return out


def read_panel(path: str, *, delimiter: str = "", header: bool = True, time_column: str = "auto",
               unit_column: str = "", columns: Sequence[str] = ()) -> Panel:
  """Reads one CSV, or several (one unit per file), into a Panel.

  Args:
    path: see `resolve_paths`.
    delimiter: field separator ("" = by extension: tab for .tsv, whitespace for .txt without commas, else comma).
    header: whether the first row names the columns (False: variables are called x0, x1, ...).
    time_column: a column to drop ("auto": a first column named time/date/year/...; "" keeps every column).
    unit_column: a column naming the unit of each row (a panel in one file, e.g. "country"); rows are grouped
      by it in order of first appearance, keeping their file order.
    columns: the variables to keep (default: every other column).

  Returns:
    The Panel (not yet checked for length; see `check_panel`).

  Raises:
    DataError: on a missing / non-numeric / non-finite cell (file, line, column), ragged rows, unknown
      columns, mismatching headers across files, or an empty file.
  """
  paths = resolve_paths(path)
  units, names, variables = [], [], None
  for p in paths:
    file_units, file_names, file_vars = _read_one(p, delimiter, header, time_column, unit_column, columns)
    if variables is not None and file_vars != variables:
      raise DataError(f"{p}: columns {file_vars} differ from {paths[0]}'s {variables}; every file must have the "
                      "same variables")
    variables = file_vars
    units += file_units
    stem = os.path.splitext(os.path.basename(p))[0]
    names += [f"{stem}/{u}" if unit_column and len(paths) > 1 else (u if unit_column else stem) for u in file_names]
  return Panel(units=units, variables=list(variables), unit_names=names, source=path)


def _read_one(path, delimiter, header, time_column, unit_column, columns):
  delim = delimiter or ("\t" if path.endswith(".tsv") else "")
  with open(path, newline="") as f:
    text = f.read()
  lines = text.splitlines()
  if not delim:
    first = next((ln for ln in lines if ln.strip()), "")
    delim = "," if ("," in first or path.endswith(".csv")) else None  # None: any whitespace
  if delim is None:
    rows = [ln.split() for ln in lines]
  else:
    rows = list(csv.reader(lines, delimiter=delim))
  rows = [(i + 1, [c.strip() for c in r]) for i, r in enumerate(rows) if any(c.strip() for c in r)]
  if not rows:
    raise DataError(f"{path}: the file is empty")
  if header:
    head = [h.strip().strip('"') for h in rows[0][1]]
    body = rows[1:]
  else:
    head = [f"x{j}" for j in range(len(rows[0][1]))]
    body = rows
  if len(set(head)) != len(head):
    raise DataError(f"{path}, line 1: duplicate column names {sorted({h for h in head if head.count(h) > 1})}")
  drop = set()
  if unit_column:
    if unit_column not in head:
      raise DataError(f"{path}: unit column {unit_column!r} is not in the header {head}")
    drop.add(head.index(unit_column))
  if time_column == "auto":
    if head and head[0].lower() in TIME_NAMES and head[0] != unit_column:
      drop.add(0)
  elif time_column:
    if time_column not in head:
      raise DataError(f"{path}: time column {time_column!r} is not in the header {head}")
    drop.add(head.index(time_column))
  keep = [j for j in range(len(head)) if j not in drop]
  if columns:
    missing = [c for c in columns if c not in head]
    if missing:
      raise DataError(f"{path}: unknown columns {missing}; the header has {head}")
    keep = [head.index(c) for c in columns]
  if not keep:
    raise DataError(f"{path}: no variable columns left (header {head})")
  if not body:
    raise DataError(f"{path}: no data rows after the header")
  values = np.empty((len(body), len(keep)), np.float64)
  unit_of_row = []
  for r, (line, row) in enumerate(body):
    if len(row) != len(head):
      raise DataError(f"{path}, line {line}: {len(row)} fields but the header has {len(head)}")
    for j, col in enumerate(keep):
      cell = row[col].strip().strip('"')
      if cell.lower() in MISSING:
        raise DataError(f"{path}, line {line}, column {head[col]!r}: missing value {cell!r}; NAVAR needs complete "
                        "series (impute or drop the row / unit first)")
      try:
        v = float(cell)
      except ValueError:
        raise DataError(f"{path}, line {line}, column {head[col]!r}: {cell!r} is not a number") from None
      if not np.isfinite(v):
        raise DataError(f"{path}, line {line}, column {head[col]!r}: non-finite value {cell!r}")
      values[r, j] = v
    if unit_column:
      unit_of_row.append(row[head.index(unit_column)].strip().strip('"'))
  variables = [head[j] for j in keep]
  if not unit_column:
    return [values], [os.path.splitext(os.path.basename(path))[0]], variables
  order = list(dict.fromkeys(unit_of_row))
  ids = np.array([order.index(u) for u in unit_of_row])
  return [values[ids == k] for k in range(len(order))], order, variables


def split_units(panel: Panel, length: int) -> Panel:
  """Cuts every unit into consecutive pieces of `length` rows (concatenated trajectories, e.g. DREAM3's 21).

  Raises:
    DataError: when a unit's length is not a multiple of `length`.
  """
  if length <= 0:
    return panel
  units, names = [], []
  for u, name in zip(panel.units, panel.unit_names):
    if len(u) % length:
      raise DataError(f"{panel.source}: unit {name!r} has {len(u)} rows, not a multiple of "
                      f"data.split_length={length}")
    for k in range(len(u) // length):
      units.append(u[k * length:(k + 1) * length])
      names.append(f"{name}#{k}")
  return dataclasses.replace(panel, units=units, unit_names=names)


def _std(values: np.ndarray) -> np.ndarray:
  with np.errstate(over="ignore", under="ignore", invalid="ignore"):
    return values.std(0)


def _check_scale(panel: Panel, values: np.ndarray, normalise: str, where: str) -> None:
  """Refuses columns whose scale the float64 statistics or the float32 windows cannot hold: a spread whose
  square overflows (normalising would set the column to zeros), a non-zero spread whose square underflows
  (the column would be called constant), and, with normalise="none", values beyond float32's range."""
  std, spread = _std(values), np.ptp(values, 0)
  big = np.abs(values).max(0)
  over = [v for v, s in zip(panel.variables, std) if not np.isfinite(s)]
  if normalise == "none":
    over += [v for v, b in zip(panel.variables, big) if b > np.finfo(np.float32).max and v not in over]
  if over:
    top = max(float(b) for v, b in zip(panel.variables, big) if v in over)
    raise DataError(f"{panel.source}: column(s) {over}{where} overflow (values up to {top:.3g}: their variance, "
                    "or with data.normalise='none' the float32 inputs, exceed the floating-point range); "
                    "divide them by a power of ten before loading")
  under = [(v, r) for v, s, r in zip(panel.variables, std, spread) if s == 0 and r > 0]
  if under:
    raise DataError(f"{panel.source}: column(s) {[v for v, _ in under]}{where} vary (by up to "
                    f"{max(r for _, r in under):.3g}) but their variance underflows to 0 in float64, so they "
                    "cannot be normalised; multiply them by a power of ten before loading")


def check_panel(panel: Panel, lags: int, normalise: str = "global") -> None:
  """Checks that every unit is long enough for `lags`, that no variable is constant, and that every column's
  scale survives normalisation (no overflow or underflow of its variance, float32 range for normalise="none").

  Raises:
    DataError: naming the short units (with their row counts), the constant columns, or the columns out of
      range (and the unit, for per-unit normalisation), with the fix.
  """
  need = lags + 1
  short = [(n, len(u)) for n, u in zip(panel.unit_names, panel.units) if len(u) < need]
  if short:
    shown = ", ".join(f"{n!r} ({t} rows)" for n, t in short[:5]) + (" ..." if len(short) > 5 else "")
    raise DataError(f"{panel.source}: too short for data.lags={lags}: {len(short)} unit(s) have fewer than "
                    f"{need} rows: {shown}; lower data.lags or drop these units")
  allv = np.concatenate(panel.units, 0)
  _check_scale(panel, allv, normalise, "")
  const = [v for v, s in zip(panel.variables, _std(allv)) if s == 0]
  if const:
    raise DataError(f"{panel.source}: constant column(s) {const} carry no information and cannot be "
                    "normalised; drop them with --config.data.columns")
  if normalise == "unit":
    for name, u in zip(panel.unit_names, panel.units):
      _check_scale(panel, u, normalise, f" within unit {name!r}")
      c = [v for v, s in zip(panel.variables, _std(u)) if s == 0]
      if c:
        raise DataError(f"{panel.source}: column(s) {c} are constant within unit {name!r}, so data.normalise="
                        "'unit' cannot scale them; use data.normalise='global' or drop the unit")
  if panel.n < 2:
    raise DataError(f"{panel.source}: {panel.n} variable column ({', '.join(panel.variables)}); causal discovery "
                    "needs at least 2 variables (one column per variable, a header row)")


def read_truth(path: str, variables: Sequence[str]) -> np.ndarray:
  """A ground-truth graph: DREAM3-style lines `CAUSE<TAB>EFFECT<TAB>0/1` or an N x N 0/1 matrix (rows = causes).

  Returns:
    (N, N) float array, [i, j] = 1 for a link i -> j.

  Raises:
    DataError: unknown variable names, a matrix of the wrong shape, or unparsable lines.
  """
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such ground-truth file")
  n = len(variables)
  index = {v: i for i, v in enumerate(variables)}
  with open(path) as f:
    rows = [(i + 1, ln.replace(",", " ").split()) for i, ln in enumerate(f) if ln.strip()]
  if rows and rows[0][1][0] in index:
    out = np.zeros((n, n))
    for line, r in rows:
      if len(r) != 3 or r[0] not in index or r[1] not in index:
        raise DataError(f"{path}, line {line}: expected 'CAUSE EFFECT 0/1' with known variables, got {r}")
      out[index[r[0]], index[r[1]]] = float(r[2])
    return out
  try:
    mat = np.array([[float(c) for c in r] for _, r in rows])
  except ValueError:
    raise DataError(f"{path}: neither 'CAUSE EFFECT 0/1' lines nor a numeric N x N matrix") from None
  if mat.shape != (n, n):
    raise DataError(f"{path}: ground-truth matrix has shape {mat.shape}, the data has {n} variables")
  return (mat != 0).astype(np.float64)


# ------------------------------------------------------------------------------------------- windowing


MIN_TRAIN_WINDOWS = 10   # fewer training windows than this fit nothing worth reporting


def make_windows(panel: Panel, lags: int, normalise: str = "global", val_fraction: float = 0.0) -> Windows:
  """Normalises the panel and cuts it into lag windows that never cross a unit boundary.

  Normalisation statistics come from each unit's training rows (all rows before its first validation target).

  Args:
    panel: the data.
    lags: K >= 1.
    normalise: "global" (z-score each variable over all units), "unit" (z-score within each unit: removes
      unit fixed effects, e.g. country levels) or "none".
    val_fraction: the last fraction of each unit's windows held out for validation (0 = none).

  Returns:
    Windows.
  """
  if normalise not in NORMALISE:
    raise DataError(f"normalise={normalise!r}: use one of {NORMALISE}")
  check_panel(panel, lags, normalise)
  n_val = [int(np.floor(val_fraction * (len(u) - lags))) for u in panel.units]
  total = sum(len(u) - lags for u in panel.units)
  if total - sum(n_val) < MIN_TRAIN_WINDOWS or (val_fraction > 0 and sum(n_val) < 1):
    raise DataError(
        f"{panel.source}: {total} window(s) of {lags} lags give {total - sum(n_val)} for training and {sum(n_val)} "
        f"for validation (data.val_fraction={val_fraction:g}); need >= {MIN_TRAIN_WINDOWS} for training"
        f"{' and >= 1 for validation' if val_fraction > 0 else ''}: give longer series or more units, lower "
        "data.lags, or change data.val_fraction")
  train_rows = [u[: len(u) - nv] for u, nv in zip(panel.units, n_val)]
  if normalise == "global":
    allv = np.concatenate(train_rows, 0)
    mean, std = allv.mean(0), allv.std(0)
    std = np.where(std > 0, std, 1.0)
    stats = [(mean, std)] * len(panel.units)
  elif normalise == "unit":
    stats = [(r.mean(0), np.where(r.std(0) > 0, r.std(0), 1.0)) for r in train_rows]
    mean, std = np.stack([s[0] for s in stats]), np.stack([s[1] for s in stats])
  else:
    mean, std = np.zeros(panel.n), np.ones(panel.n)
    stats = [(mean, std)] * len(panel.units)
  xs, ys, us, vs = [], [], [], []
  for k, (u, (m, s), nv) in enumerate(zip(panel.units, stats, n_val)):
    z = (u - m) / s
    t = np.arange(lags, len(u))
    idx = t[:, None] + np.arange(-lags, 0)[None, :]          # (W, K): rows t-K .. t-1
    xs.append(np.transpose(z[idx], (0, 2, 1)))              # (W, N, K)
    ys.append(z[t])
    us.append(np.full(len(t), k, np.int32))
    v = np.zeros(len(t), bool)
    if nv:
      v[-nv:] = True
    vs.append(v)
  return Windows(x=np.concatenate(xs).astype(np.float32), y=np.concatenate(ys).astype(np.float32),
                 unit=np.concatenate(us), val=np.concatenate(vs), mean=mean, std=std,
                 variables=list(panel.variables))


def write_csv(path: str, values: np.ndarray, variables: Sequence[str], unit_names: Sequence[str] | None = None,
              unit_column: str = "unit") -> None:
  """Writes (T, N) values (or a list of units with a unit column) as a CSV with a header row."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    if unit_names is None:
      w.writerow(list(variables))
      w.writerows([[f"{v:.6g}" for v in row] for row in np.asarray(values)])
    else:
      w.writerow([unit_column, *variables])
      for name, u in zip(unit_names, values):
        w.writerows([[name, *[f"{v:.6g}" for v in row]] for row in np.asarray(u)])


# ------------------------------------------------------------------------------------ synthetic systems

MECHANISMS = {
    "linear": lambda x: x,
    "threshold": lambda x: np.maximum(0.0, x - 0.5),
    "saturating": lambda x: np.tanh(2.0 * x),
    "sign-changing": lambda x: x ** 2 - 1.0,
}
# The label the mechanism classifier should give each true function.
EXPECTED_LABEL = {"linear": "monotone", "threshold": "threshold", "saturating": "saturating",
                  "sign-changing": "sign-changing"}


def gaussian_std(f, points: int = 201) -> float:
  """std of f(Z), Z ~ N(0, 1), by Gauss-Hermite quadrature."""
  z, w = np.polynomial.hermite_e.hermegauss(points)
  w = w / w.sum()
  m = np.sum(w * f(z))
  return float(np.sqrt(np.sum(w * (f(z) - m) ** 2)))


def _ar1(rng, t, n, phi):
  """n unit-variance AR(1) drivers of length t (stationary start)."""
  e = rng.normal(size=(t, n))
  d = np.empty((t, n))
  d[0] = e[0]
  for i in range(1, t):
    d[i] = phi * d[i - 1] + np.sqrt(1 - phi ** 2) * e[i]
  return d


def four_mechanisms(rng: np.random.Generator, length: int = 1500, effect_std: float = 0.5, driver_ar: float = 0.5,
                    target_ar: float = 0.3, noise: float = 0.3, burn_in: int = 200,
                    mechanisms: Sequence[str] = tuple(MECHANISMS)) -> dict:
  """The four-mechanism benchmark (reconstructed, after arXiv 2605.26408's synthetic study): drivers d_k (unit-variance AR(1)) and targets y_k = a y_k,t-1 + s_k f_k(d_k,t-1) + noise.

  Each s_k makes std(s_k f_k(d)) = effect_std under the stationary driver law N(0, 1), so the four true edges
  have equal scalar influence.

  Returns:
    {"values": (length, 2M) with columns d_0..d_{M-1}, y_0..y_{M-1}; "variables"; "truth": (2M, 2M) cross-edge
    adjacency (no self links); "edges": [(source, target, mechanism, scale)]}.
  """
  m = len(mechanisms)
  t = length + burn_in
  d = _ar1(rng, t, m, driver_ar)
  y = np.zeros((t, m))
  scales = [effect_std / gaussian_std(MECHANISMS[k]) for k in mechanisms]
  eps = rng.normal(size=(t, m)) * noise
  for i in range(1, t):
    y[i] = target_ar * y[i - 1] + np.array([s * MECHANISMS[k](d[i - 1, j])
                                            for j, (k, s) in enumerate(zip(mechanisms, scales))]) + eps[i]
  values = np.concatenate([d, y], 1)[burn_in:]
  truth = np.zeros((2 * m, 2 * m))
  edges = []
  for j, (k, s) in enumerate(zip(mechanisms, scales)):
    truth[j, m + j] = 1
    edges.append((j, m + j, k, s))
  return {"values": values, "variables": [f"d{j}" for j in range(m)] + [f"y{j}" for j in range(m)],
          "truth": truth, "edges": edges}


def regime_system(rng: np.random.Generator, length: int = 1500, effect_std: float = 0.5, driver_ar: float = 0.5,
                  target_ar: float = 0.3, noise: float = 0.3, burn_in: int = 200) -> dict:
  """Heterogeneity test: a regime-dependent edge and a homogeneous one with equal effect size.

  r_t = a r_{t-1} + s_r d_r,t-1 * 1[d_r,t-2 > 0] + noise   (the slope in d_r,t-1 is switched on in the high regime
  set by the driver's own second lag), h_t = a h_{t-1} + s_h d_h,t-1 + noise (the same slope in every state).

  Returns:
    {"values": (length, 4) columns d_r, d_h, r, h; "variables"; "truth"; "edges": [(src, tgt, kind, scale)]}.
  """
  t = length + burn_in
  d = _ar1(rng, t, 2, driver_ar)
  # std of d_{t-1} 1[d_{t-2} > 0] under the stationary AR(1) law: E[x^2 1[z>0]] = 1/2, E[x 1[z>0]] = phi/sqrt(2 pi).
  m1 = driver_ar / np.sqrt(2 * np.pi)
  s_r = effect_std / np.sqrt(0.5 - m1 ** 2)
  s_h = effect_std
  out = np.zeros((t, 2))
  eps = rng.normal(size=(t, 2)) * noise
  for i in range(2, t):
    out[i, 0] = target_ar * out[i - 1, 0] + s_r * d[i - 1, 0] * (d[i - 2, 0] > 0) + eps[i, 0]
    out[i, 1] = target_ar * out[i - 1, 1] + s_h * d[i - 1, 1] + eps[i, 1]
  values = np.concatenate([d, out], 1)[burn_in:]
  truth = np.zeros((4, 4))
  truth[0, 2] = truth[1, 3] = 1
  return {"values": values, "variables": ["d_regime", "d_homog", "regime", "homog"], "truth": truth,
          "edges": [(0, 2, "regime", s_r), (1, 3, "homogeneous", s_h)]}


def panel_standin(rng: np.random.Generator, units: int = 139, years: int = 50, noise: float = 0.3,
                  cut: float = 0.5) -> dict:
  """A V-Dem-like panel stand-in: units x years of 4 indicators with a regime-switch threshold effect.

  civil_society (AR(1) with a unit level) -> electoral: threshold, effect only above `cut` (a regime switch);
  electoral -> liberal: saturating; liberal -> participatory: linear. Every indicator is persistent (AR 0.5-0.6).
  A synthetic stand-in for the V-Dem case study (the real V-Dem CSV is user-supplied).

  Returns:
    {"units": list of (years, 4) arrays, "unit_names", "variables", "truth", "edges"}.
  """
  names = ["civil_society", "electoral", "liberal", "participatory"]
  out = []
  burn = 30
  for _ in range(units):
    level = rng.normal() * 0.5
    x = np.zeros((years + burn, 4))
    e = rng.normal(size=(years + burn, 4))
    for t in range(1, years + burn):
      cs = x[t - 1, 0]
      x[t, 0] = level * 0.4 + 0.6 * cs + 0.8 * e[t, 0]
      x[t, 1] = 0.5 * x[t - 1, 1] + 1.2 * max(0.0, cs - cut) + noise * e[t, 1]
      x[t, 2] = 0.5 * x[t - 1, 2] + 0.8 * np.tanh(1.5 * x[t - 1, 1]) + noise * e[t, 2]
      x[t, 3] = 0.5 * x[t - 1, 3] + 0.5 * x[t - 1, 2] + noise * e[t, 3]
    out.append(x[burn:])
  truth = np.zeros((4, 4))
  truth[0, 1] = truth[1, 2] = truth[2, 3] = 1
  return {"units": out, "unit_names": [f"country_{k:03d}" for k in range(units)], "variables": names,
          "truth": truth, "edges": [(0, 1, "threshold", 1.2), (1, 2, "saturating", 0.8), (2, 3, "linear", 0.5)]}
