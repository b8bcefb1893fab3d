"""TrainState and its sharded, shape-first initialisation.

A Flax NNX model is split once into a static `ModelDef` (graph definition + abstract variables) and pure
nested dicts of arrays (`params`, `model_state`) that live in the `TrainState` pytree. Pure dicts keep
checkpoints portable (paths like `params/l1/kernel`) and make every train step a pure function:
`model = modeldef.merge(params, model_state)` inside the step, `modeldef.split(model)` after it.

Initialisation never materialises an unsharded copy: `jax.eval_shape` gives shapes and logical
partition specs, `config.sharding_rules` map them to the mesh, and the init (model AND optimizer) runs
under `jax.jit(out_shardings=...)` so every leaf is created on its devices.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxlab import mesh as mesh_lib
from jaxlab.errors import ConfigError

ModelFn = Callable[[nnx.Rngs], nnx.Module]


@flax.struct.dataclass
class TrainState:
  """Everything a training run carries from step to step (a pytree of arrays).

  Attributes:
    step: int32 scalar, number of completed optimizer steps.
    params: nested dict of the model's `nnx.Param` arrays.
    model_state: nested dict of the model's other variables (e.g. BatchNorm statistics).
    opt_state: the optax state of `params`.
    rng: raw key data (`jax.random.key_data`) of the run's base key; step keys are `fold_in(rng, step)`.
  """
  step: jax.Array
  params: Any
  model_state: Any
  opt_state: Any
  rng: jax.Array

  def key(self, step: jax.Array | int | None = None) -> jax.Array:
    """The typed PRNG key for `step` (default: the current step)."""
    base = jax.random.wrap_key_data(self.rng)
    return jax.random.fold_in(base, self.step if step is None else step)


class ModelDef:
  """Static description of an NNX model: merge pure param dicts into a Module and split them back.

  Args:
    model_fn: `rngs -> nnx.Module`, building the model (parameters may carry logical partitioning).
  """

  def __init__(self, model_fn: ModelFn):
    self.model_fn = model_fn
    with nnx.use_eager_sharding(False):
      abstract = nnx.eval_shape(lambda: model_fn(nnx.Rngs(0)))
    self.graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    rng_paths = [p for p, _ in nnx.to_flat_state(nnx.state(abstract, nnx.RngState))]
    if rng_paths:
      raise ConfigError(
          f"model keeps nnx.Rngs state at {'/'.join(map(str, rng_paths[0]))}; build modules without stored "
          "rngs (e.g. nnx.Dropout(rate)) and pass rngs at call time so steps stay pure and checkpoints portable")
    self._params_template = params
    self._rest_template = rest
    self.param_specs = _pure_specs(params)   # logical PartitionSpecs, pure dict
    self.model_state_specs = _pure_specs(rest)

  def init(self, rng: jax.Array) -> tuple[Any, Any]:
    """Builds the model with key `rng`; returns (params, model_state) as pure dicts."""
    with nnx.use_eager_sharding(False):
      model = self.model_fn(nnx.Rngs(rng))
    return self.split(model)

  def merge(self, params: Any, model_state: Any) -> nnx.Module:
    """Rebuilds the NNX module from pure dicts (cheap; used inside jitted steps)."""
    p = jax.tree.map(lambda x: x, self._params_template)
    r = jax.tree.map(lambda x: x, self._rest_template)
    nnx.replace_by_pure_dict(p, params)
    nnx.replace_by_pure_dict(r, model_state)
    return nnx.merge(self.graphdef, p, r)

  @staticmethod
  def split(model: nnx.Module) -> tuple[Any, Any]:
    """Returns (params, model_state) of a module as pure dicts."""
    _, p, r = nnx.split(model, nnx.Param, ...)
    return p.to_pure_dict(), r.to_pure_dict()

  def abstract(self) -> tuple[Any, Any]:
    """ShapeDtypeStructs of (params, model_state)."""
    return self._params_template.to_pure_dict(), self._rest_template.to_pure_dict()


def _pure_specs(state: nnx.State) -> Any:
  """The LOGICAL PartitionSpecs of a state's variables (pure dict).

  Read with an empty rules context: inside `jaxlab.mesh.use`, flax's `get_partition_spec` would already map
  the names through the rules in context, and `tree_shardings` (which maps logical names) would then drop
  the resulting mesh-axis names and replicate every parameter.
  """
  with nnx.logical_axis_rules(()):
    specs = nnx.get_partition_spec(state).to_pure_dict()
  return jax.tree.map(lambda s: s, specs, is_leaf=lambda x: isinstance(x, P))


def tree_shardings(specs: Any, abstract: Any, mesh: Mesh, rules: Sequence[Sequence[Any]]) -> Any:
  """Maps a tree of logical PartitionSpecs to NamedShardings, checking divisibility.

  Args:
    specs: pytree of logical `PartitionSpec` (leaves), same structure as `abstract`.
    abstract: pytree of arrays / ShapeDtypeStructs (for shape checks and error paths).
    mesh: the device mesh.
    rules: `config.sharding_rules`.
  """
  def one(path, spec, leaf):
    mesh_spec = mesh_lib.logical_to_mesh(spec, rules, mesh)
    mesh_lib.check_divisible(jax.tree_util.keystr(path, simple=True, separator="/"), leaf.shape, mesh_spec, mesh)
    return NamedSharding(mesh, mesh_spec)
  return jax.tree_util.tree_map_with_path(one, specs, abstract, is_leaf=lambda x: isinstance(x, P))


def train_state_shardings(modeldef: ModelDef, tx: optax.GradientTransformation, mesh: Mesh,
                          rules: Sequence[Sequence[Any]]) -> TrainState:
  """NamedShardings of every TrainState leaf (optimizer moments follow their parameters)."""
  params_abs, rest_abs = modeldef.abstract()
  params_sh = tree_shardings(modeldef.param_specs, params_abs, mesh, rules)
  rest_sh = tree_shardings(modeldef.model_state_specs, rest_abs, mesh, rules)
  opt_abs = jax.eval_shape(tx.init, params_abs)
  repl = mesh_lib.replicated(mesh)
  opt_sh = optax.tree_utils.tree_map_params(   # MaskedNode: a parameter without state (e.g. LoRA's frozen base)
      tx, lambda _, sh: sh, opt_abs, params_sh, transform_non_params=lambda _: repl,
      is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  return TrainState(step=repl, params=params_sh, model_state=rest_sh, opt_state=opt_sh, rng=repl)


def create_train_state(modeldef: ModelDef, tx: optax.GradientTransformation, mesh: Mesh,
                       rules: Sequence[Sequence[Any]], seed: int) -> tuple[TrainState, TrainState]:
  """Initialises model and optimizer directly on the mesh.

  Args:
    modeldef: the model description.
    tx: the optax transformation (its state is created inside the same jitted init).
    mesh: device mesh.
    rules: `config.sharding_rules`.
    seed: run seed; parameter init uses `fold_in(key(seed), 0)`, the run key `fold_in(key(seed), 1)`.

  Returns:
    (state, shardings): the sharded TrainState and the matching tree of NamedShardings.
  """
  shardings = train_state_shardings(modeldef, tx, mesh, rules)

  def init(seed_arr):
    base = jax.random.key(seed_arr)
    params, rest = modeldef.init(jax.random.fold_in(base, 0))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=rest,
                      opt_state=tx.init(params), rng=jax.random.key_data(jax.random.fold_in(base, 1)))

  state = jax.jit(init, out_shardings=shardings)(jnp.uint32(seed))
  return state, shardings


def abstract_with_shardings(shardings: Any, like: Any) -> Any:
  """ShapeDtypeStructs carrying shardings: the restore target of a checkpoint on the current mesh.

  `optax.MaskedNode`s of `like` (optimizer state that a parameter does not have) stay as they are.
  """
  def one(x, s):
    return x if isinstance(x, optax.MaskedNode) else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
  return jax.tree.map(one, like, shardings, is_leaf=lambda x: isinstance(x, optax.MaskedNode))


def param_count(params: Any) -> int:
  """Total number of parameters in a pytree."""
  return sum(int(x.size) for x in jax.tree.leaves(params))
