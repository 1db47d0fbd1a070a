"""``planpath``: AT-GRPO's Plan-Path grid navigation as a turn-based planner -> executor environment.

A ``size`` x ``size`` grid with about ``wall_frac`` of its cells walls (exact count
``round(wall_frac * size**2)``), a start ``P`` and a goal ``G`` joined by a path (checked by BFS; the
start is at least 2 steps from the goal). Agents move ``P`` with ``U D L R``; a move into a wall or off
the grid is *blocked*: ``P`` stays and the move still counts.

Roles (turn order), by ``workflow`` (see :class:`accord.envs.puzzles.grid.PuzzleEnv`):

- ``tool_planner`` (default, the AT-GRPO paper's): the **tool** agent writes a Python program; it runs in
  the sandbox with ``state.json`` = ``{"size", "grid" (rows of '#' and '.'), "rows" (the same with P and
  G), "position": [row, col], "goal": [row, col], "moves_left", "moves_per_turn"}`` and should print a
  line ``Moves: ...`` (e.g. from a BFS). Its output (or error) is shown to the **planner**, whose
  ``Moves:`` line is applied to the real state (at most ``max_moves_per_turn`` per turn, never past the
  move cap ``max_moves``). The tool agent's reward is that of its printed moves applied to a copy now.
- ``direct``: the **planner** writes the move list as text and it is simulated on a copy; the
  **executor** sees it and writes the moves applied to the real state.
- ``single_agent=True``: one ``solver`` writes the moves (the single-agent baseline).

An episode ends at the goal, at the move cap, or after ``max_turns`` turns.

Rewards, as in the reference except where said, split into team and local increments:

- **local** (the acting role's own step): -0.01 per applied move, -0.10 per blocked move; text with
  no readable move list (or an empty one) applies nothing and costs -0.10 (one blocked move); plus,
  for the role whose moves are applied (planner in ``tool_planner``, executor in ``direct``, solver),
  its step's team increment below except the failure penalty, so that with ``alpha = 0`` (independent
  learners) an optimal 8-move solve from distance 8 earns ``8 + 1 + 0.5 - 0.08 = 9.42`` and one safe
  move toward the goal ``0.99 + 0.01 * 8 - 0.01 = 1.06``.
- **team** (task progress): potential shaping ``lam * (gamma * phi(s') - phi(s))`` with
  ``phi = -Manhattan distance to the goal``, ``gamma = shaping_gamma`` (default 0.99, the reference's),
  ``lam = 1``; +1 on reaching the goal; +0.5 more if the path is optimal (the moves made, blocked ones
  included, equal the BFS distance from the start); -1 when the episode ends unsolved.
  Two departures from the reference, both so that the team return of a solved episode beats that of a
  failed one from the same start: (1) the shaping is taken once per executor step (``s`` before its moves,
  ``s'`` after), not per move, and a step that leaves ``P`` where it was earns none. Summed over an
  episode the shaping is ``phi(s_T) - phi(s_0)`` plus ``(1 - gamma) * distance`` after each step, so per
  move ``gamma < 1`` would pay ``0.01 * distance`` for every blocked move and every back-and-forth pair;
  per step the extra is at most ``(1 - gamma) * 2 * (size - 1)`` a turn. (2) The reference gives its -1
  at the step cap; here an episode can also end at the turn limit, and the -1 is given at either end.
  A solved episode's team return beats a failed one's by at least ``2 - 2 * (1 - gamma) * (size - 1) *
  max_turns``: options (or a loaded grid) for which that is not positive are refused. A detour far from
  the goal before solving can still out-earn the shortest path's +0.5 when ``2 * (1 - gamma) * (size - 1)
  * (max_turns - 1) > 0.5`` (the default 10x10 with 4 turns: by at most 0.04, 0.54 - 0.5), for returns
  summed without discount (MAGRPO's ``algorithm.gamma: 1``); ``shaping_gamma: 1`` makes the shaping
  telescope to the distance gained, so that no detour pays.
- **tool** (``tool_planner``) and **planner** (``direct``): the local reward is the team + local reward
  of applying the printed (tool) or written (planner) moves to the current state now (simulated on a
  copy; no failure penalty); a tool reply with no program, a failing program or output without a
  readable move list earns -0.10. The team increment is 0.

Moves after the goal is reached are not applied. Observations show the grid (one character per cell,
row/column indices), the legend, coordinates, turn and move budget, the last step's feedback, and for
the executor the planner's proposal. The planner is not told whether its proposal works: the executor
must judge it.

Tasks are generated from seeds; an instance is ``eval`` when the sha1 of its wall layout is 0 mod 5,
so no eval map appears in training, even with another start or goal.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from accord.envs.registry import TaskError, register_task
from accord.envs.puzzles.grid import (COORDS, DIRECTIONS, TOOL_COMMON, Outcome, ParsedMoves, PuzzleEnv, check_int,
                                     generate_split, parse_moves, render_grid, show_moves, split_of)

STEP_COST, BLOCKED_COST = -0.01, -0.10
GAMMA, LAMBDA = 0.99, 1.0
GOAL_BONUS, OPTIMAL_BONUS, FAIL_PENALTY = 1.0, 0.5, -1.0


def check_shaping(size: int, max_turns: int, gamma: float) -> None:
    """Refuse a grid size and turn count whose shaping surplus, at most ``(1 - gamma) * 2 * (size - 1)`` a
    turn, could let a failed episode's team return reach a solved one's (see the module docstring)."""
    surplus = (1.0 - gamma) * 2 * (size - 1) * max_turns
    if surplus >= GOAL_BONUS - FAIL_PENALTY:
        raise TaskError(f"planpath: a {size}x{size} grid with max_turns={max_turns} and shaping_gamma={gamma} lets "
                        f"an unsolved episode out-earn a solved one (the shaping pays up to {surplus:.2f} for staying "
                        f"far from the goal, the goal and failure differ by 2); set task.options.shaping_gamma=1 or "
                        f"use fewer turns or a smaller grid")

Cell = tuple[int, int]


def shortest_path(grid: Sequence[str], start: Cell, goal: Cell) -> list[str] | None:
    """A shortest move list from ``start`` to ``goal`` on ``grid`` ('#' walls), or None if cut off."""
    n_rows, n_cols = len(grid), len(grid[0])
    prev: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path = []
            while prev[cell] is not None:
                cell, move = prev[cell][0], prev[cell][1]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in DIRECTIONS.items():
            r, c = cell[0] + dr, cell[1] + dc
            if 0 <= r < n_rows and 0 <= c < n_cols and grid[r][c] != "#" and (r, c) not in prev:
                prev[(r, c)] = (cell, move)
                queue.append((r, c))
    return None


def generate_planpath(rng: random.Random, size: int, wall_frac: float,
                      split: str | None = None) -> tuple[dict[str, Any], Any] | None:
    """One random instance ``(task, split_key)``, or None when start and goal are not joined (or, with
    ``split``, when the wall layout belongs to the other split)."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    walls = set(rng.sample(cells, round(wall_frac * size * size)))
    free = [cell for cell in cells if cell not in walls]
    if len(free) < 2:
        return None
    grid = ["".join("#" if (r, c) in walls else "." for c in range(size)) for r in range(size)]
    if split is not None and split_of(grid) != split:
        return None
    start, goal = rng.sample(free, 2)
    path = shortest_path(grid, start, goal)
    if path is None or len(path) < 2:
        return None
    task = {"size": size, "grid": grid, "start": list(start), "goal": list(goal), "optimal": len(path)}
    return task, grid


