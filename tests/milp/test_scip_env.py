"""The SCIP environment against independent references: strong-branching scores = child LPs solved by scipy's
HiGHS, their invariance under equivalent transforms, observations that permute with the instance (and a GCNN whose
logits permute with them), the recorder, the policy rule, the named rules, and the collection workers (no JAX in
them, resume, clear failures)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog

pytest.importorskip("pyscipopt", reason="pyscipopt is not installed: pip install 'jaxlab[milp]'")

from jaxlab.milp import augment, collect, generators, scip_env  # noqa: E402
from jaxlab.milp.instance import Instance  # noqa: E402

QUIET = scip_env.Settings(heuristics=False)   # presolve and cuts off, no incumbent: the root LP is the instance's


def _cover(seed: int, m: int = 80, n: int = 150, density: float = 0.05) -> Instance:
  """Set cover with continuous positive costs (a unique LP optimum almost surely: no degenerate ties)."""
  inst = generators.set_cover(np.random.default_rng(seed), m, n, density)
  inst.c = np.random.default_rng(seed + 100).uniform(1.0, 10.0, n)
  return inst


def _lp(inst: Instance, lb=None, ub=None) -> float | None:
  lo, hi = np.isfinite(inst.lhs), np.isfinite(inst.rhs)
  res = linprog(inst.c, A_ub=sp.vstack([inst.A[hi], -inst.A[lo]]),
                b_ub=np.concatenate([inst.rhs[hi], -inst.lhs[lo]]),
                bounds=np.stack([inst.lb if lb is None else lb, inst.ub if ub is None else ub], 1), method="highs")
  return None if res.status == 2 else float(res.fun) + inst.offset


def _lp_solution(inst: Instance) -> np.ndarray:
  lo, hi = np.isfinite(inst.lhs), np.isfinite(inst.rhs)
  return linprog(inst.c, A_ub=sp.vstack([inst.A[hi], -inst.A[lo]]), b_ub=np.concatenate([inst.rhs[hi], -inst.lhs[lo]]),
                 bounds=np.stack([inst.lb, inst.ub], 1), method="highs").x


@pytest.mark.parametrize("seed", [1, 2])
def test_strong_branching_scores_equal_child_lps_solved_by_scipy(seed):
  inst = _cover(seed)
  got = scip_env.root_strong_branching(inst, settings=QUIET)
  root = _lp(inst)
  assert got.pop("__lp__") == pytest.approx(root, rel=1e-7)
  x = _lp_solution(inst)
  frac = np.flatnonzero(np.abs(x - np.round(x)) > 1e-6)
  assert sorted(got) == sorted(inst.var_names[j] for j in frac)
  for j in frac:
    down_ub, up_lb = inst.ub.copy(), inst.lb.copy()
    down_ub[j], up_lb[j] = np.floor(x[j]), np.ceil(x[j])
    gains = []
    for child in (_lp(inst, ub=down_ub), _lp(inst, lb=up_lb)):
      gains.append(scip_env.INFEASIBLE_GAIN if child is None else max(child - root, scip_env.EPS))
    assert got[inst.var_names[j]] == pytest.approx(gains[0] * gains[1], rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("kinds", [("permute",), ("scale_rows",), ("shift",), ("permute", "scale_rows", "shift")])
def test_strong_branching_is_invariant_under_equivalent_transforms(kinds):
  """Claim 2 (exact property): same candidates, same scores (no iteration limit), labels mapped by name."""
  inst = _cover(1)
  new, col_perm = augment.equivalent(inst, np.random.default_rng(5), kinds=kinds)
  assert [new.var_names[j] for j in range(new.num_cols)] == [inst.var_names[j] for j in col_perm]
  a = scip_env.root_strong_branching(inst, settings=QUIET)
  b = scip_env.root_strong_branching(new, settings=QUIET)
  shift = new.offset - inst.offset
  assert b.pop("__lp__") + shift == pytest.approx(a.pop("__lp__"), rel=1e-7)
  assert sorted(a) == sorted(b) and len(a) > 3
  for name in a:
    assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-9), name
  assert max(a, key=a.get) == max(b, key=b.get)


def _root_observation(inst: Instance) -> dict:
  import pyscipopt
  model, _ = scip_env.build_model(inst, QUIET)
  got = {}

  class Obs(pyscipopt.Branchrule):
    def branchexeclp(self, allowaddcons):
      cands, _, fracs = scip_env._candidates(model)
      got.update(scip_env.node_sample(model, cands, fracs, model.getLPObjVal()))
      model.interruptSolve()
      return {"result": pyscipopt.SCIP_RESULT.DIDNOTRUN}

  model.includeBranchrule(Obs(), "obs", "", priority=10**7, maxdepth=-1, maxbounddist=1.0)
  model.optimize()
  return got


def test_observation_permutes_with_the_instance_and_the_gcnn_logits_follow():
  """Claim 2 (exact property) on SCIP's own observations: permuting rows and columns of the instance permutes
  the observed graph (the basis, the duals and the ages may differ: they follow the simplex path, and a degenerate
  LP has several optimal bases), and the GCNN's logits permute exactly as the graph does (1e-5)."""
  from flax import nnx
  from jaxlab.milp import gcnn
  inst = _cover(2)
  new, col_perm, row_perm = augment.permute(inst, np.random.default_rng(2))
  a, b = _root_observation(inst), _root_observation(new)
  assert list(a["col_vars"]) == inst.var_names and list(b["col_vars"]) == new.var_names   # LP order = var order
  path = ("red_cost", "dual_sol", "age", "basis")    # depend on the simplex path, not on the LP
  primal_c = [i for i, f in enumerate(scip_env.COL_FEATURES) if not f.startswith(path)]
  primal_r = [i for i, f in enumerate(scip_env.ROW_FEATURES) if not f.startswith(path)]
  np.testing.assert_allclose(b["col_feats"][:, primal_c], a["col_feats"][col_perm][:, primal_c], atol=1e-6)
  np.testing.assert_allclose(b["row_feats"][:, primal_r], a["row_feats"][row_perm][:, primal_r], atol=1e-6)
  assert np.isfinite(a["col_feats"]).all() and (np.abs(a["edge_feats"]) <= 1 + 1e-6).all()   # coef / row norm
  inv_r, inv_c = np.argsort(row_perm), np.argsort(col_perm)    # old index -> new index

  def edges(s, rmap, cmap):
    return {(rmap[r], cmap[c]): float(f) for (r, c), f in zip(s["edge_index"].T, s["edge_feats"][:, 0])}
  assert edges(a, inv_r, inv_c) == pytest.approx(edges(b, np.arange(new.num_rows), np.arange(new.num_cols)))
  assert sorted(a["cand_vars"]) == sorted(b["cand_vars"])
  # The GCNN on the observation and on its exact permutation.
  perm = dict(a, row_feats=a["row_feats"][row_perm], col_feats=a["col_feats"][col_perm],
              edge_index=np.stack([inv_r[a["edge_index"][0]], inv_c[a["edge_index"][1]]]).astype(np.int32),
              cands=inv_c[a["cands"]].astype(np.int32))
  model = gcnn.BipartiteGCNN(13, len(scip_env.COL_FEATURES), 1, emb=16, rngs=nnx.Rngs(0))
  logits = [np.asarray(gcnn.jit_col_logits(model, gcnn.pack([dict(s, scores=np.zeros(len(s["cands"])))])))[0]
            for s in (a, perm)]
  np.testing.assert_allclose(logits[1][:new.num_cols], logits[0][col_perm], rtol=1e-5, atol=1e-5)


