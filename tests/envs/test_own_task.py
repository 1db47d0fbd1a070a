"""Your own task from the command line: a module outside the package, found by every command
(``module:attribute``, an ``imports:`` list, an ``accord.tasks`` entry point), run as a user would:
the ``accord`` console script in a subprocess, started in the project directory."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A user's package: a single-turn task class, a factory, a registered simultaneous environment,
# and an attribute that is not a task.
USER_MODULE = textwrap.dedent('''
    """mypkg.tasks: tasks of a user's own project (not part of accord)."""
    import copy

    from accord.envs import register_task
    from accord.envs.protocol import StepResult, check_step_actions


    class GreetTask:
        """Two agents greet; team reward = how many of them said hello."""
        name = "greet"
        agents = ("host", "guest")

        def __init__(self, size: int = 40):
            self.size = size

        def rows(self, split, limit=None, seed=0):
            base = 0 if split == "train" else 1000
            n = self.size if limit is None else min(limit, self.size)
            return [{"id": f"{split}-{base + i}", "n": base + i} for i in range(n)]

        def prompt(self, agent, row):
            return [{"role": "user", "content": f"You are the {agent}. Greet visitor {row['n']}."}]

        def reward(self, *, prompts, completions, agents, **columns):
            return [float("hello" in h.lower()) + 0.5 * float("hello" in g.lower())
                    for h, g in zip(completions["host"], completions["guest"])]


    def make_greet(size: int = 40):
        return GreetTask(size)


    class EchoEnv:
        """Simultaneous: each agent is rewarded for the share of its words found in the partner's text."""
        name = "echo"
        agents = ("left", "right")
        simultaneous = True

        def __init__(self, max_turns: int = 2):
            self.max_turns = max_turns
            self._task, self._last, self._turn, self._done = None, {}, 0, False

        def tasks(self, split, limit=None, seed=0):
            base = 0 if split == "train" else 500
            n = 30 if limit is None else min(limit, 30)
            return [{"id": f"{split}-{base + i}", "word": f"w{base + i}"} for i in range(n)]

        def instructions(self, agent):
            return f"You are {agent}. Repeat your partner's words."

        def _obs(self, agent):
            other = "right" if agent == "left" else "left"
            return f"Word {self._task['word']}, turn {self._turn + 1}. Partner said: {self._last.get(other, '')[:60]}"

        def reset(self, task, seed=0):
            self._task, self._last, self._turn, self._done = dict(task), {}, 0, False
            return {a: self._obs(a) for a in self.agents}

        def acting(self):
            return self.agents

        def step(self, actions):
            check_step_actions(self, actions, started=self._task is not None, done=self._done)
            local = {}
            for a in self.agents:
                other = actions["right" if a == "left" else "left"].split()
                words = actions[a].split()
                local[a] = sum(w in other for w in words) / len(words) if words else 0.0
            self._last = dict(actions)
            self._turn += 1
            self._done = self._turn >= self.max_turns
            team = sum(local.values()) / (2 * self.max_turns)
            return StepResult({a: self._obs(a) for a in self.agents}, team, local, self._done,
                              {"success": team > 0.4})

        def clone(self):
            return copy.deepcopy(self)


    @register_task("echo", "two agents repeat each other's words (a user's environment)")
    def make_echo(max_turns: int = 2):
        return EchoEnv(max_turns)


    NOT_A_TASK = 42


    class Half:
        name = "half"
        agents = ("a",)
''')

CONFIG = textwrap.dedent('''
    run: {name: own, output_dir: runs, steps: 2, threads: 2}
    policies: {main: {model: tiny-qwen2, model_kwargs: {hidden_size: 64, num_layers: 2}}}
    task: {name: "mypkg.tasks:GreetTask", eval_size: 3, options: {size: 12}}
    algorithm: {num_generations: 2}
    rollout: {batch_size: 2, max_new_tokens: 6, temperature: 1.0}
    training: {lr: 0.001}
    logging: {tensorboard: false}
