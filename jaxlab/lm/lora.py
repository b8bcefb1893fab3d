"""LoRA: low-rank adapters on the linear layers of any Flax NNX model, trainable on their own.

Low-rank adaptation (Hu et al., 2021) replaces a frozen weight W (in, out) by W + (alpha / r) A B with
A (in, r) and B (r, out); B starts at zero, so the adapted model computes exactly what the base model
computes until training moves B.

Interface:

* `apply_lora(model, rank, alpha, targets, *, rngs)` adds adapters IN PLACE to every linear-like submodule
  whose path matches one of `targets` and returns the model. A linear-like module has an `nnx.Param`
  `kernel` of shape (*in_dims, *out_dims) whose leading `in_ndim` axes contract with the trailing axes of
  its input (`nnx.Linear`: 1; `nnx.LinearGeneral` (the projections of `jaxlab.lm.model`): its input axes; a
  module with an int attribute `n_in`: that; `nnx.Einsum` "btd,dnh->btnh": 1, "btnh,nhd->btd": 2, pass
  `in_ndim` for the latter). The
  module keeps its path, class behaviour and parameters (`layers/0/attn/q/kernel` stays where it was); it
  gains `lora_a` (*in_dims, r) and `lora_b` (r, *out_dims) as `nnx.LoRAParam` (a subclass of `nnx.Param`,
  so `jaxlab.state.ModelDef` keeps them with the parameters and checkpoints hold them), annotated with the
  kernel's logical axis names (rank axis unsharded). Its call becomes `base(x) + (alpha / r) * (x A) B`,
  computed in the module's `dtype` when it has one.
* Target patterns: a pattern without "/" is matched (fnmatch) against the module's own name, e.g.
  "q_proj" or "*_proj"; a pattern with "/" is matched against the whole path, e.g. "layers/*/mlp/*".
  List indices are path components ("layers/3/attn/q_proj").
* Stacked layers (`jaxlab.lm.Transformer` with `scan_layers`): a kernel whose first logical axis name is
  "layers" (n_layers, *in_dims, *out_dims) gets per-layer adapters stacked the same way, `lora_a`
  (n_layers, *in_dims, r) and `lora_b` (n_layers, r, *out_dims); the scanned block sees one layer's slice of
  each, so the call rule above is unchanged. Paths have no layer index there ("layers/attn/q"), so a pattern
  can select a projection in all layers but not a single layer.
* Training only the adapters: `freeze_base(tx)` wraps an optax transformation so only `lora_a`/`lora_b`
  leaves are updated (others get exactly zero updates and keep no optimizer state);
  it works on the pure param dicts of `jaxlab.train.fit`'s TrainState and on `nnx.State`.
  `lora_mask(params)` gives the boolean tree for `optax.masked` & co., `lora_param_filter` is an NNX
  filter (`nnx.state(model, lora_param_filter)`, `nnx.Optimizer(model, tx, wrt=lora_param_filter)`) and
  `nnx.LoRAParam` works as a filter too.
* `merge_lora(model)` folds every adapter into its kernel (W += (alpha / r) A B in the kernel's dtype),
  removes the adapter parameters and restores the original class: the model is again a plain base model
  (e.g. for `save_pretrained`).

Example (wiring into `jaxlab.train.fit`, whose optimizer comes from the config):

  model_fn = lambda rngs: lora.apply_lora(Transformer(cfg, rngs=rngs), rank=8, alpha=16,
                                          targets=("q", "v"), rngs=rngs)
  tx = lora.freeze_base(tx)   # where the optimizer is built

Implementation note: the adapted module's class is swapped for a cached subclass `<Class>WithLoRA` (one
per base class) that adds the low-rank term after the base class's `__call__`; this keeps parameter paths
and all attributes of the original module unchanged.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlab.errors import ConfigError

LORA_NAMES = ("lora_a", "lora_b")
STACK_AXIS = "layers"      # `jaxlab.nn.layers.LAYERS_AXIS`: kernels stacked for scan_layers lead with it
DEFAULT_TARGETS = ("q", "v", "q_proj", "v_proj")


def _lora_call(self, x, *args, **kwargs):
  """`base(x) + (alpha / r) * (x @ lora_a) @ lora_b`."""
  y = self._lora_base.__call__(self, x, *args, **kwargs)
  return y + _lora_delta(self, x).astype(y.dtype)


def _lora_delta(self, x: jax.Array) -> jax.Array:
  """The adapter term for input x (..., *in_dims) -> (..., *out_dims), in the module's compute dtype."""
  dtype = getattr(self, "dtype", None) or jnp.result_type(x.dtype, self.lora_a[...].dtype)
  a = self.lora_a[...].astype(dtype)
  b = self.lora_b[...].astype(dtype)
  h = jnp.tensordot(x.astype(dtype), a, axes=self.lora_in_ndim)  # (..., r)
  return jnp.tensordot(h, b, axes=1) * jnp.asarray(self.lora_scale, dtype)


