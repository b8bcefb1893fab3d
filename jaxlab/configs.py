"""Config helpers: variant arguments, the base config every experiment extends, overrides, validation.

An experiment's `config.py` builds its config like this::

    def get_config(arg=None):
      arg = configs.parse_arg(arg, variant="tiny", seed=0)
      config = configs.base_config()
      config.seed = arg.seed
      config.model = ml_collections.ConfigDict(dict(width=64))
      ...
      return configs.finalize(config)   # validates and locks

Top-level scalar keys belong to the shared library (`base_config`); experiment-specific keys live in
sub-sections (`model`, `data`, `method`, `eval`, ...). `validate` rejects unknown library keys, bad values
and a batch that does not split over the mesh, with a one-line message naming the key.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
from typing import Any, Iterable, Mapping, Sequence

import ml_collections

from jaxlab.errors import ConfigError

VARIANTS = ("tiny", "small", "full")
OPTIMIZERS = ("adamw", "adam", "sgd", "lion")
SCHEDULES = ("constant", "cosine", "warmup_cosine", "warmup_constant")


def parse_arg(arg: str | None, **spec: Any) -> ml_collections.ConfigDict:
  """Parses a big_vision-style config argument.

  `"tiny"` sets the first key of `spec`; `"variant=full,seed=2"` sets named keys. Values are converted
  to the type of the default in `spec` (bool, int, float, str).

  Args:
    arg: the text after `:` in `--config path/config.py:ARG` (None or "" keeps the defaults).
    **spec: argument names and their defaults, in order.

  Returns:
    A ConfigDict with one entry per key of `spec`.

  Raises:
    ConfigError: on an unknown argument name or a value of the wrong type.
  """
  out = dict(spec)
  if not arg:
    return ml_collections.ConfigDict(out)
  names = list(spec)
  for i, item in enumerate(arg.split(",")):
    item = item.strip()
    if not item:
      continue
    if "=" in item:
      key, value = item.split("=", 1)
      key = key.strip()
    elif i == 0 and names:
      key, value = names[0], item
    else:
      raise ConfigError(f"config argument '{item}' needs the form key=value (known keys: {', '.join(names)})")
    if key not in spec:
      raise ConfigError(f"unknown config argument '{key}'{_did_you_mean(key, names)}; known: {', '.join(names)}")
    out[key] = _coerce(value.strip(), spec[key], key)
  return ml_collections.ConfigDict(out)


def base_config() -> ml_collections.ConfigDict:
  """Returns the library-owned config keys with their defaults (unlocked)."""
  c = ml_collections.ConfigDict()
  c.variant = "tiny"          # tiny (CPU, minutes) | small | full (the paper's scale)
  c.seed = 0
  # Device mesh: (axis name, size) pairs, one size may be -1 (= all remaining devices).
  c.mesh = (("data", -1), ("model", 1))
  # Logical axis name -> mesh axis (None = replicated). Models annotate logical names only.
  c.sharding_rules = (
      ("batch", "data"), ("embed", None), ("mlp", "model"), ("heads", "model"), ("kv", None),
      ("vocab", "model"), ("state", None), ("length", None))
  c.batch_size = 32           # global batch over all processes
  c.eval_batch_size = 0       # 0: same as batch_size
  c.num_steps = 100
  c.log_every = 10
  c.eval_every = 0            # 0: evaluate only at the end
  c.checkpoint_every = 0      # 0: checkpoint only at the end (and on interruption)
  c.keep_checkpoints = 2
  c.async_checkpoint = True
  c.init_from = ""            # checkpoint dir or workdir to take initial params from ("" = scratch)
  c.tensorboard = True        # also write TensorBoard events to workdir/tb when tensorboardX is installed
  c.optimizer = ml_collections.ConfigDict(dict(
      name="adamw", learning_rate=1e-3, schedule="constant", warmup_steps=0, end_lr_ratio=0.0,
      weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8, momentum=0.0, nesterov=False, clip_norm=0.0))
  return c


def variant_config(arg: str | None) -> tuple[ml_collections.ConfigDict, ml_collections.ConfigDict]:
  """The start of every experiment's `get_config(arg)`.

  Returns:
    (config, arg): `base_config()` with `variant` and `seed` set from `parse_arg(arg, variant="tiny", seed=0)`,
    and the parsed argument.
  """
  arg = parse_arg(arg, variant="tiny", seed=0)
  c = base_config()
  c.variant = arg.variant
  c.seed = arg.seed
  return c, arg


def finalize(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Validates a config (device-independent checks) and locks it; returns it."""
  validate(config)
  config.lock()
  return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any] | Iterable[str]):
  """Sets dotted keys on a config in place: `{"optimizer.learning_rate": 0.1}` or `["seed=3"]`.

  String values are converted to the type of the existing value (lists/tuples via Python literals).

  Raises:
    ConfigError: on an unknown key (with a suggestion) or a value that does not convert.
  """
  if not isinstance(overrides, Mapping):
    items = {}
    for text in overrides:
      if "=" not in text:
        raise ConfigError(f"override '{text}' needs the form key=value, e.g. optimizer.learning_rate=0.01")
      k, v = text.split("=", 1)
      items[k.strip()] = v
    overrides = items
  for key, value in overrides.items():
    parent, leaf = _resolve(config, key)
    old = parent[leaf]
    if isinstance(value, str) and not isinstance(old, str):
      value = _coerce(value, old, key)
    elif isinstance(old, bool) != isinstance(value, bool) and old is not None:
      raise ConfigError(f"config key '{key}' expects {type(old).__name__}, got {value!r}")
    try:
      parent[leaf] = value
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config key '{key}': cannot set {value!r} ({e})") from None
  return config


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Checks library-owned keys and values; with `num_devices`, also the mesh and batch split.

  Raises:
    ConfigError: one line naming the offending key and how to fix it.
  """
  ref = base_config()
  for key in config.keys():
    if key not in ref and not isinstance(config[key], ml_collections.ConfigDict):
      raise ConfigError(
          f"unknown config key '{key}'{_did_you_mean(key, list(ref.keys()))}; experiment-specific keys "
          "belong in a section such as config.model or config.data")
  for key in ref.keys():
    if key not in config:
      raise ConfigError(f"config is missing required key '{key}'; build it on jaxlab.configs.base_config()")
  for key in config.optimizer.keys():
    if key not in ref.optimizer:
      raise ConfigError(f"unknown config key 'optimizer.{key}'{_did_you_mean(key, list(ref.optimizer.keys()))}")
  if config.variant not in VARIANTS:
    raise ConfigError(f"config.variant={config.variant!r} is not one of {VARIANTS}")
  for key in ("batch_size", "num_steps", "log_every", "keep_checkpoints"):
    if not isinstance(config[key], int) or config[key] <= 0:
      raise ConfigError(f"config.{key} must be a positive integer, got {config[key]!r}")
  for key in ("eval_batch_size", "eval_every", "checkpoint_every"):
    if not isinstance(config[key], int) or config[key] < 0:
      raise ConfigError(f"config.{key} must be a non-negative integer (0 = default), got {config[key]!r}")
  opt = config.optimizer
  if opt.name not in OPTIMIZERS:
    raise ConfigError(f"config.optimizer.name={opt.name!r} is not one of {OPTIMIZERS}")
  if opt.schedule not in SCHEDULES:
    raise ConfigError(f"config.optimizer.schedule={opt.schedule!r} is not one of {SCHEDULES}")
  if not (opt.learning_rate > 0 and math.isfinite(opt.learning_rate)):
    raise ConfigError(f"config.optimizer.learning_rate must be positive and finite, got {opt.learning_rate!r}")
  for key in ("warmup_steps", "weight_decay", "clip_norm", "momentum", "eps"):
    if opt[key] < 0:
      raise ConfigError(f"config.optimizer.{key} must be >= 0, got {opt[key]!r}")
  if not 0 <= opt.end_lr_ratio <= 1:
    raise ConfigError(f"config.optimizer.end_lr_ratio must be in [0, 1], got {opt.end_lr_ratio!r}")
  if opt.warmup_steps > config.num_steps:
    raise ConfigError(f"config.optimizer.warmup_steps={opt.warmup_steps} exceeds config.num_steps={config.num_steps}")
  mesh_shape(config.mesh, num_devices)  # checks names/sizes even without devices
  rules = _check_rules(config.sharding_rules, [name for name, _ in config.mesh])
  if num_devices is not None:
    shape = dict(mesh_shape(config.mesh, num_devices))
    batch_axes = rules.get("batch")
    batch_axes = (batch_axes,) if isinstance(batch_axes, str) else (batch_axes or ())
    split = math.prod(shape[a] for a in batch_axes)
    for key in ("batch_size", "eval_batch_size"):
      if config[key] and config[key] % split:
        raise ConfigError(
            f"config.{key}={config[key]} is not divisible by the {split}-way data split of mesh "
            f"{dict(shape)}; use a multiple of {split} or change config.mesh")


def mesh_shape(mesh: Sequence[Sequence[Any]], num_devices: int | None) -> list[tuple[str, int]]:
  """Resolves a mesh spec `(("data", -1), ("model", 2))` to concrete sizes for `num_devices`.

  One size may be -1 (all remaining devices). Without -1 the mesh may be smaller than the machine (e.g.
  `(("data", 1), ("model", 1))` for a single-device run); it then uses the first devices.

  Raises:
    ConfigError: on malformed entries, duplicate names, several -1, or sizes that do not fit.
  """
  try:
    pairs = [(str(n), int(s)) for n, s in mesh]
  except (TypeError, ValueError):
    raise ConfigError(f"config.mesh must be pairs (axis_name, size), got {mesh!r}") from None
  names = [n for n, _ in pairs]
  if len(set(names)) != len(names) or not pairs:
    raise ConfigError(f"config.mesh needs distinct axis names, got {names}")
  if sum(s == -1 for _, s in pairs) > 1 or any(s == 0 or s < -1 for _, s in pairs):
    raise ConfigError(f"config.mesh sizes must be positive with at most one -1, got {mesh!r}")
  if num_devices is None:
    return pairs
  fixed = math.prod(s for _, s in pairs if s != -1)
  if any(s == -1 for _, s in pairs):
    if num_devices % fixed:
      raise ConfigError(f"config.mesh {dict(pairs)} does not fit {num_devices} devices ({fixed} does not divide it)")
    return [(n, num_devices // fixed if s == -1 else s) for n, s in pairs]
  if fixed > num_devices:
    raise ConfigError(f"config.mesh {dict(pairs)} needs {fixed} devices but {num_devices} are present; "
                      "shrink it or set one axis to -1")
  return pairs  # a mesh smaller than the machine uses the first `fixed` devices


def to_json(config: ml_collections.ConfigDict) -> str:
  """Serialises a config to indented JSON (tuples become lists)."""
  return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)


def flatten(config: ml_collections.ConfigDict | Mapping, prefix: str = "") -> dict[str, Any]:
  """Flattens a (nested) config to `{"optimizer.learning_rate": ..., ...}`."""
  out = {}
  for k, v in config.items():
    if isinstance(v, (ml_collections.ConfigDict, Mapping)):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


# ------------------------------------------------------------------------------------------- helpers


def _check_rules(rules, mesh_names) -> dict:
  out = {}
  try:
    for logical, axis in rules:
      out[str(logical)] = axis
  except (TypeError, ValueError):
    raise ConfigError(f"config.sharding_rules must be pairs (logical_name, mesh_axis or None), got {rules!r}") from None
  for logical, axis in out.items():
    axes = (axis,) if isinstance(axis, str) else (axis or ())
    for a in axes:
      if a not in mesh_names:
        raise ConfigError(f"config.sharding_rules maps '{logical}' to mesh axis '{a}', which config.mesh "
                          f"does not have (axes: {mesh_names})")
  return out


def _resolve(config, key: str):
  parts = key.split(".")
  node = config
  for i, p in enumerate(parts):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if p not in keys:
      where = ".".join(parts[:i]) or "config"
      raise ConfigError(f"unknown config key '{key}'{_did_you_mean(p, keys)}; '{where}' has: {', '.join(sorted(map(str, keys)))}")
    if i == len(parts) - 1:
      return node, p
    node = node[p]
  raise ConfigError(f"empty config key {key!r}")


def _coerce(text: str, like: Any, key: str):
  try:
    if isinstance(like, bool):
      if text.lower() in ("1", "true", "yes", "on"):
        return True
      if text.lower() in ("0", "false", "no", "off"):
        return False
      raise ValueError(text)
    if isinstance(like, int):
      return int(text)
    if isinstance(like, float):
      return float(text)
    if isinstance(like, str) or like is None:
      return text
    if isinstance(like, (tuple, list)):
      value = ast.literal_eval(text)
      return type(like)(value) if isinstance(value, (tuple, list)) else type(like)((value,))
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise ConfigError(f"config key '{key}' expects {type(like).__name__}, got {text!r}") from None


def _did_you_mean(word: str, options: Sequence[str]) -> str:
  close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
  return f" (did you mean '{close[0]}'?)" if close else ""
