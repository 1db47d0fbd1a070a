"""The sandbox's child runner: the only code of accord that runs inside a sandbox.

The parent (:mod:`accord.sandbox.supervise`) compiles this file once and writes the code object into
each run's job file; ``python -I -S -c <bootstrap> <job file>`` loads both and calls :func:`main`. So
the file itself is never exposed inside the sandbox, and everything here uses only builtin and
standard-library modules (the sandbox sees nothing else). The module is importable for tests and
linters.

A run has two processes in the sandbox's pid namespace:

- the **runner** (pid 1, still root when the trainer is root): reads and deletes its job file, joins the
  run's cgroups, builds the sandbox's file system (below), forks the worker, reaps every process the code
  leaves behind and reports the worker's exit status;
- the **worker**: sets the resource limits, drops to the run's uid, sets ``no_new_privs``, installs the
  seccomp filter, then does the job's ``mode``:

  ``exec``   run the program as ``__main__``;
  ``calls``  run the program, then call its function on each input (plain data) and report each return
             value as plain data, or the exception it raised -- the only thing a candidate hands back;
  ``plan``   (trusted code only) run reference tests against the reference program and record the inputs
             of every call of the function under test, and the expected values of simple asserts
             (without a reference: evaluate the arguments of the calls, see ``harness.static_calls``);
  ``judge``  (trusted code only) replay reference tests against one candidate's recorded return values.

File system: a fresh tmpfs becomes the root (``pivot_root``; the host's tree is detached, not just
hidden). Into it are bound, read-only, only the directories the interpreter needs (the standard library,
the interpreter binary, ``/usr`` for shared libraries), with every ``site-packages``/``dist-packages``
under them covered by an empty read-only tmpfs; ``/dev`` holds only ``null``, ``zero``, ``full``,
``random`` and ``urandom``; ``/proc`` is the pid namespace's own; ``/tmp`` and ``/dev/shm`` are small
private tmpfs (an interpreter path under them, e.g. a venv in ``/tmp``, is bound on top, read-only);
the working directory ``/sandbox`` is a size-capped tmpfs holding the program and the
caller's files.

Reports go to two inherited pipes, one line per event, tagged with a per-run nonce (see :func:`main`):
the runner's control channel, closed in the worker before any code of the job runs, and the worker's
channel. A candidate can write any event it likes to the second, which amounts to claiming return
values; every verdict is computed outside its process, and its status from the control channel.
"""

from __future__ import annotations

import marshal
import os
import sys

# --------------------------------------------------------------------------------------------------
# Plain data, child side: values -> JSON text with tags (no json import: it costs ~8 ms per start).
# The parent decodes with accord.sandbox.plain.decode, which is the strict half.
# --------------------------------------------------------------------------------------------------
MAX_DEPTH = 64
MAX_ITEMS = 100_000


class Unencodable(Exception):
    """A value that is not plain data (or too deep/large); the message names what was found."""


MAX_STR = 1 << 20  # the parent refuses longer encoded values anyway


def _json_str(value):
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return '"' + value + '"'  # the common case, at C speed
    out = ['"']
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
    out.append('"')
    return "".join(out)


