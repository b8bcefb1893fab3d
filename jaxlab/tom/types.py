"""The shared story / question types of `jaxlab.tom` (Hi-ToM semantics, He et al. 2023).

A story happens in one room holding one object. Every agent in `agents` is in the room at the start and sees
the object in `init`. Events happen in order; an agent sees an event exactly when it is in the room at that
time (it is in the room until its own EXIT event; an ENTER event brings an agent that left back in, and it then
sees the events after it, not those it missed). Event kinds:

* "move": `agent` (in the room) moves the object to `container` (a container other than the current one);
* "exit": `agent` leaves the room; "enter": `agent` comes back;
* "distractor": a sentence that changes nothing (e.g. "Avery likes the red_box", "Avery made no movements and
  stayed in the room for 1 minute"); `container` may name a container (that is the point: it breaks "last
  container mentioned"), `text` holds the sentence kind ("likes", "stayed", "dislikes").

A question's `chain` (a1, ..., ak) asks "where does a1 think a2 thinks ... ak thinks the object is"; k = 0
(the empty chain) asks where the object really is. Public observation, no deception: agents know who was in the
room at each event they saw themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

EVENT_KINDS = ("move", "exit", "enter", "distractor")


@dataclasses.dataclass(frozen=True)
class Event:
  kind: str
  agent: str
  container: str | None = None
  text: str | None = None

  def __post_init__(self):
    if self.kind not in EVENT_KINDS:
      raise ValueError(f"Event kind {self.kind!r} is not one of {EVENT_KINDS}")
    if self.kind == "move" and not self.container:
      raise ValueError("a move event needs a container")


@dataclasses.dataclass(frozen=True)
class Story:
  obj: str
  room: str
  agents: tuple[str, ...]
  containers: tuple[str, ...]        # the answer candidates (every container the story may name)
  init: str                          # the object's container at the start
  events: tuple[Event, ...]


@dataclasses.dataclass(frozen=True)
class Question:
  chain: tuple[str, ...]             # () = reality; (a1,) = first order; ...

  @property
  def order(self) -> int:
    return len(self.chain)


@dataclasses.dataclass(frozen=True)
class Example:
  story: Story
  question: Question
  answer: str                        # the gold container
  meta: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)
