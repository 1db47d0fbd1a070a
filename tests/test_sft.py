"""``accord sft``: oracles, demonstrations (oracle and JSONL), the prompts RL shows, the warm start through the CLI."""

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from accord.config import config_from_dict
from accord.envs import make_task
from accord.envs.oracles import oracle_for, solve_sokoban, solve_sudoku
from accord.envs.puzzles.planpath import shortest_path
from accord.envs.puzzles.sudoku import from_rows, is_solved
from accord.tracking import MetricAccumulator
from accord.sft import DemoError, collect_demos, encode_demos, read_demos, write_demos

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2, "max_position_embeddings": 4096}}


def planpath_cfg(tmp_path, workflow="direct", max_new_tokens=96, **sft):
    """A tiny Plan-Path warm start; the direct workflow's roles (planner, executor) answer with move lines."""
    return {
        "run": {"name": "warm", "output_dir": str(tmp_path / "runs"), "threads": 2, "steps": 2, "eval_before": False,
                "eval_after": False},
        "specialization": "shared",
        "policies": {"main": TINY},
        "task": {"name": "planpath", "options": {"size": 5, "max_turns": 2, "workflow": workflow}, "eval_size": 2},
        "algorithm": {"name": "atgrpo", "num_generations": 2},
        "rollout": {"batch_size": 2, "max_new_tokens": max_new_tokens, "max_prompt_tokens": 2048,
                    "temperature": 1.0},
        "training": {"lr": 1e-3, "micro_batch_size": 16, "bf16": False},
        "logging": {"console": False, "tensorboard": False},
        "sft": {"instances": 24, "eval_size": 8, "steps": 12, "batch_size": 16, "lr": 3e-3, **sft},
    }


def play(env, row, noisy, rng):
    """Play one episode with the oracle; (solved, moves used by the real state)."""
    env.reset(row)
    oracle = oracle_for(env)
    res = None
    for _ in range(env.max_turns):
        for agent in env.agents:
            text = oracle(env, agent, row, rng, noisy)
            if text is None:
                return False, res
            res = env.step({agent: text})
            if res.done:
                return res.info["success"], env._state
    return False, env._state


@pytest.mark.parametrize("name,options", [("planpath", {"size": 6}), ("sudoku", {}), ("sokoban", {})])
def test_oracle_solves_every_puzzle_in_one_turn(name, options):
    env = make_task(name, options)
    rng = random.Random(0)
    for row in env.tasks("train", limit=10):
        env.reset(row)
        oracle = oracle_for(env)
        for agent in env.agents:
            res = env.step({agent: oracle(env, agent, row, rng, False)})
        assert res.done and res.info["success"], (name, row["id"])
        if name == "planpath":   # by a shortest path: the optimal bonus was paid
            assert env._state.moves_used == env._state.optimal


def test_noisy_answers_are_suboptimal_or_wrong():
    env = make_task("planpath", {"size": 6})
    rng = random.Random(1)
    kinds = {"longer": 0, "fails": 0}
    for row in env.tasks("train", limit=30):
        env.reset(row)
        s = env._state
        text = oracle_for(env)(env, "executor", row, rng, True)
        moves = text.split("Moves:")[1].split()
        best = shortest_path(s.grid, s.pos, s.goal)
        pos = s.pos
        for m in moves:   # walk the proposal: a detour still arrives, a wrong move does not
            r, c = pos[0] + {"U": -1, "D": 1}.get(m, 0), pos[1] + {"L": -1, "R": 1}.get(m, 0)
            if 0 <= r < len(s.grid) and 0 <= c < len(s.grid) and s.grid[r][c] != "#":
                pos = (r, c)
        if pos == s.goal:
            assert len(moves) == len(best) + 2
            kinds["longer"] += 1
        else:
            kinds["fails"] += 1
    assert kinds["longer"] >= 5 and kinds["fails"] >= 5, kinds


def test_solvers():
    board = solve_sudoku(from_rows(["1...", "..1.", ".1..", "...1"]))
    assert is_solved(board, from_rows(["1...", "..1.", ".1..", "...1"]))
    assert solve_sudoku(from_rows(["11..", "....", "....", "...."])) is None
    walls = frozenset({(r, c) for r in range(5) for c in range(5) if r in (0, 4) or c in (0, 4)})
    assert solve_sokoban(walls, frozenset({(2, 3)}), frozenset({(2, 2)}), (2, 1)) == ["R"]
    assert solve_sokoban(walls, frozenset({(2, 3)}), frozenset({(1, 1)}), (2, 2)) is None   # box in a corner


