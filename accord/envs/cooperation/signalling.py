"""``signal``: a referential (signalling) game; the listener can name the secret only from the speaker's words.

Each instance draws ``num_items`` candidate letters from ``letters`` and a secret among them. Two
agents act in turn (turn-based; :mod:`accord.envs.cooperation.items` says how texts are read):

- **speaker** sees the candidates and the secret and writes a message;
- **listener** sees the candidates and the message, never the secret, and names one candidate
  (writes words that contain it).

Team reward (increments; the return lies in [-1, 1] less ``ask_cost`` per question asked):

- the speaker's message earns ``hint * vote(message, secret)``: +1 when every item of the message
  carries the secret's letter alone (the message *points at* the secret), -1 when every one points
  elsewhere. AT-GRPO rewards each step by its own increment, so without this term its speaker would
  get no team signal at all (the answer comes a step later);
- the listener's answer earns ``(1 - hint) * vote(answer, secret)``, times ``max(0, vote(message,
  secret))`` with ``gate`` on (the default): an answer counts as far as the message supported it, so a
  lucky guess earns nothing. A hedge (every candidate named equally often) earns at most 0.

Each text is read up to its first :data:`~accord.envs.cooperation.items.SHOWN` (60) characters, which
is what the partner's view shows of it: the message is scored as the listener sees it.

``hint: 0, gate: false`` is the pure game, in which any code the two agree on works and only MAGRPO's
returns reach the speaker. The gate keeps the listener's gradient free of the noise of guessing
while messages still carry nothing; without it a tiny shared model collapses onto one output for
both roles before the speaker learns.

``info["success"]``: the answer names the secret and no other candidate (lucky guesses included).

**Local rewards** (independent learners, ``algorithm.baseline: independent``) are format only:
``local_scale`` times each agent's :func:`~accord.envs.cooperation.items.naming` score of its own text
(how cleanly it names *one* candidate, whichever). They read neither the secret nor the partner's
text, so a listener trained on them learns to name a candidate but gets no signal for which: over a
uniform secret its answers are right at the chance rate 1 / ``num_items`` at most
(docs/tasks-cooperation.md has the argument).

Options: ``letters`` (the pool, default ``"bp"``; about one word in six of a tiny random model's text
carries b or p), ``num_items`` (M, default 2), ``hint`` (default 0.5), ``gate`` (default true; needs
``hint > 0``), ``rounds`` (default 1; with 2 or more the listener may ask: an answer with a ``?`` before
the last round is a question, which costs ``ask_cost`` (default 0.05) and is shown to the speaker,
whose reply the listener reads in the next round; the hint is then a potential, ``hint *
(vote(reply) - vote(previous speaker text))``, so the team return counts the vote of the last thing
the speaker said and asking never inflates it), ``emphasis`` (how many times the speaker's view shows
the secret, default 16) and ``echo`` (how many times the listener's view shows the latest message,
default 8): a tiny random model barely reacts to one token among forty, so the views repeat it;
``local_scale`` (default 0.1),
``size`` (instances per split, default 1000) and ``single_agent``: one agent, ``solo``, sees the secret
and names it (the single-agent baseline; its answer earns the whole team reward).

There is no simultaneous (single-turn) form: in one simultaneous turn the listener cannot read the
message, so no information passes and the game is no longer a signalling game. Its one-turn form is
turn-based (the default, ``rounds: 1``), which the MAGRPO tree rollout runs as one joint action per
branch (the j-th answer is sampled after reading the j-th message). The ``handoff`` task has a
simultaneous single-turn form.

Instances: a seeded draw per instance number; train and eval use disjoint number ranges.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from accord.envs.cooperation.items import items, names, naming, shown, vote
from accord.envs.protocol import StepResult, check_step_actions
from accord.envs.registry import MAX_TASK_SIZE, TaskError, check_number, register_task

SPEAKER, LISTENER, SOLO = "speaker", "listener", "solo"


def check_letters(name: str, letters: Any, least: int) -> str:
    """``letters`` as a lower-case string of distinct ASCII letters, at least ``least`` of them."""
    if not isinstance(letters, str) or not letters.isascii() or not letters.isalpha() \
            or len(set(letters.lower())) != len(letters) or len(letters) < least:
        raise TaskError(f"task.options.{name}={letters!r}: give at least {least} distinct ASCII letters, e.g. 'bdgmp'")
    return letters.lower()


def numbered_rows(split: str, limit: int | None, size: int, draw) -> list[dict[str, Any]]:
    """``limit`` (at most ``size``) instances of ``split``, numbered from disjoint ranges (train from 0,
    eval from ``10 * size``); ``draw(number)`` gives an instance's fields."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    base = 0 if split == "train" else 10 * size
    n = size if limit is None else min(limit, size)
    return [{"id": f"{split}-{base + i}", "number": base + i, **draw(base + i)} for i in range(n)]


