"""Hugging Face checkpoint IO of `jaxlab.nn.mamba_lm.MambaLM` (config.json + *.safetensors).

Reads Hugging Face `MambaConfig` / `MambaForCausalLM` checkpoints and mamba_ssm's `MambaConfig` style
(d_model / n_layer / ssm_cfg), writes the Hugging Face format (loadable by transformers'
`MambaForCausalLM.from_pretrained`). Tensor names `backbone.embeddings.weight`,
`backbone.layers.{i}.{norm.weight, mixer.*}`, `backbone.norm_f.weight` [, `lm_head.weight`]; torch's (out, in)
Linear layout, the conv weight (d_inner, 1, d_conv). File reading (sharded safetensors, errors) is shared with
the transformer loader `jaxlab.lm.hf`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.errors import CheckpointError, require
from jaxlab.lm import hf
from jaxlab.nn.mamba_lm import MambaLM


def from_pretrained(path: str, dtype=jnp.float32, scan_impl: str = "auto") -> MambaLM:
  """Loads a local Hugging Face-format Mamba checkpoint directory (nothing is downloaded).

  Args:
    path: directory with config.json (HF `MambaConfig`, or mamba_ssm's d_model/n_layer/ssm_cfg style)
      and one or more *.safetensors files with names `backbone.embeddings.weight`,
      `backbone.layers.{i}.{norm.weight, mixer.*}`, `backbone.norm_f.weight` [, `lm_head.weight`].
    dtype: compute dtype of the returned model (parameters are float32).
    scan_impl: `selective_scan` implementation of the blocks.

  Returns:
    A `MambaLM` holding the checkpoint's weights.

  Raises:
    CheckpointError: missing config.json or weights, unsupported architecture, a missing, unexpected or
      mis-shaped tensor.
    MissingDependencyError: safetensors is not installed (pip install 'jaxlab[hf]').
  """
  kwargs = read_config(path)
  src = hf.TensorSource(path)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: MambaLM(**kwargs, scan_impl=scan_impl, dtype=dtype, rngs=nnx.Rngs(0)))
  prefix = "backbone."
  if not any(k.startswith(prefix) for k in src.names()):
    prefix = ""                                           # a bare MambaModel checkpoint
  stored = {(f"{prefix}embeddings.weight" if k == f"{prefix}embedding.weight" else k): k
            for k in src.names()}                         # mamba_ssm spelling
  used = set()
  for name, var, to_hf, from_hf in hf_entries(model, prefix):
    if name not in stored:
      raise CheckpointError(f"checkpoint {path} has no tensor '{name}' (needed by the {model.n_layer}-layer "
                            "model its config.json describes)")
    shape = var.get_value().shape
    want = jax.eval_shape(to_hf, jax.ShapeDtypeStruct(shape, jnp.float32)).shape
    if tuple(src.shapes[stored[name]]) != tuple(want):
      raise CheckpointError(f"checkpoint tensor '{name}' in {path} has shape {tuple(src.shapes[stored[name]])}, "
                            f"expected {tuple(want)} from config.json")
    # One tensor on the host at a time, placed with its logical sharding (mesh in context) as it is read.
    var.set_value(jax.device_put(np.asarray(from_hf(src.read(stored[name]).astype(np.float32)), np.float32),
                                 _sharding(var)))
    used.add(name)
  extra = sorted(k for k in stored if k not in used and not (k == "lm_head.weight" and model.tie_embeddings))
  if extra:
    raise CheckpointError(f"checkpoint {path} has tensor '{extra[0]}' ({len(extra)} unexpected in all) that "
                          f"the model from config.json does not use; config.json does not match the weights")
  return model


def _sharding(var) -> jax.sharding.Sharding:
  """The NamedSharding of a variable's logical axis names under the mesh and rules in context (the default
  device without a mesh)."""
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  mesh = mesh_lib.current_mesh()
  if not isinstance(mesh, jax.sharding.Mesh):
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])
  meta = var.get_metadata()
  names = meta.get("out_sharding", meta.get("sharding_names", meta.get("sharding"))) or ()
  return mesh_lib.logical_sharding(tuple(names))


def save_pretrained(model: MambaLM, path: str) -> None:
  """Writes config.json (HF `MambaConfig`) and model.safetensors (HF tensor names and torch layout).

  The result loads with `MambaLM.from_pretrained` (bit-exact) and with transformers'
  `MambaForCausalLM.from_pretrained`.

  Args:
    model: the model.
    path: output directory (created if needed).
  """
  st = require("safetensors", "hf")
  import safetensors.numpy  # noqa: F401  (submodule)
  os.makedirs(path, exist_ok=True)
  c = model.config
  mixer = model.layers[0].mixer if model.n_layer else None
  cfg = {
      "architectures": ["MambaForCausalLM"], "model_type": "mamba",
      "vocab_size": model.padded_vocab_size, "hidden_size": model.d_model, "state_size": c["d_state"],
      "num_hidden_layers": model.n_layer, "conv_kernel": c["d_conv"], "expand": c["expand"],
      "intermediate_size": int(c["expand"] * model.d_model),
      "time_step_rank": mixer.dt_rank if mixer else c["dt_rank"], "use_bias": c["bias"],
      "use_conv_bias": c["conv_bias"], "layer_norm_epsilon": c["norm_eps"],
      "tie_word_embeddings": model.tie_embeddings, "residual_in_fp32": model.residual_in_fp32,
      "hidden_act": "silu", "torch_dtype": "float32",
  }
  for ours, theirs in (("dt_min", "time_step_min"), ("dt_max", "time_step_max"), ("dt_scale", "time_step_scale"),
                       ("dt_init", "time_step_init_scheme"), ("dt_init_floor", "time_step_floor")):
    if ours in c:
      cfg[theirs] = c[ours]
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)
  tensors = {name: np.ascontiguousarray(to_hf(np.asarray(jax.device_get(var[...]), np.float32)))
             for name, var, to_hf, _ in hf_entries(model, "backbone.")}
  st.numpy.save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def hf_entries(model: MambaLM, prefix: str) -> list[tuple]:
  """(HF name, variable, ours -> HF array fn, HF -> ours array fn) for every parameter of `model`.

  Args:
    model: the model.
    prefix: "backbone." for `MambaForCausalLM` names, "" for a bare `MambaModel`.
  """
  ident = (lambda a: a, lambda a: a)
  linear = (lambda a: a.T, lambda a: a.T)                  # ours (in, out) <-> torch (out, in)
  out = [(f"{prefix}embeddings.weight", model.embed.embedding, *ident)]
  for i, layer in enumerate(model.layers):
    p, m = f"{prefix}layers.{i}.", layer.mixer
    d, di = m.d_model, m.d_inner
    out.append((p + "norm.weight", layer.norm.weight, *ident))
    p += "mixer."
    out.append((p + "in_proj.weight", m.in_proj.kernel,
                lambda a, d=d: a.reshape(d, -1).T, lambda a, d=d, di=di: a.T.reshape(d, 2, di)))
    if m.in_proj.bias is not None:
      out.append((p + "in_proj.bias", m.in_proj.bias, lambda a: a.reshape(-1), lambda a, di=di: a.reshape(2, di)))
    out.append((p + "conv1d.weight", m.conv1d.kernel, lambda a: a.T[:, None, :], lambda a: a[:, 0, :].T))
    if m.conv1d.bias is not None:
      out.append((p + "conv1d.bias", m.conv1d.bias, *ident))
    out.append((p + "x_proj.weight", m.x_proj.kernel, *linear))
    out.append((p + "dt_proj.weight", m.dt_proj.kernel, *linear))
    out.append((p + "dt_proj.bias", m.dt_proj.bias, *ident))
    out.append((p + "A_log", m.A_log, *ident))
    out.append((p + "D", m.D, *ident))
    out.append((p + "out_proj.weight", m.out_proj.kernel, *linear))
    if m.out_proj.bias is not None:
      out.append((p + "out_proj.bias", m.out_proj.bias, *ident))
  out.append((f"{prefix}norm_f.weight", model.norm_f.weight, *ident))
  if model.lm_head is not None:
    out.append(("lm_head.weight", model.lm_head.kernel, *linear))
  return out


# ----------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------


_HF_ARCHS = ("MambaForCausalLM", "MambaModel", "MambaLMHeadModel")


def read_config(path: str) -> dict[str, Any]:
  """MambaLM keyword arguments from a checkpoint's config.json (HF or mamba_ssm style).

  Raises:
    CheckpointError: missing or unsupported config (not Mamba-1, hybrid, LayerNorm, unknown ssm_cfg keys).
  """
  cfg = hf.read_hf_config(path)
  cfg_path = os.path.join(path, "config.json")   # named in the errors below
  model_type = cfg.get("model_type")
  if model_type not in (None, "mamba"):
    raise CheckpointError(f"{cfg_path}: model_type '{model_type}' is not supported; MambaLM loads Mamba-1 "
                          "checkpoints (model_type 'mamba')")
  archs = cfg.get("architectures") or []
  bad = [a for a in archs if a not in _HF_ARCHS]
  if bad:
    raise CheckpointError(f"{cfg_path}: architecture '{bad[0]}' is not supported; expected one of {_HF_ARCHS}")
  if "hidden_size" in cfg:                                    # transformers MambaConfig
    d_model = int(cfg["hidden_size"])
    expand = cfg.get("expand", 2)
    if "intermediate_size" in cfg and int(cfg["intermediate_size"]) != int(expand * d_model):
      raise CheckpointError(f"{cfg_path}: intermediate_size {cfg['intermediate_size']} != expand * hidden_size "
                            f"({expand} * {d_model}); such checkpoints are not supported")
    kwargs = dict(
        vocab_size=int(cfg.get("vocab_size", 50280)), d_model=d_model,
        n_layer=int(cfg.get("num_hidden_layers", 32)), d_state=int(cfg.get("state_size", 16)),
        d_conv=int(cfg.get("conv_kernel", 4)), expand=expand, dt_rank=cfg.get("time_step_rank", "auto"),
        conv_bias=bool(cfg.get("use_conv_bias", True)), bias=bool(cfg.get("use_bias", False)),
        pad_vocab_size_multiple=1, norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        residual_in_fp32=bool(cfg.get("residual_in_fp32", True)))
    for theirs, ours in (("time_step_min", "dt_min"), ("time_step_max", "dt_max"), ("time_step_scale", "dt_scale"),
                         ("time_step_init_scheme", "dt_init"), ("time_step_floor", "dt_init_floor")):
      if theirs in cfg:
        kwargs[ours] = cfg[theirs]
    return kwargs
  if "d_model" in cfg:                                        # mamba_ssm MambaConfig
    ssm = dict(cfg.get("ssm_cfg") or {})
    if ssm.get("layer", "Mamba1") != "Mamba1":
      raise CheckpointError(f"{cfg_path}: ssm_cfg.layer '{ssm['layer']}' is not supported (Mamba1 only)")
    if not cfg.get("rms_norm", True):
      raise CheckpointError(f"{cfg_path}: rms_norm=false (LayerNorm) checkpoints are not supported")
    if cfg.get("d_intermediate", 0) or cfg.get("attn_layer_idx"):
      raise CheckpointError(f"{cfg_path}: hybrid checkpoints (d_intermediate MLPs / attention layers) are not "
                            "supported")
    known = ("d_state", "d_conv", "expand", "dt_rank", "dt_min", "dt_max", "dt_init", "dt_scale",
             "dt_init_floor", "conv_bias", "bias")
    unknown = sorted(k for k in ssm if k not in known + ("layer", "use_fast_path"))
    if unknown:
      raise CheckpointError(f"{cfg_path}: ssm_cfg key '{unknown[0]}' is not supported")
    return dict(vocab_size=int(cfg["vocab_size"]), d_model=int(cfg["d_model"]), n_layer=int(cfg["n_layer"]),
                pad_vocab_size_multiple=int(cfg.get("pad_vocab_size_multiple", 8)),
                tie_embeddings=bool(cfg.get("tie_embeddings", True)),
                residual_in_fp32=bool(cfg.get("residual_in_fp32", True)),
                **{k: ssm[k] for k in known if k in ssm})
  raise CheckpointError(f"{cfg_path} has neither 'hidden_size' (Hugging Face MambaConfig) nor 'd_model' "
                        "(mamba_ssm config); it is not a Mamba checkpoint config")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of the *.safetensors files in `path` (numpy; bfloat16 is widened to float32).

  Reading (sharded files, the bf16 fallback, errors) is the transformer loader's (`jaxlab.lm.hf`).
  """
  tensors = hf.read_safetensors(path)
  return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in tensors.items()}
