"""Plots written as PNG files (matplotlib, headless Agg backend)."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxlab import metrics as metrics_lib  # noqa: E402


def plot_curves(workdirs: Sequence[str], keys: Sequence[str], path: str, labels: Sequence[str] | None = None,
                title: str | None = None, logy: bool = False,
                levels: Mapping[str, Sequence[tuple[float, str]]] | None = None) -> str | None:
  """One panel per metric key, one line per run (read from each workdir's metrics.jsonl).

  Args:
    workdirs: run directories.
    keys: metric names, e.g. ("train/loss", "eval/accuracy"); keys no run logged are skipped.
    path: output PNG path.
    labels: legend labels (default: workdir basenames).
    title: figure title.
    logy: log-scale y axes.
    levels: {key: [(value, label), ...]}: dashed horizontal lines on that key's panel (e.g. a claim's target).

  Returns:
    The path written, or None when no run logged any of the keys.
  """
  rows = [metrics_lib.read_metrics(w) for w in workdirs]
  keys = [k for k in keys if any(k in r for run in rows for r in run)]
  if not keys:
    return None
  labels = list(labels) if labels else [os.path.basename(os.path.normpath(w)) for w in workdirs]
  fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.4), squeeze=False)
  for ax, key in zip(axes[0], keys):
    for run, label in zip(rows, labels):
      pts = [(r["step"], r[key]) for r in run if r.get(key) is not None]
      if pts:
        ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None, label=label)
    for value, text in (levels or {}).get(key, ()):
      ax.axhline(value, color="k", ls="--", lw=1, label=text)
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(key)
    if logy:
      ax.set_yscale("log")
    ax.grid(alpha=0.3)
  for ax in axes[0]:
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  return save(fig, os.path.dirname(os.path.abspath(path)), os.path.basename(path))


def save(fig, out_dir: str, name: str, dpi: int = 110) -> str:
  """Lays out, writes `out_dir/name` (folders created) and closes a figure; returns the path."""
  fig.tight_layout()
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, name)
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path
