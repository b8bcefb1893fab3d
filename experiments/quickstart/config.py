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
  c.optimizer.name = "adamw"
  c.optimizer.learning_rate = 3e-3
  c.optimizer.schedule = "warmup_cosine"
  c.optimizer.warmup_steps = 20
  c.optimizer.weight_decay = 1e-4
  c.batch_size = 64
  c.num_steps = 300
  c.log_every = 25
  c.eval_every = 100
  c.checkpoint_every = 100
  if arg.variant == "small":
    c.model.hidden = (512, 512)
    c.num_steps = 1000
  elif arg.variant == "full":
    c.data.name = "mnist"
    c.model.hidden = (1024, 1024)
    c.batch_size = 256
    c.num_steps = 5000
    c.eval_every = 1000
    c.checkpoint_every = 1000
  return configs.finalize(c)


def sweep(arg=None):
  """Learning rate x width grid."""
  return [{"optimizer.learning_rate": lr, "model.hidden": (w, w)} for lr in (1e-3, 3e-3, 1e-2) for w in (64, 128)]
