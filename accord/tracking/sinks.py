"""Metric sinks: where per-step training metrics and completion tables go.

A run directory written by the sinks looks like::

    run_dir/
      metrics.jsonl                 # JsonlSink: one JSON object per step
      completions/step_000012.jsonl # JsonlSink: one row per sampled completion
      tb/events.out.tfevents.*      # TensorBoardSink

Step convention: ``step`` n is logged after n updates (step 0: before training,
e.g. the first evaluation). ``start_step`` (ConsoleSink, make_sinks) is the
number of steps already completed, and ``resume_from_step`` (JsonlSink) is the
last step whose metrics are kept. Resuming after step ``k`` therefore means
``start_step=k`` and ``resume_from_step=k``; :func:`make_sinks` derives the
latter from the former.

New back-ends (wandb, mlflow, ...) implement the :class:`MetricsSink` protocol
and register themselves with :func:`register_sink`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = [
    "COMPLETIONS_DIRNAME",
    "METRICS_FILENAME",
    "SINKS",
    "TENSORBOARD_DIRNAME",
    "ConsoleSink",
    "JsonlSink",
    "MetricAccumulator",
    "MetricsFileError",
    "MetricsSink",
    "MultiSink",
    "TensorBoardSink",
    "completions_markdown",
    "completions_path",
    "make_sinks",
    "read_metrics",
    "register_sink",
]

_logger = logging.getLogger(__name__)

METRICS_FILENAME = "metrics.jsonl"
COMPLETIONS_DIRNAME = "completions"
EVAL_COMPLETIONS_DIRNAME = "eval_completions"  # written by accord.tracking.eval_completions
TENSORBOARD_DIRNAME = "tb"

_COMPLETIONS_RE = re.compile(r"^step_(\d+)\.jsonl$")
# Column order of the completions text summary; extra keys follow.
_COMPLETION_COLUMNS = ("prompt", "agent", "completion", "reward", "advantage", "group", "turn")


@runtime_checkable
class MetricsSink(Protocol):
    """Anything that accepts per-step metrics and completion tables."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_completions(self, step: int, rows: list[dict]) -> None: ...

    def close(self) -> None: ...


SINKS: dict[str, type] = {}
"""Registry of sink classes by name (``"jsonl"``, ``"tensorboard"``, ``"console"``)."""

_T = TypeVar("_T", bound=type)


def register_sink(name: str) -> Callable[[_T], _T]:
    """Class decorator adding a sink class to :data:`SINKS` under ``name``."""

    def decorator(cls: _T) -> _T:
        if name in SINKS and SINKS[name] is not cls:
            raise ValueError(
                f"a sink named {name!r} is already registered ({SINKS[name].__qualname__}); "
                "pick a different name for the new sink"
            )
        SINKS[name] = cls
        return cls

    return decorator


# --------------------------------------------------------------------------- helpers


def _check_step(step: Any, name: str = "step") -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(step).__name__} ({step!r}); pass a non-negative integer")
    step = int(step)
    if step < 0:
        raise ValueError(f"{name} must be >= 0, got {step}")
    return step


