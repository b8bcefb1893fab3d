"""NAVAR-ICE experiment glue: the systems a config trains on, per-edge reports, and the synthetic checks.

Synthetic checks (the claims' pass criteria), all on member 0 (NAVAR trained on the full data):

* shape recovery of edge d_k -> y_k: the true contribution in normalised units,
  t(v) = s_k f_k(v sigma_d + mu_d) / sigma_y, and the PD are both centred over the grid;
  nRMSE = RMSE(PD_c - t_c) / std(t_c) (amplitude counts), corr = Pearson(PD, t);
* scalar scores of the four true edges: max |s - mean| / mean;
* mechanism labels (`jaxlab.causal.mechanisms`) against the expected label of each f;
* linear VAR baseline on the same windows: the sign-changing edge's |lag-1 coefficient| rank among the
  off-diagonal ones and the |corr| of its (linear) response curve with the truth;
* heterogeneity: ICE dispersion of the regime-dependent edge / that of the homogeneous edge.
"""

from __future__ import annotations

import numpy as np

from jaxlab.causal import data as data_lib
from jaxlab.causal import mechanisms, scores
from jaxlab.errors import ConfigError


def build_systems(config) -> list[dict]:
  """[{"name", "panel", "truth" (N, N) or None, "meta"}]: "main" always, "het" for synthetic data.

  Raises:
    ConfigError: a file data name without data.path (checked here, when the run starts: the full variant,
      data=csv, is a valid config before the file is given).
  """
  d = config.data
  if d.name not in ("synthetic", "panel") and not d.path:
    raise ConfigError(f"config.data.name={d.name!r} needs --config.data.path=FILE.csv (one column per variable, "
                      "header row; a folder or glob for one file per unit)")
  rng = np.random.default_rng(config.seed)
  if d.name == "synthetic":
    sim = data_lib.four_mechanisms(rng, d.length)
    out = [{"name": "main", "panel": data_lib.Panel([sim["values"]], sim["variables"], ["synthetic"], "synthetic"),
            "truth": sim["truth"], "meta": sim}]
    if d.heterogeneity:
      het = data_lib.regime_system(rng, d.length)
      out.append({"name": "het", "panel": data_lib.Panel([het["values"]], het["variables"], ["regime"], "regime"),
                  "truth": het["truth"], "meta": het})
    return out
  if d.name == "panel":
    sim = data_lib.panel_standin(rng, d.units, d.years)
    panel = data_lib.Panel(sim["units"], sim["variables"], sim["unit_names"], "panel stand-in")
    return [{"name": "main", "panel": panel, "truth": sim["truth"], "meta": sim}]
  panel = data_lib.read_panel(d.path, delimiter=d.delimiter, header=d.header, time_column=d.time_column,
                              unit_column=d.unit_column, columns=tuple(d.columns))
  panel = data_lib.split_units(panel, d.split_length)
  truth = data_lib.read_truth(d.truth_path, panel.variables) if d.truth_path else None
  return [{"name": "main", "panel": panel, "truth": truth, "meta": {}}]


def edge_report(variables, score_m, grid, pd, low, high, disp, labels, inds, max_edges: int) -> list[dict]:
  """Per-edge records (off-diagonal first by score, then self links), at most `max_edges`."""
  n = len(variables)
  order = sorted(((i, j) for i in range(n) for j in range(n)), key=lambda e: (e[0] == e[1], -score_m[0][e]))
  out = []
  for i, j in order[:max_edges]:
    out.append({
        "source": variables[i], "target": variables[j], "score": float(score_m[0][i, j]),
        "score_band": [float(np.quantile(score_m[1:, i, j], 0.05)), float(np.quantile(score_m[1:, i, j], 0.95))]
        if len(score_m) > 1 else None,
        "label": labels[i][j], "indicators": inds[i][j], "dispersion": float(disp[i, j]),
        "grid": grid[i].tolist(), "pd": pd[i, j].tolist(),
        "band_low": low[i, j].tolist() if low is not None else None,
        "band_high": high[i, j].tolist() if high is not None else None,
        "null_in_band": null_in_band(low, high, i, j)})
  return out


def null_in_band(low, high, i: int, j: int) -> bool | None:
  """Whether "no effect" (the flat, centred curve 0) lies inside edge i -> j's band over retrainings at every grid
  point, i.e. the ensemble cannot tell the edge from no effect (None without a band)."""
  if low is None or high is None:
    return None
  return bool(np.all((low[i, j] <= 0) & (high[i, j] >= 0)))


