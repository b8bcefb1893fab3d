"""The image encoder ("vision tower") of a vision-language model, loaded from a local Hugging Face checkpoint
directory (config.json + *.safetensors, one file or shards listed in model.safetensors.index.json; nothing is
downloaded). Two architectures:

* ViT (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale"),
  as transformers' `ViTModel` (transformers/models/vit/modeling_vit.py, config model_type "vit").
* SigLIP (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training"), as transformers'
  `SiglipVisionModel` (transformers/models/siglip/modeling_siglip.py, model_type "siglip_vision_model", or the
  `vision_config` of a full "siglip" config / of a VLM config whose vision_config is one of the two).

The forward is the same pre-norm transformer for both. With x_p^1 .. x_p^N the p x p patches of the image
(row-major over the grid, each flattened channel-first as torch's Conv2d sees it), E the patch projection
(the conv's (out, in, kh, kw) kernel as a (d, C p p) matrix) and E_pos the learned position table:

  z_0 = [x_cls; x_p^1 E + b; ..; x_p^N E + b] + E_pos     (ViT: the CLS token x_cls first; SigLIP: no CLS)
  z'_l = z_{l-1} + W_o MSA(LN_1(z_{l-1}))                   MSA: per head softmax(q k^T / sqrt(d_h)) v, with
  z_l  = z'_l + W_2 act(W_1 LN_2(z'_l) + b_1) + b_2               q, k, v = LN_1(z) W_{q,k,v} + b_{q,k,v}
  out  = LN_f(z_L)                                          (the HF `last_hidden_state`)

LayerNorms are biased, with eps = config.layer_norm_eps (ViT's default 1e-12, SigLIP's 1e-6); act is
config.hidden_act ("gelu" = exact erf GELU, ViT's default; "gelu_pytorch_tanh" = the tanh approximation,
SigLIP's). The ViT pooler and the SigLIP attention-pooling head (MAP) are not part of the tower and are ignored.
Position tables are used as stored: inputs must be image_size x image_size (`preprocess` resizes); like the
stride-p valid convolution, the patch grid is image_size // patch_size a side (pixels past it are unused).

HF tensor names (conv kernels in torch layout (out, in, kh, kw), linear weights (out, in)):

  ViT:     embeddings.{cls_token, position_embeddings, patch_embeddings.projection.{weight,bias}},
           encoder.layer.{i}.{layernorm_before, attention.attention.{query,key,value}, attention.output.dense,
           layernorm_after, intermediate.dense, output.dense}.{weight,bias}, layernorm.{weight,bias}
  SigLIP:  embeddings.{patch_embedding.{weight,bias}, position_embedding.weight},
           encoder.layers.{i}.{layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}.{weight,bias},
           post_layernorm.{weight,bias}

The checkpoint's names may carry any prefix (`vit.`, `vision_model.`, `vision_tower.vision_model.`,
`model.vision_tower.`, `visual.`, ...): it is found as whatever precedes the patch-embedding tensor's name, and
only the tensors under it are read (a VLM's language model or a text tower are never loaded). `load_params`
returns them under the canonical names above (prefix stripped); `VisionTower` holds them as `nnx.Param`s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.encoders.dinov2 import _attr, _linear, _ln
from jaxlab.errors import CheckpointError, ConfigError, DataError

# the image processors' default normalisation for both (transformers' IMAGENET_STANDARD_MEAN / _STD)
STANDARD_MEAN = (0.5, 0.5, 0.5)
STANDARD_STD = (0.5, 0.5, 0.5)

_HF_CLASS = {"vit": "ViTModel", "siglip": "SiglipVisionModel"}
_MODEL_TYPE = {"vit": "vit", "siglip": "siglip_vision_model"}
_ARCH_OF_TYPE = {"vit": "vit", "siglip_vision_model": "siglip"}
# HF defaults (configs saved with use_diff, e.g. a SiglipModel's vision_config, omit the keys at their default)
_DEFAULTS = {
    "vit": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                patch_size=16, image_size=224, num_channels=3, layer_norm_eps=1e-12, hidden_act="gelu",
                qkv_bias=True),
    "siglip": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                   patch_size=16, image_size=224, num_channels=3, layer_norm_eps=1e-6,
                   hidden_act="gelu_pytorch_tanh", qkv_bias=True),
}
# hidden_act -> the function (transformers' ACT2FN names)
_ACTS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False),
         "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
         "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
         "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
         "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
         "relu": jax.nn.relu, "silu": jax.nn.silu, "swish": jax.nn.silu}
# the per-architecture names of each role (a layer's names follow its `layer` prefix)
_NAMES = {
    "vit": dict(patch="embeddings.patch_embeddings.projection", pos="embeddings.position_embeddings",
                cls="embeddings.cls_token", layer="encoder.layer.{i}.", ln1="layernorm_before",
                q="attention.attention.query", k="attention.attention.key", v="attention.attention.value",
                o="attention.output.dense", ln2="layernorm_after", fc1="intermediate.dense", fc2="output.dense",
                final="layernorm"),
    "siglip": dict(patch="embeddings.patch_embedding", pos="embeddings.position_embedding.weight", cls=None,
                   layer="encoder.layers.{i}.", ln1="layer_norm1", q="self_attn.q_proj", k="self_attn.k_proj",
                   v="self_attn.v_proj", o="self_attn.out_proj", ln2="layer_norm2", fc1="mlp.fc1", fc2="mlp.fc2",
                   final="post_layernorm"),
}


@dataclasses.dataclass(frozen=True)
class VisionTowerConfig:
  """The architecture fields of a HF `ViTConfig` / `SiglipVisionConfig` that the forward uses.

  arch is "vit" (ViTModel: CLS token, (1, 1 + N, d) positions) or "siglip" (SiglipVisionModel: no CLS, (N, d)
  positions). qkv_bias=False (ViT only): the query / key / value projections have no biases.
  """
  arch: str = "vit"
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  patch_size: int = 16
  image_size: int = 224
  num_channels: int = 3
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"
  qkv_bias: bool = True

  def __post_init__(self):
    if self.arch not in _NAMES:
      raise ConfigError(f"VisionTowerConfig: arch={self.arch!r}; use 'vit' (ViTModel) or 'siglip' "
                        "(SiglipVisionModel)")
    if self.hidden_act not in _ACTS:
      raise ConfigError(f"VisionTowerConfig: hidden_act={self.hidden_act!r} is not supported; use one of "
                        f"{', '.join(sorted(_ACTS))}")
    if self.hidden_size % self.num_attention_heads:
      raise ConfigError(f"VisionTowerConfig: hidden_size={self.hidden_size} is not a multiple of "
                        f"num_attention_heads={self.num_attention_heads}")
    if self.patch_size > self.image_size:
      raise ConfigError(f"VisionTowerConfig: patch_size={self.patch_size} exceeds image_size={self.image_size}")

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2

  @property
  def num_tokens(self) -> int:
    """The tokens `forward` returns (drop_cls=False): the patches, plus ViT's CLS first."""
    return self.num_patches + (1 if self.arch == "vit" else 0)

  @classmethod
  def from_hf(cls, cfg: dict[str, Any] | str) -> "VisionTowerConfig":
    """From a parsed config.json, a checkpoint directory or a config.json path.

    Accepts model_type "vit", "siglip_vision_model", and any config (a full "siglip" one, a VLM's) whose
    `vision_config` is one of those (a "siglip" vision_config may omit its model_type). Keys missing from the
    config take transformers' defaults for the architecture.

    Raises:
      CheckpointError: no / unreadable config.json, an unsupported model_type, or invalid values.
    """
    where = "config"
    if isinstance(cfg, str):
      where = cfg
      if os.path.isdir(cfg):
        from jaxlab.lm.hf import read_hf_config  # pylint: disable=g-import-not-at-top
        cfg = read_hf_config(cfg)
      else:
        try:
          with open(cfg) as f:
            cfg = json.load(f)
        except (OSError, ValueError) as e:
          raise CheckpointError(f"cannot read the config {where} ({e!r}); pass a local Hugging Face checkpoint "
                                "directory (config.json + *.safetensors) or its config.json") from None
    if not isinstance(cfg, dict):
      raise CheckpointError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    raw, mt = cfg, cfg.get("model_type")
    if mt not in _ARCH_OF_TYPE:
      sub = cfg.get("vision_config")
      sub_mt = sub.get("model_type", "siglip_vision_model" if mt == "siglip" else None) if isinstance(sub, dict) \
          else None
      if sub_mt not in _ARCH_OF_TYPE:
        shown = f"model_type {mt!r}" + (f" (vision_config model_type {sub_mt!r})" if isinstance(sub, dict) else "")
        raise CheckpointError(f"{where}: {shown} is not a supported vision tower; supported: 'vit' (ViTModel), "
                              "'siglip_vision_model' (SiglipVisionModel), or a config such as 'siglip' whose "
                              "vision_config is one of them")
      raw, mt = sub, sub_mt
    arch = _ARCH_OF_TYPE[mt]
    fields = dict(_DEFAULTS[arch])
    fields.update({k: raw[k] for k in fields if raw.get(k) is not None})
    for k in ("image_size", "patch_size"):           # a few configs write [h, w]
      v = fields[k]
      if isinstance(v, (list, tuple)):
        if len(set(v)) != 1:
          raise CheckpointError(f"{where}: {k}={v} is not square; only square images / patches are supported")
        fields[k] = v[0]
    try:
      return cls(arch=arch, **{k: (type(_DEFAULTS[arch][k])(v)) for k, v in fields.items()})
    except ConfigError as e:
      raise CheckpointError(f"{where}: {e} (the vision config is inconsistent; fix config.json)") from None
    except (TypeError, ValueError) as e:
      raise CheckpointError(f"{where}: invalid value in the vision config ({e})") from None