def _to_number(key: str, value: Any) -> float | int:
    """Convert a metric value (python/numpy/torch scalar) to a JSON-friendly number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int):
        return value
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"metric {key!r} has a non-scalar value of type {type(value).__name__}; "
            "log a python float (e.g. tensor.item()) instead"
        ) from err


def _clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float | int]:
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict of name -> float, got {type(metrics).__name__}")
    out: dict[str, float | int] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric names must be str, got {key!r} ({type(key).__name__})")
        if key == "step":
            raise ValueError("'step' is reserved in metrics; pass the step as the `step` argument instead")
        out[key] = _to_number(key, value)
    return out


def _json_default(obj: Any) -> Any:
    """JSON fallback for numpy / torch values inside completion rows."""
    if hasattr(obj, "tolist"):  # numpy arrays + scalars, torch tensors
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(
        f"completion row value of type {type(obj).__name__} is not JSON serializable; "
        "convert it to str / float / list before calling log_completions"
    )


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory + os.replace."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def completions_path(run_dir: str | Path, step: int) -> Path:
    """Path of the completions table of ``step`` inside ``run_dir``."""
    return Path(run_dir) / COMPLETIONS_DIRNAME / f"step_{_check_step(step):06d}.jsonl"


class MetricsFileError(ValueError):
    """A line of metrics.jsonl cannot be read; the message names the file, the line and the fix. Nothing is
    changed in the file (a resume refuses to cut it back rather than drop lines it cannot read)."""


def _parse_metrics_lines(path: Path, text: str) -> list[tuple[dict, str]]:
    """Parse metrics.jsonl text into (record, raw line) pairs.

    A malformed *final* line without a trailing newline is what a crash during a
    write leaves behind: it is dropped with a warning. Any other malformed line
    is a :class:`MetricsFileError`.
    """
    lines = text.split("\n")
    ends_with_newline = text.endswith("\n")
    if ends_with_newline:
        lines = lines[:-1]
    records: list[tuple[dict, str]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_last = lineno == len(lines)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if is_last and not ends_with_newline:
                _logger.warning("%s:%d: dropping truncated last line (interrupted write?)", path, lineno)
                continue
            raise MetricsFileError(
                f"{path}:{lineno}: invalid JSON ({err.msg}): {line[:80]!r}; fix or delete that line of the metrics "
                "file (nothing was changed)"
            ) from err
        if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
            raise MetricsFileError(
                f"{path}:{lineno}: expected a JSON object with an integer 'step' field, got {line[:80]!r}; "
                "fix or delete that line of the metrics file (nothing was changed)"
            )
        records.append((record, line))
    return records


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Read ``run_dir/metrics.jsonl`` into a list of dicts (one per logged step).

    ``run_dir`` may also be the path of the metrics file itself. NaN/Infinity
    values written by the trainer are read back as floats.
    """
    path = Path(run_dir)
    if path.is_dir() or path.name != METRICS_FILENAME:
        path = path / METRICS_FILENAME
    if not path.is_file():
        raise FileNotFoundError(
            f"metrics file not found: {path}; pass a run directory containing {METRICS_FILENAME} "
            "(written by JsonlSink during training)"
        )
    text = path.read_text(encoding="utf-8")
    return [record for record, _ in _parse_metrics_lines(path, text)]


# --------------------------------------------------------------------------- sinks


