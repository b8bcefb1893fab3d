"""The structured optimisation model an LLM writes (the IR), parsed strictly; its errors are corrector feedback.

A model is a JSON object (an LLM's answer may wrap it in a ```json block; `extract_json` finds it):

    {"name": "furniture",
     "sets": {"P": ["chair", "table"]},
     "parameters": {"profit": {"chair": 30, "table": 50}, "hours": {"chair": 2, "table": 4}, "labor": 40},
     "variables": [{"name": "x", "over": ["P"], "type": "integer", "lb": 0, "ub": null,
                    "meaning": "number of units of each product"}],
     "constraints": [{"name": "labor_hours", "expr": "sum(p in P, hours[p] * x[p]) <= labor",
                      "meaning": "at most 40 labor hours"},
                     {"name": "min_chairs", "forall": "p in P", "expr": "x[p] >= 1"}],
     "objective": {"sense": "maximize", "expr": "sum(p in P, profit[p] * x[p])"}}

* `sets`: name -> list of distinct elements (strings or integers).
* `parameters`: name -> a number, or nested objects indexed by set elements (one level per index).
* `variables`: name, optional `over` (set names: the variable is indexed by them), `type` in {continuous,
  integer, binary}, `lb` (default 0), `ub` (default none; binary: [0, 1]), optional `unit` and `meaning`.
* `constraints`: name, `expr` (one linear comparison with <=, >= or ==), optional `forall` ("i in I" or
  "i in I, j in J": one constraint per combination), `unit`, `meaning`.
* `objective`: `sense` in {maximize, minimize} (also max / min), `expr` (a linear expression).
* optional `units`: parameter name -> unit string ("h/unit", "usd"), checked by `verify.units`.

Expressions use a small grammar of our own (model output is never executed): numbers, parameters and
variables (`cost[i, j]`, `x[p]`, `x['chair']`), + - * / with numbers and parameters only (a product of two
variables is an error: models must be linear), parentheses, and `sum(i in I, j in J, expr)`. Indices are
iterator names, quoted elements, or integers.

`parse(obj) -> Model` validates everything and expands every expression to `LinearExpr`s over scalar
variables named "x[chair]"; `ModelError` lists each problem on one line, as feedback a corrector can act on.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from typing import Any, Iterator, Mapping, Sequence

from jaxlab.errors import DataError

VAR_TYPES = ("continuous", "integer", "binary")
SENSES = {"maximize": "maximize", "max": "maximize", "maximise": "maximize", "minimize": "minimize",
          "min": "minimize", "minimise": "minimize"}
OPS = ("<=", ">=", "==")


class ModelError(DataError):
  """A model that does not parse or validate; `problems` lists each issue (one line each)."""

  def __init__(self, problems: Sequence[str]):
    self.problems = list(problems)
    super().__init__("; ".join(self.problems))


@dataclasses.dataclass(frozen=True)
class LinearExpr:
  """sum(coefs[v] * v) + const over scalar variable names."""
  coefs: Mapping[str, float]
  const: float = 0.0

  def value(self, x: Mapping[str, float]) -> float:
    return self.const + sum(c * float(x[v]) for v, c in self.coefs.items())


@dataclasses.dataclass(frozen=True)
class Variable:
  """One scalar variable (an indexed variable expands to one per index combination)."""
  name: str            # e.g. "x[chair]"
  base: str            # e.g. "x"
  index: tuple         # e.g. ("chair",)
  type: str
  lb: float
  ub: float
  unit: str | None = None
  meaning: str = ""


@dataclasses.dataclass(frozen=True)
class Constraint:
  """One scalar constraint: `lhs` (variables moved left, constants right) `op` `rhs`."""
  name: str            # e.g. "demand[j2]"
  base: str
  lhs: LinearExpr      # const is 0
  op: str              # "<=", ">=", "=="
  rhs: float
  meaning: str = ""
  unit: str | None = None


@dataclasses.dataclass
class Model:
  """A parsed, validated model (`source` is the JSON object it came from)."""
  name: str
  sets: dict[str, list]
  parameters: dict[str, Any]
  variables: list[Variable]
  constraints: list[Constraint]
  sense: str
  objective: LinearExpr
  source: dict
  numbers: list[float]          # every number the model uses: parameter entries its expressions read (not
                                # merely declared ones), literals, nonzero bounds
  unused_parameters: list[str] = dataclasses.field(default_factory=list)

  @property
  def var_names(self) -> list[str]:
    return [v.name for v in self.variables]

  def var(self, name: str) -> Variable:
    return self._by_name[name]

  def __post_init__(self):
    self._by_name = {v.name: v for v in self.variables}

  def to_json(self) -> str:
    return json.dumps(self.source, indent=1, ensure_ascii=False)


def element_name(e) -> str:
  return str(e)


def scalar_name(base: str, index: Sequence) -> str:
  return base if not index else f"{base}[{','.join(element_name(e) for e in index)}]"


# ---------------------------------------------------------------------------------------------------------------
# Tokens and expression trees.

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|(?P<str>'[^']*'|\"[^\"]*\")"
                    r"|(?P<op><=|>=|==|[-+*/()\[\],<>=:])|(?P<name>[A-Za-z_][A-Za-z_0-9]*))")


def tokenize(text: str) -> list[tuple[str, str]]:
  out, pos = [], 0
  text = text.rstrip()
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m or m.end() == pos:
      raise ValueError(f"unexpected character {text[pos:].lstrip()[:1]!r} at position {pos}")
    kind = m.lastgroup
    out.append((kind, m.group(kind)))
    pos = m.end()
  out.append(("end", ""))
  return out


class _Parser:
  """Recursive descent over tokens; builds nested tuples:
  ("num", v) | ("ref", name, [index nodes]) | ("str", s) | ("neg", a) | (op, a, b) | ("sum", [(it, set)], body)."""

  def __init__(self, text: str):
    self.toks, self.i, self.text = tokenize(text), 0, text

  def peek(self, k=0):
    return self.toks[min(self.i + k, len(self.toks) - 1)]

  def take(self, value=None):
    tok = self.toks[self.i]
    if value is not None and tok[1] != value:
      raise ValueError(f"expected {value!r} but found {tok[1] or 'the end'!r}")
    self.i += 1
    return tok

  def comparison(self):
    lhs = self.expr()
    tok = self.peek()
    if tok[1] in ("<", ">", "="):
      raise ValueError(f"use <=, >= or == (found {tok[1]!r})")
    if tok[1] not in OPS:
      raise ValueError(f"a constraint needs one of <=, >=, == (found {tok[1] or 'the end'!r})")
    self.take()
    rhs = self.expr()
    if self.peek()[1] in OPS:
      raise ValueError("a constraint has exactly one comparison; split chained comparisons into two constraints")
    self.end()
    return tok[1], lhs, rhs

  def end(self):
    if self.peek()[0] != "end":
      raise ValueError(f"unexpected {self.peek()[1]!r} after a complete expression")

  def expr(self):
    node = self.term()
    while self.peek()[1] in ("+", "-"):
      op = self.take()[1]
      node = (op, node, self.term())
    return node

  def term(self):
    node = self.unary()
    while self.peek()[1] in ("*", "/"):
      op = self.take()[1]
      node = (op, node, self.unary())
    return node

  def unary(self):
    if self.peek()[1] == "-":
      self.take()
      return ("neg", self.unary())
    if self.peek()[1] == "+":
      self.take()
      return self.unary()
    return self.atom()

  def atom(self):
    kind, value = self.peek()
    if kind == "num":
      self.take()
      return ("num", float(value))
    if kind == "str":
      self.take()
      return ("str", value[1:-1])
    if value == "(":
      self.take()
      node = self.expr()
      self.take(")")
      return node
    if kind == "name":
      self.take()
      if value == "sum" and self.peek()[1] == "(":
        return self.sum_node()
      index = []
      if self.peek()[1] == "[":
        self.take()
        index.append(self.expr())
        while self.peek()[1] == ",":
          self.take()
          index.append(self.expr())
        self.take("]")
      return ("ref", value, index)
    raise ValueError(f"unexpected {value or 'end of expression'!r}")

  def iterators(self, stop: str):
    its = []
    while True:
      kind, name = self.peek()
      if kind != "name" or self.peek(1)[1] != "in" or self.peek(2)[0] != "name":
        if not its:
          raise ValueError("sum(...) starts with iterators such as 'i in I'")
        return its
      self.i += 3
      its.append((name, self.toks[self.i - 1][1]))
      if self.peek()[1] not in (",", ":"):
        if stop == "end" and self.peek()[0] == "end":
          return its
        raise ValueError(f"expected ',' after '{name} in {its[-1][1]}'")
      if self.peek()[1] == ":":
        self.take()
        return its
      self.take(",")
      if stop == "end" and self.peek()[0] == "end":
        raise ValueError("dangling ',' in forall")

  def sum_node(self):
    self.take("(")
    its = self.iterators("body")
    body = self.expr()
    self.take(")")
    return ("sum", its, body)


def parse_forall(text: str) -> list[tuple[str, str]]:
  p = _Parser(text)
  its = p.iterators("end")
  p.end()
  return its


# ---------------------------------------------------------------------------------------------------------------
# Evaluation to linear form.

@dataclasses.dataclass
class _Lin:
  coefs: dict
  const: float

  @staticmethod
  def num(v: float) -> "_Lin":
    return _Lin({}, float(v))

  def scale(self, k: float) -> "_Lin":
    return _Lin({v: c * k for v, c in self.coefs.items()}, self.const * k)

  def add(self, o: "_Lin", sign: float = 1.0) -> "_Lin":
    out = dict(self.coefs)
    for v, c in o.coefs.items():
      out[v] = out.get(v, 0.0) + sign * c
    return _Lin(out, self.const + sign * o.const)


class _Scope:

  def __init__(self, model: "_Builder", env: dict):
    self.m, self.env = model, env

  def index_value(self, node):
    if node[0] == "str":
      return node[1]
    if node[0] == "num":
      v = node[1]
      return int(v) if float(v).is_integer() else v
    if node[0] == "ref" and not node[2] and node[1] in self.env:
      return self.env[node[1]]
    if node[0] == "ref" and not node[2]:
      return node[1]           # a bare element name, checked against the set by the caller
    raise ValueError("an index must be an iterator, a quoted element or an integer")

  def lin(self, node) -> _Lin:
    kind = node[0]
    if kind == "num":
      self.m.literals.append(node[1])
      return _Lin.num(node[1])
    if kind == "str":
      raise ValueError(f"the text '{node[1]}' is not a number")
    if kind == "neg":
      return self.lin(node[1]).scale(-1.0)
    if kind in ("+", "-"):
      return self.lin(node[1]).add(self.lin(node[2]), 1.0 if kind == "+" else -1.0)
    if kind == "*":
      a, b = self.lin(node[1]), self.lin(node[2])
      if a.coefs and b.coefs:
        raise ValueError("a product of two variables is not linear; linearise it (e.g. with a binary and big-M)")
      return b.scale(a.const) if not a.coefs else a.scale(b.const)
    if kind == "/":
      a, b = self.lin(node[1]), self.lin(node[2])
      if b.coefs:
        raise ValueError("division by a variable is not linear")
      if b.const == 0:
        raise ValueError("division by zero")
      return a.scale(1.0 / b.const)
    if kind == "sum":
      total = _Lin({}, 0.0)
      for combo in self.m.combos(node[1], self.env):
        total = total.add(_Scope(self.m, {**self.env, **combo}).lin(node[2]))
      return total
    if kind == "ref":
      return self.ref(node[1], node[2])
    raise ValueError(f"cannot read {node!r}")

  def ref(self, name: str, index_nodes) -> _Lin:
    m = self.m
    index = tuple(self.index_value(n) for n in index_nodes)
    if name in self.env and not index:
      raise ValueError(f"the iterator '{name}' is used as a number; use it only as an index")
    if name in m.var_over:
      over = m.var_over[name]
      if len(index) != len(over):
        raise ValueError(f"variable '{name}' is indexed by {len(over)} set(s) {over}, used with {len(index)} "
                         "index(es)")
      for e, s in zip(index, over):
        if e not in m.set_index[s]:
          raise ValueError(f"'{e}' is not an element of set {s} (used in {name}[...])")
      return _Lin({scalar_name(name, [m.set_index[s][e] for e, s in zip(index, over)]): 1.0}, 0.0)
    if name in m.params:
      value = m.params[name]
      for depth, e in enumerate(index):
        if not isinstance(value, Mapping):
          raise ValueError(f"parameter '{name}' has {depth} index(es), used with {len(index)}")
        key = _param_key(value, e)
        if key is None:
          raise ValueError(f"parameter '{name}' has no entry for '{e}'")
        value = value[key]
      if isinstance(value, Mapping):
        raise ValueError(f"parameter '{name}' needs more indexes (it is indexed by {len(index) + 1} or more)")
      m.used_params.add(name)
      m.literals.append(float(value))
      return _Lin.num(float(value))
    raise ValueError(f"unknown name '{name}' (not a variable, parameter or iterator)")


def _param_key(mapping: Mapping, e):
  for k in (e, str(e)):
    if k in mapping:
      return k
  return None


class _Builder:

  def __init__(self):
    self.sets: dict[str, list] = {}
    self.set_index: dict[str, dict] = {}
    self.params: dict[str, Any] = {}
    self.var_over: dict[str, list[str]] = {}
    self.literals: list[float] = []       # every number an expression reads (literals and parameter entries)
    self.used_params: set[str] = set()

  def combos(self, its, env) -> Iterator[dict]:
    for name, s in its:
      if s not in self.sets:
        raise ValueError(f"unknown set '{s}' in '{name} in {s}'")
      if name in env or name in self.params or name in self.var_over:
        raise ValueError(f"iterator '{name}' shadows another name; pick a fresh one")
    for values in itertools.product(*(self.sets[s] for _, s in its)):
      yield {name: v for (name, _), v in zip(its, values)}


def _number(v, what: str, problems: list[str], allow_none: bool = False):
  if v is None and allow_none:
    return None
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    problems.append(f"{what} must be a finite number, got {v!r}")
    return None
  return float(v)


def _check_params(name, value, problems, depth=0):
  if isinstance(value, Mapping):
    if not value:
      problems.append(f"parameter '{name}' is an empty object")
    for k, v in value.items():
      _check_params(f"{name}[{k}]", v, problems, depth + 1)
  else:
    _number(value, f"parameter '{name}'", problems)


def parse(obj: Any) -> Model:
  """Validates a model object (or its JSON text) and expands it (module docstring).

  Raises:
    ModelError: listing every problem found (one line each).
  """
  if isinstance(obj, str):
    obj = extract_json(obj)
  if not isinstance(obj, Mapping):
    raise ModelError([f"the model must be a JSON object, got {type(obj).__name__}"])
  problems: list[str] = []
  unknown = sorted(set(obj) - {"name", "sets", "parameters", "variables", "constraints", "objective", "notes",
                                "units"})
  if unknown:
    problems.append(f"unknown top-level keys {unknown}; allowed: sets, parameters, variables, constraints, "
                    "objective (and name, units, notes)")
  if "units" in obj and not (isinstance(obj["units"], Mapping) and all(isinstance(u, str)
                                                                      for u in obj["units"].values())):
    problems.append("'units' must map parameter names to unit strings such as \"h/unit\"")
  b = _Builder()
  numbers: list[float] = []
  sets = obj.get("sets") or {}
  if not isinstance(sets, Mapping):
    problems.append("'sets' must be an object: name -> list of elements")
    sets = {}
  for s, elems in sets.items():
    if not isinstance(elems, list) or not elems or any(not isinstance(e, (str, int)) or isinstance(e, bool)
                                                       for e in elems):
      problems.append(f"set '{s}' must be a non-empty list of strings or integers")
      continue
    if len(set(map(str, elems))) != len(elems):
      problems.append(f"set '{s}' has repeated elements")
      continue
    b.sets[s] = list(elems)
    b.set_index[s] = {**{str(e): e for e in elems}, **{e: e for e in elems}}
  params = obj.get("parameters") or {}
  if not isinstance(params, Mapping):
    problems.append("'parameters' must be an object: name -> number or nested object")
    params = {}
  for name, value in params.items():
    if name in b.sets:
      problems.append(f"'{name}' is both a set and a parameter")
    _check_params(name, value, problems)
  b.params = dict(params)
  variables: list[Variable] = []
  raw_vars = obj.get("variables")
  if not isinstance(raw_vars, list) or not raw_vars:
    problems.append("'variables' must be a non-empty list of {name, type, lb, ub, over?}")
    raw_vars = []
  for i, v in enumerate(raw_vars):
    if not isinstance(v, Mapping) or not isinstance(v.get("name"), str) or not re.fullmatch(
        r"[A-Za-z_][A-Za-z_0-9]*", v.get("name", "")):
      problems.append(f"variables[{i}] needs a 'name' that is an identifier")
      continue
    name = v["name"]
    if name in b.var_over or name in b.params or name in b.sets:
      problems.append(f"variable '{name}' is declared twice or clashes with a set or parameter")
      continue
    vtype = str(v.get("type", "continuous")).lower()
    vtype = {"int": "integer", "bin": "binary", "cont": "continuous", "real": "continuous"}.get(vtype, vtype)
    if vtype not in VAR_TYPES:
      problems.append(f"variable '{name}': type must be one of {list(VAR_TYPES)}, got {v.get('type')!r}")
      continue
    over = v.get("over") or []
    if isinstance(over, str):
      over = [over]
    if any(s not in b.sets for s in over):
      problems.append(f"variable '{name}' is indexed over unknown set(s) {[s for s in over if s not in b.sets]}")
      continue
    lb = _number(v.get("lb", 0), f"variable '{name}' lb", problems, allow_none=True)
    ub = _number(v.get("ub"), f"variable '{name}' ub", problems, allow_none=True)
    lb = -math.inf if lb is None and v.get("lb", 0) is None else (0.0 if lb is None else lb)
    ub = math.inf if ub is None else ub
    if vtype == "binary":
      lb, ub = max(lb, 0.0), min(ub, 1.0)
    if lb > ub:
      problems.append(f"variable '{name}': lb {lb} > ub {ub}")
      continue
    for bound in (lb, ub):
      if math.isfinite(bound) and bound != 0 and not (vtype == "binary" and bound == 1):
        numbers.append(bound)
    b.var_over[name] = list(over)
    for combo in itertools.product(*(b.sets[s] for s in over)):
      variables.append(Variable(scalar_name(name, combo), name, tuple(combo), vtype, lb, ub, v.get("unit"),
                                str(v.get("meaning", ""))))
  constraints: list[Constraint] = []
  raw_cons = obj.get("constraints") or []
  if not isinstance(raw_cons, list):
    problems.append("'constraints' must be a list of {name, expr, forall?}")
    raw_cons = []
  seen = set()
  for i, c in enumerate(raw_cons):
    if not isinstance(c, Mapping) or not isinstance(c.get("expr"), str):
      problems.append(f"constraints[{i}] needs an 'expr' string such as \"x + y <= 10\"")
      continue
    base = str(c.get("name") or f"c{i}")
    if base in seen:
      problems.append(f"constraint name '{base}' is used twice")
      continue
    seen.add(base)
    try:
      its = parse_forall(c["forall"]) if c.get("forall") else []
      op, lhs_node, rhs_node = _Parser(c["expr"]).comparison()
      for combo in b.combos(its, {}):
        scope = _Scope(b, combo)
        diff = scope.lin(lhs_node).add(scope.lin(rhs_node), -1.0)
        coefs = {v: k for v, k in diff.coefs.items() if k != 0}
        name = scalar_name(base, list(combo.values()))
        if not coefs:
          problems.append(f"constraint '{name}' has no variables (it reads {c['expr']!r})")
          continue
        constraints.append(Constraint(name, base, LinearExpr(coefs), op, -diff.const, str(c.get("meaning", "")),
                                      c.get("unit")))
    except ValueError as e:
      problems.append(f"constraint '{base}': {e} (in {c['expr']!r})")
  objective = obj.get("objective")
  sense, obj_lin = "minimize", LinearExpr({})
  if not isinstance(objective, Mapping) or not isinstance(objective.get("expr"), str):
    problems.append("'objective' must be an object with 'sense' (maximize / minimize) and 'expr'")
  else:
    sense = SENSES.get(str(objective.get("sense", "")).lower())
    if sense is None:
      problems.append(f"objective sense must be maximize or minimize, got {objective.get('sense')!r}")
      sense = "minimize"
    try:
      p = _Parser(objective["expr"])
      node = p.expr()
      p.end()
      lin = _Scope(b, {}).lin(node)
      obj_lin = LinearExpr({v: k for v, k in lin.coefs.items() if k != 0}, lin.const)
      if not obj_lin.coefs:
        problems.append("the objective has no variables")
    except ValueError as e:
      problems.append(f"objective: {e} (in {objective['expr']!r})")
  if problems:
    raise ModelError(problems)
  numbers += b.literals
  return Model(name=str(obj.get("name", "")), sets=b.sets, parameters=b.params, variables=variables,
               constraints=constraints, sense=sense, objective=obj_lin, source=json.loads(json.dumps(obj)),
               numbers=numbers, unused_parameters=sorted(set(b.params) - b.used_params))


_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.S)


def extract_json(text: str) -> Any:
  """The JSON object in an LLM answer: the last ```json fenced block, else the outermost {...}.

  Raises:
    ModelError: no JSON object, or invalid JSON (with the parser's line and column).
  """
  blocks = _FENCE.findall(text)
  candidate = blocks[-1] if blocks else None
  if candidate is None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
      raise ModelError(["the answer holds no JSON model; reply with the model as one ```json block"])
    candidate = text[start:end + 1]
  try:
    return json.loads(candidate)
  except json.JSONDecodeError as e:
    raise ModelError([f"the JSON model does not parse (line {e.lineno}, column {e.colno}: {e.msg})"]) from None
