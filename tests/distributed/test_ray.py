"""``run.backend: ray`` on a real local Ray cluster: the same rewards, losses and weights as ``backend: local``
(bit for bit, with ``run.threads`` set on both), resume on Ray, and the errors for an unreachable address and
for more CPUs/GPUs than the cluster has.

One Ray session for the module (``ray.init(num_cpus=2)``), shut down at the end. The error tests for the
address run before it starts: the backend only connects when Ray is not initialised yet.
"""

import socket
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from accord.config import config_from_dict  # noqa: E402
from accord.distributed.ray_backend import RayBackendError, RemotePolicy  # noqa: E402
from accord.tracking import read_metrics  # noqa: E402
from accord.trainer import Trainer  # noqa: E402


pytestmark = pytest.mark.usefixtures("restore_threads")  # runs with run.threads change torch's count


def _weights(trainer) -> dict:
    out = {}
    for p, pol in trainer.policies.items():
        params = pol.state_dict() if isinstance(pol, RemotePolicy) else {
            k: v.detach().clone() for k, v in pol.model.named_parameters()}
        out.update({f"{p}/{k}": v for k, v in params.items()})
    return out


def _comparable(records: list[dict]) -> list[dict]:
    """Metrics without wall-clock timings, rates and memory (everything else must match exactly)."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/")) and not k.endswith("_per_s")}
            for r in records]


def _separate(tiny_cfg, tmp_path, sub: str, **sections) -> dict:
    sections.setdefault("run", {})
    sections["run"] = {"run_dir": str(tmp_path / sub), "steps": 2, "threads": 1, **sections["run"]}
    return tiny_cfg(specialization="separate", **sections)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- errors before any cluster -----------------------------------------------------------------


@pytest.mark.parametrize("form", ["host:port", "ray://host:port", "auto"])
def test_unreachable_address_fails_fast(tiny_cfg, tmp_path, monkeypatch, form):
    if ray.is_initialized():
        ray.shutdown()
    port = _closed_port()
    address = {"host:port": f"127.0.0.1:{port}", "ray://host:port": f"ray://127.0.0.1:{port}", "auto": "auto"}[form]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # what 'auto' resolves to
    cfg = config_from_dict(tiny_cfg(run={"backend": "ray", "run_dir": str(tmp_path / "r")},
                                    ray={"address": address, "init_timeout_s": 3}))
    t = time.perf_counter()
    with pytest.raises(RayBackendError, match="cannot reach a Ray cluster at .*ray.address=null"):
        Trainer(cfg)
    assert time.perf_counter() - t < 10
    assert not ray.is_initialized()


# --- on a local cluster ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("ask,match", [({"ray": {"num_gpus_per_policy": 1}}, "ask for 2 GPUs in all .* has 0; lower"),
                                       ({"policies": {"main": {"model": "tiny-qwen2", "num_cpus": 3}}},
                                        "ask for 6 CPUs in all .* has 2; lower ray.num_cpus_per_policy")])
def test_more_resources_than_the_cluster_is_an_error_before_training(ray_session, tiny_cfg, tmp_path, ask, match):
    cfg = config_from_dict(_separate(tiny_cfg, tmp_path, "r", run={"backend": "ray"}, **ask))
    t = time.perf_counter()
    with pytest.raises(RayBackendError, match=match):
        Trainer(cfg)
    assert time.perf_counter() - t < 5  # refused up front: no actor was started
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_letters_same_metrics_and_weights_as_local(ray_session, tiny_cfg, tmp_path):
    """Two policies, one actor each (generation and updates run concurrently); eval before and after."""
    results = {}
    for backend in ("local", "ray"):
        data = _separate(tiny_cfg, tmp_path, backend, run={"backend": backend, "eval_before": True, "eval_after": True},
                         task={"name": "letters", "eval_size": 2})
        trainer = Trainer(config_from_dict(data))
        try:
            trainer.train()
            results[backend] = (_weights(trainer), read_metrics(trainer.run_dir))
            if backend == "ray":
                assert all(isinstance(p, RemotePolicy) for p in trainer.policies.values())
                assert len({p.info["pid"] for p in trainer.policies.values()}) == 2
                assert all(p.info["threads"] == 1 for p in trainer.policies.values())
        finally:
            trainer.close()
    (wl, ml), (wr, mr) = results["local"], results["ray"]
    assert [r["step"] for r in mr] == [0, 1, 2]
    assert _comparable(ml) == _comparable(mr)
    assert "loss/e/pg" in mr[-1] and "loss/o/pg" in mr[-1]
    assert wl.keys() == wr.keys() and all(torch.equal(wl[k], wr[k]) for k in wl)
    assert (tmp_path / "ray" / "checkpoints" / "step_000002" / "policies" / "o" / "model.safetensors").is_file()


@pytest.mark.slow
def test_relay_atgrpo_resumed_on_ray_matches_local(ray_session, tiny_cfg, tmp_path):
    """Multi-turn AT-GRPO: 3 steps locally vs 1 step locally, checkpointed, then resumed on Ray for steps 2-3
    (the actors load the checkpoint, train, evaluate and save). One Ray trainer keeps the module fast; the
    letters test covers a run that is on Ray from its first step."""
    common = dict(task={"name": "relay", "options": {"max_turns": 2}, "eval_size": 2},
                  algorithm={"name": "atgrpo", "num_generations": 3, "ppo_epochs": 2},
                  training={"lr": 1e-3, "micro_batch_size": 4, "schedule": "cosine"})
    local = Trainer(config_from_dict(_separate(tiny_cfg, tmp_path, "local", run={"steps": 3, "eval_after": True},
                                               **common)))
    local.train()
    run = {"steps": 3, "checkpoint_every": 1, "eval_after": True}
    Trainer(config_from_dict(_separate(tiny_cfg, tmp_path, "ray", run=run, **common))).train(stop_after=1)
    resumed = Trainer(config_from_dict(_separate(tiny_cfg, tmp_path, "ray", run={**run, "backend": "ray"}, **common)),
                      resume=True)
    try:
        assert resumed.start_step == 1
        resumed.train()
        wr = _weights(resumed)
    finally:
        resumed.close()
    ml, mr = read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray")
    assert [r["step"] for r in mr] == [1, 2, 3]
    assert _comparable(ml) == _comparable(mr)
    assert "eval/team/reward" in mr[-1] and "loss/o/pg" in mr[-1]
    wl = _weights(local)
    assert wl.keys() == wr.keys() and all(torch.equal(wl[k], wr[k]) for k in wl)
    assert (tmp_path / "ray" / "checkpoints" / "step_000003" / "policies" / "e" / "optimizer.pt").is_file()


@pytest.mark.parametrize("override,match", [
    ({"specialization": "lora"}, "run.backend=ray places one actor per policy, but specialization=lora"),
    ({"ray": {"address": "my-cluster"}}, "ray.address='my-cluster' is not valid; use null"),
    ({"ray": {"num_gpus_per_policy": -1}}, "ray.num_gpus_per_policy=-1.0 must be >= 0"),
    ({"run": {"backend": "spark"}}, r"run.backend='spark' is not valid; choose one of \['local', 'ray'\]"),
])
def test_config_errors_name_the_fix(tiny_cfg, override, match):
    from accord.config import ConfigError

    data = tiny_cfg(run={"backend": "ray"})
    for key, value in override.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and key in data else value
    with pytest.raises(ConfigError, match=match):
        config_from_dict(data)


@pytest.mark.slow
def test_resources_held_by_others_time_out_with_what_is_free(ray_session, tiny_cfg, tmp_path):
    @ray.remote(num_cpus=2)
    class Hog:
        def ping(self):
            return 1

    hog = Hog.remote()
    ray.get(hog.ping.remote())
    try:
        cfg = config_from_dict(_separate(tiny_cfg, tmp_path, "r", run={"backend": "ray"}, ray={"start_timeout_s": 2}))
        with pytest.raises(RayBackendError, match=r"did not place the actors of policies \['e', 'o'\].*free now: 0 "):
            Trainer(cfg)
    finally:
        ray.kill(hog)
