"""Static training report: PNG plots + a markdown summary of a run directory.

``write_report(run_dir)`` reads ``run_dir/metrics.jsonl`` (written by
:class:`accord.tracking.JsonlSink`), ``run_dir/config.yaml`` if present, the last
completions table (``completions/step_N.jsonl``) and the last evaluation's
completions (``eval_completions/step_N.jsonl``), and writes ``run_dir/report/``
with ``report.md`` and the plots for which the run has data:

* ``reward.png``: team reward (training and held-out), agents' rewards;
* ``success.png``: success rate (training and held-out), where the task has one;
* ``components.png``: the reward's named parts (``reward/<name>``, ``eval/reward/<name>``);
* ``loss.png``: policy-gradient loss, KL, sampling entropy and gradient norm per policy;
* ``lengths.png``: completion length per agent and the share cut at the token cap
  (``1 - agent/<name>/stop_frac``);
* ``time.png``: seconds per phase.

Curves with identical values (e.g. an agent's reward that is the team reward) are drawn once,
labelled with every name. ``report.md`` starts with the held-out result before -> after, and
shows the best and worst joint action of the last logged step and of the last evaluation.

Plots use matplotlib's object API with an explicit Agg canvas, so no display
is needed and the global pyplot backend is left untouched.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging as _logging
import math
import os
import re
import shutil
import tempfile
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from accord import metric_names as mn
from accord.tracking.console import held_out_summary, printable, training_summary
from accord.tracking.eval_completions import EVAL_COMPLETIONS_DIRNAME
from accord.tracking.jsonl import COMPLETIONS_DIRNAME, METRICS_FILENAME, MetricsFileError, read_metrics
from accord.tracking.registry import (_atomic_save, _atomic_write_text, _not_a_folder, folder_problem, hold_output_dir,
                                      made_dirs, remove_empty)

__all__ = ["PLOT_FILES", "write_report"]

_logger = _logging.getLogger(__name__)

CONFIG_FILENAME = "config.yaml"
REPORT_FILENAME = "report.md"
PLOT_FILES = ("reward.png", "success.png", "components.png", "loss.png", "lengths.png", "time.png")

_AGENT_REWARD_RE = mn.agent_pattern(mn.AGENT_REWARD)
_AGENT_LEN_RE = mn.agent_pattern(mn.AGENT_COMPLETION_LEN)
_AGENT_STOP_RE = mn.agent_pattern(mn.AGENT_STOP_FRAC)
_EVAL_AGENT_RETURN_RE = mn.agent_pattern(mn.AGENT_RETURN, held_out=True)
_EVAL_AGENT_LEN_RE = mn.agent_pattern(mn.AGENT_COMPLETION_LEN, held_out=True)
_COMPONENT_RE = mn.COMPONENT_PATTERN
_TIME_RE = mn.TIME_PATTERN
_LEARNED_RE = mn.LEARNED_PATTERN
_LOSS_TITLES = {stat: f"{title} ({mn.loss_key('<policy>', stat)})" for stat, title in (
    (mn.PG, "policy-gradient loss"), (mn.KL, "KL to the reference"), (mn.ENTROPY, "sampling entropy per token"),
    (mn.GRAD_NORM, "gradient norm before clipping"))}
_LOSS_RE = mn.loss_pattern(_LOSS_TITLES)
# "Best": the maximum of these (the last path segment) ...
_HIGHER_IS_BETTER = {"reward", "reward_best", "return", "success", "team_reward", "local_reward", "accuracy",
                     "explained_variance"}
# ... the minimum of these; every other metric (lengths, times, ...) has no "best".
_LOWER_IS_BETTER = {"pg", "kl", "loss", "nll"}
_MEAN_OF_LAST = 5
# A finite value of larger magnitude is counted as infinite: a plot's axis spans its data's max - min, which
# overflows a float from about 9e307 (matplotlib's tick locator then fails); no metric of a run comes near it.
_AXIS_LIMIT = 1e300
_MAX_SHOWN_CHARS = 1500
# a completions file larger than this is not read (a step's records are some megabytes: rows x prompt and text)
MAX_COMPLETIONS_BYTES = 512 << 20


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
    other: dict[str, tuple[int, Any]] = {}   # a key's first value that is not a number (null aside)
    for row in rows:
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                if key != "step" and value is not None:
                    other.setdefault(key, (row["step"], value))
                continue  # null / strings / nested values are not plottable
            steps.setdefault(key, []).append(row["step"])
            values.setdefault(key, []).append(float(value))
    for key, (step, value) in other.items():
        if key in steps:   # a number elsewhere: this one was damaged, not a metric of another kind
            _logger.warning("metrics.jsonl: step %d: %s=%.40r is not a number; the report leaves it out (fix or delete "
                            "that value)", step, key, value)
    return {key: _Series(np.asarray(steps[key], dtype=np.int64), _within_axis(key, steps[key], values[key]))
            for key in steps}


def _within_axis(key: str, steps: list[int], values: list[float]) -> np.ndarray:
    """``values`` as an array, those beyond ``_AXIS_LIMIT`` in magnitude made infinite (with a warning)."""
    array = np.asarray(values, dtype=np.float64)
    huge = np.isfinite(array) & (np.abs(array) > _AXIS_LIMIT)
    if huge.any():
        first = int(np.argmax(huge))
        _logger.warning("metrics.jsonl: %s has %d value(s) beyond ±%g (first at step %d: %r), more than a plot's axis "
                        "can span; the report counts them as infinite", key, int(huge.sum()), _AXIS_LIMIT,
                        steps[first], values[first])
        array = np.where(huge, np.copysign(np.inf, array), array)
    return array


def _same(a: _Series, b: _Series) -> bool:
    return a.steps.shape == b.steps.shape and bool(np.array_equal(a.steps, b.steps)) and bool(
        np.allclose(a.values, b.values, rtol=0.0, atol=1e-12, equal_nan=True))


def _merge_identical(items: Sequence[tuple[str, _Series]]) -> list[tuple[list[str], _Series]]:
    """Group series with the same steps and values: each group is drawn once, labelled with all names."""
    groups: list[tuple[list[str], _Series]] = []
    for name, series in items:
        for names, first in groups:
            if _same(first, series):
                names.append(name)
                break
        else:
            groups.append(([name], series))
    return groups


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


def _load_config(path: Path) -> tuple[dict | None, str | None]:
    """The run's config as a mapping (None when absent or unreadable), plus a note saying why not."""
    if not path.is_file():
        return None, f"no {CONFIG_FILENAME} in the run directory"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as err:
        why = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())   # YAML's marks: one line
        _logger.warning("could not parse %s (%s); the report omits the config summary", path, why[:300])
        return None, f"{CONFIG_FILENAME} could not be parsed"
    if not isinstance(config, dict):
        return None, f"{CONFIG_FILENAME} is not a mapping"
    return config, None


