"""bench/generation_speed.py: the bound's prefill counts a prefix that several prompts share once."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

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
