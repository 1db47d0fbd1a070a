"""Learning regression tests: on every training path, seeded tiny random models must reach a stated held-out team
reward on the cooperation task ``handoff``; independent learners must not.

The task (docs/tasks-cooperation.md): the first agent writes the first letter of a path around the cycle ``a o``,
the second continues from where the first stopped; the team reward counts the second's letter only when it
continues what the first actually wrote (``start: fixed``: the path starts at the cycle's first letter, so the
first's half is learnable from its own step, which AT-GRPO's per-turn credit needs). One-token completions keep
a step cheap; evaluation is sampled (temperature 1) over 128 held-out instances, so the bars are expected
rewards, not the argmax of a collapsed policy. Before training every path is near 0 (at most 0.2); the maximum
is 1.

Each path runs several seeds and its bar is on their mean. One seed's outcome is a property of the CPU's
arithmetic as much as of the method (a run either finds the convention or collapses to a wrong one, and which
it does changed between an AVX2 EPYC and an AVX512 Xeon for the same seed), so a pinned seed is a coin that a
new CPU kind re-tosses. The learning rate (0.01, the single-turn form 0.005) and step counts are where most
seeds of each path learn on the probe runs in docs/tasks-cooperation.md, so the mean over the seeds clears the
bar unless most of them fail.

The MAGRPO paths' runs stop once their training team reward is saturated (:func:`saturated`): their step counts
are where nearly every probe seed has learned, and most seeds learn well before.

Each run uses one torch thread: the model is tiny, and on a 2-core machine shared with other jobs two threads
spin against each other (a step measured 15x slower with two than with one at load 12).

The mutation check of issue 24 (each test must fail when the advantage's sign is flipped, the team reward
replaced by a constant, or group ids shuffled) is run by hand with a throwaway script; its results are in
docs/tasks-cooperation.md.
"""

import copy
import json

import pytest

pytestmark = pytest.mark.slow  # each under 20 s in the suite (2-core Xeon): docs/tasks-cooperation.md

from accord import metric_names as mn
from accord.config import config_from_dict
from accord.sft import run_sft
from accord.tracking.jsonl import completions_path
from accord.trainer import Trainer

EVAL = 128
SATURATED = 0.98   # the training team reward (of 1.0) at which a MAGRPO run stops early: see saturated


def learn(tiny_cfg, steps: int, seed: int = 0, lr: float = 0.01, options: dict | None = None, stop: bool = False,
          **sections) -> tuple[dict, dict]:
    """Held-out metrics before and after ``steps`` training steps of a seeded tiny run on ``handoff`` (with
    ``stop``, fewer once :func:`saturated`)."""
    data = tiny_cfg(
        run={"steps": steps, "seed": seed, "threads": 1, "eval_before": False, "eval_after": True, "eval_every": 0,
             "checkpoint_every": 0},
        task={"name": "handoff", "options": {"letters": "ao", "start": "fixed", **(options or {})}, "eval_size": EVAL},
        algorithm={"num_generations": 4, "normalize_std": True},
        rollout={"batch_size": 16, "max_new_tokens": 1, "temperature": 1.0, "eval_temperature": 1.0},
        training={"lr": lr, "micro_batch_size": 128, "weight_decay": 0.0},
        logging={"console": False, "tensorboard": False, "completions_every": 1},
    )
    for key, value in sections.items():
        if isinstance(value, dict) and key != "policies":
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    data["run"]["run_dir"] += f"-seed{seed}"   # a test's seeds run one after another: each its own directory
    return train_checked(data, saturated() if stop else None)


def saturated(threshold: float = SATURATED, window: int = 5):
    """``Trainer.train``'s ``stop_when``: True once the training team reward (each step's mean over its joint
    samples) has been at least ``threshold`` on each of the last ``window`` steps. For MAGRPO's runs that reward is
    each sampled episode's, drawn at temperature 1 from the prompts the sampled held-out evaluation shows, so it
    estimates the held-out reward: on the probe seeds every run stopped this way scored 0.98-1.00 held out
    (docs/tasks-cooperation.md), and the steps it skips are nearly converged ones (most groups flat, their
    advantages 0). A run that never gets there runs all its steps. Not for AT-GRPO: its team reward is each candidate's own turn's
    increment (0.5 of 1.0 per role here), and its episodes advance by the best of K candidates."""
    recent: list[float] = []

    def stop(step: int, metrics: dict[str, float]) -> bool:
        recent.append(metrics[mn.TEAM_REWARD])
        return len(recent) >= window and min(recent[-window:]) >= threshold

    return stop


