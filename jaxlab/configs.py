"""Config helpers: variant arguments, the run config every experiment extends, sections, overrides, validation.

An experiment's `config.py` builds its config like this::

    def get_config(arg=None):
      c, arg = configs.variant_config(arg)               # base_config() with variant and seed set
      c.train = configs.train_config(batch_size=64, num_steps=300)   # only if it trains with fit / run_loop
      c.model = ml_collections.ConfigDict(dict(width=64))
      ...
      return configs.finalize(c, validate)               # applies overrides, validates ONCE, locks

Three kinds of keys:

* run-level keys (`base_config`): variant, seed, mesh, sharding_rules, tensorboard; every run has them.
* the gradient-training section `config.train` (`train_config`): batch sizes, num_steps, logging / eval /
  checkpoint cadence, init_from, and the optimizer (`config.train.optimizer`). Only experiments that train
  with `jaxlab.train.fit` or `jaxlab.train.run_loop` add it, and only with the keys they use.
* experiment sections (`config.model`, `config.data`, `config.method`, ...).

Validation happens once per config: `finalize(c, validate)` runs the library's checks and the experiment's
`validate(c)` after applying the overrides given to `registry.Experiment.get_config(arg, overrides)` (the CLI's
`--config.key=value`, a sweep point, a reproduce seed). `apply_overrides` on a finalized config validates the
changed config again. Device-dependent checks (mesh fits the devices, batch splits over the data axis) run in
the runners through `check_devices`.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import difflib
import json
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import ml_collections

from jaxlab import mesh as mesh_lib
from jaxlab.errors import ConfigError

VARIANTS = ("tiny", "small", "full")     # every experiment has these
EXTRA_VARIANTS = ("tiny_v1",)            # the earlier tiny claim setting of experiments whose claims were re-posed
                                         # (issue 71); an experiment that builds it lists it in its config's
                                         # VARIANTS, and `registry` refuses it for every other experiment
OPTIMIZERS = ("adamw", "adam", "sgd", "lion")
SCHEDULES = ("constant", "cosine", "warmup_cosine", "warmup_constant")

Validator = Callable[[ml_collections.ConfigDict], None]

# Defaults of the gradient-training section (`train_config`) and of its optimizer.
TRAIN_DEFAULTS: dict[str, Any] = dict(
    batch_size=32,          # global batch over all processes
    eval_batch_size=0,      # 0: same as batch_size
    num_steps=100,
    log_every=10,
    eval_every=0,           # 0: evaluate only at the end
    checkpoint_every=0,     # 0: checkpoint only at the end (and on interruption)
    keep_checkpoints=2,
    async_checkpoint=True,
    init_from="",           # checkpoint dir or workdir to take initial params from ("" = scratch)
)
OPTIMIZER_DEFAULTS: dict[str, Any] = dict(
    name="adamw", learning_rate=1e-3, schedule="constant", warmup_steps=0, end_lr_ratio=0.0, weight_decay=0.0,
    b1=0.9, b2=0.999, eps=1e-8, momentum=0.0, nesterov=False, clip_norm=0.0)
_POSITIVE = ("batch_size", "num_steps", "log_every", "keep_checkpoints")
_NON_NEGATIVE = ("eval_batch_size", "eval_every", "checkpoint_every")

_VALIDATOR_ATTR = "_jaxlab_validate"
_EXPERIMENT_ATTR = "_jaxlab_experiment"
_PENDING: contextvars.ContextVar[tuple] = contextvars.ContextVar("jaxlab_pending_overrides", default=())


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
      raise ConfigError(f"config argument {_q(item)} needs the form key=value (known keys: {', '.join(names)})")
    if key not in spec:
      raise ConfigError(f"unknown config argument {_q(key)}{_did_you_mean(key, names)}; known: {', '.join(names)}")
    out[key] = _coerce(value.strip(), spec[key], key)
  return ml_collections.ConfigDict(out)


def base_config() -> ml_collections.ConfigDict:
  """The run-level keys every config has, with their defaults (unlocked)."""
  c = ml_collections.ConfigDict()
  c.variant = "tiny"          # tiny (CPU, minutes) | small | full (the paper's scale)
  c.seed = 0
  # Device mesh: (axis name, size) pairs, one size may be -1 (= all remaining devices).
  c.mesh = mesh_lib.DEFAULT_MESH
  # Logical axis name -> mesh axis (None = replicated); presets in jaxlab.mesh.RULES (the CLI also takes
  # a preset name: --config.sharding_rules=fsdp). Models annotate logical names only.
  c.sharding_rules = mesh_lib.DEFAULT_RULES
  c.tensorboard = True        # also write TensorBoard events to workdir/tb when tensorboardX is installed
  return c


def train_config(optimizer: Mapping[str, Any] | None | bool = True, **values: Any) -> ml_collections.ConfigDict:
  """The gradient-training section (`config.train`) of experiments that run `fit` or `run_loop`.

  Keys (defaults in `TRAIN_DEFAULTS`): batch_size, eval_batch_size, num_steps, log_every, eval_every,
  checkpoint_every, keep_checkpoints, async_checkpoint, init_from, and the `optimizer` sub-section
  (`OPTIMIZER_DEFAULTS`: name, learning_rate, schedule, warmup_steps, end_lr_ratio, weight_decay, b1, b2, eps,
  momentum, nesterov, clip_norm).

  Args:
    optimizer: values for the optimizer sub-section (True: the defaults; None or False: no optimizer, e.g. a
      zeroth-order or tabular update that builds no optax transformation).
    **values: section values; `key=None` leaves a key out (an experiment carries only the keys it uses, e.g.
      `batch_size=None, num_steps=None` for a full-batch loop whose step count follows from its method).

  Returns:
    An unlocked ConfigDict.

  Raises:
    ConfigError: on an unknown key.
  """
  for key in list(values) + list(optimizer if isinstance(optimizer, Mapping) else ()):
    known = TRAIN_DEFAULTS if key in values else OPTIMIZER_DEFAULTS
    if key not in known:
      raise ConfigError(f"train_config: unknown key '{key}'{_did_you_mean(key, list(known))}")
  section = {k: values.get(k, v) for k, v in TRAIN_DEFAULTS.items()}
  section = {k: v for k, v in section.items() if v is not None}
  if optimizer:
    section["optimizer"] = dict(OPTIMIZER_DEFAULTS, **(optimizer if isinstance(optimizer, Mapping) else {}))
  return ml_collections.ConfigDict(section)


def variant_config(arg: str | None, **extra: Any) -> tuple[ml_collections.ConfigDict, ml_collections.ConfigDict]:
  """The start of every experiment's `get_config(arg)`.

  Args:
    arg: the config argument (see `parse_arg`).
    **extra: further argument names and defaults the experiment accepts (e.g. `data="synthetic"`).

  Returns:
    (config, arg): `base_config()` with `variant` and `seed` set from
    `parse_arg(arg, variant="tiny", seed=0, **extra)`, and the parsed argument.
  """
  arg = parse_arg(arg, variant="tiny", seed=0, **extra)
  c = base_config()
  c.variant = arg.variant
  c.seed = arg.seed
  return c, arg


@contextlib.contextmanager
def overriding(*overrides: Mapping[str, Any] | Iterable[str]):
  """Within the block, `finalize` applies these overrides (in order) before it validates.

  Used by `registry.Experiment.get_config(arg, overrides)`, so a config built with overrides is validated
  once, as the user will run it.
  """
  token = _PENDING.set(_PENDING.get() + tuple(o for o in overrides if o))
  try:
    yield
  finally:
    _PENDING.reset(token)


def finalize(config: ml_collections.ConfigDict, validate: Validator | None = None) -> ml_collections.ConfigDict:
  """Applies pending overrides (see `overriding`), validates once, and locks the config.

  Args:
    config: the experiment's config.
    validate: the experiment's own checks (`validate(config)` raising ConfigError), run after the library's;
      kept with the config so `apply_overrides` checks a changed config again.

  Returns:
    The same config, validated and locked.
  """
  pending, token = _PENDING.get(), _PENDING.set(())
  try:
    for overrides in pending:
      _apply(config, overrides)
  finally:
    _PENDING.reset(token)
  _validate(config, validate)
  object.__setattr__(config, _VALIDATOR_ATTR, validate)
  config.lock()
  return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any] | Iterable[str]):
  """Sets dotted keys on a config in place: `{"train.optimizer.learning_rate": 0.1}` or `["seed=3"]`.

  String values are converted to the type of the existing value (lists/tuples via Python literals;
  `sharding_rules` also takes a preset name of `jaxlab.mesh.RULES`). A finalized config is validated again
  (library and experiment checks) after the change.

  Raises:
    ConfigError: on an unknown key (with a suggestion), a value that does not convert, or a changed config
      that fails validation.
  """
  _apply(config, overrides)
  if hasattr(config, _VALIDATOR_ATTR):
    _validate(config, getattr(config, _VALIDATOR_ATTR))
  return config


def validate(config: ml_collections.ConfigDict) -> None:
  """The library's device-independent checks of a config (run-level keys and the `train` section).

  Raises:
    ConfigError: one line naming the offending key and how to fix it.
  """
  ref = base_config()
  for key in config.keys():
    if key not in ref and not isinstance(config[key], ml_collections.ConfigDict):
      hint = ("; gradient-training keys belong in config.train (jaxlab.configs.train_config())"
              if key in TRAIN_DEFAULTS or key == "optimizer" else
              "; experiment-specific keys belong in a section such as config.model or config.data")
      raise ConfigError(f"unknown config key '{key}'{_did_you_mean(key, list(ref.keys()))}{hint}")
  for key in ref.keys():
    if key not in config:
      raise ConfigError(f"config is missing required key '{key}'; build it on jaxlab.configs.base_config()")
  if config.variant not in VARIANTS + EXTRA_VARIANTS:
    raise ConfigError(f"config.variant={config.variant!r} is not one of {VARIANTS + EXTRA_VARIANTS}")
  mesh_lib.mesh_shape(config.mesh, None)  # checks names/sizes even without devices
  mesh_lib.check_rules(config.sharding_rules, [name for name, _ in config.mesh])
  if "train" in config:
    _validate_train(config.train)


def check_devices(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Device-dependent checks: the mesh fits `num_devices` and the batch splits over the data axes.

  Raises:
    ConfigError: one line naming the key and the fix.
  """
  shape = dict(mesh_lib.mesh_shape(config.mesh, num_devices))
  rules = mesh_lib.check_rules(config.sharding_rules, list(shape))
  batch_axes = rules.get("batch")
  batch_axes = (batch_axes,) if isinstance(batch_axes, str) else (batch_axes or ())
  split = math.prod(shape[a] for a in batch_axes)
  train = config.get("train") or {}
  for key in ("batch_size", "eval_batch_size"):
    if train.get(key) and train[key] % split:
      raise ConfigError(
          f"config.train.{key}={train[key]} is not divisible by the {split}-way data split of mesh "
          f"{dict(shape)}; use a multiple of {split} or change config.mesh")


