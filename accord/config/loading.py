"""Building a :class:`~accord.config.schema.Config` from YAML and dotted ``key=value`` overrides, and back.

    cfg = load_config("examples/tiny.yaml", ["rollout.batch_size=8", "policies.main.lr=1e-4"])

:func:`read_yaml` reads a config file (UTF-8, valid YAML, no key twice in a mapping, at most
:data:`MAX_CONFIG_VALUES` values with aliases expanded); :func:`apply_override` sets one dotted key;
:func:`config_from_dict` coerces every value to its field's type (:func:`accord.config.base._coerce`), refuses
unknown keys with the closest valid ones, and builds the sections, whose checks run as they are built
(:mod:`accord.config.schema`, :mod:`accord.config.rules`). :func:`save_config` writes a resolved config;
:func:`describe` lists every key with its default and help text.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from accord.config.base import ACTOR_CRITIC, ConfigError, _coerce, _unknown_key
from accord.config.schema import DEFAULT_POLICIES, AgentConfig, Config, PolicyConfig, _to_plain
from accord.data import not_a_file

_NESTED = {"policies": PolicyConfig, "agents": AgentConfig}


def _nested_hint(key: str, exact: bool) -> str:
    """For an unknown top-level key, the nested keys it may mean: ``steps`` -> ``run.steps``; a dotted key written in
    a file (``run.steps: 5``), which YAML reads as one key, is told how to nest it."""
    section, _, rest = key.partition(".")
    if exact and rest and section in {dotted.split(".", 1)[0] for dotted, _, _ in describe() if "." in dotted}:
        parts = ", then ".join(f"`{part}:`" for part in key.split("."))
        return (f"a dotted key is one key to YAML: nest its parts, each indented beneath the one before ({parts}); "
                "dotted keys are for overrides on the command line; ")
    leaves: dict[str, list[str]] = {}
    for dotted, _, _ in describe():
        if "." in dotted:
            leaves.setdefault(dotted.rsplit(".", 1)[1], []).append(dotted)
    close = [key] if key in leaves else [] if exact else difflib.get_close_matches(key, list(leaves), n=1)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(k) for k in leaves[close[0]][:6]) + "? "


def _build(cls: type, data: Any, path: str) -> Any:
    if data is None and path:   # `run: null`, or a section whose keys are all commented out
        raise ConfigError(f"{path} is null (empty); give its keys as a mapping, or leave {path} out to take its "
                          "defaults")
    if data is None:   # an empty config file: every default
        data = {}
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        example = f"{path}.{dataclasses.fields(cls)[0].name}=..." if path else "run.steps=5"
        raise ConfigError(f"{path or 'config'} must be a mapping of keys to values, got {data!r}; set its keys "
                          f"(e.g. {example}) or write it as a YAML mapping")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(path, str(key), list(fields), _nested_hint)
        sub = f"{path}.{key}" if path else key
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, sub)
        elif key in _NESTED and cls is Config:
            item = _NESTED[key]
            if key == "policies":
                if not isinstance(value, dict):
                    raise ConfigError("policies must be a mapping name -> {model: ...}")
                kwargs[key] = {str(k): _build(item, v, f"policies.{k}") for k, v in value.items()}
            else:
                if not isinstance(value, list):
                    raise ConfigError("agents must be a list of {name: ..., policy: ...}")
                kwargs[key] = [_build(item, v, f"agents.{i}") for i, v in enumerate(value)]
        else:
            kwargs[key] = _coerce(sub, value, tp)
    missing = [f.name for f in fields.values() if f.name not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path or 'config'}: missing required key(s) {missing}")
    try:
        obj = cls(**kwargs)  # __post_init__ first: its messages know each key's own minimum
    except ConfigError as err:   # a policy's own checks say "policies.<name>": name it
        if path.startswith("policies.") and "policies.<name>" in str(err):
            raise ConfigError(str(err).replace("policies.<name>", path)) from err
        raise
    for key, value in kwargs.items():
        is_int = hints[key] is int or int in typing.get_args(hints[key])
        if is_int and isinstance(value, int) and value < 0:
            raise ConfigError(f"{path}.{key}={value} is negative; every integer key is a size, count or seed: "
                              "give a value >= 0")
    return obj


def config_from_dict(data: dict) -> Config:
    """Build and validate a :class:`Config` from nested plain data."""
    _check_finite(data, "")
    return _build(Config, data, "")


def _check_finite(node: Any, path: str) -> None:
    """NaN or infinity anywhere (task options and model_kwargs included) is an error naming its key."""
    if isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{path or 'config'}={node!r} is not a finite number; give a finite value")
    if isinstance(node, dict):
        for key, value in node.items():
            _check_finite(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _check_finite(value, f"{path}.{i}")

MAX_CONFIG_VALUES = 100_000
"""A config holds at most this many values once YAML aliases are expanded: a few nested anchors (an "alias
bomb") would otherwise expand to billions and hang every walk over the config."""


class _DuplicateKey(yaml.YAMLError):
    """A mapping names one key twice (PyYAML would keep the last silently)."""

    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark):
        super().__init__(f"key {key!r} appears twice (line {first.line + 1} and line {again.line + 1})")
        self.key, self.first, self.again = key, first, again


