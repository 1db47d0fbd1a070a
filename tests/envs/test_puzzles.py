"""AT-GRPO's puzzle environments: Plan-Path, Sudoku, Sokoban (protocol, rewards, generators, parsing)."""

import json
import random
from collections import deque

import pytest

from accord.envs import make_task
from accord.envs.registry import TaskError
from accord.envs.check import GARBAGE, check_env
from accord.envs.puzzles.grid import DIRECTIONS, parse_moves, split_of
from accord.envs.puzzles.planpath import PlanPathEnv as _PlanPathEnv, shortest_path
from accord.envs.puzzles.sokoban import SokobanEnv as _SokobanEnv, read_rows
from accord.envs.puzzles.sudoku import SudokuEnv as _SudokuEnv, complete_units, is_solved, parse_grid, progress


# These tests play the direct workflow (planner -> executor, moves written as text). Since the default
# workflow became the paper's tool agent -> planner, they ask for it by name; the tool workflow is tested
# in tests/envs/test_puzzles_tool_agent.py.
def PlanPathEnv(**kw):
    return _PlanPathEnv(**{"workflow": "direct", **kw})


def SudokuEnv(**kw):
    return _SudokuEnv(**{"workflow": "direct", **kw})


def SokobanEnv(**kw):
    return _SokobanEnv(**{"workflow": "direct", **kw})

SUDOKU_ACTIONS = ["Grid:\n1234\n3412\n2143\n4321", "```\nGrid:\n1 2 | 3 4\n3 4 | 1 2\n-----\n2 1 | 4 3\n4 3 | 2 1\n```",
                  "Grid:\n12..\n....\n....\n....", "Grid:\n5678\n1234\n1234\n1234"]
MOVE_ACTIONS = ["Moves: U R R D", "moves: left, down", "I think this works.\nMoves: R D D", "**Moves:** U U L"]


def moves_text(moves):
    return "Let me think.\nMoves: " + " ".join(moves)


def run_episode(env, task, executor_texts, planner_text="Moves: U"):
    """Play ``task`` to the end; returns (team return, per-agent local returns, last StepResult)."""
    env.reset(task)
    team, local, i, res = 0.0, dict.fromkeys(env.agents, 0.0), 0, None
    while res is None or not res.done:
        agent = env.acting()[0]
        text = planner_text if agent == "planner" else executor_texts[min(i, len(executor_texts) - 1)]
        if agent != "planner":
            i += 1
        res = env.step({agent: text})
        team += res.team_reward
        for a, v in res.local_rewards.items():
            local[a] += v
    return team, local, res


# ------------------------------------------------------------------------------------------------ protocol

@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("factory,actions", [
    (lambda **kw: PlanPathEnv(size=5, **kw), MOVE_ACTIONS),
    (lambda **kw: SudokuEnv(**kw), SUDOKU_ACTIONS),
    (lambda **kw: SokobanEnv(**kw), MOVE_ACTIONS),
], ids=["planpath", "sudoku", "sokoban"])
def test_check_env(factory, actions, single):
    check_env(lambda: factory(single_agent=single), actions=actions)


def test_check_env_larger_settings():
    check_env(lambda: PlanPathEnv(), actions=MOVE_ACTIONS, n_tasks=2)
    check_env(lambda: SudokuEnv(size=9), actions=["Grid:\n" + "\n".join(["123456789"] * 9)], n_tasks=2)
    check_env(lambda: SokobanEnv(num_boxes=2, size=7), actions=MOVE_ACTIONS, n_tasks=2)


def test_registered_and_options_validated():
    env = make_task("planpath", {"size": 5, "single_agent": True})
    assert env.agents == ("solver",) and env.max_turns == 4
    assert make_task("sudoku").agents == ("tool", "planner")        # the paper's roles are the default
    assert make_task("sudoku", {"workflow": "direct"}).agents == ("planner", "executor")
    assert make_task("sokoban").max_turns == 5
    for name, options, key in [("planpath", {"size": 2}, "size"), ("planpath", {"wall_frac": 0.9}, "wall_frac"),
                               ("sudoku", {"size": 5}, "size"), ("sudoku", {"holes": 16}, "holes"),
                               ("sokoban", {"num_boxes": 0}, "num_boxes"), ("sokoban", {"max_turns": 0}, "max_turns")]:
        with pytest.raises(TaskError, match=key):
            make_task(name, options)


