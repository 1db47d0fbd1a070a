"""A warning for each setting the run does not read (accord.config.ignored): the line appears where the key is set
and ignored, not where it is at its default or read; and two real runs that differ only in such a setting are
bit-identical (metrics and weights), which is what makes the warning true."""

import logging
from pathlib import Path

import pytest
import torch

from accord.config import ignored as ignored_module
from accord.build import build_env, check_run
from accord.config import apply_override, config_from_dict, describe, load_config
from accord.config.ignored import RULES, ignored_settings, warn_ignored
from accord.envs.single_turn import SingleTurnEnv
from accord.tracking import read_metrics
from accord.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """warn_ignored logs each line once per process: each test starts with none logged."""
    ignored_module._warned.clear()
    yield
    ignored_module._warned.clear()


def _cfg(settings: list[str], base: dict | None = None):
    data = dict(base or {})
    for item in settings:
        apply_override(data, item)
    return config_from_dict(data)


def _lines(settings: list[str], single_turn: bool | None, base: dict | None = None) -> list[str]:
    return ignored_settings(_cfg(settings, base), single_turn)


ATGRPO = ["algorithm.name=atgrpo"]
IAC = ["algorithm.name=iac", "algorithm.num_generations=1"]
MADPO = ["algorithm.name=madpo"]
MARLHF = ["algorithm.name=marlhf"]

