"""Tests of jaxlab.tom.stories (answer rule, generator, shortcut balance, rendering) and jaxlab.tom.hitom_files."""

from __future__ import annotations

import collections
import csv
import json

import pytest

from jaxlab.errors import ConfigError, DataError
from jaxlab.lm import sft_data
from jaxlab.tom import hitom_files, stories
from jaxlab.tom.types import Event, Example, Question, Story

CONTAINERS = ("red_box", "blue_box", "green_box", "white_crate")


def _story(events, init="red_box", agents=("Avery", "Ella", "Jack")) -> Story:
  return Story(obj="lettuce", room="kitchen", agents=agents, containers=CONTAINERS, init=init,
               events=tuple(events))


def M(a, c):
  return Event("move", a, c)


def X(a):
  return Event("exit", a)


# ---------------------------------------------------------------------------------------------------------
# answer()

def test_answer_hand_made_stories():
  s = _story([M("Ella", "blue_box"), X("Avery"), M("Ella", "green_box"),
              Event("distractor", "Jack", "red_box", "likes"), X("Ella"), M("Jack", "white_crate")])
  assert stories.answer(s, ()) == "white_crate"                    # order 0: the real location
  assert stories.answer(s, ("Jack",)) == "white_crate"             # true belief: Jack saw everything
  assert stories.answer(s, ("Avery",)) == "blue_box"               # false belief: left before 2nd move
  assert stories.answer(s, ("Ella",)) == "green_box"               # left before the last move
  assert stories.answer(s, ("Jack", "Avery")) == "blue_box"        # order 2: T = min exit time
  assert stories.answer(s, ("Ella", "Avery")) == "blue_box"
  assert stories.answer(s, ("Jack", "Ella")) == "green_box"
  assert stories.answer(s, Question(("Avery", "Jack", "Ella"))) == "blue_box"
  # Exit before any move: the initial container; exit after every move: the final one.
  s2 = _story([X("Avery"), M("Ella", "blue_box"), M("Jack", "green_box"), X("Jack")])
  assert stories.answer(s2, ("Avery",)) == "red_box"
  assert stories.answer(s2, ("Jack",)) == "green_box"
  assert stories.answer(s2, ("Jack", "Avery")) == "red_box"
  assert stories.witnessed_path(s2, ("Ella",)) == ["red_box", "blue_box", "green_box"]
  assert stories.answer(_story([]), ("Avery",)) == "red_box"


def test_answer_rejects_enter_events_and_unknown_agents():
  s = _story([X("Avery"), M("Ella", "blue_box"), Event("enter", "Avery")])
  with pytest.raises(ValueError, match="jaxlab.tom.simulator"):
    stories.answer(s, ("Avery",))
  with pytest.raises(DataError, match="Zed"):
    stories.answer(_story([]), ("Zed",))


# ---------------------------------------------------------------------------------------------------------
# generate()

def _causal(story: Story) -> list[tuple]:
  return [(e.kind, e.agent, e.container) for e in story.events if e.kind != "distractor"]


def _one_causal_edit(a: list[tuple], b: list[tuple]) -> bool:
  """b is a with one move/exit added or removed, or one exit moved elsewhere."""
  if abs(len(a) - len(b)) == 1:
    long, short = (a, b) if len(a) > len(b) else (b, a)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))
  if len(a) == len(b) and sorted(a) == sorted(b) and a != b:
    return any(e[0] == "exit" and [x for x in a if x != e] == [x for x in b if x != e] for e in set(a))
  return False


