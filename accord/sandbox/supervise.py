"""Starting, watching and tearing down one sandboxed run, and classifying what it did.

The parent reads stdout, stderr and the report pipe incrementally (``poll``, 64 KiB reads); past
``timeout_s``, or once stdout or stderr exceeds ``max_output_bytes``, it kills the whole tree at once:
the children of ``unshare`` (the pid namespace's init: its death makes the kernel kill every process in
the namespace), ``os.killpg`` of the session's process group, and -- without a pid namespace -- every
process of the run's uid, swept from ``/proc`` until none is left. The same cleanup runs after every
normal exit, so daemons the code leaves behind die with the run. The run's cgroup slot is reused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import marshal
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from accord.sandbox.config import SandboxConfig
from accord.sandbox.isolation import UIDS, Cgroups, Isolation, Plan, Slot, candidate_plans, default_uid_base, \
    find_unshare, root_spec

logger = logging.getLogger(__name__)

#: Every sandboxed process has ``accord-sandbox:<pid of the process that started it>`` in its command line
#: (forks keep it): handy for ``ps`` and for tests that look for leftovers.
PROCESS_MARKER = "accord-sandbox"
SOLUTION = "solution.py"
JOB = ".accord-job"
RESERVED = {SOLUTION, JOB}
_REPORT_CAP = 1 << 22  # bytes of report-pipe data kept; more is treated as an output flood
_READ_CHUNK = 1 << 16
_CHILD_PATH = Path(__file__).with_name("child.py")
# Compiled once per process (compiling it in every sandbox would cost ~4 ms of each run): the job file
# carries the code object, and this bootstrap, the only source given to the interpreter, runs it.
_CHILD_CODE = compile(_CHILD_PATH.read_text(encoding="utf-8"), "accord-sandbox-child", "exec", dont_inherit=True)
_BOOTSTRAP = ("import marshal, os, sys\n"
              "with open(sys.argv[1], 'rb') as fh:\n    code, job = marshal.loads(fh.read())\n"
              "os.unlink(sys.argv[1])\nchild = {'__name__': 'accord_sandbox_child'}\n"
              "exec(code, child)\nchild['main'](job)\n")
_PROBE_CODE = ("import os, decimal, fractions, statistics, socket, hashlib, json, re, random, collections\n"
               "print(os.getuid(), decimal.Decimal(1) / 4, os.getcwd())\n")


class Raw(NamedTuple):
    killed: str | None  # "timeout" / "output_limit" when the parent killed the run
    returncode: int | None  # of the process the parent started (unshare or the runner)
    stdout: bytes
    stderr: bytes
    report: bytes  # the worker's channel: whatever the job's code wrote there
    control: bytes  # the runner's channel: written before the job's code runs, and by the runner
    truncated: bool
    duration_s: float
    oom_killed: bool


# --------------------------------------------------------------------------------------------------
# Process helpers
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


def _drain(fd: int, buf: bytearray, cap: int) -> None:
    """Append what a non-blocking pipe still holds to ``buf`` (up to ``cap`` bytes)."""
    while len(buf) < cap:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            return
        buf += chunk[: cap - len(buf)]


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


def _clean(value):
    """Text from a sandbox as valid UTF-8 (a lone surrogate, e.g. in a candidate's exception message,
    would break tokenizers and JSON writers downstream)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def events(report: bytes, nonce: str) -> list[dict]:
    """The report lines that carry this run's tag; anything else on the pipe is ignored. String values
    are cleaned to valid UTF-8, but ``v`` (an encoded value, decoded strictly by the caller)."""
    tag = f"@accord-{nonce} ".encode()
    out = []
    for line in report.split(b"\n"):
        if line.startswith(tag):
            try:
                event = json.loads(line[len(tag):])
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict):
                out.append({k: (v if k == "v" else _clean(v)) for k, v in event.items()})
    return out