_CLASSES: dict[type, type] = {}


def _lora_class(cls: type) -> type:
  """The cached subclass `<cls>WithLoRA` that adds the adapter term (same instance layout as cls)."""
  if cls not in _CLASSES:
    name = f"{cls.__name__}WithLoRA"
    _CLASSES[cls] = type(name, (cls,), {
        "__module__": __name__, "__qualname__": name, "_lora_base": cls,
        "__call__": _lora_call, "lora_delta": _lora_delta})
  return _CLASSES[cls]


def is_adapted(module: Any) -> bool:
  """True for a module that `apply_lora` gave adapters (and `merge_lora` has not merged yet)."""
  return "_lora_base" in type(module).__dict__


def _path_str(path: Sequence[Any]) -> str:
  return "/".join(str(p) for p in path)


def _matches(path: Sequence[Any], patterns: Sequence[str]) -> bool:
  if not path:
    return False
  full, name = _path_str(path), str(path[-1])
  return any(fnmatch.fnmatchcase(full if "/" in p else name, p) for p in patterns)


def _is_linear_like(module) -> bool:
  kernel = getattr(module, "kernel", None)
  return isinstance(kernel, nnx.Param) and not isinstance(kernel, nnx.LoRAParam) and kernel[...].ndim >= 2


def _default_in_ndim(module) -> int:
  """Contracted kernel axes: an `nnx.LinearGeneral`'s input axes, an int `n_in` attribute, else 1."""
  if isinstance(module, nnx.LinearGeneral):
    axes = module.axis if isinstance(module.axis, (tuple, list)) else (module.axis,)
    if module.batch_axis or sorted(axes) != list(range(-len(axes), 0)):
      raise ConfigError(f"LinearGeneral with axis={module.axis}, batch_axis={dict(module.batch_axis)}: LoRA "
                        "supports only contraction over the trailing input axes given as negative axes")
    return len(axes)
  n_in = getattr(module, "n_in", None)
  return n_in if isinstance(n_in, int) and not isinstance(n_in, bool) else 1


def _select(model: nnx.Module, targets: Sequence[str]) -> list[tuple[tuple, nnx.Module]]:
  if isinstance(targets, str):
    targets = (targets,)
  return [(p, m) for p, m in nnx.iter_modules(model)
          if _matches(p, targets) and _is_linear_like(m) and not is_adapted(m)]


def lora_targets(model: nnx.Module, targets: Sequence[str]) -> list[str]:
  """Paths ("a/b/c") of the not-yet-adapted linear-like submodules of `model` that `targets` select."""
  return [_path_str(p) for p, _ in _select(model, targets)]


