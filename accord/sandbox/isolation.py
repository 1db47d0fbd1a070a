"""What the sandbox can isolate on this machine, measured once per process, and the pieces runs use:
the namespace plan, the sandbox's root file system, per-run uids and per-run cgroups.

Layers, best first (each is probed by running a real program through it; a layer the kernel refuses
is named once, at the first sandbox's start, in a warning and in :attr:`Isolation.notes`):

- namespaces: pid (with ``--kill-child``), mount, network, IPC (SysV shared memory, semaphores and
  message queues die with the run) and UTS (hostname ``sandbox``); as a non-root user also a user
  namespace (``--map-root-user``), which is what allows the mounts;
- a root file system of its own (``pivot_root``): the standard library, the interpreter, ``/usr`` for
  shared libraries -- every ``site-packages``/``dist-packages`` covered -- and nothing else of the host;
- a per-run uid (root only) with no capabilities, ``no_new_privs`` and a seccomp filter (no AF_VSOCK
  sockets, no io_uring, no syscalls of a foreign ABI);
- a per-run memory cgroup (root with a writable cgroup v1 ``memory`` controller): one memory cap for all
  processes of the run and the files they write to its tmpfs mounts (processes are capped by the run's
  uid and pid namespace).
"""

from __future__ import annotations

import ast
import atexit
import glob
import itertools
import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass

from accord.sandbox.harness import parse_source

logger = logging.getLogger(__name__)

UIDS_PER_PROCESS = 256
_NS_FLAGS = ("--pid", "--fork", "--kill-child", "--mount", "--ipc", "--uts")
_USER_FLAGS = ("--user", "--map-root-user")


@dataclass(frozen=True)
class Isolation:
    """What containment the sandbox achieves on this machine (measured by :func:`probe_isolation`)."""

    root: bool  #: the trainer runs as root
    uid_drop: bool  #: each run gets its own unprivileged uid (root only)
    user_namespace: bool  #: unshare --user --map-root-user (non-root only)
    pid_namespace: bool  #: unshare --pid --fork --kill-child
    mount_namespace: bool  #: a root file system of its own (standard library and working directory only)
    network_namespace: bool  #: unshare --net works (used unless SandboxConfig.network)
    unshare: str | None = None  #: path of the unshare binary used
    notes: tuple[str, ...] = ()  #: what is missing and why
    ipc_namespace: bool = False  #: unshare --ipc (SysV IPC objects die with the run)
    uts_namespace: bool = False  #: unshare --uts
    memory_cgroup: bool = False  #: one memory cap for the whole run (cgroup v1 memory controller)
    seccomp: bool = False  #: AF_VSOCK sockets, io_uring and foreign-ABI syscalls refused

    def summary(self) -> str:
        parts = [name for name, on in (
            ("root", self.root), ("uid-drop", self.uid_drop), ("userns", self.user_namespace),
            ("pidns", self.pid_namespace), ("mountns", self.mount_namespace), ("netns", self.network_namespace),
            ("ipcns", self.ipc_namespace), ("utsns", self.uts_namespace), ("memcg", self.memory_cgroup),
            ("seccomp", self.seccomp)) if on]
        return "+".join(parts) or "none"


@dataclass(frozen=True)
class Plan:
    """How runs are started: unshare flags (without --net), uid drop, own root, --net, seccomp."""

    unshare: str | None
    flags: tuple[str, ...]
    uid_drop: bool
    mounts: bool
    net: bool
    seccomp: bool = True

    @property
    def pid_namespace(self) -> bool:
        return "--pid" in self.flags

    def describe(self) -> str:
        parts = [" ".join(self.flags) or "no unshare", "uid drop" if self.uid_drop else "same uid",
                 "own root" if self.mounts else "host file system"]
        return ", ".join(parts)