def require_train_keys(config: ml_collections.ConfigDict, keys: Sequence[str], who: str) -> ml_collections.ConfigDict:
  """`config.train`, checked to hold `keys` (a runner's needs); returns it.

  Raises:
    ConfigError: naming the missing section or key.
  """
  train = config.get("train")
  if train is None:
    raise ConfigError(f"{who} needs the gradient-training section config.train; add "
                      "c.train = jaxlab.configs.train_config(...) to the experiment's get_config")
  missing = [k for k in keys if k not in train]
  if missing:
    raise ConfigError(f"{who} needs config.train.{missing[0]}; pass it to jaxlab.configs.train_config(...)")
  return train


def experiment_name(config: ml_collections.ConfigDict) -> str | None:
  """The experiment a config belongs to (set by `registry.Experiment.get_config`, else taken from the module
  of the validator `finalize` was given: `jaxlab.experiments.<name>.config`); None when unknown."""
  name = getattr(config, _EXPERIMENT_ATTR, None)
  if name:
    return name
  fn = getattr(config, _VALIDATOR_ATTR, None)
  parts = (getattr(fn, "__module__", "") or "").split(".")
  if len(parts) >= 2 and parts[-1] == "config":
    pkg = parts[-2]
    return pkg[len("_jaxlab_ext_"):].split("_", 1)[1] if pkg.startswith("_jaxlab_ext_") else pkg
  return None