# --------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------
class Runner:
    """Starts runs of the child runner under a :class:`Plan` with a config's limits."""

    def __init__(self, config, plan: Plan, cgroups: Cgroups | None) -> None:
        self.config = config
        self.plan = plan
        self.cgroups = cgroups
        self.last_setup_error: str | None = None

    def _argv(self, net: bool, job_path: str) -> list[str]:
        python = [sys.executable, "-I"] + ([] if self.config.site_packages else ["-S"])
        python += ["-c", _BOOTSTRAP, job_path, f"{PROCESS_MARKER}:{os.getpid()}"]
        flags = list(self.plan.flags)
        if net:
            flags += ["--net"] if (flags or os.geteuid() == 0) else ["--user", "--map-root-user", "--net"]
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

    def execute(self, mode: str, code: str, *, stdin: str | None = None, files: dict[str, str] | None = None,
                extra: dict | None = None, probing: bool = False) -> tuple[Raw, list[dict], list[dict], bool]:
        """Run the child in ``mode``; returns (raw result, control events, worker events, network isolated)."""
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        if stdin is not None and not isinstance(stdin, str):
            raise TypeError(f"stdin must be str or None, not {type(stdin).__name__}")
        uid_base = self.config.uid_base if self.config.uid_base is not None else default_uid_base()
        uid = UIDS.acquire(uid_base) if self.plan.uid_drop else None
        workdir = tempfile.mkdtemp(prefix="accord-sbx-")
        slot: Slot | None = None
        try:
            if self.cgroups is not None and self.cgroups.bases:
                slot = self.cgroups.acquire(self.config.memory_mb * 1024 * 1024)
            return self._execute_in(workdir, uid, slot, mode, code, stdin, files or {}, extra or {}, probing)
        finally:
            _rmtree(workdir)
            if slot is not None:
                self.cgroups.release(slot)
            if uid is not None:
                UIDS.release(uid_base, uid)

    def _prepare(self, workdir: str, uid: int | None, slot: Slot | None, mode: str, code: str,
                 files: dict[str, str], extra: dict, nonce: str, report_fd: int, ctl_fd: int) -> str:
        """Write the files and the job; returns the directory the child starts in."""
        home = os.path.join(workdir, "files")
        os.mkdir(home)
        for name, content in files.items():
            if not isinstance(name, str) or not isinstance(content, str):
                raise TypeError("files must map str paths to str contents")
            norm = os.path.normpath(name)
            if os.path.isabs(norm) or norm == ".." or norm.startswith("../") or norm in RESERVED or norm == ".":
                raise ValueError(f"files: {name!r} must be a relative path inside the working directory "
                                 f"(and not {sorted(RESERVED)})")
            path = os.path.join(home, norm)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(content)
        with open(os.path.join(home, SOLUTION), "w", encoding="utf-8", errors="replace") as fh:
            fh.write(code)
        root = None
        filename = os.path.join(home, SOLUTION)
        if self.plan.mounts:
            spec = root_spec(self.config.site_packages)
            os.mkdir(os.path.join(workdir, "root"))
            root = {"dir": os.path.join(workdir, "root"), "binds": list(spec.binds), "covers": list(spec.covers),
                    "links": list(spec.links), "files": home, "python": os.path.realpath(sys.executable)}
            filename = "/sandbox/" + SOLUTION
        job = {
            "nonce": nonce, "report_fd": report_fd, "ctl_fd": ctl_fd, "mode": mode, "code": code, "filename": filename,
            "uid": uid, "limits": self._limits(), "root": root,
            # a slot's spawner starts the run inside its cgroups; without one the runner joins them
            "cgroups": list(slot.paths) if slot is not None and slot.spawner is None else [],
            "hostname": "--uts" in self.plan.flags, "seccomp": self.plan.seccomp,
            "tmpfs_mb": self.config.tmpfs_mb, "disk_mb": self.config.disk_mb, "max_files": self.config.max_files,
        }
        job.update(extra)
        fd = os.open(os.path.join(workdir, JOB), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(marshal.dumps((_CHILD_CODE, job)))
        if uid is not None and root is None:  # no root of its own: the code works in the host directory
            for dirpath, _dirnames, filenames in os.walk(home):
                os.chown(dirpath, uid, uid)
                for name in filenames:
                    os.chown(os.path.join(dirpath, name), uid, uid)
        return home

    def _execute_in(self, workdir: str, uid: int | None, slot: Slot | None, mode: str, code: str,
                    stdin: str | None, files: dict[str, str], extra: dict,
                    probing: bool) -> tuple[Raw, list[dict], list[dict], bool]:
        cfg = self.config
        net = (not cfg.network) if probing else (self.plan.net and not cfg.network)
        nonce = secrets.token_hex(16)
        with contextlib.ExitStack() as stack:
            report_r, report_w = os.pipe()
            ctl_r, ctl_w = os.pipe()
            writers = [report_w, ctl_w]
            stack.callback(os.close, report_r)
            stack.callback(os.close, ctl_r)

            def close_writers() -> None:  # the parent's copies are closed right after the start
                while writers:
                    os.close(writers.pop())

            stack.callback(close_writers)
            home = self._prepare(workdir, uid, slot, mode, code, files, extra, nonce, report_w, ctl_w)
            stdin_file = None
            if stdin is not None:
                stdin_file = stack.enter_context(tempfile.TemporaryFile())
                stdin_file.write(stdin.encode("utf-8", errors="surrogateescape"))
                stdin_file.seek(0)
            inner_home = "/sandbox" if self.plan.mounts else home
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "HOME": inner_home, "TMPDIR": "/tmp" if self.plan.mounts else home, "USER": "sandbox",
                "LOGNAME": "sandbox", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONIOENCODING": "utf-8",
            }
            start = time.monotonic()
            try:
                argv = self._argv(net, os.path.join(workdir, JOB))
                popen = lambda: subprocess.Popen(  # noqa: E731
                    argv, cwd=home, env=env, stdin=stdin_file if stdin_file else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(report_w, ctl_w),
                    start_new_session=True)
                proc = slot.spawn(popen) if slot is not None else popen()
            except OSError as exc:
                logger.error("sandbox: cannot start the sandbox process: %s", exc)
                raw = Raw(None, None, b"", f"cannot start the sandbox: {exc}".encode(), b"", b"",
                          False, time.monotonic() - start, False)
                return raw, [{"e": "setup", "error": f"cannot start the sandbox: {exc}"}], [], net
            close_writers()
            raw = self._supervise(proc, report_r, ctl_r, start, uid, slot)
            control, worker = events(raw.control, nonce), events(raw.report, nonce)
            setup = next((e.get("error") for e in control if e.get("e") == "setup"), None)
            if probing:
                self.last_setup_error = str(setup) if setup else None
            return raw, control, worker, net

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

    def _supervise(self, proc: subprocess.Popen, report_r: int, ctl_r: int, start: float, uid: int | None,
                   slot: Slot | None) -> Raw:
        """Read the four pipes until they close, the deadline passes or output overflows; then clean up."""
        cfg = self.config
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        buffers = {out_fd: bytearray(), err_fd: bytearray(), report_r: bytearray(), ctl_r: bytearray()}
        caps = {out_fd: cfg.max_output_bytes, err_fd: cfg.max_output_bytes, report_r: _REPORT_CAP,
                ctl_r: _REPORT_CAP}
        poller = select.poll()
        for fd in buffers:
            poller.register(fd, select.POLLIN)
        open_fds = set(buffers)
        deadline = start + cfg.timeout_s
        oom_before = Cgroups.oom_kills(slot) if slot is not None else 0
        killed: str | None = None
        truncated = False
        cleaned = False
        try:
            while open_fds and killed is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed = "timeout"
                    break
                ready = poller.poll(max(1, int(min(remaining, 0.25) * 1000)))
                for fd, _ in ready:
                    chunk = os.read(fd, _READ_CHUNK)
                    if not chunk:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    buf = buffers[fd]
                    room = caps[fd] - len(buf)
                    buf += chunk[:max(room, 0)]
                    if len(chunk) > room:
                        truncated = fd in (out_fd, err_fd) or truncated
                        killed = "output_limit"
                        break
                if not ready and not cleaned and _exited(proc.pid):
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
            if killed is not None:  # what was reported before the kill still counts: read it to the end
                for fd in (report_r, ctl_r):
                    if fd in open_fds:
                        os.set_blocking(fd, False)
                        _drain(fd, buffers[fd], caps[fd])
            try:
                returncode: int | None = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                logger.error("sandbox: process %d survives SIGKILL", proc.pid)
                returncode = None
        finally:
            proc.stdout.close()
            proc.stderr.close()
        return Raw(killed, returncode, bytes(buffers[out_fd]), bytes(buffers[err_fd]), bytes(buffers[report_r]),
                   bytes(buffers[ctl_r]), truncated, time.monotonic() - start, slot is not None and Cgroups.oom_kills(slot) > oom_before)


