"""Multi-turn MAGRPO trees, AT-GRPO and the baselines.

Rollout logic is checked with scripted completions (the rollouts take a ``complete`` callback, so the
texts can be chosen to make every reward known), then end to end with a real tiny model.
"""

import itertools
import random
import re
import time

import pytest
import torch

from accord.config import ConfigError, config_from_dict
from accord.envs.centralized import CentralizedEnv, parse_roles
from accord.envs.check import check_env
from accord.envs.synthetic.relay import RelayEnv, _share
from accord.config.rules import TreeTooLargeError, check_tree_size, tree_generations
from accord.rollout.episodes import sample_episodes
from accord.rollout.multiturn import atgrpo_rollout, magrpo_tree, play_episodes
from accord.rollout.sample import Completion
from accord.seeding import rollout_seed
from accord.trainer import Trainer

WORDS = ["eel tree", "oak zoo", "bee", "ox dog", "xyz", "see moon", "", "elope"]


class Scripted:
    """A ``complete`` callback that cycles through fixed texts and records every request."""

    def __init__(self, texts=WORDS):
        self.texts, self.calls, self.i = list(texts), [], 0

    def __call__(self, requests, n, greedy):
        self.calls.append((list(requests), n))
        out = []
        for _ in requests:
            row = []
            for _ in range(n):
                text = self.texts[self.i % len(self.texts)]
                self.i += 1
                row.append(Completion([1, 2], [3, 4], [-0.5, -0.5], "stop", text))
            out.append(row)
        return out


def rows(n, split="train"):
    return RelayEnv().tasks(split, limit=n)


POLICY = {"e": "main", "o": "main", "solo": "main", "central": "main"}


# --- AT-GRPO ------------------------------------------------------------------------------------

def test_atgrpo_groups_rewards_and_selection():
    complete = Scripted()
    alpha = 0.7
    samples, metrics, episodes = atgrpo_rollout(RelayEnv, rows(3), complete, agent_policy=POLICY, k=4, turns=2,
                                                alpha=alpha)
    assert len(samples) == 3 * 2 * 2 * 4          # B x T x N x K: every candidate is a sample
    groups = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    assert len(groups) == 3 * 2 * 2
    for members in groups.values():
        assert len(members) == 4
        # one task instance, one turn, one agent per group
        assert len({(m.instance, m.turn, m.agent) for m in members}) == 1
        # each candidate's reward is its own step's alpha * team + local (recomputed independently)
        for m in members:
            local = _share(m.completion_text, m.agent)
            assert m.reward == pytest.approx(alpha * local / 4 + local)
        texts = [m.completion_text for m in members]
        if len({_share(t, members[0].agent) for t in texts}) > 1:
            assert len({m.reward for m in members}) > 1   # different candidates, different rewards
    # the best candidate advanced the real state: its text is in the episode history
    for s_group in groups.values():
        best = max(s_group, key=lambda m: m.reward)
        first_best = next(m for m in s_group if m.reward == best.reward)
        ep = episodes[first_best.instance]
        assert ep.history[first_best.agent][first_best.turn][1] == first_best.completion_text


def test_atgrpo_state_advances_and_later_agents_see_earlier_ones():
    # e draws the first four texts (best: "eee eee"), o the next four (best: "oo")
    complete = Scripted(["eee eee", "zz", "q", "w", "zz", "oo", "q", "w"])
    samples, _, episodes = atgrpo_rollout(RelayEnv, rows(1), complete, agent_policy=POLICY, k=4, turns=2, alpha=1.0)
    (req_e0, _), (req_o0, _), (req_e1, _), (req_o1, _) = complete.calls
    e0_prompt = req_e0[0][1][-1]["content"]
    o0_prompt = req_o0[0][1][-1]["content"]
    e1_prompt = req_e1[0][1][-1]["content"]
    assert "eee eee" not in e0_prompt
    assert "e: eee eee" in o0_prompt                 # intra-turn visibility: o sees e's chosen action of this turn
    assert "turn 2/2" in e1_prompt and "o: oo" in e1_prompt   # the state shown advanced to turn 2 with o's choice
    # the agent's own history is in its chat: turn-1 observation and chosen action
    chat = req_e1[0][1]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[2]["content"] == "eee eee"
    assert episodes[0].done and episodes[0].team_return == pytest.approx(1.0)


