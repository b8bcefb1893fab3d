"""Hi-ToM-style stories and belief questions: a closed-form answer rule, a generator, renderers.

Stories follow `jaxlab.tom.types` (He et al. 2023, Hi-ToM semantics): every agent is in the room at the start
and sees the object's initial container, MOVE events move the object, an agent sees nothing after its own
EXIT, and distractor sentences ("Avery likes the red_box", "Avery made no movements and stayed in the room
for 1 minute") change nothing. Without ENTER events the answer to "where does a1 think a2 thinks ... ak thinks
the object is" has a closed form: the object's location after the last move before
`T = min_i exit_time(a_i)` (`T = infinity` for the empty chain, i.e. the real location). `answer` implements
this rule; `jaxlab.tom.simulator` is the independent brute-force check that also handles ENTER events.

`generate` has two modes:

* "naive": the shortcut-prone data the paper warns about (Zhong et al., "From Shortcuts to
  Reasoning", ICML 2026, arXiv 2606.09092). False-belief originals are rare (`naive_false_belief_rate`) and always come
  from the critical chain agent leaving before the first move (so the answer is the first-mentioned
  container); true beliefs are the final location and no distractor names a container (so the answer is the
  last-mentioned container). Naive twins keep that structure (the exit moves to the very start / end), so
  with twins about half the order >= 1 questions are false beliefs, all answered by "first mentioned".
* "shortcut_free" (ours, the operationalisation in that section): random stories with distractors that name
  uniformly random containers, also after the last move; true vs false belief 50/50 per order (orders >= 1);
  random agent and container names; and a greedy best-of-k selection among candidate stories (kernel-herding
  style) that keeps, per (order, false_belief) stratum, the hit rate of each probe in `HEURISTICS` (first /
  last / most-mentioned container with either tie rule, container nearest to the first or last chain
  agent's mention counted in events or in English words, and `jaxlab.tom.audit`'s rule: nearest to the last
  event naming the innermost agent) at 1 / num_containers; each gold container is also
  put in the least used candidate slot of its stratum (so "majority answer" is at chance too). With
  `distractors=False` nothing follows the last move and "last mentioned" is no longer balanced.

  The moves alone say nothing about a false-belief answer beyond "not the final location": a story is
  first drawn without its EXIT events, in which the critical chain agent (the one whose exit decides the
  belief; it always leaves, after the last move for a true belief) acts only early, after which the object
  visits every container (given num_containers - 1 moves or more); candidates are compared
  on their heuristic hit rates averaged over the false-belief answer still to be drawn; only then is that
  answer drawn uniformly among the containers other than the final one and the agent's exit put after a
  visit of it (where it balances the heuristics best). So a false-belief answer is uniform over those
  num_containers - 1 containers given the story without exits, whatever the selection, and
  `jaxlab.tom.audit`'s probe on that story (`learned:no_exits`) can at best rule out the final location:
  1 / (num_containers - 1), 0.2 with 6 containers (chance 1/6 + 0.033; measured 0.17-0.21).

With `twins=True` every example is followed by its counterfactual twin: the same story with ONE causal fact
toggled (a chain agent's exit moved before / after the critical move, or a witnessed move added / removed)
so that the gold answer changes; both share `meta["twin_id"]`. In shortcut-free mode a false-belief question
and its twin differ only in where the critical agent leaves (so they share the story without exits).

`render` writes a prompt in a symbolic ("INIT red_box | MOVE avery blue_box | EXIT avery || Q avery") or a
Hi-ToM-like English form, `render_trace` the witnessed locations up to T (the Thinking arm's trace), and
`to_records` / `write_jsonl` the `{"prompt", "completion", ...}` records of `jaxlab.lm.sft_data`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxlab.errors import ConfigError, DataError
from jaxlab.tom.types import Event, Example, Question, Story

AGENT_NAMES = ("Avery", "Ella", "Jack", "Mia", "Liam", "Noah", "Owen", "Chloe", "Lucas", "Isla", "Jacob",
               "Olivia", "Emma", "Logan", "Aria", "Ethan", "Harper", "Mason", "Zoe", "Amelia")
COLORS = ("red", "blue", "green", "yellow", "purple", "white", "black", "orange")
CONTAINER_KINDS = ("box", "basket", "crate", "drawer", "suitcase", "bucket", "cupboard", "bathtub",
                   "envelope", "treasure_chest")
OBJECTS = ("lettuce", "apple", "banana", "carrot", "orange", "pumpkin", "onion", "potato", "peach", "grapes",
           "hat", "scarf", "watermelon", "eggplant", "lime")
ROOMS = ("living_room", "kitchen", "garden", "bedroom", "hallway", "cellar", "attic", "office", "workshop",
         "porch")
MODES = ("shortcut_free", "naive")
STYLES = ("symbolic", "english")
HEURISTICS = ("first", "last", "most_first_tie", "most_last_tie", "nearest_first_agent", "nearest_last_agent",
              "nearest_first_agent_words", "nearest_last_agent_words", "nearest_last_agent_final")

_INF = math.inf


class _Draws:
  """Fast scalar draws from a numpy Generator (uniforms drawn in blocks; deterministic given the Generator)."""

  def __init__(self, rng: _Draws, block: int = 8192):
    self._rng, self._block = rng, block
    self._buf: list[float] = []
    self._i = 0

  def random(self) -> float:
    i = self._i
    if i >= len(self._buf):
      self._buf, i = self._rng.random(self._block).tolist(), 0
    self._i = i + 1
    return self._buf[i]

  def integers(self, lo: int, hi: int | None = None) -> int:
    """Uniform int in [0, lo) or [lo, hi) (like Generator.integers)."""
    if hi is None:
      lo, hi = 0, lo
    k = int(self.random() * (hi - lo))
    return lo + (k if k < hi - lo else hi - lo - 1)

  def shuffle(self, xs: list) -> None:
    for i in range(len(xs) - 1, 0, -1):
      j = self.integers(i + 1)
      xs[i], xs[j] = xs[j], xs[i]

  def permutation(self, n: int) -> list[int]:
    xs = list(range(n))
    self.shuffle(xs)
    return xs

  def sample(self, n: int, k: int) -> list[int]:
    """k distinct ints of [0, n) in random order (a partial Fisher-Yates shuffle)."""
    xs = list(range(n))
    for i in range(k):
      j = self.integers(i, n)
      xs[i], xs[j] = xs[j], xs[i]
    return xs[:k]


def _chain_of(chain: Question | Sequence[str]) -> tuple[str, ...]:
  return tuple(chain.chain) if isinstance(chain, Question) else tuple(chain)


def answer(story: Story, chain: Question | Sequence[str]) -> str:
  """The gold container by the closed-form Hi-ToM rule (stories without ENTER events only).

  Args:
    story: a story whose events are moves, exits and distractors.
    chain: the question's agents (a1, ..., ak) or a `Question`; () asks for the real location.

  Returns:
    The object's container after the last move before T = min over the chain's agents of their exit time.

  Raises:
    ValueError: the story has ENTER events (use `jaxlab.tom.simulator`).
    DataError: a chain agent is not one of the story's agents.
  """
  chain = _chain_of(chain)
  for a in chain:
    if a not in story.agents:
      raise DataError(f"chain agent {a!r} is not in the story's agents {story.agents}; ask about a story agent")
  if any(e.kind == "enter" for e in story.events):
    raise ValueError("answer() handles stories without enter events; use jaxlab.tom.simulator")
  t = _INF
  for i, e in enumerate(story.events):
    if e.kind == "exit" and e.agent in chain:
      t = i
      break
  loc = story.init
  for i, e in enumerate(story.events):
    if i >= t:
      break
    if e.kind == "move":
      loc = e.container
  return loc


def witnessed_path(story: Story, chain: Question | Sequence[str]) -> list[str]:
  """The initial container then every move's container before T (see `answer`); the last entry is the answer."""
  chain = _chain_of(chain)
  if any(e.kind == "enter" for e in story.events):
    raise ValueError("witnessed_path() handles stories without enter events; use jaxlab.tom.simulator")
  path = [story.init]
  for e in story.events:
    if e.kind == "exit" and e.agent in chain:
      break
    if e.kind == "move":
      path.append(e.container)
  return path


