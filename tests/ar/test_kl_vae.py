"""Tests of jaxlab.ar.kl_vae: MAR's KL-16 decoder (LDM AutoencoderKL) in Flax NNX.

The numpy reference below is written from the official torch code's semantics (NCHW, torch-layout weights,
two-pass GroupNorm, nearest upsampling, single-head spatial attention), independently of the module's code.
"""

import importlib.util
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jaxlab.ar import kl_vae
from jaxlab.ar.kl_vae import KL16, KLConfig, KLDecoder
from jaxlab.errors import ConfigError, DataError, MissingDependencyError

# 4x4x4 latents -> 8x8x3 images; attention at both levels; z_channels != embed_dim to catch 1x1 transposes.
TINY = KLConfig(ch=8, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4, 8), z_channels=6, embed_dim=4,
                out_ch=3, resolution=8, norm_groups=4)

# Count of MAR's KL-16 decoder + post_quant_conv, worked out by hand from models/vae.py (see _official_count).
KL16_PARAMS = 38_189_203


def _random_state_dict(config, seed=0):
  """Torch-named, torch-layout random weights (norm affines away from 1 / 0 so they matter)."""
  rng = np.random.default_rng(seed)
  sd = {}
  for key, shape in kl_vae.expected_shapes(config).items():
    if "norm" in key.split(".")[-2]:
      base = 1.0 if key.endswith("weight") else 0.0
      sd[key] = (base + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    elif len(shape) == 4:
      fan_in = shape[1] * shape[2] * shape[3]
      sd[key] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    else:
      sd[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
  return sd


_decode = nnx.jit(lambda model, z: model(z))   # one compilation per config, shared by the tests


def _latents(config, batch=2, seed=1):
  s = config.latent_size
  return np.random.default_rng(seed).standard_normal((batch, s, s, config.embed_dim)).astype(np.float32)


# --------------------------------------------------------------------------- independent numpy reference (NCHW)


def _np_conv(x, sd, name):
  w, b = sd[name + ".weight"].astype(np.float64), sd[name + ".bias"].astype(np.float64)
  k = w.shape[-1]
  p = k // 2
  xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
  hh, ww = x.shape[2], x.shape[3]
  out = np.zeros((x.shape[0], w.shape[0], hh, ww))
  for dy in range(k):
    for dx in range(k):
      out += np.einsum("bihw,oi->bohw", xp[:, :, dy:dy + hh, dx:dx + ww], w[:, :, dy, dx])
  return out + b[None, :, None, None]


def _np_norm(x, sd, name, groups, eps=1e-6):
  b, c, h, w = x.shape
  g = x.reshape(b, groups, c // groups, h, w)
  mean = g.mean(axis=(2, 3, 4), keepdims=True)
  var = g.var(axis=(2, 3, 4), keepdims=True)
  y = ((g - mean) / np.sqrt(var + eps)).reshape(b, c, h, w)
  return y * sd[name + ".weight"][None, :, None, None] + sd[name + ".bias"][None, :, None, None]


def _np_swish(x):
  return x / (1.0 + np.exp(-x))


def _np_resblock(x, sd, name, groups):
  h = _np_conv(_np_swish(_np_norm(x, sd, name + ".norm1", groups)), sd, name + ".conv1")
  h = _np_conv(_np_swish(_np_norm(h, sd, name + ".norm2", groups)), sd, name + ".conv2")
  if name + ".nin_shortcut.weight" in sd:
    x = _np_conv(x, sd, name + ".nin_shortcut")
  return x + h


def _np_attn(x, sd, name, groups):
  b, c, hh, ww = x.shape
  y = _np_norm(x, sd, name + ".norm", groups)
  q, k, v = (_np_conv(y, sd, f"{name}.{m}").reshape(b, c, hh * ww) for m in ("q", "k", "v"))
  logits = np.einsum("bci,bcj->bij", q, k) / np.sqrt(c)
  att = np.exp(logits - logits.max(-1, keepdims=True))
  att /= att.sum(-1, keepdims=True)
  out = np.einsum("bij,bcj->bci", att, v).reshape(b, c, hh, ww)
  return x + _np_conv(out, sd, name + ".proj_out")


def _np_decode(z_nhwc, sd, config):
  g = config.norm_groups
  x = _np_conv(z_nhwc.astype(np.float64).transpose(0, 3, 1, 2), sd, "post_quant_conv")
  x = _np_conv(x, sd, "decoder.conv_in")
  x = _np_resblock(x, sd, "decoder.mid.block_1", g)
  x = _np_attn(x, sd, "decoder.mid.attn_1", g)
  x = _np_resblock(x, sd, "decoder.mid.block_2", g)
  for level in reversed(range(len(config.ch_mult))):
    for j in range(config.num_res_blocks + 1):
      x = _np_resblock(x, sd, f"decoder.up.{level}.block.{j}", g)
      if f"decoder.up.{level}.attn.{j}.q.weight" in sd:
        x = _np_attn(x, sd, f"decoder.up.{level}.attn.{j}", g)
    if level != 0:
      x = _np_conv(x.repeat(2, axis=2).repeat(2, axis=3), sd, f"decoder.up.{level}.upsample.conv")
  x = _np_conv(_np_swish(_np_norm(x, sd, "decoder.norm_out", g)), sd, "decoder.conv_out")
  return x.transpose(0, 2, 3, 1)


# ------------------------------------------------------------------------------------------------------ tests


def test_config_validation():
  with pytest.raises(ConfigError, match="norm_groups"):
    KLConfig(ch=8, ch_mult=(1, 2), norm_groups=3, resolution=8)
  with pytest.raises(ConfigError, match="attn_resolutions"):
    KLConfig(ch=8, ch_mult=(1, 2), norm_groups=4, resolution=8, attn_resolutions=(16,))
  with pytest.raises(ConfigError, match="resolution"):
    KLConfig(ch=8, ch_mult=(1, 2, 2), norm_groups=4, resolution=6)
  with pytest.raises(ConfigError, match="ch_mult"):
    KLConfig(ch_mult=())
  assert KL16.latent_size == 16 and KL16.level_resolutions == (256, 128, 64, 32, 16)
  assert KL16.attn_resolutions == () and KL16.norm_groups == 32 and KL16.norm_eps == 1e-6


def _official_count(ch=128, ch_mult=(1, 1, 2, 2, 4), nrb=2, z=16, embed=16, out=3, up_attn=()):
  """Parameter count of MAR's post_quant_conv + Decoder, from the layer list of models/vae.py."""
  conv = lambda i, o, k: i * o * k * k + o
  norm = lambda c: 2 * c
  res = lambda i, o: norm(i) + conv(i, o, 3) + norm(o) + conv(o, o, 3) + (conv(i, o, 1) if i != o else 0)
  attn = lambda c: norm(c) + 4 * conv(c, c, 1)
  c = ch * ch_mult[-1]
  n = conv(embed, embed, 1) + conv(z, c, 3) + 2 * res(c, c) + attn(c)
  res_ = 256 // 2 ** (len(ch_mult) - 1)
  for level in reversed(range(len(ch_mult))):
    o = ch * ch_mult[level]
    for _ in range(nrb + 1):
      n += res(c, o) + (attn(o) if res_ in up_attn else 0)
      c = o
    if level:
      n += conv(c, c, 3)
      res_ *= 2
  return n + norm(c) + conv(c, out, 3)


def test_kl16_builds_abstractly_with_official_param_count():
  model = nnx.eval_shape(lambda: KLDecoder(KL16, rngs=nnx.Rngs(0)))
  count = sum(int(np.prod(v.shape)) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  assert count == KL16_PARAMS == _official_count()
  # LDM's kl-f16 layout (attention in the 16x16 up level) would add three 512-channel AttnBlocks.
  assert _official_count(up_attn=(16,)) - KL16_PARAMS == 3 * (2 * 512 + 4 * (512 * 512 + 512))
  shapes = kl_vae.expected_shapes(KL16)
  assert len(shapes) == 166
  assert shapes["post_quant_conv.weight"] == (16, 16, 1, 1)
  assert shapes["decoder.conv_in.weight"] == (512, 16, 3, 3)
  assert shapes["decoder.mid.block_1.norm1.weight"] == (512,)
  assert shapes["decoder.mid.attn_1.q.weight"] == (512, 512, 1, 1)
  assert shapes["decoder.up.3.block.0.nin_shortcut.weight"] == (256, 512, 1, 1)
  assert shapes["decoder.up.1.upsample.conv.weight"] == (128, 128, 3, 3)
  assert shapes["decoder.conv_out.weight"] == (3, 128, 3, 3)
  assert "decoder.up.0.upsample.conv.weight" not in shapes
  assert not any(".up." in k and ".attn." in k for k in shapes)
  out = nnx.eval_shape(lambda: KLDecoder(KL16, rngs=nnx.Rngs(0))(jnp.zeros((2, 16, 16, 16))))
  assert out.shape == (2, 256, 256, 3) and out.dtype == jnp.float32


def test_round_trip_through_safetensors(tmp_path):
  model = KLDecoder(TINY, rngs=nnx.Rngs(3))
  sd = kl_vae.params_to_state_dict(model)
  assert sd["decoder.conv_in.weight"].shape == (16, 6, 3, 3)
  assert sd["post_quant_conv.weight"].shape == (6, 4, 1, 1)
  assert sd["decoder.up.0.attn.1.proj_out.weight"].shape == (8, 8, 1, 1)
  path = tmp_path / "tiny.safetensors"
  save_file(sd, str(path))
  loaded = kl_vae.load_decoder(str(path), TINY)
  z = _latents(TINY)
  out = np.asarray(_decode(model, z))
  assert out.shape == (2, 8, 8, 3)
  np.testing.assert_array_equal(np.asarray(_decode(loaded, z)), out)
  scaled = nnx.jit(lambda m, x: m.decode_normalized(x))(loaded, z * kl_vae.MAR_LATENT_SCALE)
  np.testing.assert_allclose(np.asarray(scaled), out, atol=1e-5)


def test_matches_numpy_reference(tmp_path):
  sd = _random_state_dict(TINY)
  sd["encoder.conv_in.weight"] = np.zeros((8, 3, 3, 3), np.float32)       # ignored
  sd["quant_conv.weight"] = np.zeros((8, 12, 1, 1), np.float32)           # ignored
  path = tmp_path / "random.safetensors"
  save_file(sd, str(path))
  model = kl_vae.load_decoder(str(path), TINY)
  z = _latents(TINY)
  out = np.asarray(_decode(model, z))
  ref = _np_decode(z, sd, TINY)
  assert np.abs(ref).max() > 0.1
  np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)


def _torch_decode(z_nhwc, sd, config):
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  t = {k: torch.from_numpy(v).double() for k, v in sd.items()}
  g = config.norm_groups

  def conv(x, n):
    w = t[n + ".weight"]
    return F.conv2d(x, w, t[n + ".bias"], padding=w.shape[-1] // 2)

  def norm(x, n):
    return F.group_norm(x, g, t[n + ".weight"], t[n + ".bias"], eps=1e-6)

  def res(x, n):
    h = conv(F.silu(norm(x, n + ".norm1")), n + ".conv1")
    h = conv(F.silu(norm(h, n + ".norm2")), n + ".conv2")
    return (conv(x, n + ".nin_shortcut") if n + ".nin_shortcut.weight" in t else x) + h

  def attn(x, n):
    b, c, hh, ww = x.shape
    y = norm(x, n + ".norm")
    q, k, v = (conv(y, f"{n}.{m}").reshape(b, c, hh * ww) for m in ("q", "k", "v"))
    w = torch.softmax(torch.bmm(q.permute(0, 2, 1), k) * c ** -0.5, dim=2)
    return x + conv(torch.bmm(v, w.permute(0, 2, 1)).reshape(b, c, hh, ww), n + ".proj_out")

  with torch.no_grad():
    x = conv(torch.from_numpy(z_nhwc).double().permute(0, 3, 1, 2), "post_quant_conv")
    x = conv(x, "decoder.conv_in")
    x = res(attn(res(x, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    for level in reversed(range(len(config.ch_mult))):
      for j in range(config.num_res_blocks + 1):
        x = res(x, f"decoder.up.{level}.block.{j}")
        if f"decoder.up.{level}.attn.{j}.q.weight" in t:
          x = attn(x, f"decoder.up.{level}.attn.{j}")
      if level:
        x = conv(F.interpolate(x, scale_factor=2.0, mode="nearest"), f"decoder.up.{level}.upsample.conv")
    x = conv(F.silu(norm(x, "decoder.norm_out")), "decoder.conv_out")
  return x.permute(0, 2, 3, 1).numpy()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (optional; the numpy reference covers the same forward)")
def test_matches_torch_reference():
  sd = _random_state_dict(TINY, seed=5)
  model = nnx.merge(nnx.graphdef(KLDecoder(TINY, rngs=nnx.Rngs(0))), kl_vae.state_dict_to_params(sd, TINY))
  z = _latents(TINY, seed=6)
  np.testing.assert_allclose(np.asarray(_decode(model, z)), _torch_decode(z, sd, TINY), atol=1e-4, rtol=1e-4)


def test_bad_checkpoints(tmp_path):
  sd = _random_state_dict(TINY)
  missing = dict(sd)
  del missing["decoder.up.1.attn.0.k.bias"]
  save_file(missing, str(tmp_path / "missing.safetensors"))
  with pytest.raises(DataError, match=r"missing key 'decoder\.up\.1\.attn\.0\.k\.bias' \(expected shape \(16,\)\)"):
    kl_vae.load_decoder(str(tmp_path / "missing.safetensors"), TINY)

  wrong = dict(sd)
  wrong["decoder.conv_in.weight"] = np.zeros((16, 4, 3, 3), np.float32)
  save_file(wrong, str(tmp_path / "wrong.safetensors"))
  expected = r"'decoder\.conv_in\.weight' has shape \(16, 4, 3, 3\), expected \(16, 6, 3, 3\)"
  with pytest.raises(DataError, match=expected):
    kl_vae.load_decoder(str(tmp_path / "wrong.safetensors"), TINY)

  extra = dict(sd)
  extra["decoder.up.1.attn.2.q.weight"] = np.zeros((16, 16, 1, 1), np.float32)
  with pytest.raises(DataError, match=r"unexpected key 'decoder\.up\.1\.attn\.2\.q\.weight'"):
    kl_vae.state_dict_to_params(extra, TINY)
  kl_vae.state_dict_to_params(extra, TINY, strict=False)    # MAR's strict=False behaviour

  with pytest.raises(DataError, match="not found"):
    kl_vae.load_decoder(str(tmp_path / "absent.safetensors"), TINY)
  with pytest.raises(DataError, match="latents must be NHWC"):
    KLDecoder(TINY, rngs=nnx.Rngs(0))(np.zeros((1, 4, 4, 3), np.float32))


def test_torch_checkpoint_without_torch_gives_conversion_command(tmp_path, monkeypatch):
  path = tmp_path / "kl16.ckpt"
  path.write_bytes(b"not really a pickle")
  monkeypatch.setitem(sys.modules, "torch", None)
  with pytest.raises(MissingDependencyError) as info:
    kl_vae.load_decoder(str(path))
  message = str(info.value)
  assert "torch" in message and "safetensors" in message and "python -c" in message
  assert str(path) in message and str(tmp_path / "kl16.safetensors") in message
  assert "\n" not in message


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (optional)")
def test_reads_torch_checkpoint_with_model_key(tmp_path):
  import torch  # pylint: disable=g-import-not-at-top
  sd = _random_state_dict(TINY, seed=7)
  blob = {k: torch.from_numpy(v) for k, v in sd.items()}
  blob["encoder.conv_in.weight"] = torch.zeros(8, 3, 3, 3)
  torch.save({"model": blob}, str(tmp_path / "kl.ckpt"))
  save_file(sd, str(tmp_path / "kl.safetensors"))
  z = _latents(TINY)
  from_ckpt = _decode(kl_vae.load_decoder(str(tmp_path / "kl.ckpt"), TINY), z)
  np.testing.assert_array_equal(np.asarray(from_ckpt), np.asarray(_decode(kl_vae.load_decoder(
      str(tmp_path / "kl.safetensors"), TINY), z)))
