"""Tests of the independent brute-force belief simulator `jaxlab.tom.simulator`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlab.errors import DataError
from jaxlab.tom import simulator
from jaxlab.tom.types import Event, Example, Question, Story

C4 = ("c0", "c1", "c2", "c3")


def _story(agents, events, init="c0", containers=C4) -> Story:
  return Story(obj="apple", room="kitchen", agents=tuple(agents), containers=tuple(containers), init=init,
               events=tuple(events))


def mv(agent: str, container: str) -> Event:
  return Event("move", agent, container)


def ex(agent: str) -> Event:
  return Event("exit", agent)


def en(agent: str) -> Event:
  return Event("enter", agent)


def ds(agent: str, container: str | None = None, text: str = "likes") -> Event:
  return Event("distractor", agent, container, text)


# ----------------------------------------------------------------------------------------------- hand-made


def test_sally_anne_first_order():
  # e0 Sally exits; e1 Anne moves basket -> box (only Anne sees it).
  s = _story(("Sally", "Anne"), [ex("Sally"), mv("Anne", "box")], init="basket", containers=("basket", "box"))
  sim = simulator.simulate(s)
  assert sim["locations"] == ["basket", "box"]
  assert sim["present"] == [frozenset({"Sally", "Anne"}), frozenset({"Anne"})]
  assert sim["final"] == "box" and sim["in_room"] == frozenset({"Anne"})
  assert simulator.belief(s, ()) == "box"                 # reality
  assert simulator.belief(s, ("Anne",)) == "box"          # Anne saw e1
  assert simulator.belief(s, ("Sally",)) == "basket"      # Sally saw only e0: false belief
  # Anne saw Sally leave at e0 (public presence) so, in Anne's model, Sally's history is [e0] -> basket.
  assert simulator.belief(s, ("Anne", "Sally")) == "basket"
  # Sally's history is [e0]; Anne was present at e0, so in Sally's model Anne saw [e0] -> basket.
  assert simulator.belief(s, ("Sally", "Anne")) == "basket"


def _three_agent_story() -> Story:
  # e0 A moves c0 -> c1 (A, B, C present); e1 B exits (A, B, C); e2 A moves -> c2 (A, C);
  # e3 A exits (A, C); e4 C moves -> c3 (C only).
  return _story(("A", "B", "C"), [mv("A", "c1"), ex("B"), mv("A", "c2"), ex("A"), mv("C", "c3")])


@pytest.mark.parametrize("chain,want", [
    ((), "c3"),                      # order 0: reality
    (("C",), "c3"),                  # C saw everything
    (("A",), "c2"),                  # A saw e0..e3
    (("B",), "c1"),                  # B saw e0, e1
    (("A", "B"), "c1"),              # A's history e0..e3; B present at e0, e1 -> c1
    (("B", "A"), "c1"),              # B's history e0, e1; A present at both -> c1
    (("C", "A"), "c2"),              # C: all; A present at e0..e3 -> c2
    (("A", "C"), "c2"),              # A: e0..e3; C present at all of them, A never saw e4 -> c2
    (("C", "A", "B"), "c1"),         # all -> e0..e3 -> e0, e1
    (("A", "C", "B"), "c1"),         # e0..e3 -> e0..e3 -> e0, e1
    (("B", "C", "A"), "c1"),         # e0, e1 at every level
    (("C", "A", "C", "B"), "c1"),    # order 4: all -> e0..e3 -> e0..e3 -> e0, e1
    (("C", "A", "C", "A"), "c2"),    # order 4: all -> e0..e3 (stays) -> c2
    (("C", "B", "C", "A"), "c1"),    # order 4: all -> e0, e1 (stays) -> c1
])
def test_orders_0_to_4(chain, want):
  assert simulator.belief(_three_agent_story(), chain) == want


def test_second_order_false_belief():
  # e0 B exits (A, B); e1 A moves -> c1 (A only); e2 A exits (A); reality c1.
  # A (first order) is right; B is wrong; A thinks B thinks c0 (A saw B leave before the move).
  # B leaves first, so the innermost history of any chain containing B is [e0] -> c0.
  s = _story(("A", "B"), [ex("B"), mv("A", "c1"), ex("A")])
  assert simulator.belief(s, ("A",)) == "c1"
  assert simulator.belief(s, ("B",)) == "c0"
  assert simulator.belief(s, ("A", "B")) == "c0"
  assert simulator.belief(s, ("B", "A")) == "c0"  # B missed e1, so B assumes A saw no move


def test_enter_sees_later_moves():
  # e0 A exits (A, B); e1 B moves -> c1 (B); e2 A enters (A, B); e3 B moves -> c2 (A, B).
  # A missed e1 but saw e3 after returning: A's history e0, e2, e3 -> c2 (not the "min exit" answer c0).
  s = _story(("A", "B"), [ex("A"), mv("B", "c1"), en("A"), mv("B", "c2")])
  assert simulator.simulate(s)["present"][2] == frozenset({"A", "B"})
  assert simulator.belief(s, ("A",)) == "c2"
  assert simulator.belief(s, ("B", "A")) == "c2"   # B saw A come back at e2, so A saw e3 in B's model
  assert simulator.belief(s, ("A", "B")) == "c2"   # A's history e0, e2, e3; B present at all -> c2


def test_enter_nested_missed_move():
  # Agents A, B, C, init c0.
  # e0 B exits (A,B,C); e1 A moves -> c1 (A,C); e2 B enters (A,B,C); e3 A exits (A,B,C); e4 C moves -> c2 (B,C).
  s = _story(("A", "B", "C"), [ex("B"), mv("A", "c1"), en("B"), ex("A"), mv("C", "c2")])
  assert simulator.belief(s, ()) == "c2"
  assert simulator.belief(s, ("B",)) == "c2"            # B: e0, e2, e3, e4 (missed e1, saw e4)
  assert simulator.belief(s, ("A",)) == "c1"            # A: e0..e3
  assert simulator.belief(s, ("A", "B")) == "c0"        # A: e0..e3 -> B present at e0, e2, e3 -> no move
  assert simulator.belief(s, ("B", "A")) == "c0"        # B: e0, e2, e3, e4 -> A present at e0, e2, e3
  assert simulator.belief(s, ("C", "B")) == "c2"        # C: all -> B present at e0, e2, e3, e4 -> c2
  assert simulator.belief(s, ("C", "A")) == "c1"        # C: all -> A: e0..e3 -> c1
  assert simulator.belief(s, ("C", "B", "A")) == "c0"   # all -> e0, e2, e3, e4 -> e0, e2, e3
  assert simulator.belief(s, ("B", "C", "A")) == "c0"   # e0, e2, e3, e4 -> same -> e0, e2, e3


def test_distractors_change_nothing():
  base = _three_agent_story()
  with_d = list(base.events)
  # Insert distractors everywhere, including by agents who are out of the room and naming containers.
  for pos, d in [(5, ds("B", "c0")), (4, ds("A", "c3", "dislikes")), (2, ds("C", None, "stayed")),
                 (0, ds("B", "c2"))]:
    with_d.insert(pos, d)
  s = _story(base.agents, with_d)
  assert simulator.all_beliefs(s, 4) == simulator.all_beliefs(base, 4)
  assert simulator.simulate(s)["final"] == "c3"


def test_all_beliefs_chains():
  s = _three_agent_story()
  b = simulator.all_beliefs(s, 2)
  # 1 + 3 + 3 * 2 chains with distinct consecutive agents.
  assert len(b) == 10 and () in b and ("A", "B") in b and ("A", "A") not in b
  assert all(b[c] == simulator.belief(s, c) for c in b)
  assert len(simulator.all_beliefs(s, 4)) == 1 + 3 + 6 + 12 + 24


def test_check_reports_disagreements():
  s = _three_agent_story()
  exs = [Example(s, Question(("A", "B")), "c1"), Example(s, Question(("A",)), "c3"),
         Example(s, Question(()), "c3")]
  assert simulator.check(exs) == [(1, "c3", "c2")]
  assert simulator.check([]) == []


# ---------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("events,msg", [
    ([ex("A"), mv("A", "c1")], r"event 1 .*out of the room"),
    ([ex("A"), ex("A")], r"event 1 .*exits but is not in the room"),
    ([en("A")], r"event 0 .*already in the room"),
    ([mv("A", "c1"), mv("B", "nowhere")], r"event 1 .*not in story.containers"),
    ([mv("A", "c0")], r"event 0 .*already is"),
    ([mv("A", "c1"), mv("B", "c1")], r"event 1 .*already is"),
    ([mv("Z", "c1")], r"event 0 .*not in story.agents"),
])
def test_invalid_story_errors(events, msg):
  s = _story(("A", "B"), events)
  for fn in (simulator.simulate, lambda s: simulator.belief(s, ("A",)), lambda s: simulator.all_beliefs(s, 2)):
    with pytest.raises(DataError, match=msg):
      fn(s)
  with pytest.raises(DataError, match=r"example 0: event"):
    simulator.check([Example(s, Question(()), "c0")])


def test_invalid_chain_and_init():
  with pytest.raises(DataError, match="not in story.agents"):
    simulator.belief(_story(("A", "B"), []), ("Z",))
  with pytest.raises(DataError, match="init container"):
    simulator.simulate(_story(("A", "B"), [], init="nowhere"))


# ------------------------------------------------------------------------------------- property (no enter)


def _closed_form(story: Story, chain: tuple[str, ...]) -> str:
  """Reference rule for stories WITHOUT enter events (cross-check only): the location after the last move
  before the earliest exit of any chain agent (the end of the story if none of them leaves)."""
  events = story.events
  exit_at = {e.agent: i for i, e in enumerate(events) if e.kind == "exit"}
  t = min((exit_at.get(a, len(events)) for a in chain), default=len(events))
  loc = story.init
  for e in events[:t]:
    if e.kind == "move":
      loc = e.container
  return loc


@st.composite
def _stories_without_enter(draw) -> Story:
  n_agents = draw(st.integers(2, 4))
  n_cont = draw(st.integers(2, 4))
  agents = tuple(f"a{i}" for i in range(n_agents))
  containers = tuple(f"c{i}" for i in range(n_cont))
  loc = draw(st.sampled_from(containers))
  init = loc
  in_room = list(agents)
  events = []
  for _ in range(draw(st.integers(0, 12))):
    kinds = ["distractor"] + (["move", "exit"] if in_room else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "move":
      c = draw(st.sampled_from([c for c in containers if c != loc]))
      events.append(mv(draw(st.sampled_from(in_room)), c))
      loc = c
    elif kind == "exit":
      a = draw(st.sampled_from(in_room))
      in_room.remove(a)
      events.append(ex(a))
    else:
      events.append(ds(draw(st.sampled_from(agents)), draw(st.sampled_from((None,) + containers))))
  return _story(agents, events, init=init, containers=containers)


@settings(max_examples=300, deadline=None)
@given(_stories_without_enter())
def test_matches_closed_form_without_enter(story):
  beliefs = simulator.all_beliefs(story, 4)
  for chain, got in beliefs.items():
    assert got == _closed_form(story, chain), (chain, story)
  assert beliefs[()] == simulator.simulate(story)["final"]


# ---------------------------------------------------------------------------------- generator cross-check


@pytest.mark.parametrize("mode", ["naive", "shortcut_free"])
def test_generator_labels_agree(mode):
  stories = pytest.importorskip("jaxlab.tom.stories")
  if not hasattr(stories, "generate"):
    pytest.skip("jaxlab.tom.stories has no generate() yet (being written concurrently)")
  examples = stories.generate(10000, seed=0, orders=(0, 1, 2, 3, 4), mode=mode)
  assert len(examples) > 0
  bad = simulator.check(examples)
  assert bad == [], f"{len(bad)} of {len(examples)} labels disagree with the simulator, first: {bad[:5]}"
