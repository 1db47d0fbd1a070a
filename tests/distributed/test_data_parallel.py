"""Data parallelism inside a policy (``policies.<name>.replicas``): real gloo process groups, real Ray actors
on a local cluster, and the real CLI under ``torchrun``.

Equivalence. The reference for ``replicas: 2`` is ``replicas: 1`` in the trainer's process: the same
per-prompt random streams (so the same rollouts, checked exactly: rewards and sampling log-probs), and
the same loss over the same global batch, split in two. The ranks' gradients are summed by an all-reduce
where one process accumulates them micro-batch by micro-batch. With each rank's share being one
micro-batch of the one-rank run the two sums have the same terms, yet the weights measured here differ
in a few elements of the tiny model's tied embedding / output matrix by up to 1 ulp (3.7e-9 after 2
steps; every other tensor is bit-identical): its gradient is the sum of two uses (the embedding lookup
and the output head), and fp32 rounding depends on how those terms are grouped with the other rank's. The
tolerance below, 1e-6 absolute on weights and 1e-5 relative on losses, is about 100x that and far
below one update (lr 1e-3 moves weights by ~1e-3 per step), so a wrong normalisation (a factor 2) or a
missing all-reduce fails it. The ranks of one policy must hold bit-identical weights.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from accord.config import ConfigError, config_from_dict
from accord.distributed.data_parallel import check_replicas
from accord.distributed.ranks import DataParallelPolicy, part
from accord.tracking import read_metrics
from accord.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
# 2 instances x K=4: 8 prompts per policy and call; 4 per rank = one generation batch and one micro-batch
COMMON = dict(algorithm={"num_generations": 4}, rollout={"batch_size": 2, "max_new_tokens": 8, "temperature": 1.0,
                                                         "generation_batch_size": 4},
              training={"lr": 1e-3, "micro_batch_size": 4})


pytestmark = pytest.mark.usefixtures("restore_threads")  # runs with run.threads=1 change torch's count


def _cfg(tiny_cfg, tmp_path, sub: str, policies: dict, steps: int = 2, **sections) -> dict:
    run = {"run_dir": str(tmp_path / sub), "steps": steps, "threads": 1, **sections.pop("run", {})}
    spec = "separate" if len(policies) > 1 else "shared"
    return tiny_cfg(specialization=spec, run=run, policies=policies, **{**COMMON, **sections})


def _losses(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith("loss/")} for r in records]


def _rollout(records: list[dict]) -> list[dict]:
    """What the rollout decides: rewards, advantages, completion lengths (must match exactly)."""
    return [{k: v for k, v in r.items() if k.startswith(("team/", "agent/", "adv/"))} for r in records]


def _close(a: list[dict], b: list[dict], rel: float = 1e-5) -> None:
    assert [r.keys() for r in a] == [r.keys() for r in b]
    for x, y in zip(a, b):
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=rel, abs=1e-7), k


def _weights_close(a: dict, b: dict, atol: float = 1e-6) -> float:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol
    return worst


def _local_weights(trainer) -> dict:
    return {f"{p}/{k}": v.detach().clone() for p, pol in trainer.policies.items()
            for k, v in pol.model.named_parameters()}


def _run(data: dict, stop_after: int | None = None):
    trainer = Trainer(config_from_dict(data))
    try:
        trainer.train(stop_after=stop_after)
        if trainer.cfg.run.backend == "ray":
            weights = {}
            for p, pol in trainer.policies.items():
                if hasattr(pol, "state_dicts"):  # every rank of a data-parallel policy: identical weights
                    ranks = pol.state_dicts()
                    assert len(ranks) == trainer.cfg.policies[p].replicas
                    assert all(torch.equal(ranks[0][k], r[k]) for r in ranks[1:] for k in ranks[0])
                    weights.update({f"{p}/{k}": v for k, v in ranks[0].items()})
                else:
                    weights.update({f"{p}/{k}": v for k, v in pol.state_dict().items()})
        else:
            weights = _local_weights(trainer)
        return weights, read_metrics(trainer.run_dir)
    finally:
        trainer.close()


# --- pure parts ----------------------------------------------------------------------------------


def test_rank_shares_are_contiguous_and_cover_everything():
    for n in range(0, 11):
        for world in (1, 2, 3, 4):
            shares = [part(n, r, world) for r in range(world)]
            assert [i for s in shares for i in range(n)[s]] == list(range(n))
            assert max(s.stop - s.start for s in shares) - min(s.stop - s.start for s in shares) <= 1


# --- bad input: refused before any model loads --------------------------------------------------


def test_replicas_without_a_launcher_is_an_error_naming_torchrun_and_ray(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = _cfg(tiny_cfg, tmp_path, "r", {"main": {**TINY, "replicas": 2}})
    t = time.perf_counter()
    with pytest.raises(ConfigError, match=r"torchrun --nproc_per_node 2 -m accord.cli train CONFIG.*run.backend=ray"):
        Trainer(config_from_dict(data))
    assert time.perf_counter() - t < 5


@pytest.mark.parametrize("reps,kw,match", [
    (3, dict(world=3, cpu_count=2, cuda_count=0), r"replicas=3 runs 3 CPU ranks, but this machine has 2 CPU core"),
    (2, dict(world=2, cpu_count=16, cuda_count=1), r"one rank per GPU, but this machine has 1 GPU.*'cuda:0'.*lower "
                                                   r"replicas to 1 or less, or set run.device=cpu"),
    (2, dict(world=3, cpu_count=16, cuda_count=0), r"started 3 processes, but no policy has replicas=3"),
    (4, dict(world=2, cpu_count=16, cuda_count=0), r"torchrun started 2 processes; launch with --nproc_per_node 4"),
])
def test_more_replicas_than_devices_or_processes(tiny_cfg, tmp_path, reps, kw, match):
    cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, "r", {"main": {**TINY, "replicas": reps}}))
    with pytest.raises(ConfigError, match=match):
        check_replicas(cfg, ["main"], **kw)


@pytest.mark.parametrize("sections,match", [
    (dict(specialization="lora"), "specialization=lora keeps every adapter on one base"),
])
def test_replicas_with_unsupported_features(tiny_cfg, tmp_path, sections, match):
    data = _cfg(tiny_cfg, tmp_path, "r", {"main": {**TINY, "replicas": 1}})
    for key, value in sections.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ConfigError, match=match):
        Trainer(config_from_dict(data))
    assert not (tmp_path / "r").exists()


def test_replicas_with_vllm_generation(tiny_cfg, tmp_path):
    # the config refuses vllm where the package is missing (here); with it installed this check applies
    cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, "r", {"main": {**TINY, "replicas": 1}}))
    cfg.rollout.generation_backend = "vllm"
    with pytest.raises(ConfigError, match="generation_backend=vllm does not support"):
        check_replicas(cfg, ["main"], world=1)


# --- the local path: replicas 1 is the one-process path ---------------------------------------


def test_one_rank_updates_like_a_plain_policy(tiny_cfg, tmp_path):
    """Same samples, same update: a world-of-one rank (no collectives) equals a plain Policy bit for bit."""
    from accord.policies.model import build_policy

    cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, "r", {"main": {**TINY}}))
    plain = build_policy(cfg, "main", 0, 4)
    rank = DataParallelPolicy("main", cfg.policies["main"], cfg.training, cfg.algorithm, cfg.rollout, 4,
                              seed=cfg.run.seed, rank=0, world=1)
    prompts = [plain.encode_chat([{"role": "user", "content": f"write {c}"}]) for c in "abab"]
    gens = rank.generate(prompts, greedy=False, temperature=1.0)
    from accord.rollout.sample import Sample

    samples = [Sample(agent="a", policy="main", turn=0, group=i % 2, instance=i % 2, prompt_ids=p,
                      completion_ids=g.ids, logprobs=g.logprobs, finish_reason=g.finish_reason,
                      advantage=float(i % 3 - 1)) for i, (p, g) in enumerate(zip(prompts, gens))]
    assert plain.update(samples, 0) == rank.update(samples, 0)
    assert all(torch.equal(a, b) for a, b in zip(plain.model.parameters(), rank.model.parameters()))


# --- Ray: N actors per policy --------------------------------------------------------------------


@pytest.mark.slow
def test_more_ray_ranks_than_cpus_is_an_error_before_any_actor(ray_session, tiny_cfg, tmp_path):
    from accord.distributed.ray_backend import RayBackendError

    data = _cfg(tiny_cfg, tmp_path, "r", {"main": {**TINY, "replicas": 3}}, run={"backend": "ray"})
    t = time.perf_counter()
    with pytest.raises(RayBackendError, match=r"ask for 3 CPUs in all \(main#0: 1, main#1: 1, main#2: 1\), but the Ray "
                                              r"cluster has 2; .*policies.<name>.replicas"):
        Trainer(config_from_dict(data))
    assert time.perf_counter() - t < 5
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_two_ray_ranks_match_one_rank(ray_session, tiny_cfg, tmp_path):
    w1, m1 = _run(_cfg(tiny_cfg, tmp_path, "one", {"main": {**TINY, "replicas": 1}}))
    w2, m2 = _run(_cfg(tiny_cfg, tmp_path, "two", {"main": {**TINY, "replicas": 2, "num_cpus": 1}},
                       run={"backend": "ray"}))
    assert _rollout(m1) == _rollout(m2)  # the same rollouts: per-prompt streams, whichever rank draws
    _close(_losses(m1), _losses(m2))
    _weights_close(w1, w2)
    moved = _local_weights_initial(tiny_cfg, tmp_path)
    assert any(not torch.equal(moved[k], w2[k]) for k in moved)  # the run trained


def _local_weights_initial(tiny_cfg, tmp_path) -> dict:
    from accord.policies.model import build_policy

    cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, "init", {"main": {**TINY}}))
    return {f"main/{k}": v.detach() for k, v in build_policy(cfg, "main", 0, 4).model.named_parameters()}


@pytest.mark.slow
def test_heterogeneous_replicas_on_ray(ray_session, tiny_cfg, tmp_path):
    """Policy e with 2 ranks and policy o with one plain actor in one run, against e with replicas 1 and o
    plain in the trainer's process: o is bit-identical, e within the tolerance."""
    local = {"e": {**TINY, "replicas": 1}, "o": {**TINY}}
    on_ray = {"e": {**TINY, "replicas": 2, "num_cpus": 0.5}, "o": {**TINY, "num_cpus": 0.5}}
    w1, m1 = _run(_cfg(tiny_cfg, tmp_path, "local", local))
    w2, m2 = _run(_cfg(tiny_cfg, tmp_path, "ray", on_ray, run={"backend": "ray"}))
    assert _rollout(m1) == _rollout(m2)
    assert [{k: v for k, v in r.items() if k.startswith("loss/o/")} for r in m1] == \
           [{k: v for k, v in r.items() if k.startswith("loss/o/")} for r in m2]
    _close(_losses(m1), _losses(m2))
    assert all(torch.equal(w1[k], w2[k]) for k in w1 if k.startswith("o/"))
    _weights_close(w1, w2)


