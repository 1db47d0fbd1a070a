"""The decoding step's kernels, compiled on this machine (x86-64 with AVX2 and FMA): fp32 matrix products for few rows
against a large weight, the decoding attention over a shared prompt, the norm and the rotary embedding.

A decoding step multiplies a handful of rows (one per sequence still writing) by every weight of the model. At such
row counts the oneDNN kernels that :class:`~accord.generation.fast_decode.Projection` otherwise uses run well below
the rate of the machine's large products on AVX2 CPUs; this kernel is faster there (``bench/README.md``,
*generation_speed.py*, measures both side by side). It is a register-blocked product: the weight laid out once in
panels of 16 output columns, each panel read in order (the next 16 KB fetched ahead; at 7-12 rows 32 KB ahead into
the second level of cache and 2 KB ahead from there) while up to six rows accumulate against it in 12 vector registers
(7-24 rows: 32 inputs at a time through each block of rows in turn, so that later blocks find them in the first level
of cache), panels split between torch's OpenMP threads. Each output is one fused
multiply-add chain over the inputs in their order, whatever rows sit beside it and however many threads run: a row's
result does not depend on the batch (rows that finish leave it) nor on the thread count.

Between the products, a decoding layer's other work is a few microseconds of arithmetic spread over dozens of torch
operators, each with its own dispatch: :func:`attend` (one position's attention of every row, each row and key head
alone, the head's group of queries together over each stretch of 32 keys and values: scores, eight keys' sums reduced
at once, a softmax with a vectorised exponential, the weighted sum of values), :func:`rms_norm` and :func:`rotate` (in
place, the same bits as torch's three operators) do theirs in one call each.

The source is compiled once per machine and compiler with the system's C compiler (``CC``, else ``cc``; about a
second) into ``kernels`` of accord's cache (``$ACCORD_CACHE``, default ``~/.cache/accord``) and loaded with
:mod:`ctypes`; it links the OpenMP runtime torch already loaded (GNU ``libgomp.so.1``), so its threads are torch's.
Where any of that is missing (another CPU, no compiler, a torch without GNU OpenMP) :func:`kernel` returns None and
the decoding step runs on oneDNN's products and torch's operators; a compiler that fails, or kernels whose self-test
fails, is logged as a warning. ``ACCORD_CPU_GEMM=0`` turns them off; a value other than 0 or 1 is a
:class:`~accord.config.ConfigError`.
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
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from accord.config import ConfigError
from accord.models.common import ModelNotFoundError, accord_cache_dir

logger = logging.getLogger(__name__)

PANEL = 16  # output columns a panel holds (two 8-float vectors)
POSTS = {"none": 0, "add": 1, "mul": 2}
FLAGS = ["-O2", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]

SOURCE = r"""
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#define NR 16
/* panel floats fetched ahead of the one being read: 16 KB into the first level of cache, so that the next weights
   arrive while these multiply; for two blocks of rows (7-12 rows) 32 KB ahead into the second level and 2 KB ahead
   from there into the first (1.1-1.17x at 7-8 rows on a Zen 3 EPYC, 4 % slower at up to 6 rows, about even at 10-12) */
#define AHEAD (256 * NR)
#define FAR (512 * NR)
#define NEAR (32 * NR)
#define PREFETCH _mm_prefetch((const char*)(b + (long)i * NR + AHEAD), _MM_HINT_T0);
#define PREFETCH_FAR _mm_prefetch((const char*)(b + (long)i * NR + FAR), _MM_HINT_T1); \
    _mm_prefetch((const char*)(b + (long)i * NR + NEAR), _MM_HINT_T0);

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

/* A block's rows accumulate inputs [i0, i1) of a panel: the accumulators come from `acc` (two vectors a row) and go
   back there, unless i1 is the last input, when the row is stored. Each sum is one multiply-add chain in the inputs'
   order however the inputs are split. */
