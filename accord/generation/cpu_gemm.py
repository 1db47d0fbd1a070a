"""fp32 matrix products for few rows against a large weight, compiled on this machine (x86-64 with AVX2 and FMA).

A decoding step multiplies a handful of rows (one per sequence still writing) by every weight of the model. At such
row counts the oneDNN kernels that :class:`~accord.generation.fast_decode.Projection` otherwise uses run well below
the rate of the machine's large products on AVX2 CPUs; this kernel is faster there (``bench/README.md``,
*generation_speed.py*, measures both side by side). It is a register-blocked product: the weight laid out once in
panels of 16 output columns, each panel read in order while up to six rows accumulate against it in 12 vector
registers, panels split between torch's OpenMP threads.

Each output is one fused multiply-add chain over the inputs in their order, whatever rows sit beside it and however
many threads run: a row's result does not depend on the batch (rows that finish leave it) nor on the thread count.

The source is compiled once per machine and compiler with the system's C compiler (``CC``, else ``cc``; about a
second) into ``kernels`` of accord's cache (``$ACCORD_CACHE``, default ``~/.cache/accord``) and loaded with
:mod:`ctypes`; it links the OpenMP runtime torch already loaded (GNU ``libgomp.so.1``), so its threads are torch's.
Where any of that is missing (another CPU, no compiler, a torch without GNU OpenMP) :func:`kernel` returns None and
the products stay with oneDNN; a compiler that fails, or a kernel whose self-test fails, is logged as a warning.
``ACCORD_CPU_GEMM=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from accord.models.common import ModelNotFoundError, accord_cache_dir

logger = logging.getLogger(__name__)

PANEL = 16  # output columns a panel holds (two 8-float vectors)
POSTS = {"none": 0, "add": 1, "mul": 2}
FLAGS = ["-O2", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]

SOURCE = r"""
#include <immintrin.h>
#define NR 16

/* One row's 16 sums of the panel starting at column n0, plus bias, then "other" added (post 1) or multiplied
   (post 2) elementwise; columns past n are not written. */
static inline void store_row(float* y, int n0, int n, __m256 c0, __m256 c1, const float* bias, int post,
                             const float* other) {
    if (n - n0 >= NR) {
        if (bias) {
            c0 = _mm256_add_ps(c0, _mm256_loadu_ps(bias + n0));
            c1 = _mm256_add_ps(c1, _mm256_loadu_ps(bias + n0 + 8));
        }
        if (post == 1) {
            c0 = _mm256_add_ps(c0, _mm256_loadu_ps(other + n0));
            c1 = _mm256_add_ps(c1, _mm256_loadu_ps(other + n0 + 8));
        } else if (post == 2) {
            c0 = _mm256_mul_ps(c0, _mm256_loadu_ps(other + n0));
            c1 = _mm256_mul_ps(c1, _mm256_loadu_ps(other + n0 + 8));
        }
        _mm256_storeu_ps(y + n0, c0);
        _mm256_storeu_ps(y + n0 + 8, c1);
        return;
    }
    float t[NR];
    _mm256_storeu_ps(t, c0);
    _mm256_storeu_ps(t + 8, c1);
    for (int j = 0; j < n - n0; j++) {
        float v = t[j];
        if (bias) v += bias[n0 + j];
        if (post == 1) v += other[n0 + j]; else if (post == 2) v *= other[n0 + j];
        y[n0 + j] = v;
    }
}

/* the two accumulators and the input row of row r of a block; one input's step; the row's store */
#define DECL(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps(); \
    const float* x##r = x + (long)(r) * k;
#define FMA(r) a = _mm256_broadcast_ss(x##r + i); \
    c##r##0 = _mm256_fmadd_ps(a, b0, c##r##0); c##r##1 = _mm256_fmadd_ps(a, b1, c##r##1);
#define STORE(r) store_row(y + (long)(r) * n, n0, n, c##r##0, c##r##1, bias, post, \
    other ? other + (long)(r) * n : 0);
#define BLOCK(name, D, F, S) \
static void name(const float* x, int k, const float* b, float* y, int n0, int n, const float* bias, int post, \
                 const float* other) { \
    D __m256 a; \
    for (int i = 0; i < k; i++) { \
        __m256 b0 = _mm256_load_ps(b + (long)i * NR), b1 = _mm256_load_ps(b + (long)i * NR + 8); \
        F \
    } \
    S \
}
BLOCK(rows1, DECL(0), FMA(0), STORE(0))
BLOCK(rows2, DECL(0) DECL(1), FMA(0) FMA(1), STORE(0) STORE(1))
BLOCK(rows3, DECL(0) DECL(1) DECL(2), FMA(0) FMA(1) FMA(2), STORE(0) STORE(1) STORE(2))
BLOCK(rows4, DECL(0) DECL(1) DECL(2) DECL(3), FMA(0) FMA(1) FMA(2) FMA(3), STORE(0) STORE(1) STORE(2) STORE(3))
BLOCK(rows5, DECL(0) DECL(1) DECL(2) DECL(3) DECL(4), FMA(0) FMA(1) FMA(2) FMA(3) FMA(4),
      STORE(0) STORE(1) STORE(2) STORE(3) STORE(4))
