"""TensorBoard: scalars and a markdown preview of the completion tables under ``RUN_DIR/tb``
(:class:`TensorBoardSink`, ``logging.report_to: [tensorboard]``)."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accord.tracking.registry import (
    _check_step,
    _clean_metrics,
    _completion_columns,
    _SinkBase,
    encodable,
    register_sink,
)

if TYPE_CHECKING:
    from accord.config import Config

__all__ = ["TENSORBOARD_DIRNAME", "TensorBoardSink", "completions_markdown"]

logger = logging.getLogger(__name__)

TENSORBOARD_DIRNAME = "tb"


# TensorBoard renders the text as markdown, raw HTML included: a cell shows these characters as themselves
# (backslash escapes for markdown, entities for HTML), so model text cannot make a link, an image that the
# browser fetches, a code span or a table row
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _md_cell(value: Any, max_chars: int) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = encodable(str(value))
    text = text.replace("\r", "").replace("\n", " ⏎ ")
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    text = _MARKDOWN.sub(r"\\\1", text)
    return "".join(_HTML.get(c, c) for c in text)


def completions_markdown(rows: Sequence[Mapping[str, Any]], max_rows: int = 8, max_chars: int = 300) -> str:
    """Render the first ``max_rows`` completion rows as a markdown table."""
    if not rows:
        return "_no completions_"
    columns = _completion_columns(rows)
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

    packages = ("tensorboard",)
    install = "pip install tensorboard"

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
                "or remove 'tensorboard' from logging.report_to"
            ) from err
        self.log_dir = Path(run_dir) / TENSORBOARD_DIRNAME
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _quiet_writer_thread()
        self.max_rows = max_rows
        self._writer = SummaryWriter(
            log_dir=str(self.log_dir),
            purge_step=None if purge_step is None else _check_step(purge_step, "purge_step"),
            flush_secs=flush_secs,
        )

    @classmethod
    def from_run(cls, cfg: Config, run_dir: str | Path, *, start_step: int) -> TensorBoardSink:
        """``RUN_DIR/tb``; resuming after step ``start_step`` hides the later events of the earlier process."""
        start_step = _check_step(start_step, "start_step")
        return cls(run_dir, purge_step=start_step + 1 if start_step else None)

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


_QUIET: list = []   # the hook installed by _quiet_writer_thread, once per process


def _quiet_writer_thread() -> None:
    """Keep tensorboard's writer thread from printing its traceback when a write fails (a full disk, a removed run
    directory): the thread keeps the error, and the writer raises it in the thread that logs next, where the run
    reports it in one line; the thread re-raising it too printed 20-30 lines beside that line. Other threads'
    errors go to the hook that was there before."""
    if _QUIET:
        return
    previous = threading.excepthook

    def hook(args) -> None:
        thread = args.thread
        if (type(thread).__name__ == "_AsyncWriterThread" and type(thread).__module__.startswith("tensorboard.")
                and isinstance(args.exc_value, OSError)):
            logger.debug("tensorboard's writer thread stopped: %s", args.exc_value)
            return
        previous(args)

    threading.excepthook = hook
    _QUIET.append(hook)
