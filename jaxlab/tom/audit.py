"""Shortcut audit of a theory-of-mind dataset: can surface features answer the questions?

The paper "From Shortcuts to Reasoning: Robust Post-Training of Theory of Mind with RL" (ICML 2026,
arXiv 2606.09092) examines ToM datasets for shortcuts, but its exact procedure is not public. **What follows
is our operationalisation** of its wording ("spurious causal correlations", "counterfactuals", "anchor
cues"), not the authors' code. A dataset passes when no probe beats chance by more than `delta`:

1. *Heuristic probes* (training-free rules on surface features; `HEURISTICS`, plus the two majority rules of
   `FITTED_HEURISTICS` that read only the train split's answers):

   * ``first_mention``: the first container the story names (the initial container counts: it is stated first);
   * ``last_mention``: the last container named by any event, distractors included;
   * ``most_mention``: the most often named container (the initial one included; ties: the first named);
   * ``nearest_to_agent``: the container named nearest, in event order, to the last event that names the
     queried agent. The queried agent is ``chain[-1]`` (the innermost agent, the one whose belief the sentence
     ends on); the initial container sits at position -1; ties go to the earlier mention; an empty chain or an
     agent no event names falls back to ``last_mention``;
   * ``majority_per_order``: the train split's most frequent answer per question order;
   * ``majority_label``: the train split's most frequent answer (the label prior of generic datasets, e.g.
     yes/no sets).

2. *Learned probes on causal-factor-ablated inputs*: a logistic regression (scikit-learn) on binary
   bag-of-token features, trained on the train split and scored on the test split, for the inputs
   ``no_story`` (question + candidates only), ``shuffled`` (events in random order; the initial container
   keeps its leading place), ``no_exits`` (EXIT / ENTER events deleted) and ``full`` (no ablation; the
   reference, never flagged). The probe scores every candidate container of a story and answers the argmax.
   A candidate's features are: its name; for each event that names it, (event kind), (event position, kind),
   (position from the end, kind), (first / last / other mention among all container mentions, kind),
   whether a chain agent performed that event, and whether it came before or after that agent's first EXIT;
   its mention count and move count; whether it is the ``nearest_to_agent`` answer. Every feature also appears
   crossed with the question order. A linear model on these can exploit any positional or lexical shortcut the
   heuristics test, and their combinations, but cannot run the belief-tracking recursion.

3. *Counterfactual twins*: `pair_consistency` is the fraction of twin groups (same ``meta["twin_id"]``) whose
   members a predictor gets all right. A shortcut predictor scores about its accuracy squared or less; a
   state tracker scores about its accuracy.

`audit(train, test)` runs all of them on a subset of questions (by default the false-belief ones:
``meta["false_belief"]``, or order >= 1 where that key is missing), broken down by order and by
``meta["question_type"]``, and returns an `AuditReport` (``to_dict()``, ``to_markdown()``, ``passed``).

Command line::

  python -m jaxlab.tom.audit --data train.jsonl [--test test.jsonl] [--subset false_belief|all]

reads JSONL records in the layout of `example_to_json` and prints the markdown report (exit 2 with one
``error: ...`` line on bad input; ``--fail_on_flag`` exits 1 when the audit flags a probe).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

from jaxlab import cli
from jaxlab.errors import ConfigError, DataError
from jaxlab.tom.types import Event, Example, Question, Story

Probe = Callable[[Example], str]
ABLATIONS = ("no_story", "shuffled", "no_exits", "full")
SUBSETS = ("false_belief", "all")


# ----------------------------------------------------------------------------------------------------------
# Surface features


def _mentions(story: Story) -> list[tuple[int, str]]:
  """(position, container) of every container mention in story order; the initial container is at -1."""
  out = [(-1, story.init)]
  out += [(i, e.container) for i, e in enumerate(story.events) if e.container]
  return out


def first_mention(ex: Example) -> str:
  """The first container the story names (the initial container)."""
  return _mentions(ex.story)[0][1]


def last_mention(ex: Example) -> str:
  """The last container any event names (moves and distractors alike)."""
  return _mentions(ex.story)[-1][1]


def most_mention(ex: Example) -> str:
  """The most often named container; ties go to the one named first."""
  names = [c for _, c in _mentions(ex.story)]
  counts = collections.Counter(names)
  best = max(counts.values())
  return next(c for c in names if counts[c] == best)


def nearest_to_agent(ex: Example) -> str:
  """The container named nearest (in event order) to the last event naming the queried agent ``chain[-1]``.

  Ties go to the earlier mention. An empty chain, or an agent that no event names, falls back to
  `last_mention`.
  """
  if not ex.question.chain:
    return last_mention(ex)
  agent = ex.question.chain[-1]
  spots = [i for i, e in enumerate(ex.story.events) if e.agent == agent]
  if not spots:
    return last_mention(ex)
  t = spots[-1]
  return min(_mentions(ex.story), key=lambda m: (abs(m[0] - t), m[0]))[1]


HEURISTICS: dict[str, Probe] = {
    "first_mention": first_mention,
    "last_mention": last_mention,
    "most_mention": most_mention,
    "nearest_to_agent": nearest_to_agent,
}


def _majority(answers: Iterable[str]) -> str:
  counts = collections.Counter(answers)
  if not counts:
    raise DataError("cannot fit a majority probe on an empty train split")
  return max(sorted(counts), key=lambda a: counts[a])


def fit_majority_per_order(train: Sequence[Example]) -> Probe:
  """The train split's most frequent answer for each question order (the overall one for unseen orders)."""
  overall = _majority(ex.answer for ex in train)
  by_order: dict[int, list[str]] = collections.defaultdict(list)
  for ex in train:
    by_order[ex.question.order].append(ex.answer)
  table = {k: _majority(v) for k, v in by_order.items()}
  return lambda ex: table.get(ex.question.order, overall)