@pytest.mark.parametrize("mode", ["shortcut_free", "naive"])
def test_generate_deterministic_counts_and_valid(mode):
  a = stories.generate(301, seed=5, mode=mode, orders=(0, 1, 2, 3))
  b = stories.generate(301, seed=5, mode=mode, orders=(0, 1, 2, 3))
  assert len(a) == 301 and a == b and [x.meta for x in a] == [x.meta for x in b]
  assert a != stories.generate(301, seed=6, mode=mode, orders=(0, 1, 2, 3))
  assert {x.meta["order"] for x in a} == {0, 1, 2, 3}
  for ex in a:
    s, chain = ex.story, ex.question.chain
    assert ex.meta["order"] == len(chain) and ex.meta["mode"] == mode
    assert ex.meta["question_type"] == "belief"
    assert all(x != y for x, y in zip(chain, chain[1:])) and set(chain) <= set(s.agents)
    assert not any(e.kind == "enter" for e in s.events)
    assert ex.answer in s.containers and s.init in s.containers
    assert all(e.container in s.containers for e in s.events if e.container)
    assert ex.answer == stories.answer(s, chain)
    final = stories.answer(s, ())
    assert ex.meta["false_belief"] == (ex.answer != final)
    assert ex.meta["answer_position"] == stories.answer_position(s, ex.answer)
    # Movers are in the room and moves change the container.
    gone, loc = set(), s.init
    for e in s.events:
      if e.kind == "move":
        assert e.agent not in gone and e.container != loc
        loc = e.container
      elif e.kind == "exit":
        assert e.agent not in gone
        gone.add(e.agent)


def test_twins_change_the_answer_by_one_causal_fact():
  exs = stories.generate(600, seed=1, orders=(0, 1, 2))
  facts = collections.Counter()
  for orig, twin in zip(exs[0::2], exs[1::2]):
    assert orig.meta["twin_id"] == twin.meta["twin_id"]
    assert (orig.meta["twin_role"], twin.meta["twin_role"]) == ("original", "twin")
    assert orig.question == twin.question and orig.answer != twin.answer
    assert orig.story.init == twin.story.init and orig.story.containers == twin.story.containers
    assert _one_causal_edit(_causal(orig.story), _causal(twin.story)), (orig, twin)
    assert ([e for e in orig.story.events if e.kind == "distractor"]
            == [e for e in twin.story.events if e.kind == "distractor"])
    facts[twin.meta["twin_fact"].split(":")[0]] += 1
  assert set(facts) == {"exit_later", "exit_earlier", "add_move", "remove_move"}
  assert len({x.meta["twin_id"] for x in exs}) == 300
  no_twins = stories.generate(50, seed=1, twins=False)
  assert all(x.meta["twin_id"] is None and x.meta["twin_role"] == "original" for x in no_twins)


def test_generate_config_errors():
  with pytest.raises(ConfigError, match="mode"):
    stories.generate(3, seed=0, mode="easy")
  with pytest.raises(ConfigError, match="num_agents"):
    stories.generate(3, seed=0, orders=(4,), num_agents=3)
  with pytest.raises(ConfigError, match="num_containers"):
    stories.generate(3, seed=0, num_containers=2)
  with pytest.raises(ConfigError, match="orders"):
    stories.generate(3, seed=0, orders=())


# ---------------------------------------------------------------------------------------------------------
# Shortcut heuristics (small independent versions; the real audit lives in jaxlab.tom.audit).

def _mentions(ex: Example) -> list[tuple[int, str]]:
  s = ex.story
  return [(0, s.init)] + [(i + 1, e.container) for i, e in enumerate(s.events) if e.container]


def _nearest_to(ex: Example, agent: str) -> str:
  ment = _mentions(ex)
  apos = [i + 1 for i, e in enumerate(ex.story.events) if e.agent == agent]
  if not apos:
    return ment[0][1]
  return min(ment, key=lambda pc: (min(abs(pc[0] - q) for q in apos), pc[0]))[1]


def _predictions(ex: Example) -> dict[str, str]:
  names = [c for _, c in _mentions(ex)]
  counts = collections.Counter(names)
  top = max(counts.values())
  chain = ex.question.chain
  return {"first": names[0], "last": names[-1], "most": next(c for c in names if counts[c] == top),
          "nearest": _nearest_to(ex, chain[0]) if chain else names[0]}