def test_code_oracles_earn_what_the_docs_say():
    task = make_task("humaneval", {})
    rows = task.rows("train", limit=3)
    rng = random.Random(0)
    oracle = oracle_for(task)
    helper = [oracle(task, "helper", r, rng, False) for r in rows]
    main = [oracle(task, "main", r, rng, False) for r in rows]
    assert [s["total"] for s in task.score(helper, main, rows)] == [3.5, 3.5, 3.5]
    env = make_task("code", {})
    row = env.tasks("train", limit=1)[0]
    env.reset(row)
    coder = env.step({"coder": oracle_for(env)(env, "coder", row, rng, False)})
    assert coder.local_rewards["coder"] == 1.0


def test_noise_share_and_demo_prompts(tmp_path):
    cfg = config_from_dict(planpath_cfg(tmp_path, noise=0.5, instances=40))
    train, evals = collect_demos(cfg)
    share = sum(d.noisy for d in train) / len(train)
    assert 0.35 < share < 0.65 and not any(d.noisy for d in evals)
    assert {d.agent for d in train} == {"planner", "executor"}
    assert any("turn 2" in d.where for d in train)   # a failed first turn is demonstrated again from its state
    clean, _ = collect_demos(config_from_dict(planpath_cfg(tmp_path, instances=40)))
    assert not any(d.noisy for d in clean)


def test_tool_workflow_demonstrates_a_solver_program(tmp_path):
    from accord.build import build_task

    cfg = config_from_dict(planpath_cfg(tmp_path, workflow="tool_planner", max_new_tokens=512, noise=0.5,
                                        instances=8))
    train, _ = collect_demos(cfg)
    assert {d.agent for d in train} == {"tool", "planner"}
    clean = next(d for d in train if d.agent == "tool" and not d.noisy)
    noisy = [d for d in train if d.agent == "tool" and d.noisy]
    assert noisy and all(d.completion != clean.completion for d in noisy)  # one operator flipped
    env = build_task(cfg)
    row = env.tasks("train", limit=1)[0]
    env.reset(row)
    res = env.step({"tool": clean.completion})  # the program runs in the sandbox on the real state
    assert res.info.get("tool_status") == "ok" and "Moves:" in res.observations["planner"]


def test_sft_prompts_are_the_token_ids_the_rl_rollout_shows(tmp_path):
    """The AT-GRPO rollout's first-turn prompts (planner, then executor after the chosen proposal) equal
    the encoded SFT prompts of the same instance once the rollout's proposal is the oracle's."""
    from accord.rollout.multiturn import start_episodes
    from accord.build import build_task
    from accord.trainer import Trainer

    cfg = config_from_dict(planpath_cfg(tmp_path))
    trainer = Trainer(cfg)
    policy = trainer.policies["main"]
    rows = trainer.batch_rows(0)
    samples, _ = trainer.rollout(0, rows, MetricAccumulator(), collections.defaultdict(float))
    row = rows[0]
    demos, _ = collect_demos_for(cfg, [row])
    planner_demo = next(d for d in demos if d.agent == "planner" and "turn 1" in d.where)
    rl_prompt = next(s.prompt_ids for s in samples if s.agent == "planner" and s.turn == 0 and s.instance == 0)
    assert encode_demos(policy, [planner_demo], 96)[0].prompt_ids == rl_prompt
    # the executor's prompt holds the planner's proposal: rebuild it with the rollout's chosen proposal text
    chosen = max((s for s in samples if s.agent == "planner" and s.turn == 0 and s.instance == 0),
                 key=lambda s: s.reward)
    ep = start_episodes(lambda: build_task(cfg), [row], 0)[0]
    ep.apply({"planner": chosen.completion_text}, ep.env.step({"planner": chosen.completion_text}))
    executor_prompts = {tuple(s.prompt_ids) for s in samples if s.agent == "executor" and s.turn == 0
                        and s.instance == 0}
    assert tuple(policy.encode_chat(ep.messages("executor", None))) in executor_prompts


def collect_demos_for(cfg, rows):
    from accord.sft import oracle_demos
    from accord.build import build_task

    return oracle_demos(cfg, lambda: build_task(cfg), rows, noise=0.0, seed=0), None


