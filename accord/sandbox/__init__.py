"""Run untrusted, model-written Python in a contained subprocess -- never inside the trainer.

    from accord.sandbox import Sandbox, SandboxConfig

    box = Sandbox(SandboxConfig(timeout_s=5, memory_mb=512))
    box.run("print(input()[::-1])", stdin="abc\\n")          # ExecResult(status='ok', stdout='cba\\n', ...)
    box.run_many(["print(1)", ("print(input())", "x\\n")])   # one result per job, in input order
    passed, total, result = box.run_tests(program, "assert f(1) == 2\\nassert f(2) == 3", "f")

Every call starts a fresh process and returns an :class:`ExecResult`; nothing the code does -- loops,
fork bombs, memory bombs, floods of output, ``os.kill`` of its parent, writes, deletes, sockets --
can raise in, block, or kill the calling process. Calls are thread-safe; the ``*_many`` methods run
their jobs concurrently on ``workers`` threads, each driving one subprocess.

Tests are never judged in the process that ran the candidate: :meth:`Sandbox.run_tests` records the
inputs of the function under test from trusted code, has the candidate's process return plain data
only, and decides every test in the caller's process or in a sandbox that runs trusted code only
(:mod:`accord.sandbox.harness`).

Layout: :mod:`~accord.sandbox.api` (the public API and statuses), :mod:`~accord.sandbox.config`
(the limits, :class:`SandboxConfig`), :mod:`~accord.sandbox.harness` (test plans and verdicts),
:mod:`~accord.sandbox.plain` (the plain-data decoder), :mod:`~accord.sandbox.isolation` (namespaces, the
sandbox's root file system, uids, cgroups, the probe's result), :mod:`~accord.sandbox.supervise` (starting,
watching and killing a run) and :mod:`~accord.sandbox.child` (the runner that executes inside the sandbox).
"""

from accord.sandbox.api import (
    STATUSES,
    ExecResult,
    Sandbox,
    SandboxError,
    TestCaseResult,
    TestPlanError,
    TestRun,
)
from accord.sandbox.config import SandboxConfig, SandboxConfigError
from accord.sandbox.harness import Statement, TestPlan
from accord.sandbox.isolation import Isolation
from accord.sandbox.supervise import PROCESS_MARKER, probe


def probe_isolation(refresh: bool = False) -> Isolation:
    """Measure (once per process) which isolation layers work here; see :mod:`accord.sandbox.isolation`."""
    return probe(refresh)[1]


__all__ = [
    "PROCESS_MARKER",
    "STATUSES",
    "ExecResult",
    "Isolation",
    "Sandbox",
    "SandboxConfig",
    "SandboxConfigError",
    "SandboxError",
    "Statement",
    "TestCaseResult",
    "TestPlan",
    "TestPlanError",
    "TestRun",
    "probe_isolation",
]
