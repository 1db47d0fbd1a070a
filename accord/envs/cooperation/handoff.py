"""``handoff``: the second agent continues a path from where the first agent stopped.

A *path* walks forward around a cycle of letters (``letters``, default ``"bgp"``: b -> g -> p -> b ...).
An item is a word that carries a letter of the cycle (:mod:`accord.envs.cooperation.items`). Two
agents build one path of ``2 * length`` items:

- **first** writes the first ``length`` items;
- **second** writes the next ``length``, continuing from the last letter the first wrote (its first
  item is the letter after that one).

Team reward (increments; the return lies in [-1, 1]): the first's text earns ``first_weight *
walk(first's items, its expected half)`` and the second's ``(1 - first_weight) * walk(second's items,
the continuation of the first's last clean item)`` (:func:`~accord.envs.cooperation.items.walk`: +1 for
exactly the expected letters; each wrong, extra or hedged item costs as much as a right one pays).
The second is scored against what the first *actually* wrote (its first 60 characters, all that the
second's view shows and all that any score reads of a text), so only a consistent pair scores;
when the first wrote no clean item there is nothing to continue and the second's text earns 0.
``info["success"]``: both halves exact.

Where the path starts (``start``):

- ``"free"`` (the default): nobody is given a start; the first's half is scored as a walk from its own
  first item. The second must continue whatever the first wrote: by reading it (turn-based form), or
  by a convention the two share (the first always starts at the same letter, the second always
  continues from there; the only way in the single-turn form).
- ``"fixed"``: the path starts at the cycle's first letter (``letters[0]``, which every view's cycle
  line shows first): the first's half is scored as a walk from there, the second's as the continuation
  of what the first actually wrote. AT-GRPO rewards each agent by its own step's increment, so with a
  free start its first agent gets no signal for the convention the second relies on; a fixed start gives
  it one, and the pair's consistency is still what the second is scored on.
- ``"given"`` (turn-based only): each instance has a start letter that only the first sees; the path
  begins at the letter after it. The second sees the first's text, never the start, so the
  information passes through the first's partial answer and no convention reaches the best reward.
  It is the harder variant for a tiny model.

``single_turn: true`` is the simultaneous, one-turn form (a single-turn task, run by MAGRPO's joint
rollout): the second cannot see the first's text, so the pair can only score by a convention; it
refuses ``start: given`` (a start only the first sees could not reach the second in any way).

**Local rewards** (independent learners) are format only: ``local_scale`` (default 0.1) times each
agent's ``walk`` of its own items against the walk that starts at its own first item (are they
``length`` items stepping forward, from wherever? ``2 * length`` for the single agent's whole path).
They read neither the start nor the partner, so the second gets no signal for where to continue
(docs/tasks-cooperation.md has the argument).

Options: ``letters``, ``length`` (default 1), ``start`` (``free``, ``fixed`` or ``given``),
``first_weight`` (default 0.5), ``local_scale``,
``single_turn``, ``single_agent`` (one agent, ``solo``, writes the whole path: its first ``length``
items are the first half), ``emphasis`` (how many times the first's view shows the given start,
default 16) and ``echo`` (how many times the second's view shows the first's text, default 8): a tiny
random model barely reacts to one token among forty, so the views repeat it; ``size``
(instances per split, default 1000).
"""

from __future__ import annotations

import copy
import random
from typing import Any

from accord.envs.cooperation.items import items, shown, walk
from accord.envs.cooperation.signalling import check_letters, numbered_rows
from accord.envs.protocol import StepResult, check_step_actions
from accord.envs.registry import MAX_TASK_SIZE, TaskError, check_number, register_task

FIRST, SECOND, SOLO = "first", "second", "solo"


def path(letters: str, start: str, n: int) -> list[str]:
    """``n`` letters walking forward around the cycle ``letters`` from ``start``."""
    i = letters.index(start)
    return [letters[(i + k) % len(letters)] for k in range(n)]


def first_clean(found: list[str]) -> str | None:
    return next((f for f in found if len(f) == 1), None)


def last_clean(found: list[str]) -> str | None:
    return next((f for f in reversed(found) if len(f) == 1), None)