class _SinkBase:
    """Context-manager support shared by the built-in sinks."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@register_sink("jsonl")
class JsonlSink(_SinkBase):
    """Appends one JSON line per step to ``run_dir/metrics.jsonl``.

    The file is flushed after every :meth:`log`, so it can be tailed or read
    while training runs. Completion tables go to
    ``run_dir/completions/step_{step:06d}.jsonl`` (written atomically).

    ``resume_from_step``: when resuming from a checkpoint taken after step
    ``k``, pass ``k``; lines with ``step > k`` are removed from metrics.jsonl
    (atomically, via a temp file + ``os.replace``) and completion tables (training and evaluation) of
    later steps are deleted, so the resumed run does not duplicate steps.
    Without it, an existing metrics.jsonl is appended to.
    NaN / inf values are written as ``NaN`` / ``Infinity`` (Python's JSON
    dialect) so a diverging run stays visible in the file.
    """

    def __init__(self, run_dir: str | Path, resume_from_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILENAME
        self.completions_dir = self.run_dir / COMPLETIONS_DIRNAME
        self._last_step: int | None = None
        if resume_from_step is not None:
            self._truncate(_check_step(resume_from_step, "resume_from_step"))
        elif self.metrics_path.is_file() and self.metrics_path.stat().st_size > 0:
            _logger.warning(
                "%s already exists and resume_from_step is None: appending to it; pass resume_from_step "
                "when resuming, or use a fresh run directory",
                self.metrics_path,
            )
        self._fh = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def _truncate(self, resume_from_step: int) -> None:
        # temp files of atomic writes a crash interrupted (metrics truncation, completion tables)
        for leftover in [*self.run_dir.glob(f".{METRICS_FILENAME}.*.tmp"), *self.completions_dir.glob(".step_*.tmp")]:
            _logger.info("removing %s (left by an interrupted write)", leftover)
            leftover.unlink()
        if self.metrics_path.is_file():
            text = self.metrics_path.read_text(encoding="utf-8")
            records = _parse_metrics_lines(self.metrics_path, text)
            kept = [(rec, line) for rec, line in records if rec["step"] <= resume_from_step]
            dropped = len(records) - len(kept)
            _atomic_write_text(self.metrics_path, "".join(line + "\n" for _, line in kept))
            if kept:
                self._last_step = max(rec["step"] for rec, _ in kept)
            _logger.info(
                "resuming after step %d: kept %d and removed %d line(s) of %s",
                resume_from_step, len(kept), dropped, self.metrics_path,
            )
        else:
            _logger.info("resuming after step %d but %s does not exist; starting a new one",
                         resume_from_step, self.metrics_path)
        for directory in (self.completions_dir, self.run_dir / EVAL_COMPLETIONS_DIRNAME):
            if not directory.is_dir():
                continue
            for path in directory.iterdir():
                match = _COMPLETIONS_RE.match(path.name)
                if match and int(match.group(1)) > resume_from_step:
                    path.unlink()

    def _check_open(self) -> None:
        if self._fh is None:
            raise RuntimeError(f"JsonlSink for {self.run_dir} is closed; create a new sink to keep logging")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._check_open()
        step = _check_step(step)
        if self._last_step is not None and step <= self._last_step:
            _logger.warning(
                "metrics for step %d logged after step %d: %s will hold duplicate/out-of-order steps "
                "(resuming? pass resume_from_step)", step, self._last_step, self.metrics_path,
            )
        record: dict[str, Any] = {"step": step}
        record.update(_clean_metrics(metrics))
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())  # on disk before the trainer renames the step's checkpoint into place
        self._last_step = step if self._last_step is None else max(step, self._last_step)

    def log_completions(self, step: int, rows: list[dict]) -> None:
        self._check_open()
        path = completions_path(self.run_dir, step)
        lines = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise TypeError(f"completion row {i} for step {step} is a {type(row).__name__}, expected a dict")
            lines.append(json.dumps(dict(row), default=_json_default, ensure_ascii=False) + "\n")
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(path, "".join(lines))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _md_cell(value: Any, max_chars: int) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    text = text.replace("\r", "").replace("\n", " ⏎ ")
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|")


def completions_markdown(rows: Sequence[Mapping[str, Any]], max_rows: int = 8, max_chars: int = 300) -> str:
    """Render the first ``max_rows`` completion rows as a markdown table."""
    if not rows:
        return "_no completions_"
    columns = [c for c in _COMPLETION_COLUMNS if any(c in row for row in rows)]
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    shown = rows[:max_rows]
    lines = [
        "| " + " | ".join(_md_cell(c, max_chars) for c in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in shown:
        lines.append("| " + " | ".join(_md_cell(row.get(c, ""), max_chars) for c in columns) + " |")
    if len(rows) > max_rows:
        lines.append(f"\n_showing {max_rows} of {len(rows)} rows_")
    return "\n".join(lines)


@register_sink("tensorboard")
class TensorBoardSink(_SinkBase):
    """Writes scalars (one ``add_scalar`` per metric) and completion tables
    (markdown text summary of the first ``max_rows`` rows) to ``run_dir/tb``.

    ``purge_step``: when resuming, events with ``step >= purge_step`` from the
    earlier run are hidden by TensorBoard (pass the first step of the resumed run).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        purge_step: int | None = None,
        max_rows: int = 8,
        flush_secs: int = 30,
    ) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # pragma: no cover - both are hard dependencies
            raise ImportError(
                "TensorBoardSink needs torch and tensorboard; install them with `pip install torch tensorboard` "
                "or disable the sink (make_sinks(..., tensorboard=False))"
            ) from err
        self.log_dir = Path(run_dir) / TENSORBOARD_DIRNAME
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.max_rows = max_rows
        self._writer = SummaryWriter(
            log_dir=str(self.log_dir),
            purge_step=None if purge_step is None else _check_step(purge_step, "purge_step"),
            flush_secs=flush_secs,
        )

    def _check_open(self) -> None:
        if self._writer is None:
            raise RuntimeError(f"TensorBoardSink for {self.log_dir} is closed; create a new sink to keep logging")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._check_open()
        step = _check_step(step)
        for key, value in _clean_metrics(metrics).items():
            self._writer.add_scalar(key, value, global_step=step)

    def log_completions(self, step: int, rows: list[dict]) -> None:
        self._check_open()
        self._writer.add_text("completions", completions_markdown(rows, self.max_rows), global_step=_check_step(step))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def _fmt(value: float | None) -> str:
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
        keys: Sequence[str] = ("team/reward",),
        every: int = 1,
        *,
        console: Console | None = None,
        progress: bool = True,
        description: str = "train",
        heartbeat_s: float = 60.0,
    ) -> None:
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
        return "  ".join(f"{k}={_fmt(v)}" for k, v in self.latest.items())

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