# --------------------------------------------------------------------------------------------------
# Probing what isolation works here (once per process)
# --------------------------------------------------------------------------------------------------
_probe_lock = threading.Lock()
_probed: tuple[Plan, Isolation, Cgroups] | None = None


def _try_plan(plan: Plan, network: bool, cgroups: Cgroups | None) -> tuple[str | None, bool]:
    """Run the probe program under ``plan``: (None when it behaved, else what went wrong; seccomp ok)."""
    config = SandboxConfig(timeout_s=20, workers=1, network=network)
    runner = Runner(config, plan, cgroups)
    raw, control, _, _ = runner.execute("exec", _PROBE_CODE, probing=True)
    seccomp_ok = not any(e.get("e") == "seccomp" for e in control)
    if runner.last_setup_error:
        return f"setup failed: {runner.last_setup_error}", seccomp_ok
    if raw.killed or raw.returncode != 0:
        return f"exit {raw.returncode} {raw.killed or ''}: {raw.stderr.decode(errors='replace').strip()[-300:]}", \
            seccomp_ok
    fields = raw.stdout.decode(errors="replace").split()
    if len(fields) < 3 or (plan.uid_drop and fields[0] == "0"):
        return f"unexpected probe output {raw.stdout!r}", seccomp_ok
    if plan.mounts and fields[2] != "/sandbox":
        return f"the probe ran in {fields[2]}, not in its own root", seccomp_ok
    return None, seccomp_ok


