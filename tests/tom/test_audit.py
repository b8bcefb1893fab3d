"""Shortcut audit: flags a dataset built around a shortcut, passes a rejection-balanced one (local generator)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxlab.errors import DataError
from jaxlab.tom import audit
from jaxlab.tom.types import Event, Example, Question, Story

NAMES = ("red_box", "blue_box", "green_basket", "suitcase", "drawer", "pantry")
AGENTS = ("Avery", "Blake", "Casey", "Drew")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------------------------------------
# A small local generator (Hi-ToM semantics without ENTER: the answer is the location at the first exit of a
# chain agent)


def _locations(story: Story) -> list[str]:
  """Object location before event i (index i), and after the last one (index len)."""
  locs = [story.init]
  for e in story.events:
    locs.append(e.container if e.kind == "move" else locs[-1])
  return locs


def _answer(story: Story, chain: tuple[str, ...]) -> str:
  exits = [i for i, e in enumerate(story.events) if e.kind == "exit" and e.agent in chain]
  return _locations(story)[min(exits) if exits else len(story.events)]


def _example(story: Story, chain: tuple[str, ...], **meta) -> Example:
  ans = _answer(story, chain)
  meta.update(order=len(chain), false_belief=ans != _locations(story)[-1])
  return Example(story, Question(chain), ans, meta)


def _random_story(rng: np.random.Generator, chain: tuple[str, ...]) -> Story:
  containers = tuple(str(c) for c in rng.permutation(NAMES))
  stayer = next(a for a in AGENTS if a not in chain)
  loc = init = containers[rng.integers(6)]
  inside = set(AGENTS)
  events = []
  exit_at = {a: rng.integers(0, 6) for a in AGENTS if a != stayer and rng.random() < 0.8}
  for t in range(rng.integers(3, 7)):
    for a, when in exit_at.items():
      if when == t and a in inside:
        events.append(Event("exit", a))
        inside.discard(a)
    if rng.random() < 0.4:
      events.append(Event("distractor", str(rng.choice(AGENTS)), containers[rng.integers(6)], "likes"))
    mover = str(rng.choice(sorted(inside)))
    loc = str(rng.choice([c for c in containers if c != loc]))
    events.append(Event("move", mover, loc))
  for _ in range(rng.integers(1, 4)):    # distractors after the last move name random containers
    events.append(Event("distractor", str(rng.choice(AGENTS)), containers[rng.integers(6)], "likes"))
  return Story("apple", "kitchen", AGENTS, containers, init, tuple(events))


def balanced(n: int, seed: int) -> list[Example]:
  """n false-belief questions, each followed by its true-belief counterfactual twin (the chain agents' exits
  deleted). Built so that each of first / last / nearest-to-agent mention hits the answer with probability
  1/6, and rejection-sampled so that most-mention does too."""
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < 2 * n:
    want_most = rng.random() < 1 / 6
    while True:
      ex = _balanced_one(rng)
      if (audit.most_mention(ex) == ex.answer) == want_most:
        break
    tid = len(out) // 2
    ex.meta.update(twin_id=tid, twin_role="factual")
    chain = ex.question.chain
    twin_story = Story(**{**ex.story.__dict__, "events": tuple(
        e for e in ex.story.events if not (e.kind == "exit" and e.agent in chain))})
    out += [ex, _example(twin_story, chain, question_type="belief", twin_id=tid, twin_role="counterfactual")]
  return out


def _balanced_one(rng: np.random.Generator) -> Example:
  containers = tuple(str(c) for c in rng.permutation(NAMES))
  chain = tuple(str(a) for a in rng.permutation(AGENTS)[:rng.integers(1, 3)])
  others = [a for a in AGENTS if a not in chain]
  answer = containers[rng.integers(6)]

  def other_than(*avoid: str) -> str:
    return str(rng.choice([c for c in containers if c not in avoid]))

  def hit_or_miss() -> str:                         # the answer with probability 1/6, else another container
    return answer if rng.random() < 1 / 6 else other_than(answer)

  events = []
  if rng.random() < 1 / 6:                          # the chain leaves before any move: answer = init
    init = loc = answer
  else:
    init = loc = other_than(answer)
    for k in range(rng.integers(1, 4)):
      last = k == 0 or rng.random() < 0.4
      loc = answer if last and loc != answer else other_than(loc, answer)
      events.append(Event("move", str(rng.choice(AGENTS)), loc))
      if loc == answer:
        break
    if loc != answer:
      events.append(Event("move", str(rng.choice(AGENTS)), answer))
      loc = answer
  if rng.random() < 0.5:
    events.append(Event("distractor", str(rng.choice(AGENTS)), other_than(), "likes"))
  events += [Event("exit", a) for a in chain]
  for _ in range(rng.integers(1, 4)):
    loc = other_than(loc, answer) if rng.random() < 0.5 else other_than(loc)
    events.append(Event("move", str(rng.choice(others)), loc))
  if loc == answer:
    loc = other_than(answer)
    events.append(Event("move", str(rng.choice(others)), loc))
  if rng.random() < 0.5:
    events.append(Event("distractor", str(rng.choice(others)), other_than(), "likes"))
  events.append(Event("distractor", chain[-1], hit_or_miss(), "likes"))      # nearest_to_agent
  events.append(Event("distractor", str(rng.choice(others)), hit_or_miss(), "dislikes"))   # last_mention
  story = Story("apple", "kitchen", AGENTS, containers, init, tuple(events))
  ex = _example(story, chain, question_type="belief")
  assert ex.answer == answer and ex.meta["false_belief"]
  return ex


def shortcut(n: int, seed: int) -> list[Example]:
  """False-belief answers are always the first-mentioned container (the chain agents leave before any move);
  one question in four is a true-belief reality question."""
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < n:
    chain = tuple(str(a) for a in rng.permutation(AGENTS)[:rng.integers(0, 3)])
    s = _random_story(rng, chain)
    if chain:
      body = [e for e in s.events if not (e.kind == "exit" and e.agent in chain)]
      body = [e for e in body if e.kind != "move" or e.agent not in chain]
      s = Story(**{**s.__dict__, "events": tuple([Event("exit", a) for a in chain] + body)})
    ex = _example(s, chain, question_type="belief")
    if not any(e.kind == "move" for e in s.events) or (chain and not ex.meta["false_belief"]):
      continue
    out.append(ex)
  return out


@pytest.fixture(scope="module")
def balanced_report():
  return audit.audit(balanced(1000, 1), balanced(4000, 2), ablations=("no_exits", "full"))


@pytest.fixture(scope="module")
def shortcut_report():
  return audit.audit(shortcut(1500, 1), shortcut(1500, 2))


# ----------------------------------------------------------------------------------------------------------


def test_heuristics_by_hand():
  s = Story("apple", "kitchen", ("A", "B"), ("x", "y", "z", "w"), "x", (
      Event("move", "A", "y"), Event("distractor", "B", "z", "likes"), Event("exit", "B"),
      Event("move", "A", "z"), Event("distractor", "A", "w", "likes")))
  ex = Example(s, Question(("B",)), "y")
  assert audit.first_mention(ex) == "x"
  assert audit.last_mention(ex) == "w"
  assert audit.most_mention(ex) == "z"                  # z twice
  assert audit.nearest_to_agent(ex) == "z"              # B's last event is the exit (index 2): z at 1 and 3, tie -> 1
  assert audit.nearest_to_agent(Example(s, Question(()), "w")) == "w"
  tie = Example(Story("o", "r", ("A",), ("x", "y"), "x", (Event("move", "A", "y"),)), Question(("A",)), "y")
  assert audit.most_mention(tie) == "x"
  assert audit.chance([ex, tie]) == audit.Chance(0.5 * (1 / 4 + 1 / 2), 1.0)   # both answers are y
  train = [Example(s, Question(("A",)), "y"), Example(s, Question(("A",)), "y"), Example(s, Question(()), "w"),
           Example(s, Question(("A",)), "x")]
  assert audit.fit_majority_per_order(train)(Example(s, Question(()), "x")) == "w"
  assert audit.fit_majority_per_order(train)(Example(s, Question(("A", "B")), "x")) == "y"
  assert audit.fit_majority_label(train)(ex) == "y"


def test_pair_consistency_by_hand():
  s = Story("o", "r", ("A",), ("x", "y"), "x", ())
  exs = [Example(s, Question(("A",)), a, {"twin_id": t}) for t, a in
         [(0, "x"), (0, "y"), (1, "x"), (1, "y"), (2, "x"), (2, "y")]]
  exs.append(Example(s, Question(()), "x", {"twin_id": 9}))            # a lone member: skipped
  preds = ["x", "y", "x", "x", "y", "x", "y"]                           # pair 0 right, 1 half, 2 wrong
  assert audit.pair_consistency(exs, preds) == pytest.approx(1 / 3)
  assert np.isnan(audit.pair_consistency(exs[:1], preds[:1]))
  with pytest.raises(DataError):
    audit.pair_consistency(exs, preds[:2])


def test_shortcut_dataset_is_flagged(shortcut_report):
  r = shortcut_report
  acc = {k: p.accuracy for k, p in r.probes.items()}
  print(json.dumps(acc, indent=1))
  assert acc["first_mention"] >= 0.99
  assert acc["learned:no_exits"] >= 0.9 and acc["learned:no_story"] < r.threshold
  assert {"first_mention", "learned:no_exits", "learned:shuffled"} <= set(r.flags)
  assert not r.probes["learned:full"].flagged and not r.passed
  assert r.n_test == sum(ex.meta["false_belief"] for ex in shortcut(1500, 2))
  everything = audit.audit(shortcut(600, 1), shortcut(600, 2), subset="all", ablations=("full",))
  assert everything.n_test == 600 and set(everything.chance_by_order) == {0, 1, 2}


def test_balanced_dataset_passes(balanced_report):
  r = balanced_report
  acc = {k: p.accuracy for k, p in r.probes.items()}
  print(json.dumps(acc, indent=1))
  assert r.n_test == 4000 and r.chance.uniform == pytest.approx(1 / 6)
  for name in [*audit.HEURISTICS, *audit.FITTED_HEURISTICS]:
    assert abs(acc[name] - 1 / 6) < 0.05, name
    assert not r.probes[name].flagged
  # The twin-deleted exits make the twin's answer the final location: the pair needs the exits.
  assert r.probes["first_mention"].pair_consistency < 0.1


def test_report_dict_and_markdown(shortcut_report):
  md = shortcut_report.to_markdown()
  assert "| probe | kind | accuracy | order 1 | order 2 | type belief | pair consistency | flag |" in md
  assert "Verdict: FLAGGED: first_mention" in md
  rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
  assert set(rows) >= {"chance", "first_mention", "learned:no_exits", "learned:full"}
  assert rows["first_mention"].endswith("| FLAG |") and rows["learned:full"].endswith("| reference |")
  assert f"{shortcut_report.probes['first_mention'].accuracy:.3f}" in rows["first_mention"]
  d = json.loads(json.dumps(shortcut_report.to_dict()))
  assert d["passed"] is False and "first_mention" in d["flags"]
  assert d["probes"]["first_mention"]["pair_consistency"] is None       # no twins in this dataset


def test_json_round_trip_and_errors():
  for ex in balanced(3, 0) + shortcut(3, 0):
    d = json.loads(json.dumps(audit.example_to_json(ex)))
    assert set(d) == {"story", "question", "answer", "meta"} and d["question"] == {"chain": list(ex.question.chain)}
    back = audit.example_from_json(d)
    assert back == ex and back.meta == ex.meta
  d = audit.example_to_json(shortcut(1, 0)[0])
  for bad, msg in [({**d, "answer": "nowhere"}, "not one of"), ({k: v for k, v in d.items() if k != "story"}, "story"),
                   ({**d, "story": {**d["story"], "events": [{"kind": "fly", "agent": "A"}]}}, "events\\[0\\]"),
                   ({**d, "question": {"chain": [1]}}, "list of strings")]:
    with pytest.raises(DataError, match=msg):
      audit.example_from_json(bad)


def test_cli(tmp_path, capsys):
  data = tmp_path / "data.jsonl"
  data.write_text("".join(json.dumps(audit.example_to_json(ex)) + "\n" for ex in shortcut(400, 3)))
  assert audit.main(["--data", str(data), "--json", str(tmp_path / "r.json")]) == 0
  assert "| first_mention | heuristic | 1.000 |" in capsys.readouterr().out
  assert json.loads((tmp_path / "r.json").read_text())["passed"] is False
  assert audit.main(["--data", str(data), "--test", str(data), "--fail_on_flag"]) == 1
  bad = tmp_path / "bad.jsonl"
  bad.write_text(data.read_text().splitlines()[0] + "\n{not json\n")
  for path in (bad, tmp_path / "missing.jsonl"):
    proc = subprocess.run([sys.executable, "-m", "jaxlab.tom.audit", "--data", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
  assert "bad.jsonl:2: not JSON" in subprocess.run(
      [sys.executable, "-m", "jaxlab.tom.audit", "--data", str(bad)], cwd=ROOT, capture_output=True,
      text=True, timeout=60).stderr


@functools.lru_cache(maxsize=1)
def _real_generator_audits():
  stories = pytest.importorskip("jaxlab.tom.stories")
  naive = audit.audit(stories.generate(4000, mode="naive", seed=0), stories.generate(2000, mode="naive", seed=1),
                      ablations=("no_exits",))
  free = audit.audit(stories.generate(4000, mode="shortcut_free", seed=0),
                     stories.generate(2000, mode="shortcut_free", seed=1), ablations=("no_exits",))
  return naive, free


def test_real_generator_heuristics():
  """Claim 1's heuristic half: naive data is flagged; on shortcut-free data every heuristic is at chance."""
  naive, free = _real_generator_audits()
  assert not naive.passed and naive.probes["first_mention"].flagged
  assert naive.probes["first_mention"].accuracy >= naive.chance.uniform + 0.30
  for name in [*audit.HEURISTICS, *audit.FITTED_HEURISTICS]:
    assert free.probes[name].accuracy <= free.chance.uniform + 0.05, (name, free.to_markdown())


def test_real_generator_learned_probe():
  """Claim 1's learned half: the probe on shortcut-free stories without their EXIT events stays near chance.

  A false-belief answer is uniform over the containers other than the final one given the story without exits
  (`jaxlab.tom.stories`), so the probe can at best rule out the final location: 1 / 5 = chance + 0.033 with 6
  containers (measured 0.199 here, 0.176 with seeds 2 / 3, 0.203 on orders 0-4; the old generator: 0.282).
  """
  _, free = _real_generator_audits()
  p = free.probes["learned:no_exits"]
  assert p.accuracy <= free.chance.uniform + 0.10 and not p.flagged, free.to_markdown()