def container_mentions(story: Story) -> list[tuple[int, str]]:
  """(position, container) of every container mention: the initial one at 0, event i at position i + 1."""
  out = [(0, story.init)]
  for i, e in enumerate(story.events):
    if e.container is not None:
      out.append((i + 1, e.container))
  return out


def answer_position(story: Story, gold: str) -> str:
  """Where `gold` is mentioned: "first", "last", "first_and_last", "middle" or "absent"."""
  names = [c for _, c in container_mentions(story)]
  first, last = names[0] == gold, names[-1] == gold
  if first and last:
    return "first_and_last"
  if first:
    return "first"
  if last:
    return "last"
  return "middle" if gold in names else "absent"


# ----------------------------------------------------------------------------------------------------------
# Generation works on an integer form of a story for speed: events are (kind, agent, container, text) tuples
# with agent / container indices (-1 = none); names are attached at the end.

_MOVE, _EXIT, _DIS = "move", "exit", "distractor"


def _locations(init: int, events: list[tuple]) -> list[int]:
  """loc[i] = the object's container just before event i (len(events) + 1 entries)."""
  loc, out = init, []
  for kind, _, c, _ in events:
    out.append(loc)
    if kind == _MOVE:
      loc = c
  out.append(loc)
  return out


def _gold(init: int, events: list[tuple], chain: tuple[int, ...]) -> tuple[int, float]:
  """(gold container, T) by the closed-form rule (see `answer`)."""
  members = set(chain)
  t = next((i for i, (kind, a, _, _) in enumerate(events) if kind == _EXIT and a in members), _INF)
  loc = init
  for i, (kind, _, c, _) in enumerate(events):
    if i >= t:
      break
    if kind == _MOVE:
      loc = c
  return loc, t


# Words per English sentence (`event_sentence`): the agent is the first word, a container the last one.
_WORDS = {"move": 7, "exit": 4, "enter": 4, "likes": 4, "dislikes": 4, "stayed": 12}


def _nearest(pos: list[int], cont: list[int], apos: list[int], default: int) -> int:
  """The container cont[i] whose (sorted, distinct) position pos[i] is nearest to one of the positions `apos`
  (ties: the earlier mention)."""
  best, best_d, best_p, n = default, _INF, _INF, len(pos)
  for q in apos:
    k = bisect.bisect_left(pos, q)
    if k < n and (pos[k] - q < best_d or pos[k] - q == best_d and pos[k] < best_p):
      best, best_d, best_p = cont[k], pos[k] - q, pos[k]
    if k and (q - pos[k - 1] < best_d or q - pos[k - 1] == best_d and pos[k - 1] < best_p):
      best, best_d, best_p = cont[k - 1], q - pos[k - 1], pos[k - 1]
  return best


