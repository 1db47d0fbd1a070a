"""End-to-end behaviour of the trainer on tiny real models: learning, updates, resume, errors."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from accord.config import config_from_dict
from accord.envs.registry import register_task
from accord.envs.synthetic.letters import LettersTask
from accord.envs.synthetic.relay import RelayEnv
from accord.tracking import read_metrics
from accord.policies import TrainingError
from accord.rollout.magrpo import RewardError
from accord.trainer import Trainer


def weights(trainer):
    return {f"{p}/{k}": v.detach().clone() for p, pol in trainer.policies.items()
            for k, v in pol.model.named_parameters()}


def test_every_trainable_parameter_changes(tiny_cfg):
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1})))
    before = weights(trainer)
    trainer.train()
    after = weights(trainer)
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"parameters not updated: {unchanged}"


def test_separate_policies_each_update(tiny_cfg):
    data = tiny_cfg(run={"steps": 1}, specialization="separate",
                    policies={"pe": {"model": "tiny-llama"}, "po": {"model": "tiny-qwen2"}},
                    agents=[{"name": "e", "policy": "pe"}, {"name": "o", "policy": "po"}])
    trainer = Trainer(config_from_dict(data))
    assert set(trainer.policies) == {"pe", "po"}
    before = weights(trainer)
    trainer.train()
    after = weights(trainer)
    assert all(not torch.equal(before[k], after[k]) for k in before)
    rec = read_metrics(trainer.run_dir)[-1]
    assert "loss/pe/pg" in rec and "loss/po/pg" in rec


@pytest.mark.slow
@pytest.mark.parametrize("loss,joint_mode", [("grpo", "aligned"), ("dapo", "aligned"), ("dr_grpo", "aligned"),
                                             ("gspo", "aligned"), ("cispo", "aligned"), ("grpo", "cross")])
def test_team_reward_rises(tiny_cfg, loss, joint_mode):
    """The learning test, for every loss variant and both joint modes of single-turn MAGRPO (cross: the default
    job's, which the writing task declares): on the cooperative letters task the team reward must rise within 30
    steps (Dr. GRPO without the std normalisation it drops)."""
    data = tiny_cfg(run={"steps": 30, "eval_before": True, "eval_after": True},
                    task={"name": "letters", "eval_size": 16},
                    algorithm={"num_generations": 4, "normalize_std": loss != "dr_grpo", "loss": loss,
                               "joint_mode": joint_mode},
                    rollout={"batch_size": 8, "max_new_tokens": 12, "temperature": 1.0, "eval_temperature": 1.0},
                    training={"lr": 2e-2, "micro_batch_size": 64})
    trainer = Trainer(config_from_dict(data))
    trainer.train()
    recs = read_metrics(trainer.run_dir)
    train = [r["team/reward"] for r in recs if "team/reward" in r]
    first, last = sum(train[:5]) / 5, sum(train[-5:]) / 5
    assert last > first + 0.15, f"team reward did not rise: first five {first:.3f}, last five {last:.3f}"
    evals = [r["eval/team/reward"] for r in recs if "eval/team/reward" in r]
    assert evals[-1] > evals[0], f"held-out reward did not rise: {evals}"


@pytest.mark.parametrize("joint_mode,loss_agg,kl", [("aligned", "token_mean", 0.0), ("cross", "seq_mean_token_mean", 0.1)])
def test_resume_is_exact(tiny_cfg, tmp_path, joint_mode, loss_agg, kl):
    common = dict(algorithm={"num_generations": 3, "joint_mode": joint_mode, "loss_agg": loss_agg, "kl_coef": kl,
                             "ppo_epochs": 2},
                  training={"lr": 1e-3, "micro_batch_size": 5, "schedule": "cosine", "warmup_steps": 1})
    full = Trainer(config_from_dict(tiny_cfg(run={"steps": 4, "run_dir": str(tmp_path / "a")}, **common)))
    full.train()
    cfg_b = tiny_cfg(run={"steps": 4, "run_dir": str(tmp_path / "b"), "checkpoint_every": 2}, **common)
    Trainer(config_from_dict(cfg_b)).train(stop_after=2)
    resumed = Trainer(config_from_dict(cfg_b), resume=True)
    assert resumed.start_step == 2
    resumed.train()
    a, b = weights(full), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in rb] == [1, 2, 3, 4]
    assert [r["team/reward"] for r in ra] == [r["team/reward"] for r in rb]


class _BadReward(LettersTask):
    mode = "nan"

    def reward(self, *, prompts=None, completions, agents, **kwargs):
        out = super().reward(prompts=prompts, completions=completions, agents=agents)
        if self.mode == "nan":
            out[3] = math.nan
        elif self.mode == "short":
            out = out[:-1]
        elif self.mode == "text":
            out = [str(v) for v in out]
        elif self.mode == "bool":
            out = [v > 0.5 for v in out]
        elif self.mode == "huge":
            out[3] = 1e300
        else:
            raise KeyError("missing column")
        return out


def _with_mode(cls, mode: str):
    """A test task of class ``cls`` in failure ``mode``."""
    task = cls()
    task.mode = mode
    return task


register_task("bad-reward-test", "test only")(lambda mode="nan": _with_mode(_BadReward, mode))


@pytest.mark.parametrize("mode,text", [("nan", "is nan for joint action 3"), ("short", "returned 7 values for 8"),
                                       ("raise", "raised KeyError"),
                                       # float('0.5') would read it: text is refused, not converted
                                       ("text", "returned str '.*' for joint action 0; return a list of floats"),
                                       # float(True) would read it: a bool is refused, as a step's reward is
                                       ("bool", r"returned bool (True|False) for joint action 0; return a list of "
                                                r"floats \(float\(passed\) for a pass/fail reward\)$")])
def test_bad_rewards_are_named_errors(tiny_cfg, mode, text):
    trainer = Trainer(config_from_dict(tiny_cfg(task={"name": "bad-reward-test", "options": {"mode": mode},
                                                      "eval_size": 0})))
    with pytest.raises(RewardError, match=text) as info:
        trainer.train()
    if mode == "nan":
        assert "row 'train-" in str(info.value) and "e: " in str(info.value)


def _reward_of(out, success=False):
    from accord.envs.single_turn import call_reward

    return call_reward(lambda **kw: out, task_name="t", agents=("a",), prompts={"a": ["p"] * 3},
                       completions={"a": ["x", "y", "z"]}, columns={}, row_ids=["r0", "r1", "r2"], success=success)


@pytest.mark.parametrize("out,text", [
    ({0: 0.5, 1: 0.5, 2: 0.5}, "returned a dict; return a list of floats"),    # a loop read its keys: 0, 1, 2
    ("111", "returned a str; return a list of floats"),                           # its characters: 1.0 each
    ({0.5, 0.25, 1.0}, "returned a set; return a list of floats"),                # in hash order
    (np.array(["0.5"] * 3), "returned str '0.5' for joint action 0"),
    (np.array([True] * 3), r"returned bool True for joint action 0; .*float\(passed\)"),
    (torch.ones(3, dtype=torch.bool), "returned bool True for joint action 0"),
    ([np.bool_(True)] * 3, "returned bool np.True_ for joint action 0"),
    ([torch.tensor(True)] * 3, "returned Tensor tensor\\(True\\) for joint action 0"),
    (np.ones((3, 1)), "returned a 2-d ndarray"),
    ([1.0, 10 ** 400, 0.5], "must return a list of floats, got list: int too large"),
    ([1.0, torch.ones(2), 0.5], "must return a list of floats, got list: only one element"),
])
def test_a_reward_that_is_no_list_of_numbers_is_named(out, text):
    """Each of these trained on without a word (the dict's keys, the string's characters, the set in hash order and
    NumPy/torch bools and text read as rewards) or ended in a traceback (an int past float's range)."""
    with pytest.raises(RewardError, match=text):
        _reward_of(out)


@pytest.mark.parametrize("row,text", [
    ({"id": "r0", "prompts": "two"}, r"an instance field 'prompts' \(row 'r0'\) is also the reward's argument of the "
                                     "agents' prompts, and every field is passed to the reward by its name; rename"),
    ({"id": "r0", 3: "x"}, r"an instance field 3 \(row 'r0'\) is no text"),
], ids=["prompts", "int-key"])
def test_an_instance_field_the_reward_cannot_take_is_named(row, text):
    """A row field named prompts (or agents, completions) or a key that is no text made the call fail before the
    reward ran, and the error said the reward's code raised TypeError; a row of mixed key types failed sorting."""
    from accord.envs.single_turn import SingleTurnEnv

    class Task:
        name, agents = "fields", ("a",)

        def reward(self, *, prompts, completions, agents, **columns):
            return [1.0]

    with pytest.raises(RewardError, match=text) as err:
        SingleTurnEnv(Task()).score([row], {"a": ["p"]}, {"a": ["x"]})
    assert "raised TypeError" not in str(err.value)


def test_arrays_numpy_and_torch_numbers_are_rewards():
    assert _reward_of(np.array([0.5, 1.0, 0.0])) == [0.5, 1.0, 0.0]
    assert _reward_of(torch.tensor([0.5, 1.0, 0.0])) == [0.5, 1.0, 0.0]
    assert _reward_of([np.float32(0.5), torch.tensor(1.0), 2]) == [0.5, 1.0, 2.0]
    assert _reward_of(np.array([True, False, True]), success=True) == [1.0, 0.0, 1.0]   # a success check's bools
    assert _reward_of([np.bool_(True), False, True], success=True) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("value,ok", [(0.5, True), (np.float64(0.5), True), (torch.tensor(0.5), True), (2, True),
                                      (10 ** 400, False), (np.bool_(True), False), (torch.tensor(True), False),
                                      (torch.ones(2), False), (np.ones(2), False), ("0.5", False), (True, False)],
                         ids=["float", "np.float64", "tensor", "int", "int past float", "np.bool_", "tensor bool",
                              "tensor of 2", "array of 2", "text", "bool"])
def test_a_step_reward_is_a_finite_number(value, ok):
    """An environment's step reward: an int past float's range and an array of several ended in a traceback, and
    NumPy/torch bools passed as numbers."""
    from accord.envs.protocol import finite_number

    assert finite_number(value) is ok


class _RaisingRelay(RelayEnv):
    where = "step"

    def reset(self, task, seed=0):
        if self.where == "reset":
            raise IndexError("no such grid")
        return super().reset(task, seed=seed)

    def step(self, actions):
        if self.where == "step":
            raise ZeroDivisionError("division by zero")
        res = super().step(actions)
        if self.where == "observations":   # the second agent's observation left out
            res = dataclasses.replace(res, observations={self.agents[0]: "go on"}, done=False)
        elif self.where == "info":
            res = dataclasses.replace(res, info=None)
        return res

    def instructions(self, agent):
        if self.where == "instructions":
            raise LookupError("no rules yet")
        return None if self.where == "no instructions" else super().instructions(agent)


@register_task("raising-relay-test", "test only")
def _make_raising_relay(where: str = "step"):
    env = _RaisingRelay()
    env.where = where
    return env


@pytest.mark.parametrize("where, algorithm, text", [
    ("step", "atgrpo", r"environment 'relay': step\(\) raised ZeroDivisionError: division by zero; an environment "
                       r"must take any text as a move"),
    ("step", "magrpo", r"step\(\) raised ZeroDivisionError"),
    ("reset", "magrpo", r"environment 'relay': reset\(task 'train-\d+'\) raised IndexError: no such grid; fix its "
                        r"reset or the task's row"),
])
def test_an_environment_that_raises_is_named(tiny_cfg, where, algorithm, text):
    """An exception from an environment's own step() or reset() stops the run with an error naming the environment
    and the call (a one-line EnvOutputError at the command line; it showed the environment's traceback)."""
    from accord.envs.protocol import EnvOutputError

    cfg = config_from_dict(tiny_cfg(task={"name": "raising-relay-test", "options": {"where": where}, "eval_size": 0},
                                    algorithm={"name": algorithm}, rollout={"batch_size": 1, "max_turns": 2}))
    trainer = Trainer(cfg)
    try:
        with pytest.raises(EnvOutputError, match=text) as info:
            trainer.train_step(0)
    finally:
        trainer.close()
    assert isinstance(info.value.__cause__, (ZeroDivisionError, IndexError))


@pytest.mark.parametrize("where, text", [
    ("instructions", r"environment 'relay': instructions\('\w+'\) raised LookupError: no rules yet; fix its "
                     r"instructions"),
    ("no instructions", r"environment 'relay': instructions\('\w+'\) must return text \(the agent's system message\), "
                        r"got NoneType$"),
    ("observations", r"environment 'relay': step\(\) returned a StepResult whose observations must hold one for each "
                     r"agent \['\w+', '\w+'\] while the episode goes on, got \['\w+'\]$"),
    ("info", r"environment 'relay': step\(\) returned a StepResult whose info must be a dict \(empty for nothing to "
             r"say\), got NoneType$"),
])
def test_an_environment_that_breaks_the_protocol_is_named(tiny_cfg, where, text):
    """An environment's instructions() raising or returning no text, a step result missing an agent's observation or
    with no info dict: each ended in a KeyError, TypeError or the chat template's error deep in the rollout."""
    from accord.envs.protocol import EnvOutputError

    cfg = config_from_dict(tiny_cfg(task={"name": "raising-relay-test", "options": {"where": where}, "eval_size": 0},
                                    algorithm={"name": "magrpo"}, rollout={"batch_size": 1, "max_turns": 2}))
    trainer = Trainer(cfg)
    try:
        with pytest.raises(EnvOutputError, match=text):
            trainer.train_step(0)
    finally:
        trainer.close()


class _OddLetters(LettersTask):
    mode = "prompt"

    def rows(self, split, limit=None, seed=0):
        if self.mode == "rows":
            raise RuntimeError("rows boom")
        rows = super().rows(split, limit=limit, seed=seed)
        return (r for r in rows) if self.mode == "generator" else tuple(rows) if self.mode == "tuple" else rows

    def prompt(self, agent, row):
        if self.mode == "prompt":
            raise RuntimeError("prompt boom")
        return super().prompt(agent, row)

    def reward(self, *, prompts=None, completions, agents, **kwargs):
        out = super().reward(prompts=prompts, completions=completions, agents=agents)
        if self.mode == "edits":   # a reward that edits what it is given
            completions[agents[0]].clear()
            prompts[agents[0]][:] = ["x"] * len(prompts[agents[0]])
        return out


register_task("odd-letters-test", "test only")(lambda mode="prompt": _with_mode(_OddLetters, mode))


@pytest.mark.parametrize("mode, text", [
    ("rows", r"environment 'letters': tasks\('train'\) raised RuntimeError: rows boom; fix its instances"),
    ("generator", r"environment 'letters': the train instances \(tasks\(\), a task's rows\(\)\) must be a "
                  r"list of dicts, got generator; return a list$"),
    ("prompt", r"environment 'letters': prompt\('\w+', row 'train-\d+'\) raised RuntimeError: prompt boom; "
               r"fix the task's prompt"),
])
def test_a_task_whose_rows_or_prompt_fail_is_named(tiny_cfg, mode, text):
    """A task's rows() or prompt() raising, or rows() giving a generator: a traceback from accord's code before."""
    from accord.envs.protocol import EnvOutputError

    with pytest.raises(EnvOutputError, match=text):
        trainer = Trainer(config_from_dict(tiny_cfg(task={"name": "odd-letters-test", "options": {"mode": mode},
                                                          "eval_size": 0})))
        try:
            trainer.train_step(0)
        finally:
            trainer.close()


def test_a_task_s_tuple_of_rows_is_read_and_a_reward_s_edits_stay_its_own(tiny_cfg, tmp_path):
    """rows() as a tuple trains as a list; a reward that clears or rewrites the lists it is given left the rollout's
    record of the completions wrong (an IndexError in the audit recorder, or a false integrity violation)."""
    from accord.audit import audit_run

    for mode in ("tuple", "edits"):
        cfg = tiny_cfg(task={"name": "odd-letters-test", "options": {"mode": mode}, "eval_size": 0})
        cfg["run"].update(steps=1, run_dir=str(tmp_path / mode))
        Trainer(config_from_dict(cfg)).train()
    assert audit_run(tmp_path / "edits").violations == []


def test_a_reward_beyond_float32_is_named(tiny_cfg):
    """A finite reward too large for float32 advantages stops the run naming it (it surfaced as a nan loss)."""
    trainer = Trainer(config_from_dict(tiny_cfg(task={"name": "bad-reward-test", "options": {"mode": "huge"},
                                                      "eval_size": 0})))
    with pytest.raises(TrainingError, match=r"step 0: the mean advantages are not finite: returns reach 1e\+300 "
                                            r"\(agent '[eo]'\), more than float32 holds; scale the task's reward down"):
        trainer.train()


def test_an_estimator_giving_nan_for_finite_returns_is_named(tiny_cfg):
    """A registered estimator's nan is named as the estimator's, not blamed on returns too large for float32."""
    from accord.algorithms import ADVANTAGE_ESTIMATORS, register_advantage

    if "test_nan_estimator" not in ADVANTAGE_ESTIMATORS:
        register_advantage("test_nan_estimator")(lambda returns, stats: returns * float("nan"))
    trainer = Trainer(config_from_dict(tiny_cfg(algorithm={"advantage": "test_nan_estimator", "normalize_std": False},
                                                task={"eval_size": 0})))
    try:
        with pytest.raises(TrainingError, match=r"step 0: the advantage estimator 'test_nan_estimator' gave nan for "
                                                r"finite returns \(the largest .*\); fix it to return finite"):
            trainer.train_step(0)
    finally:
        trainer.close()


def test_nan_loss_stops_with_step_and_policy(tiny_cfg):
    trainer = Trainer(config_from_dict(tiny_cfg()))
    model = trainer.policies["main"].model

    def poison(module, args, output):  # only the update's forward (generation runs without grad)
        return output * float("nan") if torch.is_grad_enabled() else output

    model.model.norm.register_forward_hook(poison)
    with pytest.raises(TrainingError, match="step 0: loss of policy 'main' is nan"):
        trainer.train()


def test_nan_weights_stop_generation_with_a_clear_error(tiny_cfg):
    from accord.generation.hf import GenerationError

    trainer = Trainer(config_from_dict(tiny_cfg()))
    with torch.no_grad():
        next(trainer.policies["main"].model.parameters()).fill_(float("nan"))
    with pytest.raises(GenerationError, match="policy 'main'.*non-finite"):
        trainer.train()


def test_prompt_longer_than_limit(tiny_cfg, caplog):
    """A single-turn task's instances whose prompt is too long are left out when the run is built, said with their
    number and one of them (a row too long stopped the run when it was drawn, without its name); too few left for
    a batch is an error."""
    import logging

    from accord.config import ConfigError
    from accord.policies.model import chat_ids

    with pytest.raises(ConfigError, match=r"task 'letters': 0 training instances have a prompt that fits "
                                          r"rollout.max_prompt_tokens=4 and the model's context, fewer than "
                                          r"rollout.batch_size=2; raise rollout.max_prompt_tokens"):
        Trainer(config_from_dict(tiny_cfg(rollout={"batch_size": 2, "max_prompt_tokens": 4})))
    probe = Trainer(config_from_dict(tiny_cfg(task={"name": "letters", "eval_size": 8})))
    policy, env = probe.policies["main"], probe.run.env
    lengths = {r["id"]: max(len(chat_ids(policy.tokenizer, env.prompt(a, r))) for a in env.agents)
               for r in probe.train_rows + probe.eval_rows}
    limit = min(lengths[r["id"]] for r in probe.train_rows)   # the shortest training prompts fit, longer ones not
    probe.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="accord.build"):
        trainer = Trainer(config_from_dict(tiny_cfg(task={"name": "letters", "eval_size": 8},
                                                    rollout={"max_prompt_tokens": limit})))
    assert trainer.train_rows and all(lengths[r["id"]] <= limit for r in trainer.train_rows + trainer.eval_rows)
    dropped = sum(1 for r in probe.train_rows if lengths[r["id"]] > limit)
    assert dropped > 0 and len(trainer.train_rows) == len(probe.train_rows) - dropped
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said[0].startswith(f"task 'letters': {dropped} of its {len(probe.train_rows)} training instances have a "
                              "prompt too long for their policy and are left out (e.g. row ")
    trainer.train()   # no row too long is drawn


def test_metrics_and_completions_are_written(tiny_cfg):
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 2, "eval_before": True, "eval_after": True},
                                                task={"name": "letters", "eval_size": 4})))
    trainer.train()
    recs = read_metrics(trainer.run_dir)
    assert recs[0]["step"] == 0 and "eval/team/reward" in recs[0]
    last = recs[-1]
    for key in ["team/reward", "agent/e/reward", "agent/o/completion_len", "loss/main/pg", "loss/main/entropy",
                "loss/main/clip_frac", "loss/main/grad_norm", "time/gen", "time/update", "perf/gen_tokens_per_s",
                "eval/team/reward"]:
        assert key in last and math.isfinite(last[key]), key
    assert abs(last["loss/main/logp_diff"]) < 1e-3  # stored sampling log-probs = training log-probs
    rows = (trainer.run_dir / "completions" / "step_000002.jsonl").read_text().splitlines()
    assert len(rows) == 2 * 4 * 2
    # groups with no reward spread, recounted from the completions table
    returns = {}
    for row in map(json.loads, rows):
        returns.setdefault(row["group"], set()).add(row["return"])
    flat = sum(len(v) == 1 for v in returns.values()) / len(returns)
    assert last["adv/zero_std_frac"] == pytest.approx(flat)
    assert (trainer.run_dir / "checkpoints" / "step_000002" / "policies" / "main" / "model.safetensors").is_file()