#define DECL(r) __m256 c##r##0 = acc[2 * (r)], c##r##1 = acc[2 * (r) + 1]; const float* x##r = x + (long)(r) * k;
#define FMA(r) a = _mm256_broadcast_ss(x##r + i); \
    c##r##0 = _mm256_fmadd_ps(a, b0, c##r##0); c##r##1 = _mm256_fmadd_ps(a, b1, c##r##1);
#define STORE(r) if (i1 < k) { acc[2 * (r)] = c##r##0; acc[2 * (r) + 1] = c##r##1; } \
    else store_row(y + (long)(r) * n, n0, n, c##r##0, c##r##1, bias, post, other ? other + (long)(r) * n : 0);
#define BLOCK(name, D, F, S, P) \
static void name(const float* x, int k, int i0, int i1, const float* b, float* y, int n0, int n, const float* bias, \
                 int post, const float* other, __m256* acc) { \
    D __m256 a; \
    for (int i = i0; i < i1; i++) { \
        __m256 b0 = _mm256_load_ps(b + (long)i * NR), b1 = _mm256_load_ps(b + (long)i * NR + 8); \
        P \
        F \
    } \
    S \
}
/* blocks of 1 to 6 rows (D, F, S of rows 0 to r - 1), rows3 to rows6 also as far3 to far6 (the far prefetch) */
#define D1 DECL(0)
#define F1 FMA(0)
#define S1 STORE(0)
#define D2 D1 DECL(1)
#define F2 F1 FMA(1)
#define S2 S1 STORE(1)
#define D3 D2 DECL(2)
#define F3 F2 FMA(2)
#define S3 S2 STORE(2)
#define D4 D3 DECL(3)
#define F4 F3 FMA(3)
#define S4 S3 STORE(3)
#define D5 D4 DECL(4)
#define F5 F4 FMA(4)
#define S5 S4 STORE(4)
#define D6 D5 DECL(5)
#define F6 F5 FMA(5)
#define S6 S5 STORE(5)
#define NEAR_BLOCK(r) BLOCK(rows##r, D##r, F##r, S##r, PREFETCH)
#define BOTH_BLOCKS(r) NEAR_BLOCK(r) BLOCK(far##r, D##r, F##r, S##r, PREFETCH_FAR)
NEAR_BLOCK(1)
NEAR_BLOCK(2)
BOTH_BLOCKS(3)
BOTH_BLOCKS(4)
BOTH_BLOCKS(5)
BOTH_BLOCKS(6)

typedef void (*block_fn)(const float*, int, int, int, const float*, float*, int, int, const float*, int, const float*,
                         __m256*);
static const block_fn BLOCKS[7] = {0, rows1, rows2, rows3, rows4, rows5, rows6};
static const block_fn FAR_BLOCKS[7] = {0, 0, 0, far3, far4, far5, far6};  /* two blocks: 3 to 6 rows each */

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
   chunks of CHUNK, whose inputs stay in the caches while every panel passes (a long prompt's prefill). For 7 to 24
   rows (two to four blocks: a decoding step) a panel's inputs go KC at a time through each block in turn, so that
   the blocks after the first read that stretch from the first level of cache while the next is on its way from
   memory (1.1-1.2x at 7-16 rows on a Zen 3 EPYC; no gain at more rows). */
#define CHUNK 96
#define KC 32
void accord_gemm(const float* x, int m, int k, const float* packed, int n, const float* bias, float* y, int post,
                 const float* other, int threads) {
    int panels = (n + NR - 1) / NR;
    for (int first = 0; first < m; first += CHUNK) {
        int last = m < first + CHUNK ? m : first + CHUNK;
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int p = 0; p < panels; p++) {
            const float* b = packed + (long)p * k * NR;
            __m256 acc[2 * CHUNK];
            for (int j = 0; j < 2 * (last - first); j++) acc[j] = _mm256_setzero_ps();
            int i0 = 0, kc = last - first > 6 && last - first <= 24 ? KC : k;
            const block_fn* kernels = last - first > 6 && last - first <= 12 ? FAR_BLOCKS : BLOCKS;
            do {  /* once at least: no inputs still store the bias */
                int i1 = k - i0 < kc ? k : i0 + kc;
                for (int r = first; r < last;) {
                    int left = last - r, blocks = (left + 5) / 6, rows = (left + blocks - 1) / blocks;  /* 7: 4 + 3 */
                    kernels[rows](x + (long)r * k, k, i0, i1, b, y + (long)r * n, p * NR, n, bias, post,
                                 other ? other + (long)r * n : 0, acc + 2 * (r - first));
                    r += rows;
                }
                i0 = i1;
            } while (i0 < k);
        }
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float dot(const float* a, const float* b, int d) {
    int i = 0;
    float s = 0.0f;
    if (d >= 16) {  /* two multiply-add chains */
        __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b));
        __m256 x1 = _mm256_mul_ps(_mm256_loadu_ps(a + 8), _mm256_loadu_ps(b + 8));
        for (i = 16; i + 16 <= d; i += 16) {
            x0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), x0);
            x1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), x1);
        }
        if (i + 8 <= d) {
            x0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), x0);
            i += 8;
        }
        s = hsum(_mm256_add_ps(x0, x1));
    } else if (d >= 8) {
        s = hsum(_mm256_mul_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b)));
        i = 8;
    }
    for (; i < d; i++) s += a[i] * b[i];
    return s;
}

