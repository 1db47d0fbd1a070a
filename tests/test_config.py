"""Config building, overrides and fix-it errors."""

import pytest

from accord.config import ConfigError, apply_override, config_from_dict, describe, load_config


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
    ({"rollout": {"batch_size": "many"}}, "rollout.batch_size='many' is not a valid int"),
    ({"agents": [{"name": "a", "policy": "nope"}]}, "policy 'nope', which is not defined"),
    ({"agents": [{"name": "a"}, {"name": "a"}]}, "duplicate agent names"),
    ({"policies": {"main": {}, "other": {}}, "agents": [{"name": "a", "policy": "main"}, {"name": "b", "policy": "other"}]},
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
        cfg.validate_sizes({"main": 2})


def test_agents_must_match_task():
    cfg = config_from_dict({"agents": [{"name": "x"}, {"name": "y"}]})
    with pytest.raises(ConfigError, match="do not match the agents of task"):
        cfg.resolve_agents(("concise", "detailed"))


def test_separate_without_agents_gets_one_policy_each():
    cfg = config_from_dict({"specialization": "separate"})
    cfg.resolve_agents(("concise", "detailed"))
    assert [a.policy for a in cfg.agents] == ["concise", "detailed"] and set(cfg.policies) == {"concise", "detailed"}


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_override({}, "rollout.batch_size")
    with pytest.raises(ConfigError, match="not an index"):
        apply_override({"agents": [{}]}, "agents.3.policy=x")


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("nope.yaml")


def test_every_field_has_help():
    rows = describe()
    assert all(text for _, _, text in rows), [k for k, _, t in rows if not t]
