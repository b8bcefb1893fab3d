"""Mamba-1 block and LM (jaxlab.nn.mamba, mamba_lm, mamba_hf): shapes, recurrence == parallel scan, causality, Delta scaling,
an independent numpy re-implementation, Hugging Face checkpoint IO, sharded init, and (optional) logits
of transformers' MambaForCausalLM."""

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
from jaxlab.errors import CheckpointError, MissingDependencyError
from jaxlab.nn import MambaBlock, MambaLM
from jaxlab.state import ModelDef, create_train_state

SCAN = "xla"   # the Pallas paths are tested in tests/kernels; the model only needs the op's semantics
X_SHAPE = (4, 9, 32)     # every block test uses this input shape and every LM test tokens of shape T_SHAPE,
T_SHAPE = (2, 12)        # so compiled computations are shared across tests (the file must stay fast)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _block(perturb=True):
  """The shared test block (d_model 32 -> d_inner 64, dt_rank 2, d_state 8, biases on).

  A_log, D and all biases are randomised so that no init symmetry hides a bug. Tests must not modify it.
  """
  blk = MambaBlock(32, d_state=8, bias=True, scan_impl=SCAN, rngs=nnx.Rngs(0))
  if perturb:
    rng = np.random.default_rng(100)
    rand = lambda v, mean, std: jnp.asarray(rng.normal(mean, std, v.shape), jnp.float32)
    blk.A_log[...] = blk.A_log[...] + rand(blk.A_log, 0, 0.3)
    blk.D[...] = rand(blk.D, 1, 0.5)
    for v in (blk.conv1d.bias, blk.in_proj.bias, blk.out_proj.bias):
      v[...] = rand(v, 0, 0.2)
  return blk


@functools.lru_cache(maxsize=None)
def _lm(tie=True, bias=False, dtype=jnp.float32):
  """Shared tiny LMs (vocab 37 -> padded 40, d_model 16, 2 layers, d_state 4). Tests must not modify them."""
  return MambaLM(37, 16, 2, d_state=4, tie_embeddings=tie, bias=bias, scan_impl=SCAN, dtype=dtype,
                 rngs=nnx.Rngs(0))


@functools.partial(jax.jit, static_argnums=0)
def _block_steps(graphdef, state, x_bld, scale):
  """Block outputs by `step` over every position (lax.scan), scale < 0 meaning delta_scale=None."""
  blk = nnx.merge(graphdef, state)
  def body(cache, x_bd):
    y1, c1 = blk.step(x_bd, cache)
    y2, c2 = blk.step(x_bd, cache, delta_scale=scale)
    use = scale < 0
    return jax.tree.map(lambda a, b: jnp.where(use, a, b), c1, c2), jnp.where(use, y1, y2)
  _, y_lbd = jax.lax.scan(body, blk.init_cache(x_bld.shape[0]), jnp.swapaxes(x_bld, 0, 1))
  return jnp.swapaxes(y_lbd, 0, 1)


def _silu(x):
  return x / (1 + np.exp(-x))


def _softplus(x):
  return np.log1p(np.exp(x))


def _np_ssm(u, delta, A, B, C, D, z):
  """Straight loop over time (float64) of h_t = exp(Delta_t A) h + Delta_t u_t B_t; y = C.h + D u; * silu(z)."""
  length, di = u.shape
  h = np.zeros(A.shape)
  y = np.zeros((length, di))
  for t in range(length):
    h = np.exp(delta[t][:, None] * A) * h + (delta[t] * u[t])[:, None] * B[t][None, :]
    y[t] = h @ C[t] + D * u[t]
  return y * _silu(z)


def _np_conv(x, w_dk, b):
  """Causal depthwise conv, torch layout w (dim, k): out_t = b + sum_j w[:, j] x_{t-(k-1)+j}."""
  length, di = x.shape
  k = w_dk.shape[1]
  out = np.zeros((length, di)) + (0 if b is None else b)
  for t in range(length):
    for j in range(k):
      s = t - (k - 1) + j
      if s >= 0:
        out[t] += w_dk[:, j] * x[s]
  return out


