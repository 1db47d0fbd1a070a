"""``training.fsdp: true``: a data-parallel policy sharded with FSDP2, on real gloo process groups (two Ray
actors on a local cluster), against the same run without FSDP; its checkpoints; its errors; and (marked
``gpu``) NCCL data parallelism and FSDP on CUDA.

Tolerance. The reference is ``replicas: 1`` (one process, the same global batch and the same per-prompt
random streams, so the same rollouts). FSDP does not use the prompt-sharing forward (its number of passes
depends on the data; see accord.distributed.fsdp), so the comparisons run with ``micro_batch_size: 1``,
where no run shares prompts and both compute the same forwards: then the difference is only how the
per-sample gradients are grouped when summed (per micro-batch reduce-scatter vs one process's
accumulation). Measured after 1 step: max |weight difference| 3.7e-9 (the tied embedding; 9.3e-10 in one
MLP matrix; every other tensor bit-identical); the bound, 1e-6 absolute, is ~300x that and far below one
update (lr 1e-3), so a gradient averaged instead of summed, or reduced twice, fails it. With the default
micro-batches the reference shares prompts and FSDP does not: the logits round differently, and AdamW's
first step (update ~ lr * sign(g)) turns that into weight differences of up to 2e-3 on elements whose
gradient is near zero (measured), which says nothing about FSDP. Losses: 1e-5 relative; the gradient
norm 1e-4 (measured 1.0e-5: the norm is reduced over shards, and torch's fp32 norm of the 131k-element
embedding gradient is itself 5e-5 off the float64 value here).
"""

import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

from accord.config import ConfigError, config_from_dict
from accord.tracking import read_metrics
from accord.trainer import Trainer

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
COMMON = dict(algorithm={"num_generations": 4}, rollout={"batch_size": 2, "max_new_tokens": 8, "temperature": 1.0,
                                                         "generation_batch_size": 4},
              training={"lr": 1e-3, "micro_batch_size": 1})
TIED = {"lm_head.weight": "model.embed_tokens.weight", "model.embed_tokens.weight": "lm_head.weight"}  # saved once


pytestmark = pytest.mark.usefixtures("restore_threads")  # runs with run.threads=1 change torch's count


def _cfg(tiny_cfg, tmp_path, sub: str, policies: dict, steps: int = 2, **sections) -> dict:
    run = {"run_dir": str(tmp_path / sub), "steps": steps, "threads": 1, **sections.pop("run", {})}
    training = {**COMMON["training"], **sections.pop("training", {})}
    algorithm = {**COMMON["algorithm"], **sections.pop("algorithm", {})}
    return tiny_cfg(run=run, policies=policies,
                    **{"specialization": "shared", **COMMON, "training": training, "algorithm": algorithm, **sections})


def _fsdp(tiny_cfg, tmp_path, sub, steps=2, **sections):
    training = {"fsdp": True, **sections.pop("training", {})}
    return _cfg(tiny_cfg, tmp_path, sub, {"main": {**TINY, "replicas": 2, "num_cpus": 1}}, steps=steps,
                run={"backend": "ray", **sections.pop("run", {})}, training=training, **sections)


def _losses(records):
    return [{k: v for k, v in r.items() if k.startswith("loss/")} for r in records]


def _rollout(records):
    return [{k: v for k, v in r.items() if k.startswith(("team/", "agent/", "adv/"))} for r in records]


def _close(a, b, rel=1e-5):
    assert [r.keys() for r in a] == [r.keys() for r in b]
    for x, y in zip(a, b):
        for k in x:
            # the clipping norm: torch's fp32 norm is itself ~5e-5 off on this CPU (float64 check), sharded or not
            tol = 1e-4 if k.endswith("grad_norm") else rel
            assert x[k] == pytest.approx(y[k], rel=tol, abs=1e-7), k


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _run(data: dict, stop_after: int | None = None):
    """Weights (CPU, by parameter name) and metrics of a run; a sharded group's ranks must agree."""
    trainer = Trainer(config_from_dict(data))
    try:
        trainer.train(stop_after=stop_after)
        pol = trainer.policies["main"]
        if hasattr(pol, "state_dicts"):
            ranks = pol.state_dicts()  # gathered from the shards on every rank
            assert all(torch.equal(ranks[0][k], r[k]) for r in ranks[1:] for k in ranks[0])
            weights = ranks[0]
        else:
            weights = {k: v.detach().clone() for k, v in pol.model.named_parameters()}
        return weights, read_metrics(trainer.run_dir)
    finally:
        trainer.close()