def fit_majority_label(train: Sequence[Example]) -> Probe:
  """The train split's most frequent answer, whatever the question."""
  label = _majority(ex.answer for ex in train)
  return lambda ex: label


FITTED_HEURISTICS: dict[str, Callable[[Sequence[Example]], Probe]] = {
    "majority_per_order": fit_majority_per_order,
    "majority_label": fit_majority_label,
}


# ----------------------------------------------------------------------------------------------------------
# Learned probes on ablated inputs


def _ablate(ex: Example, ablation: str, rng: np.random.Generator) -> list[Event]:
  """The event list the probe sees; the initial container is prepended as an ``("init", ...)`` pseudo-event."""
  if ablation not in ABLATIONS:
    raise ConfigError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
  if ablation == "no_story":
    return []
  events = list(ex.story.events)
  if ablation == "no_exits":
    events = [e for e in events if e.kind not in ("exit", "enter")]
  elif ablation == "shuffled":
    events = [events[i] for i in rng.permutation(len(events))]
  return [Event("distractor", "", ex.story.init, "init")] + events


def _kind(e: Event) -> str:
  return "init" if e.text == "init" and not e.agent else e.kind


def candidate_features(seq: Sequence[Event], chain: Sequence[str], candidates: Sequence[str]
                       ) -> list[list[str]]:
  """The names of the binary features (value 1) of each candidate, given an (ablated) event list and a chain."""
  n, order = len(seq), len(chain)
  roles = [(f"q{r + 1}", a) for r, a in enumerate(chain)] + ([("qlast", chain[-1])] if chain else [])
  first_exit = {a: next((i for i, e in enumerate(seq) if e.kind == "exit" and e.agent == a), None)
                for _, a in roles}
  named = [i for i, e in enumerate(seq) if e.container]
  own: dict[str, list[str]] = {c: [] for c in candidates}
  counts = collections.Counter()
  moves = collections.Counter()
  for i in named:
    e = seq[i]
    if e.container not in own:
      continue
    k = _kind(e)
    rel = "first" if i == named[0] else "last" if i == named[-1] else "other"
    f = own[e.container]
    f += [f"kind:{k}", f"pos{min(i, 15)}:{k}", f"end{min(n - i, 15)}:{k}", f"rel_{rel}:{k}"]
    for r, a in roles:
      if e.agent == a:
        f.append(f"by_{r}:{k}")
      x = first_exit[a]
      f.append(f"{r}_{'noexit' if x is None else 'before' if i < x else 'after'}_exit:{k}")
    counts[e.container] += 1
    moves[e.container] += e.kind == "move"
  nearest = None
  if chain and named:
    spots = [i for i, e in enumerate(seq) if e.agent == chain[-1]]
    t = spots[-1] if spots else named[-1]
    nearest = seq[min(named, key=lambda i: (abs(i - t), i))].container
  out = []
  for c in candidates:
    f = own[c] + [f"name={c}", f"count{min(counts[c], 5)}", f"moves{min(moves[c], 4)}"]
    if not counts[c]:
      f.append("unmentioned")
    if c == nearest:
      f.append("nearest_to_agent")
    out.append(f + [f"o{order}|{x}" for x in f])
  return out


