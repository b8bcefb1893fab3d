"""Dual-side verification of an LLM-written model (OptiVer, arXiv 2605.29556; the checks are our reconstruction).

Structure side (the model against the description, before solving):
* `number_coverage`: every number of the description is used by the model, and every number the model states
  (other than 0 and 1) appears in the description (a dropped constraint or a wrong coefficient shows up here).
* `integrality`: whole-number wording ("whole number", "integer", "number of", "how many", "either ... or")
  needs integer or binary variables; a continuous variable whose meaning says "number of" is flagged.
* `objective_sense`: maximize / profit wording against a minimize objective, and the reverse.
* `unused_variables`: a declared variable in no constraint and not in the objective, or a declared parameter
  no expression reads.
* `constraint_direction`: a constraint whose right-hand side is a number the description introduces with "at
  most" / "no more than" / "up to" must be <=, with "at least" / "no fewer than" >=, with "exactly" ==.
* `units`: where the model annotates units (`"units": {name: "h/unit", ...}` for parameters, `unit` on a
  variable), the terms of each constraint and of the objective must agree ("h/unit" * "unit" = "h").
* `llm_backtranslation` (optional, a `jaxlab.llm.Backend`): the LLM restates the model as requirements and
  compares them with the description; anything but "OK" is a finding.

Solution side (after solving):
* `status`: an infeasible model (with an irreducible infeasible subset of its constraints), an unbounded one, a
  time-out.
* `objective_recompute`: the objective recomputed from x equals the solver's.
* `residuals`: constraints, bounds and integrality hold at x (1e-6).
* `sanity`: an optimal plan that is all zero does nothing the description asks for.
* `perturbation` (ReLoop's behavioural check, arXiv 2602.15983): tighten, in the direction the description's
  wording gives, the right-hand side of each constraint by 10% (at least 1 on a row of integer variables); the
  optimum must not improve.
* `llm_readback` (optional backend): the LLM reads the plan back in words and judges it against the
  description; anything but "VALID" is a finding.

Each check returns a list of `Finding`s (empty = passed); `verify_structure` / `verify_solution` run a side.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Sequence

from jaxlab.opt_modeling import ir as ir_lib
from jaxlab.opt_modeling.ir import Model

STRUCTURE_CHECKS = ("number_coverage", "integrality", "objective_sense", "unused_variables", "constraint_direction",
                    "units")
SOLUTION_CHECKS = ("status", "objective_recompute", "residuals", "sanity", "perturbation")
TOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Finding:
  check: str
  side: str            # "structure" or "solution"
  message: str

  def to_json(self) -> dict[str, str]:
    return dataclasses.asdict(self)


_NUMBER = re.compile(r"(?<![A-Za-z_\d.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?|\.\d+)(%?)")


def description_numbers(text: str) -> list[tuple[float, int, bool]]:
  """(value, position, is_percent) of every number written in a text (1,200 = 1200; "Q3"-style names skipped)."""
  return [(float(m.group(1).replace(",", "")), m.start(), bool(m.group(2))) for m in _NUMBER.finditer(text)]


def _close(a: float, b: float) -> bool:
  return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _has(values: Sequence[float], v: float) -> bool:
  return any(_close(v, w) for w in values)


def number_coverage(desc: str, model: Model) -> list[Finding]:
  nums = description_numbers(desc)
  stated = [abs(v) for v in model.numbers]          # a description writes magnitudes ("a penalty of 5")
  out = []
  missing = sorted({v for v, _, pct in nums if not (_has(stated, v) or (pct and _has(stated, v / 100)))})
  if missing:
    out.append(Finding("number_coverage", "structure",
                       f"the description's number(s) {_fmt(missing)} are not used by the model: a constraint or "
                       "coefficient may be missing or wrong"))
  desc_values = [v for v, _, _ in nums] + [v / 100 for v, _, pct in nums if pct]
  extra = sorted({v for v in stated if not _close(v, 0) and not _close(abs(v), 1) and not _has(desc_values, v)})
  if extra:
    out.append(Finding("number_coverage", "structure",
                       f"the model uses number(s) {_fmt(extra)} that the description does not state"))
  return out


def _fmt(values) -> str:
  return ", ".join(f"{v:g}" for v in values)


_INTEGER_WORDS = re.compile(r"\bwhole[- ]numbers?\b|\bwhole\b|\bintegers?\b|\bintegral\b|\bnumber of\b|\bhow many\b|"
                            r"\beither\b.*?\bor\b|\bindivisible\b", re.I | re.S)


def integrality(desc: str, model: Model) -> list[Finding]:
  out = []
  m = _INTEGER_WORDS.search(desc)
  if m and all(v.type == "continuous" for v in model.variables):
    out.append(Finding("integrality", "structure",
                       f"the description asks for whole numbers ({m.group(0)[:30]!r}) but every variable is "
                       "continuous; make the counted quantities integer (or binary for yes/no choices)"))
  flagged = sorted({v.base for v in model.variables
                    if v.type == "continuous" and re.search(r"\bnumber of\b|\bhow many\b", v.meaning, re.I)})
  if flagged and not out:
    out.append(Finding("integrality", "structure",
                       f"variable(s) {flagged} count things ('number of') but are continuous"))
  return out


_MAX_WORDS = re.compile(r"\bmaximi[sz]e\b|\bmaximi[sz]ing\b|\bmaximum (?:profit|revenue|value|return)\b|"
                        r"\bas (?:much|many|large) as possible\b", re.I)
_MIN_WORDS = re.compile(r"\bminimi[sz]e\b|\bminimi[sz]ing\b|\bminimum (?:cost|total cost|expense)\b|"
                        r"\bas (?:little|few|small|cheap(?:ly)?) as possible\b|\bcheapest\b", re.I)


def objective_sense(desc: str, model: Model) -> list[Finding]:
  wants_max, wants_min = bool(_MAX_WORDS.search(desc)), bool(_MIN_WORDS.search(desc))
  if wants_max and not wants_min and model.sense == "minimize":
    return [Finding("objective_sense", "structure", "the description asks to maximize but the objective minimizes")]
  if wants_min and not wants_max and model.sense == "maximize":
    return [Finding("objective_sense", "structure", "the description asks to minimize but the objective maximizes")]
  return []


def unused_variables(desc: str, model: Model) -> list[Finding]:
  used = set(model.objective.coefs)
  for c in model.constraints:
    used |= set(c.lhs.coefs)
  unused = [v.name for v in model.variables if v.name not in used]
  out = []
  if unused:
    out.append(Finding("unused_variables", "structure",
                       f"variable(s) {unused[:8]} appear in no constraint and not in the objective: remove them or "
                       "add the constraint that uses them"))
  if model.unused_parameters:
    out.append(Finding("unused_variables", "structure",
                       f"parameter(s) {model.unused_parameters[:8]} are declared but never used: a constraint that "
                       "should use them may be missing"))
  return out


_UPPER = re.compile(r"(?:\bat most|\bno more than|\bup to|\bnot (?:to )?exceed(?:ing)?|\bmaximum of|\bat the most)"
                    r"\s+\$?$", re.I)
_LOWER = re.compile(r"(?:\bat least|\bno fewer than|\bno less than|\bminimum of|\bnot below)\s+\$?$", re.I)
_EXACT = re.compile(r"\bexactly\s+\$?$", re.I)


def number_cues(desc: str) -> dict[float, set[str]]:
  """{value: {"<=", ">=", "=="}}: the comparison the description's wording puts before each number."""
  cues: dict[float, set[str]] = {}
  for v, pos, _ in description_numbers(desc):
    before = desc[max(0, pos - 40):pos]
    for pattern, op in ((_UPPER, "<="), (_LOWER, ">="), (_EXACT, "==")):
      if pattern.search(before):
        cues.setdefault(v, set()).add(op)
  return cues