# --- bad input: refused before any model loads --------------------------------------------------


@pytest.mark.parametrize("policy,sections,match", [
    ({}, {}, r"training.fsdp=true shards each policy across its data-parallel ranks, but policies \{'main': None\}"),
    ({"replicas": 1}, {}, r"\{'main': 1\} \(name: replicas\) have fewer than 2; set policies.<name>.replicas=2"),
    ({"replicas": 2}, {"specialization": "lora"}, r"training.fsdp=true does not support specialization=lora"),
])
def test_fsdp_config_errors(tiny_cfg, tmp_path, policy, sections, match):
    data = _cfg(tiny_cfg, tmp_path, "r", {"main": {**TINY, **policy}}, training={"fsdp": True}, **sections)
    t = time.perf_counter()
    with pytest.raises(ConfigError, match=match):
        Trainer(config_from_dict(data))
    assert time.perf_counter() - t < 15  # imports included, on a shared 2-core machine
    assert not (tmp_path / "r").exists()  # the trainer stopped before creating its run directory


def test_fsdp_with_vllm_and_on_devices_torch_cannot_shard(tiny_cfg, tmp_path, monkeypatch):
    import torch.distributed as dist

    from accord.distributed.fsdp import check_fsdp_support

    data = _fsdp(tiny_cfg, tmp_path, "r")
    data["rollout"]["generation_backend"] = "vllm"
    with pytest.raises(ConfigError, match="vllm"):  # refused where vllm is missing (here) or by the fsdp check
        config_from_dict(data)
    cfg = config_from_dict(_fsdp(tiny_cfg, tmp_path, "r", run={"device": "cuda"}))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)  # a torch build without NCCL
    with pytest.raises(ConfigError, match=r"training.fsdp=true on run.device=cuda needs NCCL, which this torch build "
                                          r"lacks \(available: gloo on cpu\); set run.device=cpu"):
        check_fsdp_support(cfg, ["main"], cuda_count=2)
    cfg = config_from_dict(_fsdp(tiny_cfg, tmp_path, "r", run={"device": "cpu"}))
    check_fsdp_support(cfg, ["main"], cuda_count=0)  # this torch has every FSDP2 method used
    # a torch whose FSDPModule lacks a method the sharding calls (torch 2.7 lacks three): refused by the method
    # it lacks, whatever its version number says
    from torch.distributed.fsdp import FSDPModule

    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms")
    with pytest.raises(ConfigError, match=r"training.fsdp=true needs FSDP2's FSDPModule.set_force_sum_reduction_for_"
                                          r"comms, which torch .* lacks \(torch >= 2.8 has them\)"):
        check_fsdp_support(cfg, ["main"], cuda_count=0)


# --- equivalence, checkpoints (two gloo ranks as Ray actors) -----------------------------------


@pytest.mark.slow
def test_two_fsdp_ranks_match_one_rank(ray_session, tiny_cfg, tmp_path):
    w1, m1 = _run(_cfg(tiny_cfg, tmp_path, "one", {"main": {**TINY, "replicas": 1}}))
    w2, m2 = _run(_fsdp(tiny_cfg, tmp_path, "fsdp"))
    assert _rollout(m1) == _rollout(m2)  # generation under FSDP: the same tokens
    _close(_losses(m1), _losses(m2))
    worst = _worst(w1, w2)
    assert worst <= 1e-6, worst
    print(f"MEASURED fsdp vs 1 rank after 2 steps: max |dw| = {worst:.3g}")


