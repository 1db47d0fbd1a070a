"""Oracles: the answer an expert would give each agent, for the demonstrations of ``accord sft``.

An oracle answers one agent in the format the environment parses, from the state the agent sees:

- ``planpath``: a shortest move list from the current position (BFS, :func:`planpath.shortest_path`),
  for the planner's proposal and the executor's (or solver's) moves alike;
- ``sudoku``: a solution of the puzzle's clues (backtracking, :func:`solve_sudoku`), as a ``Grid:`` block;
- ``sokoban``: a shortest move list that puts every box on a goal (BFS over player and box positions,
  :func:`solve_sokoban`);
- ``code`` (coder + tester): the problem's canonical solution for the coder; for the tester, the
  reference tests that the tester's own reader accepts, rewritten to call the entry point (a problem
  whose reference tests have no literal values, e.g. randomised ones, has no tester answer);
- ``handoff`` (turn-based): the path's letters for each agent's part (the second's continuation read from
  what the first wrote);
- ``humaneval`` (helper + main, single-turn and multi-turn): the canonical solution as ``aux`` for the
  helper and an entry point that returns ``aux``'s result for main: correct and collaborative, but a
  trivial wrapper, so it earns 3.5 of the task's 4.5 (the non-trivial split is left for RL to find).

``noisy=True`` asks for a deliberately imperfect answer (the ``sft.noise`` share of demonstrations).
Each oracle draws one of two kinds with equal odds: **suboptimal** (still solves, but worse: a detour
of a back-and-forth move pair; a Sudoku grid with one hole left empty; a correct but longer program is
not attempted, so code has only the wrong kind) or **wrong** (one move replaced by another direction;
two cells of a Sudoku row swapped; a comparison or arithmetic operator of the code flipped, or a tester
assert with a changed expected value).

Oracles read a puzzle environment's current state (``env._state``); they never step or change it.
The centralized baseline of a turn-based environment with an oracle gets every role's answer in one
completion, as ``<role>`` sections (:func:`centralized_oracle`). ``oracle_for(task)`` returns None for a task
without an oracle (writing, math, your own tasks): their demonstrations come from a JSONL file.
"""

from __future__ import annotations

import ast
import random
from collections import deque
from typing import Any, Callable

from accord.envs.puzzles.grid import DIRECTIONS
from accord.envs.puzzles.planpath import PlanPathEnv, shortest_path
from accord.envs.puzzles.sokoban import SokobanEnv
from accord.envs.puzzles.sudoku import BOX, SudokuEnv, to_rows

# oracle(env_or_task, agent, row, rng, noisy) -> answer text, or None when no answer exists from this state
Oracle = Callable[[Any, str, dict, random.Random, bool], "str | None"]

OPPOSITE = {"U": "D", "D": "U", "L": "R", "R": "L"}
SOKOBAN_MAX_STATES = 200_000


def moves_answer(moves: list[str], note: str) -> str:
    return f"{note}\nMoves: {' '.join(moves)}"


def _wrong_move(moves: list[str], rng: random.Random) -> list[str]:
    """``moves`` with one move replaced by another direction."""
    out = list(moves)
    i = rng.randrange(len(out))
    out[i] = rng.choice([d for d in DIRECTIONS if d != out[i]])
    return out


def _detour(moves: list[str], rng: random.Random, free: Callable[[int, str], bool]) -> list[str]:
    """``moves`` with a back-and-forth pair ``d, opposite(d)`` inserted at a position ``i`` where
    ``free(i, d)`` (the step ``d`` after the first ``i`` moves is possible and changes nothing else)."""
    options = [(i, d) for i in range(len(moves) + 1) for d in DIRECTIONS if free(i, d)]
    if not options:
        return _wrong_move(moves, rng)
    i, d = rng.choice(options)
    return moves[:i] + [d, OPPOSITE[d]] + moves[i:]



# --- the tool agent (workflow tool_planner): a program that solves the puzzle from state.json --------