/* dot()'s vector part (its first d / 8 * 8 floats, d >= 8) before the horizontal sum, for the four keys
   k, k + d, k + 2 d, k + 3 d at once (v[0..3]) */
static inline __attribute__((always_inline)) void dot_vectors4(const float* q, const float* k, int d, __m256* v) {
    const float *k1 = k + d, *k2 = k + 2 * d, *k3 = k + 3 * d;
    __m256 qa = _mm256_loadu_ps(q);
    if (d < 16) {
        v[0] = _mm256_mul_ps(qa, _mm256_loadu_ps(k));
        v[1] = _mm256_mul_ps(qa, _mm256_loadu_ps(k1));
        v[2] = _mm256_mul_ps(qa, _mm256_loadu_ps(k2));
        v[3] = _mm256_mul_ps(qa, _mm256_loadu_ps(k3));
        return;
    }
    __m256 qb = _mm256_loadu_ps(q + 8);
    __m256 a0 = _mm256_mul_ps(qa, _mm256_loadu_ps(k)), b0 = _mm256_mul_ps(qb, _mm256_loadu_ps(k + 8));
    __m256 a1 = _mm256_mul_ps(qa, _mm256_loadu_ps(k1)), b1 = _mm256_mul_ps(qb, _mm256_loadu_ps(k1 + 8));
    __m256 a2 = _mm256_mul_ps(qa, _mm256_loadu_ps(k2)), b2 = _mm256_mul_ps(qb, _mm256_loadu_ps(k2 + 8));
    __m256 a3 = _mm256_mul_ps(qa, _mm256_loadu_ps(k3)), b3 = _mm256_mul_ps(qb, _mm256_loadu_ps(k3 + 8));
    int i = 16;
    #pragma GCC unroll 8
    for (; i + 16 <= d; i += 16) {
        qa = _mm256_loadu_ps(q + i);
        qb = _mm256_loadu_ps(q + i + 8);
        a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k + i), a0);
        b0 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k + i + 8), b0);
        a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + i), a1);
        b1 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k1 + i + 8), b1);
        a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + i), a2);
        b2 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k2 + i + 8), b2);
        a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + i), a3);
        b3 = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k3 + i + 8), b3);
    }
    if (i + 8 <= d) {
        qa = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k + i), a0);
        a1 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k1 + i), a1);
        a2 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k2 + i), a2);
        a3 = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k3 + i), a3);
    }
    v[0] = _mm256_add_ps(a0, b0);
    v[1] = _mm256_add_ps(a1, b1);
    v[2] = _mm256_add_ps(a2, b2);
    v[3] = _mm256_add_ps(a3, b3);
}