def test_atgrpo_refuses_simultaneous_env():
    with pytest.raises(ValueError, match="turn-based"):
        atgrpo_rollout(lambda: RelayEnv(simultaneous=True), rows(1), Scripted(), agent_policy=POLICY, k=2, turns=1,
                       alpha=1.0)


# --- MAGRPO trees -------------------------------------------------------------------------------

def _reference_returns(make_env, row, texts_for, k, turns, gamma, mode):
    """Slow recursive reference: returns of every joint action at the root of one tree."""
    env0 = make_env()
    env0.reset(row, seed=0)

    def node_returns(env, t):
        agents = env.agents
        draws = {a: texts_for(a) for a in agents}
        joints = [(j,) * len(agents) for j in range(k)] if mode == "aligned" else \
            list(itertools.product(range(k), repeat=len(agents)))
        out = []
        for choice in joints:
            c = env.clone()
            res = c.step({a: draws[a][choice[i]] for i, a in enumerate(agents)})
            g = res.team_reward
            if not res.done and t + 1 < turns:
                child = node_returns(c, t + 1)
                g += gamma * sum(child) / len(child)
            out.append(g)
        return out

    return node_returns(env0, 0)


@pytest.mark.parametrize("mode", ["aligned", "cross"])
def test_magrpo_tree_returns_match_reference(mode):
    texts = ["eel oak", "bee", "zoo", "x"]
    k, turns, gamma = 2, 3, 0.5

    class Fixed(Scripted):
        def __call__(self, requests, n, greedy):
            self.calls.append((list(requests), n))
            return [[Completion([1], [2], [-0.1], "stop", texts[(s + (a == "o")) % len(texts)]) for s in range(n)]
                    for a, _ in requests]

    make = lambda: RelayEnv(max_turns=3, simultaneous=True)  # noqa: E731
    samples, metrics = magrpo_tree(make, rows(1), Fixed(), agent_policy=POLICY, k=k, turns=turns, mode=mode,
                                   gamma=gamma)
    ref = _reference_returns(make, rows(1)[0], lambda a: [texts[(s + (a == "o")) % len(texts)] for s in range(k)],
                             k, turns, gamma, mode)
    root = [s for s in samples if s.turn == 0]
    for i, a in enumerate(("e", "o")):
        mine = [s for s in root if s.agent == a]
        assert len(mine) == k
        joints = [(j, j) for j in range(k)] if mode == "aligned" else list(itertools.product(range(k), repeat=2))
        for s_idx, s in enumerate(mine):
            expect = [g for c, g in zip(joints, ref) if c[i] == s_idx]
            assert s.ret == pytest.approx(sum(expect) / len(expect))
    branching = k if mode == "aligned" else k ** 2
    assert len(samples) == tree_generations(1, 2, k, turns, mode) == 2 * k * sum(branching ** t for t in range(turns))
    assert len({s.group for s in samples}) == 2 * sum(branching ** t for t in range(turns))


def test_magrpo_turn_based_chains_and_histories():
    complete = Scripted()
    samples, _ = magrpo_tree(RelayEnv, rows(2), complete, agent_policy=POLICY, k=3, turns=2)
    # turn 0: e draws 3 per root in one request; o draws one per chain, from the state after e's j-th sample
    (req_e, n_e), (req_o, n_o) = complete.calls[:2]
    assert n_e == 3 and len(req_e) == 2 and n_o == 1 and len(req_o) == 6
    e_texts = [s.completion_text for s in samples if s.agent == "e" and s.turn == 0 and s.instance == 0]
    o_prompts = [m[-1]["content"] for _, m in req_o[:3]]
    for t, p in zip(e_texts, o_prompts):
        assert f"e: {t}" in p
    # turn 1 prompts carry each agent's own turn-0 exchange
    turn1 = [s for s in samples if s.turn == 1]
    assert len(turn1) == 2 * 3 * 2 * 3
    (req_e1, _) = complete.calls[2]
    assert [m["role"] for m in req_e1[0][1]] == ["system", "user", "assistant", "user"]


