import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
torch.set_num_threads(2)


@pytest.fixture
def restore_threads():
    """Put torch's thread count back after a test whose runs set another (``run.threads``)."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray cluster of 2 CPUs for one test module, shut down at its end (one left by another module is
    shut down first)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run wherever torch sees CUDA and are skipped elsewhere, with the reason."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU; torch {torch.__version__} sees none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny_cfg(tmp_path):
    """Plain-data config of a short run of the letters task on a tiny model."""

    def make(**sections):
        data = {
            "run": {"name": "t", "run_dir": str(tmp_path / "run"), "steps": 2, "threads": 2, "eval_before": False,
                    "eval_after": False},
            "policies": {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}},
            "task": {"name": "letters", "eval_size": 0},
            "algorithm": {"num_generations": 4},
            "rollout": {"batch_size": 2, "max_new_tokens": 8, "temperature": 1.0},
            "training": {"lr": 1e-3, "micro_batch_size": 8},
            "logging": {"console": False, "tensorboard": False, "completions_every": 1},
        }
        for key, value in sections.items():
            data.setdefault(key, {})
            if isinstance(value, dict) and key != "policies":
                data[key].update(value)
            else:
                data[key] = value
        return data

    return make
