"""jaxlab.lm.model / jaxlab.lm.hf: Llama, Qwen2 and OPT decoder LMs - shapes, causality, packed segments,
an independent float64 numpy forward, remat, bf16, 4x2-mesh sharding == single device, Hugging Face
checkpoint round trips and errors, and (optional) logits of transformers' models."""

import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxlab import mesh as mesh_lib
from jaxlab.errors import CheckpointError, ConfigError, MissingDependencyError
from jaxlab.lm import Transformer, TransformerConfig, from_pretrained, save_pretrained
from jaxlab.lm import hf
from jaxlab.state import ModelDef, create_train_state, tree_shardings

V, T = 64, 12          # every test uses vocab V and (2, T) tokens so compiled computations are shared
BASE = dict(vocab_size=V, hidden=32, n_layers=2, n_heads=4, mlp_hidden=64, max_position=32)
CONFIGS = {
    "llama": TransformerConfig(**BASE, arch="llama", n_kv_heads=2, rope_theta=500.0),
    "qwen2": TransformerConfig(**BASE, arch="llama", n_kv_heads=2, qkv_bias=True, tie_embeddings=True),
    "opt": TransformerConfig(**BASE, arch="opt", qkv_bias=True, o_bias=True, mlp_bias=True, tie_embeddings=True),
    # OPT-350m style: post-LN, no final LayerNorm, narrower word embeddings with project_in / project_out.
    "opt_post": TransformerConfig(**BASE, arch="opt", qkv_bias=True, o_bias=True, mlp_bias=True,
                                  tie_embeddings=True, do_layer_norm_before=False, word_embed_proj_dim=16),
}


def _perturbed(model, seed=100, std=0.2):
  """Adds N(0, std) noise to every parameter (biases and norm weights too), so no init symmetry hides a bug."""
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  new = [x + std * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  nnx.update(model, jax.tree.unflatten(treedef, new))
  return model


@functools.lru_cache(maxsize=None)
def _model(name, **changes):
  """Shared perturbed test models (tests must not modify them)."""
  return _perturbed(Transformer(CONFIGS[name].replace(**changes), rngs=nnx.Rngs(0)))


@functools.partial(jax.jit, static_argnums=0)
def _fwd(graphdef, state, tokens, positions, segments):
  return nnx.merge(graphdef, state)(tokens, positions, segment_ids_bl=segments)


def _logits(model, tokens, positions=None, segments=None):
  gd, st = nnx.split(model)
  b, l = tokens.shape
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(l), (b, l))
  if segments is None:
    segments = jnp.ones((b, l), jnp.int32)
  return np.asarray(_fwd(gd, st, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segments)))


def _tokens(seed=0, shape=(2, T)):
  return np.asarray(jax.random.randint(jax.random.key(seed), shape, 0, V))


# ------------------------------------------------------------------------------------------------
# Model
# ------------------------------------------------------------------------------------------------


