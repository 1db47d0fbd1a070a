"""accord's compiled CPU product (accord.generation.cpu_gemm): its results against F.linear, rows that do not depend
on the batch or the thread count, and the fall-back to oneDNN where it cannot be built."""

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
    """Each output is one chain of fused multiply-adds in the inputs' order: the same bits for a row alone, beside
    12 others (blocks of 5 and 4 rows) and on one thread or two."""
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
