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


def _cycle_rows(**change):
  """Rows with a known cycle: condensation at 20, peak 1.6 at 40, trough 1.1 at 60, rank 1 -> 3 at 65, second
  peak 1.3 at 80; `change` replaces columns (arrays over steps 1..100)."""
  rows = _rows()
  s = np.arange(1, 101)
  cols = {"dyn/rank_E": np.where(s < 65, 1, 3)}
  cols.update(change)
  for i, r in enumerate(rows):
    for k, v in cols.items():
      r[k] = float(v[i]) if k != "dyn/rank_E" else int(v[i])
  return rows


def test_cycle_check_accepts_the_known_cycle():
  chk = stages.cycle_check(_cycle_rows())
  assert chk["present"] and chk["first"] == "max"
  assert (chk["peak_step"], chk["trough_step"], chk["second_step"]) == (40, 60, 80)
  assert chk["drop_frac"] == pytest.approx(0.5 / 0.6) and chk["second"] == pytest.approx(1.3)
  assert (chk["rank_cond"], chk["rank_peak"], chk["rank_trough"], chk["rank_second"]) == (1, 1, 1, 3)


@pytest.mark.parametrize("change,failed", [
    # attention first turns away from the frequent tokens: the first extremum is a minimum
    ({"dyn/focus": np.interp(np.arange(1, 101), [1, 25, 32, 40, 60, 80, 100], [1, 1, 0.9, 1.6, 1.1, 1.3, 1.2])},
     "first_peak"),
    # the first peak's excess is below 0.1
    ({"dyn/focus": np.interp(np.arange(1, 101), [1, 30, 40, 60, 80, 100], [1, 1, 1.08, 1.0, 1.3, 1.2])},
     "first_peak"),
    # the focus falls by only 40% of its excess
    ({"dyn/focus": np.interp(np.arange(1, 101), [1, 30, 40, 60, 80, 100], [1, 1, 1.6, 1.36, 1.5, 1.4])},
     "diluted"),
    # the loss rises during the dilution
    ({"train/loss": 3.0 - 0.01 * np.arange(1, 101) + 0.02 * (np.arange(1, 101) == 50)}, "loss_down"),
    # no new embedding directions after the dilution (rank already 3 at the trough)
    ({"dyn/rank_E": np.where(np.arange(1, 101) < 55, 1, 3)}, "rank_rises"),
    # the focus after the trough stays below 1.1
    ({"dyn/focus": np.interp(np.arange(1, 101), [1, 30, 40, 60, 80, 100], [1, 1, 1.6, 1.0, 1.08, 1.05])},
     "second_peak"),
    # W_E never condenses (share <= 0.85)
    ({"dyn/share_E": np.minimum(0.85, np.asarray([r["dyn/share_E"] for r in _rows()]))}, "s1"),
])
def test_cycle_check_rejects_each_missing_criterion(change, failed):
  chk = stages.cycle_check(_cycle_rows(**change))
  assert not chk["present"] and not chk[failed]
  others = [k for k in ("s1", "first_peak", "diluted", "loss_down", "rank_rises", "second_peak") if k != failed]
  if failed != "first_peak":        # a missing first peak leaves the later criteria unmeasured
    assert all(chk[k] for k in others), chk


def test_cycle_check_needs_a_confirmed_trough():
  chk = stages.cycle_check(_cycle_rows()[:60])          # the run ends at the trough
  assert chk["first_peak"] and chk["trough"] is None and not chk["present"]


