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
  layer: int | None = None  # scan_layers: the entry is slice `layer` of the stacked parameter at `path`

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

  def linear(name, path, bias, n_in=1, layer=None):
    out.append(_Entry(name + ".weight", path + ("kernel",), "linear", n_in, layer))
    if bias:
      out.append(_Entry(name + ".bias", path + ("bias",), "flat", layer=layer))

  def norm(name, path, bias, layer=None):
    out.append(_Entry(name + ".weight", path + ("weight",), "ident", layer=layer))
    if bias:
      out.append(_Entry(name + ".bias", path + ("bias",), "ident", layer=layer))

  def layer_path(i):       # (path prefix, stacked-layer index) of block i
    return (("layers",), i) if c.scan_layers else (("layers", i), None)

  if c.arch == "opt":
    p = "model.decoder."
    out.append(_Entry(p + "embed_tokens.weight", ("embed", "embedding"), "ident"))
    out.append(_Entry(p + "embed_positions.weight", ("pos_embed", "embedding"), "ident"))
    if c.word_embed_proj_dim != c.hidden:
      linear(p + "project_in", ("project_in",), False)
      linear(p + "project_out", ("project_out",), False)
    for i in range(c.n_layers):
      q, (lp, li) = f"{p}layers.{i}.", layer_path(i)
      for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
        linear(q + "self_attn." + theirs, lp + ("attn", ours), c.qkv_bias, layer=li)
      linear(q + "self_attn.out_proj", lp + ("attn", "o"), c.o_bias, n_in=2, layer=li)
      norm(q + "self_attn_layer_norm", lp + ("attn_norm",), True, layer=li)
      linear(q + "fc1", lp + ("mlp", "up"), c.mlp_bias, layer=li)
      linear(q + "fc2", lp + ("mlp", "down"), c.mlp_bias, layer=li)
      norm(q + "final_layer_norm", lp + ("mlp_norm",), True, layer=li)
    if c.final_norm:
      norm(p + "final_layer_norm", ("final_norm",), True)
  else:
    p = "model."
    out.append(_Entry(p + "embed_tokens.weight", ("embed", "embedding"), "ident"))
    for i in range(c.n_layers):
      q, (lp, li) = f"{p}layers.{i}.", layer_path(i)
      for ours in ("q", "k", "v"):
        linear(q + f"self_attn.{ours}_proj", lp + ("attn", ours), c.qkv_bias, layer=li)
      linear(q + "self_attn.o_proj", lp + ("attn", "o"), c.o_bias, n_in=2, layer=li)
      for ours in ("gate", "up", "down"):
        linear(q + f"mlp.{ours}_proj", lp + ("mlp", ours), c.mlp_bias, layer=li)
      norm(q + "input_layernorm", lp + ("attn_norm",), False, layer=li)
      norm(q + "post_attention_layernorm", lp + ("mlp_norm",), False, layer=li)
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


def _shape(abstract, e: _Entry) -> tuple[int, ...]:
  """Shape of entry e's tensor in our layout (one layer's slice of a stacked parameter)."""
  shape = tuple(_get(abstract, e.path).shape)
  return shape if e.layer is None else shape[1:]


def _value(params, e: _Entry):
  """Entry e's array in our layout (one layer's slice of a stacked parameter)."""
  a = _get(params, e.path)
  return a if e.layer is None else a[e.layer]


def _stacked(entries: list[_Entry]) -> dict[tuple, list[_Entry]]:
  """Entries grouped by parameter path, in order (one entry per path unless the layers are stacked)."""
  out: dict[tuple, list[_Entry]] = {}
  for e in entries:
    out.setdefault(e.path, []).append(e)
  return out


def _abstract_params(config: TransformerConfig) -> Any:
  """Pure dict of ShapeDtypeStructs of `Transformer(config)`'s parameters."""
  with nnx.use_eager_sharding(False):       # logical names are mapped by param_shardings, not by flax
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  return nnx.state(model, nnx.Param).to_pure_dict()


# ----------------------------------------------------------------------------------------------------
# safetensors reading / writing
# ----------------------------------------------------------------------------------------------------

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
    except (OSError, ValueError, KeyError, TypeError) as e:
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


def _unreadable(file: str, e: BaseException) -> CheckpointError:
  return CheckpointError(f"cannot read {file}: not a valid safetensors file ({' '.join(str(e).split())[:300]})")


