from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from accord.report import moving_average, write_report

N_STEPS = 30


def _synthetic_run(run_dir: Path, *, config: str | None = None, nan_step: int | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for step in range(N_STEPS):
            alice = 0.1 + step * 0.02 + rng.normal(0, 0.02)
            bob = 0.2 + step * 0.01 + rng.normal(0, 0.02)
            row = {
                "step": step,
                "team/reward": (alice + bob) / 2,
                "agent/alice/reward": alice,
                "agent/bob/reward": bob,
                "agent/alice/completion_len": 100 - step,
                "agent/bob/completion_len": 80 + step,
                "loss/shared/pg": -0.1 + rng.normal(0, 0.01),
                "loss/shared/kl": 0.001 * step,
                "loss/shared/entropy": 1.0,
                "time/rollout": 2.0,
                "time/update": 1.0,
                "time/step": 3.0,
                "perf/gen_tokens_per_s": 1000.0 + step,
            }
            if step % 10 == 9:
                row["eval/reward"] = 0.3 + step * 0.01
            if step == nan_step:
                row["loss/shared/kl"] = float("nan")
            fh.write(json.dumps(row) + "\n")
    if config is not None:
        (run_dir / "config.yaml").write_text(config)


def _table_row(md: str, metric: str) -> list[str]:
    line = next(line for line in md.splitlines() if line.startswith(f"| `{metric}` |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_write_report_full(tmp_path):
    run = tmp_path / "run"
    _synthetic_run(
        run,
        config="run:\n  name: demo-run\nalgorithm:\n  name: magrpo\ntask: {}\n",
        nan_step=7,
    )
    report = write_report(run)
    assert report == run / "report" / "report.md"
    for name in ("reward.png", "loss.png", "lengths.png", "time.png"):
        path = run / "report" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(path)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 400

    md = report.read_text()
    assert md.startswith("# Training report: demo-run")
    assert "- **Algorithm:** magrpo" in md and "**Task:**" not in md  # task: {} has no name
    assert "| Metric | First | Last | Best | Mean of last 5 | Points |" in md
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    team = [r["team/reward"] for r in rows]
    cells = _table_row(md, "team/reward")
    assert cells[1] == f"{team[0]:.4g}" and cells[2] == f"{team[-1]:.4g}"
    assert cells[3].startswith(f"{max(team):.4g} (step {int(np.argmax(team))}")
    assert cells[4] == f"{np.mean(team[-5:]):.4g}" and cells[5] == str(N_STEPS)
    for metric in ("agent/alice/reward", "agent/bob/reward", "eval/reward"):
        _table_row(md, metric)
    assert _table_row(md, "eval/reward")[5] == "3"
    assert "Steps logged:** 30 (step 0 to 29)" in md
    assert "Total time:** 0:01:30 (90.0 s, sum of `time/step`)" in md
    assert f"Throughput:** {1000 + 14.5:.4g} generated tokens/s" in md
    assert "non-finite" in md and "`loss/shared/kl` (1)" in md
    for name in ("reward", "loss", "lengths", "time"):
        assert f"![{name}]({name}.png)" in md


def test_write_report_partial_data_and_out_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as fh:
        for step in range(3):
            fh.write(json.dumps({"step": step, "team/reward": step * 0.1, "time/rollout": 1.5}) + "\n")
    (run / "config.yaml").write_text("just a string\n")
    out = tmp_path / "elsewhere"
    (out).mkdir()
    (out / "report.md").write_text("# Training report: an earlier run\n")   # an earlier report there, with its plot
    (out / "loss.png").write_bytes(b"stale")
    report = write_report(run, out_dir=out)
    assert report == out / "report.md"
    assert sorted(p.name for p in out.glob("*.png")) == ["reward.png", "time.png"]
    md = report.read_text()
    assert md.startswith("# Training report: run")
    assert "config.yaml is not a mapping" in md
    assert "sum of all `time/*` phases" in md and "Throughput:** n/a" in md
    assert "loss.png" not in md


@pytest.mark.parametrize("files", [{"report.md": "my notes\n"}, {"success.png": "mine"},
                                   {"report.md": "my notes\n", "time.png": "mine"}])
def test_an_out_folder_with_files_no_report_wrote_is_refused(tmp_path, files):
    """--out DIR holding report.md or a plot's name that no report of accord's wrote is refused in one line, and
    nothing in it is touched (the report replaced and deleted such files without a word)."""
    from accord.config import ConfigError

    run = tmp_path / "run"
    _synthetic_run(run)
    out = tmp_path / "mydocs"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    (out / "other.txt").write_text("kept")
    with pytest.raises(ConfigError, match=rf"^--out {re.escape(str(out))} holds .*no report.md of accord's there "
                                          r"wrote them; .*give it another folder"):
        write_report(run, out_dir=out)
    assert {p.name: p.read_text() for p in out.iterdir()} == {**files, "other.txt": "kept"}


def test_a_report_that_fails_leaves_the_previous_one_as_it_was(tmp_path):
    """A report stopped part way (here by a folder where its loss plot goes; Ctrl-C or a full disk alike) leaves the
    previous report's plots and report.md as they were, not new plots beside an old report.md, and no staging
    folder; once the obstacle is gone the new report replaces the old one whole."""
    run = tmp_path / "run"
    _synthetic_run(run)
    write_report(run)
    out = run / "report"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:12]))   # a shorter run: every plot changes
    (out / "loss.png").unlink()
    (out / "loss.png").mkdir()
    with pytest.raises(IsADirectoryError, match="loss.png"):
        write_report(run)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == {name: data for name, data in before.items() if name != "loss.png"}
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["loss.png"]   # no staging folder left
    (out / "loss.png").rmdir()
    write_report(run)
    assert "Steps logged:** 12 (step 0 to 11)" in (out / "report.md").read_text()
    assert all((out / name).read_bytes() != data for name, data in before.items() if name.endswith(".png"))


