"""Config parsing, overrides and validation: every bad input gets a one-line error naming the key."""

import pytest

from jaxlab import configs, registry
from jaxlab.errors import ConfigError


def test_parse_arg_positional_and_named():
  a = configs.parse_arg("small", variant="tiny", seed=0, fast=False)
  assert (a.variant, a.seed, a.fast) == ("small", 0, False)
  b = configs.parse_arg("variant=full,seed=2,fast=true", variant="tiny", seed=0, fast=False)
  assert (b.variant, b.seed, b.fast) == ("full", 2, True)
  assert configs.parse_arg(None, variant="tiny").variant == "tiny"


@pytest.mark.parametrize("arg,match", [("sed=1", "did you mean 'seed'"), ("seed=one", "expects int"),
                                       ("tiny,2", "key=value")])
def test_parse_arg_errors(arg, match):
  with pytest.raises(ConfigError, match=match):
    configs.parse_arg(arg, variant="tiny", seed=0)


def test_overrides_typed_and_unknown_keys():
  c = configs.base_config()
  c.lock()
  configs.apply_overrides(c, ["optimizer.learning_rate=0.5", "num_steps=7", "mesh=(('data', 2), ('model', 4))",
                              "async_checkpoint=false"])
  assert c.optimizer.learning_rate == 0.5 and c.num_steps == 7 and c.mesh[1] == ("model", 4)
  assert c.async_checkpoint is False
  with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
    configs.apply_overrides(c, {"optimizer.learning_rat": 0.1})
  with pytest.raises(ConfigError, match="expects int"):
    configs.apply_overrides(c, ["num_steps=ten"])


def _bad(**kv):
  c = configs.base_config()
  for k, v in kv.items():
    node = c
    *path, leaf = k.split("__")
    for p in path:
      node = node[p]
    node[leaf] = v
  return c


@pytest.mark.parametrize("config,match", [
    (_bad(batch_size=0), "batch_size must be a positive integer"),
    (_bad(optimizer__name="adagrad"), "optimizer.name='adagrad'"),
    (_bad(optimizer__learning_rate=-1.0), "learning_rate must be positive"),
    (_bad(optimizer__schedule="linear"), "optimizer.schedule"),
    (_bad(variant="huge"), "variant='huge'"),
    (_bad(mesh=(("data", -1), ("model", -1))), "at most one -1"),
    (_bad(sharding_rules=(("mlp", "tensor"),)), "mesh axis 'tensor'"),
])
def test_validate_rejects_bad_values(config, match):
  with pytest.raises(ConfigError, match=match):
    configs.validate(config)


def test_validate_unknown_top_level_key_and_missing_key():
  c = configs.base_config()
  c.batchsize = 3
  with pytest.raises(ConfigError, match="unknown config key 'batchsize'.*did you mean 'batch_size'"):
    configs.validate(c)
  c = configs.base_config()
  del c["optimizer"]["eps"]
  c.optimizer.epsilon = 1e-8
  with pytest.raises(ConfigError, match="optimizer.epsilon"):
    configs.validate(c)


def test_validate_batch_against_mesh():
  c = configs.base_config()
  c.batch_size = 12
  configs.validate(c, num_devices=4)
  with pytest.raises(ConfigError, match="batch_size=12 is not divisible by the 8-way data split"):
    configs.validate(c, num_devices=8)
  c.mesh = (("data", -1), ("model", 3))
  with pytest.raises(ConfigError, match="does not fit 8 devices"):
    configs.validate(c, num_devices=8)
  c.mesh = (("data", 4), ("model", 4))
  with pytest.raises(ConfigError, match="needs 16 devices but 8 are present"):
    configs.validate(c, num_devices=8)
  c.mesh = (("data", 1), ("model", 1))  # smaller than the machine: a single-device run
  configs.validate(c, num_devices=8)


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("variant", configs.VARIANTS)
def test_every_experiment_variant_builds_and_validates(name, variant):
  exp = registry.load(name)
  c = exp.get_config(variant)
  assert c.variant == variant and c.is_locked
  configs.validate(c)
  if hasattr(exp.config_module, "sweep"):
    for point in exp.config_module.sweep(variant):
      configs.validate(configs.apply_overrides(exp.get_config(variant), point))
