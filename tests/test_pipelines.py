"""accord eval --pipeline: prompt-only sequential hand-off and one round of discussion, scored like plain eval."""

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml

from accord.config import ConfigError, config_from_dict
from accord.evaluate import run_eval
from accord.pipelines import load_transcripts, pipeline_single_turn
from accord.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


def _trainer(tiny_cfg, **sections):
    trainer = Trainer(config_from_dict(tiny_cfg(**sections)))
    for pname, pol in trainer.policies.items():
        pol.seed_stream("eval", 7919 + zlib.crc32(pname.encode()))
    return trainer


def _config(tiny_cfg, tmp_path, **sections) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_cfg(**sections)))
    return path


def _team_of(task, rows, lines) -> list[float]:
    """The task's own team reward of the recorded final answers (rows repeated per sample)."""
    by_id = {row["id"]: row for row in rows}
    cols = [by_id[line["id"]] for line in lines]
    return task.reward(prompts=None, completions={a: [ln["agents"][a]["answer"] for ln in lines] for a in task.agents},
                       agents=task.agents, **{k: [r[k] for r in cols] for k in cols[0]})


def test_sequential_prompts_carry_earlier_answers(tiny_cfg, tmp_path):
    trainer = _trainer(tiny_cfg, task={"name": "letters", "eval_size": 3}, rollout={"max_new_tokens": 12})
    try:
        rows, task = trainer.eval_rows, trainer.run.env.task
        results = pipeline_single_turn(trainer.run, rows, 2, False, 1.0, pipeline="sequential",
                                       record=tmp_path / "s.jsonl").results
        lines = load_transcripts(tmp_path / "s.jsonl")
    finally:
        trainer.close()
    assert [(ln["id"], ln["sample"]) for ln in lines] == [(r["id"], j) for r in rows for j in range(2)]
    assert [len(per) for per in results] == [2, 2, 2]
    assert set(results[0][0]) == {"team", "agent/e/completion_len", "agent/o/completion_len"}
    assert any(ln["agents"]["e"]["answer"].strip() for ln in lines)  # the check below is not about empty strings
    for ln in lines:
        row = next(r for r in rows if r["id"] == ln["id"])
        first, second = ln["agents"]["e"], ln["agents"]["o"]
        assert first["messages"] == task.prompt("e", row)  # the first agent sees its task prompt only
        (msg,) = second["messages"]
        assert msg["content"].startswith(task.prompt("o", row)[0]["content"])
        assert first["answer"].strip() in msg["content"] and "answer of the e agent" in msg["content"]
    # the final answers are scored by the task's own team reward
    assert [r["team"] for per in results for r in per] == pytest.approx(_team_of(task, rows, lines))
    assert [ln["team"] for ln in lines] == pytest.approx([r["team"] for per in results for r in per])


def test_discussion_prompts_carry_peers_first_answers(tiny_cfg, tmp_path):
    trainer = _trainer(tiny_cfg, task={"name": "letters", "eval_size": 2}, rollout={"max_new_tokens": 12})
    try:
        rows, task = trainer.eval_rows, trainer.run.env.task
        results = pipeline_single_turn(trainer.run, rows, 2, False, 1.0, pipeline="discussion",
                                       record=tmp_path / "d.jsonl").results
        lines = load_transcripts(tmp_path / "d.jsonl")
    finally:
        trainer.close()
    assert len(lines) == 4 and any(ln["agents"]["o"]["first_answer"].strip() for ln in lines)
    for ln in lines:
        row = next(r for r in rows if r["id"] == ln["id"])
        for me, peer in (("e", "o"), ("o", "e")):
            msgs = ln["agents"][me]["messages"]
            assert msgs[0] == task.prompt(me, row)[0]  # round two continues the agent's own first exchange
            assert msgs[1] == {"role": "assistant", "content": ln["agents"][me]["first_answer"]}
            assert msgs[2]["role"] == "user" and f"answer of the {peer} agent" in msgs[2]["content"]
            assert ln["agents"][peer]["first_answer"].strip() in msgs[2]["content"]
            assert f"answer of the {me} agent" not in msgs[2]["content"]
    assert [r["team"] for per in results for r in per] == pytest.approx(_team_of(task, rows, lines))


