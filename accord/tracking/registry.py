"""The sink registry: the :class:`MetricsSink` protocol, :func:`register_sink`, :class:`MultiSink` and the
checks and file helpers the sinks share.

A sink receives every step's metrics (``log``) and the completion tables (``log_completions``) of a run,
and is closed at its end. Each sink class is registered under the name ``logging.report_to`` lists, and
builds itself for a run with the classmethod ``from_run(cfg, run_dir, *, start_step)``::

    import logging

    from accord.tracking import register_sink

    @register_sink("loglines")
    class LogLinesSink:
        @classmethod
        def from_run(cls, cfg, run_dir, *, start_step):
            return cls()

        def log(self, step, metrics):
            logging.getLogger("loglines").info("step %d: %s", step, metrics)

        def log_completions(self, step, rows):
            pass

        def close(self):
            pass

``cfg`` is the run's resolved :class:`accord.config.Config` (``cfg.logging`` for the sink's settings,
``cfg.to_dict()`` to record it), ``run_dir`` the run directory and ``start_step`` the number of steps
already done: 0 for a new run, ``k`` when resuming after step ``k`` (a sink that keeps a file cuts it back
to step ``k``). A sink whose package is optional names the modules it imports in ``packages`` and the
command that installs them in ``install``; a missing one is then an error before any model loads. The
built-in sinks: ``jsonl`` and ``console`` (always built, ``logging.console``), ``tensorboard``, ``wandb``
and ``mlflow``.

Step convention: ``step`` n is logged after n updates (step 0: before training, e.g. the first
evaluation).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import logging
import numbers
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from accord.config import ConfigError

_logger = logging.getLogger(__name__)

__all__ = ["SINKS", "MetricsSink", "MultiSink", "check_packages", "register_sink"]


@runtime_checkable
class MetricsSink(Protocol):
    """Anything that accepts per-step metrics and completion tables."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_completions(self, step: int, rows: list[dict]) -> None: ...

    def close(self) -> None: ...


SINKS: dict[str, type] = {}
"""Registry of sink classes by name: the built-in ``jsonl``, ``console``, ``tensorboard``, ``wandb`` and
``mlflow``, and those added with :func:`register_sink`."""

_T = TypeVar("_T", bound=type)


def register_sink(name: str) -> Callable[[_T], _T]:
    """Class decorator adding a sink class to :data:`SINKS` under ``name``, the name ``logging.report_to``
    lists (the class builds itself for a run with ``from_run(cfg, run_dir, *, start_step)``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a sink's name must be a non-empty string, got {name!r}")

    def decorator(cls: _T) -> _T:
        if name in SINKS and SINKS[name] is not cls:
            raise ValueError(
                f"a sink named {name!r} is already registered ({SINKS[name].__qualname__}); "
                "pick a different name for the new sink"
            )
        SINKS[name] = cls
        return cls

    return decorator


def check_packages(name: str, sink: type) -> None:
    """The modules a sink class names in ``packages`` can be imported; else a one-line :class:`ConfigError`
    with its ``install`` command."""
    missing = [m for m in getattr(sink, "packages", ()) if importlib.util.find_spec(m) is None]
    if missing:
        install = getattr(sink, "install", None) or f"pip install {' '.join(missing)}"
        raise ConfigError(f"logging.report_to includes {name!r}, but {' and '.join(missing)} is not installed; "
                          f"{install}, or remove {name!r} from logging.report_to")


# --------------------------------------------------------------------------- shared checks and helpers

# Column order of the completion tables (text summary, W&B and MLflow tables); extra keys follow.
_COMPLETION_COLUMNS = ("prompt", "agent", "completion", "reward", "advantage", "group", "turn")


def _completion_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Completion table columns: the usual ones first, then any other keys in order of appearance."""
    columns = [c for c in _COMPLETION_COLUMNS if any(c in row for row in rows)]
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    return columns


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


