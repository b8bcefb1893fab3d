"""DINOv2-with-registers encoder: a tiny random checkpoint in both tensor-name layouts; parity with transformers'
Dinov2WithRegistersModel (at the table's grid and at an interpolated one) when torch and transformers exist."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.encoders import dinov2
from jaxlab.errors import CheckpointError

from fixtures.tiny_dinov2 import TINY, _write_random


def test_encoder_from_a_hub_layout_checkpoint(tmp_path):
  _write_random(tmp_path)
  enc = dinov2.Dinov2Encoder(str(tmp_path), input_size=32)
  x = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (2, 20, 20, 3)), jnp.float32)
  z = np.asarray(enc.encode(x))
  assert z.shape == (2, 8, 8, 32) and enc.grid == (8, 8)
  np.testing.assert_allclose(z.mean(-1), 0, atol=1e-5)      # the final LayerNorm without affine
  np.testing.assert_allclose(z.std(-1), 1, atol=1e-3)
  with pytest.raises(CheckpointError, match="no config.json"):
    dinov2.Dinov2Encoder(str(tmp_path / "nothing"))
  with pytest.raises(CheckpointError, match="not a multiple of the patch size"):
    dinov2.Dinov2Encoder(str(tmp_path), input_size=30)


def test_matches_transformers(tmp_path):
  torch = pytest.importorskip("torch", reason="torch (with transformers) is needed for the parity check")
  transformers = pytest.importorskip("transformers", reason="transformers is needed for the parity check")
  cfg = transformers.Dinov2WithRegistersConfig(**TINY)
  torch.manual_seed(0)
  model = transformers.Dinov2WithRegistersModel(cfg).eval()
  with torch.no_grad():          # non-trivial embeddings and layer scales (the init leaves some at 0 / 1)
    for name, prm in model.named_parameters():
      if "token" in name or "position" in name or "lambda" in name:
        prm.copy_(0.3 * torch.randn_like(prm))
  model.save_pretrained(str(tmp_path / "new"))
  # the same weights under the released checkpoints' names
  ours = _write_random(tmp_path / "hub")
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  renamed = {}
  for k, v in state.items():
    for old, new in dinov2._ALIASES.items():
      k = k.replace(new, old)
    renamed[k] = v
  assert set(renamed) == set(ours)
  from safetensors.numpy import save_file
  save_file(renamed, str(tmp_path / "hub" / "model.safetensors"))
  for size in (32, 24):          # the table's 8 x 8 grid, and 6 x 6 (interpolated positions)
    x = np.random.default_rng(size).standard_normal((2, 3, size, size)).astype(np.float32)
    with torch.no_grad():
      ref = model(pixel_values=torch.tensor(x)).last_hidden_state.numpy()
    for sub in ("new", "hub"):
      c, p = dinov2.load_params(str(tmp_path / sub))
      got = np.asarray(dinov2.forward(c, {k: jnp.asarray(v) for k, v in p.items()},
                                      jnp.asarray(x.transpose(0, 2, 3, 1))))
      np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-4, err_msg=f"{sub} at {size}")


def test_module_inside_a_model_equals_the_encoder_and_loads_sharded(tmp_path):
  import jax
  from flax import nnx
  from jaxlab import mesh as mesh_lib
  _write_random(tmp_path)
  enc = dinov2.Dinov2Encoder(str(tmp_path), input_size=32)
  cfg = enc.config
  module = dinov2.Dinov2Module(cfg, input_size=32)
  assert all(np.all(np.asarray(v) == 0) for v in jax.tree.leaves(nnx.state(module)))   # built empty: nothing read
  mesh = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  weights = dinov2.load_arrays(str(tmp_path), cfg, {k: rep for k in nnx.state(module.weights).to_pure_dict()})
  assert all(w.sharding == rep for w in weights.values())
  nnx.update(module.weights, nnx.State(weights))
  x = jnp.asarray(np.random.default_rng(2).uniform(-1, 1, (3, 24, 24, 3)), jnp.float32)
  np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, v: m(v))(module, x)), np.asarray(enc.encode(x)),
                             rtol=1e-5, atol=1e-5)
  other = dict(TINY, hidden_size=16)
  _write_random(tmp_path / "other", other)
  with pytest.raises(CheckpointError, match="is not the model's"):
    dinov2.load_arrays(str(tmp_path / "other"), cfg)