def _picks(init: int, events: list[tuple], chain: tuple[int, ...], num_agents: int) -> tuple[int, ...]:
  """The container each heuristic probe (HEURISTICS) picks.

  Mentions are counted on the event sequence (the initial container at 0, event i at i + 1); "nearest" is
  measured both in events and in English words (`render(..., "english")`, the agent list first).
  """
  mpos, cont, counts = [0], [init], {init: 1}
  # English word positions: "A, B, C and D entered the R. The O is in the C. <events>"
  pos = num_agents + 10
  wpos = [pos - 1]
  a0, a1 = (chain[0], chain[-1]) if chain else (-1, -1)
  e0, e1, w0, w1 = [], [], [a0], [a1]
  for i, (kind, a, c, text) in enumerate(events, 1):
    n = _WORDS.get(text, 4) if kind == _DIS else _WORDS[kind]
    if a == a0:
      e0.append(i)
      w0.append(pos)
    if a == a1:
      e1.append(i)
      w1.append(pos)
    if c >= 0:
      mpos.append(i)
      wpos.append(pos + n - 1)
      cont.append(c)
      counts[c] = counts.get(c, 0) + 1
    pos += n
  first, last = init, cont[-1]
  top = max(counts.values())
  tied = [c for c in cont if counts[c] == top]
  if not chain:
    return (first, last, tied[0], tied[-1], first, first, first, first, last)
  n0, m0 = _nearest(mpos, cont, e0, first), _nearest(wpos, cont, w0, first)
  n1, m1 = (n0, m0) if a1 == a0 else (_nearest(mpos, cont, e1, first), _nearest(wpos, cont, w1, first))
  # the last one is jaxlab.tom.audit's rule: nearest to the LAST event naming the innermost agent
  return (first, last, tied[0], tied[-1], n0, n1, m0, m1, _nearest(mpos, cont, e1[-1:], last))


def _flags(init: int, events: list[tuple], chain: tuple[int, ...], gold: int,
           num_agents: int) -> tuple[int, ...]:
  """Which heuristic probes (HEURISTICS) pick the gold container (see `_picks`)."""
  return tuple(int(x == gold) for x in _picks(init, events, chain, num_agents))


def _random_chain(rng: _Draws, order: int, num_agents: int) -> tuple[int, ...]:
  chain = [rng.integers(num_agents)] if order else []
  while len(chain) < order:
    a = rng.integers(num_agents - 1)
    chain.append(a if a < chain[-1] else a + 1)
  return tuple(chain)


def _new_target(rng: _Draws, num_containers: int, avoid: set[int]) -> int:
  choices = [c for c in range(num_containers) if c not in avoid]
  return choices[rng.integers(len(choices))]


def _distractor(rng: _Draws, present: list[int], num_agents: int, num_containers: int,
                with_container: bool) -> tuple:
  if with_container or not present:
    kind = "likes" if rng.random() < 0.7 else "dislikes"
    return (_DIS, rng.integers(num_agents), rng.integers(num_containers), kind)
  return (_DIS, present[rng.integers(len(present))], -1, "stayed")


def _present_at(events: list[tuple], i: int, num_agents: int) -> list[int]:
  gone = {a for kind, a, _, _ in events[:i] if kind == _EXIT}
  return [a for a in range(num_agents) if a not in gone]


def _valid(init: int, events: list[tuple], num_agents: int) -> bool:
  """Movers are in the room, moves change the container, each agent exits at most once."""
  loc, gone = init, set()
  for kind, a, c, text in events:
    if kind == _MOVE:
      if a in gone or c == loc:
        return False
      loc = c
    elif kind == _EXIT:
      if a in gone:
        return False
      gone.add(a)
    elif text == "stayed" and a in gone:
      return False
  return True


def _sf_view(rng: _Draws, cfg: dict, order: int):
  """The exit-free part ("view") of a shortcut-free story: (init, view events, chain, crit, n_exit).

  `crit` is the chain agent whose exit decides a false belief (-1 for order 0); n_exit counts its exit. It
  moves only among the first `s` moves (move s itself half the time, so that it acts before leaving, as in
  Hi-ToM) and never "stays", and the locations from move `s` on visit every container (when there are enough
  moves), so that its exit can be put after a visit of ANY container other than the final one. Distractors
  after the last move are by a chain agent half the time (a heuristic keyed on the queried agent's last
  mention then points at a random container).
  """
  na, nc, ne = cfg["num_agents"], cfg["num_containers"], cfg["num_events"]
  chain = _random_chain(rng, order, na)
  lo = 1 if order else 0   # the critical chain agent always leaves (after the last move for a true belief)
  n_exit = rng.integers(lo, max(min(na - 1, ne - 1), lo) + 1)
  k = ne - n_exit
  crit = chain[rng.integers(order)] if order else -1
  s = rng.integers(max(k - nc + 1, 0) + 1)
  others = [a for a in range(na) if a != crit] or [crit]
  init = rng.integers(nc)
  left = set(range(nc))
  if s == 0:
    left.discard(init)
  loc, events = init, []
  for p in range(1, k + 1):
    if p < s:
      loc = _new_target(rng, nc, {loc})
    else:   # from move s on: a random walk that still visits every container by move k
      choices = [c for c in left if c != loc] if len(left) >= k - p + 1 else []
      loc = choices[rng.integers(len(choices))] if choices else _new_target(rng, nc, {loc})
      left.discard(loc)
    if p > s:
      a = others[rng.integers(len(others))]
    else:
      a = crit if p == s and rng.random() < 0.5 else rng.integers(na)
    events.append((_MOVE, a, loc, None))
  if cfg["distractors"]:
    for _ in range(rng.integers(0, cfg["max_distractors"] + 1)):
      pos = rng.integers(len(events) + 1)
      events.insert(pos, _distractor(rng, others, na, nc, rng.random() < 0.75))
    last_move = max(i for i, e in enumerate(events) if e[0] == _MOVE)
    for _ in range(rng.integers(1, 3)):
      pos = rng.integers(last_move + 1, len(events) + 1)
      # The very last container mention is uniform over all containers ("last mentioned" is at chance).
      d = _distractor(rng, others, na, nc, True)
      if chain and rng.random() < 0.5:
        d = (d[0], chain[rng.integers(order)], d[2], d[3])
      events.insert(pos, d)
  return init, events, chain, crit, n_exit


