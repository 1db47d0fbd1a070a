"""Run untrusted, model-written Python in a contained subprocess -- never inside the trainer.

    from accord.sandbox import Sandbox, SandboxConfig

    box = Sandbox(SandboxConfig(timeout_s=5, memory_mb=512))
    box.run("print(input()[::-1])", stdin="abc\\n")          # ExecResult(status='ok', stdout='cba\\n', ...)
    box.run_many(["print(1)", ("print(input())", "x\\n")])   # one result per job, in input order
    passed, total, result = box.run_tests(program, "assert f(1) == 2\\nassert f(2) == 3")

Every call starts a fresh process and returns an :class:`ExecResult`; nothing the code does -- loops,
fork bombs, memory bombs, floods of output, ``os.kill`` of its parent, writes, deletes, sockets --
can raise in, block, or kill the calling process. Calls are thread-safe; :meth:`Sandbox.run_many`
runs a step's candidates concurrently on ``workers`` threads, each driving one subprocess.

How one run is contained
------------------------
- **Process**: ``unshare <namespaces> -- sys.executable -I -S -c <runner> job accord-sandbox:<pid>``
  in a new session (``start_new_session``), in a fresh ``mkdtemp`` working directory (removed afterwards)
  holding ``solution.py`` and the caller's ``files``. The environment is built from scratch
  (``PATH``, ``LANG``/``LC_ALL``, ``HOME``/``TMPDIR`` = the working directory, ``PYTHONHASHSEED``,
  ``PYTHONDONTWRITEBYTECODE``, ``PYTHONIOENCODING``, ``USER``); nothing of ``os.environ`` reaches
  the child. ``-I`` also makes the interpreter ignore ``PYTHON*`` variables, the user site and the
  working directory on ``sys.path``. ``-S`` (the default, ``site_packages=False``) leaves the code
  the standard library only -- not the trainer's torch, transformers or accord -- and starts ~3x
  faster here (an editable install's import hook alone costs ~20 ms per start); set
  ``site_packages=True`` for code that needs third-party packages.
- **Runner** (our code, in the child): reads and deletes its job file (``0600``, owned by the
  parent), privatises ``/tmp`` & co. (below), then forks the *worker*, waits for it (reaping
  orphans: it is pid 1 of the pid namespace) and reports its exit status. The worker sets the
  resource limits, raises its ``oom_score_adj`` to 1000 (the kernel's OOM killer takes sandboxed
  code before the trainer), drops to the sandbox uid, sets ``PR_SET_NO_NEW_PRIVS`` and
  ``PR_SET_PDEATHSIG``, compiles the code (a ``SyntaxError`` is reported before anything of it runs)
  and ``exec``-s it as ``__main__``.
- **Limits** (``setrlimit`` in the worker, inherited by everything it starts): ``RLIMIT_CPU``
  (``cpu_s``; ``SIGXCPU`` at the soft limit, ``SIGKILL`` one second later), ``RLIMIT_AS``
  (``memory_mb``; allocations beyond it raise ``MemoryError``), ``RLIMIT_FSIZE`` (``file_size_mb``),
  ``RLIMIT_NPROC`` (``max_procs``), ``RLIMIT_NOFILE`` (``max_open_files``), ``RLIMIT_CORE`` = 0.
- **Wall clock and output**: the parent reads stdout, stderr and the report pipe incrementally
  (``poll``, 64 KiB reads); past ``timeout_s``, or once stdout or stderr exceeds
  ``max_output_bytes``, it kills the whole tree at once: the children of ``unshare`` (the pid
  namespace's init: its death makes the kernel kill every process in the namespace), ``os.killpg``
  of the session's process group, and -- without a pid namespace -- every process of the sandbox
  uid, swept from ``/proc`` until none is left. The same cleanup runs after every normal exit, so
  daemons the code leaves behind (double fork + ``setsid``) die with the run.
- **Per-run uid** (when the trainer runs as root): every concurrent run gets its own uid from a
  per-process block of 256 (``uid_base``, default ``1_000_000_000 + (pid % 100_000) * 256``;
  no passwd entry needed; groups cleared, gid = uid). ``RLIMIT_NPROC`` is counted per uid, so
  concurrent runs do not share the process budget, and the sweep can never hit an unrelated process.
- **Mounts** (in the private mount namespace): fresh size-limited tmpfs on ``/tmp``, ``/var/tmp``,
  ``/dev/shm`` and ``/run/lock`` (the directories anybody can write), and on every directory the
  sandbox uid cannot traverse but the interpreter lives under (here ``/root``, which holds the
  pyenv Python: covering it also hides the rest of ``/root``); the working directory and the
  interpreter's directories (``sys.prefix``, ``sys.base_prefix``, ``sys.path``) are bind-mounted
  back at their own paths, so paths in tracebacks and ``__file__`` stay what the parent sees.

Measured on this box (Linux 6.18 container, 2 CPUs, Python 3.11, util-linux 2.38)
--------------------------------------------------------------------------------
- The trainer runs as **root** (uid 0, every capability but ``CAP_SYS_RESOURCE``), so
  ``RLIMIT_NPROC`` alone would not be enforced. Everything below works and is used (``Sandbox(...)
  .isolation`` reports what a run gets; :func:`probe_isolation` measures it once per process by
  running a probe program through each candidate setup, best first):
  ``unshare --net --pid --fork --kill-child --mount-proc`` (user namespaces via ``unshare -r`` work
  too but are not needed as root), ``setuid`` to the per-run uid, ``mount(2)`` through ctypes.
- **Fork bomb**: contained three ways at once: ``RLIMIT_NPROC`` bites (non-root uid, 64 processes),
  the wall-clock kill of the pid namespace's init takes every process down with it (including
  ones that ``setsid``-ed or ``exec``-ed), and the pid namespace hides everything outside it.
  Measured: a ``while True: os.fork()`` bomb with ``timeout_s=2`` returns ``timeout`` after
  2.1-2.3 s with no process left (teardown of the namespace: 0.1-0.3 s); ``true`` started by the
  test process during the bomb completes at once.
- **Cost**: ~21-23 ms of CPU per candidate (parent + ``unshare`` + runner + worker, of which ~8.5
  is the interpreter's start and ~4.5 the runner's ``import ctypes``; ~38 ms with
  ``site_packages=True``), 40-55 ms wall for ``print(1)``; 45-80 candidates/s on the 2 CPUs with
  the default pool while other jobs shared them (``bench/sandbox_throughput.py``). A fork server
  (one pre-started sandbox forking per candidate) would cut most of that; not done.
- **Non-root check** (the same module run as ``nobody`` with the system Python): ``unshare --user
  --map-root-user --pid --fork --kill-child --mount-proc --net`` works, private ``/tmp`` works,
  the fork bomb, memory bomb, output flood, network and test harness behave as above.
- **Signalling the parent**: in the pid namespace the parent is invisible (``os.getppid()`` is 1,
  the runner, which as init ignores signals from inside the namespace and runs as another uid);
  a pid passed in from outside names no process or a sandboxed one; and a different uid cannot
  signal the trainer anyway (``EPERM``). ``os.kill(0, SIGKILL)`` only reaches the sandbox's own
  process group (``unshare`` there runs as root: ``EPERM``).
- **Writes and deletes outside the working directory** fail: the repository, the test's temp
  directories and every root-owned file are not writable by the sandbox uid (``EACCES``), and
  world-writable directories are private tmpfs, so even a ``0777`` directory or ``0666`` file under
  ``/tmp`` cannot be touched (the code sees an empty ``/tmp``).
- **Network**: ``unshare --net`` gives a namespace with only a down loopback: ``connect`` to a
  listener of the trainer on 127.0.0.1 fails (``ENETUNREACH``); ``network=True`` keeps the host's.
- **Secrets**: nothing from ``os.environ`` is passed; ``/proc`` shows only the sandbox's processes,
  so ``/proc/<trainer>/environ`` is out of reach too; ``/root`` is hidden behind the tmpfs.

Not achieved / limits (also documented for other machines)
-----------------------------------------------------------
- **Reading** world-readable files (the repository's source, ``/etc``) is still possible: only
  writing is denied. Hiding the repository would need a full bind-mounted root; not done.
- **Disk**: ``RLIMIT_FSIZE`` caps each file, not the number of files the code may create in its
  (on-disk) working directory; the private tmpfs are size-capped (``tmpfs_mb``).
- **Memory** is capped per process (``RLIMIT_AS``): up to ``max_procs`` processes may each use
  ``memory_mb``. Memory cgroups (v1 here, not delegated) are not used; ``oom_score_adj`` = 1000
  makes the kernel kill sandboxed processes first should memory run out.
- **The test harness' nonce** (below) defeats forgery by printing; it does not defend against code
  that introspects the interpreter it runs in (``gc.get_objects()``, frame walking): no in-process
  harness can. A candidate that ends the process (``os._exit``) during the tests loses the
  remaining tests; one that makes ``==`` always true (``__eq__`` returning ``True``) fools any
  ``assert x == y`` -- that is a property of the tests, not of the sandbox.
- **Elsewhere**: as a non-root user the sandbox uses ``unshare --user --map-root-user`` (plus
  pid/mount/net namespaces) when the kernel allows; RLIMIT_NPROC is then enforced (the host uid
  is not root) but the code runs with the caller's uid, so files of that uid outside the mount
  namespace's private directories (e.g. the repository) *can* be written -- there is no unprivileged
  second uid to drop to. Without any namespace, ``RLIMIT_NPROC`` counts *all* processes and
  threads of the caller's uid, trainer included, so ``max_procs`` must leave room for them.
  Without ``unshare`` (or when probes fail) each missing layer is logged
  once as a warning and results report ``network_isolated=False``; without a pid namespace and
  without a separate uid, ``os.kill(os.getppid(), ...)`` can reach the trainer and a process that
  calls ``setsid`` escapes the group kill.

Statuses (:attr:`ExecResult.status`), first match wins
------------------------------------------------------
``timeout``        the wall clock (``timeout_s``) ran out and the parent killed the tree, or the
                   worker died of ``SIGXCPU`` (``cpu_s`` of CPU time used).
``output_limit``   stdout or stderr exceeded ``max_output_bytes`` and the parent killed the tree;
                   ``truncated`` is True and the streams hold the first ``max_output_bytes``.
``sandbox_error``  the sandbox itself failed (``unshare``/setup error); the code did not run.
``syntax_error``   the code does not compile (``SyntaxError``, null bytes); nothing of it ran.
``memory``         the code raised ``MemoryError`` that reached the top level, or died of a signal
                   with an out-of-memory message on stderr (a C extension's failed allocation).
``killed``         the worker died of any other signal (``SIGKILL`` by the OOM killer or the hard
                   CPU limit, ``SIGSEGV``, ``SIGXFSZ`` when a file exceeds ``file_size_mb``, its own
                   ``os.kill``); ``returncode`` is minus the signal number.
``ok``             exit status 0 (including ``sys.exit(0)``/``sys.exit(None)``).
``error``          any other exit status: an uncaught exception (its type in ``exception``) or
                   ``sys.exit(n)``.

Test harness (:meth:`Sandbox.run_tests`)
---------------------------------------
``run_tests(program, tests)`` runs the program and then each test *separately* in the same
process, in the program's namespace: every top-level statement of ``tests`` that contains an
``assert`` (outside a ``def``/``class``) is one test; other statements (imports, helper ``def``-s,
assignments) are setup and run in order. ``tests`` may also be a list of strings, one test each.
With ``entry_point`` (HumanEval style: ``def check(candidate): assert candidate(...) == ...``) the
statements of ``check``'s body are the tests, with ``candidate`` bound to the program's
``entry_point``; the top-level ``check(...)`` call is dropped. A test passes if it raises nothing
(an ``AssertionError`` or any other exception, ``SystemExit`` included, fails it). If the program
itself fails (syntax error, uncaught exception, exit), no test runs.

Results travel on a separate pipe, not stdout (the candidate's output cannot garble them, and
results reported before a ``timeout`` or ``output_limit`` kill still count), one line per test as it
finishes, each prefixed with a tag
holding a random 128-bit nonce the candidate never sees (it is in neither the code, the argv, the
environment nor any file the worker can read), so printing or writing a fake summary does nothing.
``run_tests`` returns
:class:`TestRun` ``(passed, total, result)``; ``total`` comes from the parent's own parse of the tests.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import marshal
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple, Union

logger = logging.getLogger(__name__)

__all__ = [
    "STATUSES",
    "ExecResult",
    "Isolation",
    "Sandbox",
    "SandboxConfig",
    "SandboxConfigError",
    "TestCaseResult",
    "TestRun",
    "probe_isolation",
]

STATUSES = ("ok", "error", "syntax_error", "timeout", "memory", "output_limit", "killed", "sandbox_error")

#: Every sandboxed process has ``accord-sandbox:<pid of the process that started it>`` in its command line
#: (forks keep it): handy for ``ps`` and for tests that look for leftovers.
PROCESS_MARKER = "accord-sandbox"

_SOLUTION = "solution.py"
_JOB = ".accord-job"
_RESERVED = {_SOLUTION, _JOB}
_REPORT_CAP = 1 << 20  # bytes of report-pipe data kept; more is treated as an output flood
_READ_CHUNK = 1 << 16
_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_UIDS_PER_PROCESS = 256

Job = Union[str, "tuple[str, str | None]"]


class SandboxConfigError(ValueError):
    """A :class:`SandboxConfig` field is invalid; the message names the field."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one sandboxed run. Every field is validated on construction."""

    timeout_s: float = 5.0  #: wall-clock limit of one run (the whole process tree is killed after it)
    cpu_s: float | None = None  #: CPU seconds per process (RLIMIT_CPU); None: ceil(timeout_s) + 1
    memory_mb: int = 512  #: address space per process (RLIMIT_AS), MiB
    max_output_bytes: int = 64 * 1024  #: cap of stdout and of stderr, each; beyond it: output_limit
    file_size_mb: int = 16  #: largest file the code may write (RLIMIT_FSIZE), MiB
    max_procs: int = 64  #: processes/threads of the sandbox uid (RLIMIT_NPROC)
    max_open_files: int = 256  #: RLIMIT_NOFILE
    tmpfs_mb: int = 64  #: size of each private tmpfs (/tmp, /var/tmp, /dev/shm, /run/lock)
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  #: run_many's concurrency
    network: bool = False  #: False: the code gets an empty network namespace (when the kernel allows)
    site_packages: bool = False  #: True: the code may import the trainer's site-packages (no -S; slower start)
    uid_base: int | None = None  #: first uid of this process' block of 256 (root only); None: derived from pid

    def __post_init__(self) -> None:
        def need(name: str, ok: bool, rule: str) -> None:
            if not ok:
                raise SandboxConfigError(f"SandboxConfig.{name}={getattr(self, name)!r} is invalid: {rule}")

        def number(name: str) -> bool:
            value = getattr(self, name)
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        def integer(name: str) -> bool:
            return isinstance(getattr(self, name), int) and not isinstance(getattr(self, name), bool)

        need("timeout_s", number("timeout_s") and self.timeout_s > 0, "must be a number > 0 (seconds)")
        need("cpu_s", self.cpu_s is None or (number("cpu_s") and self.cpu_s > 0), "must be None or a number > 0")
        need("memory_mb", integer("memory_mb") and self.memory_mb >= 64, "must be an int >= 64 (MiB)")
        need("max_output_bytes", integer("max_output_bytes") and self.max_output_bytes >= 1, "must be an int >= 1")
        need("file_size_mb", integer("file_size_mb") and self.file_size_mb >= 1, "must be an int >= 1 (MiB)")
        need("max_procs", integer("max_procs") and self.max_procs >= 1, "must be an int >= 1")
        need("max_open_files", integer("max_open_files") and self.max_open_files >= 16, "must be an int >= 16")
        need("tmpfs_mb", integer("tmpfs_mb") and self.tmpfs_mb >= 1, "must be an int >= 1 (MiB)")
        need("workers", integer("workers") and 1 <= self.workers <= _UIDS_PER_PROCESS,
             f"must be an int in [1, {_UIDS_PER_PROCESS}]")
        need("network", isinstance(self.network, bool), "must be True or False")
        need("site_packages", isinstance(self.site_packages, bool), "must be True or False")
        need("uid_base", self.uid_base is None or (integer("uid_base") and 1000 <= self.uid_base
                                                    <= 2**31 - 1 - _UIDS_PER_PROCESS),
             f"must be None or an int in [1000, {2**31 - 1 - _UIDS_PER_PROCESS}]")

    @property
    def cpu_limit_s(self) -> int:
        """The RLIMIT_CPU soft limit actually set (whole seconds, rounded up)."""
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s + 1))


