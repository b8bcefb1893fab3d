"""Hugging Face checkpoint IO for `jaxlab.lm.Transformer`: Llama, Qwen2 and OPT causal LMs.

A checkpoint is a LOCAL directory with `config.json` and `*.safetensors` (one file, or shards listed in
`model.safetensors.index.json`); nothing is downloaded. Supported `architectures`: `LlamaForCausalLM`,
`Qwen2ForCausalLM`, `OPTForCausalLM` (also their bare base models `LlamaModel` / `Qwen2Model` / `OPTModel`
tensors without the `model.` prefix, when tied embeddings make the head recoverable).

Tensor names and layouts (torch `nn.Linear.weight` is (out, in); ours are (in, out), with the attention
projections split per head: q (hidden, n_heads, head_dim), o (n_heads, head_dim, hidden)):

  Llama / Qwen2:  model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias},
                  model.layers.{i}.mlp.{gate,up,down}_proj.{weight,bias},
                  model.layers.{i}.{input_layernorm,post_attention_layernorm}.weight, model.norm.weight,
                  lm_head.weight (absent when tie_word_embeddings)
  OPT:            model.decoder.{embed_tokens,embed_positions}.weight, model.decoder.project_{in,out}.weight,
                  model.decoder.layers.{i}.self_attn.{q,k,v,out}_proj.{weight,bias},
                  model.decoder.layers.{i}.{self_attn_layer_norm,final_layer_norm}.{weight,bias},
                  model.decoder.layers.{i}.{fc1,fc2}.{weight,bias}, model.decoder.final_layer_norm.{weight,bias}

The q/k weights are used exactly as stored: the HF format already uses the rotate-half RoPE convention that
`jaxlab.lm.model.apply_rope` implements (only Meta's original `consolidated.*.pth` files need the
interleaved-pair permutation, and those are not read here). `save_pretrained` writes the same format back;
`save_pretrained` -> `from_pretrained` is bit-exact, and transformers reads the result.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlab.errors import CheckpointError, ConfigError, DataError, require
from jaxlab.lm.model import Transformer, TransformerConfig

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "OPTForCausalLM")
_BASE_MODELS = {"LlamaModel": "LlamaForCausalLM", "Qwen2Model": "Qwen2ForCausalLM", "OPTModel": "OPTForCausalLM"}
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "opt": "OPTForCausalLM"}
_ACTS = {"silu": "silu", "swish": "silu", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
         "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)      # buffers some older checkpoints saved


# ----------------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig
# ----------------------------------------------------------------------------------------------------


def read_hf_config(path: str) -> dict[str, Any]:
  """The parsed config.json of checkpoint directory `path`.

  Raises:
    CheckpointError: no config.json, or it is not valid JSON.
  """
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise CheckpointError(f"{path} has no config.json; pass a local Hugging Face checkpoint directory "
                          "(config.json + *.safetensors)")
  from jaxlab.data.jsonl import load_json  # pylint: disable=g-import-not-at-top
  try:
    cfg = load_json(cfg_path)
  except DataError as e:
    raise CheckpointError(str(e)) from None
  if not isinstance(cfg, dict):
    raise CheckpointError(f"{cfg_path}: expected a JSON object, got {type(cfg).__name__}")
  return cfg


def _architecture(cfg: dict[str, Any], where: str) -> str:
  archs = cfg.get("architectures") or []
  if not archs:
    mt = cfg.get("model_type")
    if mt not in _MODEL_TYPES:
      raise CheckpointError(f"{where}: model_type {mt!r} is not supported; supported architectures: "
                            f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return _MODEL_TYPES[mt]
  arch = _BASE_MODELS.get(archs[0], archs[0])
  if arch not in SUPPORTED_ARCHITECTURES:
    raise CheckpointError(f"{where}: architecture '{archs[0]}' is not supported; supported architectures: "
                          f"{', '.join(SUPPORTED_ARCHITECTURES)}")
  return arch


def _rope(cfg: dict[str, Any]) -> tuple[float, Any]:
  """(rope_theta, rope_scaling or None) from old-style keys or transformers 5's `rope_parameters`."""
  params = dict(cfg.get("rope_parameters") or {})
  theta = float(cfg.get("rope_theta", params.get("rope_theta", 10000.0)))
  scaling = cfg.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
  kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
  if not scaling or kind == "default":
    return theta, None
  return theta, {k: v for k, v in scaling.items() if k != "type"} | {"rope_type": kind}