def _config_summary(config: dict | None, note: str | None) -> tuple[list[tuple[str, str]], str | None]:
    """(label, value) pairs for run / algorithm / task names, plus an optional note."""
    if config is None:
        return [], note
    summary = []
    for label, keys in (("Run", ("run", "name")), ("Algorithm", ("algorithm", "name")), ("Task", ("task", "name"))):
        value = _nested(config, *keys)
        if value is not None and not isinstance(value, (dict, list)):
            summary.append((label, str(value)))
    return summary, None if summary else f"{CONFIG_FILENAME} has no run/algorithm/task names"


def _latest_jsonl(directory: Path) -> tuple[int, list[dict]] | None:
    """(step, rows) of the newest ``step_N.jsonl`` in ``directory``; None when there is none. Lines are split
    at ``\\n`` only (a completion's text may hold other line breaks, U+2028 say); a line that is not a JSON
    object is left out with a warning naming it."""
    files = sorted(directory.glob("step_*.jsonl")) if directory.is_dir() else []
    for path in reversed(files):
        match = re.fullmatch(r"step_(\d+)\.jsonl", path.name)
        if not match:
            continue
        if not path.is_file() or path.stat().st_size > MAX_COMPLETIONS_BYTES:   # a pipe would never end, a huge
            _logger.warning("%s is %s; the report shows no completions of it", path,   # file fill the memory
                            "not a regular file" if not path.is_file() else
                            f"larger than {MAX_COMPLETIONS_BYTES >> 20} MiB, more than a step's completions")
            continue
        rows, bad = [], []
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as err:
                bad.append(f"{lineno} ({getattr(err, 'msg', None) or type(err).__name__})")
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad.append(f"{lineno} (a JSON {type(row).__name__}, not an object)")
        if bad:
            _logger.warning("%s: %d line(s) left out of the report, not completion records: line %s", path,
                            len(bad), ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else ""))
        return int(match.group(1)), rows
    return None


# --------------------------------------------------------------------------- plots


def _new_figure(nrows: int = 1, height: float = 4.5) -> tuple[Figure, list]:
    fig = Figure(figsize=(9, height * nrows), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # explicit non-interactive canvas: never needs a display
    axes = [fig.add_subplot(nrows, 1, i + 1) for i in range(nrows)]
    return fig, axes


def _label(names: Sequence[str]) -> str:
    return " = ".join(names)


_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
           "tab:cyan", "tab:gray")