class TensorSource:
  """The tensors of a checkpoint directory (or one .safetensors file), read lazily from memory-mapped files.

  Only headers are read on construction. `read(name, index)` returns one tensor, or the slice `index` of it
  (a tuple of slices), as numpy (bfloat16 as `ml_dtypes.bfloat16`) through `safetensors.safe_open`, which
  maps the file and copies only the requested bytes; each read opens and closes its file, so no mapping
  outlives it.

  Args:
    path: a checkpoint directory (single file or sharded with model.safetensors.index.json), a .safetensors
      file, or a dict of name -> array (tensors already in memory).

  Raises:
    CheckpointError: missing or unreadable files; MissingDependencyError: safetensors is not installed.
  """

  def __init__(self, path: str | dict[str, np.ndarray]):
    self._arrays = dict(path) if isinstance(path, dict) else None
    self.shapes: dict[str, tuple[int, ...]] = {}
    self._file: dict[str, str] = {}
    if self._arrays is not None:
      self.shapes = {k: tuple(np.shape(v)) for k, v in self._arrays.items()}
      return
    st = _st()
    for f in [path] if os.path.isfile(path) else checkpoint_files(path):
      try:
        with st.safe_open(f, framework="numpy") as h:
          for name in h.keys():
            self.shapes[name] = tuple(int(d) for d in h.get_slice(name).get_shape())
            self._file[name] = f
      except Exception as e:  # noqa: BLE001  (safetensors raises its own error types)
        raise _unreadable(f, e) from None

  def names(self) -> list[str]:
    """Every tensor name."""
    return list(self.shapes)

  def read(self, name: str, index: tuple[slice, ...] | None = None) -> np.ndarray:
    """Tensor `name`, or its slice `index` (slices with integer start/stop/step None)."""
    if self._arrays is not None:
      a = np.asarray(self._arrays[name])
      return a if index is None else a[index]
    f = self._file[name]
    try:
      with _st().safe_open(f, framework="numpy") as h:
        view = h.get_slice(name)
        if not self.shapes[name]:          # a scalar: no slicing
          return np.asarray(h.get_tensor(name))
        return np.asarray(view[index if index is not None else (slice(None),)])
    except Exception as e:  # noqa: BLE001
      raise _unreadable(f, e) from None


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a checkpoint directory (or one .safetensors file) as numpy arrays.

  bfloat16 tensors come back as `ml_dtypes.bfloat16` arrays. For large checkpoints prefer `TensorSource`
  (reads tensors or slices on demand) or `from_pretrained` (creates every parameter sharded).

  Raises:
    CheckpointError: unreadable files; MissingDependencyError: safetensors is not installed.
  """
  src = TensorSource(path)
  return {name: src.read(name) for name in src.names()}


def _write(tensors: dict[str, np.ndarray], file: str) -> None:
  _st().numpy.save_file(tensors, file, metadata={"format": "pt"})


def slice_reader(source: TensorSource, name: str, to_ours, ours_shape: tuple[int, ...], groups=None):
  """A `jax.make_array_from_callback` callback reading only the part of tensor `name` a device holds.

  Args:
    source: the checkpoint.
    name: the stored tensor.
    to_ours: maps a stored block to our layout (e.g. transpose + reshape); must commute with the grouping
      below.
    ours_shape: the parameter's shape in our layout.
    groups: how our axes come from stored axes: a list, per STORED axis, of the tuple of our axes it is
      flattened from (row-major), e.g. [(2, 3), (0, 1)] for a (out, in) torch Linear stored from our
      (in0, in1, out0, out1) kernel. None: the identity (our axis i is stored axis i).

  Returns:
    callback(index) -> numpy block of our layout: for every stored axis, the contiguous range covering our
    index's leading axis of its group (the other axes of the group whole) is read, mapped to our layout and
    then cut to `index`.
  """
  groups = [(i,) for i in range(len(ours_shape))] if groups is None else groups

  def read(index):
    index = tuple(index) + (slice(None),) * (len(ours_shape) - len(index))
    bounds = [sl.indices(n)[:2] for sl, n in zip(index, ours_shape)]
    stored, local = [], [slice(None)] * len(ours_shape)
    for axes in groups:
      lead = axes[0]
      start, stop = bounds[lead]
      rest = math.prod(ours_shape[a] for a in axes[1:])
      stored.append(slice(start * rest, stop * rest))
      local[lead] = slice(0, stop - start)
      for a in axes[1:]:
        local[a] = slice(*bounds[a])
    block_shape = tuple(bounds[a][1] - bounds[a][0] if a in [g[0] for g in groups] else ours_shape[a]
                        for a in range(len(ours_shape)))
    block = to_ours(source.read(name, tuple(stored)), block_shape)
    return block[tuple(local)]
  return read


# ----------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------


def _checked_source(path, config: TransformerConfig):
  """(source, {HF name: stored name}) after checking every tensor's presence and shape, one line per problem."""
  where = path if isinstance(path, str) else "the given tensors"
  src = TensorSource(path)
  names = {k: k for k in src.names() if not k.endswith(_IGNORED_SUFFIXES)}
  if names and not any(k.startswith("model.") for k in names):          # a bare base-model checkpoint
    names = {(k if k == "lm_head.weight" else "model." + k): k for k in names}
  abstract = _abstract_params(config)
  used = set()
  for e in _entries(config):
    shape = _shape(abstract, e)
    if e.name not in names:
      raise CheckpointError(f"checkpoint {where} has no tensor '{e.name}' (needed by the {config.n_layers}-layer "
                            f"{_hf_arch_of(config)} that config.json describes)")
    got, want = src.shapes[names[e.name]], e.hf_shape(shape)
    if tuple(got) != want:
      raise CheckpointError(f"checkpoint tensor '{e.name}' in {where} has shape {tuple(got)}, expected {want} "
                            "from config.json")
    used.add(e.name)
  ignorable = {"lm_head.weight"} if config.tie_embeddings else set()
  extra = sorted(k for k in names if k not in used and k not in ignorable)
  if extra:
    raise CheckpointError(f"checkpoint {where} has unexpected tensor '{extra[0]}' ({len(extra)} unexpected in all) "
                          "that the model from config.json does not use; config.json does not match the weights")
  return src, names, abstract