def test_one_agent_sequential_equals_plain_eval(tiny_cfg, tmp_path):
    """With one agent a sequential hand-off has nobody to hand off from: the same metrics, greedy and sampled."""
    cfg = _config(tiny_cfg, tmp_path, task={"name": "letters", "eval_size": 3}, algorithm={"baseline": "centralized"})
    plain = json.loads((run_eval(cfg, samples=2, out=tmp_path / "plain") / "eval.json").read_text())
    seq = json.loads((run_eval(cfg, samples=2, out=tmp_path / "seq", pipeline="sequential") / "eval.json").read_text())
    assert plain["pipeline"] == "parallel" and seq["pipeline"] == "sequential"
    (p,), (s,) = plain["variants"].values(), seq["variants"].values()
    p.pop("time/eval_s"), s.pop("time/eval_s")
    assert p == s and "greedy/team" in p and "sampled/team" in p
    (line,) = [ln for ln in load_transcripts(tmp_path / "seq" / "base.pipeline.jsonl") if ln["sample"] == 0][:1]
    assert list(line["agents"]) == ["central"]


def test_pipeline_bad_input(tiny_cfg, tmp_path):
    cfg = _config(tiny_cfg, tmp_path, task={"name": "letters", "eval_size": 2}, run={"output_dir": str(tmp_path / "runs")})
    with pytest.raises(ConfigError, match=r"--pipeline 'sequental' is not a pipeline; did you mean 'sequential'"):
        run_eval(cfg, samples=0, pipeline="sequental")
    assert not (tmp_path / "runs").exists()  # refused before anything was built or written
    relay = _config(tiny_cfg, tmp_path, task={"name": "relay", "eval_size": 2}, algorithm={"name": "atgrpo"})
    with pytest.raises(ConfigError, match=r"'relay' is a multi-turn environment.*drop --pipeline"):
        run_eval(relay, samples=0, out=tmp_path / "r", pipeline="discussion")
    one = _config(tiny_cfg, tmp_path, task={"name": "letters", "eval_size": 2}, algorithm={"baseline": "centralized"})
    with pytest.raises(ConfigError, match=r"discussion needs at least two agents.*without --pipeline"):
        run_eval(one, samples=0, out=tmp_path / "o", pipeline="discussion")


@pytest.mark.slow
def test_pipeline_cli(tiny_cfg, tmp_path):
    """The CLI in a subprocess: humaneval's success check gives pass@k; the results sit beside plain eval's."""
    cfg = _config(tiny_cfg, tmp_path, task={"name": "humaneval", "eval_size": 2},
                  run={"output_dir": str(tmp_path / "runs"), "name": "he"}, rollout={"max_prompt_tokens": 2048})
    cmd = [sys.executable, "-m", "accord.cli", "eval", str(cfg), "--pipeline", "discussion", "--samples", "2",
           "--k", "1", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "runs" / "he-eval-discussion"
    assert "Prompt-only pipeline `discussion`" in proc.stdout and "| pass@2 |" in proc.stdout
    report = json.loads((out / "eval.json").read_text())
    (metrics,) = report["variants"].values()
    assert {"greedy/team", "greedy/success", "sampled/success", "pass@1", "pass@2",
            "greedy/agent/helper/completion_len"} <= set(metrics)
    assert report["pipeline"] == "discussion" and len(load_transcripts(out / "base.pipeline.jsonl")) == 2
    bad = subprocess.run(cmd[:5] + ["--pipeline", "debate"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and "--pipeline 'debate' is not a pipeline" in bad.stderr
    assert "Traceback" not in bad.stderr
