"""accord: multi-agent RL for cooperating LLM agents.

The public API, importable from the package itself (``from accord import Trainer, load_config``). Names are
resolved on first use, so ``import accord`` stays cheap (no torch import) for the CLI and for tools that
only read ``accord.__version__``. The list is :data:`__all__`; ``docs/api.md`` describes each name.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # configuration
    "Config": "accord.config",
    "ConfigError": "accord.config",
    "load_config": "accord.config",
    "config_from_dict": "accord.config",
    # training, warm starts, evaluation, comparison
    "Trainer": "accord.trainer",
    "train": "accord.trainer",
    "TrainingInterrupted": "accord.stopping",
    "RunComplete": "accord.build",
    "Callback": "accord.callbacks",
    "run_sft": "accord.sft",
    "run_compare": "accord.compare",
    "run_eval": "accord.evaluate",
    # policies (the trainable units agents act with)
    "Policy": "accord.policies",
    # tasks and environments
    "Env": "accord.envs.protocol",
    "StepResult": "accord.envs.protocol",
    "Task": "accord.envs.registry",
    "TaskError": "accord.envs.registry",
    "register_task": "accord.envs.registry",
    "make_task": "accord.envs.registry",
    "make_env": "accord.envs.registry",
    # extension points
    "register_advantage": "accord.algorithms.advantages",
    "register_loss": "accord.algorithms.losses",
    "register_rollout": "accord.rollout.base",
    "register_backend": "accord.generation.backends",
    "register_sink": "accord.tracking.registry",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accord' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value   # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