class _IntTooLong(yaml.YAMLError):
    """An integer literal longer than Python converts from text (``sys.get_int_max_str_digits``)."""

    def __init__(self, digits: int, mark: yaml.Mark):
        super().__init__(f"an integer of {digits} digits at line {mark.line + 1}, column {mark.column + 1} is too "
                         f"long to read (at most {sys.get_int_max_str_digits() or 'any'} digits)")


class _UnclearNumber(yaml.YAMLError):
    """A number literal that YAML 1.1 reads otherwise than it looks: a leading 0 makes it octal (``010`` is 8) and a
    colon base 60 (``1:30`` is 90). Underscores are dropped as Python drops them (``1_000`` is 1000)."""

    def __init__(self, text: str, value: Any, mark: yaml.Mark):
        why = "a colon makes it base 60" if ":" in text else "a leading 0 makes it octal"
        self.what = f"the number {text} reads as {value!r} ({why})"
        super().__init__(f"{self.what} at line {mark.line + 1}, column {mark.column + 1}")


def _unclear(text: str, value: Any) -> bool:
    """Whether YAML read the number literal ``text`` as another ``value`` than its digits say."""
    digits = text.lstrip("+-").replace("_", "")
    if ":" in digits:
        return True
    return len(digits) > 1 and digits[0] == "0" and digits.isdigit() and int(digits) != abs(value)


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: a second ``run:`` section would
    otherwise replace the first without a word. Keys merged in with ``<<: *anchor`` may be overridden."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if first is not key_node.start_mark:
                    raise _DuplicateKey(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        try:
            value = super().construct_yaml_int(node)
        except ValueError as err:  # PyYAML's int() of a literal past Python's digit limit
            if "digits" not in str(err):
                raise
            raise _IntTooLong(sum(c.isdigit() for c in node.value), node.start_mark) from err
        if _unclear(node.value, value):
            raise _UnclearNumber(node.value, value, node.start_mark)
        return value

    def construct_yaml_float(self, node):
        value = super().construct_yaml_float(node)
        if ":" in node.value:
            raise _UnclearNumber(node.value, value, node.start_mark)
        return value


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
_ConfigLoader.add_constructor("tag:yaml.org,2002:float", _ConfigLoader.construct_yaml_float)


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses duplicate keys (see :class:`_ConfigLoader`)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _check_size(data: Any, what: str) -> None:
    """At most :data:`MAX_CONFIG_VALUES` values with aliases expanded; counted with an early stop, so an
    alias bomb is refused in bounded time."""
    stack, count = [data], 0
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"{what} expands to more than {MAX_CONFIG_VALUES} values (YAML anchors and aliases "
                              "nested into each other, an alias bomb?); write the values out instead of nesting "
                              "aliases")
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)


def is_config_file(arg: str) -> bool:
    """Whether a command-line argument names a config file rather than a ``key=value`` override: it has no '=', or
    it is an existing ``.yaml`` file whose name holds one (``lr=1e-3.yaml``)."""
    return "=" not in arg or (arg.endswith((".yaml", ".yml")) and os.path.isfile(arg))


