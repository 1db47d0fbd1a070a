"""accord.metric_names: the names it builds are the names runs have always logged (metrics.jsonl, the docs and the
report of an older run depend on them), and its patterns read them back as the report and the console did."""

import ast
from pathlib import Path

import pytest

from accord import metric_names as mn

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("built,name", [
    (mn.TEAM_REWARD, "team/reward"),
    (mn.TEAM_REWARD_BEST, "team/reward_best"),
    (mn.TEAM_RETURN, "team/return"),
    (mn.TEAM_SUCCESS, "team/success"),
    (mn.EPISODE_TURNS, "episode/turns"),
    (mn.turn_key(3), "turn/3/reward"),
    (mn.component_key("l1"), "reward/l1"),
    (mn.agent_key("alice", mn.AGENT_REWARD), "agent/alice/reward"),
    (mn.agent_key("alice", mn.AGENT_COMPLETION_LEN), "agent/alice/completion_len"),
    (mn.agent_key("alice", mn.AGENT_STOP_FRAC), "agent/alice/stop_frac"),
    (mn.agent_key("alice", mn.AGENT_TEAM_REWARD), "agent/alice/team_reward"),
    (mn.agent_key("alice", mn.AGENT_LOCAL_REWARD), "agent/alice/local_reward"),
    (mn.EVAL_TEAM_REWARD, "eval/team/reward"),
    (mn.EVAL_SUCCESS, "eval/success"),
    (mn.EVAL_TURNS, "eval/turns"),
    (mn.eval_key(mn.component_key("l1")), "eval/reward/l1"),
    (mn.played_eval_key("team"), "eval/team/reward"),
    (mn.played_eval_key("success"), "eval/success"),
    (mn.played_eval_key("turns"), "eval/turns"),
    (mn.played_eval_key("agent/alice/local_return"), "eval/agent/alice/return"),
    (mn.played_eval_key("agent/alice/completion_len"), "eval/agent/alice/completion_len"),
    (mn.mode_key("greedy", "team"), "greedy/team"),
    (mn.pass_at_key(4), "pass@4"),
    (mn.ADV_ABS_MEAN, "adv/abs_mean"),
    (mn.ADV_ZERO_STD_FRAC, "adv/zero_std_frac"),
    (mn.ROLLOUT_FLAT_GROUPS_DROPPED, "rollout/flat_groups_dropped"),
    (mn.ROLLOUT_EXTRA_ROUNDS, "rollout/extra_rounds"),
    (mn.ROLLOUT_INFORMATIVE_GROUPS, "rollout/informative_groups"),
    (mn.ROLLOUT_OVERLONG_PENALTY, "rollout/overlong_penalty"),
    (mn.ROLLOUT_TRUNCATED_MASKED, "rollout/truncated_masked"),
    (mn.SCHEDULE_ACTIVE_AGENT, "schedule/active_agent"),
    (mn.loss_key("main", mn.PG), "loss/main/pg"),
    (mn.loss_key("main", mn.KL), "loss/main/kl"),
    (mn.update_key("main", mn.ENTROPY), "loss/main/entropy"),
    (mn.update_key("main", mn.mem_key("main", mn.CUDA_PEAK_MB)), "mem/main/cuda_peak_mb"),
    (mn.critic_key("main", mn.VALUE_LOSS), "critic/main/value_loss"),
    (mn.critic_key("main", mn.EXPLAINED_VARIANCE), "critic/main/explained_variance"),
    (mn.PREF_ACCURACY, "pref/accuracy"),
    (mn.PREF_ROUND_STEP, "pref/round_step"),
    (mn.RM_REWARD, "rm/reward"),
    (mn.RM_TRUNCATED_FRAC, "rm/truncated_frac"),
    (mn.credit_key("alice", mn.CREDIT_FREE_RIDER), "credit/alice/free_rider"),
    (mn.CREDIT_SKIPPED_GROUPS, "credit/skipped_groups"),
    (mn.AUDIT_VIOLATIONS, "audit/violations"),
    (mn.time_key("gen"), "time/gen"),
    (mn.TIME_STEP, "time/step"),
    (mn.TIME_CHECKPOINT, "time/checkpoint"),
    (mn.TIME_EVAL_S, "time/eval_s"),
    (mn.PERF_GEN_TOKENS_PER_S, "perf/gen_tokens_per_s"),
    (mn.PERF_GEN_TOKENS, "perf/gen_tokens"),
    (mn.MEM_PEAK_RSS_MB, "mem/peak_rss_mb"),
    (mn.MEM_CUDA_PEAK_MB, "mem/cuda_peak_mb"),
    (mn.sft_key(mn.EVAL_TEAM_REWARD), "sft/eval/team/reward"),
    (mn.sft_policy_key("main", mn.EVAL_NLL), "sft/main/eval_nll"),
])
def test_names_are_the_logged_ones(built, name):
    assert built == name


def test_patterns_read_the_names_back():
    reward = mn.agent_pattern(mn.AGENT_REWARD)
    assert reward.match("agent/alice/reward").group(1) == "alice"
    assert not reward.match("agent/alice/reward_best") and not reward.match("eval/agent/alice/reward")
    held_out = mn.agent_pattern(held_out=True)
    match = held_out.match("eval/agent/bob/completion_len")
    assert (match["agent"], match["metric"]) == ("bob", "completion_len")
    assert mn.COMPONENT_PATTERN.match("eval/reward/l1").group(2) == "l1"
    assert mn.COMPONENT_PATTERN.match("reward/l1").group(1) is None
    loss = mn.loss_pattern([mn.PG, mn.KL])
    assert loss.match("loss/main/kl").groups() == ("main", "kl") and not loss.match("loss/main/lr")
    assert mn.TIME_PATTERN.match("time/update").group(1) == "update"
    assert [bool(mn.LEARNED_PATTERN.match(k)) for k in ("critic/a/value_loss", "pref/loss", "rm/reward", "team/reward")] \
        == [True, True, True, False]


def test_the_module_imports_nothing_of_accord():
    tree = ast.parse((REPO / "accord" / "metric_names.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("accord")], imported
