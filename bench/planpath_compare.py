#!/usr/bin/env python
"""Learning comparison on Plan-Path after a warm start: AT-GRPO (shared and per-role policies), multi-turn
MAGRPO, single-agent GRPO and independent learners at the same generated-token budget over several seeds --
a warm start per seed, then ``accord compare`` (:mod:`accord.compare`) from it.

    python bench/planpath_compare.py                                    # SmolLM2-135M, seeds 0 1 2
    python bench/planpath_compare.py --model tiny-qwen2 --hidden-size 64 --num-layers 2 --wall-frac 0.1 \\
        --seeds 0 1 --eval-size 4 --budget 400 --sft-steps 3 --sft-instances 20
    python bench/planpath_compare.py --seeds 0 --out .bench/cmp_s0      # seeds run apart, then:
    python bench/planpath_compare.py --merge .bench/cmp_s0 .bench/cmp_s1 --out .bench/cmp

What this script adds to ``accord compare``:

1. **The warm start of each seed** (the comparison's ``compare.warm_start``). The task's oracle (BFS shortest
   paths, a share ``--sft-noise`` of them imperfect: a detour or a wrong move) plays ``--sft-instances``
   training puzzles three times, in the two-role layout, as the single-agent ``solver`` and as the centralized
   ``central`` agent (every role's answer in one completion), with the very prompts RL will show
   (:func:`accord.sft.collect_demos`); one model is fine-tuned on the three sets together for
   ``--sft-steps`` steps (:func:`accord.sft.sft_step`) and exported to ``WARM/warm-<seed>``. ``accord sft``
   trains on one layout, and the single-agent and centralized methods need their own demonstrations too, hence
   this step.
   An existing warm start of the same settings is reused (a resumed run does not fine-tune again).
2. **The methods as config overrides** of one AT-GRPO config (``METHODS``) with the same K, B, lr
   (constant), temperature, max_new_tokens, turns, grid, walls and alpha; ``accord compare`` then trains each
   from the warm start to ``--budget`` generated tokens, evaluates the held-out puzzles greedily before and
   after, and prints, plots and writes the comparison (``OUT/compare.md``, ``compare.png``, ``compare.json``;
   docs/compare.md says what the intervals assume). A killed run started again with the same arguments goes
   on where it stopped; ``--merge`` is ``accord compare --merge``.

The workflow defaults to ``direct`` (planner -> executor writing moves as text), not the paper's
``tool_planner``: the oracle's tool program is 262 SmolLM2 tokens against ~30 for a move answer, so at an
equal token budget a two-role method would get about one step where single-agent GRPO gets ten, and the
program does not depend on the state, so the warm start would copy it and start every two-role method at
the ceiling. ``--workflow tool_planner`` runs the paper's roles (``--max-new-tokens`` then defaults to 320).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# spinning OpenMP threads make a shared 2-core machine several times slower (measured: a SmolLM2 prefill
# went from ~1 s to 20 s under load 5); passive waiting costs nothing on an idle one
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# method -> its overrides of the AT-GRPO base config (compare.methods)
METHODS = {
    "atgrpo_shared": [],
    "atgrpo_roles": ["specialization=separate"],
    "magrpo": ["algorithm.name=magrpo", "algorithm.joint_mode=aligned"],
    "grpo": ["algorithm.baseline=single_agent"],
    "centralized": ["algorithm.baseline=centralized"],
    "independent": ["algorithm.baseline=independent"],
}
# the agent layouts of the warm start: every method's layout (independent and MAGRPO share the two roles')
LAYOUTS = ("none", "single_agent", "centralized")
LOG = logging.getLogger("planpath_compare")


def model_kwargs(args: argparse.Namespace) -> dict:
    """The tiny model's size (2048 positions, so that the tool workflow's programs fit); {} for other models."""
    if not args.model.startswith("tiny"):
        return {}
    return {"hidden_size": args.hidden_size, "num_layers": args.num_layers, "max_position_embeddings": 2048}


def base_data(args: argparse.Namespace) -> dict:
    """The config every method shares, with the comparison's settings (the warm start is set per seed)."""
    options = {"size": args.size, "max_turns": args.turns, "workflow": args.workflow}
    if args.wall_frac is not None:
        options["wall_frac"] = args.wall_frac
    return {
        "run": {"name": "planpath-compare", "seed": args.seeds[0], "threads": args.threads,
                "checkpoint_every": args.checkpoint_every},
        "specialization": "shared",
        "policies": {"main": {"model": args.model, "model_kwargs": model_kwargs(args)}},
        "task": {"name": "planpath", "options": options, "eval_size": args.eval_size},
        "algorithm": {"name": "atgrpo", "num_generations": args.k, "normalize_std": args.normalize_std,
                      "alpha": args.alpha, "gamma": 1.0},
        "rollout": {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
                    "temperature": args.temperature, "history_turns": args.history_turns, "max_prompt_tokens": 1536},
        "training": {"lr": args.lr, "micro_batch_size": args.micro_batch, "warmup_steps": 0, "max_grad_norm": 1.0,
                     "schedule": "constant", "bf16": args.bf16},
        "sft": {"instances": args.sft_instances, "eval_size": args.sft_eval_size, "noise": args.sft_noise,
                "steps": max(1, args.sft_steps), "batch_size": args.sft_batch, "lr": args.sft_lr},
        "logging": {"console": False, "report_to": [], "completions_every": 0},
        "compare": {"methods": {m: METHODS[m] for m in args.methods}, "seeds": args.seeds,
                    "budget_tokens": args.budget, "output_dir": str(args.out),
                    "warm_start": str(warm_dir(args) / "warm-{seed}")},
    }