def config_from_hf(cfg: dict[str, Any] | str, **overrides) -> TransformerConfig:
  """A `TransformerConfig` from a Hugging Face config (dict or checkpoint directory).

  Args:
    cfg: config.json contents, or a checkpoint directory holding config.json.
    **overrides: `TransformerConfig` fields to set (e.g. dtype="bfloat16", remat=True).

  Returns:
    The config.

  Raises:
    CheckpointError: unsupported architecture or settings (named in the message).
    ConfigError: an override is not a `TransformerConfig` field or has a bad value.
  """
  where = "config.json"
  if isinstance(cfg, str):
    where = os.path.join(cfg, "config.json")
    cfg = read_hf_config(cfg)
  arch = _architecture(cfg, where)
  cfg = RequiredKeys(cfg, where, arch)
  try:
    return _config_from_hf(cfg, arch, where, overrides)
  except (TypeError, ValueError) as e:
    if isinstance(e, (CheckpointError, ConfigError)):
      raise
    raise CheckpointError(f"{where}: a value has the wrong type for a {arch} config ({e})") from None


class RequiredKeys(dict):
  """A checkpoint config whose missing required keys raise a CheckpointError naming the key and the file."""

  def __init__(self, cfg: dict[str, Any], where: str, arch: str):
    super().__init__(cfg)
    self.where, self.arch = where, arch

  def __missing__(self, key):
    raise CheckpointError(f"{self.where} has no '{key}', which a {self.arch} config needs; the checkpoint's "
                          "config.json is incomplete (compare it with the model's published config.json)")


def _config_from_hf(cfg: RequiredKeys, arch: str, where: str, overrides: dict[str, Any]) -> TransformerConfig:
  get = cfg.get
  act = get("hidden_act", get("activation_function", "relu" if arch == "OPTForCausalLM" else "silu"))
  if act not in _ACTS:
    raise CheckpointError(f"{where}: activation '{act}' is not supported (supported: {sorted(_ACTS)})")
  common = dict(vocab_size=int(cfg["vocab_size"]), hidden=int(cfg["hidden_size"]),
                n_layers=int(cfg["num_hidden_layers"]), n_heads=int(cfg["num_attention_heads"]),
                max_position=int(get("max_position_embeddings", 2048)), activation=_ACTS[act],
                init_std=float(get("initializer_range", get("init_std", 0.02))))
  if arch == "OPTForCausalLM":
    if not get("layer_norm_elementwise_affine", True):
      raise CheckpointError(f"{where}: layer_norm_elementwise_affine=false OPT checkpoints are not supported")
    bias = bool(get("enable_bias", True))
    pre = bool(get("do_layer_norm_before", True))
    kw = dict(common, arch="opt", mlp_hidden=int(cfg["ffn_dim"]), norm_eps=1e-5, qkv_bias=bias, o_bias=bias,
              mlp_bias=bias, tie_embeddings=bool(get("tie_word_embeddings", True)), do_layer_norm_before=pre,
              word_embed_proj_dim=int(get("word_embed_proj_dim") or cfg["hidden_size"]),
              final_norm=pre and not get("_remove_final_layer_norm", False))
  else:
    kinds = sorted(set(get("layer_types") or ["full_attention"]) - {"full_attention"})
    if get("use_sliding_window", False) or kinds:
      raise CheckpointError(f"{where}: sliding-window attention (use_sliding_window / layer_types {kinds}) is "
                            "not supported")
    theta, scaling = _rope(cfg)
    qwen = arch == "Qwen2ForCausalLM"
    attn_bias = bool(get("attention_bias", False))
    kw = dict(common, arch="llama", mlp_hidden=int(cfg["intermediate_size"]),
              n_kv_heads=int(get("num_key_value_heads") or cfg["num_attention_heads"]),
              head_dim=int(get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]),
              rope_theta=theta, rope_scaling=scaling, norm_eps=float(get("rms_norm_eps", 1e-6)),
              qkv_bias=True if qwen else attn_bias, o_bias=False if qwen else attn_bias,
              mlp_bias=False if qwen else bool(get("mlp_bias", False)),
              tie_embeddings=bool(get("tie_word_embeddings", False)))
  try:
    base = TransformerConfig(**kw)
  except ValueError as e:
    raise CheckpointError(f"{where}: {e}") from None
  return _with_overrides(base, overrides)