def param_shapes(cfg: VisionTowerConfig) -> dict[str, tuple[int, ...]]:
  """{canonical HF name: shape} of every tensor `forward` reads (HF layout)."""
  n, d, m, p = _NAMES[cfg.arch], cfg.hidden_size, cfg.intermediate_size, cfg.patch_size
  out = {n["patch"] + ".weight": (d, cfg.num_channels, p, p), n["patch"] + ".bias": (d,)}
  if cfg.arch == "vit":
    out[n["cls"]] = (1, 1, d)
    out[n["pos"]] = (1, cfg.num_tokens, d)
  else:
    out[n["pos"]] = (cfg.num_patches, d)
  for i in range(cfg.num_hidden_layers):
    pre = n["layer"].format(i=i)
    for role in ("ln1", "ln2"):
      out[pre + n[role] + ".weight"] = out[pre + n[role] + ".bias"] = (d,)
    for role in ("q", "k", "v", "o"):
      out[pre + n[role] + ".weight"] = (d, d)
      if cfg.qkv_bias or role == "o":
        out[pre + n[role] + ".bias"] = (d,)
    out[pre + n["fc1"] + ".weight"], out[pre + n["fc1"] + ".bias"] = (m, d), (m,)
    out[pre + n["fc2"] + ".weight"], out[pre + n["fc2"] + ".bias"] = (d, m), (d,)
  out[n["final"] + ".weight"] = out[n["final"] + ".bias"] = (d,)
  return out