def apply_override(data: dict, dotted: str) -> None:
    """Apply one ``a.b.c=value`` override to nested plain data (value parsed as YAML)."""
    if "=" not in dotted:
        raise ConfigError(f"override {dotted!r} must look like key.sub=value, e.g. rollout.batch_size=8")
    key, raw = dotted.split("=", 1)
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except _DuplicateKey as err:
        raise ConfigError(f"override {dotted!r}: {err}; give each key once") from err
    except _IntTooLong as err:
        raise ConfigError(f"override {key.strip()!r}: {err}; give a number in range, or quote it for a text") from err
    except _UnclearNumber as err:
        raise ConfigError(f"override {key.strip()!r}: {err.what}; write the number in plain digits, or quote it for a "
                          f"text, e.g. {key.strip()}='{raw.strip()}'") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"override {dotted!r}: the value is not valid YAML ({_yaml_problem(err)}); quote it or "
                          "fix the brackets, e.g. key=[1, 2] or key='text'") from err
    except RecursionError as err:
        raise ConfigError(f"override {key!r}: the value is nested too deeply to read; write it flatter") from err
    _check_size(value, f"override {key!r}")
    plain = raw.strip()
    if isinstance(value, str) and plain and plain[0] not in "'\"" and value != plain:
        # an unquoted text YAML changed: a ' #...' read as a comment and dropped, lines folded into one
        raise ConfigError(f"override {dotted!r}: YAML reads the value as {value!r}, not as written (a ' #' starts a "
                          f"comment; line breaks are folded); quote it, e.g. {key.strip()}='...'")
    parts = key.strip().split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        prefix = ".".join(parts[: i + 1])
        if isinstance(node, list):
            node = node[_list_index(node, part, prefix)]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {'.'.join(parts[:i])} is {node!r}, not a section with keys; "
                              f"set {'.'.join(parts[:i])}=VALUE, or check the key")
        if part not in node or node[part] is None:
            index = parts[i + 1].isascii() and parts[i + 1].isdigit()
            if index and (prefix in _LIST_KEYS or prefix.startswith("compare.methods.")):
                raise ConfigError(f"override {dotted!r}: {prefix} is not set here, so it has no item {parts[i + 1]} "
                                  f"to change; set the whole list, e.g. {_LIST_EXAMPLES.get(prefix, prefix + '=[...]')}")
            node[part] = {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(node, last, key)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"override {dotted!r}: {'.'.join(parts[:-1])} is {node!r}, not a section with keys; "
                          f"set {'.'.join(parts[:-1])}=VALUE, or check the key")


# the config's list-valued keys (a dotted override may index them: agents.1.policy=b)
_LIST_KEYS = ("agents", "lora.target_modules", "logging.report_to", "compare.seeds", "compare.knobs")
_LIST_EXAMPLES = {"agents": "agents=[{name: first, policy: main}, {name: second, policy: main}], an item for "
                            "each of the task's agents"}


def _list_index(node: list, part: str, path: str) -> int:
    if not (part.isascii() and part.isdigit()) or int(part) >= len(node):
        indices = f"0 to {len(node) - 1}" if node else "none: the list is empty"
        raise ConfigError(f"override {path!r}: {part!r} is not an index of a list of {len(node)} items (indices "
                          f"{indices}); use one of them, or set the whole list, e.g. {path.rsplit('.', 1)[0]}=[...]")
    return int(part)


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> None:
    """Apply ``key=value`` overrides in order; a key given twice is a :class:`ConfigError` (as a key twice in a
    YAML file is): the later one would silently win. So is a section set after a key inside it (``run.steps=3
    run={name: x}``: the section would replace it); the other order refines the section and is kept."""
    seen: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].strip() if "=" in item else None
        if key is not None and key in seen:
            raise ConfigError(f"override {item!r}: {key} is already set by {seen[key]!r}; give each key once")
        inner = [seen[k] for k in seen if key is not None and k.startswith(key + ".")]
        if inner:
            raise ConfigError(f"override {item!r} sets all of {key}, replacing {inner[0]!r} given before it; give "
                              f"{key} first and the keys inside it after")
        if key is not None:
            seen[key] = item
        apply_override(data, item)


