"""Configuration: one dataclass per section, built from YAML plus dotted ``key=value`` overrides.

    cfg = load_config("examples/tiny.yaml", ["rollout.batch_size=8", "policies.main.lr=1e-4"])

=====================  ====================================================================================
module                 what it holds
=====================  ====================================================================================
:mod:`~.base`          :class:`ConfigError`, the names the schema checks against (``ALGORITHMS``, ...), the
                       value helpers (a choice, a minimum, a device setting, the coercion of a value)
:mod:`~.schema`        the dataclasses with their help texts and the rules within each section
:mod:`~.rules`         the rules between sections, one named function per tier: run (:func:`check_config`),
                       rollout (:func:`check_rollout`), distributed (:func:`check_distributed`); its docstring
                       lists where the rules that need live objects are
:mod:`~.loading`       YAML reading, coercion, overrides, :func:`load_config`, :func:`save_config`, :func:`describe`
=====================  ====================================================================================

The package imports no accord module above it, and of the models below it only :mod:`accord.models.specs` (the
tiny models' options, without torch): what a rule needs of a higher layer is passed in as plain values.
Settings that have no effect in a run are warnings, not errors: :mod:`accord.config.ignored`.
"""

from accord.config.base import (ACTOR_CRITIC, ADVANTAGES, ALGORITHMS, BUILTIN_MODELS, LOSS_AGGS, LOSSES, MAX_SEED,
                                PAIR_SELECTIONS, PREFERENCE, SINGLE_SAMPLE_ALGORITHMS, TIS_MODES, VLLM_SLEEP,
                                ConfigError, check_device_setting)
from accord.config.loading import (MAX_CONFIG_VALUES, apply_override, apply_overrides, config_from_dict, describe,
                                   is_config_file, layout_change, load_config, read_yaml, save_config)
from accord.config.rules import EnvInfo, check_config, check_distributed, check_rollout
from accord.config.schema import (AgentConfig, AlgorithmConfig, CompareConfig, Config, CriticConfig, LoggingConfig,
                                  LoraConfig, OverlongConfig, PolicyConfig, PreferenceConfig, RayConfig,
                                  RewardModelConfig, RolloutConfig, RunConfig, SamplingConfig, SftConfig, TaskConfig,
                                  TrainingConfig, check_model_name)

__all__ = [
    # the schema
    "Config", "RunConfig", "PolicyConfig", "SamplingConfig", "AgentConfig", "TaskConfig", "AlgorithmConfig",
    "OverlongConfig", "RolloutConfig", "TrainingConfig", "LoraConfig", "RayConfig", "LoggingConfig", "SftConfig",
    "CriticConfig", "PreferenceConfig", "RewardModelConfig", "CompareConfig",
    # errors, names and value checks
    "ConfigError", "check_device_setting", "check_model_name", "ADVANTAGES", "ALGORITHMS", "ACTOR_CRITIC",
    "PREFERENCE", "PAIR_SELECTIONS", "SINGLE_SAMPLE_ALGORITHMS", "LOSS_AGGS", "LOSSES", "TIS_MODES", "VLLM_SLEEP",
    "MAX_SEED", "BUILTIN_MODELS", "MAX_CONFIG_VALUES",
    # loading and saving
    "load_config", "config_from_dict", "apply_override", "apply_overrides", "is_config_file",
    "read_yaml", "save_config", "describe",
    "layout_change",
    # the rules between sections, by tier
    "check_config", "check_rollout", "check_distributed", "EnvInfo",
]