def test_stop_when_makes_a_step_the_last(tiny_cfg):
    """train(stop_when=...): the step where it returns True is the last, evaluated, logged and checkpointed as step
    run.steps would be; it sees each step's metrics (accord compare stops at a token budget this way)."""
    seen = []

    def stop_when(step, metrics):
        seen.append((step, metrics["perf/gen_tokens"]))
        return sum(tokens for _, tokens in seen) >= 150

    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 50, "eval_after": True, "checkpoint_every": 0},
                                                task={"name": "letters", "eval_size": 2})))
    last = trainer.train(stop_when=stop_when)
    n = len(seen)
    assert [s for s, _ in seen] == list(range(1, n + 1)) and 1 < n < 50
    assert sum(t for _, t in seen[:-1]) < 150 <= sum(t for _, t in seen)
    assert [r["step"] for r in read_metrics(trainer.run_dir)] == list(range(1, n + 1))
    assert "eval/team/reward" in last   # run.eval_after: evaluated as the last step
    assert [p.name for p in (trainer.run_dir / "checkpoints").iterdir()] == [f"step_{n:06d}"]


class _IdsTask(LettersTask):
    ids = "repeat"

    def rows(self, split, limit=None, seed=0):
        rows = super().rows(split, limit, seed)
        if self.ids == "repeat" and split == "train":
            return [{**r, "id": "same" if j < 3 else r["id"]} for j, r in enumerate(rows)]
        if self.ids == "overlap" and split == "eval":
            return [{**r, "id": "train-0" if j == 0 else r["id"]} for j, r in enumerate(rows)]
        if self.ids == "unhashable" and split == "train":
            return [{**r, "id": ["a", j]} for j, r in enumerate(rows)]
        if self.ids == "none" and split == "train":
            return [{**r, "id": None} for r in rows]
        return rows