def _describe(cfg: VisionTowerConfig) -> str:
  return (f"hidden_size={cfg.hidden_size}, intermediate_size={cfg.intermediate_size}, "
          f"num_hidden_layers={cfg.num_hidden_layers}, patch_size={cfg.patch_size}, image_size={cfg.image_size}, "
          f"num_channels={cfg.num_channels}")


def check_params(cfg: VisionTowerConfig, params: dict[str, Any], where: str = "params") -> None:
  """Raises CheckpointError (one line) at the first tensor `forward` needs that is missing or mis-shaped."""
  _check_shapes(cfg, {k: tuple(np.shape(v)) for k, v in params.items()}, where)


def _check_shapes(cfg: VisionTowerConfig, found: dict[str, tuple[int, ...]], where: str) -> None:
  shapes = param_shapes(cfg)
  missing = [k for k in shapes if k not in found]
  if missing:
    raise CheckpointError(f"{where} has no tensor '{missing[0]}' ({len(missing)} missing): not a complete "
                          f"{_HF_CLASS[cfg.arch]} for its config ({_describe(cfg)}); check that config.json "
                          "belongs to these weights")
  for k, s in shapes.items():
    if tuple(found[k]) != s:
      raise CheckpointError(f"{where}: '{k}' has shape {tuple(found[k])}, expected {s} from the config "
                            f"({_describe(cfg)}); the config.json does not describe these weights")


