"""The sandbox plans test suites and runs programs on a thread pool, and CPython 3.11's ``ast.parse`` fails at
random when two threads parse at once ("SystemError: AST constructor recursion depth mismatch", seen in CI on
HumanEval's 164 suites). Every parse on that pool (the harness's, and the sandbox root's reading of the
interpreter's ``sys.path`` on first use) goes through one lock."""

from __future__ import annotations

import ast
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from accord.sandbox import harness, isolation


def counting_parse(monkeypatch) -> list[int]:
    """Replace ``ast.parse`` by a slow one that records the most calls ever inside it at once."""
    real_parse = ast.parse
    inside, most = [0], [0]
    count = threading.Lock()

    def slow_parse(source, *args, **kwargs):
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)          # long enough for another thread to enter if nothing holds it out
        try:
            return real_parse(source, *args, **kwargs)
        finally:
            with count:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    return most


def test_parse_tests_from_many_threads_parses_one_source_at_a_time(monkeypatch):
    most = counting_parse(monkeypatch)
    suites = [(f"assert f({i}) == {i + 1}\nassert f(-{i}) == {1 - i}", "f") for i in range(16)]
    with ThreadPoolExecutor(max_workers=len(suites)) as pool:
        results = list(pool.map(lambda suite: harness.parse_tests(*suite), suites))   # re-raises a worker's error
    assert len(results) == len(suites) and all(len(parsed) == 2 for _, parsed in results)
    assert most[0] == 1, f"{most[0]} parses ran at once"


def test_the_sandbox_root_reads_sys_path_under_the_same_lock(monkeypatch):
    monkeypatch.setattr(isolation, "_spec_cache", {})      # computed afresh, as on a process's first run
    most = counting_parse(monkeypatch)
    suites = [(f"assert f({i}) == {i}", "f") for i in range(8)]
    with ThreadPoolExecutor(max_workers=len(suites) + 1) as pool:
        spec = pool.submit(isolation.root_spec, False)
        results = list(pool.map(lambda suite: harness.parse_tests(*suite), suites))
        assert spec.result().binds
    assert len(results) == len(suites)
    assert most[0] == 1, f"{most[0]} parses ran at once"
