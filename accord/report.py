"""Static training report: PNG plots + a markdown summary of a run directory.

``write_report(run_dir)`` reads ``run_dir/metrics.jsonl`` (written by
:class:`accord.logging.JsonlSink`) and, if present, ``run_dir/config.yaml``,
and writes ``run_dir/report/`` with ``report.md`` and the plots for which the
run has data: ``reward.png``, ``loss.png``, ``lengths.png``, ``time.png``.

Plots use matplotlib's object API with an explicit Agg canvas, so no display
is needed and the global pyplot backend is left untouched.
"""

from __future__ import annotations

import datetime as _dt
import logging as _logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from accord.logging.sinks import METRICS_FILENAME, read_metrics

__all__ = ["PLOT_FILES", "write_report"]

_logger = _logging.getLogger(__name__)

CONFIG_FILENAME = "config.yaml"
REPORT_FILENAME = "report.md"
PLOT_FILES = ("reward.png", "loss.png", "lengths.png", "time.png")

_AGENT_REWARD_RE = re.compile(r"^agent/([^/]+)/reward$")
_AGENT_LEN_RE = re.compile(r"^agent/([^/]+)/completion_len$")
_LOSS_RE = re.compile(r"^loss/(.+)/(pg|kl)$")
_TIME_RE = re.compile(r"^time/(.+)$")
_LOSS_TITLES = {"pg": "policy-gradient loss (loss/<policy>/pg)", "kl": "KL (loss/<policy>/kl)"}
# Metrics where smaller is better (for the "best" column); everything else: larger is better.
_LOWER_IS_BETTER = ("loss", "kl", "error", "err", "perplexity", "ppl", "len", "time")


@dataclass(frozen=True)
class _Series:
    steps: np.ndarray
    values: np.ndarray

    @property
    def finite(self) -> np.ndarray:
        return self.values[np.isfinite(self.values)]


# --------------------------------------------------------------------------- data


def _dedupe_by_step(rows: list[dict]) -> list[dict]:
    """Sort by step; if a step appears more than once keep its last record."""
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step[row["step"]] = row
    if len(by_step) != len(rows):
        _logger.warning(
            "metrics.jsonl has %d duplicated step record(s) (a resume without truncation?); "
            "the report uses the last record of each step",
            len(rows) - len(by_step),
        )
    return [by_step[s] for s in sorted(by_step)]


