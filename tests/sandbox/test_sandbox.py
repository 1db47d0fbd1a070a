"""accord.sandbox: hostile code is contained with a clear status and the test process (standing in for
the trainer) keeps working; plus the normal cases. Every test starts real subprocesses."""

from __future__ import annotations

import dataclasses
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from accord.sandbox import (
    PROCESS_MARKER,
    STATUSES,
    Sandbox,
    SandboxConfig,
    SandboxConfigError,
    probe_isolation,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux (/proc, rlimits)")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def box() -> Sandbox:
    return Sandbox(SandboxConfig(timeout_s=3, memory_mb=256))


@pytest.fixture(scope="module")
def roomy() -> Sandbox:
    """The box's limits with more time: a memory bomb under a loaded CI machine took 3 s to reach its MemoryError
    (0.3 s on a quiet one), which the 3 s box reported as a timeout."""
    return Sandbox(SandboxConfig(timeout_s=20, memory_mb=256))


@pytest.fixture(scope="module")
def quick() -> Sandbox:
    return Sandbox(SandboxConfig(timeout_s=1.5, memory_mb=256, max_output_bytes=4096))


def _processes_with(marker: bytes) -> list[int]:
    """Pids whose command line contains ``marker`` (psutil-free: reads /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if marker in fh.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def _assert_alive(sandbox: Sandbox) -> None:
    """The 'trainer' still works: it can compute and start a fresh sandbox run (with the sandbox's settings but a
    wall-clock limit that a loaded CI machine's process start cannot reach: a 1.5 s one timed out there once)."""
    assert sum(range(1000)) == 499500
    result = Sandbox(dataclasses.replace(sandbox.config, timeout_s=max(sandbox.config.timeout_s, 30))).run(
        "print('alive')")
    assert (result.status, result.stdout) == ("ok", "alive\n")


def _sandbox_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("accord-sbx-")}


def _needs(flag: str) -> None:
    iso = probe_isolation()
    if not getattr(iso, flag):
        pytest.skip(f"isolation layer {flag} is not available here: {'; '.join(iso.notes) or iso.summary()}")


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("field, value", [
    ("timeout_s", 0), ("timeout_s", float("nan")), ("cpu_s", -1), ("memory_mb", 10), ("max_output_bytes", 0),
    ("file_size_mb", 0), ("max_procs", 0), ("max_open_files", 3), ("workers", 0), ("network", "no"),
    ("uid_base", 5), ("tmpfs_mb", 0),
])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(SandboxConfigError, match=rf"SandboxConfig\.{field}="):
        SandboxConfig(**{field: value})


def test_config_defaults():
    cfg = SandboxConfig()
    assert (cfg.timeout_s, cfg.memory_mb, cfg.max_output_bytes, cfg.network) == (5.0, 512, 65536, False)
    assert cfg.workers == (os.cpu_count() or 1) and cfg.cpu_limit_s == 6


# ------------------------------------------------------------------------------------------------ normal runs
def test_stdout_stdin_and_files(box):
    result = box.run("import sys\nprint(sys.stdin.read()[::-1])\nprint(open('data/x.txt').read())",
                     stdin="abc", files={"data/x.txt": "payload"})
    assert result.status == "ok" and result.returncode == 0
    assert result.stdout == "cba\npayload\n" and result.stderr == ""
    assert result.duration_s > 0 and not result.truncated
    assert result.network_isolated == probe_isolation().network_namespace
    with pytest.raises(ValueError, match="relative path"):
        box.run("pass", files={"../escape.txt": "x"})
    with pytest.raises(ValueError, match="relative path"):
        box.run("pass", files={"/etc/passwd": "x"})


def test_no_stdin_reads_eof(box):
    result = box.run("try:\n    input()\nexcept EOFError:\n    print('eof')")
    assert (result.status, result.stdout) == ("ok", "eof\n")


def test_exit_codes_and_exceptions(box):
    assert box.run("import sys; sys.exit(0)").status == "ok"
    result = box.run("import sys; print('x'); sys.exit(3)")
    assert (result.status, result.returncode, result.stdout) == ("error", 3, "x\n")
    result = box.run("def f():\n    return 1 / 0\nf()")
    assert (result.status, result.returncode, result.exception) == ("error", 1, "ZeroDivisionError")
    assert "ZeroDivisionError: division by zero" in result.stderr and "solution.py" in result.stderr
    assert 'File "<string>"' not in result.stderr  # the traceback starts at the candidate's code, not the runner
    result = box.run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert (result.status, result.returncode) == ("killed", -signal.SIGSEGV)
    assert {r.status for r in (result,)} <= set(STATUSES)


def test_syntax_error_runs_nothing(box):
    result = box.run("print('side effect')\ndef f(:\n    pass")
    assert result.status == "syntax_error" and result.stdout == ""
    assert "SyntaxError" in result.stderr
    assert box.run("x = '\0'").status in ("syntax_error", "ok")  # null bytes inside a literal may compile
    assert box.run("\0").status == "syntax_error"


def test_main_module_semantics(box):
    result = box.run("import sys\n"
                     "print(__name__, __file__.endswith('solution.py'), sys.argv[0].endswith('solution.py'))")
    assert result.stdout == "__main__ True True\n"


def test_site_packages_only_when_asked(box):
    result = box.run("import yaml")
    assert (result.status, result.exception) == ("error", "ModuleNotFoundError")
    assert Sandbox(SandboxConfig(site_packages=True)).run("import yaml\nprint('ok')").stdout == "ok\n"


_VENV_PROGRAM = """
import sys
sys.path.insert(0, sys.argv[1])
from accord.sandbox import Sandbox, SandboxConfig, probe_isolation
if not probe_isolation().mount_namespace:
    print("no-own-root")
else:
    for site in (False, True):
        r = Sandbox(SandboxConfig(site_packages=site, timeout_s=20)).run("import venv_probe; print(venv_probe.X)")
        print(site, r.status, r.exception, r.stdout.strip(), r.stderr.strip()[-300:].replace(chr(10), " | "))
"""


def test_a_virtual_environment_under_tmp_is_mounted_over_the_private_tmp(tmp_path):
    """A trainer whose interpreter and site-packages live under /tmp (a checkout or venv there): with
    ``site_packages=True`` its packages are importable in the sandbox (they were hidden by the sandbox's own
    /tmp), and still not without it."""
    base = Path(tempfile.mkdtemp(prefix="accord-venv-", dir="/tmp"))
    try:
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip",
                        str(base / "venv")], check=True, capture_output=True, timeout=120)
        python = base / "venv" / "bin" / "python"
        site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        assert site.startswith("/tmp/")
        Path(site, "venv_probe.py").write_text("X = 'from the venv'\n")
        out = subprocess.run([python, "-c", _VENV_PROGRAM, str(REPO)], capture_output=True, text=True, timeout=120,
                             cwd=base).stdout
        if out.strip() == "no-own-root":
            pytest.skip("no mount namespace here: the sandbox sees the host's /tmp anyway")
        lines = out.splitlines()
        assert lines[0].startswith("False error ModuleNotFoundError"), out
        assert lines[1].startswith("True ok None from the venv"), out
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ hostile code
def test_infinite_loop_times_out(quick):
    start = time.monotonic()
    result = quick.run("while True:\n    pass")
    assert result.status == "timeout" and result.returncode is None
    assert 1.4 < time.monotonic() - start < 4
    _assert_alive(quick)


