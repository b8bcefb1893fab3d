"""`jaxlab.compile_check`: topology names, the loop-weighted HLO FLOP count, and ahead-of-time TPU compiles.

The TPU tests run when libtpu is installed (the `tpu-aot` extra; CI installs it): its compile-only client
compiles for a v5e:2x2 slice without TPU hardware.
"""

import importlib.util
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxlab import compile_check as cc
from jaxlab import configs, ledger, mesh as mesh_lib, registry
from jaxlab.errors import ConfigError

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu not installed (pip install -e '.[tpu-aot]')")


@pytest.mark.parametrize("name,want", [
    ("v5p-64", ("tpu", "v5p", "v5p:2x4x4")), ("v4-8", ("tpu", "v4", "v4:2x2x1")),
    ("v5e-16", ("tpu", "v5e", "v5e:4x4")), ("v5litepod-4", ("tpu", "v5e", "v5e:2x2")),
    ("v6e-256", ("tpu", "v6e", "v6e:16x16")), ("v5e:2x2", ("tpu", "v5e", "v5e:2x2")),
    ("H100:8", ("cuda", "h100", "8"))])
def test_topology_names(name, want):
  assert cc.parse_topology(name) == want


@pytest.mark.parametrize("name", ["v5p-6", "tpu9-8", "v5e-3"])
def test_bad_topology_is_one_clear_error(name):
  with pytest.raises(ConfigError, match="--topology"):
    cc.parse_topology(name)


def test_hlo_flops_weight_loop_bodies_by_trip_count():
  """A scanned stack of matmuls (forward + backward) against the closed-form count 2 m n k per matmul."""
  layers, m, n = 5, 24, 32

  def f(w, x):
    h, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)
    return jnp.sum(h * h)

  compiled = jax.jit(jax.grad(f)).lower(jnp.zeros((layers, n, n)), jnp.zeros((m, n))).compile()
  totals = cc.hlo_totals(compiled.as_text())
  # forward h @ w, backward dh @ w^T and h^T @ dh: three m x n x n matmuls a layer
  assert totals["matmul_flops"] == pytest.approx(3 * layers * 2 * m * n * n, rel=0.01)
  assert layers in totals["loops"]
  xla = compiled.cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  assert xla["flops"] < totals["matmul_flops"]   # XLA's own count has the loop body once


def test_hlo_flops_count_a_conditional_as_its_costliest_branch():
  m, n = 16, 64

  def f(p, x, w):
    return jax.lax.cond(p, lambda: x @ w @ w, lambda: x)

  compiled = jax.jit(f).lower(True, jnp.zeros((m, n)), jnp.zeros((n, n))).compile()
  assert "conditional" in compiled.as_text()
  assert cc.hlo_totals(compiled.as_text())["matmul_flops"] == pytest.approx(2 * 2 * m * n * n, rel=0.01)


def test_hlo_collectives_are_counted_with_bytes():
  text = """HloModule m
ENTRY %main (p: f32[8,128]) -> f32[8,128] {
  %p = f32[8,128]{1,0} parameter(0)
  %ag = (f32[8,128]{1,0}, f32[32,128]{1,0}) all-gather-start(%p), dimensions={0}
  %agd = f32[32,128]{1,0} all-gather-done(%ag)
  ROOT %ar = bf16[8,128]{1,0} all-reduce(%p), to_apply=%add
}
"""
  got = cc.hlo_totals(text)["collectives"]
  assert got == {"all-gather": {"count": 1, "bytes": 32 * 128 * 4}, "all-reduce": {"count": 1, "bytes": 8 * 128 * 2}}


