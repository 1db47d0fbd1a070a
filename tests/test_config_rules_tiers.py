"""The config's rules by tier (accord/config/rules.py): each tier's function refuses a representative bad input
with its documented error, the rules module's list of rules kept elsewhere names real functions, and the
config package imports nothing above it."""

import ast
import importlib
import re
from pathlib import Path

import pytest

from accord.config import Config, ConfigError, RolloutConfig, config_from_dict
from accord.config.rules import (EnvInfo, TreeTooLargeError, check_config, check_distributed, check_ray_devices,
                                 check_rollout)

ROOT = Path(__file__).resolve().parents[1]
LETTERS = EnvInfo(name="letters", agents=("e", "o"), single_turn=True)
RELAY = EnvInfo(name="relay", agents=("a", "b"), single_turn=False, max_turns=3)


def test_section_tier_is_checked_when_a_section_is_built():
    with pytest.raises(ConfigError, match=r"^rollout.batch_size=0 must be >= 1$"):
        RolloutConfig(batch_size=0)


def test_run_tier_is_checked_when_a_config_is_built(tiny_cfg):
    bad = tiny_cfg(rollout={"drop_flat_groups": True}, algorithm={"norm_scope": "agent"})
    with pytest.raises(ConfigError, match="rollout.drop_flat_groups=true drops advantage groups .* algorithm.norm_scope=agent pools"):
        config_from_dict(bad)
    cfg = config_from_dict(tiny_cfg(policies={"a": {"model": "tiny-qwen2"}, "b": {"model": "tiny-qwen2"}},
                                    specialization="separate",
                                    agents=[{"name": "e", "policy": "a"}, {"name": "o", "policy": "b"}]))
    cfg.specialization = "shared"   # changed after construction: the function itself refuses it
    with pytest.raises(ConfigError, match=r"specialization=shared trains one model, but agents use policies \['a', 'b'\]"):
        check_config(cfg)


def test_rollout_tier_checks_the_config_against_the_environment(tiny_cfg):
    cfg = config_from_dict(tiny_cfg(algorithm={"name": "atgrpo"}))
    with pytest.raises(ConfigError, match="algorithm.name=atgrpo needs a multi-turn environment; 'letters' is a "
                                          "single-turn task"):
        check_rollout(cfg, LETTERS)
    assert [a.name for a in cfg.agents] == ["e", "o"]   # the agents were resolved first
    sizes = config_from_dict(tiny_cfg(training={"num_mini_batches": 3}))   # 2 x 4 x 2 samples
    with pytest.raises(ConfigError, match="gets 16 samples per step .* not divisible by training.num_mini_batches=3"):
        check_rollout(sizes, LETTERS)
    tree = config_from_dict(tiny_cfg(task={"name": "relay"}, rollout={"max_tree_generations": 10}))
    with pytest.raises(TreeTooLargeError, match="more than rollout.max_tree_generations=10"):
        check_rollout(tree, RELAY)
    check_rollout(config_from_dict(tiny_cfg()), LETTERS)   # a good config passes


def test_joint_mode_null_is_resolved_by_the_rollout_tier(tiny_cfg):
    """algorithm.joint_mode: null (the default) becomes the mode the task declares where the run can use it:
    cross only for single-turn MAGRPO with team credit, two or more agents and K^N within max_cross_joint; aligned
    for a task that declares nothing and for every other MAGRPO rollout and trainer. AT-GRPO, which reads no joint
    mode, keeps null. An explicit value is kept."""
    crossed = EnvInfo(name="letters", agents=("e", "o"), single_turn=True, joint_mode="cross")

    def resolved(env=crossed, **sections):
        cfg = config_from_dict(tiny_cfg(**sections))
        assert cfg.algorithm.joint_mode is None or "joint_mode" in sections.get("algorithm", {})
        check_rollout(cfg, env)
        return cfg.algorithm.joint_mode

    assert resolved() == "cross"
    assert resolved(LETTERS) == "aligned"   # the task declares nothing
    assert resolved(EnvInfo(name="letters", agents=("e", "o"), single_turn=True, joint_mode="aligned")) == "aligned"
    assert resolved(algorithm={"joint_mode": "aligned"}) == "aligned"
    assert resolved(LETTERS, algorithm={"joint_mode": "cross"}) == "cross"
    assert resolved(algorithm={"credit": "counterfactual"}) == "aligned"
    assert resolved(algorithm={"max_cross_joint": 15}) == "aligned"   # K^N = 4^2 = 16
    assert resolved(algorithm={"max_cross_joint": 16}) == "cross"
    assert resolved(algorithm={"name": "iac", "num_generations": 1}) == "aligned"
    assert resolved(algorithm={"name": "marlhf"}) == "aligned"
    assert resolved(EnvInfo(name="letters", agents=("solo",), single_turn=True, joint_mode="cross"),
                    agents=[{"name": "solo", "policy": "main"}]) == "aligned"
    tree = EnvInfo(name="relay", agents=("a", "b"), single_turn=False, max_turns=3, joint_mode="cross")
    assert resolved(tree, task={"name": "relay"}) == "aligned"   # a tree: cross would branch K^N ways
    assert resolved(tree, task={"name": "relay"}, algorithm={"name": "atgrpo"}) is None