class LearnedProbe:
  """Logistic regression scoring each candidate of a story on `candidate_features` of an ablated input."""

  def __init__(self, ablation: str, *, seed: int = 0, c: float = 1.0):
    if ablation not in ABLATIONS:
      raise ConfigError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
    self.ablation, self.seed, self.c = ablation, seed, c
    self._vocab: dict[str, int] | None = None
    self._clf = None
    self._const = ""

  def _matrix(self, examples: Sequence[Example], rng: np.random.Generator, grow: bool):
    """Sparse candidate-by-feature matrix; `grow` adds unseen feature names to the vocabulary."""
    import scipy.sparse
    vocab = self._vocab
    cols: list[int] = []
    indptr = [0]
    for ex in examples:
      for feats in candidate_features(_ablate(ex, self.ablation, rng), ex.question.chain, ex.story.containers):
        for name in set(feats):
          j = vocab.get(name)
          if j is None and grow:
            j = vocab[name] = len(vocab)
          if j is not None:
            cols.append(j)
        indptr.append(len(cols))
    return scipy.sparse.csr_matrix(
        (np.ones(len(cols)), np.asarray(cols, dtype=np.int32), np.asarray(indptr, dtype=np.int32)),
        shape=(len(indptr) - 1, len(vocab)))

  def fit(self, train: Sequence[Example]) -> LearnedProbe:
    """Fits on `train` (binary target: is this candidate the answer)."""
    from sklearn.linear_model import LogisticRegression
    y = np.array([c == ex.answer for ex in train for c in ex.story.containers], dtype=int)
    if y.min() == y.max():
      self._const = train[0].answer
      return self
    self._vocab = {}
    x = self._matrix(train, np.random.default_rng(self.seed), grow=True)
    self._clf = LogisticRegression(C=self.c, solver="liblinear", max_iter=1000).fit(x, y)
    return self

  def predict(self, examples: Sequence[Example]) -> list[str]:
    """The highest-scoring candidate of each example."""
    if not examples:
      return []
    if self._clf is None:
      return [self._const if self._const in ex.story.containers else ex.story.containers[0] for ex in examples]
    x = self._matrix(examples, np.random.default_rng(self.seed + 1), grow=False)
    scores = self._clf.decision_function(x)
    out, start = [], 0
    for ex in examples:
      m = len(ex.story.containers)
      out.append(ex.story.containers[int(np.argmax(scores[start:start + m]))])
      start += m
    return out


# ----------------------------------------------------------------------------------------------------------
# Scores


class Chance(NamedTuple):
  uniform: float    # mean over examples of 1 / number of candidate containers
  majority: float   # frequency of the most frequent answer


def chance(examples: Sequence[Example]) -> Chance:
  """Chance accuracy of `examples`: uniform guessing among the candidates, and always the commonest answer."""
  if not examples:
    return Chance(float("nan"), float("nan"))
  uniform = float(np.mean([1.0 / len(ex.story.containers) for ex in examples]))
  counts = collections.Counter(ex.answer for ex in examples)
  return Chance(uniform, max(counts.values()) / len(examples))


def pair_consistency(examples: Sequence[Example], predictions: Sequence[str]) -> float:
  """Fraction of counterfactual twin groups (same ``meta["twin_id"]``, >= 2 members) predicted all right.

  Examples without a ``twin_id``, and ids seen once, are skipped. NaN when there is no group.
  """
  if len(examples) != len(predictions):
    raise DataError(f"{len(examples)} examples but {len(predictions)} predictions")
  groups: dict[Any, list[bool]] = collections.defaultdict(list)
  for ex, p in zip(examples, predictions):
    tid = ex.meta.get("twin_id")
    if tid is not None:
      groups[tid].append(p == ex.answer)
  pairs = [all(v) for v in groups.values() if len(v) >= 2]
  return float(np.mean(pairs)) if pairs else float("nan")