def _find_prefix(names: Sequence[str], cfg: VisionTowerConfig, path: str) -> str:
  key = _NAMES[cfg.arch]["patch"] + ".weight"
  found = sorted({k[:-len(key)] for k in names if k == key or k.endswith("." + key)})
  if not found:
    raise CheckpointError(f"checkpoint {path} has no '{key}' under any prefix: not a {_HF_CLASS[cfg.arch]} "
                          f"checkpoint (config.json says {_MODEL_TYPE[cfg.arch]!r}); pass the directory of the "
                          "vision tower's weights")
  if len(found) > 1:
    raise CheckpointError(f"checkpoint {path} holds {len(found)} vision towers (prefixes {found}); save the one "
                          "you want on its own")
  return found[0]


def load_params(path: str) -> tuple[VisionTowerConfig, dict[str, np.ndarray]]:
  """(config, {canonical HF name: float32 array}) from a local checkpoint directory; only the tower's tensors
  are read (the pooler / head, a text tower or a language model are skipped).

  Raises:
    CheckpointError: no config.json, an unsupported model_type, a missing or mis-shaped tensor.
  """
  from jaxlab.lm.hf import TensorSource  # pylint: disable=g-import-not-at-top  (the LM core's safetensors reader)
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise CheckpointError(f"{path} has no config.json: pass a local Hugging Face ViT / SigLIP checkpoint directory "
                          "(config.json + *.safetensors, downloaded beforehand; nothing is downloaded)")
  cfg = VisionTowerConfig.from_hf(path)
  src = TensorSource(path)
  prefix = _find_prefix(src.names(), cfg, path)
  shapes = param_shapes(cfg)
  present = {k: src.shapes[prefix + k] for k in shapes if prefix + k in src.shapes}
  _check_shapes(cfg, present, f"checkpoint {path}" + (f" (prefix '{prefix}')" if prefix else ""))
  return cfg, {k: np.asarray(src.read(prefix + k), np.float32) for k in shapes}