def test_magrpo_gamma_is_honoured_and_early_stop_is_optional():
    make = lambda: RelayEnv(max_turns=2, simultaneous=True)  # noqa: E731
    full0, _ = magrpo_tree(make, rows(1), Scripted(["eel", "oak"]), agent_policy=POLICY, k=2, turns=2, gamma=0.0)
    full1, _ = magrpo_tree(make, rows(1), Scripted(["eel", "oak"]), agent_policy=POLICY, k=2, turns=2, gamma=1.0)
    root0 = [s.ret for s in full0 if s.turn == 0]
    root1 = [s.ret for s in full1 if s.turn == 0]
    assert root0 != root1 and all(b > a for a, b in zip(root0, root1))
    assert len(full1) == 2 * 2 * 3
    # a threshold below every reward ends each branch after its first joint action
    stopped, _ = magrpo_tree(make, rows(1), Scripted(["eel", "oak"]), agent_policy=POLICY, k=2, turns=2,
                             early_stop_reward=-1.0)
    assert {s.turn for s in stopped} == {0}


def test_tree_cap_refuses_before_any_generation():
    assert check_tree_size(2, 2, 4, 2, "aligned", 2048) == 2 * 2 * 4 * 5
    with pytest.raises(TreeTooLargeError, match="rollout.max_turns=3") as err:
        check_tree_size(4, 2, 4, 5, "aligned", 2048)
    assert "algorithm.num_generations" in str(err.value)
    with pytest.raises(TreeTooLargeError, match="joint_mode=aligned"):
        check_tree_size(2, 3, 4, 2, "cross", 1000)


@pytest.mark.parametrize("k, mode", [(4, "aligned"), (1, "aligned"), (2, "cross")])
def test_a_tree_of_a_million_turns_is_refused_at_once(k, mode):
    """The tree's size is not summed past the cap (a million turns once hung the config check): refused in a
    moment, naming the most turns that fit, exactly as counted."""
    t = time.perf_counter()
    with pytest.raises(TreeTooLargeError, match=r"samples (more than 10\^12|\d+) completions") as err:
        check_tree_size(2, 2, k, 10 ** 6, mode, 2048)
    assert time.perf_counter() - t < 2
    fit = int(re.search(r"rollout.max_turns=(\d+)", str(err.value)).group(1))
    assert tree_generations(2, 2, k, fit, mode) <= 2048 < tree_generations(2, 2, k, fit + 1, mode)


def test_trainer_refuses_large_tree_before_loading_models(tiny_cfg):
    data = tiny_cfg(task={"name": "relay", "options": {"max_turns": 6}}, rollout={"batch_size": 8})
    with pytest.raises(TreeTooLargeError, match="max_tree_generations"):
        Trainer(config_from_dict(data))


# --- baselines ----------------------------------------------------------------------------------

def test_parse_roles_and_centralized_penalty():
    sections, failed = parse_roles("<e>eel bee</e>\n<O> oak </O>", ("e", "o"))
    assert sections == {"e": "eel bee", "o": "oak"} and failed == []
    sections, failed = parse_roles("<e>one</e><e>two</e>", ("e", "o"))
    assert failed == ["e", "o"]
    # many opening tags and no closing one: every role failed (read in one pass; the lazy regex parse_roles
    # used before rescanned to the end from every tag: 23 s for 20,000 tags on a 2-core AMD EPYC)
    assert parse_roles("<e>" * 20000, ("e", "o")) == ({"e": "", "o": ""}, ["e", "o"])
    env = CentralizedEnv(RelayEnv(), parse_penalty=1.0)
    env.reset(rows(1)[0])
    good = env.clone().step({"central": "<e>eel</e><o>oak</o>"})
    bad = env.clone().step({"central": "eel oak"})
    assert good.info["parse_failures"] == 0 and good.team_reward == pytest.approx(0.5)
    assert bad.info["parse_failures"] == 2 and bad.team_reward == pytest.approx(-2.0)
    check_env(lambda: CentralizedEnv(RelayEnv()), ["<e>eel</e><o>oak</o>"])


