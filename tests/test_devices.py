"""Device placement (run.device, policies.<name>.device): resolution and its errors on this machine, the
cross-device checkpoint path, and (marked ``gpu``, run wherever CUDA exists) placement, bf16 autocast,
DecodeStep parity and a two-step AT-GRPO run on a GPU."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accord.config import ConfigError, config_from_dict
from accord.config.rules import check_ray_devices
from accord.devices import actor_device, make_generator, policy_devices, resolve_device, restore_generator
from accord.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def _separate(tiny_cfg, **devices):
    pol = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
    return tiny_cfg(specialization="separate", policies={"e": dict(pol, device=devices.get("e")),
                                                         "o": dict(pol, device=devices.get("o"))},
                    agents=[{"name": "e", "policy": "e"}, {"name": "o", "policy": "o"}])


def test_resolution_without_and_with_gpus():
    assert resolve_device("auto", "run.device", cuda_count=0) == torch.device("cpu")
    assert resolve_device("auto", "run.device", cuda_count=2) == torch.device("cuda:0")
    assert resolve_device("cuda", "run.device", cuda_count=2) == torch.device("cuda:0")
    assert resolve_device("cuda:1", "run.device", cuda_count=2) == torch.device("cuda:1")
    assert resolve_device("cpu", "run.device", cuda_count=2) == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"run.device=cuda, but this machine has no CUDA device .*available: "
                                          r"\['cpu'\]\); set run.device=cpu"):
        resolve_device("cuda", "run.device", cuda_count=0)
    with pytest.raises(ConfigError, match=r"policies.e.device=cuda:2, but this process sees 2 GPU\(s\) \(available: "
                                          r"\['cpu', 'cuda:0', 'cuda:1'\]\)"):
        resolve_device("cuda:2", "policies.e.device", cuda_count=2)


@pytest.mark.parametrize("override,match", [("run.device=gpu", "run.device='gpu' is not a device; use auto"),
                                            ("policies.main.device=cuda:x", "is not a device")])
def test_device_syntax_is_checked_with_the_config(tiny_cfg, override, match):
    from accord.config import apply_override

    data = tiny_cfg()
    apply_override(data, override)
    with pytest.raises(ConfigError, match=match):
        config_from_dict(data)


def test_per_policy_devices_and_lora_on_one_device(tiny_cfg):
    cfg = config_from_dict(_separate(tiny_cfg, e="cuda:1"))
    assert policy_devices(cfg, ["e", "o"], cuda_count=2) == {"e": torch.device("cuda:1"), "o": torch.device("cuda:0")}
    with pytest.raises(ConfigError, match="policies.e.device=cuda:1, but this process sees 1 GPU"):
        policy_devices(cfg, ["e", "o"], cuda_count=1)
    lora = _separate(tiny_cfg, e="cuda:1", o="cuda:0")
    lora["specialization"] = "lora"
    with pytest.raises(ConfigError, match=r"specialization=lora keeps every adapter on one base model, but the "
                                          r"policies resolve to different devices \(e: cuda:1, o: cuda:0\)"):
        policy_devices(config_from_dict(lora), ["e", "o"], cuda_count=2)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_cuda_on_a_machine_without_one_fails_before_any_model_is_loaded(tiny_cfg, tmp_path):
    """The CLI in a subprocess: exit code 2 and a one-line error; the model spec names a directory that does
    not exist, so an error about the model would mean it was loaded first."""
    cmd = [sys.executable, "-m", "accord.cli", "train", f"run.run_dir={tmp_path / 'run'}", "run.device=cuda",
           "task.name=letters", f"policies.main.model={tmp_path / 'no' / 'such' / 'model'}", "logging.console=false"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "run.device=cuda, but this machine has no CUDA device" in out.stderr
    assert "no such directory" not in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_a_policy_device_that_does_not_exist_is_an_error(tiny_cfg):
    with pytest.raises(ConfigError, match=r"policies.o.device=cuda:1, but this machine has no CUDA device"):
        Trainer(config_from_dict(_separate(tiny_cfg, o="cuda:1")))


def test_ray_policies_asking_for_cuda_must_reserve_a_gpu(tiny_cfg):
    cfg = config_from_dict(_separate(tiny_cfg, e="cuda"))
    with pytest.raises(ConfigError, match=r"policies.e.device=cuda, but the Ray actor of policy 'e' reserves no GPU; "
                                          r"set policies.e.num_gpus=1"):
        check_ray_devices(cfg, {"e": (1.0, 0.0), "o": (1.0, 0.0)})
    check_ray_devices(cfg, {"e": (1.0, 1.0), "o": (1.0, 0.0)})
    cfg = config_from_dict(_separate(tiny_cfg, e="cuda:1"))
    with pytest.raises(ConfigError, match="sees only the 1 GPU"):
        check_ray_devices(cfg, {"e": (1.0, 1.0), "o": (1.0, 0.0)})
    assert actor_device("auto", "run.device", []) == torch.device("cpu")


def _vllm(cfg, **rollout):
    """``cfg`` with the vllm backend (set after validation: vLLM is not installed here, and the layout check
    does not need it)."""
    cfg.rollout.generation_backend = "vllm"
    for key, value in rollout.items():
        setattr(cfg.rollout, key, value)
    return cfg


def test_vllm_engines_are_refused_where_vllm_would_misplace_them(tiny_cfg):
    """Checked before any model loads: an engine for a policy on cuda:1 (vLLM's worker in this process takes
    cuda:0), two CUDA engines in one process, sleep mode for a CPU engine; the working layouts pass."""
    cfg = _vllm(config_from_dict(_separate(tiny_cfg, e="cuda:1", o="cpu")))
    with pytest.raises(ConfigError, match=r"policies.e.device=cuda:1, but rollout.generation_backend=vllm starts the "
                                          r"engine of policy 'e' on the first GPU of its process \(cuda:0\); use "
                                          r"run.backend=ray with one GPU per policy"):
        policy_devices(cfg, ["e", "o"], cuda_count=2)
    cfg = _vllm(config_from_dict(_separate(tiny_cfg, e="cuda:0", o="cuda:0")))
    with pytest.raises(ConfigError, match=r"policies \['e', 'o'\] would each start a vLLM engine on a GPU in this "
                                          r"process.*run.backend=ray.*or specialization=lora"):
        policy_devices(cfg, ["e", "o"], cuda_count=2)
    lora = _separate(tiny_cfg, e="cuda:0", o="cuda:0")
    lora["specialization"] = "lora"
    policy_devices(_vllm(config_from_dict(lora)), ["e", "o"], cuda_count=2)       # one engine for both adapters
    policy_devices(_vllm(config_from_dict(_separate(tiny_cfg, e="cuda:0", o="cpu"))), ["e", "o"], cuda_count=2)
    policy_devices(_vllm(config_from_dict(_separate(tiny_cfg, e="cpu", o="cpu"))), ["e", "o"], cuda_count=0)
    with pytest.raises(ConfigError, match=r"rollout.vllm_sleep=2 needs a CUDA engine, but every policy is on the CPU"):
        policy_devices(_vllm(config_from_dict(tiny_cfg()), vllm_sleep=2), ["main"], cuda_count=0)
    policy_devices(_vllm(config_from_dict(tiny_cfg()), vllm_sleep="auto"), ["main"], cuda_count=0)


def test_torchrun_sets_the_cuda_device_before_creating_nccl_groups(tiny_cfg, monkeypatch):
    """torchrun process 1 of 2, a policy with 2 replicas on CUDA: the process's GPU (cuda:<local rank>) is made
    current before its NCCL group is created, and the group is bound to it (device_id). No GPU here: torch.cuda's
    device calls, the group constructor and the rank's build are recorded stand-ins (a real check needs two
    GPUs: tests/e2e/test_gpu.py runs the CLI under torchrun with NCCL)."""
    import accord.distributed.data_parallel as dp

    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: events.append(("set_device", str(torch.device(d)))))

    def new_group(ranks, backend=None, timeout=None, **kw):
        events.append(("new_group", backend, str(kw.get("device_id"))))
        return object()

    monkeypatch.setattr(dp.dist, "new_group", new_group)
    monkeypatch.setattr(dp, "build_rank", lambda *a, **kw: events.append(("build", str(kw["device"]))) or "rank")
    monkeypatch.setenv("LOCAL_RANK", "1")
    pol = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}, "replicas": 2}
    cfg = config_from_dict(tiny_cfg(run={"device": "cuda"}, policies={"main": pol}))
    assert dp._groups(cfg, ["main"], {"main": 2}, 2, 1, rank=1) == {"main": "rank"}
    assert events == [("set_device", "cuda:1"), ("new_group", "nccl", "cuda:1"), ("new_group", "gloo", "None"),
                      ("build", "cuda:1")]


def test_cpu_generator_is_the_one_accord_always_used():
    a, b = make_generator(torch.device("cpu"), 7), torch.Generator().manual_seed(7)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))


def test_a_stream_saved_on_another_device_type_is_reseeded_reproducibly(caplog):
    cuda_state = torch.tensor([7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)  # Philox seed+offset
    draws = []
    for _ in range(2):
        gen = make_generator(torch.device("cpu"), 0)
        with caplog.at_level(logging.WARNING, logger="accord.devices"):
            restore_generator(gen, cuda_state, "cuda", "policy 'main'")
        draws.append(torch.rand(4, generator=gen))
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], torch.rand(4, generator=make_generator(torch.device("cpu"), 0)))
    assert "random stream saved on cuda, resumed on cpu; reseeded" in caplog.text
    # same device type (and checkpoints from before devices were recorded): the exact state
    src = make_generator(torch.device("cpu"), 3)
    torch.rand(3, generator=src)
    dst = make_generator(torch.device("cpu"), 0)
    restore_generator(dst, src.get_state(), None, "policy 'main'")
    assert torch.equal(torch.rand(4, generator=dst), torch.rand(4, generator=src))


# --- on a GPU ------------------------------------------------------------------------------------------


def _weights(policy):
    return {k: v.detach().cpu().clone() for k, v in policy.model.state_dict().items()}


@pytest.mark.gpu
def test_gpu_placement_update_and_checkpoint_round_trip_to_cpu(tiny_cfg, tmp_path):
    """Everything of a policy follows its model onto the GPU; its checkpoint resumes on the CPU and back."""
    cfg = config_from_dict(tiny_cfg(run={"device": "cuda"}, algorithm={"kl_coef": 0.05}))
    trainer = Trainer(cfg)
    pol = trainer.policies["main"]
    assert {p.device.type for p in pol.model.parameters()} == {"cuda"}
    assert {p.device.type for p in pol.ref_model.parameters()} == {"cuda"}
    assert pol.generator.device.type == "cuda"
    metrics = trainer.train()
    assert metrics["mem/main/cuda_peak_mb"] > 0 and metrics["mem/cuda_peak_mb"] > 0
    assert all(s["exp_avg"].device.type == "cuda" for s in pol.optimizer.state.values())
    ckpt = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))[-1]
    for device in ("cpu", "cuda"):
        other = Trainer(config_from_dict(tiny_cfg(run={"device": device, "run_dir": str(tmp_path / device)})))
        other.policies["main"].load(ckpt / "policies" / "main")
        got, want = _weights(other.policies["main"]), _weights(pol)
        assert all(torch.equal(got[k], want[k]) for k in want)
        assert all(s["exp_avg"].device.type == device for s in other.policies["main"].optimizer.state.values())


@pytest.mark.gpu
def test_gpu_bf16_auto_and_autocast_follow_the_device(tiny_cfg):
    from accord.devices import cuda_bf16

    cfg = config_from_dict(tiny_cfg(run={"device": "cuda"}, training={"bf16": "auto"}))
    pol = Trainer(cfg).policies["main"]
    assert pol.bf16 == cuda_bf16(pol.device)
    if pol.bf16:
        with pol.autocast():
            assert torch.is_autocast_enabled("cuda")
            x = torch.ones(4, 4, device=pol.device)
            assert (x @ x).dtype == torch.bfloat16
        assert all(p.dtype == torch.float32 for p in pol.model.parameters())  # fp32 master weights


@pytest.mark.gpu
def test_gpu_decode_step_matches_the_model_forward_and_cpu_tokens():
    """DecodeStep on CUDA gives the forward's logits; greedy generation on the GPU gives the CPU's tokens."""
    from accord.generation import generate
    from accord.generation.fast_decode import DecodeStep
    from accord.models import build_tiny_model

    model, tok = build_tiny_model("qwen2", hidden_size=64, num_layers=2, seed=0)
    prompts = [tok("hello there")["input_ids"], tok("a longer prompt with more words")["input_ids"]]
    cpu = generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    model.cuda()
    assert DecodeStep.build(model, 64) is not None
    gpu = generate(model, tok, prompts, max_new_tokens=8, greedy=True)
    assert [g.ids for g in gpu] == [g.ids for g in cpu]
    for a, b in zip(gpu, cpu):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    sampled = [generate(model, tok, prompts, max_new_tokens=8, temperature=1.0,
                        generator=make_generator(torch.device("cuda:0"), 5)) for _ in range(2)]
    assert [g.ids for g in sampled[0]] == [g.ids for g in sampled[1]]  # reproducible from the seed on the GPU


def _shared_layers_and_top_p_draws(device: torch.device) -> None:
    """Two tiny models that train the last of three blocks decode the two frozen ones together on ``device``:
    each model's own call's tokens, log-probs to rounding (products through F.linear / cuBLAS may round a row
    by the rows beside it); the sampler's draw over top-p's kept tokens gives the whole vocabulary's tokens."""
    from accord.algorithms.losses import process_logits
    from accord.generation import generate
    from accord.generation.fast_decode import shared_trunk
    from accord.generation.hf import DecodeJob, _Sampler, generate_together
    from accord.models import build_tiny_model
    from accord.policies.learner import train_last_layers

    models, tok = [], None
    for i in range(2):
        model, tok = build_tiny_model("qwen2", hidden_size=64, num_layers=3, seed=0)
        train_last_layers(model, 1)
        if i:
            torch.manual_seed(1)
            with torch.no_grad():
                for param in model.parameters():
                    if param.requires_grad:
                        param.add_(0.3 * torch.randn_like(param))
        models.append(model.to(device))
    trunk = shared_trunk(models)
    assert trunk == 2
    prompts = [tok(t)["input_ids"] for t in ("hello there", "a longer prompt with more words", "hello there")]
    settings = dict(max_new_tokens=12, temperature=1.0, top_k=0, top_p=0.9)
    own = [generate(m, tok, prompts, generator=make_generator(device, 3 + i), name=str(i), batch_size=3, **settings)
           for i, m in enumerate(models)]
    together = generate_together([DecodeJob(m, tok, prompts, False, make_generator(device, 3 + i), str(i), settings)
                                  for i, m in enumerate(models)], trunk)
    for mine, theirs in zip(together, own):
        assert [g.ids for g in mine] == [g.ids for g in theirs]
        for a, b in zip(mine, theirs):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    logits = torch.randn(6, 2048, generator=torch.Generator().manual_seed(0)).to(device) * 4
    log_probs = torch.log_softmax(process_logits(logits, 0.8, 0, 0.9), -1)
    cdf = log_probs.exp().double().cumsum(-1)
    for seed in range(10):
        sampler = _Sampler(0.8, 0, 0.9, False, "x", generator=make_generator(device, seed))
        tokens = sampler.draw(logits.clone())
        u = torch.rand((6, 1), dtype=torch.float64, device=device, generator=make_generator(device, seed))
        assert torch.equal(tokens, torch.searchsorted(cdf, u * cdf[:, -1:], right=True))