def candidate_plans(root: bool, unshare: str | None) -> list[Plan]:
    """Setups to probe, best first."""
    plans = []
    if unshare:
        base = () if root else _USER_FLAGS
        for uid_drop in ((True, False) if root else (False,)):
            plans.append(Plan(unshare, base + _NS_FLAGS, uid_drop, True, False))
            plans.append(Plan(unshare, base + _NS_FLAGS, uid_drop, False, False))
            plans.append(Plan(unshare, base + ("--pid", "--fork", "--kill-child", "--mount"), uid_drop, False, False))
        if not root:
            plans.append(Plan(unshare, _USER_FLAGS, False, False, False))
    for uid_drop in ((True, False) if root else (False,)):
        plans.append(Plan(None, (), uid_drop, False, False))
    return plans


def find_unshare() -> str | None:
    return shutil.which("unshare") or next((p for p in ("/usr/bin/unshare", "/bin/unshare")
                                            if os.access(p, os.X_OK)), None)


# --------------------------------------------------------------------------------------------------
# The sandbox's root file system
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RootSpec:
    binds: tuple[tuple[str, bool], ...]  #: (host path, is a directory), bound read-only at the same path
    covers: tuple[str, ...]  #: directories under the binds hidden by an empty read-only tmpfs
    links: tuple[tuple[str, str], ...]  #: (path, target) symlinks of the root (/bin -> usr/bin ...)


_spec_cache: dict[bool, RootSpec] = {}
_spec_lock = threading.Lock()


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _topmost(paths: set[str]) -> list[str]:
    out: list[str] = []
    for d in sorted(paths):  # sorted: a parent comes before its children
        if not any(_inside(d, m) for m in out):
            out.append(d)
    return out


def _interpreter_path(site_packages: bool) -> list[str]:
    """``sys.path`` of ``python -I [-S]``, asked from a real child (the trainer's own ``sys.path`` holds
    its script or working directory, which must not be exposed)."""
    argv = [sys.executable, "-I", *([] if site_packages else ["-S"]), "-c", "import sys; print(repr(sys.path))"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, cwd="/",
                             env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}).stdout
        paths = ast.literal_eval(parse_source(out.strip(), mode="eval"))   # maybe on the sandbox's thread pool
    except (OSError, subprocess.SubprocessError, ValueError, SyntaxError) as exc:
        logger.warning("sandbox: cannot ask the interpreter for its sys.path (%s); using its prefix only", exc)
        paths = []
    return [p for p in paths if isinstance(p, str) and p]


def root_spec(site_packages: bool) -> RootSpec:
    """What the sandbox's root holds (computed once per process and setting)."""
    with _spec_lock:
        if site_packages in _spec_cache:
            return _spec_cache[site_packages]
        binary = os.path.realpath(sys.executable)
        dirs = {os.path.realpath(p) for p in _interpreter_path(site_packages) if os.path.isdir(p)}
        dirs.add(os.path.realpath(os.path.join(sys.base_prefix, "lib")))  # libpython, if shared
        dirs.add("/usr")
        links, top = [], []
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = "/" + name
            if os.path.islink(path):
                links.append((path, os.readlink(path)))
            elif os.path.isdir(path):
                dirs.add(path)
        dirs = {d for d in dirs if os.path.isdir(d)}
        top = _topmost(dirs)
        binds = [(d, True) for d in top]
        for extra in (binary, "/etc/ld.so.cache"):
            if os.path.isfile(extra) and not any(_inside(extra, d) for d in top):
                binds.append((extra, False))
        allowed = {os.path.realpath(p) for p in _interpreter_path(True)} if site_packages else set()
        found: set[str] = set()
        for d in top:
            for pattern in ("site-packages", "dist-packages", "*/site-packages", "*/dist-packages",
                            "lib/python3*/site-packages", "lib/python3*/dist-packages",
                            "local/lib/python3*/site-packages", "local/lib/python3*/dist-packages",
                            "lib/python3/dist-packages"):
                for hit in glob.glob(os.path.join(d, pattern)):
                    real = os.path.realpath(hit)
                    if os.path.isdir(real) and _inside(real, d) and real not in allowed:
                        found.add(real)
        spec = RootSpec(tuple(binds), tuple(_topmost(found)), tuple(links))
        _spec_cache[site_packages] = spec
        logger.debug("sandbox root: binds %s, covers %s, links %s", spec.binds, spec.covers, spec.links)
        return spec