def test_parse_roles_sections_are_those_of_a_lazy_tag_regex():
    """Each section runs from an opening tag to the first closing tag after it, tags case-insensitive, as
    ``re.findall(r"<e>(.*?)</e>", text, re.DOTALL | re.IGNORECASE)`` reads them."""
    rng = random.Random(0)
    parts = ["<e>", "</e>", "<E>", "</E>", "x", "e", "<", ">", "/", "<o>", "</o>", "\n", "<e", "e>", "</e"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        expected = re.findall(r"<e>(.*?)</e>", text, flags=re.DOTALL | re.IGNORECASE)
        sections, failed = parse_roles(text, ("e",))
        ok = len(expected) == 1 and expected[0].strip()
        assert (failed == []) == bool(ok) and sections["e"] == (expected[0].strip() if ok else ""), text


def test_independent_learners_use_local_rewards():
    make = lambda: RelayEnv(max_turns=1, simultaneous=True)  # noqa: E731
    samples, _ = magrpo_tree(make, rows(1), Scripted(["eel", "oak"]), agent_policy=POLICY, k=2, turns=1,
                             reward_mode="local")
    for s in samples:
        assert s.ret == pytest.approx(_share(s.completion_text, s.agent))


def _cfg(tiny_cfg, **kw):
    base = dict(task={"name": "relay", "eval_size": 2}, run={"eval_after": True})
    base.update(kw)
    return config_from_dict(tiny_cfg(**base))


@pytest.mark.parametrize("algorithm", [
    {"name": "atgrpo"},
    {"name": "atgrpo", "baseline": "independent"},
    {"name": "atgrpo", "baseline": "centralized"},
    {"name": "magrpo"},
    {"name": "magrpo", "baseline": "single_agent"},
    {"name": "magrpo", "baseline": "centralized"},
    {"name": "magrpo", "norm_scope": "agent", "normalize_std": True},
])
def test_multiturn_training_runs_end_to_end(tiny_cfg, algorithm):
    trainer = Trainer(_cfg(tiny_cfg, algorithm=algorithm))
    metrics = trainer.train()
    assert metrics["perf/samples"] > 0
    assert "eval/success" in metrics and "team/return" in metrics
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_every_candidate_reaches_its_agents_policy(tiny_cfg):
    data = tiny_cfg(task={"name": "relay", "eval_size": 0}, specialization="separate",
                    algorithm={"name": "atgrpo"})
    data["policies"] = {"pe": data["policies"]["main"], "po": dict(data["policies"]["main"])}
    data["agents"] = [{"name": "e", "policy": "pe"}, {"name": "o", "policy": "po"}]
    trainer = Trainer(config_from_dict(data))
    seen = {}
    for name, pol in trainer.policies.items():
        original = pol.update

        def spy(samples, step, _name=name, _orig=original):
            seen[_name] = list(samples)
            return _orig(samples, step)

        pol.update = spy
    before = {n: [p.detach().clone() for p in pol.model.parameters()] for n, pol in trainer.policies.items()}
    trainer.train_step(0)
    b, t, k = 2, 2, 4
    assert len(seen["pe"]) == len(seen["po"]) == b * t * k
    assert {s.agent for s in seen["pe"]} == {"e"} and {s.agent for s in seen["po"]} == {"o"}
    for n, pol in trainer.policies.items():
        assert any(not torch.equal(a, p) for a, p in zip(before[n], pol.model.parameters()))


@pytest.mark.slow
def test_atgrpo_learns_relay(tiny_cfg):
    """Team reward on the relay environment rises under AT-GRPO with a tiny model."""
    data = tiny_cfg(task={"name": "relay", "eval_size": 0}, algorithm={"name": "atgrpo", "normalize_std": True},
                    rollout={"batch_size": 4, "max_new_tokens": 8},
                    training={"lr": 0.02, "micro_batch_size": 64, "weight_decay": 0.0}, run={"steps": 25})
    trainer = Trainer(config_from_dict(data))
    rewards = []
    for step in range(25):
        m, _ = trainer.train_step(step)
        rewards.append(m["team/reward"])
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.03, rewards


def test_config_errors_for_multiturn(tiny_cfg):
    with pytest.raises(ConfigError, match="single-turn"):
        Trainer(config_from_dict(tiny_cfg(algorithm={"name": "atgrpo"})))
    with pytest.raises(ConfigError, match="single_agent"):
        Trainer(config_from_dict(tiny_cfg(algorithm={"baseline": "single_agent"})))
    with pytest.raises(ConfigError, match="turn-based"):
        Trainer(config_from_dict(tiny_cfg(task={"name": "relay", "options": {"simultaneous": True}},
                                          algorithm={"name": "atgrpo"})))
    with pytest.raises(ConfigError, match="simultaneous"):
        Trainer(config_from_dict(tiny_cfg(task={"name": "relay"}, algorithm={"joint_mode": "cross"})))


def test_play_episodes_is_one_trajectory_per_task():
    complete = Scripted(["eel"])
    eps = play_episodes(RelayEnv, rows(3, "eval"), complete, turns=2)
    assert all(ep.done for ep in eps)
    assert all(n == 1 for _, n in complete.calls)
    assert [len(r) for r, _ in complete.calls] == [3, 3, 3, 3]


class SeededRelay(RelayEnv):
    """Relay whose start depends on the reset seed, as the protocol allows (shown in every observation)."""

    def reset(self, task, seed=0):
        self.start = seed
        return super().reset(task, seed)

    def _observe(self, agent):
        return f"start {self.start}. " + super()._observe(agent)


def test_the_k_episodes_of_an_instance_start_alike_and_steps_do_not_share_starts():
    k, n = 4, 3
    starts = []
    for step in range(2):
        complete = Scripted()
        samples, _ = sample_episodes(lambda: SeededRelay(max_turns=1), rows(n), complete,
                                     agent_policy=POLICY, k=k, turns=1, seed=rollout_seed(0, step, n))
        first = [s for s in samples if s.agent == "e"]
        by_instance = {}
        for s in first:
            by_instance.setdefault(s.instance, set()).add(s.prompt_text.split(".")[0])
        assert len(by_instance) == n and all(len(v) == 1 for v in by_instance.values())   # K copies, one start
        starts.append({v.pop() for v in by_instance.values()})
        assert len(starts[-1]) == n                                                         # instances apart
    assert not starts[0] & starts[1]                                                        # steps apart


@pytest.mark.parametrize("make", [lambda: RelayEnv(max_turns=1), lambda: RelayEnv(max_turns=1, simultaneous=True)],
                         ids=["turn-based", "simultaneous"])
def test_step_refuses_misuse_with_the_fix(make):
    """Every built-in env starts step() with the same checks; a non-str action is an error, never ''."""
    env = make()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step({a: "x" for a in env.agents})
    env.reset(env.tasks("train", 1)[0])
    acting = env.acting()
    with pytest.raises(ValueError, match="takes the actions of"):
        env.step({"nobody": "x"})
    with pytest.raises(TypeError, match="must be a str"):
        env.step({a: None for a in acting})
    while not env.step({a: "x" for a in env.acting()}).done:
        pass
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step({a: "x" for a in env.acting()})


@pytest.mark.parametrize("baseline", ["none", "centralized"])
def test_the_environment_is_resolved_once_per_run(tiny_cfg, monkeypatch, baseline):
    """A run looks the task up, imports the user's modules and checks the registries once; each episode (here 2
    training steps of 2 instances and an evaluation of 2; the K candidates of a turn play on clones) only calls
    the resolved factory."""
    import accord.build as build
    import accord.envs.registry as registry

    calls = {"lookups": 0, "imports": 0, "envs": 0}
    lookup, imports, call = registry.task_factory, build.import_modules, build.EnvFactory.__call__

    def counting(key, fn):
        def wrapped(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(registry, "task_factory", counting("lookups", lookup))
    monkeypatch.setattr(build, "import_modules", counting("imports", imports))
    monkeypatch.setattr(build.EnvFactory, "__call__", counting("envs", call))
    trainer = Trainer(_cfg(tiny_cfg, algorithm={"name": "atgrpo", "baseline": baseline}))
    trainer.train()
    assert calls["envs"] >= 1 + 2 * 2 + 2, calls   # the run's own, then one per episode
    # imports: once for the sinks of logging.report_to (build_run), once for the task (the factory)
    assert calls["lookups"] == 1 and calls["imports"] <= 2, calls