BLOCK(rows6, DECL(0) DECL(1) DECL(2) DECL(3) DECL(4) DECL(5), FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5),
      STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5))

typedef void (*block_fn)(const float*, int, const float*, float*, int, int, const float*, int, const float*);
static const block_fn BLOCKS[7] = {0, rows1, rows2, rows3, rows4, rows5, rows6};

/* The weight w (n x k, rows of k), each input i multiplied by columns[i] (unless NULL), as panels
   [ceil(n / 16)][k][16], the last panel's missing columns 0. */
void accord_pack(const float* w, float* packed, int n, int k, const float* columns, int threads) {
    int panels = (n + NR - 1) / NR;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int p = 0; p < panels; p++) {
        float* out = packed + (long)p * k * NR;
        for (int j = 0; j < NR; j++) {
            int row = p * NR + j;
            if (row < n) {
                const float* in = w + (long)row * k;
                if (columns) for (int i = 0; i < k; i++) out[(long)i * NR + j] = in[i] * columns[i];
                else for (int i = 0; i < k; i++) out[(long)i * NR + j] = in[i];
            } else {
                for (int i = 0; i < k; i++) out[(long)i * NR + j] = 0.0f;
            }
        }
    }
}

/* y (m x n) = x (m x k) times the weight (n x k) laid out as panels [n / 16][k][16], plus bias (n or NULL), then
   post 0 (nothing), 1 (+ other, m x n) or 2 (* other); panels split among `threads` OpenMP threads. Rows go in
   chunks of CHUNK, whose inputs stay in the caches while every panel passes (a long prompt's prefill). */
#define CHUNK 96
void accord_gemm(const float* x, int m, int k, const float* packed, int n, const float* bias, float* y, int post,
                 const float* other, int threads) {
    int panels = (n + NR - 1) / NR;
    for (int first = 0; first < m; first += CHUNK) {
        int last = m < first + CHUNK ? m : first + CHUNK;
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int p = 0; p < panels; p++) {
            const float* b = packed + (long)p * k * NR;
            for (int r = first; r < last;) {
                int left = last - r, blocks = (left + 5) / 6, rows = (left + blocks - 1) / blocks;  /* 7: 4 + 3 */
                BLOCKS[rows](x + (long)r * k, k, b, y + (long)r * n, p * NR, n, bias, post,
                             other ? other + (long)r * n : 0);
                r += rows;
            }
        }
    }
}
"""


def _compiler() -> list[str] | None:
    """The C compiler's command: ``CC`` (split as a shell would: ``ccache gcc``), else ``cc`` or ``gcc``."""
    if os.environ.get("CC", "").strip():
        try:
            return shlex.split(os.environ["CC"])
        except ValueError:   # an unclosed quote
            return None
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def _openmp_runtimes() -> set[str]:
    """The OpenMP runtimes mapped into this process (their files)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {line.split()[-1] for line in maps.splitlines()
            if any(name in line for name in ("libgomp", "libiomp", "libomp"))}


def _build(compiler: list[str]) -> Path:
    """The compiled library (compiled now unless an earlier build of this source and compiler is cached)."""
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    digest = hashlib.sha256("\0".join([SOURCE, version, *FLAGS]).encode()).hexdigest()[:16]
    target = accord_cache_dir() / "kernels" / f"accord_gemm_{digest}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, built = Path(tmp) / "accord_gemm.c", Path(tmp) / target.name
        source.write_text(SOURCE)
        subprocess.run([*compiler, *FLAGS, str(source), "-o", str(built)], capture_output=True, text=True,
                       timeout=300, check=True)
        os.replace(built, target)  # atomic: a concurrent build of the same source writes the same file
    return target


class Kernel(NamedTuple):
    """The compiled library's functions (ctypes)."""

    gemm: ctypes._CFuncPtr
    pack: ctypes._CFuncPtr