def _groups(e: _Entry, ndim: int):
  """`slice_reader` groups of an entry: how our axes are flattened into the stored ones."""
  if e.kind == "linear":
    return [tuple(range(e.n_in, ndim)), tuple(range(e.n_in))]
  if e.kind == "flat":
    return [tuple(range(ndim))]
  return None


def load_hf_params(path: str | dict[str, np.ndarray], config: TransformerConfig) -> dict[str, Any]:
  """The parameters of `Transformer(config)` from a checkpoint, as a pure dict of numpy arrays.

  The dict has the structure of `jaxlab.state.ModelDef(...).split(model)[0]`, in `config.param_dtype`. The
  whole model passes through host memory: for large models use `load_hf_arrays` / `from_pretrained`, which
  create each parameter directly with its sharding.

  Args:
    path: checkpoint directory, or a dict of HF tensor name -> array (e.g. from `read_safetensors`).
    config: the architecture (normally `config_from_hf(path)`).

  Returns:
    Nested dict of numpy arrays.

  Raises:
    CheckpointError: a missing, unexpected or mis-shaped tensor (one line naming it).
  """
  src, names, abstract = _checked_source(path, config)
  pdt = config.params_dtype
  out: dict[str, Any] = {}
  for path, group in _stacked(_entries(config)).items():
    arrays = [np.asarray(e.from_hf(np.asarray(src.read(names[e.name])), _shape(abstract, e))).astype(pdt)
              for e in group]
    _set(out, path, arrays[0] if group[0].layer is None else np.stack(arrays))
  return out


def load_hf_arrays(path: str | dict[str, np.ndarray], config: TransformerConfig, shardings: Any = None) -> Any:
  """The parameters of `Transformer(config)` as jax Arrays created directly with their shardings.

  Each parameter is built by `jax.make_array_from_callback`: every device of this process reads only the
  block of the stored tensor it holds (memory-mapped, cast to `config.param_dtype` on the fly), so the host
  never holds more than one tensor's block at a time, and on several hosts each reads only its own part.

  Args:
    path: checkpoint directory (or a dict of HF name -> array).
    config: the architecture.
    shardings: pure dict (like the parameters) of `jax.sharding.Sharding`; default: the model's logical
      axis names mapped by the mesh and rules in context (`jaxlab.mesh.use`), or the default device when no
      mesh is in context.

  Returns:
    Pure dict of jax Arrays (the structure of `load_hf_params`).

  Raises:
    CheckpointError: a missing, unexpected or mis-shaped tensor.
  """
  src, names, abstract = _checked_source(path, config)
  if shardings is None:
    shardings = param_shardings(config)
  pdt = config.params_dtype
  out: dict[str, Any] = {}
  for path, group in _stacked(_entries(config)).items():
    readers = []
    for e in group:
      shape = _shape(abstract, e)
      to_ours = (lambda t, bs: t.T.reshape(bs)) if e.kind == "linear" else (lambda t, bs: t.reshape(bs))
      readers.append(slice_reader(src, names[e.name], to_ours, shape, _groups(e, len(shape))))
    if group[0].layer is None:
      read = lambda idx, r=readers[0]: np.asarray(r(idx)).astype(pdt)
    else:                   # a stacked parameter: the block of each layer in the index's layer range
      def read(idx, rs=readers):
        idx = tuple(idx)
        layers = range(*(idx[0] if idx else slice(None)).indices(len(rs)))
        return np.stack([np.asarray(rs[i](idx[1:])).astype(pdt) for i in layers])
    _set(out, path, jax.make_array_from_callback(tuple(_get(abstract, path).shape), _get(shardings, path), read))
  return out


