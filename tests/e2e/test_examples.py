"""Every example config trains for two steps with a tiny model (the smoke test of each algorithm x env pair)."""

from pathlib import Path

import pytest
import torch

from accord.config import PolicyConfig, load_config
from accord.trainer import Trainer

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_there_is_an_example_per_algorithm_and_environment():
    names = {p.stem for p in EXAMPLES}
    for algo in ("atgrpo", "magrpo"):
        for env in ("planpath", "sudoku", "sokoban"):
            assert f"{algo}_{env}" in names
    assert {"grpo_planpath", "centralized_planpath", "independent_planpath"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_two_steps(path, tmp_path, torch_threads):
    cfg = load_config(path, [f"run.run_dir={tmp_path / 'run'}", "run.steps=2", "run.checkpoint_every=0",
                             "rollout.batch_size=2", "rollout.max_new_tokens=8", "task.eval_size=2",
                             "logging.console=false", "logging.tensorboard=false"])
    for name in cfg.policies:
        cfg.policies[name] = PolicyConfig(model="tiny-qwen2", model_kwargs={"hidden_size": 64, "num_layers": 2,
                                                                         "max_position_embeddings": 4096})
    cfg.run.threads = min(cfg.run.threads or torch_threads, torch_threads)  # 1 per pytest-xdist worker
    if cfg.task.name == "writing":
        cfg.task.options["source"] = "offline"
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train()
    finally:
        trainer.close()   # stops Ray actors / the cluster of ray-backend examples
    assert metrics["perf/samples"] > 0
    assert "eval/team/reward" in metrics
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values())
    assert (tmp_path / "run" / "checkpoints").is_dir()