def is_false_belief(ex: Example) -> bool:
  """``meta["false_belief"]`` when present, else question order >= 1."""
  fb = ex.meta.get("false_belief")
  return bool(fb) if fb is not None else ex.question.order >= 1


def select(examples: Sequence[Example], subset: str) -> list[Example]:
  """The examples of `subset` ("false_belief" or "all")."""
  if subset not in SUBSETS:
    raise ConfigError(f"unknown subset {subset!r}; expected one of {SUBSETS}")
  return list(examples) if subset == "all" else [ex for ex in examples if is_false_belief(ex)]


def _accuracy(examples: Sequence[Example], preds: Sequence[str]) -> float:
  return float(np.mean([p == ex.answer for ex, p in zip(examples, preds)])) if examples else float("nan")


def _breakdown(examples: Sequence[Example], preds: Sequence[str], key: Callable[[Example], Any]) -> dict:
  groups: dict[Any, list[int]] = collections.defaultdict(list)
  for i, ex in enumerate(examples):
    groups[key(ex)].append(i)
  return {k: _accuracy([examples[i] for i in idx], [preds[i] for i in idx]) for k, idx in sorted(groups.items())}


# ----------------------------------------------------------------------------------------------------------
# The audit


@dataclasses.dataclass
class ProbeResult:
  name: str
  kind: str                               # "heuristic" or "learned"
  accuracy: float                         # on the test subset
  by_order: dict[int, float]
  by_type: dict[str, float]
  pair_consistency: float                 # on the whole test set's twin groups (NaN without twins)
  flagged: bool


@dataclasses.dataclass
class AuditReport:
  subset: str
  delta: float
  n_train: int
  n_test: int
  chance: Chance
  chance_by_order: dict[int, float]
  chance_by_type: dict[str, float]
  probes: dict[str, ProbeResult]

  @property
  def threshold(self) -> float:
    """Accuracy above which a probe is flagged: uniform chance + delta."""
    return self.chance.uniform + self.delta

  @property
  def flags(self) -> list[str]:
    return [name for name, p in self.probes.items() if p.flagged]

  @property
  def passed(self) -> bool:
    """True when no probe is flagged."""
    return not self.flags

  def to_dict(self) -> dict[str, Any]:
    """JSON-ready summary (NaN becomes None)."""
    def clean(v):
      if isinstance(v, float) and math.isnan(v):
        return None
      if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
      return v
    return clean({
        "subset": self.subset, "delta": self.delta, "n_train": self.n_train, "n_test": self.n_test,
        "chance": self.chance._asdict(), "threshold": self.threshold, "chance_by_order": self.chance_by_order,
        "chance_by_type": self.chance_by_type, "passed": self.passed, "flags": self.flags,
        "probes": {k: dataclasses.asdict(p) for k, p in self.probes.items()},
    })

  def to_markdown(self) -> str:
    """The report as a markdown table, one row per probe."""
    orders = sorted(self.chance_by_order)
    types = sorted(self.chance_by_type)
    f = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"   # noqa: E731
    head = ["probe", "kind", "accuracy"] + [f"order {k}" for k in orders] + [f"type {t}" for t in types]
    head += ["pair consistency", "flag"]
    lines = [
        f"Shortcut audit ({self.subset} questions; {self.n_test} test / {self.n_train} train examples). "
        f"Chance: uniform {self.chance.uniform:.3f}, majority class {self.chance.majority:.3f}; "
        f"flag above {self.threshold:.3f} (uniform chance + delta {self.delta:.2f}). "
        f"Verdict: {'PASSED' if self.passed else 'FLAGGED: ' + ', '.join(self.flags)}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * len(head)) + "|",
        "| chance | - | " + " | ".join([f(self.chance.uniform)] + [f(self.chance_by_order[k]) for k in orders]
                                      + [f(self.chance_by_type[t]) for t in types]) + " | - | - |",
    ]
    for p in self.probes.values():
      cells = [p.name, p.kind, f(p.accuracy)] + [f(p.by_order.get(k)) for k in orders]
      cells += [f(p.by_type.get(t)) for t in types]
      flag = "FLAG" if p.flagged else ("reference" if p.name == "learned:full" else "ok")
      cells += [f(p.pair_consistency), flag]
      lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _qtype(ex: Example) -> str:
  return str(ex.meta.get("question_type", "-"))


