"""What every module of :mod:`accord.config` shares: :class:`ConfigError`, the names and constants the schema
and the rules check against, and the value helpers (a field with help text, a choice, a minimum, a device
setting, the coercion of a YAML/CLI value to a field's type).

A leaf of the package: it imports no other accord module, so that :mod:`accord.config.schema` and
:mod:`accord.config.rules` can both use it without importing each other in a circle.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import field
from typing import Any, Callable


class ConfigError(ValueError):
    """A configuration value is missing, unknown or inconsistent. The message says how to fix it."""


def _f(default: Any = dataclasses.MISSING, help: str = "", factory: Any = dataclasses.MISSING):
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _choice(section: str, name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        key = f"{section}.{name}" if section else name
        near = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1) \
            if isinstance(value, str) else []
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigError(f"{key}={_brief(value)} is not valid; {hint}choose one of {list(choices)}")


#: more steps than any run takes (a step is seconds at the least): a larger count is a typo, and past 10^308 it
#: cannot even be divided into a float (the warm-up's share, the progress bar)
MAX_STEPS = 10 ** 9


def _positive(section: str, name: str, value: float, minimum: float = 1) -> None:
    if value < minimum:
        raise ConfigError(f"{section}.{name}={value} must be >= {minimum}")


def _step_count(section: str, name: str, value: int, minimum: int = 1) -> None:
    """A count of steps: at least ``minimum``, at most :data:`MAX_STEPS`."""
    _positive(section, name, value, minimum)
    if value > MAX_STEPS:
        shown = value if value < 10 ** 30 else f"a number of {len(str(value))} digits"
        raise ConfigError(f"{section}.{name}={shown} is more than {MAX_STEPS:,} steps; give the steps the run should "
                          "take")


def _no_empty_path(section: str, name: str, value: str | None) -> None:
    """A path setting given as an empty string (``key=''``) is refused: it would name the current directory."""
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"{section}.{name} is an empty string (an unset shell variable?); give a path, or null to "
                          "leave it unset")


def check_device_setting(key: str, value: str | None) -> None:
    """The syntax of a device setting (auto, cpu, cuda, cuda:N); whether it exists is checked at run time
    (:mod:`accord.devices`), on the machine that loads the model."""
    if value is not None and (not isinstance(value, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value)):
        raise ConfigError(f"{key}={value!r} is not a device; use auto (CUDA if present, else CPU), cpu, cuda or "
                          "cuda:N (N = GPU index, e.g. cuda:1)")


MAX_SEED = 2**31 - 1
#: more turns than an episode of model turns takes (each turn is a generate call per agent): a larger count is a typo
MAX_TURNS = 10_000
VLLM_SLEEP = ("auto", "off", 1, 2)  # rollout.vllm_sleep
ADVANTAGES = ("mean", "rloo", "max", "raw")
ALGORITHMS = ("magrpo", "atgrpo", "iac", "maac", "madpo", "marlhf")
ACTOR_CRITIC = ("iac", "maac")                     # docs/algorithms-actor-critic.md
PREFERENCE = ("madpo", "marlhf")                   # docs/algorithms-preference.md
PAIR_SELECTIONS = ("reward_gap", "random", "all")   # accord.algorithms.preference.select_pairs
SINGLE_SAMPLE_ALGORITHMS = ("iac", "maac", "marlhf")  # K = 1 allowed (marlhf: with an actor-critic stage)
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_sum", "seq_sum_norm")
LOSSES = ("grpo", "dapo", "dr_grpo", "gspo", "cispo")   # built in (accord.algorithms.losses); ``clip`` = grpo
TIS_MODES = ("auto", "off", "truncate", "mask")
BUILTIN_MODELS = ("smollm2-135m", "tiny-qwen2", "tiny-llama", "tiny-qwen3")
"""The model names accord knows without a directory or the Hub (:mod:`accord.models.loading` builds them; kept
here so that a config is checked before torch is imported)."""


def algorithm_phrase(cfg) -> str:
    """``algorithm.name=X``, with marlhf's RL stage (``reward_model.rl``), for messages about a config."""
    name = cfg.algorithm.name
    return f"algorithm.name={name}" + (f" with reward_model.rl={cfg.reward_model.rl}" if name == "marlhf" else "")