def encode(value):
    """``value`` as tagged JSON: exact builtin types only (subclasses are refused), bounded depth and size.

    null/true/false, ints and finite floats as JSON numbers, str as JSON strings, list as arrays; tagged
    one-key objects for the rest: ``{"t": [...]}`` tuple, ``{"d": [[k, v], ...]}`` dict, ``{"s": [...]}``
    set, ``{"f": [...]}`` frozenset, ``{"b": "hex"}`` bytes, ``{"c": [re, im]}`` complex, ``{"F": "nan"}``
    (or ``"inf"``, ``"-inf"``) float.
    """
    count = [0]

    def enc(v, depth):
        count[0] += 1
        if count[0] > MAX_ITEMS:
            raise Unencodable("more than %d items" % MAX_ITEMS)
        if depth > MAX_DEPTH:
            raise Unencodable("nested deeper than %d" % MAX_DEPTH)
        t = type(v)
        if v is None:
            return "null"
        if t is bool:
            return "true" if v else "false"
        if t is int:
            try:
                return int.__repr__(v)
            except ValueError:  # beyond the interpreter's int-to-str digit limit
                raise Unencodable("an int too large to print") from None
        if t is float:
            if v != v:
                return '{"F":"nan"}'
            if v in (float("inf"), float("-inf")):
                return '{"F":"%s"}' % ("inf" if v > 0 else "-inf")
            return float.__repr__(v)
        if t is str:
            if len(v) > MAX_STR:
                raise Unencodable("a string longer than %d characters" % MAX_STR)
            return _json_str(str.__str__(v))
        if t is list:
            return "[" + ",".join([enc(x, depth + 1) for x in list.copy(v)]) + "]"
        if t is tuple:
            return '{"t":[' + ",".join([enc(x, depth + 1) for x in v]) + "]}"
        if t is dict:
            items = dict.copy(v).items()
            return '{"d":[' + ",".join(["[" + enc(k, depth + 1) + "," + enc(x, depth + 1) + "]"
                                        for k, x in items]) + "]}"
        if t is set or t is frozenset:
            tag = "s" if t is set else "f"
            return '{"%s":[' % tag + ",".join([enc(x, depth + 1) for x in list(v)]) + "]}"
        if t is bytes:
            return '{"b":"%s"}' % bytes.hex(v)
        if t is complex:
            return '{"c":[' + enc(v.real, depth + 1) + "," + enc(v.imag, depth + 1) + "]}"
        raise Unencodable("a value of type " + _type_name(t))

    return enc(value, 0)


def _type_name(t):
    try:
        name = type.__getattribute__(t, "__qualname__")
        return name if type(name) is str else "?"
    except BaseException:  # a hostile metaclass: anything may raise here
        return "?"


def describe(exc):
    """``Type: message`` of an exception, at most 300 characters, whatever its ``__str__`` does."""
    try:
        text = str(exc)
        if type(text) is not str:
            text = "<unprintable>"
    except BaseException:  # a candidate-defined __str__ may raise anything
        text = "<unprintable>"
    name = _type_name(type(exc))
    return (name + ": " + text if text else name)[:300]


def event_line(tag, event):
    """One report line: ``tag`` + a flat JSON object of str keys and None/bool/int/str values."""
    parts = []
    for key, value in event.items():
        if value is None:
            text = "null"
        elif value is True:
            text = "true"
        elif value is False:
            text = "false"
        elif type(value) is int:
            text = str(value)
        else:
            text = _json_str(value)
        parts.append(_json_str(key) + ":" + text)
    return tag + ("{" + ",".join(parts) + "}").encode() + b"\n"


# --------------------------------------------------------------------------------------------------
# The runner: cgroups, the sandbox's root file system, the worker.
# --------------------------------------------------------------------------------------------------
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MNT_DETACH = 2
EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
_NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
# Per machine: its audit arch, then syscall numbers. Refused in the worker: namespaces of its own (unshare,
# setns, clone with namespace flags; clone3 with ENOSYS so that libc falls back to clone), the kernel
# keyrings (a key outlives the run and is readable by later runs of the same uid), mount changes (old and
# new mount API),
# ptrace and reading other processes' memory, bpf, perf events, userfaultfd, io_uring (it bypasses
# seccomp), AF_VSOCK sockets (vsock ignores network namespaces) and any syscall of another ABI; and the ways
# runs at the same time could talk through the read-only files they all see (the standard library, /usr): file
# locks (flock; fcntl's record, open-file-description and lease commands, F_NOTIFY) and inotify/fanotify
# watches: through them a wrong program could read a correct sibling's answers, and a run on the hidden tests
# could tell the run on the examples their inputs, which the feedback shows. For the same reason, what evicts
# a shared file's pages from the page cache or tells whether they are there without reading them (fadvise,
# readahead, mincore, cachestat, madvise's MADV_COLD and MADV_PAGEOUT, process_madvise; preadv2 and pwritev2
# with ENOSYS, for RWF_NOWAIT, so that libc falls back to preadv): timed reads of pages one run evicted and
# another brought back carried answers too. A page's first read is still slower than its next (see
# docs/sandbox.md).
_PAGE_CACHE = {"cachestat": 451, "process_madvise": 440}   # the same numbers on every architecture
_NEW_MOUNT_API = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
                  "mount_setattr": 442}  # the same numbers on every architecture
