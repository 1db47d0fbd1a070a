"""madpo and marlhf end to end on tiny real models: learning, rounds and exact resume with the pair buffer, the
reward model (from the team reward, from a person's file, from an earlier run), and bad input."""

import json
import logging

import pytest
import torch

from accord.config import ConfigError, config_from_dict
from accord.critics import sequence_logprobs, weighted_logprob_update
from accord.envs.registry import register_task
from accord.envs.synthetic.letters import LettersTask
from accord.rollout.sample import Sample
from accord.tracking import read_metrics
from accord.trainer import Trainer


def weights(trainer):
    return {f"{p}/{k}": v.detach().clone() for p, pol in trainer.policies.items()
            for k, v in pol.model.named_parameters()}


# The MADPO learning test: three seeds, and a bar on their mean rise (one seed's outcome changed with the CPU kind:
# seed 0 rose past 0.75 in 20 steps at lr 0.02 on a 2-core AVX2 EPYC, 0.44 -> 0.44 on an AVX512 Xeon). On that Xeon
# (2026-11-29) 50 steps at lr 0.01 raised seeds 0-7 by +0.11, +0.13, +0.17, +0.11, +0.04, +0.21, +0.13, +0.15
# (held-out 0.44-0.49 before; the curves of docs/algorithms-preference.md); with winner and loser swapped in
# accord.trainer_steps.build_pairs (a throwaway pytest plugin) the test fails (docs/algorithms-preference.md).
@pytest.mark.slow
def test_madpo_learns_letters(learn_seeds):
    runs = learn_seeds((0, 1, 2), run={"steps": 50}, algorithm={"name": "madpo", "num_generations": 4},
                       preference={"max_pairs_per_prompt": 4, "beta": 0.5}, training={"lr": 1e-2})
    assert runs.mean_rise() >= 0.06, f"held-out reward did not rise: {runs.reached}"
    # (pref/accuracy is not asserted: with rounds_every=1 it ranks fresh pairs the policy has not trained on)
    assert all(recs[-1]["pref/pairs"] > 0 and "pref/accuracy" in recs[-1] for recs in runs.metrics)


# marlhf: stage 2 climbs the reward model's score, and stage 1's reward model ranks its held-out pairs above
# chance. What this does NOT show is that the task gets better: on this tiny setup (one torch thread, 2026-11-24)
# the held-out task reward went 0.44 -> 0.57 at lr 1e-2 and 0.44 -> 0.18 at lr 2e-2 while rm/reward kept rising,
# and the reward model ordered only 102 of 191 fresh pairs of held-out instances as the task's reward does (94 of
# 189 with the preferences flipped): its 72 % held-out accuracy is over pairs of the training prompts. It is
# marlhf's learning test for stage 2: with every advantage's sign flipped (accord.trainer.group_advantages negated,
# a throwaway pytest plugin; 2026-11-29, an AVX512 Xeon) rm/reward fell from about 0 to -1.2 and it failed. With
# the preferences flipped it failed once (rm/reward rose by 0.08 < 0.5), which is no proof that it guards them.
# Whether stage 2 raises the task's own reward is measured in docs/algorithms-preference.md (on that Xeon not
# measurably: +0.03 over seeds 0-7), not asserted.
@pytest.mark.slow
def test_marlhf_climbs_its_reward_model(learn_seeds):
    runs = learn_seeds((0,), algorithm={"name": "marlhf", "num_generations": 4, "normalize_std": True},
                       reward_model={"prompts": 32, "epochs": 3, "lr": 1e-3}, training={"lr": 1e-2})
    recs = runs.metrics[0]   # both evaluations logged (learn_seeds checks)
    stage1 = next(r for r in recs if r["step"] == 1)
    assert stage1["rm/accuracy"] > 0.6, f"the reward model ranks held-out pairs at chance: {stage1['rm/accuracy']}"
    rm = [r["rm/reward"] for r in recs if "rm/reward" in r]
    assert sum(rm[-5:]) / 5 > sum(rm[:5]) / 5 + 0.5, f"the policies did not climb the reward model: {rm}"
    assert all("team/reward" in r for r in recs if "rm/reward" in r)   # both rewards logged