@dataclass
class PathState:
    grid: list[str]
    pos: Cell
    goal: Cell
    optimal: int
    max_moves: int
    per_turn: int
    moves_used: int = 0


def _manhattan(a: Cell, b: Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


_PLANNER = (
    "You are the planner in a two-agent team solving a grid path puzzle. P is the current position, G the "
    "goal, # a wall, . a free cell. Moves: U (up), D (down), L (left), R (right); a move into a wall or off "
    "the grid is wasted. Propose the full, shortest move sequence from P to G. Your teammate, the executor, "
    "sees your proposal and decides which moves are made.\n"
    "End your answer with exactly one line: Moves: U R R D")
_EXECUTOR = (
    "You are the executor in a two-agent team solving a grid path puzzle. P is the current position, G the "
    "goal, # a wall, . a free cell. Moves: U (up), D (down), L (left), R (right). The planner's proposal is "
    "in the observation: check it against the grid, fix it if it is wrong, and give the moves to make now. "
    "They are applied in order; a move into a wall or off the grid is wasted and penalised; reaching G "
    "solves the puzzle, and the shortest path earns a bonus.\n"
    "End your answer with exactly one line: Moves: U R R D")
_SOLVER = (
    "You solve a grid path puzzle. P is the current position, G the goal, # a wall, . a free cell. Moves: "
    "U (up), D (down), L (left), R (right). Give the moves to make now. They are applied in order; a move "
    "into a wall or off the grid is wasted and penalised; reaching G solves the puzzle, and the shortest "
    "path earns a bonus.\n"
    "End your answer with exactly one line: Moves: U R R D")


_TOOL = (
    "You are the tool agent in a two-agent team solving a grid path puzzle. " + TOOL_COMMON + " state.json holds: "
    "size; grid, a list of row strings with '#' for a wall and '.' for a free cell; rows, the same with P (the "
    "current position) and G (the goal); position and goal as [row, col] (row 0 at the top); moves_left and "
    "moves_per_turn. Moves: U (row-1), D (row+1), L (col-1), R (col+1); a move into a wall or off the grid is "
    "wasted. Compute the shortest move sequence from position to goal (e.g. breadth-first search) and print it "
    "as one line: Moves: U R R D")
_TOOL_PLANNER = (
    "You are the planner in a two-agent team solving a grid path puzzle. P is the current position, G the "
    "goal, # a wall, . a free cell. Moves: U (up), D (down), L (left), R (right). Your teammate, the tool agent, "
    "wrote a program that ran on the current state; its output (or error) is in the observation: check it "
    "against the grid, fix it if it is wrong, and give the moves to make now. They are applied in order; a "
    "move into a wall or off the grid is wasted and penalised; reaching G solves the puzzle, and the shortest "
    "path earns a bonus.\n"
    "End your answer with exactly one line: Moves: U R R D")


class PlanPathEnv(PuzzleEnv):
    """Plan-Path: see the module docstring."""

    name = "planpath"
    fail_penalty = FAIL_PENALTY

    def __init__(self, size: int = 10, wall_frac: float = 0.22, max_turns: int = 4,
                 max_moves_per_turn: int | None = None, max_moves: int | None = None, single_agent: bool = False,
                 workflow: str = "tool_planner", tool_timeout_s: float = 3.0, shaping_gamma: float = GAMMA):
        super().__init__(max_turns=max_turns, single_agent=single_agent, workflow=workflow,
                         tool_timeout_s=tool_timeout_s)
        self.size = check_int("size", size, 4, 50)
        if not isinstance(wall_frac, (int, float)) or not 0.0 <= wall_frac <= 0.5:
            raise TaskError(f"task.options.wall_frac={wall_frac!r}: must be a number in [0, 0.5]")
        self.wall_frac = float(wall_frac)
        self.max_moves_per_turn = None if max_moves_per_turn is None else check_int(
            "max_moves_per_turn", max_moves_per_turn, 1)
        self.max_moves = None if max_moves is None else check_int("max_moves", max_moves, 1)
        if isinstance(shaping_gamma, bool) or not isinstance(shaping_gamma, (int, float)) \
                or not 0.0 < shaping_gamma <= 1.0:
            raise TaskError(f"task.options.shaping_gamma={shaping_gamma!r}: must be a number in (0, 1] (the distance "
                            f"shaping's discount; 0.99 the reference's, 1 pays only the distance gained)")
        self.shaping_gamma = float(shaping_gamma)
        check_shaping(self.size, self.max_turns, self.shaping_gamma)
        self._instructions = {"planner": _PLANNER, "executor": _EXECUTOR, "solver": _SOLVER,
                              "tool": _TOOL.format(timeout=self.tool_timeout_s), "tool_planner": _TOOL_PLANNER}

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Generated instances of ``split`` (default 1000 train / 100 eval), disjoint by wall layout."""
        return generate_split(self.name, split, limit, seed,
                              lambda rng, split: generate_planpath(rng, self.size, self.wall_frac, split))

    def _load(self, task: dict[str, Any]) -> PathState:
        try:
            grid = [str(row) for row in task["grid"]]
            start, goal = (int(task["start"][0]), int(task["start"][1])), (int(task["goal"][0]), int(task["goal"][1]))
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise TaskError(f"planpath: a task needs 'grid' (list of strings), 'start' and 'goal' ([row, col]): "
                            f"{err!r}") from err
        n = len(grid)
        if n < 2 or any(len(row) != n or set(row) - {"#", "."} for row in grid):
            raise TaskError(f"planpath: task {task.get('id')!r} grid must be square rows of '#' and '.'")
        for cell in (start, goal):
            if not (0 <= cell[0] < n and 0 <= cell[1] < n) or grid[cell[0]][cell[1]] == "#":
                raise TaskError(f"planpath: task {task.get('id')!r} start/goal {cell} is off the grid or a wall")
        path = shortest_path(grid, start, goal)
        if path is None:
            raise TaskError(f"planpath: task {task.get('id')!r} has no path from start to goal")
        if n > self.size:
            check_shaping(n, self.max_turns, self.shaping_gamma)
        per_turn = self.max_moves_per_turn or 4 * n
        return PathState(grid=grid, pos=start, goal=goal, optimal=len(path),
                         max_moves=self.max_moves or self.max_turns * per_turn, per_turn=per_turn)

    def _parse(self, text: str) -> ParsedMoves:
        return parse_moves(text)

    def _apply(self, s: PathState, parsed: ParsedMoves) -> Outcome:
        if not parsed.ok:
            return Outcome(0.0, BLOCKED_COST, "no readable `Moves:` line; nothing was applied.", parse_error=True)
        room = min(s.per_turn, s.max_moves - s.moves_used)
        moves = parsed.moves[:room]
        team = local = 0.0
        blocked: list[str] = []
        applied = 0
        solved = False
        n = len(s.grid)
        start = s.pos
        for i, move in enumerate(moves, 1):
            dr, dc = DIRECTIONS[move]
            r, c = s.pos[0] + dr, s.pos[1] + dc
            if not (0 <= r < n and 0 <= c < n):
                blocked.append(f"#{i} {move} off the grid")
                local += BLOCKED_COST
            elif s.grid[r][c] == "#":
                blocked.append(f"#{i} {move} into a wall")
                local += BLOCKED_COST
            else:
                s.pos = (r, c)
                local += STEP_COST
            applied = i
            s.moves_used += 1
            if s.pos == s.goal:
                solved = True
                team += GOAL_BONUS
                if s.moves_used == s.optimal:
                    team += OPTIMAL_BONUS
                break
        if s.pos != start:  # standing still earns no shaping (the formula would pay (1 - gamma) * distance)
            team += LAMBDA * (self.shaping_gamma * -_manhattan(s.pos, s.goal) + _manhattan(start, s.goal))
        parts = [f"moves {show_moves(parsed.moves)}: {applied - len(blocked)} moved"]
        if blocked:
            parts.append(f"{len(blocked)} blocked ({'; '.join(blocked[:5])}{'; ...' if len(blocked) > 5 else ''})")
        if len(parsed.moves) > applied:
            why = "after the goal" if solved else ("past the move cap" if room < s.per_turn
                                                   else f"past {s.per_turn} per turn")
            parts.append(f"{len(parsed.moves) - applied} not applied ({why})")
        if parsed.ignored:
            parts.append(f"ignored words: {' '.join(parsed.ignored[:5])}")
        feedback = "; ".join(parts) + f". Now at {s.pos}."
        if solved:
            feedback += " Reached the goal" + (" by a shortest path." if s.moves_used == s.optimal else ".")
        return Outcome(team, local, feedback, solved=solved, out_of_moves=s.moves_used >= s.max_moves)

    def _show_plan(self, s: PathState, parsed: ParsedMoves) -> str:
        return show_moves(parsed.moves) if parsed.ok else "unreadable (no `Moves:` line)"

    def _render(self, s: PathState) -> str:
        rows = [list(row) for row in s.grid]
        rows[s.goal[0]][s.goal[1]] = "G"
        rows[s.pos[0]][s.pos[1]] = "P"
        return (f"Grid {len(rows)}x{len(rows)}, coordinates {COORDS}.\n"
                f"{render_grid([''.join(r) for r in rows])}\n"
                f"Legend: P you, G goal, # wall, . free.\nYou: {s.pos}. Goal: {s.goal}.")

    def _budget(self, s: PathState) -> str:
        return f"Moves used {s.moves_used} of {s.max_moves}, at most {s.per_turn} per turn."

    def _state_data(self, s: PathState) -> dict[str, Any]:
        rows = [list(row) for row in s.grid]
        rows[s.goal[0]][s.goal[1]] = "G"
        rows[s.pos[0]][s.pos[1]] = "P"
        return {"size": len(s.grid), "grid": list(s.grid), "rows": ["".join(r) for r in rows],
                "position": list(s.pos), "goal": list(s.goal), "moves_left": s.max_moves - s.moves_used,
                "moves_per_turn": s.per_turn}


@register_task("planpath", "AT-GRPO Plan-Path: a tool agent's Python (sandboxed) then a planner moves P to G (size 10)")
def make_planpath(size: int = 10, wall_frac: float = 0.22, max_turns: int = 4, max_moves_per_turn: int | None = None,
                  max_moves: int | None = None, single_agent: bool = False, workflow: str = "tool_planner",
                  tool_timeout_s: float = 3.0, shaping_gamma: float = GAMMA) -> PlanPathEnv:
    """Plan-Path environment; ``max_moves_per_turn`` defaults to ``4 * size`` and ``max_moves`` to
    ``max_turns * max_moves_per_turn``; ``workflow``: ``tool_planner`` (tool -> planner, the paper's) or
    ``direct`` (planner -> executor); ``tool_timeout_s`` limits each tool program; ``shaping_gamma``: the
    distance shaping's discount (0.99, the reference's; 1: only the distance gained pays)."""
    return PlanPathEnv(size=size, wall_frac=wall_frac, max_turns=max_turns, max_moves_per_turn=max_moves_per_turn,
                       max_moves=max_moves, single_agent=single_agent, workflow=workflow,
                       tool_timeout_s=tool_timeout_s, shaping_gamma=shaping_gamma)
