from __future__ import annotations

import io
import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import accord.tracking as alog
from accord.tracking import (
    SINKS,
    ConsoleSink,
    JsonlSink,
    MetricAccumulator,
    MetricsSink,
    MultiSink,
    TensorBoardSink,
    make_sinks,
    read_metrics,
    register_sink,
)
from accord.tracking import jsonl as jsonl_mod

REPO_ROOT = Path(__file__).resolve().parents[2]


def _write_steps(run_dir: Path, steps) -> None:
    with JsonlSink(run_dir) as sink:
        for s in steps:
            sink.log(s, {"team/reward": s / 10, "loss/shared/pg": -s})


def test_stdlib_logging_not_shadowed():
    assert jsonl_mod.logging is logging
    assert alog.__name__ == "accord.tracking"


def test_jsonl_writes_and_reads(tmp_path):
    sink = JsonlSink(tmp_path / "run")
    sink.log(0, {"team/reward": 0.5, "agent/alice/reward": np.float32(0.25), "perf/tokens_per_s": 100})
    sink.log(1, {"team/reward": float("nan")})
    # flushed on every call: readable while the sink is still open
    rows = read_metrics(tmp_path / "run")
    assert rows[0] == {"step": 0, "team/reward": 0.5, "agent/alice/reward": 0.25, "perf/tokens_per_s": 100}
    assert rows[1]["step"] == 1 and math.isnan(rows[1]["team/reward"])
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        sink.log(2, {})
    # read_metrics also accepts the file path itself
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[0] == rows[0]


def test_jsonl_rejects_bad_input(tmp_path):
    with JsonlSink(tmp_path) as sink:
        with pytest.raises(ValueError, match="reserved"):
            sink.log(0, {"step": 1.0})
        with pytest.raises(TypeError, match="tensor.item"):
            sink.log(0, {"x": [1.0, 2.0]})
        with pytest.raises(TypeError, match="step must be an int"):
            sink.log(1.5, {})


def test_read_metrics_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=str(missing / "metrics.jsonl").replace("\\", "\\\\")):
        read_metrics(missing)


def test_read_metrics_corrupt_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "a": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: invalid JSON"):
        read_metrics(tmp_path)
    # a truncated *final* line (crash mid-write) is dropped with a warning
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "a": 1}\n{"step": 1, "a"')
    assert read_metrics(tmp_path) == [{"step": 0, "a": 1}]


def test_resume_cuts_back_a_linked_metrics_file_through_its_link(tmp_path):
    """metrics.jsonl a link into a shared folder: a new run writes through it, and the resume's cut replaced the link
    by a plain file, leaving the shared copy stale with the steps the resume dropped."""
    run, shared = tmp_path / "run", tmp_path / "shared"
    run.mkdir()
    shared.mkdir()
    (run / "metrics.jsonl").symlink_to(shared / "metrics.jsonl")
    with JsonlSink(run) as sink:
        for s in range(4):
            sink.log(s, {"team/reward": float(s)})
    with JsonlSink(run, resume_from_step=1) as sink:
        sink.log(2, {"team/reward": 20.0})
    assert (run / "metrics.jsonl").is_symlink()
    assert [r["step"] for r in read_metrics(shared)] == [0, 1, 2] and read_metrics(shared)[-1]["team/reward"] == 20.0


def test_resume_truncates_metrics_and_completions(tmp_path):
    run = tmp_path / "run"
    with JsonlSink(run) as sink:
        for s in range(10):
            sink.log(s, {"team/reward": float(s)})
            sink.log_completions(s, [{"prompt": "p", "agent": "a", "completion": str(s)}])
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 10, "team/rew')  # interrupted write

    with JsonlSink(run, resume_from_step=4) as sink:
        assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3, 4]
        assert sorted(p.name for p in (run / "completions").iterdir()) == [
            f"step_{s:06d}.jsonl" for s in range(5)
        ]
        sink.log(5, {"team/reward": 50.0})
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert rows[-1]["team/reward"] == 50.0
    assert not list(run.glob(".*tmp")), "temp file left behind"


def test_duplicate_step_warns(tmp_path, caplog):
    with JsonlSink(tmp_path) as sink, caplog.at_level(logging.WARNING, logger="accord.tracking.jsonl"):
        sink.log(3, {"a": 1.0})
        sink.log(3, {"a": 1.0})
    assert "duplicate" in caplog.text


