"""Shared pieces of AT-GRPO's puzzle environments (:mod:`planpath`, :mod:`sudoku`, :mod:`sokoban`).

- :class:`PuzzleEnv`: the turn-based planner -> executor protocol all three follow (or one ``solver``
  when ``single_agent=True``). A puzzle module supplies the state, a parser, the function that applies
  a parsed action to a state, and the rendering; this class does the turn order, the planner's
  simulation on a copy, the end of the episode, observations and info.
- :func:`parse_moves`: a forgiving reader of move lists (``Moves: U R R D``) in model text.
- :func:`render_grid`: one character per cell with row and column indices.
- :func:`generate_split`: deterministic task generation from integer seeds, with the train/eval split
  decided by a hash of each instance's *content*, so the two splits never share a puzzle even when
  different seeds generate the same one.

Coordinates everywhere are ``(row, col)``, 0-based, row 0 at the top; ``U`` decreases the row, ``D``
increases it, ``L`` decreases the column, ``R`` increases it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from accord.envs.base import TaskError
from accord.envs.protocol import StepResult, check_step_actions

DIRECTIONS: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
COORDS = "(row, col) from 0, row 0 at the top; U = row-1, D = row+1, L = col-1, R = col+1"

_MOVE_WORDS = {"u": "U", "up": "U", "d": "D", "down": "D", "l": "L", "left": "L", "r": "R", "right": "R",
               "↑": "U", "↓": "D", "←": "L", "→": "R"}
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
_MOVES_KEY = re.compile(r"(?i)\b(?:moves?|actions?)\s*[:=]\s*(.*)$")
_TOKEN = re.compile(r"[A-Za-z]+|[↑↓←→]")
_LINE_JUNK = " \t*`>#-•"


def strip_fences(text: str) -> str:
    """``text`` with Markdown code-fence markers (and their language tags) removed, content kept."""
    return _FENCE.sub("\n", text)


@dataclass(frozen=True)
class ParsedMoves:
    """Moves read from model text: ``moves`` in order, ``ignored`` words on the chosen line."""

    moves: tuple[str, ...]
    ignored: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when at least one move was read (an empty list counts as unreadable)."""
        return bool(self.moves)


def _tokens(s: str) -> tuple[list[str], list[str]]:
    moves, ignored = [], []
    for tok in _TOKEN.findall(s):
        low = tok.lower()
        if low in _MOVE_WORDS:
            moves.append(_MOVE_WORDS[low])
        elif tok.isupper() and set(tok) <= set("UDLR"):
            moves.extend(tok)  # compact form: "URRD"
        else:
            ignored.append(tok)
    return moves, ignored


