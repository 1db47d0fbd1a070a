"""What the experiment-tracker sinks (W&B, MLflow) share: the tracker run ids kept in ``RUN_DIR/trackers.json``
for a resume, completion tables as columns and rows, and the config as flat parameters.

Each tracker sink writes its run's id to ``RUN_DIR/trackers.json``; a resumed run (``accord train --resume``)
continues that tracker run. Steps after the checkpoint that the interrupted process had already logged are
logged again: W&B ignores a step lower than one it has seen (it warns), MLflow keeps both values of such a step.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accord.config import ConfigError
from accord.tracking.registry import _completion_columns, _json_default, encodable, json_line

__all__ = ["TRACKERS_FILENAME", "flatten_config"]

_logger = logging.getLogger(__name__)

TRACKERS_FILENAME = "trackers.json"


def _read_ids(run_dir: Path) -> dict:
    path = run_dir / TRACKERS_FILENAME
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:
        raise ConfigError(f"{path} is not valid JSON ({getattr(err, 'msg', None) or type(err).__name__}); fix it or delete it (a resumed run then starts "
                          "new tracker runs)") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object of tracker -> run id; fix it or delete it")
    return data


def _write_id(run_dir: Path, tracker: str, record: dict) -> None:
    data = _read_ids(run_dir)
    old = data.get(tracker)
    if old is not None and old != record:
        _logger.warning("%s: replacing the %s run %s with the new run %s", run_dir / TRACKERS_FILENAME, tracker,
                        old, record)
    data[tracker] = record
    (run_dir / TRACKERS_FILENAME).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _resume_id(run_dir: Path, tracker: str, resume: bool) -> dict | None:
    """The tracker run to continue when resuming, if an earlier process recorded one."""
    if not resume:
        return None
    record = _read_ids(run_dir).get(tracker)
    if record is None:
        _logger.warning("resuming %s, but %s records no %s run; starting a new one", run_dir, TRACKERS_FILENAME,
                        tracker)
    return record


def _cell(value: Any) -> Any:
    """A table cell: scalars and None as they are, anything else (lists, dicts, arrays) as JSON text."""
    if isinstance(value, str):
        return encodable(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        return value.item()
    return json_line(value)


def _table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"completion row {i} is a {type(row).__name__}, expected a dict")
    columns = _completion_columns(rows)
    return columns, [[_cell(row.get(c)) for c in columns] for row in rows]


def flatten_config(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config data as dotted names -> text (lists and None as JSON), for parameter tables."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, str):
            out[name] = value
        else:
            out[name] = json.dumps(value, default=_json_default)
    return out


def _first_line(err: BaseException) -> str:
    """An exception's message as one line, without the links and advice trackers append."""
    text = " ".join(str(getattr(err, "message", None) or err).split())
    return re.split(r"\s+See https?://", text)[0].rstrip(". ") or type(err).__name__