def test_two_reports_into_one_folder_at_once_are_refused(tmp_path):
    import subprocess
    import sys

    from accord.config import ConfigError
    from accord.tracking.registry import hold_output_dir

    run = tmp_path / "run"
    _synthetic_run(run)
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time\nfrom pathlib import Path\nfrom accord.tracking.registry import hold_output_dir\n"
        f"with hold_output_dir(Path({str(out)!r}), 'accord report'):\n"
        "    print('held', flush=True)\n    time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"^{out} is in use by another accord command, writing its results "
                                              "there now; wait for it to end, or pass this accord report another "
                                              "folder with --out DIR$"):
            write_report(run, out_dir=out)
        assert not list(out.iterdir())
    finally:
        holder.kill()
        holder.wait()
    with hold_output_dir(out, "accord report"):   # the lock went with the process
        pass
    assert write_report(run, out_dir=out) == out / "report.md"


def test_write_report_missing_metrics(tmp_path):
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl does not exist.*accord train"):
        write_report(tmp_path / "empty_run")
    with pytest.raises(FileNotFoundError, match=r"no run to report: the directory .*no_run does not exist"):
        write_report(tmp_path / "no_run")


def test_write_report_empty_metrics(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="no logged steps"):
        write_report(tmp_path)


def test_moving_average_ignores_nan():
    out = moving_average(np.array([1.0, 3.0, math.nan, 5.0]), 2)
    assert out.tolist() == [1.0, 2.0, 3.0, 5.0]


def test_legends_never_cover_the_curves(tmp_path, monkeypatch):
    """Every legend of every plot sits outside its axes (components.png with six parts and lengths.png with the
    cap line used to put theirs over the curves)."""
    import accord.report as report

    run = tmp_path / "run"
    run.mkdir()
    rng = np.random.default_rng(0)
    parts = ["l1", "l2", "l3", "l4", "faithfulness", "source_overlap"]
    with open(run / "metrics.jsonl", "w") as fh:
        for step in range(21):
            row = {"step": step}
            if step:
                row["team/reward"] = 1.5 + 0.02 * step
                row["loss/main/pg"] = rng.normal()
                row["time/gen"], row["time/step"] = 1.0, 2.0
                for i, part in enumerate(parts):
                    row[f"reward/{part}"] = i / 6 + rng.normal(0, 0.05)
                for agent in ("concise", "detailed"):
                    row[f"agent/{agent}/reward"] = row["team/reward"]
                    row[f"agent/{agent}/completion_len"] = 50 + 25 * (agent == "detailed") - step
                    row[f"agent/{agent}/stop_frac"] = 0.3 + step * 0.03
            if step % 5 == 0:
                row["eval/team/reward"] = 1.2 + step * 0.03
                for i, part in enumerate(parts):
                    row[f"eval/reward/{part}"] = i / 6
                for agent in ("concise", "detailed"):
                    row[f"eval/agent/{agent}/completion_len"] = 52 - step
            fh.write(json.dumps(row) + "\n")
    (run / "config.yaml").write_text("run: {name: demo}\nrollout: {max_new_tokens: 80}\ntask: {name: writing}\n")
    figures = {}
    save = report._save

    def keep(fig, axes, path, *args, **kwargs):
        figures[Path(path).name] = (fig, axes)
        return save(fig, axes, path, *args, **kwargs)

    monkeypatch.setattr(report, "_save", keep)
    write_report(run)
    assert {"components.png", "lengths.png", "reward.png"} <= set(figures)
    for name, (fig, axes) in figures.items():
        renderer = fig.canvas.get_renderer()
        for ax in axes:
            legend = ax.get_legend()
            if legend is None:
                continue
            box, plot = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert box.x0 >= plot.x1 or box.y1 <= plot.y0, (name, ax.get_title(), box, plot)
            assert box.x1 <= fig.bbox.x1 + 1, (name, "legend cut off at the figure's edge")