# (the setting, where it has no effect, single-turn there?, where the same value is read, single-turn there?)
CASES = [
    ("algorithm.alpha=0.7", [], True, ATGRPO, False),
    ("algorithm.alpha=0.7", IAC, False, ATGRPO, False),
    ("algorithm.alpha=0.7", ATGRPO + ["algorithm.baseline=independent"], False, ATGRPO, False),
    ("algorithm.joint_mode=cross", ATGRPO, False, [], True),
    ("algorithm.max_cross_joint=64", ["algorithm.joint_mode=aligned"], True, ["algorithm.joint_mode=cross"], True),
    ("algorithm.max_cross_joint=64", ATGRPO, False, [], True),   # joint_mode null: it decides cross or aligned
    ("algorithm.max_cross_joint=64", ["algorithm.joint_mode=cross"], False, ["algorithm.joint_mode=cross"], True),
    ("algorithm.max_cross_joint=64", ATGRPO + ["algorithm.joint_mode=cross"], False, ["algorithm.joint_mode=cross"],
     True),
    ("algorithm.gamma=0.9", ATGRPO, False, [], False),
    ("algorithm.gamma=0.9", MADPO, False, IAC, False),
    ("algorithm.gamma=0.9", [], True, [], False),
    ("algorithm.gamma=0.9", IAC, True, IAC, False),
    ("algorithm.gamma=0.9", MARLHF + ["reward_model.rl=iac"], None, ["algorithm.name=maac"], False),
    ("critic.gae_lambda=0.5", IAC, True, IAC, False),
    ("algorithm.early_stop_reward=1.0", ATGRPO, False, [], False),
    ("algorithm.early_stop_reward=1.0", [], True, [], False),
    ("rollout.max_tree_generations=100", IAC, False, [], False),
    ("rollout.max_tree_generations=100", [], True, [], False),
    ("rollout.max_turns=2", [], True, ATGRPO, False),
    ("rollout.history_turns=1", MARLHF, None, IAC, False),
    ("algorithm.credit_orderings=3", [], True, ["algorithm.credit=counterfactual"], True),
    ("algorithm.parse_penalty=2.0", [], True, ["algorithm.baseline=centralized"], True),
    ("algorithm.parse_penalty=2.0", MADPO, True, MADPO + ["algorithm.baseline=centralized"], True),
    ("algorithm.normalize_std=true", IAC, True, ATGRPO, False),
    ("algorithm.advantage=rloo", MADPO, True, [], True),
    ("algorithm.norm_scope=prompt", MARLHF + ["reward_model.rl=maac"], True, MARLHF, True),
    ("algorithm.group_std=sample", MADPO + ["algorithm.normalize_std=true"], True,
     ["algorithm.normalize_std=true"], True),
    ("rollout.max_extra_rounds=5", [], True, ["rollout.drop_flat_groups=true"], True),
    ("algorithm.overlong.penalty=0.5", [], True, ["algorithm.overlong.window=8"], True),
    ("algorithm.tis_cap=3.0", ["algorithm.tis='off'"], True, ["algorithm.tis=truncate"], True),
    ("algorithm.tis_cap=3.0", MADPO, True, IAC, True),
    ("algorithm.kl_estimator=k2", [], True, ["algorithm.kl_coef=0.1"], True),
    ("algorithm.kl_estimator=k2", MADPO, True, IAC + ["algorithm.kl_coef=0.1"], True),
    ("algorithm.epsilon=0.3", MADPO, True, IAC, True),
    ("algorithm.epsilon_high=0.3", MADPO, True, [], True),
    ("algorithm.loss_agg=seq_sum", MADPO, True, ATGRPO, False),
    ("algorithm.tis='off'", MADPO, True, [], True),
    ("critic.lr=0.5", [], True, IAC, True),
    ("critic.value_coef=2.0", ATGRPO, False, ["algorithm.name=maac"], False),
    ("critic.mode=separate", MADPO, True, IAC, True),
    ("critic.lr=0.5", MARLHF, True, MARLHF + ["reward_model.rl=iac"], True),
    ("critic.max_tokens=64", IAC, True, IAC + ["critic.mode=separate"], True),
    ("preference.beta=0.5", ATGRPO, False, MADPO, True),
    ("preference.pair_selection=random", [], True, MARLHF, True),
    ("preference.beta=0.5", MARLHF, True, MADPO, True),
    ("preference.rounds_every=2", MARLHF, True, MADPO, True),
    ("preference.min_gap=0.1", MARLHF + ["reward_model.path=x"], True, MARLHF, True),
    ("preference.min_gap=0.1", MARLHF + ["reward_model.preferences=x.jsonl"], True, MARLHF, True),
    ("reward_model.prompts=8", MADPO, True, MARLHF, True),
    ("reward_model.lr=0.001", MARLHF + ["reward_model.path=x"], True, MARLHF, True),
    ("reward_model.prompts=8", MARLHF + ["reward_model.preferences=x.jsonl"], True, MARLHF, True),
    ("lora.r=4", [], True, ["specialization=lora"], True),
    ("lora.target_modules=[q_proj]", ["specialization=shared"], True, ["specialization=lora"], True),
    ("ray.num_cpus_per_policy=3.0", [], True, ["run.backend=ray"], True),
    ("ray.address=auto", [], True, ["run.backend=ray"], True),
    ("policies.main.num_gpus=1", [], True, ["run.backend=ray"], True),
    ("policies.main.num_cpus=2", [], True, ["run.backend=ray"], True),
    ("logging.wandb_project=x", [], True, ["logging.report_to=[wandb]"], True),
    ("logging.mlflow_experiment=x", [], True, ["logging.report_to=[mlflow]"], True),
    ("run.eval_every=5", ["task.eval_size=0"], True, ["task.eval_size=4"], True),
    ("logging.mlflow_tracking_uri=file:///tmp/mlruns", [], True, ["logging.report_to=[mlflow]"], True),
    ("training.micro_batch_size=4", ["training.micro_batch_tokens=512"], True, [], True),
    # the default job's policy sets its own lr; a critic model without critic.lr reads training.lr
    ("training.lr=0.001", [], True, ["policies.main.lr=null"], True),
    ("training.lr=0.001", IAC + ["critic.mode=separate", "critic.lr=0.01"], True, IAC + ["critic.mode=separate"], True),
    ("training.micro_batch_size=4", IAC + ["training.micro_batch_tokens=512"], True,
     IAC + ["critic.mode=separate", "training.micro_batch_tokens=512"], True),
    ("training.micro_batch_size=4", MADPO + ["training.micro_batch_tokens=512"], True,
     ["algorithm.name=maac", "training.micro_batch_tokens=512"], True),
    ("training.micro_batch_size=4", ATGRPO + ["training.micro_batch_tokens=512"], False,
     MARLHF + ["training.micro_batch_tokens=512"], True),
    # a critic or reward model is built from these kwargs only when its own model is named
    ("critic.model_kwargs={hidden_size: 32}", IAC + ["critic.mode=separate"], True,
     IAC + ["critic.mode=separate", "critic.model=tiny-qwen2"], True),
    ("critic.model_kwargs={hidden_size: 32}", ["algorithm.name=maac"], True,
     ["algorithm.name=maac", "critic.model=tiny-qwen2"], True),
    ("reward_model.model_kwargs={hidden_size: 32}", MARLHF, True, MARLHF + ["reward_model.model=tiny-qwen2"], True),
    # the joint DPO step and a value head's joint update always step
    ("training.skip_zero_grad=false", MADPO, True, [], True),
    ("training.skip_zero_grad=false", IAC, True, IAC + ["critic.mode=separate"], True),
]


