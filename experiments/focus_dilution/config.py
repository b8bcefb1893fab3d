"""Focus-dilution cycles: a one-layer attention-only Transformer on Markov data condenses, focuses, dilutes.

Paper: Chen, Lin, Xu, Luo, "Focus and Dilution: The Multi-stage Learning Process of Attention", ICML 2026
(arXiv 2605.01199). The model, data generator and metrics are reconstructed (see README).

Variants: tiny (V = 20 Markov chain with Zipf(1) stationary law, alpha = 0.5, d = 16, T = 16, 256 fixed sequences,
full-batch GD, init std 1e-2, 24k steps logged every 200; plus a standard-init control), small (d = 32, T = 24, 1024
sequences, more steps), full (WikiText-103 through tfds `wikitext/wikitext-103-raw-v1` or a local TinyStories /
WikiText text file via data.path; 4k-word vocabulary, d = 256, T = 128, SGD-like full-batch GD on 4096 windows).
Real-text smoke: data.source=pydoc (CPython's pydoc_data.topics, offline).
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2)
SOURCES = ("markov", "pydoc", "file", "wikitext")


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`focus_dilution` (Focus and Dilution, arXiv 2605.01199; model and metrics reconstructed)",
    claim=("one-layer attention-only Transformer, small init, full-batch GD on Zipf-Markov data: W_E rank-one "
           "share >= 0.9 with QK^T <= 2x its init; leading singular pair aligned with the closed form (\\|cos\\| "
           ">= 0.9); focus peak >= 1.3 then >= 50% dilution; rank >= 2 and a second focus peak; the "
           "standard-init control fails to condense"),
    note="condensation reproduces, the focus-dilution cycles do not on every seed (README)",
)

CLAIMS = [
    claims.Claim("condense", "S1: top-1 share of W_E at the condensation point (min over seeds), attention frozen",
                 claims.minimum("cond/share_E"), ">=", 0.9),
    claims.Claim("frozen_qk", "S1: ||W_Q W_K^T|| / init at the condensation point (max over seeds)",
                 claims.maximum("cond/qk_ratio"), "<=", 2.0),
    claims.Claim("closed_form_u", "S1: |cos(u1(Phi), pi)| at condensation, pi from the chain (min over seeds)",
                 claims.minimum("cond/cos_u_pi"), ">=", 0.9),
    claims.Claim("closed_form_v", "S1: |cos(v1(Phi), pi - 1/V)| at condensation (min over seeds)",
                 claims.minimum("cond/cos_v_pi"), ">=", 0.9),
    claims.Claim("focus", "S2: first focus-index peak after S1 (min over seeds)",
                 claims.minimum("cycle1/peak"), ">=", 1.3),
    claims.Claim("dilution", "S3: focus falls by this fraction of its excess over 1 (min over seeds)",
                 claims.minimum("cycle1/drop_frac"), ">=", 0.5),
    claims.Claim("loss_down", "S3: loss keeps decreasing during dilution (fraction of seeds)",
                 claims.mean("cycle1/loss_decreasing"), ">=", 1.0),
    claims.Claim("new_rank", "S4: numerical rank of W_E after the dilution (min over seeds)",
                 claims.minimum("cycle2/rank"), ">=", 2),
    claims.Claim("second_focus", "S4: a second focus peak after the dilution trough (min over seeds)",
                 claims.minimum("cycle2/peak"), ">=", 1.15),
    claims.Claim("control", "control: standard init (std 1/sqrt(d)) top-1 share of W_E at the same step (max)",
                 claims.maximum("control/share_E"), "<", 0.6),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  # data.source: markov | pydoc (CPython pydoc_data.topics) | file (data.path, UTF-8 text) | wikitext (tfds).
  c.data = ml_collections.ConfigDict(dict(
      source="markov", vocab=20, alpha=0.5, zipf_s=1.0, concentration=1.0, n_seq=256, length=16, path="",
      tfds_name="wikitext/wikitext-103-raw-v1", max_docs=200000, level="word", top_k=3))
  c.model = ml_collections.ConfigDict(dict(d=16, init_std=1e-2, init_gamma=0.0, value_identity=True,
                                           last_only=False))
  # method.optimizer: gd (full-batch gradient descent ~ gradient flow, the mechanistic run) | adam (robustness).
  # method.steps GD steps in all, run and logged in chunks of method.chunk (one run_loop step per chunk; tiny:
  # 24k GD steps = 120 chunks of 200). Every step sees the full batch (the data.n_seq sequences).
  c.method = ml_collections.ConfigDict(dict(
      optimizer="gd", lr=0.5, steps=24000, chunk=200, control=True, control_std=0.0, rank_rel=0.1,
      frozen_ratio=2.0, reversal=0.05, min_peak_excess=0.1))
  # The chunk loop's cadence (in chunks); no batch_size (full batch), no num_steps (method.steps // chunk), no
  # optimizer section (method.optimizer / method.lr).
  c.train = configs.train_config(optimizer=None, batch_size=None, eval_batch_size=None, num_steps=None,
                                 eval_every=None, init_from=None, log_every=1, checkpoint_every=25)
  c.tensorboard = False
  if arg.variant == "small":
    c.model.d = 32
    c.data.length = 24
    c.data.n_seq = 1024
    c.method.steps = 60000
  elif arg.variant == "full":
    c.data.source = "wikitext"
    c.data.vocab = 4096
    c.data.length = 128
    c.data.n_seq = 4096
    c.model.d = 256
    c.model.init_gamma = 1.0
    c.method.lr = 0.1
    c.method.chunk = 500
    c.method.steps = 50000
  return configs.finalize(c, validate)


def num_chunks(c) -> int:
  """The run_loop's step count: method.steps GD steps in chunks of method.chunk."""
  return c.method.steps // c.method.chunk


