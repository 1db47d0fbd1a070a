"""Data helpers shared by the tasks: the Hugging Face Hub, local JSON/JSONL files, hash-based splits.

- **Hub**: :func:`hub_unavailable_reason` says why the Hub cannot be used now (offline variables, no
  ``datasets`` package, no answer within :data:`HUB_PROBE_S` seconds) and :func:`load_hub_dataset`
  loads a dataset with ``datasets.load_dataset``, turning every failure into the caller's own error, so a
  loader with an offline fallback never waits for transformers' retries;
- **files**: :func:`read_records` reads the records of a local JSON (a list, or ``{"data": [...]}`` /
  ``{"rows": [...]}``) or JSONL file;
- **splits and ids**: :func:`digest`, :func:`canonical_json`, :func:`hash_bucket` and :func:`hash_split`
  give content-derived ids and train/eval membership that depend on the content only (not on order,
  seed or machine), so the two splits never overlap and stay the same across runs and versions.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse


HUB_PROBE_S = 2.0
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


def not_a_file(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a file, as the rest of a sentence that names it ("does not exist", "is a
    directory, not a file", "is a FIFO (named pipe), not a regular file"); None when it is a regular file or a link
    to one. A FIFO or a device exists: reading one would wait for a writer or never end."""
    p = Path(path)
    if p.is_file():
        return None
    if p.is_dir():
        return "is a directory, not a file"
    try:
        mode = p.stat().st_mode
    except (OSError, ValueError):   # missing, a dangling link, or a name the system cannot hold
        return "does not exist"
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "something else")
    return f"is {kind}, not a regular file"


def demo_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be a file of demonstrations (``sft.data``, ``sft.eval_data``); None when it is a file."""
    what = not_a_file(path)
    if what is None:
        return None
    return (f"demonstrations file {str(path)!r} {what}; give a JSONL file of "
            '{"agent": ..., "prompt": ..., "completion": ...} lines')


# --- the Hub -----------------------------------------------------------------------------------------

def hub_reachable(timeout: float = HUB_PROBE_S) -> bool:
    """Whether the Hub endpoint (``$HF_ENDPOINT``, default huggingface.co) accepts a TCP connection
    within ``timeout`` seconds. The probe runs in a daemon thread, so a stalled DNS lookup cannot hold
    the caller longer than that."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    answer: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, name="accord-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(answer and answer[0])


def hub_unavailable_reason() -> str | None:
    """Why the Hub cannot be used for datasets now (None: it can): an offline variable is set, the
    ``datasets`` package is missing, or the Hub did not answer within :data:`HUB_PROBE_S` seconds."""
    for var in OFFLINE_VARS:
        if os.environ.get(var, "").strip().upper() in _TRUE:
            return f"{var}={os.environ[var]} is set (offline mode)"
    if importlib.util.find_spec("datasets") is None:
        return "the 'datasets' package is not installed (pip install datasets, or pip install 'accord[hub]')"
    if not hub_reachable():
        return f"the Hugging Face Hub did not answer within {HUB_PROBE_S:g} s"
    return None


def hub_load_errors() -> tuple[type[BaseException], ...]:
    """Exceptions meaning "the Hub could not be read" (network, HTTP, missing data).

    Most derive from OSError; the transport errors of the httpx-style clients that huggingface_hub uses
    do not, so their base class is added when present.
    """
    errors: list[type[BaseException]] = [OSError]
    for module_name in ("httpx", "httpx2"):
        if importlib.util.find_spec(module_name) is None:
            continue
        base = getattr(importlib.import_module(module_name), "HTTPError", None)
        if isinstance(base, type) and issubclass(base, BaseException):
            errors.append(base)
    return tuple(errors)


def load_hub_dataset(name: str, config: str | None = None, *, error: Callable[[str], Exception]) -> Any:
    """``datasets.load_dataset(name[, config])``; when the Hub cannot be used or the load fails, raises
    ``error(reason)`` (the caller's exception, whose message names its offline alternatives)."""
    reason = hub_unavailable_reason()
    if reason:
        raise error(reason)
    import datasets  # optional dependency, presence checked above

    try:
        return datasets.load_dataset(name, config) if config else datasets.load_dataset(name)
    except hub_load_errors() as exc:
        raise error(f"loading failed ({exc})") from exc


# --- local files -------------------------------------------------------------------------------------

class DuplicateKeyError(json.JSONDecodeError):
    """A key given twice in one JSON object (:func:`strict_json`)."""