''')


def accord_command() -> list[str]:
    """The installed console script next to this interpreter (as a user types `accord`): unlike
    `python -m`, it does not put the current directory on sys.path."""
    script = Path(sys.executable).with_name("accord")
    if not script.is_file():
        pytest.fail(f"no `accord` console script next to {sys.executable}; install accord (pip install -e .)")
    return [str(script)]


def run(*args, cwd, extra_path=()):
    paths = [str(REPO), *map(str, extra_path)]  # this checkout first; never the project directory itself
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=os.pathsep.join(paths))
    return subprocess.run([*accord_command(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def project(tmp_path):
    proj = tmp_path / "project"
    (proj / "mypkg").mkdir(parents=True)
    (proj / "mypkg" / "__init__.py").write_text("")
    (proj / "mypkg" / "tasks.py").write_text(USER_MODULE)
    (proj / "cfg.yaml").write_text(CONFIG)
    return proj


@pytest.mark.slow
def test_own_task_through_every_command(project):
    train = run("train", "cfg.yaml", cwd=project)
    assert train.returncode == 0, train.stderr
    run_dir = project / "runs" / "own"
    saved = (run_dir / "config.yaml").read_text()
    assert "mypkg.tasks:GreetTask" in saved
    lines = [line for line in train.stderr.splitlines() if line.strip()]
    tail = "\n".join(lines[-8:])   # the run's closing summary: held-out before -> after, then the training thirds
    assert "held-out team reward (greedy), step 0 -> step 2:" in tail and "mean of the first third" in tail
    rows = [json.loads(line) for line in (run_dir / "completions" / "step_000002.jsonl").read_text().splitlines()]
    assert {r["agent"] for r in rows} == {"host", "guest"}

    ev = run("eval", str(run_dir), "--samples", "2", cwd=project)
    assert ev.returncode == 0, ev.stderr
    report = json.loads((run_dir / "eval" / "eval.json").read_text())
    assert report["task"] == "mypkg.tasks:GreetTask" and set(report["variants"]) == {"base", "step_000002"}

    rep = run("report", str(run_dir), cwd=project)
    assert rep.returncode == 0, rep.stderr
    assert "mypkg.tasks:GreetTask" in (run_dir / "report" / "report.md").read_text()

    check = run("envs", "--check", "mypkg.tasks:EchoEnv", cwd=project)
    assert check.returncode == 0, check.stderr
    assert "mypkg.tasks:EchoEnv: conforms to the environment protocol" in check.stdout
    listed = run("envs", "--import", "mypkg.tasks", cwd=project)
    assert listed.returncode == 0, listed.stderr
    echo = next(line for line in listed.stdout.splitlines() if line.startswith("echo "))
    assert "multi-turn, simultaneous, 2 turns" in echo and "left, right" in echo


@pytest.mark.slow
def test_imports_list_registers_an_environment_for_train_and_eval(project):
    train = run("train", "cfg.yaml", "imports=[mypkg.tasks]", "task.name=echo", "task.options={}", "run.name=echo",
                "run.steps=1", cwd=project)
    assert train.returncode == 0, train.stderr
    run_dir = project / "runs" / "echo"
    assert "- mypkg.tasks" in (run_dir / "config.yaml").read_text()
    assert "held-out team reward" in train.stderr and "held-out success rate" in train.stderr
    ev = run("eval", str(run_dir), "--samples", "0", cwd=project)
    assert ev.returncode == 0, ev.stderr
    # the registered name alone, without the imports, is unknown and the error says how to fix it
    bare = run("train", "cfg.yaml", "task.name=echo", "task.options={}", cwd=project)
    assert bare.returncode == 2 and "unknown task 'echo'" in bare.stderr and "imports" in bare.stderr
    missing = run("train", "cfg.yaml", "imports=[mypkg.nothere]", cwd=project)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "imports: 'mypkg.nothere': module 'mypkg.nothere' does not import" in missing.stderr


@pytest.mark.slow
def test_entry_point_of_an_installed_package(project, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(project / "mypkg", site / "mypkg")
    info = site / "mypkg_tasks-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg-tasks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[accord.tasks]\ngreeting = mypkg.tasks:make_greet\n"
                                           "echo2 = mypkg.tasks:EchoEnv\nbroken = mypkg.nothere:X\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = run("envs", cwd=elsewhere, extra_path=[site])
    assert listed.returncode == 0, listed.stderr
    out = listed.stdout.splitlines()
    assert any(line.startswith("greeting ") and "single-turn" in line and "host, guest" in line for line in out)
    assert any(line.startswith("echo2 ") and "simultaneous" in line for line in out)
    assert any(line.startswith("broken ") and "does not load" in line and "mypkg.nothere" in line for line in out)
    check = run("envs", "--check", "echo2", cwd=elsewhere, extra_path=[site])
    assert check.returncode == 0 and "echo2: conforms" in check.stdout, check.stderr
    train = run("train", str(project / "cfg.yaml"), "task.name=greeting", "run.steps=1", "task.eval_size=0",
                cwd=elsewhere, extra_path=[site])
    assert train.returncode == 0, train.stderr


@pytest.mark.parametrize("name, expected", [
    ("nomod:Task", ["module 'nomod' does not import", "ModuleNotFoundError", "PYTHONPATH"]),
    ("mypkg.tasks:Greet", ["module 'mypkg.tasks' has no attribute 'Greet'", "did you mean 'GreetTask'"]),
    ("mypkg.tasks:NOT_A_TASK", ["is of type int, not a task class or factory"]),
    ("mypkg.tasks:Half", ["built a Half, which is not a task", "'rows'", "docs/own-task.md"]),
    ("mypkg.broken:Task", ["module 'mypkg.broken' does not import", "'numpyy'", "install 'numpyy'"]),
])
@pytest.mark.slow
def test_bad_module_reference_is_one_line_naming_module_error_and_fix(project, name, expected):
    (project / "mypkg" / "broken.py").write_text("import numpyy\n")
    out = run("train", "cfg.yaml", f"task.name={name}", "task.options={}", cwd=project)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    for text in expected:
        assert text in errors[0], errors[0]


# A newcomer's task, as the README lists what a task needs: no `name` attribute (register_task names it) and
# rows without an `id` (accord gives each one, a hash of its content, in train and in envs --check alike).
MINIMAL_MODULE = textwrap.dedent('''
    from accord.envs import register_task


    class Shout:
        """two agents shout a word"""
        agents = ("a", "b")

        def rows(self, split, limit=None, seed=0):
            words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"] if split == "train" else ["eta", "theta"]
            return [{"word": w} for w in words][:limit]

        def prompt(self, agent, row):
            return [{"role": "user", "content": f"Shout {row['word']}"}]

        def reward(self, *, prompts, completions, agents, word, **columns):
            return [float(w in x) for w, x in zip(word, completions["a"])]


    @register_task("shout", "a newcomer's task")
    def make_shout():
        return Shout()


    class Broken:
        agents = ("a",)

        def __init__(self):
            raise RuntimeError("the data file is missing")


    @register_task("broken", "a task whose constructor fails")
    def make_broken():
        return Broken()
