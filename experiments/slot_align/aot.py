"""SLOT-Align's accelerator step for `python -m jaxlab.compile_check` (no claim imports this file).

    python -m jaxlab.compile_check --config experiments/slot_align/config.py:full [--config.data.path=FEATURES.npz]

Each (alpha, tau) stage runs one jitted round (`method.make_round`): every client's features through its geodesic
map, local SGD of a linear head (vmapped over the clients, which are sharded over the data axis), one FedAvg and the
macro accuracy on the mapped test features. The client statistics, the Bures barycenter and the maps are computed
on the host. The round's shapes come from the feature file when data.path is given; otherwise from the image counts
of the dataset's domains (`DOMAIN_SIZES`, Office-Home's published counts) split as `fdata.train_test_split` does.
The feature width is data.dim (512: CLIP ViT-B/32).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import compile_check
from jaxlab import mesh as mesh_lib
from jaxlab.errors import ConfigError
from jaxlab.federated import data as fdata
from jaxlab.federated import head as head_lib

from . import config as config_lib
from . import method

TOPOLOGY = "v5e-4"
# Images per domain (Venkateswara et al. 2017, Office-Home: 15,588 images in 4 domains).
DOMAIN_SIZES = {"office_home": {"Art": 2427, "Clipart": 4365, "Product": 4439, "Real_World": 4357}}


def domain_sizes(config) -> dict[str, int]:
  """Rows per domain: from the feature file when data.path is set, else `DOMAIN_SIZES`."""
  d = config.data
  names, _ = config_lib.DATASETS[d.dataset]
  if d.path:
    return {name: len(y) for name, (_, y) in fdata.load_feature_npz(d.path, names).items()}
  if d.dataset not in DOMAIN_SIZES:
    raise ConfigError(f"config.data.dataset={d.dataset!r}: give --config.data.path=FEATURES.npz (its shapes set the "
                      "round's)")
  return DOMAIN_SIZES[d.dataset]


def compile_targets(config):
  """One round at the padded client count, epochs-mode local steps of the largest client (alpha = 0: every row)."""
  d, h = config.data, config.head
  _, num_classes = config_lib.DATASETS[d.dataset]
  sizes = domain_sizes(config)
  tests = {k: int(round(d.test_fraction * n)) for k, n in sizes.items()}    # as `fdata.train_test_split`
  n_train = max(n - tests[k] for k, n in sizes.items())
  n_test = max(tests.values())
  kp = method.padded_count(len(sizes))
  if h.steps:
    steps, per_client = int(h.steps), False
  else:
    steps, per_client = h.epochs * math.ceil(n_train / h.batch_size), True
  mesh = mesh_lib.current_mesh()
  cl, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
  sds = lambda shape, dtype=jnp.float32, sh=cl: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)  # noqa: E731
  dim = int(d.dim)
  key = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), kp))
  init = jax.tree.map(lambda s: sds(s.shape, s.dtype, rep), jax.eval_shape(lambda: head_lib.init_head(dim,
                                                                                                      num_classes)))
  args = (sds((kp, n_train, dim)), sds((kp, n_train), jnp.int32), sds((kp, n_train)), sds((kp, dim, dim)),
          sds((kp, dim)), sds(key.shape, key.dtype), sds((kp,), jnp.int32), sds((kp,)), init,
          sds((kp, n_test, dim)), sds((kp, n_test), jnp.int32), sds((kp, n_test)))
  # local SGD (6 per weight use x batch_size rows x steps per client), the maps of train and test features
  # (2 d^2 per row) and the test logits (2 d C per row)
  flops = kp * (6.0 * steps * h.batch_size * dim * num_classes + 2.0 * (n_train + n_test) * dim * dim
                + 2.0 * n_test * dim * num_classes)
  fn = method.make_round(config, steps, per_client)
  return [compile_check.Target("round", fn, args, state=init, model_flops=flops)]