_SYSCALLS = {
    "x86_64": {"arch": 0xC000003E, "pivot_root": 155, "socket": 41, "socketpair": 53, "clone": 56,
               "mount_setattr": 442, "capset": 126,
               "deny": {"unshare": 272, "setns": 308, "add_key": 248, "request_key": 249, "keyctl": 250,
                        "mount": 165, "umount2": 166, "pivot_root": 155, "ptrace": 101, "process_vm_readv": 310,
                        "process_vm_writev": 311, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, **_NEW_MOUNT_API,
                        "flock": 73, "inotify_init": 253, "inotify_init1": 294, "inotify_add_watch": 254,
                        "fanotify_init": 300, "fanotify_mark": 301, **_PAGE_CACHE,
                        "fadvise64": 221, "readahead": 187, "mincore": 27},
               "fcntl": 72, "madvise": 28, "enosys": {"clone3": 435, "preadv2": 327, "pwritev2": 328}},
    "aarch64": {"arch": 0xC00000B7, "pivot_root": 41, "socket": 198, "socketpair": 199, "clone": 220,
                "mount_setattr": 442, "capset": 91,
                "deny": {"unshare": 97, "setns": 268, "add_key": 217, "request_key": 218, "keyctl": 219,
                         "mount": 40, "umount2": 39, "pivot_root": 41, "ptrace": 117, "process_vm_readv": 270,
                         "process_vm_writev": 271, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
                         "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, **_NEW_MOUNT_API,
                         "flock": 32, "inotify_init1": 26, "inotify_add_watch": 27, "fanotify_init": 262,
                         "fanotify_mark": 263, **_PAGE_CACHE, "fadvise64": 223, "readahead": 213, "mincore": 232},
                "fcntl": 25, "madvise": 233, "enosys": {"clone3": 435, "preadv2": 286, "pwritev2": 287}},
}
# fcntl's commands that lock, lease or watch a file (F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK,
# F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY): refused, the file descriptor commands stay
FCNTL_REFUSED = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
MADVISE_REFUSED = (20, 21)   # MADV_COLD, MADV_PAGEOUT: they push a mapped file's pages out of memory
DEVICES = ("null", "zero", "full", "random", "urandom")
WORKDIR = "/sandbox"


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


class _Mounter:
    def __init__(self):
        self.ctypes, self.libc = _libc()

    def _fail(self, what, target):
        err = self.ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)), target)

    def mount(self, source, target, fstype, flags, data=None):
        src = source.encode() if isinstance(source, str) else source
        typ = fstype.encode() if isinstance(fstype, str) else fstype
        dat = data.encode() if isinstance(data, str) else data
        if self.libc.mount(src, target.encode(), typ, flags, dat) != 0:
            self._fail("mount", target)

    def bind_ro(self, source, target):
        """Bind ``source`` (with every mount below it) at ``target``, all of it read-only, nosuid, nodev."""
        self.mount(source, target, None, MS_BIND | MS_REC)
        self.mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        if self._setattr_recursive(target):
            return
        for sub in _submounts(target):  # kernels before 5.12: remount each mount below the target too
            self.mount(None, sub, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

    def _setattr_recursive(self, target):
        """``mount_setattr(AT_RECURSIVE)`` read-only/nosuid/nodev; False where the kernel lacks it."""
        number = _SYSCALLS.get(os.uname().machine, {}).get("mount_setattr")
        if number is None:
            return False
        attr = (self.ctypes.c_uint64 * 4)(0x1 | 0x2 | 0x4, 0, 0, 0)  # MOUNT_ATTR_RDONLY | NOSUID | NODEV
        if self.libc.syscall(number, -100, target.encode(), 0x8000, self.ctypes.byref(attr), 32) == 0:
            return True
        if self.ctypes.get_errno() == 38:  # ENOSYS
            return False
        self._fail("mount_setattr", target)

    def tmpfs(self, target, options, readonly=False):
        self.mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)
        if readonly:
            self.mount(None, target, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, options)


def _submounts(target):
    """Mount points strictly below ``target`` (from /proc/self/mountinfo), outermost first."""
    prefix = target.rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                found.append(point)
    return sorted(set(found), key=len)