def _with_exits(view: list[tuple], exits: list[tuple[int, int]]) -> list[tuple]:
  """The view with (gap, agent) exits inserted (gap g: just before view[g]; same gap: in list order)."""
  at: dict[int, list[int]] = {}
  for g, a in exits:
    at.setdefault(g, []).append(a)
  out = []
  for g in range(len(view) + 1):
    out += [(_EXIT, a, -1, None) for a in at.get(g, ())]
    if g < len(view):
      out.append(view[g])
  return out


def _sf_pair(rng: _Draws, cfg: dict, order: int, want_fb: bool, twin_fb: bool | None):
  """A shortcut-free candidate for the original (and its twin: `twin_fb` asks for a false- or true-belief one,
  None for none), or None.

  Returns `("fixed", init, events, chain, twin)` when every answer is already known, or `("open", init, chain,
  cand)` when a false-belief answer is still to be drawn (`_sf_draw_answers`, after the candidate is picked):
  uniformly from the containers the critical chain agent can have last seen before it leaves (every container
  but the final one, see `_sf_view`), so that the story without its exits says nothing about which
  non-final container it is; `_sf_open_events` then puts the exit after a visit of it. A twin of (or that is)
  a false-belief question only moves that agent's exit; a true-belief pair adds or removes a move.
  """
  na = cfg["num_agents"]
  init, view, chain, crit, n_exit = _sf_view(rng, cfg, order)
  last_act = [-1] * na
  for i, (kind, a, _, text) in enumerate(view):
    if kind == _MOVE or text == "stayed":
      last_act[a] = i
  last_move = max(i for i, e in enumerate(view) if e[0] == _MOVE)
  pool = [a for a in range(na) if a != crit]
  exits = []
  for a in rng.sample(len(pool), n_exit - (crit >= 0)):
    a = pool[a]
    lo = max(last_act[a], last_move if a in chain else -1) + 1   # other chain agents leave after the last move
    exits.append((rng.integers(lo, len(view) + 1), a))
  if crit < 0:
    events = _with_exits(view, exits)
    twin = _twin(rng, cfg, init, events, chain) if twin_fb is not None else None
    return ("fixed", init, events, chain, twin) if twin or twin_fb is None else None
  locs = _locations(init, view)   # locs[g]: the location at gap g (just before view[g])
  gaps: dict[int, list[int]] = {}
  for g in range(last_act[crit] + 1, last_move + 1):
    if locs[g] != locs[-1]:
      gaps.setdefault(locs[g], []).append(g)
  tail = list(range(max(last_move, last_act[crit]) + 1, len(view) + 1))
  if want_fb and not gaps:
    return None
  if twin_fb and len(gaps) < 1 + want_fb:
    twin_fb = False
  if not want_fb and not twin_fb:   # true belief only: the exit after the last move
    events = _with_exits(view, exits + [(tail[rng.integers(len(tail))], crit)])
    if twin_fb is None:
      return "fixed", init, events, chain, None
    twin = _twin(rng, cfg, init, events, chain, allowed=("add_move", "remove_move"))
    return ("fixed", init, events, chain, twin) if twin else None
  roles = [want_fb] + ([twin_fb] if twin_fb is not None else [])
  base = _with_exits(view, exits)
  at = [i for i, e in enumerate(base) if e[0] != _EXIT] + [len(base)]   # at[g]: where view[g] is in base
  # gaps where something (a distractor, another exit) separates the exit from the move before it
  spaced = {g for g in range(1, len(view) + 1) if view[g - 1][0] != _MOVE} | {g for g, _ in exits}
  cand = {"base": base, "at": at, "crit": crit, "gaps": gaps, "roles": roles, "spaced": spaced,
          "tail": [tail[rng.integers(len(tail))] for _ in roles]}
  return "open", init, chain, cand


def _sf_events(cand: dict, g: int) -> list[tuple]:
  """The events of an "open" candidate with the critical chain agent's exit at gap `g` of its view."""
  i = cand["at"][g]
  return cand["base"][:i] + [(_EXIT, cand["crit"], -1, None)] + cand["base"][i:]


