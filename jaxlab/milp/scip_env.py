"""SCIP as a branching environment (PySCIPOpt): models from instances, node observations, strong-branching
labels, and branching rules that record samples or call a learned policy.

What Ecole gives users of Gasse et al. (NeurIPS 2019, "Exact Combinatorial Optimization with Graph Convolutional
Neural Networks"), built on PySCIPOpt, whose wheel ships SCIP (10.x), so nothing else is installed:

* `build_model(inst, settings)`: a `pyscipopt.Model` with the experiment's solver settings (`Settings`: presolve,
  cuts, restarts, limits, seed).
* `observe(model)`: the node's bipartite variable-constraint graph from SCIP's `getBipartiteGraphRepresentation`
  (its 19 column features plus 2 of ours, 13 of its 14 row features, one edge feature), normalised as Gasse
  normalises his (objective and reduced costs by the objective norm, row quantities and edge coefficients by the
  row norm, ages by the LP count), so the features do not change when a row or the objective is scaled.
* `strong_branching_scores(model, cands, itlim)`: full strong branching over the candidates without changing the
  solver's state (`idempotent`): score = max(gain_down, eps) * max(gain_up, eps), gains = child LP bound - parent
  LP value (the product score of SCIP and Gasse), an infeasible child counting as a gain of `INFEASIBLE_GAIN`.
* `make_recorder`: Gasse's explore-then-strong-branch sampling rule. At each node, with probability `p_expert`,
  record a sample (observation, candidates, their strong-branching scores, depth, node summary) and branch on the
  strong-branching argmax; otherwise branch on the explore rule (a uniformly random candidate by default, or SCIP's
  pseudocost rule as in Gasse's code), which spreads the samples over the depths of the tree.
* `make_policy_rule`: branches on the argmax of a policy `sample -> candidate index` (e.g. the jitted GCNN).
* `solve(inst, rule, ...)`: one solve with a named rule (SCIP's relpscost, pscost, mostinf = most fractional,
  random, full strong branching "fullstrong", or "policy") and its nodes, time, gap and status.

This module never imports JAX: the collection workers (`jaxlab.milp.collect`) run it in processes of their own.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from jaxlab.milp import instance as instance_lib

EPS = 1e-6
INFEASIBLE_GAIN = 1e6     # a child whose LP is infeasible (it is pruned): a larger gain than any finite one here
# Features of SCIP's representation that are dropped: the raw row norm (every row quantity is divided by it).
ROW_FEATURES = ("has_lhs", "has_rhs", "n_non_zeros", "obj_cosine", "bias", "sol_at_lhs", "sol_at_rhs", "dual_sol",
                "age", "basis_lower", "basis_basic", "basis_upper", "basis_zero")
SCIP_COL_FEATURES = ("continuous", "binary", "integer", "implicit_integer", "obj_coef", "has_lb", "has_ub", "sol_at_lb",
                "sol_at_ub", "sol_val", "sol_frac", "red_cost", "basis_lower", "basis_basic", "basis_upper",
                "basis_zero", "best_incumbent_val", "avg_incumbent_val", "age")
# Two of ours, appended: the node's gap to the cutoff bound (incumbent) over the objective norm (1 before the first
# incumbent), and |reduced cost| / that gap (clipped at 10): whether a child can be cut off depends on them.
COL_FEATURES = SCIP_COL_FEATURES + ("cutoff_gap", "red_cost_over_gap")
EDGE_FEATURES = ("coef",)
# Per-node summary (for strata, plots and the depth breakdowns), `node_feats` in a sample.
NODE_FEATURES = ("depth", "cand_share", "frac_mean", "root_gap", "log_nodes", "has_incumbent")
RULES = ("relpscost", "pscost", "mostinf", "random", "fullstrong", "policy")
EXPLORE = ("random", "pscost", "scip")


def _scip():
  try:
    import pyscipopt  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("pyscipopt is not installed: pip install 'jaxlab[milp]'") from e
  return pyscipopt


@dataclasses.dataclass
class Settings:
  """Solver settings of an experiment.

  Attributes:
    presolve: run SCIP's presolving (off in the tiny runs: the LP then is the instance's own).
    cuts: "off", "root" (Gasse's setting: separation at the root only) or "all".
    restarts: allow restarts (Gasse: off).
    time_limit: seconds per solve (None: no limit).
    node_limit: nodes per solve (None: no limit).
    seed: SCIP's random seed shift.
    heuristics: run SCIP's primal heuristics (off: no incumbent before branching, as in some tests).
    params: any other SCIP parameters {name: value}.
  """
  presolve: bool = False
  cuts: str = "off"
  restarts: bool = False
  heuristics: bool = True
  time_limit: float | None = None
  node_limit: int | None = None
  seed: int = 0
  params: dict = dataclasses.field(default_factory=dict)

  @classmethod
  def from_config(cls, c, **overrides) -> "Settings":
    kw = {f.name: c[f.name] for f in dataclasses.fields(cls) if f.name in c}
    kw.update(overrides)
    kw["params"] = dict(kw.get("params") or {})
    return cls(**kw)


def build_model(inst: instance_lib.Instance, settings: Settings | None = None, quiet: bool = True):
  """(model, variables) of `inst` with `settings` applied (pyscipopt.Model; variables in the instance's order)."""
  s = settings or Settings()
  model, xs = instance_lib.to_scip(inst)
  if quiet:
    model.hideOutput()
  if not s.presolve:
    model.setIntParam("presolving/maxrounds", 0)
  if not s.restarts:
    model.setIntParam("presolving/maxrestarts", 0)
  if s.cuts in ("off", "root"):
    model.setIntParam("separating/maxrounds", 0)
  if s.cuts == "off":
    model.setIntParam("separating/maxroundsroot", 0)
  elif s.cuts not in ("root", "all"):
    raise ValueError(f"Settings.cuts={s.cuts!r} must be 'off', 'root' or 'all'")
  if s.time_limit is not None:
    model.setRealParam("limits/time", float(s.time_limit))
  if s.node_limit is not None:
    model.setLongintParam("limits/nodes", int(s.node_limit))
  model.setIntParam("randomization/randomseedshift", int(s.seed) % 2**31)
  if not s.heuristics:
    model.setHeuristics(_scip().SCIP_PARAMSETTING.OFF)
  for name, value in s.params.items():
    model.setParam(name, value)
  return model, xs


def _var_key(var) -> str:
  name = var.name
  return name[2:] if name.startswith("t_") else name


def observe(model) -> dict[str, np.ndarray]:
  """The focus node's LP as a normalised bipartite graph.

  Returns {"row_feats" (m, 13), "col_feats" (n, 21), "edge_index" (2, E) int32 (row, column), "edge_feats" (E, 1),
  "col_vars" (n,) object array of the LP columns' variable names (original names)}. Columns are in LP order.
  """
  cols, edges, rows, maps = model.getBipartiteGraphRepresentation(suppress_warnings=True)
  cm, rm, em = maps["col"], maps["row"], maps["edge"]
  # nan (e.g. incumbent values before the first incumbent) -> 0; `node_feats` says whether one exists.
  col = np.nan_to_num(np.asarray(cols, np.float64).reshape(len(cols), -1))
  row = np.nan_to_num(np.asarray(rows, np.float64).reshape(len(rows), -1))
  edge = np.asarray(edges, np.float64).reshape(len(edges), -1)
  n_lps = max(model.getNLPs(), 0)
  obj_norm = max(float(np.linalg.norm(col[:, cm["obj_coef"]])), EPS)
  norm = np.maximum(row[:, rm["norm"]], EPS)
  out_col = np.stack([col[:, cm[k]] for k in SCIP_COL_FEATURES], 1)
  red_cost = np.abs(out_col[:, SCIP_COL_FEATURES.index("red_cost")])
  for k in ("obj_coef", "red_cost"):
    out_col[:, SCIP_COL_FEATURES.index(k)] /= obj_norm
  out_col[:, SCIP_COL_FEATURES.index("age")] /= n_lps + 5.0
  cutoff, lp = model.getCutoffbound(), model.getLPObjVal()
  if model.isInfinity(cutoff) or cutoff >= 1e19:
    gap_feat, over_gap = np.ones(len(col)), np.zeros(len(col))
  else:
    gap = max(cutoff - lp, 0.0)
    gap_feat = np.full(len(col), min(gap / obj_norm, 1.0))
    over_gap = np.minimum(red_cost / max(gap, EPS), 10.0)
  out_col = np.concatenate([out_col, gap_feat[:, None], over_gap[:, None]], 1)
  out_row = np.stack([row[:, rm[k]] for k in ROW_FEATURES], 1)
  out_row[:, ROW_FEATURES.index("n_non_zeros")] /= max(len(cols), 1)
  out_row[:, ROW_FEATURES.index("bias")] /= norm
  out_row[:, ROW_FEATURES.index("dual_sol")] *= norm / obj_norm
  out_row[:, ROW_FEATURES.index("age")] /= n_lps + 5.0
  r_idx = edge[:, em["row_idx"]].astype(np.int32)
  c_idx = edge[:, em["col_idx"]].astype(np.int32)
  coef = edge[:, em["coef"]] / norm[r_idx]
  lp_cols = model.getLPColsData()
  names = np.array([_var_key(c.getVar()) for c in lp_cols], dtype=object)
  return {"row_feats": out_row.astype(np.float32), "col_feats": out_col.astype(np.float32),
          "edge_index": np.stack([r_idx, c_idx]), "edge_feats": coef[:, None].astype(np.float32),
          "col_vars": names}


def strong_branching_scores(model, cands, itlim: int | None = None) -> np.ndarray:
  """Full strong branching over `cands` (pyscipopt variables) at the focus node; (k,) float64 product scores.

  `itlim`: LP iterations per child (None: no limit). The solver's state is left unchanged (`idempotent`).
  """
  lp = model.getLPObjVal()
  it = 2**31 - 1 if itlim is None else int(itlim)
  out = np.empty(len(cands))
  model.startStrongbranch()
  try:
    for i, v in enumerate(cands):
      down, up, _, _, downinf, upinf, _, _, lperror = model.getVarStrongbranch(v, it, idempotent=True)
      if lperror:
        out[i] = EPS * EPS
        continue
      gd = INFEASIBLE_GAIN if downinf else min(max(down - lp, EPS), INFEASIBLE_GAIN)
      gu = INFEASIBLE_GAIN if upinf else min(max(up - lp, EPS), INFEASIBLE_GAIN)
      out[i] = gd * gu
  finally:
    model.endStrongbranch()
  return out


def _candidates(model):
  cands, sols, fracs, _, npriocands, _ = model.getLPBranchCands()
  return cands[:npriocands], np.asarray(sols[:npriocands]), np.asarray(fracs[:npriocands])


def node_summary(model, n_cands: int, fracs: np.ndarray, root_lp: float) -> np.ndarray:
  """NODE_FEATURES of the focus node."""
  lp = model.getLPObjVal()
  n_cols = max(model.getNLPCols(), 1)
  return np.array([model.getDepth(), n_cands / n_cols, float(np.mean(fracs)) if len(fracs) else 0.0,
                   (lp - root_lp) / max(abs(root_lp), 1.0), np.log1p(model.getNNodes()),
                   float(model.getNSols() > 0)], np.float32)


def node_sample(model, cands, fracs, root_lp: float) -> dict[str, Any]:
  """The observation of the focus node with its candidates as LP column positions ("cands")."""
  obs = observe(model)
  pos = np.array([v.getCol().getLPPos() for v in cands], np.int32)
  obs["cands"] = pos
  obs["cand_vars"] = obs["col_vars"][pos]
  obs["depth"] = np.int32(model.getDepth())
  obs["node_feats"] = node_summary(model, len(cands), fracs, root_lp)
  return obs


def make_recorder(model, *, p_expert: float, rng: np.random.Generator, explore: str = "random",
                  itlim: int | None = None, max_samples: int | None = None, on_sample: Callable | None = None,
                  all_depth_le: int = -1, record_tied: bool = False):
  """Gasse's explore-then-strong-branch rule, included in `model`; returns the rule (its `.samples`, `.sb_time`).

  Args:
    model: a model from `build_model` (before `optimize`).
    p_expert: probability of querying strong branching (and recording a sample) at a node.
    rng: the numpy generator of the coin flips and random exploration.
    explore: "random" (a uniformly random candidate), "pscost" (SCIP's pseudocost rule, Gasse's exploration) or
      "scip" (the solver's own next rule, relpscost by default).
    itlim: strong-branching LP iteration limit per child (None: none).
    max_samples: stop the solve after this many samples (None: never).
    on_sample: optional callback(sample) (e.g. a streaming writer); samples are also kept in `.samples`.
    all_depth_le: nodes at depth <= this are always sampled (the upstream nodes SC-MILP needs; -1: none).
    record_tied: also record nodes where every candidate has the same score (no label: any choice is strong
      branching's; by default they are branched on and counted in `.tied`, not recorded).
  """
  scip = _scip()
  if explore not in EXPLORE:
    raise ValueError(f"explore={explore!r} must be one of {EXPLORE}")
  if explore == "pscost":        # the rule SCIP falls back to when ours does not run
    _use_scip_rule(model, "pscost")

  class Recorder(scip.Branchrule):
    def __init__(self):
      self.samples, self.sb_time, self.nodes_seen, self.root_lp, self.tied = [], 0.0, 0, None, 0

    def branchexeclp(self, allowaddcons):
      del allowaddcons
      m = model
      cands, _, fracs = _candidates(m)
      if self.root_lp is None:
        self.root_lp = m.getLPObjVal()
      self.nodes_seen += 1
      if m.getDepth() <= all_depth_le or rng.random() < p_expert:
        t0 = time.perf_counter()
        scores = strong_branching_scores(m, cands, itlim)
        if record_tied or scores.max() > scores.min() * (1 + 1e-9):
          sample = node_sample(m, cands, fracs, self.root_lp)
          sample["scores"] = scores.astype(np.float32)
          self.samples.append(sample)
          if on_sample is not None:
            on_sample(sample)
        else:
          self.tied += 1
        self.sb_time += time.perf_counter() - t0
        m.branchVar(cands[int(np.argmax(scores))])
        if max_samples is not None and len(self.samples) >= max_samples:
          m.interruptSolve()
        return {"result": scip.SCIP_RESULT.BRANCHED}
      if explore == "random":
        m.branchVar(cands[int(rng.integers(len(cands)))])
        return {"result": scip.SCIP_RESULT.BRANCHED}
      return {"result": scip.SCIP_RESULT.DIDNOTRUN}      # the next rule by priority branches

  rule = Recorder()
  _include(model, rule, "explore_then_sb", "Gasse's explore-then-strong-branch sampler")
  return rule


def make_policy_rule(model, policy: Callable[[dict], int]):
  """A branching rule in `model` that branches on candidate `policy(sample)` (an index into sample["cands"]).

  The rule's `.calls` and `.policy_time` (seconds inside the policy, observation included) are kept for reports.
  """
  scip = _scip()

  class Policy(scip.Branchrule):
    def __init__(self):
      self.calls, self.policy_time, self.root_lp = 0, 0.0, None

    def branchexeclp(self, allowaddcons):
      del allowaddcons
      cands, _, fracs = _candidates(model)
      if self.root_lp is None:
        self.root_lp = model.getLPObjVal()
      t0 = time.perf_counter()
      choice = int(policy(node_sample(model, cands, fracs, self.root_lp)))
      self.policy_time += time.perf_counter() - t0
      self.calls += 1
      if not 0 <= choice < len(cands):
        raise ValueError(f"the policy chose candidate {choice} of {len(cands)}")
      model.branchVar(cands[choice])
      return {"result": scip.SCIP_RESULT.BRANCHED}

  rule = Policy()
  _include(model, rule, "policy", "a learned branching policy")
  return rule


def make_fullstrong_rule(model, itlim: int | None = None):
  """Full strong branching (ours, the labels' rule): branches on the strong-branching argmax at every node."""
  scip = _scip()

  class Full(scip.Branchrule):
    def branchexeclp(self, allowaddcons):
      del allowaddcons
      cands, _, _ = _candidates(model)
      model.branchVar(cands[int(np.argmax(strong_branching_scores(model, cands, itlim)))])
      return {"result": scip.SCIP_RESULT.BRANCHED}

  rule = Full()
  _include(model, rule, "fullsb", "full strong branching")
  return rule


def _include(model, rule, name: str, desc: str) -> None:
  """Adds `rule` above every SCIP rule, at all depths and nodes."""
  model.includeBranchrule(rule, name, desc, priority=10**7, maxdepth=-1, maxbounddist=1.0)


def _use_scip_rule(model, name: str) -> None:
  model.setIntParam(f"branching/{name}/priority", 10**6)
  model.setIntParam(f"branching/{name}/maxdepth", -1)


def solve(inst: instance_lib.Instance, rule: str, settings: Settings | None = None,
          policy: Callable[[dict], int] | None = None) -> dict[str, Any]:
  """Solves `inst` with branching `rule` (one of RULES; "policy" needs `policy`).

  Returns {"nodes", "time" (SCIP's solving time, s), "status", "gap" (SCIP's relative gap; 0 when optimal),
  "primal", "dual", "policy_time", "policy_calls"}.
  """
  if rule not in RULES:
    raise ValueError(f"rule={rule!r} must be one of {RULES}")
  if rule == "policy" and policy is None:
    raise ValueError("rule='policy' needs a policy (sample -> candidate index)")
  model, _ = build_model(inst, settings)
  extra = None
  if rule == "policy":
    extra = make_policy_rule(model, policy)
  elif rule == "fullstrong":
    make_fullstrong_rule(model)
  elif rule != "relpscost":
    _use_scip_rule(model, rule)
  t0 = time.perf_counter()
  model.optimize()
  wall = time.perf_counter() - t0
  status = model.getStatus()
  out = {"nodes": int(model.getNNodes()), "time": float(model.getSolvingTime()), "wall": wall, "status": status,
         "gap": float(model.getGap()) if model.getNSols() else float("inf"),
         "primal": float(model.getPrimalbound()), "dual": float(model.getDualbound()),
         "policy_time": extra.policy_time if extra else 0.0, "policy_calls": extra.calls if extra else 0}
  model.freeProb()
  return out


def root_strong_branching(inst: instance_lib.Instance, itlim: int | None = None,
                          settings: Settings | None = None) -> dict[str, float]:
  """{variable name: strong-branching score} over the root's candidates (the solve stops at the root)."""
  scip = _scip()
  model, _ = build_model(inst, settings)
  got = {}

  class Root(scip.Branchrule):
    def branchexeclp(self, allowaddcons):
      del allowaddcons
      cands, _, _ = _candidates(model)
      got.update(zip([_var_key(v) for v in cands], strong_branching_scores(model, cands, itlim)))
      got["__lp__"] = model.getLPObjVal()
      model.interruptSolve()
      return {"result": scip.SCIP_RESULT.DIDNOTRUN}

  _include(model, Root(), "root_sb", "root strong branching")
  model.optimize()
  model.freeProb()
  return got


def shifted_geometric_mean(values, shift: float) -> float:
  """exp(mean(log(v + shift))) - shift: the MILP community's average of nodes (shift 1..100) and times (1 s)."""
  v = np.asarray(values, np.float64)
  return float(np.exp(np.mean(np.log(v + shift))) - shift)
