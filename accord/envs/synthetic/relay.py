"""``relay``: a small synthetic multi-turn environment for tests and quick runs with tiny random models.

Two agents, ``e`` and ``o`` (``num_agents`` up to 5 adds ``a``, ``i``, ``u``), take turns (turn-based by default, ``simultaneous=True`` for MAGRPO's
parallel agents). Each writes a few words; its **local** reward for a step is the share of its words
that contain its letter ("e" or "o"). The **team** reward increment of a step is that share divided by
``N * max_turns``, so the team return of an episode lies in [0, 1] and reaches 1 only when every
action of both agents is on-letter. Every observation shows the turn, the agent's letter and the
partner's latest text, so the state an agent sees advances with the episode (which the AT-GRPO tests
rely on). An episode ends after ``max_turns`` turns; ``info["success"]`` is true once the team return
reaches ``success_at``.

``single_agent=True`` gives one agent, ``solo``, rewarded for the mean of both shares (the baseline).
Empty or unreadable text is a legal move worth 0. Instances differ by a number in the prompt; train
and eval use disjoint number ranges. Nothing here is random, so resets are trivially deterministic.
"""

from __future__ import annotations

import copy
from typing import Any

from accord.envs.registry import MAX_TASK_SIZE, check_flag, check_number, register_task
from accord.envs.protocol import StepResult, check_step_actions


VOWELS = "eoaiu"   # agent names and letters; the default pair is e and o


def _share(text: str, letters: str) -> float:
    words = text.split()
    if not words:
        return 0.0
    return sum(sum(ch in w.lower() for ch in letters) / len(letters) for w in words) / len(words)


class RelayEnv:
    name = "relay"

    def __init__(self, max_turns: int = 2, simultaneous: bool = False, single_agent: bool = False,
                 success_at: float = 0.75, size: int = 1000, num_agents: int = 2):
        self.max_turns = check_number("max_turns", max_turns, 1, integer=True)
        self.simultaneous = check_flag("simultaneous", simultaneous)
        self.success_at = check_number("success_at", success_at, 0.0, 1.0)
        self.size = check_number("size", size, 1, MAX_TASK_SIZE, integer=True)
        num_agents = check_number("num_agents", num_agents, 1, len(VOWELS), integer=True)
        self.agents = ("solo",) if check_flag("single_agent", single_agent) else tuple(VOWELS[:num_agents])
        self.letters = {"solo": "eo", **{v: v for v in VOWELS}}
        self._task: dict | None = None
        self._last: dict[str, str] = {}
        self._slot = 0        # actions taken so far (turn-based: one per step)
        self._turn = 0
        self._return = 0.0
        self._done = False

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        base = 0 if split == "train" else 10 * self.size
        n = self.size if limit is None else min(limit, self.size)
        return [{"id": f"{split}-{base + i}", "number": base + i} for i in range(n)]

    def instructions(self, agent: str) -> str:
        return f"You are agent {agent}. Write a few words that contain the letter(s) {self.letters[agent]!r}."

    def _observe(self, agent: str) -> str:
        partner = [a for a in self.agents if a != agent]
        said = " | ".join(f"{p}: {self._last.get(p, '')[:80]}" for p in partner) or "-"
        return (f"Task {self._task['number']}, turn {self._turn + 1}/{self.max_turns}. Partner: {said}. "
                f"Letter: {self.letters[agent]}.")

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        self._task = dict(task)
        self._last, self._slot, self._turn, self._return, self._done = {}, 0, 0, 0.0, False
        return {a: self._observe(a) for a in self.agents}

    def acting(self) -> tuple[str, ...]:
        if self.simultaneous:
            return self.agents
        return (self.agents[self._slot % len(self.agents)],)

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._task is not None, done=self._done)
        expected = self.acting()
        local = {a: 0.0 for a in self.agents}
        team = 0.0
        for a in expected:
            text = actions[a]
            local[a] = _share(text, self.letters[a])
            team += local[a] / (len(self.agents) * self.max_turns)
            self._last[a] = text
        self._return += team
        self._slot += len(expected)
        if self._slot % len(self.agents) == 0:
            self._turn += 1
        self._done = self._turn >= self.max_turns
        info = {"success": self._return >= self.success_at - 1e-9}
        return StepResult({a: self._observe(a) for a in self.agents}, team, local, self._done, info)

    def clone(self) -> "RelayEnv":
        return copy.deepcopy(self)


@register_task("relay", "synthetic multi-turn: agents e and o take turns writing words with their letter")
def make_relay(max_turns: int = 2, simultaneous: bool = False, single_agent: bool = False, success_at: float = 0.75,
               size: int = 1000, num_agents: int = 2) -> RelayEnv:
    return RelayEnv(max_turns=max_turns, simultaneous=simultaneous, single_agent=single_agent,
                    success_at=success_at, size=size, num_agents=num_agents)