def validate(c):
  """Experiment-specific checks (run once by `configs.finalize`, and again by `configs.apply_overrides`)."""
  from jaxlab.errors import ConfigError
  if c.data.source not in SOURCES:
    raise ConfigError(f"config.data.source={c.data.source!r}: use one of {SOURCES}")
  if c.data.source == "file" and not c.data.path:
    raise ConfigError("config.data.source='file' needs --config.data.path=TEXT.txt (a UTF-8 text file)")
  if c.data.vocab < 2 or c.data.length < 3 or c.data.n_seq < 1:
    raise ConfigError("config.data needs vocab >= 2, length >= 3 and n_seq >= 1")
  if not 0.0 <= c.data.alpha <= 1.0:
    raise ConfigError(f"config.data.alpha={c.data.alpha} must be in [0, 1]")
  if not 1 <= c.data.top_k < c.data.vocab:
    raise ConfigError(f"config.data.top_k={c.data.top_k} must be in [1, vocab)")
  if c.model.d < 1 or (c.model.init_std <= 0 and c.model.init_gamma <= 0):
    raise ConfigError("config.model needs d >= 1 and init_std > 0 (or init_gamma > 0)")
  if c.method.optimizer not in ("gd", "adam"):
    raise ConfigError(f"config.method.optimizer={c.method.optimizer!r}: use gd or adam")
  if not c.method.lr > 0 or c.method.chunk < 1:
    raise ConfigError("config.method needs lr > 0 and chunk >= 1")
  if c.method.steps < c.method.chunk or c.method.steps % c.method.chunk:
    raise ConfigError(f"config.method.steps={c.method.steps} must be a positive multiple of config.method.chunk="
                      f"{c.method.chunk} (the GD steps are run and logged in chunks); e.g. "
                      f"--config.method.steps={max(1, round(c.method.steps / c.method.chunk)) * c.method.chunk}")
  if not c.method.reversal > 0 or not c.method.frozen_ratio > 1 or not 0 < c.method.rank_rel < 1:
    raise ConfigError("config.method needs reversal > 0, frozen_ratio > 1 and rank_rel in (0, 1)")


def sweep(arg=None):
  """Initialisation scale x learning rate (the regime knobs), plus the Adam robustness variant."""
  return ([{"model.init_std": s, "method.lr": lr} for s in (1e-3, 3e-3, 1e-2) for lr in (0.2, 0.5)]
          + [{"method.optimizer": "adam", "method.lr": 1e-3}])