@register_task("ids-test", "test only")
def _make_ids(ids: str = "repeat"):
    task = _IdsTask(size=20)
    task.ids = ids
    return task


@pytest.mark.parametrize("ids, text", [
    ("repeat", r"task 'ids-test': its train split repeats 1 instance ids \(e.g. 'same' 3 times; .*\); give each "
               r"instance its own id or drop the repeats"),
    ("overlap", r"task 'ids-test': 1 instances are in both train and eval splits \(e.g. id 'train-0'\)"),
    ("unhashable", r"task 'ids-test': its train instances' ids must be text or integers, got list \['a', 0\]"),
    ("none", r"task 'ids-test': its train instances' ids must be text or integers, got NoneType None"),
])
def test_instance_ids_are_checked_per_split_and_across(tiny_cfg, ids, text):
    """Repeated ids within a split are named as such (they were reported as a train/eval overlap, or not at all),
    an overlap as an overlap, and an id that is neither text nor an integer is refused (a list raised TypeError)."""
    from accord.build import split_data
    from accord.config import ConfigError
    from accord.envs.registry import make_env

    cfg = config_from_dict(tiny_cfg(task={"name": "ids-test", "options": {"ids": ids}, "eval_size": 4}))
    with pytest.raises(ConfigError, match=text):
        split_data(cfg, make_env("ids-test", {"ids": ids}))


