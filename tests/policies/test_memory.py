"""Memory options: token-budget micro-batches, gradient checkpointing (full and LoRA), peak-memory metrics."""

import mmap
from dataclasses import replace

import pytest
import torch

from accord.config import ConfigError, config_from_dict
from accord.tracking import read_metrics
from accord.policies.learner import enable_gradient_checkpointing, micro_batches
from accord.rollout.sample import Sample
from accord.trainer import Trainer, memory_metrics, reset_peak_memory


def sample(n_prompt, n_completion):
    return Sample("e", "main", 0, 0, 0, [1] * n_prompt, [2] * n_completion, [0.0] * n_completion, "stop")


def test_micro_batches_stay_within_the_token_budget():
    samples = [sample(10, c) for c in (1, 2, 3, 5, 8, 13, 21, 40)]  # sorted by length, as the update orders them
    parts = micro_batches(samples, 8, max_tokens=48)
    assert [s for part in parts for s in part] == samples
    for part in parts:
        padded = len(part) * max(len(s.prompt_ids) + len(s.completion_ids) for s in part)
        assert padded <= 48 or len(part) == 1
    assert [len(p) for p in parts] == [3, 2, 1, 1, 1]  # 50 tokens > 48: the longest runs alone
    assert micro_batches(samples, 3) == [samples[:3], samples[3:6], samples[6:]]
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        config_from_dict({"training": {"micro_batch_tokens": 0}})


LORA = {"specialization": "lora",
        "policies": {n: {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
                     for n in ("pe", "po")},
        "agents": [{"name": "e", "policy": "pe"}, {"name": "o", "policy": "po"}],
        "lora": {"r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]}}


def rollout_samples(tiny_cfg, lora=False, **training):
    """A trainer and one step's samples per policy (advantages set), without any update."""
    data = tiny_cfg(rollout={"batch_size": 2, "max_new_tokens": 12, "temperature": 1.0},
                    algorithm={"num_generations": 4, "kl_coef": 0.1},
                    training={"lr": 1e-2, "micro_batch_size": 3, "max_grad_norm": None, **training})
    if lora:
        data.update(LORA)
    trainer = Trainer(config_from_dict(data))
    got = {}
    for name, pol in trainer.policies.items():
        pol.update = lambda samples, step, name=name: got.setdefault(name, list(samples)) and {}
    trainer.train_step(0)
    for name, pol in trainer.policies.items():
        del pol.update
    return trainer, got


def checkpointing(model) -> bool:
    return model.is_activation_checkpointing if hasattr(model, "is_activation_checkpointing") \
        else model.is_gradient_checkpointing


def update_grads(pol, samples, bf16=False, **training):
    """Gradients (and loss metrics) of one update, with the optimizer step skipped (fp32 unless ``bf16``)."""
    pol.training = replace(pol.training, bf16=bf16, **training)
    pol.bf16 = bf16
    grads = []
    pol.optimizer.step = lambda: grads.append([p.grad.clone() for p in pol.params])
    try:
        metrics = pol.update(samples, 0)
    finally:
        del pol.optimizer.step
    return grads, metrics


def assert_same(a, b):
    (ga, ma), (gb, mb) = a, b
    assert len(ga) == len(gb) == 1
    for x, y in zip(ga[0], gb[0]):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], rel=1e-4, abs=1e-7), k


SKIPPED_STEP = "ignore:Seems like `optimizer.step\\(\\)` has been overridden"


@pytest.mark.filterwarnings(SKIPPED_STEP)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_token_budget_micro_batches_give_the_same_loss_and_gradients(tiny_cfg, lora):
    trainer, samples = rollout_samples(tiny_cfg, lora=lora)
    for name, pol in trainer.policies.items():
        mine = samples[name]
        lengths = sorted(len(s.prompt_ids) + len(s.completion_ids) for s in mine)
        budget = 3 * lengths[len(lengths) // 2]
        assert 1 < len(micro_batches(mine, 3, budget)) < len(mine)
        fixed = update_grads(pol, mine, micro_batch_tokens=None)
        packed = update_grads(pol, mine, micro_batch_tokens=budget)
        assert_same(fixed, packed)


@pytest.mark.filterwarnings(SKIPPED_STEP)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tiny_cfg, lora):
    trainer, samples = rollout_samples(tiny_cfg, lora=lora)
    pol = next(iter(trainer.policies.values()))
    mine = samples[pol.name]
    base = pol.group.base if lora else pol.model
    calls = []
    attn = base.model.layers[0].self_attn
    attn.register_forward_hook(lambda module, args, out: calls.append(torch.is_grad_enabled()))
    shared = update_grads(pol, mine)                    # repeated prompts run once (two forwards per micro-batch)
    pol._can_share_prompts = lambda model: False
    calls.clear()
    plain = update_grads(pol, mine)                     # one full-sequence forward per micro-batch
    forwards = calls.count(True)
    del pol._can_share_prompts
    assert_same(shared, plain)
    enable_gradient_checkpointing(base)
    assert checkpointing(base) and not pol._can_share_prompts(pol.model)   # checkpointing turns the cache off
    calls.clear()
    ckpt = update_grads(pol, mine)
    assert calls.count(True) == 2 * forwards  # recomputed in the backward pass
    assert_same(plain, ckpt)


def test_memory_options_from_the_config(tiny_cfg):
    data = tiny_cfg(run={"steps": 1}, training={"gradient_checkpointing": True, "micro_batch_tokens": 64})
    data.update(LORA)
    trainer = Trainer(config_from_dict(data))
    assert checkpointing(trainer.policies["pe"].group.base)
    trainer.train()
    assert read_metrics(trainer.run_dir)[-1]["loss/pe/grad_norm"] > 0


def test_peak_memory_is_reported_per_step(tiny_cfg):
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1})))
    trainer.train()
    rec = read_metrics(trainer.run_dir)[-1]
    assert rec["mem/peak_rss_mb"] >= rec["mem/rss_mb"] > 10
    # where /proc/self/clear_refs is writable, the high-water mark restarts from the current RSS. The 64 MiB
    # are an anonymous mapping, which munmap returns to the OS (a tensor's memory may stay in malloc's
    # arenas after earlier tests, and then neither raises nor lowers the RSS)
    blob = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(blob), 4096):
        blob[offset] = 1
    before = memory_metrics(False)["mem/peak_rss_mb"]
    blob.close()
    if reset_peak_memory():
        after = memory_metrics(True)
        assert after["mem/peak_rss_mb"] < before - 32 and after["mem/peak_is_per_step"] == 1.0
        assert rec["mem/peak_is_per_step"] == 1.0