def test_completions_file_contents(tmp_path):
    rows = [
        {"prompt": "2+2?", "agent": "alice", "completion": "4\nok", "reward": 1.0, "advantage": 0.5,
         "group": 0, "turn": 0, "extra": np.float64(0.1), "ids": np.arange(3)},
        {"prompt": "3+3?", "agent": "bob", "completion": "ünïcode", "reward": 0.0, "advantage": -0.5,
         "group": 0, "turn": 1},
    ]
    with JsonlSink(tmp_path) as sink:
        sink.log_completions(12, rows)
    path = tmp_path / "completions" / "step_000012.jsonl"
    assert path == alog.completions_path(tmp_path, 12)
    loaded = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert loaded[0]["completion"] == "4\nok" and loaded[0]["extra"] == 0.1 and loaded[0]["ids"] == [0, 1, 2]
    assert loaded[1] == rows[1]
    with JsonlSink(tmp_path) as sink, pytest.raises(TypeError, match="not JSON serializable"):
        sink.log_completions(13, [{"obj": object()}])
    assert not (tmp_path / "completions" / "step_000013.jsonl").exists()


def test_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardSink(tmp_path) as sink:
        for s in range(3):
            sink.log(s, {"team/reward": s * 0.5, "loss/shared/kl": np.float32(0.01)})
        sink.log_completions(2, [{"prompt": "p|q", "agent": "alice", "completion": "x", "reward": 1.0}] * 10)
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("team/reward")] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert "loss/shared/kl" in acc.Tags()["scalars"]
    text_tags = acc.Tags()["tensors"]
    assert any(t.startswith("completions") for t in text_tags)
    text = acc.Tensors(text_tags[0])[0].tensor_proto.string_val[0].decode()
    assert "| prompt | agent | completion | reward |" in text
    assert "p\\|q" in text and "showing 8 of 10 rows" in text


def test_console_sink_non_tty_capture(caplog):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=120)
    assert not console.is_terminal
    with caplog.at_level(logging.INFO, logger="accord.tracking.console"):
        sink = ConsoleSink(total_steps=5, keys=("team/reward", "agent/alice/reward"), every=2, console=console)
        for s in range(1, 6):
            sink.log(s, {"team/reward": (s - 1) / 4})
        sink.close()
        sink.close()
    lines = [r.getMessage() for r in caplog.records]
    # every 2 logged steps + the final step
    assert lines == [
        "step 2/5  team/reward=0.25  agent/alice/reward=-",
        "step 4/5  team/reward=0.75  agent/alice/reward=-",
        "step 5/5  team/reward=1  agent/alice/reward=-",
    ]
    out = buf.getvalue()
    assert "5/5" in out and "team/reward=1" in out  # final state rendered once on close
    assert "\x1b[" not in out  # no terminal control codes in a non-TTY stream


def test_console_sink_subprocess_piped_stdout(tmp_path):
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from accord.tracking import ConsoleSink\n"
        "s = ConsoleSink(total_steps=4, start_step=1)\n"
        "[s.log(i, {'team/reward': i - 1.0}) for i in range(2, 5)]\n"
        "s.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "step 4/4  team/reward=3" in proc.stderr
    assert "4/4" in proc.stdout


def test_console_sink_validation():
    with pytest.raises(ValueError, match="start_step"):
        ConsoleSink(total_steps=3, start_step=4)
    with pytest.raises(ValueError, match="every"):
        ConsoleSink(total_steps=3, every=0)


class _Recorder:
    def __init__(self, fail_close=False):
        self.calls = []
        self.fail_close = fail_close

    def log(self, step, metrics):
        self.calls.append(("log", step, dict(metrics)))

    def log_completions(self, step, rows):
        self.calls.append(("completions", step, len(rows)))

    def close(self):
        self.calls.append(("close",))
        if self.fail_close:
            raise OSError("disk gone")


def test_multisink_fans_out_and_closes_all():
    a, b, c = _Recorder(), _Recorder(fail_close=True), _Recorder()
    multi = MultiSink([a, b, c])
    assert isinstance(multi, MetricsSink)
    multi.log(1, {"x": 1.0})
    multi.log_completions(1, [{}, {}])
    with pytest.raises(OSError, match="disk gone"):
        multi.close()
    for r in (a, b, c):
        assert r.calls == [("log", 1, {"x": 1.0}), ("completions", 1, 2), ("close",)]
    with pytest.raises(TypeError, match="not a MetricsSink"):
        MultiSink([object()])