def _sf_expected_flags(rng: _Draws, cand: dict, init: int, chain: tuple[int, ...], num_agents: int
                       ) -> list[float]:
  """Mean heuristic flags of a false-belief role of an "open" candidate over its possible answers (one exit
  position each, preferably one that something separates from the move before it)."""
  tot = [0] * len(HEURISTICS)
  for c, gs in cand["gaps"].items():
    gs = [g for g in gs if g in cand["spaced"]] or gs
    picks = _picks(init, _sf_events(cand, gs[rng.integers(len(gs))]), chain, num_agents)
    tot = [t + (p == c) for t, p in zip(tot, picks)]
  return [t / len(cand["gaps"]) for t in tot]


def _sf_open_events(rng: _Draws, cand: dict, answers: Sequence[int], max_options: int = 4
                    ) -> list[list[tuple[int, list[tuple]]]]:
  """For each role of an "open" candidate: its [(gap of the critical exit, events), ...] options.

  A false-belief role gets `answers[i]` (a key of `cand["gaps"]`) as its answer, with up to `max_options` exit
  positions after a visit of it; a true-belief role its exit after the last move.
  """
  out = []
  for role, fb in enumerate(cand["roles"]):
    gs = cand["gaps"][answers[role]] if fb else [cand["tail"][role]]
    if len(gs) > max_options:
      gs = [gs[i] for i in rng.sample(len(gs), max_options)]
    out.append([(g, _sf_events(cand, g)) for g in gs])
  return out


def _sf_draw_answers(rng: _Draws, cand: dict) -> list[int]:
  """Uniform false-belief answers for the roles of an "open" candidate (distinct for a false-belief pair;
  -1 for a true-belief role)."""
  cs = sorted(cand["gaps"])
  out = []
  for fb in cand["roles"]:
    left = [c for c in cs if c not in out] if fb else []
    out.append(left[rng.integers(len(left))] if left else -1)
  return out


def _twin(rng: _Draws, cfg: dict, init: int, events: list[tuple], chain: tuple[int, ...],
          naive: bool = False, allowed: Sequence[str] | None = None):
  """A counterfactual twin (events', description) toggling one causal fact so the answer changes, or None.

  `allowed` restricts the kinds of edit ("exit_later", "exit_earlier", "remove_move", "add_move").
  """
  na, nc = cfg["num_agents"], cfg["num_containers"]
  gold, t = _gold(init, events, chain)
  moves = [i for i, e in enumerate(events) if e[0] == _MOVE]
  before = [i for i in moves if i < t]
  crit = before[-1] if before else None
  options = []
  # (a) the critical chain agent stays for the next move: its exit moves right after that move.
  if t != _INF:
    after = [i for i in moves if i > t]
    if after:
      options.append("exit_later")
  # (b) a chain agent leaves right before the critical move (it made no move from there on).
  if crit is not None:
    cands = [a for a in set(chain) if not any(e[0] == _MOVE and e[1] == a for e in events[crit:])]
    if cands:
      options.append("exit_earlier")
  # (c) remove the critical move; (d) add a witnessed move just before T.
  if crit is not None and len(moves) >= 2:
    options.append("remove_move")
  options.append("add_move")
  if allowed is not None:
    options = [o for o in options if o in allowed]
  if naive:
    options = ["exit_later"] if "exit_later" in options else (
        ["exit_earlier"] if "exit_earlier" in options else options)
  rng.shuffle(options)
  for opt in options:
    ev = list(events)
    if opt == "exit_later":
      crit_agent = events[t][1]
      nxt = next(i for i in moves if i > t)
      del ev[t]
      ev.insert(nxt if not naive else len(ev), events[t])
      desc = f"exit_later:{crit_agent}"
    elif opt == "exit_earlier":
      cands = sorted(a for a in set(chain) if not any(e[0] == _MOVE and e[1] == a for e in events[crit:]))
      a = cands[rng.integers(len(cands))]
      ev = [e for e in ev if not (e[0] == _EXIT and e[1] == a)]   # its exit (if any) came after crit
      pos = moves[0] if naive else crit
      ev.insert(pos, (_EXIT, a, -1, None))
      desc = f"exit_earlier:{a}"
    elif opt == "remove_move":
      del ev[crit]
      desc = "remove_move"
    else:
      lo = crit + 1 if crit is not None else 0
      if t != _INF:
        hi = t
      elif naive:
        lo = hi = len(ev)
      else:   # keep a container-naming distractor after the new move when there is one
        ment = [i for i, e in enumerate(ev) if e[0] == _DIS and e[2] >= 0 and i >= lo]
        hi = ment[-1] if ment else len(ev)
      pos = rng.integers(lo, hi + 1)
      present = _present_at(ev, pos, na)
      if not present:
        continue
      loc = _locations(init, ev)[pos]
      nxt = next((e[2] for e in ev[pos:] if e[0] == _MOVE), -1)
      c = _new_target(rng, nc, {loc, nxt})
      ev.insert(pos, (_MOVE, present[rng.integers(len(present))], c, None))
      desc = "add_move"
    if not _valid(init, ev, na):
      continue
    if _gold(init, ev, chain)[0] != gold:
      return ev, desc
  return None