def test_cpu_limit_reports_timeout():
    box = Sandbox(SandboxConfig(timeout_s=10, cpu_s=1))
    start = time.monotonic()
    result = box.run("while True:\n    pass")
    assert result.status == "timeout" and result.returncode == -signal.SIGXCPU
    assert time.monotonic() - start < 5


def _needs_tree_kill() -> None:
    iso = probe_isolation()
    if not (iso.pid_namespace or iso.uid_drop):
        pytest.skip(f"no pid namespace and no separate uid here ({iso.summary()}): processes that setsid "
                    "escape the process-group kill")


def test_fork_bomb_is_contained(tmp_path):
    _needs_tree_kill()
    marker = f"forkbomb-{secrets.token_hex(4)}"
    box = Sandbox(SandboxConfig(timeout_s=2.5, memory_mb=256))
    # Forks without end, and also exec-s long sleepers that escape the process group (setsid), all
    # carrying a marker in their command line.
    bomb = f"""
import os, sys
while True:
    try:
        if os.fork() == 0:
            os.setsid()
            if os.getpid() % 3 == 0:
                os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])
    except OSError:
        pass
"""
    holder: dict = {}
    thread = threading.Thread(target=lambda: holder.setdefault("result", box.run(bomb)))
    thread.start()
    time.sleep(1.0)
    # the machine stays responsive while the bomb runs
    start = time.monotonic()
    subprocess.run(["true"], check=True, timeout=10)
    assert time.monotonic() - start < 1.5
    thread.join(timeout=30)
    assert not thread.is_alive()
    result = holder["result"]
    assert result.status == "timeout", result
    assert _processes_with(marker.encode()) == []
    assert _processes_with(f"{PROCESS_MARKER}:{os.getpid()}".encode()) == []
    _assert_alive(box)