@pytest.mark.slow
def test_fsdp_with_the_last_block_trained_only(ray_session, tiny_cfg, tmp_path):
    """policies.<name>.trainable_layers under FSDP2: the frozen block and embeddings keep their weights on the
    sharded ranks, and the trained ones match one rank's run (the tolerance of the module docstring)."""
    top = {**TINY, "trainable_layers": 1}
    w1, m1 = _run(_cfg(tiny_cfg, tmp_path, "one", {"main": {**top, "replicas": 1}}))
    data = _cfg(tiny_cfg, tmp_path, "fsdp", {"main": {**top, "replicas": 2, "num_cpus": 1}},
                run={"backend": "ray"}, training={"fsdp": True})
    w2, m2 = _run(data)
    assert _rollout(m1) == _rollout(m2)
    assert _worst(w1, w2) <= 1e-6
    init = Trainer(config_from_dict(_cfg(tiny_cfg, tmp_path, "init", {"main": dict(TINY)})))
    try:
        w0 = {k: v.detach().clone() for k, v in init.policies["main"].model.named_parameters()}
    finally:
        init.close()
    frozen = [k for k in w0 if k.startswith(("model.layers.0.", "model.embed_tokens."))]
    assert frozen and all(torch.equal(w0[k], w2[k]) for k in frozen)
    assert any(not torch.equal(w0[k], w2[k]) for k in w0 if k.startswith("model.layers.1."))


@pytest.mark.slow  # ~70 s here: four trainers, eight actors
def test_fsdp_resume_is_exact_and_checkpoint_loads_without_fsdp(ray_session, tiny_cfg, tmp_path):
    """2 steps uninterrupted vs 1 step, checkpoint, resume to 2 (both FSDP): bit for bit; the step-1 checkpoint
    has the files of an unsharded policy and a plain policy loads it."""
    w_full, m_full = _run(_fsdp(tiny_cfg, tmp_path, "full", steps=2))
    data = _fsdp(tiny_cfg, tmp_path, "cut", steps=2, run={"checkpoint_every": 1})
    _run(data, stop_after=1)
    ckpt = tmp_path / "step1"
    shutil.copytree(tmp_path / "cut" / "checkpoints" / "step_000001" / "policies" / "main", ckpt)
    saved = load_file(ckpt / "model.safetensors")
    trainer = Trainer(config_from_dict(data), resume=True)
    try:
        assert trainer.start_step == 1
        trainer.train()
        ranks = trainer.policies["main"].state_dicts()
        assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
        w_cut = ranks[0]
    finally:
        trainer.close()
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/", "perf/"))} for r in rs]  # noqa: E731
    assert strip(m_full) == strip(read_metrics(tmp_path / "cut"))
    assert all(torch.equal(w_full[k], w_cut[k]) for k in w_full)

    from accord.policies.model import build_policy

    cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, "plain", {"main": {**TINY}}))
    plain = build_policy(cfg, "main", 0, 6)
    plain.load(ckpt)  # strict: every tensor present, same names as an unsharded policy's file
    got = {k: v.detach() for k, v in plain.model.named_parameters()}
    assert all(torch.equal(got[k], saved[k if k in saved else TIED[k]]) for k in got)
    assert len(plain.optimizer.state) == len(plain.params)  # the AdamW moments of every parameter
    assert all(s["exp_avg"].shape == p.shape for p, s in zip(plain.params, plain.optimizer.state.values()))


def test_plan_divides_the_sharded_state_by_the_ranks(tiny_cfg, tmp_path):
    from accord.plan import make_plan

    plans = {}
    for fsdp in (False, True):
        cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, f"p{fsdp}", {"main": {**TINY, "replicas": 2}},
                                    run={"device": "cpu"}, training={"fsdp": fsdp}, algorithm={"kl_coef": 0.1}))
        plans[fsdp] = make_plan(cfg)["plans"][0]
    plain, sharded = plans[False], plans[True]
    for key in ("weights", "reference", "grads", "optimizer"):
        assert getattr(sharded, key) == pytest.approx(getattr(plain, key) / 2)
    assert sharded.generation == pytest.approx(plain.generation + plain.weights / 2)  # gathered to generate


