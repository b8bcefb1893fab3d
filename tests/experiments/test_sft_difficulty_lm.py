"""sft_difficulty LM arm: pretrain (resume), SFT cells (metrics, determinism, nested budgets), data, grid, errors."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

from jaxlab.errors import ConfigError, DataError
from jaxlab.experiments.sft_difficulty import lm_arm
from jaxlab.state import ModelDef

SINGLE = (("data", 1), ("model", 1))   # one device: the tests' 8 fake CPU devices would only slow a tiny model


def tiny(**overrides):
  """A seconds-sized LM arm: 1 layer of width 32, 30 pretraining steps, 2 x 2 grid, tiny eval sets."""
  lm = lm_arm.default_config()
  lm.model.update(dict(hidden=32, n_layers=1, n_heads=2, n_kv_heads=1, mlp_hidden=64))
  lm.pretrain.update(dict(n_examples=400, steps=30, batch=16, warmup=5, log_every=10, checkpoint_every=0))
  lm.difficulties, lm.budgets, lm.target_digits = (2, 3), (8, 16), (2, 3, 4)
  lm.sft.update(dict(steps=6, batch=8, warmup=1))
  lm.eval.update(dict(n_id=8, n_target=8, batch=8))
  lm.mesh = SINGLE
  for k, v in overrides.items():
    section, _, key = k.rpartition(".")
    (lm[section] if section else lm)[key] = v
  return lm


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  lm = tiny()
  workdir = str(tmp_path_factory.mktemp("lm_arm") / "pretrain")
  return lm, lm_arm.pretrain(lm, 0, workdir), workdir


def _params(model):
  return jax.device_get(ModelDef.split(model)[0])


def _same(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_cell_metrics_are_finite_and_gaps_match_their_definitions(pretrained):
  lm, base, _ = pretrained
  before = _params(base)
  r = lm_arm.sft_cell(lm, base, 3, 16, 0)
  for key in lm_arm.METRICS + ("d", "n", "target_err_k2", "target_err_k4", "target_loss_k4"):
    assert key in r and math.isfinite(r[key]), key
  assert (r["d"], r["n"]) == (3, 16)
  assert r["gen_gap"] == pytest.approx(r["id_loss"] - r["train_loss"], abs=1e-12)
  assert r["extrap_gap"] == pytest.approx(r["target_loss"] - r["id_loss"], abs=1e-12)
  assert r["id_acc"] + r["id_err"] == pytest.approx(1.0) and r["target_acc"] + r["target_err"] == pytest.approx(1.0)
  per_level = np.mean([r[f"target_loss_k{k}"] for k in lm.target_digits])      # equal shares of the mix
  assert r["target_loss"] == pytest.approx(per_level, rel=1e-6)
  assert 0.0 < r["train_loss"] < math.log(264)                                  # pretraining taught something
  assert _same(before, _params(base))                                           # the base is not changed
  ref = lm_arm.base_metrics(lm, base, 0)
  assert set(ref) >= {"target_loss", "target_err", "target_err_k4"} and ref["target_loss"] != r["target_loss"]


def test_cell_is_deterministic_and_cells_differ(pretrained):
  lm, base, _ = pretrained
  a, b = lm_arm.sft_cell(lm, base, 2, 8, 0), lm_arm.sft_cell(lm, base, 2, 8, 0)
  a.pop("seconds"), b.pop("seconds")
  assert a == b
  c = lm_arm.sft_cell(lm, base, 2, 16, 0)
  assert c["train_loss"] != a["train_loss"]


def test_budgets_are_nested_and_sets_disjoint():
  lm = tiny()
  small, held = lm_arm.cell_data(lm, 2, 8, 0)
  large, held2 = lm_arm.cell_data(lm, 2, 16, 0)
  assert large[:8] == small and held == held2 and len(large) == 16 and len(held) == lm.eval.n_id
  targets = [r["prompt"] for _, r in lm_arm.target_set(lm, 0)]
  pre = {r["prompt"] for r in lm_arm.pretrain_examples(lm, 0)}
  train, ident = {r["prompt"] for r in large}, {r["prompt"] for r in held}
  assert len(targets) == len(set(targets)) == lm.eval.n_target * len(lm.target_digits)
  assert not (train & ident) and not (train & set(targets)) and not (ident & set(targets))
  assert not (pre & (ident | set(targets)))              # evaluation problems are new to the base model too
  for r in large + held:       # fixed width (the widest level, 4), operands below 10^2, sum padded and reversed
    a, b = map(int, r["prompt"][:-1].split("+"))
    assert len(r["prompt"]) == 2 * 4 + 2 and a < 100 and b < 100 and r["completion"] == str(a + b).zfill(5)[::-1]
  # A larger pool (another budget list) keeps the same prefix; another seed draws other problems.
  assert lm_arm.cell_data(tiny(budgets=(8, 16, 64)), 2, 16, 0)[0] == large
  assert lm_arm.cell_data(lm, 2, 8, 1)[0] != small
  with pytest.raises(ConfigError, match="exceeds max"):
    lm_arm.cell_data(lm, 2, 17, 0)


def test_natural_format_has_exactly_d_digit_operands():
  lm = tiny(**{"data.pad_operands": False, "data.leading_zeros": False})
  train, held = lm_arm.cell_data(lm, 3, 16, 0)
  for r in train + held:
    a, b = map(int, r["prompt"][:-1].split("+"))
    assert 100 <= a < 1000 and 100 <= b < 1000 and r["prompt"] == f"{a}+{b}=" and r["completion"] == str(a + b)[::-1]


def test_pretrain_resumes_from_the_saved_model(pretrained, monkeypatch):
  lm, base, workdir = pretrained

  def no_training(*args, **kwargs):
    raise AssertionError("pretrain trained again instead of loading workdir/final")
  monkeypatch.setattr(lm_arm, "fit", no_training)
  again = lm_arm.pretrain(lm, 0, workdir)
  assert again.config == base.config and _same(_params(base), _params(again))
  with pytest.raises(ConfigError, match="different config"):        # other settings: refused, not overwritten
    lm_arm.pretrain(tiny(**{"model.hidden": 16}), 0, workdir)


def test_jsonl_pools_with_difficulty_buckets(pretrained, tmp_path):
  lm, base, _ = pretrained
  pool, target = tmp_path / "pool.jsonl", tmp_path / "target.jsonl"
  rng = np.random.default_rng(0)
  with open(pool, "w") as f:
    for d in (2, 3):
      for a, b in rng.integers(10 ** (d - 1), 10 ** d, size=(40, 2)):
        f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)[::-1], "difficulty": d}) + "\n")
  with open(target, "w") as f:
    for a, b in rng.integers(1000, 10000, size=(8, 2)):
      f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b)[::-1], "difficulty": 4}) + "\n")
  user = tiny(**{"data.source": "jsonl", "data.path": str(pool), "data.target_path": str(target),
                 "data.seq_len": lm_arm.seq_len(lm)})
  train, held = lm_arm.cell_data(user, 3, 16, 0)
  assert all(len(r["prompt"]) == 8 for r in train + held) and not {r["prompt"] for r in train} & {
      r["prompt"] for r in held}
  r = lm_arm.sft_cell(user, base, 3, 16, 0)
  assert math.isfinite(r["extrap_gap"]) and "target_err_k4" in r
  with pytest.raises(DataError, match="records of difficulty 5"):
    lm_arm.cell_data(user, 5, 8, 0)


def test_grid_arrays_and_heatmap(tmp_path):
  rows = [{"d": d, "n": n, "target_err": d / 10 + n / 100, "gen_gap": float(d * n)} for d in (2, 3) for n in (8,)]
  arrays = lm_arm.grid_arrays(rows, (2, 3, 4), (8, 16))
  assert arrays["target_err"].shape == (2, 3)
  np.testing.assert_allclose(arrays["target_err"][0], [0.28, 0.38, np.nan])
  assert np.isnan(arrays["gen_gap"][1]).all()
  path = lm_arm.heatmap(arrays, (2, 3, 4), (8, 16), "target_err", str(tmp_path / "plots" / "err.png"), "t")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(DataError, match="two rows"):
    lm_arm.grid_arrays(rows + rows[:1], (2, 3), (8,))
  with pytest.raises(DataError, match="no metric"):
    lm_arm.heatmap(arrays, (2, 3, 4), (8, 16), "nope", str(tmp_path / "x.png"))


@pytest.mark.parametrize("overrides, match", [
    ({"difficulties": ()}, "difficulties is empty"),
    ({"budgets": ()}, "budgets is empty"),
    ({"budgets": (8, 0)}, "budgets must be an integer >= 1"),
    ({"difficulties": (2, 2)}, "repeats a value"),
    ({"difficulties": (2, 10)}, "max_position=32 is shorter than a 10-digit addition"),
    ({"sft.steps": 0}, "sft.steps must be an integer >= 1"),
    ({"eval.n_id": -1}, "eval.n_id must be an integer >= 1"),
    ({"sft.lr": 0.0}, "sft.lr must be positive"),
    ({"sft.warmup": 99}, "sft.warmup=99 must be in"),
    ({"pretrain.min_digits": 3}, "min_digits=3 exceeds max_digits=2"),
    ({"data.source": "csv"}, "use addition or jsonl"),
    ({"data.source": "jsonl"}, "needs config.lm.data.seq_len"),
    ({"data.seq_len": 10}, "seq_len=10 is too short"),
    ({"model.n_kv_heads": 3}, "must divide"),
    ({"sft.schedule": "linear"}, "sft.schedule"),
])
def test_validate_errors(overrides, match):
  with pytest.raises(ConfigError, match=match) as e:
    lm_arm.validate(tiny(**overrides))
  assert "\n" not in str(e.value)


def test_batch_must_split_over_the_mesh(pretrained):
  lm, base, _ = pretrained
  with pytest.raises(ConfigError, match="sft.batch=6 is not divisible by the 8-way data split"):
    lm_arm.sft_cell(tiny(**{"mesh": lm_arm.default_config().mesh, "sft.batch": 6}), base, 2, 8, 0)


def test_sharded_cell_matches_single_device(pretrained):
  lm, base, _ = pretrained
  sharded = tiny(mesh=lm_arm.default_config().mesh)            # the tests' 8 CPU devices: batch 8 over "data"
  a, b = lm_arm.sft_cell(lm, base, 2, 16, 0), lm_arm.sft_cell(sharded, base, 2, 16, 0)
  for key in ("train_loss", "id_loss", "target_loss", "id_err", "target_err"):
    assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-3), key