def test_madpo_rounds_resume_exactly_mid_round(tiny_cfg, tmp_path):
    """rounds_every=2 with a checkpoint after step 1: the resumed run trains step 2 on the saved round's pairs."""
    common = dict(algorithm={"name": "madpo", "num_generations": 3},
                  preference={"rounds_every": 2, "pair_selection": "random", "max_pairs_per_prompt": 2},
                  training={"lr": 1e-3, "micro_batch_size": 5, "num_mini_batches": 2})
    full = Trainer(config_from_dict(tiny_cfg(run={"steps": 3, "run_dir": str(tmp_path / "a")}, **common)))
    full.train()
    cfg_b = tiny_cfg(run={"steps": 3, "run_dir": str(tmp_path / "b"), "checkpoint_every": 1}, **common)
    Trainer(config_from_dict(cfg_b)).train(stop_after=1)
    resumed = Trainer(config_from_dict(cfg_b), resume=True)
    assert resumed.start_step == 1 and resumed.run.parts["pairs"].round_step == 0 and resumed.run.parts["pairs"].pairs
    resumed.train()
    a, b = weights(full), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["pref/round_step"] for r in ra] == [0, 0, 2]
    for key in ("pref/loss", "pref/accuracy", "pref/margin"):
        assert [r[key] for r in ra] == [r[key] for r in rb], key


def test_the_margins_forward_is_kept_for_the_update_only_where_it_is_the_updates_own(tiny_cfg):
    """sequence_logprobs(keep=True) over one micro-batch keeps its graph and weighted_logprob_update runs only the
    backward: the same sums, the same weights after the step as the two-pass route, bit for bit. Two micro-batches,
    other samples, or a model with dropout (LoRA's) run the update's own forward."""
    def policy_and_samples(**sections):
        trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1}, algorithm={"name": "madpo", "num_generations": 3},
                                                    **sections)))
        pol = next(iter(trainer.policies.values()))
        prompts = [pol.encode_chat([{"role": "user", "content": f"count to {n}"}]) for n in range(4)]
        gens = pol.generate(prompts, greedy=False, temperature=1.0)
        samples = [Sample(agent="e", policy=pol.name, turn=0, group=i, instance=i, prompt_ids=p,
                          completion_ids=list(g.ids), logprobs=list(g.logprobs), finish_reason=g.finish_reason)
                   for i, (p, g) in enumerate(zip(prompts, gens))]
        return pol, samples

    weights_of = [0.5, -1.0, 0.25, 2.0]
    after = {}
    for keep in (False, True):
        pol, samples = policy_and_samples(training={"lr": 1e-2, "micro_batch_size": 8})
        sums = sequence_logprobs(pol, samples, keep=keep)
        assert (pol._kept_logprobs is not None) == keep
        weighted_logprob_update(pol, samples, weights_of, step=0)
        assert pol._kept_logprobs is None
        after[keep] = ({k: v.detach().clone() for k, v in pol.model.named_parameters()}, sums)
    assert after[True][1] == after[False][1]
    assert all(torch.equal(after[True][0][k], after[False][0][k]) for k in after[False][0])
    pol, samples = policy_and_samples(training={"lr": 1e-2, "micro_batch_size": 2})
    sequence_logprobs(pol, samples, keep=True)
    assert pol._kept_logprobs is None                       # two micro-batches: nothing kept
    pol, samples = policy_and_samples(training={"lr": 1e-2, "micro_batch_size": 8})
    sequence_logprobs(pol, samples[:3], keep=True)
    before = {k: v.detach().clone() for k, v in pol.model.named_parameters()}
    weighted_logprob_update(pol, samples, weights_of, step=0)   # other samples: its own forward over all four
    assert pol._kept_logprobs is None and any(not torch.equal(before[k], v) for k, v in pol.model.named_parameters())
    pol, samples = policy_and_samples(specialization="lora", lora={"r": 4, "alpha": 8, "dropout": 0.1},
                                      training={"lr": 1e-2, "micro_batch_size": 8})
    sequence_logprobs(pol, samples, keep=True)
    assert pol._kept_logprobs is None                       # dropout in training mode: margins in eval mode


def test_madpo_with_lora_uses_the_base_as_reference(tiny_cfg):
    trainer = Trainer(config_from_dict(tiny_cfg(
        run={"steps": 1}, specialization="lora", algorithm={"name": "madpo", "num_generations": 3},
        policies={"pe": {"model": "tiny-qwen2"}, "po": {"model": "tiny-qwen2"}},
        agents=[{"name": "e", "policy": "pe"}, {"name": "o", "policy": "po"}], training={"lr": 1e-2})))
    assert all(p.ref_model is None for p in trainer.policies.values())   # no second model: adapters off
    buf = trainer.run.parts["pairs"]
    trainer.train()
    assert buf.pairs and any(v != 0.0 for v in buf.ref)
    rec = read_metrics(trainer.run_dir)[-1]
    assert rec["pref/skipped"] == 0 and rec["loss/pe/grad_norm"] > 0 and rec["loss/po/grad_norm"] > 0