@functools.lru_cache(maxsize=None)
def kernel() -> Kernel | None:
    """The compiled product and packing (ctypes functions), or None where they do not apply here (logged once, with
    why)."""
    reason = _unavailable()
    if reason is not None:
        logger.debug("accord's CPU kernel not used: %s", reason)
        return None
    compiler = _compiler()
    before = _openmp_runtimes()
    try:
        library = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError, ModelNotFoundError) as err:
        detail = (str(getattr(err, "stderr", None) or err).strip() or type(err).__name__).splitlines()[-1]
        logger.warning("accord's CPU kernel not used (decoding products through oneDNN): building or loading it with "
                       "%s failed (%s)", shlex.join(compiler), detail)
        return None
    if _openmp_runtimes() != before:
        logger.warning("accord's CPU kernel not used (decoding products through oneDNN): it loaded an OpenMP runtime "
                       "of its own (%s) beside torch's (%s)", sorted(_openmp_runtimes() - before), sorted(before))
        return None
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    functions = Kernel(library.accord_gemm, library.accord_pack)
    functions.gemm.argtypes = [pointer, integer, integer, pointer, integer, pointer, pointer, integer, pointer, integer]
    functions.pack.argtypes = [pointer, pointer, integer, integer, pointer, integer]
    functions.gemm.restype = functions.pack.restype = None
    if not _self_test(functions):
        logger.warning("accord's CPU kernel not used (decoding products through oneDNN): it gave wrong products on "
                       "this machine")
        return None
    return functions


def _unavailable() -> str | None:
    setting = os.environ.get("ACCORD_CPU_GEMM", "1")
    if setting == "0":
        return "ACCORD_CPU_GEMM=0"
    if setting != "1":
        logger.warning("ACCORD_CPU_GEMM=%r is neither 0 (off) nor 1 (on, the default): accord's CPU kernel stays on",
                       setting)
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"{platform.system()} {platform.machine()}, not Linux on x86-64"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"CPU capability {capability}, not AVX2 or AVX512"
    if "OpenMP" not in torch.__config__.parallel_info():
        return "torch does not run its threads with OpenMP"
    if not any("libgomp" in path for path in _openmp_runtimes()):
        return "torch's OpenMP runtime is not GNU libgomp"
    if _compiler() is None:
        return "no C compiler (no cc or gcc on PATH, or CC is not a command line)"
    return None


def _self_test(functions: Kernel) -> bool:
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(7, 40, generator=generator), torch.randn(37, 40, generator=generator)
    bias, other = torch.randn(37, generator=generator), torch.randn(7, 37, generator=generator)
    got = linear(x, pack(weight, functions=functions), 37, bias, "mul", other, functions)
    return bool(torch.allclose(got, (F.linear(x, weight, bias)) * other, atol=1e-4, rtol=1e-4))


def pack(weight: torch.Tensor, columns: torch.Tensor | None = None, functions: Kernel | None = None) -> torch.Tensor:
    """``weight`` (n x k), times ``columns`` (k: a factor per input, as ``weight * columns`` computes it), laid out
    as the kernel reads it: panels of 16 output columns, [panels][k][16] (the last panel padded with zeros)."""
    functions = functions or kernel()
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"accord's CPU kernel takes a 2-d float32 weight on the CPU, not {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    weight = weight.detach().contiguous()
    n, k = weight.shape
    if columns is not None:
        columns = columns.detach().to(torch.float32).contiguous()
        if columns.shape != (k,):
            raise ValueError(f"accord's CPU kernel: {tuple(columns.shape)} column factors for a weight of {k} inputs")
    packed = weight.new_empty(-(-n // PANEL), k, PANEL)
    if packed.data_ptr() % 32:  # the kernel's aligned loads
        raise RuntimeError("accord's CPU kernel needs 32-byte aligned weights; torch allocated another alignment")
    args = (weight.data_ptr(), packed.data_ptr(), n, k, None if columns is None else columns.data_ptr(),
            torch.get_num_threads())
    if torch.autograd._profiler_enabled():
        with torch.autograd.profiler.record_function("accord::pack"):
            functions.pack(*args)
    else:
        functions.pack(*args)
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None, post: str = "none",
           other: torch.Tensor | None = None, functions: Kernel | None = None) -> torch.Tensor:
    """``x`` (m x k, fp32) times the packed weight (:func:`pack` of an n x k weight), plus ``bias`` (n, contiguous),
    then ``post``: ``none``, ``add`` / ``mul`` (``other``, m x n) or ``swish`` (SiLU). The shapes and dtypes are the
    caller's to get right (:class:`~accord.generation.fast_decode.Projection`'s): the kernel reads raw memory."""
    functions = functions or kernel()
    if not x.is_contiguous():
        x = x.contiguous()
    if other is not None and not other.is_contiguous():
        other = other.contiguous()
    m, k = x.shape
    y = x.new_empty(m, n)
    if m == 0:
        return y
    args = (x.data_ptr(), m, k, packed.data_ptr(), n, None if bias is None else bias.data_ptr(), y.data_ptr(),
            0 if post == "swish" else POSTS[post], None if other is None else other.data_ptr(), torch.get_num_threads())
    if torch.autograd._profiler_enabled():   # the kernel is no torch operator: a range of its own, named by shape
        with torch.autograd.profiler.record_function(f"accord::gemm [{m}, {k}] -> {n}"):
            functions.gemm(*args)
    else:
        functions.gemm(*args)
    return F.silu(y, inplace=True) if post == "swish" else y
