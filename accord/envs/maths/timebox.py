r"""Model answers judged in bounded time: the checks of :mod:`.answer`, run in a helper process with a deadline.

    from accord.envs.maths import timebox

    timebox.check_answer(timebox.extract_answer(reply), "42")   # False, never an exception, at most ~2 s

Two lines of defence keep a hostile answer (``\boxed{1e-999999999}``, a 400-character regular-expression
trap, a tower of powers) from stalling the trainer:

1. :mod:`.answer` bounds its own work: input lengths, number literals (200 characters, exponents within
   +-1000), the size of every exact value (20,000 bits; larger ones continue as floats), the number of
   boxes and answer markers tried, and regular expressions that cannot backtrack exponentially.
2. This module runs every check in a long-lived helper process and waits at most ``timeout_s``
   (default :data:`CHECK_TIMEOUT_S`, 2 s) for its answer. Past the deadline the helper is killed with
   ``SIGKILL`` -- which stops anything, also one big-integer operation inside C that neither a signal
   handler nor a thread could interrupt -- and the check counts as failed: no answer, not equal, not
   correct, with a warning. The next call starts a fresh helper. So no input, whatever the parser's
   remaining weaknesses, costs the trainer more than the deadline plus a restart.

The helper is ``python -I -S`` on this file with :mod:`.answer` loaded by path (standard library only;
it does not import accord, torch or the task's data): it starts in about 50 ms, once per trainer
process (ranks and Ray actors start their own), and answers a check in well under a millisecond of
overhead (a JSON line each way over pipes). It runs no model code -- it only parses text -- and its
memory is capped (``RLIMIT_AS``, 1 GiB), so a blow-up is a ``MemoryError`` there, reported back as a
failed check. It dies with the trainer (``PR_SET_PDEATHSIG`` where Linux offers it, else at the end of
its standard input). A check that raises inside the helper (a bug of ours) also counts as failed and is
logged; model text cannot make these functions raise.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["CHECK_TIMEOUT_S", "AnswerChecker", "AnswerCheckerError", "answers_equal", "check_answer",
           "extract_answer", "tool_answer"]

CHECK_TIMEOUT_S = 2.0           # per check; normal checks take well under 10 ms
_START_TIMEOUT_S = 60.0         # starting the helper (a loaded machine can be slow to start Python)
_MEMORY_BYTES = 1 << 30
_ANSWER_PY = Path(__file__).with_name("answer.py")
_OPS = ("extract_answer", "tool_answer", "check_answer", "answers_equal")
_READY = b"ready\n"


class AnswerCheckerError(RuntimeError):
    """The helper process could not be started at all (a failure of the machine, not of an answer)."""


class AnswerChecker:
    """A helper process that runs the functions of a checker module (by default :mod:`.answer`) with a
    deadline per call; see the module docstring. Thread-safe: one call at a time."""

    def __init__(self, module_path: str | os.PathLike | None = None, timeout_s: float = CHECK_TIMEOUT_S):
        self.module_path = str(module_path or _ANSWER_PY)
        self.timeout_s = float(timeout_s)
        self.timeouts = 0           #: checks stopped at the deadline
        self.failures = 0           #: checks that raised or lost their helper
        self._proc: subprocess.Popen | None = None
        self._owner = 0  # pid of the process that started the helper: a forked child starts its own
        self._lock = threading.Lock()

    # the helper process ---------------------------------------------------------------------------
    def _start(self) -> subprocess.Popen:
        argv = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), self.module_path]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/",
                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, close_fds=True)
        except OSError as exc:
            raise AnswerCheckerError(f"cannot start the answer-checker process ({exc}); check that "
                                     f"{sys.executable} runs") from exc
        line = self._read_line(proc, time.monotonic() + _START_TIMEOUT_S)
        if line != _READY:
            self._kill(proc)
            raise AnswerCheckerError(f"the answer-checker process did not start (said {line!r}); run "
                                     f"`{' '.join(argv)}` by hand to see why")
        return proc

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    @staticmethod
    def _read_line(proc: subprocess.Popen, deadline: float) -> bytes | None:
        """One line from the helper; None at the deadline; what came before the end when it closes its
        output first (no newline at the end then)."""
        fd = proc.stdout.fileno()
        data = bytearray()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not poller.poll(max(1, int(remaining * 1000))):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        return bytes(data)

    def close(self) -> None:
        """Stop the helper (a later call starts a new one)."""
        with self._lock:
            if self._proc is not None and self._owner == os.getpid():
                self._kill(self._proc)
            self._proc = None

    # calls ------------------------------------------------------------------------------------------
    def call(self, op: str, *args: Any, default: Any, timeout_s: float | None = None) -> Any:
        """``op(*args)`` in the helper; ``default`` when it runs past the deadline or fails there."""
        if op not in _OPS:
            raise ValueError(f"unknown check {op!r}; the checker runs {list(_OPS)}")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        request = (json.dumps([op, list(args)]) + "\n").encode()
        with self._lock:
            if self._proc is None or self._owner != os.getpid() or self._proc.poll() is not None:
                self._proc, self._owner = self._start(), os.getpid()
            proc = self._proc
            lost: str | None = None
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                line = self._read_line(proc, time.monotonic() + timeout)
            except OSError as exc:  # BrokenPipeError: the helper is gone
                line, lost = b"", str(exc)
            if line is None or not line.endswith(b"\n"):
                self._kill(proc)
                self._proc = None
                if line is None:
                    self.timeouts += 1
                    logger.warning("math: an answer check (%s) ran past %.3g s and was stopped; it counts as "
                                   "failed (%d so far). Its input starts %r", op, timeout, self.timeouts,
                                   str(args[0])[:80] if args else "")
                else:
                    self.failures += 1
                    logger.warning("math: the answer-checker process stopped during %s (%s); the check counts as "
                                   "failed", op, lost or f"exit status {proc.returncode}")
                return default
        try:
            status, value = json.loads(line)
        except (ValueError, TypeError):
            status, value = "error", f"unreadable reply {line[:200]!r}"
        if status != "ok":
            self.failures += 1
            logger.warning("math: the answer check %s failed in the checker process: %s", op, value)
            return default
        return value


_checker: AnswerChecker | None = None
_checker_lock = threading.Lock()


def _default() -> AnswerChecker:
    global _checker
    with _checker_lock:
        if _checker is None:
            _checker = AnswerChecker()
            atexit.register(_checker.close)
        return _checker


def extract_answer(text: str, *, timeout_s: float | None = None) -> str | None:
    """:func:`.answer.extract_answer` within the deadline (None past it)."""
    if not isinstance(text, str):
        return None
    return _default().call("extract_answer", text, default=None, timeout_s=timeout_s)


def tool_answer(stdout: str, *, timeout_s: float | None = None) -> str | None:
    """:func:`.answer.tool_answer` within the deadline (None past it)."""
    if not isinstance(stdout, str):
        return None
    return _default().call("tool_answer", stdout, default=None, timeout_s=timeout_s)


def check_answer(answer: str | None, reference: str, mode: str = "math", *, timeout_s: float | None = None) -> bool:
    """:func:`.answer.check_answer` within the deadline (False past it)."""
    if not isinstance(answer, str) or not isinstance(reference, str):
        return False
    return _default().call("check_answer", answer, reference, mode, default=False, timeout_s=timeout_s) is True


def answers_equal(a: str | None, b: str | None, *, timeout_s: float | None = None) -> bool:
    """:func:`.answer.answers_equal` within the deadline (False past it)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return _default().call("answers_equal", a, b, default=False, timeout_s=timeout_s) is True


# ---------------------------------------------------------------------------------------------------
# the helper's side: `python -I -S timebox.py <checker module>` (standard library only)
# ---------------------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass  # not Linux: the helper still ends at the end of its standard input


def _serve(module_path: str) -> None:
    import importlib.util
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_BYTES, _MEMORY_BYTES))
    except (ValueError, OSError):
        pass
    _die_with_parent()
    spec = importlib.util.spec_from_file_location("accord_answer_checker", module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the module runs
    spec.loader.exec_module(module)
    functions = {op: getattr(module, op) for op in _OPS}
    out = sys.stdout.buffer
    out.write(_READY)
    out.flush()
    for line in sys.stdin.buffer:
        try:
            op, args = json.loads(line)
            reply = ["ok", functions[op](*args)]
        except (ArithmeticError, ValueError, TypeError, AttributeError, LookupError, RecursionError,
                MemoryError) as exc:  # a failed check is reported to the caller, which logs it
            reply = ["error", f"{type(exc).__name__}: {str(exc)[:300]}"]
        out.write((json.dumps(reply) + "\n").encode())
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