def audit(train_examples: Sequence[Example], test_examples: Sequence[Example], *, subset: str = "false_belief",
          delta: float = 0.10, seed: int = 0, train_on: str = "subset",
          ablations: Sequence[str] = ABLATIONS) -> AuditReport:
  """Runs every heuristic and learned probe and flags those that beat chance by more than `delta`.

  Args:
    train_examples: examples the fitted heuristics and learned probes learn from.
    test_examples: examples the probes are scored on.
    subset: "false_belief" (``meta["false_belief"]``, else order >= 1) or "all": the questions scored.
    delta: margin over uniform chance above which a probe is flagged (the "full" learned probe never is).
    seed: seed of the event shuffling.
    train_on: "subset" fits on the train split's `subset` questions (the stronger audit: a shortcut that
      only holds on false-belief questions is found), "all" on the whole train split.
    ablations: the learned probes to run.

  Returns:
    The `AuditReport`.

  Raises:
    DataError: when the train or test subset is empty.
  """
  if train_on not in ("subset", "all"):
    raise ConfigError(f"train_on must be 'subset' or 'all', not {train_on!r}")
  test = select(test_examples, subset)
  train = select(train_examples, subset) if train_on == "subset" else list(train_examples)
  if not test:
    raise DataError(f"the test split has no {subset} questions")
  if not train:
    raise DataError(f"the train split has no {subset if train_on == 'subset' else ''} questions")
  ch = chance(test)
  threshold = ch.uniform + delta
  probes: dict[str, ProbeResult] = {}
  types = any("question_type" in ex.meta for ex in test)
  in_subset = [subset == "all" or is_false_belief(ex) for ex in test_examples]

  def add(name: str, kind: str, preds_all: list[str]) -> None:
    preds = [p for p, keep in zip(preds_all, in_subset) if keep]
    acc = _accuracy(test, preds)
    probes[name] = ProbeResult(
        name=name, kind=kind, accuracy=acc, by_order=_breakdown(test, preds, lambda ex: ex.question.order),
        by_type=_breakdown(test, preds, _qtype) if types else {},
        pair_consistency=pair_consistency(test_examples, preds_all),
        flagged=bool(acc > threshold) and name != "learned:full")

  for name, probe in HEURISTICS.items():
    add(name, "heuristic", [probe(ex) for ex in test_examples])
  for name, fit in FITTED_HEURISTICS.items():
    probe = fit(train)
    add(name, "heuristic", [probe(ex) for ex in test_examples])
  for ablation in ablations:
    model = LearnedProbe(ablation, seed=seed).fit(train)
    add(f"learned:{ablation}", "learned", model.predict(test_examples))
  by_order = collections.defaultdict(list)
  by_type = collections.defaultdict(list)
  for ex in test:
    by_order[ex.question.order].append(ex)
    by_type[_qtype(ex)].append(ex)
  return AuditReport(
      subset=subset, delta=delta, n_train=len(train), n_test=len(test), chance=ch,
      chance_by_order={k: chance(v).uniform for k, v in sorted(by_order.items())},
      chance_by_type={k: chance(v).uniform for k, v in sorted(by_type.items())} if types else {},
      probes=probes)


# ----------------------------------------------------------------------------------------------------------
# JSON layout and command line


def example_to_json(ex: Example) -> dict[str, Any]:
  """``{"story": {..., "events": [...]}, "question": {"chain": [...]}, "answer": ..., "meta": {...}}``."""
  d = dataclasses.asdict(ex)
  d["story"]["agents"] = list(ex.story.agents)
  d["story"]["containers"] = list(ex.story.containers)
  d["story"]["events"] = [dataclasses.asdict(e) for e in ex.story.events]
  d["question"] = {"chain": list(ex.question.chain)}
  return d