def test_a_growing_history_leaves_out_its_earliest_exchanges(tiny_cfg, caplog):
    """A multi-turn prompt that outgrows rollout.max_prompt_tokens as the agents write (six turns of up to 48
    tokens against 200) leaves out its earliest exchanges, counted and said once, where it stopped the run with
    PromptTooLongError; a prompt with no exchange to leave out is still the error."""
    import logging

    from accord.policies.agents import without_earliest_exchange

    cfg = config_from_dict(tiny_cfg(task={"name": "relay", "eval_size": 0, "options": {"max_turns": 6}},
                                    algorithm={"name": "atgrpo", "num_generations": 2},
                                    rollout={"batch_size": 1, "max_new_tokens": 48, "max_turns": 6,
                                             "max_prompt_tokens": 200}))
    trainer = Trainer(cfg)
    with caplog.at_level(logging.WARNING, logger="accord.policies.agents"):
        trainer.train()
    cut = [r.get("rollout/history_cut", 0) for r in read_metrics(trainer.run_dir)]
    assert sum(cut) > 0, cut
    assert len([r for r in caplog.records if "earliest exchange" in r.getMessage()]) == 1
    system, u1, a1, u2 = ({"role": r, "content": r[0]} for r in ("system", "user", "assistant", "user"))
    assert without_earliest_exchange([system, u1, a1, u2]) == [system, u2]
    assert without_earliest_exchange([u1, a1, u2]) == [u2]
    assert without_earliest_exchange([system, u2]) is None and without_earliest_exchange([u1, a1]) is None


