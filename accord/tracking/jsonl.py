"""The run's own record: ``RUN_DIR/metrics.jsonl`` and the completion tables, written by :class:`JsonlSink`
and read back by :func:`read_metrics`.

::

    run_dir/
      metrics.jsonl                 # one JSON object per step
      completions/step_000012.jsonl # one row per sampled completion

Resuming after step ``k`` passes ``resume_from_step=k``: later lines and tables are removed, so the resumed
run logs every step once.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accord.tracking.eval_completions import EVAL_COMPLETIONS_DIRNAME
from accord.tracking.registry import (
    _atomic_write_text,
    _check_step,
    _clean_metrics,
    _SinkBase,
    json_line,
    register_sink,
)

if TYPE_CHECKING:
    from accord.config import Config

__all__ = ["COMPLETIONS_DIRNAME", "METRICS_FILENAME", "JsonlSink", "MetricsFileError", "completions_path",
           "read_metrics"]

_logger = logging.getLogger(__name__)

MAX_STEP = 2**53           # a step number a metrics file may hold (any run's steps are far fewer)
MAX_EXACT_INT = 2**53      # integers beyond it are not metrics (and a 400-digit one overflows a float)

METRICS_FILENAME = "metrics.jsonl"
COMPLETIONS_DIRNAME = "completions"

_COMPLETIONS_RE = re.compile(r"^step_(\d+)\.jsonl$")


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
        except (ValueError, RecursionError) as err:   # also an integer of more digits than Python converts
            if is_last and not ends_with_newline:
                _logger.warning("%s:%d: dropping truncated last line (interrupted write?)", path, lineno)
                continue
            raise MetricsFileError(
                f"{path}:{lineno}: invalid JSON ({getattr(err, 'msg', None) or type(err).__name__}): {line[:80]!r}; "
                "fix or delete that line of the metrics file (nothing was changed)"
            ) from err
        if (not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int)
                or not 0 <= record["step"] <= MAX_STEP):
            raise MetricsFileError(
                f"{path}:{lineno}: expected a JSON object with an integer 'step' field in [0, {MAX_STEP}], got "
                f"{line[:80]!r}; fix or delete that line of the metrics file (nothing was changed)"
            )
        bad = next((k for k, v in record.items() if isinstance(v, int) and not isinstance(v, bool)
                    and abs(v) > MAX_EXACT_INT), None)
        if bad is not None:
            raise MetricsFileError(f"{path}:{lineno}: {bad}={str(record[bad])[:20]}... is larger than a metric can be "
                                   "(beyond a float's exact integers); fix or delete that line of the metrics file "
                                   "(nothing was changed)")
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
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise MetricsFileError(f"{path}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x}); fix or delete that "
                               "line of the metrics file (nothing was changed)") from err
    return [record for record, _ in _parse_metrics_lines(path, text)]


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

    @classmethod
    def from_run(cls, cfg: Config, run_dir: str | Path, *, start_step: int) -> JsonlSink:
        """The run's metrics.jsonl; resuming after step ``start_step`` cuts it back to that step."""
        return cls(run_dir, resume_from_step=_check_step(start_step, "start_step") or None)

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
            lines.append(json_line(dict(row)) + "\n")
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(path, "".join(lines))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