def _make_target(path, is_dir):
    if is_dir:
        os.makedirs(path, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def _copy_tree(src, dst, uid):
    for dirpath, _dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target_dir = dst if rel == "." else os.path.join(dst, rel)
        os.makedirs(target_dir, 0o755, exist_ok=True)
        if uid is not None:
            os.chown(target_dir, uid, uid)
        for name in filenames:
            target = os.path.join(target_dir, name)
            with open(os.path.join(dirpath, name), "rb") as fin, open(target, "wb") as fout:
                fout.write(fin.read())
            if uid is not None:
                os.chown(target, uid, uid)


def build_root(job):
    """Make the sandbox's file system and ``pivot_root`` into it (see the module docstring)."""
    spec = job["root"]
    m = _Mounter()
    new = spec["dir"]
    m.tmpfs(new, "mode=755,size=1m")
    # The interpreter's own paths may lie under /tmp or /dev/shm (a checkout or venv in /tmp): those are
    # bound (and covered) after the private tmpfs mounts, on top of them, or the tmpfs would hide them.
    private = ("/tmp/", "/dev/shm/")
    for late in (False, True):
        if late:
            for path in ("/tmp", "/dev/shm"):
                os.makedirs(new + path, 0o755, exist_ok=True)
                m.tmpfs(new + path, "mode=1777,size=%dm,nr_inodes=4096" % job["tmpfs_mb"])
        for path, is_dir in spec["binds"]:
            if path.startswith(private) == late:
                target = new + path
                _make_target(target, is_dir)
                m.bind_ro(path, target)
        for path in spec["covers"]:  # site-packages and the like under the bound trees: empty and read-only
            if path.startswith(private) == late:
                m.tmpfs(new + path, "mode=755,size=4k", readonly=True)
    for link, dest in spec["links"]:
        os.symlink(dest, new + link)
    for name in DEVICES:
        _make_target(new + "/dev/" + name, False)
        m.mount("/dev/" + name, new + "/dev/" + name, None, MS_BIND)
    os.symlink("/proc/self/fd", new + "/dev/fd")
    os.makedirs(new + "/proc", 0o755, exist_ok=True)
    m.mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")  # runner hidden
    work = new + WORKDIR
    os.makedirs(work, 0o755, exist_ok=True)
    m.tmpfs(work, "mode=755,size=%dm,nr_inodes=%d" % (job["disk_mb"], job["max_files"]))
    _copy_tree(spec["files"], work, job["uid"])
    uid = job["uid"] if job["uid"] is not None else 0
    os.makedirs(new + "/etc", 0o755, exist_ok=True)
    with open(new + "/etc/passwd", "w") as fh:  # for pwd.getpwuid(os.getuid()) and the like
        fh.write("root:x:0:0::/root:/bin/sh\nsandbox:x:%d:%d::%s:/bin/sh\n" % (uid, uid, WORKDIR))
    with open(new + "/etc/group", "w") as fh:
        fh.write("root:x:0:\nsandbox:x:%d:\n" % uid)
    _EXECUTABLE[0] = spec["python"]
    m.mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=755,size=1m")
    numbers = _SYSCALLS.get(os.uname().machine)
    if numbers is None:
        raise OSError(0, "pivot_root: unknown machine " + os.uname().machine, new)
    os.chdir(new)
    if m.libc.syscall(numbers["pivot_root"], b".", b".") != 0:  # the old root ends up stacked on top: detach it
        m._fail("pivot_root", new)
    if m.libc.umount2(b".", MNT_DETACH) != 0:
        m._fail("umount2", "/")
    os.chdir(WORKDIR)


def _join_cgroups(paths):
    for path in paths:
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write("0")


def seccomp_program(machine):
    """The worker's seccomp filter as classic BPF ``(code, jt, jf, k)`` instructions (see ``_SYSCALLS``)."""
    table = _SYSCALLS[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno = 0x7FFF0000, 0x00050000
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, table["arch"]), (ret, 0, 0, errno | EPERM),  # another ABI: refused
            (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, errno | EPERM)]     # x32: refused
    for action, numbers in ((errno | EPERM, table["deny"]), (errno | ENOSYS, table["enosys"])):
        for nr in sorted(set(numbers.values())):
            prog += [(jeq, 0, 1, nr), (ret, 0, 0, action)]
    for name in ("socket", "socketpair"):  # args[0] (low half) is the address family
        prog += [(jeq, 0, 4, table[name]), (ld, 0, 0, 16), (jeq, 0, 1, 40), (ret, 0, 0, errno | EAFNOSUPPORT),
                 (ld, 0, 0, 0)]
    prog += [(jeq, 0, 4, table["clone"]), (ld, 0, 0, 16), (jset, 0, 1, _NAMESPACE_FLAGS),
             (ret, 0, 0, errno | EPERM), (ld, 0, 0, 0)]
    # fcntl's commands (args[1], its low half at offset 24) and madvise's advice (args[2], at 32) that are refused:
    # past the syscall's number, the argument is loaded, compared with each value, and the number loaded again
    for name, offset, refused in (("fcntl", 24, FCNTL_REFUSED), ("madvise", 32, MADVISE_REFUSED)):
        prog += [(jeq, 0, 2 * len(refused) + 2, table[name]), (ld, 0, 0, offset)]
        for value in refused:
            prog += [(jeq, 0, 1, value), (ret, 0, 0, errno | EPERM)]
        prog.append((ld, 0, 0, 0))
    prog.append((ret, 0, 0, allow))
    return prog