def test_shared_layers_and_top_p_draws_on_the_cpu():
    _shared_layers_and_top_p_draws(torch.device("cpu"))


@pytest.mark.gpu
def test_gpu_shared_layers_decode_together_and_top_p_draws():
    """The same on CUDA: generate_together's device handling, and the support draw where the running sums are
    a parallel scan (any difference from the whole vocabulary's would be in the last bits of fp64 sums)."""
    _shared_layers_and_top_p_draws(torch.device("cuda:0"))


@pytest.mark.gpu
def test_gpu_two_step_atgrpo_lora_run(tiny_cfg, tmp_path):
    cfg = config_from_dict(tiny_cfg(
        run={"device": "cuda"}, specialization="lora", algorithm={"name": "atgrpo", "num_generations": 2},
        policies={n: {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}} for n in "eo"},
        agents=[{"name": "e", "policy": "e"}, {"name": "o", "policy": "o"}], task={"name": "relay", "eval_size": 0}))
    metrics = Trainer(cfg).train()
    assert metrics["perf/samples"] > 0
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values())


@pytest.mark.gpu
def test_gpu_vllm_colocated_with_the_learner(tiny_cfg):
    """vLLM on the learner's GPU (fp32 engine, asleep during each update): three steps; the engine was woken and
    the weights pushed before each generation after an update, and its weights are then the learner's (read
    from the engine's own tensors); the stored log-probs are the learner's."""
    pytest.importorskip("vllm")
    cfg = config_from_dict(tiny_cfg(
        run={"device": "cuda", "steps": 3}, policies={"main": {"model": "tiny-qwen2", "model_kwargs": {
            "hidden_size": 64, "num_heads": 2, "num_layers": 2}}},
        rollout={"generation_backend": "vllm", "vllm_gpu_memory_utilization": 0.2,
                 "vllm_kwargs": {"dtype": "float32", "enforce_eager": True, "max_model_len": 256}}))
    trainer = Trainer(cfg)
    try:
        metrics = trainer.train()
        pol = trainer.policies["main"]
        engine = pol.backend.engine
        assert engine.sleeps == 3 and engine.asleep  # asleep since the last update
        assert engine.syncs == 2  # before the generations of steps 2 and 3
        pol.generate([pol.encode_chat([{"role": "user", "content": "hi"}])], greedy=True, temperature=0.0)
        assert engine.syncs == 3 and not engine.asleep
        name = "model.embed_tokens.weight"
        vocab = pol.model.config.vocab_size
        pushed = engine.llm.apply_model(lambda m: dict(m.named_parameters())[name][:vocab].detach().cpu().clone())[0]
        assert torch.equal(pushed, pol.model.get_parameter(name).detach().cpu())
    finally:
        trainer.policies["main"].backend.close()   # the next engine of this process needs vLLM's allocator free
        trainer.close()
    assert metrics["perf/samples"] > 0
    assert metrics["loss/main/logp_diff"] < 1e-2