def test_leftover_daemons_are_killed(box):
    _needs_tree_kill()
    marker = f"daemon-{secrets.token_hex(4)}"
    code = f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])
    os._exit(0)
print('started')
"""
    result = box.run(code)
    assert (result.status, result.stdout) == ("ok", "started\n")
    assert result.duration_s < 2
    assert _processes_with(marker.encode()) == []


@pytest.mark.parametrize("code", [
    "x = bytearray(10 ** 10)",
    "chunks = []\nwhile True:\n    chunks.append(b' ' * 10 ** 7)",
])
def test_memory_bomb(roomy, code):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = roomy.run(code)
    assert result.status == "memory" and result.exception == "MemoryError", result
    assert "MemoryError" in result.stderr
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB: the parent did not grow
    _assert_alive(roomy)


@pytest.mark.parametrize("code", [
    "while True:\n    print('x' * 1000)",
    "import sys\nsys.stdout.write('y' * 50_000_000)",
    "import sys\nwhile True:\n    sys.stderr.write('e' * 100_000)",
])
def test_huge_output_is_cut(code):
    # a generous timeout (another xdist worker may hold the other core): the status still shows that the
    # output cap, not the clock, stopped the program (the loops would otherwise run until the timeout)
    box = Sandbox(SandboxConfig(timeout_s=10.0, memory_mb=256, max_output_bytes=4096))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = box.run(code)
    assert result.status == "output_limit" and result.truncated, result.status
    assert len(result.stdout) <= 4096 and len(result.stderr) <= 4096
    assert max(len(result.stdout), len(result.stderr)) == 4096
    assert result.duration_s < 10.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB
    _assert_alive(box)


def test_cannot_write_outside_workdir(box, tmp_path):
    _needs_containment()
    shared = Path(tempfile.mkdtemp(prefix="accord-test-shared-"))  # a world-writable directory in /tmp
    try:
        shared.chmod(0o777)
        name = f"escape-{secrets.token_hex(4)}.txt"
        targets = [tmp_path / name, REPO / name, REPO / "accord" / name, shared / name]
        code = "import os\n" + "".join(
            f"try:\n    open({str(t)!r}, 'w').write('pwned')\n    print('wrote', {str(t)!r})\n"
            f"except OSError as e:\n    print('denied', type(e).__name__)\n" for t in targets)
        code += "open('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
        result = box.run(code)
        assert result.status == "ok", result
        assert result.stdout.endswith("fine\n") and result.stdout.count("denied") == len(targets)
        for target in targets:
            assert not target.exists(), f"sandboxed code wrote {target}"
    finally:
        for target in (REPO / name, REPO / "accord" / name):
            if target.exists():
                target.unlink()
        for p in shared.iterdir():
            p.unlink()
        shared.rmdir()
    _assert_alive(box)


def test_cannot_delete_files(box, tmp_path):
    _needs_containment()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    shared = Path(tempfile.mkdtemp(prefix="accord-test-shared-"))
    repo_dir = REPO / f".sandbox-test-{secrets.token_hex(4)}"  # outside /tmp: only the uid protects it
    try:
        shared.chmod(0o777)
        shared_victim = shared / "victim.txt"
        shared_victim.write_text("keep me")
        shared_victim.chmod(0o666)
        repo_dir.mkdir()
        repo_victim = repo_dir / "victim.txt"
        repo_victim.write_text("keep me")
        victims = (victim, shared_victim, repo_victim)
        code = "import os, shutil\n" + "".join(
            f"for act in (lambda: os.remove({str(p)!r}), lambda: shutil.rmtree({str(p.parent)!r}),"
            f" lambda: open({str(p)!r}, 'w').close()):\n"
            f"    try:\n        act()\n        print('done')\n    except OSError as e:\n        print('denied')\n"
            for p in victims)
        result = box.run(code)
        assert result.status == "ok", result
        assert result.stdout == "denied\n" * 9
        assert [p.read_text() for p in victims] == ["keep me"] * 3
    finally:
        for p in shared.iterdir():
            p.unlink()
        shared.rmdir()
        if repo_dir.exists():
            shutil.rmtree(repo_dir)


def _needs_containment() -> None:
    iso = probe_isolation()
    if not (iso.uid_drop or iso.mount_namespace):
        pytest.skip(f"no separate uid and no mount namespace here: {iso.summary()}")


def test_environment_secrets_do_not_leak(box, monkeypatch):
    secret = f"sk-{secrets.token_hex(12)}"
    monkeypatch.setenv("ACCORD_FAKE_API_KEY", secret)
    code = f"""