def test_config_validation_and_hashability():
  c = CONFIGS["llama"]
  assert c.head_dim == 8 and c.n_kv_heads == 2 and c.activation == "silu" and hash(c) == hash(c.replace())
  assert CONFIGS["opt"].activation == "relu" and CONFIGS["opt"].final_norm and not CONFIGS["opt_post"].final_norm
  with pytest.raises(ValueError, match="n_kv_heads=3 must divide n_heads=4"):
    c.replace(n_kv_heads=3)
  with pytest.raises(ValueError, match="arch='gpt9' is not one of"):
    c.replace(arch="gpt9")
  with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
    c.replace(rope_scaling={"rope_type": "yarn", "factor": 2.0})
  assert c.replace(dtype=jnp.bfloat16).dtype == "bfloat16"
  wider = c.replace(hidden=64, n_heads=8)           # derived fields follow their sources; n_kv_heads was set
  assert (wider.head_dim, wider.n_kv_heads) == (8, 2)


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_logits_shape_dtype_params_and_modeldef(name):
  model = _model(name)
  tokens = _tokens()
  out = jax.jit(lambda t: model(t))(jnp.asarray(tokens))
  assert out.shape == (2, T, V) and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), _logits(model, tokens), rtol=1e-5, atol=1e-5)
  md = ModelDef(lambda rngs: Transformer(CONFIGS[name], rngs=rngs))   # keeps no Rngs, builds outside a mesh
  specs = md.param_specs
  assert specs["embed"]["embedding"] == P("vocab", "embed")
  assert specs["layers"][1]["attn"]["q"]["kernel"] == P("embed", "heads", None)
  assert specs["layers"][1]["attn"]["k"]["kernel"] == P("embed", "kv", None)
  assert specs["layers"][0]["attn"]["o"]["kernel"] == P("heads", None, "embed")
  assert specs["layers"][0]["mlp"]["up"]["kernel"] == P("embed", "mlp")
  assert specs["layers"][0]["mlp"]["down"]["kernel"] == P("mlp", "embed")
  assert specs["final_norm"]["weight"] == P("embed")
  if name == "llama":
    assert specs["lm_head"]["kernel"] == P("embed", "vocab")
    assert specs["layers"][0]["mlp"]["gate"]["kernel"] == P("embed", "mlp")
  else:
    assert specs["pos_embed"]["embedding"] == P(None, "embed") and "lm_head" not in specs
    assert specs["layers"][0]["attn"]["q"]["bias"] == P("heads", None)


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_causal(name):
  model = _model(name)
  a = _tokens(1)
  b = a.copy()
  b[:, 5:] = (b[:, 5:] + 7) % V
  la, lb = _logits(model, a), _logits(model, b)
  np.testing.assert_allclose(la[:, :5], lb[:, :5], rtol=1e-6, atol=1e-6)
  assert np.abs(la[:, 5:] - lb[:, 5:]).max() > 1e-3


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_packed_segments_equal_separate_sequences(name):
  """Row = [seq A (5 tokens) | seq B (7 tokens)], positions restart per segment: block-diagonal causal."""
  model = _model(name)
  tok = _tokens(2)
  seg = np.array([[1] * 5 + [2] * 7, [3] * 12])
  pos = np.array([list(range(5)) + list(range(7)), list(range(12))])
  packed = _logits(model, tok, pos, seg)
  sep_a = _logits(model, np.stack([tok[0], tok[0]])[:, :T])            # same shapes: reuse the compile
  np.testing.assert_allclose(packed[0, :5], sep_a[0, :5], rtol=1e-5, atol=1e-5)
  shifted = np.stack([np.concatenate([tok[0, 5:], tok[0, :5]])] * 2)  # B first, then anything (causal)
  sep_b = _logits(model, shifted)
  np.testing.assert_allclose(packed[0, 5:], sep_b[0, :7], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(packed[1], _logits(model, tok)[1], rtol=1e-5, atol=1e-5)


# An independent float64 numpy forward written from the HF tensors (torch layout) and the HF equations.
def _np_forward(t, cfg, tokens):
  L = len(tokens)
  lin = lambda name, x: x @ t[name + ".weight"].T + (t[name + ".bias"] if name + ".bias" in t else 0.0)
  H = cfg["num_attention_heads"]
  d = cfg["hidden_size"] // H

  def attn(q, k, v, rope):
    hk = k.shape[-1] // d
    q, k, v = q.reshape(L, H, d), k.reshape(L, hk, d), v.reshape(L, hk, d)
    if rope is not None:
      cos, sin = rope
      rot = lambda x: np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
      q, k = q * cos[:, None] + rot(q) * sin[:, None], k * cos[:, None] + rot(k) * sin[:, None]
    k, v = np.repeat(k, H // hk, axis=1), np.repeat(v, H // hk, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v).reshape(L, H * d)

  if cfg["model_type"] == "opt":
    p = "model.decoder."
    ln = lambda name, x: ((x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
                          * t[name + ".weight"] + t[name + ".bias"])
    pre = cfg["do_layer_norm_before"]
    h = t[p + "embed_tokens.weight"][tokens]
    if p + "project_in.weight" in t:
      h = lin(p + "project_in", h)
    h = h + t[p + "embed_positions.weight"][np.arange(L) + 2]
    for i in range(cfg["num_hidden_layers"]):
      q = f"{p}layers.{i}."
      x = ln(q + "self_attn_layer_norm", h) if pre else h
      a = lin(q + "self_attn.out_proj", attn(*(lin(q + f"self_attn.{n}_proj", x) for n in "qkv"), None))
      h = h + a if pre else ln(q + "self_attn_layer_norm", h + a)
      x = ln(q + "final_layer_norm", h) if pre else h
      m = lin(q + "fc2", np.maximum(lin(q + "fc1", x), 0))
      h = h + m if pre else ln(q + "final_layer_norm", h + m)
    if pre:
      h = ln(p + "final_layer_norm", h)
    if p + "project_out.weight" in t:
      h = lin(p + "project_out", h)
    return h @ t[p + "embed_tokens.weight"].T
  rms = lambda name, x: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * t[name + ".weight"]
  ang = np.arange(L)[:, None] * cfg["rope_theta"] ** (-np.arange(0, d, 2) / d)[None]
  rope = (np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1))
  h = t["model.embed_tokens.weight"][tokens]
  for i in range(cfg["num_hidden_layers"]):
    q = f"model.layers.{i}."
    x = rms(q + "input_layernorm", h)
    h = h + lin(q + "self_attn.o_proj", attn(*(lin(q + f"self_attn.{n}_proj", x) for n in "qkv"), rope))
    x = rms(q + "post_attention_layernorm", h)
    g = lin(q + "mlp.gate_proj", x)
    h = h + lin(q + "mlp.down_proj", g / (1 + np.exp(-g)) * lin(q + "mlp.up_proj", x))
  h = rms("model.norm", h)
  return h @ (t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]).T


@pytest.mark.parametrize("name", ["llama", "qwen2", "opt", "opt_post"])
def test_hf_round_trip_is_bitwise_and_matches_numpy_reference(tmp_path, name):
  pytest.importorskip("safetensors")
  model = _model(name)
  save_pretrained(model, str(tmp_path))
  cfg = json.load(open(tmp_path / "config.json"))
  arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(name, "OPTForCausalLM")
  assert cfg["architectures"] == [arch]
  t = {k: v.astype(np.float64) for k, v in hf.read_safetensors(str(tmp_path)).items()}
  assert sorted(t) == sorted(hf.tensor_names(model.config))
  if name == "llama":
    assert t["model.layers.0.self_attn.q_proj.weight"].shape == (32, 32)
    assert t["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32)
    assert t["model.layers.1.self_attn.o_proj.weight"].shape == (32, 32)
    assert t["model.layers.1.mlp.gate_proj.weight"].shape == (64, 32) and "lm_head.weight" in t
  if name == "qwen2":
    assert t["model.layers.0.self_attn.k_proj.bias"].shape == (16,) and "lm_head.weight" not in t
    assert "model.layers.0.self_attn.o_proj.bias" not in t
  if name == "opt_post":
    assert t["model.decoder.project_in.weight"].shape == (32, 16) and "model.decoder.final_layer_norm.weight" not in t
  back = from_pretrained(str(tmp_path))
  assert back.config == model.config
  for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(back, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tokens = _tokens(3)
  got = _logits(back, tokens)
  np.testing.assert_array_equal(got, _logits(model, tokens))
  want = _np_forward(t, cfg, tokens[0])
  np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)


def test_sharded_checkpoint_bf16_tensors_and_overrides(tmp_path):
  pytest.importorskip("safetensors")
  import ml_dtypes
  model = _model("llama")
  save_pretrained(model, str(tmp_path / "sharded"), max_shard_bytes=20_000)
  index = json.load(open(tmp_path / "sharded" / "model.safetensors.index.json"))
  assert len(set(index["weight_map"].values())) > 1
  back = from_pretrained(str(tmp_path / "sharded"), dtype=jnp.bfloat16, remat=True)
  assert back.config == model.config.replace(dtype="bfloat16", remat=True)
  np.testing.assert_array_equal(np.asarray(back.layers[1].attn.v.kernel[...]),
                                np.asarray(model.layers[1].attn.v.kernel[...]))
  # bfloat16 tensors are read and widened to the float32 parameters.
  t = hf.read_safetensors(str(tmp_path / "sharded"))
  (tmp_path / "bf16").mkdir()
  hf._write({k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()}, str(tmp_path / "bf16" / "model.safetensors"))
  os.link(tmp_path / "sharded" / "config.json", tmp_path / "bf16" / "config.json")
  got = from_pretrained(str(tmp_path / "bf16"))
  want = t["model.layers.0.mlp.up_proj.weight"].astype(ml_dtypes.bfloat16).astype(np.float32).T
  np.testing.assert_array_equal(np.asarray(got.layers[0].mlp.up.kernel[...]), want)
  # Pure numpy params with the structure of ModelDef's param dicts (to start fine-tuning on a mesh).
  params = hf.load_hf_params(str(tmp_path / "sharded"), model.config)
  md = ModelDef(lambda rngs: Transformer(model.config, rngs=rngs))
  assert jax.tree.structure(params) == jax.tree.structure(md.abstract()[0])
  assert isinstance(params["layers"][1]["attn"]["o"]["kernel"], np.ndarray)
  with pytest.raises(ConfigError, match="'n_experts' is not a TransformerConfig field"):
    from_pretrained(str(tmp_path / "sharded"), n_experts=4)


def test_checkpoint_errors_are_one_line_and_name_the_problem(tmp_path):
  pytest.importorskip("safetensors")
  with pytest.raises(CheckpointError, match="has no config.json"):
    from_pretrained(str(tmp_path / "nowhere"))
  good = tmp_path / "good"
  save_pretrained(_model("llama"), str(good))
  tensors = hf.read_safetensors(str(good))
  cfg = json.load(open(good / "config.json"))

  def case(name, cfg_, tensors_):
    d = tmp_path / name
    d.mkdir()
    json.dump(cfg_, open(d / "config.json", "w"))
    if tensors_ is not None:
      hf._write(tensors_, str(d / "model.safetensors"))
    return str(d)

  errors = []
  with pytest.raises(CheckpointError, match="architecture 'MixtralForCausalLM' is not supported; supported "
                     "architectures: LlamaForCausalLM, Qwen2ForCausalLM, OPTForCausalLM") as e:
    from_pretrained(case("arch", dict(cfg, architectures=["MixtralForCausalLM"]), tensors))
  errors.append(e)
  missing = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
  with pytest.raises(CheckpointError, match="has no tensor 'model.layers.1.mlp.up_proj.weight'") as e:
    from_pretrained(case("missing", cfg, missing))
  errors.append(e)
  with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.1.input_layernorm.weight' "
                     r"\(9 unexpected in all\)") as e:
    from_pretrained(case("extra", dict(cfg, num_hidden_layers=1), tensors))
  errors.append(e)
  bad = dict(tensors, **{"model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)})
  with pytest.raises(CheckpointError, match=r"'model.layers.0.self_attn.k_proj.weight' .* has shape \(32, 32\), "
                     r"expected \(16, 32\)") as e:
    from_pretrained(case("shape", cfg, bad))
  errors.append(e)
  with pytest.raises(CheckpointError, match=r"no \*.safetensors files") as e:
    from_pretrained(case("empty", cfg, None))
  errors.append(e)
  assert all("\n" not in str(e.value) for e in errors)


def test_missing_safetensors_package_names_the_extra(tmp_path, monkeypatch):
  json.dump(hf.config_to_hf(CONFIGS["llama"]), open(tmp_path / "config.json", "w"))
  monkeypatch.setitem(sys.modules, "safetensors", None)
  with pytest.raises(MissingDependencyError, match=r"jaxlab\[hf\]"):
    from_pretrained(str(tmp_path))


def _loss(model, tokens):
  logits = model(tokens[:, :-1])
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))


def test_remat_gives_identical_loss_and_grads():
  model = _model("llama")
  gd, st = nnx.split(model)
  remat = Transformer(model.config.replace(remat=True), rngs=nnx.Rngs(0))
  gd_r, _ = nnx.split(remat)
  tokens = jnp.asarray(_tokens(4))
  f = lambda g: jax.jit(jax.value_and_grad(lambda s, t: _loss(nnx.merge(g, s), t)))
  (l0, g0), (l1, g1) = f(gd)(st, tokens), f(gd_r)(st, tokens)
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
  assert "remat" in str(jax.make_jaxpr(lambda s, t: _loss(nnx.merge(gd_r, s), t))(st, tokens))


def test_bfloat16_compute_runs_close_to_float32():
  model = _model("llama")
  st = nnx.split(model)[1]
  gd16, _ = nnx.split(Transformer(model.config.replace(dtype="bfloat16"), rngs=nnx.Rngs(0)))
  tokens = jnp.asarray(_tokens(5))
  a = _logits(model, tokens)                              # float32, compiled once for every llama test
  b16 = jax.jit(lambda s, t: nnx.merge(gd16, s)(t))(st, tokens)
  b = np.asarray(b16)
  assert b16.dtype == jnp.float32 and np.isfinite(b).all()
  assert np.abs(a - b).max() < 0.05 * np.abs(a).max()
  assert np.abs(a - b).max() > 0       # it did compute in bfloat16


def test_sharded_loss_and_update_equal_single_device():
  """4x2 mesh, FSDP rules (embed over data, heads/mlp/vocab over model) == one device (rtol 1e-5)."""
  default, rules = mesh_lib.RULES["tensor_parallel"], mesh_lib.RULES["fsdp"]
  cfg = CONFIGS["llama"]
  md = ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))
  tx = optax.sgd(0.5)
  tokens = _tokens(6, (8, T))

  def step(state, batch):
    def objective(params):
      return _loss(md.merge(params, state.model_state), batch)
    loss, grads = jax.value_and_grad(objective)(state.params)
    updates, _ = tx.update(grads, state.opt_state, state.params)
    return loss, optax.apply_updates(state.params, updates)

  mesh = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  abstract = md.abstract()[0]
  for r, q_spec, emb_spec, kv_spec in ((default, P(None, "model"), P("model"), P()),
                                       (rules, P("data", "model"), P("model", "data"), P("data"))):
    sh = tree_shardings(md.param_specs, abstract, mesh, r)
    assert sh["layers"][0]["attn"]["q"]["kernel"].spec == q_spec
    assert sh["embed"]["embedding"].spec == emb_spec
    assert sh["layers"][1]["attn"]["k"]["kernel"].spec == kv_spec
  state, sh = create_train_state(md, tx, mesh, rules, seed=0)
  assert state.params["layers"][0]["mlp"]["down"]["kernel"].sharding.spec == P("model", "data")
  batch = jax.device_put(jnp.asarray(tokens), mesh_lib.batch_sharding(mesh, rules))
  loss, params = jax.jit(step, in_shardings=(sh, mesh_lib.batch_sharding(mesh, rules)))(state, batch)
  state1 = jax.device_put(jax.device_get(state), jax.devices()[0])     # the same values on one device
  loss1, params1 = jax.jit(step)(state1, jnp.asarray(tokens))
  np.testing.assert_allclose(float(loss), float(loss1), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Optional: Hugging Face transformers
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_layers", [2, 4], ids=["unrolled", "scanned"])
def test_transformers_logits_match(tmp_path, n_layers):
  """Tiny random transformers Llama / Qwen2 / OPT models, saved as safetensors, loaded by us (and back);
  4 layers load as a scanned (stacked-layer) model."""
  torch = pytest.importorskip("torch", reason="torch (with transformers) is needed for the parity check")
  transformers = pytest.importorskip("transformers", reason="transformers is needed for the parity check")
  common = dict(vocab_size=V, hidden_size=32, num_hidden_layers=n_layers, num_attention_heads=4,
                max_position_embeddings=64)
  cases = {
      "llama": transformers.LlamaConfig(**common, intermediate_size=48, num_key_value_heads=2, rope_theta=500.0,
                                        tie_word_embeddings=False),
      "llama3_scaled_bias": transformers.LlamaConfig(
          **common, intermediate_size=48, num_key_value_heads=1, attention_bias=True, mlp_bias=True,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8}),
      "qwen2": transformers.Qwen2Config(**common, intermediate_size=48, num_key_value_heads=2,
                                        tie_word_embeddings=True),
      "opt": transformers.OPTConfig(**common, ffn_dim=48, tie_word_embeddings=True),
      "opt_350m_style": transformers.OPTConfig(**common, ffn_dim=48, do_layer_norm_before=False,
                                               word_embed_proj_dim=16),
  }
  classes = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
             "opt": transformers.OPTForCausalLM}
  tokens = np.random.default_rng(0).integers(0, V, (2, 13))
  diffs = {}
  for name, cfg in cases.items():
    cls = classes[name.split("_")[0].replace("llama3", "llama")]
    torch.manual_seed(0)
    ref = cls(cfg).eval()
    with torch.no_grad():                         # move every weight off its init
      for p in ref.parameters():
        p.add_(0.1 * torch.randn_like(p))
    ref.save_pretrained(str(tmp_path / name), safe_serialization=True)
    ours = from_pretrained(str(tmp_path / name))
    assert ours.config.scan_layers == (n_layers >= 4)
    with torch.no_grad():
      want = ref(torch.tensor(tokens)).logits.float().numpy()
    got = np.asarray(ours(jnp.asarray(tokens)))
    diffs[name] = float(np.abs(got - want).max())
    save_pretrained(ours, str(tmp_path / f"ours_{name}"))
    again = cls.from_pretrained(str(tmp_path / f"ours_{name}")).eval()
    with torch.no_grad():
      back = again(torch.tensor(tokens)).logits.float().numpy()
    diffs[name + " (ours saved -> transformers)"] = float(np.abs(back - want).max())
  print("transformers vs jaxlab max abs logit diffs:", json.dumps(diffs, indent=1))
  assert max(diffs.values()) < 1e-4, diffs
