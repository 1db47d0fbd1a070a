"""Shared pieces of AT-GRPO's puzzle environments (:mod:`planpath`, :mod:`sudoku`, :mod:`sokoban`).

- :class:`PuzzleEnv`: the turn-based protocol all three follow. ``workflow="tool_planner"`` (the
  default, the AT-GRPO paper's roles): ``tool`` -> ``planner``, the tool agent's Python program runs in
  :class:`accord.sandbox.Sandbox` on the current state and its printed output is shown to the planner,
  whose answer moves the environment. ``workflow="direct"``: ``planner`` -> ``executor``, the planner
  writes its proposal as text. ``single_agent=True``: one ``solver``. A puzzle module supplies the state,
  a parser, the function that applies a parsed action to a state, the state as JSON data for the tool
  agent, and the rendering; this class does the turn order, the proposer's simulation on a copy, the
  sandboxed tool runs, the end of the episode, observations and info.
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
import json
import logging
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from accord.data import canonical_json, digest, hash_bucket
from accord.envs import tool_programs
from accord.envs.registry import TaskError
from accord.envs.protocol import StepResult, check_step_actions

logger = logging.getLogger(__name__)

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
    return digest(canonical_json(obj))


def split_of(key: Any, eval_every: int = 5) -> str:
    """``'eval'`` for one content key in ``eval_every`` (by hash), else ``'train'``."""
    return "eval" if hash_bucket(canonical_json(key), eval_every, algorithm="sha1") == 0 else "train"


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
    if not out and n:
        raise TaskError(f"{name}: no {split!r} instance in {draws} draws with these options: an instance's split is "
                        "decided by a hash of its layout (walls, level), so that no layout is in both splits, and "
                        "these options give too few distinct layouts for both (planpath with wall_frac=0 has one); "
                        "use options that vary the layout (task.options.wall_frac above 0, a larger size)")
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


# --------------------------------------------------------------------------------------------------
# the tool agent's programs

WORKFLOWS = ("tool_planner", "direct")
NO_CODE = "no_code"
_SHOW_OUTPUT, _SHOW_ERROR = 600, 400


@dataclass(frozen=True)
class ToolRun:
    """What one tool program did: a sandbox status (or ``no_code``), its stdout, and a failure summary."""

    status: str
    stdout: str = ""
    error: str = ""


def run_tool(text: str, state_json: str, timeout_s: float) -> ToolRun:
    """Run the program in the tool agent's reply ``text`` (its last ```python block, see
    :func:`accord.envs.maths.env.extract_code`) in the sandbox, with ``state.json`` (``state_json``) in its
    working directory; never raises. Cached per (program, state, timeout): :mod:`accord.envs.tool_programs`."""
    from accord.envs.maths.env import extract_code

    code = extract_code(text)
    if code is None:
        return ToolRun(NO_CODE)
    result = tool_programs.run_program(code, timeout_s=timeout_s, memory_mb=256, files={"state.json": state_json},
                                       what="puzzle tool agent")
    error = "" if result.ok else tool_programs.clean_error(result.stderr, result.exception, _SHOW_ERROR)
    return ToolRun(result.status, result.stdout, error)


def describe_tool_run(run: ToolRun, timeout_s: float) -> str:
    """The tool run as the planner sees it: the printed output (tail), or the failure."""
    if run.status == NO_CODE:
        return "no ```python block in the tool agent's reply, so nothing ran."
    if run.status == "ok":
        out = run.stdout.strip("\n")
        if not out.strip():
            return "the program ran and printed nothing."
        if len(out) > _SHOW_OUTPUT:
            out = f"[... {len(out) - _SHOW_OUTPUT} characters cut]\n" + out[-_SHOW_OUTPUT:]
        return "the program printed:\n" + out
    what = {"error": "stopped with an error", "syntax_error": "has a syntax error",
            "timeout": f"timed out (limit {timeout_s:g} s) and was stopped", "memory": "ran out of memory",
            "output_limit": "printed too much and was stopped", "killed": "was killed",
            "sandbox_error": "could not be run (sandbox failure)"}.get(run.status, run.status)
    return f"the program {what}." + (f"\n{run.error}" if run.error else "")


TOOL_COMMON = ("Write one Python program in a single ```python fenced block. It runs in a fresh directory that "
               "holds `state.json`, the current state as data (read it with `import json; s = "
               "json.load(open('state.json'))`), with the Python standard library only, no input and at most "
               "{timeout:g} seconds. What it prints is shown to your teammate, the planner, who decides the "
               "answer; you are rewarded by how good the printed answer would be if applied now.")


class PuzzleEnv:
    """Base of the turn-based puzzle environments. Agents, by ``workflow``:

    - ``"tool_planner"`` (default; the AT-GRPO paper's roles): ``("tool", "planner")``. The tool agent
      writes a Python program; it runs in the sandbox (one :class:`accord.sandbox.Sandbox` per environment,
      ``tool_timeout_s`` seconds, standard library only) with ``state.json`` -- :meth:`_state_data` of the
      current state -- in its working directory. Its printed output (or its error, or the timeout) is
      shown to the planner; the planner's answer is applied to the real state.
    - ``"direct"``: ``("planner", "executor")``. The planner writes its proposal as text; the executor's
      answer is applied to the real state.
    - ``single_agent=True`` (either workflow): ``("solver",)``, whose answer is applied directly.

    The first role of a two-role workflow (the *proposer*: ``tool`` or direct ``planner``) never changes
    the real state: its answer -- the tool program's stdout, read by the same parser as a planner's text,
    in the trainer process, never inside the sandboxed program -- is applied to a deep copy, and its
    local reward is what that copy earned (team + local increments of the simulated step, without the
    end-of-episode failure penalty); a reply with no program, a program that fails (error, timeout,
    memory, output flood) or output with nothing readable earns what unreadable text earns. Its team
    increment is 0. The second role (the *mover*: ``planner`` or ``executor``; or the solver) is applied
    to the real state; its local reward is its own step's task progress plus its move costs (``team +
    local`` increments of its step, without the failure penalty), so that independent learners
    (``alpha = 0``) still prefer solving; its team increment is the step's progress. A turn ends with
    the mover's step. The episode ends when the puzzle is solved, when the move cap is reached, or
    after ``max_turns`` turns; an episode that ends unsolved gets ``fail_penalty`` added to the team
    increment of its last step.

    Subclasses set ``name``, ``fail_penalty``, ``_instructions`` (keys ``planner``, ``executor``, ``solver``
    for the direct roles, ``tool`` and ``tool_planner`` for the tool workflow's roles) and implement
    ``_load``, ``_parse``, ``_apply``, ``_show_plan``, ``_render``, ``_budget`` and ``_state_data``.
    """

    name = "puzzle"
    simultaneous = False
    fail_penalty = 0.0

    def __init__(self, *, max_turns: int, single_agent: bool, workflow: str = "tool_planner",
                 tool_timeout_s: float = 3.0):
        self.max_turns = check_int("max_turns", max_turns, 1)
        if not isinstance(single_agent, bool):
            raise TaskError(f"task.options.single_agent={single_agent!r}: must be true or false")
        if workflow not in WORKFLOWS:
            raise TaskError(f"task.options.workflow={workflow!r}: choose one of {list(WORKFLOWS)} (tool_planner: the "
                            "paper's tool agent + planner; direct: planner + executor writing moves as text)")
        if isinstance(tool_timeout_s, bool) or not isinstance(tool_timeout_s, (int, float)) \
                or not 0 < tool_timeout_s <= 60:
            raise TaskError(f"task.options.tool_timeout_s={tool_timeout_s!r}: must be a number of seconds in (0, 60]")
        self.single_agent = single_agent
        self.workflow = workflow
        self.tool_timeout_s = float(tool_timeout_s)
        if single_agent:
            self.agents: tuple[str, ...] = ("solver",)
        elif workflow == "tool_planner":
            self.agents = ("tool", "planner")
        else:
            self.agents = ("planner", "executor")
        self._tool_mode = not single_agent and workflow == "tool_planner"
        self._instructions: dict[str, str] = {}  # role key -> system prompt, set by the subclass
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

    def _state_data(self, state: Any) -> dict[str, Any]:
        """The state as plain JSON data: the tool agent's ``state.json``."""
        raise NotImplementedError

    # protocol -------------------------------------------------------------------------------------
    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        raise NotImplementedError

    def instructions(self, agent: str) -> str:
        """The system prompt of ``agent``."""
        if agent not in self.agents:
            raise ValueError(f"{self.name}: unknown agent {agent!r}; agents are {list(self.agents)}")
        if self._tool_mode:
            return self._instructions["tool_planner" if agent == "planner" else "tool"]
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
        local = dict.fromkeys(self.agents, 0.0)
        team = 0.0
        if len(self.agents) == 2 and agent == self.agents[0]:
            tool_info: dict[str, Any] = {}
            if self._tool_mode:
                run = run_tool(text, json.dumps(self._state_data(self._state), sort_keys=True), self.tool_timeout_s)
                parsed = self._parse(run.stdout if run.status == "ok" else "")
                tool_info = {"tool_status": run.status}
            else:
                parsed = self._parse(text)
            sim = copy.deepcopy(self._state)
            out = self._apply(sim, parsed)
            local[agent] = out.team + out.local
            shown = self._show_plan(self._state, parsed)
            if self._tool_mode:
                shown = describe_tool_run(run, self.tool_timeout_s) + "\nRead as: " + shown
            self._proposal = shown
            self._slot = 1
            info = {"plan_reward": local[agent], "plan_solves": out.solved, **tool_info}
        else:
            parsed = self._parse(text)
            out = self._apply(self._state, parsed)
            team, local[agent] = out.team, out.team + out.local
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
        if len(self.agents) == 2 and agent == self.agents[1]:
            proposal = self._proposal or "none yet this turn"
            label = "Tool agent's program (run on the current state):" if self._tool_mode else "Planner's proposal:"
            parts.append(label + ("" if proposal.startswith("\n") else " ") + proposal)
        return "\n".join(parts)