def fit_quality(windows, val_mse: float | None) -> dict:
  """The validation MSE against the mean predictor (each target's mean over the training windows), and R^2 = 1 -
  MSE / MSE(mean). Without validation windows: {}."""
  val = np.asarray(windows.val, bool)
  if val_mse is None or not val.any() or val.all():
    return {}
  y = np.asarray(windows.y, np.float64)
  of_mean = float(np.mean((y[val] - y[~val].mean(axis=0)) ** 2))
  return {"eval/val_mse_of_mean": of_mean, "eval/val_r2": 1.0 - float(val_mse) / max(of_mean, 1e-30)}


def true_curve(edge, grid_v: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
  """The true contribution of a synthetic edge (src, tgt, mechanism, scale) on the normalised grid."""
  src, tgt, kind, s = edge
  raw = grid_v * std[src] + mean[src]
  return s * data_lib.MECHANISMS[kind](raw) / std[tgt]


def curve_errors(pd_g: np.ndarray, true_g: np.ndarray) -> tuple[float, float]:
  """(nRMSE of the centred curves, Pearson corr)."""
  p, t = pd_g - pd_g.mean(), true_g - true_g.mean()
  nrmse = float(np.sqrt(np.mean((p - t) ** 2)) / t.std())
  corr = float(np.corrcoef(p, t)[0, 1])
  return nrmse, corr


def synthetic_checks(sim: dict, windows, grid, pd, score, labels, flat_tol: float) -> dict:
  """The summary keys behind the claims for the four-mechanism system."""
  out = {}
  true_scores, nrmses, corrs, correct = [], [], [], 0
  for src, tgt, kind, s in sim["edges"]:
    t = true_curve((src, tgt, kind, s), grid[src], windows.mean, windows.std)
    nrmse, corr = curve_errors(pd[src, tgt], t)
    out[f"nrmse/{kind}"], out[f"corr/{kind}"] = nrmse, corr
    out[f"score/{kind}"] = float(score[src, tgt])
    out[f"label/{kind}"] = labels[src][tgt]
    correct += labels[src][tgt] == data_lib.EXPECTED_LABEL[kind]
    nrmses.append(nrmse)
    corrs.append(corr)
    true_scores.append(score[src, tgt])
  ts = np.array(true_scores)
  out["score/max_rel_dev"] = float(np.max(np.abs(ts - ts.mean())) / ts.mean())
  out["curve/max_nrmse"] = float(max(nrmses))
  out["curve/min_corr"] = float(min(corrs))
  out["mech/correct"] = int(correct)
  return out


def var_baseline(sim: dict | None, windows, train_mask, grid, truth) -> dict:
  """Linear VAR on the training windows: AUROC, and (synthetic) the sign-changing edge's fate."""
  fit = scores.fit_linear_var(windows.x, windows.y, train_mask)
  out = {}
  if truth is not None:
    out["var/auroc"] = scores.auroc(fit["score"], truth)
  if sim is None:
    return out
  n = fit["score"].shape[0]
  off = fit["score"][~np.eye(n, dtype=bool)]
  for src, tgt, kind, s in sim["edges"]:
    if kind != "sign-changing":
      continue
    v = fit["score"][src, tgt]
    rank = float(np.mean(off < v))                       # 0 = smallest off-diagonal |coef|, 1 = largest
    line = fit["coef"][src, 0, tgt] * grid[src]
    t = true_curve((src, tgt, kind, s), grid[src], windows.mean, windows.std)
    corr = abs(float(np.corrcoef(line, t)[0, 1])) if np.std(line) > 0 else 0.0
    out.update({"var/rank_sign_changing": rank, "var/abs_corr_sign_changing": corr,
                "var/fails": bool(rank < 0.5 or corr < 0.3),
                "var/nrmse_sign_changing": curve_errors(line, t)[0]})
  return out


def label_all(grid, cpd, flat_tol: float):
  """Labels and indicators for every edge: (labels [N][N], indicators [N][N])."""
  n = cpd.shape[0]
  labels = [[None] * n for _ in range(n)]
  inds = [[None] * n for _ in range(n)]
  for i in range(n):
    for j in range(n):
      lab, ind = mechanisms.classify(grid[i], cpd[i, j], flat_tol)
      labels[i][j], inds[i][j] = lab, {k: (float(v) if isinstance(v, float) else v) for k, v in ind.items()}
  return labels, inds
