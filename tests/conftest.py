import os
import re
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# torch threads per test process: 2, or 1 in each of several pytest-xdist workers (scripts/test.sh runs one
# worker per core) so that the workers do not oversubscribe the cores
THREADS = 1 if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 else 2
torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _threads_per_test():
    """Each test starts with THREADS torch threads, whatever runs of an earlier test on this worker set."""
    torch.set_num_threads(THREADS)


@pytest.fixture
def torch_threads() -> int:
    """run.threads for a test's runs of a config that sets its own (examples): THREADS."""
    return THREADS


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


# modules whose tests start Ray clusters or torchrun (its fixed rendezvous port) besides those of ray_session
# (test_gpu.py: its tests share the GPUs, so one worker runs them one after another)
_RAY_MODULES = {"test_ray.py", "test_data_parallel.py", "test_fsdp.py", "test_gpu.py"}
# modules whose tests time the sandbox's limits (a timeout, a CPU limit, the machine's response under a fork bomb)
# and also start bombs: on one worker, so that a bomb never runs beside their own timed tests (a fork bomb on one
# worker made the CPU-limit test on the other take 5.5 s and `true` 4 s, in one CI run of 2026-12-02)
_TIMED_MODULES = {"test_sandbox.py"}


def _xdist_group(item) -> str | None:
    """The worker group of a test under ``pytest -n N --dist loadgroup`` (scripts/test.sh): every test that
    starts Ray or torchrun in one group ("ray": one cluster at a time, ray_session set up once per module), the
    sandbox's timed tests in one group, and the tests of a module that share a module-scoped fixture in one group
    per module (built once); None: any worker."""
    params = getattr(item, "callspec", None)
    path = params.params.get("path") if params is not None else None  # an example's or a recipe's config
    if (item.path.name in _RAY_MODULES or any(f.startswith("ray_session") for f in item.fixturenames)
            or (isinstance(path, Path) and re.search(r"^\s*backend:\s*ray\b", path.read_text(), re.M))):
        return "ray"
    if item.path.name in _TIMED_MODULES:
        return item.path.name
    for name in item.fixturenames:
        defs = item._fixtureinfo.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "class", "package"):
            return item.path.name
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run wherever torch sees CUDA and are skipped elsewhere, with the reason. Each test
    gets its pytest-xdist group (:func:`_xdist_group`) under ``--dist loadgroup``."""
    if config.getoption("dist", "no") == "loadgroup":
        for item in items:
            group = _xdist_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
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
            "run": {"name": "t", "run_dir": str(tmp_path / "run"), "steps": 2, "threads": THREADS,
                    "eval_before": False, "eval_after": False},
            "specialization": "shared",
            "policies": {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}},
            "task": {"name": "letters", "eval_size": 0},
            "algorithm": {"num_generations": 4},
            "rollout": {"batch_size": 2, "max_new_tokens": 8, "temperature": 1.0},
            "training": {"lr": 1e-3, "micro_batch_size": 8, "warmup_steps": 0},
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