def test_the_default_job_declares_cross_joint_actions_and_a_bad_declaration_is_named():
    from types import SimpleNamespace

    from accord import build

    cfg = config_from_dict({})   # the default job: the writing task's two agents
    assert cfg.algorithm.joint_mode is None
    build.check_run(cfg, build.build_env(cfg))
    assert cfg.algorithm.joint_mode == "cross"
    with pytest.raises(ConfigError, match="task 'odd' declares joint_mode='diagonal'; a task may declare 'aligned' or "
                                          "'cross'"):
        build.task_joint_mode(SimpleNamespace(name="odd", joint_mode="diagonal"))


def test_rollout_top_p_null_takes_the_tasks_nucleus(tiny_cfg):
    """rollout.top_p: null is the nucleus the task declares (the writing task's 0.9), else 1.0; a number the config
    gives wins; a bad declaration is named. The resolved value is written into the config (config.yaml)."""
    from types import SimpleNamespace

    from accord import build
    from accord.rollout.sample import agent_sampling, rollout_sampling

    cfg = config_from_dict({})   # the default job: the writing task
    assert cfg.rollout.top_p is None and rollout_sampling(cfg.rollout).top_p == 1.0   # unresolved: no nucleus
    build.check_run(cfg, build.build_env(cfg))
    assert cfg.rollout.top_p == 0.9 and {s.top_p for s in agent_sampling(cfg).values()} == {0.9}
    mine = config_from_dict({"rollout": {"top_p": 1.0}})
    build.check_run(mine, build.build_env(mine))
    assert mine.rollout.top_p == 1.0
    letters = config_from_dict(tiny_cfg())   # declares none
    build.check_run(letters, build.build_env(letters))
    assert letters.rollout.top_p == 1.0
    for bad in (0.0, 1.5, True, "0.9"):
        with pytest.raises(ConfigError, match=f"task 'odd' declares top_p={bad!r}; a task may declare a nucleus in "
                                              r"\(0, 1\]"):
            build.task_top_p(SimpleNamespace(name="odd", top_p=bad))


def test_build_check_run_goes_through_the_rollout_tier(tiny_cfg, monkeypatch):
    from accord import build

    seen = []
    monkeypatch.setattr(build, "check_rollout", lambda cfg, env: seen.append(env))
    cfg = config_from_dict(tiny_cfg())
    build.check_run(cfg, build.build_env(cfg))
    assert seen == [EnvInfo(name="letters", agents=("e", "o"), single_turn=True, max_turns=1,
                            simultaneous=True)]


def test_distributed_tier_checks_replicas_against_processes_and_hardware(tiny_cfg):
    cfg = config_from_dict(tiny_cfg(policies={"main": {"model": "tiny-qwen2", "replicas": 2}}))
    with pytest.raises(ConfigError, match=r"ask for 2 data-parallel ranks, but run.backend=local without torchrun"):
        check_distributed(cfg, ["main"], world=1, cuda_count=0, cpu_count=4)
    with pytest.raises(ConfigError, match=r"policies.main.replicas=2 runs 2 CPU ranks, but this machine has 1 CPU"):
        check_distributed(cfg, ["main"], world=2, cuda_count=0, cpu_count=1)
    assert check_distributed(cfg, ["main"], world=2, cuda_count=0, cpu_count=2) == {"main": 2}
    ray = config_from_dict(tiny_cfg(run={"backend": "ray", "device": "cuda"}))
    with pytest.raises(ConfigError, match="run.device=cuda, but the Ray actor of policy 'main' reserves no GPU"):
        check_ray_devices(ray, {"main": (1.0, 0.0)})


def test_the_rules_kept_elsewhere_are_named_by_real_functions():
    """The rules module's docstring lists where the rules that need live objects are: each name resolves."""
    from accord.config import rules

    names = re.findall(r":func:`(accord\.[\w.]+)`", rules.__doc__)
    assert len(names) >= 10
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr)), dotted


# accord modules the config package may import: its own, and the tiny models' option names (model_kwargs), which
# accord.models.specs holds without torch
ALLOWED = {"accord.config", "accord.config.base", "accord.config.schema", "accord.config.rules",
           "accord.config.loading", "accord.models.specs",
           "accord.data"}   # a leaf (tests/test_imports.py): why a path is no readable file


def test_the_config_package_imports_no_module_above_it():
    found = {}
    for path in sorted((ROOT / "accord" / "config").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: use absolute imports"
                mods = [node.module or ""]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for mod in mods:
                if mod == "accord" or mod.startswith("accord."):
                    found.setdefault(mod, set()).add(path.name)
    above = {mod: sorted(files) for mod, files in found.items() if mod not in ALLOWED}
    assert not above, f"accord/config imports modules above it: {above}; pass plain values in instead"
    assert "accord.config.rules" in found and "accord.config.schema" in found   # the walk saw the package


def test_a_config_is_still_a_config():
    assert isinstance(config_from_dict({}), Config)