def test_make_sinks_and_registry(tmp_path):
    assert set(SINKS) >= {"jsonl", "tensorboard", "console"}
    with pytest.raises(ValueError, match="already registered"):
        register_sink("jsonl")(_Recorder)
    _write_steps(tmp_path, range(6))
    extra = _Recorder()
    multi = make_sinks(tmp_path, total_steps=10, start_step=3, console=False, extra=[extra])
    assert [type(s) for s in multi.sinks] == [JsonlSink, TensorBoardSink, _Recorder]
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]  # resume_from_step = start_step
    multi.log(4, {"team/reward": 1.0})
    multi.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_run_sinks_builds_each_sink_from_the_config(tmp_path):
    from accord.config import config_from_dict
    from accord.tracking.report_to import run_sinks

    cfg = config_from_dict({"run": {"steps": 10}, "logging": {"report_to": ["tensorboard"], "console": True}})
    _write_steps(tmp_path, range(6))
    multi = run_sinks(cfg, tmp_path, start_step=3)
    assert [type(s) for s in multi.sinks] == [JsonlSink, TensorBoardSink, ConsoleSink]
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]   # resume after step 3: cut back
    assert multi.sinks[2].start_step == 3 and multi.sinks[2].total_steps == 10
    multi.close()
    cfg = config_from_dict({"logging": {"report_to": [], "console": False}})
    assert [type(s) for s in run_sinks(cfg, tmp_path).sinks] == [JsonlSink]


def test_run_sinks_closes_what_it_built_when_a_sink_fails(tmp_path):
    from accord.config import config_from_dict
    from accord.tracking.report_to import run_sinks

    built = []

    @register_sink("test_not_a_sink")
    class NotASink:
        @classmethod
        def from_run(cls, cfg, run_dir, *, start_step):
            return object()

    @register_sink("test_recorder")
    class Recorder(_Recorder):
        @classmethod
        def from_run(cls, cfg, run_dir, *, start_step):
            built.append(cls())
            return built[-1]

    try:
        cfg = config_from_dict({"logging": {"report_to": ["test_recorder", "test_not_a_sink"], "console": False}})
        with pytest.raises(TypeError, match="from_run must return a sink with log.*, got 'object'"):
            run_sinks(cfg, tmp_path)
        assert built[0].calls == [("close",)]
        assert not (tmp_path / "metrics.jsonl").exists()   # the report_to sinks are built first
    finally:
        SINKS.pop("test_not_a_sink")
        SINKS.pop("test_recorder")


def test_a_registered_class_without_from_run_is_a_config_error():
    from accord.config import ConfigError
    from accord.tracking.report_to import check_report_to

    register_sink("test_no_factory")(_Recorder)
    try:
        with pytest.raises(ConfigError, match=r"sink 'test_no_factory' \(.*_Recorder\) has no from_run"):
            check_report_to(["test_no_factory"])
    finally:
        SINKS.pop("test_no_factory")


def test_metric_accumulator():
    acc = MetricAccumulator()
    acc.add("reward", 1.0, weight=1.0)
    acc.add("reward", 4.0, weight=3.0)
    acc.add_many({"len": 10, "loss": np.float32(2.0)})
    acc.add_many({"len": 20})
    acc.add("never_weighted", 5.0, weight=0.0)
    acc.add("bad", float("nan"))
    acc.add("bad", 1.0)
    acc.add("zero_w_inf", float("inf"), weight=0.0)
    acc.add("zero_w_inf", 2.0)
    mean = acc.mean()
    assert mean["reward"] == pytest.approx((1 + 12) / 4)
    assert mean["len"] == 15 and mean["loss"] == 2.0
    assert math.isnan(mean["never_weighted"])  # key kept
    assert math.isnan(mean["bad"])  # NaN kept for the trainer to detect
    assert mean["zero_w_inf"] == 2.0
    assert len(acc) == 6 and "reward" in acc
    with pytest.raises(ValueError, match="weight"):
        acc.add("reward", 1.0, weight=-1)
    acc.reset()
    assert acc.mean() == {}