def parse_moves(text: str) -> ParsedMoves:
    """Read a move list from model text; never raises.

    The last line with ``Moves:`` (or ``Move:``, ``Actions:``; any case, Markdown bold or backticks
    around it) wins; when nothing follows the colon the next non-empty line is read. Without such a
    line, the last non-empty line made only of moves is read. Moves are ``U D L R`` or the words
    ``up down left right`` in any case, arrows ``↑ ↓ ← →``, or an upper-case run such as ``URRD``,
    separated by spaces, commas, brackets or quotes; other words on the chosen line are ignored and
    reported in ``ignored``.
    """
    lines = [ln.strip().replace("*", "").replace("`", "") for ln in strip_fences(text).splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        m = _MOVES_KEY.search(lines[i])
        if m is None:
            continue
        body = m.group(1).strip()
        if not body:
            body = next((ln for ln in lines[i + 1:] if ln.strip()), "")
        moves, ignored = _tokens(body)
        return ParsedMoves(tuple(moves), tuple(ignored))
    for line in reversed(lines):
        line = line.strip(_LINE_JUNK)
        if not line:
            continue
        moves, ignored = _tokens(line)
        if moves and not ignored:
            return ParsedMoves(tuple(moves))
    return ParsedMoves(())


def show_moves(moves: Sequence[str], limit: int = 40) -> str:
    """Moves as ``U R R D``, cut after ``limit`` with a count of the rest."""
    if not moves:
        return "(none)"
    head = " ".join(moves[:limit])
    return head if len(moves) <= limit else f"{head} ... (+{len(moves) - limit} more)"


def render_grid(rows: Sequence[str]) -> str:
    """Rows of one character per cell, with column indices on top and row indices on the left
    (indices modulo 10, so they stay one character wide)."""
    width = len(rows[0]) if rows else 0
    header = "  " + "".join(str(c % 10) for c in range(width))
    return "\n".join([header] + [f"{r % 10} {row}" for r, row in enumerate(rows)])


def content_hash(obj: Any) -> str:
    """sha1 of the canonical JSON of ``obj`` (plain lists, strings and numbers)."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def split_of(key: Any, eval_every: int = 5) -> str:
    """``'eval'`` for one content key in ``eval_every`` (by hash), else ``'train'``."""
    return "eval" if int(content_hash(key), 16) % eval_every == 0 else "train"


DEFAULT_LIMIT = {"train": 1000, "eval": 100}


def generate_split(name: str, split: str, limit: int | None, seed: int,
                   make: Callable[[random.Random, str], tuple[dict[str, Any], Any] | None]) -> list[dict[str, Any]]:
    """Generate ``limit`` distinct instances of ``split`` from the seed stream ``(name, seed, i)``.

    ``make(rng, split)`` returns ``(task, split_key)`` or None for a rejected draw (it may return None
    as soon as it knows the split key belongs to the other split, to save time). The instance goes to
    the split that :func:`split_of` gives its ``split_key`` (instances of the other split are skipped), is
    deduplicated by the hash of the whole task, and gets ``id = f"{name}-{hash[:12]}"``. Both splits
    read the same stream, so any seed gives disjoint splits. ``limit=None`` gives
    ``DEFAULT_LIMIT[split]`` instances.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    n = DEFAULT_LIMIT[split] if limit is None else int(limit)
    if n < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit!r}")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    budget = 30 * n + 1000  # generated instances (rejected draws aside) before giving up
    generated = draws = 0
    while len(out) < n and generated < budget and draws < 20 * budget:
        made = make(random.Random(f"{name}:{seed}:{draws}"), split)
        draws += 1
        if made is None:
            continue
        generated += 1
        task, key = made
        if split_of(key) != split:
            continue
        digest = content_hash(task)
        if digest in seen:
            continue
        seen.add(digest)
        out.append({"id": f"{name}-{digest[:12]}", **task})
    if len(out) < n:
        raise TaskError(f"{name}: found only {len(out)} distinct {split!r} instances in {draws} draws with these "
                        "options: too few distinct puzzles exist; ask for fewer (limit) or widen the puzzle space "
                        "(e.g. a larger task.options.size)")
    return out


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """``value`` as an int within [lo, hi], else a :class:`TaskError` naming the option."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise TaskError(f"task.options.{name}={value!r}: must be an integer {bound}")
    return value


# --------------------------------------------------------------------------------------------------
# the planner -> executor protocol


@dataclass
class Outcome:
    """What applying one action to a state earned (see :meth:`PuzzleEnv._apply`)."""

    team: float                # task-level increment: progress, success bonus
    local: float               # the acting role's own shaping: per-move costs, invalid-move penalties
    feedback: str              # one line for the next observations
    parse_error: bool = False  # the text could not be read; nothing was applied
    solved: bool = False
    out_of_moves: bool = False  # the episode's move cap is reached


class PuzzleEnv:
    """Base of the turn-based puzzle environments: ``("planner", "executor")`` or ``("solver",)``.

    The planner's step never changes the real state: its proposal is applied to a deep copy and its
    local reward is what that copy earned (team + local increments of the simulated executor step,
    without the end-of-episode failure penalty); the team increment of a planner step is 0. The
    executor (or the solver) is applied to the real state; a turn ends with its step. The episode ends
    when the puzzle is solved, when the move cap is reached, or after ``max_turns`` turns; an episode
    that ends unsolved gets ``fail_penalty`` added to the team increment of its last step.

    Subclasses set ``name``, ``fail_penalty``, ``_instructions`` and implement ``_load``, ``_parse``,
    ``_apply``, ``_show_plan``, ``_render`` and ``_budget``.
    """

    name = "puzzle"
    simultaneous = False
    fail_penalty = 0.0

    def __init__(self, *, max_turns: int, single_agent: bool):
        self.max_turns = check_int("max_turns", max_turns, 1)
        if not isinstance(single_agent, bool):
            raise TaskError(f"task.options.single_agent={single_agent!r}: must be true or false")
        self.single_agent = single_agent
        self.agents: tuple[str, ...] = ("solver",) if single_agent else ("planner", "executor")
        self._instructions: dict[str, str] = {}  # role -> system prompt, set by the subclass
        self._state: Any = None
        self._slot = 0
        self._turn = 0
        self._done = False
        self._success = False
        self._proposal: str | None = None
        self._feedback = "none yet (first turn)"

    # hooks ----------------------------------------------------------------------------------------
    def _load(self, task: dict[str, Any]) -> Any:
        """The initial state of ``task`` (validated; raises TaskError on a malformed task)."""
        raise NotImplementedError

    def _parse(self, text: str) -> Any:
        """The action read from ``text`` (never raises)."""
        raise NotImplementedError

    def _apply(self, state: Any, parsed: Any) -> Outcome:
        """Apply ``parsed`` to ``state`` in place and return what it earned."""
        raise NotImplementedError

    def _show_plan(self, state: Any, parsed: Any) -> str:
        """How the planner's proposal is shown to the executor."""
        raise NotImplementedError

    def _render(self, state: Any) -> str:
        """The state as text (grid, legend, positions)."""
        raise NotImplementedError

    def _budget(self, state: Any) -> str:
        """Moves used and left, e.g. ``"Moves used 3 of 40, at most 20 per turn."``"""
        raise NotImplementedError

    # protocol -------------------------------------------------------------------------------------
    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        raise NotImplementedError

    def instructions(self, agent: str) -> str:
        """The system prompt of ``agent``."""
        if agent not in self.agents:
            raise ValueError(f"{self.name}: unknown agent {agent!r}; agents are {list(self.agents)}")
        return self._instructions[agent]

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        """Start an episode on ``task``. Nothing is random at reset, so ``seed`` changes nothing."""
        self._state = self._load(task)
        self._slot, self._turn, self._done, self._success = 0, 0, False, False
        self._proposal = None
        self._feedback = "none yet (first turn)"
        return self._observations()

    def acting(self) -> tuple[str, ...]:
        """The one agent whose action the next step takes."""
        return (self.agents[self._slot],)

    def clone(self) -> "PuzzleEnv":
        """An independent deep copy."""
        return copy.deepcopy(self)

    def step(self, actions: dict[str, str]) -> StepResult:
        """Apply the acting agent's text; see the class docstring for who changes what."""
        check_step_actions(self, actions, started=self._state is not None, done=self._done)
        agent = self.agents[self._slot]
        text = actions[agent]
        parsed = self._parse(text)
        local = dict.fromkeys(self.agents, 0.0)
        team = 0.0
        if agent == "planner":
            sim = copy.deepcopy(self._state)
            out = self._apply(sim, parsed)
            local[agent] = out.team + out.local
            self._proposal = self._show_plan(self._state, parsed)
            self._slot = 1
            info = {"plan_reward": local[agent], "plan_solves": out.solved}
        else:
            out = self._apply(self._state, parsed)
            team, local[agent] = out.team, out.local
            self._turn += 1
            self._slot = 0
            self._proposal = None
            self._success = out.solved
            feedback = out.feedback
            if out.solved:
                self._done = True
                feedback += " Solved: episode over."
            elif out.out_of_moves or self._turn >= self.max_turns:
                self._done = True
                team += self.fail_penalty
                feedback += " Out of moves: episode over." if out.out_of_moves else " Out of turns: episode over."
            self._feedback = feedback
            info = {}
        info.update({"success": self._success, "turn": self._turn, "agent": agent,
                     "parse_error": {agent: out.parse_error}, "feedback": out.feedback})
        # rounded so that sums of -0.01 steps read as -0.21, not -0.21000000000000002
        local = {a: round(v, 10) for a, v in local.items()}
        return StepResult(self._observations(), round(float(team), 10), local, self._done, info)

    # observations ---------------------------------------------------------------------------------
    def _observations(self) -> dict[str, str]:
        return {a: self._observe(a) for a in self.agents}

    def _observe(self, agent: str) -> str:
        turn = min(self._turn + 1, self.max_turns)
        parts = [self._render(self._state), f"Turn {turn} of {self.max_turns}. {self._budget(self._state)}",
                 f"Last: {self._feedback}"]
        if agent == "executor":
            proposal = self._proposal or "none yet this turn"
            parts.append("Planner's proposal:" + ("" if proposal.startswith("\n") else " ") + proposal)
        return "\n".join(parts)