def test_shard_bytes_follow_the_sharding():
  mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(4, 1), ("data", "model"))
  x = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("data")))
  y = jax.ShapeDtypeStruct((16,), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  assert cc.shard_bytes({"x": x, "y": y}) == 16 * 32 * 4 + 16 * 2


def test_missing_libtpu_says_how_to_install(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else object())
  with pytest.raises(ConfigError, match=r"tpu-aot"):
    cc.topology("v5e:2x2")


@needs_libtpu
@pytest.mark.parametrize("experiment", ["quickstart"])
def test_full_configs_compile_for_a_v5e_slice(experiment):
  rows = cc.run(f"{experiment}:full", "v5e:2x2")
  assert rows and all(r["fits"] for r in rows)
  row = rows[0]
  assert row["devices"] == 4 and row["flops"] > 0 and row["step_s_lower_bound"] > 0
  assert 0 < row["mfu_at_bound"] <= 1.0
  # the state's bytes per chip: float32 parameters + two AdamW moments over 4 data-parallel or FSDP chips
  assert row["opt_bytes"] >= 2 * row["param_bytes"] * 0.99


@needs_libtpu
def test_lm_full_config_compiles_from_a_checkpoints_config_json(tmp_path):
  """lm_sft:full on a v5e:2x2 slice, its model read from a checkpoint's config.json (no weights), FSDP."""
  import json
  hf_cfg = dict(cc.LLAMA_3_2_1B, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, vocab_size=1024)
  (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
  rows = cc.run("lm_sft:full", "v5e:2x2", [f"model.hf_path={tmp_path}", "train.batch_size=8", "data.seq_len=256"])
  assert [r["target"] for r in rows] == ["train_step"] and rows[0]["fits"]
  row = rows[0]
  attn = 2 * 256 * 256 + 2 * 256 * 128     # q, o: 4 heads x 64; k, v: 2 heads x 64
  n = 1024 * 256 + 2 * (attn + 3 * 256 * 512 + 2 * 256) + 256   # tied embeddings, 2 blocks, final norm
  assert row["num_params"] == n
  assert row["param_bytes"] == pytest.approx(4 * n / 4, rel=0.05)   # float32 parameters sharded over 4 chips
  assert row["collectives"].get("all-gather", {}).get("count", 0) > 0   # FSDP gathers the sharded weights
  assert 0 < row["mfu_at_bound"] <= 1.0


@needs_libtpu
def test_llama_bench_memory_matches_the_analytic_count():
  """The 0.95B Llama of `jaxlab.lm.bench` (FSDP over 4 chips, remat): parameters + AdamW state per chip within
  10% of 12 bytes x N / 4, read both from the shardings and from XLA's compiled argument size."""
  from jaxlab.lm import sft
  from jaxlab.lm.model import Transformer, TransformerConfig
  c = configs.base_config()
  c.train = configs.train_config(batch_size=8, num_steps=10, optimizer=dict(name="adamw", weight_decay=0.1))
  c.sharding_rules = mesh_lib.RULES["fsdp"]
  cfg = TransformerConfig(vocab_size=32000, hidden=2048, n_layers=16, n_heads=16, mlp_hidden=5632, max_position=4096,
                          dtype="bfloat16", param_dtype="float32", attention="auto", scan_layers=True, remat=True)
  n = 2 * 32000 * 2048 + 16 * (4 * 2048 * 2048 + 3 * 2048 * 5632 + 2 * 2048) + 2048   # untied embeddings

  def targets(config):
    return [cc.train_target(config, lambda rngs: Transformer(cfg, rngs=rngs), sft.make_loss_fn(), cc.lm_batch(8, 128))]

  row = cc.check(c, cc.topology("v5e:2x2"), targets)[0]
  assert row["num_params"] == pytest.approx(n, rel=0.01)
  analytic = 12 * n / 4
  assert row["param_bytes"] + row["opt_bytes"] == pytest.approx(analytic, rel=0.1)
  assert row["argument_bytes"] == pytest.approx(analytic, rel=0.1)
  assert row["fits"]


@needs_libtpu
def test_a_config_that_does_not_fit_gets_one_line_with_a_remedy(capsys):
  rows = cc.run("quickstart:full", "v5e:2x2", ["model.hidden=(65536, 65536)", "train.batch_size=65536"])
  assert not rows[0]["fits"]
  assert "remedy:" in rows[0]["advice"] and "GiB" in rows[0]["advice"]
  assert "DOES NOT FIT" in capsys.readouterr().out


def test_experiments_with_targets_name_their_topology():
  for name in registry.names():
    aot = cc.aot_module(registry.load(name))
    if aot is not None:
      assert hasattr(aot, "compile_targets"), f"experiments/{name}/aot.py defines no compile_targets(config)"
      assert getattr(aot, "TOPOLOGY", None), f"experiments/{name}/aot.py names no TOPOLOGY"
      cc.parse_topology(aot.TOPOLOGY)


def test_aot_files_are_not_claim_sources():
  """Wiring a compile target must not make claims stale: no claim file imports aot.py."""
  for name in registry.names():
    if cc.aot_module(registry.load(name)) is not None:
      assert f"experiments/{name}/aot.py" not in ledger.import_closure(name)


def _aot_experiments():
  return [n for n in registry.names() if cc.aot_module(registry.load(n)) is not None]


@needs_libtpu
@pytest.mark.parametrize("experiment", _aot_experiments())
def test_every_aot_target_lowers_for_its_slice(experiment):
  """Each experiment's full-config targets trace and lower (StableHLO, no XLA compile) on its own TOPOLOGY's mesh,
  so a library change that breaks a compile target fails here; the compiled numbers are the README's table."""
  exp, config = registry.load_config(f"{experiment}:full")
  aot = cc.aot_module(exp)
  topo = cc.topology(aot.TOPOLOGY)
  with mesh_lib.use_config(config, topo.devices):
    targets = aot.compile_targets(config)
    assert targets and len({t.name for t in targets}) == len(targets)
    for t in targets:
      if experiment != "curvzo":   # its ZO step lowers to 71 MB of StableHLO (row-block tables): built, not lowered
        assert t.fn.lower(*t.args).as_text(dialect="stablehlo")[:1]