def _heuristic_accuracies(exs: list[Example], train: list[Example]) -> dict[str, float]:
  acc = collections.Counter()
  for ex in exs:
    for k, v in _predictions(ex).items():
      acc[k] += v == ex.answer
  # Majority answer per order, fit on a separate train set: by name and by candidate slot.
  by_name, by_slot = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
  for ex in train:
    by_name[ex.question.order][ex.answer] += 1
    by_slot[ex.question.order][ex.story.containers.index(ex.answer)] += 1
  for ex in exs:
    o = ex.question.order
    acc["majority_name"] += by_name[o].most_common(1)[0][0] == ex.answer
    acc["majority_slot"] += ex.story.containers[by_slot[o].most_common(1)[0][0]] == ex.answer
  return {k: v / len(exs) for k, v in acc.items()}


def test_naive_mode_has_shortcuts():
  exs = stories.generate(7000, seed=0, mode="naive")
  fb = [x for x in exs if x.meta["false_belief"]][:2000]
  assert len(fb) == 2000
  acc = _heuristic_accuracies(fb, exs)
  assert max(acc["first"], acc["last"]) >= 1 / 6 + 0.30, acc


def test_shortcut_free_mode_is_at_chance():
  exs = stories.generate(4000, seed=0)
  train = stories.generate(4000, seed=1)
  chance = 1 / 6
  for subset in (exs, [x for x in exs if x.meta["false_belief"]]):
    acc = _heuristic_accuracies(subset, train)
    assert set(acc) == {"first", "last", "most", "nearest", "majority_name", "majority_slot"}
    for k, v in acc.items():
      assert v <= chance + 0.05, (k, acc)
  for order in (1, 2):
    fbs = [x.meta["false_belief"] for x in exs if x.meta["order"] == order]
    assert abs(sum(fbs) / len(fbs) - 0.5) < 0.03
  positions = collections.Counter(x.meta["answer_position"] for x in exs)
  assert positions["middle"] > positions["first"] > 0 and positions["last"] > 0


def test_shortcut_free_moves_do_not_locate_false_belief_answers():
  """Without its exits a story only tells that a false-belief answer is not the final location: ranked by how
  recently the object was there, the other containers are each the answer about 1/5 of the time (the old
  generator favoured the most recent ones: 0.36, 0.26, 0.21, 0.13, 0.04)."""
  exs = [x for x in stories.generate(3000, seed=2) if x.meta["false_belief"]]
  assert len(exs) > 800
  ranks = collections.Counter()
  for ex in exs:
    locs = [ex.story.init] + [e.container for e in ex.story.events if e.kind == "move"]
    last = {c: max((i for i, x in enumerate(locs) if x == c), default=-1) for c in ex.story.containers}
    recent = sorted((c for c in ex.story.containers if c != locs[-1]), key=lambda c: -last[c])
    ranks[recent.index(ex.answer)] += 1
  freqs = [ranks[r] / len(exs) for r in range(5)]
  assert max(abs(f - 0.2) for f in freqs) < 0.06, freqs


# ---------------------------------------------------------------------------------------------------------
# Rendering and records.

def _parse_symbolic(prompt: str) -> tuple[Story, tuple[str, ...]]:
  """A tiny reader of the symbolic format (test-only)."""
  story_part, q_part = prompt.split(" || ")[:2]
  init, events = None, []
  for tok in story_part.split(" | "):
    w = tok.split()
    if w[0] == "INIT":
      init = w[1]
    elif w[0] == "MOVE":
      events.append(M(w[1], w[2]))
    elif w[0] == "EXIT":
      events.append(X(w[1]))
    elif w[0] == "STAY":
      events.append(Event("distractor", w[1], None, "stayed"))
    else:
      events.append(Event("distractor", w[1], w[2], w[0].lower()))
  agents = tuple(sorted({e.agent for e in events} | set(q_part.split()[1:])))
  return Story("obj", "room", agents, (), init, tuple(events)), tuple(q_part.split()[1:])


