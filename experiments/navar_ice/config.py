"""NAVAR-ICE: function-valued causal influence (ICE response curves, mechanisms, dispersion) from NAVAR.

Paper: V. V. Kuskova, D. Zaytsev, M. Coppedge, "Function-Valued Causal Influence in Nonlinear Time Series",
ICML 2026 (arXiv 2605.26408), over NAVAR (Bussmann, Nys, Latre 2021). Grid, lag choice, dispersion measure
and the mechanism rules are reconstructed (see README).

Config argument: `variant=tiny|small|full,seed=S,data=NAME` with data presets
  synthetic (default of tiny/small): 4 drivers -> 4 targets with linear / threshold / saturating / sign-changing
    effects of equal size (T = 1500) + a regime-dependent vs homogeneous edge pair (heterogeneity test);
  panel: a V-Dem-like stand-in, 139 units x 50 years, 4 indicators, a regime-switch threshold effect;
  csv (default of full): your CSV(s) from --config.data.path (header row, one column per variable; several
    files = one unit each, or one file with --config.data.unit_column=country); optional --config.data.truth_path;
  vdem: csv preset for a user-supplied V-Dem country-year CSV (unit_column=country_name, per-unit lags 1-3);
  dream3: NAVAR's DREAM3 .tsv (46 trajectories x 21 steps, split_length=21, lags 2; truth from *_gt.txt);
  causeme: a CauseMe nonlinear-VAR / river-runoff text file (no header, whitespace; lags 5).
A data key the chosen data name does not read (the file keys with synthetic / panel; length, heterogeneity
outside synthetic; units, years outside panel) must keep the variant's value: setting it is a ConfigError.
Outputs: summary.json (edge_scores [sources x targets], variables, per-edge curves and labels),
response_curves.npz, response_functions.png in the workdir.
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2)
DATA_NAMES = ("synthetic", "panel", "csv", "vdem", "dream3", "causeme")
MECHS = ("linear", "threshold", "saturating", "sign-changing")

RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment=("`navar_ice` (Function-Valued Causal Influence / NAVAR + ICE, arXiv 2605.26408; curve extraction and "
                "mechanism rules reconstructed)"),
    claim=("synthetic 4 drivers -> 4 targets (linear / threshold / saturating / sign-changing, equal effect "
           "size), NAVAR-MLP: edge AUROC >= 0.95; true-edge scores within +-15% of their mean; every PD curve "
           "nRMSE <= 0.35 and corr >= 0.95; mechanisms labelled correctly on >= 2/3 seeds; a linear VAR fails on"
           " the sign-changing edge; a regime edge's ICE dispersion >= 3x a homogeneous edge's"),
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"data.length": 200, "method.steps": 30, "method.chunk": 15, "model.hidden": 8, "method.bootstrap": 1,
          "eval.grid": 9, "eval.keep_ice": 4}

CLAIMS = [
    claims.Claim("auroc", "edge AUROC (off-diagonal) >= 0.95 on every seed", claims.minimum("auroc"), ">=", 0.95),
    claims.Claim("equal_scores", "the four true edges' scalar scores within +-15% of their mean (worst seed)",
                 claims.maximum("score/max_rel_dev"), "<=", 0.15),
    claims.Claim("curve_nrmse", "every PD response curve recovered: nRMSE vs the true function <= 0.35 (worst edge, "
                 "worst seed)", claims.maximum("curve/max_nrmse"), "<=", 0.35),
    claims.Claim("curve_corr", "every PD response curve: Pearson corr with the true function >= 0.95 (worst edge, "
                 "worst seed)", claims.minimum("curve/min_corr"), ">=", 0.95),
    claims.Claim("mechanisms", "all 4 mechanisms labelled correctly on >= 2 of 3 seeds",
                 claims.count(lambda s: s["mech/correct"] == 4), ">=", 2),
    claims.Claim("var_fails", "linear VAR baseline fails on the sign-changing edge (|coef| in the bottom half or "
                 "|PD corr| < 0.3) on every seed", claims.fraction(lambda s: s["var/fails"]), ">=", 1.0),
    claims.Claim("heterogeneity", "regime-dependent edge's ICE dispersion >= 3x the homogeneous edge's (worst seed)",
                 claims.minimum("het/ratio"), ">=", 3.0),
]


# Which data names read which data keys (the others have no effect there; `validate` refuses a change to them).
FILE_DATA = ("csv", "vdem", "dream3", "causeme")
FILE_KEYS = ("path", "truth_path", "delimiter", "header", "time_column", "unit_column", "columns", "split_length")
SYNTHETIC_KEYS = ("length", "heterogeneity")   # data.name=synthetic only
PANEL_KEYS = ("units", "years")                # data.name=panel only


def get_config(arg=None):
  """`variant=tiny|small|full,seed=S,data=synthetic|panel|csv|vdem|dream3|causeme` (e.g. "tiny")."""
  return configs.finalize(_build(arg), validate)


def _build(arg):
  """The variant's config before overrides (also the reference `validate` compares mode-specific keys with)."""
  c, arg = configs.variant_config(arg, data="")
  c.data = ml_collections.ConfigDict(dict(
      name="synthetic", path="", truth_path="", delimiter="", header=True, time_column="auto", unit_column="",
      columns=(), split_length=0, lags=3, normalise="global", val_fraction=0.0, length=1500, units=139, years=50,
      heterogeneity=True))
  c.model = ml_collections.ConfigDict(dict(kind="mlp", hidden=32, layers=1))
  # Full-batch AdamW: method.steps updates in chunks of method.chunk (one logged / checkpointed step each).
  c.method = ml_collections.ConfigDict(dict(lam=0.1, steps=3000, chunk=500, bootstrap=2))
  c.eval = ml_collections.ConfigDict(dict(
      grid=25, lag=1, quantiles=(0.05, 0.95), band=(0.05, 0.95), keep_ice=40, flat_tol=0.02, max_edges=64,
      var_baseline=True, plots=True))
  # The training stage's run_loop: its cadence and the optimizer (no batch size: every step sees all windows;
  # no num_steps: the loop runs method.steps // method.chunk chunks).
  c.train = configs.train_config(
      batch_size=None, eval_batch_size=None, num_steps=None, eval_every=None, init_from=None,
      log_every=1, checkpoint_every=1, optimizer=dict(learning_rate=3e-3, weight_decay=1e-4))
  data = arg.data or ("csv" if arg.variant == "full" else "synthetic")
  c.data.name = data
  if arg.variant == "small":
    c.method.bootstrap = 9
    c.method.steps = 5000
    c.eval.grid = 50
  elif arg.variant == "full":
    c.method.bootstrap = 10
    c.method.steps = 5000
    c.eval.grid = 50
    c.data.val_fraction = 0.2 if data in ("csv", "vdem") else 0.0
  if data == "panel":
    c.data.lags = 2
    c.data.normalise = "unit"
  elif data == "vdem":
    c.data.lags = 2
    c.data.normalise = "unit"
    c.data.unit_column = "country_name"
    c.data.time_column = "year"
  elif data == "dream3":                       # official run_dream_experiments.py (ecoli1 MLP)
    c.data.lags = 2
    c.data.split_length = 21
    c.data.delimiter = "\t"
    c.model.hidden = 10
    c.method.lam = 0.188
    c.train.optimizer.learning_rate = 5e-4
    c.train.optimizer.weight_decay = 1.1e-4
  elif data == "causeme":                      # official run_causeme_experiments.py (nonlinear-VAR N-10 MLP)
    c.data.lags = 5
    c.data.header = False
    c.data.time_column = ""
    c.model.hidden = 128
    c.method.lam = 0.2014
    c.train.optimizer.learning_rate = 5e-4
    c.train.optimizer.weight_decay = 8.6e-3
  return c


