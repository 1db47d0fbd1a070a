"""Config building, overrides and fix-it errors."""

import re

import pytest

from accord.config import ConfigError, apply_override, config_from_dict, describe, load_config
from accord.config.rules import check_sizes


def test_defaults_build():
    cfg = load_config()
    assert cfg.task.name == "writing" and cfg.policies["main"].model == "smollm2-135m"
    assert cfg.algorithm.num_generations >= 2


def test_yaml_plus_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run: {steps: 3}\nagents:\n  - {name: e}\n  - {name: o}\n")
    cfg = load_config(path, ["rollout.batch_size=8", "training.lr=1e-4", "training.betas=[0.8, 0.9]",
                             "agents.1.policy=main", "policies.main.model=tiny-qwen2"])
    assert cfg.run.steps == 3 and cfg.rollout.batch_size == 8 and cfg.training.lr == 1e-4
    assert cfg.training.betas == (0.8, 0.9) and cfg.policies["main"].model == "tiny-qwen2"


@pytest.mark.parametrize("data,match", [
    ({"rollout": {"bach_size": 3}}, "did you mean 'rollout.batch_size'"),
    ({"algoritm": {}}, "did you mean 'algorithm'"),
    ({"algorithm": {"num_generations": 1}}, "K >= 2"),
    ({"algorithm": {"joint_mode": "diagonal"}}, "choose one of"),
    ({"algorithm": {"name": "magrp"}}, r"algorithm.name='magrp' is not valid; did you mean 'magrpo'\? choose one of"),
    ({"rollout": {"batch_size": "many"}}, "rollout.batch_size='many' is not a valid int"),
    ({"agents": [{"name": "a", "policy": "nope"}]}, "policy 'nope', which is not defined"),
    ({"agents": [{"name": "a"}, {"name": "a"}]}, "duplicate agent names"),
    ({"specialization": "shared", "policies": {"main": {}, "other": {}},
      "agents": [{"name": "a", "policy": "main"}, {"name": "b", "policy": "other"}]},
     "specialization=shared trains one model"),
    ({"policies": {"main": {}, "spare": {}}, "specialization": "separate", "agents": [{"name": "a"}]},
     "used by no agent"),
    ({"rollout": {"temperature": 0}}, "eval_temperature=0"),
    ({"training": {"betas": [0.9]}}, "two numbers"),
])
def test_errors_name_the_fix(data, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict(data)


def test_sizes_must_divide():
    cfg = config_from_dict({"training": {"num_mini_batches": 3}, "rollout": {"batch_size": 2}})
    with pytest.raises(ConfigError, match="not divisible by training.num_mini_batches=3"):
        check_sizes(cfg, {"main": 2})


def test_agents_must_match_task():
    cfg = config_from_dict({"agents": [{"name": "x"}, {"name": "y"}]})
    with pytest.raises(ConfigError, match="do not match the agents of task"):
        cfg.resolve_agents(("concise", "detailed"))


def test_separate_without_agents_gets_one_policy_each():
    cfg = config_from_dict({"specialization": "separate"})
    cfg.resolve_agents(("concise", "detailed"))
    assert [a.policy for a in cfg.agents] == ["concise", "detailed"] and set(cfg.policies) == {"concise", "detailed"}


def test_default_job_gives_each_agent_a_copy_of_main():
    cfg = load_config()
    cfg.resolve_agents(("concise", "detailed"))
    assert cfg.specialization == "separate" and set(cfg.policies) == {"concise", "detailed"}
    assert cfg.policies["concise"] is not cfg.policies["detailed"]


@pytest.mark.parametrize("policies, extra", [
    ({"a": {"model": "tiny-qwen2"}, "b": {"model": "tiny-llama"}}, "['a', 'b']"),
    ({"concise": {}, "detailed": {}, "main": {}}, "['main']"),
])
def test_separate_without_agents_refuses_policies_it_would_drop(policies, extra):
    """Two policies named after no agent (or one left over) would be dropped without a word: an error instead."""
    cfg = config_from_dict({"specialization": "separate", "policies": policies})
    with pytest.raises(ConfigError, match=rf"policies {re.escape(extra)} name no agent of task 'writing'"):
        cfg.resolve_agents(("concise", "detailed"))


def test_separate_without_agents_uses_named_policies_and_the_template():
    cfg = config_from_dict({"specialization": "separate",
                            "policies": {"main": {"model": "tiny-qwen2"}, "detailed": {"model": "tiny-llama"}}})
    cfg.resolve_agents(("concise", "detailed"))
    assert {n: p.model for n, p in cfg.policies.items()} == {"concise": "tiny-qwen2", "detailed": "tiny-llama"}


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_override({}, "rollout.batch_size")
    with pytest.raises(ConfigError, match="not an index"):
        apply_override({"agents": [{}]}, "agents.3.policy=x")
    # an index into a list the config does not set names the list and the fix (it said only that agents must be
    # a list, after the override had made it a section with a key '0')
    for data in ({}, {"agents": None}):
        with pytest.raises(ConfigError, match=r"agents is not set here, so it has no item 0 to change; set the whole "
                                              r"list, e.g. agents=\[\{name: first"):
            apply_override(data, "agents.0.policy=x")
    with pytest.raises(ConfigError, match=r"lora.target_modules is not set here, so it has no item 1"):
        apply_override({}, "lora.target_modules.1=q_proj")
    # a path given as an empty string named the current directory ("demonstrations file '.' is a directory")
    for key in ("sft.data", "sft.eval_data", "reward_model.path", "reward_model.preferences", "run.run_dir",
                "run.output_dir", "sft.output_dir", "compare.warm_start", "compare.output_dir"):
        with pytest.raises(ConfigError, match=rf"{key} is an empty string \(an unset shell variable\?\); give a path"):
            load_config(None, [f"{key}=''"])
    data = {}
    apply_override(data, "task.options.0=x")   # a section's key that happens to be a number is still a key
    assert data == {"task": {"options": {"0": "x"}}}


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("nope.yaml")


def test_a_config_file_that_is_a_fifo_or_a_device_is_named_so(tmp_path):
    """A FIFO or a device given as the config file exists: it was reported as "does not exist"."""
    import os

    fifo = tmp_path / "cfg.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"config file '.*cfg.fifo' is a FIFO \(named pipe\), not a regular file; "
                                          "pass a YAML file"):
        load_config(str(fifo))
    with pytest.raises(ConfigError, match=r"config file '/dev/null' is a device, not a regular file; pass a YAML"):
        load_config("/dev/null")


