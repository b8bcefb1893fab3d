"""A word-level tokenizer for the symbolic ToM renderings (`jaxlab.tom.stories.render(style="symbolic")`).

Every word of the symbolic stories, questions, reasoning traces and answer tags is one token: the
`ByteTokenizer` of the LM core with the words registered as extra specials (" MOVE", " avery", " red_box",
"red_box", " ->", "<think>", ...), so the LM core's sampler, `per_token_logps` and the post-training trainers
work on it unchanged, and decoding gives back the exact text. A symbolic prompt of ten events is about 60
tokens instead of about 300 bytes. Words outside the vocabulary (e.g. a user's English story) still encode, as
bytes; `unknown_bytes` counts them so a caller can refuse such data for a word-level model.

`canonical(example)` renames a story's candidate containers c1..cN (in their candidate order, which the
shortcut-free generator balances for the gold answer) and its agents a1..aK: the symbol vocabulary of the
research notes' ToM-lite task (one token per container and agent of the story), on which a small model learns
the belief rule instead of first having to learn 80 container names.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import dataclasses

from jaxlab.lm.tokenizer import ByteTokenizer
from jaxlab.tom import stories
from jaxlab.tom.types import Event, Example, Question, Story

KEYWORDS = ("INIT", "MOVE", "EXIT", "ENTER", "LIKES", "DISLIKES", "STAY", "|", "||", "Q", "C", "->", "none")
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# Format requests a prompt can end with (" THINK": reason, then answer; " ANSWER": the answer alone); last in the
# vocabulary, so adding them kept every other word's id.
FORMAT_WORDS = (" THINK", " ANSWER")


def vocabulary(containers: Iterable[str] | None = None, agents: Iterable[str] | None = None) -> list[str]:
  """The extra specials: tags, then each keyword / agent / container with a leading space, containers also
  without one (a trace or an answer starts right after a tag), then the format requests."""
  if containers is None:
    named = [f"{c}_{k}" for k in stories.CONTAINER_KINDS for c in stories.COLORS]
    containers = named + [f"c{i + 1}" for i in range(len(named))]
  if agents is None:
    agents = [a.lower() for a in stories.AGENT_NAMES] + [f"a{i + 1}" for i in range(len(stories.AGENT_NAMES))]
  containers, agents = list(dict.fromkeys(containers)), list(dict.fromkeys(agents))
  words = list(TAGS) + ["INIT"] + [" " + w for w in KEYWORDS if w != "INIT"]
  words += [" " + a for a in agents] + [" " + c for c in containers] + containers + list(FORMAT_WORDS)
  return list(dict.fromkeys(words))


def tokenizer(containers: Iterable[str] | None = None, agents: Iterable[str] | None = None) -> ByteTokenizer:
  """The word-level tokenizer (default: every container and agent name the generator can draw)."""
  return ByteTokenizer(extra_specials=vocabulary(containers, agents))


def unknown_bytes(tok: ByteTokenizer, texts: Sequence[str]) -> int:
  """How many tokens of `texts` are raw bytes (words outside the vocabulary; 0 for generated symbolic data)."""
  return sum(sum(1 for i in tok.encode(t) if i < 256) for t in texts)


def canonical(example: Example) -> Example:
  """The example with containers renamed c1..cN (candidate order) and agents a1..aK (story order)."""
  s = example.story
  cm = {c: f"c{i + 1}" for i, c in enumerate(s.containers)}
  am = {a: f"a{i + 1}" for i, a in enumerate(s.agents)}
  cm.update({c: f"c{len(cm) + 1 + i}" for i, c in enumerate(
      dict.fromkeys(e.container for e in s.events if e.container and e.container not in cm))})
  events = tuple(Event(e.kind, am.get(e.agent, e.agent), cm.get(e.container) if e.container else e.container, e.text)
                 for e in s.events)
  story = Story(obj=s.obj, room=s.room, agents=tuple(am[a] for a in s.agents),
                containers=tuple(cm[c] for c in s.containers), init=cm.get(s.init, s.init), events=events)
  return dataclasses.replace(example, story=story, question=Question(tuple(am.get(a, a) for a in example.question.chain)),
                             answer=cm.get(example.answer, example.answer))
