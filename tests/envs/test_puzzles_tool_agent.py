"""The AT-GRPO paper's tool agent + planner workflow of Plan-Path, Sudoku and Sokoban (programs run in the
real sandbox), and the local rewards that independent learners (alpha = 0) train on."""

import json
import sys
import time

import pytest

from accord.envs import make_task
from accord.envs.registry import TaskError
from accord.envs.check import check_env
from accord.envs import tool_programs
from accord.envs.puzzles.grid import NO_CODE
from accord.envs.oracles import PLANPATH_TOOL_PROGRAM, SOKOBAN_TOOL_PROGRAM, SUDOKU_TOOL_PROGRAM, fenced
from accord.envs.puzzles.planpath import PlanPathEnv, shortest_path
from accord.envs.puzzles.sokoban import SokobanEnv
from accord.envs.puzzles.sudoku import SudokuEnv, complete_units, progress
from accord.rollout.multiturn import atgrpo_rollout
from accord.rollout.sample import Completion

BFS_PATH = "Here is my program.\n" + fenced(PLANPATH_TOOL_PROGRAM)

SUDOKU_SOLVER = fenced(SUDOKU_TOOL_PROGRAM)

SOKOBAN_BFS = fenced(SOKOBAN_TOOL_PROGRAM)

BAD_PROGRAMS = {
    "no_code": "I would use breadth-first search here.\nMoves: U",
    "error": "```python\nimport json\ns = json.load(open('state.json'))\nprint(s['no such key'])\n```",
    "syntax_error": "```python\ndef f(:\n```",
    "timeout": "```python\nwhile True:\n    pass\n```",
    "garbage": "```python\nimport random\nprint(''.join(chr(random.randint(33, 126)) for _ in range(300)))\n```",
    "output_limit": "```python\nwhile True:\n    print('x' * 1000)\n```",
    "no_file": "```python\nprint(open('/etc/shadow').read())\n```",
    "silent": "```python\nx = 1\n```",
}


def moves(path):
    return "Moves: " + " ".join(path)


def test_default_workflow_is_the_papers_tool_then_planner():
    for name in ("planpath", "sudoku", "sokoban"):
        env = make_task(name)
        assert env.workflow == "tool_planner" and env.agents == ("tool", "planner")
        assert "state.json" in env.instructions("tool") and "```python" in env.instructions("tool")
        assert "tool agent" in env.instructions("planner")
        assert make_task(name, {"workflow": "direct"}).agents == ("planner", "executor")
        assert make_task(name, {"single_agent": True}).agents == ("solver",)
    with pytest.raises(TaskError, match="workflow.*tool_planner"):
        make_task("planpath", {"workflow": "tools"})
    with pytest.raises(TaskError, match="tool_timeout_s"):
        make_task("sudoku", {"tool_timeout_s": 0})


def test_planpath_tool_program_runs_on_the_state_and_the_planner_sees_its_output():
    env = PlanPathEnv(size=6)
    for task in env.tasks("train", 3):
        path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
        env.reset(task)
        res = env.step({"tool": BFS_PATH})
        assert res.info["tool_status"] == "ok" and res.info["parse_error"] == {"tool": False}
        assert res.team_reward == 0.0 and env._state.pos == tuple(task["start"])  # the tool moves nothing
        d = abs(task["start"][0] - task["goal"][0]) + abs(task["start"][1] - task["goal"][1])
        # its reward: what its printed moves would earn if applied now (shortest path: goal + optimal bonus)
        assert res.local_rewards["tool"] == pytest.approx(d + 1.5 - 0.01 * len(path))
        obs = res.observations["planner"]
        assert "the program printed:\n" + moves(path) in obs and "Read as: " + " ".join(path) in obs
        assert "printed" not in res.observations["tool"].split("Last:")[0]
        res = env.step({"planner": "The tool's path looks right.\n" + moves(path)})
        assert res.done and res.info["success"]
        assert res.team_reward == pytest.approx(d + 1.5)
        assert res.local_rewards["planner"] == pytest.approx(d + 1.5 - 0.01 * len(path))


