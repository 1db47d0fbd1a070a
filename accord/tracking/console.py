"""What a run says on the console: the logging set-up of the command line, the progress bar
(:class:`ConsoleSink`) and its closing lines.

:func:`configure_logging` makes the log lines and the progress bar share one console: in a terminal
(stdout and stderr both terminals) the lines go through rich's logging handler on rich's console,
the one the :class:`ConsoleSink` bar draws on, so each line prints above the live bar instead of
into it. Elsewhere (a pipe, a file, CI) they are plain timestamped lines on
stderr.

:func:`held_out_summary` turns a run's ``metrics.jsonl`` rows into the lines ``accord train`` ends
with: the held-out team reward before -> after, the success rate where the task has one, and each
agent's own return where it differs from the team's (multi-turn environments) and completion length.
:func:`training_summary` adds the sampled training reward of the first third of the steps against the
last third: a second, noisier view of learning that needs no held-out set (the quickstart's criterion).
"""

from __future__ import annotations

import logging
import math
import re
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from accord import metric_names as mn
from accord.tracking.registry import _check_step, _SinkBase, _to_number, register_sink

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from accord.config import Config

_logger = logging.getLogger(__name__)

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TIME_FORMAT = "%H:%M:%S"

# characters a terminal acts on instead of showing: C0 controls but the line feed and tab (ESC starts the
# sequences that move the cursor, recolour, retitle the window or clear the screen; CR overwrites the line),
# DEL, C1 controls (CSI, OSC and DCS of 8-bit terminals) and the bidirectional overrides and isolates, which
# reorder what is shown (a model's text reaches log lines: an environment quoting its move in an error)
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (:data:`_TERMINAL_CONTROLS`) as its escape
    (``\\x1b``, ``\\u202e``): shown, not obeyed."""
    return _TERMINAL_CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


class PrintableFormatter(logging.Formatter):
    """A formatter whose lines (message and traceback) show terminal controls as escapes (:func:`printable`)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def configure_logging(level: int = logging.INFO) -> logging.Handler:
    """Install one root handler (rich's in a terminal, plain stderr lines elsewhere), whose lines show terminal
    controls as escapes (:class:`PrintableFormatter`); return it."""
    from rich import get_console

    console = get_console()
    if console.is_terminal and sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=console, show_path=False, markup=False,
                                                log_time_format=f"[{TIME_FORMAT}]")
        handler.setFormatter(PrintableFormatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(PrintableFormatter(PLAIN_FORMAT, datefmt=TIME_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
    # torch sets its loggers to WARNING at the end of its import; a Ctrl-C during the import leaves them unset,
    # and the atexit hooks of the modules already loaded would log INFO lines through this handler
    torch_logger = logging.getLogger("torch")
    if torch_logger.level == logging.NOTSET:
        torch_logger.setLevel(logging.WARNING)
    return handler


def _latest(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@register_sink("console")
class ConsoleSink(_SinkBase):
    """Rich progress bar (step, ETA, latest values of ``keys``) plus a compact
    ``logging`` line every ``every`` steps (and on the last step).

    In a terminal the live bar is the progress display: the per-step line is logged at DEBUG
    (``accord -v``), so the two do not repeat each other (the CLI logs through rich's handler on
    the same console, so log lines print above the bar). When the console is not a terminal (CI,
    pipes, a log file), rich draws no live bar (only its final state on close); the per-step lines
    are logged at INFO, and while a step runs a heartbeat line is logged whenever ``heartbeat_s``
    seconds pass without one (the step, the phase set by :meth:`set_activity`, the time into the
    step and in all). ``progress=False`` disables the bar, keeping the log lines.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        keys: Sequence[str] = (mn.TEAM_REWARD,),
        every: int = 1,
        *,
        console: Console | None = None,
        progress: bool = True,
        description: str = "train",
        heartbeat_s: float = 60.0,
    ) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        total_steps = _check_step(total_steps, "total_steps")
        start_step = _check_step(start_step, "start_step")
        if start_step > total_steps:
            raise ValueError(f"start_step ({start_step}) is larger than total_steps ({total_steps}); check the resume step")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        if isinstance(keys, str):
            keys = (keys,)
        self.total_steps = total_steps
        self.start_step = start_step
        self.keys = tuple(keys)
        self.every = every
        self.latest: dict[str, float | None] = dict.fromkeys(self.keys)
        self._logged = 0
        self._closed = False
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[values]}"),
            console=console,
            disable=not progress,
        )
        self._task = self._progress.add_task(description, total=total_steps, completed=start_step, values="")
        self._started = False
        self.live = progress and self._progress.console.is_terminal
        self.activity = ""
        self._completed = start_step
        self._t0 = self._last_line = self._step_end = time.monotonic()
        self._stop = threading.Event()
        self._heartbeat = None
        if heartbeat_s and heartbeat_s > 0 and not self.live:
            self._heartbeat = threading.Thread(target=self._beat, args=(float(heartbeat_s),), daemon=True,
                                               name="accord-console-heartbeat")
            self._heartbeat.start()

    @classmethod
    def from_run(cls, cfg: Config, run_dir: str | Path, *, start_step: int) -> ConsoleSink:
        """The progress bar of ``run.steps`` steps, from ``start_step`` on, showing the team reward."""
        return cls(cfg.run.steps, start_step=start_step)

    def set_activity(self, text: str) -> None:
        """Name what the run is doing now (a phase such as ``gen`` or ``eval``), for the heartbeat line."""
        self.activity = text

    def _beat(self, every: float) -> None:
        while not self._stop.wait(max(0.05, self._last_line + every - time.monotonic())):
            now = time.monotonic()
            if now - self._last_line < every:
                continue
            doing = f" ({self.activity})" if self.activity else ""
            _logger.info("step %d/%d running%s: %s into the step, %s in all", min(self._completed + 1,
                         self.total_steps), self.total_steps, doing, _duration(now - self._step_end),
                         _duration(now - self._t0))
            self._last_line = now

    def _values_text(self) -> str:
        return "  ".join(f"{k}={_latest(v)}" for k, v in self.latest.items())

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self._closed:
            raise RuntimeError("ConsoleSink is closed; create a new sink to keep logging")
        step = _check_step(step)
        for key in self.keys:
            if key in metrics:
                self.latest[key] = float(_to_number(key, metrics[key]))
        if not self._started:
            self._progress.start()
            self._started = True
        completed = min(self.total_steps, step)  # step n = n updates done; 0 = before training
        self._progress.update(self._task, completed=completed, values=self._values_text())
        self._logged += 1
        self._completed = completed
        self._step_end = self._last_line = time.monotonic()
        self.activity = ""
        if self._logged % self.every == 0 or completed >= self.total_steps:
            level = logging.DEBUG if self.live else logging.INFO  # in a terminal the bar shows these values
            _logger.log(level, "step %d/%d  %s", completed, self.total_steps, self._values_text())

    def log_completions(self, step: int, rows: list[dict]) -> None:
        """Completion tables are not shown on the console."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stop.set()
            if self._heartbeat is not None:
                self._heartbeat.join()
            if self._started:
                self._progress.stop()


def _fmt(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else str(value)


def _change(before: float, after: float) -> str:
    return f"{_fmt(before)} -> {_fmt(after)} ({after - before:+.4f})"


_AGENT_KEY = mn.agent_pattern(held_out=True)


def held_out_summary(rows: list[dict], *, temperature: float = 0.0) -> list[str]:
    """Closing lines of a run from its metric rows: the first held-out evaluation (step 0 when the
    run evaluated before training) against the last one."""
    evals = [r for r in rows if isinstance(r.get(mn.EVAL_TEAM_REWARD), (int, float))]
    mode = "greedy" if not temperature else f"sampled at temperature {temperature:g}"
    if not evals:
        return ["no held-out evaluation in this run (task.eval_size is 0, run.eval_before and run.eval_after are "
                "false, or the task gave no eval instances)"]
    first, last = evals[0], evals[-1]
    if first is last:
        return [f"held-out team reward ({mode}) at step {last['step']}: {_fmt(last[mn.EVAL_TEAM_REWARD])} "
                "(one evaluation: set run.eval_before=true for a before -> after comparison)"]
    span = f"step {first['step']} -> step {last['step']}"
    lines = [f"held-out team reward ({mode}), {span}: {_change(first[mn.EVAL_TEAM_REWARD], last[mn.EVAL_TEAM_REWARD])}"]
    if mn.EVAL_SUCCESS in first and mn.EVAL_SUCCESS in last:
        lines.append(f"held-out success rate, {span}: {_change(first[mn.EVAL_SUCCESS], last[mn.EVAL_SUCCESS])}")
    per_agent: dict[str, list[str]] = {}
    for key in last:
        match = _AGENT_KEY.match(key)
        if not match or key not in first:
            continue
        agent, metric = match["agent"], match["metric"]
        if metric == mn.AGENT_RETURN and all(r.get(key) == r[mn.EVAL_TEAM_REWARD] for r in (first, last)):
            continue  # an agent's own return equal to the team's says nothing more
        if metric == mn.AGENT_COMPLETION_LEN:
            per_agent.setdefault(agent, []).append(f"length {first[key]:.1f} -> {last[key]:.1f} tokens")
        else:
            per_agent.setdefault(agent, []).append(f"{metric} {_change(first[key], last[key])}")
    for agent, parts in per_agent.items():
        lines.append(f"  agent {agent}: " + ", ".join(parts))
    return lines


def training_thirds(rows: list[dict]) -> tuple[list[int], float, list[int], float] | None:
    """(steps, mean) of the training team reward over the first and the last third of a run's steps,
    or None with fewer than two steps. A third holds ``max(1, n // 3)`` steps, so the two never overlap;
    a step logged twice (a resume) counts once, with its last value."""
    by_step = {r["step"]: r[mn.TEAM_REWARD] for r in rows
               if isinstance(r.get(mn.TEAM_REWARD), (int, float)) and math.isfinite(r[mn.TEAM_REWARD])}
    steps = sorted(by_step)
    if len(steps) < 2:
        return None
    k = max(1, len(steps) // 3)
    first, last = steps[:k], steps[-k:]
    return (first, sum(by_step[s] for s in first) / k, last, sum(by_step[s] for s in last) / k)


def _span(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def training_summary(rows: list[dict]) -> list[str]:
    """The closing line on the sampled training team reward: the mean of the first third of the steps ->
    the mean of the last third (no line with fewer than two steps)."""
    thirds = training_thirds(rows)
    if thirds is None:
        return []
    first, before, last, after = thirds
    return [f"training team reward (sampled), mean of the first third ({_span(first)}) -> the last third "
            f"({_span(last)}): {_change(before, after)}"]