def _seccomp(libc, ctypes):
    """Install :func:`seccomp_program`; returns None, or why it is not installed."""
    machine = os.uname().machine
    if machine not in _SYSCALLS:
        return "unknown machine " + machine
    program = seccomp_program(machine)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*[Filter(*ins) for ins in program])
    prog = Program(len(program), filters)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return "seccomp: " + os.strerror(ctypes.get_errno())
    return None


def _drop_bounding_set(libc):
    """Empty the capability bounding set and lock the securebits (both need CAP_SETPCAP: done while the
    worker still has it), so that no capability can come back, through exec or otherwise."""
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; fails with EINVAL past the last capability
    # SECBIT_NOROOT, NO_SETUID_FIXUP and their locks, KEEP_CAPS locked off
    libc.prctl(28, 0x1 | 0x2 | 0x4 | 0x8 | 0x20, 0, 0, 0)  # PR_SET_SECUREBITS


def _drop_capabilities(libc, ctypes):
    """Empty the effective, permitted and inheritable sets, so that even a worker that is uid 0 (in a user
    namespace) holds no capability: it cannot reach the runner's files in /proc or remount anything."""
    numbers = _SYSCALLS.get(os.uname().machine)
    if numbers is not None:
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: two 32-bit words each, all empty
        if libc.syscall(numbers["capset"], ctypes.byref(header), ctypes.byref(data)) != 0:
            raise OSError(ctypes.get_errno(), "capset")


