"""Same seed and config, same weights: two `accord train` processes of one config, two threads each, end with
byte-identical checkpoints and the same logged rewards and losses.

The config is the default job (two writers, MAGRPO, the K samples of a text sharing its prompt pass) on tiny random
models with SmolLM2's attention shapes where they matter (64-wide heads, grouped keys and values), so the KV cache
rows copied to the K samples are large enough for the CPU to accumulate their gradients in parallel. With the
rows copied by advanced indexing (its backward adds atomically) the second step's weights and losses differ
between the two processes and this test fails.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = "{hidden_size: 512, num_layers: 2, num_heads: 8, vocab_size: 2048}"
# what a run logs that depends on the machine (its speed, its memory), not on the computation
TIMING = ("time/", "perf/", "mem/")


def train(run_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    args = ["train", f"run.run_dir={run_dir}", "run.steps=2", "run.threads=2", "run.eval_before=false",
            "run.eval_after=false", "policies.concise.model=tiny-qwen2", "policies.detailed.model=tiny-qwen2",
            f"policies.concise.model_kwargs={MODEL}", f"policies.detailed.model_kwargs={MODEL}",
            "logging.console=false", "logging.tensorboard=false"]
    return subprocess.run([sys.executable, "-m", "accord.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def logged(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


@pytest.mark.slow
def test_two_processes_of_one_config_end_with_the_same_weights(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run_dir in runs:
        proc = train(run_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (sorted((r / "checkpoints").glob("step_*/policies/*/model.safetensors")) for r in runs)
    assert [p.relative_to(runs[0]) for p in a] == [p.relative_to(runs[1]) for p in b] and len(a) == 2
    assert logged(runs[0]) == logged(runs[1])
    for x, y in zip(a, b):
        assert x.read_bytes() == y.read_bytes(), f"{x.relative_to(runs[0])} differs between the two processes"
