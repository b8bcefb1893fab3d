"""DF-Mamba: one shared Mamba block over a fractal pyramid of scales (Delta * r^k), zero-shot to longer inputs.

Paper: "Dynamic Fractal Mamba" (DF-Mamba), ICML 2026 (only the abstract is public; the recursion, the
coarse-graining, the losses and the aggregation are reconstructed, see README and jaxlab/nn/multiscale.py).

Variants: tiny (synthetic multi-scale series with periods 8/64/512 + AR(1) noise, 4 channels; train at
lookback 128 with 3 levels, evaluate at 128 and zero-shot at 512 with 5 levels; DF-Mamba, the
no-Delta-scaling ablation and flat Mamba trained side by side), small (more steps, d_model 64), full
(an ETT / Weather CSV from --config.data.path, lookback 96 -> zero-shot 384, horizon 96).
Tasks: `data.name` = synthetic | csv | co2 (statsmodels' weekly CO2, an offline real series) | digits
(8x8 sklearn digits as Hilbert-ordered pixel sequences, zero-shot at 16x16) | patch_camelyon (tfds, full).
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2)
MODELS = ("fractal", "no_delta_scale", "flat")


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`df_mamba` (DF-Mamba, ICML 2026; only the abstract is public, method reconstructed)",
    claim=("exact ZOH identity <= 1e-5; trained at lookback 128 on multi-scale series, zero-shot at 512: MSE <= "
           "0.85x its own at 128, <= 0.9x the no-Delta-scaling ablation, <= flat Mamba"),
    note="zero-shot length transfer does not reproduce, diagnosis in its README",
)

CLAIMS = [
    claims.Claim("zoh_identity", "exact ZOH: r steps at Delta == one step at r*Delta on window-constant input "
                 "(max abs error, fp32)", claims.maximum("zoh/max_err"), "<=", 1e-5),
    claims.Claim("longer_helps", "DF-Mamba trained at L=128, zero-shot at L=512: MSE <= 0.85x its own at 128 "
                 "(mean of 3 seeds)", claims.ratio_of_means("mse512/fractal", "mse128/fractal"), "<=", 0.85),
    claims.Claim("delta_scaling", "DF-Mamba at 512 <= 0.9x the no-Delta-scaling ablation at 512",
                 claims.ratio_of_means("mse512/fractal", "mse512/no_delta_scale"), "<=", 0.9),
    claims.Claim("vs_flat", "DF-Mamba at 512 <= flat Mamba given the 512 context",
                 claims.ratio_of_means("mse512/fractal", "mse512/flat"), "<=", 1.0),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  c.data = ml_collections.ConfigDict(dict(
      name="synthetic", path="", columns=(), periods=(8, 64, 512), channels=4, rho=0.9, sigma=0.1,
      train_series=256, train_length=1024, test_series=256, lookback=128, eval_lookbacks=(128, 512),
      horizon=32, image_size=8, eval_image_sizes=(8, 16), patch=1, data_dir=""))
  c.model = ml_collections.ConfigDict(dict(
      models=MODELS, d_model=32, d_state=8, d_conv=4, expand=1.0, ratio=2, min_len=32, tau=1.0,
      flat_layers=1, aggregate="top_down", channel_independent=True, level_dropout=0.5, chunk=0,
      scan_impl="auto", discretization="euler"))
  c.method = ml_collections.ConfigDict(dict(lambda_rec=0.1, lambda_cons=0.1, zoh_ratio=2, zoh_delta=0.05))
  c.train = configs.train_config(batch_size=16, num_steps=800, log_every=50, eval_every=0, checkpoint_every=200,
                                 optimizer=dict(learning_rate=2e-3, clip_norm=1.0))
  if arg.variant == "small":
    c.model.d_model = 32
    c.model.d_state = 16
    c.train.batch_size = 64
    c.train.num_steps = 3000
  elif arg.variant == "full":
    c.data.name = "csv"
    c.data.lookback = 96
    c.data.eval_lookbacks = (96, 384)
    c.data.horizon = 96
    c.data.channels = 7
    c.model.d_model = 128
    c.model.d_state = 16
    c.model.min_len = 12
    c.train.batch_size = 32
    c.train.num_steps = 20000
    c.train.eval_every = 2000
    c.train.checkpoint_every = 1000
    c.train.optimizer.learning_rate = 5e-4
  return configs.finalize(c, validate)


DATA_NAMES = ("synthetic", "csv", "co2", "digits", "patch_camelyon")


def validate(c):
  """Experiment-specific checks (run once by `configs.finalize`, and again by `configs.apply_overrides`).

  The full variant's CSV path (`data.path`) is checked when the data is read (`method.make_data`), so the
  variant builds without one.
  """
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from jaxlab.nn import multiscale  # pylint: disable=g-import-not-at-top
  if c.data.name not in DATA_NAMES:
    raise ConfigError(f"config.data.name={c.data.name!r}: use one of {DATA_NAMES}")
  bad = [m for m in c.model.models if m not in multiscale.MODES]
  if bad or not c.model.models:
    raise ConfigError(f"config.model.models={tuple(c.model.models)}: each must be one of {multiscale.MODES}")
  if c.model.aggregate not in ("softmax", "top_down"):
    raise ConfigError(f"config.model.aggregate={c.model.aggregate!r}: use 'softmax' or 'top_down'")
  if c.model.chunk < 0 or (c.model.chunk and c.model.min_len % c.model.chunk):
    raise ConfigError(f"config.model.chunk={c.model.chunk} must be 0 or divide model.min_len={c.model.min_len}")
  if c.model.discretization not in ("euler", "zoh"):
    raise ConfigError(f"config.model.discretization={c.model.discretization!r}: use 'euler' (Mamba) or 'zoh'")
  if c.model.discretization == "zoh" and c.model.scan_impl not in ("auto", "xla", "associative"):
    raise ConfigError(f"config.model.discretization='zoh' needs config.model.scan_impl auto, xla or associative "
                      f"(the Pallas kernels implement Mamba's Euler rule), got {c.model.scan_impl!r}")
  if c.model.ratio < 2:
    raise ConfigError(f"config.model.ratio={c.model.ratio} must be >= 2")
  if c.method.lambda_rec < 0 or c.method.lambda_cons < 0:
    raise ConfigError("config.method.lambda_rec and lambda_cons must be >= 0")
  if c.data.name in ("digits", "patch_camelyon"):
    sizes = [(s // c.data.patch) ** 2 for s in (c.data.image_size, *c.data.eval_image_sizes)]
  else:
    sizes = [c.data.lookback, *c.data.eval_lookbacks]
  for s in sizes:
    try:
      multiscale.num_levels(s, c.model.ratio, c.model.min_len)
    except ValueError as e:
      raise ConfigError(f"config.data / config.model: {e}") from None


def sweep(arg=None):
  """Loss weights x coarse-graining temperature (the reconstructed knobs)."""
  del arg
  return [{"method.lambda_rec": a, "method.lambda_cons": b, "model.tau": t}
          for a in (0.0, 0.1) for b in (0.0, 0.1) for t in (0.5, 1.0)]