def _palette(names: Iterable[str]) -> dict[str, str]:
    """One colour per name (an agent, a policy, a reward part), the same in every panel of a figure."""
    return {name: _COLORS[i % len(_COLORS)] for i, name in enumerate(sorted(set(names)))}


def _plot_smoothed(ax, series: _Series, label: str, color: str | None = None, linestyle: str = "-") -> str:
    """Raw values thin, their moving average thick; returns the colour used."""
    window = _window(series.values.size)
    if window == 1:
        marker = "o" if series.values.size <= 12 else None
        (line,) = ax.plot(series.steps, series.values, color=color, linewidth=1.6, label=label, marker=marker,
                          markersize=3.5, linestyle=linestyle)
        return line.get_color()
    (raw,) = ax.plot(series.steps, series.values, color=color, linewidth=0.9, alpha=0.35, linestyle=linestyle)
    ax.plot(series.steps, moving_average(series.values, window), color=raw.get_color(), linewidth=2.0,
            label=f"{label} (MA {window})", linestyle=linestyle)
    return raw.get_color()


def _plot_eval(ax, series: _Series, label: str, color: str | None = None) -> str:
    (line,) = ax.plot(series.steps, series.values, color=color, marker="o", linestyle="--", linewidth=1.3,
                      markersize=5, label=label)
    return line.get_color()


LEGEND_WIDTH = 30
"""Characters per line of a legend entry: long entries (curves drawn once for several equal series) wrap."""


def _style(ax, title: str, ylabel: str, legend_title: str | None = None) -> None:
    ax.set_title(textwrap.fill(title, 70))
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if labels:
        # beside the plot, not on it: inside the axes a legend of six parts covers curves wherever "best" puts
        # it; the constrained layout narrows the axes to make room
        labels = [textwrap.fill(label, LEGEND_WIDTH, break_on_hyphens=False) for label in labels]
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  fontsize="small", title=legend_title)


def _save(fig: Figure, axes: list, path: Path, smoothed: bool, title: str | None = None) -> Path:
    axes[-1].set_xlabel("step")
    if smoothed and not title and len(axes) == 1:
        axes[0].set_title(f"{axes[0].get_title()}\n(thin: raw, thick: moving average)")
    elif smoothed:
        title = f"{title}\n(thin: raw, thick: moving average)" if title else "thin: raw, thick: moving average"
    if title:
        fig.suptitle(title)
    _atomic_save(path, fig.savefig)
    return path


def _is_smoothed(series: Iterable[_Series]) -> bool:
    return any(_window(s.values.size) > 1 for s in series)


def _plot_rewards(series: dict[str, _Series], out: Path) -> Path | None:
    train = ([(mn.TEAM_REWARD, series[mn.TEAM_REWARD])] if mn.TEAM_REWARD in series else []) + [
        (k, series[k]) for k in sorted(series) if _AGENT_REWARD_RE.match(k)]
    held_out = ([(mn.EVAL_TEAM_REWARD, series[mn.EVAL_TEAM_REWARD])] if mn.EVAL_TEAM_REWARD in series else []) + [
        (k, series[k]) for k in sorted(series) if _EVAL_AGENT_RETURN_RE.match(k)]
    if not train and not held_out:
        return None
    fig, (ax,) = _new_figure()
    colors = _palette(m.group(1) for k, _ in train + held_out
                      for m in [_AGENT_REWARD_RE.match(k) or _EVAL_AGENT_RETURN_RE.match(k)] if m)

    def color(name: str) -> str:
        match = _AGENT_REWARD_RE.match(name) or _EVAL_AGENT_RETURN_RE.match(name)
        return colors[match.group(1)] if match else "black"

    for names, s in _merge_identical(train):
        _plot_smoothed(ax, s, _label(names), color=color(names[0]))
    for names, s in _merge_identical(held_out):
        _plot_eval(ax, s, "held-out: " + _label(names), color="tab:gray" if names[0] == mn.EVAL_TEAM_REWARD
                   else color(names[0]))
    _style(ax, "Reward (training: sampled joint actions; held-out: dashed, one per evaluation)", "reward")
    return _save(fig, [ax], out / "reward.png", _is_smoothed(s for _, s in train))