def forward(cfg: VisionTowerConfig, params: dict[str, Any], pixels_bhwc: jax.Array, *,
            drop_cls: bool = False, remat: bool = False) -> jax.Array:
  """HF `last_hidden_state`, float32 (B, num_tokens, hidden) (drop_cls=True: without ViT's CLS; SigLIP has
  none), of pixels (B, image_size, image_size, num_channels), channels last, already normalised (`preprocess`).
  Pure: jit it with `jax.jit(forward, static_argnums=0, static_argnames=("drop_cls", "remat"))`. With remat,
  each layer is rematerialised (`jax.checkpoint`): a backward pass keeps only the layers' inputs alive, not
  their attention maps and MLP activations (the same values, one more forward of the tower).
  """
  x = jnp.asarray(pixels_bhwc, jnp.float32)
  s, c, ps, d = cfg.image_size, cfg.num_channels, cfg.patch_size, cfg.hidden_size
  if x.ndim != 4 or x.shape[1:] != (s, s, c):
    raise DataError(f"vision tower: pixels have shape {tuple(x.shape)}, expected (B, {s}, {s}, {c}) channels "
                    "last; resize and normalise them with vision_tower.preprocess")
  n, b, g = _NAMES[cfg.arch], x.shape[0], s // ps
  # the patch conv (stride = kernel, no padding: trailing rows / columns that fill no patch are dropped, as in
  # SigLIP so400m-patch14-384's 27 x 27 grid) as a matmul, each patch flattened (C, kh, kw) like the torch kernel
  x = x[:, :g * ps, :g * ps]
  patches = x.reshape(b, g, ps, g, ps, c).transpose(0, 1, 3, 5, 2, 4).reshape(b, g * g, c * ps * ps)
  x = patches @ params[n["patch"] + ".weight"].reshape(d, -1).T + params[n["patch"] + ".bias"]
  if cfg.arch == "vit":
    x = jnp.concatenate([jnp.broadcast_to(params[n["cls"]], (b, 1, d)).astype(x.dtype), x], axis=1)
    x = x + params[n["pos"]]
  else:
    x = x + params[n["pos"]][None]
  heads = cfg.num_attention_heads
  hd, eps, act = d // heads, cfg.layer_norm_eps, _ACTS[cfg.hidden_act]

  def proj(name, y):
    return _linear(params, name, y) if name + ".bias" in params else y @ params[name + ".weight"].T

  def layer(x, params, i):
    pre = n["layer"].format(i=i)
    y = _ln(x, params[pre + n["ln1"] + ".weight"], params[pre + n["ln1"] + ".bias"], eps)
    q, k, v = (proj(pre + n[r], y).reshape(b, -1, heads, hd) for r in "qkv")
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) * hd ** -0.5, axis=-1)
    x = x + _linear(params, pre + n["o"], jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, -1, d))
    y = _ln(x, params[pre + n["ln2"] + ".weight"], params[pre + n["ln2"] + ".bias"], eps)
    return x + _linear(params, pre + n["fc2"], act(_linear(params, pre + n["fc1"], y)))

  if remat:
    layer = jax.checkpoint(layer, static_argnums=(2,))
  for i in range(cfg.num_hidden_layers):
    x = layer(x, params, i)
  x = _ln(x, params[n["final"] + ".weight"], params[n["final"] + ".bias"], eps).astype(jnp.float32)
  return x[:, 1:] if drop_cls and cfg.arch == "vit" else x


def preprocess(x: jax.Array, cfg: VisionTowerConfig, mean: Sequence[float] | float | None = None,
               std: Sequence[float] | float | None = None) -> jax.Array:
  """Images (B, H, W, C) -> resized bilinearly (antialiased when shrinking) to image_size and normalised,
  (x - mean) / std per channel. x must be in the range the statistics refer to: [0, 1] for the checkpoint's
  preprocessor_config.json image_mean / image_std (None: 0.5 / 0.5, the ViT and SigLIP processors' default,
  which maps [0, 1] to [-1, 1])."""
  x = jnp.asarray(x, jnp.float32)
  if x.ndim != 4 or x.shape[-1] != cfg.num_channels:
    raise DataError(f"vision tower preprocess: images have shape {tuple(x.shape)}, expected (B, H, W, "
                    f"{cfg.num_channels}) channels last")
  s = cfg.image_size
  if x.shape[1:3] != (s, s):
    x = jax.image.resize(x, (x.shape[0], s, s, x.shape[-1]), method="bilinear")
  mean = jnp.asarray(STANDARD_MEAN[:cfg.num_channels] if mean is None else mean, jnp.float32)
  std = jnp.asarray(STANDARD_STD[:cfg.num_channels] if std is None else std, jnp.float32)
  return (x - mean) / std


def _is_norm(cfg: VisionTowerConfig, name: str) -> bool:
  n = _NAMES[cfg.arch]
  return any(name.endswith(n[r] + ".weight") for r in ("ln1", "ln2", "final"))


def init_params(cfg: VisionTowerConfig, key: jax.Array, stddev: float = 0.02) -> dict[str, jax.Array]:
  """Random canonical params, as transformers initialises: truncated normal (stddev) for the patch kernel,
  the linear weights, the position table and the CLS token, zeros for biases, ones for the LayerNorm scales."""
  return _init_params(cfg, key, float(stddev))