# --------------------------------------------------------------------------------------------------
# Per-run uids (root only)
# --------------------------------------------------------------------------------------------------
class UidPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}

    def acquire(self, base: int) -> int:
        with self._lock:
            free = self._free.setdefault(base, list(range(base + UIDS_PER_PROCESS - 1, base - 1, -1)))
            if not free:
                raise RuntimeError(f"more than {UIDS_PER_PROCESS} concurrent sandbox runs")
            return free.pop()

    def release(self, base: int, uid: int) -> None:
        with self._lock:
            self._free[base].append(uid)


UIDS = UidPool()


def default_uid_base() -> int:
    return 1_000_000_000 + (os.getpid() % 100_000) * UIDS_PER_PROCESS


# --------------------------------------------------------------------------------------------------
# Per-run cgroups (cgroup v1 memory controller, root only)
# --------------------------------------------------------------------------------------------------
_CGROUP_ROOT = "/sys/fs/cgroup"


def _own_cgroup(controller: str) -> str | None:
    """Directory of this process' cgroup of ``controller`` (cgroup v1), or None."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            for mount in (os.path.join(_CGROUP_ROOT, controller), os.path.join(_CGROUP_ROOT, parts[1])):
                path = mount + parts[2]
                if os.path.isdir(path):
                    return path
    return None


def _remove_stale(parent: str) -> None:
    """Remove the per-process directories of accord processes that no longer exist."""
    for entry in glob.glob(os.path.join(parent, "accord-sbx-*")):
        try:
            pid = int(entry.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            for run in glob.glob(os.path.join(entry, "r*")):
                _rmdir(run)
            if _rmdir(entry):
                logger.info("sandbox: removed the stale cgroup %s of an earlier process", entry)


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


class _Spawner:
    """A thread that lives in one slot's cgroups and starts that slot's runs.

    Joining a cgroup v1 hierarchy waits for an RCU grace period (about 8 ms of wall time here). A
    process is born in the cgroup of the thread that forks it, and cgroup v1 can hold single threads:
    so each slot's thread joins once (``tasks``), and every run it starts is in the slot from its first
    instruction, with no migration per run. Memory is charged by process, so the trainer's own memory
    stays where it was."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._ready = threading.Event()
        self.error: OSError | None = None
        self.tid: int | None = None
        threading.Thread(target=self._loop, args=(paths,), name="accord-sandbox-spawner", daemon=True).start()
        self._ready.wait()

    def _loop(self, paths: tuple[str, ...]) -> None:
        self.tid = threading.get_native_id()
        try:
            for path in paths:
                _write(path, "tasks", threading.get_native_id())
        except OSError as exc:
            self.error = exc
        self._ready.set()
        while True:
            fn, box, done = self._jobs.get()
            try:
                box.append(fn())
            except BaseException as exc:  # handed to the calling thread, which raises it
                box.append(exc)
            done.set()

    def call(self, fn):
        box: list = []
        done = threading.Event()
        self._jobs.put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


class Slot:
    """One run's cgroups: their directories and the spawner thread that starts runs inside them (None where
    a thread cannot join them: the runner joins them itself before it forks)."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        self.memory_bytes: int | None = None
        spawner = _Spawner(paths)
        self.spawner = spawner if spawner.error is None else None
        if spawner.error is not None:
            logger.debug("sandbox: a thread cannot join %s (%s); runs join it themselves", paths, spawner.error)

    def spawn(self, fn):
        """``fn()`` (a ``subprocess.Popen``) called so that its process starts in the slot's cgroups."""
        return self.spawner.call(fn) if self.spawner is not None else fn()


