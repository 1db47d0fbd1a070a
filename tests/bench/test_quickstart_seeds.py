"""bench/quickstart_seeds.py: the quickstart's criteria judged from a real run's files (its statistics are
accord.stats, tested in tests/test_stats.py; the training-reward thirds in tests/tracking/test_console.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accord.stats import mean_ci

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "quickstart_seeds.py"
TINY = ["policies.main.model=tiny-qwen2", "policies.main.model_kwargs={hidden_size: 32, num_layers: 1, num_heads: 4, "
        "vocab_size: 2048}", "run.steps=3", "rollout.batch_size=1", "algorithm.num_generations=2",
        "rollout.max_new_tokens=4", "task.eval_size=3", "run.eval_every=0", "rollout.max_prompt_tokens=2048",
        "logging.report_to=[]"]


def _script(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)


@pytest.mark.slow
def test_runs_the_default_job_per_seed_and_judges_it(tmp_path):
    """The real script trains the default job (the writing task, on a tiny model here) for a seed in a subprocess,
    then judges it from the run's files: the paired gain is the mean over held-out texts of after - before."""
    out = tmp_path / "seeds"
    proc = _script("--seeds", "3", "--out", str(out), "--threads", "1", "--json", str(tmp_path / "r.json"),
                   "--set", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = json.loads((tmp_path / "r.json").read_text())
    run = out / "seed-3"
    by_step = {}
    for step in (0, 3):
        rows = [json.loads(line) for line in (run / "eval_completions" / f"step_{step:06d}.jsonl").open()]
        by_step[step] = {r["instance"]: r["reward"] for r in rows}
    assert len(by_step[0]) == 3 and by_step[0].keys() == by_step[3].keys()
    mean, low, high = mean_ci([by_step[3][i] - by_step[0][i] for i in sorted(by_step[0])])
    gain = result["held_out_gain"]
    assert (gain["mean"], gain["low"], gain["high"]) == pytest.approx((mean, low, high))
    assert result["steps"] == 3 and result["eval_steps"] == [0, 3] and result["seed"] == 3
    assert result["passes"] == (mean >= 0.4 and result["train_last_third"] > result["train_first_third"])
    assert result["wall_s"] > 0 and result["s_per_step"] > 0
    last = [json.loads(line) for line in (run / "eval_completions" / "step_000003.jsonl").open()]
    assert result["distinct_answers"] == {a: len({r["completion"] for r in last if r["agent"] == a})
                                          for a in ("concise", "detailed")}
    assert f"concise {result['distinct_answers']['concise']}/3" in proc.stdout
    assert "| seed-3 |" in proc.stdout and "all pass:" in proc.stdout
    # judging the finished run again gives the same verdict, without training
    again = _script("--runs", str(run))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "| seed-3 |" in again.stdout and f"{gain['mean']:+.2f} [" in again.stdout


@pytest.mark.slow   # three interpreters that import torch: about 5 s under load
def test_bad_arguments_are_one_line_errors():
    for args, words in ((["--seeds", "0", "0"], "a seed given twice"),
                        (["--runs", "x", "--set", "run.steps=2"], "give one of them"),
                        (["--runs", "/nonexistent/run"], "metrics file not found")):
        proc = _script(*args)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
