"""accord plan: its parameter counts are the real models' (full and LoRA), and its sizes follow the config."""

from pathlib import Path

import pytest

from accord.config import config_from_dict
from accord.models import load_model_and_tokenizer
from accord.plan import GIB, format_plan, make_plan, present_devices
from accord.policies.lora import build_lora_policies


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
    # the entropy bonus keeps two more vocabulary-sized tensors per completion token for its gradient
    cfg = config_from_dict(tiny_cfg())
    b, c, vocab = cfg.training.micro_batch_size, cfg.rollout.max_new_tokens, 2048
    assert peak(algorithm={"entropy_coef": 0.01}).activations - base.activations == 2 * b * c * vocab * 4.0
    cfg = config_from_dict(tiny_cfg())
    text = format_plan(cfg, make_plan(cfg), present_devices(gpu_memory_gb=1e-6, gpus=1))
    assert "cpu: needs" in text and "verdict: the run fits" in text
    assert GIB == 2 ** 30


def test_a_gpu_counts_the_context_fragmentation_and_a_colocated_engine(tiny_cfg):
    """What torch's tensors do not show: the CUDA context, the allocator's fragmentation, and (vLLM) the engine's
    share and CUDA graphs; with sleep mode the engine's share is the update's, without it the two add up."""
    from accord.plan import CUDA_CONTEXT_GIB, FRAGMENTATION, VLLM_CUDA_GRAPH_GIB, fit

    cfg = config_from_dict(tiny_cfg(run={"device": "cuda"}))
    plan = make_plan(cfg, prompt_tokens=200)
    pol = plan["plans"][0]
    gpus = present_devices(gpu_memory_gb=1.0, gpus=1)
    (dev, need, have), = fit(cfg, plan["plans"], gpus, plan["resources"])
    assert dev == "cuda:0" and have == GIB
    assert need == pytest.approx(pol.peak * (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB * GIB)

    cfg.rollout.generation_backend = "vllm"   # set after validation: vLLM is not installed here
    cfg.rollout.vllm_gpu_memory_utilization = 0.25
    update = (pol.static + pol.grads + pol.activations) * (1 + FRAGMENTATION) + (CUDA_CONTEXT_GIB +
                                                                                 VLLM_CUDA_GRAPH_GIB) * GIB
    generation = pol.static * (1 + FRAGMENTATION) + (CUDA_CONTEXT_GIB + VLLM_CUDA_GRAPH_GIB) * GIB
    details = {}
    (_, asleep, _), = fit(cfg, plan["plans"], gpus, plan["resources"], details)
    assert asleep == pytest.approx(max(update, generation / 0.75))   # the smallest GPU both phases fit
    assert details["cuda:0"].asleep and details["cuda:0"].engine_share == 0.25
    text = format_plan(cfg, plan, gpus)
    assert "update, engine asleep (rollout.vllm_sleep): learner" in text and "engine 0.25 of the GPU = 0.25" in text
    cfg.rollout.vllm_sleep = "off"
    (_, awake, _), = fit(cfg, plan["plans"], gpus, plan["resources"])
    assert awake == pytest.approx(update / 0.75) and awake > asleep
    cfg.rollout.vllm_kwargs = {"enforce_eager": True}   # no CUDA graphs captured
    (_, eager, _), = fit(cfg, plan["plans"], gpus, plan["resources"])
    assert eager == pytest.approx(awake - VLLM_CUDA_GRAPH_GIB * GIB / 0.75)


def test_lora_on_a_gpu_counts_the_fragmentation_measured_under_lora(tiny_cfg):
    """Under LoRA the plan adds LORA_FRAGMENTATION of the learner's bytes (79 % measured on an H200, against
    2-8 % for full fine-tuning): the same learner with FRAGMENTATION would be planned about 5 GiB short."""
    from accord.plan import CUDA_CONTEXT_GIB, FRAGMENTATION, LORA_FRAGMENTATION, fit, gpu_need

    data = _lora(tiny_cfg)
    data["run"]["device"] = "cuda"
    cfg = config_from_dict(data)
    plan = make_plan(cfg, prompt_tokens=200)
    gpus = present_devices(gpu_memory_gb=1.0, gpus=1)
    (_, need, _), = fit(cfg, plan["plans"], gpus, plan["resources"])
    learner = gpu_need(cfg, plan["plans"], vllm=False).update["learner"]
    assert need == pytest.approx(learner * (1 + LORA_FRAGMENTATION) + CUDA_CONTEXT_GIB * GIB)
    assert LORA_FRAGMENTATION > FRAGMENTATION


def test_ray_actors_sharing_a_gpu_each_count_a_context_and_an_engine(tiny_cfg):
    """Two Ray actors on one GPU (ray.num_gpus_per_policy=0.5), each with a colocated engine: two CUDA contexts,
    two CUDA-graph pools, both engines' shares while generating, and during one policy's update the other's
    engine, which sleeps only for its own policy's update."""
    from accord.plan import CUDA_CONTEXT_GIB, FRAGMENTATION, VLLM_CUDA_GRAPH_GIB, fit

    pol = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
    cfg = config_from_dict(tiny_cfg(run={"device": "cuda", "backend": "ray"}, specialization="separate",
                                    policies={"e": pol, "o": dict(pol)}, task={"name": "relay"},
                                    algorithm={"name": "atgrpo"}, ray={"num_gpus_per_policy": 0.5},
                                    agents=[{"name": "e", "policy": "e"}, {"name": "o", "policy": "o"}]))
    cfg.rollout.generation_backend = "vllm"   # set after validation: vLLM is not installed here
    cfg.rollout.vllm_gpu_memory_utilization = 0.25
    plan = make_plan(cfg, prompt_tokens=200)
    e, o = plan["plans"]
    gpus = present_devices(gpu_memory_gb=1.0, gpus=1)
    details = {}
    (dev, need, _), = fit(cfg, plan["plans"], gpus, plan["resources"], details)
    extra = 2 * (CUDA_CONTEXT_GIB + VLLM_CUDA_GRAPH_GIB) * GIB
    static = e.static + o.static
    update = (static + max(p.grads + p.activations for p in (e, o))) * (1 + FRAGMENTATION) + extra
    generation = static * (1 + FRAGMENTATION) + extra
    assert dev == "cuda:0" and need == pytest.approx(max(update / 0.75, generation / 0.5))
    assert details[dev].engines == 2 and details[dev].engine_share == 0.5
    assert "its engine asleep (rollout.vllm_sleep), the others awake" in format_plan(cfg, plan, gpus)


def test_planning_for_gpus_puts_auto_devices_on_them(capsys):
    """`accord plan --gpus N --gpu-memory-gb G` plans for a machine with GPUs: device auto lands on cuda:0 there,
    whatever this machine has."""
    from accord.cli import main

    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    assert main(["plan", str(tiny), "run.device=auto", "--gpus", "2", "--gpu-memory-gb", "80"]) == 0
    text = capsys.readouterr().out
    assert "device cuda:0" in text and "cuda:0: needs" in text and "verdict: the run fits" in text
    assert main(["plan", str(tiny), "run.device=cpu", "--gpus", "2", "--gpu-memory-gb", "80"]) == 0
    assert "device cpu" in capsys.readouterr().out
    # a verdict of "does not fit" is exit status 1, so that a script can use the plan as a pre-flight check
    assert main(["plan", str(tiny), "run.device=auto", "--gpus", "1", "--gpu-memory-gb", "0.01"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("verdict: the run does not fit the devices present")


def test_a_model_directory_without_a_readable_config_is_one_line(tmp_path):
    """accord plan reads only config.json: a directory without one, one that is not JSON, or one without a
    model_type is a ConfigError naming the file, not transformers' or json's traceback."""
    from accord.config import ConfigError, load_config

    (tmp_path / "empty").mkdir()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "config.json").write_text('{"model_type": "qwen2"\n')
    (tmp_path / "untyped").mkdir()
    (tmp_path / "untyped" / "config.json").write_text('{"hidden_size": 64}')
    for name, problem in (("empty", "has no config.json"), ("cut", "cannot be read as a model config .*Expecting"),
                          ("untyped", "cannot be read as a model config .*'model_type'")):
        cfg = load_config(overrides=[f"policies.main.model={tmp_path / name}", "task.name=letters"])
        with pytest.raises(ConfigError, match=problem + r".*save_pretrained"):
            make_plan(cfg)


def test_plan_refuses_what_train_refuses_and_holds_prompts_to_the_context(tiny_cfg, caplog):
    """A length cap the model's context cannot hold, an unknown sink and a --prompt-tokens past the context are
    refused as train refuses them; a rollout.max_prompt_tokens past the context is warned of and the plan uses
    the longest prompt that fits beside the cap (tiny-qwen2's 1024 positions, 16 new tokens: 1008)."""
    from accord.build import prompt_room
    from accord.config import ConfigError

    small = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2,
                                                      "max_position_embeddings": 8}}
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=16 leaves no room for a prompt in the context of 8"):
        make_plan(config_from_dict(tiny_cfg(policies={"main": small}, rollout={"max_new_tokens": 16})))
    with pytest.raises(ConfigError, match="'tensorbord' is not a registered sink; did you mean 'tensorboard'"):
        make_plan(config_from_dict(tiny_cfg(logging={"report_to": ["tensorbord"]})))
    cfg = config_from_dict(tiny_cfg(rollout={"max_new_tokens": 16}))
    with pytest.raises(ConfigError, match="--prompt-tokens 1009 does not fit .* policy 'main': give at most 1008"):
        make_plan(cfg, prompt_tokens=1009)
    assert make_plan(cfg, prompt_tokens=1008)["prompt"] == 1008
    with caplog.at_level("WARNING", logger="accord.build"):
        assert make_plan(cfg)["prompt"] == cfg.rollout.max_prompt_tokens == 512
    assert "max_prompt_tokens" not in caplog.text
    cfg = config_from_dict(tiny_cfg(rollout={"max_new_tokens": 16, "max_prompt_tokens": 100000}))
    with caplog.at_level("WARNING", logger="accord.build"):
        assert make_plan(cfg)["prompt"] == 1008
    assert "rollout.max_prompt_tokens=100000 does not fit the 1024-token context" in caplog.text
    assert "set rollout.max_prompt_tokens to 1008 or less" in caplog.text
    assert prompt_room(cfg, {"main": None}) == {}   # an unknown context holds anything
    with pytest.raises(ConfigError, match="rollout.batch_size=8 is more than the 4 training instances"):
        make_plan(config_from_dict(tiny_cfg(rollout={"batch_size": 8}, task={"train_size": 4})))


def test_a_vllm_config_planned_without_vllm_is_not_told_its_engine_settings_do_nothing(caplog):
    """Where vLLM is not installed, accord plan builds a vLLM config with the hf backend; the vllm_* keys the real
    run reads are not reported as having no effect."""
    import importlib.util

    from accord.config.ignored import ignored_settings
    from accord.plan import load_plan_config

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the config is built with its own backend")
    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny.yaml"
    cfg = load_plan_config(str(tiny), ["rollout.generation_backend=vllm", "rollout.vllm_gpu_memory_utilization=0.25",
                                       "rollout.vllm_kwargs={max_model_len: 512}"])
    with caplog.at_level("WARNING"):
        make_plan(cfg, cuda=True)
    assert "vllm_" not in caplog.text and not ignored_settings(cfg)
    cfg = load_plan_config(str(tiny), ["rollout.vllm_gpu_memory_utilization=0.25"])   # an hf run: no effect
    assert [line.split(" has")[0] for line in ignored_settings(cfg)] == ["rollout.vllm_gpu_memory_utilization=0.25"]
