"""Counterfactual credit (``algorithm.credit: counterfactual``): the Shapley game on small synthetic rewards
whose credits are known, then through the real single-turn rollout and the multi-turn tree with tiny models."""

import itertools
import math
import random

import pytest

from accord.algorithms.credit import (CreditError, agent_orderings, counterfactual_credit, plan_choices)
from accord.config import ConfigError, config_from_dict
from accord.envs.registry import register_task
from accord.envs.synthetic.letters import LettersTask, _share
from accord.envs.synthetic.relay import RelayEnv
from accord.rollout.multiturn import magrpo_tree
from accord.rollout.sample import Completion
from accord.trainer import Trainer


def run_credit(agents, actions, reward, *, orderings=8, seed=0):
    """Credits of one group whose K joint actions are ``actions[j]`` (one value per agent), scored by
    ``reward(tuple of values)``."""
    k = len(actions)
    recorded = [[reward(tuple(actions[j]))] for j in range(k)]

    def evaluate(requests):
        return [reward(tuple(actions[c[i]][i] for i in range(len(agents)))) for _, c in requests]

    return counterfactual_credit(agents, k, [[r[0] for r in recorded]], ["group 0"], evaluate,
                                 orderings=orderings, rng=random.Random(seed))


def test_only_e_matters_gives_o_exactly_zero_credit():
    # rewards with awkward floats: averaging copies of 0.1 does not give 0.1 back, differences first do
    actions = [(0.1, 7), (0.7, 3), (0.3, 3), (0.1, 9)]
    step = run_credit(("e", "o"), actions, lambda a: a[0] * 1.1)
    for j, credit in enumerate(step.credits[0]):
        assert credit[1] == 0.0                                   # exactly
        others = [actions[s][0] * 1.1 for s in range(4) if s != j]
        assert credit[0] == pytest.approx(actions[j][0] * 1.1 - sum(others) / 3)
    assert step.metrics["credit/o/variance_share"] == [0.0]
    assert step.metrics["credit/e/variance_share"] == [pytest.approx(1.0)]
    assert step.metrics["credit/o/free_rider"] == [1.0] and step.metrics["credit/e/free_rider"] == [0.0]
    assert step.metrics["credit/interaction_share"] == [pytest.approx(0.0, abs=1e-12)]


def test_null_player_is_exactly_zero_with_sampled_orderings():
    # N = 4 > 3 sampled orderings: Shapley by sampled orderings, the null agent still exactly 0
    rng = random.Random(3)
    actions = [tuple(rng.random() for _ in range(4)) for _ in range(5)]
    step = run_credit(("a", "b", "c", "d"), actions, lambda x: x[0] * x[1] + math.sin(x[3]), orderings=3)
    assert all(c[2] == 0.0 for c in step.credits[0])
    assert len(agent_orderings(4, 3, random.Random(0))) == 3


def test_xor_reward_is_all_interaction():
    # each agent's bit sampled evenly: no main effect, the whole variance is the interaction
    actions = [(0, 0), (0, 1), (1, 0), (1, 1)]
    step = run_credit(("e", "o"), actions, lambda a: float(a[0] ^ a[1]))
    assert step.metrics["credit/interaction_share"] == [1.0]
    assert step.metrics["credit/e/variance_share"] == [pytest.approx(0.5)]   # Shapley splits it evenly


def test_credits_sum_to_the_leave_one_out_advantage():
    rng = random.Random(1)
    actions = [tuple(rng.random() for _ in range(3)) for _ in range(4)]

    def reward(x):
        return x[0] + 2 * x[1] * x[2] - x[0] * x[2]

    for orderings in (1, 2, 6):
        step = run_credit(("a", "b", "c"), actions, reward, orderings=orderings)
        r = [reward(a) for a in actions]
        for j, credit in enumerate(step.credits[0]):
            assert sum(credit) == pytest.approx(r[j] - (sum(r) - r[j]) / 3)


def test_exact_shapley_for_three_agents_matches_the_definition():
    """All 3! orderings: the credit equals the textbook Shapley value of v_j(S) computed by brute force."""
    rng = random.Random(2)
    actions = [tuple(rng.random() for _ in range(3)) for _ in range(3)]

    def reward(x):
        return x[0] * x[1] + x[2] ** 2 - x[1] * x[2]

    step = run_credit(("a", "b", "c"), actions, reward, orderings=6)
    k, n = 3, 3

    def v(j, keep):
        return sum(reward(tuple(actions[j][i] if i in keep else actions[s][i] for i in range(n)))
                   for s in range(k) if s != j) / (k - 1)

    for j in range(k):
        for i in range(n):
            others = [x for x in range(n) if x != i]
            phi = 0.0
            for size in range(n):
                for sub in itertools.combinations(others, size):
                    w = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
                    phi += w * (v(j, set(sub) | {i}) - v(j, set(sub)))
            assert step.credits[0][j][i] == pytest.approx(phi)


def test_plan_reuses_complements():
    plan = plan_choices(2, 4, [(0, 1), (1, 0)])
    assert len(plan) == 16 and len(set(plan)) == 16      # the K x K grid: K unchanged + K(K-1) swaps


