"""Stage detector on synthetic metric traces with known stages, and the zig-zag filter vs a hand count."""

import numpy as np
import pytest

from jaxlab.dynamics import stages


def test_zigzag_finds_known_extrema():
  x = [0, 1, 2, 1.5, 1.0, 1.2, 1.9, 3.0, 2.0]
  assert stages.zigzag(x, 0.5) == [(2, "max"), (4, "min"), (7, "max")]  # the start is not a confirmed extremum
  assert stages.zigzag([0, 0.1, 0.05, 0.12], 0.5) == []
  with pytest.raises(ValueError):
    stages.zigzag(x, 0.0)


def _rows(n=100):
  s = np.arange(1, n + 1)
  share = np.where(s < 20, 0.2 + 0.8 * s / 20, np.maximum(0.3, 1.0 - (s - 20) / 30))
  qk = np.where(s <= 25, 1.0, np.exp((s - 25) / 5.0))
  # focus: flat, peak 1.6 at step 40, trough 1.1 at 60, second peak 1.3 at 80, then 1.2
  focus = np.interp(s, [1, 30, 40, 60, 80, 100], [1.0, 1.0, 1.6, 1.1, 1.3, 1.2])
  rank = np.where(s < 55, 1, 3)
  loss = 3.0 - 0.01 * s
  return [{"step": int(a), "train/loss": float(b), "dyn/share_E": float(c), "dyn/rank_E": int(d),
           "dyn/qk_ratio": float(e), "dyn/focus": float(f)} for a, b, c, d, e, f in zip(s, loss, share, rank, qk, focus)]


def test_detects_condensation_focus_dilution_and_next_cycle():
  st = stages.detect_stages(_rows(), frozen_ratio=2.0, reversal=0.05, min_peak_excess=0.1)
  assert st["condensation"]["step"] == 20 and st["condensation"]["range"] == (1, 28)
  c1, c2 = st["cycles"]
  assert (c1["peak_step"], c1["trough_step"]) == (40, 60)
  assert c1["drop_frac"] == pytest.approx(0.5 / 0.6)
  assert c1["loss_decreasing"] and c1["focus"] == (20, 40) and c1["dilution"] == (40, 60)
  assert c2["peak_step"] == 80 and c2["focus_peak"] == pytest.approx(1.3)
  assert st["next_cycle"] == {"start": 60, "rank": 3, "refocus": pytest.approx(1.3), "refocus_step": 80}
  # A trough at the very end (no rise after it) is not a confirmed dilution trough: no next cycle.
  rows = _rows(60)
  assert stages.detect_stages(rows)["next_cycle"] is None


def test_no_focus_means_no_cycle():
  rows = _rows()
  for r in rows:
    r["dyn/focus"] = 1.0
  st = stages.detect_stages(rows)
  assert st["cycles"] == [] and st["next_cycle"] is None
  with pytest.raises(ValueError, match="no metric rows"):
    stages.detect_stages([{"step": 1}])