def warm_dir(args: argparse.Namespace) -> Path:
    return args.warm_dir or args.out.with_name(args.out.name + "-warm")


# --- the warm start ---------------------------------------------------------------------------------------

def warm_start(args: argparse.Namespace, seed: int) -> dict:
    """Fine-tune one model on the oracle's demonstrations of every layout and export it to WARM/warm-<seed>
    (or reuse the one there, made with the same settings); returns its summary."""
    import copy

    from accord.config import config_from_dict
    from accord.seeding import setup_process
    from accord.sft import (DemoError, _batches, _policies, collect_demos, encode_demos, mean_nll, sft_step,
                            write_demos)

    out = warm_dir(args) / f"warm-{seed}"
    data = base_data(args)
    data["run"].update(seed=seed, run_dir=str(warm_dir(args) / f"sft-{seed}"))
    settings = {"model": args.model, "model_kwargs": model_kwargs(args), "task_options": data["task"]["options"],
                "rollout": data["rollout"], "sft": data["sft"], "sft_steps": args.sft_steps, "bf16": args.bf16,
                "seed": seed}
    stamp = out / "warm_start.json"
    if stamp.is_file():
        done = json.loads(stamp.read_text())
        if done["settings"] != json.loads(json.dumps(settings)):
            raise SystemExit(f"planpath_compare: {out} holds a warm start of other settings; delete it or pass "
                             "another --warm-dir")
        LOG.info("seed %d: reusing the warm start in %s", seed, out)
        return done["summary"]
    t0 = time.perf_counter()
    cfgs = []
    for baseline in LAYOUTS:   # the two-role layout, the solver's, the centralized one
        d = copy.deepcopy(data)
        d.pop("compare")
        d["algorithm"]["baseline"] = baseline
        cfgs.append(config_from_dict(d))
    setup_process(seed, args.threads)
    train, held = [], []
    for cfg in cfgs:   # the same puzzles in every layout
        tr, ev = collect_demos(cfg)
        train += tr
        held += ev
    ((policy, _),) = _policies(cfgs[0]).values()   # one model with the RL runs' training setup, sft.lr constant
    try:
        encoded = encode_demos(policy, train, args.max_new_tokens)
        held_data = encode_demos(policy, held, args.max_new_tokens)
    except DemoError as err:   # the bench's flag, not the config key the library names
        raise SystemExit(f"planpath_compare: {err}; here: --max-new-tokens") from err
    micro = cfgs[0].training.micro_batch_size
    nll_before = mean_nll(policy, held_data, micro) if held_data else None
    batches = _batches(len(encoded), args.sft_batch, seed)
    losses, every = [], max(1, args.sft_steps // 5)
    for step in range(1, args.sft_steps + 1):
        t = time.perf_counter()
        metrics = sft_step(policy, [encoded[i] for i in next(batches)], micro, cfgs[0].training.max_grad_norm, step)
        losses.append(metrics["loss"])
        if step % every == 0 or step == args.sft_steps:
            LOG.info("seed %d sft step %d/%d: loss %.4f, %.1fs", seed, step, args.sft_steps, metrics["loss"],
                     time.perf_counter() - t)
    nll_after = mean_nll(policy, held_data, micro) if held_data else None
    policy.export(out)
    write_demos(train, out / "demos.jsonl")
    summary = {"demos": len(train), "noisy": sum(d.noisy for d in train),
               "by_agent": {a: sum(d.agent == a for d in train) for a in sorted({d.agent for d in train})},
               "held_out": len(held), "loss_first": losses[0] if losses else None,
               "loss_last": losses[-1] if losses else None, "held_out_nll_before": nll_before,
               "held_out_nll_after": nll_after, "seconds": round(time.perf_counter() - t0, 1)}
    stamp.write_text(json.dumps({"settings": settings, "summary": summary}, indent=1))   # last: marks it complete
    LOG.info("seed %d warm start: %d demonstrations (%d imperfect), %d steps, held-out NLL %s -> %s, %.0fs", seed,
             summary["demos"], summary["noisy"], args.sft_steps, _fmt(nll_before), _fmt(nll_after),
             summary["seconds"])
    del policy
    gc.collect()
    return summary


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="base model of the warm start")
    p.add_argument("--hidden-size", type=int, default=64, help="tiny models: hidden size")
    p.add_argument("--num-layers", type=int, default=2, help="tiny models: decoder layers")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget", type=int, default=1000, help="generated training tokens per method and seed")
    p.add_argument("--workflow", default="direct", choices=["direct", "tool_planner"],
                   help="Plan-Path roles (see the module docstring for why direct is the default)")
    p.add_argument("--size", type=int, default=4, help="Plan-Path grid size (the smallest setting)")
    p.add_argument("--wall-frac", type=float, help="share of the grid's cells that are walls (default: the task's)")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default 136 (direct: the centralized answer, both roles' sections, is up to 130 tiny-tokenizer "
                   "tokens) or 320 (tool_planner): the oracle's answers must fit")
    p.add_argument("--alpha", type=float, default=1.0, help="AT-GRPO team weight (independent: 0 by definition)")
    p.add_argument("--normalize-std", action=argparse.BooleanOptionalAction, default=True,
                   help="divide every method's advantages by their group's std (algorithm.normalize_std)")
    p.add_argument("--temperature", type=float, default=1.0, help="training sampling temperature")
    p.add_argument("--history-turns", type=int, default=0,
                   help="earlier exchanges kept in prompts (0: the observation already holds the whole state)")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward (SFT and RL updates)")
    p.add_argument("--bf16", action="store_true", help="training.bf16=true (autocast over fp32 weights), SFT too")
    p.add_argument("--eval-size", type=int, default=16, help="held-out puzzles per seed")
    p.add_argument("--sft-steps", type=int, default=8,
                   help="warm-start steps (SmolLM2: about 2 s per demonstration on 2 cores)")
    p.add_argument("--sft-batch", type=int, default=8, help="demonstrations per SFT step")
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--sft-noise", type=float, default=0.2, help="share of imperfect demonstrations")
    p.add_argument("--sft-instances", type=int, default=100, help="training puzzles the oracle plays per layout")
    p.add_argument("--sft-eval-size", type=int, default=8, help="held-out puzzles of the warm start's NLL")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint-every", type=int, default=1,
                   help="checkpoint each method's run every N steps (a killed run resumes from the newest)")
    p.add_argument("--out", type=Path, default=REPO / ".bench" / "planpath_compare",
                   help="the comparison's directory (accord compare's compare.output_dir)")
    p.add_argument("--warm-dir", type=Path, help="where the warm starts go (default: OUT-warm)")
    p.add_argument("--overwrite", action="store_true", help="delete an earlier comparison in --out first")
    p.add_argument("--merge", nargs="+", type=Path, metavar="OUT",
                   help="run nothing: merge the --out directories (or compare.json files) of earlier runs of one "
                   "setting, e.g. one per seed, into --out")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", force=True)
    import dataclasses

    from accord.compare import load_plan, merge, preflight, run_compare
    from accord.config import ConfigError

    try:
        if args.merge:
            data = merge(args.merge, args.out)
        else:
            if args.max_new_tokens is None:
                args.max_new_tokens = 320 if args.workflow == "tool_planner" else 136
            if args.sft_steps < 0:
                p.error("--sft-steps must be >= 0")
            plan = load_plan([("planpath", base_data(args))])
            # every check that needs no model before the warm starts (which do not exist yet)
            preflight(dataclasses.replace(plan, compare=dataclasses.replace(plan.compare, warm_start=None)))
            warm = {seed: warm_start(args, seed) for seed in args.seeds}
            (warm_dir(args) / "warm_starts.json").write_text(json.dumps(warm, indent=1))
            data = run_compare(plan, overwrite=args.overwrite)
    except ConfigError as err:
        p.exit(2, f"planpath_compare: {err}\n")
    print(Path(data["files"]["markdown"]).read_text())
    print(f"{data['files']['json']}\n{data['files']['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
