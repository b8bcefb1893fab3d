"""HF vision towers (ViT, SigLIP): tiny random checkpoints written here in HF naming (prefixed, sharded, nested
configs) against an independent float64 numpy forward of the HF equations; the nnx module, save / load round
trips, the errors on bad checkpoints; parity with transformers' ViTModel / SiglipVisionModel when torch exists."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jaxlab.encoders import vision_tower as vt
from jaxlab.errors import CheckpointError, ConfigError, DataError

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=4,
            image_size=16, num_channels=3)


# ------------------------------------------------------------------------------------------------------------
# tiny checkpoints, written by hand in HF naming
# ------------------------------------------------------------------------------------------------------------

def _hf_shapes(arch, qkv_bias=True):
  """HF tensor names (no prefix) and shapes of a tiny ViTModel / SiglipVisionModel."""
  d, m, p, c, layers = (TINY[k] for k in ("hidden_size", "intermediate_size", "patch_size", "num_channels",
                                          "num_hidden_layers"))
  n = (TINY["image_size"] // p) ** 2
  out = {}
  if arch == "vit":
    out.update({"embeddings.cls_token": (1, 1, d), "embeddings.position_embeddings": (1, n + 1, d),
                "embeddings.patch_embeddings.projection.weight": (d, c, p, p),
                "embeddings.patch_embeddings.projection.bias": (d,)})
    for i in range(layers):
      pre = f"encoder.layer.{i}."
      for nm in ("layernorm_before", "layernorm_after"):
        out[pre + nm + ".weight"] = out[pre + nm + ".bias"] = (d,)
      for nm in ("attention.attention.query", "attention.attention.key", "attention.attention.value",
                 "attention.output.dense"):
        out[pre + nm + ".weight"] = (d, d)
        if qkv_bias or nm == "attention.output.dense":
          out[pre + nm + ".bias"] = (d,)
      out[pre + "intermediate.dense.weight"], out[pre + "intermediate.dense.bias"] = (m, d), (m,)
      out[pre + "output.dense.weight"], out[pre + "output.dense.bias"] = (d, m), (d,)
    out["layernorm.weight"] = out["layernorm.bias"] = (d,)
  else:
    out.update({"embeddings.patch_embedding.weight": (d, c, p, p), "embeddings.patch_embedding.bias": (d,),
                "embeddings.position_embedding.weight": (n, d)})
    for i in range(layers):
      pre = f"encoder.layers.{i}."
      for nm in ("layer_norm1", "layer_norm2"):
        out[pre + nm + ".weight"] = out[pre + nm + ".bias"] = (d,)
      for nm in ("q_proj", "k_proj", "v_proj", "out_proj"):
        out[pre + f"self_attn.{nm}.weight"], out[pre + f"self_attn.{nm}.bias"] = (d, d), (d,)
      out[pre + "mlp.fc1.weight"], out[pre + "mlp.fc1.bias"] = (m, d), (m,)
      out[pre + "mlp.fc2.weight"], out[pre + "mlp.fc2.bias"] = (d, m), (d,)
    out["post_layernorm.weight"] = out["post_layernorm.bias"] = (d,)
  return out


def _random_tensors(arch, seed=0, qkv_bias=True):
  rng = np.random.default_rng(seed)
  out = {}
  for k, s in _hf_shapes(arch, qkv_bias).items():
    norm_scale = ("norm" in k) and k.endswith(".weight")
    out[k] = ((1.0 if norm_scale else 0.0) + 0.2 * rng.standard_normal(s)).astype(np.float32)
  return out


def _write(path, config, tensors, prefix="", shards=1, extra=None):
  """config.json + the tensors under `prefix` (plus `extra`, e.g. a pooler or a text tower), in `shards` files
  (more than one: with model.safetensors.index.json)."""
  os.makedirs(path, exist_ok=True)
  named = {prefix + k: v for k, v in tensors.items()}
  named.update(extra or {})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  if shards == 1:
    save_file(named, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return
  names = sorted(named)
  weight_map = {}
  for s in range(shards):
    file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    part = {k: named[k] for k in names[s::shards]}
    save_file(part, os.path.join(path, file), metadata={"format": "pt"})
    weight_map.update({k: file for k in part})
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": sum(v.nbytes for v in named.values())}, "weight_map": weight_map}, f)


def _vit_config(**kw):
  return {**TINY, "model_type": "vit", "architectures": ["ViTModel"], "hidden_act": "gelu", "layer_norm_eps": 1e-12,
          **kw}


def _siglip_config(**kw):
  return {**TINY, "model_type": "siglip_vision_model", "architectures": ["SiglipVisionModel"],
          "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, **kw}


# ------------------------------------------------------------------------------------------------------------
# an independent float64 numpy forward, from modeling_vit.py / modeling_siglip.py
# ------------------------------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf)


def _gelu(x, tanh):
  if tanh:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
  return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _layer_norm(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def _reference(arch, t, pixels_bchw, eps, tanh):
  """last_hidden_state in float64 of HF tensors t (no prefix) for channels-first pixels."""
  t = {k: v.astype(np.float64) for k, v in t.items()}
  x = pixels_bchw.astype(np.float64)
  b, _, h, _ = x.shape
  p, d, heads = TINY["patch_size"], TINY["hidden_size"], TINY["num_attention_heads"]
  g, hd = h // p, d // heads
  conv = "embeddings.patch_embeddings.projection" if arch == "vit" else "embeddings.patch_embedding"
  emb = np.zeros((b, d, g, g))                                  # Conv2d(stride = kernel = p), channels first
  for i in range(g):
    for j in range(g):
      window = x[:, :, i * p:(i + 1) * p, j * p:(j + 1) * p]
      emb[:, :, i, j] = np.einsum("bckl,dckl->bd", window, t[conv + ".weight"]) + t[conv + ".bias"]
  z = emb.reshape(b, d, g * g).transpose(0, 2, 1)               # flatten(2).transpose(1, 2)
  if arch == "vit":
    z = np.concatenate([np.repeat(t["embeddings.cls_token"], b, 0), z], 1) + t["embeddings.position_embeddings"]
    names = dict(layer="encoder.layer.{}.", ln1="layernorm_before", q="attention.attention.query",
                 k="attention.attention.key", v="attention.attention.value", o="attention.output.dense",
                 ln2="layernorm_after", fc1="intermediate.dense", fc2="output.dense", final="layernorm")
  else:
    z = z + t["embeddings.position_embedding.weight"][None]
    names = dict(layer="encoder.layers.{}.", ln1="layer_norm1", q="self_attn.q_proj", k="self_attn.k_proj",
                 v="self_attn.v_proj", o="self_attn.out_proj", ln2="layer_norm2", fc1="mlp.fc1", fc2="mlp.fc2",
                 final="post_layernorm")

  def lin(name, y):
    return y @ t[name + ".weight"].T + t.get(name + ".bias", 0.0)

  n_tok = z.shape[1]
  for i in range(TINY["num_hidden_layers"]):
    pre = names["layer"].format(i)
    y = _layer_norm(z, t[pre + names["ln1"] + ".weight"], t[pre + names["ln1"] + ".bias"], eps)
    q, k, v = (lin(pre + names[r], y).reshape(b, n_tok, heads, hd).transpose(0, 2, 1, 3) for r in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    s = np.exp(s - s.max(-1, keepdims=True))
    ctx = (s / s.sum(-1, keepdims=True)) @ v
    z = z + lin(pre + names["o"], ctx.transpose(0, 2, 1, 3).reshape(b, n_tok, d))
    y = _layer_norm(z, t[pre + names["ln2"] + ".weight"], t[pre + names["ln2"] + ".bias"], eps)
    z = z + lin(pre + names["fc2"], _gelu(lin(pre + names["fc1"], y), tanh))
  return _layer_norm(z, t[names["final"] + ".weight"], t[names["final"] + ".bias"], eps)


def _pixels(seed=0, b=2, size=16):
  return np.random.default_rng(seed).standard_normal((b, 3, size, size)).astype(np.float32)   # NCHW, as HF takes


# ------------------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------------------

CASES = {
    # name: (arch, config, prefix, shards, extra tensors, qkv_bias)
    "vit": ("vit", _vit_config(), "", 1, None, True),
    "vit_prefixed_sharded": ("vit", _vit_config(architectures=["ViTForImageClassification"]), "vit.", 3,
                             {"vit.pooler.dense.weight": np.ones((32, 32), np.float32),
                              "classifier.weight": np.ones((10, 32), np.float32)}, True),
    "vit_no_qkv_bias_gelu_new": ("vit", _vit_config(qkv_bias=False, hidden_act="gelu_new"), "", 1, None,
                                        False),
    "siglip_vision_model_prefix": ("siglip", _siglip_config(), "vision_model.", 1,
                                   {"vision_model.head.probe": np.ones((1, 1, 32), np.float32)}, True),
    "siglip_full_nested_in_a_vlm": (
        "siglip", {"model_type": "siglip", "architectures": ["SiglipModel"], "text_config": {"hidden_size": 8},
                   "vision_config": {k: v for k, v in TINY.items()}},       # defaults: eps 1e-6, tanh GELU
        "model.vision_tower.vision_model.", 2,
        {"model.text_model.embeddings.token_embedding.weight": np.ones((5, 8), np.float32),
         "model.text_model.embeddings.position_embedding.weight": np.ones((4, 8), np.float32)}, True),
    # 18 // 4 = 4 patches a side: the valid conv drops the last 2 rows / columns (as so400m-patch14-384 does)
    "siglip_image_not_a_multiple_of_the_patch": ("siglip", _siglip_config(image_size=18), "", 1, None, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_an_independent_numpy_forward(tmp_path, case):
  arch, config, prefix, shards, extra, qkv_bias = CASES[case]
  tensors = _random_tensors(arch, seed=len(case), qkv_bias=qkv_bias)
  _write(tmp_path, config, tensors, prefix, shards, extra)
  cfg, params = vt.load_params(str(tmp_path))
  assert cfg.arch == arch and cfg.hidden_size == 32 and cfg.qkv_bias == qkv_bias
  assert set(params) == set(tensors)                     # prefix stripped; pooler / head / text tower skipped
  for k, v in tensors.items():
    np.testing.assert_array_equal(params[k], v)
  x = _pixels(len(case), size=cfg.image_size)
  act, eps = config.get("hidden_act", "gelu_pytorch_tanh"), config.get("layer_norm_eps", 1e-6)  # nested: defaults
  assert (cfg.hidden_act, cfg.layer_norm_eps) == (act, eps)
  ref = _reference(arch, tensors, x, eps, tanh=act != "gelu")
  got = np.asarray(vt.forward(cfg, params, jnp.asarray(x.transpose(0, 2, 3, 1))))
  assert got.dtype == np.float32 and got.shape == (2, cfg.num_tokens, 32)
  assert cfg.num_tokens == 16 + (arch == "vit")
  np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)
  dropped = np.asarray(vt.forward(cfg, params, jnp.asarray(x.transpose(0, 2, 3, 1)), drop_cls=True))
  np.testing.assert_allclose(dropped, ref[:, 1:] if arch == "vit" else ref, atol=1e-4, rtol=1e-4)


def test_module_from_pretrained_round_trip_and_training(tmp_path):
  tensors = _random_tensors("siglip", seed=3)
  _write(tmp_path / "ckpt", _siglip_config(), tensors, "vision_model.")
  cfg, params = vt.load_params(str(tmp_path / "ckpt"))
  tower = vt.VisionTower.from_pretrained(str(tmp_path / "ckpt"))
  assert tower.config == cfg and tower.out_dim == 32
  x = jnp.asarray(_pixels(4).transpose(0, 2, 3, 1))
  want = np.asarray(vt.forward(cfg, params, x))
  np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, v: m(v))(tower, x)), want, atol=1e-5, rtol=1e-5)
  jitted = jax.jit(vt.forward, static_argnums=0, static_argnames="drop_cls")
  np.testing.assert_allclose(np.asarray(jitted(cfg, params, x)), want, atol=1e-5, rtol=1e-5)
  # save_pretrained -> from_pretrained is bit-exact; the file is in SiglipVisionModel naming
  tower.save_pretrained(str(tmp_path / "again"))
  cfg2, params2 = vt.load_params(str(tmp_path / "again"))
  assert cfg2 == cfg and all(np.array_equal(params2[k], v) for k, v in tensors.items())
  with open(tmp_path / "again" / "config.json") as f:
    assert json.load(f)["model_type"] == "siglip_vision_model"

  # composed into a larger model: its Params are the model's, and gradients reach them
  class Probe(nnx.Module):
    def __init__(self, rngs):
      self.tower = vt.VisionTower(vt.VisionTowerConfig(arch="vit", **TINY), rngs=rngs)
      self.head = nnx.Linear(self.tower.out_dim, 2, rngs=rngs)

    def __call__(self, v):
      return self.head(self.tower(v, drop_cls=True).mean(1))

  model = Probe(nnx.Rngs(0))
  w = model.tower.hf_params()
  assert w["layernorm.weight"].shape == (32,) and np.all(np.asarray(w["layernorm.weight"]) == 1)
  assert np.all(np.asarray(w["encoder.layer.0.attention.attention.query.bias"]) == 0)
  assert 0 < float(jnp.std(w["embeddings.position_embeddings"])) < 0.03
  grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2)))(model)
  g = grads["tower"]["weights"]["encoder__layer__0__intermediate__dense__weight"][...]
  assert g.shape == (64, 32) and float(jnp.abs(g).sum()) > 0
  n_params = sum(v.size for v in jax.tree.leaves(nnx.state(model.tower, nnx.Param)))
  assert n_params == sum(math.prod(s) for s in _hf_shapes("vit").values())
  with pytest.raises(ConfigError, match="rngs"):
    vt.VisionTower(cfg)


def test_preprocess_and_input_checks():
  cfg = vt.VisionTowerConfig(arch="siglip", **TINY)
  out = vt.preprocess(jnp.full((2, 20, 24, 3), 0.75), cfg)       # 0.5 / 0.5: [0, 1] -> [-1, 1]
  assert out.shape == (2, 16, 16, 3)
  np.testing.assert_allclose(np.asarray(out), 0.5, atol=1e-6)
  ramp = jnp.broadcast_to(jnp.linspace(0, 1, 32)[None, None, :, None], (1, 16, 32, 3))
  out = np.asarray(vt.preprocess(ramp, cfg, mean=(0.1, 0.2, 0.3), std=(0.5, 0.5, 0.5)))
  assert np.all(np.diff(out[0, 0, :, 0]) > 0)                    # resized along the width, order kept
  np.testing.assert_allclose(out[..., 1] - out[..., 0], -0.2, atol=1e-5)
  params = vt.init_params(cfg, jax.random.key(0))
  with pytest.raises(DataError, match="preprocess"):
    vt.forward(cfg, params, jnp.zeros((1, 20, 20, 3)))
  with pytest.raises(DataError, match="channels last"):
    vt.forward(cfg, params, jnp.zeros((1, 3, 16, 16)))
  assert vt.VisionTowerConfig.from_hf({"model_type": "vit"}).num_tokens == 197          # HF defaults
  big = vt.VisionTowerConfig.from_hf({"model_type": "siglip", "vision_config": {"image_size": 384,
                                                                                 "patch_size": 14}})
  assert (big.arch, big.num_patches, big.hidden_act, big.layer_norm_eps) == ("siglip", 729, "gelu_pytorch_tanh",
                                                                             1e-6)


def test_bad_checkpoints_raise_one_clear_error(tmp_path):
  t = _random_tensors("vit")
  broken = dict(t)
  del broken["encoder.layer.1.output.dense.weight"]
  _write(tmp_path / "missing", _vit_config(), broken, "vit.")
  with pytest.raises(CheckpointError, match=r"no tensor 'encoder\.layer\.1\.output\.dense\.weight'.*config\.json"):
    vt.load_params(str(tmp_path / "missing"))
  _write(tmp_path / "shape", _vit_config(intermediate_size=48), t)
  with pytest.raises(CheckpointError, match=r"'encoder\.layer\.0\.intermediate\.dense\.weight' has shape \(64, 32\), "
                                            r"expected \(48, 32\).*does not describe these weights"):
    vt.load_params(str(tmp_path / "shape"))
  _write(tmp_path / "clip", dict(TINY, model_type="clip_vision_model"), t)
  with pytest.raises(CheckpointError, match=r"'clip_vision_model' is not a supported vision tower; supported: 'vit'"):
    vt.load_params(str(tmp_path / "clip"))
  _write(tmp_path / "llava", {"model_type": "llava", "vision_config": {"model_type": "clip_vision_model"}}, t)
  with pytest.raises(CheckpointError, match="vision_config model_type 'clip_vision_model'"):
    vt.VisionTowerConfig.from_hf(str(tmp_path / "llava"))
  _write(tmp_path / "other", _siglip_config(), t)                 # ViT weights under a SigLIP config
  with pytest.raises(CheckpointError, match="not a SiglipVisionModel checkpoint"):
    vt.load_params(str(tmp_path / "other"))
  with pytest.raises(CheckpointError, match="no config.json"):
    vt.load_params(str(tmp_path / "nothing"))
  _write(tmp_path / "heads", _vit_config(num_attention_heads=5), t)
  with pytest.raises(CheckpointError, match="not a multiple of num_attention_heads"):
    vt.load_params(str(tmp_path / "heads"))
  cfg = vt.VisionTowerConfig(arch="vit", **TINY)
  with pytest.raises(CheckpointError, match="has shape"):
    vt.VisionTower(cfg, dict(t, **{"layernorm.bias": np.zeros(8, np.float32)}))


def test_matches_transformers(tmp_path):
  torch = pytest.importorskip("torch", reason="torch (with transformers) is needed for the parity check")
  transformers = pytest.importorskip("transformers", reason="transformers is needed for the parity check")
  torch.manual_seed(0)
  text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=50,
              max_position_embeddings=8)
  models = {
      "vit": transformers.ViTModel(transformers.ViTConfig(**TINY, hidden_act="gelu")),
      "siglip": transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**TINY)),
      "siglip_full": transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=TINY)),
  }
  x = _pixels(7)
  for name, model in models.items():
    model.eval()
    with torch.no_grad():        # non-trivial LayerNorms and biases (the init leaves them at 1 / 0)
      for prm in model.parameters():
        prm.add_(0.1 * torch.randn_like(prm))
      tower = model.vision_model if name == "siglip_full" else model
      ref = tower(pixel_values=torch.tensor(x)).last_hidden_state.numpy()      # HF pixels are channels first
    model.save_pretrained(str(tmp_path / name))
    cfg, params = vt.load_params(str(tmp_path / name))
    got = np.asarray(vt.forward(cfg, params, jnp.asarray(x.transpose(0, 2, 3, 1))))
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4, err_msg=name)
    if name != "siglip_full":      # transformers reads what save_hf writes
      vt.save_hf(str(tmp_path / (name + "_ours")), cfg, params)
      back = type(model).from_pretrained(str(tmp_path / (name + "_ours"))).eval()
      with torch.no_grad():
        again = back(pixel_values=torch.tensor(x)).last_hidden_state.numpy()
      np.testing.assert_allclose(again, ref, atol=1e-5, rtol=1e-5, err_msg=name)
