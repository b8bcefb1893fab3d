"""jaxlab.train.accumulate: a micro-batched update is the one-pass update of the whole batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab import mesh as mesh_lib
from jaxlab.lm.model import Transformer, TransformerConfig
from jaxlab.posttrain.grpo import AGG_MODES, GRPOConfig, make_grpo_loss_fn, make_logps_fn
from jaxlab.state import ModelDef, create_train_state
from jaxlab.train import accumulate

V, B, T = 32, 16, 12


def _modeldef():
  cfg = TransformerConfig(vocab_size=V, hidden=16, n_layers=1, n_heads=2, mlp_hidden=32, max_position=T,
                          init_std=0.3)
  return ModelDef(lambda rngs: Transformer(cfg, rngs=rngs))


def _batch(seed=0):
  """GRPO rows with ragged completions; rows 3 and 10 are empty (padding rows: no trained token)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, T - 3, B)
  lengths[[3, 10]] = 0
  mask = (np.arange(T)[None] >= 3) & (np.arange(T)[None] < 3 + lengths[:, None])
  return {"tokens": rng.integers(1, V, (B, T)).astype(np.int32),
          "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)),
          "segment_ids": np.ones((B, T), np.int32), "loss_mask": mask.astype(np.float32),
          "advantages": rng.normal(size=B).astype(np.float32),
          "old_logps": rng.normal(-3.0, 0.3, (B, T)).astype(np.float32),
          "ref_logps": rng.normal(-3.0, 0.3, (B, T)).astype(np.float32)}


def _step(mesh, loss_fn, k, lr=0.5):
  md, tx = _modeldef(), optax.sgd(lr)
  state, shardings = create_train_state(md, tx, mesh, mesh_lib.current_rules(), seed=0)
  step = accumulate.make_accumulating_train_step(md, loss_fn, tx, lambda s: lr, shardings,
                                                 mesh_lib.batch_sharding(mesh), micro_batches=k)
  return state, step


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batched_grpo_update_equals_the_one_pass_update(mode):
  """Every loss_agg_mode (the loss's "weight" counts its units): the same parameters after one SGD step, the
  same loss, on a batch sharded over 4 data devices x 2 model devices, with empty rows in the batch."""
  mesh = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  gcfg = GRPOConfig(num_generations=2, num_iterations=2, beta=0.05, loss_agg_mode=mode)
  loss_fn = make_grpo_loss_fn(gcfg)
  batch = _batch()
  # k = 2 and k = 4 run the same lax.scan accumulation (only the micro-batch rows differ): one mode checks both,
  # the others k = 4 (each k is a train step compiled for the 8-device mesh).
  ks = (1, 2, 4) if mode == AGG_MODES[0] else (1, 4)
  with mesh_lib.use(mesh):
    out = {}
    for k in ks:
      state, step = _step(mesh, loss_fn, k)
      new, m = step(state, jax.device_put(batch, mesh_lib.batch_sharding(mesh)))
      out[k] = (jax.device_get(new.params), float(m["train/loss"].value), float(m["train/grad_norm"]))
  for k in ks[1:]:
    for a, b in zip(jax.tree.leaves(out[1][0]), jax.tree.leaves(out[k][0])):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out[k][1], out[1][1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out[k][2], out[1][2], rtol=1e-4)
  assert out[1][2] > 0


def test_the_default_weight_is_rows_and_keys_differ_per_micro_batch():
  """A loss with no "weight" (a per-row mean) accumulates as the whole batch's mean; micro-batch j gets key
  fold_in(step key, j), so a key-dependent loss sees k different keys."""
  def loss_fn(model, batch, key):
    logits = model(batch["tokens"])
    loss = jnp.mean(jax.nn.logsumexp(logits.astype(jnp.float32), -1))
    return loss, {"noise": jax.random.uniform(key)}

  mesh = mesh_lib.make_mesh((("data", 2), ("model", 1)), jax.devices()[:2])
  batch = _batch(1)
  with mesh_lib.use(mesh):
    res = {}
    for k in (1, 4):
      state, step = _step(mesh, loss_fn, k)
      new, m = step(state, jax.device_put(batch, mesh_lib.batch_sharding(mesh)))
      res[k] = jax.device_get(new.params), float(m["train/loss"].value), float(m["train/noise"].value)
  for a, b in zip(jax.tree.leaves(res[1][0]), jax.tree.leaves(res[4][0])):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(res[4][1], res[1][1], rtol=1e-5)
  assert res[4][2] != res[1][2]   # a mean of 4 uniform draws, not the one-pass draw


def test_fold_take_split_merge_round_trip_and_row_order():
  x = np.arange(24).reshape(12, 2)
  folded = accumulate.fold({"x": x, "s": np.float32(3)}, 3)
  np.testing.assert_array_equal(accumulate.take(folded, 1)["x"], x[1::3])
  assert float(accumulate.take(folded, 2)["s"]) == 3.0
  parts = accumulate.split(x, 3)
  assert parts.shape == (3, 4, 2)
  np.testing.assert_array_equal(parts[2], x[2::3])
  np.testing.assert_array_equal(accumulate.merge(parts), x)


def test_map_micro_gives_the_whole_batch_log_probs_on_a_mesh():
  """`make_logps_fn(micro_batches=k)` (reference / old-policy passes) = the one-pass log-probs, row for row."""
  md = _modeldef()
  params, model_state = md.init(jax.random.key(2))
  batch = _batch(2)
  mesh = mesh_lib.make_mesh((("data", 4), ("model", 2)))
  with mesh_lib.use(mesh):
    one = np.asarray(make_logps_fn(md, 0.7)(params, model_state, batch))
    four = np.asarray(make_logps_fn(md, 0.7, micro_batches=4)(params, model_state, batch))
  np.testing.assert_allclose(four, one, rtol=1e-5, atol=1e-5)


def test_bad_micro_batches_say_what_to_change():
  with pytest.raises(ValueError, match="does not split into 5 micro-batches"):
    accumulate.fold(np.zeros((12, 3)), 5)
  with pytest.raises(ValueError, match="divisor of 6"):
    accumulate.check_micro_batches(12, 4, data_split=2)
  accumulate.check_micro_batches(12, 3, data_split=2)
  with pytest.raises(ValueError, match="micro_batches must be >= 1"):
    GRPOConfig(num_generations=2, micro_batches=0)
  with pytest.raises(ValueError, match="micro_batches must be >= 1"):
    accumulate.make_accumulating_train_step(None, None, None, None, None, None, micro_batches=0)