def test_planpath_refuses_shaping_that_lets_failure_out_earn_a_solve():
    """The shaping's surplus (1 - gamma) * 2 * (size - 1) a turn must stay under the 2 between the goal's +1 and
    the failure's -1, at construction and for a loaded grid larger than ``size``."""
    with pytest.raises(TaskError, match=r"40x40 grid with max_turns=10 .*task.options.shaping_gamma=1"):
        make_task("planpath", {"size": 40, "max_turns": 10})
    assert make_task("planpath", {"size": 40, "max_turns": 10, "shaping_gamma": 1}).shaping_gamma == 1.0
    for bad in (0, 1.5, True, "0.99"):
        with pytest.raises(TaskError, match=r"task.options.shaping_gamma=.*must be a number in \(0, 1\]"):
            make_task("planpath", {"shaping_gamma": bad})
    env = PlanPathEnv(size=5, max_turns=12, single_agent=True)
    big = {"id": "big", "grid": ["." * 20] * 20, "start": [0, 1], "goal": [0, 0]}
    with pytest.raises(TaskError, match="20x20 grid with max_turns=12"):
        env.reset(big)


@pytest.mark.parametrize("gamma", [0.99, 1.0])
def test_planpath_a_detour_far_from_the_goal_pays_only_below_gamma_one(gamma):
    """Summed without discount, gamma < 1 pays (1 - gamma) x distance after every step: on a 10x10 grid with 6
    turns, walking to the far corner and back out-earns the shortest path's +0.5 (the module docstring's
    bound); with shaping_gamma 1 the shaping telescopes and the detour returns less."""
    env = PlanPathEnv(size=10, max_turns=6, single_agent=True, shaping_gamma=gamma)
    task = {"id": "open", "grid": ["." * 10] * 10, "start": [0, 1], "goal": [0, 0]}
    env.reset(task)
    direct = env.step({"solver": "Moves: L"})
    assert direct.done and direct.info["success"] and direct.team_reward == pytest.approx(1 + 1 + 0.5)
    env.reset(task)
    turns = ["Moves: " + " ".join("R" * 8 + "D" * 9), "Moves: U", "Moves: D", "Moves: U", "Moves: D",
             "Moves: " + " ".join("U" * 9 + "L" * 9)]
    detour = [env.step({"solver": text}) for text in turns]
    assert detour[-1].done and detour[-1].info["success"] and not any(r.done for r in detour[:-1])
    total = sum(r.team_reward for r in detour)
    if gamma < 1:
        assert total == pytest.approx(2.5 + 0.38) and total > direct.team_reward
    else:
        assert total == pytest.approx(2.0) and total < direct.team_reward


def test_a_split_with_no_layout_names_the_cause():
    env = make_task("planpath", {"size": 4, "wall_frac": 0.0})   # one wall layout: it lands in one split only
    assert len(env.tasks("train", 3)) == 3
    with pytest.raises(TaskError, match=r"no 'eval' instance .*task.options.wall_frac above 0"):
        env.tasks("eval", 3)


def test_protocol_misuse_raises():
    env = PlanPathEnv(size=5, max_turns=1)
    task = env.tasks("train", 1)[0]
    with pytest.raises(RuntimeError):
        env.step({"planner": "Moves: U"})
    env.reset(task)
    with pytest.raises(ValueError, match="planner"):
        env.step({"executor": "Moves: U"})
    env.step({"planner": "Moves: U"})
    res = env.step({"executor": "junk"})
    assert res.done and res.info["success"] is False
    with pytest.raises(RuntimeError):
        env.step({"planner": "Moves: U"})


def test_tasks_are_json_and_reset_from_json():
    for env in (PlanPathEnv(size=5), SudokuEnv(), SokobanEnv()):
        task = env.tasks("eval", 1)[0]
        back = json.loads(json.dumps(task))
        assert back == task
        assert env.reset(back) == env.reset(task)


# ------------------------------------------------------------------------------------------------ Plan-Path

def _blocked_move(task):
    grid, (r, c) = task["grid"], task["start"]
    n = len(grid)
    for m, (dr, dc) in DIRECTIONS.items():
        rr, cc = r + dr, c + dc
        if not (0 <= rr < n and 0 <= cc < n) or grid[rr][cc] == "#":
            return m
    return None