def _policies_named(overrides) -> set[str]:
    """The policy names that ``policies.NAME...=VALUE`` overrides set keys of."""
    keys = (o.split("=", 1)[0].strip() for o in overrides if "=" in o)
    return {k.split(".")[1] for k in keys if k.startswith("policies.") and len(k.split(".")) > 1}


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load the embedded defaults, then a YAML file (if any), then dotted overrides; validate."""
    data: dict = {}
    if path is not None:
        data = read_yaml(Path(path))
    if "policies" not in data and _policies_named(overrides) <= set(DEFAULT_POLICIES):
        # the default policies, which policies.main.KEY=VALUE overrides refine; overrides that name other policies
        # (policies.concise.model=...) build the section from nothing, as a YAML section would
        data["policies"] = copy.deepcopy(DEFAULT_POLICIES)
    alone = copy.deepcopy(data) if path is not None and overrides else data
    apply_overrides(data, overrides)
    try:
        return config_from_dict(data)
    except ConfigError as err:
        if path is None:
            raise
        if alone is not data:   # the file without the overrides: does the same error come from it?
            try:
                config_from_dict(alone)
            except ConfigError as own:
                if str(own) != str(err):
                    raise err from None
            else:
                raise
        raise type(err)(f"config file {path}: {err}") from err   # name the file (a run's own config.yaml too)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error in one line: its problem and, where known, line and column (1-based)."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return where + problem


def read_yaml(p: Path) -> dict:
    """A config file's top-level mapping, or a one-line ConfigError naming the file, the problem and the fix."""
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; pass a YAML file (to continue a run: "
                          f"accord train --resume {p})")
    problem = not_a_file(p)
    if problem:
        raise ConfigError(f"config file {str(p)!r} {problem}; pass a YAML file such as examples/tiny.yaml")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                          f"{err.start}); save it as UTF-8") from err
    except OSError as err:
        raise ConfigError(f"config file {p} cannot be read ({err.strerror}); check its permissions") from err
    try:
        loaded = _load_yaml(text)
    except _DuplicateKey as err:
        raise ConfigError(f"config file {p}: {err}; the second would replace the first: merge them into one "
                          f"{err.key!r} (YAML keeps only one value per key)") from err
    except _IntTooLong as err:
        raise ConfigError(f"config file {p}: {err}; give a number in range, or quote it for a text") from err
    except _UnclearNumber as err:
        raise ConfigError(f"config file {p}: {err}; write the number in plain digits, or quote it for a text") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {p}: invalid YAML at {_yaml_problem(err)}; fix the syntax there") from err
    except RecursionError as err:
        raise ConfigError(f"config file {p} is nested too deeply to read; write it flatter") from err
    _check_size(loaded, f"config file {p}")
    if loaded is None:
        raise ConfigError(f"config file {p} is empty; add config keys, or run `accord train` without a file for the "
                          "defaults")
    if not isinstance(loaded, dict):
        raise ConfigError(f"{p} must hold a YAML mapping at the top level, not a {type(loaded).__name__}; write "
                          f"'key: value' lines such as 'run:' with 'steps: 20' indented under it")
    return loaded


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config atomically (temp file, fsync, rename): a crash never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:   # a full disk, Ctrl-C: no half-written temporary file left beside the config
        tmp.unlink(missing_ok=True)
        raise


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field, for docs and ``accord train --help-config``."""
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(describe(tp, key + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append((key, _to_plain(default), f.metadata.get("help", "")))
    for name, item in (("policies.<name>.", PolicyConfig), ("agents.<i>.", AgentConfig)):
        if cls is Config:
            out.extend(describe(item, name))
    return out


def layout_of(data: dict) -> dict[str, object]:
    """What a run's checkpoints are laid out by, from its config as plain data: its specialization, its
    algorithm (marlhf's online stage too), its critic's mode where the run has a critic, its policies and which
    agent each one serves."""
    algorithm = data.get("algorithm") or {}
    rl = (data.get("reward_model") or {}).get("rl") if algorithm.get("name") == "marlhf" else None
    layout = {"specialization": data.get("specialization"), "algorithm.name": algorithm.get("name"),
              "reward_model.rl": rl, "policies": sorted(data.get("policies") or {}),
              "agents": [(a.get("name"), a.get("policy")) for a in data.get("agents") or [] if isinstance(a, dict)]}
    if algorithm.get("name") in ACTOR_CRITIC or rl in ACTOR_CRITIC:
        layout["critic.mode"] = (data.get("critic") or {}).get("mode")
    return layout


def layout_change(run_dir: Path, cfg: Config) -> str | None:
    """The error for a resume whose config lays the run out otherwise than the run's recorded ``config.yaml``
    (:func:`layout_of`: another specialization, algorithm, critic mode, policies or agents): the checkpoints hold
    the first layout, and a run that went on with the other would train something else under the same name
    (shared weights split into copies, MAGRPO's policies under AT-GRPO's updates). None when they agree, or when
    the recorded config cannot be read (the load that follows says why)."""
    try:
        recorded = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(recorded, dict):
        return None
    before = layout_of(recorded)
    if not cfg.agents and before["agents"]:
        # none listed: the task's agents (the recorded run's, which resolved them) get their policies as the build
        # will give them (separate and lora runs: a copy of the policy for each agent, named after it)
        cfg = copy.deepcopy(cfg)
        try:
            cfg.resolve_agents(tuple(name for name, _ in before["agents"]))
        except ConfigError:   # the build says why
            return None
    after = layout_of(cfg.to_dict())
    if not before["agents"]:   # a recorded config without agents: theirs is not known, the build checks them
        after["agents"] = []
    for key, was in before.items():
        if after.get(key) != was:
            return (f"--resume changes {key} from {was!r} to {after.get(key)!r}, but the checkpoints of {run_dir} "
                    f"hold a run laid out by the first; resume without that change, or train a new run from this "
                    f"one's weights (accord export {run_dir} --out DIR, then policies.<name>.model=DIR/<name>)")
    return None
