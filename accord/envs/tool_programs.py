"""Tool agents' programs (the ``math`` tool agent, the puzzles' tool agent): run in the sandbox, cached.

A tool program reads no input but the files it is given, so what it does depends on its text, those
files and its limits only: results are cached per (program, files, timeout, memory) in one
process-wide LRU, which makes AT-GRPO's branching on clones and repeated candidates cheap and keeps the
answer to a given program the same within a run. Sandbox failures of ours (``sandbox_error``) are not
cached and are named once in a warning. Nothing here raises on what a program does; deciding what its
output is worth is the environment's business, in the trainer's process.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict

from accord.sandbox import ExecResult, Sandbox, SandboxConfig

logger = logging.getLogger(__name__)

__all__ = ["CACHE_SIZE", "cached_runs", "clean_error", "run_program"]

CACHE_SIZE = 4096
_cache: OrderedDict[tuple, ExecResult] = OrderedDict()
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
            return hit
    result = _sandbox(float(timeout_s), int(memory_mb)).run(code, files=files)
    if result.status == "sandbox_error":
        if what not in _warned:
            _warned.add(what)
            logger.warning("%s: the sandbox could not run a program (%s); its output counts as missing. Check "
                           "accord.sandbox.probe_isolation() on this machine.", what,
                           clean_error(result.stderr, result.exception) or "no detail")
        return result
    with _lock:
        _cache[key] = result
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return result


def cached_runs() -> int:
    """How many program results the cache holds."""
    with _lock:
        return len(_cache)


def clean_error(stderr: str, exception: str | None, limit: int = 400) -> str:
    """The last lines of a failed program's traceback (its innermost file line, code line and exception),
    sandbox paths removed, at most ``limit`` characters; the exception's type when stderr is empty."""
    text = re.sub(r'File "[^"]*/([^/"]+\.py)"', r'File "\1"', stderr)
    text = re.sub(r"/[^\s\"']*accord-sbx-[^/\s\"']*/", "", text)
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not re.fullmatch(r"\s*[~^]+\s*", ln)]
    tail = "\n".join(lines[-3:]) or (exception or "")
    return tail[-limit:]
