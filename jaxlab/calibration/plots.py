"""Reliability diagrams (PNG): accuracy against confidence per bin, one panel per model or shift."""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from jaxlab import plotting
from jaxlab.calibration import metrics


def reliability_diagram(panels: Mapping[str, tuple], path: str, n_bins: int = 15, title: str | None = None) -> str:
  """Writes one reliability panel per entry of `panels` = {name: (conf, correct[, weights])}.

  Each panel: bars of per-bin accuracy, the diagonal (perfect calibration), the gap to the bin's mean
  confidence shaded, the share of the data per bin underneath, and the ECE in the title."""
  plt = plotting.plt
  n = len(panels)
  fig, axes = plt.subplots(2, n, figsize=(3.2 * n, 4.2), squeeze=False, gridspec_kw={"height_ratios": [3, 1]},
                           sharex=True)
  for col, (name, args) in enumerate(panels.items()):
    conf, correct = args[0], args[1]
    weights = args[2] if len(args) > 2 else None
    r = {k: np.asarray(v) for k, v in metrics.reliability(conf, correct, weights, n_bins).items()}
    e = float(metrics.ece(conf, correct, weights, n_bins))
    left, width = r["edges"][:-1], np.diff(r["edges"])
    ok = np.isfinite(r["acc"])
    ax = axes[0, col]
    ax.bar(left[ok], r["acc"][ok], width=width[ok], align="edge", color="tab:blue", alpha=0.75, edgecolor="k",
           linewidth=0.4, label="accuracy")
    ax.bar(left[ok], (r["conf"] - r["acc"])[ok], bottom=r["acc"][ok], width=width[ok], align="edge",
           color="tab:red", alpha=0.3, label="gap to confidence")
    ax.plot([0, 1], [0, 1], "k--", linewidth=0.8)
    ax.set(xlim=(0, 1), ylim=(0, 1), title=f"{name}\nECE {e:.4f}")
    if col == 0:
      ax.set_ylabel("accuracy")
      ax.legend(fontsize=7, loc="upper left")
    axes[1, col].bar(left, r["share"], width=width, align="edge", color="0.5")
    axes[1, col].set_xlabel("confidence")
    if col == 0:
      axes[1, col].set_ylabel("share")
  if title:
    fig.suptitle(title)
  return plotting.save(fig, os.path.dirname(path) or ".", os.path.basename(path))