def test_planpath_bfs_path_solves_with_optimal_bonus():
    env = PlanPathEnv(size=5)
    for task in env.tasks("train", 20):
        path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
        assert len(path) == task["optimal"]
        env.reset(task)
        env.step({"planner": moves_text(path)})
        res = env.step({"executor": moves_text(path)})
        assert res.done and res.info["success"] is True
        d = abs(task["start"][0] - task["goal"][0]) + abs(task["start"][1] - task["goal"][1])
        assert res.team_reward == pytest.approx(d + 1.0 + 0.5)  # shaping gamma*0 - (-d), goal, optimal
        # the mover's local reward carries its own step's progress as well as its move costs
        assert res.local_rewards["executor"] == pytest.approx(d + 1.0 + 0.5 - 0.01 * len(path))
        assert res.local_rewards["planner"] == 0.0


def test_planpath_detour_loses_optimal_bonus_and_blocked_moves_cost():
    env = PlanPathEnv(size=5)
    task = next(t for t in env.tasks("train", 50) if _blocked_move(t))
    path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
    env.reset(task)
    env.step({"planner": "Moves: U"})
    best = env.step({"executor": moves_text(path)})
    env.reset(task)
    env.step({"planner": "Moves: U"})
    detour = env.step({"executor": moves_text([_blocked_move(task)] + path)})
    assert detour.info["success"]
    assert best.team_reward - detour.team_reward == pytest.approx(0.5)
    assert best.local_rewards["executor"] - detour.local_rewards["executor"] == pytest.approx(0.5 + 0.10)
    assert "1 blocked" in detour.observations["planner"]
    # a lone blocked move: -0.10, no shaping, state unchanged
    env.reset(task)
    env.step({"planner": "Moves: U"})
    res = env.step({"executor": f"Moves: {_blocked_move(task)}"})
    assert res.local_rewards["executor"] == pytest.approx(-0.10) and res.team_reward == 0.0
    assert env._state.pos == tuple(task["start"])


def test_planpath_success_beats_failure_and_failure_penalty():
    env = PlanPathEnv(size=5)
    task = env.tasks("train", 1)[0]
    path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
    win, _, last = run_episode(env, task, [moves_text(path)])
    assert last.info["success"]
    lose, local, last = run_episode(env, task, ["no idea", "Moves:", "```\n???\n```", "blah"])
    assert not last.info["success"] and env._turn == env.max_turns
    assert lose == pytest.approx(-1.0)                       # only the failure penalty
    assert local["executor"] == pytest.approx(-0.4)          # four unreadable answers
    assert win > lose
    # a wandering failure (away and back, many times) still returns less than the success
    wander = ["U D L R R L D U " * 2] * 4
    lose2, _, last = run_episode(env, task, wander)
    assert not last.info["success"] and lose2 < win


def test_planpath_move_cap_ends_episode():
    env = PlanPathEnv(size=5, max_moves=3, max_turns=4)
    task = next(t for t in env.tasks("train", 50) if t["optimal"] > 3 and _blocked_move(t))
    env.reset(task)
    env.step({"planner": "Moves: U"})
    res = env.step({"executor": "Moves: " + " ".join([_blocked_move(task)] * 6)})
    assert res.done and not res.info["success"] and env._turn == 1
    assert "0 moved; 3 blocked" in res.info["feedback"] and "Out of moves" in res.observations["executor"]
    assert res.team_reward == pytest.approx(-1.0)
    assert res.local_rewards["executor"] == pytest.approx(-0.30)


def test_planner_never_changes_state_and_is_shown_to_executor():
    env = PlanPathEnv(size=5)
    task = env.tasks("train", 1)[0]
    path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
    obs = env.reset(task)
    good = env.step({"planner": moves_text(path)})
    assert good.team_reward == 0.0 and not good.done and good.info["plan_solves"]
    assert good.observations["planner"] == obs["planner"]
    assert env._state.pos == tuple(task["start"]) and env._state.moves_used == 0
    assert "Planner's proposal: " + " ".join(path) in good.observations["executor"]
    assert "Planner's proposal" not in good.observations["planner"]
    env.reset(task)
    wrong = env.step({"planner": moves_text([{"U": "D", "D": "U", "L": "R", "R": "L"}[m] for m in path])})
    env.reset(task)
    junk = env.step({"planner": "I would go around the wall."})
    assert junk.info["parse_error"] == {"planner": True}
    assert good.local_rewards["planner"] > wrong.local_rewards["planner"]
    assert good.local_rewards["planner"] > junk.local_rewards["planner"]
    assert good.local_rewards["executor"] == 0.0
    # the proposal is gone once the executor has acted
    after = env.step({"executor": moves_text(path[:1])})
    assert "none yet this turn" in after.observations["executor"]


