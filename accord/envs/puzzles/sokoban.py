"""``sokoban``: AT-GRPO's Sokoban as a turn-based tool agent -> planner environment (or planner -> executor).

A ``size`` x ``size`` room (walls on the border, ``round(wall_frac * (size-2)**2)`` inner walls, the
floor kept connected) with ``num_boxes`` boxes and as many goals. Puzzles are made by reverse play, as
in gym-sokoban: boxes start on the goals and the player walks at random, pulling a box it walks away
from with probability 1/2; among the visited states whose boxes are farthest from their goals (total
Manhattan distance at least 2, and at least the maximum reached minus 1) one is drawn at random and
becomes the puzzle (drawing, rather than always taking the farthest, varies the player's position).
Every puzzle is therefore solvable: the forward pushes undo the pulls.

The player moves with ``U D L R`` and pushes a box by walking into it if the cell beyond the box is
free; a move into a wall, or a push into a wall or another box, is *blocked* (nothing moves, the move
still counts). Solved when every box is on a goal.

Roles (turn order), by ``workflow`` (see :class:`accord.envs.puzzles.grid.PuzzleEnv`):

- ``tool_planner`` (default, the AT-GRPO paper's): the **tool** agent writes a Python program; it runs in
  the sandbox with ``state.json`` = ``{"size", "rows" (the room in the notation below), "walls", "goals",
  "boxes" (lists of [row, col]), "player": [row, col], "moves_left", "moves_per_turn"}`` and should print
  a line ``Moves: ...`` (e.g. from a breadth-first search over (player, boxes)). Its output (or error)
  is shown to the **planner**, whose ``Moves:`` line is applied to the real state (at most
  ``max_moves_per_turn`` per turn).
- ``direct``: the **planner** writes the list as text and it is simulated on a copy; the **executor**
  sees it and writes the moves applied to the real state.
- ``single_agent=True``: one ``solver`` writes the moves.

An episode ends when solved, at the move cap ``max_moves`` (200, the reference's), or after
``max_turns`` turns.

Rewards per move (the reference's numbers), split into team and local increments:

- **local** (the acting role's own step): -0.01 per move made, -0.05 per blocked move; text with no
  readable move list (or an empty one) applies nothing and costs -0.05; plus, for the role whose moves
  are applied (planner in ``tool_planner``, executor in ``direct``, solver), its step's team increment
  below except the failure penalty (independent learners, ``alpha = 0``, still prefer solving).
- **team** (task progress): +1 when a box reaches a goal, -0.5 when a box leaves one; shaping
  ``0.1 * (phi(s') - phi(s))`` with ``phi = -sum over boxes of the Manhattan distance to the nearest
  goal``; +10 when solved; -5 when the episode ends unsolved (the reference's penalty at the 200-move
  cap, here given at the turn limit too). One departure: the +1 is paid only when the number of boxes
  on goals exceeds its best so far in the episode. With several boxes the reference's +1 / -0.5 pays
  +0.5 for every push off and back onto a goal, which a policy can farm; with one box (the paper's
  setting) nothing changes, since a box reaching the goal solves the puzzle.
- **tool** (``tool_planner``) and **planner** (``direct``): the local reward is the team + local reward
  of applying the printed (tool) or written (planner) moves to the current state now (simulated on a
  copy; no failure penalty); a tool reply with no program, a failing program or output without a
  readable move list earns -0.05. The team increment is 0.

Moves after the puzzle is solved are not applied. A box pushed into a corner that is not a goal can
never leave it; the episode then runs until the move cap or the turn limit.

Tasks: an instance is ``eval`` when the sha1 of its room (walls and goals, without boxes and player) is
0 mod 5, so no eval room appears in training.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

from accord.envs.registry import TaskError, register_task
from accord.envs.puzzles.grid import (COORDS, DIRECTIONS, TOOL_COMMON, Outcome, ParsedMoves, PuzzleEnv, check_int,
                                     generate_split, parse_moves, render_grid, show_moves, split_of)

STEP_COST, BLOCKED_COST = -0.01, -0.05
BOX_ON, BOX_OFF, SHAPING_W, WIN_BONUS, FAIL_PENALTY = 1.0, -0.5, 0.1, 10.0, -5.0

Cell = tuple[int, int]
LEGEND = "# wall, . floor, G goal, B box, * box on a goal, P you, + you on a goal"


def _add(a: Cell, d: tuple[int, int]) -> Cell:
    return a[0] + d[0], a[1] + d[1]


def render_rows(size: int, walls: set[Cell], goals: set[Cell], boxes: set[Cell], player: Cell) -> list[str]:
    """The room as strings in this module's notation (see ``LEGEND``)."""
    rows = []
    for r in range(size):
        row = []
        for c in range(size):
            cell = (r, c)
            if cell in walls:
                row.append("#")
            elif cell in boxes:
                row.append("*" if cell in goals else "B")
            elif cell == player:
                row.append("+" if cell in goals else "P")
            else:
                row.append("G" if cell in goals else ".")
        rows.append("".join(row))
    return rows


