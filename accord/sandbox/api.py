"""The sandbox's public API: :class:`Sandbox` and the result types (its limits: :mod:`accord.sandbox.config`).

Statuses (:attr:`ExecResult.status`), first match wins:

``timeout``        the wall clock (``timeout_s``) ran out and the parent killed the tree, or the worker died
                   of ``SIGXCPU`` (``cpu_s`` of CPU time used).
``output_limit``   stdout or stderr exceeded ``max_output_bytes`` and the parent killed the tree;
                   ``truncated`` is True and the streams hold the first ``max_output_bytes``.
``sandbox_error``  the sandbox itself failed (``unshare``/setup error); the code did not run.
``syntax_error``   the code does not compile (``SyntaxError``, null bytes); nothing of it ran.
``memory``         the code raised ``MemoryError`` that reached the top level, the run's memory cgroup
                   OOM-killed a process, or a process died of a signal with an out-of-memory message.
``killed``         the worker died of any other signal (``SIGKILL`` by the hard CPU limit, ``SIGSEGV``,
                   ``SIGXFSZ`` when a file exceeds ``file_size_mb``, its own ``os.kill``).
``ok``             exit status 0 (including ``sys.exit(0)``/``sys.exit(None)``).
``error``          any other exit status: an uncaught exception (its type in ``exception``) or ``sys.exit(n)``.
"""

from __future__ import annotations

import logging
import marshal
import signal
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, Union

from accord.sandbox import harness
from accord.sandbox.config import SandboxConfig
from accord.sandbox.harness import Statement, TestPlan
from accord.sandbox.isolation import Isolation
from accord.sandbox.plain import PlainDataError, decode
from accord.sandbox.supervise import Raw, Runner, probe

logger = logging.getLogger(__name__)

STATUSES = ("ok", "error", "syntax_error", "timeout", "memory", "output_limit", "killed", "sandbox_error")

Job = Union[str, "tuple[str, str | None]"]


class SandboxError(RuntimeError):
    """The sandbox could not run trusted code (a plan or a judge): a failure of the machine, not of a candidate."""