PLANPATH_TOOL_PROGRAM = """\
import json
from collections import deque
s = json.load(open("state.json"))
g, n = s["grid"], s["size"]
start, goal = tuple(s["position"]), tuple(s["goal"])
D = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
prev, q = {start: None}, deque([start])
while q:
    c = q.popleft()
    for m, (dr, dc) in D.items():
        r, cc = c[0] + dr, c[1] + dc
        if 0 <= r < n and 0 <= cc < n and g[r][cc] != "#" and (r, cc) not in prev:
            prev[(r, cc)] = (c, m)
            q.append((r, cc))
path, c = [], goal
while prev[c] is not None:
    c, m = prev[c]
    path.append(m)
print("Moves:", " ".join(reversed(path)))
"""

SUDOKU_TOOL_PROGRAM = """\
import json
s = json.load(open("state.json"))
n, b, g = s["size"], s["box"], s["grid"]
def ok(r, c, v):
    if v in g[r] or any(g[i][c] == v for i in range(n)):
        return False
    r0, c0 = b * (r // b), b * (c // b)
    return all(g[r0 + i][c0 + j] != v for i in range(b) for j in range(b))
def solve():
    for r in range(n):
        for c in range(n):
            if g[r][c] == 0:
                for v in range(1, n + 1):
                    if ok(r, c, v):
                        g[r][c] = v
                        if solve():
                            return True
                        g[r][c] = 0
                return False
    return True
solve()
print("Grid:")
for row in g:
    print("".join(map(str, row)))
"""

SOKOBAN_TOOL_PROGRAM = """\
import json
from collections import deque
s = json.load(open("state.json"))
walls = {tuple(c) for c in s["walls"]}
goals = frozenset(tuple(c) for c in s["goals"])
start = (tuple(s["player"]), frozenset(tuple(c) for c in s["boxes"]))
D = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
prev, q = {start: None}, deque([start])
while q:
    st = q.popleft()
    p, boxes = st
    if boxes <= goals:
        break
    for m, (dr, dc) in D.items():
        nxt = (p[0] + dr, p[1] + dc)
        if nxt in walls:
            continue
        nb = boxes
        if nxt in boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in walls or beyond in boxes:
                continue
            nb = (boxes - {nxt}) | {beyond}
        key = (nxt, nb)
        if key not in prev:
            prev[key] = (st, m)
            q.append(key)
path = []
while prev[st] is not None:
    st, m = prev[st]
    path.append(m)
print("Moves: " + " ".join(reversed(path)))
"""


def tool_answer(program: str, rng: random.Random, noisy: bool) -> str:
    """The tool agent's demonstration: a solver program that reads ``state.json`` and prints the answer;
    a noisy one has one operator flipped (:func:`mutate_program`), so it may print a wrong answer or fail."""
    return fenced(mutate_program(program, rng) if noisy else program)


# --- planpath ---------------------------------------------------------------------------------------

def planpath_oracle(env: PlanPathEnv, agent: str, row: dict, rng: random.Random, noisy: bool) -> str | None:
    if agent == "tool":
        return tool_answer(PLANPATH_TOOL_PROGRAM, rng, noisy)
    s = env._state
    path = shortest_path(s.grid, s.pos, s.goal)
    if not path:
        return None
    note = f"A shortest path from {s.pos} to {s.goal} takes {len(path)} moves."
    if not noisy:
        return moves_answer(path, note)
    n = len(s.grid)
    cells = [s.pos]
    for m in path:
        dr, dc = DIRECTIONS[m]
        cells.append((cells[-1][0] + dr, cells[-1][1] + dc))

    def free(i: int, d: str) -> bool:
        r, c = cells[i][0] + DIRECTIONS[d][0], cells[i][1] + DIRECTIONS[d][1]
        return 0 <= r < n and 0 <= c < n and s.grid[r][c] != "#" and (r, c) != s.goal and i < len(path)

    moves = _detour(path, rng, free) if rng.random() < 0.5 else _wrong_move(path, rng)
    return moves_answer(moves, f"A path from {s.pos} to {s.goal}.")