def _case_id(case) -> str:
    setting, ignored = case[0], case[1]
    return f"{setting.split('=')[0]}|{','.join(o.split('.')[-1] for o in ignored) or 'magrpo'}"


@pytest.mark.parametrize("setting,ignored,st_ignored,used,st_used", CASES, ids=[_case_id(c) for c in CASES])
def test_warned_where_ignored_only(setting, ignored, st_ignored, used, st_used, caplog):
    key = setting.split("=", 1)[0]
    with caplog.at_level(logging.WARNING, logger="accord.config.ignored"):
        warn_ignored(_cfg(ignored + [setting]), st_ignored)
    mine = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{key}=")]
    assert len(mine) == 1, caplog.text
    line = mine[0]
    assert "has no effect" in line and "; remove it" in line and "\n" not in line
    # at its default, and where the same value is read: no line for the key
    assert not [x for x in _lines(ignored, st_ignored) if x.startswith(f"{key}=")]
    assert not [x for x in _lines(used + [setting], st_used) if x.startswith(f"{key}=")]


def test_vllm_settings_are_warned_under_another_backend_only():
    """The vLLM engine's settings under generation_backend=hf: one line each. Under vllm they are read (the backend
    is set on the built config: a config naming vllm cannot be built where the package is not installed)."""
    cfg = _cfg(["rollout.vllm_gpu_memory_utilization=0.9", "rollout.vllm_kwargs={enforce_eager: true}",
                "rollout.vllm_sleep='off'"])
    lines = ignored_settings(cfg, True)
    assert [x.split("=")[0] for x in lines] == ["rollout.vllm_gpu_memory_utilization", "rollout.vllm_kwargs",
                                                 "rollout.vllm_sleep"], lines
    assert all("with rollout.generation_backend=hf" in x and "set rollout.generation_backend=vllm" in x for x in lines)
    cfg.rollout.generation_backend = "vllm"
    assert ignored_settings(cfg, True) == []


def test_the_message_names_key_value_algorithm_and_fix():
    (line,) = _lines(["algorithm.alpha=0.7"], True)
    assert line == ("algorithm.alpha=0.7 has no effect under algorithm.name=magrpo (it weighs the team reward in "
                    "AT-GRPO's candidate reward, alpha * team + local); remove it or set algorithm.name=atgrpo")


def test_a_section_gives_one_line_per_key_set():
    lines = _lines(["critic.lr=0.5", "critic.value_coef=2.0", "critic.model_kwargs={hidden_size: 32}"], True)
    assert [x.split("=")[0] for x in lines] == ["critic.model_kwargs", "critic.lr", "critic.value_coef"]
    assert all("under algorithm.name=magrpo" in x for x in lines)


