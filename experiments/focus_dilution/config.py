"""Focus-dilution cycles: a one-layer attention-only Transformer on Markov data condenses, focuses, dilutes.

Paper: Chen, Lin, Xu, Luo, "Focus and Dilution: The Multi-stage Learning Process of Attention", ICML 2026
(arXiv 2605.01199). The model, data generator and metrics are reconstructed (see README).

Variants: tiny (V = 20 Markov chain with Zipf(1) stationary law, alpha = 0.5, d = 16, T = 16, 256 fixed sequences,
full-batch GD with lr 0.5 from init std 1e-2: the trained-W_V model for 44k GD steps, logged every 200, a W_V = I
companion run of 4k steps for the first stage's closed form, and a standard-init control), small (d = 32, T = 24,
1024 sequences, more steps), full (WikiText-103 through tfds `wikitext/wikitext-103-raw-v1` or a local TinyStories
/ WikiText text file via data.path; 4k-word vocabulary, d = 256, T = 128, SGD-like full-batch GD on 4096 windows).
Real-text smoke: data.source=pydoc (CPython's pydoc_data.topics, offline).
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = tuple(range(300, 312))   # 12 fresh random Markov chains (issue 24); calibration used seeds 100+
SOURCES = ("markov", "pydoc", "file", "wikitext")
CYCLE_MIN = 10   # chains (of the 12) with a cycle: a one-sided binomial test against p = 0.5 gives p = 0.019


RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`focus_dilution` (Focus and Dilution, arXiv 2605.01199; model and metrics reconstructed)",
    claim=("one-layer attention-only Transformer, small init, full-batch GD on Zipf-Markov data. W_V = I: W_E "
           "rank-one share >= 0.9 with QK^T <= 2x its init, Phi's leading singular pair aligned with the closed "
           "form (\\|cos\\| >= 0.9), the standard-init control does not condense; W_V trained (the "
           "predecessor's model): condensation, a focus peak, >= 50% dilution with the loss falling, new W_E "
           "directions and a second focus on >= 10 of 12 fresh chains"),
    note="the cycle claim counts the fresh chains (of 12) with the whole cycle; per-chain verdicts in the README",
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shrunk, every stage and claim.
CANARY = {"method.steps": 240, "method.chunk": 60, "method.s1_steps": 120, "data.n_seq": 32,
          "train.checkpoint_every": 2}

CLAIMS = [
    claims.Claim("condense", "S1 (W_V = I): top-1 share of W_E at the condensation point (min over chains), "
                 "attention frozen", claims.minimum("s1/share_E"), ">=", 0.9),
    claims.Claim("frozen_qk", "S1 (W_V = I): ||W_Q W_K^T|| / init at the condensation point (max over chains)",
                 claims.maximum("s1/qk_ratio"), "<=", 2.0),
    claims.Claim("closed_form_u", "S1 (W_V = I): |cos(u1(Phi), pi)| at condensation, pi from the chain (min over "
                 "chains)", claims.minimum("s1/cos_u_pi"), ">=", 0.9),
    claims.Claim("closed_form_v", "S1 (W_V = I): |cos(v1(Phi), pi - 1/V)| at condensation (min over chains)",
                 claims.minimum("s1/cos_v_pi"), ">=", 0.9),
    claims.Claim("cycle", "W_V trained: chains (of 12) with the cycle present: S1, then a first focus peak with "
                 "excess >= 0.1, >= 50% dilution while the loss falls, the rank of W_E rising and a second peak "
                 "with excess >= 0.1", claims.count(lambda s: s["cycle/present"]), ">=", CYCLE_MIN),
    claims.Claim("control", "control (W_V = I, std 1/sqrt(d)): top-1 share of W_E at the condensation step (max "
                 "over chains)", claims.maximum("control/share_E"), "<", 0.6),
]


def get_config(arg=None):
  """Variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  # data.source: markov | pydoc (CPython pydoc_data.topics) | file (data.path, UTF-8 text) | wikitext (tfds).
  c.data = ml_collections.ConfigDict(dict(
      source="markov", vocab=20, alpha=0.5, zipf_s=1.0, concentration=1.0, n_seq=256, length=16, path="",
      tfds_name="wikitext/wikitext-103-raw-v1", max_docs=200000, level="word", top_k=3))
  # model.value_identity=False: W_V trained from the small init (the predecessor paper's model; the cycle claim).
  c.model = ml_collections.ConfigDict(dict(d=16, init_std=1e-2, init_gamma=0.0, value_identity=False,
                                           last_only=False))
  # method.optimizer: gd (full-batch gradient descent ~ gradient flow, the mechanistic run) | adam (robustness).
  # method.steps GD steps of the main model, run and logged in chunks of method.chunk (one run_loop step per
  # chunk; tiny: 44k GD steps = 220 chunks of 200). Every step sees the full batch (the data.n_seq sequences).
  # method.s1_steps: GD steps of the W_V = I companion run (the S1 closed-form claims and the control; 0: none).
  # The cycle test: min_share (S1), min_peak_excess (both focus peaks), min_drop (dilution, of the excess),
  # reversal (the zig-zag filter that confirms peaks and troughs), frozen_ratio (attention frozen).
  c.method = ml_collections.ConfigDict(dict(
      optimizer="gd", lr=0.5, steps=44000, chunk=200, s1_steps=4000, control=True, control_std=0.0,
      rank_rel=0.1, frozen_ratio=2.0, reversal=0.05, min_peak_excess=0.1, min_share=0.9, min_drop=0.5))
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
  if c.method.s1_steps < 0 or c.method.s1_steps % c.method.chunk:
    raise ConfigError(f"config.method.s1_steps={c.method.s1_steps} must be 0 or a positive multiple of "
                      f"config.method.chunk={c.method.chunk}")
  if c.method.steps < c.method.chunk or c.method.steps % c.method.chunk:
    raise ConfigError(f"config.method.steps={c.method.steps} must be a positive multiple of config.method.chunk="
                      f"{c.method.chunk} (the GD steps are run and logged in chunks); e.g. "
                      f"--config.method.steps={max(1, round(c.method.steps / c.method.chunk)) * c.method.chunk}")
  if not c.method.reversal > 0 or not c.method.frozen_ratio > 1 or not 0 < c.method.rank_rel < 1:
    raise ConfigError("config.method needs reversal > 0, frozen_ratio > 1 and rank_rel in (0, 1)")
  if not 0 < c.method.min_share <= 1 or not c.method.min_drop > 0 or not c.method.min_peak_excess > 0:
    raise ConfigError("config.method needs min_share in (0, 1], min_drop > 0 and min_peak_excess > 0")


def sweep(arg=None):
  """Initialisation scale x learning rate (the regime knobs), plus the Adam robustness variant."""
  return ([{"model.init_std": s, "method.lr": lr} for s in (1e-3, 3e-3, 1e-2) for lr in (0.2, 0.5)]
          + [{"method.optimizer": "adam", "method.lr": 1e-3}])