@dataclass(frozen=True)
class TestCaseResult:
    """Outcome of one test of :meth:`Sandbox.run_tests`."""

    __test__ = False  # not a pytest test class

    index: int  #: position among the tests (setup statements are not counted)
    passed: bool
    error: str | None = None  #: e.g. "AssertionError" or "NameError: name 'f' is not defined"


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed run did. See the module docstring for how ``status`` is decided."""

    status: str  #: one of STATUSES
    returncode: int | None  #: the code's exit status, -signal when a signal ended it; None if we killed it
    stdout: str
    stderr: str
    duration_s: float
    truncated: bool = False  #: stdout or stderr was cut at max_output_bytes
    network_isolated: bool = False  #: the run had no network (empty network namespace)
    exception: str | None = None  #: type name of an uncaught exception of the code
    test_cases: tuple[TestCaseResult, ...] = ()  #: run_tests only: the tests that reported, by index

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class TestRun(NamedTuple):
    """Result of :meth:`Sandbox.run_tests`: unpacks as ``passed, total, result``."""

    __test__ = False  # not a pytest test class

    passed: int
    total: int
    result: ExecResult

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class Isolation:
    """What containment the sandbox achieves on this machine (measured by :func:`probe_isolation`)."""

    root: bool  #: the trainer runs as root
    uid_drop: bool  #: each run gets its own unprivileged uid (root only)
    user_namespace: bool  #: unshare --user --map-root-user (non-root only)
    pid_namespace: bool  #: unshare --pid --fork --kill-child --mount-proc
    mount_namespace: bool  #: private tmpfs on /tmp & co. and hidden untraversable dirs
    network_namespace: bool  #: unshare --net works (used unless SandboxConfig.network)
    unshare: str | None = None  #: path of the unshare binary used
    notes: tuple[str, ...] = ()  #: what is missing and why

    def summary(self) -> str:
        parts = [name for name, on in (("root", self.root), ("uid-drop", self.uid_drop),
                                       ("userns", self.user_namespace), ("pidns", self.pid_namespace),
                                       ("mountns", self.mount_namespace), ("netns", self.network_namespace)) if on]
        return "+".join(parts) or "none"


# --------------------------------------------------------------------------------------------------
# The runner: our code, run by the sandboxed interpreter with -c. It must stay self-contained (only
# builtin / stdlib modules) and never print to stdout/stderr except on behalf of the candidate.
# --------------------------------------------------------------------------------------------------
_RUNNER = r'''
import marshal, os, sys

def _json(value):
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        out = []
        for ch in value:
            code = ord(ch)
            if ch == '"' or ch == "\\" or code < 32 or code > 126:
                if code > 0xFFFF:
                    code -= 0x10000
                    out.append("\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)))
                else:
                    out.append("\\u%04x" % code)
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    return "{" + ",".join(_json(str(k)) + ":" + _json(v) for k, v in value.items()) + "}"

def _describe(exc):
    try:
        text = str(exc)
    except BaseException:  # a candidate-defined __str__ may raise anything
        text = "<unprintable>"
    name = type(exc).__name__
    return (name + ": " + text if text else name)[:300]

def _libc():
    import ctypes
    return ctypes, ctypes.CDLL(None, use_errno=True)

def _mounts(job):
    ctypes, libc = _libc()
    def mount(source, target, fstype, flags, data):
        if libc.mount(source, target.encode(), fstype, flags, data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), target)
    nosuid_nodev, bind = 2 | 4, 4096
    keep = {}
    for path in job["keep"]:
        keep[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    errors = []
    for path, data in job["cover"]:
        try:
            mount(b"tmpfs", path, b"tmpfs", nosuid_nodev, data.encode())
        except OSError as exc:
            errors.append("tmpfs %s: %s" % (path, exc.strerror))
    for path, fd in keep.items():
        want = os.fstat(fd)
        try:
            have = os.stat(path)
            same = (have.st_dev, have.st_ino) == (want.st_dev, want.st_ino)
        except OSError:
            same = False
        if not same:
            try:
                os.makedirs(path, 0o755, exist_ok=True)
                mount(("/proc/self/fd/%d" % fd).encode(), path, None, bind, None)
            except OSError as exc:
                errors.append("bind %s: %s" % (path, exc.strerror))
        os.close(fd)
    os.chdir(job["workdir"])
    return errors

def _limit_and_drop(job):
    import resource
    for name, value in job["limits"]:
        which = getattr(resource, name)
        soft, hard = value
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    ctypes, libc = _libc()  # before the uid changes: the new uid may not be able to read the stdlib
    uid = job["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL: die with the runner

def _print_exception(exc, skip):
    import traceback
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    try:
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    except BaseException:  # printing a candidate's exception runs candidate code (__str__)
        sys.stderr.write(type(exc).__name__ + "\n")

def _finish(code):
    # Skip interpreter finalization (several ms) when nothing can observe it: no atexit callbacks and
    # no other thread. Otherwise exit normally so atexit handlers run and non-daemon threads are joined.
    import atexit
    threading = sys.modules.get("threading")
    if atexit._ncallbacks() == 0 and (threading is None or threading.active_count() == 1):
        try:
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                if stream is not None:
                    stream.flush()
        except BaseException:  # a candidate may have replaced sys.stdout by anything
            sys.exit(code)
        os._exit(code)
    sys.exit(code)

def _worker(job, report):
    try:
        _limit_and_drop(job)
    except (OSError, ValueError, ImportError) as exc:
        report(e="setup", error="worker setup: " + _describe(exc))
        os._exit(125)
    filename = job["filename"]
    try:
        code = compile(job["code"], filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        report(e="syntax", error=_describe(exc))
        import traceback
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        sys.exit(1)
    import builtins, types
    module = types.ModuleType("__main__")
    module.__file__ = filename
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [filename]
    namespace = module.__dict__
    tests = job["tests"]
    memory_line = report(e="exc", type="MemoryError", encode_only=True)
    write, fd = os.write, job["report_fd"]
    try:
        exec(code, namespace)
    except SystemExit:
        if tests is not None:
            report(e="program_exit")
        raise
    except MemoryError as exc:
        try:
            write(fd, memory_line)
        except OSError:
            pass
        namespace.clear()
        _print_exception(exc, 1)
        sys.exit(1)
    except BaseException as exc:  # whatever the candidate raises is its result, reported like Python would
        report(e="exc", type=type(exc).__name__)
        _print_exception(exc, 1)
        sys.exit(1)
    if tests is None:
        _finish(0)
    passed = total = 0
    for index, (source, is_test) in enumerate(tests):
        error = None
        try:
            exec(compile(source, "<test %d>" % index, "exec", dont_inherit=True), namespace)
        except BaseException as exc:  # a test fails on anything the candidate raises, SystemExit included
            error = _describe(exc)
        if is_test:
            report(e="test", i=total, ok=error is None, err=error)
            passed += error is None
            total += 1
        elif error is not None:
            report(e="setup_error", i=index, err=error)
    report(e="tests_done", passed=passed, total=total)
    _finish(0)

def _main():
    path = sys.argv[1]
    with open(path, "rb") as fh:
        job = marshal.loads(fh.read())
    os.unlink(path)
    tag = ("@accord-" + job.pop("nonce") + " ").encode()
    fd = job["report_fd"]

    def report(encode_only=False, **event):
        data = tag + _json(event).encode() + b"\n"
        if encode_only:
            return data
        while data:
            try:
                data = data[os.write(fd, data):]
            except OSError:
                return None
        return None

    os.umask(0o022)
    errors = []
    if job["mounts"]:
        try:
            errors = _mounts(job)
        except OSError as exc:
            errors = ["mounts: " + _describe(exc)]
    report(e="start", mount_error="; ".join(errors) or None)
    try:
        pid = os.fork()
    except OSError as exc:
        report(e="setup", error="fork: " + _describe(exc))
        os._exit(125)
    if pid == 0:
        _worker(job, report)
        sys.exit(0)

    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            os._exit(125)
        if done == pid:
            break
    if os.WIFSIGNALED(status):
        report(e="exit", signal=os.WTERMSIG(status))
        os._exit(128 + os.WTERMSIG(status))
    report(e="exit", code=os.WEXITSTATUS(status))
    os._exit(os.WEXITSTATUS(status))

_main()
'''


# --------------------------------------------------------------------------------------------------
# Probing what isolation works here (once per process).
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    unshare: str | None
    flags: tuple[str, ...]  # namespace flags, without --net
    uid_drop: bool
    mounts: bool
    net: bool  # --net works with these flags

    @property
    def pid_namespace(self) -> bool:
        return "--pid" in self.flags


_PID_FLAGS = ("--pid", "--fork", "--kill-child", "--mount-proc")
_USER_FLAGS = ("--user", "--map-root-user")
_PROBE_CODE = "import os, decimal, fractions, statistics, socket\nprint(os.getuid(), decimal.Decimal(1) / 4)\n"

_probe_lock = threading.Lock()
_probed: tuple[_Plan, Isolation] | None = None


def _candidates(root: bool, unshare: str | None) -> list[_Plan]:
    plans = []
    if unshare:
        base = () if root else _USER_FLAGS
        for uid_drop in ((True, False) if root else (False,)):
            plans.append(_Plan(unshare, base + _PID_FLAGS, uid_drop, True, False))
            plans.append(_Plan(unshare, base + _PID_FLAGS, uid_drop, False, False))
        if not root:
            plans.append(_Plan(unshare, _USER_FLAGS, False, False, False))
    for uid_drop in ((True, False) if root else (False,)):
        plans.append(_Plan(None, (), uid_drop, False, False))
    return plans


def _try_plan(plan: _Plan, network: bool) -> str | None:
    """Run the probe program under ``plan``; None when it behaved, else what went wrong."""
    config = SandboxConfig(timeout_s=20, workers=1, network=network)
    runner = _Runner(config, plan)
    result = runner.execute(_PROBE_CODE, None, None, None, probing=True)
    if result.status != "ok":
        return f"{result.status}: {(result.stderr or '').strip()[-300:]}"
    fields = result.stdout.split()
    if not fields or (plan.uid_drop and fields[0] == "0"):
        return f"unexpected probe output {result.stdout!r}"
    if runner.last_mount_error:
        return f"mount setup failed: {runner.last_mount_error}"
    return None


def probe_isolation(refresh: bool = False) -> Isolation:
    """Measure (once per process) which isolation layers work here; see the module docstring."""
    return _probe(refresh)[1]


def _probe(refresh: bool = False) -> tuple[_Plan, Isolation]:
    global _probed
    with _probe_lock:
        if _probed is not None and not refresh:
            return _probed
        root = os.geteuid() == 0
        unshare = shutil.which("unshare") or next((p for p in ("/usr/bin/unshare", "/bin/unshare")
                                                   if os.access(p, os.X_OK)), None)
        notes: list[str] = []
        if unshare is None:
            notes.append("no unshare binary: no namespaces")
        chosen = None
        for plan in _candidates(root, unshare):
            problem = _try_plan(plan, network=True)
            if problem is None:
                chosen = plan
                break
            notes.append(f"{_describe_plan(plan)} does not work: {problem}")
            logger.debug("sandbox probe: %s failed: %s", _describe_plan(plan), problem)
        if chosen is None:  # even a plain subprocess failed: report it, runs will show the error
            chosen = _Plan(None, (), False, False, False)
            notes.append("even a plain subprocess failed the probe")
        if unshare is None:
            net_problem = "no unshare binary"
        else:
            chosen = _Plan(unshare, chosen.flags, chosen.uid_drop, chosen.mounts, False)
            net_problem = _try_plan(chosen, network=False)
        if net_problem is None:
            chosen = _Plan(chosen.unshare, chosen.flags, chosen.uid_drop, chosen.mounts, True)
        else:
            notes.append(f"network namespace unavailable: {net_problem}")
        iso = Isolation(
            root=root,
            uid_drop=chosen.uid_drop,
            user_namespace="--user" in chosen.flags,
            pid_namespace=chosen.pid_namespace,
            mount_namespace=chosen.mounts,
            network_namespace=chosen.net,
            unshare=chosen.unshare if (chosen.flags or chosen.net) else None,
            notes=tuple(notes),
        )
        logger.info("sandbox isolation: %s", iso.summary())
        if not chosen.net:
            logger.warning("sandbox: cannot cut the network here (%s); results report network_isolated=False",
                           net_problem)
        if not (chosen.pid_namespace or chosen.uid_drop):
            logger.warning("sandbox: no pid namespace and no separate uid: sandboxed code can signal the "
                           "trainer's processes and escape the group kill with setsid (%s)", "; ".join(notes))
        elif root and not chosen.uid_drop:
            logger.warning("sandbox: running as root without a separate uid: RLIMIT_NPROC is not enforced "
                           "and the code can write anything root can (%s)", "; ".join(notes))
        _probed = (chosen, iso)
        return _probed


def _describe_plan(plan: _Plan) -> str:
    parts = [" ".join(plan.flags) or "no unshare"]
    parts.append("uid drop" if plan.uid_drop else "same uid")
    parts.append("mounts" if plan.mounts else "no mounts")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# Per-run uids (root only).
# --------------------------------------------------------------------------------------------------
class _UidPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}

    def acquire(self, base: int) -> int:
        with self._lock:
            free = self._free.setdefault(base, list(range(base + _UIDS_PER_PROCESS - 1, base - 1, -1)))
            if not free:
                raise RuntimeError(f"more than {_UIDS_PER_PROCESS} concurrent sandbox runs")
            return free.pop()

    def release(self, base: int, uid: int) -> None:
        with self._lock:
            self._free[base].append(uid)


_UIDS = _UidPool()


def _default_uid_base() -> int:
    return 1_000_000_000 + (os.getpid() % 100_000) * _UIDS_PER_PROCESS


# --------------------------------------------------------------------------------------------------
# Process helpers.
# --------------------------------------------------------------------------------------------------
def _proc_pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _children_of(pid: int) -> list[int]:
    children = []
    for candidate in _proc_pids():
        try:
            with open(f"/proc/{candidate}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid).encode():
            children.append(candidate)
    return children


def _pids_of_uid(uid: int) -> list[int]:
    found = []
    for candidate in _proc_pids():
        try:
            with open(f"/proc/{candidate}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(candidate)
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def _signal(pid: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep_uid(uid: int) -> None:
    """Kill every process of ``uid`` until none is left (a fork bomb may fork between scan and kill)."""
    for _ in range(200):
        pids = _pids_of_uid(uid)
        if not pids:
            return
        for pid in pids:
            _signal(pid)
        time.sleep(0.002)
    logger.error("sandbox: processes of uid %d survive repeated SIGKILL", uid)


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited, without reaping it (so its pid and process group stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _rmtree(path: str) -> None:
    def retry(func, target, _exc_info):  # code may have removed permissions: restore and retry once
        try:
            os.chmod(os.path.dirname(target), 0o700)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, 0o700)
            func(target)
        except OSError as exc:
            logger.warning("sandbox: cannot remove %s: %s", target, exc)

    shutil.rmtree(path, onerror=retry)


def _blocked_ancestor(path: str) -> str | None:
    """The topmost ancestor of ``path`` that 'other' users cannot traverse, if any."""
    parts = path.strip("/").split("/")
    current = ""
    for part in parts[:-1]:
        current += "/" + part
        try:
            if not os.stat(current).st_mode & stat.S_IXOTH:
                return current
        except OSError:
            return None
    return None


_interpreter_cache: dict[bool, list[str]] = {}
_interpreter_lock = threading.Lock()


def _interpreter_dirs(site_packages: bool) -> list[str]:
    """Directories the sandboxed interpreter reads: prefixes and the ``sys.path`` of ``python -I [-S]``
    (asked once from a real child: the trainer's own ``sys.path`` holds its script or working directory,
    which must not be exposed), reduced to the topmost ones."""
    with _interpreter_lock:
        if site_packages in _interpreter_cache:
            return _interpreter_cache[site_packages]
        dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.realpath(sys.executable))}
        argv = [sys.executable, "-I", *([] if site_packages else ["-S"]), "-c", "import sys; print(repr(sys.path))"]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, cwd="/",
                                 env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}).stdout
            paths = ast.literal_eval(out.strip())
        except (OSError, subprocess.SubprocessError, ValueError, SyntaxError) as exc:
            logger.warning("sandbox: cannot ask the interpreter for its sys.path (%s); using prefixes only", exc)
            paths = []
        dirs.update(p for p in paths if isinstance(p, str) and p)
        real = sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})
        minimal: list[str] = []
        for d in real:  # sorted: a parent comes before its children
            if not any(_inside(d, m) for m in minimal):
                minimal.append(d)
        _interpreter_cache[site_packages] = minimal
        return minimal


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _mount_plan(workdir: str, tmpfs_mb: int, site_packages: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """(paths to keep visible, [(dir to cover with a tmpfs, tmpfs options)]) for one run."""
    cover: dict[str, str] = {}
    for d in _TMP_DIRS:
        real = os.path.realpath(d)
        if os.path.isdir(real):
            cover.setdefault(real, f"mode=1777,size={tmpfs_mb}m")
    # an interpreter directory that is /tmp itself or one of its ancestors would undo the cover
    keep = [d for d in _interpreter_dirs(site_packages) if not any(_inside(c, d) for c in cover)]
    for d in keep + [workdir]:
        blocked = _blocked_ancestor(d)
        if blocked and blocked != "/":
            cover.setdefault(blocked, "mode=755,size=1m")
    top: list[str] = []
    for d in sorted(cover):  # drop covers inside other covers
        if not any(_inside(d, t) for t in top):
            top.append(d)
    covered = [d for d in keep if any(_inside(d, t) for t in top)]
    return covered + [workdir], [(t, cover[t]) for t in top]


def _parse_tests(tests: str | Sequence[str], entry_point: str | None) -> list[tuple[str, bool]]:
    """Split trusted test code into [(statement source, is_test)]."""
    if not isinstance(tests, str):
        items = list(tests)
        if not all(isinstance(t, str) for t in items):
            raise TypeError("tests must be a string of statements or a sequence of strings")
        for t in items:
            ast.parse(t)  # raise on broken tests here, not as a candidate failure
        return [(t, True) for t in items]
    tree = ast.parse(tests)
    body = list(tree.body)
    prefix: list[tuple[str, bool]] = []
    if entry_point is not None:
        if not entry_point.isidentifier():
            raise ValueError(f"entry_point={entry_point!r} is not an identifier")
        check = next((s for s in body if isinstance(s, ast.FunctionDef) and s.name == "check"), None)
        if check is None:
            raise ValueError("entry_point given but tests define no `def check(candidate)`")
        arg = check.args.args[0].arg if check.args.args else "candidate"
        setup = [s for s in body if s is not check and not _calls_check(s)]
        prefix = [(ast.unparse(s), False) for s in setup] + [(f"{arg} = {entry_point}", False)]
        body = list(check.body)
    out = list(prefix)
    for stmt in body:
        is_test = not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
            isinstance(node, ast.Assert) for node in ast.walk(stmt))
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue  # docstring
        out.append((ast.unparse(stmt), is_test))
    return out


def _calls_check(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check")


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def _oom_message(stderr: bytes) -> bool:
    tail = stderr[-2000:]
    return any(m in tail for m in (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory"))


# --------------------------------------------------------------------------------------------------
# One run.
# --------------------------------------------------------------------------------------------------
class _Runner:
    def __init__(self, config: SandboxConfig, plan: _Plan) -> None:
        self.config = config
        self.plan = plan
        self.last_mount_error: str | None = None

    def _argv(self, net: bool) -> list[str]:
        python = [sys.executable, "-I"] + ([] if self.config.site_packages else ["-S"])
        python += ["-c", _RUNNER, _JOB, f"{PROCESS_MARKER}:{os.getpid()}"]
        flags = list(self.plan.flags)
        if net:
            flags += ["--net"] if (flags or os.geteuid() == 0) else [*_USER_FLAGS, "--net"]
        if not flags:
            return python
        return [self.plan.unshare or "unshare", *flags, "--", *python]

    def _limits(self) -> list[tuple[str, tuple[int, int]]]:
        c = self.config
        mib = 1024 * 1024
        return [
            ("RLIMIT_CPU", (c.cpu_limit_s, c.cpu_limit_s + 1)),
            ("RLIMIT_AS", (c.memory_mb * mib, c.memory_mb * mib)),
            ("RLIMIT_FSIZE", (c.file_size_mb * mib, c.file_size_mb * mib)),
            ("RLIMIT_NPROC", (c.max_procs, c.max_procs)),
            ("RLIMIT_NOFILE", (c.max_open_files, c.max_open_files)),
            ("RLIMIT_CORE", (0, 0)),
        ]

    def execute(self, code: str, stdin: str | None, files: dict[str, str] | None,
                tests: list[tuple[str, bool]] | None, probing: bool = False) -> ExecResult:
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        if stdin is not None and not isinstance(stdin, str):
            raise TypeError(f"stdin must be str or None, not {type(stdin).__name__}")
        uid_base = self.config.uid_base if self.config.uid_base is not None else _default_uid_base()
        uid = _UIDS.acquire(uid_base) if self.plan.uid_drop else None
        workdir = tempfile.mkdtemp(prefix="accord-sbx-")
        try:
            return self._execute_in(workdir, uid, code, stdin, files or {}, tests, probing)
        finally:
            _rmtree(workdir)
            if uid is not None:
                _UIDS.release(uid_base, uid)

    def _prepare(self, workdir: str, uid: int | None, code: str, files: dict[str, str],
                 tests: list[tuple[str, bool]] | None, nonce: str, report_fd: int) -> None:
        for name, content in files.items():
            if not isinstance(name, str) or not isinstance(content, str):
                raise TypeError("files must map str paths to str contents")
            norm = os.path.normpath(name)
            if os.path.isabs(norm) or norm == ".." or norm.startswith("../") or norm in _RESERVED or norm == ".":
                raise ValueError(f"files: {name!r} must be a relative path inside the working directory "
                                 f"(and not {sorted(_RESERVED)})")
            path = os.path.join(workdir, norm)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(content)
        solution = os.path.join(workdir, _SOLUTION)
        with open(solution, "w", encoding="utf-8", errors="replace") as fh:
            fh.write(code)
        keep, cover = ([], [])
        if self.plan.mounts:
            keep, cover = _mount_plan(workdir, self.config.tmpfs_mb, self.config.site_packages)
        job = {
            "nonce": nonce, "report_fd": report_fd, "code": code, "filename": solution, "workdir": workdir,
            "tests": tests, "uid": uid, "limits": self._limits(), "mounts": self.plan.mounts,
            "keep": keep, "cover": cover,
        }
        fd = os.open(os.path.join(workdir, _JOB), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(marshal.dumps(job))
        if uid is not None:  # the code's uid owns its working directory and files (not the job file)
            for dirpath, _dirnames, filenames in os.walk(workdir):
                os.chown(dirpath, uid, uid)
                for name in filenames:
                    if name != _JOB:
                        os.chown(os.path.join(dirpath, name), uid, uid)

    def _execute_in(self, workdir: str, uid: int | None, code: str, stdin: str | None,
                    files: dict[str, str], tests: list[tuple[str, bool]] | None, probing: bool) -> ExecResult:
        cfg = self.config
        net = (not cfg.network) if probing else (self.plan.net and not cfg.network)
        nonce = secrets.token_hex(16)
        report_r, report_w = os.pipe()
        with contextlib.ExitStack() as stack:
            stack.callback(os.close, report_r)

            def close_write_end() -> None:  # the parent's copy is closed right after the start
                if report_w >= 0:
                    os.close(report_w)

            stack.callback(close_write_end)
            self._prepare(workdir, uid, code, files, tests, nonce, report_w)
            stdin_file = None
            if stdin is not None:
                stdin_file = stack.enter_context(tempfile.TemporaryFile())
                stdin_file.write(stdin.encode("utf-8", errors="surrogateescape"))
                stdin_file.seek(0)
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "HOME": workdir, "TMPDIR": workdir, "USER": "sandbox", "LOGNAME": "sandbox",
                "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
            }
            start = time.monotonic()
            try:
                proc = subprocess.Popen(
                    self._argv(net), cwd=workdir, env=env, stdin=stdin_file if stdin_file else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(report_w,), start_new_session=True,
                )
            except OSError as exc:
                logger.error("sandbox: cannot start the sandbox process: %s", exc)
                return ExecResult("sandbox_error", None, "", f"cannot start the sandbox: {exc}",
                                  time.monotonic() - start, network_isolated=net)
            os.close(report_w)
            report_w = -1
            raw = self._supervise(proc, report_r, start, uid)
            events = _events(raw.report, nonce)
            mount_error = next((e.get("mount_error") for e in events if e.get("e") == "start"), None)
            if probing:
                self.last_mount_error = str(mount_error) if mount_error else None
            elif mount_error:
                _warn_once(f"sandbox: mount setup incomplete: {mount_error}")
            return _classify(raw, events, net, tests is not None)

    def _kill(self, proc: subprocess.Popen, uid: int | None) -> None:
        """Kill everything the run started. Returns once no process of it is left."""
        if not _exited(proc.pid):
            children = _children_of(proc.pid)
            for child in children:
                _signal(child)
            if children and self.plan.pid_namespace:
                # The child of unshare is the pid namespace's init: the kernel kills every process of the
                # namespace and waits for them before init's exit completes; unshare (which waits for
                # init) exits after that. So once unshare has exited, the namespace is empty.
                limit = time.monotonic() + 5
                delay = 0.0002
                while not _exited(proc.pid) and time.monotonic() < limit:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.01)
        _signal(proc.pid, group=True)
        if uid is not None and not self.plan.pid_namespace:
            _sweep_uid(uid)

    def _supervise(self, proc: subprocess.Popen, report_r: int, start: float, uid: int | None) -> _Raw:
        """Read the three pipes until they close, the deadline passes or output overflows; then clean up."""
        cfg = self.config
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        buffers = {out_fd: bytearray(), err_fd: bytearray(), report_r: bytearray()}
        caps = {out_fd: cfg.max_output_bytes, err_fd: cfg.max_output_bytes, report_r: _REPORT_CAP}
        poller = select.poll()
        for fd in buffers:
            poller.register(fd, select.POLLIN)
        open_fds = set(buffers)
        deadline = start + cfg.timeout_s
        killed: str | None = None
        truncated = False
        cleaned = False
        try:
            while open_fds and killed is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed = "timeout"
                    break
                events = poller.poll(max(1, int(min(remaining, 0.25) * 1000)))
                for fd, _ in events:
                    chunk = os.read(fd, _READ_CHUNK)
                    if not chunk:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    buf = buffers[fd]
                    room = caps[fd] - len(buf)
                    buf += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        truncated = fd != report_r or truncated
                        killed = "output_limit"
                        break
                if not events and not cleaned and _exited(proc.pid):
                    # the sandbox exited, but something it left behind holds a pipe open: kill it
                    self._kill(proc, uid)
                    cleaned = True
            if killed is None:
                # every pipe is closed, so the process is exiting: wait for it without reaping it
                delay = 0.0002
                while not _exited(proc.pid):
                    if time.monotonic() >= deadline:
                        killed = "timeout"
                        break
                    time.sleep(delay)
                    delay = min(delay * 2, 0.01)
            if killed is not None:
                # Stop reading first: a writer blocked on a full pipe must not hold up the teardown
                # (unshare itself writes a message to stderr when its child is SIGKILLed).
                proc.stdout.close()
                proc.stderr.close()
            self._kill(proc, uid)
            try:
                returncode: int | None = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                logger.error("sandbox: process %d survives SIGKILL", proc.pid)
                returncode = None
        finally:
            proc.stdout.close()
            proc.stderr.close()
        return _Raw(killed, returncode, bytes(buffers[out_fd]), bytes(buffers[err_fd]), bytes(buffers[report_r]),
                    truncated, time.monotonic() - start)


class _Raw(NamedTuple):
    killed: str | None  # "timeout" / "output_limit" when the parent killed the run
    returncode: int | None  # of the process the parent started (unshare or the runner)
    stdout: bytes
    stderr: bytes
    report: bytes
    truncated: bool
    duration_s: float


def _events(report: bytes, nonce: str) -> list[dict]:
    """The runner's report lines that carry this run's tag; anything else on the pipe is ignored."""
    tag = f"@accord-{nonce} ".encode()
    events = []
    for line in report.split(b"\n"):
        if line.startswith(tag):
            try:
                event = json.loads(line[len(tag):])
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events


def _classify(raw: _Raw, events: list[dict], net: bool, with_tests: bool) -> ExecResult:
    stdout = raw.stdout.decode("utf-8", errors="replace")
    stderr = raw.stderr.decode("utf-8", errors="replace")
    kinds = {e.get("e"): e for e in events}
    exit_event = kinds.get("exit")
    returncode: int | None = raw.returncode
    if exit_event is not None:
        if isinstance(exit_event.get("signal"), int):
            returncode = -exit_event["signal"]
        elif isinstance(exit_event.get("code"), int):
            returncode = exit_event["code"]
    exc = kinds.get("exc", {}).get("type")
    exception = exc if isinstance(exc, str) else None
    if raw.killed is not None:
        status = raw.killed
        returncode = None
    elif "setup" in kinds or "start" not in kinds:  # the runner failed before the code could run
        status = "sandbox_error"
        reason = kinds.get("setup", {}).get("error") or stderr.strip()[-500:]
        logger.error("sandbox: the sandbox failed to run the code: %s", reason)
        if "setup" in kinds:
            stderr = f"{stderr}sandbox setup failed: {reason}\n"
    elif "syntax" in kinds:
        status = "syntax_error"
    elif exception == "MemoryError":
        status = "memory"
    elif returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            status = "timeout"
        elif sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS) and _oom_message(raw.stderr):
            status = "memory"
        else:
            status = "killed"
    elif returncode == 0:
        status = "ok"
    else:
        status = "error"
    cases: tuple[TestCaseResult, ...] = ()
    if with_tests:
        seen: dict[int, TestCaseResult] = {}
        for e in events:
            if e.get("e") == "test" and isinstance(e.get("i"), int) and e["i"] not in seen:
                err = e.get("err")
                seen[e["i"]] = TestCaseResult(e["i"], e.get("ok") is True, err if isinstance(err, str) else None)
        cases = tuple(seen[i] for i in sorted(seen))
    return ExecResult(status, returncode, stdout, stderr, raw.duration_s, raw.truncated, net, exception, cases)


# --------------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------------
class Sandbox:
    """Runs untrusted code under :class:`SandboxConfig` limits; thread-safe, no state between runs."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config if config is not None else SandboxConfig()
        if not isinstance(self.config, SandboxConfig):
            raise TypeError(f"config must be a SandboxConfig, not {type(self.config).__name__}")
        self._plan, self._isolation = _probe()
        self._runner = _Runner(self.config, self._plan)

    @property
    def isolation(self) -> Isolation:
        """The containment runs get here (network_namespace is False when config.network is True)."""
        iso = self._isolation
        if self.config.network and iso.network_namespace:
            iso = Isolation(iso.root, iso.uid_drop, iso.user_namespace, iso.pid_namespace, iso.mount_namespace,
                            False, iso.unshare, iso.notes + ("network allowed by config",))
        return iso

    def run(self, code: str, stdin: str | None = None, files: dict[str, str] | None = None) -> ExecResult:
        """Run ``code`` as ``__main__`` with ``stdin`` as its standard input and ``files`` (relative path ->
        text) in its working directory."""
        return self._runner.execute(code, stdin, files, None)

    def run_many(self, jobs: Sequence[Job]) -> list[ExecResult]:
        """Run jobs (code strings or ``(code, stdin)`` pairs) concurrently on ``config.workers`` threads;
        results in input order."""
        normalized = [_normalize_job(job) for job in jobs]
        return self._map(lambda job: self._runner.execute(job[0], job[1], None, None), normalized)

    def run_tests(self, program: str, tests: str | Sequence[str], entry_point: str | None = None) -> TestRun:
        """Run ``program`` then each test separately in one process; see the module docstring."""
        parsed = _parse_tests(tests, entry_point)
        result = self._runner.execute(program, None, None, parsed)
        return _test_run(parsed, result)

    def run_tests_many(self, jobs: Sequence[tuple]) -> list[TestRun]:
        """:meth:`run_tests` for many ``(program, tests)`` or ``(program, tests, entry_point)`` jobs,
        concurrently; results in input order."""
        parsed = []
        for job in jobs:
            if not isinstance(job, tuple) or len(job) not in (2, 3):
                raise TypeError("run_tests_many jobs must be (program, tests) or (program, tests, entry_point)")
            parsed.append((job[0], _parse_tests(job[1], job[2] if len(job) == 3 else None)))
        return self._map(lambda job: _test_run(job[1], self._runner.execute(job[0], None, None, job[1])), parsed)

    def _map(self, fn, items: list) -> list:
        if len(items) <= 1 or self.config.workers == 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.config.workers, len(items)),
                                thread_name_prefix="accord-sandbox") as pool:
            return list(pool.map(fn, items))


def _normalize_job(job: Job) -> tuple[str, str | None]:
    if isinstance(job, str):
        return job, None
    if isinstance(job, tuple) and len(job) == 2 and isinstance(job[0], str) and (job[1] is None
                                                                                  or isinstance(job[1], str)):
        return job[0], job[1]
    raise TypeError(f"a job must be a code string or a (code, stdin) pair, not {type(job).__name__}")


def _test_run(parsed: list[tuple[str, bool]], result: ExecResult) -> TestRun:
    total = sum(1 for _, is_test in parsed if is_test)
    passed = sum(1 for case in result.test_cases if case.passed and case.index < total)
    return TestRun(passed, total, result)