def test_task_form_rules_wait_for_the_task():
    """Without knowing whether the task is single-turn, the rules that depend on it say nothing."""
    assert _lines(["rollout.max_turns=2", "algorithm.gamma=0.5", "algorithm.early_stop_reward=1"], None) == []
    assert len(_lines(["rollout.max_turns=2", "algorithm.gamma=0.5", "algorithm.early_stop_reward=1"], True)) == 3


def test_defaults_and_every_example_warn_of_nothing():
    assert _lines([], True) == [] and _lines([], False) == []
    for name in ("atgrpo", "iac", "maac", "madpo", "marlhf"):
        assert _lines([f"algorithm.name={name}"], name == "marlhf" or None) == []
    examples = sorted((REPO / "examples").rglob("*.yaml"))
    assert examples
    for path in examples:
        if "vllm" in path.name:   # needs the vllm package to load; its keys are those of the others
            continue
        methods = load_config(path).compare.methods or {"": []}   # a comparison: each method's config
        for method, overrides in methods.items():
            cfg = load_config(path, overrides)
            assert ignored_settings(cfg, isinstance(build_env(cfg), SingleTurnEnv)) == [], (path, method)


def test_every_rule_names_config_keys():
    keys = {k for k, _, _ in describe()}
    sections = {k.split(".")[0] for k in keys}
    for rule in RULES:
        for key in rule.keys:
            key = key.replace("policies.*.", "policies.<name>.")   # a key of each policy
            assert key in keys or key in sections, key
        assert rule.when and rule.why and rule.fix


def test_check_run_warns_once_per_process(tiny_cfg, caplog):
    cfg = config_from_dict(tiny_cfg(algorithm={"alpha": 0.5}, lora={"r": 4}))
    with caplog.at_level(logging.WARNING, logger="accord.config.ignored"):
        check_run(cfg, build_env(cfg))
        check_run(cfg, build_env(cfg))   # accord compare checks each method once per seed
    lines = [r.getMessage() for r in caplog.records if r.name == "accord.config.ignored"]
    assert [x.split("=")[0] for x in lines] == ["algorithm.alpha", "lora.r"]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "accord.config.ignored")


def test_accord_plan_warns(tiny_cfg, caplog):
    from accord.plan import make_plan

    cfg = config_from_dict(tiny_cfg(rollout={"batch_size": 2, "max_new_tokens": 8, "history_turns": 1}))
    with caplog.at_level(logging.WARNING, logger="accord.config.ignored"):
        make_plan(cfg, prompt_tokens=64)
    assert "rollout.history_turns=1 has no effect on the single-turn task 'letters'" in caplog.text


# --- the proof: runs that differ only in an ignored setting are the same run ---------------------------

# relay on a tiny model with a small output layer (vocabulary 2048, as examples/atgrpo_relay.yaml), for speed
SMALL_VOCAB = {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2,
                                                                 "vocab_size": 2048}}}
RELAY_ATGRPO = {"task": {"name": "relay", "eval_size": 0, "options": {"max_turns": 2}},
                "algorithm": {"name": "atgrpo"},
                "rollout": {"batch_size": 1, "max_new_tokens": 8, "temperature": 1.0}, "policies": SMALL_VOCAB}
LETTERS_MAGRPO: dict = {}
LETTERS_MADPO = {"algorithm": {"name": "madpo"}}
LETTERS_IAC = {"algorithm": {"name": "iac", "num_generations": 2}}


def _run(tiny_cfg, tmp_path, name: str, base: dict, settings: list[str]):
    data = tiny_cfg(run={"steps": 1, "run_dir": str(tmp_path / name)}, **{k: dict(v) for k, v in base.items()})
    for item in settings:
        apply_override(data, item)
    trainer = Trainer(config_from_dict(data))
    try:
        trainer.train()
        weights = {f"{p}/{k}": v.detach().clone() for p, pol in trainer.policies.items()
                   for k, v in pol.model.named_parameters()}
    finally:
        trainer.close()
    metrics = [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/", "perf/"))}
               for r in read_metrics(trainer.run_dir)]
    return metrics, weights