class _Flat(LettersTask):
    def reward(self, *, completions, **kwargs):
        return [0.5] * len(completions["e"])


@register_task("flat-letters-test", "test only: every joint action scores 0.5")
def _make_flat():
    return _Flat()


def test_a_batch_with_no_usable_pair_is_logged_and_skipped(tiny_cfg, caplog):
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1}, task={"name": "flat-letters-test", "eval_size": 0},
                                                algorithm={"name": "madpo", "num_generations": 3})))
    before = weights(trainer)
    with caplog.at_level(logging.WARNING, logger="accord.trainer_steps"):
        trainer.train()
    assert "no preference pair" in caplog.text
    rec = read_metrics(trainer.run_dir)[-1]
    assert rec["pref/skipped"] == 1 and rec["pref/pairs"] == 0
    assert all(torch.isfinite(torch.tensor(float(v))) for v in rec.values())
    after = weights(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)


def _write(path, lines):
    path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return str(path)


GOOD = {"prompts": {"e": "Task 1: write words with the letter e.", "o": "Task 1: write words with the letter o."},
        "chosen": {"e": "eel tree see", "o": "good moon solo"}, "rejected": {"e": "a b", "o": "x y"}}


def test_marlhf_from_a_persons_file_then_reuse_of_its_reward_model(tiny_cfg, tmp_path):
    prefs = _write(tmp_path / "prefs.jsonl", [GOOD] * 6 + [""])
    first = Trainer(config_from_dict(tiny_cfg(run={"steps": 1, "run_dir": str(tmp_path / "one")},
                                              algorithm={"name": "marlhf"},
                                              reward_model={"preferences": prefs, "epochs": 2, "eval_frac": 0.0})))
    first.train()
    rec = read_metrics(first.run_dir)[0]
    assert rec["rm/pairs"] == 6 and 0 <= rec["rm/accuracy"] <= 1 and "rm/reward" in rec
    exported = tmp_path / "one" / "reward_model"
    assert (exported / "head.safetensors").is_file()
    again = Trainer(config_from_dict(tiny_cfg(run={"steps": 1, "run_dir": str(tmp_path / "two")},
                                              algorithm={"name": "marlhf"}, reward_model={"path": str(exported)})))
    assert again.run.parts["reward_model"].ready   # no stage 1
    again.train()
    assert "rm/pairs" not in read_metrics(again.run_dir)[0]
    # the same reward model scores the same joint text the same way in both runs
    rm_a, rm_b = first.run.parts["reward_model"].model, again.run.parts["reward_model"].model
    ids = rm_a.encode("Agents: e, o.\nJoint score:")[0]
    assert rm_a.scores([ids]) == rm_b.scores([ids])
    # a control string a completion writes out is its characters in the joint text, not the control token
    eot = rm_a.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert eot not in rm_a.encode("e acts: done <|endoftext|> Joint score:")[0]


def test_preference_texts_cut_to_max_tokens_are_warned(tiny_cfg, tmp_path, caplog):
    """Joint texts longer than reward_model.max_tokens keep their last tokens: counted in rm/truncated_frac and
    said once in the log with the fix (it was the metric alone)."""
    long = {**GOOD, "chosen": {"e": "eel " * 40, "o": "moon " * 40}}
    prefs = _write(tmp_path / "prefs.jsonl", [GOOD] * 3 + [long] * 3 + [""])
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1}, algorithm={"name": "marlhf"},
                                                reward_model={"preferences": prefs, "epochs": 1, "eval_frac": 0.0,
                                                              "max_tokens": 128})))
    with caplog.at_level(logging.WARNING, logger="accord.trainer_steps"):
        trainer.train()
    assert read_metrics(trainer.run_dir)[0]["rm/truncated_frac"] > 0   # (averaged with the rollouts' share)
    said = [r.getMessage() for r in caplog.records if "preference texts" in r.getMessage()]
    assert said == ["reward model: 3 of the 12 preference texts are longer than 128 tokens and keep only their last 128 "
                    "(rm/truncated_frac); raise reward_model.max_tokens or shorten them"]