@pytest.mark.parametrize("kind", sorted(BAD_PROGRAMS))
def test_bad_tool_programs_are_observations_never_exceptions(kind):
    env = PlanPathEnv(size=5, tool_timeout_s=1.0)
    task = env.tasks("train", 1)[0]
    env.reset(task)
    t0 = time.monotonic()
    res = env.step({"tool": BAD_PROGRAMS[kind]})
    assert time.monotonic() - t0 < 15
    status = res.info["tool_status"]
    want = {"no_code": NO_CODE, "garbage": "ok", "silent": "ok", "no_file": "error"}.get(kind, kind)
    assert status == want
    # nothing readable came out: the cost of an unreadable answer, the state unchanged, the planner told why
    assert res.info["parse_error"] == {"tool": True} and res.local_rewards["tool"] == pytest.approx(-0.10)
    assert env._state.pos == tuple(task["start"]) and not res.done
    obs = res.observations["planner"]
    assert "Read as: unreadable" in obs
    expect = {"no_code": "no ```python block", "error": "KeyError", "syntax_error": "syntax error",
              "timeout": "timed out (limit 1 s)", "output_limit": "printed too much", "no_file": "Error",
              "silent": "printed nothing", "garbage": "the program printed:"}[kind]
    assert expect in obs
    assert len(obs) < 2000   # a flood of output is cut
    res = env.step({"planner": "Moves: U"})   # the episode goes on
    assert res.info["turn"] == 1


def test_tool_results_are_cached_by_program_and_state():
    env = PlanPathEnv(size=5)
    a, b = env.tasks("train", 2)
    env.reset(a)
    program = BFS_PATH.replace("Here is my program.", "Cache test.") + "\n"
    before = tool_programs.cached_runs()
    clone = env.clone()
    first = env.step({"tool": program})
    assert tool_programs.cached_runs() == before + 1
    clone.step({"tool": program})   # a clone shares the process-wide cache
    assert tool_programs.cached_runs() == before + 1
    env.reset(a)
    t0 = time.monotonic()
    again = env.step({"tool": program})
    assert time.monotonic() - t0 < 0.05 and again.observations == first.observations
    assert tool_programs.cached_runs() == before + 1
    env.reset(b)   # another state: the program runs again
    env.step({"tool": program})
    assert tool_programs.cached_runs() == before + 2


def test_the_tool_cache_is_bounded_in_bytes(monkeypatch):
    """A program that fills its output cap with 4-byte characters made one cached result half a megabyte (2 GiB of
    the trainer's memory at the count limit): the cache also keeps to CACHE_BYTES, dropping the oldest."""
    monkeypatch.setattr(tool_programs, "CACHE_BYTES", 600_000)
    monkeypatch.setattr(tool_programs, "_cache", type(tool_programs._cache)())
    monkeypatch.setattr(tool_programs, "_bytes", 0)
    program = "import sys\nsys.stdout.write('\\U0001F600' + 'x' * 60000)  # {}\n"   # one 4-byte character: 4 each
    results = [tool_programs.run_program(program.format(i), timeout_s=10.0) for i in range(3)]
    assert all(r.status == "ok" and r.stdout.startswith("\U0001F600") for r in results), results[0]
    assert sys.getsizeof(results[0].stdout) > 200_000            # each result holds about 240 kB of text
    assert tool_programs.cached_runs() == 2 and 0 < tool_programs.cached_bytes() <= 600_000
    assert tool_programs.run_program(program.format(2), timeout_s=10.0) is results[2]   # the newest is kept


def test_sudoku_tool_solver_and_planner_submission():
    env = SudokuEnv()
    for task in env.tasks("train", 3):
        obs = env.reset(task)
        res = env.step({"tool": SUDOKU_SOLVER})
        assert res.info["tool_status"] == "ok" and res.info["plan_solves"]
        puzzle, solution = ([[0 if ch == "." else int(ch) for ch in row] for row in rows]
                            for rows in (task["puzzle"], task["solution"]))
        won = (2.5 + 0.5 * (progress(solution, puzzle) - progress(puzzle, puzzle))   # the bonuses and the
               + 0.02 * (complete_units(solution) - complete_units(puzzle)))        # potential's change
        assert res.local_rewards["tool"] == pytest.approx(won - 0.01 * task["holes"])
        assert res.observations["planner"] != obs["planner"] and "Grid:" in res.observations["planner"]
        grid = res.observations["planner"].split("Grid:\n")[-1].split("\nRead as")[0]
        res = env.step({"planner": "Grid:\n" + grid})
        assert res.done and res.info["success"] and res.team_reward == pytest.approx(won)