def train_checked(data: dict, stop_when=None) -> tuple[dict, dict]:
    """Held-out metrics before and after training the run ``data`` describes (``stop_when`` as
    ``Trainer.train``'s), with its groups checked."""
    trainer = Trainer(config_from_dict(data))
    try:
        before = trainer.evaluate()
        after = trainer.train(stop_when=stop_when)
    finally:
        trainer.close()
    # the first step's completions table (logging.completions_every=1 writes every step's): its returns still vary
    rows = [json.loads(line) for line in completions_path(trainer.run_dir, 1).read_text().splitlines()]
    assert_centred_within_groups(rows)
    return before, after


def assert_centred_within_groups(table: list[dict]) -> None:
    """Every advantage is relative to its own rollout group: they sum to 0 within each group. The learning bars
    alone cannot catch shuffled group ids here: every handoff instance shows the same prompt, so any grouping of
    an agent's samples estimates the same baseline (docs/tasks-cooperation.md, the mutation check). The first
    step is checked: once a run has converged every group is flat and every advantage 0."""
    sums: dict[int, float] = {}
    for row in table:
        sums[row["group"]] = sums.get(row["group"], 0.0) + row["advantage"]
    assert len(sums) > 1 and all(abs(v) < 1e-4 for v in sums.values()), sums


def two_policies(data_policy: dict) -> dict:
    return {"first": dict(data_policy), "second": dict(data_policy)}


TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
PER_ROLE = {"policies": two_policies(TINY),
            "agents": [{"name": "first", "policy": "first"}, {"name": "second", "policy": "second"}]}

SEEDS = (0, 1, 2)

# path id -> (steps, learning rate, seeds, the bar on the seeds' mean held-out team reward, the run's config sections).
# Steps: where the probe runs' held-out curves (docs/tasks-cooperation.md, 16-32 seeds per path, every 10 or 20
# steps) show nearly all seeds have learned; the MAGRPO paths' seeds learn late more often, and a bar of 0.5 on
# their mean passes with one of three still at a wrong convention, and with two whose returns add up to 0.5
PATHS = {
    # the simultaneous form: the second cannot read the first, so the pair must find a convention; with a fixed
    # start the first's letter is prescribed and the search is slower, so this path starts free (any first letter).
    # Some seeds settle on a wrong convention (0.3-0.5) or find the right one late, hence the lower learning rate
    "magrpo_single_turn": (160, 0.005, SEEDS, 0.5,
                           {"options": {"single_turn": True, "start": "free", "letters": "aoi"}}),
    "magrpo_tree": (80, 0.01, SEEDS, 0.5, {"algorithm": {"name": "magrpo"}}),
    # policies.main.trainable_layers: the top block, the final norm and an untied output head train (a random model's
    # frozen tied head would cap every logit near 0.2: see atgrpo_lora); the bottom block and the embeddings do not
    "magrpo_tree_top_layer": (80, 0.01, SEEDS, 0.5, {"algorithm": {"name": "magrpo"},
                                                    "policies": {"main": {**TINY, "trainable_layers": 1,
                                                                          "model_kwargs": {**TINY["model_kwargs"],
                                                                                           "tie_word_embeddings": False}}}}),
    "atgrpo_shared": (50, 0.01, SEEDS, 0.6, {"algorithm": {"name": "atgrpo"}}),
    # adapters on the output head too: a random base's frozen head and final norm cap every logit near 0.2, so
    # adapters of the decoder's projections alone leave the output uniform (entropy stayed at log 2048)
    "atgrpo_lora": (40, 0.01, SEEDS, 0.6, {"algorithm": {"name": "atgrpo"}, "specialization": "lora",
                                           "lora": {"r": 8, "alpha": 16,
                                                    "target_modules": ["q_proj", "v_proj", "lm_head"]},
                                           **PER_ROLE}),
    "atgrpo_separate": (40, 0.01, SEEDS, 0.6, {"algorithm": {"name": "atgrpo"}, "specialization": "separate",
                                               **PER_ROLE}),
    # one agent writes both letters in two tokens; it learns the first ("a", 0.5 of the team reward) but within 80
    # steps not the second, whose credit it shares with the first token of the same completion
    "single_agent": (80, 0.01, SEEDS, 0.45, {"options": {"single_agent": True},
                                             "algorithm": {"baseline": "single_agent"},
                                             "agents": [{"name": "solo", "policy": "main"}],
                                             "rollout": {"max_new_tokens": 2}}),
}

