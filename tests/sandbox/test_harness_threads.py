"""The sandbox plans test suites on a thread pool, and CPython 3.11's ``ast.parse`` fails at random when two
threads parse at once ("SystemError: AST constructor recursion depth mismatch", seen in CI on HumanEval's
164 suites). The harness parses one source at a time."""

from __future__ import annotations

import ast
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from accord.sandbox import harness


def test_parse_tests_from_many_threads_parses_one_source_at_a_time(monkeypatch):
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
    suites = [(f"assert f({i}) == {i + 1}\nassert f(-{i}) == {1 - i}", "f") for i in range(16)]
    with ThreadPoolExecutor(max_workers=len(suites)) as pool:
        results = list(pool.map(lambda suite: harness.parse_tests(*suite), suites))   # re-raises a worker's error
    assert len(results) == len(suites) and all(len(parsed) == 2 for _, parsed in results)
    assert most[0] == 1, f"{most[0]} parses ran at once"