def _np_mixer_torch_layout(t, pre, x, delta_scale=None):
  """Mamba mixer from HF-named float64 tensors `t` (torch (out, in) layout) for one sequence x (l, d)."""
  W = lambda n: t[pre + n]
  di = W("D").shape[0]
  n = W("A_log").shape[1]
  r = W("dt_proj.weight").shape[1]
  xz = x @ W("in_proj.weight").T + t.get(pre + "in_proj.bias", 0)
  xs, z = xz[:, :di], xz[:, di:]
  u = _silu(_np_conv(xs, W("conv1d.weight")[:, 0, :], t.get(pre + "conv1d.bias")))
  dbl = u @ W("x_proj.weight").T
  dt, B, C = dbl[:, :r], dbl[:, r:r + n], dbl[:, r + n:]
  delta = _softplus(dt @ W("dt_proj.weight").T + W("dt_proj.bias"))
  if delta_scale is not None:
    delta = delta * delta_scale
  y = _np_ssm(u, delta, -np.exp(W("A_log")), B, C, W("D"), z)
  return y @ W("out_proj.weight").T + t.get(pre + "out_proj.bias", 0)


def _np_lm(t, tokens_l, n_layer, eps=1e-5):
  """Logits of the whole LM from HF tensors (float64)."""
  def rms(h, w):
    return h / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps) * w
  emb = t["backbone.embeddings.weight"]
  h = emb[tokens_l]
  for i in range(n_layer):
    p = f"backbone.layers.{i}."
    h = h + _np_mixer_torch_layout(t, p + "mixer.", rms(h, t[p + "norm.weight"]))
  h = rms(h, t["backbone.norm_f.weight"])
  return h @ t.get("lm_head.weight", emb).T


def _load_np(path):
  from safetensors.numpy import load_file
  return {k: v.astype(np.float64) for k, v in load_file(os.path.join(path, "model.safetensors")).items()}


# ------------------------------------------------------------------------------------------------
# block
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_block_shapes_dtypes_and_official_init(dtype):
  blk = MambaBlock(32, d_state=8, bias=True, scan_impl=SCAN, dtype=dtype, rngs=nnx.Rngs(0))
  assert (blk.d_inner, blk.dt_rank) == (64, 2)
  x = jax.random.normal(jax.random.key(0), X_SHAPE, dtype)
  y = blk(x)
  assert y.shape == X_SHAPE and y.dtype == dtype
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(blk, nnx.Param)))
  shapes = {"/".join(map(str, k)): v.shape for k, v in nnx.to_flat_state(nnx.state(blk, nnx.Param))}
  assert shapes == {"A_log": (64, 8), "D": (64,), "conv1d/bias": (64,), "conv1d/kernel": (4, 64),
                    "dt_proj/bias": (64,), "dt_proj/kernel": (2, 64), "in_proj/kernel": (32, 2, 64),
                    "in_proj/bias": (2, 64), "out_proj/kernel": (64, 32), "out_proj/bias": (32,),
                    "x_proj/kernel": (64, 2 + 16)}
  np.testing.assert_allclose(np.asarray(blk.A_log[...]), np.log(np.tile(np.arange(1.0, 9.0), (64, 1))), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(blk.D[...]), 1.0)
  dt = np.asarray(jax.nn.softplus(blk.dt_proj.bias[...]))
  assert dt.min() >= 1e-4 * 0.999 and 1e-3 * 0.999 <= dt.min() and dt.max() <= 0.1 * 1.001
  assert np.abs(np.asarray(blk.dt_proj.kernel[...])).max() <= 2 ** -0.5
  cache = blk.init_cache(4)
  assert cache[0].shape == (4, 3, 64) and cache[0].dtype == dtype
  assert cache[1].shape == (4, 64, 8) and cache[1].dtype == jnp.float32


