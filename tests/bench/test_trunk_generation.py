"""bench/trunk_generation.py runs end to end on a tiny model: two policies that train the last of its two
layers share the first, and decoding it together gives every row the tokens of its own call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_trunk_benchmark_compares_the_two_paths_on_the_same_rows(tmp_path):
    out = tmp_path / "trunk.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "trunk_generation.py"), "--rounds", "1",
                           "--json", str(out), "--set", "policies.main.model=tiny-qwen2",
                           "policies.main.trainable_layers=1", "rollout.max_new_tokens=8"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["trunk_layers"] == 1 and result["layers"] == 2
    assert result["rows"] == 16 and result["same_token_rows"] == 16 and result["max_logprob_gap"] < 1e-5
    assert set(result["results"]) == {"separate", "together"} and result["speedup"] > 0
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == result
