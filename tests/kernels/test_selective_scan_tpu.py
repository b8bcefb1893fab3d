"""TPU (Mosaic) selective-scan kernels: semantics under Pallas' TPU interpret mode, and the Mosaic lowering.

* Forward and gradients of every input run `kernels/selective_scan/kernel_tpu.py` through the public op
  (`impl="interpret_tpu"`) against the pure-JAX reference, with tiles small enough that every shape spans
  several sequence tiles, sub-chunks and (where dim allows) channel tiles, and lengths that need padding.
* The compiled path is lowered for TPU on this CPU machine (`lowering_platforms=("tpu",)`), which runs the
  Pallas -> Mosaic lowering of both kernels at the benchmark shape and at a small odd shape.
* When `libtpu` is installed (it is not a test dependency), the kernels are also compiled by Mosaic for a
  TPU v5e topology without TPU hardware, which checks layouts and VMEM budgets as a real TPU would.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.kernels.selective_scan import BlockSizes, kernel_tpu, ops, reference

F32 = jnp.float32
SMALL = BlockSizes(block_d=128, chunk=32, sub_chunk=8, block_d_bwd=128)
# Different forward / backward channel tiles and a longer sub-chunk.
MIXED = BlockSizes(block_d=256, chunk=64, sub_chunk=16, block_d_bwd=128)
BENCH = (8, 4096, 2048, 16)


def make_inputs(b, l, d, n, dtype=F32, softplus=True, seed=0):
  k = jax.random.split(jax.random.key(seed), 8)
  raw = 0.5 * jax.random.normal(k[1], (b, l, d))
  delta = raw if softplus else jax.nn.softplus(raw)
  return dict(
      u=jax.random.normal(k[0], (b, l, d)).astype(dtype), delta=delta.astype(dtype),
      A=-jnp.exp(0.5 * jax.random.normal(k[2], (d, n))), B=jax.random.normal(k[3], (b, l, n)).astype(dtype),
      C=jax.random.normal(k[4], (b, l, n)).astype(dtype), D=jax.random.normal(k[5], (d,)),
      z=jax.random.normal(k[6], (b, l, d)).astype(dtype), delta_bias=0.3 * jax.random.normal(k[7], (d,)))


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def drop(x, with_z, with_D, with_bias):
  return dict(x, z=x["z"] if with_z else None, D=x["D"] if with_D else None,
              delta_bias=x["delta_bias"] if with_bias else None)


# (with_z, with_D, with_bias, softplus, return_last_state)
OPTIONS = [(True, True, True, True, True), (False, False, False, False, False), (True, False, True, False, True),
           (False, True, False, True, True)]


@pytest.mark.parametrize("shape,opts,blocks", [
    ((2, 64, 128, 16), OPTIONS[0], SMALL),
    ((2, 64, 128, 16), OPTIONS[1], SMALL),
    ((1, 200, 256, 8), OPTIONS[0], SMALL),    # 200 = 6 * 32 + 8: padded last tile; two channel tiles
    ((1, 200, 256, 8), OPTIONS[2], SMALL),
    ((1, 200, 256, 8), OPTIONS[3], MIXED),
    ((1, 37, 40, 5), OPTIONS[0], None),       # TPU defaults; odd length, dim and state all padded
], ids=str)
def test_forward_matches_reference_float32(shape, opts, blocks):
  with_z, with_D, with_bias, softplus, last = opts
  x = drop(make_inputs(*shape, softplus=softplus), with_z, with_D, with_bias)
  got = ops.selective_scan(**x, delta_softplus=softplus, return_last_state=last, impl="interpret_tpu",
                           block_sizes=blocks)
  want = reference.selective_scan_ref(**x, delta_softplus=softplus, return_last_state=last)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert g.shape == w.shape and g.dtype == w.dtype
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_forward_bfloat16():
  x = make_inputs(2, 64, 128, 16, dtype=jnp.bfloat16)
  got, last = ops.selective_scan(**x, delta_softplus=True, return_last_state=True, impl="interpret_tpu",
                                 block_sizes=SMALL)
  x32 = {k: (v.astype(F32) if v.dtype == jnp.bfloat16 else v) for k, v in x.items()}
  want, want_last = reference.selective_scan_ref(**x32, delta_softplus=True, return_last_state=True)
  assert got.dtype == jnp.bfloat16 and last.dtype == F32
  assert rel(got, want) <= 1e-2 and rel(last, want_last) <= 1e-2, (rel(got, want), rel(last, want_last))


@pytest.mark.parametrize("shape,opts,blocks", [
    ((2, 64, 128, 16), OPTIONS[0], SMALL),
    pytest.param((1, 200, 256, 8), OPTIONS[0], MIXED, marks=pytest.mark.slow),   # ~20 s in the interpreter
    ((1, 37, 40, 5), OPTIONS[3], SMALL),
], ids=str)
def test_gradients_of_every_input_match_reference(shape, opts, blocks):
  with_z, with_D, with_bias, softplus, _ = opts
  x = drop(make_inputs(*shape, softplus=softplus), with_z, with_D, with_bias)
  names = [k for k, v in x.items() if v is not None]
  absent = {k: None for k, v in x.items() if v is None}

  def loss(fn, *vals):   # depends on the output AND the last state
    y, state = fn(**dict(zip(names, vals)), **absent, delta_softplus=softplus, return_last_state=True)
    return jnp.sum(y * jnp.cos(y)) + jnp.sum(state ** 2)

  mine = lambda **kw: ops.selective_scan(**kw, impl="interpret_tpu", block_sizes=blocks)  # noqa: E731
  vals = [x[k] for k in names]
  argnums = tuple(range(len(vals)))
  got = jax.grad(lambda *v: loss(mine, *v), argnums=argnums)(*vals)
  want = jax.grad(lambda *v: loss(reference.selective_scan_ref, *v), argnums=argnums)(*vals)
  for name, g, w in zip(names, got, want):
    assert g.shape == w.shape and g.dtype == w.dtype, name
    assert rel(g, w) <= 1e-4, f"d{name}: relative error {rel(g, w):.2e}"


def test_bad_block_sizes_are_clear_errors():
  x = make_inputs(1, 16, 128, 4)
  for bs, match in [(BlockSizes(block_d=64), "multiple of 128"), (BlockSizes(chunk=20), "multiple of 8"),
                    (BlockSizes(chunk=32, sub_chunk=12), "must divide chunk")]:
    with pytest.raises(ValueError, match=match):
      ops.selective_scan(**x, impl="interpret_tpu", block_sizes=bs)


# ------------------------------------------------------------------------------ compiled (Mosaic) path


def _specs(b, l, d, n, dtype):
  s = jax.ShapeDtypeStruct
  return dict(u=s((b, l, d), dtype), delta=s((b, l, d), dtype), A=s((d, n), F32), B=s((b, l, n), dtype),
              C=s((b, l, n), dtype), D=s((d,), F32), z=s((b, l, d), dtype), delta_bias=s((d,), F32))


def _fwd_bwd(blocks):
  """forward (saving residuals) then backward, with interpret=False: the compiled custom-VJP path."""
  def f(u, delta, A, B, C, D, z, delta_bias, dout, dlast):
    args = (u, delta, A, B, C, D, z, delta_bias)
    out, last, res = kernel_tpu.forward(*args, delta_softplus=True, block_sizes=blocks, interpret=False,
                                        save_residuals=True)
    return out, last, kernel_tpu.backward(*args, res, dout, dlast, delta_softplus=True, block_sizes=blocks,
                                          interpret=False)
  return f


@pytest.mark.parametrize("shape,dtype,blocks", [
    (BENCH, jnp.bfloat16, None),
    ((3, 37, 40, 5), F32, None),
    ((3, 200, 300, 8), jnp.bfloat16, BlockSizes(block_d=256, chunk=64, sub_chunk=16, block_d_bwd=128)),
], ids=str)
def test_lowers_for_tpu(shape, dtype, blocks):
  b, l, d, n = shape
  spec = _specs(*shape, dtype)
  fwd = lambda *a: kernel_tpu.forward(*a, delta_softplus=True, block_sizes=blocks, interpret=False)  # noqa: E731
  lowered = jax.jit(fwd).trace(*spec.values()).lower(lowering_platforms=("tpu",))
  assert lowered.as_text().count("tpu_custom_call") == 1
  extra = (jax.ShapeDtypeStruct((b, l, d), dtype), jax.ShapeDtypeStruct((b, d, n), F32))
  text = jax.jit(_fwd_bwd(blocks)).trace(*spec.values(), *extra).lower(lowering_platforms=("tpu",)).as_text()
  assert text.count("tpu_custom_call") == 2
  assert f"{b}x{l}x{d}x{n}x" not in text and f"{b}x{d}x{l}x{n}x" not in text  # no (b, l, d, n) tensor


def test_grad_through_public_op_lowers_for_tpu(monkeypatch):
  """jax.grad of `selective_scan(impl="pallas")` as it runs on a TPU (the backend query is faked)."""
  monkeypatch.setattr(ops.jax, "default_backend", lambda: "tpu")
  spec = _specs(*BENCH, jnp.bfloat16)

  def loss(u, delta, A, B, C, D, z, delta_bias):
    out, last = ops.selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus=True,
                                   return_last_state=True, impl="pallas")
    return jnp.sum(out.astype(F32) ** 2) + jnp.sum(last)

  grad = jax.jit(jax.grad(loss, argnums=tuple(range(8))))
  text = grad.trace(*spec.values()).lower(lowering_platforms=("tpu",)).as_text()
  assert text.count("tpu_custom_call") == 2 and "selective_scan_tpu_bwd" in text


_COMPILE_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding
    from jaxlab.kernels.selective_scan import BlockSizes
    import test_selective_scan_tpu as t
    dev = topologies.get_topology_desc("v5e:2x2", platform="tpu").devices[0]
    put = lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=SingleDeviceSharding(dev))
    for shape, dtype, blocks in [(t.BENCH, jnp.bfloat16, None), ((3, 37, 40, 5), jnp.float32, None),
                                 ((2, 1000, 512, 16), jnp.float32, BlockSizes(block_d=512, chunk=256))]:
      b, l, d, n = shape
      args = [put(s) for s in t._specs(*shape, dtype).values()]
      args += [put(jax.ShapeDtypeStruct((b, l, d), dtype)), put(jax.ShapeDtypeStruct((b, d, n), jnp.float32))]
      jax.jit(t._fwd_bwd(blocks)).trace(*args).lower(lowering_platforms=("tpu",)).compile()
      print("compiled", shape, flush=True)
""")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed (optional)")
def test_mosaic_compiles_for_tpu_v5e_without_hardware():
  """Full Mosaic compilation (layouts, VMEM) for a v5e topology via libtpu's compile-only client."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1", TPU_ACCELERATOR_TYPE="v5litepod-4",
             TPU_WORKER_ID="0", TPU_WORKER_HOSTNAMES="localhost",
             ALLOW_MULTIPLE_LIBTPU_LOAD="1")   # no lockfile: a compile-only client beside another libtpu user
  env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
  proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
  assert proc.stdout.count("compiled") == 3