class Cgroups:
    """Per-run cgroups under ``<own cgroup>/accord-sbx-<pid>/`` (the memory controller).

    A run takes a slot (a cgroup per controller) from a pool and gives it back afterwards, so that
    concurrent runs never share one; slots are reused rather than removed, since removing a cgroup waits
    for its last dying task. The OOM count of a slot is cumulative: a run reads it before and after.
    """

    def __init__(self) -> None:
        self.bases: dict[str, str] = {}
        self.notes: list[str] = []
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._free: list[Slot] = []
        self._slots: list[Slot] = []
        self._parents: dict[str, str] = {}
        if os.geteuid() != 0:
            self.notes.append("not root: no per-run cgroups (memory is capped per process by RLIMIT_AS)")
            return
        # The memory controller only: processes are capped by the run's own uid (RLIMIT_NPROC) and pid
        # namespace already, and each hierarchy's cgroup costs a thread migration per slot.
        for controller in ("memory",):
            own = _own_cgroup(controller)
            if own is None:
                self.notes.append(f"no cgroup v1 {controller} controller mounted under {_CGROUP_ROOT}")
                continue
            base = os.path.join(own, f"accord-sbx-{os.getpid()}")
            try:
                _remove_stale(own)
                os.makedirs(base, exist_ok=True)
                probe = os.path.join(base, "probe")
                os.mkdir(probe)
                with open(os.path.join(probe, "memory.limit_in_bytes"), "w") as fh:
                    fh.write("104857600")
                os.rmdir(probe)
            except OSError as exc:
                self.notes.append(f"cannot create {controller} cgroups under {own}: {exc.strerror}")
                _rmdir(base)
                continue
            self.bases[controller] = base
            self._parents[base] = own
        if self.bases:
            atexit.register(self._cleanup)

    def acquire(self, memory_bytes: int) -> Slot:
        """A free slot with the run's memory limit set."""
        with self._lock:
            slot = self._free.pop() if self._free else None
            name = None if slot is not None else f"r{next(self._counter)}"
        if slot is None:
            made = []
            try:
                for base in self.bases.values():
                    path = os.path.join(base, name)
                    os.mkdir(path)
                    made.append(path)
            except OSError:
                for path in made:
                    _rmdir(path)
                raise
            slot = Slot(tuple(made))
            with self._lock:
                self._slots.append(slot)
        if slot.memory_bytes != memory_bytes:
            for path in slot.paths:
                # cgroup v1 keeps memory <= memory+swap: lower the memory limit first, raise memsw first
                names = ["memory.limit_in_bytes"]
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    names.append("memory.memsw.limit_in_bytes")
                    if memory_bytes > _read_int(path, "memory.limit_in_bytes"):
                        names.reverse()
                for limit in names:
                    _write(path, limit, memory_bytes)
            slot.memory_bytes = memory_bytes
        return slot

    def release(self, slot: Slot) -> None:
        with self._lock:
            self._free.append(slot)

    @staticmethod
    def oom_kills(slot: Slot) -> int:
        """The kernel OOM killer's count in the slot's memory cgroup (cumulative over the slot's runs)."""
        for path in slot.paths:
            try:
                with open(os.path.join(path, "memory.oom_control"), encoding="ascii") as fh:
                    for line in fh:
                        if line.startswith("oom_kill "):
                            return int(line.split()[1])
            except (OSError, ValueError):
                continue
        return 0

    def _cleanup(self) -> None:
        for slot in self._slots:  # a spawner thread still lives in its slot: move it out first
            if slot.spawner is not None and slot.spawner.tid is not None:
                for base in self.bases.values():
                    try:
                        _write(self._parents[base], "tasks", slot.spawner.tid)
                    except OSError:
                        pass
        for base in self.bases.values():
            for run in glob.glob(os.path.join(base, "r*")):
                _rmdir(run)
            _rmdir(base)


def _read_int(path: str, name: str) -> int:
    with open(os.path.join(path, name), encoding="ascii") as fh:
        return int(fh.read().strip())


def _write(path: str, name: str, value: int) -> None:
    with open(os.path.join(path, name), "w") as fh:
        fh.write(str(int(value)))