def _canonical(c: ir_lib.Constraint) -> tuple[str, float]:
  """(op, rhs) with a non-negative right-hand side (both sides negated when it is negative)."""
  if c.rhs < 0:
    return {"<=": ">=", ">=": "<=", "==": "=="}[c.op], -c.rhs
  return c.op, c.rhs


def _cue_of(cues: dict[float, set[str]], rhs: float) -> str | None:
  found = {op for v, ops in cues.items() if _close(v, rhs) for op in ops}
  return next(iter(found)) if len(found) == 1 else None


def constraint_direction(desc: str, model: Model) -> list[Finding]:
  cues = number_cues(desc)
  wrong = []
  for c in model.constraints:
    op, rhs = _canonical(c)
    want = _cue_of(cues, rhs)
    if want is not None and want != op and _sign_consistent(c):
      wrong.append(f"{c.name} ({op} {rhs:g}, the description says {_WORD[want]} {rhs:g})")
  if not wrong:
    return []
  return [Finding("constraint_direction", "structure", "constraint direction differs from the wording: " +
                  "; ".join(wrong[:6]))]


_WORD = {"<=": "at most", ">=": "at least", "==": "exactly"}


def _sign_consistent(c: ir_lib.Constraint) -> bool:
  """Whether the constraint's variables all carry coefficients of one sign (a bound on a total); mixed signs
  (x - y <= 3) make the wording's direction ambiguous."""
  signs = {k > 0 for k in c.lhs.coefs.values()}
  if len(signs) != 1:
    return False
  return (c.rhs >= 0) == next(iter(signs)) or c.rhs == 0


