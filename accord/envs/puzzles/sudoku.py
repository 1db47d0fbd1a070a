"""``sudoku``: AT-GRPO's Sudoku as a turn-based tool agent -> planner environment (or planner -> executor).

A ``size`` x ``size`` Sudoku (4, the paper's setting, or 9) with ``holes`` empty cells. The solution
grid is drawn by randomised backtracking (every valid grid can come out) and ``holes`` cells are
emptied at random. Puzzles need not have a unique solution: **any** completion that is a valid Sudoku
and keeps every clue counts as solved. The solved check (:func:`is_solved`) tests the Sudoku rules
and the clues; the stored ``solution`` is never used to judge an answer (the reference's check
ignored the clues, so a valid grid unrelated to the puzzle counted).

Roles (turn order), by ``workflow`` (see :class:`accord.envs.puzzles.grid.PuzzleEnv`):

- ``tool_planner`` (default, the AT-GRPO paper's): the **tool** agent writes a Python program; it runs in
  the sandbox with ``state.json`` = ``{"size", "box" (box side), "grid" (the current grid), "clues" (the
  puzzle), both lists of rows of ints, 0 = empty}`` and should print the completed grid (a line
  ``Grid:`` and ``size`` rows). Its output (or error) is shown to the **planner**, whose grid replaces
  the current one.
- ``direct``: the **planner** writes a complete grid as text and it is checked on a copy; the
  **executor** sees it and submits the grid that replaces the current one.
- ``single_agent=True``: one ``solver`` submits grids.

An episode ends when the grid is solved or after ``max_turns`` turns.

Answer format: after a line ``Grid:``, ``size`` lines of ``size`` cells, rows top to bottom; a cell is a
digit ``1..size``, or ``.``/``0``/``_``/``?`` for a cell left empty. Spaces, commas, ``|``, brackets and
separator lines are ignored, so ``1 2 | 3 4`` and ``[1, 2, 3, 4]`` read as ``1234``; a
``Row 1:`` prefix is dropped; one line of ``size**2`` cells (e.g. a nested list) is also read. Without
a ``Grid:`` line the last block of ``size`` row-like lines is read.

Rewards (the reference's numbers), split into team and local increments. A *cell edit* is a cell whose
value the submitted grid changes; it is the unit the reference's "steps" map to here.

- **local** (the acting role's own step): -0.01 per cell edit (at least -0.01 per submission); -0.5
  for an invalid grid (unreadable, or changing a clue: the submission is rejected and the grid stays
  as it was); -1 for a digit out of range (e.g. 7 in a 4x4; rejected); plus, for the role whose grid
  is submitted (planner in ``tool_planner``, executor in ``direct``, solver), its step's team
  increment below (independent learners, ``alpha = 0``, still prefer solving).
- **team** (task progress): ``0.5 * delta(progress) + 0.02 * delta(units)`` on every accepted grid,
  where progress is the share of holes holding a digit with no duplicate in its row, column or box, and
  units counts the rows, columns and boxes that hold each digit exactly once; on solving, +2 more, plus
  0.5 if the cell edits of the whole episode are at most the number of holes (every empty cell written
  once). The shaping is a potential's change on the solving step too, so an episode's shaping sums to the
  final potential minus the first, whatever the path (the reference pays only the bonus on the solving
  step: a solve split into two submissions earned more than one submission). No failure penalty: a failed
  episode earns at most ``0.5 + 0.02 * 3 * size`` < 2.
- **tool** (``tool_planner``) and **planner** (``direct``): the local reward is the team + local reward
  of submitting the printed (tool) or written (planner) grid now (on a copy); a tool reply with no
  program, a failing program or output without a readable grid earns -0.5. The team increment is 0.

Tasks: an instance is ``eval`` when the sha1 of its *solution grid* is 0 mod 5, so eval puzzles share
neither a puzzle nor a solution grid with training puzzles (4x4 has only 288 solution grids, so
splitting by puzzle alone would put every eval answer in the training set).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Sequence

from accord.envs.registry import TaskError, register_task
from accord.envs.puzzles.grid import TOOL_COMMON, Outcome, PuzzleEnv, check_int, generate_split, split_of, strip_fences

EDIT_COST, INVALID_GRID, OUT_OF_RANGE = -0.01, -0.5, -1.0
SOLVED_BONUS, EFFICIENT_BONUS, PROGRESS_W, UNITS_W = 2.0, 0.5, 0.5, 0.02
BOX = {4: 2, 9: 3}
EMPTY_CHARS = "._0?"

Board = list[list[int]]


def units(n: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """Every row, column and box of an ``n`` x ``n`` Sudoku as (name, cells); names are 1-based."""
    b = BOX[n]
    out = [(f"row {r + 1}", [(r, c) for c in range(n)]) for r in range(n)]
    out += [(f"column {c + 1}", [(r, c) for r in range(n)]) for c in range(n)]
    out += [(f"box {i + 1}", [(b * (i // b) + dr, b * (i % b) + dc) for dr in range(b) for dc in range(b)])
            for i in range(n)]
    return out


def is_solved(board: Sequence[Sequence[int]], clues: Sequence[Sequence[int]]) -> bool:
    """True when ``board`` is a complete valid Sudoku **and** keeps every clue (non-zero cell of ``clues``)."""
    n = len(clues)
    if len(board) != n or any(len(row) != n for row in board):
        return False
    if any(clues[r][c] and board[r][c] != clues[r][c] for r in range(n) for c in range(n)):
        return False
    full = set(range(1, n + 1))
    return all({board[r][c] for r, c in cells} == full for _, cells in units(n))


def duplicates(board: Board) -> list[str]:
    """Names of the units holding some digit twice."""
    out = []
    for name, cells in units(len(board)):
        vals = [board[r][c] for r, c in cells if board[r][c]]
        if len(vals) != len(set(vals)):
            out.append(name)
    return out


def progress(board: Board, clues: Board) -> float:
    """Share of holes holding a digit that has no duplicate in its row, column or box."""
    n = len(board)
    holes = [(r, c) for r in range(n) for c in range(n) if not clues[r][c]]
    if not holes:
        return 1.0
    b = BOX[n]
    good = 0
    for r, c in holes:
        v = board[r][c]
        if not v:
            continue
        peers = {(r, j) for j in range(n)} | {(i, c) for i in range(n)}
        peers |= {(b * (r // b) + i, b * (c // b) + j) for i in range(b) for j in range(b)}
        peers.discard((r, c))
        good += all(board[i][j] != v for i, j in peers)
    return good / len(holes)


def complete_units(board: Board) -> int:
    """How many rows, columns and boxes hold each digit exactly once."""
    full = set(range(1, len(board) + 1))
    return sum({board[r][c] for r, c in cells} == full for _, cells in units(len(board)))


def random_solution(rng: random.Random, n: int) -> Board:
    """A random complete ``n`` x ``n`` Sudoku by randomised backtracking."""
    b = BOX[n]
    board = [[0] * n for _ in range(n)]

    def fill(k: int) -> bool:
        if k == n * n:
            return True
        r, c = divmod(k, n)
        used = set(board[r]) | {board[i][c] for i in range(n)}
        used |= {board[b * (r // b) + i][b * (c // b) + j] for i in range(b) for j in range(b)}
        digits = [d for d in range(1, n + 1) if d not in used]
        rng.shuffle(digits)
        for d in digits:
            board[r][c] = d
            if fill(k + 1):
                return True
        board[r][c] = 0
        return False

    fill(0)
    return board


def to_rows(board: Board) -> list[str]:
    """A board as strings, ``.`` for empty cells."""
    return ["".join(str(v) if v else "." for v in row) for row in board]


def from_rows(rows: Sequence[str]) -> Board:
    """Strings of digits and ``.`` as a board (0 for empty)."""
    return [[0 if ch in EMPTY_CHARS else int(ch) for ch in row] for row in rows]


def generate_sudoku(rng: random.Random, n: int, holes: int,
                    split: str | None = None) -> tuple[dict[str, Any], Any] | None:
    """One random instance ``(task, split_key)``; the split key is the solution grid (None when, with
    ``split``, the solution belongs to the other split)."""
    solution = random_solution(rng, n)
    if split is not None and split_of(to_rows(solution)) != split:
        return None
    puzzle = [row[:] for row in solution]
    for k in rng.sample(range(n * n), holes):
        puzzle[k // n][k % n] = 0
    task = {"size": n, "puzzle": to_rows(puzzle), "solution": to_rows(solution), "holes": holes}
    return task, task["solution"]


_GRID_KEY = re.compile(r"(?im)\b(?:grid|answer|solution)\s*:")
_ROW_PREFIX = re.compile(r"(?i)^\s*(?:row\s*\d+|r\d+)\s*[:=.)]")
_SEPARATORS = re.compile(r"[\s,|;\[\](){}'\"+\-=:*`#]")
_CELLS = set("0123456789" + EMPTY_CHARS)


@dataclass(frozen=True)
class ParsedGrid:
    """A grid read from text: ``rows`` of cell characters, or None when no grid was found."""

    rows: tuple[str, ...] | None


def parse_grid(text: str, n: int) -> ParsedGrid:
    """Read an ``n`` x ``n`` grid from model text (format in the module docstring); never raises."""
    text = strip_fences(text)
    marks = list(_GRID_KEY.finditer(text))
    regions = [text[marks[-1].end():], text] if marks else [text]
    for region in regions:
        blocks, cur = [], []
        single = None
        for line in region.splitlines():
            s = _SEPARATORS.sub("", _ROW_PREFIX.sub("", line))
            if not s:
                continue
            if len(s) == n and all(ch in _CELLS for ch in s):
                cur.append(s)
                continue
            if len(s) == n * n and all(ch in _CELLS for ch in s):
                single = s
            if cur:
                blocks.append(cur)
                cur = []
        if cur:
            blocks.append(cur)
        full = [blk for blk in blocks if len(blk) >= n]
        if full:
            return ParsedGrid(tuple(full[-1][-n:]))
        if single is not None:
            return ParsedGrid(tuple(single[i * n:(i + 1) * n] for i in range(n)))
    return ParsedGrid(None)


@dataclass
class SudokuState:
    clues: Board
    board: Board
    holes: int
    edits: int = 0


def _instr(role: str, n_note: str) -> str:
    common = ("Fill every empty cell (.) with a digit so that each row, column and box holds each digit exactly "
              "once; the puzzle's digits (clues) are fixed.")
    fmt = ("Answer format: a line `Grid:` and then the grid, one row per line, e.g. for 4x4:\n"
           "Grid:\n1234\n3412\n2143\n4321")
    if role == "tool":
        head = ("You are the tool agent in a two-agent team solving a Sudoku. " + TOOL_COMMON + " state.json "
                "holds: size; box, the side of a box; grid, the current grid, and clues, the puzzle, both as lists "
                "of rows of integers with 0 for an empty cell. Solve it (e.g. by backtracking) and print the grid "
                "in the answer format below.")
    elif role == "tool_planner":
        head = ("You are the planner in a two-agent team solving a Sudoku. Your teammate, the tool agent, wrote "
                "a program that ran on the current grid; its output (or error) is in the observation: check it "
                "(rows, columns, boxes, clues), fix it if needed, and submit the grid. A submission that changes "
                "a clue is rejected and penalised.")
    elif role == "planner":
        head = ("You are the planner in a two-agent team solving a Sudoku. Propose a complete solution grid; "
                "your teammate, the executor, sees it and decides what is submitted.")
    elif role == "executor":
        head = ("You are the executor in a two-agent team solving a Sudoku. The planner's proposal is in the "
                "observation: check it (rows, columns, boxes, clues), fix it if needed, and submit the grid. "
                "A submission that changes a clue is rejected and penalised.")
    else:
        head = "You solve a Sudoku. Submit the grid; a submission that changes a clue is rejected and penalised."
    return f"{head} {common} {n_note}\n{fmt}"


class SudokuEnv(PuzzleEnv):
    """Sudoku: see the module docstring."""

    name = "sudoku"
    fail_penalty = 0.0

    def __init__(self, size: int = 4, holes: int | None = None, max_turns: int = 4, single_agent: bool = False,
                 workflow: str = "tool_planner", tool_timeout_s: float = 3.0):
        super().__init__(max_turns=max_turns, single_agent=single_agent, workflow=workflow,
                         tool_timeout_s=tool_timeout_s)
        if size not in BOX:
            raise TaskError(f"task.options.size={size!r}: Sudoku size must be 4 or 9")
        self.size = size
        self.holes = size * size // 2 if holes is None else check_int("holes", holes, 1, size * size - 1)
        note = "Digits are 1 to the grid size; leave a cell you cannot fill as '.'."
        self._instructions = {r: _instr(r, note) for r in ("planner", "executor", "solver", "tool_planner")}
        self._instructions["tool"] = _instr("tool", note).replace("{timeout:g}", f"{self.tool_timeout_s:g}")

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        """Generated puzzles of ``split`` (default 1000 train / 100 eval), disjoint by solution grid."""
        return generate_split(self.name, split, limit, seed,
                              lambda rng, split: generate_sudoku(rng, self.size, self.holes, split))

    def _load(self, task: dict[str, Any]) -> SudokuState:
        try:
            rows = [str(row) for row in task["puzzle"]]
        except (KeyError, TypeError) as err:
            raise TaskError(f"sudoku: a task needs 'puzzle' (list of row strings): {err!r}") from err
        n = len(rows)
        if n not in BOX or any(len(row) != n or any(not (ch in EMPTY_CHARS or ch in "123456789"[:n]) for ch in row)
                               for row in rows):
            raise TaskError(f"sudoku: task {task.get('id')!r} puzzle must be 4 or 9 rows of that many cells "
                            f"(digits 1..n or '.')")
        clues = from_rows(rows)
        if duplicates(clues):
            raise TaskError(f"sudoku: task {task.get('id')!r} clues repeat a digit in {duplicates(clues)[0]}")
        return SudokuState(clues=clues, board=[row[:] for row in clues],
                           holes=sum(not v for row in clues for v in row))

    def _parse(self, text: str) -> ParsedGrid:
        return parse_grid(text, len(self._state.clues))

    def _apply(self, s: SudokuState, parsed: ParsedGrid) -> Outcome:
        n = len(s.clues)
        if parsed.rows is None:
            return Outcome(0.0, INVALID_GRID, f"no readable {n}x{n} grid (a `Grid:` line, then {n} lines of {n} "
                                              "cells); nothing changed.", parse_error=True)
        grid = from_rows(parsed.rows)
        bad = [(r, c, grid[r][c]) for r in range(n) for c in range(n) if grid[r][c] > n]
        if bad:
            r, c, v = bad[0]
            return Outcome(0.0, OUT_OF_RANGE, f"digit {v} at row {r + 1}, column {c + 1} is out of range 1-{n}: "
                                              "grid rejected, nothing changed.")
        changed = [(r, c) for r in range(n) for c in range(n) if s.clues[r][c] and grid[r][c] != s.clues[r][c]]
        if changed:
            r, c = changed[0]
            return Outcome(0.0, INVALID_GRID, f"changes {len(changed)} clue(s), e.g. row {r + 1}, column {c + 1} "
                                              f"(clue {s.clues[r][c]}, got {grid[r][c] or '.'}): grid rejected, "
                                              "nothing changed.")
        edits = sum(grid[r][c] != s.board[r][c] for r in range(n) for c in range(n))
        before_p, before_u = progress(s.board, s.clues), complete_units(s.board)
        s.board, s.edits = grid, s.edits + edits
        local = EDIT_COST * max(edits, 1)
        # the shaping is a potential's change, on the solving step too: an episode's shaping sums to the final
        # potential minus the first whatever the path (paying only the bonus there, as the reference does, paid
        # 0.6 more for a solve split into two submissions than for one)
        team = PROGRESS_W * (progress(s.board, s.clues) - before_p) + UNITS_W * (complete_units(s.board) - before_u)
        if is_solved(s.board, s.clues):
            team += SOLVED_BONUS + (EFFICIENT_BONUS if s.edits <= s.holes else 0.0)
            return Outcome(team, local, f"grid accepted ({edits} cells changed): a valid solution.", solved=True)
        dups = duplicates(s.board)
        empty = sum(not v for row in s.board for v in row)
        feedback = (f"grid accepted ({edits} cells changed); {empty} empty cells; duplicates: "
                    f"{', '.join(dups[:6]) + (' ...' if len(dups) > 6 else '') if dups else 'none'}.")
        return Outcome(team, local, feedback)

    def _show_plan(self, s: SudokuState, parsed: ParsedGrid) -> str:
        return "\n" + "\n".join(parsed.rows) if parsed.rows is not None else "unreadable (no grid found)"

    def _render(self, s: SudokuState) -> str:
        n = len(s.clues)
        b = BOX[n]
        text = [f"Sudoku {n}x{n} in {b}x{b} boxes, digits 1-{n}, . = empty; rows and columns numbered from 1."]
        if s.board != s.clues:
            text += ["Puzzle (clues are fixed):", *to_rows(s.clues), "Current grid:"]
        else:
            text.append("Current grid (all digits are clues):")
        text += to_rows(s.board)
        return "\n".join(text)

    def _budget(self, s: SudokuState) -> str:
        return f"Cells edited so far {s.edits}; the puzzle has {s.holes} holes."

    def _state_data(self, s: SudokuState) -> dict[str, Any]:
        return {"size": len(s.clues), "box": BOX[len(s.clues)], "grid": [row[:] for row in s.board],
                "clues": [row[:] for row in s.clues]}


@register_task("sudoku", "AT-GRPO Sudoku: a tool agent's Python (sandboxed) then a planner submits a grid (4x4)")
def make_sudoku(size: int = 4, holes: int | None = None, max_turns: int = 4, single_agent: bool = False,
                workflow: str = "tool_planner", tool_timeout_s: float = 3.0) -> SudokuEnv:
    """Sudoku environment; ``holes`` defaults to half the cells (8 for 4x4, 40 for 9x9); ``workflow``:
    ``tool_planner`` (tool -> planner, the paper's) or ``direct`` (planner -> executor)."""
    return SudokuEnv(size=size, holes=holes, max_turns=max_turns, single_agent=single_agent, workflow=workflow,
                     tool_timeout_s=tool_timeout_s)