@pytest.mark.slow
def test_resume_with_replicas_on_ray_is_exact(ray_session, tiny_cfg, tmp_path):
    """3 steps uninterrupted vs 1 step, checkpoint, resume to 3 (both with 2 ranks): bit for bit."""
    pol = {"main": {**TINY, "replicas": 2, "num_cpus": 1}}
    w_full, m_full = _run(_cfg(tiny_cfg, tmp_path, "full", pol, steps=3, run={"backend": "ray"}))
    data = _cfg(tiny_cfg, tmp_path, "cut", pol, steps=3, run={"backend": "ray", "checkpoint_every": 1})
    _run(data, stop_after=1)
    trainer = Trainer(config_from_dict(data), resume=True)
    try:
        assert trainer.start_step == 1
        trainer.train()
        ranks = trainer.policies["main"].state_dicts()
        assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])  # both ranks loaded the checkpoint
        w_cut = {f"main/{k}": v for k, v in ranks[0].items()}
    finally:
        trainer.close()
    m_cut = read_metrics(tmp_path / "cut")
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/", "perf/"))} for r in rs]  # noqa: E731
    assert strip(m_full) == strip(m_cut)
    assert all(torch.equal(w_full[k], w_cut[k]) for k in w_full)


# --- torchrun: the real CLI ----------------------------------------------------------------------


