"""accord's compiled CPU kernels (accord.generation.cpu_gemm): the product against F.linear, the decoding attention
against a softmax over each row's sequence, the norm and the rotary embedding against torch's; rows that do not depend
on the batch or the thread count, and the fall-back to oneDNN where they cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from accord.generation import cpu_gemm, fast_decode

pytestmark = pytest.mark.skipif(cpu_gemm._unavailable() is not None,
                                reason=f"accord's CPU kernel does not apply here: {cpu_gemm._unavailable()}")


def test_where_it_applies_it_builds_and_passes_its_self_test():
    assert cpu_gemm.kernel() is not None
    assert fast_decode.product_kernel() == "accord"


@pytest.mark.parametrize("post", ["none", "add", "mul", "swish"])
def test_products_match_f_linear_at_every_row_count_and_width(post):
    """Every row count of one to four blocks of rows (1-6 a block), rows past a chunk of 96, widths that fill panels
    of 16 and widths that do not, with and without a bias."""
    generator = torch.Generator().manual_seed(0)
    for n, k in ((16, 1), (37, 40), (64, 129), (100, 576)):
        weight = torch.randn(n, k, generator=generator)
        packed = cpu_gemm.pack(weight)
        for bias in (None, torch.randn(n, generator=generator)):
            for m in (*range(1, 14), 16, 17, 24, 97, 200):
                x = torch.randn(m, k, generator=generator)
                other = torch.randn(m, n, generator=generator)
                got = cpu_gemm.linear(x, packed, n, bias, post, None if post in ("none", "swish") else other)
                want = F.linear(x, weight, bias)
                want = {"none": want, "add": want + other, "mul": want * other, "swish": F.silu(want)}[post]
                assert got.shape == (m, n)
                assert torch.allclose(got, want, atol=1e-4, rtol=1e-5), (n, k, m, (got - want).abs().max())


def test_a_row_is_the_same_alone_in_any_batch_and_on_any_number_of_threads():
    """Each output is one chain of fused multiply-adds in the inputs' order: the same bits for a row alone (its 300
    inputs in one pass), beside 12 others (blocks of 5 and 4 rows, the inputs 32 at a time through each block) and on
    one thread or two."""
    generator = torch.Generator().manual_seed(1)
    weight, x = torch.randn(200, 300, generator=generator), torch.randn(13, 300, generator=generator)
    packed = cpu_gemm.pack(weight)
    batch = cpu_gemm.linear(x, packed, 200)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = cpu_gemm.linear(x, packed, 200)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(batch, one_thread)
    for r in range(13):
        assert torch.equal(cpu_gemm.linear(x[r:r + 1], packed, 200), batch[r:r + 1]), r
        assert torch.equal(cpu_gemm.linear(x[r:r + 6], packed, 200)[0], batch[r]), r


def test_a_strided_input_is_read_as_its_values():
    generator = torch.Generator().manual_seed(2)
    weight, wide = torch.randn(48, 32, generator=generator), torch.randn(5, 64, generator=generator)
    x = wide[:, ::2]   # every other column: not contiguous
    assert torch.allclose(cpu_gemm.linear(x, cpu_gemm.pack(weight), 48), F.linear(x, weight), atol=1e-5)


def _probe(env: dict, tmp_path) -> subprocess.CompletedProcess:
    code = ("import logging, sys; logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format='%(message)s')\n"
            "from accord.generation import cpu_gemm, fast_decode\n"
            "print('kernel:', fast_decode.product_kernel())\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ACCORD_CACHE": str(tmp_path), **env})


def test_it_is_built_once_into_the_cache_and_reused(tmp_path):
    first = _probe({}, tmp_path)
    assert "kernel: accord" in first.stdout, first.stdout + first.stderr
    built = list((tmp_path / "kernels").glob("accord_gemm_*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    second = _probe({}, tmp_path)
    assert "kernel: accord" in second.stdout, second.stdout + second.stderr
    assert list((tmp_path / "kernels").glob("accord_gemm_*.so")) == built
    assert built[0].stat().st_mtime_ns == stamp


def test_without_a_working_compiler_or_when_turned_off_the_products_stay_with_onednn(tmp_path):
    fallback = "onednn" if fast_decode.onednn_linear_available() else "None"
    broken = _probe({"CC": "/bin/false"}, tmp_path)
    assert f"kernel: {fallback}" in broken.stdout, broken.stdout + broken.stderr
    assert "building or loading it with /bin/false failed" in broken.stdout
    off = _probe({"ACCORD_CPU_GEMM": "0"}, tmp_path)
    assert f"kernel: {fallback}" in off.stdout and "ACCORD_CPU_GEMM=0" in off.stdout, off.stdout
    assert not list((tmp_path / "kernels").glob("*.so"))


def test_a_setting_other_than_0_or_1_is_refused_in_one_line(tmp_path):
    """``ACCORD_CPU_GEMM=off`` meant off: the kernels stayed on with a warning."""
    refused = _probe({"ACCORD_CPU_GEMM": "off"}, tmp_path)
    assert refused.returncode != 0
    assert ("accord.config.base.ConfigError: ACCORD_CPU_GEMM='off' is neither 0 nor 1; set ACCORD_CPU_GEMM=0 to "
            "decode without accord's CPU kernels") in refused.stderr, refused.stderr
    assert not list((tmp_path / "kernels").glob("*.so"))


def test_no_rows_give_no_rows_and_a_weight_it_cannot_read_is_named():
    packed = cpu_gemm.pack(torch.randn(20, 8))
    assert cpu_gemm.linear(torch.empty(0, 8), packed, 20).shape == (0, 20)
    with pytest.raises(ValueError, match=r"^accord's CPU kernel takes a 2-d float32 weight on the CPU, not "
                                         r"torch.float64 \(20, 8\) on cpu$"):
        cpu_gemm.pack(torch.randn(20, 8, dtype=torch.float64))


def test_column_factors_packed_in_are_the_products_of_the_scaled_weight():
    """Projection folds a preceding RMSNorm's weight into the layout: the same bits as scaling the weight first."""
    generator = torch.Generator().manual_seed(3)
    weight, columns = torch.randn(45, 70, generator=generator), torch.randn(70, generator=generator)
    assert torch.equal(cpu_gemm.pack(weight, columns), cpu_gemm.pack(weight * columns))
    with pytest.raises(ValueError, match=r"^accord's CPU kernel: \(69,\) column factors for a weight of 70 inputs$"):
        cpu_gemm.pack(weight, columns[:69])