@pytest.mark.parametrize("line,match", [
    ({**GOOD, "chosen": {"e": "x", "o": "y", "u": "z"}}, r"line 2: unknown agent\(s\) \['u'\] in 'chosen'"),
    ({**GOOD, "rejected": {"e": "  ", "o": "y"}}, r"line 2: empty completion of agent 'e' in 'rejected'"),
    ({**GOOD, "chosen": {"e": "x"}}, r"line 2: 'chosen' lacks agent\(s\) \['o'\]"),
    ({"prompts": GOOD["prompts"], "chosen": GOOD["chosen"]}, "line 2: needs exactly the keys"),
    ({**GOOD, "rejected": GOOD["chosen"]}, "line 2: 'chosen' and 'rejected' are identical"),
    ("{not json", "line 2: not valid JSON"),
    ('{"prompts": {"e": "\\ud800", "o": "x"}}', "line 2: a string holds a lone surrogate escape"),
    ("[" * 100000 + "]" * 100000, "line 2: not valid JSON here \\(nested too deeply to parse\\)"),
])
def test_bad_preference_files_are_one_line_errors_naming_the_line(tiny_cfg, tmp_path, line, match):
    prefs = _write(tmp_path / "prefs.jsonl", [GOOD, line])
    with pytest.raises(ConfigError, match=match) as err:
        Trainer(config_from_dict(tiny_cfg(algorithm={"name": "marlhf"}, reward_model={"preferences": prefs})))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists() or not (tmp_path / "run" / "checkpoints").exists()


def test_a_preference_file_that_is_not_utf8_or_not_a_file_is_one_line(tiny_cfg, tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_bytes(_write(tmp_path / "good.jsonl", [GOOD]) and (tmp_path / "good.jsonl").read_bytes()
                      + b'{"prompts": {"e": "caf\xe9"}}\n')
    for path, match in [(prefs, "prefs.jsonl line 2 is not UTF-8 text"), (tmp_path, "is a directory, not a file")]:
        with pytest.raises(ConfigError, match=match) as err:
            Trainer(config_from_dict(tiny_cfg(algorithm={"name": "marlhf"}, reward_model={"preferences": str(path)})))
        assert "\n" not in str(err.value)


def test_a_reward_model_path_that_does_not_load_is_one_line(tiny_cfg, tmp_path):
    (tmp_path / "notamodel").mkdir()
    with pytest.raises(ConfigError, match="reward_model.path=.* does not load") as err:
        Trainer(config_from_dict(tiny_cfg(algorithm={"name": "marlhf"},
                                          reward_model={"path": str(tmp_path / "notamodel")})))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("n_pairs", [5, 1])
def test_rm_accuracy_is_never_the_training_pairs_accuracy(tiny_cfg, tmp_path, caplog, n_pairs):
    """eval_frac 0.1 of 5 pairs rounds to none: one pair is held out for rm/accuracy (it was the training pairs'
    accuracy under the held-out name); a single pair leaves none to hold out: no rm/accuracy, and a warning says
    why."""
    pairs = [{**GOOD, "chosen": {"e": f"eel tree see {i}", "o": f"good moon solo {i}"}} for i in range(n_pairs)]
    prefs = _write(tmp_path / "prefs.jsonl", pairs)
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1}, algorithm={"name": "marlhf"},
                                                reward_model={"preferences": prefs, "epochs": 1})))
    with caplog.at_level(logging.WARNING, logger="accord.trainer_steps"):
        trainer.train()
    rec = read_metrics(trainer.run_dir)[0]
    said = [r.getMessage() for r in caplog.records if "held out" in r.getMessage()]
    if n_pairs == 5:
        assert rec["rm/accuracy_pairs"] == 1 and 0 <= rec["rm/accuracy"] <= 1 and not said
    else:
        assert "rm/accuracy" not in rec and "rm/accuracy_pairs" not in rec and "rm/train_accuracy" in rec
        assert len(said) == 1 and "rm/accuracy (held-out accuracy) is not logged" in said[0]


