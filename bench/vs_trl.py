#!/usr/bin/env python
"""Throughput of single-agent GRPO: accord vs TRL's GRPOTrainer, same workload.

    python bench/vs_trl.py                         # defaults: hidden 64, 2 layers, vocab 2048, K 4, B 8, T 32, 10 steps
    python bench/vs_trl.py --steps 8 --json /tmp/bench.json
    python bench/vs_trl.py --loss cispo            # a loss variant against TRL's matching loss_type (see LOSSES)

Both frameworks train the same tiny random Qwen2 model (built by accord, saved once with
``save_pretrained`` and loaded from that directory by both) on one single-agent task defined by this
script (not part of the library): the prompt asks for words with the letter "e" and the reward is the
share of the completion's words that contain "e" (accord's ``letters`` reward for its agent ``e``).
Prompts are identical chat messages on both sides, turned into the same token ids by the model's
chat template (checked). K completions per prompt, B prompts per step, temperature 1 / top-p 1 /
no top-k, at most ``--max-new-tokens`` tokens, group-normalised advantages, the clipped token-level
loss normalised by the step's token count (accord ``token_mean`` = TRL ``loss_type="dapo"``), no KL
(no reference model), AdamW at lr 1e-4, grad-norm clipping at 1.0, one optimizer step per step.
``--loss`` picks another loss variant on both sides (:data:`LOSSES`: accord's ``algorithm`` keys and TRL's
``GRPOConfig`` fields that compute the same loss), everything else unchanged.

The metric is completions trained per second: completions that were generated, rewarded and used in a
gradient update, divided by the wall time of the measured steps (generation + reward + advantage +
update + the trainer's own per-step work: everything). One warm-up step is run and excluded. Each
framework runs ``--rounds`` times (fresh processes, alternating order) and its fastest round is
reported, with the median-round, median-step and per-CPU-second ratios alongside. Both sides run with
OMP_WAIT_POLICY=PASSIVE by default, which keeps timings stable on a machine shared with other jobs.
See bench/README.md ("vs TRL") for what exactly is compared and why it is fair.

TRL (``trl==1.16.0``) runs in its own virtual environment, created here on first use under
``$ACCORD_BENCH_DIR`` (default ``<repo>/.bench``): torch 2.13.0 is installed first (the CPU wheel),
then trl with a constraints file pinning torch, transformers and tokenizers to the versions of the
interpreter running this script, so both sides run the same Hugging Face model and generate code.
Each side runs as its own subprocess (same thread count, same offline environment), so peak RSS is
per framework. The last line of stdout is the results as JSON (also written to ``--json PATH``).
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

TRL_VERSION = "1.16.0"  # newest on PyPI when written; needs transformers>=4.56.2, so it runs on ours (5.x)
RESULT_TAG = "@@VS_TRL_RESULT@@ "
TASK_NAME = "bench-letter-e"   # registered inside the accord worker only
LETTER = "e"

# accord's loss variant -> (its algorithm keys, TRL GRPOConfig fields of the same loss). TRL's "grpo" is the mean
# over sequences of token means; GSPO is TRL's sequence-level importance sampling with that aggregation; Dr. GRPO
# divides by the length cap and drops the std scaling of advantages; CISPO caps its weight at TRL epsilon_high,
# which accord writes as 1 + epsilon_high (4.0 here = TRL's recommended 5.0).
LOSSES = {
    "dapo": ({"loss": "dapo"}, {"loss_type": "dapo"}),
    "grpo": ({"loss": "grpo", "loss_agg": "seq_mean_token_mean"}, {"loss_type": "grpo"}),
    "dr_grpo": ({"loss": "dr_grpo", "normalize_std": False}, {"loss_type": "dr_grpo", "scale_rewards": "none"}),
    "gspo": ({"loss": "gspo"}, {"loss_type": "grpo", "importance_sampling_level": "sequence"}),
    "cispo": ({"loss": "cispo", "epsilon_high": 4.0}, {"loss_type": "cispo", "epsilon_high": 5.0}),
}


# ------------------------------------------------------------------------------------------------
# the TRL driver (runs inside the trl venv; plain GRPOTrainer API, timing by a callback and wrappers)
# ------------------------------------------------------------------------------------------------

TRL_DRIVER = r'''
import json, os, random, resource, sys, time

spec = json.load(open(sys.argv[1]))
import numpy as np
import torch

torch.set_num_threads(spec["threads"])
random.seed(spec["seed"]); np.random.seed(spec["seed"]); torch.manual_seed(spec["seed"])

import accelerate, datasets, transformers, trl
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

B, K, W, S = spec["batch"], spec["k"], spec["warmup"], spec["steps"]
letter = spec["letter"]

# Exactly the prompts accord trains on, in the same order, as conversational rows: TRL applies the
# tokenizer's chat template itself (add_generation_prompt=True), as accord does.
instances = spec["instances"]
assert len(instances) == B * (W + S), (len(instances), B, W, S)
train = Dataset.from_list([{"prompt": inst["messages"]} for inst in instances])

def share(text):
    words = text.split()
    return sum(letter in w.lower() for w in words) / len(words) if words else 0.0

def letter_reward(completions, **kwargs):
    # conversational rows: each completion is [{"role": "assistant", "content": text}]
    return [share(c[0]["content"] if isinstance(c, list) else c) for c in completions]

args = GRPOConfig(
    output_dir=spec["output_dir"],
    use_cpu=True,
    seed=spec["seed"],
    max_steps=W + S,
    # one optimizer step per generation batch of B prompts x K completions, all in one micro-batch
    per_device_train_batch_size=B * K,
    gradient_accumulation_steps=1,
    num_generations=K,
    num_iterations=1,
    shuffle_dataset=False,        # keep accord's prompt order (RepeatSampler then yields rows in order)
    max_completion_length=spec["max_new_tokens"],
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=None,
    repetition_penalty=1.0,
    use_vllm=False,
    use_transformers_continuous_batching=False,
    beta=0.0,                     # no KL term, no reference model
    epsilon=0.2,
    # default "dapo": token sum / tokens of the whole generation batch = accord token_mean; --loss: see LOSSES
    loss_type=spec["trl_loss"].get("loss_type", "dapo"),
    importance_sampling_level=spec["trl_loss"].get("importance_sampling_level", "token"),
    epsilon_high=spec["trl_loss"].get("epsilon_high"),
    scale_rewards=spec["trl_loss"].get("scale_rewards", "group"),   # divide by the group std, like normalize_std
    mask_truncated_completions=False,
    learning_rate=spec["lr"],
    lr_scheduler_type="constant",
    warmup_steps=0,
    weight_decay=0.0,
    adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
    max_grad_norm=spec["max_grad_norm"] if spec["max_grad_norm"] is not None else 0.0,
    bf16=False, fp16=False,       # fp32 like accord (GRPOConfig defaults bf16 to True)
    gradient_checkpointing=False, # GRPOConfig defaults it to True
    model_init_kwargs={"dtype": "float32"},
    logging_strategy="no",
    save_strategy="no",
    eval_strategy="no",
    report_to="none",
    disable_tqdm=True,
    log_completions=False,
    dataloader_num_workers=0,
)

marks = {"begin": [], "end": []}
class StepTimes(TrainerCallback):
    def on_step_begin(self, a, state, control, **kw):
        marks["begin"].append(time.perf_counter())
    def on_step_end(self, a, state, control, **kw):
        marks["end"].append((time.perf_counter(), time.process_time()))

t_load = time.perf_counter()
trainer = GRPOTrainer(model=spec["model_dir"], reward_funcs=letter_reward, args=args, train_dataset=train,
                      callbacks=[StepTimes()])
load_s = time.perf_counter() - t_load

gen_calls, score_calls, prep_ends, loss_calls, rewards, prompt_ids_seen = [], [], [], [], [], []
orig_gen = trainer._generate
def timed_gen(prompts):
    t = time.perf_counter()
    out = orig_gen(prompts)
    prompt_ids, completion_ids = out[0], out[1]
    gen_calls.append((t, time.perf_counter() - t, len(completion_ids), sum(len(c) for c in completion_ids)))
    prompt_ids_seen.extend(list(map(int, p)) for p in prompt_ids[::K])  # one per group (rows come K at a time)
    return out
trainer._generate = timed_gen

orig_score = trainer._generate_and_score_completions
def timed_score(inputs):
    t = time.perf_counter()
    out = orig_score(inputs)
    score_calls.append((t, time.perf_counter() - t))
    return out
trainer._generate_and_score_completions = timed_score

orig_prep = trainer._prepare_inputs
def timed_prep(batch):
    out = orig_prep(batch)
    prep_ends.append(time.perf_counter())
    return out
trainer._prepare_inputs = timed_prep

orig_rew = trainer._calculate_rewards
def recorded_rewards(*a, **kw):
    out = orig_rew(*a, **kw)
    rewards.extend(out[:, 0].tolist())
    return out
trainer._calculate_rewards = recorded_rewards

orig_loss = trainer.compute_loss
def counted_loss(model, inputs, *a, **kw):
    loss_calls.append((time.perf_counter(), int(inputs["completion_ids"].size(0)), int(inputs["completion_mask"].sum()),
                       "old_per_token_logps" in inputs, "ref_per_token_logps" in inputs))
    return orig_loss(model, inputs, *a, **kw)
trainer.compute_loss = counted_loss

model = trainer.model
t_start, cpu_start = time.perf_counter(), time.process_time()
trainer.train()
t_end = time.perf_counter()
opt = trainer.optimizer
opt = getattr(opt, "optimizer", opt)  # accelerate's AcceleratedOptimizer wrapper

ends = marks["end"]
assert len(ends) == W + S, (len(ends), W, S)
begin, cpu_begin = ends[W - 1] if W else (t_start, cpu_start)
step_ends = [e[0] for e in ends]
step_times = [b - a for a, b in zip([begin] + step_ends[W:-1], step_ends[W:])]
measured = step_ends[-1] - begin
measured_cpu = ends[-1][1] - cpu_begin
in_window = lambda calls: [c for c in calls if begin <= c[0] <= step_ends[-1]]
gen_w, score_w, loss_w = in_window(gen_calls), in_window(score_calls), in_window(loss_calls)
prep_w = [p for p in prep_ends if begin <= p <= step_ends[-1]]
assert len(prep_w) == S, (len(prep_w), S)
update_s = sum(e - p for p, e in zip(prep_w, step_ends[W:]))
completions_trained = sum(c[1] for c in loss_w)
mismatch = sum(1 for got, inst in zip(prompt_ids_seen, instances) if got != inst["prompt_ids"])
result = {
    "framework": "trl",
    "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                 "accelerate": accelerate.__version__, "datasets": datasets.__version__},
    "threads": torch.get_num_threads(),
    "load_s": load_s,
    "steps": S,
    "measured_s": measured,
    "measured_cpu_s": measured_cpu,
    "step_times_s": step_times,
    "mean_prompt_tokens": float(np.mean([len(p) for p in prompt_ids_seen])),
    "prompt_ids_checked": len(prompt_ids_seen),
    "prompt_ids_mismatch": mismatch + abs(len(prompt_ids_seen) - len(instances)),
    "completions_generated": sum(c[2] for c in gen_w),
    "completions_trained": completions_trained,
    "completions_per_step": completions_trained / S,
    "completions_per_s": completions_trained / measured,
    "generate_calls_per_step": len(gen_w) / S,
    "optimizer_steps_per_step": 1.0,   # gradient_accumulation_steps=1: one optimizer step per trainer step
    "loss_calls_per_step": len(loss_w) / S,
    "gen_s_per_step": sum(c[1] for c in gen_w) / S,
    "reward_adv_s_per_step": (sum(c[1] for c in score_w) - sum(c[1] for c in gen_w)) / S,
    "update_s_per_step": update_s / S,
    "mean_completion_tokens": sum(c[3] for c in gen_w) / max(1, sum(c[2] for c in gen_w)),
    "trained_tokens_per_completion": sum(c[2] for c in loss_w) / max(1, completions_trained),
    "mean_reward": float(np.mean(rewards)) if rewards else None,
    "checks": {
        "model_dtype": str(next(model.parameters()).dtype),
        "attn_implementation": model.config._attn_implementation,
        "device": str(next(model.parameters()).device),
        "use_vllm": bool(trainer.use_vllm),
        "bf16": bool(args.bf16), "fp16": bool(args.fp16),
        "gradient_checkpointing": any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()),
        "ref_model": trainer.ref_model is not None,
        "beta": trainer.beta,
        "loss_type": trainer.loss_type,
        "importance_sampling_level": trainer.importance_sampling_level,
        "old_logps_forward": any(c[3] for c in loss_calls),
        "ref_logps_forward": any(c[4] for c in loss_calls),
        "optimizer": type(opt).__name__,
        "optimizer_fused": bool(opt.defaults.get("fused")),
        "lr": opt.param_groups[0]["lr"],
        "lr_scheduler": type(trainer.lr_scheduler).__name__,
        "generation_batch_size": args.generation_batch_size,
        "steps_per_generation": args.steps_per_generation,
        "generation_config": {k: getattr(trainer.generation_config, k) for k in
                              ("do_sample", "temperature", "top_p", "top_k", "min_p", "max_new_tokens")},
    },
    "tail_s": t_end - step_ends[-1],
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
}
c = result["checks"]
wrong = [name for name, ok in (
    ("fp32 weights", c["model_dtype"] == "torch.float32"),
    ("cpu", c["device"] == "cpu"),
    ("no vLLM", not c["use_vllm"]),
    ("no bf16/fp16", not (c["bf16"] or c["fp16"])),
    ("no gradient checkpointing", not c["gradient_checkpointing"]),
    ("no reference model / KL", not c["ref_model"] and c["beta"] == 0.0 and not c["ref_logps_forward"]),
    ("no old-log-prob forward", not c["old_logps_forward"]),
    ("one generate call per step", result["generate_calls_per_step"] == 1.0),
    ("one loss call (micro-batch) per step", result["loss_calls_per_step"] == 1.0),
    ("B*K completions per step", result["completions_per_step"] == B * K),
    ("constant lr", abs(c["lr"] - spec["lr"]) < 1e-12),
    ("the requested loss", c["loss_type"] == spec["trl_loss"].get("loss_type", "dapo")),
) if not ok]
if wrong:
    raise SystemExit(f"TRL did not run the intended workload ({', '.join(wrong)}): {json.dumps(result)}")
print("@@VS_TRL_RESULT@@ " + json.dumps(result), flush=True)
'''


# ------------------------------------------------------------------------------------------------
# the accord side (runs as a subprocess of this script, in this interpreter)
# ------------------------------------------------------------------------------------------------

class LetterTask:
    """One agent writes words; its reward is the share of its words containing ``LETTER``.

    accord's ``letters`` task with only its agent ``e``: same rows, same prompt, same share.
    """

    name = TASK_NAME
    agents = ("writer",)

    def __init__(self, size: int = 1000):
        self.size = size

    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict]:
        base = 0 if split == "train" else 10 * self.size
        n = self.size if limit is None else min(limit, self.size)
        return [{"id": f"{split}-{base + i}", "number": base + i} for i in range(n)]

    def prompt(self, agent: str, row: dict) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Task {row['number']}: write words with the letter {LETTER}."}]

    def reward(self, *, prompts=None, completions: dict, agents: tuple[str, ...], **kwargs) -> list[float]:
        from accord.envs.synthetic.letters import _share
        return [_share(c, LETTER) for c in completions["writer"]]


def accord_worker(spec: dict) -> dict:
    import torch

    from accord.config import config_from_dict
    from accord.envs.registry import register_task
    from accord.trainer import Trainer

    register_task(TASK_NAME, "bench only: one agent, reward = share of words with the letter e")(LetterTask)
    B, K, W, S = spec["batch"], spec["k"], spec["warmup"], spec["steps"]
    cfg = config_from_dict({
        "run": {"name": "vs-trl", "run_dir": spec["run_dir"], "seed": spec["seed"], "steps": W + S,
                "threads": spec["threads"], "eval_before": False, "eval_after": False},
        "specialization": "shared",
        "policies": {"main": {"model": spec["model_dir"]}},
        "task": {"name": TASK_NAME, "eval_size": 0},
        "algorithm": {"num_generations": K, "advantage": "mean",
                      "normalize_std": True,       # TRL scale_rewards="group"
                      "epsilon": 0.2, "ppo_epochs": 1, "kl_coef": 0.0,
                      **spec["accord_loss"]},      # default dapo: token_mean = TRL loss_type="dapo" (= "bnpo" here)
        "rollout": {"batch_size": B, "max_new_tokens": spec["max_new_tokens"], "temperature": 1.0,
                    "top_p": 1.0, "top_k": 0},
        "training": {"lr": spec["lr"], "micro_batch_size": spec["micro_batch_size"], "num_mini_batches": 1,
                     "weight_decay": 0.0, "schedule": "constant", "warmup_steps": 0,
                     "max_grad_norm": spec["max_grad_norm"], "bf16": False},   # fp32 like TRL's side
        "logging": {"console": False, "tensorboard": False, "completions_every": 0},
    })
    t = time.perf_counter()
    trainer = Trainer(cfg)
    load_s = time.perf_counter() - t
    (agent,) = trainer.agents
    policy = trainer.policies[trainer.agent_policy[agent]]
    instances, step_times, metrics_seen, completions = [], [], [], 0
    for step in range(W + S):
        for row in trainer.batch_rows(step):
            messages = trainer.task.prompt(agent, row)
            instances.append({"id": str(row.get("id")), "messages": messages,
                              "prompt_ids": policy.encode_chat(messages)})
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

    def mean_of(key):
        vals = [m[key] for m in metrics_seen if key in m]
        return sum(vals) / len(vals) if vals else None

    return {
        "framework": "accord",
        "versions": {"torch": torch.__version__, "transformers": installed_version("transformers")},
        "threads": torch.get_num_threads(),
        "load_s": load_s,
        "steps": S,
        "measured_s": measured,
        "measured_cpu_s": measured_cpu,
        "step_times_s": step_times,
        "mean_prompt_tokens": sum(len(i["prompt_ids"]) for i in instances) / len(instances),
        "completions_generated": completions,
        "completions_trained": completions,
        "completions_per_step": completions / S,
        "completions_per_s": completions / measured,
        "generate_calls_per_step": -(-B * K // cfg.rollout.generation_batch_size),
        "optimizer_steps_per_step": cfg.training.num_mini_batches * cfg.algorithm.ppo_epochs,
        "gen_s_per_step": mean_of("time/gen"),
        "reward_adv_s_per_step": (mean_of("time/reward") or 0.0) + (mean_of("time/adv") or 0.0),
        "update_s_per_step": mean_of("time/update"),
        "mean_completion_tokens": mean_of(f"agent/{agent}/completion_len"),
        "trained_tokens_per_completion": mean_of(f"agent/{agent}/completion_len"),
        "mean_reward": mean_of("team/reward"),
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
    for side in ("accord", "trl"):
        r = res.get(side)
        if not r:
            continue
        step = r["measured_s"] / r["steps"]
        lines.append(f"{side:<10} {r['completions_per_s']:>14.1f} {step:>14.3f} {r['completions_per_step']:>17.0f} "
                     f"{r['gen_s_per_step']:>11.3f} {r['update_s_per_step']:>14.3f} {r['peak_rss_mib']:>13.0f}")
    if res.get("ratio") is not None:
        lines.append(f"ratio accord/trl: {res['ratio']:.2f}  (target >= 1.2)")
        rb = res["ratio_robust"]
        lines.append(f"  other estimates: median round {rb['median_round']:.2f}, median step time "
                     f"{rb['median_step']:.2f}, per CPU-second {rb['per_cpu_s']:.2f}")
        lines.append(f"  prompt token ids identical on both sides: {res['prompt_ids_identical']}; mean completion "
                     f"tokens accord {res['accord']['mean_completion_tokens']:.1f}, trl "
                     f"{res['trl']['mean_completion_tokens']:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hidden", type=int, default=64, help="tiny model hidden size")
    p.add_argument("--layers", type=int, default=2, help="tiny model layers")
    p.add_argument("--heads", type=int, default=4, help="tiny model attention heads")
    p.add_argument("--vocab", type=int, default=2048, help="tiny model vocabulary size")
    p.add_argument("--k", type=int, default=4, help="K: completions per prompt (num_generations)")
    p.add_argument("--batch", type=int, default=8, help="B: prompts per step")
    p.add_argument("--max-new-tokens", type=int, default=32, help="max_new_tokens = TRL max_completion_length")
    p.add_argument("--steps", type=int, default=10, help="measured steps")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps, excluded from timing")
    p.add_argument("--rounds", type=int, default=3,
                   help="fresh process pairs per framework, alternating; the fastest round of each is reported")
    p.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=("PASSIVE", "ACTIVE", ""),
                   help="OMP_WAIT_POLICY for both sides ('' = library default, spinning)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-grad-norm", type=float, default=1.0,
                   help="grad-norm clipping on both sides (the default of both); <= 0 disables it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss", default="dapo", choices=sorted(LOSSES),
                   help="the loss variant on both sides (accord algorithm.loss and TRL's matching loss_type)")
    p.add_argument("--micro-batch-size", type=int, default=64,
                   help="accord training.micro_batch_size (TRL trains the B*K completions in one micro-batch)")
    p.add_argument("--bench-dir", default=os.environ.get("ACCORD_BENCH_DIR", str(REPO / ".bench")),
                   help="models, runs and the trl venv ($ACCORD_BENCH_DIR)")
    p.add_argument("--reinstall", action="store_true", help="recreate the trl venv")
    p.add_argument("--skip-trl", action="store_true", help="run accord only")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per framework run")
    p.add_argument("--json", dest="json_path", help="also write the results JSON here")
    p.add_argument("--worker", choices=("accord",), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker == "accord":
        spec = json.loads(Path(args.spec).read_text())
        print(RESULT_TAG + json.dumps(accord_worker(spec)), flush=True)
        return 0

    if args.warmup < 1 or args.steps < 1 or args.rounds < 1:
        p.error("--steps, --warmup and --rounds must be >= 1")
    if args.micro_batch_size < args.batch * args.k:
        print(f"[bench] note: accord micro_batch_size {args.micro_batch_size} < B*K = {args.batch * args.k}: accord "
              "accumulates gradients over several forward passes while TRL runs one", file=sys.stderr)
    bench_dir = Path(args.bench_dir).resolve()
    bench_dir.mkdir(parents=True, exist_ok=True)
    # accelerate (under TRL): a plain single CPU process (no launcher, no IPEX, no mixed precision)
    env = worker_env(args.threads, bench_dir, args.omp_wait_policy,
                     extra={"ACCELERATE_USE_CPU": "true", "ACCELERATE_MIXED_PRECISION": "no",
                            "CUDA_VISIBLE_DEVICES": ""})

    install_s = None
    trl_py = None
    if not args.skip_trl:
        # trl pulls accelerate and datasets; no extras (no vllm, liger, peft, deepspeed)
        trl_py, install_s = ensure_peer_venv(bench_dir, "trl", TRL_VERSION, args.reinstall,
                                             also_import=("accelerate",))
    model_dir = ensure_model(args, bench_dir)

    max_grad_norm = args.max_grad_norm if args.max_grad_norm > 0 else None
    common = {"model_dir": str(model_dir), "batch": args.batch, "k": args.k, "warmup": args.warmup,
              "steps": args.steps, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
              "lr": args.lr, "seed": args.seed, "max_grad_norm": max_grad_norm,
              "accord_loss": LOSSES[args.loss][0], "trl_loss": LOSSES[args.loss][1]}
    results: dict = {
        "config": {**common, "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                   "vocab": args.vocab, "rounds": args.rounds, "omp_wait_policy": args.omp_wait_policy,
                   "cpu_count": os.cpu_count(), "micro_batch_size": args.micro_batch_size,
                   "trl_version": TRL_VERSION, "loss": args.loss},
        "trl_venv_install_s": install_s,
    }
    runs: dict[str, list[dict]] = {"accord": [], "trl": []}
    with tempfile.TemporaryDirectory(prefix="vs_trl.") as tmp:
        run_dir = bench_dir / "runs" / "vs-trl"
        spec_path = Path(tmp) / "accord_spec.json"
        spec_path.write_text(json.dumps({**common, "run_dir": str(run_dir),
                                         "micro_batch_size": args.micro_batch_size}))
        driver = Path(tmp) / "trl_driver.py"
        driver.write_text(TRL_DRIVER)
        tspec = Path(tmp) / "trl_spec.json"
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
                # exactly the prompts accord trains on, in the same order, with accord's token ids
                tspec.write_text(json.dumps({**common, "letter": LETTER, "instances": instances,
                                             "output_dir": str(Path(tmp) / "trl-out")}))
            runs["accord"].append(res)

        def run_trl(rnd: int) -> None:
            runs["trl"].append(run_worker([str(trl_py), str(driver), str(tspec)], env,
                                          f"trl (round {rnd + 1}/{args.rounds})", args.timeout, RESULT_TAG))

        for rnd in range(args.rounds):
            order = [run_accord] if args.skip_trl else (
                [run_accord, run_trl] if rnd % 2 == 0 or instances is None else [run_trl, run_accord])
            for fn in order:
                fn(rnd)

    for side, rs in runs.items():
        if rs:
            results[side] = summarize(rs)
    results["ratio"] = None
    if results.get("trl"):
        a, t = results["accord"], results["trl"]
        results["ratio"] = a["completions_per_s"] / t["completions_per_s"]
        results["ratio_robust"] = {
            "median_round": a["completions_per_s_median_round"] / t["completions_per_s_median_round"],
            "median_step": a["completions_per_s_median_step"] / t["completions_per_s_median_step"],
            "per_cpu_s": a["completions_per_cpu_s"] / t["completions_per_cpu_s"],
        }
        results["prompt_ids_identical"] = all(r["prompt_ids_mismatch"] == 0 for r in runs["trl"])
        if not results["prompt_ids_identical"]:
            print(f"[bench] WARNING: TRL tokenized {t['prompt_ids_mismatch']} prompts differently from accord",
                  file=sys.stderr)
        if a["completions_per_step"] != t["completions_per_step"]:
            print(f"[bench] WARNING: completions per step differ: accord {a['completions_per_step']}, "
                  f"trl {t['completions_per_step']}", file=sys.stderr)

    cfg = results["config"]
    print(f"loss {cfg['loss']}: single agent, 'e' words task, tiny qwen2 (hidden {cfg['hidden']}, {cfg['layers']} layers, "
          f"vocab {cfg['vocab']}), K={cfg['k']}, B={cfg['batch']}, max_new_tokens={cfg['max_new_tokens']}, "
          f"{cfg['steps']} measured steps (+{cfg['warmup']} warm-up), {cfg['threads']} threads, "
          f"best of {cfg['rounds']} rounds; trl {TRL_VERSION}")
    print(fmt_table(results))
    if install_s:
        print(f"trl venv installed in {install_s:.1f} s")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