def test_sokoban_tool_search_solves():
    env = SokobanEnv()
    for task in env.tasks("train", 3):
        env.reset(task)
        res = env.step({"tool": SOKOBAN_BFS})
        assert res.info["tool_status"] == "ok" and res.info["plan_solves"], res.observations["planner"]
        line = next(ln for ln in res.observations["planner"].splitlines() if ln.startswith("Moves: "))
        res = env.step({"planner": line})
        assert res.done and res.info["success"] and res.team_reward > 10


def test_state_json_is_the_state_as_data():
    env = PlanPathEnv(size=5)
    task = env.tasks("train", 1)[0]
    env.reset(task)
    res = env.step({"tool": "```python\nprint(open('state.json').read())\n```"})
    printed = res.observations["planner"].split("the program printed:\n")[1].split("\nRead as")[0]
    data = json.loads(printed)
    assert data["grid"] == task["grid"] and data["position"] == task["start"] and data["goal"] == task["goal"]
    assert data["rows"][task["start"][0]][task["start"][1]] == "P" and data["moves_left"] == 4 * 5 * 4


@pytest.mark.parametrize("factory", [lambda: PlanPathEnv(size=5, tool_timeout_s=0.5),
                                     lambda: SudokuEnv(tool_timeout_s=0.5),
                                     lambda: SokobanEnv(tool_timeout_s=0.5)], ids=["planpath", "sudoku", "sokoban"])
def test_check_env_tool_workflow(factory):
    check_env(factory, actions=[BFS_PATH, SUDOKU_SOLVER, SOKOBAN_BFS, "Moves: U R", "Grid:\n1234\n3412\n2143\n4321"],
              n_tasks=2)


# ------------------------------------------------------------------------------- independent learners

def _safe_move(task):
    """One move from the start that is not blocked and does not reach the goal."""
    grid, (r, c) = task["grid"], task["start"]
    for m, (dr, dc) in {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}.items():
        rr, cc = r + dr, c + dc
        if 0 <= rr < len(grid) and 0 <= cc < len(grid) and grid[rr][cc] != "#" and [rr, cc] != task["goal"]:
            return m
    raise AssertionError("no safe move")


@pytest.mark.parametrize("workflow,mover", [("tool_planner", "planner"), ("direct", "executor")])
def test_alpha_zero_prefers_an_optimal_solve_to_a_safe_move(workflow, mover):
    """The issue's case: with local rewards only, an optimal solve used to score -0.08 and one safe move
    -0.01. The mover's local reward now carries its own step's progress."""
    env = PlanPathEnv(size=10, workflow=workflow)
    task = next(t for t in env.tasks("train", 50) if t["optimal"] >= 6)
    path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
    first = env.agents[0]
    scores = {}
    for name, text in (("solve", moves(path)), ("safe", f"Moves: {_safe_move(task)}")):
        env.reset(task)
        env.step({first: "Moves: U" if workflow == "direct" else "no program"})
        res = env.step({mover: text})
        scores[name] = 0.0 * res.team_reward + res.local_rewards[mover]
    assert scores["solve"] > scores["safe"]
    assert scores["solve"] > 1.0   # goal and optimal bonuses are in it


def test_alpha_zero_in_atgrpo_rollout_picks_the_solving_candidate():
    """AT-GRPO with alpha = 0 (the independent-learner baseline): among K planner candidates from one state,
    the solving one gets the highest reward and advances the episode."""
    probe = PlanPathEnv(size=8)
    task = next(t for t in probe.tasks("train", 50) if t["optimal"] >= 5)
    path = shortest_path(task["grid"], tuple(task["start"]), tuple(task["goal"]))
    candidates = {"tool": ["no program", BFS_PATH], "planner": [f"Moves: {_safe_move(task)}", moves(path)]}

    def complete(requests, n, greedy):
        return [[Completion([1], [2], [-0.1], "stop", candidates[a][j % 2]) for j in range(n)] for a, _ in requests]

    samples, metrics, episodes = atgrpo_rollout(lambda: PlanPathEnv(size=8), [task], complete,
                                                agent_policy={"tool": "main", "planner": "main"}, k=2, turns=2,
                                                alpha=0.0)
    planner = [s for s in samples if s.agent == "planner"]
    tool = [s for s in samples if s.agent == "tool"]
    assert planner[1].reward > planner[0].reward and tool[1].reward > tool[0].reward
    assert episodes[0].success