def param_shardings(config: TransformerConfig) -> Any:
  """Shardings of `Transformer(config)`'s parameters: logical names under the mesh and rules in context, or
  the default device without a (multi-device) mesh."""
  from jaxlab import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from jaxlab import state as state_lib  # pylint: disable=g-import-not-at-top
  md = state_lib.ModelDef(lambda rngs: Transformer(config, rngs=rngs))
  abstract = md.abstract()[0]
  mesh = mesh_lib.current_mesh()
  if not isinstance(mesh, jax.sharding.Mesh):
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda _: one, abstract)
  return state_lib.tree_shardings(md.param_specs, abstract, mesh, mesh_lib.current_rules())


def from_pretrained(path: str, dtype=jnp.float32, **overrides) -> Transformer:
  """Loads a local Hugging Face Llama / Qwen2 / OPT checkpoint directory (nothing is downloaded).

  Parameters are created already sharded (`load_hf_arrays`): under a mesh in context (`jaxlab.mesh.use`) each
  device reads only its block of each memory-mapped tensor; without one they go to the default device.

  Args:
    path: directory with config.json and *.safetensors (single file or sharded with
      model.safetensors.index.json).
    dtype: compute dtype of the returned model (a dtype or its name); parameters are `param_dtype`
      (float32 unless overridden).
    **overrides: further `TransformerConfig` fields, e.g. remat=True, param_dtype="bfloat16",
      attention="splash".

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
  params = load_hf_arrays(path, config)
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  return model


DEFAULT_MAX_SHARD_BYTES = 5 * 2**30      # transformers' default max_shard_size ("5GB")


def save_pretrained(model: Transformer, path: str, *, max_shard_bytes: int | None = DEFAULT_MAX_SHARD_BYTES
                    ) -> None:
  """Writes `model` as a Hugging Face checkpoint: config.json + model.safetensors (torch layout).

  Loads back bit-exactly with `from_pretrained` and with transformers' `AutoModelForCausalLM`. Shards are
  planned from the parameter shapes and written one at a time: the host holds one shard's tensors at most.

  Args:
    model: the model (any device placement; parameters are gathered to the host in their dtype).
    path: output directory (created if needed).
    max_shard_bytes: when the tensors are larger, write model-0000k-of-0000n.safetensors shards of at most
      about this size plus model.safetensors.index.json; None: one file whatever the size.

  Raises:
    CheckpointError: the config has no Hugging Face equivalent.
  """
  config = model.config
  cfg = config_to_hf(config)
  _st()
  params = nnx.state(model, nnx.Param).to_pure_dict()
  entries = _entries(config)
  nbytes = {e.name: int(np.prod(_shape(params, e))) * np.dtype(_get(params, e.path).dtype).itemsize
            for e in entries}
  total = sum(nbytes.values())
  shards: list[list[_Entry]] = [[]]
  size = 0
  for e in entries:
    if max_shard_bytes and shards[-1] and size + nbytes[e.name] > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(e)
    size += nbytes[e.name]
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)

  def gathered(shard):
    return {e.name: np.ascontiguousarray(e.to_hf(np.asarray(jax.device_get(_value(params, e))))) for e in shard}

  if len(shards) == 1:
    _write(gathered(shards[0]), os.path.join(path, "model.safetensors"))
    return
  weight_map = {}
  for k, shard in enumerate(shards):
    fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    _write(gathered(shard), os.path.join(path, fname))
    weight_map.update({e.name: fname for e in shard})
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def tensor_names(config: TransformerConfig) -> Iterable[str]:
  """The HF tensor names a checkpoint of `config` holds (in writing order)."""
  return [e.name for e in _entries(config)]