def _plot_success(series: dict[str, _Series], out: Path) -> Path | None:
    keys = [k for k in (mn.TEAM_SUCCESS, mn.EVAL_SUCCESS) if k in series]
    if not keys:
        return None
    fig, (ax,) = _new_figure(height=3.6)
    if mn.TEAM_SUCCESS in series:
        _plot_smoothed(ax, series[mn.TEAM_SUCCESS], f"{mn.TEAM_SUCCESS} (training)", color="black")
    if mn.EVAL_SUCCESS in series:
        _plot_eval(ax, series[mn.EVAL_SUCCESS], f"{mn.EVAL_SUCCESS} (held-out)")
    ax.set_ylim(-0.03, 1.03)
    _style(ax, "Success rate", "share of episodes / joint actions")
    return _save(fig, [ax], out / "success.png", mn.TEAM_SUCCESS in series and _is_smoothed([series[mn.TEAM_SUCCESS]]))


def _plot_components(series: dict[str, _Series], out: Path) -> Path | None:
    train = [(k, series[k]) for k in sorted(series) if _COMPONENT_RE.match(k) and not k.startswith(mn.EVAL_PREFIX)]
    held_out = [(k, series[k]) for k in sorted(series) if _COMPONENT_RE.match(k) and k.startswith(mn.EVAL_PREFIX)]
    if not train and not held_out:
        return None
    rows = [part for part in (train, held_out) if part]
    fig, axes = _new_figure(len(rows), height=3.8)
    colors = _palette(_COMPONENT_RE.match(k).group(2) for k, _ in train + held_out)
    for ax, part in zip(axes, rows):
        is_eval = part is held_out
        for names, s in _merge_identical(part):
            parts = [_COMPONENT_RE.match(n).group(2) for n in names]
            if is_eval:
                _plot_eval(ax, s, _label(parts), color=colors[parts[0]])
            else:
                _plot_smoothed(ax, s, _label(parts), color=colors[parts[0]])
        _style(ax, ("held-out (eval/reward/<part>)" if is_eval else "training (reward/<part>)"),
               "mean per joint action", legend_title="part")
    return _save(fig, axes, out / "components.png", _is_smoothed(s for _, s in train),
                 "Reward components (the parts the task's reward is made of; equal curves drawn once)")


def _plot_losses(series: dict[str, _Series], out: Path) -> Path | None:
    by_kind: dict[str, list[tuple[str, _Series]]] = {}
    for key in sorted(series):
        match = _LOSS_RE.match(key)
        if match:
            by_kind.setdefault(match.group(2), []).append((match.group(1), series[key]))
    kinds = [k for k in _LOSS_TITLES if k in by_kind]
    if not kinds:
        return None
    fig, axes = _new_figure(len(kinds), height=3.2)
    colors = _palette(name for items in by_kind.values() for name, _ in items)
    for ax, kind in zip(axes, kinds):
        for names, s in _merge_identical(by_kind[kind]):
            _plot_smoothed(ax, s, _label(names), color=colors[names[0]])
        _style(ax, _LOSS_TITLES[kind], kind, legend_title="policy")
    smoothed = _is_smoothed(s for items in by_kind.values() for _, s in items)
    return _save(fig, axes, out / "loss.png", smoothed, "Optimisation")


def _plot_lengths(series: dict[str, _Series], out: Path, max_new_tokens: int | None) -> Path | None:
    lengths = [(_AGENT_LEN_RE.match(k).group(1), series[k]) for k in sorted(series) if _AGENT_LEN_RE.match(k)]
    held_out = [(_EVAL_AGENT_LEN_RE.match(k).group(1), series[k]) for k in sorted(series)
                if _EVAL_AGENT_LEN_RE.match(k)]
    cut = [(_AGENT_STOP_RE.match(k).group(1), _Series(series[k].steps, 1.0 - series[k].values))
           for k in sorted(series) if _AGENT_STOP_RE.match(k)]
    if not lengths and not held_out and not cut:
        return None
    rows = [part for part in (lengths or held_out, cut) if part]
    fig, axes = _new_figure(len(rows), height=3.8)
    colors = _palette(name for name, _ in lengths + held_out + cut)
    ax = axes[0]
    if lengths or held_out:
        for names, s in _merge_identical(lengths):
            _plot_smoothed(ax, s, _label(names), color=colors[names[0]])
        for names, s in _merge_identical(held_out):
            _plot_eval(ax, s, "held-out: " + _label(names), color=colors[names[0]])
        if max_new_tokens:
            ax.axhline(max_new_tokens, color="grey", linestyle=":", linewidth=1.2,
                       label=f"cap (rollout.max_new_tokens = {max_new_tokens})")
        _style(ax, "Completion length per agent", "tokens", legend_title="agent")
    if cut:
        ax = axes[-1]
        for names, s in _merge_identical(cut):
            _plot_smoothed(ax, s, _label(names), color=colors[names[0]])
        ax.set_ylim(-0.03, 1.03)
        _style(ax, "Truncated: share of completions cut at the token cap (1 - agent/<name>/stop_frac)",
               "share", legend_title="agent")
    return _save(fig, axes, out / "lengths.png", _is_smoothed(s for _, s in lengths + cut))