def accord(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-m", "accord.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_warm_start_lowers_heldout_nll_and_rl_starts_from_it(tmp_path):
    config = tmp_path / "warm.yaml"
    config.write_text(yaml.safe_dump(planpath_cfg(tmp_path)))
    sft = accord("sft", str(config), cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr
    out = tmp_path / "runs" / "warm" / "sft"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    before, after = lines[0]["sft/main/eval_nll"], lines[-1]["sft/main/eval_nll"]
    assert after < 0.6 * before, (before, after)
    assert [x["step"] for x in lines] == list(range(13))
    assert all(x["perf/tokens_per_s"] > 0 for x in lines[1:])
    played = {k: lines[-1][k] for k in ("sft/eval/success", "sft/eval/team/reward")}   # greedy play, 8 puzzles
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (out / "main").iterdir()}
    assert f"policies.main.model={out / 'main'}" in sft.stderr
    demos = read_demos(out / "demos.jsonl", ("planner", "executor"))   # its own output is valid input
    assert len(demos) >= 24

    rl = accord("train", str(config), f"policies.main.model={out / 'main'}", "policies.main.model_kwargs={}",
                "run.name=rl", "run.eval_before=true", "task.eval_size=8", cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr
    run = tmp_path / "runs" / "rl"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # sft's held-out play is the RL run's evaluation of the same weights on the same puzzles
    assert (metrics[0]["eval/success"], metrics[0]["eval/team/reward"]) == pytest.approx(
        (played["sft/eval/success"], played["sft/eval/team/reward"]))
    assert yaml.safe_load((run / "config.yaml").read_text())["policies"]["main"]["model"] == str(out / "main")
    again = accord("sft", str(config), cwd=tmp_path)   # never overwrites a warm start
    assert again.returncode == 2 and "already holds a warm start" in again.stderr


BAD_LINES = [
    ('{"agent": "nobody", "prompt": "hi", "completion": "Moves: U"}', "line 2: unknown agent 'nobody'"),
    ('{"agent": "planner", "prompt": "hi", "completion": "  "}', "line 2: empty completion"),
    ('{"agent": "planner", "prompt": "hi"}', "line 2: missing key(s) ['completion']"),
    ('{"agent": "planner", "prompt": "hi", "completion": "x", "score": 1}', "line 2: unknown key(s) ['score']"),
    ('{"agent": "planner", "prompt": [], "completion": "x"}', "line 2: prompt must be"),
    ('{"agent": "planner", "prompt": [{"role": "assistant", "content": "x"}], "completion": "x"}',
     "line 2: the prompt's last message must be the user's"),
    ("not json", "line 2: not valid JSON"),
    ('{"agent": "planner", "prompt": "hi", "completion": 5}',
     "line 2: the completion for agent 'planner' must be a string, not int"),
    ('{"agent": "planner", "prompt": "hi", "completion": "x", "agent": "executor"}',
     "line 2: not valid JSON (key 'agent' appears twice in one object)"),
]


@pytest.mark.parametrize("bad,message", BAD_LINES, ids=[m.split(": ", 1)[1][:20] for _, m in BAD_LINES])
def test_bad_jsonl_lines_name_the_line(tmp_path, bad, message):
    path = tmp_path / "demos.jsonl"
    path.write_text('{"agent": "executor", "prompt": "Grid...", "completion": "Moves: U R"}\n' + bad + "\n")
    with pytest.raises(DemoError) as err:
        read_demos(path, ("planner", "executor"))
    assert f"{path} {message}" in str(err.value)


def test_jsonl_prompts_text_and_chat(tmp_path):
    path = tmp_path / "demos.jsonl"
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    path.write_text(json.dumps({"agent": "planner", "prompt": "obs", "completion": "Moves: U"}) + "\n\n"
                    + json.dumps({"agent": "executor", "prompt": chat, "completion": "Moves: D"}) + "\n")
    demos = read_demos(path, ("planner", "executor"), {"planner": "P-sys", "executor": "E-sys"})
    assert demos[0].messages == [{"role": "system", "content": "P-sys"}, {"role": "user", "content": "obs"}]
    assert demos[1].messages == chat and demos[1].where == f"{path} line 3"
    write_demos(demos, tmp_path / "again.jsonl")
    assert [d.messages for d in read_demos(tmp_path / "again.jsonl", ("planner", "executor"))] == \
        [d.messages for d in demos]
    # JSON allows U+2028, U+2029 and U+0085 unescaped inside a string (json.dumps(ensure_ascii=False) writes them
    # so): they are text, not line breaks; a CRLF file and a byte-order mark read the same
    odd = "a\u2028b\u2029c\u0085d"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps({"agent": "planner", "prompt": odd, "completion": "Moves: U"},
                                                   ensure_ascii=False) + "\r\n" + json.dumps(
        {"agent": "executor", "prompt": "obs", "completion": "Moves: D"}) + "\r\n").encode("utf-8"))
    demos = read_demos(path, ("planner", "executor"), {"planner": "P-sys", "executor": "E-sys"})
    assert [d.messages[-1]["content"] for d in demos] == [odd, "obs"] and demos[1].where == f"{path} line 2"


