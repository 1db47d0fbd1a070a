"""Group advantages (fixes of issue 14, item 5): RLOO on singleton groups, the group std's ddof, and grouping by
identical prompt (also through multi-turn runs). The KL penalty's fixes: test_kl.py."""

import math

import pytest
import torch

from accord.algorithms.advantages import group_advantages
from accord.config import ConfigError, config_from_dict
from accord.rollout.sample import Sample, prompt_group_ids
from accord.trainer import Trainer


def test_rloo_singleton_group_has_zero_advantage():
    returns = torch.tensor([3.0, 1.0, 2.0, 6.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1, 2])          # groups 1 and 2 hold one sample each
    adv = group_advantages(returns, groups, "rloo")
    assert adv[3] == 0 and adv[4] == 0
    # the rest is the leave-one-out baseline of group 0
    assert torch.allclose(adv[:3], torch.tensor([3 - 1.5, 1 - 2.5, 2 - 2.0]))


def test_group_std_sample_vs_population():
    returns = torch.tensor([1.0, 2.0, 4.0, 7.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    pop = group_advantages(returns, groups, "mean", True)
    samp = group_advantages(returns, groups, "mean", True, std_ddof=1)
    r = returns[:4].double()
    assert torch.allclose(pop[:4], ((r - r.mean()) / (r.std(correction=0) + 1e-6)).float())
    assert torch.allclose(samp[:4], ((r - r.mean()) / (r.std(correction=1) + 1e-6)).float())
    assert torch.allclose(pop[:4] / samp[:4], torch.tensor((4 / 3) ** 0.5), atol=1e-5)
    assert (pop[4:] == 0).all() and (samp[4:] == 0).all()   # constant group and singleton: 0, not NaN
    with pytest.raises(ValueError, match="std_ddof"):
        group_advantages(returns, groups, "mean", True, std_ddof=2)


def test_group_std_config(tiny_cfg):
    assert config_from_dict(tiny_cfg()).algorithm.group_std == "population"   # the default is unchanged
    with pytest.raises(ConfigError, match="only matters with algorithm.normalize_std=true"):
        config_from_dict(tiny_cfg(algorithm={"group_std": "sample"}))
    with pytest.raises(ConfigError, match="group_std='ddof1' is not valid"):
        config_from_dict(tiny_cfg(algorithm={"group_std": "ddof1", "normalize_std": True}))


def test_prompt_group_ids():
    def s(agent, prompt):
        return Sample(agent=agent, policy="p", turn=0, group=0, instance=0, prompt_ids=prompt, completion_ids=[1],
                      logprobs=[0.0], finish_reason="stop")
    batch = [s("e", [1, 2]), s("o", [1, 2]), s("e", [1, 2]), s("e", [1, 3]), s("o", [1, 2])]
    assert prompt_group_ids(batch) == [0, 1, 0, 2, 1]


def _relay_tree_groups(tiny_cfg, norm_scope, advantage="mean", steps=1):
    data = tiny_cfg(run={"steps": steps}, task={"name": "relay", "eval_size": 0},
                    algorithm={"name": "magrpo", "norm_scope": norm_scope, "advantage": advantage})
    data["run"]["run_dir"] += f"-{norm_scope}-{advantage}"  # one run directory per run
    trainer = Trainer(config_from_dict(data))
    seen = {}
    original = trainer.policies["main"].update

    def spy(samples, step):
        seen[step] = list(samples)
        return original(samples, step)

    trainer.policies["main"].update = spy
    trainer.train()
    return seen


@pytest.mark.slow
def test_turn_based_magrpo_groups_by_node_or_by_prompt(tiny_cfg):
    """Relay is turn-based: at a node, agent o's K samples are drawn from K different states (after each of
    e's samples). norm_scope=group pools them in one group; norm_scope=prompt gives each its own group."""
    by_node = _relay_tree_groups(tiny_cfg, "group")[0]
    by_prompt = _relay_tree_groups(tiny_cfg, "prompt")[0]
    assert [s.completion_ids for s in by_node] == [s.completion_ids for s in by_prompt]   # same rollout
    node_groups = {}
    for s in by_node:
        node_groups.setdefault(s.group, []).append(s)
    o_groups = [g for g in node_groups.values() if g[0].agent == "o"]
    assert o_groups and all(len({tuple(s.prompt_ids) for s in g}) > 1 for g in o_groups)  # mixed prompts
    e_groups = [g for g in node_groups.values() if g[0].agent == "e"]
    assert all(len({tuple(s.prompt_ids) for s in g}) == 1 for g in e_groups)            # one state each
    # by prompt: e's groups are unchanged; o's samples with distinct prompts have advantage 0 (singletons)
    for s_node, s_prompt in zip(by_node, by_prompt):
        if s_node.agent == "e":
            assert s_prompt.advantage == pytest.approx(s_node.advantage)
    counts = {}
    for s in by_prompt:
        counts[(s.agent, tuple(s.prompt_ids))] = counts.get((s.agent, tuple(s.prompt_ids)), 0) + 1
    singles = [s for s in by_prompt if counts[(s.agent, tuple(s.prompt_ids))] == 1]
    assert singles and all(s.advantage == 0 for s in singles)
    assert any(s.advantage != 0 for s in by_node if s.agent == "o")


@pytest.mark.slow
def test_rloo_through_a_multiturn_run_with_singleton_groups(tiny_cfg):
    """advantage=rloo used to raise on the one-sample groups a turn-based tree produces; now they get 0."""
    seen = _relay_tree_groups(tiny_cfg, "prompt", advantage="rloo", steps=2)
    assert set(seen) == {0, 1}
    for samples in seen.values():
        assert all(math.isfinite(s.advantage) for s in samples)
        assert any(s.advantage != 0 for s in samples)