import os
print(dict(os.environ))
for path in ('/proc/self/environ', '/proc/{os.getpid()}/environ', '/proc/1/environ'):
    try:
        print(open(path, 'rb').read())
    except OSError as e:
        print(path, type(e).__name__)
"""
    result = box.run(code)
    assert result.status == "ok"
    assert secret not in result.stdout and "ACCORD_FAKE_API_KEY" not in result.stdout
    assert "'HOME'" in result.stdout  # the minimal environment is there


def test_network_is_cut():
    _needs("network_namespace")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = f"""
import socket
s = socket.socket()
s.settimeout(1)
try:
    s.connect(('127.0.0.1', {port}))
    print('connected')
except OSError as e:
    print('blocked', type(e).__name__)
"""
    try:
        result = Sandbox(SandboxConfig(timeout_s=3)).run(code)
        assert result.status == "ok" and result.network_isolated
        assert result.stdout.startswith("blocked"), result.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()
        allowed = Sandbox(SandboxConfig(timeout_s=3, network=True)).run(code)
        assert allowed.stdout == "connected\n" and not allowed.network_isolated
    finally:
        listener.close()


def test_cannot_signal_the_parent(box):
    iso = probe_isolation()
    if not (iso.pid_namespace or iso.uid_drop):
        pytest.skip("without a pid namespace or a separate uid the code could kill the test process")
    me = os.getpid()
    code = f"""
import os, signal
print('ppid', os.getppid())
for target in (os.getppid(), {me}, -{os.getpgid(0)}, -1):
    try:
        os.kill(target, signal.SIGKILL)
        print('sent', target)
    except OSError as e:
        print('failed', target, type(e).__name__)
