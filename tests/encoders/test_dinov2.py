"""DINOv2-with-registers encoder: a tiny random checkpoint in both tensor-name layouts; parity with transformers'
Dinov2WithRegistersModel (at the table's grid and at an interpolated one) when torch and transformers exist."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.encoders import dinov2
from jaxlab.errors import CheckpointError

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, patch_size=4, image_size=32,
            num_channels=3, num_register_tokens=4, layer_norm_eps=1e-6, hidden_act="gelu", layerscale_value=0.5)


def _hub_names(cfg) -> dict[str, tuple]:
  """The released checkpoints' tensor names (transformers 4.x layout) and shapes of a config."""
  d, m, p = cfg["hidden_size"], int(cfg["hidden_size"] * cfg["mlp_ratio"]), cfg["patch_size"]
  n = (cfg["image_size"] // p) ** 2
  out = {"embeddings.cls_token": (1, 1, d), "embeddings.mask_token": (1, d),
         "embeddings.register_tokens": (1, cfg["num_register_tokens"], d),
         "embeddings.position_embeddings": (1, 1 + n, d),
         "embeddings.patch_embeddings.projection.weight": (d, 3, p, p),
         "embeddings.patch_embeddings.projection.bias": (d,), "layernorm.weight": (d,), "layernorm.bias": (d,)}
  for i in range(cfg["num_hidden_layers"]):
    pre = f"encoder.layer.{i}."
    for nm in ("norm1", "norm2"):
      out[pre + nm + ".weight"], out[pre + nm + ".bias"] = (d,), (d,)
    for nm in ("attention.attention.query", "attention.attention.key", "attention.attention.value",
               "attention.output.dense"):
      out[pre + nm + ".weight"], out[pre + nm + ".bias"] = (d, d), (d,)
    out[pre + "mlp.fc1.weight"], out[pre + "mlp.fc1.bias"] = (m, d), (m,)
    out[pre + "mlp.fc2.weight"], out[pre + "mlp.fc2.bias"] = (d, m), (d,)
    out[pre + "layer_scale1.lambda1"], out[pre + "layer_scale2.lambda1"] = (d,), (d,)
  return out


def _write_random(path, cfg=TINY, seed=0):
  from safetensors.numpy import save_file
  rng = np.random.default_rng(seed)
  os.makedirs(path, exist_ok=True)
  tensors = {k: (0.2 * rng.standard_normal(s)).astype(np.float32) for k, s in _hub_names(cfg).items()}
  save_file(tensors, os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(dict(cfg, model_type="dinov2_with_registers"), f)
  return tensors


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
