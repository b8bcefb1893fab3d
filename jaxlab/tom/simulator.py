"""An independent brute-force belief simulator for Hi-ToM-style stories (checks generator labels).

It deliberately does not use the closed-form rule of the generator (the object's location at the earliest exit
time of the chain's agents). Instead it simulates the world event by event and computes nested beliefs by
explicit recursion on subjective event histories:

* the world history is every event of the story, each tagged with the set of agents present at it (its
  observers: for "exit" the leaving agent still sees its own exit, for "enter" the returning agent sees its own
  entry);
* agent a's history, inside a model whose history is H, is the subsequence of H whose events a was present for
  (presence is public, so the modelling agent knows who saw each event it saw itself);
* belief(a1, ..., ak) filters the world history by a1, then by a2, ..., then by ak, and replays the innermost
  history from `init`: every move in it puts the object in its container; every event missing from it is
  assumed (default persistence) not to have happened.

`check(examples)` compares gold labels with the simulation; an empty list means 100% agreement.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

from jaxlab.errors import DataError
from jaxlab.tom.types import Example, Story

# A tagged event: (event index in the story, event, frozenset of agents present at it).
Tagged = tuple[int, Any, frozenset]


def _validate_and_tag(story: Story) -> tuple[list[Tagged], list[str]]:
  """Steps through the world, validating each event; returns tagged events and the real location timeline.

  Args:
    story: the story.

  Returns:
    (tagged, locations): `tagged[i]` = (i, event i, agents present at event i); `locations[i]` = the object's
    real container after event i.

  Raises:
    DataError: on an event that cannot happen (see `simulate`).
  """
  if not story.agents:
    raise DataError("story has no agents")
  if len(set(story.agents)) != len(story.agents):
    raise DataError(f"story agents {story.agents} contain duplicates")
  if story.init not in story.containers:
    raise DataError(f"story init container {story.init!r} is not in story.containers {story.containers}")
  in_room = set(story.agents)
  location = story.init
  tagged: list[Tagged] = []
  locations: list[str] = []
  for i, ev in enumerate(story.events):
    where = f"event {i} ({ev.kind} by {ev.agent!r})"
    if ev.kind in ("move", "exit", "enter") and ev.agent not in story.agents:
      raise DataError(f"{where}: agent {ev.agent!r} is not in story.agents {story.agents}")
    if ev.container is not None and ev.container not in story.containers:
      raise DataError(f"{where}: container {ev.container!r} is not in story.containers {story.containers}")
    if ev.kind == "move":
      if ev.agent not in in_room:
        raise DataError(f"{where}: the agent moves the object while out of the room")
      if ev.container == location:
        raise DataError(f"{where}: moves the object to {ev.container!r}, where it already is")
      present = frozenset(in_room)
      location = ev.container
    elif ev.kind == "exit":
      if ev.agent not in in_room:
        raise DataError(f"{where}: the agent exits but is not in the room")
      present = frozenset(in_room)  # the leaving agent sees its own exit
      in_room.discard(ev.agent)
    elif ev.kind == "enter":
      if ev.agent in in_room:
        raise DataError(f"{where}: the agent enters but is already in the room")
      in_room.add(ev.agent)
      present = frozenset(in_room)  # the returning agent sees its own entry
    else:  # distractor: observed by those present, changes nothing
      present = frozenset(in_room)
    tagged.append((i, ev, present))
    locations.append(location)
  return tagged, locations


def simulate(story: Story) -> dict[str, Any]:
  """Simulates the real world of a story event by event.

  Args:
    story: the story to simulate.

  Returns:
    A dict with "locations" (the object's real container after each event), "present" (the frozenset of agents
    in the room at each event, i.e. who observed it), "in_room" (the agents in the room at the end) and
    "final" (the object's real container at the end).

  Raises:
    DataError: one line naming the event index, for a move or exit by an absent agent, an enter by a present
      agent, a container not in story.containers, a move to the current container, or an unknown agent.
  """
  tagged, locations = _validate_and_tag(story)
  in_room = set(story.agents)
  for _, ev, _ in tagged:
    if ev.kind == "exit":
      in_room.discard(ev.agent)
    elif ev.kind == "enter":
      in_room.add(ev.agent)
  return {
      "locations": locations,
      "present": [p for _, _, p in tagged],
      "in_room": frozenset(in_room),
      "final": locations[-1] if locations else story.init,
  }


def _subjective(history: list[Tagged], agent: str) -> list[Tagged]:
  """The part of `history` that `agent` observed (within the model whose history it is)."""
  return [t for t in history if agent in t[2]]


def _nested_history(history: list[Tagged], chain: Sequence[str]) -> list[Tagged]:
  """Recursively filters a history down the chain: a1's view, then a2's view inside it, and so on."""
  if not chain:
    return history
  return _nested_history(_subjective(history, chain[0]), chain[1:])


def _replay(init: str, history: Iterable[Tagged]) -> str:
  """Replays a (subjective) history from `init`; events not in it are assumed not to have happened."""
  location = init
  for _, ev, _ in history:
    if ev.kind == "move":
      location = ev.container
  return location


def _check_chain(story: Story, chain: Sequence[str]):
  for a in chain:
    if a not in story.agents:
      raise DataError(f"chain {tuple(chain)} names {a!r}, who is not in story.agents {story.agents}")


def belief(story: Story, chain: Sequence[str]) -> str:
  """Where a1 thinks a2 thinks ... ak thinks the object is (the real location for the empty chain).

  Args:
    story: the story.
    chain: the agents (a1, ..., ak), outermost first.

  Returns:
    The believed container.

  Raises:
    DataError: if the story is invalid or the chain names an agent not in the story.
  """
  _check_chain(story, chain)
  tagged, _ = _validate_and_tag(story)
  return _replay(story.init, _nested_history(tagged, tuple(chain)))


def all_chains(agents: Sequence[str], max_order: int) -> list[tuple[str, ...]]:
  """Every chain of length 0..max_order whose consecutive agents differ."""
  chains: list[tuple[str, ...]] = []
  for k in range(max_order + 1):
    for c in itertools.product(agents, repeat=k):
      if all(c[j] != c[j + 1] for j in range(k - 1)):
        chains.append(tuple(c))
  return chains


def all_beliefs(story: Story, max_order: int) -> dict[tuple[str, ...], str]:
  """Brute force: the belief of every chain of distinct-consecutive agents of length 0..max_order.

  Args:
    story: the story.
    max_order: the longest chain.

  Returns:
    {chain: believed container}.
  """
  if max_order < 0:
    raise DataError(f"max_order must be >= 0, got {max_order}")
  tagged, _ = _validate_and_tag(story)
  return {c: _replay(story.init, _nested_history(tagged, c)) for c in all_chains(story.agents, max_order)}


def check(examples: Iterable[Example]) -> list[tuple[int, str, str]]:
  """Compares each example's gold answer with the simulated belief.

  Args:
    examples: the labelled examples.

  Returns:
    (index, gold, simulated) for every disagreement; an empty list means 100% agreement.

  Raises:
    DataError: if a story is invalid (the message names the example index too).
  """
  bad: list[tuple[int, str, str]] = []
  cache: dict[int, tuple[Story, list[Tagged]]] = {}  # keeps the story alive so its id is not reused
  for n, ex in enumerate(examples):
    story = ex.story
    try:
      key = id(story)
      if key not in cache or cache[key][0] is not story:
        cache[key] = (story, _validate_and_tag(story)[0])
      _check_chain(story, ex.question.chain)
    except DataError as e:
      raise DataError(f"example {n}: {e}") from e
    sim = _replay(story.init, _nested_history(cache[key][1], tuple(ex.question.chain)))
    if sim != ex.answer:
      bad.append((n, ex.answer, sim))
  return bad
