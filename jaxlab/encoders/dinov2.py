"""DINOv2 with registers (Darcet et al. 2024, "Vision Transformers Need Registers") as a frozen latent encoder,
loaded from a local Hugging Face checkpoint directory (config.json + *.safetensors; nothing is downloaded).

The forward is Hugging Face's `Dinov2WithRegistersModel` (checked against transformers in the tests): a
p x p patch convolution, a CLS token, the position embeddings (bicubic, antialiased resize of the patch
grid's table when the input grid differs from the table's: `jax.image.resize` agrees with torch's
`interpolate(..., antialias=True)` to ~1e-6), the register tokens inserted after CLS (without positions),
pre-norm blocks (LayerNorm, multi-head attention with biases, layer scale; LayerNorm, GELU MLP, layer scale)
and a final LayerNorm.

As a latent (`encode`), the way Latent Forcing's RAE wrapper uses it: the image in [-1, 1] goes to [0, 1],
is resized to `input_size` (224: a 16 x 16 grid at patch 14) bicubically and normalised with the ImageNet
mean / std; the last layer's tokens go through the final LayerNorm WITHOUT its affine weights; CLS and the
registers are dropped, leaving (B, 16, 16, hidden). Standardise and rescale it with
`jaxlab.encoders.LatentNormalizer` (the official code's per-channel statistics and 0.485).

Tensor names: both transformers 5's (`attention.q_proj`, `attention.o_proj`) and the released checkpoints'
(`attention.attention.query`, `attention.output.dense`), with or without a leading `dinov2.`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.errors import CheckpointError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_ALIASES = {"attention.attention.query.": "attention.q_proj.", "attention.attention.key.": "attention.k_proj.",
            "attention.attention.value.": "attention.v_proj.", "attention.output.dense.": "attention.o_proj."}


@dataclasses.dataclass(frozen=True)
class Dinov2Config:
  """The architecture fields of a HF `Dinov2WithRegistersConfig` (config.json) that the forward uses."""
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  mlp_ratio: float = 4.0
  patch_size: int = 14
  image_size: int = 518
  num_channels: int = 3
  num_register_tokens: int = 4
  layer_norm_eps: float = 1e-6
  hidden_act: str = "gelu"
  use_swiglu_ffn: bool = False

  @classmethod
  def from_json(cls, path: str) -> "Dinov2Config":
    with open(path) as f:
      raw = json.load(f)
    cfg = cls(**{k.name: raw[k.name] for k in dataclasses.fields(cls) if k.name in raw})
    if cfg.use_swiglu_ffn:
      raise CheckpointError(f"{path}: use_swiglu_ffn=True (the giant DINOv2) is not supported; use a base/large model")
    if cfg.hidden_act != "gelu":
      raise CheckpointError(f"{path}: hidden_act={cfg.hidden_act!r}; only 'gelu' is supported")
    return cfg


def _canonical(name: str) -> str:
  name = name[len("dinov2."):] if name.startswith("dinov2.") else name
  for old, new in _ALIASES.items():
    name = name.replace(old, new)
  return name


def load_params(path: str) -> tuple[Dinov2Config, dict[str, np.ndarray]]:
  """(config, {canonical HF name: float32 array}) from a local checkpoint directory."""
  from jaxlab.lm.hf import TensorSource  # pylint: disable=g-import-not-at-top  (the LM core's safetensors reader)
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"{path} has no config.json: pass a local Hugging Face DINOv2-with-registers checkpoint "
                          "directory (e.g. facebook/dinov2-with-registers-base, downloaded beforehand)")
  cfg = Dinov2Config.from_json(cfg_path)
  src = TensorSource(path)
  params = {_canonical(k): np.asarray(src.read(k), np.float32) for k in src.names()}
  need = ["embeddings.cls_token", "embeddings.register_tokens", "embeddings.position_embeddings",
          "embeddings.patch_embeddings.projection.weight", "layernorm.weight"]
  need += [f"encoder.layer.{i}.attention.q_proj.weight" for i in range(cfg.num_hidden_layers)]
  missing = [k for k in need if k not in params]
  if missing:
    raise CheckpointError(f"checkpoint {path} has no tensor '{missing[0]}' ({len(missing)} missing): not a "
                          "DINOv2-with-registers checkpoint of the config.json's size")
  return cfg, params


def _ln(x, w=None, b=None, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
  y = (x - mu) * jax.lax.rsqrt(var + eps)
  return y if w is None else y * w + b


def _linear(p, name, x):
  return x @ p[name + ".weight"].T + p[name + ".bias"]


def forward(cfg: Dinov2Config, p: dict[str, Any], pixels: jax.Array, *, final_affine: bool = True) -> jax.Array:
  """HF `last_hidden_state` (B, 1 + registers + gh gw, hidden) of NCHW-free input: pixels (B, H, W, C), already
  normalised as the model expects. final_affine=False: the final LayerNorm without its weight and bias."""
  b, h, w, c = pixels.shape
  ps, d = cfg.patch_size, cfg.hidden_size
  gh, gw = h // ps, w // ps
  if h % ps or w % ps:
    raise CheckpointError(f"DINOv2: the input {h}x{w} is not a multiple of the patch size {ps}")
  kernel = p["embeddings.patch_embeddings.projection.weight"]                 # (d, c, ps, ps)
  patches = pixels.reshape(b, gh, ps, gw, ps, c).transpose(0, 1, 3, 5, 2, 4).reshape(b, gh * gw, c * ps * ps)
  x = patches @ kernel.reshape(d, -1).T + p["embeddings.patch_embeddings.projection.bias"]
  pos = p["embeddings.position_embeddings"]                                     # (1, 1 + n, d)
  n = pos.shape[1] - 1
  side = int(round(n ** 0.5))
  patch_pos = pos[:, 1:]
  if (gh, gw) != (side, side):
    grid = patch_pos.reshape(1, side, side, d)
    patch_pos = jax.image.resize(grid, (1, gh, gw, d), method="bicubic", antialias=True).reshape(1, gh * gw, d)
  cls = jnp.broadcast_to(p["embeddings.cls_token"] + pos[:, :1], (b, 1, d))
  x = x + patch_pos
  regs = jnp.broadcast_to(p["embeddings.register_tokens"], (b, cfg.num_register_tokens, d))
  x = jnp.concatenate([cls, regs, x], axis=1)
  heads = cfg.num_attention_heads
  hd = d // heads
  eps = cfg.layer_norm_eps
  for i in range(cfg.num_hidden_layers):
    pre = f"encoder.layer.{i}."
    y = _ln(x, p[pre + "norm1.weight"], p[pre + "norm1.bias"], eps)
    q, k, v = (_linear(p, pre + f"attention.{name}_proj", y).reshape(b, -1, heads, hd) for name in "qkv")
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * hd ** -0.5
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(b, -1, d)
    x = x + _linear(p, pre + "attention.o_proj", a) * p[pre + "layer_scale1.lambda1"]
    y = _ln(x, p[pre + "norm2.weight"], p[pre + "norm2.bias"], eps)
    y = _linear(p, pre + "mlp.fc2", jax.nn.gelu(_linear(p, pre + "mlp.fc1", y), approximate=False))
    x = x + y * p[pre + "layer_scale2.lambda1"]
  if final_affine:
    return _ln(x, p["layernorm.weight"], p["layernorm.bias"], eps)
  return _ln(x, eps=eps)


def param_shapes(cfg: Dinov2Config) -> dict[str, tuple[int, ...]]:
  """{canonical name: shape} of the tensors `forward` reads (HF layout; the mask token is not used)."""
  d, m, p = cfg.hidden_size, int(cfg.hidden_size * cfg.mlp_ratio), cfg.patch_size
  n = (cfg.image_size // p) ** 2
  out = {"embeddings.cls_token": (1, 1, d), "embeddings.register_tokens": (1, cfg.num_register_tokens, d),
         "embeddings.position_embeddings": (1, 1 + n, d),
         "embeddings.patch_embeddings.projection.weight": (d, cfg.num_channels, p, p),
         "embeddings.patch_embeddings.projection.bias": (d,), "layernorm.weight": (d,), "layernorm.bias": (d,)}
  for i in range(cfg.num_hidden_layers):
    pre = f"encoder.layer.{i}."
    for nm in ("norm1", "norm2"):
      out[pre + nm + ".weight"], out[pre + nm + ".bias"] = (d,), (d,)
    for nm in ("q_proj", "k_proj", "v_proj", "o_proj"):
      out[pre + f"attention.{nm}.weight"], out[pre + f"attention.{nm}.bias"] = (d, d), (d,)
    out[pre + "mlp.fc1.weight"], out[pre + "mlp.fc1.bias"] = (m, d), (m,)
    out[pre + "mlp.fc2.weight"], out[pre + "mlp.fc2.bias"] = (d, m), (d,)
    out[pre + "layer_scale1.lambda1"], out[pre + "layer_scale2.lambda1"] = (d,), (d,)
  return out


def preprocess(x: jax.Array, input_size: int) -> jax.Array:
  """[-1, 1] (B, H, W, 3) -> resized to input_size (bicubic), ImageNet-normalised."""
  x01 = (jnp.asarray(x, jnp.float32) + 1.0) / 2.0
  s = int(input_size)
  if x01.shape[1:3] != (s, s):
    x01 = jax.image.resize(x01, (x01.shape[0], s, s, x01.shape[-1]), method="bicubic")
  return (x01 - jnp.asarray(IMAGENET_MEAN)) / jnp.asarray(IMAGENET_STD)


def encode_with(cfg: Dinov2Config, params: dict[str, Any], x: jax.Array, input_size: int) -> jax.Array:
  """The latent grid (B, input_size / patch, input_size / patch, hidden) of images x in [-1, 1]: the patch tokens
  after the final LayerNorm without affine, CLS and registers dropped."""
  tokens = forward(cfg, params, preprocess(x, input_size), final_affine=False)
  g = int(input_size) // cfg.patch_size
  return tokens[:, 1 + cfg.num_register_tokens:].reshape(tokens.shape[0], g, g, cfg.hidden_size)


class Dinov2Encoder:
  """A frozen DINOv2-with-registers latent encoder (see the module docstring): `encode(x) -> (B, gh, gw, hidden)`.

  Args:
    path: local checkpoint directory.
    input_size: the side the image is resized to (224 for a 16 x 16 grid at patch 14).
  """

  def __init__(self, path: str, input_size: int = 224):
    self.config, params = load_params(path)
    self.params = {k: jnp.asarray(v) for k, v in params.items()}
    self.input_size = int(input_size)
    if self.input_size % self.config.patch_size:
      raise CheckpointError(f"input_size={input_size} is not a multiple of the patch size {self.config.patch_size}")

  @property
  def grid(self) -> tuple[int, int]:
    g = self.input_size // self.config.patch_size
    return (g, g)

  def preprocess(self, x: jax.Array) -> jax.Array:
    """[-1, 1] (B, H, W, 3) -> resized to input_size, ImageNet-normalised."""
    return preprocess(x, self.input_size)

  def encode(self, x: jax.Array) -> jax.Array:
    return encode_with(self.config, self.params, x, self.input_size)


def _attr(name: str) -> str:
  return name.replace(".", "__")


class Dinov2Module(nnx.Module):
  """DINOv2 with its weights held as `nnx.Param`s of a model, for encoding inside a jitted, sharded train step
  (the frozen latent encoder of a latent-conditioned DiT at full scale). Built with zeros (cheap; nothing is
  read), filled with `load_arrays` (each device reads its block of each tensor from the memory-mapped
  safetensors); the optimizer must leave them untouched (e.g. `optax.multi_transform` with `set_to_zero` for
  this subtree) and the latent taken under `jax.lax.stop_gradient`.

  Args:
    cfg: the checkpoint's architecture (`Dinov2Config.from_json`).
    input_size: the side images are resized to.
  """

  def __init__(self, cfg: Dinov2Config, input_size: int = 224):
    if int(input_size) % cfg.patch_size:
      raise CheckpointError(f"input_size={input_size} is not a multiple of the patch size {cfg.patch_size}")
    self.config, self.input_size = cfg, int(input_size)
    self.weights = nnx.Dict({_attr(k): nnx.Param(jnp.zeros(s, jnp.float32)) for k, s in param_shapes(cfg).items()})

  def __call__(self, x: jax.Array) -> jax.Array:
    p = {k: self.weights[_attr(k)][...] for k in param_shapes(self.config)}
    return encode_with(self.config, p, x, self.input_size)


def load_arrays(path: str, cfg: Dinov2Config, shardings: Any = None) -> dict[str, jax.Array]:
  """The pure-dict values of a `Dinov2Module`'s `weights` ({attribute: array}) from a local checkpoint directory,
  each created with its sharding (default: the default device) by `jax.make_array_from_callback` over the
  memory-mapped safetensors, so a device reads only its block. The checkpoint's config must match `cfg`."""
  from jaxlab.lm.hf import TensorSource  # pylint: disable=g-import-not-at-top  (the LM core's safetensors reader)
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"{path} has no config.json: pass a local Hugging Face DINOv2-with-registers checkpoint "
                          "directory (downloaded beforehand; nothing is downloaded)")
  found = Dinov2Config.from_json(cfg_path)
  if found != cfg:
    raise CheckpointError(f"{path}: its config.json ({found}) is not the model's ({cfg})")
  src = TensorSource(path)
  names = {_canonical(n): n for n in src.names()}
  out = {}
  for k, shape in param_shapes(cfg).items():
    if k not in names:
      raise CheckpointError(f"checkpoint {path} has no tensor '{k}': not a DINOv2-with-registers checkpoint")
    if tuple(src.shapes[names[k]]) != shape:
      raise CheckpointError(f"checkpoint {path}: '{k}' has shape {tuple(src.shapes[names[k]])}, expected {shape}")
    sharding = (shardings or {}).get(_attr(k)) or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    out[_attr(k)] = jax.make_array_from_callback(
        shape, sharding, lambda idx, n=names[k]: np.asarray(src.read(n, tuple(idx)), np.float32))
  return out
