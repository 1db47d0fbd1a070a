"""A learner's saved state (optimizer.pt) of another structure, loaded unverified (``--allow-unverified``, no manifest
to catch it): a ValueError naming the mismatch, which the checkpoint's loaders turn into one line. A list, a string
or an int where a dict or a tensor belongs was a TypeError traceback; a moment of another shape was accepted and
failed or broadcast at the next step."""

from __future__ import annotations

import copy

import pytest
import torch

from accord.checkpoint import CheckpointError, load_policy
from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
from accord.devices import restore_generator
from accord.policies.learner import load_optimizer_state, load_scheduler_state, lr_lambda, read_saved_state
from accord.policies.model import ModelPolicy

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}


def _learner():
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(0, 10, "cosine"))
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return optimizer, scheduler


def _moments(state, key="exp_avg", value=None):
    state = copy.deepcopy(state)
    state["state"][0][key] = value
    return state


@pytest.mark.parametrize("change, problem", [
    (lambda s: [1], r"not an optimizer's \(no parameter groups or moments\)"),
    (lambda s: {**s, "param_groups": "abc"}, r"not an optimizer's"),
    (lambda s: {**s, "state": [1]}, r"not an optimizer's"),
    (lambda s: {**s, "param_groups": s["param_groups"] * 2}, r"holds 4 tensors in 2 group\(s\), this one 2 in 1"),
    (lambda s: {**s, "param_groups": [{**s["param_groups"][0], "params": [1, 0]}]}, r"numbers its tensors \[1, 0\]"),
    (lambda s: {**s, "param_groups": [{**s["param_groups"][0], "lr": "fast"}]}, r"optimizer's lr is 'fast', not a "
                                                                                 r"float"),
    (lambda s: {**s, "param_groups": [{**s["param_groups"][0], "betas": (0.9,)}]}, r"optimizer's betas"),
    (lambda s: _moments(s, value=torch.zeros(3)), r"exp_avg of tensor 0 has shape \[3\], its parameter \[2, 3\]"),
    (lambda s: _moments(s, value=[0.0]), r"exp_avg of tensor 0 is a list, not a tensor"),
    (lambda s: {**s, "state": {0: [1]}}, r"moments of tensor 0 are a list, not a dict"),
])
def test_an_optimizer_state_of_another_structure_is_named(change, problem):
    optimizer, _ = _learner()
    saved = optimizer.state_dict()
    with pytest.raises(ValueError, match=problem):
        load_optimizer_state(optimizer, change(copy.deepcopy(saved)), "policy 'p'")
    fresh, _ = _learner()
    load_optimizer_state(fresh, copy.deepcopy(saved), "policy 'p'")   # its own kind loads, moments and all
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], saved["state"][0]["exp_avg"])


@pytest.mark.parametrize("saved, problem", [
    ([1], "not this schedule's state"),
    ({"last_epoch": "x"}, r"step is 'x', not a count of steps"),
    ({"last_epoch": 3, "step": 1}, "not this schedule's state"),
    ({"last_epoch": 3, "base_lrs": [0.1, 0.2]}, r"base LRs are '\[0.1, 0.2\]', not one number per parameter group"),
])
def test_a_schedule_state_of_another_structure_is_named(saved, problem):
    _, scheduler = _learner()
    with pytest.raises(ValueError, match=problem):
        load_scheduler_state(scheduler, saved, "policy 'p'")
    _, other = _learner()
    other.step()
    load_scheduler_state(scheduler, other.state_dict(), "policy 'p'")
    assert scheduler.last_epoch == 2


@pytest.mark.parametrize("state, device, problem", [
    (5, "cpu", "random stream is a int, not a generator's state"),
    (torch.zeros(3), "cpu", "random stream is a Tensor"),
    (torch.Generator().get_state(), 7, "random stream's device is '7'"),
])
def test_a_random_stream_of_another_kind_is_named(state, device, problem):
    with pytest.raises(ValueError, match=problem):
        restore_generator(torch.Generator(), state, device, "policy 'p'")


def test_a_file_that_is_not_a_dict_of_the_keys_is_named(tmp_path):
    torch.save([1, 2], tmp_path / "optimizer.pt")
    with pytest.raises(ValueError, match=r"optimizer.pt holds a list, not the dict of names accord saves"):
        read_saved_state(tmp_path / "optimizer.pt", ("optimizer",))
    torch.save({"optimizer": {}}, tmp_path / "optimizer.pt")
    with pytest.raises(ValueError, match=r"optimizer.pt holds no scheduler, generator"):
        read_saved_state(tmp_path / "optimizer.pt", ("optimizer", "scheduler", "generator"))


def test_a_policys_foreign_optimizer_file_is_one_line_and_its_own_loads(tmp_path):
    """Through the loader every command uses (resume, eval, export, cross-play): a CheckpointError with the fix."""
    pol = ModelPolicy("main", PolicyConfig(**TINY), TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(),
                      total_optimizer_steps=1, seed=3)
    (tmp_path / "policies").mkdir()
    pol.save(tmp_path / "policies" / "main")
    path = tmp_path / "policies" / "main" / "optimizer.pt"
    good = torch.load(path, weights_only=True)
    for bad, problem in (([1, 2], "holds a list"), ({**good, "generator": 5}, "random stream is a int"),
                         ({**good, "scheduler": [1]}, "LR schedule is not")):
        torch.save(bad, path)
        with pytest.raises(CheckpointError, match=rf"policy 'main' cannot be loaded \(ValueError: .*{problem}.*\); "
                                                  "fix it"):
            load_policy(pol, tmp_path, "main", "fix it")
    torch.save(good, path)
    load_policy(pol, tmp_path, "main", "fix it")