def _plot_time(series: dict[str, _Series], out: Path) -> Path | None:
    keys = sorted(k for k in series if _TIME_RE.match(k))
    if not keys:
        return None
    fig, (ax,) = _new_figure()
    for key in keys:
        s = series[key]
        if key == mn.TIME_STEP and len(keys) > 1:
            ax.plot(s.steps, s.values, color="black", linestyle="--", linewidth=1.5, label="step (total)")
        else:
            ax.plot(s.steps, s.values, linewidth=1.4, label=_TIME_RE.match(key).group(1),
                    marker="o" if s.values.size <= 12 else None, markersize=3.5)
    ax.set_ylim(bottom=0)
    _style(ax, "Time per phase (eval: per evaluation; step: a training step without eval and checkpoint)",
           "seconds")
    return _save(fig, [ax], out / "time.png", False)


# --------------------------------------------------------------------------- markdown


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.4g}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _best_direction(key: str) -> str | None:
    """``max``, ``min`` or None (no "best": lengths, times, rates that are neither good nor bad)."""
    last = key.rsplit("/", 1)[-1].lower()
    if _COMPONENT_RE.match(key) or last in _HIGHER_IS_BETTER or last.startswith("pass@"):
        return "max"
    if last in _LOWER_IS_BETTER or last.endswith("_loss") or last.endswith("_nll"):
        return "min"
    return None


def _summary_row(key: str, s: _Series, label: str | None = None) -> str:
    finite_mask = np.isfinite(s.values)
    if not finite_mask.any():
        cells = ["n/a"] * 4
    else:
        vals = s.values[finite_mask]
        direction = _best_direction(key)
        if direction is None:
            best = "—"
        else:
            best_idx = int(np.argmin(vals) if direction == "min" else np.argmax(vals))
            best = f"{_fmt(vals[best_idx])} (step {int(s.steps[finite_mask][best_idx])}{', min' if direction == 'min' else ''})"
        tail = _fmt(float(vals[-_MEAN_OF_LAST:].mean())) if vals.size >= _MEAN_OF_LAST else "—"
        cells = [_fmt(vals[0]), _fmt(vals[-1]), best, tail]
    name = label or f"`{_md_escape(key)}`"
    return f"| {name} | " + " | ".join(cells) + f" | {s.values.size} |"


def _table(keys: Sequence[str], series: dict[str, _Series], groups: bool = True) -> list[str]:
    lines = [f"| Metric | First | Last | Best | Mean of last {_MEAN_OF_LAST} | Points |", "|---|---|---|---|---|---|"]
    items = [(k, series[k]) for k in keys if k in series]
    for names, s in (_merge_identical(items) if groups else [([k], s) for k, s in items]):
        label = " = ".join(f"`{_md_escape(n)}`" for n in names)
        lines.append(_summary_row(names[0], s, label))
    return lines


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or abs(seconds) >= 1e9:   # beyond what a timedelta holds: a damaged time
        return f"{seconds:.3g} s"
    return str(_dt.timedelta(seconds=round(seconds)))


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _shown(text: Any) -> str:
    """A prompt's or completion's text for the report: cut at ``_MAX_SHOWN_CHARS``, terminal controls as escapes
    (``cat report.md`` shows them, not obeys them)."""
    text = "" if text is None else str(text)
    if len(text) > _MAX_SHOWN_CHARS:
        return printable(text[:_MAX_SHOWN_CHARS]) + f"\n… ({len(text) - _MAX_SHOWN_CHARS} more characters)"
    return printable(text)


def _units(rows: list[dict]) -> list[list[dict]]:
    """The scored units of a completions table: a joint action's rows (same ``joint``), else single rows."""
    units: dict[Any, list[dict]] = {}
    singles = []
    for row in rows:
        if row.get("joint") is None or not isinstance(row["joint"], (int, str)):   # a damaged joint id: on its own
            singles.append([row])
        else:
            units.setdefault(row["joint"], []).append(row)
    return list(units.values()) + singles