# -- units ------------------------------------------------------------------------------------------------------

def _unit_parse(u: str | None) -> tuple[tuple, tuple] | None:
  if u is None:
    return None
  num, _, den = str(u).replace(" ", "").partition("/")
  split = lambda s: tuple(sorted(t for t in s.split("*") if t and t != "1"))   # noqa: E731
  return split(num), split(den)


def _unit_mul(a, b):
  if a is None or b is None:
    return None
  num, den = list(a[0] + b[0]), list(a[1] + b[1])
  for t in list(num):
    if t in den:
      num.remove(t)
      den.remove(t)
  return tuple(sorted(num)), tuple(sorted(den))


def _unit_str(u) -> str:
  return "*".join(u[0]) + ("/" + "*".join(u[1]) if u[1] else "") if u and (u[0] or u[1]) else "1"


def units(desc: str, model: Model) -> list[Finding]:
  src = model.source
  declared = dict(src.get("units") or {}) if isinstance(src.get("units"), dict) else {}
  for v in src.get("variables") or []:
    if isinstance(v, dict) and v.get("unit"):
      declared[v["name"]] = v["unit"]
  if not declared:
    return []

  def unit(node):
    kind = node[0]
    if kind == "num":
      return ((), ())
    if kind == "ref":
      return _unit_parse(declared.get(node[1]))
    if kind == "neg":
      return unit(node[1])
    if kind == "*":
      return _unit_mul(unit(node[1]), unit(node[2]))
    if kind == "/":
      b = unit(node[2])
      return _unit_mul(unit(node[1]), None if b is None else (b[1], b[0]))
    if kind == "sum":
      return unit(node[2])
    if kind in ("+", "-"):
      a, b = unit(node[1]), unit(node[2])
      if a is not None and b is not None and a != b and a != ((), ()) and b != ((), ()):
        raise _UnitClash(a, b)
      return a if a is not None and a != ((), ()) else b
    return None

  out = []
  pieces = [(c.get("name", f"c{i}"), c.get("expr")) for i, c in enumerate(src.get("constraints") or [])
            if isinstance(c, dict)]
  obj = src.get("objective") or {}
  for name, expr in pieces + [("objective", obj.get("expr"))]:
    if not isinstance(expr, str):
      continue
    try:
      p = ir_lib._Parser(expr)   # pylint: disable=protected-access
      if name == "objective":
        unit(p.expr())
      else:
        _, lhs, rhs = p.comparison()
        unit(("-", lhs, rhs))      # the two sides must agree like the terms of a sum
    except _UnitClash as e:
      out.append(f"{name}: {_unit_str(e.a)} vs {_unit_str(e.b)}")
    except ValueError:
      continue
  if not out:
    return []
  return [Finding("units", "structure", "terms with different units are added or compared: " + "; ".join(out[:6]))]


class _UnitClash(Exception):

  def __init__(self, a, b):
    super().__init__()
    self.a, self.b = a, b


# -- solution side ----------------------------------------------------------------------------------------------