def _naive_story(rng: _Draws, cfg: dict, order: int):
  """One naive-mode (init, events, chain): false beliefs rare, first / last mention answers (module doc)."""
  na, nc, ne = cfg["num_agents"], cfg["num_containers"], cfg["num_events"]
  chain = _random_chain(rng, order, na)
  fb = bool(order) and rng.random() < cfg["naive_false_belief_rate"]
  crit = chain[rng.integers(len(chain))] if chain else -1
  others = [a for a in range(na) if a not in chain]
  movers = others or [a for a in range(na) if a != crit]
  n_exit = rng.integers(0, len(others) + 1) if others else 0
  n_move = max(ne - n_exit - int(fb), 1)
  init = rng.integers(nc)
  loc, events = init, []
  if fb:
    events.append((_EXIT, crit, -1, None))
  for _ in range(n_move):
    loc = _new_target(rng, nc, {loc})
    events.append((_MOVE, movers[rng.integers(len(movers))], loc, None))
  if cfg["distractors"]:
    for _ in range(rng.integers(0, cfg["max_distractors"] + 1)):
      pos = rng.integers(len(events) + 1)
      events.insert(pos, (_DIS, movers[rng.integers(len(movers))], -1, "stayed"))
  for i in rng.sample(len(others), n_exit):
    events.append((_EXIT, others[i], -1, None))
  return init, events, chain


def _to_story(init: int, events: list[tuple], agents: list[str], names: list[str], candidates: list[str],
              obj: str, room: str) -> Story:
  """The named Story: abstract container c is called names[c]; `candidates` is the answer-choice order."""
  ev = tuple(Event(kind, agents[a], names[c] if c >= 0 else None, text) for kind, a, c, text in events)
  return Story(obj=obj, room=room, agents=tuple(agents), containers=tuple(candidates), init=names[init],
               events=ev)


