"""Template optimisation problems written in words from ground-truth models (the tiny / small variants' data).

    inst = generate("production", np.random.default_rng(0))    # Instance(family, description, model, optimum, integer)
    insts = generate_set(200, seed=0)                           # families cycled in the order of FAMILIES

Six families (sizes are small, so every solve takes milliseconds):
* production: products x resources, integer units, maximize profit; one `<=` constraint per resource.
* diet: foods x nutrients, continuous kilograms, minimize cost; nutrient minimums (forall) and a weight limit.
* knapsack: items, binary select, maximize value under a weight budget.
* transportation: suppliers x customers, continuous tons, minimize shipping cost; supply limits and demand
  requirements (both forall).
* staffing: shifts, integer workers, minimize wages; one coverage requirement per period, where a worker of a
  shift covers one or two consecutive periods and handles a fixed number of requests in each.
* scheduling: jobs x machines, binary assignment, each job on exactly 1 machine, machine hour capacities,
  minimize cost.

The description follows rules that the deterministic verifiers (`jaxlab.opt_modeling.verify`) rely on, so a
correct model never raises a finding:
* the numbers of the description are exactly the numbers of the model (`ir.Model.numbers`), all distinct, and none
  equals the size of a set; element names hold no digits;
* integer families say "whole number" / "number of" (knapsack and scheduling "either ... or"); the continuous
  ones use none of "whole", "integer", "number of", "how many", "units", "either";
* maximisation problems say "maximize", minimisation ones "minimize", never the other, nor "maximum",
  "minimum", or "most" / "least" outside "at most" / "at least";
* every right-hand side follows a cue: "at most" / "no more than" (<=), "at least" (>=), "exactly" (==); the
  cues appear nowhere else;
* every constraint entry of the model has a number of its own.

Instances are rejection-sampled until the model is feasible and bounded with a positive optimum, and then
(up to `_ATTEMPTS` tries, else the first feasible one is kept) until relaxing integrality changes the optimum
(integer families) and dropping any one constraint entry changes it. `optimum` is
`solvers.solve(ir.parse(model), "highs").objective`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Callable

import numpy as np

from jaxlab.errors import ConfigError
from jaxlab.opt_modeling import ir, solvers

FAMILIES = ("production", "diet", "knapsack", "transportation", "staffing", "scheduling")
INTEGER = {"production": True, "diet": False, "knapsack": True, "transportation": False, "staffing": True,
           "scheduling": True}
_ATTEMPTS = 40          # tries per instance for the preferred properties (LP relaxation and drops change it)
_MAX_TRIES = 400        # tries for a feasible, bounded instance with a positive optimum
_REL = 1e-6


@dataclasses.dataclass(frozen=True)
class Instance:
  family: str
  description: str
  model: dict          # the IR JSON object (jaxlab.opt_modeling.ir)
  optimum: float
  integer: bool        # whether the true model has integer / binary variables


class _Reject(Exception):
  """The sampled numbers cannot make an instance; draw again."""


# ------------------------------------------------------------------------------------------------ numbers

def _clean(v: float) -> int | float:
  v = round(float(v), 2)
  return int(v) if v.is_integer() else v


def _key(v: float) -> float:
  return round(float(v), 6)


def fmt(v: float) -> str:
  """A number as the description writes it: 40, 2.5, 1200 (no separators, no exponent)."""
  v = _clean(v)
  return str(v) if isinstance(v, int) else f"{v:.2f}".rstrip("0").rstrip(".")


class _Draw:
  """Draws description numbers on grids: each value once per description, never a forbidden one."""

  def __init__(self, rng: np.random.Generator, forbidden=()):
    self.rng = rng
    self.taken = {_key(v) for v in forbidden}

  def __call__(self, lo: float, hi: float, step: float = 1.0) -> int | float:
    n = int(math.floor((hi - lo) / step + 1e-9)) + 1
    free = [v for v in (_clean(lo + i * step) for i in range(max(n, 0))) if _key(v) not in self.taken]
    if not free:
      raise _Reject
    v = free[int(self.rng.integers(len(free)))]
    self.taken.add(_key(v))
    return v

  def near(self, target: float, spread: float, step: float, floor: float | None = None) -> int | float:
    """A value within target +- max(spread * target, 3 steps), on the grid of `step`, at least `floor` (default:
    step)."""
    floor = step if floor is None else floor
    half = max(abs(target) * spread, 3 * step)
    lo = max(floor, math.ceil((target - half) / step) * step)
    hi = max(lo, math.floor((target + half) / step) * step)
    return self(lo, hi, step)


def _join(words: list[str]) -> str:
  return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _upper(text: str) -> str:
  return text[:1].upper() + text[1:]


def _pick(rng: np.random.Generator, pool: list, k: int) -> list:
  """k distinct entries of `pool` in pool order."""
  idx = sorted(rng.choice(len(pool), size=k, replace=False).tolist())
  return [pool[i] for i in idx]


def _counts(sets: dict[str, list]) -> list[int]:
  return sorted({len(v) for v in sets.values()})


# ------------------------------------------------------------------------------------------------ families

_FURNITURE = dict(
    maker="A furniture workshop", kind="piece of furniture", verb="make",
    products=[("chair", "chairs"), ("table", "tables"), ("desk", "desks"), ("shelf", "shelves"), ("stool", "stools"),
              ("bench", "benches"), ("cabinet", "cabinets")],
    resources=[("labor", "takes", "hours of labor", (1, 12, 0.5)), ("wood", "uses", "board feet of wood", (2, 40, 1)),
               ("finishing", "needs", "hours of finishing", (0.5, 6, 0.5)),
               ("machine", "needs", "hours of machine time", (0.5, 9, 0.5))])
_BAKERY = dict(
    maker="A bakery", kind="kind of batch", verb="bake",
    products=[("batch of bread", "bread"), ("batch of muffins", "muffins"), ("batch of cookies", "cookies"),
              ("batch of rolls", "rolls"), ("batch of pies", "pies"), ("batch of bagels", "bagels")],
    resources=[("oven", "needs", "hours of oven time", (0.5, 5, 0.5)), ("flour", "uses", "kilograms of flour",
                                                                         (2, 30, 1)),
               ("labor", "takes", "hours of labor", (1, 8, 0.5)), ("butter", "uses", "kilograms of butter",
                                                                   (0.5, 9, 0.5))])


def _production(rng: np.random.Generator) -> tuple[str, dict]:
  s = _FURNITURE if rng.random() < 0.6 else _BAKERY
  k, m = int(rng.integers(2, 5)), int(rng.integers(2, 4))
  prods = _pick(rng, s["products"], k)
  res = _pick(rng, s["resources"], m)
  names = [p[1] for p in prods]
  sets = {"P": names}
  draw = _Draw(rng, _counts(sets))
  use = {r[0]: {n: draw(*r[3]) for n in names} for r in res}
  plan = {n: rng.uniform(3, 14) for n in names}
  limit = {r[0]: draw.near(sum(use[r[0]][n] * plan[n] for n in names), 0.1, 1) for r in res}
  # profits near a positive price of each resource times its use: every resource then matters at the optimum.
  price = {r[0]: rng.uniform(0.5, 1.5) / np.mean(list(use[r[0]].values())) for r in res}
  raw = {n: sum(price[r[0]] * use[r[0]][n] for r in res) for n in names}
  scale = rng.uniform(15, 45) / np.mean(list(raw.values()))
  profit = {n: draw.near(raw[n] * scale, 0.2, 1, floor=5) for n in names}
  a = lambda p: "an" if p[0][0] in "aeiou" else "a"  # noqa: E731
  sent = [f"{s['maker']} can {s['verb']} {_join(names)}.",
          _upper(_join([f"each {p[0]} earns a profit of {fmt(profit[p[1]])}" if i == 0 else
                        f"each {p[0]} {fmt(profit[p[1]])}" for i, p in enumerate(prods)])) + "."]
  for key, verb, unit, _ in res:
    parts = [f"{a(p)} {p[0]} {verb} {fmt(use[key][p[1]])} {unit}" if i == 0 else f"{a(p)} {p[0]} {fmt(use[key][p[1]])}"
             for i, p in enumerate(prods)]
    sent.append(_upper(_join(parts)) + f"; at most {fmt(limit[key])} {unit} are available.")
  sent.append(f"Choose the number of each {s['kind']} to {s['verb']}, in whole numbers, to maximize the total "
              "profit.")
  model = {
      "name": "production", "sets": sets,
      "parameters": {"profit": profit, **{f"{r}_use": use[r] for r in use}, **{f"{r}_limit": limit[r] for r in use}},
      "variables": [{"name": "x", "over": ["P"], "type": "integer", "lb": 0, "ub": None,
                     "meaning": f"number of each {s['kind']} to {s['verb']}"}],
      "constraints": [{"name": r[0], "expr": f"sum(p in P, {r[0]}_use[p] * x[p]) <= {r[0]}_limit",
                       "meaning": f"the {r[2]} used stay within those available"} for r in res],
      "objective": {"sense": "maximize", "expr": "sum(p in P, profit[p] * x[p])"}}
  return " ".join(sent), model


_FOODS = ["oats", "rice", "beans", "lentils", "corn", "barley", "peas", "potatoes", "millet"]
_NUTRIENTS = [("protein", "grams of protein", (20, 260, 1), 1), ("fiber", "grams of fiber", (5, 160, 1), 1),
              ("iron", "milligrams of iron", (4, 90, 1), 1), ("energy", "kilocalories", (700, 3900, 10), 10)]


def _diet(rng: np.random.Generator) -> tuple[str, dict]:
  k, m = int(rng.integers(2, 5)), int(rng.integers(2, 4))
  foods, nuts = _pick(rng, _FOODS, k), _pick(rng, _NUTRIENTS, m)
  sets = {"F": foods, "N": [n[0] for n in nuts]}
  draw = _Draw(rng, _counts(sets))
  content = {n[0]: {f: draw(*n[2]) for f in foods} for n in nuts}
  plan = {f: rng.uniform(0.2, 1.2) for f in foods}
  need = {n[0]: draw.near(sum(content[n[0]][f] * plan[f] for f in foods), 0.1, n[3]) for n in nuts}
  price = {n[0]: rng.uniform(0.5, 1.5) / np.mean(list(content[n[0]].values())) for n in nuts}
  raw = {f: sum(price[n[0]] * content[n[0]][f] for n in nuts) for f in foods}
  scale = rng.uniform(1.5, 4.5) / np.mean(list(raw.values()))
  cost = {f: draw.near(raw[f] * scale, 0.25, 0.1, floor=0.3) for f in foods}
  model = {
      "name": "diet", "sets": sets,
      "parameters": {"cost": cost, "content": content, "need": need},
      "variables": [{"name": "x", "over": ["F"], "type": "continuous", "lb": 0, "ub": None,
                     "meaning": "kilograms of each food in the ration"}],
      "constraints": [{"name": "nutrients", "forall": "n in N", "expr": "sum(f in F, content[n, f] * x[f]) >= need[n]",
                       "meaning": "the ration provides the required amount of each nutrient"}],
      "objective": {"sense": "minimize", "expr": "sum(f in F, cost[f] * x[f])"}}
  # the weight limit: between the lightest ration that meets the needs and the cheapest one, so that it binds.
  light = copy.deepcopy(model)
  light["objective"] = {"sense": "minimize", "expr": "sum(f in F, x[f])"}
  cheap, lightest = _solve(model), _solve(light)
  if cheap.status != "optimal" or lightest.status != "optimal":
    raise _Reject
  heavy = sum(cheap.x.values())
  gap = heavy - lightest.objective
  if gap < 0.3:
    raise _Reject
  cap = draw(math.ceil((lightest.objective + 0.3 * gap) * 10) / 10, math.floor((lightest.objective + 0.8 * gap) * 10)
             / 10, 0.1)
  model["parameters"]["max_weight"] = cap
  model["constraints"].append({"name": "weight", "expr": "sum(f in F, x[f]) <= max_weight",
                               "meaning": "the ration's total weight stays within the limit"})
  sent = [f"A kitchen mixes a daily ration from {_join(foods)}.",
          "A kilogram of " + _join([f"{f} costs {fmt(cost[f])}" if i == 0 else f"a kilogram of {f} {fmt(cost[f])}"
                                    for i, f in enumerate(foods)]) + "."]
  for key, unit, _, _ in nuts:
    parts = [f"a kilogram of {f} contains {fmt(content[key][f])} {unit}" if i == 0 else
             f"a kilogram of {f} {fmt(content[key][f])}" for i, f in enumerate(foods)]
    sent.append(_upper(_join(parts)) + f"; the ration must provide at least {fmt(need[key])} {unit}.")
  sent.append(f"The ration may weigh no more than {fmt(cap)} kilograms in total.")
  sent.append("Choose the amount of each food in kilograms (fractions allowed) to minimize the total cost.")
  return " ".join(sent), model


_PACKS = [dict(intro="A hiker is packing for a trip.", thing="item", verb="packed", carrier="The pack",
               items=["tent", "stove", "lamp", "rope", "kettle", "blanket", "camera", "radio", "hammock", "compass"],
               aim="Choose the items to pack"),
          dict(intro="A cargo plane is loading crates for a flight.", thing="crate", verb="loaded", carrier="The plane",
               items=["tea", "silk", "spices", "coffee", "cocoa", "wool", "pepper", "saffron", "vanilla"],
               aim="Choose the crates to load")]


def _knapsack(rng: np.random.Generator) -> tuple[str, dict]:
  s = _PACKS[int(rng.integers(len(_PACKS)))]
  items = _pick(rng, s["items"], int(rng.integers(4, 7)))
  sets = {"I": items}
  draw = _Draw(rng, _counts(sets))
  weight = {i: draw(1.5, 20, 0.5) for i in items}
  value = {i: draw.near(weight[i] * rng.uniform(2, 8), 0.3, 1, floor=5) for i in items}
  total = sum(weight.values())
  cap = draw.near(total * rng.uniform(0.35, 0.65), 0.05, 0.5)
  label = (lambda i: f"the {i}") if s["thing"] == "item" else (lambda i: f"the crate of {i}")
  desc = (f"{s['intro']} Each {s['thing']} is either {s['verb']} or not. " +
          " ".join(f"{_upper(label(i))} is worth {fmt(value[i])} and weighs {fmt(weight[i])} "
                   "kilograms." for i in items) +
          f" {s['carrier']} can carry at most {fmt(cap)} kilograms. {s['aim']} to maximize their total value.")
  model = {
      "name": "knapsack", "sets": sets, "parameters": {"value": value, "weight": weight, "capacity": cap},
      "variables": [{"name": "x", "over": ["I"], "type": "binary", "lb": 0, "ub": 1,
                     "meaning": f"1 if the {s['thing']} is {s['verb']}, else 0"}],
      "constraints": [{"name": "weight", "expr": "sum(i in I, weight[i] * x[i]) <= capacity",
                       "meaning": f"the {s['verb']} weight stays within what can be carried"}],
      "objective": {"sense": "maximize", "expr": "sum(i in I, value[i] * x[i])"}}
  return desc, model


_SHIPPERS = [dict(goods="gravel", source="quarry", sources="quarries", dest="building site", dests="building sites"),
             dict(goods="grain", source="silo", sources="silos", dest="mill", dests="mills"),
             dict(goods="cement", source="plant", sources="plants", dest="depot", dests="depots")]
_SUPPLIERS = ["Alpha", "Beta", "Gamma", "Delta"]
_CUSTOMERS = ["Northfield", "Riverside", "Lakeside", "Hillcrest", "Oakdale", "Fairview", "Brookton"]


def _transportation(rng: np.random.Generator) -> tuple[str, dict]:
  s = _SHIPPERS[int(rng.integers(len(_SHIPPERS)))]
  sup = _pick(rng, _SUPPLIERS, int(rng.integers(2, 4)))
  cus = _pick(rng, _CUSTOMERS, int(rng.integers(2, 5)))
  sets = {"S": sup, "C": cus}
  draw = _Draw(rng, _counts(sets))
  cost = {a: {c: draw(2, 30, 0.5) for c in cus} for a in sup}
  demand = {c: draw(30, 300, 1) for c in cus}
  total = sum(demand.values()) * rng.uniform(1.1, 1.4)
  share = rng.dirichlet(np.full(len(sup), 2.0))
  supply = {a: draw.near(max(total * w, 40), 0.05, 1) for a, w in zip(sup, share)}
  sent = [f"A company ships {s['goods']} from the {s['sources']} {_join(sup)} to the {s['dests']} {_join(cus)}.",
          f"The {s['source']} {sup[0]} can supply at most {fmt(supply[sup[0]])} tons" +
          "".join(f"{',' if i < len(sup) - 1 else ' and'} {a} at most {fmt(supply[a])} tons"
                  for i, a in enumerate(sup[1:], 1)) + ".",
          f"The {s['dest']} {cus[0]} needs at least {fmt(demand[cus[0]])} tons" +
          "".join(f"{',' if i < len(cus) - 1 else ' and'} {c} at least {fmt(demand[c])} tons"
                  for i, c in enumerate(cus[1:], 1)) + "."]
  for a in sup:
    sent.append(f"Shipping a ton from {a} costs " + _join([f"{fmt(cost[a][c])} to {c}" for c in cus]) + ".")
  sent.append("Choose the amount in tons to ship on each route to minimize the total shipping cost.")
  model = {
      "name": "transportation", "sets": sets, "parameters": {"cost": cost, "supply": supply, "demand": demand},
      "variables": [{"name": "x", "over": ["S", "C"], "type": "continuous", "lb": 0, "ub": None,
                     "meaning": f"tons of {s['goods']} shipped from each {s['source']} to each {s['dest']}"}],
      "constraints": [{"name": "supply", "forall": "s in S", "expr": "sum(c in C, x[s, c]) <= supply[s]",
                       "meaning": f"each {s['source']} ships no more than it can supply"},
                      {"name": "demand", "forall": "c in C", "expr": "sum(s in S, x[s, c]) >= demand[c]",
                       "meaning": f"each {s['dest']} receives what it needs"}],
      "objective": {"sense": "minimize", "expr": "sum(s in S, c in C, cost[s, c] * x[s, c])"}}
  return " ".join(sent), model


_DESKS = [dict(place="A call centre", short="The centre", worker="agent", workers="agents", verb="answers",
               items="calls", act="answer"),
          dict(place="A clinic", short="The clinic", worker="nurse", workers="nurses", verb="sees", items="patients",
               act="see"),
          dict(place="A help desk", short="The desk", worker="technician", workers="technicians", verb="resolves",
               items="tickets", act="resolve")]
_PERIODS = {3: ["morning", "afternoon", "evening"], 4: ["morning", "midday", "afternoon", "evening"]}
_AT = {"morning": "in the morning", "midday": "at midday", "afternoon": "in the afternoon", "evening": "in the evening"}
_THE = {"morning": "the morning", "midday": "midday", "afternoon": "the afternoon", "evening": "the evening"}


def _staffing(rng: np.random.Generator) -> tuple[str, dict]:
  s = _DESKS[int(rng.integers(len(_DESKS)))]
  periods = _PERIODS[int(rng.integers(3, 5))]
  full = ["early", "day", "late"] if len(periods) == 4 else ["early", "late"]
  covers = {name: periods[i:i + 2] for i, name in enumerate(full)}
  covers["short"] = [periods[-1]] if rng.random() < 0.5 else [periods[0]]
  shifts = list(covers)
  sets = {"S": shifts, "T": periods}
  draw = _Draw(rng, _counts(sets))
  rate = draw(8, 30, 1)
  level = {sh: rng.uniform(1.5, 8) for sh in shifts}
  need = {t: draw.near(rate * sum(level[sh] for sh in shifts if t in covers[sh]), 0.06, 1, floor=10) for t in periods}
  wage = {sh: draw(95, 180, 1) if sh != "short" else draw(40, 89, 1) for sh in shifts}
  an = "An" if s["worker"][0] in "aeiou" else "A"
  works = [f"{an} {s['worker']} on the {sh} shift works {_join([_THE[t] for t in covers[sh]])}." for sh in full]
  works.append(f"{an} {s['worker']} on the short shift works only {_THE[covers['short'][0]]}.")
  sent = [f"{s['place']} plans its {s['workers']} for a day split into {_join([_THE[t] for t in periods])}.",
          *works,
          f"Each {s['worker']} {s['verb']} {fmt(rate)} {s['items']} in every period worked.",
          f"{s['short']} must {s['act']} " + _join([f"at least {fmt(need[t])} {s['items']} {_AT[t]}" if i == 0 else
                                                    f"at least {fmt(need[t])} {_AT[t]}"
                                                    for i, t in enumerate(periods)]) + ".",
          f"The daily wage of {'an' if s['worker'][0] in 'aeiou' else 'a'} {s['worker']} is " +
          _join([f"{fmt(wage[sh])} on the {sh} shift" for sh in shifts]) + ".",
          f"Decide the number of {s['workers']} on each shift, in whole numbers, to minimize the total wage cost."]
  cons = []
  for t in periods:
    on = [sh for sh in shifts if t in covers[sh]]
    staff = " + ".join(f"x['{sh}']" for sh in on)
    cons.append({"name": f"cover_{t}", "expr": f"rate * ({staff}) >= need['{t}']" if len(on) > 1 else
                 f"rate * {staff} >= need['{t}']",
                 "meaning": f"the {s['workers']} working {_THE[t]} handle the {s['items']} required then"})
  model = {
      "name": "staffing", "sets": sets, "parameters": {"wage": wage, "need": need, "rate": rate},
      "variables": [{"name": "x", "over": ["S"], "type": "integer", "lb": 0, "ub": None,
                     "meaning": f"number of {s['workers']} on each shift"}],
      "constraints": cons,
      "objective": {"sense": "minimize", "expr": "sum(s in S, wage[s] * x[s])"}}
  return " ".join(sent), model


_JOBS = ["Atlas", "Boreas", "Cobalt", "Dynamo", "Ember", "Falcon"]
_MACHINES = ["lathe", "press", "mill", "drill", "router"]


def _scheduling(rng: np.random.Generator) -> tuple[str, dict]:
  jobs = _pick(rng, _JOBS, int(rng.integers(3, 5)))
  machines = _pick(rng, _MACHINES, int(rng.integers(2, 4)))
  sets = {"J": jobs, "M": machines}
  draw = _Draw(rng, _counts(sets) + [1])
  hours = {j: {m: draw(1.5, 12, 0.5) for m in machines} for j in jobs}
  per_hour = {m: rng.uniform(3, 9) for m in machines}
  cost = {j: {m: draw.near(hours[j][m] * per_hour[m], 0.3, 1, floor=5) for m in machines} for j in jobs}
  # capacities below the load of each job's cheapest machine where that load is high, so the cheap plan breaks.
  load = {m: 0.0 for m in machines}
  for j in jobs:
    load[min(machines, key=lambda m: cost[j][m])] += hours[j][min(machines, key=lambda m: cost[j][m])]
  fair = sum(min(hours[j].values()) for j in jobs) / len(machines)
  capacity = {}
  for m in machines:
    target = load[m] * rng.uniform(0.55, 0.9) if load[m] > 0 else fair * rng.uniform(1.0, 1.6)
    capacity[m] = draw.near(max(target, max(min(hours[j].values()) for j in jobs), 2), 0.15, 0.5)
  sent = [f"A workshop assigns the jobs {_join(jobs)} to its {_join(machines)}.",
          "For every job and machine, the job either runs on that machine or not, and each job must run on exactly 1 "
          "machine."]
  for j in jobs:
    sent.append(f"Job {j} takes " + _join([f"{fmt(hours[j][m])} hours on the {m}" for m in machines]) + ".")
  sent.append(_upper(_join([f"the {m} can run at most {fmt(capacity[m])} hours" for m in machines])) + ".")
  for j in jobs:
    sent.append(f"Running {j} costs " + _join([f"{fmt(cost[j][m])} on the {m}" for m in machines]) + ".")
  sent.append("Choose the assignment to minimize the total running cost.")
  model = {
      "name": "scheduling", "sets": sets, "parameters": {"hours": hours, "cost": cost, "capacity": capacity},
      "variables": [{"name": "y", "over": ["J", "M"], "type": "binary", "lb": 0, "ub": 1,
                     "meaning": "1 if the job runs on the machine, else 0"}],
      "constraints": [{"name": "assign", "forall": "j in J", "expr": "sum(m in M, y[j, m]) == 1",
                       "meaning": "each job runs on exactly one machine"},
                      {"name": "capacity", "forall": "m in M",
                       "expr": "sum(j in J, hours[j, m] * y[j, m]) <= capacity[m]",
                       "meaning": "the hours of the jobs on a machine stay within its hours"}],
      "objective": {"sense": "minimize", "expr": "sum(j in J, m in M, cost[j, m] * y[j, m])"}}
  return " ".join(sent), model


_BUILDERS: dict[str, Callable[[np.random.Generator], tuple[str, dict]]] = {
    "production": _production, "diet": _diet, "knapsack": _knapsack, "transportation": _transportation,
    "staffing": _staffing, "scheduling": _scheduling}


# ------------------------------------------------------------------------------------------------ checks

def _solve(model: dict) -> solvers.SolveResult:
  return solvers.solve(ir.parse(model), "highs", find_iis=False)


def _differs(a: solvers.SolveResult, value: float) -> bool:
  return a.status != "optimal" or abs(a.objective - value) > _REL * max(1.0, abs(value))


def relaxed(model: dict) -> dict:
  """The model with every integer / binary variable continuous (binaries keep [0, 1])."""
  m = copy.deepcopy(model)
  for v in m["variables"]:
    if v.get("type", "continuous") != "continuous":
      v["ub"] = 1 if v["type"] == "binary" else v.get("ub")
      v["type"] = "continuous"
  return m


def dropped(model: dict, i: int) -> dict:
  """The model without constraint entry i."""
  m = copy.deepcopy(model)
  m["constraints"].pop(i)
  return m


def properties(model: dict, optimum: float, integer: bool, stop_early: bool = False) -> dict:
  """{"lp_differs": bool | None, "drop_changes": [bool per constraint entry]} of a model with that optimum."""
  out = {"lp_differs": None, "drop_changes": []}
  if integer:
    out["lp_differs"] = _differs(_solve(relaxed(model)), optimum)
    if stop_early and not out["lp_differs"]:
      return out
  for i in range(len(model["constraints"])):
    out["drop_changes"].append(_differs(_solve(dropped(model, i)), optimum))
    if stop_early and not out["drop_changes"][-1]:
      return out
  return out


def _preferred(p: dict) -> bool:
  return p["lp_differs"] is not False and all(p["drop_changes"])


# ------------------------------------------------------------------------------------------------ API

def generate(family: str, rng: np.random.Generator) -> Instance:
  """One instance of `family` (module docstring); deterministic given the generator's state."""
  if family not in _BUILDERS:
    raise ConfigError(f"unknown problem family {family!r}; choose from {list(FAMILIES)}")
  integer, first = INTEGER[family], None
  for tries in range(_MAX_TRIES):
    try:
      desc, model = _BUILDERS[family](rng)
    except _Reject:
      continue
    result = solvers.solve(ir.parse(model), "highs")
    if result.status != "optimal" or not result.objective > _REL:
      continue
    inst = Instance(family, desc, model, float(result.objective), integer)
    if _preferred(properties(model, inst.optimum, integer, stop_early=True)):
      return inst
    if first is None:
      first = inst
    if tries + 1 >= _ATTEMPTS:
      return first
  if first is not None:
    return first
  raise RuntimeError(f"no feasible {family} instance in {_MAX_TRIES} tries")


def generate_set(n: int, seed: int) -> list[Instance]:
  """n instances, families cycled in the order of FAMILIES, from one np.random.default_rng(seed)."""
  rng = np.random.default_rng(seed)
  return [generate(FAMILIES[i % len(FAMILIES)], rng) for i in range(n)]