class Handoff:
    """Scoring shared by the turn-based environment and the single-turn task (see the module docstring)."""

    def __init__(self, letters: str, length: int, start: str, first_weight: float, local_scale: float,
                 emphasis: int, echo: int, size: int):
        self.letters = check_letters("letters", letters, 2)
        self.length = check_number("length", length, 1, 8, integer=True)
        if start not in ("given", "free", "fixed"):
            raise TaskError(f"task.options.start={start!r}: choose 'free' (the first starts where it likes), 'fixed' "
                            "(at the cycle's first letter) or 'given' (only the first sees where the path starts)")
        self.start = start
        self.first_weight = float(check_number("first_weight", first_weight, 0.0, 1.0))
        self.local_scale = float(check_number("local_scale", local_scale, 0.0))
        self.emphasis = check_number("emphasis", emphasis, 1, 32, integer=True)
        self.echo = check_number("echo", echo, 1, 8, integer=True)
        self.size = check_number("size", size, 1, MAX_TASK_SIZE, integer=True)

    def draw(self, number: int) -> dict[str, Any]:
        if self.start != "given":
            return {}
        return {"start": random.Random(f"handoff:{self.letters}:{number}").choice(self.letters)}

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        return numbered_rows(split, limit, self.size, self.draw)

    def first_score(self, found: list[str], row: dict[str, Any]) -> float:
        """The first half against the path from the given start (or from the first's own first item)."""
        if self.start == "given":   # the first stands at the start and walks on from it
            return walk(found, path(self.letters, row["start"], self.length + 1)[1:])
        if self.start == "fixed":
            return walk(found, path(self.letters, self.letters[0], self.length))
        begin = first_clean(found)
        if begin is None:   # free start and no clean item: no letter matches
            return walk(found, [""] * self.length)
        return walk(found, path(self.letters, begin, self.length))

    def second_score(self, found: list[str], first_found: list[str]) -> float:
        """The second half against the continuation of the first's last clean item (0 without one)."""
        stop = last_clean(first_found)
        if stop is None:
            return 0.0
        return walk(found, path(self.letters, stop, self.length + 1)[1:])

    def local(self, found: list[str], length: int) -> float:
        """Format only: are the agent's own items ``length`` letters stepping forward (from wherever)?"""
        start = first_clean(found)
        expected = path(self.letters, start, length) if start else [""] * length
        return self.local_scale * walk(found, expected)

    def cycle_text(self) -> str:
        return " ".join(self.letters)

    def view(self, agent: str, row: dict[str, Any], first_text: str | None = None) -> str:
        head = f"Cycle: {self.cycle_text()}."
        if agent in (FIRST, SOLO):
            if self.start == "given":
                return f"{head} Start: {' '.join([row['start']] * self.emphasis)}"
            return head
        if first_text is None:
            return f"{head} Continue the first's path."
        return f"{head} First wrote: " + " | ".join([shown(first_text) or "-"] * self.echo)

    def instructions(self, agent: str) -> str:
        where = {"fixed": " from its first letter",
                 "given": " that begins at the letter after Start (do not write Start itself)"}.get(self.start, "")
        if agent == SOLO:
            return f"Write a path of {2 * self.length} letters around the cycle{where}."
        if agent == FIRST:
            return f"First: write the first {self.length} letter(s) of a path around the cycle{where}."
        return f"Second: continue the path for {self.length} letter(s) from where the first stopped."