def _reference_cycle(rows, reversal=0.05, excess=0.1, min_share=0.9, min_drop=0.5, frozen_ratio=2.0):
  """The per-chain "cycle present" definition, written out with plain loops over the rows (the reference)."""
  f = [r["dyn/focus"] for r in rows]
  crit = ("s1", "first_peak", "diluted", "loss_down", "rank_rises", "second_peak")
  out = {k: False for k in crit}
  out.update(peak_step=None, trough_step=None, second_step=None)
  end = 0                                  # the initial run of rows with attention frozen
  while end < len(rows) and rows[end]["dyn/qk_ratio"] <= frozen_ratio:
    end += 1
  if end == 0:
    out["present"] = False
    return out
  c = 0                                    # condensation point: the first row of largest W_E share there
  for i in range(end):
    if rows[i]["dyn/share_E"] > rows[c]["dyn/share_E"]:
      c = i
  out["s1"] = rows[c]["dyn/share_E"] >= min_share and rows[c]["dyn/qk_ratio"] <= frozen_ratio
  # The first extremum after c: the first row j at which the focus has moved `reversal` back from the highest
  # (lowest) value since c, that value coming after (before) the lowest (highest) one.
  p = kind = j1 = None
  for j in range(c, len(f)):
    hi = max(range(c, j + 1), key=lambda i: (f[i], -i))
    lo = min(range(c, j + 1), key=lambda i: (f[i], i))
    if f[hi] - f[j] >= reversal and hi >= lo:
      p, kind, j1 = hi, "max", j
      break
    if f[j] - f[lo] >= reversal and lo >= hi:
      p, kind, j1 = lo, "min", j
      break
  if kind != "max":
    out["present"] = False
    return out
  out["peak_step"] = rows[p]["step"]
  out["first_peak"] = f[p] - 1.0 >= excess
  t = None                                 # the trough: lowest focus since the peak, once it rose `reversal` again
  for j in range(j1, len(f)):
    lo = min(range(p, j + 1), key=lambda i: (f[i], i))
    if f[j] - f[lo] >= reversal:
      t = lo
      break
  if t is not None:
    out["trough_step"] = rows[t]["step"]
    out["diluted"] = out["first_peak"] and (f[p] - f[t]) / (f[p] - 1.0) >= min_drop
    loss = [rows[i]["train/loss"] for i in range(p, t + 1)]
    out["loss_down"] = loss[-1] < loss[0] and all(b <= a + 1e-6 for a, b in zip(loss, loss[1:]))
    r = max(range(t, len(f)), key=lambda i: (f[i], -i))   # the second peak: highest focus after the trough
    out["second_step"] = rows[r]["step"]
    out["rank_rises"] = rows[r]["dyn/rank_E"] > rows[t]["dyn/rank_E"]
    out["second_peak"] = f[r] - 1.0 >= excess
  out["present"] = all(out[k] for k in crit)
  return out


def _random_trace(rng, n=60):
  """Random rows: share up to a random level while qk is frozen for a random time (sometimes never, sometimes
  dipping back under 2 later), focus through random knots with noise, loss with random bumps, rank steps."""
  s = np.arange(1, n + 1)
  k0 = int(rng.integers(0, 20))
  qk = np.where(s <= k0, rng.uniform(0.9, 1.9, n), np.exp((s - k0) / 4.0) + 1.5)
  if rng.random() < 0.2:
    qk[int(rng.integers(k0, n))] = 1.2          # attention frozen again later: not part of the initial run
  top = rng.uniform(0.8, 1.0)
  share = np.minimum(top, 0.1 + s / max(k0, 1)) * np.where(s > k0, np.exp(-(s - k0) / 30), 1)
  knots = np.sort(rng.choice(np.arange(k0 + 2, n), size=5, replace=False))
  focus = np.interp(s, np.r_[1, k0 + 1, knots], np.r_[1.0, 1.0, rng.uniform(0.85, 1.6, 5)])
  focus = focus + rng.normal(0, 0.01, n) * (s > k0)
  loss = 3.0 - 0.01 * s
  if rng.random() < 0.4:
    loss[int(rng.integers(0, n)):] += 0.03      # a loss bump
  rank = np.minimum(1 + np.cumsum(rng.random(n) < 0.15), 16)
  return [{"step": int(a), "train/loss": float(b), "dyn/share_E": float(c), "dyn/rank_E": int(d),
           "dyn/qk_ratio": float(e), "dyn/focus": float(g)} for a, b, c, d, e, g in zip(s, loss, share, rank, qk, focus)]


def test_cycle_check_matches_the_brute_force_definition_on_random_traces():
  rng = np.random.default_rng(0)
  crit = ("present", "s1", "first_peak", "diluted", "loss_down", "rank_rises", "second_peak")
  seen = {k: set() for k in crit}
  for _ in range(400):
    rows = _random_trace(rng)
    got, ref = stages.cycle_check(rows), _reference_cycle(rows)
    for k in crit + ("peak_step", "trough_step", "second_step"):
      assert got[k] == ref[k], (k, got, ref)
    for k in crit:
      seen[k].add(bool(got[k]))
  assert all(v == {True, False} for v in seen.values()), seen   # every condition both holds and fails somewhere


def test_condensation_uses_the_initial_frozen_run():
  rows = _rows()
  for r in rows[60:70]:                    # attention dips back under 2x later: still not the frozen phase
    r["dyn/qk_ratio"] = 1.5
  assert stages.detect_stages(rows)["condensation"]["range"] == (1, 28)
  rows[0]["dyn/qk_ratio"] = 3.0            # already moved at the first row: no frozen phase, no S1
  assert stages.detect_stages(rows)["condensation"] is None and not stages.cycle_check(rows)["present"]