def test_a_resume_without_the_checkpoints_a_run_had_is_refused(tiny_cfg, tmp_path):
    """A run killed before its first checkpoint is replayed from step 0 (its logs discarded); one that logged a
    step past its first checkpoint's had a checkpoint, so a resume that finds none is refused instead of deleting
    its logs (the checkpoints were removed), naming the fixes."""
    from accord.build import resume_point
    from accord.config import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "team/reward": 0.5}) + "\n" for s in range(4)))
    cfg = config_from_dict(tiny_cfg(run={"steps": 10, "checkpoint_every": 2}))
    with pytest.raises(ConfigError, match=r"logged 3 steps but holds no checkpoint .*checkpoint_every=2.*--overwrite"):
        resume_point(cfg, run)
    # step 3 logged at a checkpoint step: a kill between its log and the checkpoint's rename, replayed
    assert resume_point(config_from_dict(tiny_cfg(run={"steps": 10, "checkpoint_every": 3})), run) is None
    assert resume_point(config_from_dict(tiny_cfg(run={"steps": 10, "checkpoint_every": 0})), run) is None


def test_a_warm_up_longer_than_the_run_is_named(tiny_cfg):
    """training.warmup_steps so long that the run's optimizer steps end under half of training.lr: a warning with
    the share reached; the default warm-up of a short run (1 step of 2: half) says nothing."""
    from accord.build import note_short_warmup

    cfg = config_from_dict(tiny_cfg(run={"steps": 20}, training={"warmup_steps": 100, "lr": 1e-3}))
    line = note_short_warmup(cfg, 20)
    assert line == ("training.warmup_steps=100 is longer than the run's 20 optimizer steps (run.steps x "
                    "algorithm.ppo_epochs x training.num_mini_batches): the learning rate ends at 20% of "
                    "training.lr=0.001; lower training.warmup_steps")
    assert note_short_warmup(config_from_dict(tiny_cfg(run={"steps": 1}, training={"warmup_steps": 2})), 1) is None
    assert note_short_warmup(config_from_dict(tiny_cfg(training={"warmup_steps": 0})), 1) is None