def _same(a, b) -> bool:
    (ma, wa), (mb, wb) = a, b
    return ma == mb and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


PROOFS = [
    ("alpha-magrpo", LETTERS_MAGRPO, ["algorithm.alpha=0.3"]),
    ("parse_penalty-magrpo", LETTERS_MAGRPO, ["algorithm.parse_penalty=5.0"]),
    ("critic-magrpo", LETTERS_MAGRPO, ["critic.mode=separate", "critic.lr=0.5", "critic.value_coef=3.0",
                                       "critic.gae_lambda=0.1", "critic.normalize_advantage=false",
                                       "critic.value_clip=null", "critic.value_at=completion"]),
    ("gamma-atgrpo", RELAY_ATGRPO, ["algorithm.gamma=0.3"]),
    ("joint_mode-atgrpo", RELAY_ATGRPO, ["algorithm.joint_mode=cross", "algorithm.max_cross_joint=2"]),
    ("early_stop-atgrpo", RELAY_ATGRPO, ["algorithm.early_stop_reward=0.0", "rollout.max_tree_generations=1"]),
    ("preference-atgrpo", RELAY_ATGRPO, ["preference.beta=0.7", "preference.reference_free=true",
                                         "preference.pair_selection=random", "preference.rounds_every=3",
                                         "preference.min_gap=0.2"]),
    ("clip-madpo", LETTERS_MADPO, ["algorithm.epsilon=0.05", "algorithm.epsilon_high=0.01",
                                   "algorithm.loss_agg=seq_sum", "algorithm.tis='off'", "algorithm.tis_cap=1.0"]),
    ("group-advantage-iac", LETTERS_IAC, ["algorithm.advantage=max", "algorithm.norm_scope=agent",
                                          "algorithm.gamma=0.2", "critic.gae_lambda=0.3"]),
    ("backends-magrpo", LETTERS_MAGRPO, ["rollout.vllm_gpu_memory_utilization=0.9", "rollout.vllm_sleep='off'",
                                         "ray.num_cpus_per_policy=3.0", "logging.wandb_project=x"]),
    ("micro_batch_size-iac", {**LETTERS_IAC, "training": {"micro_batch_tokens": 40}}, ["training.micro_batch_size=3"]),
    ("lr-own-lr", {"policies": {"main": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2},
                                         "lr": 1e-3}}}, ["training.lr=0.5"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,base,settings", PROOFS, ids=[p[0] for p in PROOFS])
def test_an_ignored_setting_changes_nothing(tiny_cfg, tmp_path, caplog, name, base, settings):
    plain = _run(tiny_cfg, tmp_path, "plain", base, [])
    with caplog.at_level(logging.WARNING, logger="accord.config.ignored"):
        changed = _run(tiny_cfg, tmp_path, "changed", base, settings)
    warned = {r.getMessage().split("=")[0] for r in caplog.records if r.name == "accord.config.ignored"}
    assert warned == {s.split("=")[0] for s in settings}
    assert plain[0] and any(v for r in plain[0] for k, v in r.items() if k.startswith("loss/"))   # it trained
    assert _same(plain, changed)


@pytest.mark.slow
def test_the_comparison_sees_a_setting_that_is_read(tiny_cfg, tmp_path):
    """The control: alpha under atgrpo is read, and the same comparison finds the runs different."""
    plain = _run(tiny_cfg, tmp_path, "plain", RELAY_ATGRPO, [])
    assert not _same(plain, _run(tiny_cfg, tmp_path, "alpha", RELAY_ATGRPO, ["algorithm.alpha=0.3"]))