def read_rows(rows: Sequence[str]) -> tuple[set[Cell], set[Cell], set[Cell], Cell | None]:
    """Walls, goals, boxes and player of rows in this module's notation."""
    walls, goals, boxes, player = set(), set(), set(), None
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch == "#":
                walls.add((r, c))
            if ch in "G*+":
                goals.add((r, c))
            if ch in "B*":
                boxes.add((r, c))
            if ch in "P+":
                player = (r, c)
    return walls, goals, boxes, player


def _connected(cells: set[Cell]) -> bool:
    if not cells:
        return False
    start = next(iter(cells))
    seen, queue = {start}, deque([start])
    while queue:
        cell = queue.popleft()
        for d in DIRECTIONS.values():
            nxt = _add(cell, d)
            if nxt in cells and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return len(seen) == len(cells)


def generate_sokoban(rng: random.Random, size: int, num_boxes: int, wall_frac: float, split: str | None = None,
                     reverse_steps: int = 100) -> tuple[dict[str, Any], Any] | None:
    """One puzzle by reverse play ``(task, split_key)``, or None for a rejected draw (or, with ``split``,
    when the room belongs to the other split)."""
    inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    inner_set = set(inner)
    walls = {(r, c) for r in range(size) for c in range(size) if (r, c) not in inner_set}
    walls |= set(rng.sample(inner, round(wall_frac * len(inner))))
    floor = [cell for cell in inner if cell not in walls]
    if len(floor) < num_boxes + 2 or not _connected(set(floor)):
        return None
    goals = rng.sample(floor, num_boxes)
    room = render_rows(size, walls, set(goals), set(), (-1, -1))
    if split is not None and split_of(room) != split:
        return None
    boxes = list(goals)  # box i starts on goal i
    player = rng.choice([cell for cell in floor if cell not in boxes])
    visited: list[tuple[int, frozenset, Cell]] = []
    moves = list(DIRECTIONS.values())
    for _ in range(reverse_steps):
        d = rng.choice(moves)
        nxt = _add(player, d)
        if nxt in walls or nxt in boxes:
            continue
        behind = (player[0] - d[0], player[1] - d[1])
        if behind in boxes and rng.random() < 0.5:
            boxes[boxes.index(behind)] = player
        player = nxt
        score = sum(abs(b[0] - g[0]) + abs(b[1] - g[1]) for b, g in zip(boxes, goals))
        if score >= 2 and not set(boxes) <= set(goals):
            visited.append((score, frozenset(boxes), player))
    if not visited:
        return None
    top = max(score for score, _, _ in visited)
    _, best_boxes, best_player = rng.choice([v for v in visited if v[0] >= top - 1])
    rows = render_rows(size, walls, set(goals), set(best_boxes), best_player)
    task = {"size": size, "num_boxes": num_boxes, "rows": rows}
    return task, room


@dataclass
class SokobanState:
    size: int
    walls: frozenset
    goals: frozenset
    boxes: set = field(default_factory=set)
    player: Cell = (0, 0)
    max_moves: int = 200
    per_turn: int = 40
    moves_used: int = 0
    best_on: int = 0


def _phi(boxes: set[Cell], goals: frozenset) -> int:
    return -sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in goals) for b in boxes)


_RULES = ("P is you, B a box, G a goal, * a box on a goal, + you on a goal, # a wall, . floor. Moves: U (up), "
          "D (down), L (left), R (right). Walking into a box pushes it one cell if the cell beyond is free; boxes "
          "cannot be pulled, so never push a box into a corner that is not a goal. The puzzle is solved when every "
          "box is on a goal.")
