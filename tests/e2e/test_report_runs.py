"""`accord report` on real runs: `accord train` and `accord report` in subprocesses, tiny random models."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest
import yaml

from accord.config import config_from_dict
from accord.tracking import read_metrics
from accord.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


def accord(*args, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "accord.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _row(md: str, label: str) -> list[str]:
    line = next(line for line in md.splitlines() if line.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.fixture(scope="module")
def writing_run(tmp_path_factory):
    """Five steps of the writing task on a tiny model, evaluated every two steps; then `accord report`."""
    tmp = tmp_path_factory.mktemp("writing")
    data = {
        "run": {"name": "w", "run_dir": str(tmp / "run"), "steps": 5, "threads": 2, "eval_every": 2},
        "policies": {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}},
        "agents": [{"name": "concise", "policy": "main"}, {"name": "detailed", "policy": "main"}],
        "task": {"name": "writing", "eval_size": 2, "options": {"source": "offline"}},
        # aligned (the writing task declares cross): the report's table pairs the agents of each joint action
        "algorithm": {"num_generations": 2, "joint_mode": "aligned"},
        "rollout": {"batch_size": 2, "max_new_tokens": 12, "temperature": 1.0, "eval_temperature": 1.0},
        "training": {"lr": 1e-3, "micro_batch_size": 8},
        "logging": {"console": False, "tensorboard": False, "completions_every": 2},
    }
    cfg = tmp / "writing.yaml"
    cfg.write_text(yaml.safe_dump(data))
    train = accord("train", str(cfg), cwd=tmp)
    assert train.returncode == 0, train.stderr[-3000:]
    report = accord("report", str(tmp / "run"), cwd=tmp)
    assert report.returncode == 0, report.stderr[-3000:]
    return tmp / "run"


@pytest.mark.slow
def test_report_headline_totals_and_tables(writing_run):
    rows = read_metrics(writing_run)
    md = (writing_run / "report" / "report.md").read_text()
    # evaluation at intervals: step 0, every 2 steps, and the last
    assert [r["step"] for r in rows if "eval/team/reward" in r] == [0, 2, 4, 5]
    # the headline, before -> after, from the first and last evaluations
    first, last = rows[0]["eval/team/reward"], rows[-1]["eval/team/reward"]
    headline = md.split("## What the run learned", 1)[1].split("##", 1)[0]
    assert f"step 0 -> step 5: {first:.4f} -> {last:.4f}" in headline
    # and the training reward's first third -> last third (one step each of five)
    team = [r["team/reward"] for r in rows if "team/reward" in r]
    assert (f"training team reward (sampled), mean of the first third (step 1) -> the last third (step 5): "
            f"{team[0]:.4f} -> {team[-1]:.4f}") in headline
    # identical curves once: the agents' rewards are the team reward
    cells = _row(md, "`team/reward` = `agent/concise/reward` = `agent/detailed/reward`")
    team = [r["team/reward"] for r in rows if "team/reward" in r]
    assert cells[3].startswith(f"{max(team):.4g} (step ") and cells[4] == f"{sum(team) / 5:.4g}" and cells[5] == "5"
    # four evaluation points: no mean of the last five; best is the maximum
    ev = _row(md, "`eval/team/reward`")
    evals = [r["eval/team/reward"] for r in rows if "eval/team/reward" in r]
    assert ev[4] == "—" and ev[5] == "4" and ev[3].startswith(f"{max(evals):.4g} (step")
    # lengths have no best; losses have the minimum
    assert _row(md, "`agent/concise/completion_len`")[3] == "—"
    pg = [r["loss/main/pg"] for r in rows if "loss/main/pg" in r]
    assert _row(md, "`loss/main/pg`")[3].startswith(f"{min(pg):.4g} (step") and ", min)" in _row(md, "`loss/main/pg`")[3]
    # totals include the evaluations (and the checkpoint)
    total = sum(r.get(k, 0.0) for r in rows for k in ("time/step", "time/eval", "time/checkpoint"))
    match = re.search(r"\*\*Total time:\*\* \S+ \(([\d.]+) s, sum of `time/step` \+ `time/eval` \+ `time/checkpoint`\)", md)
    assert match and float(match.group(1)) == pytest.approx(total, abs=0.06)
    assert "evaluations: " in md and "(4)" in md
    # the reward's components, logged and tabled
    for part in ("l1", "l2", "l3", "l4", "faithfulness", "source_overlap"):
        assert all(math.isfinite(r[f"reward/{part}"]) for r in rows if "team/reward" in r)
        assert all(f"eval/reward/{part}" in r for r in rows if "eval/team/reward" in r)
        _row(md, f"`reward/{part}`")
    for r in rows:
        if "team/reward" in r:   # faithfulness is off by default: the levels add up to the paper's reward
            assert sum(r[f"reward/l{i}"] for i in range(1, 5)) == pytest.approx(r["team/reward"], abs=1e-9)
            assert r["reward/faithfulness"] == 0.0
    assert "No KL was measured" in md


def test_report_plots(writing_run):
    report = writing_run / "report"
    names = {p.name for p in report.glob("*.png")}
    assert names == {"reward.png", "components.png", "loss.png", "lengths.png", "time.png"}
    md = (report / "report.md").read_text()
    for name in names:
        img = mpimg.imread(report / name)
        assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 600
        assert f"![{name[:-4]}]({name})" in md
    # three panels (pg, entropy, grad norm; no KL without kl_coef) and two (lengths, truncation) are taller
    assert mpimg.imread(report / "loss.png").shape[0] > mpimg.imread(report / "reward.png").shape[0] * 2
    assert mpimg.imread(report / "lengths.png").shape[0] > mpimg.imread(report / "reward.png").shape[0] * 1.5


def test_report_sample_completions_and_eval_files(writing_run):
    md = (writing_run / "report" / "report.md").read_text()
    for step in (0, 2, 4, 5):
        lines = (writing_run / "eval_completions" / f"step_{step:06d}.jsonl").read_text().splitlines()
        recs = [json.loads(line) for line in lines]
        assert len(recs) == 2 * 2 and {r["agent"] for r in recs} == {"concise", "detailed"}
        assert {r["joint"] for r in recs} == {0, 1}
        for r in recs:
            assert set(r["components"]) == {"l1", "l2", "l3", "l4", "faithfulness", "source_overlap"}
            assert r["completion"] and ("Summarize" in r["prompt"] or "detailed summary" in r["prompt"])
    by_joint = {}
    for r in map(json.loads, (writing_run / "eval_completions" / "step_000005.jsonl").read_text().splitlines()):
        by_joint.setdefault(r["joint"], set()).add(r["reward"])
    assert all(len(v) == 1 for v in by_joint.values())   # the agents of a joint action share its reward
    rewards = {r["step"]: r for r in read_metrics(writing_run)}[5]
    assert sum(next(iter(v)) for v in by_joint.values()) / 2 == pytest.approx(rewards["eval/team/reward"])
    # the last step's completions are written although 5 is not a multiple of completions_every
    assert (writing_run / "completions" / "step_000005.jsonl").is_file()
    samples = md.split("## Sample completions", 1)[1]
    assert "### Last training step: step 5 (`completions/step_000005.jsonl`, 4 scored joint actions)" in samples
    assert "### Last held-out evaluation: step 5 (`eval_completions/step_000005.jsonl`, 2 scored joint actions)" \
        in samples
    train_rows = [json.loads(x) for x in (writing_run / "completions" / "step_000005.jsonl").read_text().splitlines()]
    best = max(r["reward"] for r in train_rows)
    worst = min(r["reward"] for r in train_rows)
    section = samples.split("### Last held-out", 1)[0]
    if best != worst:
        assert f"**Best**: reward {best:.4g}" in section and f"**Worst**: reward {worst:.4g}" in section
    else:
        assert "All 4 scored the same" in section
    assert "*concise*" in section and "*detailed*" in section and "l1 " in section


def test_eval_every_gives_more_than_two_points(tiny_cfg):
    assert config_from_dict(tiny_cfg()).run.eval_every == 0   # by default only before and after
    data = tiny_cfg(run={"steps": 6, "eval_before": True, "eval_after": True, "eval_every": 5},
                    task={"name": "letters", "eval_size": 2})
    del data["run"]["threads"]
    cfg = config_from_dict(data)
    trainer = Trainer(cfg)
    trainer.train()
    assert [r["step"] for r in read_metrics(trainer.run_dir) if "eval/team/reward" in r] == [0, 5, 6]
    # a task whose reward is plain floats logs no components
    assert not any(k.startswith("reward/") for r in read_metrics(trainer.run_dir) for k in r)
    rows = [json.loads(x) for x in (trainer.run_dir / "eval_completions" / "step_000006.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 and "components" not in rows[0]


def test_multi_turn_eval_completions_and_report(tiny_cfg):
    data = tiny_cfg(run={"steps": 1, "eval_before": True, "eval_after": True},
                    task={"name": "relay", "eval_size": 2, "options": {"max_turns": 2}},
                    algorithm={"name": "atgrpo", "num_generations": 2}, rollout={"batch_size": 2, "max_new_tokens": 6,
                                                                               "temperature": 1.0,
                                                                               "eval_temperature": 1.0})
    trainer = Trainer(config_from_dict(data))
    trainer.train()
    rows = [json.loads(x) for x in (trainer.run_dir / "eval_completions" / "step_000001.jsonl").read_text().splitlines()]
    metrics = read_metrics(trainer.run_dir)[-1]
    # every agent's every turn of each episode, in playing order, with the episode's results
    assert [(r["joint"], r["turn"], r["agent"]) for r in rows] == [(e, t, a) for e in (0, 1) for t in (0, 1)
                                                                  for a in ("e", "o")]
    assert sum({r["joint"]: r["reward"] for r in rows}.values()) / 2 == pytest.approx(metrics["eval/team/reward"])
    assert sum({r["joint"]: r["success"] for r in rows}.values()) / 2 == pytest.approx(metrics["eval/success"])
    report = accord("report", str(trainer.run_dir), cwd=trainer.run_dir)
    assert report.returncode == 0, report.stderr
    md = (trainer.run_dir / "report" / "report.md").read_text()
    assert "### Last held-out evaluation: step 1 (`eval_completions/step_000001.jsonl`, 2 scored joint actions)" in md
    assert "held-out success rate, step 0 -> step 1" in md and (trainer.run_dir / "report" / "success.png").is_file()
