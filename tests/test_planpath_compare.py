"""bench/planpath_compare.py: its interval statistics against textbook values, and (slow) the whole
pipeline -- warm start, five methods, before/after evaluation, table, JSON and plot -- on a tiny model."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "planpath_compare.py"


def _bench():
    spec = importlib.util.spec_from_file_location("planpath_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_t_quantile_matches_tables():
    b = _bench()
    # two-sided 95 % critical values of Student's t (any statistics table)
    for df, t in ((1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423), (47, 2.0117), (1000, 1.9623)):
        assert b.t_quantile(0.975, df) == pytest.approx(t, abs=2e-4)
    with pytest.raises(ValueError):
        b.t_quantile(0.975, 0)


def test_wilson_and_mean_intervals():
    b = _bench()
    # Wilson 95 % for 0/10, 10/10 and 3/10 (Newcombe 1998, method 3)
    assert b.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert b.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert b.wilson(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    for n in range(1, 200):   # the ends hold the proportion exactly, also where rounding would cross it
        assert b.wilson(0, n)[0] == 0.0 and b.wilson(n, n)[1] == 1.0
        assert all(b.wilson(k, n)[0] <= k / n <= b.wilson(k, n)[1] for k in range(n + 1))
    m, lo, hi = b.mean_ci([1.0, 2.0, 3.0, 4.0])   # mean 2.5, sd 1.291, t(3) = 3.1824
    assert (m, lo, hi) == pytest.approx((2.5, 2.5 - 3.1824 * 1.291 / 2, 2.5 + 3.1824 * 1.291 / 2), abs=1e-3)
    assert b.mean_ci([-1.0, -1.0]) == (-1.0, -1.0, -1.0)


def test_summary_pairs_puzzles():
    b = _bench()
    before = {"a": {"success": 0.0, "return": -1.0}, "b": {"success": 1.0, "return": 2.0}}
    after = {"a": {"success": 1.0, "return": 1.5}, "b": {"success": 1.0, "return": 2.0}}
    run = {"method": "grpo", "seed": 0, "layout": "solver", "steps": 2, "train_tokens": 10, "train_s": 1.0,
           "flat_group_frac": 0.5, "before": before, "after": after}
    s = b.summarise([run, dict(run, seed=1)], ["grpo"])["grpo"]
    assert s["episodes"] == 4 and s["seeds"] == 2
    assert s["success_before"]["mean"] == 0.5 and s["success_after"]["mean"] == 1.0
    assert s["return_change"]["mean"] == pytest.approx(1.25)   # per-puzzle differences 2.5 and 0, twice
    assert [p["seed"] for p in s["per_seed"]] == [0, 1]


def _fake_output(path: Path, seeds: list[int], **config) -> None:
    """A --json output of the script with one grpo run per seed (no model involved)."""
    before = {"a": {"success": 0.0, "return": -1.0}, "b": {"success": 1.0, "return": 2.0}}
    after = {"a": {"success": 1.0, "return": 1.5}, "b": {"success": 1.0, "return": 2.0}}
    runs = [{"method": "grpo", "seed": s, "layout": "solver", "steps": 2, "train_tokens": 10, "train_s": 1.0,
             "flat_group_frac": 0.5, "before": before, "after": after} for s in seeds]
    cfg = {"model": "tiny-qwen2", "methods": ["grpo"], "seeds": seeds, "budget": 100, "workflow": "direct",
           "size": 4, "eval_size": 2, "sft_steps": 2, "lr": 2e-5, "json": str(path), "plot": "x.png",
           "work_dir": None, "threads": 2, **config}
    path.write_text(json.dumps({"config": cfg, "total_s": 60.0, "warm_starts": {str(s): {"nll": 1.0} for s in seeds},
                                "summary": {}, "runs": runs}))


@pytest.mark.slow
def test_merge_summarises_runs_of_one_setting_made_apart(tmp_path):
    """--merge: per-seed outputs become one comparison; a file of another setting or a repeated seed is refused."""
    _fake_output(tmp_path / "s0.json", [0])
    _fake_output(tmp_path / "s12.json", [1, 2])
    out_path, plot = tmp_path / "all.json", tmp_path / "all.png"
    cmd = [sys.executable, str(SCRIPT), "--plot", str(plot), "--json", str(out_path), "--merge"]
    proc = subprocess.run(cmd + [str(tmp_path / "s0.json"), str(tmp_path / "s12.json")], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(out_path.read_text())
    assert out["config"]["seeds"] == [0, 1, 2] and out["total_s"] == 120.0   # the two files' times, summed
    s = out["summary"]["grpo"]
    assert s["seeds"] == 3 and s["episodes"] == 6 and [p["seed"] for p in s["per_seed"]] == [0, 1, 2]
    assert s["return_change"]["mean"] == pytest.approx(1.25)
    assert set(out["warm_starts"]) == {"0", "1", "2"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    _fake_output(tmp_path / "lr.json", [3], lr=1e-4)
    bad = subprocess.run(cmd + [str(tmp_path / "s0.json"), str(tmp_path / "lr.json")], capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "lr=0.0001" in bad.stderr and "merge only runs of one setting" in bad.stderr
    again = subprocess.run(cmd + [str(tmp_path / "s0.json"), str(tmp_path / "s0.json")], capture_output=True,
                           text=True, timeout=120, check=False)
    assert again.returncode == 2 and "seed(s) [0] are already in an earlier file" in again.stderr
    (tmp_path / "junk.json").write_text("[1, 2]")
    junk = subprocess.run(cmd + [str(tmp_path / "junk.json")], capture_output=True, text=True, timeout=120,
                          check=False)
    assert junk.returncode == 2 and "not a --json output of this script" in junk.stderr
    assert "Traceback" not in bad.stderr + again.stderr + junk.stderr


@pytest.mark.slow
def test_tiny_end_to_end(tmp_path):
    """The real script in a subprocess: 2 seeds x 5 methods on a tiny model; table, JSON line and PNG."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    plot = tmp_path / "cmp.png"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny-qwen2", "--seeds", "0", "1", "--eval-size", "2",
         "--budget", "100", "--sft-steps", "2", "--sft-instances", "6", "--sft-eval-size", "2",
         "--plot", str(plot), "--json", str(tmp_path / "cmp.json")],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    out = json.loads(lines[-1])
    assert out == json.loads((tmp_path / "cmp.json").read_text())
    assert list(out["summary"]) == ["atgrpo_shared", "atgrpo_roles", "magrpo", "grpo", "independent"]
    for method, s in out["summary"].items():
        assert s["episodes"] == 4 and len(s["per_seed"]) == 2
        assert s["train_tokens"] >= 100
        assert 0.0 <= s["success_after"]["low"] <= s["success_after"]["mean"] <= s["success_after"]["high"] <= 1.0
    # one before-evaluation per seed and layout: methods of a layout share it
    runs = [r for r in out["runs"] if r["seed"] == 0]
    assert runs[0]["before"] == runs[1]["before"] == runs[2]["before"] == runs[4]["before"]
    assert set(runs[3]["before"]) == set(runs[0]["before"])   # the solver plays the same puzzles
    assert out["warm_starts"]["0"]["by_agent"].keys() == {"executor", "planner", "solver"}
    assert any(line.startswith("atgrpo_shared") for line in lines)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