def generate(n: int, *, seed: int, mode: str = "shortcut_free", orders: Sequence[int] = (0, 1, 2),
             num_agents: int = 4, num_containers: int = 6, num_events: int = 10, distractors: bool = True,
             twins: bool = True, max_distractors: int = 4, candidates_per_example: int = 12,
             naive_false_belief_rate: float = 0.15) -> list[Example]:
  """Hi-ToM-style belief questions (module docstring), deterministic given `seed`.

  Args:
    n: number of examples (with twins: n // 2 pairs, plus one unpaired original when n is odd).
    seed: numpy seed.
    mode: "shortcut_free" (balanced, distractors after the last move) or "naive" (shortcut-prone).
    orders: question orders to draw from uniformly (0 = the real location, k = k nested beliefs).
    num_agents: agents per story (>= max(orders); chains repeat no agent twice in a row).
    num_containers: candidate containers per story (>= 3); chance = 1 / num_containers.
    num_events: MOVE + EXIT events per story (distractors come on top).
    distractors: add distractor sentences ("likes" / "dislikes" / "stayed").
    twins: follow every example by its counterfactual twin (same `meta["twin_id"]`).
    max_distractors: distractors placed anywhere (shortcut-free mode adds 1-2 more after the last move).
    candidates_per_example: shortcut-free mode picks the best of this many candidates for balance.
    naive_false_belief_rate: naive mode's rate of false-belief originals (orders >= 1).

  Returns:
    list of n `Example`s with meta "order", "false_belief", "mode", "twin_id", "twin_role", "twin_fact",
    "answer_position", "question_type" ("belief") and "index".

  Raises:
    ConfigError: a bad mode, order, count or size.
  """
  if mode not in MODES:
    raise ConfigError(f"mode={mode!r} is not one of {MODES}; pick one of them")
  orders = tuple(int(o) for o in orders)
  if not orders or min(orders) < 0:
    raise ConfigError(f"orders={orders} must be a non-empty list of integers >= 0")
  if n < 0:
    raise ConfigError(f"n={n} must be >= 0")
  if num_containers < 3 or num_containers > len(COLORS) * len(CONTAINER_KINDS):
    raise ConfigError(f"num_containers={num_containers} must be in [3, {len(COLORS) * len(CONTAINER_KINDS)}]")
  if num_agents < max(max(orders), 1) or num_agents > len(AGENT_NAMES):
    raise ConfigError(f"num_agents={num_agents} must be in [max(orders, 1)={max(max(orders), 1)}, "
                      f"{len(AGENT_NAMES)}]; raise num_agents or drop the high orders")
  if num_events < 2:
    raise ConfigError(f"num_events={num_events} must be >= 2 (room for a move and an exit)")
  if candidates_per_example < 1:
    raise ConfigError(f"candidates_per_example={candidates_per_example} must be >= 1")
  cfg = dict(num_agents=num_agents, num_containers=num_containers, num_events=num_events,
             distractors=distractors, max_distractors=max_distractors,
             naive_false_belief_rate=naive_false_belief_rate)
  rng = _Draws(np.random.default_rng(seed))
  all_containers = [f"{c}_{k}" for k in CONTAINER_KINDS for c in COLORS]
  naive = mode == "naive"
  chance = 1.0 / num_containers
  hits: dict[tuple[int, bool], list[int]] = {}
  counts: dict[tuple[int, bool], int] = {}
  slot_counts: dict[tuple[int, bool], list[int]] = {}
  fb_count: dict[int, list[int]] = {o: [0, 0] for o in orders}   # [false-belief, total] per order
  out: list[Example] = []
  pair_id = 0

  def cost_delta(members) -> float:
    """Change of the sum of squared deviations (hits - chance * count) the members would make."""
    delta = 0.0
    for order, fb, flags in members:
      key = (order, fb)
      h = hits.get(key) or [0] * len(HEURISTICS)
      base = chance * counts.get(key, 0)
      for hk, f in zip(h, flags):
        d_old = hk - base
        d_new = d_old + f - chance
        delta += d_new * d_new - d_old * d_old
    return delta

  def evaluate(init, chain, variants):
    """(order, false_belief, heuristic flags) of each variant story."""
    members = []
    for ev in variants:
      gold = _gold(init, ev, chain)[0]
      members.append((len(chain), gold != _locations(init, ev)[-1], _flags(init, ev, chain, gold, num_agents)))
    return members

  while len(out) < n:
    order = orders[rng.integers(len(orders))]
    with_twin = twins and n - len(out) >= 2
    best = None
    tries = 0
    want_fb = bool(order) and fb_count[order][0] * 2 < fb_count[order][1] + (rng.random() < 0.5)
    twin_fb = (rng.random() < 0.5) if with_twin and not naive else None
    n_cand = 1 if naive else candidates_per_example
    while (best is None or tries < n_cand) and tries < 50 * n_cand:
      tries += 1
      if naive:
        cand = _naive_story(rng, cfg, order)
        twin = _twin(rng, cfg, *cand, naive) if with_twin else None
        if with_twin and twin is None:
          continue
        cand = ("fixed", *cand, twin)
      else:
        cand = _sf_pair(rng, cfg, order, want_fb, twin_fb)
        if cand is None:
          continue
      if cand[0] == "fixed":
        _, init, events, chain, twin = cand
        members = evaluate(init, chain, [events] + ([twin[0]] if twin else []))
      else:   # false-belief roles are scored on their mean flags over the answer still to be drawn, so the
        # selection cannot favour one answer over another given the story without exits
        _, init, chain, hidden = cand
        mean = None
        members = []
        for role, fb in enumerate(hidden["roles"]):
          if fb:
            mean = mean or _sf_expected_flags(rng, hidden, init, chain, num_agents)
            members.append((order, True, mean))
          else:
            members += evaluate(init, chain, [_sf_events(hidden, hidden["tail"][role])])
      score = 0.0 if naive else cost_delta(members)
      if not naive:
        for _, fb, _ in members:   # keep false vs true belief near 50/50 per order
          if order:
            f, t = fb_count[order]
            score += ((f + fb) - (t + 1) / 2) ** 2 - (f - t / 2) ** 2
      if best is None or score < best[0]:
        best = (score, cand, members)
    if best is None:
      raise ConfigError(f"could not generate a story for order {order} with num_agents={num_agents}, "
                        f"num_events={num_events}; raise num_events or num_agents")
    _, cand, members = best
    if cand[0] == "fixed":
      _, init, events, chain, twin = cand
    else:   # draw the false-belief answers now, then put the exits where they balance the heuristics best
      _, init, chain, hidden = cand
      golds = _sf_draw_answers(rng, hidden)
      opts = _sf_open_events(rng, hidden, golds)
      flags = [[evaluate(init, chain, [ev])[0] for _, ev in o] for o in opts]
      combos = itertools.product(*[range(len(o)) for o in opts])
      pick = min(combos, key=lambda ij: cost_delta([flags[r][k] for r, k in enumerate(ij)]))
      members = [flags[r][k] for r, k in enumerate(pick)]
      events = opts[0][pick[0]][1]
      twin = None
      if len(opts) > 1:
        g1, g2 = opts[0][pick[0]][0], opts[1][pick[1]][0]
        twin = (opts[1][pick[1]][1], f"{'exit_later' if g2 > g1 else 'exit_earlier'}:{hidden['crit']}")
    # Random names in random order: answers, queried agents and candidate positions are uniform; in
    # shortcut-free mode each gold container goes to the least used candidate slot of its stratum.
    golds = [_gold(init, ev, chain)[0] for ev in [events] + ([twin[0]] if twin else [])]
    slot = rng.sample(num_containers, num_containers)   # slot[c] = candidate position of abstract container c
    if not naive:
      free = list(range(num_containers))
      for g, (o, fb, _) in zip(golds, members):
        used = slot_counts.setdefault((o, fb), [0] * num_containers)
        low = min(used[p] for p in free)
        best_slots = [p for p in free if used[p] == low]
        p = best_slots[rng.integers(len(best_slots))]
        other = slot.index(p)
        slot[g], slot[other] = slot[other], slot[g]
        free.remove(p)
        used[p] += 1
    cand = [all_containers[i] for i in rng.sample(len(all_containers), num_containers)]
    cnames = [cand[slot[c]] for c in range(num_containers)]
    anames = [AGENT_NAMES[i] for i in rng.sample(len(AGENT_NAMES), num_agents)]
    obj, room = OBJECTS[rng.integers(len(OBJECTS))], ROOMS[rng.integers(len(ROOMS))]
    variants = [(events, "original", None)] + ([(twin[0], "twin", twin[1])] if twin else [])
    for (ev, role, fact), (o, fb, flags) in zip(variants, members):
      key = (o, fb)
      hits[key] = [h + f for h, f in zip(hits.get(key) or [0] * len(HEURISTICS), flags)]
      counts[key] = counts.get(key, 0) + 1
      if o:
        fb_count[o][0] += int(fb)
        fb_count[o][1] += 1
      story = _to_story(init, ev, anames, cnames, cand, obj, room)
      q = Question(tuple(anames[a] for a in chain))
      gold = cnames[_gold(init, ev, chain)[0]]
      if fact and ":" in fact:
        kind, a = fact.split(":")
        fact = f"{kind}:{anames[int(a)]}"
      meta = {"order": o, "false_belief": bool(fb), "mode": mode, "twin_id": pair_id if twins else None,
              "twin_role": role, "twin_fact": fact, "answer_position": answer_position(story, gold),
              "question_type": "belief", "index": len(out)}
      out.append(Example(story=story, question=q, answer=gold, meta=meta))
    pair_id += 1
  return out[:n]


