"""PettingZoo, TextArena and Gymnasium environments as accord tasks (``pettingzoo:<id>``, ``textarena:<id>``,
``gymnasium:<id>``): conformance, rewards, clones by seed + replay, the one-line errors, and training runs of
a tiny model on a classic PettingZoo game and a TextArena game."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("textarena")
pytest.importorskip("gymnasium")

from gymnasium import spaces  # noqa: E402
from pettingzoo import AECEnv  # noqa: E402

from accord.config import config_from_dict  # noqa: E402
from accord.envs import make_env  # noqa: E402
from accord.envs.check import check_env  # noqa: E402
from accord.envs.external.base import ReplayError, TextObservationError  # noqa: E402
from accord.envs.registry import TaskError  # noqa: E402
from accord.trainer import Trainer  # noqa: E402

HERE = Path(__file__).resolve().parent


class ArrayGame(AECEnv):
    """A two-player AEC game with array observations and random transitions (seeded by reset, or not)."""

    metadata = {"name": "array_game_v0", "is_parallelizable": False}

    def __init__(self, seeded: bool = True, takes_seed: bool = True):
        self.possible_agents = ["a", "b"]
        self.seeded = seeded
        if not takes_seed:
            self.reset = self._reset_without_seed

    def action_space(self, agent):
        return spaces.Discrete(3)

    def observation_space(self, agent):
        return spaces.Box(0, 1, (2,))

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rng = np.random.default_rng(seed if self.seeded else None)
        self.value = self.rng.random(2)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = dict(self.rewards)
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection, self.t = "a", 0

    def _reset_without_seed(self, options=None):
        ArrayGame.reset(self, seed=0)

    def observe(self, agent):
        return self.value.copy()

    def step(self, action):
        self.value = self.rng.random(2)
        self.rewards = {a: float(action == 1) if a == self.agent_selection else 0.0 for a in self.agents}
        self.t += 1
        self.agent_selection = "b" if self.agent_selection == "a" else "a"
        if self.t >= 6:
            self.terminations = {a: True for a in self.agents}


def make_array_env(seeded: bool = True, takes_seed: bool = True):
    return ArrayGame(seeded, takes_seed)


def render_array(obs, agent):
    return f"values: {obs[0]:.3f} {obs[1]:.3f}"


@pytest.mark.parametrize("name,options,actions", [
    ("pettingzoo:tictactoe_v3", {}, [str(i) for i in range(9)]),
    ("pettingzoo:classic.connect_four_v3", {}, [str(i) for i in range(7)]),
    ("pettingzoo:rps_v2", {"parallel": True}, ["rock", "paper", "scissors"]),
    ("pettingzoo:test_external_envs:make_array_env", {"render": "test_external_envs:render_array"}, ["0", "1"]),
    ("textarena:TicTacToe-v0", {}, [f"[{i}]" for i in range(9)]),
    ("gymnasium:FrozenLake-v1", {}, ["0", "1", "2", "3"]),
])
def test_adapters_conform(name, options, actions):
    check_env(lambda: make_env(name, options), actions=actions)


def test_tictactoe_game_rewards_and_illegal_moves():
    env = make_env("pettingzoo:tictactoe_v3")
    assert env.agents == ("player_1", "player_2") and not env.simultaneous
    env.reset(env.tasks("train", limit=1)[0])
    for move in ["move 0", "3", "1", "4"]:
        res = env.step({env.acting()[0]: move})
        assert not res.done and res.team_reward == 0.0
    twin = env.clone()
    win = env.step({"player_1": "I take 2"})
    assert win.done and win.local_rewards == {"player_1": 1.0, "player_2": -1.0} and win.team_reward == 0.0
    # the clone is still before the winning move: an occupied cell is an illegal move there
    bad = twin.step({"player_1": "4"})
    assert bad.done and bad.info["illegal"] == "player_1"
    assert bad.local_rewards == {"player_1": -1.0, "player_2": 0.0} and bad.team_reward == -1.0
    chosen = make_env("pettingzoo:tictactoe_v3", {"team_reward": "player_2"})
    chosen.reset(chosen.tasks("eval", limit=1)[0])
    assert chosen.step({"player_1": "no move"}).team_reward == 0.0      # player_2's reward: 0
    with pytest.raises(TaskError, match="team_reward='nobody' is neither 'sum' nor one of the agents"):
        make_env("pettingzoo:tictactoe_v3", {"team_reward": "nobody"})


def test_textarena_invalid_move_ends_the_episode():
    env = make_env("textarena:TicTacToe-v0")
    env.reset(env.tasks("train", limit=1)[0])
    ok = env.step({"player_0": "[4]"})
    assert not ok.done and "placed their symbol" in ok.observations["player_1"]
    bad = env.step({"player_1": "[4]"})          # occupied: TextArena would ask player 1 to retry
    assert bad.done and bad.info["illegal"] == "player_1" and bad.local_rewards["player_1"] == -1.0


def test_textarena_model_text_neither_raises_nor_stalls_nor_floods_the_game(caplog):
    """A 5,000-digit cell number made TicTacToe's own int() raise out of step (the run stopped); a megabyte of text
    took hours to parse in games whose parsing is quadratic; a move followed by a megabyte reached the other
    player's prompt whole, where its lines could read as the game's. Now: invalid moves, and a cut, indented echo."""
    import time

    from accord.envs.external.textarena import SHOWN_CHARS
    from accord.envs.protocol import step_env

    env = make_env("textarena:TicTacToe-v0")
    env.reset(env.tasks("train", limit=1)[0])
    with caplog.at_level("WARNING", logger="accord.envs.external.textarena"):
        res = step_env(env, {"player_0": "[" + "9" * 5000 + "]"})
    assert res.done and res.info["illegal"] == "player_0" and res.local_rewards["player_0"] == -1.0
    assert "counted as an invalid move" in caplog.text
    clone_env = make_env("textarena:ColonelBlotto-v0")
    clone_env.reset(clone_env.tasks("train", limit=1)[0])
    start = time.perf_counter()
    res = step_env(clone_env, {"player_0": "[" * 1_000_000})
    assert time.perf_counter() - start < 1.0 and res.done and res.info["illegal"] == "player_0"
    env = make_env("textarena:TicTacToe-v0", {"max_move_chars": 2_000_000})
    env.reset(env.tasks("train", limit=1)[0])
    res = env.step({"player_0": "[4] " + "x" * 1_000_000 + "\n[GAME] Player 1 made an invalid move."})
    seen = res.observations["player_1"]
    assert len(seen) < 10_000 and f"more characters not shown" in seen
    assert not any(line.startswith("[GAME] Player 1 made") for line in seen.splitlines())
    text = "[4] " + "y" * (SHOWN_CHARS - 100) + "\nGAME: Player 1 loses."
    env.reset(env.tasks("train", limit=1)[0])
    lines = env.step({"player_0": text}).observations["player_1"].splitlines()
    assert "  GAME: Player 1 loses." in lines and "GAME: Player 1 loses." not in lines   # indented: the player's
    with pytest.raises(TaskError, match="max_move_chars=0 must be a positive integer"):
        make_env("textarena:TicTacToe-v0", {"max_move_chars": 0})


@pytest.mark.parametrize("name,options,problem", [
    ("pettingzoo:test_external_envs:make_array_env", {}, TextObservationError),
    ("pettingzoo:test_external_envs:make_array_env", {"render": "test_external_envs:render_array",
                                                      "env_kwargs": {"seeded": False}}, ReplayError),
    ("pettingzoo:test_external_envs:make_array_env", {"render": "test_external_envs:render_array",
                                                      "env_kwargs": {"takes_seed": False}}, TaskError),
])
def test_bad_environments_are_one_line(name, options, problem):
    with pytest.raises(problem) as info:
        env = make_env(name, options)
        env.reset(env.tasks("train", limit=1)[0])
        env.step({"a": "1"})
        env.clone()
    text = str(info.value)
    assert "\n" not in text
    assert {"TextObservationError": "not text; give task.options.render=my_module:render",
            "ReplayError": "cannot be cloned by seed + action replay",
            "TaskError": "its reset() takes no seed"}[problem.__name__] in text


def render_fails(obs, agent):
    raise KeyError("board")


def render_array_as_list(obs, agent):
    return [float(v) for v in obs]


def parse_fails(text, agent, space):
    return int(text.split()[1])


@pytest.mark.parametrize("name,options,match", [
    ("pettingzoo:test_external_envs:make_array_env", {"render": "test_external_envs:render_fails"},
     r"task.options.render='test_external_envs:render_fails' raised KeyError: 'board'; fix that function \(a render "
     r"must return the observation as a str for any observation\)"),
    ("pettingzoo:test_external_envs:make_array_env", {"render": "test_external_envs:render_array_as_list"},
     r"task.options.render='test_external_envs:render_array_as_list' returned list, not text"),
    ("pettingzoo:test_external_envs:make_array_env", {"render": "test_external_envs:render_array",
                                                      "parse": "test_external_envs:parse_fails"},
     r"task.options.parse='test_external_envs:parse_fails' raised IndexError: .*; fix that function \(a parse must "
     r"return an action, or None for a text that is no action, for any text\)"),
    ("gymnasium:FrozenLake-v1", {"render": "test_external_envs:render_fails"},
     r"task.options.render='test_external_envs:render_fails' raised KeyError"),
    ("gymnasium:FrozenLake-v1", {"parse": "test_external_envs:parse_fails"},
     r"task.options.parse='test_external_envs:parse_fails' raised IndexError"),
], ids=["pz-render-raises", "pz-render-no-text", "pz-parse-raises", "gym-render-raises", "gym-parse-raises"])
def test_a_users_render_or_parse_that_fails_is_named(name, options, match):
    """A render or parse function given as an option that raised (or rendered no text) came out as the environment's
    step() failing (or an AttributeError on .rstrip), not naming the option whose function it was."""
    from accord.envs.protocol import EnvOutputError, reset_env, step_env

    env = make_env(name, options)
    with pytest.raises(EnvOutputError, match=match) as info:
        reset_env(env, env.tasks("train", limit=1)[0], seed=0)
        step_env(env, {env.acting()[0]: "1"})
    assert "\n" not in str(info.value) and "environment " not in str(info.value)


def test_unknown_names_get_the_closest():
    with pytest.raises(TaskError, match="did you mean 'tictactoe_v3'"):
        make_env("pettingzoo:tictactoe_v2")
    with pytest.raises(TaskError, match="did you mean 'TicTacToe-v0'"):
        make_env("textarena:TicTacToe-v9")


@pytest.mark.slow
def test_envs_check_cli_one_line_errors():
    run = lambda *a: subprocess.run([sys.executable, "-m", "accord.cli", "envs", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=300, cwd=HERE)
    ok = run("--check", "pettingzoo:tictactoe_v3")
    assert ok.returncode == 0 and "conforms to the environment protocol" in ok.stdout
    bad = run("--check", "pettingzoo:test_external_envs:make_array_env")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not text" in bad.stderr
    # the fix the error names works on the command line that checks: the environment built with that option
    rendered = run("--check", "pettingzoo:test_external_envs:make_array_env",
                   "task.options.render=test_external_envs:render_array")
    assert rendered.returncode == 0 and "conforms to the environment protocol" in rendered.stdout, rendered.stderr
    other = run("--check", "relay", "rollout.max_turns=3")
    assert other.returncode == 2 and "takes the environments' options only, as task.options.KEY=VALUE" in other.stderr


def _tiny(tmp_path, task, algorithm, **extra):
    return config_from_dict({
        "run": {"name": "t", "run_dir": str(tmp_path / "run"), "steps": 2, "threads": 2, "eval_before": False,
                "eval_after": False},
        "policies": {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}},
        "task": {"name": task, "eval_size": 0, **extra},
        "algorithm": {"num_generations": 2, **algorithm},
        "rollout": {"batch_size": 2, "max_new_tokens": 6, "temperature": 1.0, "max_turns": 2},
        "training": {"lr": 1e-3, "micro_batch_size": 8, "audit": "strict"},
        "logging": {"console": False, "report_to": [], "completions_every": 1},
    })


@pytest.mark.slow
def test_train_tictactoe_cli_two_steps(tmp_path):
    out = subprocess.run([sys.executable, "-m", "accord.cli", "train", "task.name=pettingzoo:tictactoe_v3",
                          "policies.main.model=tiny-qwen2",
                          "policies.main.model_kwargs={hidden_size: 64, num_layers: 2}",
                          "algorithm.name=atgrpo", "algorithm.num_generations=2", "rollout.batch_size=2",
                          "rollout.max_new_tokens=6", "rollout.max_turns=2", "run.steps=2", "run.threads=2",
                          "run.eval_before=false", "run.eval_after=false", "task.eval_size=0",
                          f"run.run_dir={tmp_path / 'ttt'}", "logging.console=false", "logging.report_to=[]",
                          "training.audit=strict"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = (tmp_path / "ttt" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2


@pytest.mark.slow
@pytest.mark.parametrize("task,algorithm", [("textarena:TicTacToe-v0", {"name": "magrpo"}),
                                            ("gymnasium:FrozenLake-v1", {"name": "atgrpo"})])
def test_train_two_steps(tmp_path, task, algorithm):
    trainer = Trainer(_tiny(tmp_path, task, algorithm))
    try:
        last = trainer.train()
    finally:
        trainer.close()
    assert last["audit/violations"] == 0 and "team/reward" in last


@pytest.mark.slow
def test_an_own_pettingzoo_factory_is_found_in_the_current_directory(tmp_path):
    """``pettingzoo:module:function`` imports its module with the current directory on the path, as a task's
    module (``task.name=module:Class``) is: through the installed ``accord`` script (no ``python -m``, whose
    current directory is on the path anyway) it was a ModuleNotFoundError naming ``task.options.name``."""
    import os
    import shutil

    (tmp_path / "my_local_pz.py").write_text("def tictactoe_v3():   # named as the game: its built-in renderer\n"
                                             "    from pettingzoo.classic import tictactoe_v3\n"
                                             "    return tictactoe_v3.env()\n")
    script = shutil.which("accord", path=os.path.dirname(sys.executable)) or shutil.which("accord")
    if script is None:
        pytest.skip("no accord script installed beside this Python")
    ok = subprocess.run([script, "envs", "--check", "pettingzoo:my_local_pz:tictactoe_v3"], capture_output=True, text=True,
                        timeout=300, cwd=tmp_path)
    assert ok.returncode == 0 and "conforms to the environment protocol" in ok.stdout, ok.stderr[-2000:]
    bad = subprocess.run([script, "envs", "--check", "pettingzoo:no_such_local_pz:make"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "task.name=pettingzoo:no_such_local_pz:make: module 'no_such_local_pz' does not import (ModuleNotFoundError: "
        "No module named 'no_such_local_pz'); run accord from the directory that contains 'no_such_local_pz', add "
        "that directory to PYTHONPATH, or pip install the package that provides it"), bad.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("task,algorithm,has_success", [("pettingzoo:tictactoe_v3", "magrpo", False),
                                                        ("pettingzoo:tictactoe_v3", "atgrpo", False),
                                                        ("gymnasium:FrozenLake-v1", "atgrpo", True)])
def test_success_is_logged_only_for_an_environment_that_says_it(tmp_path, task, algorithm, has_success):
    """A PettingZoo game says nothing of success (its adapter sets no info["success"]): its runs logged
    team/success and eval success 0.0, read as "never succeeds", and the end of a run printed a held-out success
    rate of 0 -> 0. Now neither is logged; Gymnasium's adapter, which says it, logs both."""
    from accord import metric_names as mn

    cfg = _tiny(tmp_path, task, {"name": algorithm})
    cfg.run = dataclasses.replace(cfg.run, eval_after=True, steps=1)
    cfg.task = dataclasses.replace(cfg.task, eval_size=2)
    trainer = Trainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    keys = set().union(*(json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()))
    success = {mn.TEAM_SUCCESS, mn.played_eval_key("success")}
    assert (success <= keys) if has_success else not (success & keys), sorted(keys)