@functools.partial(jax.jit, static_argnums=(0, 2))       # one compiled program rather than an eager op per tensor
def _init_params(cfg: VisionTowerConfig, key: jax.Array, stddev: float) -> dict[str, jax.Array]:
  shapes = param_shapes(cfg)
  drawn = [k for k in shapes if not k.endswith(".bias") and not _is_norm(cfg, k)]
  sizes = [math.prod(shapes[k]) for k in drawn]
  flat = nnx.initializers.truncated_normal(stddev=stddev)(key, (sum(sizes),), jnp.float32)   # one draw, sliced
  out = {k: jnp.zeros(s, jnp.float32) if k.endswith(".bias") else jnp.ones(s, jnp.float32) for k, s in shapes.items()}
  for k, start, size in zip(drawn, np.cumsum([0] + sizes[:-1]), sizes):
    out[k] = flat[int(start):int(start) + size].reshape(shapes[k])
  return out


class VisionTower(nnx.Module):
  """A ViT / SigLIP vision tower with its tensors as `nnx.Param`s (HF layout, under `weights`, names with dots
  mapped to double underscores): trainable, or frozen by leaving the subtree out of the optimizer
  (`nnx.Optimizer(..., wrt=...)` / `optax.multi_transform`) and taking the output under `jax.lax.stop_gradient`;
  composable into a larger nnx model. `__call__(pixels) -> (B, tokens, hidden)` is `forward`.

  Args:
    cfg: the architecture (`VisionTowerConfig.from_hf`).
    params: canonical {name: array} (`load_params`); None: a random init from rngs.
    rngs: `nnx.Rngs` for the random init (truncated normal 0.02, zero biases, unit LayerNorm scales).
  """

  def __init__(self, cfg: VisionTowerConfig, params: dict[str, Any] | None = None, *, rngs: nnx.Rngs | None = None):
    if params is None:
      if rngs is None:
        raise ConfigError("VisionTower: pass params (e.g. from vision_tower.load_params, or use "
                          "VisionTower.from_pretrained) or rngs=nnx.Rngs(0) for a random init")
      params = init_params(cfg, rngs.params())
    else:
      check_params(cfg, params)
    self.config = cfg
    self.out_dim = cfg.hidden_size
    self.weights = nnx.Dict({_attr(k): nnx.Param(jnp.asarray(params[k], jnp.float32)) for k in param_shapes(cfg)})

  @classmethod
  def from_pretrained(cls, path: str) -> "VisionTower":
    """From a local HF checkpoint directory (see `load_params`)."""
    cfg, params = load_params(path)
    return cls(cfg, params)

  def hf_params(self) -> dict[str, jax.Array]:
    """The current tensors under their canonical HF names."""
    return {k: self.weights[_attr(k)][...] for k in param_shapes(self.config)}

  def save_pretrained(self, path: str) -> None:
    """config.json + model.safetensors that `from_pretrained` and transformers read (`save_hf`)."""
    save_hf(path, self.config, self.hf_params())

  def __call__(self, pixels_bhwc: jax.Array, *, drop_cls: bool = False, remat: bool = False) -> jax.Array:
    return forward(self.config, self.hf_params(), pixels_bhwc, drop_cls=drop_cls, remat=remat)


def hf_config(cfg: VisionTowerConfig) -> dict[str, Any]:
  """The config.json dict of a transformers `ViTModel` / `SiglipVisionModel` with this architecture."""
  out = {"architectures": [_HF_CLASS[cfg.arch]], "model_type": _MODEL_TYPE[cfg.arch], "torch_dtype": "float32"}
  out.update({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "arch"})
  if cfg.arch == "vit":
    out.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.02)
  else:
    del out["qkv_bias"]
    out.update(attention_dropout=0.0)
  return out


def save_hf(path: str, cfg: VisionTowerConfig, params: dict[str, Any]) -> None:
  """Writes config.json + model.safetensors (float32) in HF naming, as transformers' save_pretrained of a
  `ViTModel` (no prefix) or a `SiglipVisionModel` (under `vision_model.`) would; `load_params` reads it back
  bit-exactly."""
  from jaxlab.errors import require  # pylint: disable=g-import-not-at-top
  require("safetensors", "hf")
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  check_params(cfg, params)
  prefix = "vision_model." if cfg.arch == "siglip" else ""
  os.makedirs(path, exist_ok=True)
  tensors = {prefix + k: np.ascontiguousarray(np.asarray(params[k], np.float32)) for k in param_shapes(cfg)}
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config(cfg), f, indent=2)