def _number(value: Any) -> float | None:
    """A completion record's number as a float; None for anything else (text, a bool, an integer past a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _reward_of(unit: list[dict]) -> float | None:
    values = [v for v in (_number(r.get("reward")) for r in unit) if v is not None]
    return values[0] if values else None


def _components_text(row: dict) -> str:
    parts = row.get("components")
    if not isinstance(parts, dict) or not parts:
        return ""
    return " (" + ", ".join(f"{k} {_fmt(v)}" for k, v in ((k, _number(v)) for k, v in parts.items())
                            if v is not None) + ")"


def _render_unit(title: str, unit: list[dict]) -> list[str]:
    first = unit[0]
    reward = _reward_of(unit)
    lines = [f"**{title}**: reward {_fmt(reward)}{_components_text(first)}, instance "
             f"`{printable(str(first.get('instance')))}`", ""]
    prompt = _shown(first.get("prompt"))
    fence = _fence(prompt)
    lines += ["<details><summary>prompt of " + printable(str(first.get("agent"))) + "</summary>", "", f"{fence}text",
              prompt, fence, "", "</details>", ""]
    for row in unit:
        details = [f"turn {row['turn']}"] if row.get("turn") not in (None, 0) else []
        if row.get("finish_reason"):
            details.append(f"finish: {printable(str(row['finish_reason']))}")
        returned, advantage = _number(row.get("return")), _number(row.get("advantage"))
        if returned is not None and row.get("return") != row.get("reward"):
            details.append(f"return {_fmt(returned)}")
        if advantage is not None:
            details.append(f"advantage {_fmt(advantage)}")
        text = _shown(row.get("completion"))
        fence = _fence(text)
        lines += [f"*{printable(str(row.get('agent')))}*" + (f" ({', '.join(details)})" if details else "") + ":", "",
                  f"{fence}text", text, fence, ""]
    return lines


def _samples_section(run_dir: Path) -> list[str]:
    lines = ["## Sample completions", ""]
    found, unscored = False, []
    for dirname, what in ((COMPLETIONS_DIRNAME, "training step"), (EVAL_COMPLETIONS_DIRNAME, "held-out evaluation")):
        latest = _latest_jsonl(run_dir / dirname)
        if latest is None:
            continue
        step, rows = latest
        scored = [u for u in _units(rows) if _reward_of(u) is not None]
        if not scored:
            unscored.append(f"`{dirname}/step_{step:06d}.jsonl`")
            continue
        found = True
        scored.sort(key=lambda u: _reward_of(u))
        lines += [f"### Last {what}: step {step} (`{dirname}/step_{step:06d}.jsonl`, {len(scored)} scored "
                  f"{'joint actions' if any(len(u) > 1 for u in scored) else 'completions'})", ""]
        if _reward_of(scored[-1]) == _reward_of(scored[0]):
            lines += _render_unit(f"All {len(scored)} scored the same; one of them", scored[-1])
        else:
            lines += _render_unit("Best", scored[-1])
            lines += _render_unit("Worst", scored[0])
    if not found and unscored:
        lines += [f"_No scored completions in the newest completion tables ({', '.join(unscored)}): see the "
                  "warnings of `accord report` for lines it left out._", ""]
    elif not found:
        lines += ["_No completion tables in the run directory (logging.completions_every is 0 and no evaluation "
                  "wrote eval_completions/)._", ""]
    return lines


def _time_lines(series: dict[str, _Series]) -> list[str]:
    parts = [(key, float(series[key].finite.sum()), series[key].finite.size)
             for key in (mn.TIME_STEP, mn.TIME_EVAL, mn.TIME_CHECKPOINT) if key in series]
    if parts:
        total = sum(seconds for _, seconds, _ in parts)
        source = " + ".join(f"`{key}`" for key, _, _ in parts)
        lines = [f"- **Total time:** {_fmt_duration(total)} ({total:.1f} s, sum of {source})"]
        named = {mn.TIME_STEP: "training steps", mn.TIME_EVAL: "evaluations", mn.TIME_CHECKPOINT: "checkpoints"}
        if len(parts) > 1:
            lines.append("  - " + "; ".join(f"{named[key]}: {seconds:.1f} s ({n})" for key, seconds, n in parts))
        return lines
    time_keys = [k for k in series if _TIME_RE.match(k)]
    if time_keys:
        total = float(sum(series[k].finite.sum() for k in time_keys))
        return [f"- **Total time:** {_fmt_duration(total)} ({total:.1f} s, sum of all `time/*` phases)"]
    return ["- **Total time:** n/a (no `time/*` metrics)"]


def _render_markdown(
    run_dir: Path,
    rows: list[dict],
    series: dict[str, _Series],
    config: dict | None,
    config_note: str | None,
    images: list[Path],
) -> str:
    config_summary, config_note = _config_summary(config, config_note)
    run_name = next((v for label, v in config_summary if label == "Run"), None) or run_dir.resolve().name
    lines = [f"{_REPORT_TITLE}{run_name}", ""]

    temperature = _nested(config, "rollout", "eval_temperature")
    temperature = float(temperature) if isinstance(temperature, (int, float)) else 0.0
    lines += ["## What the run learned", ""]
    lines += [f"- {line.strip()}" for line in held_out_summary(rows, temperature=temperature) + training_summary(rows)]
    lines.append("")

    lines += ["## Configuration", ""]
    lines += [f"- **{label}:** {value}" for label, value in config_summary]
    if config_note:
        lines.append(f"- _{config_note}_")
    lines.append(f"- **Run directory:** `{run_dir.resolve()}`")
    lines.append("")

    steps = [row["step"] for row in rows]
    lines += ["## Overview", ""]
    lines.append(f"- **Steps logged:** {len(rows)} (step {steps[0]} to {steps[-1]})")
    lines += _time_lines(series)
    tput = series.get(mn.PERF_GEN_TOKENS_PER_S)
    if tput is not None and tput.finite.size:
        lines.append(f"- **Throughput:** {_fmt(float(tput.finite.mean()))} generated tokens/s (mean of "
                     f"`{mn.PERF_GEN_TOKENS_PER_S}`)")
    else:
        lines.append(f"- **Throughput:** n/a (no `{mn.PERF_GEN_TOKENS_PER_S}`)")
    lines.append("")

    main = ([mn.TEAM_REWARD, mn.RM_REWARD] + sorted(k for k in series if _AGENT_REWARD_RE.match(k))
            + [mn.TEAM_SUCCESS, mn.EVAL_TEAM_REWARD, mn.EVAL_SUCCESS]
            + sorted(k for k in series if _EVAL_AGENT_RETURN_RE.match(k))
            + sorted(k for k in series if k.startswith(mn.EVAL_PREFIX) and _best_direction(k) == "max"
                     and not _COMPONENT_RE.match(k) and k not in (mn.EVAL_TEAM_REWARD, mn.EVAL_SUCCESS)
                     and not _EVAL_AGENT_RETURN_RE.match(k)))
    main = [k for k in main if k in series]
    lines += ["## Main metrics", ""]
    if main:
        lines += _table(main, series)
        lines.append("")
        lines.append(f"_Metrics with identical values share a row. Best is the maximum for rewards, returns and "
                     f"success; non-finite values are ignored; the mean of the last {_MEAN_OF_LAST} needs "
                     f"{_MEAN_OF_LAST} points._")
    else:
        lines.append("_No `team/reward`, `agent/<name>/reward` or `eval/*` metrics were logged._")
    lines.append("")

    components = sorted(k for k in series if _COMPONENT_RE.match(k) and not k.startswith(mn.EVAL_PREFIX)) + sorted(
        k for k in series if _COMPONENT_RE.match(k) and k.startswith(mn.EVAL_PREFIX))
    if components:
        lines += ["## Reward components", ""]
        lines += _table(components, series, groups=False)
        lines += ["", "_The task's reward in parts (`reward/<part>`: training, mean per joint action; "
                  "`eval/reward/<part>`: held-out)._", ""]

    learned = [k for k in sorted(series) if _LEARNED_RE.match(k)]
    if learned:
        lines += ["## Critics, preferences and the reward model", ""]
        lines += _table(learned, series, groups=False)
        lines += ["", "_`critic/<name>/...`: the critics of iac and maac (docs/algorithms-actor-critic.md); `pref/...`: madpo's "
                  "pairs and joint DPO loss; `rm/...`: marlhf's reward model (stage 1 at step 1; `rm/reward`, the "
                  "score the policies are trained on, beside the task's own `team/reward`: a gap that grows is "
                  "reward-model over-optimisation; docs/algorithms-preference.md)._", ""]

    health = [k for k in sorted(series) if _LOSS_RE.match(k) or _AGENT_LEN_RE.match(k) or _AGENT_STOP_RE.match(k)
              or _EVAL_AGENT_LEN_RE.match(k) or k == mn.ADV_ZERO_STD_FRAC]
    if health:
        lines += ["## Training health", ""]
        lines += _table(health, series, groups=False)
        lines += ["", "_Best is the minimum for losses and KL; lengths, entropy, gradient norms and shares have no "
                  "best. `stop_frac` is the share of completions that ended with EOS (the rest hit "
                  "`rollout.max_new_tokens`)._", ""]
        if not any(_LOSS_RE.match(k) and k.endswith(mn.SEP + mn.KL) for k in series):
            lines += ["_No KL was measured: `algorithm.kl_coef` is 0, so no reference model is built (set it > 0 to "
                      "penalise and plot the KL to the initial policy)._", ""]

    nonfinite = {k: int((~np.isfinite(s.values)).sum()) for k, s in series.items()}
    nonfinite = {k: n for k, n in nonfinite.items() if n}
    if nonfinite:
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
    lines += _samples_section(run_dir)
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
    if run_dir.is_file():
        raise MetricsFileError(f"{run_dir} is a file, not a run directory; pass the directory `accord train` wrote "
                               f"(the one holding {METRICS_FILENAME})")
    if not run_dir.exists():
        raise FileNotFoundError(f"no run to report: the directory {run_dir} does not exist; pass the run directory "
                                "`accord train` wrote (run.output_dir/run.name, runs/<name> by default)")
    if not metrics_path.is_file():
        raise FileNotFoundError(
            f"no metrics to report: {metrics_path} does not exist. Run `accord train` first "
            f"(it writes {METRICS_FILENAME} into the run directory), or pass the run directory that contains it."
        )
    rows = read_metrics(run_dir)
    if not rows:
        raise MetricsFileError(
            f"{metrics_path} contains no logged steps; let `accord train` run at least one step before reporting"
        )
    rows = _dedupe_by_step(rows)
    series = _collect_series(rows)
    config, config_note = _load_config(run_dir / CONFIG_FILENAME)
    cap = _nested(config, "rollout", "max_new_tokens")

    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    if out_dir is None and out.is_symlink():   # it deletes its stale plots there: only in a folder of the run's
        from accord.config import ConfigError

        raise ConfigError(f"{out} is a symbolic link (to {str(out.readlink())!r}); the report writes its files there "
                          f"and deletes its stale plots, so it follows no link of the run's: delete the link, or "
                          f"give the folder with --out")
    problem = folder_problem(out)
    if problem is not None:
        from accord.config import ConfigError

        raise ConfigError(f"report folder {out}: {problem}; give the report a folder with --out")
    if out_dir is not None:   # a folder of the user's: replace only what an earlier report of accord's wrote there
        held, ours = _report_files(out)
        if held and not ours:
            from accord.config import ConfigError

            raise ConfigError(f"--out {out} holds {', '.join(held)}, and no report.md of accord's there wrote them; "
                              f"the report would replace or delete them: give it another folder (or move them)")
        if held:
            _logger.warning("--out %s holds an earlier report: it is replaced (plots of groups this run lacks are "
                            "deleted)", out)
    made = made_dirs(out)
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / REPORT_FILENAME
    try:
        with hold_output_dir(out, "accord report"):
            images = _write_staged(out, run_dir, rows, series, config, config_note, cap)
    except BaseException:
        remove_empty(made)   # a failed report leaves no empty --out behind
        raise
    _logger.info("wrote report %s (%d plot(s))", report_path, len(images))
    return report_path


STAGING_PREFIX = ".accord-report."
_REPORT_TITLE = "# Training report: "


def _report_files(out: Path) -> tuple[list[str], bool]:
    """(the names in ``out`` a report writes or deletes, whether its report.md is one of accord's reports)."""
    held = [name for name in (REPORT_FILENAME, *PLOT_FILES) if (out / name).is_file()]
    try:
        with open(out / REPORT_FILENAME, encoding="utf-8", errors="replace") as f:
            first = f.readline(200)
    except OSError:
        first = ""
    return held, first.startswith(_REPORT_TITLE)


def _write_staged(out: Path, run_dir: Path, rows, series, config, config_note, cap) -> list[Path]:
    """Draw the plots and write report.md into a staging folder in ``out``, then move them into ``out``, the plots
    first and report.md last, and delete the plots of groups this run no longer has: an interrupted or failed
    report (Ctrl-C, a full disk) leaves the previous report as it was, not new plots beside an old report.md.
    Staging folders a killed report left go first. Returns the plots' paths in ``out``."""
    for leftover in out.glob(f"{STAGING_PREFIX}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    try:
        drawn: list[Path] = []
        plots = (_plot_rewards, _plot_success, _plot_components, _plot_losses,
                 lambda s, o: _plot_lengths(s, o, cap if isinstance(cap, int) else None), _plot_time)
        for plot in plots:
            path = plot(series, stage)
            if path is not None:
                drawn.append(path)
        images = [out / path.name for path in drawn]
        _atomic_write_text(stage / REPORT_FILENAME, _render_markdown(run_dir, rows, series, config, config_note,
                                                                     images))
        for path in (*drawn, stage / REPORT_FILENAME):   # every place checked before anything moves
            _not_a_folder(out / path.name)
        for path in drawn:
            os.replace(path, out / path.name)
        for name in PLOT_FILES:
            stale = out / name
            if stale not in images and stale.is_file():
                stale.unlink()
        os.replace(stage / REPORT_FILENAME, out / REPORT_FILENAME)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return images