class SignalEnv:
    """The referential game (see the module docstring)."""

    name = "signal"
    simultaneous = False

    def __init__(self, letters: str = "bp", num_items: int = 2, hint: float = 0.5, rounds: int = 1,
                 ask_cost: float = 0.05, emphasis: int = 16, echo: int = 8, local_scale: float = 0.1,
                 gate: bool = True, size: int = 1000, single_agent: bool = False):
        self.letters = check_letters("letters", letters, 2)
        self.num_items = check_number("num_items", num_items, 2, len(self.letters), integer=True)
        self.hint = float(check_number("hint", hint, 0.0, 1.0))
        self.rounds = check_number("rounds", rounds, 1, integer=True)
        self.ask_cost = float(check_number("ask_cost", ask_cost, 0.0))
        self.emphasis = check_number("emphasis", emphasis, 1, 32, integer=True)
        self.echo = check_number("echo", echo, 1, 8, integer=True)
        self.local_scale = float(check_number("local_scale", local_scale, 0.0))
        self.size = check_number("size", size, 1, MAX_TASK_SIZE, integer=True)
        for key, value in (("single_agent", single_agent), ("gate", gate)):
            if not isinstance(value, bool):
                raise TaskError(f"task.options.{key}={value!r}: must be true or false")
        if gate and self.hint == 0:
            raise TaskError("task.options.gate=true needs hint > 0 (the gate counts the answer as far as the message "
                            "points at the secret, which hint=0 leaves undefined); set gate=false for the pure game")
        self.gate = gate
        self.single_agent = single_agent
        self.agents = (SOLO,) if single_agent else (SPEAKER, LISTENER)
        self.max_turns = 1 if single_agent else self.rounds
        self._task: dict | None = None
        self._said: list[tuple[str, str]] = []   # (agent, text), in order
        self._slot = 0
        self._turn = 0
        self._pointing = 0.0     # vote of the speaker's latest text (the hint's potential)
        self._done = False

    # --- instances -----------------------------------------------------------------------------------
    def _draw(self, number: int) -> dict[str, Any]:
        rng = random.Random(f"signal:{self.letters}:{self.num_items}:{number}")
        candidates = sorted(rng.sample(self.letters, self.num_items))
        return {"candidates": "".join(candidates), "secret": rng.choice(candidates)}

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        return numbered_rows(split, limit, self.size, self._draw)

    # --- prompts -------------------------------------------------------------------------------------
    def instructions(self, agent: str) -> str:
        if agent == SOLO:
            return "Name the secret letter."
        if agent == SPEAKER:
            return "Speaker: tell the listener the secret letter."
        ask = " Or end with ? to ask the speaker." if self.rounds > 1 else ""
        return f"Listener: name the secret letter from the message.{ask}"

    def _observe(self, agent: str) -> str:
        task = self._task
        head = f"Letters: {' '.join(task['candidates'])}."
        if agent in (SPEAKER, SOLO):
            parts = [head, "Secret: " + " ".join([task["secret"]] * self.emphasis)]
            questions = [t for a, t in self._said if a == LISTENER]
            if agent == SPEAKER and questions:
                parts.append(f"Question: {shown(questions[-1])}")
            return " ".join(parts)
        said = [shown(t) for a, t in self._said if a == SPEAKER]
        if not said:
            return f"{head} Message: -"
        return f"{head} Message: " + " | ".join(said[:-1] + [said[-1]] * self.echo)

    # --- protocol ------------------------------------------------------------------------------------
    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        self._task = dict(task)
        self._said, self._slot, self._turn, self._pointing, self._done = [], 0, 0, 0.0, False
        return {a: self._observe(a) for a in self.agents}

    def acting(self) -> tuple[str, ...]:
        return (self.agents[self._slot % len(self.agents)],)

    def step(self, actions: dict[str, str]) -> StepResult:
        check_step_actions(self, actions, started=self._task is not None, done=self._done)
        (agent,) = self.acting()
        text = actions[agent]
        secret, letters = self._task["secret"], self._task["candidates"]
        found = items(text, letters)
        local = {a: 0.0 for a in self.agents}
        info: dict[str, Any] = {}
        team = 0.0
        if agent == SOLO:
            team, local[agent] = vote(found, secret), self.local_scale * naming(found)
            info["success"] = names(found, secret)
            self._done = True
        elif agent == SPEAKER:
            pointing = vote(found, secret)
            team = self.hint * (pointing - self._pointing)
            self._pointing = pointing
            local[agent] = self.local_scale * naming(found)
        else:
            last_round = self._turn + 1 >= self.rounds
            if not last_round and "?" in shown(text):
                team, info["asked"] = -self.ask_cost, True
            else:
                team, local[agent] = (1.0 - self.hint) * vote(found, secret), self.local_scale * naming(found)
                if self.gate:
                    team *= max(0.0, self._pointing)
                info["success"] = names(found, secret)
                self._done = True
        self._said.append((agent, text))
        self._slot += 1
        if self._slot % len(self.agents) == 0:
            self._turn += 1
        info.setdefault("success", False)
        return StepResult({a: self._observe(a) for a in self.agents}, team, local, self._done, info)

    def clone(self) -> "SignalEnv":
        """An independent copy: settings are shared (never written after construction), the episode's state
        copied."""
        other = copy.copy(self)
        other._task, other._said = copy.deepcopy(self._task), list(self._said)
        return other

    def fingerprint(self) -> str:
        """The rollout audit's view of this environment (:func:`accord.audit.state_fingerprint`): its settings and
        the episode's state (plain values only), without walking the objects."""
        return repr(vars(self))


@register_task("signal", "cooperation: the speaker sees a secret letter, the listener names it from the message alone")
def make_signal(letters: str = "bp", num_items: int = 2, hint: float = 0.5, rounds: int = 1, ask_cost: float = 0.05,
                emphasis: int = 16, echo: int = 8, local_scale: float = 0.1, gate: bool = True, size: int = 1000,
                single_agent: bool = False, single_turn: bool = False) -> SignalEnv:
    if single_turn is not False:
        raise TaskError("task signal has no single-turn (simultaneous) form: in one simultaneous turn the listener "
                        "cannot read the message; use its turn-based form (drop task.options.single_turn; MAGRPO runs "
                        "it as a one-turn tree), or task handoff with single_turn=true")
    return SignalEnv(letters=letters, num_items=num_items, hint=hint, rounds=rounds, ask_cost=ask_cost,
                     emphasis=emphasis, echo=echo, local_scale=local_scale, gate=gate, size=size,
                     single_agent=single_agent)