/* The horizontal sums of v[0..7], each added in hsum()'s order (the halves, then lanes two apart, then the two
   left), as the eight lanes of one vector */
static inline __m256 hsum8(const __m256* v) {
    __m256 s[4], t[2];
    for (int u = 0; u < 4; u++)  /* [v[u]'s halves summed | v[u + 4]'s] */
        s[u] = _mm256_add_ps(_mm256_permute2f128_ps(v[u], v[u + 4], 0x20),
                             _mm256_permute2f128_ps(v[u], v[u + 4], 0x31));
    for (int u = 0; u < 2; u++)  /* per half: lanes 0 + 2 and 1 + 3 of s[u] and s[u + 2], interleaved */
        t[u] = _mm256_add_ps(_mm256_unpacklo_ps(s[u], s[u + 2]), _mm256_unpackhi_ps(s[u], s[u + 2]));
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* r holds v[0], v[2], v[1], v[3] | v[4], v[6], v[5], v[7] */
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 2, 1, 3, 4, 6, 5, 7));
}

/* s[j] = dot(query, keys + j * d, d) for j < n, the same bits: eight keys at a time, their sums reduced together */
static inline __attribute__((always_inline)) void scores_of(const float* query, const float* keys, long n, int d,
                                                            float* s) {
    long j = 0;
    if (d >= 8) {
        int tail = d / 8 * 8;
        for (; j + 8 <= n; j += 8) {
            __m256 v[8];
            dot_vectors4(query, keys + j * d, d, v);
            dot_vectors4(query, keys + (j + 4) * d, d, v + 4);
            _mm256_storeu_ps(s + j, hsum8(v));
            for (int u = 0; u < 8 && tail < d; u++) {
                float x = s[j + u];
                for (int i = tail; i < d; i++) x += query[i] * keys[(j + u) * d + i];
                s[j + u] = x;
            }
        }
    }
    for (; j < n; j++) s[j] = dot(query, keys + j * d, d);
}

static void scores(const float* query, const float* keys, long n, int d, float* s) {
    if (d == 64) scores_of(query, keys, n, 64, s);  /* the common widths with their loops unrolled */
    else if (d == 128) scores_of(query, keys, n, 128, s);
    else scores_of(query, keys, n, d, s);
}

/* o (d floats) += the sum over j < n of p[j] * x_j, x_j = x + j * d: 64 floats at a time in eight registers, the
   rest through memory */
static void weighted_sum(const float* p, const float* x, long n, int d, float* o) {
    int c = 0;
    for (; c + 64 <= d; c += 64) {
        __m256 a0 = _mm256_loadu_ps(o + c), a1 = _mm256_loadu_ps(o + c + 8), a2 = _mm256_loadu_ps(o + c + 16),
               a3 = _mm256_loadu_ps(o + c + 24), a4 = _mm256_loadu_ps(o + c + 32), a5 = _mm256_loadu_ps(o + c + 40),
               a6 = _mm256_loadu_ps(o + c + 48), a7 = _mm256_loadu_ps(o + c + 56);
        for (long j = 0; j < n; j++) {
            const float* row = x + j * d + c;
            __m256 w = _mm256_set1_ps(p[j]);
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 24), a3);
            a4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 32), a4);
            a5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 40), a5);
            a6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 48), a6);
            a7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 56), a7);
        }
        _mm256_storeu_ps(o + c, a0); _mm256_storeu_ps(o + c + 8, a1); _mm256_storeu_ps(o + c + 16, a2);
        _mm256_storeu_ps(o + c + 24, a3); _mm256_storeu_ps(o + c + 32, a4); _mm256_storeu_ps(o + c + 40, a5);
        _mm256_storeu_ps(o + c + 48, a6); _mm256_storeu_ps(o + c + 56, a7);
    }
    for (long j = 0; j < n && c < d; j++) {
        const float* row = x + j * d;
        int i = c;
        __m256 w = _mm256_set1_ps(p[j]);
        for (; i + 8 <= d; i += 8)
            _mm256_storeu_ps(o + i, _mm256_fmadd_ps(w, _mm256_loadu_ps(row + i), _mm256_loadu_ps(o + i)));
        for (; i < d; i++) o[i] += p[j] * row[i];
    }
}