def test_every_field_has_help():
    rows = describe()
    assert all(text for _, _, text in rows), [k for k, _, t in rows if not t]


# --- input that used to be taken silently or hang (issue 23, item 11) ------------------------------------

def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys: the first section's settings would vanish without a word."""
    path = tmp_path / "dup.yaml"
    path.write_text("run:\n  steps: 3\ntask:\n  name: letters\nrun:\n  seed: 4\n")
    with pytest.raises(ConfigError, match=r"'run' appears twice \(line 1 and line 5\).*merge them"):
        load_config(path)
    nested = tmp_path / "nested.yaml"
    nested.write_text("run:\n  steps: 3\n  steps: 4\n")
    with pytest.raises(ConfigError, match="'steps' appears twice"):
        load_config(nested)
    with pytest.raises(ConfigError, match="'a' appears twice"):
        apply_override({}, "task.options={a: 1, a: 2}")


def test_an_integer_too_long_to_read_and_a_top_level_list_are_one_line(tmp_path):
    """Python refuses int() of more than 4300 digits: PyYAML's ValueError becomes an error naming the place."""
    path = tmp_path / "big.yaml"
    path.write_text("run:\n  steps: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"big.yaml: an integer of 5000 digits at line 2, column 10 is too long"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"override 'rollout.batch_size': an integer of 5000 digits"):
        apply_override({}, "rollout.batch_size=" + "9" * 5000)
    with pytest.raises(ConfigError, match=r"run.seed=9+ is out of range"):   # long but readable: the range check's
        load_config(overrides=["run.seed=" + "9" * 30])
    listed = tmp_path / "list.yaml"
    listed.write_text("- run\n- task\n")
    with pytest.raises(ConfigError, match=r"top level, not a list; write 'key: value' lines"):
        load_config(listed)


def test_an_error_in_the_file_names_the_file_and_one_in_an_override_does_not(tmp_path):
    """A run's own config.yaml (eval, export, --resume) or a user's file: the error names the file it lies in; an
    override's error comes from the command line and names no file."""
    path = tmp_path / "typo.yaml"
    path.write_text("run:\n  nmae: x\n")
    with pytest.raises(ConfigError, match=r"^config file .*typo.yaml: unknown config key 'run.nmae'; did you mean"):
        load_config(path, ["run.steps=3"])
    path.write_text("run:\n  steps: 3\n")
    with pytest.raises(ConfigError, match=r"^unknown config key 'run.nmae'"):
        load_config(path, ["run.nmae=x"])


def test_merge_keys_may_still_be_overridden(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("policies:\n  main: &p {model: tiny-qwen2, lr: 0.01}\n  other:\n    <<: *p\n    lr: 0.02\n"
                    "specialization: separate\n")
    cfg = load_config(path)
    assert cfg.policies["other"].lr == 0.02 and cfg.policies["other"].model == "tiny-qwen2"


def _alias_bomb(levels: int = 12) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "task:\n  options:\n" + "".join(f"    {line}\n" for line in lines)


def test_an_alias_bomb_is_refused_in_bounded_time(tmp_path):
    """Nine aliases per level, twelve levels: 9**12 values once expanded. Refused before anything walks them."""
    import time

    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    t = time.perf_counter()
    with pytest.raises(ConfigError, match=r"more than 100000 values.*alias"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"override 'task.options.x' expands to more than 100000 values"):
        load_config(None, ["task.options.x=[&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], " + ", ".join(
            [f"&a{i} [" + ", ".join([f"*a{i - 1}" if i > 1 else "*a"] * 10) + "]" for i in range(1, 7)]) + "]"])
    assert time.perf_counter() - t < 2.0


@pytest.mark.parametrize("name, problem", [("../x", "contains '..'"), ("a/../../x", "contains '..'"),
                                           ("/tmp/elsewhere", "is an absolute path"), (".", "names run.output_dir"),
                                           ("./", "names run.output_dir")])
def test_a_run_name_that_leaves_the_output_dir_is_refused(name, problem):
    with pytest.raises(ConfigError, match=f"run.name={name!r} {problem}.*run.output_dir"):
        load_config(None, [f"run.name={name}"])


def test_a_run_name_may_hold_subdirectories():
    cfg = load_config(None, ["run.name=sweep/seed1", "run.output_dir=out"])
    assert str(cfg.run_dir) == "out/sweep/seed1"


@pytest.mark.parametrize("model, closest", [("smolm2-135m", "smollm2-135m"), ("tiny-qwen", "tiny-qwen3"),
                                            ("tiny-lama", "tiny-llama"), ("SmolLM2-135M", "smollm2-135m")])
def test_a_misspelt_built_in_model_gets_the_closest_name(model, closest):
    """Before the model_kwargs check (a tiny config) and before any Hub request (the default config)."""
    for overrides in ([], ["policies.main.model_kwargs={hidden_size: 32}"]):
        with pytest.raises(ConfigError, match=f"policies.main.model={model!r} is not a model.*did you mean {closest!r}"):
            load_config(None, [f"policies.main.model={model}", *overrides])


def test_model_names_far_from_the_built_ins_and_local_directories_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-qwen").mkdir()   # a local directory of that name is the user's model, not a typo
    for model in ("tiny-qwen", "Qwen/Qwen3-0.6B", "gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct", "./my-model"):
        assert load_config(None, [f"policies.main.model={model}"]).policies["main"].model == model


def test_the_config_knows_the_models_the_loader_builds():
    from accord.config import BUILTIN_MODELS
    from accord.models.loading import SMOLLM2_SPEC, TINY_SPECS

    assert set(BUILTIN_MODELS) == {SMOLLM2_SPEC, *TINY_SPECS}


def test_tiny_model_options_are_checked_without_torch():
    """model_kwargs are checked against a copy of build_tiny_model's signature in a module without torch, so that a config
    with a tiny model is loaded (and its errors said) without importing torch and transformers (11 s on a 2-core
    EPYC before)."""
    import inspect
    import subprocess
    import sys

    from accord.models.specs import TINY_OPTIONS
    from accord.models.tiny import build_tiny_model

    params = inspect.signature(build_tiny_model).parameters
    assert TINY_OPTIONS == {k: eval(p.annotation) for k, p in params.items() if k not in ("arch", "seed")}
    code = ("import sys; from accord.config import load_config; import accord.plan; "   # plan's config too
            "cfg = load_config(None, ['policies.main.model=tiny-llama', 'policies.main.model_kwargs={num_layers: 3}']); "
            "print(cfg.policies['main'].model_kwargs, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.split() == ["{'num_layers':", "3}", "False", "False"]


@pytest.mark.parametrize("overrides,match", [
    (["task=null"], "task is null"),
    (["policies.main=null"], "policies.main is null"),
    (["rollout=null"], "rollout is null"),
    (["run.steps=1", "run.steps=0"], r"run.steps is already set by 'run.steps=1'; give each key once"),
    (["specialization=foo"], r"^specialization='foo' is not valid"),
    (["policies.main.replicas=0"], r"policies.main.replicas=0 must be >= 1"),
    (["policies.main.model=", "policies.main.model_kwargs={hidden_size: 64}"], r"policies.main.model='' names no model"),
])
def test_a_null_section_a_repeated_override_and_policy_errors_are_named(overrides, match):
    """A section given as null is not quietly replaced by its defaults (task=null would train the default task), a
    key overridden twice is not decided by its order, and a policy's own checks name the policy."""
    with pytest.raises(ConfigError, match=match) as info:
        own_model = any(o.startswith(("policies.main.model=", "policies.main=")) for o in overrides)
        load_config(None, ([] if own_model else ["policies.main.model=tiny-qwen2"]) + overrides)
    assert "\n" not in str(info.value)


def test_lora_target_modules_takes_peft_all_linear():
    """PEFT's `all-linear` is every linear projection but the head, accord's null: it was refused later as a module
    the model lacks. Beside other names it is ambiguous and refused in one line."""
    cfg = config_from_dict({"specialization": "lora", "lora": {"target_modules": "all-linear"}})
    assert cfg.lora.target_modules is None
    with pytest.raises(ConfigError, match=r"lists all-linear beside other names; give all-linear alone"):
        config_from_dict({"specialization": "lora", "lora": {"target_modules": ["all-linear", "q_proj"]}})
    with pytest.raises(ConfigError, match=r"lora.target_modules='q_proj' is one name where a list is expected"):
        config_from_dict({"specialization": "lora", "lora": {"target_modules": "q_proj"}})
    assert config_from_dict({"specialization": "lora", "lora": {"target_modules": ["q_proj"]}}).lora.target_modules \
        == ["q_proj"]


def test_a_resume_that_lists_no_agents_has_the_layout_its_run_recorded(tmp_path):
    """A separate or LoRA run without `agents` records the policies the build made (one per agent, named after
    it); its resume config, with the one policy it was given, lays the run out the same way and is not refused
    (it was, as changing `policies` from [e, o] to [main]). Another specialization still is."""
    from accord.config import layout_change, save_config

    def config(**extra):
        return config_from_dict({"specialization": "separate", "task": {"name": "relay"}, **extra})

    recorded = config()
    recorded.resolve_agents(("e", "o"))
    save_config(recorded, tmp_path / "config.yaml")
    assert sorted(recorded.policies) == ["e", "o"]
    assert layout_change(tmp_path, config()) is None
    assert "--resume changes specialization from 'separate' to 'lora'" in layout_change(
        tmp_path, config(specialization="lora"))


@pytest.mark.parametrize("key", ["run.steps", "sft.steps"])
def test_a_step_count_past_any_run_is_one_line(key):
    """A huge step count is refused where it is read (10^400 once reached the warm-up check and ended in an
    OverflowError traceback when divided into a float)."""
    section, name = key.split(".")
    config_from_dict({section: {name: 10 ** 9}})
    for value, shown in ((10 ** 9 + 1, "1000000001"), (10 ** 400, "a number of 401 digits")):
        with pytest.raises(ConfigError, match=rf"^{key}={shown} is more than 1,000,000,000 steps; give the steps"):
            config_from_dict({section: {name: value}})


def test_the_warmup_note_takes_any_step_count():
    from accord.build import note_short_warmup
    cfg = config_from_dict({"training": {"warmup_steps": 2}})
    assert note_short_warmup(cfg, 10 ** 400) is None and note_short_warmup(cfg, 1) is None
    assert "training.warmup_steps=5" in note_short_warmup(config_from_dict({"training": {"warmup_steps": 5}}), 2)


def test_numbers_yaml_reads_otherwise_than_written_are_refused_in_a_file(tmp_path):
    """A config file's `seed: 010` trained as seed 8 without a word (YAML 1.1's octal); the same digits as a plain
    number or quoted text, underscores (read as Python reads them) and 05 (octal and decimal agree) are kept."""
    path = tmp_path / "cfg.yaml"
    path.write_text("run:\n  seed: 010\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml: the number 010 reads as 8 \(a leading 0 makes it octal\) at "
                                          r"line 2, column 9; write the number in plain digits, or quote it"):
        load_config(path)
    path.write_text("run:\n  seed: 05\n  steps: 1_000\n  name: '010'\n")
    cfg = load_config(path)
    assert (cfg.run.seed, cfg.run.steps, cfg.run.name) == (5, 1000, "010")


def test_more_turns_than_any_episode_takes_are_one_line():
    """rollout.max_turns and a task's max_turns past 10,000 are refused where they are read (a task of 10^8 turns
    kept `accord envs --check` running for as long as its episode)."""
    from accord.envs import make_task
    from accord.envs.registry import TaskError

    config_from_dict({"rollout": {"max_turns": 10_000}})
    with pytest.raises(ConfigError, match=r"^rollout.max_turns=10001 is more than 10,000 turns"):
        config_from_dict({"rollout": {"max_turns": 10_001}})
    assert make_task("relay", {"max_turns": 10_000}).max_turns == 10_000
    with pytest.raises(TaskError, match=r"^task 'relay' has max_turns=100000000, more than 10,000 turns .*"
                                        r"\(task.options.max_turns\)$"):
        make_task("relay", {"max_turns": 10 ** 8})
