"""bench/planpath_compare.py: the warm start of each seed, then accord compare from it (its statistics are
accord.stats, tested in tests/test_stats.py; the comparison itself in tests/test_compare.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "planpath_compare.py"


@pytest.mark.slow
def test_tiny_end_to_end(tmp_path):
    """The real script in a subprocess on a tiny model of the size it is given, with 10 % walls: one warm start
    that every method's every policy starts from, the comparison's files, and a second run that reuses both."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    out = tmp_path / "cmp"
    cmd = [sys.executable, str(SCRIPT), "--model", "tiny-qwen2", "--hidden-size", "32", "--num-layers", "1",
           "--wall-frac", "0.1", "--seeds", "0", "--methods", "atgrpo_shared", "atgrpo_roles", "grpo",
           "--eval-size", "2", "--budget", "3000", "--batch-size", "1", "--k", "2", "--sft-steps", "2",
           "--sft-instances", "6", "--sft-eval-size", "2",
           "--threads", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| atgrpo_shared |" in proc.stdout and (out / "compare.png").is_file()
    data = json.loads((out / "compare.json").read_text())
    assert data["methods"] == ["atgrpo_shared", "atgrpo_roles", "grpo"]
    assert data["settings"]["methods"]["grpo"]["task.options.wall_frac"] == 0.1
    warm = tmp_path / "cmp-warm" / "warm-0"
    assert json.loads((warm / "config.json").read_text())["hidden_size"] == 32
    starts = json.loads((tmp_path / "cmp-warm" / "warm_starts.json").read_text())
    assert starts["0"]["by_agent"].keys() == {"executor", "planner", "solver", "central"}   # every layout's demonstrations
    for r in data["runs"]:
        assert r["warm_start"] == str(warm) and r["train_tokens"] >= 3000
    # per-role policies load the same warm start: greedy decoding from it plays the same episodes as one model
    full = {m: json.loads((out / "results" / m / "seed_0.json").read_text()) for m in data["methods"]}
    texts = {m: [[(c["agent"], c["completion"]) for c in e["completions"]] for e in r["before"]]
             for m, r in full.items()}
    assert texts["atgrpo_shared"] == texts["atgrpo_roles"]
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "seed 0: reusing the warm start" in again.stderr and "compare: grpo seed 0 is done" in again.stderr