def test_files_that_are_not_utf8_or_already_exist(tmp_path):
    """A demonstrations file that is not UTF-8 is a DemoError, not a decoding traceback; writing demonstrations
    never replaces an existing file."""
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'\xff\xfe{"agent": "planner"}\n')
    with pytest.raises(DemoError, match="is not UTF-8 text"):
        read_demos(path, ("planner", "executor"))
    mine = tmp_path / "mine.jsonl"
    mine.write_text("precious\n")
    demo = read_demos(_one_demo(tmp_path), ("planner", "executor"))
    with pytest.raises(DemoError, match="already exists; give a new path"):
        write_demos(demo, mine)
    assert mine.read_text() == "precious\n"


def test_a_demonstrations_file_that_is_a_fifo_is_named_so(tmp_path):
    """A FIFO given as sft.data exists, and is not read (it would wait for a writer): it was reported as "does not
    exist"."""
    fifo = tmp_path / "demos.fifo"
    os.mkfifo(fifo)
    with pytest.raises(DemoError, match=r"demonstrations file '.*demos.fifo' is a FIFO \(named pipe\), not a "
                                        r"regular file; give a JSONL file"):
        read_demos(fifo, ("planner", "executor"))
    with pytest.raises(DemoError, match=r"demonstrations file '/dev/null' is a device, not a regular file"):
        read_demos("/dev/null", ("planner", "executor"))


def _one_demo(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"agent": "planner", "prompt": "obs", "completion": "Moves: U"}) + "\n")
    return path


def test_eval_data_without_data_is_refused(tmp_path):
    """sft.eval_data is read only with sft.data: with the oracle it would be ignored, so it is an error."""
    cfg = config_from_dict(planpath_cfg(tmp_path, eval_data=str(tmp_path / "nowhere.jsonl")))
    with pytest.raises(DemoError, match="sft.eval_data=.* is read only with sft.data"):
        collect_demos(cfg)


def test_held_out_demonstrations_that_repeat_training_ones_are_refused(tmp_path):
    """As RL refuses instances in both splits, sft.eval_data may be neither the sft.data file nor repeat one of its
    demonstrations (same agent, prompt and completion): the held-out NLL would measure memorisation (it was
    reported without a word)."""
    def line(agent, prompt, completion):
        return json.dumps({"agent": agent, "prompt": prompt, "completion": completion}) + "\n"

    train = tmp_path / "demos.jsonl"
    train.write_text(line("planner", "obs 1", "Moves: U") + line("executor", "obs 2", "Moves: D"))
    with pytest.raises(DemoError) as err:
        collect_demos(config_from_dict(planpath_cfg(tmp_path, data=str(train), eval_data=str(train))))
    assert str(err.value) == (f"sft.data and sft.eval_data name the same file ({train}); the held-out demonstrations "
                              "must be others than the training ones: give sft.eval_data a separate file, or drop it")
    held = tmp_path / "held.jsonl"
    held.write_text(line("planner", "obs 2", "Moves: D") + line("executor", "obs 2", "Moves: D"))
    with pytest.raises(DemoError) as err:
        collect_demos(config_from_dict(planpath_cfg(tmp_path, data=str(train), eval_data=str(held))))
    assert str(err.value).startswith(f"sft.eval_data: 1 of the 2 held-out demonstrations are also training "
                                     f"demonstrations of sft.data (same agent, prompt and completion; e.g. {held} "
                                     f"line 2 = {train} line 2); keep")
    assert "\n" not in str(err.value)
    held.write_text(line("planner", "obs 2", "Moves: D") + line("executor", "obs 2", "Moves: U"))
    train_demos, evals = collect_demos(config_from_dict(planpath_cfg(tmp_path, data=str(train),
                                                                     eval_data=str(held))))
    assert len(train_demos) == 2 and len(evals) == 2