def test_single_agent_solver():
    env = PlanPathEnv(size=5, single_agent=True)
    task = env.tasks("train", 1)[0]
    path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
    obs = env.reset(task)
    assert set(obs) == {"solver"} and "proposal" not in obs["solver"]
    res = env.step({"solver": moves_text(path)})
    assert res.done and res.info["success"] and set(res.local_rewards) == {"solver"}


def test_planpath_observation_is_compact():
    env = PlanPathEnv()
    obs = env.reset(env.tasks("eval", 1)[0])
    assert len(obs["executor"]) < 700
    assert "Legend" in obs["planner"] and "row 0 at the top" in obs["planner"]
    assert "Moves:" in env.instructions("executor") and "Moves:" in env.instructions("planner")


# ------------------------------------------------------------------------------------------------ Sudoku

def _relabel(rows, a="1", b="2"):
    return ["".join({a: b, b: a}.get(ch, ch) for ch in row) for row in rows]


def _board(rows):
    return [[0 if ch == "." else int(ch) for ch in row] for row in rows]


def _shaping(task) -> float:
    """The shaping a solve earns whatever its path: the potential of the solution minus the puzzle's."""
    puzzle, solution = _board(task["puzzle"]), _board(task["solution"])
    return (0.5 * (progress(solution, puzzle) - progress(puzzle, puzzle))
            + 0.02 * (complete_units(solution) - complete_units(puzzle)))


def test_sudoku_solution_solves_and_clue_change_does_not():
    env = SudokuEnv()
    for task in env.tasks("train", 10):
        team, local, res = run_episode(env, task, ["Grid:\n" + "\n".join(task["solution"])],
                                       planner_text="Grid:\n" + "\n".join(task["solution"]))
        assert res.info["success"] and team == pytest.approx(2.5 + _shaping(task))
        assert local["executor"] == pytest.approx(2.5 + _shaping(task) - 0.01 * task["holes"])
        # swapping two digits keeps a valid Sudoku but changes clues: not solved, rejected
        clue = next(ch for row in task["puzzle"] for ch in row if ch != ".")
        other = _relabel(task["solution"], clue, "1" if clue != "1" else "2")
        clues = [[0 if ch == "." else int(ch) for ch in row] for row in task["puzzle"]]
        assert not is_solved([[int(ch) for ch in row] for row in other], clues)
        assert is_solved([[int(ch) for ch in row] for row in other], [[0] * 4 for _ in range(4)])
        env.reset(task)
        env.step({"planner": "Grid:\n" + "\n".join(other)})
        res = env.step({"executor": "Grid:\n" + "\n".join(other)})
        assert not res.info["success"] and res.local_rewards["executor"] == pytest.approx(-0.5)
        assert "clue" in res.info["feedback"] and env._state.board == clues


def test_sudoku_a_solve_earns_the_same_whatever_its_path():
    """The solving step pays the potential's change too: a solve split into two submissions (all holes but one,
    then the last) earned 3.12 against 2.5 in one, so RL learned to stall a turn before solving."""
    def play(grids, task):
        env = SudokuEnv(single_agent=True)
        env.reset(task)
        results = [env.step({"solver": "Grid:\n" + "\n".join(g)}) for g in grids]
        return sum(r.team_reward for r in results), results[-1].info["success"]

    for task in SudokuEnv().tasks("train", 5):
        almost = [list(row) for row in task["solution"]]
        r, c = [(r, c) for r in range(4) for c in range(4) if task["puzzle"][r][c] == "."][-1]
        almost[r][c] = "."
        once = play([task["solution"]], task)
        twice = play([["".join(row) for row in almost], task["solution"]], task)
        assert once[1] and twice[1] and once[0] == pytest.approx(twice[0]) == pytest.approx(2.5 + _shaping(task))


def test_sudoku_any_valid_completion_keeping_clues_counts():
    # one clue only: a grid other than the stored solution that keeps it is a solution
    task = {"id": "x", "puzzle": ["1...", "....", "....", "...."], "solution": ["1234", "3412", "2143", "4321"]}
    env = SudokuEnv(single_agent=True)
    env.reset(task)
    res = env.step({"solver": "Grid:\n1243\n3412\n2134\n4321"})
    assert res.info["success"] and res.done