def set_experiment_name(config: ml_collections.ConfigDict, name: str) -> None:
  """Records which experiment `config` belongs to (kept out of the config's keys)."""
  object.__setattr__(config, _EXPERIMENT_ATTR, name)


def to_json(config: ml_collections.ConfigDict) -> str:
  """Serialises a config to indented JSON (tuples become lists)."""
  return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)


def flatten(config: ml_collections.ConfigDict | Mapping, prefix: str = "") -> dict[str, Any]:
  """Flattens a (nested) config to `{"train.optimizer.learning_rate": ..., ...}`."""
  out = {}
  for k, v in config.items():
    if isinstance(v, (ml_collections.ConfigDict, Mapping)):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


# ------------------------------------------------------------------------------------------- helpers


def _validate(config, validate_fn):
  validate(config)
  if validate_fn is not None:
    validate_fn(config)


def _validate_train(t) -> None:
  for key in t.keys():
    if key not in TRAIN_DEFAULTS and key != "optimizer":
      raise ConfigError(f"unknown config key 'train.{key}'{_did_you_mean(key, list(TRAIN_DEFAULTS))}")
  for key in _POSITIVE:
    if key in t and (not isinstance(t[key], int) or isinstance(t[key], bool) or t[key] <= 0):
      raise ConfigError(f"config.train.{key} must be a positive integer, got {t[key]!r}")
  for key in _NON_NEGATIVE:
    if key in t and (not isinstance(t[key], int) or isinstance(t[key], bool) or t[key] < 0):
      raise ConfigError(f"config.train.{key} must be a non-negative integer (0 = default), got {t[key]!r}")
  if "optimizer" not in t:
    return
  opt = t.optimizer
  for key in opt.keys():
    if key not in OPTIMIZER_DEFAULTS:
      raise ConfigError(f"unknown config key 'train.optimizer.{key}'{_did_you_mean(key, list(OPTIMIZER_DEFAULTS))}")
  for key in OPTIMIZER_DEFAULTS:
    if key not in opt:
      raise ConfigError(f"config.train.optimizer is missing '{key}'; build it with jaxlab.configs.train_config()")
  if opt.name not in OPTIMIZERS:
    raise ConfigError(f"config.train.optimizer.name={opt.name!r} is not one of {OPTIMIZERS}")
  if opt.schedule not in SCHEDULES:
    raise ConfigError(f"config.train.optimizer.schedule={opt.schedule!r} is not one of {SCHEDULES}")
  if not (opt.learning_rate > 0 and math.isfinite(opt.learning_rate)):
    raise ConfigError(f"config.train.optimizer.learning_rate must be positive and finite, got {opt.learning_rate!r}")
  for key in ("warmup_steps", "weight_decay", "clip_norm", "momentum", "eps"):
    if opt[key] < 0:
      raise ConfigError(f"config.train.optimizer.{key} must be >= 0, got {opt[key]!r}")
  if not 0 <= opt.end_lr_ratio <= 1:
    raise ConfigError(f"config.train.optimizer.end_lr_ratio must be in [0, 1], got {opt.end_lr_ratio!r}")
  if "num_steps" in t and opt.warmup_steps > t.num_steps:
    raise ConfigError(f"config.train.optimizer.warmup_steps={opt.warmup_steps} exceeds "
                      f"config.train.num_steps={t.num_steps}")


