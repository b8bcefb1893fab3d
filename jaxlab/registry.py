"""Finding experiments: by name in `jaxlab.experiments`, or by a folder / config.py path anywhere.

An experiment is a folder with `config.py` (`get_config(arg)` ending in `configs.finalize(c, validate)`,
optional `sweep(arg)`, `CLAIMS`, optional `SEEDS`) and `train.py` (`train_and_evaluate(config, workdir) ->
dict`, optional `plot(runs, workdirs, out_dir)`). The library finds them by name here, so `jaxlab` itself never imports
`jaxlab.experiments` statically.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import sys
import types
from typing import Any

import ml_collections

from jaxlab import configs
from jaxlab.errors import ConfigError

PACKAGE = "jaxlab.experiments"


@dataclasses.dataclass
class Experiment:
  """A loaded experiment: its name, package and config module."""
  name: str
  package: str
  config_module: types.ModuleType

  @property
  def train_module(self) -> types.ModuleType:
    """The experiment's train.py (imported on first use)."""
    return importlib.import_module(f"{self.package}.train")

  @property
  def description(self) -> str:
    """The first paragraph of the config module's docstring, on one line (whole sentences, never cut)."""
    doc = (self.config_module.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())

  @property
  def claims(self) -> list:
    return list(getattr(self.config_module, "CLAIMS", []))

  @property
  def variants(self) -> tuple[str, ...]:
    """The variants the experiment builds: its config module's `VARIANTS`, else `jaxlab.configs.VARIANTS`."""
    return tuple(getattr(self.config_module, "VARIANTS", configs.VARIANTS))

  def check_variant(self, arg: str | None) -> None:
    """Raises ConfigError (one line, before any work) when `arg` names a variant this experiment does not build
    (e.g. `tiny_v1`, the earlier claim setting only re-posed experiments keep)."""
    variant = "tiny"
    for i, part in enumerate(p.strip() for p in str(arg or "").split(",")):
      key, eq, value = part.partition("=")
      if eq and key.strip() == "variant":
        variant = value.strip()
      elif not eq and i == 0 and part:    # "small": the first key of the argument spec is the variant
        variant = part
    if variant not in self.variants:
      raise ConfigError(f"{self.name} has no variant {variant!r}: use one of {', '.join(self.variants)}")

  def get_config(self, arg: str | None = None, overrides: Any = ()) -> ml_collections.ConfigDict:
    """The experiment's `get_config(arg)` with `overrides` applied before it is validated (once) and locked.

    Args:
      arg: the config argument, e.g. "tiny" or "variant=small,seed=1".
      overrides: dotted-key overrides: a mapping `{"train.num_steps": 5}`, "key=value" strings, or a tuple
        of such (applied in order).

    Raises:
      ConfigError: an unknown key, a bad value, or a config the experiment's `validate` rejects.
    """
    self.check_variant(arg)
    groups = overrides if isinstance(overrides, tuple) else (overrides,)
    with configs.overriding(*groups):
      config = self.config_module.get_config(arg)
    if not isinstance(config, ml_collections.ConfigDict):
      raise ConfigError(f"{self.name}: get_config must return an ml_collections.ConfigDict")
    if not config.is_locked:
      raise ConfigError(f"{self.name}: get_config must end with `return configs.finalize(c, validate)`")
    configs.set_experiment_name(config, self.name)
    return config


def names() -> list[str]:
  """Names of the experiments installed under `jaxlab.experiments`."""
  try:
    pkg = importlib.import_module(PACKAGE)
  except ModuleNotFoundError:
    raise ConfigError("jaxlab.experiments is not importable: install the checkout first (pip install -e .), "
                      "setup.py maps experiments/ to jaxlab.experiments") from None
  return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.ispkg and not m.name.startswith("_"))


def load(name_or_path: str) -> Experiment:
  """Loads an experiment by name ("quickstart") or folder / config.py path.

  Raises:
    ConfigError: when no such experiment exists (lists the known names).
  """
  path = name_or_path
  if path.endswith(".py"):
    path = os.path.dirname(path) or "."
  base = os.path.basename(os.path.normpath(path))
  if os.path.isdir(path):
    if os.path.normpath(os.path.dirname(os.path.abspath(path))).endswith(os.sep + "experiments") and base in names():
      return _from_package(base)
    if not os.path.exists(os.path.join(path, "config.py")):
      raise ConfigError(f"{path} has no config.py; an experiment folder needs config.py and train.py")
    return _from_folder(path)
  if name_or_path in names():
    return _from_package(name_or_path)
  if base in names():  # e.g. "experiments/<p>/config.py" typed outside a checkout (installed package)
    return _from_package(base)
  raise ConfigError(f"unknown experiment {name_or_path!r}; known: {', '.join(names()) or 'none'} "
                    "(or pass a folder holding config.py and train.py)")


def load_config(spec: str, overrides: Any = (), values: Any = None) -> tuple[Experiment, ml_collections.ConfigDict]:
  """Loads `path/to/config.py:ARG` (or `name:ARG`) with overrides applied, validated once.

  Args:
    spec: the `--config` value.
    overrides: "key=value" strings (CLI) or a mapping.
    values: a further mapping of typed values applied after `overrides` (e.g. a sweep point).

  Returns:
    (experiment, config).
  """
  target, _, arg = spec.partition(":")
  exp = load(target)
  return exp, exp.get_config(arg or None, (overrides, values or {}))


def _from_package(name: str) -> Experiment:
  pkg = f"{PACKAGE}.{name}"
  return Experiment(name=name, package=pkg, config_module=importlib.import_module(f"{pkg}.config"))


def _from_folder(path: str) -> Experiment:
  path = os.path.abspath(path)
  name = os.path.basename(path)
  pkg = f"_jaxlab_ext_{abs(hash(path))}_{name}"
  if pkg not in sys.modules:
    mod = types.ModuleType(pkg)
    mod.__path__ = [path]
    sys.modules[pkg] = mod
  return Experiment(name=name, package=pkg, config_module=importlib.import_module(f"{pkg}.config"))