def apply_lora(model: nnx.Module, rank: int, alpha: float, targets: Sequence[str] = DEFAULT_TARGETS, *,
               rngs: nnx.Rngs, in_ndim: int | Callable[[str, nnx.Module], int] | None = None,
               a_init: Callable | None = None, dtype: Any = None) -> nnx.Module:
  """Adds low-rank adapters to the matching linear-like submodules of `model` (in place).

  Args:
    model: any NNX module.
    rank: adapter rank r >= 1.
    alpha: scale numerator; the adapter output is multiplied by alpha / r.
    targets: path patterns (see the module docstring). Default: the query and value projections of
      `jaxlab.lm.Transformer` ("q", "v") and of Hugging Face-style models ("q_proj", "v_proj"); e.g.
      ("q", "k", "v", "o", "gate", "up", "down") adapts every projection of a `jaxlab.lm.Transformer`.
    rngs: random streams; `rngs.params()` initialises A.
    in_ndim: number of leading kernel axes contracted with the input, or `(path, module) -> int`. Default:
      the input axes of an `nnx.LinearGeneral` (e.g. 2 for `jaxlab.lm.Transformer`'s attention output
      (heads, head_dim, hidden)), the module's int attribute `n_in` when it has one, else 1.
    a_init: initializer of A (key, shape, dtype); default normal with std 1/sqrt(fan_in). B is zero.
    dtype: parameter dtype of A and B (default: the kernel's).

  Returns:
    the same model object, now with adapters.

  Raises:
    ConfigError: bad rank, or no linear-like submodule matches `targets` (the message lists candidates).
  """
  if rank < 1:
    raise ConfigError(f"LoRA rank must be >= 1, got {rank}")
  if isinstance(targets, str):
    targets = (targets,)
  chosen = _select(model, targets)
  if not chosen:
    candidates = [_path_str(p) for p, m in nnx.iter_modules(model) if _is_linear_like(m)]
    raise ConfigError(f"LoRA targets {list(targets)} match no linear layer (module with a 'kernel' Param); "
                      f"candidates: {candidates[:12]}{' ...' if len(candidates) > 12 else ''}")
  for path, module in chosen:
    kernel = module.kernel
    k = (_default_in_ndim(module) if in_ndim is None else
         in_ndim(_path_str(path), module) if callable(in_ndim) else in_ndim)
    meta = kernel.get_metadata()
    names = meta.get("out_sharding") or meta.get("sharding_names") or meta.get("sharding")
    lead = _stacked_axes(names)
    stack, shape = kernel[...].shape[:lead], kernel[...].shape[lead:]
    if not 1 <= k < len(shape):
      raise ConfigError(f"in_ndim={k} does not fit a kernel of shape {shape}")
    pdtype = dtype or kernel[...].dtype
    fan_in = int(np.prod(shape[:k]))
    init = a_init or jax.nn.initializers.normal(1.0 / math.sqrt(fan_in))
    a = init(rngs.params(), stack + shape[:k] + (rank,), pdtype)
    b = jnp.zeros(stack + (rank,) + shape[k:], pdtype)
    extra = {}
    if names is not None and len(names) == lead + len(shape):
      extra_a = dict(out_sharding=tuple(names[:lead + k]) + (None,))
      extra_b = dict(out_sharding=tuple(names[:lead]) + (None,) + tuple(names[lead + k:]))
      for key in ("mesh", "eager_sharding"):
        if meta.get(key) is not None:
          extra[key] = meta[key]
    else:
      extra_a = extra_b = {}
    module.__class__ = _lora_class(type(module))
    module.lora_a = nnx.LoRAParam(a, **extra_a, **extra)
    module.lora_b = nnx.LoRAParam(b, **extra_b, **extra)
    module.lora_scale = float(alpha) / rank
    module.lora_in_ndim = k
  return model


def _stacked_axes(names) -> int:
  """Leading axes of a kernel stacked by `jaxlab.lm.model.stack_blocks` (scan_layers): 1 or 0."""
  return 1 if names and names[0] == STACK_AXIS else 0