@pytest.mark.slow
def test_torchrun_cli_two_processes_match_one_rank(tiny_cfg, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    one = _cfg(tiny_cfg, tmp_path, "one", {"main": {**TINY, "replicas": 1}})
    two = _cfg(tiny_cfg, tmp_path, "two", {"main": {**TINY, "replicas": 2}})
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(two))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "-m", "accord.cli", "train",
                           str(tmp_path / "two.yaml")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torchrun process 1: ranks of ['main']" in proc.stderr
    w1, m1 = _run(one)
    m2 = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert _rollout(m1) == _rollout(m2)
    _close(_losses(m1), _losses(m2))
    w2 = {f"main/{k}": v for k, v in load_file(tmp_path / "two" / "checkpoints" / "step_000002" / "policies" / "main"
                                               / "model.safetensors").items()}
    tied = {"main/lm_head.weight": "main/model.embed_tokens.weight"}  # saved once, under either name
    w1 = {k: w1[tied.get(k, k)] for k in w2}
    _weights_close(w1, w2)
    assert not list((tmp_path / "two").glob("*rank*"))  # process 1 wrote nothing of its own


@pytest.mark.slow
@pytest.mark.parametrize("sig, name, to_group", [(signal.SIGINT, "Ctrl-C", True), (signal.SIGTERM, "SIGTERM", False)])
def test_torchrun_ctrl_c_and_sigterm_finish_the_step_on_every_process(tiny_cfg, tmp_path, sig, name, to_group):
    """A terminal's Ctrl-C (SIGINT to the whole process group: torchrun passes it on, so the processes get it twice)
    and a SIGTERM to torchrun alone (passed on once): process 0 finishes its step, checkpoints it and stops process
    1, which serves that step to its end instead of dying at once (process 0's step then failed on a closed
    connection, with a traceback and no checkpoint). Then `--resume` under torchrun goes on from the checkpoint."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    run = tmp_path / "two"
    cfg = _cfg(tiny_cfg, tmp_path, "two", {"main": {**TINY, "replicas": 2}}, steps=60, run={"checkpoint_every": 0})
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "torchrun.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(torchrun), "--nproc_per_node", "2", "-m", "accord.cli", "train",
                                 str(tmp_path / "two.yaml")], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    def steps() -> int:
        return len(read_metrics(run / "metrics.jsonl")) if (run / "metrics.jsonl").exists() else 0

    try:
        deadline = time.monotonic() + 240
        while steps() < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None and steps() >= 3, log.read_text()[-3000:]
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        proc.wait(timeout=120)   # torchrun's own exit reports the signal it got (its traceback, not accord's)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "[rank0]" not in text and "[rank1]" not in text, text[-3000:]   # no traceback of either process
    assert f"torchrun process 1: {name}; process 0 finishes its step and stops this process" in text, text[-3000:]
    done = len(read_metrics(run / "metrics.jsonl"))
    assert f"stopped by {name} after step {done}/60" in text, text[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step_{done:06d}"]
    resumed = subprocess.run([str(torchrun), "--nproc_per_node", "2", "-m", "accord.cli", "train", "--resume",
                              str(run), f"run.steps={done + 1}"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, done + 2))


def test_plan_counts_every_rank(tiny_cfg, tmp_path):
    """`accord plan`: each rank holds a full copy (CPU ranks add up; CUDA ranks get one GPU each) and
    updates on 1/N of the samples."""
    from accord.plan import fit, make_plan

    plans = {}
    for reps in (None, 2):
        cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, f"p{reps}", {"main": {**TINY, "replicas": reps}},
                                    run={"device": "cpu"}))
        plan = make_plan(cfg)
        plans[reps] = (plan["plans"][0], dict((d, need) for d, need, _ in fit(cfg, plan["plans"], {}, plan["resources"])))
    (one, need1), (two, need2) = plans[None], plans[2]
    assert two.replicas == 2 and two.samples == one.samples // 2
    assert need2["cpu"] - need1["cpu"] == pytest.approx(one.static, rel=1e-6)  # a second full copy
    cfg = config_from_dict(_cfg(tiny_cfg, tmp_path, "g", {"main": {**TINY, "replicas": 2, "device": "cuda"}}))
    cfg.run.device = "cuda"
    plan = make_plan(cfg)
    assert {d for d, _, _ in fit(cfg, plan["plans"], {}, plan["resources"])} == {"cuda:0", "cuda:1"}
