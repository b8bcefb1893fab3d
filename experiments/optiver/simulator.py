"""The simulated LLM of the tiny variant: model corruptions and a noisy formulator / corrector backend.

Error types (each edits a correct model the way a modelling LLM errs; spec section B.4):
* `drop_constraint`: one constraint entry is removed, with the parameters only it used.
* `flip_inequality`: one constraint's <= becomes >= (or the reverse).
* `relax_integrality`: every integer / binary variable becomes continuous (binaries keep [0, 1]).
* `perturb_coefficient`: one parameter entry an expression reads is scaled by 0.5, 1.5 or 2 (rounded, and not
  equal to a number of the description).
* `flip_sense`: maximize <-> minimize.
* `swap_coefficients`: two entries of one indexed parameter trade values (every number is still there, in
  the right places by kind: no deterministic verifier can see it; listed as such).

`NoisyLLM` is a `jaxlab.llm.ScriptedBackend` callable answering by request id `<problem>/<role>/<round>`: the
formulator returns the true model corrupted with probability `p_error` (one type drawn uniformly); the
corrector, which is asked only when the verifiers found something, returns the true model corrupted with
probability `p_error * correct_factor` (so only verification can raise accuracy); the LLM checkers answer
"OK" / "VALID" (no information: the claims are about the deterministic verifiers).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

import numpy as np

from jaxlab.opt_modeling import ir as ir_lib
from jaxlab.opt_modeling import verify

ERROR_TYPES = ("drop_constraint", "flip_inequality", "relax_integrality", "perturb_coefficient", "flip_sense",
               "swap_coefficients")


def _names_in(expr: str) -> set[str]:
  return set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", expr))


def _used_entries(model: dict) -> list[tuple[str, tuple]]:
  """(parameter, key path) of every numeric parameter entry."""
  out = []

  def walk(name, value, path):
    if isinstance(value, dict):
      for k in value:
        walk(name, value[k], path + (k,))
    else:
      out.append((name, path))
  exprs = " ".join([c["expr"] for c in model.get("constraints", [])] + [model["objective"]["expr"]])
  for name, value in (model.get("parameters") or {}).items():
    if name in _names_in(exprs):
      walk(name, value, ())
  return out


def _get(params, name, path):
  v = params[name]
  for k in path:
    v = v[k]
  return v


def _set(params, name, path, value):
  if not path:
    params[name] = value
    return
  v = params[name]
  for k in path[:-1]:
    v = v[k]
  v[path[-1]] = value


def applicable(model: dict, kind: str) -> bool:
  """Whether error `kind` can be applied to `model`."""
  if kind == "drop_constraint":
    return len(model.get("constraints", [])) >= 1
  if kind == "flip_inequality":
    return any(re.search(r"<=|>=", c["expr"]) for c in model.get("constraints", []))
  if kind == "relax_integrality":
    return any(v.get("type", "continuous") != "continuous" for v in model["variables"])
  if kind == "perturb_coefficient":
    return bool(_used_entries(model))
  if kind == "swap_coefficients":
    return bool(_swap_candidates(model))
  return kind == "flip_sense"


def _swap_candidates(model: dict) -> list[tuple[str, tuple, tuple]]:
  entries = _used_entries(model)
  params = model.get("parameters") or {}
  out = []
  for i, (n1, p1) in enumerate(entries):
    for n2, p2 in entries[i + 1:]:
      if n1 == n2 and len(p1) == len(p2) and p1[:-1] == p2[:-1] and _get(params, n1, p1) != _get(params, n2, p2):
        out.append((n1, p1, p2))
  return out


def corrupt(model: dict, kind: str, rng: np.random.Generator, description: str = "") -> dict:
  """A copy of `model` with one error of type `kind` (see the module docstring)."""
  m = copy.deepcopy(model)
  if kind == "drop_constraint":
    cons = m["constraints"]
    dropped = cons.pop(int(rng.integers(len(cons))))
    still = _names_in(" ".join([c["expr"] for c in cons] + [c.get("forall", "") or "" for c in cons] +
                               [m["objective"]["expr"]]))
    for name in _names_in(dropped["expr"]):
      if name in (m.get("parameters") or {}) and name not in still:
        del m["parameters"][name]
    return m
  if kind == "flip_inequality":
    idx = [i for i, c in enumerate(m["constraints"]) if re.search(r"<=|>=", c["expr"])]
    c = m["constraints"][int(rng.choice(idx))]
    c["expr"] = re.sub(r"<=|>=", lambda x: ">=" if x.group(0) == "<=" else "<=", c["expr"], count=1)
    return m
  if kind == "relax_integrality":
    for v in m["variables"]:
      if v.get("type", "continuous") == "binary":
        v["type"], v["ub"] = "continuous", 1
      elif v.get("type", "continuous") != "continuous":
        v["type"] = "continuous"
    return m
  if kind == "perturb_coefficient":
    entries = _used_entries(m)
    name, path = entries[int(rng.integers(len(entries)))]
    old = float(_get(m["parameters"], name, path))
    taken = {v for v, _, _ in verify.description_numbers(description)}
    for factor in rng.permutation([0.5, 1.5, 2.0]):
      new = round(old * float(factor), 2)
      new = int(new) if float(new).is_integer() else new
      if new != old and new not in taken and new != 0:
        _set(m["parameters"], name, path, new)
        return m
    _set(m["parameters"], name, path, old * 3 + 1)
    return m
  if kind == "flip_sense":
    sense = ir_lib.SENSES[str(m["objective"]["sense"]).lower()]
    m["objective"]["sense"] = "minimize" if sense == "maximize" else "maximize"
    return m
  if kind == "swap_coefficients":
    cands = _swap_candidates(m)
    name, p1, p2 = cands[int(rng.integers(len(cands)))]
    a, b = _get(m["parameters"], name, p1), _get(m["parameters"], name, p2)
    _set(m["parameters"], name, p1, b)
    _set(m["parameters"], name, p2, a)
    return m
  raise ValueError(f"unknown error type {kind!r}; choose from {list(ERROR_TYPES)}")


def _rng(*parts) -> np.random.Generator:
  digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
  return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _answer(model: dict) -> str:
  return "Here is the model.\n```json\n" + json.dumps(model, indent=1) + "\n```"


class NoisyLLM:
  """The simulated LLM (module docstring); `calls` counts requests by role. Wrap it in
  `jaxlab.llm.ScriptedBackend(NoisyLLM(...))`."""

  def __init__(self, instances: dict[str, Any], seed: int, p_error: float = 0.6, correct_factor: float = 0.3,
               types=ERROR_TYPES):
    self.instances, self.seed = instances, seed
    self.p_error, self.correct_factor, self.types = p_error, correct_factor, tuple(types)
    self.injected: dict[str, list[str | None]] = {}

  def __call__(self, prompt, request_id, index):
    pid, role, rnd = request_id.rsplit("/", 2) if request_id.count("/") >= 2 else (request_id, "", "0")
    if role == "structure_checker":
      return "OK"
    if role == "solution_interpreter":
      return "VALID"
    if role not in ("formulator", "corrector"):
      raise ValueError(f"NoisyLLM: unknown role in request id {request_id!r}")
    inst = self.instances[pid]
    rng = _rng(self.seed, pid, role, rnd)
    p = self.p_error if role == "formulator" else self.p_error * self.correct_factor
    kind = None
    if rng.random() < p:
      kinds = [k for k in self.types if applicable(inst.model, k)]
      kind = kinds[int(rng.integers(len(kinds)))]
    self.injected.setdefault(pid, []).append(kind)
    model = inst.model if kind is None else corrupt(inst.model, kind, rng, inst.description)
    return _answer(model)