/* e^x for x <= 0 (softmax's shifted scores; below -87.3 it gives e^-87.3 ~ 1e-38): x = n ln 2 + r with |r| <= ln 2 / 2,
   e^r by its degree-7 Taylor-like polynomial (Cephes' expf coefficients), times 2^n built in the exponent bits. */
static inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* The softmax of scores s[0, n) in place (their exponentials, each less the largest, padded with zeros to a multiple
   of 8 past n; s has room for that) and the inverse of their sum */
static float softmax_in_place(float* s, long n) {
    long padded = (n + 7) / 8 * 8;
    for (long j = n; j < padded; j++) s[j] = -INFINITY;
    __m256 top = _mm256_set1_ps(-INFINITY), total = _mm256_setzero_ps();
    for (long j = 0; j < padded; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j));
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    __m256 shift = _mm256_set1_ps(_mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half))));
    for (long j = 0; j < padded; j += 8) {
        __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), shift));
        if (j + 8 > n)  /* the padding's lanes count nothing */
            e = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32((int)(n - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
        _mm256_storeu_ps(s + j, e);
        total = _mm256_add_ps(total, e);
    }
    return 1.0f / hsum(total);
}

/* keys (or values) read KEYS at a time by every query of a group, so that they come from the first level of cache
   for all but the first (8 KB of 64-float heads) */
#define KEYS 32

/* One decoding position's attention for `rows` rows, each over its prompt's keys and values and its own generated
   ones (SharedPrefixCache's layout). Row r's new key and value (k and v, kv heads of d floats at a row stride) are
   first written at position t of its generated keys and values gk, gv (rows x kv x steps x d). Its query heads
   (q: kv x group heads of d floats at a row stride, already scaled) attend to positions [0, prompt_len[p]) of its
   prompt p = row_prompt[r] (pk, pv: prompts x kv x width x d) and [0, t] of its own, one softmax over both;
   out (rows x kv x group x d); scratch: room for `room` scores per query of a group, per thread. Each (row, key
   head) is computed alone, its group's queries side by side over each stretch of keys and values, each score and
   each output float in one order: a row's result depends neither on the rows beside it nor on the thread count. */
