"""Quickstart: an MLP classifier on handwritten digits, the reference run of the shared library.

Not a paper: it exercises every shared piece (config variants, sharded state on a mesh, the resumable
loop, eval, checkpoints, the reproduce harness) on data that ships with scikit-learn, so
`python -m jaxlab.reproduce quickstart` works offline in about a minute on a laptop CPU.

Variants: tiny (sklearn digits, 8x8, CPU in seconds), small (wider, longer), full (TFDS `mnist`; prepare
it once with `tfds build mnist` and pass --config.data.data_dir if it is not in the default place).
"""

import ml_collections

from jaxlab import claims, configs

SEEDS = (0, 1, 2)

RESULTS = dict(  # this experiment's row of the README results table (values from claims.json)
    experiment="`quickstart` (reference, not a paper)",
    claim="held-out digit accuracy >= 0.93 on every seed (3 seeds); final train loss < log(10)/10",
)

# The canary (`python -m jaxlab.reproduce --verify`, jaxlab.canary): the tiny variant shortened, every claim key.
CANARY = {"train.num_steps": 40, "train.log_every": 10, "train.eval_every": 20, "train.checkpoint_every": 20}

CLAIMS = [
    claims.Claim("test_acc", "held-out digit accuracy >= 0.93 on every seed",
                 measure=claims.minimum("eval/accuracy"), op=">=", target=0.93),
    claims.Claim("learns", "final train loss below a tenth of log(10) (chance) on average",
                 measure=claims.mean("train/loss"), op="<", target=0.2303),
]


def get_config(arg=None):
  """Config for variant tiny | small | full (e.g. "tiny" or "variant=small,seed=1")."""
  c, arg = configs.variant_config(arg)
  c.data = ml_collections.ConfigDict(dict(name="digits", data_dir="", train_split="train", test_split="test"))
  c.model = ml_collections.ConfigDict(dict(hidden=(128, 128)))
  c.train = configs.train_config(
      batch_size=64, num_steps=300, log_every=25, eval_every=100, checkpoint_every=100,
      optimizer=dict(name="adamw", learning_rate=3e-3, schedule="warmup_cosine", warmup_steps=20,
                     weight_decay=1e-4))
  if arg.variant == "small":
    c.model.hidden = (512, 512)
    c.train.num_steps = 1000
  elif arg.variant == "full":
    c.data.name = "mnist"
    c.model.hidden = (1024, 1024)
    c.train.update(batch_size=256, num_steps=5000, eval_every=1000, checkpoint_every=1000)
  return configs.finalize(c, validate)


def validate(c):
  """Experiment-specific checks (run once by configs.finalize, again by configs.apply_overrides)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  if c.data.name not in ("digits", "mnist"):
    raise ConfigError(f"config.data.name={c.data.name!r}: use 'digits' (offline) or 'mnist' (TFDS)")
  if not c.model.hidden or any(int(w) < 1 for w in c.model.hidden):
    raise ConfigError(f"config.model.hidden={tuple(c.model.hidden)}: need at least one layer, each width >= 1")


def sweep(arg=None):
  """Learning rate x width grid."""
  return [{"train.optimizer.learning_rate": lr, "model.hidden": (w, w)} for lr in (1e-3, 3e-3, 1e-2) for w in (64, 128)]