@pytest.mark.parametrize("scale", [None, 1.0, 2.5])
def test_block_recurrent_steps_equal_full_sequence(scale):
  blk = _block()
  x = jax.random.normal(jax.random.key(1), X_SHAPE)
  full = blk(x, delta_scale=scale)
  gd, st = nnx.split(blk)
  steps = _block_steps(gd, st, x, jnp.float32(-1.0 if scale is None else scale))
  np.testing.assert_allclose(np.asarray(steps), np.asarray(full), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("prompt", [2, 7])      # shorter and longer than d_conv - 1 = 3
def test_block_prefill_then_step_continues_the_sequence(prompt):
  blk = _block()
  x = jax.random.normal(jax.random.key(2), X_SHAPE)
  full = blk(x)
  y0, cache = blk.prefill(x[:, :prompt])
  ys = [y0]
  for t in range(prompt, X_SHAPE[1]):
    y, cache = blk.step(x[:, t], cache)
    ys.append(y[:, None])
  np.testing.assert_allclose(np.asarray(jnp.concatenate(ys, 1)), np.asarray(full), rtol=1e-5, atol=1e-6)
  _, (conv, ssm) = blk.prefill(x)
  assert conv.shape == (4, 3, 64) and ssm.shape == (4, 64, 8)


def test_delta_scale_one_equals_fused_path_and_scale_changes_output():
  blk = _block()
  x = jax.random.normal(jax.random.key(3), X_SHAPE)
  fused = blk(x)
  np.testing.assert_allclose(np.asarray(blk(x, delta_scale=1.0)), np.asarray(fused), rtol=1e-6, atol=1e-7)
  assert not np.allclose(np.asarray(blk(x, delta_scale=4.0)), np.asarray(fused), atol=1e-4)
  gd, st = nnx.split(blk)
  other = nnx.merge(gd, st)
  other.scan_impl = "associative"                     # the attribute reaches the op
  np.testing.assert_allclose(np.asarray(other(x)), np.asarray(fused), rtol=1e-4, atol=1e-5)


def test_zoh_discretization_reaches_the_scan_and_the_recurrent_step():
  blk = _block()
  x = jax.random.normal(jax.random.key(5), X_SHAPE)
  euler = blk(x, delta_scale=3.0)
  gd, st = nnx.split(blk)
  zoh = nnx.merge(gd, st)
  zoh.discretization = "zoh"
  full = zoh(x, delta_scale=3.0)
  assert not np.allclose(np.asarray(full), np.asarray(euler), atol=1e-4)
  gd_z, st_z = nnx.split(zoh)
  steps = _block_steps(gd_z, st_z, x, jnp.float32(3.0))
  np.testing.assert_allclose(np.asarray(steps), np.asarray(full), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="discretization"):
    MambaBlock(32, discretization="trapezoid", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("scale", [None, 0.5])
def test_block_matches_independent_numpy_implementation(scale):
  """The block against a float64 loop over the official equations (our (in, out) parameter layout)."""
  blk = _block()
  x = np.asarray(jax.random.normal(jax.random.key(4), X_SHAPE), np.float64)
  got = np.asarray(blk(jnp.asarray(x, jnp.float32), delta_scale=scale))
  f64 = lambda v: np.asarray(v[...], np.float64)
  r, n = blk.dt_rank, blk.d_state
  for b in range(X_SHAPE[0]):
    xz = np.einsum("ld,dce->lce", x[b], f64(blk.in_proj.kernel)) + f64(blk.in_proj.bias)   # (l, 2, d_inner)
    xs, z = xz[:, 0], xz[:, 1]
    u = _silu(_np_conv(xs, f64(blk.conv1d.kernel).T, f64(blk.conv1d.bias)))
    dbl = u @ f64(blk.x_proj.kernel)
    delta = _softplus(dbl[:, :r] @ f64(blk.dt_proj.kernel) + f64(blk.dt_proj.bias)) * (1.0 if scale is None else scale)
    y = _np_ssm(u, delta, -np.exp(f64(blk.A_log)), dbl[:, r:r + n], dbl[:, r + n:], f64(blk.D), z)
    want = y @ f64(blk.out_proj.kernel) + f64(blk.out_proj.bias)
    np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-5)


def test_model_keeps_no_rngs_and_jits_with_grad():
  blk = _block()
  assert not nnx.to_flat_state(nnx.state(blk, nnx.RngState))
  x = jax.random.normal(jax.random.key(5), X_SHAPE)

  @nnx.jit
  def loss(m, x):
    return jnp.mean(m(x, delta_scale=2.0) ** 2)
  g = nnx.grad(loss)(blk, x)
  assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(g))


# ------------------------------------------------------------------------------------------------
# language model
# ------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _lm_steps(graphdef, state, tokens_bl):
  lm = nnx.merge(graphdef, state)
  def body(cache, tok_b):
    logits, cache = lm.step(tok_b, cache)
    return cache, logits
  _, out = jax.lax.scan(body, lm.init_cache(tokens_bl.shape[0]), tokens_bl.T)
  return jnp.swapaxes(out, 0, 1)