''')


def test_a_task_needs_no_name_and_its_rows_no_id(tmp_path, monkeypatch):
    """make_task names a task by its registered name; a row without an id gets a content hash in the
    instances train reads and in the checker: both accept the same task."""
    import sys as _sys

    from accord.envs import make_task
    from accord.envs.check import check_env
    from accord.envs.protocol import instance_id, task_instances
    from accord.envs.registry import TASKS, make_env

    (tmp_path / "newcomer.py").write_text(MINIMAL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("accord.envs.registry.TASKS", dict(TASKS))
    import importlib

    importlib.import_module("newcomer")
    try:
        assert make_task("shout").name == "shout"
        env = make_env("shout")
        rows = task_instances(env, "train")
        assert [r["id"] for r in rows] == [instance_id({"word": w}) for w in ("alpha", "beta", "gamma", "delta",
                                                                              "eps", "zeta")]
        assert "id" not in env.task.rows("train")[0]   # the task's own rows are not changed
        check_env(lambda: make_env("shout"))
    finally:
        _sys.modules.pop("newcomer", None)


@pytest.mark.slow
def test_a_newcomers_task_trains_and_checks_and_a_broken_one_is_a_row_of_the_listing(tmp_path):
    (tmp_path / "newcomer.py").write_text(MINIMAL_MODULE)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG.replace('"mypkg.tasks:GreetTask"', "shout").replace("options: {size: 12}", "options: {}")
                   + "imports: [newcomer]\n")
    train = run("train", str(cfg), cwd=tmp_path)
    assert train.returncode == 0, train.stderr
    rows = [json.loads(line) for line in (tmp_path / "runs" / "own" / "completions" / "step_000002.jsonl")
            .read_text().splitlines()]
    assert all(r["instance"].startswith("row-") for r in rows)
    check = run("envs", "--import", "newcomer", "--check", "shout", cwd=tmp_path)
    assert check.returncode == 0 and "shout: conforms" in check.stdout, check.stderr
    listed = run("envs", "--import", "newcomer", cwd=tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    out = listed.stdout.splitlines()
    assert out[0].startswith("NAME") and out[-2].startswith("(kind and roles")   # the whole table, then the notes
    assert out[-1].startswith("other libraries' environments")
    assert any(line.startswith("letters ") for line in out) and any(line.startswith("writing ") for line in out)
    broken = next(line for line in out if line.startswith("broken "))
    assert "(does not build)" in broken and "RuntimeError: the data file is missing" in broken
    shout = next(line for line in out if line.startswith("shout "))
    assert "single-turn" in shout and "a, b" in shout


@pytest.mark.parametrize("agents, match", [
    (("a", "a"), r"repeats \['a'\]; give each role its own name"),
    ((), "give a non-empty tuple of role names"),
    ("ab", "give a non-empty tuple of role names"),
    (("a", 3), "give a non-empty tuple of role names"),
])
def test_a_tasks_agents_are_distinct_role_names(monkeypatch, agents, match):
    """A task whose agents repeat a name, are empty or are not names is refused when it is built (a repeated
    name trained one agent silently; an empty tuple failed later inside the reward)."""
    from accord.envs import make_task, register_task
    from accord.envs.registry import TASKS, TaskError

    monkeypatch.setattr("accord.envs.registry.TASKS", dict(TASKS))

    class Odd:
        def rows(self, split, limit=None, seed=0):
            return [{"word": "x"}]

        def prompt(self, agent, row):
            return [{"role": "user", "content": "hi"}]

        def reward(self, *, prompts, completions, agents, **columns):
            return [0.0] * len(next(iter(completions.values())))

    Odd.agents = agents
    register_task("odd", "agents under test")(Odd)
    with pytest.raises(TaskError, match=match):
        make_task("odd")


@pytest.mark.parametrize("max_turns, said", [(None, "has no max_turns"), (0, "has max_turns=0"),
                                             ("4", "has max_turns='4'"), (True, "has max_turns=True")])
def test_an_environment_without_a_positive_max_turns_is_refused_when_built(monkeypatch, max_turns, said):
    """An environment that declares no max_turns (or not a positive int) is one line when it is built: it
    trained to the end of its first step and then failed with an AttributeError inside the rollout."""
    from accord.envs import make_task, register_task
    from accord.envs.registry import TASKS, TaskError
    from accord.envs.synthetic.relay import RelayEnv

    monkeypatch.setattr("accord.envs.registry.TASKS", dict(TASKS))

    class Turnless(RelayEnv):
        def __init__(self):
            super().__init__()
            if max_turns is None:
                del self.max_turns
            else:
                self.max_turns = max_turns

    register_task("turnless", "max_turns under test")(Turnless)
    with pytest.raises(TaskError, match=f"^task 'turnless' \\(Turnless\\) {said}; a multi-turn environment declares "
                                        "the most turns an episode takes"):
        make_task("turnless")


def test_a_task_with_reward_components_and_no_reward_trains(monkeypatch, tiny_cfg, tmp_path):
    """reward_components is called instead of reward, so a task need not define both: one with only the parts
    was refused as lacking reward()."""
    from accord.config import config_from_dict
    from accord.envs import make_task, register_task
    from accord.envs.registry import TASKS
    from accord.trainer import Trainer

    monkeypatch.setattr("accord.envs.registry.TASKS", dict(TASKS))

    @register_task("parts_only", "reward_components and no reward")
    class PartsOnly:
        agents = ("a", "b")

        def rows(self, split, limit=None, seed=0):
            return [{"id": f"{split}{i}", "word": w} for i, w in enumerate(("sun", "moon", "star", "sky")[:limit])]

        def prompt(self, agent, row):
            return [{"role": "user", "content": f"{agent}: say {row['word']}"}]

        def reward_components(self, *, prompts, completions, agents, word, **columns):
            return [{"total": float(w in completions["a"][j]) + float(w in completions["b"][j]),
                     "a_says": float(w in completions["a"][j])} for j, w in enumerate(word)]

    assert make_task("parts_only").agents == ("a", "b")
    data = tiny_cfg(task={"name": "parts_only", "eval_size": 2}, run={"steps": 1, "run_dir": str(tmp_path / "run")})
    trainer = Trainer(config_from_dict(data))
    try:
        metrics = trainer.train()
    finally:
        trainer.close()
    assert "reward/a_says" in metrics and "team/reward" in metrics


def test_a_module_that_fails_at_import_is_one_line(tmp_path, monkeypatch):
    from accord.envs.registry import TaskError, import_modules

    (tmp_path / "raiser.py").write_text("raise RuntimeError('the data file is missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError, match=r"imports: 'raiser': module 'raiser' does not import \(RuntimeError: the data "
                                        r"file is missing\); fix the module") as err:
        import_modules(["raiser"])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("messages, match", [
    ("hello", "must return a non-empty list of chat messages"),
    (None, "must return a non-empty list of chat messages"),
    ([], "must return a non-empty list of chat messages"),
    ([{"role": "robot", "content": "x"}], r"returned the message \{'role': 'robot'"),
    ([{"role": "user"}], r"returned the message \{'role': 'user'\}"),
    ([{"role": "user", "content": 5}], "'content': a str"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "must end with the user's message"),
])
def test_a_tasks_prompt_must_be_chat_messages(messages, match):
    """What a task's prompt() returns is checked where accord reads it, naming the task, agent and row (it went to
    the chat template, which raised from inside jinja or accepted a made-up role)."""
    from accord.envs.protocol import EnvOutputError
    from accord.envs.single_turn import SingleTurnEnv
    from accord.envs.synthetic.letters import LettersTask

    class Odd(LettersTask):
        def prompt(self, agent, row):
            return messages

    env = SingleTurnEnv(Odd())
    with pytest.raises(EnvOutputError, match=rf"task '.*': prompt\('e', row 'r1'\) .*{match}"):
        env.prompt("e", {"id": "r1"})


@pytest.mark.parametrize("result, match", [
    ({"team_reward": 1.0}, "step\\(\\) must return a StepResult, got dict"),
    (("1.0", {"a": 0.0, "b": 0.0}, True), "team_reward must be a finite number, got '1.0'"),
    ((float("nan"), {"a": 0.0, "b": 0.0}, True), "team_reward must be a finite number, got nan"),
    ((1.0, {}, True), r"local_rewards must hold a reward for each agent \['a', 'b'\]"),
    ((1.0, {"a": 0.0, "b": "0"}, True), "every local reward must be a finite number"),
    ((1.0, {"a": 0.0, "b": 0.0}, "no"), "done must be a bool, got 'no'"),
])
def test_a_step_result_is_checked_on_every_step(result, match):
    """An environment's step() result is checked where every step of a run is taken (step_env; the shape
    `accord envs --check` checks): a text reward was read as a number, a done of 'no' as true, a missing local reward as 0."""
    from accord.envs.protocol import EnvOutputError, StepResult, step_env

    res = result if isinstance(result, dict) else StepResult({"a": "", "b": ""}, *result)

    class Env2:
        name, agents = "two", ("a", "b")

        def step(self, actions):
            return res

    with pytest.raises(EnvOutputError, match=f"environment 'two': (step\\(\\) returned a StepResult whose )?{match}"):
        step_env(Env2(), {"a": "x"})


@pytest.mark.parametrize("result, match", [
    ({"team_reward": 1.0}, "must return a StepResult, got dict"),
    (("1.0", {"a": 0.0, "b": 0.0}, True), "team_reward must be a finite number, got '1.0'"),
    ((True, {"a": 0.0, "b": 0.0}, True), "team_reward must be a finite number, got True"),
    ((1.0, {"a": 0.0, "b": float("inf")}, True), "every local reward must be a finite number"),
    ((1.0, {"a": 0.0, "b": 0.0}, "no"), "done must be a bool, got 'no'"),
    ((1.0, {"a": 0.0, "b": 0.0}, True, None, {"a": ""}), r"must return an observation for every agent \['a', 'b'\], got \['a'\]"),
    ((1.0, {"a": 0.0, "b": 0.0}, True, []), r"info must be a dict \(empty for nothing to say\), got list"),
])
def test_envs_check_demands_what_a_run_demands_and_more(result, match):
    """`accord envs --check` refuses every step result a run refuses (one check, the same words), and besides
    wants an observation for every agent and a dict info; a numpy reward passes both."""
    import numpy as np

    from accord.envs.check import EnvCheckError, _check_result
    from accord.envs.protocol import StepResult

    class Env2:
        name, agents = "two", ("a", "b")

    fine = StepResult({"a": "", "b": ""}, np.float32(1.0), {"a": np.float64(0.5), "b": 0}, False)
    assert _check_result(Env2(), fine) is fine
    if isinstance(result, dict):
        res = result
    else:
        reward, local, done, *rest = result
        info = rest[0] if rest and rest[0] is not None else {}
        res = StepResult(rest[1] if len(rest) > 1 else {"a": "", "b": ""}, reward, local, done, info)
    with pytest.raises(EnvCheckError, match=f"environment 'two': Env2\\.step (returned a StepResult whose )?{match}"):
        _check_result(Env2(), res)


def test_step_env_names_the_environments_own_errors_and_passes_accords():
    """An exception from an environment's code is named with the environment; a machine failure accord raises
    itself (a sandbox that cannot start) and OSError pass unchanged, with their own words."""
    from accord.envs.protocol import EnvOutputError, step_env
    from accord.sandbox.api import SandboxError

    class Env2:
        name, agents = "two", ("a", "b")

        def __init__(self, err):
            self.err = err

        def step(self, actions):
            raise self.err

    with pytest.raises(EnvOutputError, match=r"environment 'two': step\(\) raised KeyError: 'x'; an environment must "
                                             r"take any text as a move"):
        step_env(Env2(KeyError("x")), {"a": "go"})
    for err in (SandboxError("the sandbox did not start"), OSError(28, "No space left on device")):
        with pytest.raises(type(err)) as info:
            step_env(Env2(err), {"a": "go"})
        assert info.value is err


def test_an_instance_id_is_the_same_in_every_process():
    """A set in a row was hashed by its repr, whose order follows the per-process string hash seed: the same
    instance got another id in each process (a Ray actor, a resume). A set, an array, bytes hash by their content;
    an object whose repr names its memory address, or a row of mixed key types, is an error asking for an id."""
    import os
    import subprocess
    import sys as _sys

    from accord.envs.protocol import EnvOutputError, instance_id

    code = ("import numpy, torch; from accord.envs.protocol import instance_id; "
            "print(instance_id({'letters': set('abcdefghij'), 'a': numpy.arange(3), 't': torch.tensor([1.5]), "
            "'b': b'xy', 'f': frozenset({('p', 1), ('q', 2)})}))")
    ids = {subprocess.run([_sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in (1, 2, 3)}
    assert len(ids) == 1 and ids.pop().startswith("row-")
    assert instance_id({"s": {"a", "b"}}) != instance_id({"s": ["a", "b"]}) != instance_id({"s": {"a"}})
    with pytest.raises(EnvOutputError, match=r"holds a value of type object whose repr \(<object object at 0x.*give "
                                             "the instance an"):
        instance_id({"x": object()})
    with pytest.raises(EnvOutputError, match=r"cannot be hashed into one \(.*\); give the instance an 'id'"):
        instance_id({1: "a", "b": 2})