# characters ``json.dumps(ensure_ascii=False)`` writes as they are that would break a JSON-lines file: line
# separators that ``str.splitlines`` (and many JSON-lines readers) split on, and lone surrogates, which UTF-8
# cannot encode
_UNSAFE_IN_LINE = re.compile("[\x85\u2028\u2029\ud800-\udfff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _u_escape(match: re.Match) -> str:
    return f"\\u{ord(match.group()):04x}"


def encodable(text: str) -> str:
    """``text`` with each lone surrogate (which UTF-8 cannot encode: a tracker writing it fails) as its
    ``\\uXXXX`` escape."""
    return _LONE_SURROGATE.sub(_u_escape, text)


def json_line(value: Any) -> str:
    """``value`` as one line of JSON (no newline) with non-ASCII text as it is, except the characters that would
    split the line or fail to encode (U+0085, U+2028, U+2029, lone surrogates), written as ``\\uXXXX`` escapes:
    model text holds any of them, and JSON reads the escapes back to the same string."""
    text = json.dumps(value, default=_json_default, ensure_ascii=False)
    return _UNSAFE_IN_LINE.sub(_u_escape, text)


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()   # read once, at import (setting it to read it is not thread-safe)


def folder_problem(path: Path) -> str | None:
    """What keeps a folder from being made (or written into) at ``path``: the nearest of it and its parents that
    exists is a file, or a symbolic link that leads nowhere (or to itself), where ``mkdir`` would fail with "File
    exists" or "Not a directory". None where nothing does."""
    for parent in (path, *path.parents):
        if parent.is_symlink() and not parent.exists():
            return f"{parent} is a symbolic link that leads nowhere (or to itself)"
        if parent.exists():
            return None if parent.is_dir() else f"{parent} is a file, not a directory"
    return None


def _not_a_folder(path: Path) -> None:
    """An IsADirectoryError naming ``path`` where a folder stands at the file's path (the rename onto it would fail
    after the work, naming the temporary file)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "a folder, where this file is written", str(path))


@contextlib.contextmanager
def hold_output_dir(out_dir: Path, command: str) -> Iterator[None]:
    """Hold ``out_dir`` (an exclusive ``flock`` on the folder itself: no file is left in it) while ``command``
    (accord eval, its --crossplay, accord report) writes its results there: a second command writing into the
    same folder at once is a :class:`ConfigError` (the later would replace the earlier's results, and clear its
    scratch files as a killed command's). The kernel lets go when the process ends, however it ends. Where the
    file system has no locks the command goes on unlocked."""
    import fcntl

    fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{out_dir} is in use by another accord command, writing its results there now; wait "
                              f"for it to end, or pass this {command} another folder with --out DIR") from None
        except OSError as err:
            _logger.debug("no lock on %s (%s): writing unlocked", out_dir, err)
        yield
    finally:
        os.close(fd)   # releases the lock


def made_dirs(path: Path) -> list[Path]:
    """The directories ``path.mkdir(parents=True)`` is about to create, deepest first."""
    made = []
    while not path.exists():
        made.append(path)
        if path.parent == path:
            break
        path = path.parent
    return made


def remove_empty(dirs: list[Path]) -> None:
    """Remove ``dirs`` (deepest first) while they are empty: what a failed command made for its ``--out``."""
    for path in dirs:
        try:
            path.rmdir()
        except OSError:   # not empty (the command wrote there, or something else did) or gone: keep it
            return


def _raise_named(err: BaseException, path: Path) -> None:
    """Raise ``err`` again naming ``path`` where it is an OSError that names no file (a write that hit a full disk
    says only "No space left on device"): the one-line error then says which disk to free."""
    if isinstance(err, OSError) and err.errno is not None and err.filename is None:
        raise OSError(err.errno, err.strerror, str(path)) from err


def _atomic_save(path: Path, save: Callable[[Path], None]) -> None:
    """``save(tmp)`` into a temporary file beside ``path`` (same suffix: a plot's format follows it), then renamed
    onto ``path``: a full disk or a kill never leaves a truncated file where a good one was."""
    _not_a_folder(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)   # a plain file's mode, not mkstemp's 0600
    os.close(fd)
    try:
        save(Path(tmp_name))
        os.replace(tmp_name, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        _raise_named(err, path)
        raise


def _atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory + os.replace. A symbolic link at ``path`` is
    written through, as opening it for writing would: its target is replaced and the link stays (a
    ``metrics.jsonl`` linked into a shared folder stays linked when a resume cuts it back)."""
    _not_a_folder(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)   # a plain file's mode, not mkstemp's 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        _raise_named(err, path)
        raise


# --------------------------------------------------------------------------- base and fan-out


class _SinkBase:
    """Context-manager support shared by the built-in sinks."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