def status(desc: str, model: Model, result) -> list[Finding]:
  if result.status == "optimal":
    return []
  if result.status == "infeasible":
    iis = f" (these constraints conflict: {result.iis})" if result.iis else " (the variable bounds conflict)"
    return [Finding("status", "solution", "the model is infeasible" + iis + "; check their directions and numbers")]
  if result.status == "unbounded":
    return [Finding("status", "solution", "the model is unbounded: the objective improves without limit, so a "
                    "limiting constraint is missing or points the wrong way")]
  return [Finding("status", "solution", f"the solver stopped without an optimum ({result.status}: "
                  f"{result.message})")]


def objective_recompute(desc: str, model: Model, result) -> list[Finding]:
  if result.status != "optimal":
    return []
  value = model.objective.value(result.x)
  if abs(value - result.objective) > 1e-6 * max(1.0, abs(value)):
    return [Finding("objective_recompute", "solution",
                    f"the objective recomputed from x is {value:g}, the solver reported {result.objective:g}")]
  return []


def residuals(desc: str, model: Model, result) -> list[Finding]:
  if result.status != "optimal":
    return []
  bad = []
  x = result.x
  for c in model.constraints:
    lhs = c.lhs.value(x)
    viol = {"<=": lhs - c.rhs, ">=": c.rhs - lhs, "==": abs(lhs - c.rhs)}[c.op]
    if viol > TOL * max(1.0, abs(c.rhs)):
      bad.append(f"{c.name} violated by {viol:g}")
  for v in model.variables:
    val = x[v.name]
    if val < v.lb - TOL or val > v.ub + TOL:
      bad.append(f"{v.name} = {val:g} outside [{v.lb:g}, {v.ub:g}]")
    if v.type != "continuous" and abs(val - round(val)) > 1e-5:
      bad.append(f"{v.name} = {val:g} is not integral")
  if not bad:
    return []
  return [Finding("residuals", "solution", "the solution breaks the model: " + "; ".join(bad[:6]))]


def sanity(desc: str, model: Model, result) -> list[Finding]:
  if result.status != "optimal":
    return []
  if all(abs(v) <= TOL for v in result.x.values()):
    return [Finding("sanity", "solution", "the optimal plan is all zero: the model lets doing nothing be best, so "
                    "the objective's sense, a requirement or a coefficient's sign is likely wrong")]
  return []


def perturbation(desc: str, model: Model, result, *, solver: str = "highs", step: float = 0.1) -> list[Finding]:
  if result.status != "optimal":
    return []
  from jaxlab.opt_modeling import solvers  # pylint: disable=g-import-not-at-top
  cues = number_cues(desc)
  moved = []
  for i, c in enumerate(model.constraints):
    op, rhs = _canonical(c)
    want = _cue_of(cues, rhs)
    if want not in ("<=", ">=") or rhs == 0 or not _sign_consistent(c):
      continue
    delta = step * rhs
    if all(model.var(v).type != "continuous" for v in c.lhs.coefs):
      delta = max(delta, 1.0)      # an integer row needs a whole step to move at all
    tighter = rhs - delta if want == "<=" else rhs + delta
    new_rhs = tighter if c.rhs >= 0 else -tighter
    changed = dataclasses.replace(c, rhs=new_rhs)
    trial = dataclasses.replace(model, constraints=[changed if k == i else k_c
                                                    for k, k_c in enumerate(model.constraints)])
    res = solvers.solve(trial, solver, find_iis=False)
    if res.status != "optimal":
      continue
    better = (res.objective > result.objective if model.sense == "maximize" else res.objective < result.objective)
    if better and abs(res.objective - result.objective) > 1e-6 * max(1.0, abs(result.objective)):
      moved.append(f"{c.name}: tightening {rhs:g} to {tighter:g} ({_WORD[want]}) improved the objective from "
                   f"{result.objective:g} to {res.objective:g}")
  if not moved:
    return []
  return [Finding("perturbation", "solution", "tightening a limit the description states made the optimum better, "
                  "so the constraint does not act as that limit: " + "; ".join(moved[:4]))]


# -- LLM checks --------------------------------------------------------------------------------------------------