_FMT = "End your answer with exactly one line: Moves: U R R D"
_INSTRUCTIONS = {
    "planner": ("You are the planner in a two-agent team solving a Sokoban puzzle. " + _RULES + " Propose the "
                "full move sequence that solves it from the current state; your teammate, the executor, sees "
                "your proposal and decides which moves are made.\n" + _FMT),
    "executor": ("You are the executor in a two-agent team solving a Sokoban puzzle. " + _RULES + " The "
                 "planner's proposal is in the observation: check it against the room, fix it if it is wrong, "
                 "and give the moves to make now. Blocked moves are wasted and penalised.\n" + _FMT),
    "solver": ("You solve a Sokoban puzzle. " + _RULES + " Give the moves to make now. Blocked moves are wasted "
               "and penalised.\n" + _FMT),
    "tool": ("You are the tool agent in a two-agent team solving a Sokoban puzzle. " + _RULES + " " + TOOL_COMMON
             + " state.json holds: size; rows, the room as row strings (" + LEGEND + "); walls, goals and boxes "
             "as lists of [row, col] (row 0 at the top); player as [row, col]; moves_left and moves_per_turn. "
             "Moves: U (row-1), D (row+1), L (col-1), R (col+1). Search for a move sequence that puts every box "
             "on a goal (e.g. breadth-first search over the player and box positions) and print it as one line: "
             "Moves: U R R D"),
    "tool_planner": ("You are the planner in a two-agent team solving a Sokoban puzzle. " + _RULES + " Your "
                     "teammate, the tool agent, wrote a program that ran on the current state; its output (or "
                     "error) is in the observation: check it against the room, fix it if it is wrong, and give "
                     "the moves to make now. Blocked moves are wasted and penalised.\n" + _FMT),
}