@pytest.mark.slow
def test_a_ctrl_c_during_the_last_step_says_the_run_is_complete(tiny_cfg):
    """The step in progress is finished and checkpointed; when it was the last, the line said to resume a run
    that had nothing left to do."""
    import os
    import signal

    from accord.callbacks import Callback
    from accord.stopping import TrainingInterrupted
    from accord.trainer import Trainer

    class CtrlC(Callback):
        def on_step_end(self, step, metrics):
            if step == 2:
                os.kill(os.getpid(), signal.SIGINT)

    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 2})), callbacks=[CtrlC()])
    with pytest.raises(TrainingInterrupted, match=r"after the last step, 2/2 .*: the run is complete") as stopped:
        trainer.train()
    assert stopped.value.step == 2 and (trainer.run_dir / "checkpoints" / "step_000002").is_dir()


@pytest.mark.slow
def test_a_resume_that_lays_the_run_out_otherwise_is_refused(tiny_cfg, tmp_path):
    """A resume whose overrides change the run's algorithm, specialization, policies or agents went on with a
    warning: MAGRPO's checkpoint trained on under AT-GRPO, a shared policy split into copies. Now it is one line
    naming the change, before any model loads (the command line says nothing of the change applying from here on);
    other changes (the learning rate) still apply from the resume on."""
    import subprocess
    import sys
    from pathlib import Path

    from accord.config import ConfigError, layout_change

    data = tiny_cfg(task={"name": "relay", "eval_size": 2}, algorithm={"name": "magrpo"},
                    run={"run_dir": str(tmp_path / "run"), "steps": 1, "checkpoint_every": 1})
    Trainer(config_from_dict(data)).train()
    run = tmp_path / "run"
    for key, value, was in (("algorithm", {**data["algorithm"], "name": "atgrpo"}, "'magrpo' to 'atgrpo'"),
                            ("specialization", "separate", "'shared' to 'separate'")):
        other = dict(data, run={**data["run"], "steps": 2}, **{key: value})
        name = "algorithm.name" if key == "algorithm" else key
        with pytest.raises(ConfigError, match=f"^--resume changes {name} from {was}, but the checkpoints of {run} "
                                              "hold a run laid out by the first; resume without that change"):
            Trainer(config_from_dict(other), resume=True)
    assert layout_change(run, config_from_dict(dict(data, training={**data.get("training", {}), "lr": 0.5}))) is None
    import accord   # a run with no step left is accord.RunComplete, catchable without reaching into accord.build
    with pytest.raises(accord.RunComplete, match=f"^{run} already reached run.steps=1 "):
        Trainer(config_from_dict(data), resume=True, stop_if_finished=True)
    cli = subprocess.run([sys.executable, "-m", "accord.cli", "train", "--resume", str(run), "run.steps=2",
                          "algorithm.name=atgrpo"], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert cli.returncode == 2 and "from here on" not in cli.stderr, cli.stderr[-2000:]
    assert cli.stderr.strip().splitlines()[-1].endswith("--resume changes algorithm.name from 'magrpo' to 'atgrpo', "
                                                        f"but the checkpoints of {run} hold a run laid out by the "
                                                        "first; resume without that change, or train a new run from "
                                                        f"this one's weights (accord export {run} --out DIR, then "
                                                        "policies.<name>.model=DIR/<name>)")


def test_a_run_into_a_new_folder_that_another_run_filled_meanwhile_changes_nothing(tiny_cfg, monkeypatch):
    """Two runs into one directory that did not exist yet: the first checked the folder before building (no lock:
    there was no folder) while the second ran to its end there; the first then went on, appended its steps to the
    other's metrics and replaced its checkpoints and config.yaml. It stops instead, the other's files untouched."""
    import accord.build
    from accord.config import ConfigError

    cfg = config_from_dict(tiny_cfg(run={"steps": 1}))
    real = accord.build.setup_process

    def meanwhile(*args):   # while this run is being built, another finishes in the same new directory
        monkeypatch.setattr(accord.build, "setup_process", real)
        Trainer(config_from_dict(tiny_cfg(run={"steps": 1}, training={"lr": 0.5}))).train()
        return real(*args)

    monkeypatch.setattr(accord.build, "setup_process", meanwhile)
    assert not cfg.run_dir.exists()
    with pytest.raises(ConfigError, match=r"was new when this run started, but another run wrote config.yaml, "
                                          r"metrics.jsonl, checkpoints.*--resume") as err:
        Trainer(cfg)
    assert "\n" not in str(err.value)
    assert "lr: 0.5" in (cfg.run_dir / "config.yaml").read_text()
    steps = [m["step"] for m in read_metrics(cfg.run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == 1   # the other run's steps, once each


def test_a_run_folder_replaced_as_a_checkpoint_is_written_gets_none_of_it(tiny_cfg, tmp_path, monkeypatch):
    """The run's folder moved away and a new one made in its place between the check before a checkpoint and its
    write: the checkpoint went into the new folder (checkpoints/step_N without config.yaml or metrics). What was
    written there is taken out again, and the run stops in one line."""
    import accord.trainer
    from accord.checkpoint import CheckpointError

    cfg = config_from_dict(tiny_cfg(run={"steps": 2, "checkpoint_every": 2}))
    trainer = Trainer(cfg)
    real = accord.trainer.write_checkpoint

    def replaced_first(run_dir, *args, **kwargs):
        run_dir.rename(tmp_path / "moved")
        run_dir.mkdir()
        return real(run_dir, *args, **kwargs)

    monkeypatch.setattr(accord.trainer, "write_checkpoint", replaced_first)
    with pytest.raises(CheckpointError, match="was removed or replaced while the run was going on"):
        trainer.train()
    assert list(cfg.run_dir.iterdir()) == []
    assert [m["step"] for m in read_metrics(tmp_path / "moved")] == [1]


def test_a_second_run_in_a_held_folder_says_how_to_go_on_from_python_too(tiny_cfg):
    """The same script run twice: the refusal names the command line's flags and the Python API's arguments."""
    import accord
    from accord.config import ConfigError

    cfg = config_from_dict(tiny_cfg(run={"steps": 1}))
    Trainer(cfg).train()
    with pytest.raises(ConfigError, match="already holds a run") as err:
        Trainer(cfg)
    assert "--resume" in str(err.value) and "accord.train(cfg, resume=True)" in str(err.value)
    assert "overwrite=True" in str(err.value)
    assert accord.train(cfg, overwrite=True) == cfg.run_dir