class TestPlanError(ValueError):
    """Tests that cannot be judged outside the candidate's process as given: a test whose calls of the
    function depend on loops, conditions or earlier results, with no reference program to plan it."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class TestCaseResult:
    """Outcome of one test of :meth:`Sandbox.run_tests`."""

    __test__ = False  # not a pytest test class

    index: int  #: position among the tests (setup statements are not counted)
    passed: bool
    error: str | None = None  #: e.g. "AssertionError: got 3" or "ValueError: bad input"


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
    test_cases: tuple[TestCaseResult, ...] = ()  #: run_tests only: every test, by index

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


def _oom_message(stderr: bytes) -> bool:
    tail = stderr[-2000:]
    return any(m in tail for m in (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory"))


def classify(raw: Raw, control: list[dict], worker: list[dict], net: bool) -> ExecResult:
    """The :class:`ExecResult` of a finished run (see the module docstring for the statuses).

    Whether the code ran and how it exited come from the runner's control channel, which the job's code
    cannot write to; ``syntax`` and ``exc`` (the labels syntax_error / memory and the exception's type)
    come from the worker's channel, so a candidate could only swap one failing label for another.
    """
    stdout = raw.stdout.decode("utf-8", errors="replace")
    stderr = raw.stderr.decode("utf-8", errors="replace")
    kinds: dict = {}
    for e in worker:
        if e.get("e") in ("syntax", "exc"):
            kinds.setdefault(e.get("e"), e)
    for e in control:
        if e.get("e") in ("start", "setup", "exit"):
            kinds.setdefault(e.get("e"), e)
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
    elif exception == "MemoryError" or (raw.oom_killed and returncode is not None and returncode < 0):
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
    return ExecResult(status, returncode, stdout, stderr, raw.duration_s, raw.truncated, net, exception)


def call_outcomes(evs: list[dict], n: int, max_bytes: int) -> list[tuple | None]:
    """Per call, ``("ok", value)`` / ``("err", text)`` / None from a ``calls`` run's events. A value that
    does not decode as plain data fails its call; the first event of a call counts. At most ``max_bytes``
    of encoded values are decoded per run (decoding costs the trainer's CPU): later values fail."""
    out: list[tuple | None] = [None] * n
    seen: set[int] = set()
    budget = max_bytes
    for e in evs:
        if e.get("e") != "call":
            continue
        i = e.get("i")
        if type(i) is not int or not 0 <= i < n or i in seen:
            continue
        seen.add(i)
        if e.get("ok") is True and isinstance(e.get("v"), str):
            budget -= len(e["v"])
            if budget < 0:
                out[i] = ("err", f"not plain data: the run's return values exceed {max_bytes} bytes in all "
                                 "(SandboxConfig.max_return_bytes)")
                continue
            try:
                out[i] = ("ok", decode(e["v"]))
            except PlainDataError as exc:
                out[i] = ("err", f"not plain data: {exc}")
        else:
            err = e.get("err")
            out[i] = ("err", err[:300] if isinstance(err, str) else "the call failed")
    return out


class Sandbox:
    """Runs untrusted code under :class:`SandboxConfig` limits; thread-safe, no state between runs
    (but a bounded cache of test plans, which hold trusted data only)."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config if config is not None else SandboxConfig()
        if not isinstance(self.config, SandboxConfig):
            raise TypeError(f"config must be a SandboxConfig, not {type(self.config).__name__}")
        self._plan, self._isolation, cgroups = probe()
        self._runner = Runner(self.config, self._plan, cgroups)
        self._plans: OrderedDict = OrderedDict()
        self._plans_lock = threading.Lock()

    @property
    def isolation(self) -> Isolation:
        """The containment runs get here (network_namespace is False when config.network is True)."""
        iso = self._isolation
        if self.config.network and iso.network_namespace:
            from dataclasses import replace

            iso = replace(iso, network_namespace=False, notes=iso.notes + ("network allowed by config",))
        return iso

    # --- plain runs -----------------------------------------------------------------------------
    def _run(self, mode: str, code: str, stdin: str | None = None, files: dict[str, str] | None = None,
             extra: dict | None = None) -> tuple[ExecResult, list[dict]]:
        raw, control, worker, net = self._runner.execute(mode, code, stdin=stdin, files=files, extra=extra)
        return classify(raw, control, worker, net), worker

    def run(self, code: str, stdin: str | None = None, files: dict[str, str] | None = None) -> ExecResult:
        """Run ``code`` as ``__main__`` with ``stdin`` as its standard input and ``files`` (relative path ->
        text) in its working directory."""
        return self._run("exec", code, stdin, files)[0]

    def run_many(self, jobs: Sequence[Job]) -> list[ExecResult]:
        """Run jobs (code strings or ``(code, stdin)`` pairs) concurrently on ``config.workers`` threads;
        results in input order."""
        normalized = [_normalize_job(job) for job in jobs]
        return self._map(lambda job: self.run(job[0], job[1]), normalized)

    # --- tests --------------------------------------------------------------------------------
    def plan_tests(self, tests: str | Sequence[str], function: str, *, reference: str | None = None,
                   setup: str | None = None) -> TestPlan:
        """The :class:`~accord.sandbox.harness.TestPlan` of trusted ``tests`` of ``function`` (see
        :mod:`accord.sandbox.harness`); ``reference`` is a correct program, needed for tests whose calls
        are not independent (loops, conditions, calls on results; without it they raise
        :class:`TestPlanError`), and ``setup`` trusted code the tests need (a problem's imports and helpers)."""
        return self.plan_tests_many([(tests, function, reference, setup)])[0]

    def plan_tests_many(self, suites: Sequence[tuple]) -> list[TestPlan]:
        """:meth:`plan_tests` of ``(tests, function[, reference[, setup]])`` suites; cached, misses run
        concurrently."""
        keys = []
        for suite in suites:
            if not isinstance(suite, tuple) or not 2 <= len(suite) <= 4:
                raise TypeError("a test suite is (tests, function[, reference[, setup]])")
            tests, function, reference, setup = (*suite, None, None)[:4]
            keys.append((tests if isinstance(tests, str) else tuple(tests), function, reference, setup))
        with self._plans_lock:
            found = {k: self._plans[k] for k in keys if k in self._plans}
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        fresh = self._map(lambda k: self._make_plan(*k), missing)
        with self._plans_lock:
            for k, plan in zip(missing, fresh):
                self._plans[k] = plan
                found[k] = plan
            while len(self._plans) > 1024:
                self._plans.popitem(last=False)
        return [found[k] for k in keys]

    def _make_plan(self, tests, function: str, reference: str | None, setup: str | None) -> TestPlan:
        tests = tests if isinstance(tests, str) else list(tests)
        static = harness.literal_plan(tests, function)
        if static is not None:
            return static
        binding, parsed = harness.parse_tests(tests, function)
        if reference is None:
            unplanned = harness.needs_reference(tests, function)
            if unplanned:
                raise TestPlanError(
                    f"test {' '.join(unplanned[0].split())[:160]!r} of {function!r} cannot be judged without a "
                    f"reference solution ({len(unplanned)} such test(s)): its calls of {function} sit in a loop, "
                    f"a condition or another call; pass reference=<a correct program>, or write it as "
                    f"independent calls such as `assert abs({function}(ARGS) - EXPECTED) < EPS`")
        context = tuple(c for c in (setup, reference) if c)
        extra = {"context": list(context), "function": function, "binding": binding,
                 "has_reference": reference is not None,
                 "statements": harness.plan_job_statements(binding, parsed, reference is not None)}
        result, evs = self._run("plan", "", extra=extra)
        failure = next((e.get("error") for e in evs if e.get("e") == "trusted_error"), None)
        by_index = {e["i"]: e for e in evs if e.get("e") == "stmt" and type(e.get("i")) is int}
        if failure is not None or result.status != "ok" or len(by_index) != len(parsed):
            raise SandboxError(f"planning the tests of {function!r} failed ({result.status}): "
                               f"{failure or result.stderr.strip()[-400:] or 'no detail'}")
        statements, inputs = [], []
        for index, (source, kind, _node) in enumerate(parsed):
            event = by_index[index]
            error = event.get("plan_err") if isinstance(event.get("plan_err"), str) else None
            if kind == "setup" and error is not None:
                raise SandboxError(f"planning the tests of {function!r} failed: the setup statement "
                                   f"{source[:120]!r} raises {error}; fix the tests or the reference")
            calls: list[int] = []
            expected = None
            try:
                for text in filter(None, (event.get("calls") or "").split("\x1e")):
                    args, kwargs = decode(text)
                    calls.append(len(inputs))
                    inputs.append(marshal.dumps((list(args), kwargs)))
                if kind == "simple" and error is None:
                    expected = decode(event.get("expected"))
            except (PlainDataError, ValueError, TypeError) as exc:
                error = f"cannot record the inputs: {exc}"
            if kind != "setup" and event.get("ref_ok") is False and error is None:
                logger.warning("sandbox: the reference fails its own test %r: %s", source[:120], event.get("ref_err"))
            op = harness.simple_parts(_node, binding)[0] if kind == "simple" else None
            if error is not None and kind != "setup":
                logger.warning("sandbox: test %r of %r cannot be judged outside the candidate's process (%s); "
                               "it fails for every program", source[:120], function, error)
            statements.append(Statement(source, kind, op, expected, tuple(calls), error))
        return TestPlan(function, binding, tuple(statements), tuple(inputs), context)

    def run_tests(self, program: str, tests: str | Sequence[str] | TestPlan, function: str | None = None, *,
                  reference: str | None = None, setup: str | None = None) -> TestRun:
        """Run ``program``'s ``function`` on the tests' inputs and judge each test outside its process
        (see :mod:`accord.sandbox.harness`). ``tests`` may be a plan from :meth:`plan_tests`."""
        return self.run_tests_many([(program, tests, function, reference, setup)])[0]

    def run_tests_many(self, jobs: Sequence[tuple]) -> list[TestRun]:
        """:meth:`run_tests` for many ``(program, plan)`` or ``(program, tests, function[, reference[,
        setup]])`` jobs, concurrently; results in input order."""
        programs, plans = [], []
        suites: list[tuple] = []
        slots: list[int | None] = []
        for job in jobs:
            if not isinstance(job, tuple) or len(job) < 2 or not isinstance(job[0], str):
                raise TypeError("run_tests_many jobs are (program, plan) or (program, tests, function[, "
                                "reference[, setup]])")
            programs.append(job[0])
            if isinstance(job[1], TestPlan):
                plans.append(job[1])
                slots.append(None)
            else:
                if len(job) < 3 or job[2] is None:
                    raise TypeError("run_tests needs the name of the function under test (function=...)")
                plans.append(None)
                slots.append(len(suites))
                suites.append(tuple(job[1:]))
        planned = self.plan_tests_many(suites) if suites else []
        plans = [p if p is not None else planned[s] for p, s in zip(plans, slots)]
        return self._map(lambda pair: self._test_one(*pair), list(zip(programs, plans)))

    def _test_one(self, program: str, plan: TestPlan) -> TestRun:
        extra = {"function": plan.function, "calls": list(plan.inputs)}
        result, evs = self._run("calls", program, extra=extra)
        outcomes = call_outcomes(evs, len(plan.inputs), self.config.max_return_bytes)
        if not any(e.get("e") == "done" for e in evs) and result.status == "ok":
            result = ExecResult("error", result.returncode, result.stdout, result.stderr, result.duration_s,
                                result.truncated, result.network_isolated, "SystemExit")
        if any(e.get("e") == "nofunc" for e in evs):
            outcomes = [("err", f"NameError: name {plan.function!r} is not defined")] * len(plan.inputs)
        verdicts: dict[int, tuple[bool, str | None]] = {}
        for index, st in enumerate(plan.statements):
            if st.kind == "simple":
                verdicts[index] = harness.simple_verdict(st, outcomes[st.calls[0]] if st.calls else None)
            elif st.kind == "test" and st.error is not None:
                verdicts[index] = (False, f"not judged: {st.error}")
        if plan.needs_judge and any(o is not None for o in outcomes):
            verdicts.update(self._judge(plan, outcomes))
        cases, passed = [], 0
        for index, st in enumerate(plan.statements):
            if not st.is_test:
                continue
            ok, err = verdicts.get(index, (False, "no return value (the program stopped before this test)"))
            cases.append(TestCaseResult(len(cases), ok, err))
            passed += ok
        result = ExecResult(result.status, result.returncode, result.stdout, result.stderr, result.duration_s,
                            result.truncated, result.network_isolated, result.exception, tuple(cases))
        return TestRun(passed, plan.total, result)

    def _judge(self, plan: TestPlan, outcomes: list[tuple | None]) -> dict[int, tuple[bool, str | None]]:
        """Verdicts of the plan's non-simple tests, replayed in a sandbox that runs trusted code only."""
        extra = {"context": list(plan.context), "function": plan.function, "binding": plan.binding,
                 "statements": plan.judge_statements(), "calls": list(plan.inputs),
                 "outcomes": marshal.dumps(outcomes)}
        result, evs = self._run("judge", "", extra=extra)
        failure = next((e.get("error") for e in evs if e.get("e") == "trusted_error"), None)
        if failure is not None or result.status == "sandbox_error":
            raise SandboxError(f"judging the tests of {plan.function!r} failed ({result.status}): "
                               f"{failure or result.stderr.strip()[-400:]}")
        out: dict[int, tuple[bool, str | None]] = {}
        for e in evs:
            i = e.get("i")
            if e.get("e") == "verdict" and type(i) is int and 0 <= i < len(plan.statements) and i not in out:
                if plan.statements[i].kind == "test" and plan.statements[i].error is None:
                    err = e.get("err")
                    out[i] = (e.get("ok") is True, err if isinstance(err, str) else None)
        if result.status != "ok":
            for i, st in enumerate(plan.statements):
                if st.kind == "test" and i not in out:
                    out[i] = (False, f"the replay of this test ended with {result.status}")
        return out

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