def test_lm_full_sequence_equals_recurrent_steps_and_generate_is_consistent():
  lm = _lm()
  assert lm.padded_vocab_size == 40 and lm.vocab_size == 37
  tokens = jax.random.randint(jax.random.key(0), T_SHAPE, 0, 37)
  full = lm(tokens)
  assert full.shape == (*T_SHAPE, 40) and full.dtype == jnp.float32
  gd, st = nnx.split(lm)
  np.testing.assert_allclose(np.asarray(_lm_steps(gd, st, tokens)), np.asarray(full), rtol=1e-5, atol=1e-5)
  out = lm.generate(tokens[:, :4], 8)
  assert out.shape == T_SHAPE and out.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(out[:, :4]), np.asarray(tokens[:, :4]))
  again = np.asarray(lm(out))                        # greedy: every new token is the argmax given its prefix
  np.testing.assert_array_equal(np.asarray(out[:, 4:]), again[:, 3:-1, :37].argmax(-1))
  sampled = lm.generate(tokens[:, :4], 8, temperature=1.0, key=jax.random.key(1))
  assert sampled.shape == T_SHAPE and int(sampled.max()) < 37
  with pytest.raises(ValueError, match="needs key"):
    lm.generate(tokens, 2, temperature=1.0)


def test_lm_is_causal():
  lm = _lm()
  tokens = jax.random.randint(jax.random.key(1), T_SHAPE, 0, 37)
  changed = tokens.at[:, 7].set((tokens[:, 7] + 1) % 37)
  a, b = np.asarray(lm(tokens)), np.asarray(lm(changed))
  np.testing.assert_array_equal(a[:, :7], b[:, :7])
  assert not np.allclose(a[:, 7:], b[:, 7:])


def test_lm_bfloat16_close_to_float32():
  lm32 = _lm()
  lm16 = _lm(dtype=jnp.bfloat16)
  tokens = jax.random.randint(jax.random.key(2), T_SHAPE, 0, 37)
  a, b = np.asarray(lm32(tokens)), np.asarray(lm16(tokens))
  assert b.dtype == np.float32 and np.abs(a - b).max() < 5e-2 * max(1.0, np.abs(a).max())


