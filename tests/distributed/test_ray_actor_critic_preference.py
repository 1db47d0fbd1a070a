"""iac (value heads in the policies' Ray actors) and madpo (log-prob passes and weighted updates in the actors) on
``run.backend: ray``: the same metrics and weights as ``backend: local``, bit for bit (``run.threads`` set)."""

import pytest
import torch

pytest.importorskip("ray")

from accord.config import config_from_dict  # noqa: E402
from accord.distributed.ray_backend import RemotePolicy  # noqa: E402
from accord.tracking import read_metrics  # noqa: E402
from accord.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_threads")


def _by_value():
    """Pickle this module's functions by value: ``_heads`` runs in a policy's Ray actor, which cannot import a
    test module."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _heads(policy) -> dict:
    return {k: v.detach().clone() for k, v in policy.value_heads.state_dict().items()}


def _state(trainer) -> dict:
    out = {}
    for p, pol in trainer.policies.items():
        if isinstance(pol, RemotePolicy):
            params, heads = pol.state_dict(), (pol.run(_heads) if trainer.cfg.algorithm.name == "iac" else {})
        else:
            params = {k: v.detach().clone() for k, v in pol.model.named_parameters()}
            heads = _heads(pol) if trainer.cfg.algorithm.name == "iac" else {}
        out.update({f"{p}/{k}": v for k, v in {**params, **{f"head.{k}": v for k, v in heads.items()}}.items()})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [{"name": "iac", "num_generations": 1}, {"name": "madpo", "num_generations": 3}])
def test_same_metrics_and_weights_as_local(ray_session, tiny_cfg, tmp_path, algorithm):
    _by_value()
    results = {}
    for backend in ("local", "ray"):
        trainer = Trainer(config_from_dict(tiny_cfg(
            specialization="separate", algorithm=algorithm,
            run={"run_dir": str(tmp_path / backend), "steps": 2, "threads": 1, "backend": backend})))
        try:
            trainer.train()
            results[backend] = (_state(trainer), read_metrics(trainer.run_dir))
            if backend == "ray":
                assert all(isinstance(p, RemotePolicy) for p in trainer.policies.values())
        finally:
            trainer.close()
    (wl, ml), (wr, mr) = results["local"], results["ray"]
    drop = ("time/", "mem/")
    assert [{k: v for k, v in r.items() if not k.startswith(drop) and not k.endswith("_per_s")} for r in ml] == \
        [{k: v for k, v in r.items() if not k.startswith(drop) and not k.endswith("_per_s")} for r in mr]
    assert wl.keys() == wr.keys() and all(torch.equal(wl[k], wr[k]) for k in wl)
    if algorithm["name"] == "iac":
        assert any(".head." in k or "/head." in k for k in wl)
        assert (tmp_path / "ray" / "checkpoints" / "step_000002" / "extras" / "critics" / "e" / "heads.safetensors").is_file()