# --- sudoku -----------------------------------------------------------------------------------------

def solve_sudoku(clues: list[list[int]]) -> list[list[int]] | None:
    """A completion of ``clues`` (0 = empty) that is a valid Sudoku, or None if there is none."""
    n = len(clues)
    box = BOX[n]
    board = [row[:] for row in clues]
    empty = [(r, c) for r in range(n) for c in range(n) if not board[r][c]]

    def ok(r: int, c: int, v: int) -> bool:
        if v in board[r] or any(board[i][c] == v for i in range(n)):
            return False
        br, bc = r - r % box, c - c % box
        return all(board[i][j] != v for i in range(br, br + box) for j in range(bc, bc + box))

    def fill(k: int) -> bool:
        if k == len(empty):
            return True
        r, c = empty[k]
        for v in range(1, n + 1):
            if ok(r, c, v):
                board[r][c] = v
                if fill(k + 1):
                    return True
        board[r][c] = 0
        return False

    return board if fill(0) else None


def sudoku_oracle(env: SudokuEnv, agent: str, row: dict, rng: random.Random, noisy: bool) -> str | None:
    if agent == "tool":
        return tool_answer(SUDOKU_TOOL_PROGRAM, rng, noisy)
    s = env._state
    board = solve_sudoku(s.clues)
    if board is None:
        return None
    note = "A solution that keeps every clue:"
    holes = [(r, c) for r in range(len(board)) for c in range(len(board)) if not s.clues[r][c]]
    if noisy and holes:
        if rng.random() < 0.5:   # suboptimal: one hole left empty (progress, not a solution)
            r, c = rng.choice(holes)
            board[r][c] = 0
        else:                    # wrong: two non-clue cells of one row swapped (a duplicate in their columns)
            rows = [r for r in range(len(board)) if len({board[r][c] for rr, c in holes if rr == r}) >= 2]
            if rows:
                r = rng.choice(rows)
                c1, c2 = rng.sample([c for rr, c in holes if rr == r], 2)
                while board[r][c1] == board[r][c2]:
                    c1, c2 = rng.sample([c for rr, c in holes if rr == r], 2)
                board[r][c1], board[r][c2] = board[r][c2], board[r][c1]
            else:
                r, c = rng.choice(holes)
                board[r][c] = 0
        note = "My grid:"
    return note + "\nGrid:\n" + "\n".join(to_rows(board))


# --- sokoban ----------------------------------------------------------------------------------------

def solve_sokoban(walls: frozenset, goals: frozenset, boxes: frozenset, player: tuple[int, int],
                  max_states: int = SOKOBAN_MAX_STATES) -> list[str] | None:
    """A shortest move list (BFS over player and box positions) after which every box is on a goal;
    None when there is none within ``max_states`` visited states (e.g. a box pushed into a corner)."""
    start = (player, boxes)
    prev: dict = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        p, bs = state
        if bs <= goals:
            path = []
            while prev[state] is not None:
                state, move = prev[state]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in DIRECTIONS.items():
            nxt = (p[0] + dr, p[1] + dc)
            if nxt in walls:
                continue
            nbs = bs
            if nxt in bs:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in bs:
                    continue
                nbs = (bs - {nxt}) | {beyond}
            key = (nxt, nbs)
            if key not in prev:
                if len(prev) >= max_states:
                    return None
                prev[key] = (state, move)
                queue.append(key)
    return None


