"""The GPU recipes of examples/gpu/: `accord plan` on each (the real models' configs, no weights), and a
two-step run of each on this machine with every model replaced, by key overrides, by a tiny model of the
same architecture and every device forced to the CPU."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accord.config import load_config
from accord.plan import _meta_model, format_plan, make_plan, model_config, present_devices
from accord.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "examples" / "gpu").glob("*.yaml"))
TINY_OF = {"Qwen3ForCausalLM": "tiny-qwen3", "Qwen2ForCausalLM": "tiny-qwen2", "LlamaForCausalLM": "tiny-llama"}
PARAMS = {"Qwen/Qwen3-1.7B": 1.72e9, "Qwen/Qwen2.5-Coder-3B": 3.09e9}  # the model cards' counts


def test_there_is_a_recipe_per_paper_setup():
    assert {p.stem for p in RECIPES} == {"atgrpo_planpath_qwen3_lora", "atgrpo_planpath_qwen3_separate",
                                        "magrpo_humaneval_qwen25coder_vllm", "atgrpo_planpath_qwen3_ray_multinode"}


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_plan_of_each_recipe_fits_two_80gb_gpus(path):
    out = subprocess.run([sys.executable, "-m", "accord.cli", "plan", str(path), "--prompt-tokens", "400",
                          "--gpu-memory-gb", "80", "--gpus", "2"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    counts = re.findall(r"policy \w+: (\S+) \((\w+)\), ([\d.]+) B parameters", out.stdout)
    assert len(counts) == 2, out.stdout
    for model, _, billions in counts:
        assert float(billions) * 1e9 == pytest.approx(PARAMS[model], rel=0.01)
    assert "verdict: the run fits" in out.stdout, out.stdout
    assert "cuda" in out.stdout
    # the same plan without GPUs: the CUDA devices are missing here
    out = subprocess.run([sys.executable, "-m", "accord.cli", "plan", str(path)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    if not torch.cuda.is_available():
        assert "not present here" in out.stdout and "verdict: the run does not fit" in out.stdout, out.stdout


@pytest.mark.slow
def test_vllm_recipe_fits_80gb_gpus_only_with_sleep_mode():
    """The colocated vLLM recipe: with the engine asleep during the update it fits an 80 GB GPU with room to
    spare; with the engine holding its share throughout (and the CUDA context, CUDA graphs and fragmentation
    counted) it does not: the reason sleep mode is on."""
    from accord.plan import GIB, fit, load_plan_config

    cfg = load_plan_config(str(ROOT / "examples" / "gpu" / "magrpo_humaneval_qwen25coder_vllm.yaml"), [])
    plan = make_plan(cfg, prompt_tokens=300)
    gpus = present_devices(gpu_memory_gb=80, gpus=2)
    needs = {}
    for sleep in ("auto", "off"):
        cfg.rollout.vllm_sleep = sleep
        needs[sleep] = [need for dev, need, _ in fit(cfg, plan["plans"], gpus, plan["resources"])]
    assert len(needs["auto"]) == 2 and all(n <= 0.85 * 80 * GIB for n in needs["auto"]), needs
    assert all(n > 80 * GIB for n in needs["off"]), needs


def _tiny_overrides(cfg_path: Path, tmp_path: Path) -> list[str]:
    cfg = load_config(cfg_path, ["rollout.generation_backend=hf"])
    out = [f"run.run_dir={tmp_path / 'run'}", "run.steps=2", "run.checkpoint_every=0", "run.device=cpu", "run.threads=1",
           "rollout.batch_size=1", "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=1024",
           "algorithm.num_generations=2", "task.eval_size=1", "logging.console=false", "logging.tensorboard=false",
           "rollout.generation_backend=hf", "rollout.max_turns=2", "training.micro_batch_size=4"]
    for name, pol in cfg.policies.items():
        arch = type(_meta_model(model_config(pol.model))).__name__
        out += [f"policies.{name}.model={TINY_OF[arch]}", f"policies.{name}.model_kwargs="
                "{hidden_size: 64, num_layers: 2, max_position_embeddings: 4096}"]
        if pol.device is not None:
            out.append(f"policies.{name}.device=cpu")
    if cfg.run.backend == "ray":
        out += ["ray.address=null", "ray.num_gpus_per_policy=0", "ray.num_cpus_per_policy=1"]
    if "vllm" in cfg_path.stem:  # the Ray path is the multi-node recipe's; this one checks the model and task
        out.append("run.backend=local")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_two_steps_with_a_tiny_model_of_the_same_architecture(path, tmp_path):
    real = load_config(path, ["rollout.generation_backend=hf"])
    cfg = load_config(path, _tiny_overrides(path, tmp_path))
    plan = make_plan(cfg, prompt_tokens=64)   # the plan of the tiny run, on this machine
    assert "verdict: the run fits" in format_plan(cfg, plan, present_devices())
    trainer = Trainer(cfg)
    try:
        for name, pol in trainer.policies.items():
            want = type(_meta_model(model_config(real.policies[name].model))).__name__
            model = getattr(pol, "model", None)   # a Ray actor's model stays in its actor
            if model is not None:
                model = model.get_base_model() if hasattr(model, "get_base_model") else model
                assert type(model).__name__ == want
        metrics = trainer.train()
    finally:
        trainer.close()
    assert metrics["perf/samples"] > 0
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values())