def _with_overrides(config: TransformerConfig, overrides: dict[str, Any]) -> TransformerConfig:
  fields = [f.name for f in dataclasses.fields(TransformerConfig)]
  unknown = [k for k in overrides if k not in fields]
  if unknown:
    raise ConfigError(f"'{unknown[0]}' is not a TransformerConfig field; known fields: {', '.join(fields)}")
  try:
    return config.replace(**overrides)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _hf_arch_of(config: TransformerConfig) -> str:
  c = config
  if c.arch == "opt":
    if not (c.qkv_bias == c.o_bias == c.mlp_bias) or c.n_kv_heads != c.n_heads or c.pos_offset != 2 \
        or c.head_dim * c.n_heads != c.hidden:
      raise CheckpointError("this OPT config (mixed biases, GQA, head_dim or pos_offset) has no Hugging Face "
                            "OPTConfig equivalent")
    return "OPTForCausalLM"
  if c.qkv_bias and not c.o_bias and not c.mlp_bias:
    return "Qwen2ForCausalLM"
  if c.qkv_bias != c.o_bias:
    raise CheckpointError("llama config with qkv_bias != o_bias (other than Qwen2's q/k/v-only biases) has no "
                          "Hugging Face equivalent")
  return "LlamaForCausalLM"


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
  """The Hugging Face config.json dict of `config` (LlamaConfig, Qwen2Config or OPTConfig fields).

  Raises:
    CheckpointError: the config has no Hugging Face equivalent (e.g. OPT with GQA).
  """
  c = config
  arch = _hf_arch_of(c)
  inv_acts = {"silu": "silu", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
  out: dict[str, Any] = {"architectures": [arch], "vocab_size": c.vocab_size, "hidden_size": c.hidden,
                         "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
                         "max_position_embeddings": c.max_position, "tie_word_embeddings": c.tie_embeddings,
                         "torch_dtype": c.param_dtype, "dtype": c.param_dtype}
  if arch == "OPTForCausalLM":
    out.update(model_type="opt", ffn_dim=c.mlp_hidden, do_layer_norm_before=c.do_layer_norm_before,
               word_embed_proj_dim=c.word_embed_proj_dim, activation_function=inv_acts[c.activation],
               enable_bias=c.qkv_bias, layer_norm_elementwise_affine=True, init_std=c.init_std,
               _remove_final_layer_norm=bool(c.do_layer_norm_before and not c.final_norm))
    return out
  out.update(model_type="qwen2" if arch == "Qwen2ForCausalLM" else "llama", intermediate_size=c.mlp_hidden,
             num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.norm_eps,
             rope_theta=c.rope_theta, rope_scaling=None if c.rope_scaling is None else dict(c.rope_scaling),
             hidden_act=inv_acts[c.activation], initializer_range=c.init_std)
  if arch == "Qwen2ForCausalLM":
    out.update(use_sliding_window=False, max_window_layers=c.n_layers)
  else:
    out.update(attention_bias=c.qkv_bias, mlp_bias=c.mlp_bias)
  return out


# ----------------------------------------------------------------------------------------------------
# Name mapping
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Entry:
  name: str                 # HF tensor name
  path: tuple               # path in the model's pure param dict
  kind: str                 # "ident" | "linear" (n_in leading axes contracted) | "flat" (bias)
  n_in: int = 1

  def to_hf(self, a: np.ndarray) -> np.ndarray:
    if self.kind == "linear":
      n = math.prod(a.shape[:self.n_in])
      return a.reshape(n, -1).T
    if self.kind == "flat":
      return a.reshape(-1)
    return a

  def from_hf(self, t: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if self.kind == "linear":
      return t.T.reshape(shape)
    return t.reshape(shape)

  def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    if self.kind == "linear":
      n = math.prod(shape[:self.n_in])
      return (math.prod(shape) // n, n)
    if self.kind == "flat":
      return (math.prod(shape),)
    return tuple(shape)


def _entries(config: TransformerConfig) -> list[_Entry]:
  """Every parameter of `Transformer(config)` with its HF name (the checkpoint's full tensor list)."""
  c = config
  out = []

  def linear(name, path, bias, n_in=1):
    out.append(_Entry(name + ".weight", path + ("kernel",), "linear", n_in))
    if bias:
      out.append(_Entry(name + ".bias", path + ("bias",), "flat"))

  def norm(name, path, bias):
    out.append(_Entry(name + ".weight", path + ("weight",), "ident"))
    if bias:
      out.append(_Entry(name + ".bias", path + ("bias",), "ident"))

  if c.arch == "opt":
    p = "model.decoder."
    out.append(_Entry(p + "embed_tokens.weight", ("embed", "embedding"), "ident"))
    out.append(_Entry(p + "embed_positions.weight", ("pos_embed", "embedding"), "ident"))
    if c.word_embed_proj_dim != c.hidden:
      linear(p + "project_in", ("project_in",), False)
      linear(p + "project_out", ("project_out",), False)
    for i in range(c.n_layers):
      q, lp = f"{p}layers.{i}.", ("layers", i)
      for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
        linear(q + "self_attn." + theirs, lp + ("attn", ours), c.qkv_bias)
      linear(q + "self_attn.out_proj", lp + ("attn", "o"), c.o_bias, n_in=2)
      norm(q + "self_attn_layer_norm", lp + ("attn_norm",), True)
      linear(q + "fc1", lp + ("mlp", "up"), c.mlp_bias)
      linear(q + "fc2", lp + ("mlp", "down"), c.mlp_bias)
      norm(q + "final_layer_norm", lp + ("mlp_norm",), True)
    if c.final_norm:
      norm(p + "final_layer_norm", ("final_norm",), True)
  else:
    p = "model."
    out.append(_Entry(p + "embed_tokens.weight", ("embed", "embedding"), "ident"))
    for i in range(c.n_layers):
      q, lp = f"{p}layers.{i}.", ("layers", i)
      for ours in ("q", "k", "v"):
        linear(q + f"self_attn.{ours}_proj", lp + ("attn", ours), c.qkv_bias)
      linear(q + "self_attn.o_proj", lp + ("attn", "o"), c.o_bias, n_in=2)
      for ours in ("gate", "up", "down"):
        linear(q + f"mlp.{ours}_proj", lp + ("mlp", ours), c.mlp_bias)
      norm(q + "input_layernorm", lp + ("attn_norm",), False)
      norm(q + "post_attention_layernorm", lp + ("mlp_norm",), False)
    norm(p + "norm", ("final_norm",), False)
  if not c.tie_embeddings:
    linear("lm_head", ("lm_head",), False)
  return out


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


def _set(tree: dict, path, value):
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _abstract_params(config: TransformerConfig) -> Any:
  """Pure dict of ShapeDtypeStructs of `Transformer(config)`'s parameters."""
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  return nnx.state(model, nnx.Param).to_pure_dict()


# ----------------------------------------------------------------------------------------------------
# safetensors reading / writing
# ----------------------------------------------------------------------------------------------------

_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _st():
  st = require("safetensors", "hf")
  import safetensors.numpy  # noqa: F401  (submodule)
  return st


def checkpoint_files(path: str) -> list[str]:
  """The *.safetensors files of checkpoint directory `path` (from the shard index when present).

  Raises:
    CheckpointError: no safetensors files, or the index names a missing shard.
  """
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError) as e:
      raise CheckpointError(f"{index} is not a valid safetensors index ({e!r})") from None
    files = [os.path.join(path, f) for f in sorted(set(weight_map.values()))]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
      raise CheckpointError(f"{index} lists shard {os.path.basename(missing[0])}, which is not in {path}")
    return files
  files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
  if not files:
    raise CheckpointError(f"{path} has no *.safetensors files (PyTorch .bin checkpoints are not read; save "
                          "them with save_pretrained(..., safe_serialization=True))")
  return files


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a checkpoint directory (or one .safetensors file) as numpy arrays.

  bfloat16 tensors come back as `ml_dtypes.bfloat16` arrays.

  Raises:
    CheckpointError: unreadable files; MissingDependencyError: safetensors is not installed.
  """
  st = _st()
  files = [path] if os.path.isfile(path) else checkpoint_files(path)
  out: dict[str, np.ndarray] = {}
  for f in files:
    try:
      out.update(st.numpy.load_file(f))
    except (KeyError, TypeError, ValueError):     # dtypes an older safetensors' numpy backend lacks (BF16)
      out.update(_read_raw(f))
    except Exception as e:  # noqa: BLE001  (safetensors raises its own error types)
      raise CheckpointError(f"cannot read {f}: {' '.join(str(e).split())}") from None
  return out


def _read_raw(file: str) -> dict[str, np.ndarray]:
  """Minimal safetensors reader: u64 little-endian header size, JSON header, raw little-endian data."""
  import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
  try:
    size = os.path.getsize(file)
    with open(file, "rb") as f:
      n = int.from_bytes(f.read(8), "little")
      if not 0 < n <= size - 8:
        raise ValueError(f"header length {n} does not fit the {size}-byte file")
      header = json.loads(f.read(n))
      data = f.read()
  except (OSError, ValueError) as e:
    raise CheckpointError(f"cannot read {file}: not a valid safetensors file ({' '.join(str(e).split())})") from None
  if not isinstance(header, dict):
    raise CheckpointError(f"cannot read {file}: not a valid safetensors file (the header is not a JSON object)")
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      if info["dtype"] not in _ST_DTYPES:
        raise CheckpointError(f"{file}: tensor {name!r} has unsupported dtype {info['dtype']!r}")
      dt = np.dtype(ml_dtypes.bfloat16) if info["dtype"] == "BF16" else np.dtype(_ST_DTYPES[info["dtype"]])
      start, end = (int(v) for v in info["data_offsets"])
      shape = [int(d) for d in info["shape"]]
      if not 0 <= start <= end <= len(data) or (end - start) != dt.itemsize * int(np.prod(shape)):
        raise ValueError(f"data_offsets {info['data_offsets']} do not hold a {info['dtype']} tensor of shape {shape}")
      out[name] = np.frombuffer(data[start:end], dtype=dt.newbyteorder("<")).reshape(shape)
    except CheckpointError:
      raise
    except (KeyError, TypeError, ValueError) as e:
      raise CheckpointError(f"cannot read {file}: tensor {name!r} has a malformed header entry "
                            f"({' '.join(str(e).split())})") from None
  return out


def _write(tensors: dict[str, np.ndarray], file: str) -> None:
  st = _st()
  try:
    st.numpy.save_file(tensors, file, metadata={"format": "pt"})
  except (KeyError, TypeError, ValueError):        # bfloat16 with an older safetensors
    _write_raw(tensors, file)


def _write_raw(tensors: dict[str, np.ndarray], file: str) -> None:
  """Minimal safetensors writer (the format of `_read_raw`), tensors in sorted name order."""
  inv = {v: k for k, v in _ST_DTYPES.items()}
  header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  blobs, off = [], 0
  for name in sorted(tensors):
    a = np.ascontiguousarray(tensors[name])
    b = a.tobytes()
    header[name] = {"dtype": inv[a.dtype.name], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
  h = json.dumps(header).encode()
  h += b" " * (-len(h) % 8)
  with open(file, "wb") as f:
    f.write(len(h).to_bytes(8, "little") + h)
    for b in blobs:
      f.write(b)


# ----------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------


def load_hf_params(path: str | dict[str, np.ndarray], config: TransformerConfig) -> dict[str, Any]:
  """The parameters of `Transformer(config)` from a checkpoint, as a pure dict of numpy arrays.

  The dict has the structure of `jaxlab.state.ModelDef(...).split(model)[0]` (e.g. to `jax.device_put` it
  with the shardings of `create_train_state` and start fine-tuning), in `config.param_dtype`.

  Args:
    path: checkpoint directory, or a dict of HF tensor name -> array (e.g. from `read_safetensors`).
    config: the architecture (normally `config_from_hf(path)`).

  Returns:
    Nested dict of numpy arrays.

  Raises:
    CheckpointError: a missing, unexpected or mis-shaped tensor (one line naming it).
  """
  where = path if isinstance(path, str) else "the given tensors"
  tensors = read_safetensors(path) if isinstance(path, str) else dict(path)
  tensors = {k: v for k, v in tensors.items() if not k.endswith(_IGNORED_SUFFIXES)}
  if tensors and not any(k.startswith("model.") for k in tensors):          # a bare base-model checkpoint
    tensors = {(k if k == "lm_head.weight" else "model." + k): v for k, v in tensors.items()}
  abstract = _abstract_params(config)
  pdt = config.params_dtype
  out: dict[str, Any] = {}
  used = set()
  for e in _entries(config):
    shape = tuple(_get(abstract, e.path).shape)
    if e.name not in tensors:
      raise CheckpointError(f"checkpoint {where} has no tensor '{e.name}' (needed by the {config.n_layers}-layer "
                            f"{_hf_arch_of(config)} that config.json describes)")
    t = tensors[e.name]
    want = e.hf_shape(shape)
    if tuple(t.shape) != want:
      raise CheckpointError(f"checkpoint tensor '{e.name}' in {where} has shape {tuple(t.shape)}, expected {want} "
                            "from config.json")
    _set(out, e.path, np.asarray(e.from_hf(np.asarray(t), shape)).astype(pdt))
    used.add(e.name)
  ignorable = {"lm_head.weight"} if config.tie_embeddings else set()
  extra = sorted(k for k in tensors if k not in used and k not in ignorable)
  if extra:
    raise CheckpointError(f"checkpoint {where} has unexpected tensor '{extra[0]}' ({len(extra)} unexpected in all) "
                          "that the model from config.json does not use; config.json does not match the weights")
  return out


def from_pretrained(path: str, dtype=jnp.float32, **overrides) -> Transformer:
  """Loads a local Hugging Face Llama / Qwen2 / OPT checkpoint directory (nothing is downloaded).

  Args:
    path: directory with config.json and *.safetensors (single file or sharded with
      model.safetensors.index.json).
    dtype: compute dtype of the returned model (a dtype or its name); parameters are `param_dtype`
      (float32 unless overridden).
    **overrides: further `TransformerConfig` fields, e.g. remat=True, param_dtype="bfloat16",
      attention="cudnn".

  Returns:
    A `Transformer` holding the checkpoint's weights; `model(tokens_bl)` gives (batch, length, vocab)
    float32 logits.

  Raises:
    CheckpointError: missing config.json or weights, unsupported architecture, a missing / unexpected /
      mis-shaped tensor (one line naming it).
    ConfigError: an unknown override.
    MissingDependencyError: safetensors is not installed (pip install 'jaxlab[hf]').
  """
  config = config_from_hf(path, dtype=jnp.dtype(dtype).name, **overrides)
  params = load_hf_params(path, config)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  nnx.update(model, state)
  return model


def save_pretrained(model: Transformer, path: str, *, max_shard_bytes: int | None = None) -> None:
  """Writes `model` as a Hugging Face checkpoint: config.json + model.safetensors (torch layout).

  Loads back bit-exactly with `from_pretrained` and with transformers' `AutoModelForCausalLM`.

  Args:
    model: the model (any device placement; parameters are gathered to the host in their dtype).
    path: output directory (created if needed).
    max_shard_bytes: when set and the tensors are larger, write model-0000k-of-0000n.safetensors shards
      of at most about this size plus model.safetensors.index.json.

  Raises:
    CheckpointError: the config has no Hugging Face equivalent.
  """
  config = model.config
  cfg = config_to_hf(config)
  _st()
  params = nnx.state(model, nnx.Param).to_pure_dict()
  tensors = {e.name: np.ascontiguousarray(e.to_hf(np.asarray(jax.device_get(_get(params, e.path)))))
             for e in _entries(config)}
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)
  total = sum(t.nbytes for t in tensors.values())
  if not max_shard_bytes or total <= max_shard_bytes:
    _write(tensors, os.path.join(path, "model.safetensors"))
    return
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, t in tensors.items():
    if shards[-1] and size + t.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = t
    size += t.nbytes
  weight_map = {}
  for k, shard in enumerate(shards):
    fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    _write(shard, os.path.join(path, fname))
    weight_map.update({name: fname for name in shard})
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def tensor_names(config: TransformerConfig) -> Iterable[str]:
  """The HF tensor names a checkpoint of `config` holds (in writing order)."""
  return [e.name for e in _entries(config)]