void accord_attend(const float* q, long q_stride, const float* k, long k_stride, const float* v, long v_stride,
                   int rows, int kv, int group, int d, const float* pk, const float* pv, int width,
                   const long* row_prompt, const long* prompt_len, float* gk, float* gv, int steps, int t,
                   float* out, float* scratch, long room, int threads) {
    #pragma omp parallel num_threads(threads)
    {
        float* s = scratch + (long)omp_get_thread_num() * room * group;
        #pragma omp for schedule(static)
        for (int task = 0; task < rows * kv; task++) {
            int r = task / kv, h = task % kv;
            long p = row_prompt[r], len = prompt_len[p], n = len + t + 1;
            float* own_k = gk + ((long)r * kv + h) * steps * d;
            float* own_v = gv + ((long)r * kv + h) * steps * d;
            memcpy(own_k + (long)t * d, k + r * k_stride + (long)h * d, d * sizeof(float));
            memcpy(own_v + (long)t * d, v + r * v_stride + (long)h * d, d * sizeof(float));
            const float* keys = pk + (p * kv + h) * width * d;
            const float* values = pv + (p * kv + h) * width * d;
            const float* query = q + r * q_stride + (long)h * group * d;  /* the group's queries, d floats apart */
            float* o = out + ((long)r * kv + h) * group * d;
            for (long j = 0; j < n; j += KEYS) {  /* positions [j, j + KEYS): the prompt's, then the row's own */
                long m = (n - j < KEYS ? n - j : KEYS);
                long a = j >= len ? 0 : len - j < m ? len - j : m;  /* of them in the prompt; the rest the row's */
                for (int g = 0; g < group; g++) {
                    const float* qg = query + (long)g * d;
                    float* sg = s + g * room + j;
                    if (a) scores(qg, keys + j * d, a, d, sg);
                    if (a < m) scores(qg, own_k + (j + a - len) * d, m - a, d, sg + a);
                }
            }
            float inverse[group];
            for (int g = 0; g < group; g++) inverse[g] = softmax_in_place(s + g * room, n);
            memset(o, 0, (long)group * d * sizeof(float));
            for (long j = 0; j < n; j += KEYS) {
                long m = (n - j < KEYS ? n - j : KEYS);
                long a = j >= len ? 0 : len - j < m ? len - j : m;
                for (int g = 0; g < group; g++) {
                    const float* sg = s + g * room + j;
                    float* og = o + (long)g * d;
                    if (a) weighted_sum(sg, values + j * d, a, d, og);
                    if (a < m) weighted_sum(sg + a, own_v + (j + a - len) * d, m - a, d, og);
                }
            }
            for (int g = 0; g < group; g++) {
                float* og = o + (long)g * d;
                __m256 scale = _mm256_set1_ps(inverse[g]);
                int i = 0;
                for (; i + 8 <= d; i += 8) _mm256_storeu_ps(og + i, _mm256_mul_ps(_mm256_loadu_ps(og + i), scale));
                for (; i < d; i++) og[i] *= inverse[g];
            }
        }
    }
}

/* y (m x k) = each row of x divided by the root of its mean square plus eps (RMSNorm without a weight) */
void accord_rms_norm(const float* x, int m, int k, float eps, float* y) {
    for (int r = 0; r < m; r++) {
        const float* row = x + (long)r * k;
        float* out = y + (long)r * k;
        __m256 squares = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= k; i += 8) {
            __m256 a = _mm256_loadu_ps(row + i);
            squares = _mm256_fmadd_ps(a, a, squares);
        }
        float sum = hsum(squares);
        for (; i < k; i++) sum += row[i] * row[i];
        float scale = 1.0f / sqrtf(sum / (float)k + eps);
        __m256 f = _mm256_set1_ps(scale);
        for (i = 0; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), f));
        for (; i < k; i++) out[i] = row[i] * scale;
    }
}

/* The rotary embedding in place: in each of `rows` rows (`stride` floats apart) the first `heads` heads of d floats,
   x -> x * cos + roll(x, d / 2) * sin, with cos and sin (d floats; sin's first half negated) at the row's position
   of the tables (positions x d). Each product and the sum rounded apart, as three tensor operations would. */