class HandoffEnv:
    """The turn-based hand-off (first, then second; or ``solo``)."""

    name = "handoff"
    simultaneous = False
    max_turns = 1

    def __init__(self, rules: Handoff, single_agent: bool = False):
        self.rules = rules
        self.agents = (SOLO,) if single_agent else (FIRST, SECOND)
        self._row: dict | None = None
        self._first_text: str | None = None
        self._first_score = 0.0
        self._slot = 0
        self._done = False

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        return self.rules.rows(split, limit, seed)

    def instructions(self, agent: str) -> str:
        return self.rules.instructions(agent)

    def _observe(self) -> dict[str, str]:
        return {a: self.rules.view(a, self._row, self._first_text) for a in self.agents}

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        self._row, self._first_text, self._first_score, self._slot, self._done = dict(task), None, 0.0, 0, False
        return self._observe()

    def acting(self) -> tuple[str, ...]:
        return (self.agents[self._slot],)

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._row is not None, done=self._done)
        (agent,) = self.acting()
        text, rules = actions[agent], self.rules
        found = items(text, rules.letters)
        local = {a: 0.0 for a in self.agents}
        # a solo writes the whole path: its format is 2 * length letters, a role's is length
        local[agent] = rules.local(found, 2 * rules.length if agent == SOLO else rules.length)
        info: dict[str, Any] = {"success": False}
        if agent == SOLO:
            first, second = found[:rules.length], found[rules.length:]
            a, b = rules.first_score(first, self._row), rules.second_score(second, first)
            team = rules.first_weight * a + (1 - rules.first_weight) * b
            info["success"] = a == 1.0 and b == 1.0
            self._done = True
        elif agent == FIRST:
            self._first_score = rules.first_score(found, self._row)
            team = rules.first_weight * self._first_score
            self._first_text = text
        else:
            first_found = items(self._first_text, rules.letters)
            b = rules.second_score(found, first_found)
            team = (1 - rules.first_weight) * b
            info["success"] = self._first_score == 1.0 and b == 1.0
            self._done = True
        self._slot += 1
        return StepResult(self._observe(), team, local, self._done, info)

    def clone(self) -> "HandoffEnv":
        """An independent copy: the rules are shared (never written after construction), the episode's row copied."""
        other = copy.copy(self)
        other._row = copy.deepcopy(self._row)
        return other

    def fingerprint(self) -> str:
        """The rollout audit's view of this environment (:func:`accord.audit.state_fingerprint`): the episode's
        state and the rules' settings, without walking the objects (the tree rollouts fingerprint every clone)."""
        return repr((vars(self.rules), self.agents, self._row, self._first_text, self._first_score, self._slot,
                     self._done))


class HandoffTask:
    """The simultaneous single-turn form (``single_turn: true``): a task with a batched team reward."""

    name = "handoff"

    def __init__(self, rules: Handoff, single_agent: bool = False):
        self.rules = rules
        self.agents = (SOLO,) if single_agent else (FIRST, SECOND)

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        return self.rules.rows(split, limit, seed)

    def prompt(self, agent: str, row: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.rules.instructions(agent)},
                {"role": "user", "content": self.rules.view(agent, row)}]

    def _scores(self, completions: dict, columns: dict) -> list[tuple[float, float]]:
        rules = self.rules
        starts = columns.get("start") or [None] * len(next(iter(completions.values())))
        out = []
        for j, start in enumerate(starts):
            row = {"start": start}
            if SOLO in completions:
                found = items(completions[SOLO][j], rules.letters)
                first, second = found[:rules.length], found[rules.length:]
            else:
                first = items(completions[FIRST][j], rules.letters)
                second = items(completions[SECOND][j], rules.letters)
            out.append((rules.first_score(first, row), rules.second_score(second, first)))
        return out

    def reward(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **columns) -> list[float]:
        w = self.rules.first_weight
        return [w * a + (1 - w) * b for a, b in self._scores(completions, columns)]

    def success(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **columns) -> list[float]:
        return [float(a == 1.0 and b == 1.0) for a, b in self._scores(completions, columns)]


@register_task("handoff", "cooperation: the first writes half a letter path, the second continues from where it "
               "stopped")
def make_handoff(letters: str = "bgp", length: int = 1, start: str = "free", first_weight: float = 0.5,
                 local_scale: float = 0.1, emphasis: int = 16, echo: int = 8, size: int = 1000,
                 single_turn: bool = False, single_agent: bool = False):
    for key, value in (("single_turn", single_turn), ("single_agent", single_agent)):
        if not isinstance(value, bool):
            raise TaskError(f"task.options.{key}={value!r}: must be true or false")
    if single_turn and start == "given" and not single_agent:
        raise TaskError("task handoff: single_turn=true with start=given cannot work (in one simultaneous turn the "
                        "second never sees the first's text, so a start only the first sees cannot reach it); use "
                        "start=free, or the turn-based form (single_turn=false)")
    rules = Handoff(letters, length, start, first_weight, local_scale, emphasis, echo, size)
    return HandoffTask(rules, single_agent) if single_turn else HandoffEnv(rules, single_agent)