def _exported_reward_model(directory, *, head=None, backbone_nan=False):
    """A reward model directory as a marlhf run exports it (the backbone of tiny_cfg's policy, a head), its head
    file replaced by ``head`` bytes or its head / backbone weights made nan on request."""
    from safetensors.torch import save_file

    from accord.config import TrainingConfig
    from accord.critics import ScalarModel

    model = ScalarModel("reward model", "tiny-qwen2", {"hidden_size": 64, "num_layers": 2}, 1e-3,
                        TrainingConfig(bf16=False), 1, seed=0, device="cpu")
    if backbone_nan:
        with torch.no_grad():
            model.model.get_input_embeddings().weight.fill_(float("nan"))
    model.export(directory)
    if head == "nan":
        save_file({k: torch.full_like(v, float("nan")) for k, v in model.head.state_dict().items()},
                  str(directory / "head.safetensors"))
    elif head is not None:
        (directory / "head.safetensors").write_bytes(head)
    return str(directory)


@pytest.mark.parametrize("head,match", [
    (b"\x00" * 100, r"head.safetensors cannot be read \(.*: truncated or not safetensors\); copy the reward model "
                     "directory again"),
    ("nan", r"head.safetensors: the reward model's head holds nan or infinite weights \(.*\), so every score it "
            "gives would be nan"),
], ids=["unreadable", "nan"])
def test_a_damaged_reward_model_head_is_a_one_line_error_naming_the_file(tiny_cfg, tmp_path, head, match):
    """A damaged head.safetensors was a safetensors traceback; a nan head stopped the run blaming the task's
    reward."""
    path = _exported_reward_model(tmp_path / "rm", head=head)
    with pytest.raises(ConfigError, match=f"reward_model.path=.* does not load .*{match}") as err:
        Trainer(config_from_dict(tiny_cfg(algorithm={"name": "marlhf"}, reward_model={"path": path})))
    assert "\n" not in str(err.value) and str(tmp_path / "rm" / "head.safetensors") in str(err.value)


def test_a_reward_model_that_scores_nan_is_named_not_the_tasks_reward(tiny_cfg, tmp_path):
    from accord.policies.protocol import TrainingError

    path = _exported_reward_model(tmp_path / "rm", backbone_nan=True)
    trainer = Trainer(config_from_dict(tiny_cfg(run={"steps": 1}, algorithm={"name": "marlhf"},
                                                reward_model={"path": path})))
    with pytest.raises(TrainingError) as err:
        trainer.train()
    assert str(err.value).startswith(f"reward_model.path={path!r} scored 8 of the 8 joint actions nan")
    assert "task's reward" not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides,match", [
    ({"algorithm": {"name": "madpo", "num_generations": 1}}, "madpo pairs candidates"),
    ({"algorithm": {"name": "madpo", "kl_coef": 0.1}}, "does not apply to madpo"),
    ({"algorithm": {"name": "madpo"}, "preference": {"pair_selection": "all"}}, "max_pairs_per_prompt=null"),
    ({"algorithm": {"name": "marlhf", "num_generations": 1}}, "reward_model.rl=magrpo needs K >= 2"),
    ({"algorithm": {"name": "marlhf", "joint_mode": "cross"}}, "joint_mode=cross does not apply"),
    ({"preference": {"beta": 0}}, "preference.beta=0"),
])
def test_config_errors(tiny_cfg, overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        config_from_dict(tiny_cfg(**overrides))
    assert "\n" not in str(err.value)


def test_marlhf_on_a_multi_turn_environment_names_what_works(tiny_cfg):
    with pytest.raises(ConfigError, match="marlhf needs a single-turn task.*use madpo, iac or maac"):
        Trainer(config_from_dict(tiny_cfg(algorithm={"name": "marlhf"}, task={"name": "relay", "eval_size": 0})))


@pytest.mark.parametrize("stage", ["magrpo", "iac"])
def test_marlhf_passes_a_strict_audit(tiny_cfg, tmp_path, stage):
    """The audit checks each sample's reward against the task's score of its text, before the reward model's score
    replaces it (checked after, every sample carried another reward than its text scored: a false violation)."""
    prefs = _write(tmp_path / "prefs.jsonl", [GOOD] * 4)
    trainer = Trainer(config_from_dict(tiny_cfg(
        run={"steps": 2, "run_dir": str(tmp_path / "run")}, algorithm={"name": "marlhf"},
        training={"audit": "strict"}, reward_model={"preferences": prefs, "epochs": 1, "eval_frac": 0.0, "rl": stage})))
    trainer.train()
    recs = read_metrics(trainer.run_dir)
    assert [r["audit/violations"] for r in recs if "audit/violations" in r] == [0.0, 0.0]
    assert all("rm/reward" in r for r in recs if "audit/violations" in r)