void accord_rotate(float* x, long stride, int rows, int heads, int d, const float* cos, const float* sin,
                   const long* positions) {
    int half = d / 2;
    for (int r = 0; r < rows; r++) {
        const float* c = cos + positions[r] * d;
        const float* s = sin + positions[r] * d;
        for (int h = 0; h < heads; h++) {
            float* lo = x + r * stride + (long)h * d;  /* x[i] and its partner x[i + half], both halves at once */
            float* hi = lo + half;
            int i = 0;
            for (; i + 8 <= half; i += 8) {
                __m256 a = _mm256_loadu_ps(lo + i), b = _mm256_loadu_ps(hi + i);
                _mm256_storeu_ps(lo + i, _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)),
                                                       _mm256_mul_ps(b, _mm256_loadu_ps(s + i))));
                _mm256_storeu_ps(hi + i, _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + half + i)),
                                                       _mm256_mul_ps(a, _mm256_loadu_ps(s + half + i))));
            }
            for (; i < half; i++) {
                float a = lo[i], b = hi[i];
                lo[i] = a * c[i] + b * s[i];
                hi[i] = b * c[half + i] + a * s[half + i];
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
    attend: ctypes._CFuncPtr
    rms_norm: ctypes._CFuncPtr
    rotate: ctypes._CFuncPtr


@functools.lru_cache(maxsize=None)
def kernel() -> Kernel | None:
    """The compiled kernels (ctypes functions), or None where they do not apply here (logged once, with
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
    long = ctypes.c_long
    functions = Kernel(library.accord_gemm, library.accord_pack, library.accord_attend, library.accord_rms_norm,
                       library.accord_rotate)
    functions.gemm.argtypes = [pointer, integer, integer, pointer, integer, pointer, pointer, integer, pointer, integer]
    functions.pack.argtypes = [pointer, pointer, integer, integer, pointer, integer]
    functions.attend.argtypes = [pointer, long, pointer, long, pointer, long, integer, integer, integer, integer,
                                 pointer, pointer, integer, pointer, pointer, pointer, pointer, integer, integer,
                                 pointer, pointer, long, integer]
    functions.rms_norm.argtypes = [pointer, integer, integer, ctypes.c_float, pointer]
    functions.rotate.argtypes = [pointer, long, integer, integer, integer, pointer, pointer, pointer]
    for function in functions:
        function.restype = None
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
        raise ConfigError(f"ACCORD_CPU_GEMM={setting!r} is neither 0 nor 1; set ACCORD_CPU_GEMM=0 to decode without "
                          "accord's CPU kernels, or 1 (or unset it) to use them where they apply")
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
    if not torch.allclose(got, (F.linear(x, weight, bias)) * other, atol=1e-4, rtol=1e-4):
        return False
    # attention: 3 rows over 2 prompts (one padded), 2 key heads of 2 queries of 12 floats, the third position
    q, k, v = (torch.randn(3, 2, n, 12, generator=generator) for n in (2, 1, 1))
    prefix_keys, prefix_values = torch.randn(2, 2, 2, 5, 12, generator=generator)
    keys, values = torch.randn(2, 3, 2, 4, 12, generator=generator)
    row_prompt, lengths, t = torch.tensor([0, 1, 1]), torch.tensor([5, 3]), 2
    got = attend(q, k[:, :, 0], v[:, :, 0], prefix_keys, prefix_values, row_prompt, lengths, keys, values, t, functions)
    for r, p in enumerate(row_prompt.tolist()):
        n = int(lengths[p])
        seq_k = torch.cat((prefix_keys[p, :, :n], keys[r, :, :t + 1]), 1)
        seq_v = torch.cat((prefix_values[p, :, :n], values[r, :, :t + 1]), 1)
        if not torch.allclose(got[r], torch.softmax(q[r] @ seq_k.transpose(1, 2), -1) @ seq_v, atol=1e-5):
            return False
    return bool(torch.equal(keys[:, :, t], k[:, :, 0]))


def _run(function: ctypes._CFuncPtr, args: tuple, label: str | Callable[[], str]) -> None:
    """Call a compiled function; under torch's profiler inside a range of its own named ``label`` (a function for a
    name built only then), as the kernels are no torch operators."""
    if torch.autograd._profiler_enabled():
        with torch.autograd.profiler.record_function(label if isinstance(label, str) else label()):
            function(*args)
    else:
        function(*args)


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
    _run(functions.pack, args, "accord::pack")
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
    _run(functions.gemm, args, lambda: f"accord::gemm [{m}, {k}] -> {n}")
    return F.silu(y, inplace=True) if post == "swish" else y


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_keys: torch.Tensor, prefix_values: torch.Tensor,
           row_prompt: torch.Tensor, prompt_lengths: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, t: int,
           functions: Kernel | None = None) -> torch.Tensor:
    """Attention of one new position per row (:class:`~accord.generation.fast_decode.SharedPrefixCache`'s layout):
    the rows' new keys and values ``k``, ``v`` (rows, kv_heads, head_dim) are written at position ``t`` of their
    generated ``keys``, ``values`` (rows, kv_heads, steps, head_dim, contiguous), then the scaled queries ``q``
    (rows, kv_heads, group, head_dim) attend, one softmax each, to the first ``prompt_lengths[p]`` positions of their
    prompt ``p = row_prompt[row]`` in ``prefix_keys``, ``prefix_values`` (prompts, kv_heads, width, head_dim,
    contiguous) and to positions ``[0, t]`` of their own. Returns (rows, kv_heads, group, head_dim). ``row_prompt``
    and ``prompt_lengths`` are int64; every tensor is fp32 on the CPU, each head's ``head_dim`` floats contiguous."""
    functions = functions or kernel()
    rows, kv_heads, group, head_dim = q.shape
    _, _, width, _ = prefix_keys.shape
    if q.stride()[1:] != (group * head_dim, head_dim, 1):
        q = q.contiguous()
    k, v = (x if x.stride()[1:] == (head_dim, 1) else x.contiguous() for x in (k, v))
    out = q.new_empty(rows, kv_heads, group, head_dim)
    if rows == 0:
        return out
    threads = torch.get_num_threads()
    room = -(-(width + t + 1) // 8) * 8
    scratch = q.new_empty(threads, group, room)
    args = (q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), rows, kv_heads, group,
            head_dim, prefix_keys.data_ptr(), prefix_values.data_ptr(), width, row_prompt.data_ptr(),
            prompt_lengths.data_ptr(), keys.data_ptr(), values.data_ptr(), keys.size(2), t, out.data_ptr(),
            scratch.data_ptr(), room, threads)
    _run(functions.attend, args, lambda: f"accord::attend [{rows}, {kv_heads}, {group}] over {width + t + 1}")
    return out


def rms_norm(x: torch.Tensor, eps: float, functions: Kernel | None = None) -> torch.Tensor:
    """Each row of ``x`` (m x k, fp32) divided by the root of its mean square plus ``eps`` (an RMSNorm without a
    weight; ``F.rms_norm``'s result to rounding, the sum of squares in another order)."""
    functions = functions or kernel()
    if not x.is_contiguous():
        x = x.contiguous()
    y = x.new_empty(x.shape)
    if not x.numel():
        return y
    args = (x.data_ptr(), x.size(0), x.size(1), eps, y.data_ptr())
    _run(functions.rms_norm, args, "accord::rms_norm")
    return y


def rotate(x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
           functions: Kernel | None = None) -> None:
    """The rotary embedding, in place, of the first ``heads`` heads of ``head_dim`` floats of each row of ``x``
    (rows x width, fp32, its rows' floats contiguous): ``x * cos + x.roll(head_dim // 2, -1) * sin`` with the tables'
    rows (``cos``, ``sin``: positions x head_dim, contiguous, sin's first half negated) at ``positions`` (int64),
    the same bits as those three tensor operations."""
    functions = functions or kernel()
    if head_dim % 2:
        raise ValueError(f"accord's CPU rotary embedding rotates heads of an even width, not {head_dim}")
    if x.stride(1) != 1 or positions.dtype != torch.long or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError("accord's CPU rotary embedding takes rows of contiguous floats, contiguous tables and int64 "
                         "positions")
    positions = positions.contiguous()
    if not x.size(0):
        return
    args = (x.data_ptr(), x.stride(0), x.size(0), heads, head_dim, cos.data_ptr(), sin.data_ptr(), positions.data_ptr())
    _run(functions.rotate, args, "accord::rotate")