def llm_backtranslation(desc: str, model: Model, backend, prompts, request_id: str | None = None) -> list[Finding]:
  """The structure checker's verdict (a `jaxlab.llm.Backend` and the prompt set); "OK" passes."""
  reply = backend.complete(prompts.structure_checker(desc, model.to_json()), request_id=request_id,
                           max_tokens=prompts.max_tokens)[0].text
  verdict = reply.strip()
  if re.match(r"^\W*OK\b", verdict, re.I):
    return []
  return [Finding("llm_backtranslation", "structure", verdict[:800] or "the structure checker gave no verdict")]


def llm_readback(desc: str, model: Model, result, backend, prompts, request_id: str | None = None) -> list[Finding]:
  """The solution interpreter's verdict on the plan; "VALID" passes."""
  if result.status != "optimal":
    return []
  plan = plan_text(model, result)
  reply = backend.complete(prompts.solution_interpreter(desc, model.to_json(), plan), request_id=request_id,
                           max_tokens=prompts.max_tokens)[0].text
  verdict = reply.strip()
  if re.match(r"^\W*VALID\b", verdict, re.I):
    return []
  return [Finding("llm_readback", "solution", verdict[:800] or "the solution interpreter gave no verdict")]


def plan_text(model: Model, result) -> str:
  """The solution in words: each nonzero variable with its meaning, then the objective."""
  lines = []
  for v in model.variables:
    val = result.x[v.name]
    if abs(val) > TOL:
      shown = f"{round(val):d}" if v.type != "continuous" else f"{val:.6g}"
      lines.append(f"{v.name} = {shown}" + (f"  ({v.meaning})" if v.meaning else ""))
  lines.append(f"objective ({model.sense}) = {result.objective:.6g}")
  return "\n".join(lines)


_STRUCTURE: dict[str, Callable[..., list[Finding]]] = {
    "number_coverage": number_coverage, "integrality": integrality, "objective_sense": objective_sense,
    "unused_variables": unused_variables, "constraint_direction": constraint_direction, "units": units}
_SOLUTION: dict[str, Callable[..., list[Finding]]] = {
    "status": status, "objective_recompute": objective_recompute, "residuals": residuals, "sanity": sanity,
    "perturbation": perturbation}


def verify_structure(desc: str, model: Model, *, checks: Sequence[str] = STRUCTURE_CHECKS, backend=None,
                     prompts=None, request_id: str | None = None) -> list[Finding]:
  """The structure-side findings (deterministic checks, then the LLM back-translation when a backend is given)."""
  out = [f for name in checks for f in _STRUCTURE[name](desc, model)]
  if backend is not None:
    out += llm_backtranslation(desc, model, backend, prompts, request_id)
  return out


def verify_solution(desc: str, model: Model, result, *, checks: Sequence[str] = SOLUTION_CHECKS, solver: str = "highs",
                    backend=None, prompts=None, request_id: str | None = None) -> list[Finding]:
  """The solution-side findings (deterministic checks, then the LLM read-back when a backend is given)."""
  out = []
  for name in checks:
    fn = _SOLUTION[name]
    out += fn(desc, model, result, solver=solver) if name == "perturbation" else fn(desc, model, result)
  if backend is not None:
    out += llm_readback(desc, model, result, backend, prompts, request_id)
  return out


def check_names(names: Sequence[str], side: str) -> list[str]:
  """Validates check names of a side (ConfigError naming the allowed ones)."""
  from jaxlab.errors import ConfigError  # pylint: disable=g-import-not-at-top
  allowed = STRUCTURE_CHECKS if side == "structure" else SOLUTION_CHECKS
  bad = [n for n in names if n not in allowed]
  if bad:
    raise ConfigError(f"unknown {side} check(s) {bad}; choose from {list(allowed)}")
  return list(names)


def summarize(findings: Sequence[Finding | dict]) -> str:
  """The findings (or their `to_json` dicts) as the feedback text a corrector reads (one numbered line each)."""
  rows = [f.to_json() if isinstance(f, Finding) else f for f in findings]
  return "\n".join(f"{i + 1}. [{f['side']}/{f['check']}] {f['message']}" for i, f in enumerate(rows))

