"""Tool agents' programs (the ``math`` tool agent, the puzzles' tool agent): run in the sandbox, cached.

A tool program reads no input but the files it is given, so what it does depends on its text, those
files and its limits only: results are cached per (program, files, timeout, memory) in one
process-wide LRU of at most :data:`CACHE_SIZE` results and :data:`CACHE_BYTES` of their texts (a program
that fills its output cap with characters Python stores in 4 bytes each made a result half a megabyte:
2 GiB of the trainer's memory at the count limit alone), which makes AT-GRPO's branching on clones and
repeated candidates cheap and keeps the answer to a given program the same within a run. Sandbox
failures of ours (``sandbox_error``) are not cached and are named once in a warning. Nothing here raises
on what a program does; deciding what its output is worth is the environment's business, in the trainer's
process.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections import OrderedDict

from accord.sandbox import ExecResult, Sandbox, SandboxConfig

logger = logging.getLogger(__name__)

__all__ = ["CACHE_BYTES", "CACHE_SIZE", "cached_bytes", "cached_runs", "clean_error", "run_program"]

CACHE_SIZE = 4096
CACHE_BYTES = 64 * 2**20
"""The most memory the cached results' texts (program, files, output, errors) may hold."""
_cache: OrderedDict[tuple, tuple[ExecResult, int]] = OrderedDict()
_bytes = 0
_lock = threading.Lock()
_sandboxes: dict[tuple[float, int], Sandbox] = {}
_warned: set[str] = set()


def _sandbox(timeout_s: float, memory_mb: int) -> Sandbox:
    with _lock:
        box = _sandboxes.get((timeout_s, memory_mb))
        if box is None:
            box = _sandboxes[(timeout_s, memory_mb)] = Sandbox(
                SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb, workers=1))
        return box


def run_program(code: str, *, timeout_s: float, memory_mb: int = 512, files: dict[str, str] | None = None,
                what: str = "tool agent") -> ExecResult:
    """The sandbox's result of ``code`` with ``files`` in its working directory (cached; see the module
    docstring). ``what`` names the caller in the warning about a sandbox failure."""
    key = (code, float(timeout_s), int(memory_mb), tuple(sorted((files or {}).items())))
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit[0]
    result = _sandbox(float(timeout_s), int(memory_mb)).run(code, files=files)
    if result.status == "sandbox_error":
        if what not in _warned:
            _warned.add(what)
            logger.warning("%s: the sandbox could not run a program (%s); its output counts as missing. Check "
                           "accord.sandbox.probe_isolation() on this machine.", what,
                           clean_error(result.stderr, result.exception) or "no detail")
        return result
    size = sum(sys.getsizeof(text) for text in (code, result.stdout, result.stderr, result.exception or "",
                                                  *(x for item in key[3] for x in item)))
    global _bytes
    with _lock:
        if key not in _cache and size <= CACHE_BYTES:
            _cache[key] = (result, size)
            _bytes += size
        while _cache and (len(_cache) > CACHE_SIZE or _bytes > CACHE_BYTES):
            _bytes -= _cache.popitem(last=False)[1][1]
    return result


def cached_runs() -> int:
    """How many program results the cache holds."""
    with _lock:
        return len(_cache)


def cached_bytes() -> int:
    """The memory the cached results' texts hold (``sys.getsizeof`` of each), at most :data:`CACHE_BYTES`."""
    with _lock:
        return _bytes


_QUOTED_FILE = re.compile(r'File "([^"]*)"')  # each scan stops at the next quote: linear in the text
_SPLIT_TOKENS = re.compile(r"""([\s"']+)""")
_SANDBOX_DIR = "accord-sbx-"


def _file_name(m: re.Match) -> str:
    path = m.group(1)
    name = path.rpartition("/")[2]
    return f'File "{name}"' if "/" in path and name.endswith(".py") and len(name) > 3 else m.group(0)


def _strip_sandbox_dir(token: str) -> str:
    """``token`` (no whitespace or quotes) without a path through a sandbox working directory: from its
    first ``/`` to the ``/`` after the last ``accord-sbx-<name>`` that has one; each step is one scan."""
    last_slash = token.rfind("/")
    k = token.rfind(_SANDBOX_DIR, 0, last_slash) if last_slash > 0 else -1
    first_slash = token.find("/")
    if k < 0 or first_slash >= k:
        return token
    return token[:first_slash] + token[token.find("/", k) + 1:]


def clean_error(stderr: str, exception: str | None, limit: int = 400) -> str:
    """The last lines of a failed program's traceback (its innermost file line, code line and exception),
    sandbox paths removed, at most ``limit`` characters; the exception's type when stderr is empty.

    Linear in the length of ``stderr`` whatever it holds (a program chooses its stderr: a regular
    expression that backtracked over a long run of ``/`` once cost the trainer 20-33 s per program)."""
    text = _QUOTED_FILE.sub(_file_name, stderr)
    if _SANDBOX_DIR in text:
        parts = _SPLIT_TOKENS.split(text)
        parts[::2] = [_strip_sandbox_dir(t) if _SANDBOX_DIR in t else t for t in parts[::2]]
        text = "".join(parts)
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not re.fullmatch(r"\s*[~^]+\s*", ln)]
    tail = "\n".join(lines[-3:]) or (exception or "")
    return tail[-limit:]
