"""accord eval: the pass@k estimator, greedy/sampled metrics, base vs checkpoint, the CLI."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from accord.config import ConfigError, config_from_dict
from accord.evaluate import pass_at_k, run_eval
from accord.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (5, 0), (5, 2), (6, 3), (8, 8), (7, 1)])
def test_pass_at_k_matches_enumeration(n, c):
    outcomes = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), k))
        brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(brute)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def _train_relay(tiny_cfg, tmp_path):
    data = tiny_cfg(task={"name": "relay", "eval_size": 3}, algorithm={"name": "atgrpo"},
                    rollout={"eval_temperature": 1.0}, run={"run_dir": str(tmp_path / "run"), "steps": 2})
    Trainer(config_from_dict(data)).train()
    return tmp_path / "run"


@pytest.mark.slow
def test_eval_run_dir_compares_base_and_checkpoint(tiny_cfg, tmp_path):
    run = _train_relay(tiny_cfg, tmp_path)
    out = run_eval(run, samples=3, ks=[1, 3])
    report = json.loads((out / "eval.json").read_text())
    assert list(report["variants"]) == ["base", "step_000002"]
    for metrics in report["variants"].values():
        assert metrics["instances"] == 3
        assert 0 <= metrics["pass@1"] <= metrics["pass@3"] <= 1
        assert metrics["pass@1"] == pytest.approx(metrics["sampled/success"])
        assert {"greedy/team", "greedy/success", "sampled/agent/e/local_return"} <= set(metrics)
    assert "| pass@3 |" in (out / "eval.md").read_text()
    # the checkpoint really was loaded: its weights differ from the base, and so do (some) metrics
    base, ckpt = report["variants"].values()
    assert base != ckpt


def test_eval_single_turn_without_success_check(tiny_cfg, tmp_path):
    cfg_path = tmp_path / "c.yaml"
    import yaml

    cfg_path.write_text(yaml.safe_dump(tiny_cfg(task={"name": "letters", "eval_size": 2})))
    out = run_eval(cfg_path, samples=2, ks=[1], out=tmp_path / "out")
    report = json.loads((out / "eval.json").read_text())
    (metrics,) = report["variants"].values()
    assert "pass@1" not in metrics and "sampled/team" in metrics and "greedy/agent/e/completion_len" in metrics
    assert "no success check" in (out / "eval.md").read_text()
    # pass@k of a task that has no success check is refused before anything is evaluated (nothing written)
    with pytest.raises(ConfigError, match="--k 1 2: task 'letters' defines no success check, so pass@k cannot be "
                                          "computed; drop --k"):
        run_eval(cfg_path, samples=2, ks=[1, 2], out=tmp_path / "out2")
    assert not (tmp_path / "out2" / "eval.json").exists()


def test_eval_greedy_only_keeps_the_success_check(tiny_cfg, tmp_path):
    """--samples 0 on a task with a success check: the table has greedy/success and says pass@k needs samples,
    not that the task has no success check."""
    import yaml

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_cfg(task={"name": "relay", "eval_size": 2})))
    out = run_eval(cfg_path, samples=0, out=tmp_path / "out")
    md = (out / "eval.md").read_text()
    assert "| greedy/success |" in md
    assert "no success check" not in md and "pass@k is not reported: it needs sampled completions" in md
    # a temperature with nothing sampled was taken without a word (and printed in eval.md as if it had been used)
    with pytest.raises(ConfigError, match=r"^--temperature 0.5 with --samples 0 \(greedy: nothing is sampled\); drop"):
        run_eval(cfg_path, samples=0, temperature=0.5, out=tmp_path / "out3")
    assert not (tmp_path / "out3").exists()


def test_overrides_an_evaluation_does_not_read_are_named(tiny_cfg, tmp_path, caplog):
    """``accord eval CONFIG training.lr=0.5``: the update's settings change no number of an evaluation; each such
    override is one warning (the ones it reads, here at their values, none), and the numbers are those without them."""
    import yaml

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_cfg(task={"name": "relay", "eval_size": 2})))
    plain = json.loads((run_eval(cfg_path, samples=0, out=tmp_path / "a") / "eval.json").read_text())
    unread = ["training.lr=0.5", "run.steps=9", "sft.steps=3", "compare.seeds=[0, 1]"]
    with caplog.at_level("WARNING", logger="accord.evaluate"):
        out = run_eval(cfg_path, [*unread, "task.eval_size=2", "run.seed=0"], samples=0, out=tmp_path / "b")
    lines = [r.getMessage() for r in caplog.records if "has no effect on accord eval" in r.getMessage()]
    assert [x.split(" has no effect")[0] for x in lines] == unread, lines
    assert all(x.endswith("an evaluation runs no training step; remove it") for x in lines), lines
    mine, before = json.loads((out / "eval.json").read_text())["variants"]["base"], plain["variants"]["base"]
    assert mine.keys() == before.keys() and {k for k in mine if mine[k] != before[k]} <= {"time/eval_s"}


@pytest.mark.slow
def test_eval_cli(tiny_cfg, tmp_path):
    run = _train_relay(tiny_cfg, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "accord.cli", "eval", str(run), "--samples", "2", "--k", "1", "2",
                           "--no-base"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| pass@2 |" in proc.stdout and "base" not in proc.stdout.split("\n")[4]
    bad = subprocess.run([sys.executable, "-m", "accord.cli", "eval", str(run), "--samples", "1", "--k", "2"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and "pass@2 needs at least 2 samples" in bad.stderr
    inside = run / "checkpoints" / "step_000002" / "mine"   # rotation would delete it with the checkpoint
    refused = subprocess.run([sys.executable, "-m", "accord.cli", "eval", str(run), "--samples", "0", "--out",
                              str(inside)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert refused.returncode == 2 and "lies in the run's checkpoints/" in refused.stderr, refused.stderr[-2000:]
    assert not inside.exists()


def test_two_evaluations_into_one_folder_at_once_are_refused(tiny_cfg, tmp_path):
    """While one accord eval writes into OUT, a second into the same OUT stops in one line (it would have cleared
    the first's scratch run as a killed one's, and the later's results would have replaced the earlier's); the
    first's scratch run is untouched, and once it ends the folder is free again."""
    import yaml

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_cfg(task={"name": "letters", "eval_size": 2})))
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time\nfrom pathlib import Path\nfrom accord.evaluate import scratch_run\n"
        f"with scratch_run(Path({str(out)!r}), 'accord eval') as work:\n"
        "    print(work, flush=True)\n    time.sleep(120)\n")], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        work = Path(holder.stdout.readline().strip())
        assert work.is_dir()
        second = subprocess.run([sys.executable, "-m", "accord.cli", "eval", str(cfg_path), "--samples", "0",
                                 "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.strip().splitlines()[-1].endswith(
            f" ERROR accord: {out} is in use by another accord command, writing its results there now; wait for it "
            "to end, or pass this accord eval another folder with --out DIR")
        assert work.is_dir() and not (out / "eval.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert run_eval(cfg_path, samples=0, out=out) == out and (out / "eval.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["eval.json", "eval.md"]   # the lock leaves no file