def _attention_case(generator, rows_of_prompt: list[int], lengths: list[int], kv_heads: int, group: int,
                    head_dim: int, steps: int):
    prompts, width = len(lengths), max(lengths)
    prefix_keys, prefix_values = torch.randn(2, prompts, kv_heads, width, head_dim, generator=generator)
    for p, n in enumerate(lengths):   # what lies past a prompt's length must not count: poison it
        prefix_keys[p, :, n:] = 1e4
        prefix_values[p, :, n:] = float("nan")
    row_prompt = torch.tensor([p for p, n in enumerate(rows_of_prompt) for _ in range(n)])
    keys, values = torch.randn(2, row_prompt.numel(), kv_heads, steps, head_dim, generator=generator)
    return prefix_keys, prefix_values, row_prompt, keys, values


def _threads(n: int, fn):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("head_dim", [4, 12, 64, 72, 128])
def test_decoding_attention_is_a_softmax_over_each_rows_prompt_and_own_tokens(head_dim):
    """Each row's queries attend to its prompt's first positions (past them poisoned: they must not count) and its own
    generated ones, the new key and value written first; head widths under one vector, with tails, of the kernel's
    64-float blocks and past them; sequences shorter and longer than a stretch of keys; a row's result is the same
    bits alone, in any batch and on one thread or two."""
    generator = torch.Generator().manual_seed(4)
    kv_heads, group, steps = 2, 3, 6
    # (prompts of 30 and 45 positions: the kernel's stretches of 32 keys end inside a row's own keys or straddle
    # the prompt's end)
    lengths = [7, 3, 12, 45, 30]
    prefix_keys, prefix_values, row_prompt, keys, values = _attention_case(
        generator, [2, 0, 3, 1, 1], lengths, kv_heads, group, head_dim, steps)
    lengths_t = torch.tensor(lengths)
    rows = row_prompt.numel()
    for t in range(steps):
        q = torch.randn(rows, kv_heads, group, head_dim, generator=generator) / head_dim ** 0.5
        qkv = torch.randn(rows, 2 * kv_heads * head_dim + 5, generator=generator)   # k and v read at a row stride
        k = qkv[:, :kv_heads * head_dim].view(rows, kv_heads, head_dim)
        v = qkv[:, kv_heads * head_dim:2 * kv_heads * head_dim].view(rows, kv_heads, head_dim)
        got = cpu_gemm.attend(q, k, v, prefix_keys, prefix_values, row_prompt, lengths_t, keys, values, t)
        assert torch.equal(keys[:, :, t], k) and torch.equal(values[:, :, t], v)
        for r, p in enumerate(row_prompt.tolist()):
            n = lengths[p]
            seq_k = torch.cat((prefix_keys[p, :, :n], keys[r, :, :t + 1]), 1).double()
            seq_v = torch.cat((prefix_values[p, :, :n], values[r, :, :t + 1]), 1).double()
            want = torch.softmax(q[r].double() @ seq_k.transpose(1, 2), -1) @ seq_v
            assert torch.allclose(got[r].double(), want, atol=2e-6, rtol=1e-5), (t, r, (got[r] - want).abs().max())
            alone = cpu_gemm.attend(q[r:r + 1], k[r:r + 1], v[r:r + 1], prefix_keys, prefix_values,
                                    row_prompt[r:r + 1], lengths_t, keys[r:r + 1].clone(), values[r:r + 1].clone(), t)
            assert torch.equal(alone[0], got[r]), (t, r)
        one_thread = _threads(1, lambda: cpu_gemm.attend(q, k, v, prefix_keys, prefix_values, row_prompt, lengths_t,
                                                         keys.clone(), values.clone(), t))
        assert torch.equal(one_thread, got), t