def test_sudoku_penalties_and_progress():
    env = SudokuEnv(single_agent=True, max_turns=3)
    task = env.tasks("train", 1)[0]
    env.reset(task)
    res = env.step({"solver": "nothing useful"})
    assert res.local_rewards["solver"] == pytest.approx(-0.5) and res.info["parse_error"]["solver"]
    bad = [row.replace(".", "7") for row in task["puzzle"]]
    res = env.step({"solver": "Grid:\n" + "\n".join(bad)})
    assert res.local_rewards["solver"] == pytest.approx(-1.0) and "out of range" in res.info["feedback"]
    # fill one hole correctly: progress goes up, team reward positive
    rows = [list(r) for r in task["puzzle"]]
    r, c = next((i, j) for i in range(4) for j in range(4) if rows[i][j] == ".")
    rows[r][c] = task["solution"][r][c]
    res = env.step({"solver": "Grid:\n" + "\n".join("".join(x) for x in rows)})
    assert res.team_reward > 0 and res.local_rewards["solver"] == pytest.approx(res.team_reward - 0.01)
    assert res.done and not res.info["success"]          # the last turn ends the episode unsolved
    assert env._state.edits == 1


def test_sudoku_9x9_solution_solves():
    env = SudokuEnv(size=9)
    task = env.tasks("eval", 1)[0]
    assert sum(row.count(".") for row in task["puzzle"]) == 40
    env.reset(task)
    env.step({"planner": "Grid:\n" + "\n".join(task["solution"])})
    res = env.step({"executor": "Grid:\n" + "\n".join(" ".join(row) for row in task["solution"])})
    assert res.info["success"] and res.team_reward == pytest.approx(2.5 + _shaping(task))


def test_parse_grid_formats():
    want = ("1234", "3412", "2143", "4321")
    for text in ["Grid:\n1234\n3412\n2143\n4321",
                 "```\n1 2 | 3 4\n3 4 | 1 2\n----+----\n2 1 | 4 3\n4 3 | 2 1\n```",
                 "Row 1: 1 2 3 4\nRow 2: 3 4 1 2\nRow 3: 2 1 4 3\nRow 4: 4 3 2 1",
                 "[[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]]",
                 "first try\nGrid:\n1111\n2222\n3333\n4444\nbetter:\nGrid:\n1234\n3412\n2143\n4321\nDone."]:
        assert parse_grid(text, 4).rows == want, text
    assert parse_grid("Grid:\n12.4\n3_12\n2143\n4320", 4).rows == ("12.4", "3_12", "2143", "4320")
    for junk in list(GARBAGE) + ["Grid:\n123\n456", "1234\n5678"]:
        assert parse_grid(junk, 4).rows is None


# ------------------------------------------------------------------------------------------------ Sokoban

def solve_sokoban(rows):
    """A shortest solution by BFS over (player, boxes) states, or None."""
    walls, goals, boxes, player = read_rows(rows)
    start = (player, frozenset(boxes))
    prev = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        pos, bx = state
        if bx <= goals:
            moves = []
            while prev[state] is not None:
                state, m = prev[state]
                moves.append(m)
            return moves[::-1]
        for m, (dr, dc) in DIRECTIONS.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt in walls:
                continue
            nb = bx
            if nxt in bx:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in bx:
                    continue
                nb = (bx - {nxt}) | {beyond}
            new = (nxt, nb)
            if new not in prev:
                prev[new] = (state, m)
                queue.append(new)
    return None


def test_sokoban_generated_puzzles_are_solvable_and_solve():
    env = SokobanEnv()
    for task in env.tasks("train", 30) + env.tasks("eval", 10):
        path = solve_sokoban(task["rows"])
        assert path, task
        team, _, res = run_episode(env, task, [moves_text(path)], planner_text=moves_text(path))
        assert res.info["success"] and res.done
        assert team > 11.0 - 1e-9  # +1 box on goal, +10 win, shaping >= 0 on a shortest solution
    # two boxes
    env2 = SokobanEnv(num_boxes=2, size=7)
    for task in env2.tasks("train", 5):
        path = solve_sokoban(task["rows"])
        assert path
        env2.reset(task)
        env2.step({"planner": "Moves: U"})
        assert env2.step({"executor": moves_text(path)}).info["success"]


def test_sokoban_box_off_goal_and_no_farming():
    task = {"id": "t", "rows": ["######", "#P*..#", "#....#", "#.B.G#", "#....#", "######"]}
    env = SokobanEnv(single_agent=True)
    env.reset(task)
    res = env.step({"solver": "Moves: R"})  # pushes the box at (1,2) off its goal to (1,3)
    assert res.team_reward == pytest.approx(-0.5 - 0.1)
    assert res.local_rewards["solver"] == pytest.approx(-0.5 - 0.1 - 0.01)
    assert "left the goal" in res.info["feedback"]
    res = env.step({"solver": "Moves: D R R U L"})  # walk round and push it back on
    assert res.team_reward == pytest.approx(0.1)  # shaping only: the goal count is no record
    assert "reached the goal" in res.info["feedback"]
    # a blocked move (into the wall) costs -0.05 and moves nothing
    res = env.step({"solver": "Moves: U"})
    assert res.local_rewards["solver"] == pytest.approx(-0.05)