def test_a_reward_that_is_not_deterministic_is_one_line():
    noise = iter(range(10_000))
    with pytest.raises(CreditError, match=r"re-scoring the unchanged joint action 0 of group 0") as info:
        run_credit(("e", "o"), [(1, 1), (2, 2)], lambda a: a[0] + next(noise))
    assert "\n" not in str(info.value) and "algorithm.credit=team" in str(info.value)


@pytest.mark.parametrize("over,text", [
    ({"algorithm": {"name": "atgrpo", "credit": "counterfactual"}}, "AT-GRPO's groups already compare"),
    ({"algorithm": {"credit": "counterfactual", "joint_mode": "cross"}}, "works on aligned joint actions"),
    ({"algorithm": {"credit": "counterfactual", "baseline": "independent"}}, "has no team reward to split"),
    ({"algorithm": {"credit": "shapley"}}, "algorithm.credit='shapley' is not valid"),
    ({"algorithm": {"credit_orderings": 0}}, "algorithm.credit_orderings=0 must be >= 1"),
])
def test_bad_credit_config(tiny_cfg, over, text):
    with pytest.raises(ConfigError, match=text):
        config_from_dict(tiny_cfg(**over))


# --- through the real rollouts --------------------------------------------------------------------

class _OnlyE(LettersTask):
    """letters, but the team reward is agent e's share alone: o's action never matters."""

    def reward(self, *, prompts=None, completions, agents, **kwargs):
        return [_share(t, "e") for t in completions["e"]]


class _Noisy(LettersTask):
    calls = 0

    def reward(self, *, prompts=None, completions, agents, **kwargs):
        _Noisy.calls += 1
        return [r + 1e-3 * _Noisy.calls for r in super().reward(completions=completions, agents=agents)]


register_task("credit-only-e-test", "test only")(lambda: _OnlyE())
register_task("credit-noisy-test", "test only")(lambda: _Noisy())


def test_single_turn_rollout_gives_the_idle_agent_zero_credit(tiny_cfg):
    cfg = config_from_dict(tiny_cfg(task={"name": "credit-only-e-test", "eval_size": 0},
                                    algorithm={"credit": "counterfactual", "num_generations": 4},
                                    rollout={"batch_size": 2, "max_new_tokens": 12}))
    trainer = Trainer(cfg)
    try:
        metrics, table = trainer.train_step(0)
    finally:
        trainer.close()
    o_rows = [r for r in table if r["agent"] == "o"]
    e_rows = [r for r in table if r["agent"] == "e"]
    assert len(o_rows) == 8 and all(r["return"] == 0.0 and r["advantage"] == 0.0 for r in o_rows)
    # e's credit is its joint action's team reward over its siblings' (leave-one-out)
    for r in e_rows:
        siblings = [x["return"] for x in e_rows if x["instance"] == r["instance"]]
        assert sum(siblings) == pytest.approx(0.0, abs=1e-9)
    assert metrics["credit/evaluations"] == 2 * 16
    assert "time/credit" in metrics


def test_a_nondeterministic_reward_stops_the_run_in_one_line(tiny_cfg):
    cfg = config_from_dict(tiny_cfg(task={"name": "credit-noisy-test", "eval_size": 0},
                                    algorithm={"credit": "counterfactual"}))
    trainer = Trainer(cfg)
    try:
        with pytest.raises(CreditError, match=r"joint action 0 of instance 'train-\d+'") as info:
            trainer.train_step(0)
    finally:
        trainer.close()
    assert "\n" not in str(info.value)


class Scripted:
    def __init__(self, texts):
        self.texts, self.i = list(texts), 0

    def __call__(self, requests, n, greedy):
        out = []
        for _ in requests:
            row = []
            for _ in range(n):
                row.append(Completion([1], [2], [-0.1], "stop", self.texts[self.i % len(self.texts)]))
                self.i += 1
            out.append(row)
        return out


@pytest.mark.parametrize("simultaneous", [False, True])
def test_tree_credit_replays_turns_on_clones(simultaneous):
    """relay's team reward is additive over the agents' shares: each agent's credit at a node is its own
    share over its siblings' (the turn replayed on a clone), and the interaction share is 0."""
    texts = ["eel tree", "oak zoo", "bee", "ox dog", "see", "moon", "eon", "zz"]
    make = lambda: RelayEnv(max_turns=1, simultaneous=simultaneous)  # noqa: E731
    rows = make().tasks("train", limit=2)
    samples, metrics = magrpo_tree(make, rows, Scripted(texts), agent_policy={"e": "m", "o": "m"}, k=4, turns=1,
                                   credit_orderings=8, credit_rng=random.Random(0))
    assert metrics["credit/interaction_share"] == [pytest.approx(0.0, abs=1e-12)]
    assert metrics["credit/skipped_groups"] == [0.0]
    for s in samples:
        group = [x for x in samples if x.group == s.group]
        own = _share_of(s)
        rest = [_share_of(x) for x in group if x is not s]
        assert s.ret == pytest.approx((own - sum(rest) / 3) / 2)      # team increment = share / (N * turns)


def _share_of(sample):
    from accord.envs.synthetic.relay import _share as relay_share

    return relay_share(sample.completion_text, sample.agent)