def test_decoding_attention_of_far_apart_scores_keeps_the_largest():
    """Scores hundreds apart (one position dominating, others underflowing to nothing) give that position's value,
    not a NaN or a blend."""
    generator = torch.Generator().manual_seed(5)
    prefix_keys, prefix_values, row_prompt, keys, values = _attention_case(generator, [1], [9], 1, 1, 16, 1)
    q = torch.zeros(1, 1, 1, 16)
    q[..., 0] = 100.0
    prefix_keys[0, 0, :, 0] = torch.linspace(-5.0, 3.0, 9)   # scores -500 ... 300
    k = torch.zeros(1, 1, 16)
    k[..., 0] = -8.0                                           # the own token: -800
    v = torch.randn(1, 1, 16, generator=generator)
    got = cpu_gemm.attend(q, k, v, prefix_keys, prefix_values, row_prompt, torch.tensor([9]), keys, values, 0)
    assert torch.allclose(got[0, 0, 0], prefix_values[0, 0, 8], atol=1e-6)


def test_the_norm_is_torchs_rms_norm_to_rounding_and_each_row_its_own():
    generator = torch.Generator().manual_seed(6)
    for k in (1, 7, 8, 64, 576, 1000):
        x = torch.randn(11, k, generator=generator) * 3
        got = cpu_gemm.rms_norm(x, 1e-5)
        assert torch.allclose(got, F.rms_norm(x, (k,), None, 1e-5), atol=1e-6, rtol=1e-5), k
        assert torch.equal(cpu_gemm.rms_norm(x[4:5], 1e-5), got[4:5]), k
    assert torch.allclose(cpu_gemm.rms_norm(torch.zeros(2, 5), 0.25), torch.zeros(2, 5))
    assert torch.equal(cpu_gemm.rms_norm(torch.full((1, 4), 2.0), 0.0), torch.ones(1, 4))


def test_the_rotary_embedding_in_place_is_torchs_three_operations_bit_for_bit():
    """x * cos + roll(x, half) * sin of the first heads of each row, in place in a wider row (the values and
    whatever follows untouched), at each row's own position of the tables."""
    generator = torch.Generator().manual_seed(7)
    for head_dim in (4, 12, 20, 64):   # halves of 2, 6, 8 + 2 and 32 floats
        heads, rows = 5, 6
        cos, sin = torch.randn(2, 40, head_dim, generator=generator)
        positions = torch.tensor([0, 39, 3, 3, 17, 8])
        x = torch.randn(rows, heads * head_dim + 9, generator=generator)
        heads_part = x[:, :(heads - 1) * head_dim].view(rows, heads - 1, head_dim)
        want = heads_part * cos[positions][:, None] + heads_part.roll(head_dim // 2, -1) * sin[positions][:, None]
        rest = x[:, (heads - 1) * head_dim:].clone()
        cpu_gemm.rotate(x, heads - 1, head_dim, cos, sin, positions)
        assert torch.equal(x[:, :(heads - 1) * head_dim].view(rows, heads - 1, head_dim), want), head_dim
        assert torch.equal(x[:, (heads - 1) * head_dim:], rest), head_dim


def test_a_rotary_embedding_of_an_odd_head_width_is_refused_in_one_line():
    x, table = torch.zeros(1, 6), torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"^accord's CPU rotary embedding rotates heads of an even width, not 3$"):
        cpu_gemm.rotate(x, 2, 3, table, table, torch.tensor([1]))
    assert torch.equal(x, torch.zeros(1, 6))
