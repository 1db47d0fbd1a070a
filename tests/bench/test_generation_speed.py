"""bench/generation_speed.py: the bound's prefill counts a prefix that several prompts share once."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("generation_speed", REPO / "bench" / "generation_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bounds_prefill_counts_each_node_of_the_prompts_trie_once():
    bench = _bench()
    assert bench.prompt_trie_positions([[1, 2, 3], [1, 2, 4, 5], [6], [1, 2, 3]]) == [0, 1, 2, 2, 3, 0]
    config = SimpleNamespace(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, head_dim=4,
                             num_key_value_heads=1, intermediate_size=16, vocab_size=10)
    body = 2 * (8 * (8 + 2 * 4) + 8 * 8 + 3 * 8 * 16)
    rates = {"gemm_gflops": 1.0, "read_gbs": 1.0}
    shared = bench.bound_seconds(config, [[1, 2, 3], [1, 2, 4]] * 2, [1, 1, 1, 1], rates)
    # positions 0, 1, 2 and the second prompt's 2: four tokens' products, attention over 1, 2, 3 and 3 positions
    want = 4 * 2 * body + 4 * 2 * 8 * (1 + 2 + 3 + 3) + 2 * 2 * 10 * 8
    assert abs(shared["prefill_tflop"] * 1e12 - want) < 1e-3


def test_a_second_policys_own_layers_are_read_again_and_only_they_move():
    """``--policies 2``: the bound reads the weights of the layers the second policy holds apart once more per
    decoding step (memory-bound here), and the second policy's noise moves exactly what trainable_layers trains."""
    from accord.models import load_model_and_tokenizer
    from accord.policies.learner import train_last_layers

    bench = _bench()
    config = SimpleNamespace(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, head_dim=4,
                             num_key_value_heads=1, intermediate_size=16, vocab_size=10)
    body = 2 * (8 * (8 + 2 * 4) + 8 * 8 + 3 * 8 * 16)
    rates = {"gemm_gflops": 1e9, "read_gbs": 1.0}   # every step memory-bound
    one, two = (bench.bound_seconds(config, [[1, 2, 3]], [3], rates, own) for own in (0, 1))
    assert abs((two["decode_bound_s"] - one["decode_bound_s"]) - 2 * 4 * body // 2 / 1e9) < 1e-15
    model = load_model_and_tokenizer("tiny-qwen2", model_kwargs={"hidden_size": 64, "num_layers": 3})[0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_last_layers(model, 1)
    moved = bench.second_policy(model, 1)
    assert set(moved) == {n for n, p in model.named_parameters() if p.requires_grad}
    # (a multiplicative noise leaves the tiny model's zero biases at zero)
    assert {n for n, p in model.named_parameters() if not torch.equal(p, before[n])} == {
        n for n in moved if bool(before[n].any())}