def test_lm_shards_with_the_training_stack():
  rules = mesh_lib.DEFAULT_RULES
  mesh = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  md = ModelDef(lambda rngs: MambaLM(37, 16, 2, d_state=4, scan_impl=SCAN, rngs=rngs))
  state, _ = create_train_state(md, optax.adamw(1e-3), mesh, rules, seed=0)
  mixer = state.params["layers"][0]["mixer"]
  assert mixer["in_proj"]["kernel"].sharding.spec == P(None, None, "model")
  assert mixer["out_proj"]["kernel"].sharding.spec == P("model")
  assert mixer["A_log"].sharding.spec == P("model")
  assert state.params["embed"]["embedding"].sharding.spec == P("model")
  assert state.opt_state[0].mu["layers"][0]["mixer"]["in_proj"]["kernel"].sharding.spec == P(None, None, "model")
  tokens = jax.random.randint(jax.random.key(0), (8, 6), 0, 37)
  single = jax.jit(lambda params, t: md.merge(params, state.model_state)(t))(jax.device_get(state.params), tokens)
  # The same parameters, sharded, on a sharded batch, with the mesh in context.
  with mesh_lib.use(mesh, rules):
    fwd = jax.jit(lambda params, t: md.merge(params, state.model_state)(t))
    sharded = fwd(state.params, jax.device_put(tokens, mesh_lib.batch_sharding()))
  np.testing.assert_allclose(np.asarray(sharded), np.asarray(single), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Hugging Face checkpoints
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie,bias", [(True, False), (False, True)])
def test_hf_save_load_round_trip_is_bitwise(tmp_path, tie, bias):
  pytest.importorskip("safetensors")
  lm = _lm(tie=tie, bias=bias)
  lm.save_pretrained(str(tmp_path))
  cfg = json.load(open(tmp_path / "config.json"))
  assert cfg["model_type"] == "mamba" and cfg["vocab_size"] == 40 and cfg["tie_word_embeddings"] == tie
  t = _load_np(str(tmp_path))
  assert t["backbone.layers.1.mixer.in_proj.weight"].shape == (64, 16)
  assert t["backbone.layers.0.mixer.conv1d.weight"].shape == (32, 1, 4)
  assert t["backbone.layers.0.mixer.x_proj.weight"].shape == (1 + 8, 32)
  assert ("lm_head.weight" in t) == (not tie)
  back = MambaLM.from_pretrained(str(tmp_path), scan_impl=SCAN)
  for a, b in zip(jax.tree.leaves(nnx.state(lm, nnx.Param)), jax.tree.leaves(nnx.state(back, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tokens = jax.random.randint(jax.random.key(3), T_SHAPE, 0, 37)
  np.testing.assert_array_equal(np.asarray(back(tokens)), np.asarray(lm(tokens)))
  # An independent float64 numpy LM built from the saved tensors (torch layout) reproduces the logits.
  want = _np_lm(t, np.asarray(tokens[0]), n_layer=2)
  np.testing.assert_allclose(np.asarray(lm(tokens))[0], want, rtol=1e-4, atol=1e-4)


def _write_st(path, tensors):
  from safetensors.numpy import save_file
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(path, "model.safetensors"),
            metadata={"format": "pt"})


def test_checkpoint_errors_are_one_line_and_name_the_problem(tmp_path):
  pytest.importorskip("safetensors")
  from safetensors.numpy import load_file
  with pytest.raises(CheckpointError, match="no config.json"):
    MambaLM.from_pretrained(str(tmp_path / "nowhere"))
  good = tmp_path / "good"
  _lm().save_pretrained(str(good))
  tensors = load_file(str(good / "model.safetensors"))
  cfg = json.load(open(good / "config.json"))

  def case(name, cfg_, tensors_):
    d = tmp_path / name
    d.mkdir()
    json.dump(cfg_, open(d / "config.json", "w"))
    if tensors_ is not None:
      _write_st(str(d), tensors_)
    return str(d)

  missing = dict(tensors)
  del missing["backbone.layers.1.mixer.D"]
  with pytest.raises(CheckpointError, match="no tensor 'backbone.layers.1.mixer.D'"):
    MambaLM.from_pretrained(case("missing", cfg, missing))
  bad = dict(tensors, **{"backbone.layers.0.mixer.A_log": np.zeros((32, 5), np.float32)})
  with pytest.raises(CheckpointError, match=r"'backbone.layers.0.mixer.A_log' .* shape \(32, 5\), expected \(32, 4\)"):
    MambaLM.from_pretrained(case("shape", cfg, bad))
  with pytest.raises(CheckpointError, match="model_type 'mamba2' is not supported"):
    MambaLM.from_pretrained(case("mamba2", dict(cfg, model_type="mamba2"), tensors))
  with pytest.raises(CheckpointError, match="architecture 'LlamaForCausalLM'"):
    MambaLM.from_pretrained(case("arch", dict(cfg, architectures=["LlamaForCausalLM"]), tensors))
  with pytest.raises(CheckpointError, match=r"no \*.safetensors files"):
    MambaLM.from_pretrained(case("empty", cfg, None))
  with pytest.raises(CheckpointError, match="tensor 'backbone.layers.1.* does not use"):
    MambaLM.from_pretrained(case("extra", dict(cfg, num_hidden_layers=1), tensors))
  with pytest.raises(CheckpointError) as info:
    MambaLM.from_pretrained(case("missing2", cfg, missing))
  assert "\n" not in str(info.value)


def test_missing_safetensors_package_names_the_extra(tmp_path, monkeypatch):
  _lm().save_pretrained(str(tmp_path))
  monkeypatch.setitem(sys.modules, "safetensors", None)
  with pytest.raises(MissingDependencyError, match=r"jaxlab\[hf\]"):
    MambaLM.from_pretrained(str(tmp_path))


def test_loads_mamba_ssm_style_config_and_bfloat16_tensors(tmp_path):
  pytest.importorskip("safetensors")
  import ml_dtypes
  from safetensors.numpy import load_file
  lm = _lm()
  lm.save_pretrained(str(tmp_path / "hf"))
  tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
  out = tmp_path / "ssm"
  out.mkdir()
  json.dump({"d_model": 16, "n_layer": 2, "vocab_size": 37, "pad_vocab_size_multiple": 8,
             "ssm_cfg": {"d_state": 4}, "rms_norm": True, "residual_in_fp32": True, "tie_embeddings": True},
            open(out / "config.json", "w"))
  # bfloat16 tensors (numpy has no bf16: write the safetensors container by hand) + mamba_ssm's name.
  renamed = {("backbone.embedding.weight" if k == "backbone.embeddings.weight" else k): v for k, v in tensors.items()}
  header, blobs, off = {}, [], 0
  for k, v in renamed.items():
    b = np.asarray(v, ml_dtypes.bfloat16).tobytes()
    header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
  h = json.dumps(header).encode()
  h += b" " * (-len(h) % 8)
  with open(out / "model.safetensors", "wb") as f:
    f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
  got = MambaLM.from_pretrained(str(out), scan_impl=SCAN)
  assert got.padded_vocab_size == 40 and got.vocab_size == 37
  np.testing.assert_array_equal(
      np.asarray(got.layers[1].mixer.A_log[...]),
      np.asarray(tensors["backbone.layers.1.mixer.A_log"]).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_transformers_mamba_logits_match(tmp_path):
  """Optional: a tiny random transformers MambaForCausalLM, saved as safetensors, loaded by us."""
  torch = pytest.importorskip("torch", reason="torch (with transformers) is needed for the parity check")
  transformers = pytest.importorskip("transformers", reason="transformers is needed for the parity check")
  for tie, bias in ((True, False), (False, True)):
    cfg = transformers.MambaConfig(vocab_size=50, hidden_size=24, state_size=8, num_hidden_layers=2,
                                   conv_kernel=4, expand=2, use_bias=bias, use_conv_bias=True,
                                   tie_word_embeddings=tie)
    torch.manual_seed(0)
    hf = transformers.MambaForCausalLM(cfg).eval()
    with torch.no_grad():                       # move every weight off its init so nothing is trivially equal
      for p in hf.parameters():
        p.add_(0.05 * torch.randn_like(p))
    d = tmp_path / f"hf_{tie}"
    hf.save_pretrained(str(d), safe_serialization=True)
    ours = MambaLM.from_pretrained(str(d), scan_impl=SCAN)
    tokens = np.random.default_rng(0).integers(0, 50, (2, 13))
    with torch.no_grad():
      want = hf(torch.tensor(tokens)).logits.float().numpy()
    got = np.asarray(ours(jnp.asarray(tokens)))
    diff = float(np.abs(got - want).max())
    print(f"transformers MambaForCausalLM (tie={tie}, bias={bias}) vs ours: max abs diff {diff:.3e}")
    assert diff < 1e-4
    # And our writer produces a checkpoint transformers reads back to the same logits.
    ours.save_pretrained(str(tmp_path / f"ours_{tie}"))
    hf2 = transformers.MambaForCausalLM.from_pretrained(str(tmp_path / f"ours_{tie}")).eval()
    with torch.no_grad():
      again = hf2(torch.tensor(tokens)).logits.float().numpy()
    np.testing.assert_allclose(again, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("scale", [None, 2.0])
def test_pallas_scan_runs_per_shard_under_a_mesh_context(scale):
  """With a multi-device mesh in context a Pallas scan runs inside shard_map (batch over data, d_inner over
  model); the result equals the unsharded call."""
  mesh = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  gd, st = nnx.split(_block())
  blk = nnx.merge(gd, st)
  blk.scan_impl = "interpret"
  x = jax.random.normal(jax.random.key(6), X_SHAPE)
  prefill = jax.jit(lambda x: blk.prefill(x, delta_scale=scale))
  want, (_, want_ssm) = prefill(x)
  with mesh_lib.use(mesh):
    assert "shard_map" in str(jax.make_jaxpr(lambda x: blk.prefill(x, delta_scale=scale))(x))
    y, (_, ssm) = prefill(x)
  assert "shard_map" not in str(jax.make_jaxpr(lambda x: blk.prefill(x, delta_scale=scale))(x))
  np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(ssm), np.asarray(want_ssm), rtol=1e-6, atol=1e-6)