def merge_lora(model: nnx.Module) -> nnx.Module:
  """Folds every adapter into its kernel and turns the modules back into their base class (in place).

  After merging, `model(x)` equals the adapted model's output up to float rounding, and the parameter tree
  is that of the base model (no `lora_a`/`lora_b`).

  Returns:
    the same model object.
  """
  for _, module in list(nnx.iter_modules(model)):
    if not is_adapted(module):
      continue
    kernel = module.kernel
    shape = kernel[...].shape
    a, b = module.lora_a[...].astype(jnp.float32), module.lora_b[...].astype(jnp.float32)
    lead = a.ndim - module.lora_in_ndim - 1                  # stacked layer axes (scan_layers)
    r = a.shape[-1]
    a = a.reshape(a.shape[:lead] + (-1, r))
    b = b.reshape(b.shape[:lead] + (r, -1))
    delta = jnp.matmul(a, b).reshape(shape) * module.lora_scale
    kernel[...] = (kernel[...].astype(jnp.float32) + delta).astype(kernel[...].dtype)
    del module.lora_a, module.lora_b, module.lora_scale, module.lora_in_ndim
    module.__class__ = type(module)._lora_base
  return model


def _key_name(entry: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def is_lora_path(path: Sequence[Any]) -> bool:
  """True when a parameter path (tuple of keys or jax key entries) passes through `lora_a` / `lora_b`."""
  return any(_key_name(p) in LORA_NAMES for p in path)


def lora_param_filter(path: Sequence[Any], value: Any) -> bool:
  """NNX filter selecting the adapter parameters: `nnx.state(model, lora_param_filter)`."""
  return isinstance(value, nnx.LoRAParam) or is_lora_path(path)


def lora_mask(params: Any) -> Any:
  """Boolean pytree like `params`: True on adapter leaves (`.../lora_a`, `.../lora_b`)."""
  return jax.tree_util.tree_map_with_path(lambda p, _: is_lora_path(p), params)


def _zero_frozen() -> optax.GradientTransformation:
  """Stateless transformation that zeroes every non-adapter leaf of the updates."""
  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    out = jax.tree_util.tree_map_with_path(lambda p, u: u if is_lora_path(p) else jnp.zeros_like(u), updates)
    return out, state
  return optax.GradientTransformation(init, update)


def freeze_base(tx: optax.GradientTransformation, *, compact: bool = True) -> optax.GradientTransformation:
  """Applies `tx` to the adapter parameters only; every other parameter gets an exactly zero update.

  Args:
    tx: the optimizer for the adapters (e.g. `jaxlab.train.optim.make_optimizer(...)[0]`).
    compact: True (default): `optax.multi_transform` with `set_to_zero` for the frozen parameters, so the
      optimizer state exists for the adapters only (Adam keeps no moments for the base weights: 2x the base
      parameters' memory saved); the frozen leaves of the state are `optax.MaskedNode`s, which
      `jaxlab.state.train_state_shardings` handles. False: `chain(zero frozen grads, tx, zero frozen
      updates)`, whose state keeps the whole parameter tree's shape (frozen moments stay zero). Both give the
      same updates; global-norm clipping and weight decay inside `tx` see only the adapters.

  Works on pure param dicts and `nnx.State` (adapters are found by their `lora_a`/`lora_b` path names).
  """
  if compact:
    def labels(params):
      return jax.tree_util.tree_map_with_path(lambda p, _: "lora" if is_lora_path(p) else "frozen", params)
    return optax.multi_transform({"lora": tx, "frozen": optax.set_to_zero()}, labels)
  return optax.chain(_zero_frozen(), tx, _zero_frozen())


def count_lora_params(model_or_params: Any) -> tuple[int, int]:
  """(adapter parameter count, total parameter count) of a model or param tree."""
  params = model_or_params
  if isinstance(params, nnx.Module):
    params = nnx.state(params, nnx.Param)
  if isinstance(params, nnx.State):
    params = params.to_pure_dict()
  flat = jax.tree_util.tree_leaves_with_path(params)
  lora = sum(int(np.size(v)) for p, v in flat if is_lora_path(p))
  return lora, sum(int(np.size(v)) for _, v in flat)