def sokoban_oracle(env: SokobanEnv, agent: str, row: dict, rng: random.Random, noisy: bool) -> str | None:
    if agent == "tool":
        return tool_answer(SOKOBAN_TOOL_PROGRAM, rng, noisy)
    s = env._state
    path = solve_sokoban(frozenset(s.walls), frozenset(s.goals), frozenset(s.boxes), tuple(s.player))
    if not path:
        return None
    note = f"A shortest solution takes {len(path)} moves."
    if not noisy:
        return moves_answer(path, note)
    cells, box_at = [tuple(s.player)], [set(s.boxes)]   # the player's cells and the boxes along the path
    for m in path:
        dr, dc = DIRECTIONS[m]
        nxt = (cells[-1][0] + dr, cells[-1][1] + dc)
        boxes = box_at[-1]
        if nxt in boxes:
            boxes = (boxes - {nxt}) | {(nxt[0] + dr, nxt[1] + dc)}
        cells.append(nxt)
        box_at.append(boxes)

    def free(i: int, d: str) -> bool:
        r, c = cells[i][0] + DIRECTIONS[d][0], cells[i][1] + DIRECTIONS[d][1]
        return (r, c) not in s.walls and (r, c) not in box_at[i] and i < len(path)  # after the last move it is solved

    moves = _detour(path, rng, free) if rng.random() < 0.5 else _wrong_move(path, rng)
    return moves_answer(moves, "A solution.")


# --- code -------------------------------------------------------------------------------------------

_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv}


def mutate_program(code: str, rng: random.Random) -> str:
    """``code`` with one comparison or arithmetic operator flipped (``<`` to ``<=``, ``+`` to ``-``, ...);
    ``code`` unchanged when it has none."""
    tree = ast.parse(code)
    spots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            spots.extend((node, i) for i, op in enumerate(node.ops) if type(op) in _FLIP)
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _FLIP:
            spots.append((node, None))
    if not spots:
        return code
    node, i = rng.choice(spots)
    if i is None:
        node.op = _FLIP[type(node.op)]()
    else:
        node.ops[i] = _FLIP[type(node.ops[i])]()
    return ast.unparse(tree)


def _entry_def(code: str, entry: str) -> ast.FunctionDef:
    tree = ast.parse(code)
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)


def fenced(code: str) -> str:
    """``code`` in one ```python block, as a model would answer."""
    return f"```python\n{code.strip()}\n```"


def coder_answer(problem: dict, rng: random.Random, noisy: bool) -> str:
    code = problem["canonical"]
    if noisy:
        code = mutate_program(code, rng)
    return fenced(code)


def tester_answer(problem: dict, rng: random.Random, noisy: bool, max_tests: int) -> str | None:
    """The reference tests, calling the entry point by name, that :func:`accord.envs.coding.code.read_tests` accepts."""
    from accord.envs.coding.code import read_tests
    from accord.envs.coding.common import case_sources

    entry, alias = problem["entry_point"], problem.get("test_entry_point") or None
    lines = []
    for src in case_sources(problem["test"], alias):
        tree = ast.parse(src)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in ("candidate", alias or entry):
                node.id = entry
        lines.append(ast.unparse(tree))
    _, tests = read_tests(fenced("\n".join(lines)), entry, max_tests)
    if noisy and tests:   # wrong: one expected value changed
        i = rng.randrange(len(tests))
        tree = ast.parse(tests[i])
        consts = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, (int, float, str))
                  and not isinstance(n.value, bool)]
        if consts:
            c = consts[-1]
            c.value = c.value + "x" if isinstance(c.value, str) else c.value + 1
            tests[i] = ast.unparse(tree)
    return fenced("\n".join(tests)) if tests else None   # no reference test with literal values to copy


def code_oracle(env, agent: str, row: dict, rng: random.Random, noisy: bool) -> str | None:
    if agent in ("coder", "solo"):
        return coder_answer(row, rng, noisy)
    return tester_answer(row, rng, noisy, env.max_tests)