@pytest.mark.slow
def test_bad_jsonl_through_the_cli_is_a_one_line_error(tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_text('{"agent": "executor", "prompt": "Grid", "completion": "Moves: U"}\n'
                     '{"agent": "tool", "prompt": "Grid", "completion": "Moves: U"}\n')
    config = tmp_path / "warm.yaml"
    config.write_text(yaml.safe_dump(planpath_cfg(tmp_path, data=str(demos))))
    res = accord("sft", str(config), cwd=tmp_path)
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and f"{demos} line 2: unknown agent 'tool'" in errors[0], res.stderr
    assert "Traceback" not in res.stderr
    # overrides stand anywhere, after --write-demos FILE too; the file written is new
    out = tmp_path / "written.jsonl"
    res = accord("sft", str(config), "--write-demos", str(out), "sft.data=null", "sft.instances=4", cwd=tmp_path)
    assert res.returncode == 0 and out.is_file(), res.stderr[-3000:]
    again = accord("sft", str(config), "--write-demos", str(out), "sft.data=null", cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    # an option's value that looks like key=value is the option's (it was taken as an override)
    named = tmp_path / "demos=v1.jsonl"
    res = accord("sft", str(config), "--write-demos", named.name, "sft.data=null", "sft.instances=4", cwd=tmp_path)
    assert res.returncode == 0 and named.is_file(), res.stderr[-3000:]


def test_sft_config_errors():
    from accord.config import ConfigError

    with pytest.raises(ConfigError, match="sft.noise=1.5"):
        config_from_dict({"sft": {"noise": 1.5}})
    with pytest.raises(ConfigError, match="used as written"):
        config_from_dict({"sft": {"noise": 0.2, "data": "d.jsonl"}})
    with pytest.raises(ConfigError, match="has no oracle"):
        collect_demos(config_from_dict({"task": {"name": "letters"}, "policies": {"main": TINY}}))


def _resolved(data: dict):
    """The config of ``data`` with the task's agents filled in (as collect_demos leaves it)."""
    from accord.build import build_task

    cfg = config_from_dict(data)
    cfg.resolve_agents(tuple(build_task(cfg).agents))
    return cfg


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_sft_places_policies_as_training_does(tmp_path):
    """run.device and policies.<name>.device decide where SFT trains (a CUDA device that does not exist is the
    one-line error `accord train` gives, before any model loads); held-out play generates with hf."""
    from accord.config import ConfigError
    from accord.sft import _policies

    with pytest.raises(ConfigError, match=r"run.device=cuda, but this machine has no CUDA device"):
        _policies(_resolved({**planpath_cfg(tmp_path), "run": {"device": "cuda"}}))
    data = planpath_cfg(tmp_path)
    data["run"]["device"] = "cuda"
    data["policies"] = {"main": {**TINY, "device": "cpu"}}   # the policy's own setting wins, as in training
    (pol, agents), = _policies(_resolved(data)).values()
    assert pol.device == torch.device("cpu") and {p.device.type for p in pol.model.parameters()} == {"cpu"}
    assert pol.backend.name == "hf" and agents == ("planner", "executor")


def test_epochs_decide_each_policys_steps():
    from accord.sft import step_counts

    cfg = config_from_dict({"sft": {"steps": 7, "batch_size": 16}})
    assert step_counts(cfg, {"a": 100, "b": 3}) == {"a": 7, "b": 7}
    cfg = config_from_dict({"sft": {"epochs": 2.5, "batch_size": 16}})
    # ceil(2.5 * 100 / 16) = 16; a policy with fewer demonstrations than a batch takes them all each step
    assert step_counts(cfg, {"a": 100, "b": 3}) == {"a": 16, "b": 3}
    with pytest.raises(Exception, match="sft.epochs=0"):
        config_from_dict({"sft": {"epochs": 0}})


def test_centralized_demos_answer_every_role_and_solve(tmp_path):
    cfg = config_from_dict({**planpath_cfg(tmp_path, max_new_tokens=200),
                            "algorithm": {"name": "atgrpo", "num_generations": 2, "baseline": "centralized"}})
    train, _ = collect_demos(cfg)
    assert {d.agent for d in train} == {"central"}
    from accord.build import build_task

    env = build_task(cfg)
    # the first turn's demonstrations come first, one per puzzle in order
    for demo, row in zip(train, env.tasks("train", limit=cfg.sft.instances, seed=cfg.run.seed)):
        assert demo.where.endswith("turn 1") and row["id"] in demo.where
        assert demo.completion.index("<planner>") < demo.completion.index("<executor>")
        env.reset(row)
        res = env.step({"central": demo.completion})
        assert res.info["parse_failures"] == 0
        if not demo.noisy:
            assert res.info["success"], demo.completion


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _untimed(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


@pytest.mark.slow
def test_a_killed_or_interrupted_warm_start_resumes_to_the_same_models(tmp_path):
    """A warm start killed (SIGKILL) or stopped by Ctrl-C (SIGINT) part-way, then run again with the same command,
    ends with the very weights and losses of an uninterrupted one; other settings are refused in its place."""
    data = planpath_cfg(tmp_path, steps=30, checkpoint_every=5, eval_size=2, eval_success=False)
    config = tmp_path / "warm.yaml"
    config.write_text(yaml.safe_dump(data))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    ref = accord("sft", str(config), "sft.output_dir=ref", cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    for how, sig in (("killed", signal.SIGKILL), ("interrupted", signal.SIGINT)):
        part = tmp_path / f".{how}.partial"
        proc = subprocess.Popen([sys.executable, "-m", "accord.cli", "sft", str(config), f"sft.output_dir={how}"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while not (part / "checkpoints" / "step_000010").is_dir():
            assert proc.poll() is None, f"finished before it could be stopped: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() - t0 < 600
            time.sleep(0.01)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=600)
        if sig == signal.SIGINT:   # the step in progress is finished and checkpointed
            assert proc.returncode == 130, err[-3000:]
            assert "run the same command again to go on from there" in err and "Traceback" not in err
        assert not (tmp_path / how).exists() and part.is_dir()
        other = accord("sft", str(config), f"sft.output_dir={how}", "sft.lr=0.01", cwd=tmp_path)
        assert other.returncode == 2 and "holds an unfinished warm start of other settings (sft.lr=" in other.stderr
        again = accord("sft", str(config), f"sft.output_dir={how}", cwd=tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "sft: resuming" in again.stderr and not part.exists()
        ours, theirs = _weights(tmp_path / how / "main"), _weights(tmp_path / "ref" / "main")
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), how
        assert _untimed(tmp_path / how / "metrics.jsonl") == _untimed(tmp_path / "ref" / "metrics.jsonl"), how
        assert not (tmp_path / how / "checkpoints").exists()
    # killed before any checkpoint (sft.checkpoint_every=0: only at a Ctrl-C): the same command starts it over
    part = tmp_path / ".early.partial"
    args = ["sft", str(config), "sft.output_dir=early", "sft.checkpoint_every=0"]
    proc = subprocess.Popen([sys.executable, "-m", "accord.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while '"step": 3' not in ((part / "metrics.jsonl").read_text() if (part / "metrics.jsonl").is_file() else ""):
        assert proc.poll() is None and time.monotonic() - t0 < 600
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    again = accord(*args, cwd=tmp_path)
    assert again.returncode == 0 and "has no checkpoint yet; starting it over" in again.stderr, again.stderr[-3000:]
    ours = _weights(tmp_path / "early" / "main")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert _untimed(tmp_path / "early" / "metrics.jsonl") == _untimed(tmp_path / "ref" / "metrics.jsonl")


@pytest.mark.slow
def test_a_warm_start_stopped_at_its_final_rename_is_not_trained_again(tmp_path, monkeypatch, caplog):
    """Killed just before the finished warm start is renamed into place: the next start resumes it from its last
    checkpoint (the tidying ran before the rename, so the .partial it found had no settings.json and was deleted,
    the trained models with it, and trained again from step 0)."""
    import accord.sft as sft
    from accord.config import config_from_dict

    cfg = config_from_dict(planpath_cfg(tmp_path, steps=4, checkpoint_every=2, eval_size=2, eval_success=False))
    replace = os.replace

    def killed(src, dst):
        if str(src).endswith(".partial"):
            raise KeyboardInterrupt   # where a SIGKILL would stop it
        return replace(src, dst)

    monkeypatch.setattr(sft.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        sft.run_sft(cfg)
    monkeypatch.setattr(sft.os, "replace", replace)
    with caplog.at_level("INFO", logger="accord.sft"):
        summary = sft.run_sft(cfg)
    assert "sft: resuming" in caplog.text
    assert (Path(summary["output_dir"]) / "main" / "model.safetensors").is_file()
    assert not (Path(summary["output_dir"]) / "checkpoints").exists()


@pytest.mark.slow
def test_a_failed_warm_start_does_not_block_a_run_of_other_settings(tmp_path):
    """A run that cannot finish (a non-finite loss) leaves no unfinished warm start behind: the same command with
    the fix its error names runs in its place. One of other settings without a checkpoint is started over."""
    config = tmp_path / "warm.yaml"
    config.write_text(yaml.safe_dump(planpath_cfg(tmp_path, steps=6, eval_size=2, eval_success=False)))
    bad = accord("sft", str(config), "sft.lr=1e30", cwd=tmp_path)
    assert bad.returncode == 2 and "lower sft.lr" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert not (tmp_path / "runs" / "warm" / ".sft.partial").exists()
    good = accord("sft", str(config), cwd=tmp_path)
    assert good.returncode == 0, good.stderr[-3000:]
    assert (tmp_path / "runs" / "warm" / "sft" / "main" / "model.safetensors").is_file()
    # an unfinished warm start of other settings that holds no checkpoint yet: started over, with a warning
    part = tmp_path / "runs" / "other" / ".sft.partial"
    part.mkdir(parents=True)
    (part / "settings.json").write_text(json.dumps({"sft": {"lr": 1.0}}))
    (part / "demos.jsonl").write_text("")
    other = accord("sft", str(config), "run.name=other", cwd=tmp_path)
    assert other.returncode == 0 and "without a checkpoint; starting over" in other.stderr, other.stderr[-3000:]


def test_a_demonstration_prompt_longer_than_the_rollout_allows_names_its_line():
    from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
    from accord.policies.model import ModelPolicy
    from accord.sft import Demo

    policy = ModelPolicy("p", PolicyConfig(model="tiny-qwen2"), TrainingConfig(bf16=False), AlgorithmConfig(),
                         RolloutConfig(temperature=1.0, max_prompt_tokens=16), total_optimizer_steps=1, seed=0)
    demo = Demo(agent="planner", messages=[{"role": "user", "content": "word " * 50}], completion="x",
                where="demos.jsonl line 7")
    with pytest.raises(DemoError) as err:
        encode_demos(policy, [demo], 8)
    assert str(err.value).startswith("demos.jsonl line 7: the prompt of agent 'planner' is too long")
    assert "rollout.max_prompt_tokens=16" in str(err.value) and "\n" not in str(err.value)


def test_a_control_string_written_in_a_demonstration_stays_text():
    """A demonstration that writes `<|im_end|>` out trains on its characters (as the rollout's prompts keep them):
    it was encoded as the end-of-turn token, so the policy learned to stop in the middle of the answer."""
    from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
    from accord.policies.model import ModelPolicy
    from accord.sft import Demo

    policy = ModelPolicy("p", PolicyConfig(model="tiny-qwen2"), TrainingConfig(bf16=False), AlgorithmConfig(),
                         RolloutConfig(temperature=1.0), total_optimizer_steps=1, seed=0)
    tok = policy.tokenizer
    specials = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|im_start|>", "<|endoftext|>")}
    demo = Demo(agent="a", messages=[{"role": "user", "content": "say it"}],
                completion="one <|im_end|> two <|endoftext|>", where="demos.jsonl line 1")
    (encoded,) = encode_demos(policy, [demo], 64)
    body = encoded.completion_ids[:-1]
    assert not specials & set(body) and encoded.completion_ids[-1] in specials   # the EOS only at the end
    assert tok.decode(body) == "one <|im_end|> two <|endoftext|>"
    plain = Demo(agent="a", messages=demo.messages, completion="one two", where="demos.jsonl line 2")
    assert encode_demos(policy, [plain], 64)[0].completion_ids[:-1] == tok("one two", add_special_tokens=False)["input_ids"]


def test_sft_settings_it_does_not_read_are_named(tiny_cfg):
    """sft.steps beside sft.epochs (the epochs decide) and the oracle's sft.instances beside sft.data: a line each;
    the defaults, and each alone, say nothing."""
    from accord.sft import unread_sft_settings

    both = config_from_dict(tiny_cfg(sft={"steps": 1, "epochs": 2, "instances": 7, "data": "demos.jsonl"}))
    lines = unread_sft_settings(both)
    assert len(lines) == 2
    assert lines[0].startswith("sft.steps=1 has no effect with sft.epochs=2 set") and "give only one" in lines[0]
    assert lines[1].startswith("sft.instances=7 has no effect with sft.data") and "drop sft.instances" in lines[1]
    assert unread_sft_settings(config_from_dict(tiny_cfg(sft={"epochs": 2, "data": "demos.jsonl"}))) == []
    assert unread_sft_settings(config_from_dict(tiny_cfg(sft={"steps": 3, "instances": 7}))) == []


def test_a_prompt_too_long_by_its_characters_alone_is_refused_untokenized(tmp_path):
    """More characters than CHARS_PER_TOKEN times the prompt limit is more tokens than the limit for any tokenizer:
    refused before the prompt is encoded (a 10 MB prompt took 5 GB and 19 s to find too long)."""
    from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
    from accord.policies.model import ModelPolicy
    from accord.sft import CHARS_PER_TOKEN, Demo

    policy = ModelPolicy("p", PolicyConfig(model="tiny-qwen2"), TrainingConfig(bf16=False), AlgorithmConfig(),
                         RolloutConfig(temperature=1.0, max_prompt_tokens=16), total_optimizer_steps=1, seed=0)
    encoded = []
    real = policy.encode_chat
    policy.encode_chat = lambda messages: encoded.append(messages) or real(messages)
    demo = Demo(agent="planner", messages=[{"role": "user", "content": "x" * (CHARS_PER_TOKEN * 16 + 1)}],
                completion="Moves: U", where="demos.jsonl line 3")
    with pytest.raises(DemoError) as err:
        encode_demos(policy, [demo], 8)
    assert str(err.value).startswith("demos.jsonl line 3: the prompt of agent 'planner' has 1025 characters, so more "
                                     "than rollout.max_prompt_tokens=16 tokens") and not encoded
    short = Demo(agent="planner", messages=[{"role": "user", "content": "x" * (CHARS_PER_TOKEN * 16)}],
                 completion="Moves: U", where="demos.jsonl line 4")
    with pytest.raises(DemoError, match="demos.jsonl line 4: the prompt of agent 'planner' is too long"):
        encode_demos(policy, [short], 8)   # at the bound: tokenized, and found too long by its tokens
    assert len(encoded) == 1


def test_a_prompt_of_more_messages_than_the_prompt_limit_is_refused_untokenized():
    """Each chat message takes the template's tokens, empty or not: a prompt of more messages than the prompt limit
    is refused before it is encoded (600,000 empty messages passed the character count and took 4 GB and a minute
    to find too long)."""
    from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
    from accord.policies.model import ModelPolicy
    from accord.sft import Demo

    policy = ModelPolicy("p", PolicyConfig(model="tiny-qwen2"), TrainingConfig(bf16=False), AlgorithmConfig(),
                         RolloutConfig(temperature=1.0, max_prompt_tokens=16), total_optimizer_steps=1, seed=0)
    encoded = []
    real = policy.encode_chat
    policy.encode_chat = lambda messages: encoded.append(messages) or real(messages)
    demo = Demo(agent="planner", messages=[{"role": "user", "content": ""}] * 17, completion="Moves: U",
                where="demos.jsonl line 5")
    with pytest.raises(DemoError) as err:
        encode_demos(policy, [demo], 8)
    assert str(err.value).startswith("demos.jsonl line 5: the prompt of agent 'planner' has 17 chat messages, so "
                                     "more than rollout.max_prompt_tokens=16 tokens") and not encoded
    assert "\n" not in str(err.value)
    few = Demo(agent="planner", messages=[{"role": "user", "content": "U"}] * 2, completion="Moves: U",
               where="demos.jsonl line 6")
    assert len(encode_demos(policy, [few], 8)) == 1 and len(encoded) == 1


@pytest.mark.slow
def test_a_warm_start_refused_for_its_demonstrations_leaves_nothing_behind(tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps({"agent": "planner", "prompt": "Grid " * 40000, "completion": "Moves: U"}) + "\n")
    config = tmp_path / "warm.yaml"
    config.write_text(yaml.safe_dump(planpath_cfg(tmp_path, data=str(demos))))
    res = accord("sft", str(config), cwd=tmp_path)
    errors = [line for line in res.stderr.splitlines() if "ERROR" in line]
    assert res.returncode == 2 and len(errors) == 1 and "the prompt of agent 'planner' has" in errors[0], res.stderr
    assert not (tmp_path / "runs" / "warm" / ".sft.partial").exists()
    assert not (tmp_path / "runs" / "warm" / "sft").exists()


def test_resuming_keeps_the_metrics_through_the_checkpoint_and_names_a_damaged_line(tmp_path):
    """A last line cut short by a kill is dropped; a damaged line before it was dropped silently too (a step's
    metrics lost without a word), and a line of JSON that is not a record raised an AttributeError."""
    from accord.config import ConfigError
    from accord.sft import metrics_through

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"st')
    assert metrics_through(metrics, 2, tmp_path) == ['{"step": 1}', '{"step": 2}']
    for bad in ("garbage", "[1, 2]", '{"step": "2"}'):
        metrics.write_text(f'{{"step": 1}}\n{bad}\n{{"step": 3}}\n')
        with pytest.raises(ConfigError, match=r"metrics.jsonl: line 2 is not a metrics record .*remove that line"):
            metrics_through(metrics, 2, tmp_path)