def _apply(config, overrides) -> None:
  if not isinstance(overrides, Mapping):
    items = {}
    for text in overrides:
      if "=" not in text:
        raise ConfigError(f"override {_q(text)} needs the form key=value, e.g. train.optimizer.learning_rate=0.01")
      k, v = text.split("=", 1)
      items[k.strip()] = v
    overrides = items
  for key, value in overrides.items():
    parent, leaf = _resolve(config, key)
    old = parent[leaf]
    if leaf == "sharding_rules" and isinstance(value, str) and value.strip() in mesh_lib.RULES:
      value = mesh_lib.RULES[value.strip()]
    elif isinstance(value, str) and not isinstance(old, str):
      value = _coerce(value, old, key)
    elif isinstance(old, bool) != isinstance(value, bool) and old is not None:
      raise ConfigError(f"config key {_q(key)} expects {type(old).__name__}, got {value!r}")
    try:
      parent[leaf] = value
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config key {_q(key)}: cannot set {value!r} ({_q(str(e))})") from None


def _resolve(config, key: str):
  parts = key.split(".")
  node = config
  for i, p in enumerate(parts):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if p not in keys:
      where = ".".join(parts[:i]) or "config"
      moved = sorted((k for k in flatten(config) if k.split(".")[-1] == parts[-1] and k != key),
                     key=lambda k: (not k.startswith("train."), k.count("."), k))
      hint = f" (did you mean '{moved[0]}'?)" if moved else _did_you_mean(p, keys)
      raise ConfigError(f"unknown config key {_q(key)}{hint}; {_q(where)} has: {', '.join(sorted(map(str, keys)))}")
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
    raise ConfigError(f"config key {_q(key)} expects {type(like).__name__}, got {text!r}{_example(like, key)}") \
        from None


def _example(like: Any, key: str) -> str:
  """"; e.g. --config.KEY=..." written from the key's current value (a tuple or list as Python literal)."""
  if isinstance(like, (tuple, list, dict)):
    text = repr(like if len(like) <= 4 else type(like)(list(like)[:4]) if not isinstance(like, dict) else like)
    return f"; write a Python literal, e.g. --config.{key}=\"{text}\" (its current value)" if len(text) <= 80 else \
        f"; write a Python {type(like).__name__} literal, e.g. --config.{key}=\"(1, 2)\""
  if isinstance(like, bool):
    return f"; e.g. --config.{key}=true"
  return ""


def _q(text: str) -> str:
  """User text quoted for a one-line message: 'text', or its repr when it holds line breaks or odd characters."""
  text = str(text)
  return f"'{text}'" if text.isprintable() and "'" not in text else repr(text)


def _did_you_mean(word: str, options: Sequence[str]) -> str:
  close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
  return f" (did you mean '{close[0]}'?)" if close else ""