def test_render_symbolic_and_english():
  s = _story([M("Ella", "blue_box"), X("Avery"), Event("distractor", "Jack", "green_box", "likes"),
              Event("distractor", "Ella", None, "stayed")])
  ex = Example(s, Question(("Avery", "Ella")), "blue_box", {})
  prompt, ans = stories.render(ex, "symbolic")
  assert prompt == "INIT red_box | MOVE ella blue_box | EXIT avery | LIKES jack green_box | STAY ella || Q avery ella"
  assert ans == "blue_box"
  prompt, _ = stories.render(ex, "english", choices=True)
  assert prompt.splitlines() == [
      "Avery, Ella and Jack entered the kitchen. The lettuce is in the red_box. Ella moved the lettuce to the "
      "blue_box. Avery exited the kitchen. Jack likes the green_box. Ella made no movements and stayed in the "
      "kitchen for 1 minute.",
      "Where does Avery think Ella thinks the lettuce is?",
      "Choices: red_box, blue_box, green_box, white_crate"]
  assert stories.render(Example(s, Question(()), "blue_box"), "english")[0].endswith("Where is the lettuce really?")
  assert stories.render_trace(ex) == "red_box -> blue_box"
  with pytest.raises(ConfigError, match="style"):
    stories.render(ex, "latex")


def test_records_round_trip(tmp_path):
  exs = stories.generate(200, seed=3, orders=(0, 1, 2, 3))
  recs = stories.to_records(exs, "symbolic")
  for ex, r in zip(exs, recs):
    assert r["completion"] == r["answer"] == ex.answer
    assert r["order"] == ex.question.order and r["twin_id"] == ex.meta["twin_id"]
    assert r["false_belief"] == ex.meta["false_belief"] and r["answer"] not in r["prompt"].split("|| Q")[1]
    story, chain = _parse_symbolic(r["prompt"])
    assert stories.answer(story, chain) == ex.answer
    assert r["trace"].split(" -> ")[-1] == ex.answer
  think = stories.to_records(exs[:5], "english", thinking=True, choices=True)
  for ex, r in zip(exs, think):
    assert r["completion"] == f"<think>{stories.render_trace(ex)}</think><answer>{ex.answer}</answer>"
    assert "Choices: " in r["prompt"]
  path = tmp_path / "tom.jsonl"
  assert stories.write_jsonl(path, exs, "english") == 200
  lines = [json.loads(x) for x in path.read_text().splitlines()]
  assert lines == json.loads(json.dumps(stories.to_records(exs, "english")))
  loaded = sft_data.read_jsonl(str(path))
  assert len(loaded) == 200


def test_parse_english_recovers_the_story():
  exs = stories.generate(300, seed=4, orders=(0, 1, 2, 3, 4), num_agents=5)
  for r, ex in zip(stories.to_records(exs, "english"), exs):
    story_text, question = r["prompt"].split("\n")[:2]
    parsed = hitom_files.parse_english({"story": story_text, "question": question, "answer": r["answer"]})
    assert parsed is not None, r["prompt"]
    assert parsed.story.events == ex.story.events and parsed.story.init == ex.story.init
    assert parsed.story.agents == ex.story.agents and parsed.question == ex.question
    assert stories.answer(parsed.story, parsed.question) == parsed.answer == ex.answer


# ---------------------------------------------------------------------------------------------------------
# CSV files.

