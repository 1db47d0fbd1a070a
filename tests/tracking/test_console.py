"""A run that reports itself and says what it is doing (the console sink, its heartbeat and summaries);
`accord envs`; config suggestions; joint-action ids in completion files. The install: test_packaging.py."""

import io
import json
import logging
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from rich.console import Console

from accord.config import ConfigError, config_from_dict, load_config
from accord.tracking import ConsoleSink
from accord.tracking.console import held_out_summary, training_summary, training_thirds
from accord.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


def accord(*args, cwd, env=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "accord.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_piped_run_shows_progress_and_ends_with_before_after(tmp_path):
    out = accord("train", str(REPO / "examples" / "tiny.yaml"), "run.steps=2", f"run.output_dir={tmp_path}",
                 "task.eval_size=4", "logging.tensorboard=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert any("step 1/2  team/reward=" in line for line in lines)  # a plain progress line per step
    at = next(i for i, line in enumerate(lines) if "run directory:" in line)
    assert "held-out team reward (sampled at temperature 1), step 0 -> step 2: " in lines[at + 1]
    assert "training team reward (sampled), mean of the first third (step 1) -> the last third (step 2): " in lines[-1]
    assert lines[at + 2:-1] and all("  agent " in line and " -> " in line for line in lines[at + 2:-1])
    assert "\x1b[" not in out.stderr  # no terminal control codes in a pipe


@pytest.mark.slow
def test_terminal_run_logs_through_the_bars_console(tmp_path):
    """Under a pseudo-terminal: rich's handler draws the log lines, the bar shows the per-step values
    and the per-step log line is not repeated beside it."""
    master, slave = pty.openpty()
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200", TERM="xterm")
    proc = subprocess.Popen([sys.executable, "-m", "accord.cli", "train", str(REPO / "examples" / "tiny.yaml"),
                             "run.steps=2", f"run.output_dir={tmp_path}", "task.eval_size=2",
                             "logging.tensorboard=false"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + 600
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))  # colours, cursor
    assert "held-out team reward (sampled at temperature 1)" in text and "train" in text and "2/2" in text
    assert "INFO" in text and "accord.tracking.console: step 1/2" not in text  # rich's handler; no repeated step line
    assert " INFO accord" not in text  # not the plain stderr format


def test_heartbeat_when_not_a_terminal(caplog):
    console = Console(file=io.StringIO(), force_terminal=False)
    with caplog.at_level(logging.INFO, logger="accord.tracking.console"):
        sink = ConsoleSink(total_steps=3, console=console, heartbeat_s=0.2)
        sink.set_activity("gen")
        time.sleep(0.7)
        sink.log(1, {"team/reward": 0.5})
        sink.set_activity("update")
        time.sleep(0.5)
        sink.close()
    lines = [r.getMessage() for r in caplog.records]
    beats = [line for line in lines if "running" in line]
    assert beats and beats[0].startswith("step 1/3 running (gen): ") and "in all" in beats[0]
    assert any(line.startswith("step 2/3 running (update): ") for line in beats)
    assert "step 1/3  team/reward=0.5" in lines


def test_no_heartbeat_and_no_repeated_line_in_a_terminal(caplog):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with caplog.at_level(logging.INFO, logger="accord.tracking.console"):
        sink = ConsoleSink(total_steps=2, console=console, heartbeat_s=0.1)
        time.sleep(0.3)
        sink.log(1, {"team/reward": 0.25})
        sink.log(2, {"team/reward": 0.75})
        sink.close()
    assert sink.live and not caplog.records  # the live bar is the progress display
    assert "team/reward=0.75" in buf.getvalue()


def test_held_out_summary_lines():
    rows = [{"step": 0, "eval/team/reward": 0.5, "eval/success": 0.25, "eval/agent/a/return": 0.2,
             "eval/agent/b/return": 0.5, "eval/agent/a/completion_len": 30.0},
            {"step": 1, "team/reward": 0.7},
            {"step": 4, "eval/team/reward": 0.9, "eval/success": 0.5, "eval/agent/a/return": 0.6,
             "eval/agent/b/return": 0.9, "eval/agent/a/completion_len": 20.5}]
    lines = held_out_summary(rows)
    assert lines[0] == "held-out team reward (greedy), step 0 -> step 4: 0.5000 -> 0.9000 (+0.4000)"
    assert lines[1] == "held-out success rate, step 0 -> step 4: 0.2500 -> 0.5000 (+0.2500)"
    assert lines[2] == "  agent a: return 0.2000 -> 0.6000 (+0.4000), length 30.0 -> 20.5 tokens"
    assert len(lines) == 3  # agent b's return equals the team's: not repeated
    assert "temperature 0.7" in held_out_summary(rows, temperature=0.7)[0]
    assert "one evaluation" in held_out_summary(rows[2:])[0]
    assert "no held-out evaluation" in held_out_summary(rows[1:2])[0]


def test_training_summary_compares_the_first_and_last_third_of_the_steps():
    """The quickstart's second criterion: the training reward's mean over the last third of the steps against
    the first third's; evaluation-only rows, non-finite values and a resumed step's older record do not count."""
    rewards = [1.0, 1.2, 0.8, 1.5, 1.1, 1.4, 2.0, 2.2, 2.4, 2.6]   # steps 1..10: thirds of 3 steps
    rows = [{"step": 0, "eval/team/reward": 1.0}]
    rows += [{"step": i + 1, "team/reward": r} for i, r in enumerate(rewards)]
    rows.insert(5, {"step": 9, "team/reward": -50.0})  # superseded by the later record of step 9
    rows.append({"step": 11, "team/reward": float("nan")})
    first, before, last, after = training_thirds(rows)
    assert (first, last) == ([1, 2, 3], [8, 9, 10])
    assert before == pytest.approx(1.0) and after == pytest.approx(2.4)
    assert training_summary(rows) == ["training team reward (sampled), mean of the first third (steps 1-3) -> "
                                      "the last third (steps 8-10): 1.0000 -> 2.4000 (+1.4000)"]
    assert training_thirds(rows[:2]) is None and training_summary(rows[:2]) == []


def test_envs_lists_kind_and_roles(tmp_path):
    out = accord("envs", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert "single-turn" in rows["writing"] and "concise, detailed" in rows["writing"]
    # the paper's roles are the default workflow (tool -> planner)
    assert "multi-turn, turn-based, 4 turns" in rows["planpath"] and "tool, planner" in rows["planpath"]
    assert "multi-turn, turn-based" in rows["relay"] and "e, o" in rows["relay"]


@pytest.mark.parametrize("override, hint", [
    ("steps=5", "did you mean 'run.steps' or 'sft.steps'?"),
    ("batch_size=8", "did you mean 'rollout.batch_size' or 'sft.batch_size' or 'reward_model.batch_size'?"),
    ("lr=0.1", "did you mean 'training.lr' or 'sft.lr' or 'critic.lr' or 'reward_model.lr' or 'policies.<name>.lr'?"),
    ("stpes=5", "did you mean 'run.steps' or 'sft.steps'?"),
    ("specialisation=shared", "did you mean 'specialization'?"),
    ("run.step=5", "did you mean 'run.steps'?"),
])
def test_unknown_top_level_keys_get_suggestions(override, hint):
    with pytest.raises(ConfigError, match="unknown config key") as err:
        load_config(None, [override])
    assert hint in str(err.value)


def test_unknown_top_level_key_from_the_cli(tmp_path):
    out = accord("train", "steps=5", cwd=tmp_path)
    assert out.returncode == 2 and "did you mean 'run.steps'" in out.stderr and "Traceback" not in out.stderr


def _completion_rows(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "completions" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def test_completion_rows_pair_the_agents_of_each_joint_action(tiny_cfg, tmp_path):
    Trainer(config_from_dict(tiny_cfg(run={"steps": 1}))).train()
    rows = _completion_rows(tmp_path / "run", 1)
    joint = defaultdict(list)
    for r in rows:
        joint[r["joint"]].append(r)
    assert sorted(joint) == list(range(2 * 4))  # B=2 instances x K=4 aligned joint actions
    for members in joint.values():
        assert sorted(m["agent"] for m in members) == ["e", "o"]
        assert len({m["instance"] for m in members}) == 1 and len({m["sample"] for m in members}) == 1
        assert len({m["reward"] for m in members}) == 1  # one team reward per joint action
    # cross mode: every combination is a joint action; a sample has its index but no single joint id
    cfg = tiny_cfg(run={"steps": 1, "run_dir": str(tmp_path / "cross")}, algorithm={"joint_mode": "cross",
                                                                                     "num_generations": 2})
    Trainer(config_from_dict(cfg)).train()
    rows = _completion_rows(tmp_path / "cross", 1)
    assert all(r["joint"] is None for r in rows) and {r["sample"] for r in rows} == {0, 1}


def test_multi_turn_tree_rows_pair_joint_actions(tiny_cfg, tmp_path):
    cfg = tiny_cfg(task={"name": "relay", "options": {"simultaneous": True}}, algorithm={"num_generations": 2},
                   rollout={"batch_size": 1, "max_new_tokens": 6, "temperature": 1.0, "max_turns": 2},
                   run={"steps": 1})
    Trainer(config_from_dict(cfg)).train()
    rows = _completion_rows(tmp_path / "run", 1)
    joint = defaultdict(list)
    for r in rows:
        joint[r["joint"]].append(r)
    assert len(joint) == 2 + 2 * 2  # the root's K joint actions, then K per child
    for members in joint.values():
        assert sorted(m["agent"] for m in members) == ["e", "o"] and len({m["turn"] for m in members}) == 1