@pytest.mark.filterwarnings(SKIPPED_STEP)
def test_bf16_autocast_keeps_fp32_master_weights_and_gradients(tiny_cfg):
    """training.bf16: the forward runs under bf16 autocast, weights, gradients and AdamW state stay fp32,
    and the gradients match fp32 ones to bf16 precision."""
    trainer, samples = rollout_samples(tiny_cfg)
    pol = trainer.policies["main"]
    mine = samples["main"]
    (g32,), _ = update_grads(pol, mine)
    seen = []
    pol.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    (g16,), metrics = update_grads(pol, mine, bf16=True)
    assert torch.bfloat16 in seen                      # the matmuls ran in bf16
    assert all(p.dtype == torch.float32 for p in pol.params)
    assert all(g.dtype == torch.float32 for g in g16)
    flat32, flat16 = torch.cat([g.flatten() for g in g32]), torch.cat([g.flatten() for g in g16])
    cos = torch.nn.functional.cosine_similarity(flat32, flat16, dim=0)
    assert cos > 0.99, f"bf16 gradients diverge from fp32 ones (cosine {cos:.4f})"
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    trainer.train_step(1)                               # a real optimizer step under bf16
    assert all(p.dtype == torch.float32 for p in pol.params)
    assert all(s.dtype == torch.float32 for st in pol.optimizer.state.values() for s in st.values() if s.dim())


def test_bf16_unit_detection_reads_cpu_flags():
    from accord.devices import cpu_bf16_matrix_units, cpu_bf16_units

    amx = "processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    avx512_bf16 = "flags : fpu sse avx2 avx512f avx512_bf16\n"
    arm = "Features : fp asimd bf16 i8mm\n"
    avx2 = "flags : fpu sse avx2 fma\n"
    # bf16 instructions at all (not emulated): what the warning on training.bf16=true reads
    assert [cpu_bf16_units(c) for c in (amx, avx512_bf16, arm, avx2)] == [True, True, True, False]
    # bf16 matrix units (what training.bf16=auto reads): AVX512-BF16 without AMX made updates slower than fp32
    assert [cpu_bf16_matrix_units(c) for c in (amx, avx512_bf16, arm, avx2)] == [True, False, True, False]


def test_bf16_auto_follows_the_cpu_and_config_takes_true_false_auto(monkeypatch):
    import accord.devices as devices
    from accord.config import ConfigError, config_from_dict

    assert config_from_dict({}).training.bf16 == "auto"
    for given, expected in (("auto", "auto"), ("true", True), (False, False), ("no", False)):
        assert config_from_dict({"training": {"bf16": given}}).training.bf16 == expected
    with pytest.raises(ConfigError, match="training.bf16='maybe' must be true, false or auto"):
        config_from_dict({"training": {"bf16": "maybe"}})
    for units, expected in ((True, True), (False, False), (None, False)):
        monkeypatch.setattr(devices, "cpu_bf16_matrix_units", lambda units=units: units)
        assert devices.resolve_bf16("auto") is expected
        assert devices.resolve_bf16(False) is False
    assert devices.resolve_bf16(True) is True        # honoured (with a warning where the units are missing)