# keys by the names TRL's trainers (and Hugging Face's Trainer) give them, too far apart to be suggested by
# spelling (learning_rate is not close to lr): accord's name where the section has it (sft.learning_rate:
# sft.lr), else the key TRL's name means in a policy-gradient run (beta: TRL's KL coefficient), in any section
OTHER_NAMES = {"learning_rate": "training.lr", "max_completion_length": "rollout.max_new_tokens",
               "max_prompt_length": "rollout.max_prompt_tokens", "num_train_epochs": "sft.epochs",
               "per_device_train_batch_size": "training.micro_batch_size", "beta": "algorithm.kl_coef",
               "lr_scheduler_type": "training.schedule"}


def _unknown_key(path: str, key: str, valid: list[str],
                 nested_hint: Callable[[str, bool], str] | None = None) -> ConfigError:
    """The error of an unknown key at ``path`` with the closest valid one; at the top level ``nested_hint(key,
    exact)`` names the nested keys it may mean (:func:`accord.config.loading._nested_hint`)."""
    prefix = path + "." if path else ""
    other = OTHER_NAMES.get(key)
    if other is not None:
        short = other.split(".")[-1]
        close = [prefix + short if short in valid else other]
    else:
        close = [prefix + k for k in difflib.get_close_matches(key, valid, n=1)]
    hint = f"did you mean {close[0]!r}? " if close else ""
    if not path and nested_hint is not None:  # a nested key at the top level (steps=5 for run.steps=5): exact first
        hint = nested_hint(key, True) or hint or nested_hint(key, False)
    where = path or "the top level"
    return ConfigError(f"unknown config key {(path + '.' if path else '') + key!r}; {hint}valid keys at {where}: {valid}")


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Coerce a YAML/CLI value to the annotated type, or raise a ConfigError naming the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for option in inner[:-1]:  # the first type that takes the value (bool | str: 'true' is True)
            try:
                return _coerce(path, value, option)
            except ConfigError:
                pass
        return _coerce(path, value, inner[-1])
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
    elif tp is int:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str):
            try:
                number = int(value)
            except ValueError:
                pass
        if number is not None:
            return number
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"{path}={value!r} is not a finite number; give a finite value")
            return number
    elif tp is str:
        if isinstance(value, str):
            bad = next((c for c in value if c == "\x00" or "\ud800" <= c <= "\udfff"), None)
            if bad is not None:
                raise ConfigError(f"{path} holds the character {bad!r}, which no path, name or file can hold; remove it")
            return value
        if isinstance(value, bool):  # YAML reads a bare on, off, yes, no, true or false as a boolean
            word = "on" if value else "off"
            raise ConfigError(f"{path}={value}: YAML read this value as a boolean (a bare on, off, yes, no, true or "
                              f"false is one), where text is expected; quote it, e.g. {path}='{word}'")
        if isinstance(value, (int, float)):
            # YAML read the text as a number, and not always as written (0755 is 493, 1:30 is 90, 2024.10 is
            # 2024.1): the text cannot be recovered, so it must be quoted
            raise ConfigError(f"{path}={value!r}: YAML read this value as a number, where text is expected (and may "
                              f"have changed it: 0755 reads as 493, 1:30 as 90); quote it, e.g. {path}='...'")
    elif tp in (dict, list, tuple) or origin in (dict, list, tuple):
        base = origin or tp
        if isinstance(value, (list, tuple)) and base in (list, tuple):
            return base(value)
        if isinstance(value, dict) and base is dict:
            return value
    else:
        return value
    name = getattr(tp, '__name__', tp)
    raise ConfigError(f"{path}={_brief(value)} is not a valid {name}; give a value of type {name}")


def _brief(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut at ``limit`` characters (a 400-deep list would be the whole error line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# --- settings as flat dotted keys (comparisons, warm starts: what must be the same to resume or merge) -----

def flat_keys(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested plain data as {dotted key: value}; lists are values."""
    if isinstance(node, dict) and node:
        out = {}
        for k, v in node.items():
            out.update(flat_keys(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: node}


def covered(key: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    """Whether dotted ``key`` is one of ``prefixes`` or lies under one."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def first_difference(a: dict, b: dict, free: tuple[str, ...] = ()) -> tuple[str, Any, Any] | None:
    """The first dotted key (in sorted order, none under ``free``) whose value differs between two nested
    settings, with both values (``"<unset>"`` where one lacks it); None when they agree."""
    fa, fb = flat_keys(a), flat_keys(b)
    for key in sorted(set(fa) | set(fb)):
        if covered(key, free):
            continue
        if fa.get(key, "<unset>") != fb.get(key, "<unset>"):
            return key, fa.get(key, "<unset>"), fb.get(key, "<unset>")
    return None