def _check_mode_keys(c) -> None:
  """A data key the chosen data.name does not read must keep the variant's value (else it would be ignored)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d = c.data
  ref = _build(f"variant={c.variant},seed={c.seed},data={d.name}").data
  norm = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
  changed = lambda key: norm(d[key]) != norm(ref[key])  # noqa: E731
  files = f"data.name=csv (or the preset {', '.join(FILE_DATA[1:])})"
  for key in FILE_KEYS:
    if d.name not in FILE_DATA and changed(key):
      raise ConfigError(f"config.data.{key}={d[key]!r} has no effect with data.name={d.name!r} (generated data); "
                        f"set {files} to read a file, e.g. --config experiments/navar_ice/config.py:"
                        f"variant={c.variant},data=csv")
  for keys, name in ((SYNTHETIC_KEYS, "synthetic"), (PANEL_KEYS, "panel")):
    for key in keys:
      if d.name != name and changed(key):
        what = "reads data.path" if d.name in FILE_DATA else "generates its own data"
        raise ConfigError(f"config.data.{key}={d[key]!r} has no effect with data.name={d.name!r} ({what}); it "
                          f"belongs to data.name={name}: set that, or leave data.{key} at {ref[key]!r}")


def validate(c):
  """Experiment-specific checks (run once by `configs.finalize` and again by `configs.apply_overrides`).

  A missing data.path for a file data name is reported when the run starts (`method.build_systems`), so the
  full variant (data=csv) is a valid config before the file is given.
  """
  from jaxlab.causal import data as data_lib  # pylint: disable=g-import-not-at-top
  from jaxlab.causal import navar  # pylint: disable=g-import-not-at-top
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  d, m, e = c.data, c.method, c.eval
  if d.name not in DATA_NAMES:
    raise ConfigError(f"config.data.name={d.name!r}: use one of {DATA_NAMES}")
  _check_mode_keys(c)
  if not isinstance(d.lags, int) or d.lags < 1:
    raise ConfigError(f"config.data.lags must be an integer >= 1, got {d.lags!r}")
  if d.normalise not in data_lib.NORMALISE:
    raise ConfigError(f"config.data.normalise={d.normalise!r}: use one of {data_lib.NORMALISE}")
  if not 0.0 <= d.val_fraction < 0.9:
    raise ConfigError(f"config.data.val_fraction must be in [0, 0.9), got {d.val_fraction!r}")
  if d.split_length < 0 or (d.split_length and d.split_length <= d.lags):
    raise ConfigError(f"config.data.split_length={d.split_length} must be 0 (off) or > data.lags={d.lags}")
  if d.name == "synthetic" and d.length < 10 * d.lags + 50:
    raise ConfigError(f"config.data.length={d.length} is too short for a synthetic run; use >= {10 * d.lags + 50}")
  if c.model.kind not in navar.KINDS:
    raise ConfigError(f"config.model.kind={c.model.kind!r}: use one of {navar.KINDS}")
  if c.model.hidden < 1 or c.model.layers < 1:
    raise ConfigError("config.model.hidden and config.model.layers must be >= 1")
  if m.lam < 0:
    raise ConfigError(f"config.method.lam must be >= 0, got {m.lam!r}")
  if m.chunk < 1 or m.steps < 1 or m.steps % m.chunk:
    raise ConfigError(f"config.method.steps={m.steps} must be a positive multiple of config.method.chunk={m.chunk}")
  if c.train.optimizer.warmup_steps > m.steps:
    raise ConfigError(f"config.train.optimizer.warmup_steps={c.train.optimizer.warmup_steps} exceeds "
                      f"config.method.steps={m.steps} (the optimizer's schedule runs over method.steps updates)")
  if m.bootstrap < 0:
    raise ConfigError(f"config.method.bootstrap must be >= 0, got {m.bootstrap!r}")
  if e.grid < 7:
    raise ConfigError(f"config.eval.grid={e.grid} must be >= 7 points")
  if not 1 <= e.lag <= d.lags:
    raise ConfigError(f"config.eval.lag={e.lag} must be in [1, data.lags={d.lags}]")
  for key in ("quantiles", "band"):
    lo, hi = e[key]
    if not 0.0 <= lo < hi <= 1.0:
      raise ConfigError(f"config.eval.{key}={tuple(e[key])} must be (low, high) with 0 <= low < high <= 1")


def sweep(arg=None):
  """L1 strength x hidden width (NAVAR's main knobs)."""
  del arg
  return [{"method.lam": lam, "model.hidden": h} for lam in (0.03, 0.1, 0.3) for h in (16, 32, 64)]
