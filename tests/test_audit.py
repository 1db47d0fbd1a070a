"""Rollout integrity audit (``training.audit``, ``accord audit RUN_DIR``): deliberately broken rollouts and
environments are caught, and every built-in rollout passes on every built-in task."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from accord.audit import AuditError, audit_run, state_fingerprint
from accord.config import ConfigError, config_from_dict
from accord.envs.registry import register_task
from accord.envs.synthetic.relay import RelayEnv
from accord.rollout.magrpo import JointRollout
from accord.rollout.multiturn import ATGRPORollout
from accord.trainer import Trainer


class _MutatedClone(RelayEnv):
    """relay whose clone() is not faithful: the copy forgets the partner's last text (a real class of bug:
    a clone that rebuilds its state from the task and loses what the episode did)."""

    def clone(self):
        c = copy.deepcopy(self)
        c._last = {}
        return c


register_task("relay-mutated-clone-test", "test only")(lambda **kw: _MutatedClone(**kw))


def _swap_rewards(samples):
    """Swap the rewards of the first two samples of different groups whose rewards differ (a reward attached to
    another sample); True when such a pair existed."""
    for a in samples:
        for b in samples:
            if a.group != b.group and a.reward != b.reward:
                a.reward, b.reward = b.reward, a.reward
                a.ret, b.ret = a.reward, b.reward
                return True
    return False


def _with_shuffle(cls):
    class Shuffling(cls):
        swapped = False

        def collect(self, rows, generate, *, step, phase):
            result = super().collect(rows, generate, step=step, phase=phase)
            Shuffling.swapped = _swap_rewards(result.samples)
            return result

    return Shuffling


def _trainer(cfg, rollout_cls=None):
    trainer = Trainer(cfg)
    if rollout_cls is not None:   # the run's own rollout, replaced by a deliberately broken subclass
        old = trainer.run.rollout
        new = rollout_cls(cfg, old.env, old.make_env, old.agents, old.agent_policy)
        new.recorder = old.recorder
        trainer.run.rollout = new
    return trainer


def test_a_shuffled_reward_stops_a_strict_run_in_one_line(tiny_cfg):
    cls = _with_shuffle(JointRollout)
    trainer = _trainer(config_from_dict(tiny_cfg(training={"audit": "strict"})), cls)
    try:
        with pytest.raises(AuditError, match=r"audit: step 1, group \d+ \(agent '\w', instance 'train-\d+', turn 0\): "
                                             r"reward: member \d carries reward") as info:
            trainer.train_step(0)
    finally:
        trainer.close()
    assert cls.swapped and "\n" not in str(info.value)


def _one_relay_step(tiny_cfg, rollout_cls):
    """The config of a tiny AT-GRPO run on the relay task that trained (and recorded) one step."""
    cfg = config_from_dict(tiny_cfg(task={"name": "relay", "eval_size": 0}, algorithm={"name": "atgrpo"},
                                    rollout={"batch_size": 2, "max_turns": 1}))
    trainer = _trainer(cfg, rollout_cls)
    try:
        trainer.train_step(0)
    finally:
        trainer.close()
    return cfg


@pytest.mark.slow
def test_a_shuffled_reward_is_found_after_the_fact(tiny_cfg, tmp_path):
    cls = _with_shuffle(ATGRPORollout)
    cfg = _one_relay_step(tiny_cfg, cls)
    assert cls.swapped
    result = audit_run(cfg.run_dir)
    assert [v.kind for v in result.violations] == ["reward", "reward"]      # both members of the swap
    cli = subprocess.run([sys.executable, "-m", "accord.cli", "audit", str(cfg.run_dir)], capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 1 and "violations: 2 (reward 2)" in cli.stdout


@pytest.mark.parametrize("algorithm", [{"name": "atgrpo"}, {"name": "magrpo"}])
def test_a_mutated_clone_is_caught(tiny_cfg, algorithm):
    cfg = config_from_dict(tiny_cfg(task={"name": "relay-mutated-clone-test", "eval_size": 0}, algorithm=algorithm,
                                    rollout={"batch_size": 1, "max_turns": 2}, training={"audit": "strict"}))
    trainer = _trainer(cfg)
    try:
        with pytest.raises(AuditError, match=r"state: member \d's action was scored on state \w+ but its prompt "
                                             r"shows state \w+ \(the environment stepped is not the one rendered"):
            trainer.train_step(0)
    finally:
        trainer.close()


def test_fingerprint_sees_state_not_identity():
    env = RelayEnv()
    env.reset({"id": "x", "number": 3})
    env.step({"e": "tree"})
    twin = env.clone()
    assert twin is not env and state_fingerprint(twin) == state_fingerprint(env)
    twin.step({"o": "zoo"})
    assert state_fingerprint(twin) != state_fingerprint(env)


def test_audit_off_records_nothing_and_bad_values_are_named(tiny_cfg):
    with pytest.raises(ConfigError, match=r"training.audit='loud' is not valid; choose one of \['off', 'record', "):
        config_from_dict(tiny_cfg(training={"audit": "loud"}))
    cfg = config_from_dict(tiny_cfg(training={"audit": "off"}, run={"steps": 1}))
    trainer = Trainer(cfg)
    try:
        metrics, _ = trainer.train_step(0)
    finally:
        trainer.close()
    assert "time/audit" not in metrics and not (cfg.run_dir / "audit").exists()
    with pytest.raises(AuditError, match="has no audit records"):
        audit_run(cfg.run_dir)


def test_record_mode_writes_and_logs(tiny_cfg):
    cfg = config_from_dict(tiny_cfg(run={"steps": 1}))
    trainer = Trainer(cfg)
    try:
        metrics, _ = trainer.train_step(0)
    finally:
        trainer.close()
    assert metrics["audit/violations"] == 0 and "audit/all_equal_group_share" in metrics
    lines = [json.loads(x) for x in (cfg.run_dir / "audit" / "step_000001.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "step" and sum(x["kind"] == "sample" for x in lines) == 2 * 2 * 4
    assert sum(x["kind"] == "scored" for x in lines) == 2 * 4          # aligned: B x K joint actions
    result = audit_run(cfg.run_dir)
    assert result.violations == [] and result.groups == 4


# every built-in rollout on every built-in task, one strict step each
CASES = [
    ("letters", {}, {"name": "magrpo"}),
    ("letters", {}, {"name": "magrpo", "joint_mode": "cross"}),
    ("letters", {}, {"name": "magrpo", "credit": "counterfactual"}),
    ("writing", {"source": "offline"}, {"name": "magrpo"}),
    ("humaneval", {}, {"name": "magrpo"}),
    ("humaneval", {"multi_turn": True}, {"name": "magrpo"}),
    ("relay", {}, {"name": "magrpo"}),
    ("relay", {"simultaneous": True}, {"name": "magrpo", "joint_mode": "cross"}),
    ("relay", {}, {"name": "atgrpo"}),
    ("relay", {}, {"name": "magrpo", "credit": "counterfactual"}),
    ("code", {}, {"name": "atgrpo"}),
    ("code", {}, {"name": "magrpo"}),
    ("math", {}, {"name": "atgrpo"}),
    ("planpath", {}, {"name": "atgrpo"}),
    ("planpath", {}, {"name": "magrpo"}),
    ("sudoku", {}, {"name": "atgrpo"}),
    ("sokoban", {}, {"name": "atgrpo"}),
    ("signal", {"rounds": 2}, {"name": "atgrpo"}),
    ("signal", {}, {"name": "magrpo"}),
    ("handoff", {"start": "given"}, {"name": "atgrpo"}),
    ("handoff", {"single_turn": True}, {"name": "magrpo"}),
]


@pytest.mark.slow
@pytest.mark.parametrize("task,options,algorithm", CASES, ids=[f"{t}-{a['name']}-{i}" for i, (t, _, a) in
                                                                 enumerate(CASES)])
def test_every_builtin_rollout_passes_on_every_task(tiny_cfg, task, options, algorithm):
    cfg = config_from_dict(tiny_cfg(task={"name": task, "options": options, "eval_size": 0},
                                    algorithm={"num_generations": 2, **algorithm},
                                    rollout={"batch_size": 1, "max_new_tokens": 8, "max_turns": 2,
                                             "max_prompt_tokens": 4096, "history_turns": 0},
                                    training={"audit": "strict"}, run={"steps": 1}))
    trainer = Trainer(cfg)
    try:
        metrics, _ = trainer.train_step(0)
    finally:
        trainer.close()
    assert metrics["audit/violations"] == 0
    assert audit_run(cfg.run_dir).violations == []


def test_a_resume_drops_the_records_after_its_checkpoint(tmp_path):
    from accord.audit import prune_after, write_step

    for step in (1, 2, 3):
        write_step(tmp_path, step, [], {}, [])
    prune_after(tmp_path, 2)
    assert sorted(p.name for p in (tmp_path / "audit").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]


@pytest.mark.parametrize("task,algorithm", [("letters", "magrpo"), ("relay", "atgrpo")])
def test_dynamic_sampling_rounds_keep_their_audit_records_apart(tiny_cfg, task, algorithm):
    """rollout.drop_flat_groups rolls out more rounds in a step; each round's scored units are its own (their keys
    started over and collided before), and the kept samples still match what was scored."""
    cfg = config_from_dict(tiny_cfg(run={"steps": 2}, task={"name": task}, algorithm={"name": algorithm},
                                    rollout={"max_new_tokens": 1, "temperature": 0.01, "drop_flat_groups": True},
                                    training={"audit": "strict"}))
    trainer = Trainer(cfg)
    try:
        rounds = [trainer.train_step(step)[0]["rollout/extra_rounds"] for step in range(2)]
    finally:
        trainer.close()
    assert max(rounds) >= 1   # near-greedy one-token answers make flat groups, so extra rounds ran
    assert audit_run(cfg.run_dir).violations == []


@pytest.mark.parametrize("damage", ["count_past_a_float", "step_a_list", "step_text", "step_null", "states_a_list",
                                    "texts_text"])
def test_a_damaged_record_is_one_line(tiny_cfg, damage):
    """Records that read as JSON but not as accord's (edited, or another tool's): `accord audit` says which file is
    damaged in one line. A count of 1e999, a step that is a list, text or null, a scored unit's states or texts of
    another type each ended in a traceback (OverflowError, TypeError, AttributeError)."""
    cfg = _one_relay_step(tiny_cfg, ATGRPORollout)
    path = next((Path(cfg.run_dir) / "audit").glob("step_*.jsonl"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    header, unit = lines[0], next(x for x in lines if x["kind"] == "scored")
    if damage == "states_a_list":
        unit["states"] = []
    elif damage == "texts_text":
        unit["texts"] = "abc"
    elif damage != "count_past_a_float":
        header["step"] = {"step_a_list": [1], "step_text": "x", "step_null": None}[damage]
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    if damage == "count_past_a_float":
        text = text.replace(f'"scored": {header["scored"]}', '"scored": 1e999', 1)
    path.write_text(text)
    with pytest.raises(AuditError, match=r"damaged: delete it or re-run the step"):
        audit_run(cfg.run_dir)
