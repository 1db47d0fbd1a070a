"""Cross-play (``accord eval --crossplay``): two separately trained tiny runs give matrices whose diagonal is
plain evaluation (``accord eval``) of each run, and the gaps and intervals that follow from them."""

import json
import subprocess
import sys

import pytest

from accord.checkpoint import CheckpointError
from accord.config import ConfigError, config_from_dict
from accord.crossplay import bootstrap_ci, run_crossplay
from accord.evaluate import run_eval
from accord.trainer import train


def _run(tiny_cfg, tmp_path, seed):
    return train(config_from_dict(tiny_cfg(
        run={"seed": seed, "run_dir": str(tmp_path / f"seed{seed}"), "steps": 1},
        specialization="separate",
        policies={"e": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}},
                  "o": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}},
        agents=[{"name": "e", "policy": "e"}, {"name": "o", "policy": "o"}],
        task={"name": "letters", "eval_size": 3}, rollout={"eval_temperature": 1.0, "batch_size": 1})))


@pytest.mark.slow
def test_crossplay_diagonal_is_plain_evaluation(tiny_cfg, tmp_path):
    a, b = _run(tiny_cfg, tmp_path, 0), _run(tiny_cfg, tmp_path, 1)
    out = run_crossplay([a, b], samples=2)
    report = json.loads((out / "crossplay.json").read_text())
    plain = {}
    for run in (a, b):
        ev = json.loads((run_eval(run, samples=2, ks=[1]) / "eval.json").read_text())["variants"]
        plain[run.name] = {"base": ev["base"], "trained": ev[next(k for k in ev if k != "base")]}
    for role in ("e", "o"):
        m = report["matrices"][role]
        for name in ("seed0", "seed1"):
            for mode in ("greedy", "sampled"):
                assert m[name][name][mode]["mean"] == plain[name]["trained"][f"{mode}/team"]
        for mode in ("greedy", "sampled"):   # the base weights are the first run's initial ones
            assert m["base"]["base"][mode]["mean"] == plain["seed0"]["base"][f"{mode}/team"]
    # two roles: role o's matrix is role e's transposed (one evaluation per assignment)
    me, mo = report["matrices"]["e"], report["matrices"]["o"]
    assert me["seed0"]["seed1"] == mo["seed1"]["seed0"]
    assert report["evaluations"] == 9 + 2       # 3 x 3 assignments, and each run's swapped roles
    gap = report["gaps"]["seed0"]["e"]
    lo, hi = gap["vs_seeds"]["ci95"]
    assert lo <= gap["vs_seeds"]["mean"] <= hi
    sp, xp = me["seed0"]["seed0"]["sampled"]["mean"], me["seed0"]["seed1"]["sampled"]["mean"]
    assert gap["vs_seeds"]["mean"] == pytest.approx(sp - xp)
    assert "Co-adaptation gap" in (out / "crossplay.md").read_text()


def test_bootstrap_interval():
    lo, hi = bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert 1.0 <= lo < 2.5 < hi <= 4.0
    assert bootstrap_ci([2.0] * 5) == (2.0, 2.0)


@pytest.mark.slow
def test_crossplay_needs_a_checkpoint(tiny_cfg, tmp_path):
    cfg = config_from_dict(tiny_cfg(run={"steps": 1}))
    (cfg.run_dir).mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text("run: {name: x}\n")
    with pytest.raises(ConfigError, match="has no checkpoint; train it"):
        run_crossplay([cfg.run_dir])
    cli = subprocess.run([sys.executable, "-m", "accord.cli", "eval", "--crossplay", str(tmp_path / "nothing")],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "no config.yaml there" in cli.stderr and len(cli.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_crossplay_plays_a_checkpoint_without_its_manifest_only_when_allowed(tiny_cfg, tmp_path):
    """As accord train --resume and accord eval: a checkpoint whose files cannot be verified is not played
    unless --allow-unverified is given."""
    run = _run(tiny_cfg, tmp_path, 0)
    for manifest in (run / "checkpoints").glob("step_*/manifest.json"):
        manifest.unlink()
    with pytest.raises(CheckpointError, match="pass --allow-unverified to load it anyway"):
        run_crossplay([run], samples=0)
    out = run_crossplay([run], samples=0, allow_unverified=True)
    assert json.loads((out / "crossplay.json").read_text())["runs"] == [str(run)]
    assert not list(out.glob(".accord-work.*"))   # the evaluating run's scratch directory is gone