def strict_json(text: str) -> Any:
    """``json.loads``, except that a key given twice in one object is a ``json.JSONDecodeError`` naming it (the
    standard module silently keeps the last value)."""
    def unique(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise DuplicateKeyError(f"key {key!r} appears twice in one object", text, 0)
            out[key] = value
        return out

    return json.loads(text, object_pairs_hook=unique)


class DataFileError(ValueError):
    """A local data file that cannot be read as the records it should hold; the message names the file, the line
    where known, and the fix."""


def json_lines(path: str | os.PathLike, what: str) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSONL file (``what`` names the option or file kind for
    the messages). Lines end at ``\\n`` only (a U+2028 inside a string is text, as JSON allows); a trailing ``\\r``
    and a leading UTF-8 byte-order mark are dropped, and a key twice in one object is an error (:func:`strict_json`).
    Not UTF-8, invalid JSON and values nested too deeply to parse are each a one-line :class:`DataFileError`."""
    raw = Path(path).read_bytes().removeprefix(b"\xef\xbb\xbf")   # a byte-order mark is not part of the text
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DataFileError(f"{what} {path} line {line} is not UTF-8 text (byte {err.start}: {err.reason}); save "
                            "the file as UTF-8") from err
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            out.append((n, strict_json(line)))
        except json.JSONDecodeError as err:
            detail = err.msg if isinstance(err, DuplicateKeyError) else f"{err.msg} at column {err.colno}"
            raise DataFileError(f"{what} {path} line {n}: not valid JSON ({detail}); write one JSON object per "
                                "line") from err
        except RecursionError as err:
            raise DataFileError(f"{what} {path} line {n}: not valid JSON here (nested too deeply to parse); write "
                                "one JSON object per line") from err
        except ValueError as err:   # an integer of more digits than Python converts
            raise DataFileError(f"{what} {path} line {n}: not valid JSON here ({err}); write one JSON object per "
                                "line") from err
        if "\\u" in line and _lone_surrogate(out[-1][1]):   # JSON writes its escapes with a lowercase u
            raise DataFileError(f"{what} {path} line {n}: a string holds a lone surrogate escape (\\ud800-\\udfff "
                                "without its pair), which is no character; fix or remove that escape")
    return out


def _lone_surrogate(value: Any) -> bool:
    """Whether a string in parsed JSON holds a surrogate code point (JSON's ``\\ud800`` escapes decode to one when
    unpaired; no UTF-8 text can hold it). Walked with a stack: a value nested as deeply as the parser allows would
    exceed Python's recursion limit here."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def read_records(path: str | os.PathLike, what: str = "data_files") -> list[Any]:
    """Records of a local JSON (a list, or ``{"data": [...]}`` / ``{"rows": [...]}``) or JSONL file
    (``.jsonl`` / ``.ndjson``: one JSON value per line, blank lines skipped). ``what`` names the option
    the path came from, for the error messages."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{what}={str(path)!r} is not a file; give the path of a local JSON or JSONL file "
                                "(relative paths are read from the working directory)")
    if file.suffix.lower() in (".jsonl", ".ndjson"):
        return [value for _, value in json_lines(file, what)]
    try:
        text = file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataFileError(f"{what} {path} is not UTF-8 text (byte {err.start}: {err.reason}); save it as "
                            "UTF-8") from err
    try:
        data = strict_json(text)
    except json.JSONDecodeError as err:
        raise DataFileError(f"{what} {path} is not valid JSON ({err.msg}, line {err.lineno}); use a JSON list of "
                            "records or a .jsonl file with one record per line") from err
    except RecursionError as err:
        raise DataFileError(f"{what} {path} is not valid JSON here (nested too deeply to parse); use a JSON list "
                            "of records") from err
    except ValueError as err:   # an integer of more digits than Python converts
        raise DataFileError(f"{what} {path} is not valid JSON here ({err}); use a JSON list of records") from err
    if isinstance(data, dict):
        data = data.get("data", data.get("rows"))
    if not isinstance(data, list):
        raise DataFileError(f"{what} {path} must hold a JSON list of records (or {{\"data\": [...]}}), got "
                            f"{type(data).__name__}; or name a .jsonl file with one record per line")
    return data


# --- content hashes: ids and splits ------------------------------------------------------------------

def digest(text: str, algorithm: str = "sha1", salt: str = "") -> str:
    """Hex digest of ``salt + text`` (UTF-8) with ``algorithm`` (a :mod:`hashlib` name)."""
    return hashlib.new(algorithm, (salt + text).encode("utf-8")).hexdigest()


def canonical_json(obj: Any) -> str:
    """``obj`` as compact JSON with sorted keys: the same text for equal plain data."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def hash_bucket(key: str, buckets: int, *, salt: str = "", algorithm: str = "sha256", digits: int | None = None) -> int:
    """Bucket ``0 .. buckets-1`` of ``key``: the digest of ``salt + key`` (its first ``digits`` hex digits,
    or all of it) as an integer, modulo ``buckets``."""
    hexdigest = digest(key, algorithm, salt)
    return int(hexdigest[:digits] if digits else hexdigest, 16) % buckets


def hash_split(rows: list[dict[str, Any]], split: str, in_eval: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The rows of ``split`` (``"eval"``: those ``in_eval`` holds for; anything else: the others), in
    their order."""
    want_eval = split == "eval"
    return [row for row in rows if in_eval(row) == want_eval]