def _need(d: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
  if not isinstance(d, dict):
    raise DataError(f"{where}: expected an object, got {type(d).__name__}")
  if key not in d:
    raise DataError(f"{where}: missing key {key!r}")
  if not isinstance(d[key], typ):
    raise DataError(f"{where}.{key}: expected {typ if isinstance(typ, type) else typ[0]}, "
                    f"got {type(d[key]).__name__}")
  return d[key]


def _strings(v: list, where: str) -> tuple[str, ...]:
  if not all(isinstance(s, str) for s in v):
    raise DataError(f"{where}: expected a list of strings")
  return tuple(v)


def example_from_json(d: dict[str, Any]) -> Example:
  """Inverse of `example_to_json`; raises `DataError` on a malformed record."""
  s = _need(d, "story", dict, "record")
  events = []
  for i, e in enumerate(_need(s, "events", list, "story")):
    where = f"story.events[{i}]"
    kind, agent = _need(e, "kind", str, where), _need(e, "agent", str, where)
    container, text = e.get("container"), e.get("text")
    if container is not None and not isinstance(container, str) or text is not None and not isinstance(text, str):
      raise DataError(f"{where}: container and text must be strings or null")
    try:
      events.append(Event(kind, agent, container, text))
    except ValueError as err:
      raise DataError(f"{where}: {err}") from None
  containers = _strings(_need(s, "containers", list, "story"), "story.containers")
  if not containers:
    raise DataError("story.containers: empty candidate list")
  story = Story(obj=str(s.get("obj", "")), room=str(s.get("room", "")),
                agents=_strings(_need(s, "agents", list, "story"), "story.agents"), containers=containers,
                init=_need(s, "init", str, "story"), events=tuple(events))
  chain = _strings(_need(_need(d, "question", dict, "record"), "chain", list, "question"), "question.chain")
  answer = _need(d, "answer", str, "record")
  if answer not in containers:
    raise DataError(f"answer {answer!r} is not one of the story's containers {list(containers)}")
  meta = d.get("meta") or {}
  if not isinstance(meta, dict):
    raise DataError("meta: expected an object")
  return Example(story, Question(chain), answer, dict(meta))


def read_jsonl(path: str) -> list[Example]:
  """Examples of a JSONL file of `example_to_json` records."""
  if not os.path.isfile(path):
    raise DataError(f"{path}: no such file")
  out = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as err:
        raise DataError(f"{path}:{n}: not JSON ({err.msg})") from None
      try:
        out.append(example_from_json(rec))
      except DataError as err:
        raise DataError(f"{path}:{n}: {err}") from None
  if not out:
    raise DataError(f"{path}: no records")
  return out


def split(examples: Sequence[Example], test_fraction: float = 0.3, seed: int = 0
          ) -> tuple[list[Example], list[Example]]:
  """Random train / test split that keeps counterfactual twins (same ``twin_id``) on one side."""
  keys = [ex.meta.get("twin_id", ("row", i)) for i, ex in enumerate(examples)]
  uniq = list(dict.fromkeys(map(repr, keys)))
  rng = np.random.default_rng(seed)
  test_keys = set(uniq[i] for i in rng.permutation(len(uniq))[:max(1, round(test_fraction * len(uniq)))])
  train = [ex for ex, k in zip(examples, keys) if repr(k) not in test_keys]
  test = [ex for ex, k in zip(examples, keys) if repr(k) in test_keys]
  return train, test


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxlab.tom.audit", description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", required=True, help="JSONL of example_to_json records (the train split)")
  parser.add_argument("--test", default=None, help="test JSONL (default: a twin-aware split of --data)")
  parser.add_argument("--subset", default="false_belief", choices=SUBSETS)
  parser.add_argument("--delta", type=float, default=0.10)
  parser.add_argument("--test_fraction", type=float, default=0.3, help="held-out share when --test is absent")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None, help="also write the report as JSON here")
  parser.add_argument("--fail_on_flag", action="store_true", help="exit 1 when a probe is flagged")
  args = parser.parse_args(argv)
  if not 0 < args.test_fraction < 1:
    raise ConfigError(f"--test_fraction must be in (0, 1), got {args.test_fraction}")
  data = read_jsonl(args.data)
  if args.test:
    train, test = data, read_jsonl(args.test)
  else:
    train, test = split(data, args.test_fraction, args.seed)
    if not train:
      raise DataError(f"{args.data}: too few records to split into train and test; pass --test")
  report = audit(train, test, subset=args.subset, delta=args.delta, seed=args.seed)
  print(report.to_markdown(), end="")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(report.to_dict(), f, indent=2)
  return 1 if args.fail_on_flag and not report.passed else 0


if __name__ == "__main__":
  cli.main_wrapper(main)
