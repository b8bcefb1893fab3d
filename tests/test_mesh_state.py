"""Meshes, logical-to-mesh sharding rules and the shape-first sharded TrainState init."""

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxlab import configs
from jaxlab import mesh as mesh_lib
from jaxlab.errors import ConfigError
from jaxlab.nn import MLP
from jaxlab.state import ModelDef, create_train_state

RULES = configs.base_config().sharding_rules


def test_make_mesh_resolves_minus_one():
  m = mesh_lib.make_mesh((("data", -1), ("model", 2)))
  assert dict(m.shape) == {"data": 4, "model": 2}
  with pytest.raises(ConfigError, match="does not fit"):
    mesh_lib.make_mesh((("data", -1), ("model", 3)))
  assert mesh_lib.make_mesh((("data", 2), ("model", 1))).devices.size == 2  # a subset of the devices


def test_logical_to_mesh_rules():
  m = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  assert mesh_lib.logical_to_mesh(P("embed", "mlp"), RULES, m) == P(None, "model")
  assert mesh_lib.logical_to_mesh(P("mlp", "heads"), RULES, m) == P("model")  # axis used once
  assert mesh_lib.logical_to_mesh(P("batch", None), RULES, m) == P("data")
  m1 = mesh_lib.make_mesh((("data", 8), ("model", 1)))
  assert mesh_lib.logical_to_mesh(P("embed", "mlp"), RULES, m1) == P()  # size-1 axes dropped
  fsdp = (("embed", "data"), ("mlp", "model"))
  assert mesh_lib.logical_to_mesh(P("embed", "mlp"), fsdp, m) == P("data", "model")


def test_sharded_init_places_every_leaf_on_the_mesh():
  m = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  md = ModelDef(lambda rngs: MLP(8, [16, 16], 4, rngs=rngs))
  tx = optax.adamw(1e-3)
  state, shardings = create_train_state(md, tx, m, RULES, seed=0)
  leaves = jax.tree.leaves(state)
  assert all(leaf.sharding.mesh == m for leaf in leaves)
  model_sharded = [leaf for leaf in leaves if "model" in jax.tree.leaves(tuple(leaf.sharding.spec))]
  assert model_sharded, "no leaf is sharded over the model axis"
  # The Adam moments follow their parameter's sharding.
  mu = state.opt_state[0].mu
  assert mu["layers"][0]["kernel"].sharding.spec == state.params["layers"][0]["kernel"].sharding.spec == P(None, "model")
  # Same seed -> same values on any mesh.
  m1 = mesh_lib.make_mesh((("data", 1), ("model", 1)), jax.devices()[:1])
  state1, _ = create_train_state(md, tx, m1, RULES, seed=0)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(state1.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_model_built_inside_the_mesh_context_keeps_its_logical_specs():
  """`fit` builds its ModelDef inside `mesh.use`: the specs must stay logical so the rules shard them (a
  regression: flax resolved them through the rules in context and every parameter came out replicated)."""
  m = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  with mesh_lib.use(m, "fsdp"):
    md = ModelDef(lambda rngs: MLP(8, [16, 16], 4, rngs=rngs))
    state, _ = create_train_state(md, optax.adamw(1e-3), m, mesh_lib.current_rules(), seed=0)
  assert md.param_specs["layers"][0]["kernel"] == P("embed", "mlp")
  assert state.params["layers"][0]["kernel"].sharding.spec == P("data", "model")


def test_indivisible_dimension_is_a_clear_error():
  m = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  md = ModelDef(lambda rngs: MLP(8, [15], 4, rngs=rngs))
  with pytest.raises(ConfigError, match="'layers/0/(bias|kernel)' dim \\d \\(size 15\\) does not split"):
    create_train_state(md, optax.sgd(0.1), m, RULES, seed=0)


def test_model_with_stored_rngs_is_rejected():
  from flax import nnx
  with pytest.raises(ConfigError, match="pass rngs at call time"):
    ModelDef(lambda rngs: nnx.Dropout(0.1, rngs=rngs))