def helper_main_answer(agent: str, problem: dict, rng: random.Random, noisy: bool) -> str | None:
    if not problem.get("canonical"):
        return None
    entry = problem["entry_point"]
    canonical = problem["canonical"]
    if noisy:
        canonical = mutate_program(canonical, rng)
    func = _entry_def(canonical, entry)
    args = [a.arg for a in func.args.posonlyargs + func.args.args]
    if agent == "helper":
        func.name = "aux"
        func.body = [st for i, st in enumerate(func.body)
                     if not (i == 0 and isinstance(st, ast.Expr) and isinstance(getattr(st, "value", None), ast.Constant))]
        return fenced(ast.unparse(func))
    a = func.args
    call = ", ".join(args + ([f"*{a.vararg.arg}"] if a.vararg else []) + [f"{k.arg}={k.arg}" for k in a.kwonlyargs]
                     + ([f"**{a.kwarg.arg}"] if a.kwarg else []))
    doc = func.body[:1] if func.body and isinstance(func.body[0], ast.Expr) and isinstance(
        getattr(func.body[0], "value", None), ast.Constant) else []
    func.body = doc + ast.parse(f"result = aux({call})\nreturn result").body
    return fenced(ast.unparse(func))


def humaneval_oracle(task, agent: str, row: dict, rng: random.Random, noisy: bool) -> str | None:
    return helper_main_answer(agent, row, rng, noisy)


def centralized_oracle(env: Any, agent: str, row: dict, rng: random.Random, noisy: bool) -> str | None:
    """The centralized baseline's answer (:class:`~accord.envs.centralized.CentralizedEnv` over a multi-turn
    environment): each role's oracle answer in a ``<role>`` section, in turn order, every later role answering
    the state after the earlier roles' answers (played on a copy); ``noisy`` applies to every role."""
    inner = env.inner
    oracle = oracle_for(inner)
    sim = inner.clone()
    sections = []
    for role in env.roles:
        text = oracle(sim, role, row, rng, noisy)
        if text is None:
            return None
        sections.append(f"<{role}>\n{text}\n</{role}>")
        if not inner.simultaneous and sim.step({role: text}).done:
            break
    return "\n".join(sections)


def handoff_oracle(env: Any, agent: str, row: dict, rng: random.Random, noisy: bool) -> str | None:
    """``handoff`` (turn-based): the path's letters for the agent's part (the first's half from the start the
    ``start`` option gives, a free start drawn at random; the second's continuation of the first's last clean
    item, read from the environment's state; ``solo`` both halves). Noisy: one letter replaced by another
    (wrong). None for the second when the first wrote no clean item (nothing to continue)."""
    from accord.envs.cooperation.handoff import SECOND, last_clean, path
    from accord.envs.cooperation.items import items

    rules = env.rules
    letters, n = rules.letters, rules.length
    if agent == SECOND:
        stop = last_clean(items(env._first_text or "", letters))
        if stop is None:
            return None
        seq = path(letters, stop, n + 1)[1:]
    else:
        if rules.start == "given":
            seq = path(letters, row["start"], 2 * n + 1)[1:]
        else:
            seq = path(letters, letters[0] if rules.start == "fixed" else rng.choice(letters), 2 * n)
        seq = seq if agent != "first" else seq[:n]
    if noisy:
        i = rng.randrange(len(seq))
        seq[i] = rng.choice([c for c in letters if c != seq[i]])
    return " ".join(seq)


def oracle_for(task: Any) -> Oracle | None:
    """The oracle of a task or environment, or None when it has none (demonstrations then come from a file)."""
    from accord.envs.centralized import CentralizedEnv
    from accord.envs.coding.code import CodeEnv
    from accord.envs.coding.humaneval import HelperMainEnv, HelperMainTask

    if isinstance(task, CentralizedEnv) and not task.inner.simultaneous and oracle_for(task.inner) is not None:
        return centralized_oracle
    if isinstance(task, PlanPathEnv):
        return planpath_oracle
    if isinstance(task, SudokuEnv):
        return sudoku_oracle
    if isinstance(task, SokobanEnv):
        return sokoban_oracle
    if isinstance(task, CodeEnv):
        return code_oracle
    if isinstance(task, (HelperMainTask, HelperMainEnv)):
        return humaneval_oracle
    from accord.envs.cooperation.handoff import HandoffEnv
    if isinstance(task, HandoffEnv):
        return handoff_oracle
    return None