"""
    result = box.run(code)
    # Still here. The run itself may end as killed (kill(-1) can reach its own processes).
    assert result.status in ("ok", "killed")
    assert os.getpid() == me
    _assert_alive(box)


# ------------------------------------------------------------------------------------------------ test harness
PROGRAM = "def add(a, b):\n    return a + b if a != 2 else 0\n"
REFERENCE = "def add(a, b):\n    return a + b\n"


def test_harness_counts_each_assert(box):
    tests = "import math\nassert add(1, 1) == 2\nassert add(2, 2) == 4\nassert math.isclose(add(0.5, 0.25), 0.75)\n"
    passed, total, result = box.run_tests(PROGRAM, tests, "add", reference=REFERENCE)
    assert (passed, total, result.status) == (2, 3, "ok")
    assert [c.passed for c in result.test_cases] == [True, False, True]
    assert result.test_cases[1].error == "AssertionError: got 0"  # the value, told by the trainer's process
    assert box.run_tests(PROGRAM, ["assert add(1, 2) == 3", "assert add(2, 5) == 7"], "add").passed == 1


def test_harness_humaneval_style(box):
    tests = '''
METADATA = {"author": "x"}

def check(candidate):
    assert candidate(1, 1) == 2
    assert candidate(2, 2) == 4
    for a in range(3, 6):
        assert candidate(a, 1) == a + 1

check(add)
'''
    run = box.run_tests(PROGRAM, tests, "add", reference=REFERENCE)
    assert (run.passed, run.total) == (2, 3) and run.fraction == pytest.approx(2 / 3)
    plan = box.plan_tests(tests, "add", reference=REFERENCE)
    assert plan.binding == "candidate" and plan.needs_judge  # the loop is replayed by a trusted judge
    assert [s.kind for s in plan.statements] == ["setup", "simple", "simple", "test"]
    assert box.run_tests(REFERENCE, plan)[:2] == (3, 3)
    loop_wrong = "def add(a, b):\n    return a + b + (a == 4)\n"
    run = box.run_tests(loop_wrong, plan)
    assert (run.passed, run.result.test_cases[2].passed) == (2, False)


def test_harness_plans_literal_tests_without_running_anything(box):
    plan = box.plan_tests(["assert add(1, 2) == 3", "assert not add(0, 0)", "assert add(1, 1) is not None"], "add")
    assert not plan.context and not plan.needs_judge and len(plan.inputs) == 3
    assert [s.op for s in plan.statements] == ["==", "falsy", "is not"]


def test_harness_judges_tolerance_tests_without_a_reference(box):
    """``abs(f(x) - y) < eps`` and other asserts whose calls of the function do not depend on its results
    are planned without a reference: their inputs are evaluated by trusted code, the verdict is replayed by
    the judge. Before the fix a correct f(x) = 2x + 1 scored 3 of 4 on these four plain asserts."""
    correct, wrong = "def f(x):\n    return 2 * x + 1\n", "def f(x):\n    return 2 * x + 1.5\n"
    tests = ["assert f(1) == 3", "assert abs(f(0.5) - 2.0) < 1e-9", "assert f(2) == 5", "assert f(3) == 7"]
    assert box.run_tests(correct, tests, "f")[:2] == (4, 4)
    assert box.run_tests(wrong, tests, "f")[:2] == (0, 4)
    more = ("import math\nassert math.isclose(f(0.25), 1.5)\nassert abs(f(1) - f(0)) <= 2\n"
            "assert round(f(1 / 3), 6) == round(5 / 3, 6)\nassert sorted([f(2), f(-1)]) == [-1, 5]\n"
            "assert {'a': f(1), f(0): 'b'} == {'a': 3, 1: 'b'}\n")
    plan = box.plan_tests(more, "f")
    assert [s.kind for s in plan.statements] == ["setup"] + ["test"] * 5 and plan.needs_judge
    assert all(s.error is None for s in plan.statements) and len(plan.inputs) == 8
    assert box.run_tests(correct, plan)[:2] == (5, 5)
    run = box.run_tests(wrong, plan)
    assert run.passed == 1 and run.result.test_cases[1].passed  # only f(1) - f(0) <= 2 holds for 2x + 1.5


def test_harness_refuses_to_plan_computed_tests_without_a_reference(box):
    from accord.sandbox import SandboxError, TestPlanError

    for tests in ("for a in range(3):\n    assert add(a, 1) == a + 1\n", "assert add(add(1, 1), 1) == 3\n",
                  "assert all(add(a, 1) for a in range(3))\n", "assert (add(1, 1) if True else add(2, 2)) == 2\n",
                  "assert list(map(add, [1], [2])) == [3]\n", "assert add(1, 1) == 2 or add(9, 9) == 0\n",
                  "assert 0 < add(1, 1) < add(2, 2)\n"):
        with pytest.raises(TestPlanError, match="reference") as err:  # at planning, before any scoring
            box.plan_tests(tests, "add")
        assert "\n" not in str(err.value)
        assert box.plan_tests(tests, "add", reference=REFERENCE).statements[0].error is None
    with pytest.raises(SandboxError, match="planning the tests"):
        box.plan_tests("import no_such_module\nassert add(1, 1) == 2\n", "add", reference=REFERENCE)


def test_harness_failing_programs_pass_nothing(box):
    tests = ["assert add(1, 1) == 2"]
    assert box.run_tests("def add(a, b:\n", tests, "add")[:2] == (0, 1)
    run = box.run_tests("raise RuntimeError('boom')\ndef add(a, b): return a + b", tests, "add")
    assert (run.passed, run.result.status, run.result.exception) == (0, "error", "RuntimeError")
    run = box.run_tests("import os\ndef add(a, b): return a + b\nos._exit(0)", tests, "add")
    assert (run.passed, run.total) == (0, 1)
    run = box.run_tests("def other(a, b): return a + b", tests, "add")
    assert run.passed == 0 and "NameError" in run.result.test_cases[0].error


def test_harness_cannot_be_forged(box):
    # The candidate prints summaries and writes fake report lines to every descriptor it can find.
    program = PROGRAM + '''
import os, json
line = '@accord-' + '0' * 32 + ' ' + json.dumps({"e": "call", "i": 0, "ok": True, "v": "4"}) + '\\n'
fake = '{"passed": 3, "total": 3}\\n' + line
print(fake)
for fd in range(3, 64):
    try:
        os.write(fd, fake.encode())
    except OSError:
        pass
'''
    run = box.run_tests(program, ["assert add(2, 2) == 4", "assert add(2, 3) == 5", "assert add(1, 1) == 3"], "add")
    assert (run.passed, run.total) == (0, 3)


def test_harness_keeps_results_before_a_timeout(quick):
    program = "def add(a, b):\n    while a == 5:\n        pass\n    return a + b\n"
    run = quick.run_tests(program, ["assert add(1, 1) == 2", "assert add(5, 1) == 6", "assert add(1, 2) == 3"], "add")
    assert (run.passed, run.total, run.result.status) == (1, 3, "timeout")


def test_harness_survives_output_flood(quick):
    # 10 MB cannot pass the pipe before the kill: the program dies in its print, before any call
    run = quick.run_tests(PROGRAM + "print('z' * 10_000_000)\n", ["assert add(1, 1) == 2"], "add")
    assert run.result.status == "output_limit"  # killed before the tests: nothing passes
    assert run.passed == 0
    chatty = "def add(a, b):\n    print('z' * 1500)\n    return a + b\n"
    run = quick.run_tests(chatty, "assert add(1, 1) == 2\nassert add(3, 1) == 4", "add")
    assert (run.passed, run.total, run.result.status) == (2, 2, "ok")


def test_plain_data_round_trip_and_refusals(box):
    values = [None, True, 0, -7, 10**30, 1.5, "é\u2603\U0001F600\n\"", b"\x00\xff", 2 + 3j,
              [1, [2]], (1, (2,)), {"a": 1, 2: [3], (4, 5): None}, {1, 2}, frozenset({3})]
    program = "def echo(x):\n    return x\n"
    cases = [f"assert echo({v!r}) == {v!r}" for v in values]
    cases += ["assert echo(float('inf')) == float('inf')", "assert echo(float('nan')) != 0.0"]
    run = box.run_tests(program, cases, "echo")
    assert run.passed == len(cases), [c for c in run.result.test_cases if not c.passed]
    hostile = "class B(list):\n    pass\ndef echo(x):\n    return {'gen': (i for i in x), 'sub': B(x), 'obj': object(), " \
              "'deep': None}[x[0]] if x[0] != 'deep' else eval('[' * 90 + ']' * 90)\n"
    run = box.run_tests(hostile, [f"assert echo([{k!r}]) == []" for k in ("gen", "sub", "obj", "deep")], "echo")
    assert run.passed == 0
    assert all(c.error.startswith("not plain data") for c in run.result.test_cases), run.result.test_cases


# ------------------------------------------------------------------------------------------------ batching
def test_run_many_order_and_concurrency():
    box = Sandbox(SandboxConfig(timeout_s=5, workers=4))
    n = 8
    jobs = [f"import time\ntime.sleep(0.5)\nprint({i})" for i in range(n)]
    jobs[3] = ("print(input())", "from stdin")
    start = time.monotonic()
    results = box.run_many(jobs)
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == [f"{i}\n" if i != 3 else "from stdin\n" for i in range(n)]
    assert elapsed < 0.5 * n * 0.6, elapsed
    runs = box.run_tests_many([(PROGRAM, ["assert add(1, 1) == 2"], "add"), (PROGRAM, ["assert add(2, 2) == 4"], "add")])
    assert [r.passed for r in runs] == [1, 0]
    assert box.run_many([]) == []


def test_temp_dirs_are_removed(box, monkeypatch):
    # in a temporary directory of this test's own (world-writable like /tmp, for the runs' uids): the sandbox
    # runs of tests in other pytest-xdist workers come and go in /tmp meanwhile
    own = tempfile.mkdtemp(prefix="accord-test-tmp-")
    os.chmod(own, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", own)
    made = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **kw: made.append(mkdtemp(*a, **kw)) or made[-1])
    try:
        before = _sandbox_dirs()
        box.run("import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nos.chmod('a/b', 0)\nos.chmod('a', 0)")
        box.run_many(["print(1)"] * 3)
        assert _sandbox_dirs() - before == set()
        assert len([d for d in made if Path(d).parent == Path(own)]) >= 4  # the runs' directories were there
    finally:
        shutil.rmtree(own, ignore_errors=True)


def test_harness_bad_return_values_fail_cleanly(quick):
    program = ("import sys\n"
               "def f(kind):\n"
               "    if kind == 'recurse':\n        return f(kind)\n"
               "    if kind == 'huge':\n        return 'x' * (3 * 2**20)\n"
               "    if kind == 'many':\n        return [0] * 200_000\n"
               "    if kind == 'flood':\n        sys.stdout.write('y' * 10**6)\n        return 1\n"
               "    return kind\n")
    run = quick.run_tests(program, [f"assert f({k!r}) == 0" for k in ("recurse", "huge", "many")]
                          + ["assert f('ok') == 'ok'"], "f")
    errors = [c.error for c in run.result.test_cases]
    assert errors[0].startswith("RecursionError")
    assert errors[1].startswith("not plain data") and errors[2].startswith("not plain data"), errors
    assert (run.passed, run.result.status) == (1, "ok")
    run = quick.run_tests(program, ["assert f('ok') == 'ok'", "assert f('flood') == 1"], "f")
    assert (run.result.status, run.result.truncated) == ("output_limit", True)
    # the value reported before the flood counts; the flooding call fails (killed, or its pipe closed)
    assert run.passed == 1 and not run.result.test_cases[1].passed