def test_a_value_that_is_not_a_number_where_the_key_has_numbers_is_named(caplog):
    """A damaged value (a string where the key's other steps hold numbers) is left out of the plot with a warning
    naming the step and key; a key that is never a number (a note) and nulls say nothing."""
    from accord.report import _collect_series

    rows = [{"step": 1, "team/reward": 0.5, "note": "x"}, {"step": 2, "team/reward": "high", "loss": None},
            {"step": 3, "team/reward": 0.7, "loss": 1.0}]
    with caplog.at_level("WARNING", logger="accord.report"):
        series = _collect_series(rows)
    assert list(series["team/reward"].steps) == [1, 3] and list(series["loss"].steps) == [3] and "note" not in series
    assert [r.getMessage() for r in caplog.records] == [
        "metrics.jsonl: step 2: team/reward='high' is not a number; the report leaves it out (fix or delete that value)"]


def test_values_beyond_what_an_axis_can_span_are_counted_as_infinite(tmp_path, caplog):
    """-1e308 and 1e308 in one series: the axis would span more than a float holds and matplotlib's tick
    locator failed with a traceback (`arange: cannot compute length`). The report is written; the two values are
    named in a warning and counted with the non-finite ones."""
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as fh:
        for step, reward in enumerate([1.0, -1e308, 1e308, 2.0]):
            fh.write(json.dumps({"step": step, "team/reward": reward, "time/rollout": 1.5}) + "\n")
    with caplog.at_level("WARNING", logger="accord.report"):
        md = write_report(run).read_text()
    assert "`team/reward` (2)" in md and (run / "report" / "reward.png").exists()
    assert [r.getMessage() for r in caplog.records] == [
        "metrics.jsonl: team/reward has 2 value(s) beyond ±1e+300 (first at step 1: -1e+308), more than a plot's "
        "axis can span; the report counts them as infinite"]


def test_odd_numbers_in_the_completions_are_left_out(tmp_path):
    """A completion record whose return is text, or whose reward, advantage or reward part is an integer past a
    float: each ended `accord report` in a traceback (ValueError, OverflowError); the report is written, the odd
    numbers left out, the others shown."""
    run = tmp_path / "run"
    _synthetic_run(run)
    (run / "completions").mkdir()
    base = {"prompt": "p", "agent": "alice", "completion": "c", "group": 0, "turn": 0, "instance": "i\x1b[2J",
            "finish_reason": "stop", "joint": None, "sample": 0}
    rows = [{**base, "reward": 0.5, "return": "x", "advantage": 10 ** 400, "components": {"a": 10 ** 400, "b": 0.25}},
            {**base, "sample": 1, "group": 1, "reward": 10 ** 400, "return": 0.75, "advantage": 0.125}]
    (run / "completions" / "step_000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(run).read_text()
    # the reward past a float leaves its record unscored; the other's text return and huge advantage are not shown
    assert "1 scored completions" in md and "reward 0.5 (b 0.25)" in md and "*alice* (finish: stop):" in md
    assert "\x1b" not in md and "instance `i\\x1b[2J`" in md   # a terminal control in a field: shown, not obeyed