class SokobanEnv(PuzzleEnv):
    """Sokoban: see the module docstring."""

    name = "sokoban"
    fail_penalty = FAIL_PENALTY

    def __init__(self, size: int = 6, num_boxes: int = 1, wall_frac: float = 0.1, max_turns: int = 5,
                 max_moves_per_turn: int = 40, max_moves: int = 200, single_agent: bool = False,
                 workflow: str = "tool_planner", tool_timeout_s: float = 3.0):
        super().__init__(max_turns=max_turns, single_agent=single_agent, workflow=workflow,
                         tool_timeout_s=tool_timeout_s)
        self.size = check_int("size", size, 6, 20)  # a 3x3 inner room leaves almost no puzzles
        self.num_boxes = check_int("num_boxes", num_boxes, 1, max(1, (size - 2) ** 2 // 4))
        if not isinstance(wall_frac, (int, float)) or not 0.0 <= wall_frac <= 0.3:
            raise TaskError(f"task.options.wall_frac={wall_frac!r}: must be a number in [0, 0.3]")
        self.wall_frac = float(wall_frac)
        self.max_moves_per_turn = check_int("max_moves_per_turn", max_moves_per_turn, 1)
        self.max_moves = check_int("max_moves", max_moves, 1)
        self._instructions = {**_INSTRUCTIONS, "tool": _INSTRUCTIONS["tool"].format(timeout=self.tool_timeout_s)}

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Generated puzzles of ``split`` (default 1000 train / 100 eval), disjoint by room (walls, goals)."""
        return generate_split(self.name, split, limit, seed,
                              lambda rng, split: generate_sokoban(rng, self.size, self.num_boxes, self.wall_frac,
                                                                  split))

    def _load(self, task: dict[str, Any]) -> SokobanState:
        try:
            rows = [str(row) for row in task["rows"]]
        except (KeyError, TypeError) as err:
            raise TaskError(f"sokoban: a task needs 'rows' (list of strings): {err!r}") from err
        n = len(rows)
        if n < 3 or any(len(row) != n or set(row) - set("#.GB*P+") for row in rows):
            raise TaskError(f"sokoban: task {task.get('id')!r} rows must be square, in the notation {LEGEND}")
        walls, goals, boxes, player = read_rows(rows)
        border = {(r, c) for r in range(n) for c in range(n) if r in (0, n - 1) or c in (0, n - 1)}
        if player is None or not boxes or len(boxes) != len(goals) or not border <= walls:
            raise TaskError(f"sokoban: task {task.get('id')!r} needs one player, as many boxes as goals (>= 1) "
                            "and walls all around")
        return SokobanState(size=n, walls=frozenset(walls), goals=frozenset(goals), boxes=boxes, player=player,
                            max_moves=self.max_moves, per_turn=self.max_moves_per_turn,
                            best_on=len(boxes & goals))

    def _parse(self, text: str) -> ParsedMoves:
        return parse_moves(text)

    def _apply(self, s: SokobanState, parsed: ParsedMoves) -> Outcome:
        if not parsed.ok:
            return Outcome(0.0, BLOCKED_COST, "no readable `Moves:` line; nothing was applied.", parse_error=True)
        room = min(s.per_turn, s.max_moves - s.moves_used)
        team = local = 0.0
        applied = pushes = 0
        blocked, events = [], []
        solved = False
        for i, move in enumerate(parsed.moves[:room], 1):
            d = DIRECTIONS[move]
            nxt = _add(s.player, d)
            applied = i
            s.moves_used += 1
            if nxt in s.walls:
                blocked.append(f"#{i} {move} into a wall")
                local += BLOCKED_COST
                continue
            if nxt in s.boxes:
                beyond = _add(nxt, d)
                if beyond in s.walls or beyond in s.boxes:
                    blocked.append(f"#{i} {move} box cannot move")
                    local += BLOCKED_COST
                    continue
                before = _phi(s.boxes, s.goals)
                s.boxes.remove(nxt)
                s.boxes.add(beyond)
                pushes += 1
                team += SHAPING_W * (_phi(s.boxes, s.goals) - before)
                if beyond in s.goals and nxt not in s.goals:
                    on = len(s.boxes & s.goals)
                    if on > s.best_on:
                        team += BOX_ON
                        s.best_on = on
                    events.append(f"a box reached the goal at {beyond}")
                elif nxt in s.goals and beyond not in s.goals:
                    team += BOX_OFF
                    events.append(f"a box left the goal at {nxt}")
            s.player = nxt
            local += STEP_COST
            if s.boxes <= s.goals:
                solved = True
                team += WIN_BONUS
                break
        parts = [f"moves {show_moves(parsed.moves)}: {applied - len(blocked)} moved ({pushes} pushes)"]
        if blocked:
            parts.append(f"{len(blocked)} blocked ({'; '.join(blocked[:5])}{'; ...' if len(blocked) > 5 else ''})")
        if events:
            parts.append("; ".join(events[:4]))
        if len(parsed.moves) > applied:
            why = "after solving" if solved else ("past the move cap" if room < s.per_turn
                                                  else f"past {s.per_turn} per turn")
            parts.append(f"{len(parsed.moves) - applied} not applied ({why})")
        if parsed.ignored:
            parts.append(f"ignored words: {' '.join(parsed.ignored[:5])}")
        feedback = "; ".join(parts) + f". Now at {s.player}; boxes on goals {len(s.boxes & s.goals)} of {len(s.goals)}."
        return Outcome(team, local, feedback, solved=solved, out_of_moves=s.moves_used >= s.max_moves)

    def _show_plan(self, s: SokobanState, parsed: ParsedMoves) -> str:
        return show_moves(parsed.moves) if parsed.ok else "unreadable (no `Moves:` line)"

    def _render(self, s: SokobanState) -> str:
        rows = render_rows(s.size, set(s.walls), set(s.goals), s.boxes, s.player)
        return (f"Sokoban room {s.size}x{s.size}, coordinates {COORDS}.\n{render_grid(rows)}\n"
                f"Legend: {LEGEND}.\nYou: {s.player}. Boxes: {', '.join(map(str, sorted(s.boxes)))}. "
                f"Goals: {', '.join(map(str, sorted(s.goals)))}.")

    def _budget(self, s: SokobanState) -> str:
        return f"Moves used {s.moves_used} of {s.max_moves}, at most {s.per_turn} per turn."

    def _state_data(self, s: SokobanState) -> dict[str, Any]:
        return {"size": s.size, "rows": render_rows(s.size, set(s.walls), set(s.goals), s.boxes, s.player),
                "walls": [list(c) for c in sorted(s.walls)], "goals": [list(c) for c in sorted(s.goals)],
                "boxes": [list(c) for c in sorted(s.boxes)], "player": list(s.player),
                "moves_left": s.max_moves - s.moves_used, "moves_per_turn": s.per_turn}


@register_task("sokoban", "AT-GRPO Sokoban: a tool agent's Python (sandboxed) then a planner pushes the box (6x6)")
def make_sokoban(size: int = 6, num_boxes: int = 1, wall_frac: float = 0.1, max_turns: int = 5,
                 max_moves_per_turn: int = 40, max_moves: int = 200, single_agent: bool = False,
                 workflow: str = "tool_planner", tool_timeout_s: float = 3.0) -> SokobanEnv:
    """Sokoban environment (puzzles by reverse play; see :mod:`accord.envs.puzzles.sokoban`); ``workflow``:
    ``tool_planner`` (tool -> planner, the paper's) or ``direct`` (planner -> executor)."""
    return SokobanEnv(size=size, num_boxes=num_boxes, wall_frac=wall_frac, max_turns=max_turns,
                      max_moves_per_turn=max_moves_per_turn, max_moves=max_moves, single_agent=single_agent,
                      workflow=workflow, tool_timeout_s=tool_timeout_s)