# ----------------------------------------------------------------------------------------------------------
# Rendering.

def _sym(name: str) -> str:
  return name.lower()


def _agent_list(agents: Sequence[str]) -> str:
  if len(agents) == 1:
    return agents[0]
  return ", ".join(agents[:-1]) + " and " + agents[-1]


def event_sentence(e: Event, story: Story) -> str:
  """The Hi-ToM-style English sentence of one event."""
  if e.kind == "move":
    return f"{e.agent} moved the {story.obj} to the {e.container}."
  if e.kind == "exit":
    return f"{e.agent} exited the {story.room}."
  if e.kind == "enter":
    return f"{e.agent} entered the {story.room}."
  kind = e.text or ("likes" if e.container else "stayed")
  if kind == "stayed" or e.container is None:
    return f"{e.agent} made no movements and stayed in the {story.room} for 1 minute."
  return f"{e.agent} {kind} the {e.container}."


def question_sentence(story: Story, chain: Sequence[str]) -> str:
  """"Where is the O really?" (order 0) or "Where does A think B thinks ... the O is?"."""
  if not chain:
    return f"Where is the {story.obj} really?"
  rest = "".join(f" {a} thinks" for a in chain[1:])
  return f"Where does {chain[0]} think{rest} the {story.obj} is?"


def render(example: Example, style: str = "symbolic", *, choices: bool = False) -> tuple[str, str]:
  """(prompt, answer text) of an example.

  Args:
    example: the example.
    style: "symbolic" ("INIT red_box | MOVE avery blue_box | EXIT avery | LIKES ella green_box || Q avery
      ella") or "english" (Hi-ToM-like sentences and question).
    choices: list the candidate containers in the prompt.

  Returns:
    (prompt text, answer text).
  """
  if style not in STYLES:
    raise ConfigError(f"style={style!r} is not one of {STYLES}; pick one of them")
  s, chain = example.story, example.question.chain
  if style == "symbolic":
    parts = [f"INIT {s.init}"]
    for e in s.events:
      if e.kind == "distractor":
        kind = (e.text or "likes").upper() if e.container else "STAY"
        parts.append(f"{kind} {_sym(e.agent)}" + (f" {e.container}" if e.container else ""))
      else:
        parts.append(f"{e.kind.upper()} {_sym(e.agent)}" + (f" {e.container}" if e.kind == "move" else ""))
    prompt = " | ".join(parts) + " || Q" + "".join(f" {_sym(a)}" for a in chain)
    if choices:
      prompt += " || C " + " ".join(s.containers)
    return prompt, example.answer
  lines = [f"{_agent_list(s.agents)} entered the {s.room}.", f"The {s.obj} is in the {s.init}."]
  lines += [event_sentence(e, s) for e in s.events]
  prompt = " ".join(lines) + "\n" + question_sentence(s, chain)
  if choices:
    prompt += "\nChoices: " + ", ".join(s.containers)
  return prompt, example.answer


def render_trace(example: Example) -> str:
  """The witnessed locations up to T, e.g. "red_box -> blue_box" (its last entry is the answer)."""
  return " -> ".join(witnessed_path(example.story, example.question.chain))


def to_records(examples: Sequence[Example], style: str = "symbolic", *, thinking: bool = False,
               choices: bool = False) -> list[dict[str, Any]]:
  """`jaxlab.lm.sft_data` records with the example's metadata.

  Args:
    examples: generated (or parsed) examples.
    style: "symbolic" or "english" (see `render`).
    thinking: completion "<think>TRACE</think><answer>ANS</answer>" instead of the bare answer.
    choices: list the candidate containers in the prompt.

  Returns:
    list of {"prompt", "completion", "answer", "trace", "order", "false_belief", "twin_id", "twin_role",
    "twin_fact", "answer_position", "question_type", "mode", "candidates"} dicts.
  """
  out = []
  for ex in examples:
    prompt, ans = render(ex, style, choices=choices)
    trace = render_trace(ex)
    completion = f"<think>{trace}</think><answer>{ans}</answer>" if thinking else ans
    m = ex.meta
    out.append({"prompt": prompt, "completion": completion, "answer": ans, "trace": trace,
                "order": ex.question.order, "false_belief": m.get("false_belief"), "twin_id": m.get("twin_id"),
                "twin_role": m.get("twin_role"), "twin_fact": m.get("twin_fact"),
                "answer_position": m.get("answer_position"), "question_type": m.get("question_type", "belief"),
                "mode": m.get("mode"), "candidates": list(ex.story.containers)})
  return out


def write_jsonl(path: str | os.PathLike, examples: Sequence[Example], style: str = "symbolic",
                **kwargs: Any) -> int:
  """Writes `to_records(examples, style, **kwargs)` as JSONL; returns the number of records."""
  recs = to_records(examples, style, **kwargs)
  try:
    with open(path, "w", encoding="utf-8") as f:
      for r in recs:
        f.write(json.dumps(r) + "\n")
  except OSError as e:
    raise DataError(f"cannot write {path}: {e.strerror}; check the directory exists and is writable") from e
  return len(recs)
