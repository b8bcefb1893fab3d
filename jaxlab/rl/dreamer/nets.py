"""Functional layers over plain parameter pytrees (dicts and lists of arrays), so that world models stack on a
leading axis (one per task group) and train under one `vmap`, and `jaxlab.multitask.param_sharing` selects
subsets by path ("gru/w", "enc/0/w", ...).

    p = mlp_init(key, [in, 256, 256, out])      # LayerNorm + SiLU hidden layers (DreamerV3's MLP)
    y = mlp(p, x)
    p = conv_encoder_init(key, depth=32)        # 64x64x3 -> 4 stride-2 convolutions -> (8 depth * 4 * 4,)
    p = conv_decoder_init(key, feat, depth=32)  # feat -> 4x4x(8 depth) -> 4 transposed convolutions -> 64x64x3
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def linear_init(key, n_in: int, n_out: int, scale: float = 1.0) -> dict:
  """Truncated-normal fan-in initialisation (scale 0 gives zero weights, as DreamerV3 does for output heads)."""
  w = jax.random.truncated_normal(key, -2.0, 2.0, (n_in, n_out)) * (scale / jnp.sqrt(n_in) / 0.8796)
  return {"w": w, "b": jnp.zeros((n_out,))}


def layer_norm(x, eps: float = 1e-3):
  """LayerNorm without a learned affine map (the next linear layer absorbs it)."""
  mu = x.mean(-1, keepdims=True)
  var = x.var(-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(var + eps)


def mlp_init(key, sizes, out_scale: float = 1.0) -> list:
  """Layers of an MLP with sizes [in, h1, ..., out]; the last layer's weights scaled by `out_scale`."""
  n = len(sizes) - 1
  return [linear_init(jax.random.fold_in(key, i), a, b, out_scale if i == n - 1 else 1.0)
          for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]


def mlp(params: list, x, act_last: bool = False):
  """Linear -> LayerNorm -> SiLU on every layer but the last (unless `act_last`)."""
  for i, layer in enumerate(params):
    x = x @ layer["w"] + layer["b"]
    if i < len(params) - 1 or act_last:
      x = jax.nn.silu(layer_norm(x))
  return x


_DN = ("NHWC", "HWIO", "NHWC")


def conv_encoder_init(key, depth: int = 32, channels: int = 3, stages: int = 4) -> list:
  """Four 4x4 stride-2 convolutions with depths depth x (1, 2, 4, 8) (DreamerV3's image encoder layout)."""
  out, c_in = [], channels
  for i in range(stages):
    c_out = depth * 2 ** i
    w = jax.random.truncated_normal(jax.random.fold_in(key, i), -2.0, 2.0, (4, 4, c_in, c_out))
    out.append({"w": w / jnp.sqrt(16 * c_in) / 0.8796, "b": jnp.zeros((c_out,))})
    c_in = c_out
  return out


def conv_encoder(params: list, image):
  """(..., H, W, C) float image in [-0.5, 0.5] -> (..., features) flattened."""
  lead = image.shape[:-3]
  x = image.reshape((-1,) + image.shape[-3:])
  for layer in params:
    x = jax.lax.conv_general_dilated(x, layer["w"], (2, 2), "SAME", dimension_numbers=_DN) + layer["b"]
    x = jax.nn.silu(layer_norm(x))
  return x.reshape(lead + (-1,))


def conv_encoder_out(depth: int, image_size: int = 64, stages: int = 4) -> int:
  side = image_size // 2 ** stages
  return side * side * depth * 2 ** (stages - 1)


def conv_decoder_init(key, n_in: int, depth: int = 32, channels: int = 3, image_size: int = 64,
                      stages: int = 4) -> dict:
  """A linear map to a (side, side, 8 depth) grid, then transposed convolutions doubling the side each time."""
  side = image_size // 2 ** stages
  c_top = depth * 2 ** (stages - 1)
  layers, c_in = [], c_top
  for i in range(stages):
    c_out = channels if i == stages - 1 else depth * 2 ** (stages - 2 - i)
    w = jax.random.truncated_normal(jax.random.fold_in(key, i + 1), -2.0, 2.0, (4, 4, c_in, c_out))
    layers.append({"w": w / jnp.sqrt(16 * c_in) / 0.8796, "b": jnp.zeros((c_out,))})
    c_in = c_out
  return {"in": linear_init(jax.random.fold_in(key, 0), n_in, side * side * c_top), "up": layers}


def conv_decoder(params: dict, feat, image_size: int = 64):
  """(..., feat) -> (..., H, W, C): the mean image (in [-0.5, 0.5] units)."""
  lead = feat.shape[:-1]
  stages = len(params["up"])
  side = image_size // 2 ** stages
  x = feat.reshape((-1, feat.shape[-1])) @ params["in"]["w"] + params["in"]["b"]
  x = x.reshape((-1, side, side, params["up"][0]["w"].shape[2]))
  for i, layer in enumerate(params["up"]):
    x = jax.lax.conv_transpose(x, layer["w"], (2, 2), "SAME", dimension_numbers=_DN) + layer["b"]
    if i < stages - 1:
      x = jax.nn.silu(layer_norm(x))
  return x.reshape(lead + x.shape[1:])
