"""The process's C allocator: keep freed memory for reuse instead of handing it back (``run.retain_freed_memory``).

glibc's malloc serves every block above its mmap threshold (at most 32 MiB) with a fresh memory mapping and
unmaps it when the block is freed. An update allocates and frees several such blocks per micro-batch: the
logits over the vocabulary, their softmax and their gradients (8 completions x 80 tokens x 49,152 entries of
SmolLM2 is a 126 MB fp32 tensor), the tied embedding's gradient. Each fresh mapping is faulted in and zeroed
by the kernel. With :func:`retain_freed_memory`, large blocks come from the heap and freed ones stay there
for the next allocation. ``bench/allocator.py`` measures it (``bench/README.md``, *allocator.py*): on the
2-core AVX2 EPYC the default job's update ran 1.28-1.42x faster, with the same numbers. Raising only the
mmap threshold to its 32 MiB maximum, or trimming the heap after each update, measured no gain; transparent
huge pages for torch's blocks (``THP_MEM_ALLOC_ENABLE=1``) neither.

Serving large blocks from the heap has a cost: a freed block is reused only by a request it can hold, and
torch's 64-byte-aligned requests need a little more than the block they freed, so a program that allocates
one large size again and again, with a small block kept alive after each, can grow the heap by that size each
time (``tests/test_allocator.py`` builds the case with blocks that grow by 1 MiB, where it happens every time).
:func:`bound_retained_memory`, called after every policy update, gives free pages back (glibc's
``malloc_trim``) when the resident size has grown by more than ``GROWTH`` over that of its first few calls (the
run's steady state), so the resident size stays near it. On other C libraries (musl, macOS, Windows) nothing
changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# free bytes at the heap's top above which glibc gives memory back by itself (mallopt takes an int: 2 GiB - 1)
TRIM_THRESHOLD = 2**31 - 1
# growth of the resident size, over the reference, that makes bound_retained_memory trim the heap
GROWTH = 0.25
# calls of bound_retained_memory whose largest resident size is the reference
WARMUP_CALLS = 4

_libc = None
_applied: bool | None = None
_reference_rss: int | None = None
_calls = 0


def retain_freed_memory() -> bool:
    """Serve large blocks from the heap and keep freed memory in this process (glibc only; once per
    process). Returns whether glibc's malloc now works that way."""
    global _applied, _libc
    if _applied is not None:
        return _applied
    _applied = False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        logger.debug("run.retain_freed_memory: not glibc (%s), the allocator is left as it is", platform.libc_ver())
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):  # a glibc without them in the global namespace (static builds)
        logger.debug("run.retain_freed_memory: mallopt or malloc_trim not found, the allocator is left as it is")
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    # mallopt returns 1 on success
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if _applied:
        _libc = libc
    logger.debug("run.retain_freed_memory: glibc malloc keeps freed memory: %s", _applied)
    return _applied


def resident_bytes() -> int:
    """This process's resident size (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bound_retained_memory() -> bool:
    """Where :func:`retain_freed_memory` applies: the largest resident size of the first ``WARMUP_CALLS``
    calls is the reference (a run's steady state: each update's blocks freed and kept for the next); a later
    call that finds the resident size more than ``GROWTH`` above it gives every free page back to the
    operating system (``malloc_trim``), and the reference rises to the resident size after that where the
    live memory itself has grown. Returns whether it trimmed."""
    global _reference_rss, _calls
    if _libc is None:
        return False
    rss = resident_bytes()
    _calls += 1
    if _calls <= WARMUP_CALLS:
        _reference_rss = max(_reference_rss or 0, rss)
        return False
    if rss <= _reference_rss * (1 + GROWTH):
        return False
    _libc.malloc_trim(0)
    after = resident_bytes()
    logger.debug("run.retain_freed_memory: resident size %d MiB, over the reference %d MiB by more than %.0f %%: "
                 "trimmed to %d MiB", rss >> 20, _reference_rss >> 20, GROWTH * 100, after >> 20)
    _reference_rss = max(_reference_rss, after)
    return True