def _limit_and_drop(job):
    """Limits, oom_score_adj, the run's uid, no_new_privs, seccomp; returns why seccomp is missing, if it is."""
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
    _drop_bounding_set(libc)
    uid = job["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _drop_capabilities(libc, ctypes)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL: die with the runner
    return _seccomp(libc, ctypes) if job["seccomp"] else None


def _print_exception(exc, skip):
    import traceback

    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    try:
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    except BaseException:  # printing a candidate's exception runs candidate code (__str__)
        sys.stderr.write(_type_name(type(exc)) + "\n")


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


def _new_main(filename):
    import builtins
    import types

    if _EXECUTABLE[0]:  # the trainer's path (a venv's link, say) may not exist here; the interpreter does
        sys.executable = sys._base_executable = _EXECUTABLE[0]

    module = types.ModuleType("__main__")
    module.__file__ = filename
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [filename]
    return module.__dict__


def _run_program(job, report, namespace):
    """Compile and run the job's program in ``namespace``; exits the worker on a failure."""
    try:
        code = compile(job["code"], job["filename"], "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        report(e="syntax", error=describe(exc))
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        sys.exit(1)
    memory_line = report(e="exc", type="MemoryError", encode_only=True)
    write, fd = os.write, job["report_fd"]
    try:
        exec(code, namespace)
    except SystemExit:
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
        report(e="exc", type=_type_name(type(exc)))
        _print_exception(exc, 1)
        sys.exit(1)


def _calls(job, report, namespace):
    """Call the program's function on every input; report each return value (plain data) or exception."""
    fn = namespace.get(job["function"])
    if fn is None:
        report(e="nofunc")
        return
    loads = marshal.loads
    for index, packed in enumerate(job["calls"]):
        args, kwargs = loads(packed)  # fresh objects for every call: a candidate may mutate its inputs
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:  # a call fails on anything the candidate raises, SystemExit included
            report(e="call", i=index, ok=False, err=describe(exc))
            continue
        try:
            text = encode(value)
        except Unencodable as exc:
            report(e="call", i=index, ok=False, err="not plain data: " + str(exc))
            continue
        except BaseException as exc:  # e.g. RecursionError or a MemoryError while encoding
            report(e="call", i=index, ok=False, err="not plain data: " + describe(exc))
            continue
        report(e="call", i=index, ok=True, v=text)


_EXECUTABLE = [None]


class _Diverged(AssertionError):
    """The replayed test left the path it took when it was planned (or the program stopped early)."""


class CallFailed(Exception):
    """The candidate's call raised (in its own process); the message is what it raised."""


def _trusted_context(job):
    """Namespace with the trusted setup code and reference program run in it (plan and judge modes)."""
    import random

    namespace = _new_main(job["filename"])
    for source in job["context"]:
        exec(compile(source, "<reference>", "exec", dont_inherit=True), namespace)
    random.seed(0)
    return namespace, random


def _plan(job, report):
    namespace, random = _trusted_context(job)
    function = namespace.get(job["function"]) if job["has_reference"] else None
    binding = job["binding"]
    recorded = []

    def pack(*args, **kwargs):
        return args, kwargs

    def recorder(*args, **kwargs):
        recorded.append(encode((list(args), kwargs)))
        if function is None:
            raise _Diverged("the tests call the function in a way that needs a reference solution to plan")
        return function(*args, **kwargs)

    namespace["__accord_pack__"] = pack
    for index, item in enumerate(job["statements"]):
        source, kind, args_src, expected_src = item
        random.seed(index)
        recorded.clear()
        namespace[binding] = recorder
        event = {"e": "stmt", "i": index}
        try:
            if kind == "static":  # no reference: the calls' arguments, in call order (harness.static_calls)
                for args, kwargs in eval(compile(args_src, "<args %d>" % index, "eval", dont_inherit=True), namespace):
                    recorded.append(encode((list(args), kwargs)))
            elif kind == "simple":
                args, kwargs = eval(compile(args_src, "<args %d>" % index, "eval", dont_inherit=True), namespace)
                recorded.append(encode((list(args), kwargs)))
                event["expected"] = encode(eval(compile(expected_src, "<expected %d>" % index, "eval",
                                                        dont_inherit=True), namespace))
                if job["has_reference"]:
                    random.seed(index)
                    calls = len(recorded)
                    try:
                        exec(compile(source, "<test %d>" % index, "exec", dont_inherit=True), namespace)
                        event["ref_ok"] = True
                    except BaseException as exc:  # the reference failing its own test is reported, not fatal
                        event["ref_ok"] = False
                        event["ref_err"] = describe(exc)
                    del recorded[calls:]
            else:
                try:
                    exec(compile(source, "<test %d>" % index, "exec", dont_inherit=True), namespace)
                    event["ref_ok"] = True
                except _Diverged as exc:
                    raise Unencodable(str(exc)) from None
                except Unencodable:
                    raise
                except BaseException as exc:
                    if kind != "test":
                        raise
                    event["ref_ok"] = False
                    event["ref_err"] = describe(exc)
        except Unencodable as exc:
            event["plan_err"] = "cannot record the inputs: " + str(exc)
        except BaseException as exc:  # trusted test code failed outside an assert: report it
            event["plan_err"] = describe(exc)
        event["calls"] = "\x1e".join(recorded)
        report(**event)


def _replayer(queue, calls, outcomes):
    """The function under test as a judge sees it: each call answers from the candidate's recorded outcome
    of the next planned call, after checking that the inputs are the planned ones."""

    def replay(*args, **kwargs):
        if not queue:
            raise _Diverged("the test called the function more often than when it was planned")
        k = queue.pop(0)
        want_args, want_kwargs = calls[k]
        if list(args) != list(want_args) or kwargs != want_kwargs:
            raise _Diverged("the test called the function with other inputs than when it was planned")
        outcome = outcomes[k]
        if outcome is None:
            raise _Diverged("no return value (the program stopped before this call)")
        if outcome[0] == "err":
            raise CallFailed(outcome[1])
        return outcome[1]

    return replay


def _judge(job, report):
    """Replay the test statements with the function under test answering from recorded return values."""
    namespace, random = _trusted_context(job)
    calls = [marshal.loads(c) for c in job["calls"]]
    outcomes = marshal.loads(job["outcomes"])  # per call: ("ok", value) | ("err", text) | None
    binding = job["binding"]
    for index, item in enumerate(job["statements"]):
        source, kind, call_ids = item
        random.seed(index)
        replay = _replayer(list(call_ids), calls, outcomes)
        namespace[binding] = replay
        error = None
        try:
            exec(compile(source, "<test %d>" % index, "exec", dont_inherit=True), namespace)
        except CallFailed as exc:
            error = str(exc)
        except BaseException as exc:  # a test fails on anything raised while replaying it
            error = describe(exc)
        if kind == "test":
            report(e="verdict", i=index, ok=error is None, err=error)


def _worker(job, report, control):
    try:
        seccomp_problem = _limit_and_drop(job)
    except (OSError, ValueError, ImportError) as exc:
        control(e="setup", error="worker setup: " + describe(exc))
        os._exit(125)
    if seccomp_problem is not None:
        control(e="seccomp", error=seccomp_problem)
    os.close(job["ctl_fd"])  # from here on, no code of the job can write to the runner's channel
    mode = job["mode"]
    if mode in ("plan", "judge"):
        try:
            (_plan if mode == "plan" else _judge)(job, report)
        except BaseException as exc:  # trusted code failed: say so; the parent turns it into an error
            report(e="trusted_error", error=describe(exc))
            _print_exception(exc, 0)
            sys.exit(1)
        report(e="done")
        _finish(0)
    namespace = _new_main(job["filename"])
    _run_program(job, report, namespace)
    if mode == "calls":
        _calls(job, report, namespace)
        report(e="done")
    _finish(0)


def _reporter(tag, fd):
    def report(encode_only=False, **event):
        data = event_line(tag, event)
        if encode_only:
            return data
        while data:
            try:
                data = data[os.write(fd, data):]
            except OSError:
                return None
        return None

    return report


def main(job):
    """Run one job (a dict written by the parent; see :mod:`accord.sandbox.supervise`).

    Two pipes lead to the parent: the runner's control channel (``ctl_fd``: start, setup failures, the
    worker's exit status), which the worker closes before any code of the job runs, and the worker's
    channel (``report_fd``: call values, exceptions, verdicts of trusted modes). So a candidate can
    write only to the second, and the run's status never depends on what it writes.
    """
    tag = ("@accord-" + job.pop("nonce") + " ").encode()
    _, libc = _libc()
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the runner's /proc files stay closed to the worker
    control = _reporter(tag, job["ctl_fd"])
    report = _reporter(tag, job["report_fd"])
    os.umask(0o022)
    error = None
    try:
        _join_cgroups(job["cgroups"])
        if job["root"] is not None:
            build_root(job)
        if job["hostname"]:
            _, libc = _libc()
            libc.sethostname(b"sandbox", 7)
    except OSError as exc:
        error = describe(exc)
    if error is not None:
        control(e="setup", error="sandbox setup: " + error)
        os._exit(125)
    control(e="start")
    try:
        pid = os.fork()
    except OSError as exc:
        control(e="setup", error="fork: " + describe(exc))
        os._exit(125)
    if pid == 0:
        _worker(job, report, control)
        sys.exit(0)
    os.close(job["report_fd"])
    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            os._exit(125)
        if done == pid:
            break
    if os.WIFSIGNALED(status):
        control(e="exit", signal=os.WTERMSIG(status))
        os._exit(128 + os.WTERMSIG(status))
    control(e="exit", code=os.WEXITSTATUS(status))
    os._exit(os.WEXITSTATUS(status))