HITOM_ROWS = [
    {"Story": "Avery, Ella and Jack entered the living_room. The lettuce is in the red_box. Ella moved the "
              "lettuce to the green_bathtub. Avery exited the living_room. Jack likes the blue_crate. Ella moved "
              "the lettuce to the blue_crate. Jack made no movements and stayed in the living_room for 1 minute.",
     "Question": "Where does Jack think Avery thinks the lettuce is?", "Answer": "green_bathtub",
     "Question_Order": "2", "Deception": "False",
     "Choices": "['red_box', 'green_bathtub', 'blue_crate', 'white_basket']"},
    {"Story": "1 Sally entered the kitchen.\n2 Anne entered the kitchen.\n3 The apple is in the box.\n"
              "4 Sally exited the kitchen.\n5 Anne moved the apple to the basket.",
     "Question": "Where will Sally look for the apple?", "Answer": "box.", "Question_Order": "first order",
     "Deception": "", "Choices": ""},
    {"Story": "Avery, Ella entered the hall. The pear is in the red_box. Avery privately told Ella that the pear "
              "is in the blue_box.",
     "Question": "Where is the pear really?", "Answer": "A. red_box", "Question_Order": "0", "Deception": "true",
     "Choices": "A. red_box, B. blue_box"},
]


def _write_csv(path, rows, delimiter=","):
  with open(path, "w", newline="", encoding="utf-8") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
    w.writeheader()
    w.writerows(rows)


def test_load_csv_and_parse(tmp_path):
  path = tmp_path / "Hi_ToM_cleaned.csv"
  _write_csv(path, HITOM_ROWS)
  recs = hitom_files.load_csv(path)
  assert [r["order"] for r in recs] == [2, 1, 0]
  assert [r["answer"] for r in recs] == ["green_bathtub", "box", "red_box"]
  assert recs[0]["choices"] == ["red_box", "green_bathtub", "blue_crate", "white_basket"]
  assert recs[2]["choices"] == ["red_box", "blue_box"] and recs[1]["choices"] is None
  assert [r["deception"] for r in recs] == [False, None, True]
  ex = hitom_files.parse_english(recs[0])
  assert ex.question.chain == ("Jack", "Avery") and ex.story.containers[:4] == tuple(recs[0]["choices"])
  assert stories.answer(ex.story, ex.question) == ex.answer == "green_bathtub"
  tomi = hitom_files.parse_english(recs[1])
  assert tomi.question.chain == ("Sally",) and stories.answer(tomi.story, tomi.question) == "box"
  assert hitom_files.parse_english(recs[2]) is None                  # deception is not understood
  assert hitom_files.parse_english({"story": recs[1]["story"], "question": "Where was the apple at the "
                                    "beginning?", "answer": "box"}) is None
  # Other column names and a tab-separated file.
  tsv = tmp_path / "tomi.tsv"
  rows = [{"context": r["Story"], "QUESTION": r["Question"], "label": r["Answer"], "level": r["Question_Order"]}
          for r in HITOM_ROWS]
  _write_csv(tsv, rows, delimiter="\t")
  assert [r["answer"] for r in hitom_files.load_csv(tsv)] == ["green_bathtub", "box", "red_box"]


def test_parse_english_late_agent_and_reentry():
  rec = {"story": "Avery and Ella entered the den. The hat is in the red_box. Avery exited the den. Ella moved "
                  "the hat to the blue_box. Jack entered the den. Ella moved the hat to the green_box. Avery "
                  "entered the den.",
         "question": "Where does Jack think the hat is?", "answer": "green_box"}
  ex = hitom_files.parse_english(rec)
  assert ex is not None and [e.kind for e in ex.story.events] == ["exit", "exit", "move", "enter", "move",
                                                                    "enter"]
  # A re-entered agent who missed a move then "sees" the object: not representable -> None.
  rec["story"] += " The hat is in the green_box."
  assert hitom_files.parse_english(rec) is None


def test_load_csv_errors(tmp_path):
  bad = tmp_path / "bad.csv"
  _write_csv(bad, [{"story": "x", "query": "y"}])
  with pytest.raises(DataError, match=r"bad\.csv has no answer column"):
    hitom_files.load_csv(bad)
  with pytest.raises(DataError, match="cannot read"):
    hitom_files.load_csv(tmp_path / "missing.csv")
  empty = tmp_path / "empty.csv"
  empty.write_text("")
  with pytest.raises(DataError, match="empty"):
    hitom_files.load_csv(empty)
