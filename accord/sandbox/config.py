"""The sandbox's limits: :class:`SandboxConfig`, validated on construction (:class:`SandboxConfigError`).

Its own module, below both :mod:`accord.sandbox.api` and :mod:`accord.sandbox.supervise`, which read it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from accord.sandbox.isolation import UIDS_PER_PROCESS


class SandboxConfigError(ValueError):
    """A :class:`SandboxConfig` field is invalid; the message names the field."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one sandboxed run. Every field is validated on construction."""

    timeout_s: float = 5.0  #: wall-clock limit of one run (the whole process tree is killed after it)
    cpu_s: float | None = None  #: CPU seconds per process (RLIMIT_CPU); None: ceil(timeout_s) + 1
    memory_mb: int = 512  #: memory of the whole run (cgroup) and address space per process (RLIMIT_AS), MiB
    max_output_bytes: int = 64 * 1024  #: cap of stdout and of stderr, each; beyond it: output_limit
    max_return_bytes: int = 256 * 1024  #: encoded return values decoded per run (all calls); later calls fail
    file_size_mb: int = 16  #: largest file the code may write (RLIMIT_FSIZE), MiB
    max_procs: int = 64  #: processes/threads of the run (RLIMIT_NPROC of its own uid)
    max_open_files: int = 256  #: RLIMIT_NOFILE
    tmpfs_mb: int = 64  #: size of each private tmpfs (/tmp, /dev/shm)
    disk_mb: int = 64  #: size of the working directory (a tmpfs): the run's disk quota, MiB
    max_files: int = 4096  #: files and directories the working directory can hold
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  #: concurrency of the *_many calls
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
        need("max_return_bytes", integer("max_return_bytes") and self.max_return_bytes >= 1, "must be an int >= 1")
        need("file_size_mb", integer("file_size_mb") and self.file_size_mb >= 1, "must be an int >= 1 (MiB)")
        need("max_procs", integer("max_procs") and self.max_procs >= 1, "must be an int >= 1")
        need("max_open_files", integer("max_open_files") and self.max_open_files >= 16, "must be an int >= 16")
        need("tmpfs_mb", integer("tmpfs_mb") and self.tmpfs_mb >= 1, "must be an int >= 1 (MiB)")
        need("disk_mb", integer("disk_mb") and self.disk_mb >= 1, "must be an int >= 1 (MiB)")
        need("max_files", integer("max_files") and self.max_files >= 16, "must be an int >= 16")
        need("workers", integer("workers") and 1 <= self.workers <= UIDS_PER_PROCESS,
             f"must be an int in [1, {UIDS_PER_PROCESS}]")
        need("network", isinstance(self.network, bool), "must be True or False")
        need("site_packages", isinstance(self.site_packages, bool), "must be True or False")
        need("uid_base", self.uid_base is None or (integer("uid_base") and 1000 <= self.uid_base
                                                    <= 2**31 - 1 - UIDS_PER_PROCESS),
             f"must be None or an int in [1000, {2**31 - 1 - UIDS_PER_PROCESS}]")

    @property
    def cpu_limit_s(self) -> int:
        """The RLIMIT_CPU soft limit actually set (whole seconds, rounded up)."""
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s + 1))