def test_sokoban_failure_penalty_and_planner():
    env = SokobanEnv()
    task = env.tasks("train", 1)[0]
    path = solve_sokoban(task["rows"])
    lose, _, res = run_episode(env, task, ["pass"])
    assert lose == pytest.approx(-5.0) and not res.info["success"]
    obs = env.reset(task)
    good = env.step({"planner": moves_text(path)})
    assert good.observations["planner"] == obs["planner"] and env._state.moves_used == 0
    assert "Planner's proposal: " + " ".join(path) in good.observations["executor"]
    env.reset(task)
    bad = env.step({"planner": "Moves: " + " ".join(["U"] * 6)})
    assert good.local_rewards["planner"] > bad.local_rewards["planner"]


# ------------------------------------------------------------------------------------------------ tasks

def _room(rows):
    return [row.replace("B", ".").replace("*", "G").replace("P", ".").replace("+", "G") for row in rows]


@pytest.mark.parametrize("env,key", [
    (PlanPathEnv(size=5), lambda t: t["grid"]),
    (SudokuEnv(), lambda t: t["solution"]),
    (SokobanEnv(), lambda t: _room(t["rows"])),
], ids=["planpath", "sudoku", "sokoban"])
def test_train_eval_disjoint_by_content_and_deterministic(env, key):
    train, evals = env.tasks("train", 250), env.tasks("eval", 250)
    assert len(train) == 250 and len(evals) == 250

    def content(t):
        return json.dumps({k: v for k, v in t.items() if k != "id"}, sort_keys=True)

    assert len({content(t) for t in train}) == 250 and len({t["id"] for t in train}) == 250
    assert not {json.dumps(key(t)) for t in train} & {json.dumps(key(t)) for t in evals}
    assert not {content(t) for t in train} & {content(t) for t in evals}
    assert all(split_of(key(t)) == "eval" for t in evals)
    assert env.tasks("train", 250) == train
    assert [t["id"] for t in env.tasks("train", 20, seed=1)] != [t["id"] for t in train[:20]]
    # a different seed still never crosses the split
    assert not {json.dumps(key(t)) for t in env.tasks("train", 100, seed=7)} & {json.dumps(key(t)) for t in evals}


def test_planpath_generator_properties():
    env = PlanPathEnv(size=10)
    for task in env.tasks("train", 50):
        walls = sum(row.count("#") for row in task["grid"])
        assert walls == 22
        assert shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"])) is not None


# ------------------------------------------------------------------------------------------------ parsing

@pytest.mark.parametrize("text,want", [
    ("Moves: U R R D", "URRD"),
    ("```\nMoves: up, right, Right, down\n```", "URRD"),
    ("moves: left left\nOn second thought:\nMoves: [\"R\", \"D\"]", "RD"),
    ("**Moves:** `U` `L`", "UL"),
    ("Moves:\nU R R D\n", "URRD"),
    ("Final moves = URRD", "URRD"),
    ("I'll go:\n↑ → →", "URR"),
    ("The path is\nR, R, D", "RRD"),
    ("Moves: R R (then) D", "RRD"),
    ("I would go right", ""),
    ("Moves: none", ""),
    ("", ""),
])
def test_parse_moves(text, want):
    assert "".join(parse_moves(text).moves) == want


def test_parse_never_raises_on_garbage():
    rng = random.Random(0)
    texts = list(GARBAGE) + ["".join(chr(rng.randrange(0, 0x2FFF)) for _ in range(300)) for _ in range(50)]
    texts += ["Moves:" * 100, "Grid:" * 50, "Moves: " + "U" * 5000]
    for text in texts:
        parse_moves(text)
        parse_grid(text, 4)
        parse_grid(text, 9)
    env = PlanPathEnv(size=5, max_moves_per_turn=3)
    env.reset(env.tasks("train", 1)[0])
    env.step({"planner": "Moves: " + "U" * 5000})
    res = env.step({"executor": "Moves: " + "U" * 5000})
    assert res.info["feedback"].count("U") < 100 and "not applied" in res.info["feedback"]