def probe(refresh: bool = False) -> tuple[Plan, Isolation, Cgroups]:
    global _probed
    with _probe_lock:
        if _probed is not None and not refresh:
            return _probed
        root = os.geteuid() == 0
        unshare = find_unshare()
        cgroups = Cgroups()
        notes: list[str] = list(cgroups.notes)
        if unshare is None:
            notes.append("no unshare binary: no namespaces")
        chosen, seccomp_ok = None, False
        for plan in candidate_plans(root, unshare):
            problem, seccomp_ok = _try_plan(plan, True, cgroups)
            if problem is None:
                chosen = plan
                break
            notes.append(f"{plan.describe()} does not work: {problem}")
            logger.debug("sandbox probe: %s failed: %s", plan.describe(), problem)
        if chosen is None:  # even a plain subprocess failed: report it, runs will show the error
            chosen = Plan(None, (), False, False, False)
            notes.append("even a plain subprocess failed the probe")
        if not seccomp_ok:
            notes.append("seccomp filter unavailable: AF_VSOCK sockets and io_uring are not blocked")
            chosen = Plan(chosen.unshare, chosen.flags, chosen.uid_drop, chosen.mounts, chosen.net, False)
        if unshare is None:
            net_problem: str | None = "no unshare binary"
        else:
            chosen = Plan(unshare, chosen.flags, chosen.uid_drop, chosen.mounts, False, chosen.seccomp)
            net_problem, _ = _try_plan(chosen, False, cgroups)
        if net_problem is None:
            chosen = Plan(chosen.unshare, chosen.flags, chosen.uid_drop, chosen.mounts, True, chosen.seccomp)
        else:
            notes.append(f"network namespace unavailable: {net_problem}")
        iso = Isolation(
            root=root, uid_drop=chosen.uid_drop, user_namespace="--user" in chosen.flags,
            pid_namespace=chosen.pid_namespace, mount_namespace=chosen.mounts, network_namespace=chosen.net,
            unshare=chosen.unshare if (chosen.flags or chosen.net) else None, notes=tuple(notes),
            ipc_namespace="--ipc" in chosen.flags, uts_namespace="--uts" in chosen.flags,
            memory_cgroup="memory" in cgroups.bases,
            seccomp=chosen.seccomp,
        )
        logger.info("sandbox isolation: %s", iso.summary())
        missing = [what for what, on in (
            ("network namespace", iso.network_namespace), ("pid namespace", iso.pid_namespace),
            ("own root file system (the code can read the host's files, site-packages included)",
             iso.mount_namespace), ("IPC namespace", iso.ipc_namespace),
            ("memory cgroup (memory is capped per process, not per run)", iso.memory_cgroup),
            ("seccomp filter", iso.seccomp)) if not on]
        if missing:
            logger.warning("sandbox: missing on this machine: %s (%s)", "; ".join(missing), "; ".join(notes))
        if not (chosen.pid_namespace or chosen.uid_drop):
            logger.warning("sandbox: no pid namespace and no separate uid: sandboxed code can signal the "
                           "trainer's processes and escape the group kill with setsid")
        elif root and not chosen.uid_drop:
            logger.warning("sandbox: running as root without a separate uid: RLIMIT_NPROC is not enforced "
                           "and the code can write anything root can")
        _probed = (chosen, iso, cgroups)
        return _probed