class MultiSink(_SinkBase):
    """Fans every call out to a list of sinks, in order.

    :meth:`close` closes every sink even if some fail; the last error is
    re-raised (earlier ones are chained as its context).
    """

    def __init__(self, sinks: Iterable[MetricsSink]) -> None:
        self.sinks: list[MetricsSink] = list(sinks)
        for sink in self.sinks:
            if not isinstance(sink, MetricsSink):
                raise TypeError(
                    f"{type(sink).__name__} is not a MetricsSink; it needs log(), log_completions() and close()"
                )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def log_completions(self, step: int, rows: list[dict]) -> None:
        for sink in self.sinks:
            sink.log_completions(step, rows)

    def set_activity(self, text: str) -> None:
        """Pass what the run is doing now to the sinks that show it (the console's heartbeat)."""
        for sink in self.sinks:
            if callable(getattr(sink, "set_activity", None)):
                sink.set_activity(text)

    def flush(self) -> None:
        """Flush the sinks that buffer (TensorBoard), e.g. before a checkpoint is committed."""
        for sink in self.sinks:
            if callable(getattr(sink, "flush", None)):
                sink.flush()

    def close(self) -> None:
        with contextlib.ExitStack() as stack:
            for sink in reversed(self.sinks):  # ExitStack unwinds LIFO -> closes in list order
                stack.callback(sink.close)


def make_sinks(
    run_dir: str | Path,
    *,
    total_steps: int,
    start_step: int = 0,
    tensorboard: bool = True,
    console: bool = True,
    jsonl: bool = True,
    resume_from_step: int | None = None,
    console_keys: Sequence[str] = ("team/reward",),
    console_every: int = 1,
    console_heartbeat_s: float = 60.0,
    extra: Iterable[MetricsSink] = (),
) -> MultiSink:
    """Build the standard sinks for a run directory.

    ``start_step`` is the first step this process runs. When it is > 0 (a
    resume) and ``resume_from_step`` is not given, metrics of steps
    ``> start_step`` are removed from metrics.jsonl (``resume_from_step =
    start_step``: step n is logged after n updates, step 0 before training) and hidden in TensorBoard. ``extra`` sinks (e.g. a
    future wandb sink) are appended.
    """
    start_step = _check_step(start_step, "start_step")
    if resume_from_step is None and start_step > 0:
        resume_from_step = start_step
    sinks: list[MetricsSink] = []
    if jsonl:
        sinks.append(SINKS["jsonl"](run_dir, resume_from_step=resume_from_step))
    if tensorboard:
        purge = None if resume_from_step is None else resume_from_step + 1
        sinks.append(SINKS["tensorboard"](run_dir, purge_step=purge))
    if console:
        sinks.append(SINKS["console"](total_steps, start_step=start_step, keys=console_keys, every=console_every,
                                      heartbeat_s=console_heartbeat_s))
    sinks.extend(extra)
    return MultiSink(sinks)


# --------------------------------------------------------------------------- accumulation


class MetricAccumulator:
    """Accumulates weighted values per key within one step.

    ``mean()`` returns the weighted mean of every key ever added (keys are
    never dropped; a key whose total weight is 0 maps to NaN). NaN values are
    kept — they propagate into the mean so the trainer can detect divergence.
    """

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}

    def add(self, key: str, value: Any, weight: float = 1.0) -> None:
        if not isinstance(key, str):
            raise TypeError(f"metric names must be str, got {key!r} ({type(key).__name__})")
        value = float(_to_number(key, value))
        weight = float(_to_number(f"{key} (weight)", weight))
        if math.isnan(weight) or weight < 0 or math.isinf(weight):
            raise ValueError(f"weight for metric {key!r} must be a finite number >= 0, got {weight}")
        self._sums.setdefault(key, 0.0)
        self._weights.setdefault(key, 0.0)
        if weight == 0.0:
            return  # registers the key without contributing (avoids 0 * inf = nan)
        self._sums[key] += value * weight
        self._weights[key] += weight

    def add_many(self, metrics: Mapping[str, Any], weight: float = 1.0) -> None:
        for key, value in metrics.items():
            self.add(key, value, weight)

    def mean(self) -> dict[str, float]:
        return {
            key: (self._sums[key] / w if w > 0 else math.nan)
            for key, w in self._weights.items()
        }

    def reset(self) -> None:
        self._sums.clear()
        self._weights.clear()

    def __len__(self) -> int:
        return len(self._sums)

    def __contains__(self, key: object) -> bool:
        return key in self._sums