# the paths whose runs stop once their training team reward is saturated (MAGRPO's: see saturated); the others'
# steps are few enough, and the single agent's training team reward stays near 0.5
STOP_EARLY = ("magrpo_single_turn", "magrpo_tree", "magrpo_tree_top_layer")


@pytest.mark.parametrize("path", list(PATHS))
def test_path_learns_the_handoff(tiny_cfg, restore_threads, path):
    steps, lr, seeds, bar, sections = PATHS[path]
    runs = {seed: learn(tiny_cfg, steps, seed=seed, lr=lr, stop=path in STOP_EARLY, **copy.deepcopy(sections))
            for seed in seeds}
    reached = {seed: (round(b["eval/team/reward"], 3), round(a["eval/team/reward"], 3)) for seed, (b, a) in runs.items()}
    assert all(before < 0.4 for before, _ in reached.values()), reached
    assert sum(after for _, after in reached.values()) / len(seeds) >= bar, reached


def test_independent_learners_do_not_learn_the_partner_dependent_part(tiny_cfg, restore_threads):
    """Local rewards only (format: a clean letter, whichever): each agent learns to write one clean letter (its
    local-reward bar), but nothing rewards the second for continuing the first, so the held-out team reward
    stays far below the team methods' bar (AT-GRPO shared's steps, learning rate and seeds)."""
    locals_, team = {}, {}
    for seed in SEEDS:
        before, after = learn(tiny_cfg, PATHS["atgrpo_shared"][0], seed=seed,
                              algorithm={"name": "atgrpo", "baseline": "independent"})
        locals_[seed] = {k: round(after[k], 3) for k in after if k.endswith("/return") and k.startswith("eval/")}
        team[seed] = round(after["eval/team/reward"], 3)
    # of 0.1: a clean letter each
    assert all(len(v) == 2 and min(v.values()) >= 0.08 for v in locals_.values()), locals_
    assert sum(team.values()) / len(team) < 0.55, team


def test_centralized_learns_the_handoff_from_a_wrong_warm_start(tiny_cfg, restore_threads, tmp_path):
    """The centralized baseline (one model writes ``<first>..</first><second>..</second>``): a random model
    never writes that format, so the run starts from a warm start of 150 SFT steps (8 demonstrations each, lr
    5e-3) on oracle demonstrations of which 75 % are wrong on purpose (``sft.noise``: one letter of each role
    replaced). Its greedy answer is the wrong pair, its samples right some of the time (held-out team reward -0.87
    to +0.12 on the probe runs' seeds); 30 AT-GRPO steps at lr 1e-3 must make the right pair the likely one. Every
    seed of the probe runs reached the bar (docs/tasks-cooperation.md, with the mutation check), so one seed is
    enough here."""
    data = tiny_cfg(
        run={"steps": 30, "seed": 0, "threads": 1, "eval_before": False, "eval_after": True, "eval_every": 0,
             "checkpoint_every": 0},
        task={"name": "handoff", "options": {"letters": "ao", "start": "fixed"}, "eval_size": EVAL},
        algorithm={"name": "atgrpo", "baseline": "centralized", "num_generations": 4, "normalize_std": True},
        rollout={"batch_size": 16, "max_new_tokens": 32, "temperature": 1.0, "eval_temperature": 1.0},
        training={"lr": 0.01, "micro_batch_size": 64, "weight_decay": 0.0},
        sft={"instances": 200, "steps": 150, "batch_size": 8, "noise": 0.75, "lr": 0.005, "eval_size": 32,
             "output_dir": str(tmp_path / "warm")},
    )
    warm = run_sft(config_from_dict(data))
    assert warm["after"]["sft/eval/success"] == 0.0, warm["after"]   # the greedy warm start answers wrongly
    data["policies"] = {"main": {"model": str(tmp_path / "warm" / "main")}}
    data["training"]["lr"] = 0.001
    before, after = train_checked(data)
    assert before["eval/team/reward"] < 0.2, before   # far below the bar
    assert after["eval/team/reward"] >= 0.6, (before["eval/team/reward"], after["eval/team/reward"])
