"""A model's text on the way out: run files, the report, TensorBoard's table and the console show it as text.

The policy writes any characters: line separators other than ``\\n`` (U+2028, U+2029, U+0085), lone
surrogates, terminal controls (ESC sequences that recolour, retitle or clear; CR), markdown and HTML. None of
them may split a JSON line, stop a writer, hide a step's samples from the report, render as a link or an image,
or reach the terminal as a control.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accord.envs.protocol import RAISED_MESSAGE_CHARS, EnvOutputError, step_env
from accord.report import write_report
from accord.tracking import JsonlSink, TensorBoardSink
from accord.tracking.console import PLAIN_FORMAT, PrintableFormatter, printable
from accord.tracking.eval_completions import eval_completions_path, write_eval_completions
from accord.tracking.registry import json_line
from accord.tracking.tensorboard import completions_markdown
from accord.tracking.trackers import _table

HOSTILE = ["ends a line\u2028here", "next\x85line", "para\u2029graph", "lone \ud800 surrogate",
           "\x1b]0;title\x07\r\x1b[2J cleared", "<img src=http://a.example/p.png> ![i](http://a.example/i.png)"]


def _rows(texts):
    return [{"prompt": "p", "agent": "a", "instance": str(i), "completion": t, "reward": float(i)}
            for i, t in enumerate(texts)]


def test_json_line_escapes_what_would_split_or_not_encode():
    for text in HOSTILE:
        line = json_line({"completion": text})
        line.encode("utf-8")   # a lone surrogate would raise here
        assert len(line.splitlines()) == 1 and json.loads(line) == {"completion": text}
    assert json_line({"t": "é 😀"}) == '{"t": "é 😀"}'   # other text stays as it is


def test_run_files_hold_one_line_per_row(tmp_path):
    rows = _rows(HOSTILE)
    with JsonlSink(tmp_path) as sink:
        sink.log_completions(1, rows)
    write_eval_completions(tmp_path, 1, rows)
    for path in (tmp_path / "completions" / "step_000001.jsonl", eval_completions_path(tmp_path, 1)):
        text = path.read_text(encoding="utf-8")
        assert [json.loads(line) for line in text.splitlines()] == rows


def test_report_reads_lines_at_newlines_only_and_names_a_bad_line(tmp_path, caplog):
    """A table written with the separators raw (as before json_line) and a damaged line: the report still shows
    the step's best and worst samples, and warns naming the damaged line."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "team/reward": 0.5}) + "\n")
    rows = _rows(["worst\u2028text", "middle", "BEST\x85TEXT\x1b[2J"])
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    lines.insert(1, '{"prompt": "cut')
    (tmp_path / "completions").mkdir()
    (tmp_path / "completions" / "step_000001.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        report = write_report(tmp_path).read_text(encoding="utf-8")
    assert "BEST\\x85TEXT\\x1b[2J" in report and "worst\u2028text" in report   # controls shown as escapes
    assert "\x1b" not in report and "\x85" not in report
    assert "Last training step: step 1" in report and "3 scored" in report
    assert any("1 line(s) left out" in r.getMessage() and "line 2" in r.getMessage() for r in caplog.records)


def test_report_says_when_tables_hold_nothing_scored(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "team/reward": 0.5}) + "\n")
    (tmp_path / "completions").mkdir()
    (tmp_path / "completions" / "step_000001.jsonl").write_text("not json\n", encoding="utf-8")
    report = write_report(tmp_path).read_text(encoding="utf-8")
    assert "No scored completions in the newest completion tables (`completions/step_000001.jsonl`)" in report
    assert "completions_every is 0" not in report


def test_tensorboard_table_renders_model_markup_as_text(tmp_path):
    from tensorboard import plugin_util

    text = ('<img src="http://a.example/p.png"> ![x](http://a.example/i.png) [docs](http://a.example) `c` **b** '
            '| cell | <script>alert(1)</script> &lt; \ud800')
    html = plugin_util.markdown_to_safe_html(completions_markdown(_rows([text])))
    assert "<img" not in html and "<a " not in html and "<script" not in html and "<code>" not in html
    assert "<strong>" not in html and html.count("<td>") == 5   # one row of five cells: no injected cell
    assert "![x](http://a.example/i.png)" in html and "&amp;lt;" in html
    with TensorBoardSink(tmp_path) as sink:   # a lone surrogate does not stop the writer
        sink.log_completions(1, _rows(HOSTILE))


def test_tracker_tables_take_lone_surrogates():
    columns, data = _table(_rows(HOSTILE) + [{"completion": ["x\ud800"]}])
    for row in data:
        for cell in row:
            if isinstance(cell, str):
                cell.encode("utf-8")


def test_log_lines_show_terminal_controls_as_escapes():
    formatter = PrintableFormatter(PLAIN_FORMAT)
    record = logging.LogRecord("accord", logging.ERROR, __file__, 1, "move %s", ("\x1b]0;t\x07\r\x1b[32mok\u202e",),
                               None)
    line = formatter.format(record)
    assert "\x1b" not in line and "\r" not in line and "\x07" not in line and "\u202e" not in line
    assert line.endswith("move \\x1b]0;t\\x07\\r\\x1b[32mok\\u202e")
    assert printable("tab\tand\nnewline, é 😀") == "tab\tand\nnewline, é 😀"


class _QuotingEnv:
    """An environment that quotes the move in its exception, as many hand-written ones do."""
    agents = ["a"]

    def step(self, actions):
        raise ValueError(f"illegal move: {actions['a']}")


def test_an_environment_quoting_a_long_move_is_cut():
    with pytest.raises(EnvOutputError) as info:
        step_env(_QuotingEnv(), {"a": "x" * 10_000})
    message = str(info.value)
    assert len(message) < RAISED_MESSAGE_CHARS + 400 and "(10014 characters)" in message


def test_cli_error_line_reaches_stderr_without_controls(tmp_path):
    """The real CLI, stopped by a hand-written environment whose error quotes a move holding terminal controls."""
    (tmp_path / "quoting_env.py").write_text(
        "class Env:\n"
        "    name, agents, simultaneous, max_turns = 'moves', ('e', 'o'), True, 1\n"
        "    def tasks(self, split, limit=None, seed=0):\n"
        "        base = 0 if split == 'train' else 1000\n"
        "        return [{'id': f'{split}-{i}'} for i in range(base, base + (limit or 8))]\n"
        "    def instructions(self, agent): return 'Name a move.'\n"
        "    def reset(self, task, seed=0): return {a: 'your move' for a in self.agents}\n"
        "    def acting(self): return self.agents\n"
        "    def step(self, actions): raise ValueError('illegal move: \\x1bc\\x1b]0;done\\x07\\r\\x1b[32mINFO ok')\n"
        "    def clone(self): return Env()\n")
    proc = subprocess.run(
        [sys.executable, "-m", "accord.cli", "train", "examples/tiny.yaml", f"run.run_dir={tmp_path / 'run'}",
         "task.name=quoting_env:Env", "run.steps=1", "logging.report_to=[]"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "illegal move: \\x1bc\\x1b]0;done\\x07\\r\\x1b[32mINFO ok" in proc.stderr, proc.stderr[-2000:]
    assert "\x1b" not in proc.stderr and "\r" not in proc.stderr
