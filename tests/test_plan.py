"""accord plan: its parameter counts are the real models' (full and LoRA), and its sizes follow the config."""

from accord.config import config_from_dict
from accord.models import load_model_and_tokenizer
from accord.plan import GIB, format_plan, make_plan, present_devices
from accord.policies_lora import build_lora_policies


def _lora(tiny_cfg):
    pol = {"model": "tiny-qwen3", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
    return tiny_cfg(specialization="lora", policies={"e": pol, "o": dict(pol)}, task={"name": "relay"},
                    algorithm={"name": "atgrpo"}, agents=[{"name": "e", "policy": "e"}, {"name": "o", "policy": "o"}])


def test_parameter_counts_are_the_models(tiny_cfg):
    cfg = config_from_dict(tiny_cfg())
    plan = make_plan(cfg)["plans"][0]
    model, _ = load_model_and_tokenizer("tiny-qwen2", model_kwargs={"hidden_size": 64, "num_layers": 2})
    assert plan.params == plan.trainable == sum(p.numel() for p in model.parameters())
    assert plan.weights == 4 * plan.params and plan.optimizer == 8 * plan.params
    cfg = config_from_dict(_lora(tiny_cfg))
    plans = make_plan(cfg)["plans"]
    real = build_lora_policies(cfg, ["e", "o"], 1, seed=0)
    assert [p.trainable for p in plans] == [sum(t.numel() for t in real[n].params) for n in ("e", "o")]
    assert plans[1].weights == 0  # the second adapter shares the base


def test_sizes_follow_the_config(tiny_cfg):
    def peak(**sections):
        cfg = config_from_dict(tiny_cfg(**sections))
        return make_plan(cfg, prompt_tokens=200)["plans"][0]

    base = peak()
    assert peak(training={"micro_batch_size": 16}).activations > base.activations
    # checkpointing keeps one layer's activations but turns prompt sharing off: a gain from about 4 layers on
    deep = {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 8}}}
    assert (peak(policies=deep, training={"gradient_checkpointing": True}).activations
            < peak(policies=deep).activations)
    assert peak(training={"gradient_checkpointing": True}).activations > base.activations  # 2 layers
    assert peak(algorithm={"kl_coef": 0.1}).reference == base.weights
    cfg = config_from_dict(tiny_cfg())
    text = format_plan(cfg, make_plan(cfg), present_devices(gpu_memory_gb=1e-6, gpus=1))
    assert "cpu: needs" in text and "verdict: the run fits" in text
    assert GIB == 2 ** 30
