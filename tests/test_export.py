"""``accord export``: a trained checkpoint as directories that from_pretrained loads, with the same
weights as the checkpoint and the same logits as accord's policy."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from accord.config import ConfigError, config_from_dict, load_config
from accord.export import export_run
from accord.models import load_model_and_tokenizer
from accord.trainer import Trainer, train

CHAT = [{"role": "user", "content": "Name a red thing, then two blue ones."}]


def accord(*args, cwd):
    return subprocess.run([sys.executable, "-m", "accord.cli", *args], check=False, cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def resumed_policies(run_dir):
    """accord's own policies at the run's latest checkpoint."""
    trainer = Trainer(load_config(run_dir / "config.yaml"), resume=True)
    assert trainer.start_step == 2
    return trainer.policies


@pytest.mark.slow
def test_export_full_model_loads_with_from_pretrained(tiny_cfg, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = train(config_from_dict(tiny_cfg(run={"steps": 2})))
    out = tmp_path / "exported"
    proc = accord("export", str(run_dir), "--step", "2", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert sorted(p.name for p in out.iterdir()) == ["main"]

    model = AutoModelForCausalLM.from_pretrained(out / "main").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "main")
    saved = load_file(str(run_dir / "checkpoints" / "step_000002" / "policies" / "main" / "model.safetensors"))
    loaded = model.state_dict()
    assert saved and all(torch.equal(loaded[k], v) for k, v in saved.items())
    fresh, _ = load_model_and_tokenizer("tiny-qwen2", model_kwargs={"hidden_size": 64, "num_layers": 2}, seed=0)
    assert any(not torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())  # trained, not the init

    policy = resumed_policies(run_dir)["main"]
    ids = policy.encode_chat(CHAT)
    assert list(tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)["input_ids"]) == ids
    policy.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=torch.tensor([ids])).logits,
                                   policy.model(input_ids=torch.tensor([ids])).logits, rtol=0, atol=1e-6)

    again = accord("export", str(run_dir), "--out", str(out), cwd=tmp_path)  # never overwrites
    assert again.returncode == 2 and "already exists" in again.stderr
    missing = accord("export", str(run_dir), "--step", "1", cwd=tmp_path)
    assert missing.returncode == 2 and "has no checkpoint of step 1; it has steps [2]" in missing.stderr
    # inside the checkpoints a resumed run deletes as it goes on (run.keep_checkpoints): refused
    inside = run_dir / "checkpoints" / "step_000002" / "mine"
    refused = accord("export", str(run_dir), "--out", str(inside), cwd=tmp_path)
    assert refused.returncode == 2 and "lies in the run's checkpoints/" in refused.stderr, refused.stderr[-2000:]
    assert not inside.exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")  # PEFT asks transformers 5
def test_export_lora_adapters_load_with_peft(tiny_cfg, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    tiny = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
    data = tiny_cfg(run={"steps": 2}, specialization="lora", policies={"pe": dict(tiny), "po": dict(tiny)},
                    agents=[{"name": "e", "policy": "pe"}, {"name": "o", "policy": "po"}],
                    lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    run_dir = train(config_from_dict(data))
    out = export_run(run_dir)
    assert out == run_dir / "export" / "step_000002"
    assert sorted(p.name for p in out.iterdir()) == ["base", "pe", "po"]

    policies = resumed_policies(run_dir)
    ids = torch.tensor([policies["pe"].encode_chat(CHAT)])
    logits = {}
    for name in ("pe", "po"):
        adapter = json.loads((out / name / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str((out / "base").resolve())
        base = AutoModelForCausalLM.from_pretrained(out / "base")
        model = peft.PeftModel.from_pretrained(base, out / name).eval()
        saved = load_file(str(run_dir / "checkpoints" / "step_000002" / "policies" / name / "adapter.safetensors"))
        for key, value in saved.items():  # accord's keys: <module path>.lora_A|lora_B.weight of adapter `name`
            path, kind, param = key.rsplit(".", 2)
            loaded = getattr(getattr(model.get_submodule(path), kind)["default"], param)
            assert torch.equal(loaded, value), key
        policy = policies[name]
        policy.group.activate(name)
        policy.model.eval()
        with torch.no_grad():
            logits[name] = model(input_ids=ids).logits
            torch.testing.assert_close(logits[name], policy.model(input_ids=ids).logits, rtol=0, atol=1e-6)
        auto = peft.AutoPeftModelForCausalLM.from_pretrained(out / name).eval()  # finds OUT/base on its own
        with torch.no_grad():
            torch.testing.assert_close(auto(input_ids=ids).logits, logits[name], rtol=0, atol=1e-6)
    assert not torch.equal(logits["pe"], logits["po"])  # two trained adapters, two different policies


def test_export_needs_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="has no config.yaml"):
        export_run(tmp_path)


@pytest.mark.slow
def test_a_garbage_model_file_loaded_unverified_is_one_line(tiny_cfg, tmp_path):
    """With --allow-unverified (no manifest to catch it), a model file that is not safetensors is a CheckpointError
    naming the file, for export and for eval alike (it was safetensors' own traceback)."""
    from accord.checkpoint import CheckpointError
    from accord.evaluate import run_eval

    run_dir = train(config_from_dict(tiny_cfg(run={"steps": 1, "run_dir": str(tmp_path / "run")})))
    ckpt = run_dir / "checkpoints" / "step_000001"
    (ckpt / "manifest.json").unlink()
    (ckpt / "policies" / "main" / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match=r"model.safetensors of policy 'main' does not load \(SafetensorError"):
        export_run(run_dir, out=tmp_path / "out", allow_unverified=True)
    with pytest.raises(CheckpointError, match=r"policy 'main' cannot be loaded \(SafetensorError"):
        run_eval(run_dir, compare_base=False, allow_unverified=True)