def _collect_series(rows: Sequence[dict]) -> dict[str, _Series]:
    steps: dict[str, list[int]] = {}
    values: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # null / strings / nested values are not plottable
            steps.setdefault(key, []).append(row["step"])
            values.setdefault(key, []).append(float(value))
    return {
        key: _Series(np.asarray(steps[key], dtype=np.int64), np.asarray(values[key], dtype=np.float64))
        for key in steps
    }


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average ignoring non-finite values (NaN where a window has none)."""
    values = np.asarray(values, dtype=np.float64)
    if window <= 1 or values.size == 0:
        return values.copy()
    finite = np.isfinite(values)
    filled = np.where(finite, values, 0.0)
    csum = np.concatenate([[0.0], np.cumsum(filled)])
    ccount = np.concatenate([[0], np.cumsum(finite)])
    idx = np.arange(values.size)
    lo = np.maximum(0, idx + 1 - window)
    sums = csum[idx + 1] - csum[lo]
    counts = ccount[idx + 1] - ccount[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _window(n: int) -> int:
    return max(1, n // 10)


def _nested(config: Any, *keys: str) -> Any:
    node = config
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _load_config_summary(path: Path) -> tuple[list[tuple[str, str]], str | None]:
    """(label, value) pairs for run / algorithm / task names, plus an optional note."""
    if not path.is_file():
        return [], f"no {CONFIG_FILENAME} in the run directory"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        _logger.warning("could not parse %s (%s); the report omits the config summary", path, err)
        return [], f"{CONFIG_FILENAME} could not be parsed"
    if not isinstance(config, dict):
        return [], f"{CONFIG_FILENAME} is not a mapping"
    summary = []
    for label, keys in (("Run", ("run", "name")), ("Algorithm", ("algorithm", "name")), ("Task", ("task", "name"))):
        value = _nested(config, *keys)
        if value is not None and not isinstance(value, (dict, list)):
            summary.append((label, str(value)))
    return summary, None if summary else f"{CONFIG_FILENAME} has no run/algorithm/task names"


# --------------------------------------------------------------------------- plots


def _new_figure(nrows: int = 1, height: float = 4.5) -> tuple[Figure, list]:
    fig = Figure(figsize=(9, height * nrows), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # explicit non-interactive canvas: never needs a display
    axes = [fig.add_subplot(nrows, 1, i + 1) for i in range(nrows)]
    return fig, axes


def _plot_smoothed(ax, series: _Series, label: str, color: str | None = None) -> None:
    window = _window(series.values.size)
    if window == 1:
        ax.plot(series.steps, series.values, color=color, linewidth=1.6, label=label)
        return
    (raw,) = ax.plot(series.steps, series.values, color=color, linewidth=0.9, alpha=0.35)
    ax.plot(series.steps, moving_average(series.values, window), color=raw.get_color(), linewidth=2.0,
            label=f"{label} (MA {window})")


def _finish(fig: Figure, ax, title: str, ylabel: str, smoothed: bool, path: Path) -> Path:
    if smoothed:
        title += "\n(thin: raw, thick: moving average)"
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.savefig(path)
    return path


def _is_smoothed(series: Iterable[_Series]) -> bool:
    return any(_window(s.values.size) > 1 for s in series)


def _plot_rewards(series: dict[str, _Series], out: Path) -> Path | None:
    team = series.get("team/reward")
    agents = sorted(k for k in series if _AGENT_REWARD_RE.match(k))
    evals = sorted(k for k in series if k.startswith("eval/") and "reward" in k)
    if team is None and not agents and not evals:
        return None
    fig, (ax,) = _new_figure()
    if team is not None:
        _plot_smoothed(ax, team, "team/reward", color="black")
    for key in agents:
        _plot_smoothed(ax, series[key], key)
    for key in evals:
        ax.plot(series[key].steps, series[key].values, marker="o", linestyle="--", linewidth=1.0, label=key)
    smoothed = _is_smoothed([series[k] for k in (["team/reward"] if team is not None else []) + agents])
    return _finish(fig, ax, "Reward", "reward", smoothed, out / "reward.png")


def _plot_losses(series: dict[str, _Series], out: Path) -> Path | None:
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for key in sorted(series):
        match = _LOSS_RE.match(key)
        if match:
            by_kind.setdefault(match.group(2), []).append((match.group(1), key))
    kinds = [k for k in ("pg", "kl") if k in by_kind]
    if not kinds:
        return None
    fig, axes = _new_figure(len(kinds), height=3.6)
    smoothed = False
    for ax, kind in zip(axes, kinds):
        for policy, key in by_kind[kind]:
            _plot_smoothed(ax, series[key], policy)
        smoothed = smoothed or _is_smoothed(series[key] for _, key in by_kind[kind])
        ax.set_title(_LOSS_TITLES[kind])
        ax.set_ylabel(kind)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small", title="policy")
    axes[-1].set_xlabel("step")
    if smoothed:
        fig.suptitle("Losses (thin: raw, thick: moving average)")
    path = out / "loss.png"
    fig.savefig(path)
    return path


def _plot_lengths(series: dict[str, _Series], out: Path) -> Path | None:
    keys = sorted(k for k in series if _AGENT_LEN_RE.match(k))
    if not keys:
        return None
    fig, (ax,) = _new_figure()
    for key in keys:
        _plot_smoothed(ax, series[key], _AGENT_LEN_RE.match(key).group(1))
    return _finish(fig, ax, "Completion length per agent", "tokens", _is_smoothed(series[k] for k in keys),
                   out / "lengths.png")


def _plot_time(series: dict[str, _Series], out: Path) -> Path | None:
    keys = sorted(k for k in series if _TIME_RE.match(k))
    if not keys:
        return None
    fig, (ax,) = _new_figure()
    for key in keys:
        s = series[key]
        if key == "time/step" and len(keys) > 1:
            ax.plot(s.steps, s.values, color="black", linestyle="--", linewidth=1.5, label="step (total)")
        else:
            ax.plot(s.steps, s.values, linewidth=1.4, label=_TIME_RE.match(key).group(1))
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, "Time per phase", "seconds", False, out / "time.png")


# --------------------------------------------------------------------------- markdown


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.4g}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _lower_is_better(key: str) -> bool:
    tokens = set(re.split(r"[_\-.]", key.rsplit("/", 1)[-1].lower()))
    return bool(tokens & set(_LOWER_IS_BETTER))


def _summary_row(key: str, s: _Series) -> str:
    finite_mask = np.isfinite(s.values)
    if not finite_mask.any():
        cells = ["n/a"] * 4
    else:
        vals = s.values[finite_mask]
        lower = _lower_is_better(key)
        best_idx = int(np.argmin(vals) if lower else np.argmax(vals))
        best_step = int(s.steps[finite_mask][best_idx])
        cells = [
            _fmt(vals[0]),
            _fmt(vals[-1]),
            f"{_fmt(vals[best_idx])} (step {best_step}{', min' if lower else ''})",
            _fmt(float(vals[-5:].mean())),
        ]
    return f"| `{_md_escape(key)}` | " + " | ".join(cells) + f" | {s.values.size} |"


def _fmt_duration(seconds: float) -> str:
    return str(_dt.timedelta(seconds=round(seconds)))


def _render_markdown(
    run_dir: Path,
    rows: list[dict],
    series: dict[str, _Series],
    config_summary: list[tuple[str, str]],
    config_note: str | None,
    images: list[Path],
) -> str:
    run_name = next((v for label, v in config_summary if label == "Run"), None) or run_dir.resolve().name
    lines = [f"# Training report: {run_name}", ""]

    lines += ["## Configuration", ""]
    lines += [f"- **{label}:** {value}" for label, value in config_summary]
    if config_note:
        lines.append(f"- _{config_note}_")
    lines.append(f"- **Run directory:** `{run_dir.resolve()}`")
    lines.append("")

    steps = [row["step"] for row in rows]
    lines += ["## Overview", ""]
    lines.append(f"- **Steps logged:** {len(rows)} (step {steps[0]} to {steps[-1]})")
    if "time/step" in series:
        total, source = float(series["time/step"].finite.sum()), "sum of `time/step`"
    else:
        time_keys = [k for k in series if _TIME_RE.match(k)]
        total = float(sum(series[k].finite.sum() for k in time_keys)) if time_keys else None
        source = "sum of all `time/*` phases"
    if total is not None:
        lines.append(f"- **Total time:** {_fmt_duration(total)} ({total:.1f} s, {source})")
    else:
        lines.append("- **Total time:** n/a (no `time/*` metrics)")
    tput = series.get("perf/gen_tokens_per_s")
    if tput is not None and tput.finite.size:
        lines.append(f"- **Throughput:** {_fmt(float(tput.finite.mean()))} generated tokens/s (mean of `perf/gen_tokens_per_s`)")
    else:
        lines.append("- **Throughput:** n/a (no `perf/gen_tokens_per_s`)")
    lines.append("")

    main = (["team/reward"] if "team/reward" in series else []) + sorted(
        k for k in series if _AGENT_REWARD_RE.match(k)
    ) + sorted(k for k in series if k.startswith("eval/"))
    lines += ["## Main metrics", ""]
    if main:
        lines.append("| Metric | First | Last | Best | Mean of last 5 | Points |")
        lines.append("|---|---|---|---|---|---|")
        lines += [_summary_row(key, series[key]) for key in main]
        lines.append("")
        lines.append("_Best is the maximum (minimum for loss/length/time-like metrics); non-finite values are ignored._")
    else:
        lines.append("_No `team/reward`, `agent/<name>/reward` or `eval/*` metrics were logged._")
    nonfinite = {k: int((~np.isfinite(s.values)).sum()) for k, s in series.items()}
    nonfinite = {k: n for k, n in nonfinite.items() if n}
    if nonfinite:
        lines.append("")
        lines.append("**Warning — non-finite (NaN/inf) values:** " + ", ".join(
            f"`{_md_escape(k)}` ({n})" for k, n in sorted(nonfinite.items())
        ))
    lines.append("")

    lines += ["## Plots", ""]
    if images:
        for image in images:
            lines += [f"![{image.stem}]({image.name})", ""]
    else:
        lines += ["_No plottable metrics._", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- entry point


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write plots and ``report.md`` for a training run; returns the path of report.md.

    ``out_dir`` defaults to ``run_dir/report``. Plots are only written for
    metric groups present in the run; stale plots of absent groups left by an
    earlier report in ``out_dir`` are removed.
    """
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILENAME
    if not metrics_path.is_file():
        raise FileNotFoundError(
            f"no metrics to report: {metrics_path} does not exist. Run `accord train` first "
            f"(it writes {METRICS_FILENAME} into the run directory), or pass the run directory that contains it."
        )
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(
            f"{metrics_path} contains no logged steps; let `accord train` run at least one step before reporting"
        )
    rows = _dedupe_by_step(rows)
    series = _collect_series(rows)
    config_summary, config_note = _load_config_summary(run_dir / CONFIG_FILENAME)

    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    images: list[Path] = []
    for plot in (_plot_rewards, _plot_losses, _plot_lengths, _plot_time):
        path = plot(series, out)
        if path is not None:
            images.append(path)
    for name in PLOT_FILES:
        stale = out / name
        if stale not in images and stale.is_file():
            stale.unlink()

    report_path = out / REPORT_FILENAME
    report_path.write_text(
        _render_markdown(run_dir, rows, series, config_summary, config_note, images), encoding="utf-8"
    )
    _logger.info("wrote report %s (%d plot(s))", report_path, len(images))
    return report_path