def test_recorder_samples_and_branches_on_strong_branching():
  inst = generators.set_cover(np.random.default_rng(0), 120, 240, 0.05)
  model, _ = scip_env.build_model(inst, scip_env.Settings(time_limit=30))
  rule = scip_env.make_recorder(model, p_expert=1.0, rng=np.random.default_rng(0), max_samples=6)
  model.optimize()
  assert 1 <= len(rule.samples) <= 6
  for s in rule.samples:
    assert s["row_feats"].shape == (120, len(scip_env.ROW_FEATURES))
    assert s["col_feats"].shape == (240, len(scip_env.COL_FEATURES))
    assert s["edge_index"].shape[1] == inst.A.nnz == len(s["edge_feats"])
    assert len(s["cands"]) == len(s["scores"]) >= 2 and s["scores"].max() > s["scores"].min()
    assert 0 <= s["cands"].min() and s["cands"].max() < 240
    sol_frac = s["col_feats"][s["cands"], scip_env.COL_FEATURES.index("sol_frac")]
    assert (sol_frac > 0).all()                                 # candidates are fractional
    assert s["node_feats"].shape == (len(scip_env.NODE_FEATURES),)
  assert rule.samples[0]["depth"] == 0


def test_named_rules_policy_rule_and_bad_rule():
  inst = generators.set_cover(np.random.default_rng(1), 100, 200, 0.05)
  settings = scip_env.Settings(time_limit=30)
  res = {r: scip_env.solve(inst, r, settings) for r in ("relpscost", "mostinf", "random", "fullstrong")}
  opt = res["relpscost"]["primal"]
  assert all(r["status"] == "optimal" and r["primal"] == pytest.approx(opt) for r in res.values())
  calls = []

  def first(sample):
    calls.append(len(sample["cands"]))
    return 0
  out = scip_env.solve(inst, "policy", settings, policy=first)
  assert out["status"] == "optimal" and out["primal"] == pytest.approx(opt) and out["policy_calls"] == len(calls)
  with pytest.raises(ValueError, match="rule='nope' must be one of"):
    scip_env.solve(inst, "nope")
  with pytest.raises(ValueError, match="needs a policy"):
    scip_env.solve(inst, "policy")
  assert scip_env.shifted_geometric_mean([10, 100], 10) == pytest.approx(np.sqrt(20 * 110) - 10)