# --- on GPUs -------------------------------------------------------------------------------------


def _gpus(n: int) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs, torch sees {torch.cuda.device_count()}")


@pytest.mark.gpu
def test_gpu_two_nccl_ranks_match_one_rank(ray_session_gpu, tiny_cfg, tmp_path):
    """Plain data parallelism on two GPUs (NCCL all-reduce) against one rank on one GPU."""
    _gpus(2)
    w1, m1 = _run(_cfg(tiny_cfg, tmp_path, "one", {"main": {**TINY, "replicas": 1, "num_gpus": 1}},
                       run={"device": "cuda", "backend": "ray"}))
    w2, m2 = _run(_cfg(tiny_cfg, tmp_path, "two", {"main": {**TINY, "replicas": 2, "num_gpus": 1, "num_cpus": 1}},
                       run={"device": "cuda", "backend": "ray"}))
    assert _rollout(m1) == _rollout(m2)
    _close(_losses(m1), _losses(m2))
    assert _worst(w1, w2) <= 1e-5  # GPU kernels round by batch shape; still far below one update (1e-3)


@pytest.mark.gpu
def test_gpu_fsdp_two_steps(ray_session_gpu, tiny_cfg, tmp_path):
    """FSDP over NCCL: two steps, the ranks' gathered weights equal, moved from the initial ones, a checkpoint."""
    _gpus(2)
    data = _fsdp(tiny_cfg, tmp_path, "g", run={"device": "cuda", "checkpoint_every": 2})
    data["policies"]["main"]["num_gpus"] = 1
    w, m = _run(data)
    assert all(torch.isfinite(torch.tensor(float(v))) for r in m for v in r.values() if isinstance(v, (int, float)))
    assert (tmp_path / "g" / "checkpoints" / "step_000002" / "policies" / "main" / "model.safetensors").exists()


@pytest.mark.gpu
def test_gpu_fsdp_resume_matches_an_uninterrupted_run(ray_session_gpu, tiny_cfg, tmp_path):
    """FSDP over NCCL on two GPUs: 2 steps uninterrupted against 1 step, checkpoint, resume to 2. CUDA kernels
    with atomics (the embedding's backward) are not bit-reproducible and AdamW can turn such a difference into up
    to lr on an element whose gradient nearly cancels, so the check is relative: the two runs' weights differ by
    under 1 % of how far training moved them (a resume that lost the AdamW moments, the schedule or a shard
    moves every element's second step differently)."""
    from accord.policies.model import build_policy

    _gpus(2)

    def data(sub, **run):
        d = _fsdp(tiny_cfg, tmp_path, sub, steps=2, run={"device": "cuda", **run})
        d["policies"]["main"]["num_gpus"] = 1
        return d

    w_full, m_full = _run(data("full"))
    cut = data("cut", checkpoint_every=1)
    _run(cut, stop_after=1)
    trainer = Trainer(config_from_dict(cut), resume=True)
    try:
        assert trainer.start_step == 1
        trainer.train()
        ranks = trainer.policies["main"].state_dicts()
        assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # both ranks loaded the checkpoint
        w_cut = ranks[0]
    finally:
        trainer.close()
    plain = config_from_dict(_cfg(tiny_cfg, tmp_path, "init", {"main": {**TINY}}))
    w_init = {k: v.detach() for k, v in build_policy(plain, "main", 0, 2).model.named_parameters()}
    moved = sum(((w_full[k] - w_init[k]).double() ** 2).sum() for k in w_init) ** 0.5
    apart = sum(((w_full[k] - w_cut[k]).double() ** 2).sum() for k in w_init) ** 0.5
    print(f"MEASURED fsdp resume on GPUs: |w_full - w_resumed| = {apart:.3g}, |w_full - w_init| = {moved:.3g}")
    assert moved > 0 and apart < 0.01 * moved
    losses = _losses(read_metrics(tmp_path / "cut"))
    _close(_losses(m_full)[:1], losses[:1], rel=1e-4)  # step 1 ran before the checkpoint in both


@pytest.fixture(scope="module")
def ray_session_gpu():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