def _jobs(n, **kw):
  return [collect.job(i, generator="setcover", sizes=dict(n_rows=100, n_cols=200, density=0.05), seed=(7, i),
                      settings=dict(time_limit=20.0), p_expert=0.5, max_samples=5, **kw) for i in range(n)]


def test_collection_workers_resume_and_never_import_jax(tmp_path):
  out = str(tmp_path / "shards")
  metas = collect.collect(_jobs(3), out, workers=2)
  assert [m["index"] for m in metas] == [0, 1, 2]
  assert not any(m["jax_imported"] for m in metas)            # the workers are JAX-free processes
  samples, _ = collect.load(out)
  assert len(samples) == sum(m["samples"] for m in metas) > 0
  s = samples[0]
  assert s["edge_index"].shape == (2, len(s["edge_feats"])) and s["edge_index"].dtype == np.int32
  stamp = {i: os.path.getmtime(collect.shard_path(out, i)) for i in range(3)}
  before, _ = collect.load(out, [1])
  os.remove(collect.shard_path(out, 1))                        # an interrupted collection: shard 1 missing
  time.sleep(0.05)
  again = collect.collect(_jobs(3), out, workers=2)
  assert os.path.getmtime(collect.shard_path(out, 0)) == stamp[0]   # kept, not recollected
  assert again[1]["samples"] == metas[1]["samples"]
  redo, _ = collect.load(out, [1])
  assert len(redo) == len(before) and all(np.array_equal(a["scores"], b["scores"]) for a, b in zip(redo, before))
  assert collect.throughput(again)["samples"] == collect.throughput(metas)["samples"]


def test_collect_splits_summarises_each_split_and_refuses_an_empty_one(tmp_path):
  out, metas = collect.collect_splits({"a": (_jobs(2), str(tmp_path / "a")), "b": (_jobs(1), str(tmp_path / "b"))},
                                      workers=1)
  assert out["collect/a/instances"] == 2 and out["collect/b/instances"] == 1 and len(metas) == 3
  assert out["collect/a/samples"] + out["collect/b/samples"] == out["collect/samples"] > 0
  assert out["collect/jax_in_workers"] is False
  none = [collect.job(0, generator="setcover", sizes=dict(n_rows=100, n_cols=200, density=0.05), seed=(7, 0),
                      p_expert=1e-9)]                         # never queries strong branching: no labelled node
  with pytest.raises(RuntimeError, match="the empty instances gave no strong-branching samples"):
    collect.collect_splits({"empty": (none, str(tmp_path / "empty"))}, workers=1)


def test_collection_worker_failure_is_a_clear_error(tmp_path):
  bad = [collect.job(0, generator="nope", seed=(0,))]
  with pytest.raises(RuntimeError, match="a collection worker failed .* rerun to continue"):
    collect.collect(bad, str(tmp_path / "bad"), workers=1)
  with pytest.raises(ValueError, match="exactly one of generator= and path="):
    collect.job(0)
  with pytest.raises(ValueError, match="distinct indices"):
    collect.collect(_jobs(1) + _jobs(1), str(tmp_path / "dup"))


def test_collection_on_transformed_and_file_instances(tmp_path):
  """A job may collect on an equivalent or perturbed copy of its instance, or on a user's .mps file."""
  from jaxlab.milp import instance
  inst = generators.set_cover(np.random.default_rng((7, 0)), 100, 200, 0.05)
  path = str(tmp_path / "user.mps")
  instance.write(inst, path)
  jobs = [collect.job(0, path=path, seed=(1,), p_expert=1.0, max_samples=2),
          collect.job(1, generator="setcover", sizes=dict(n_rows=100, n_cols=200, density=0.05), seed=(7, 0),
                      p_expert=1.0, max_samples=2, transform={"kind": "equivalent", "seed": [3]}),
          collect.job(2, generator="setcover", sizes=dict(n_rows=100, n_cols=200, density=0.05), seed=(7, 0),
                      p_expert=1.0, max_samples=2, transform={"kind": "perturb", "seed": [3], "sigma": 0.1})]
  metas = collect.collect(jobs, str(tmp_path / "shards"), workers=1)
  assert [(m["rows"], m["cols"]) for m in metas] == [(100, 200)] * 3
  assert all(m["samples"] >= 1 for m in metas)
  samples, _ = collect.load(str(tmp_path / "shards"))
  assert sorted({s["instance"] for s in samples}) == [0, 1, 2]
  assert all(s["col_feats"].shape == (200, len(scip_env.COL_FEATURES)) for s in samples)
