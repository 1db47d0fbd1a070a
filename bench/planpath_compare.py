#!/usr/bin/env python
"""Learning comparison on Plan-Path after a warm start: AT-GRPO (shared and per-role policies), multi-turn
MAGRPO, single-agent GRPO and independent learners, at the same generated-token budget, over several seeds.

    python bench/planpath_compare.py --json .bench/planpath_compare.json        # the defaults: about 52 min on 2 cores
    python bench/planpath_compare.py --model tiny-qwen2 --seeds 0 1 --eval-size 4 --budget 400 --sft-steps 3
    python bench/planpath_compare.py --merge s0.json s1.json s2.json --json all.json   # seeds run apart, one table

Per seed:

1. **Warm start.** The task's oracle (BFS shortest paths, a share ``--sft-noise`` of them imperfect:
   a detour or a wrong move) plays ``--sft-instances`` training puzzles twice, once in the two-role
   layout and once as the single-agent ``solver``, with the very prompts RL will show
   (:func:`accord.sft.collect_demos`); one model is fine-tuned on both sets together for
   ``--sft-steps`` steps (:func:`accord.sft.sft_step`, ``--sft-batch`` demonstrations a step) and
   exported. Every method of the seed starts from that export; per-role policies each load a copy.
2. **Before.** The export is evaluated once per agent layout (two roles; one solver), greedily, one
   episode per held-out puzzle. Greedy decoding from identical weights gives the same episodes for
   every method of a layout, so they share it.
3. **Training** of each method from the export until the completions it generated for training reach
   ``--budget`` tokens (the step that crosses it is the last), with the same K, B, lr, temperature,
   max_new_tokens, turns, grid and alpha:

   - ``atgrpo_shared``: AT-GRPO, both roles on one model; K candidates per (puzzle, turn, agent) from
     one state, rewards ``alpha * team + local``, the best candidate advances the state;
   - ``atgrpo_roles``: the same with one model (and optimizer) per role (``specialization: separate``);
   - ``magrpo``: multi-turn MAGRPO, a tree of aligned joint actions, team reward only,
     ``G = r + gamma * mean(children)``;
   - ``grpo``: one model does the whole task alone (``baseline: single_agent``) with AT-GRPO's
     turn-wise groups: the effect of having two roles;
   - ``independent``: AT-GRPO's sampling, each agent trained on its local reward only
     (``baseline: independent``): the effect of the team term.
4. **After.** The trained model(s) on the same held-out puzzles, as in step 2.

The held-out puzzles depend on the seed (``task.tasks("eval", seed=seed)``), so seeds x ``--eval-size``
episodes are pooled per method. Success rate: Wilson score interval (correct coverage near 0 and 1,
where the normal interval collapses to a point). Mean team return: Student-t interval over the pooled
episodes (deterministic, unlike a bootstrap, which gives about the same width at n >= 30 and is the
better choice only for small n with skewed returns). Before -> after differences: paired Student-t
interval over the per-puzzle differences (the same puzzles are played before and after). All intervals
are 95 %. They treat episodes as independent draws and ignore the extra variance between seeds
(training runs); the per-seed values are printed beside them so that the spread between seeds is
visible. ``flat groups`` is the mean share of advantage groups whose returns were all equal during
training (``adv/zero_std_frac``): at 1.0 no sample had a learning signal.

Output: the table, a plot (``--plot``: success rates and returns, before and after, with the
intervals), and the last stdout line is all results as JSON (``--json PATH`` writes it too).

The workflow defaults to ``direct`` (planner -> executor writing moves as text), not the paper's
``tool_planner``: the oracle's tool program is 262 SmolLM2 tokens against ~30 for a move answer, so at
an equal token budget a two-role method would get about one step where single-agent GRPO gets ten, and
the program does not depend on the state, so the warm start would copy it and start every two-role
method at the ceiling. ``--workflow tool_planner`` runs the paper's roles (``--max-new-tokens`` then
defaults to 320).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# spinning OpenMP threads make a shared 2-core machine several times slower (measured: a SmolLM2 prefill
# went from ~1 s to 20 s under load 5); passive waiting costs nothing on an idle one
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# method -> (algorithm section, specialization, agent layout)
METHODS = {
    "atgrpo_shared": ({"name": "atgrpo"}, "shared", "roles"),
    "atgrpo_roles": ({"name": "atgrpo"}, "separate", "roles"),
    "magrpo": ({"name": "magrpo", "joint_mode": "aligned"}, "shared", "roles"),
    "grpo": ({"name": "atgrpo", "baseline": "single_agent"}, "shared", "solver"),
    "independent": ({"name": "atgrpo", "baseline": "independent"}, "shared", "roles"),
}
Z95 = 1.959963984540054
LOG = logging.getLogger("planpath_compare")


# --- statistics -------------------------------------------------------------------------------------------

def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default)."""
    if n <= 0:
        raise ValueError("wilson: n must be > 0")
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the interval holds p; rounding can put an end a hair past it (0 successes in 48: low 7e-18)
    return max(0.0, min(p, center - half)), min(1.0, max(p, center + half))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (p in (0.5, 1)), by bisection on the CDF."""
    if df < 1 or not 0.5 < p < 1.0:
        raise ValueError(f"t_quantile: need df >= 1 and 0.5 < p < 1, got df={df}, p={p}")
    target = 2.0 * (1.0 - p)   # two-sided tail mass: P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2)
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if betainc(df / 2.0, 0.5, df / (df + mid * mid)) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % Student-t interval of the mean (a point when n < 2 or all values equal)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci: no values")
    m = sum(values) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return m, m - half, m + half


def proportion(values: list[float]) -> dict:
    """Success rate of 0/1 ``values`` with its Wilson interval."""
    lo, hi = wilson(sum(values), len(values))
    return {"mean": sum(values) / len(values), "low": lo, "high": hi, "n": len(values)}


def average(values: list[float]) -> dict:
    m, lo, hi = mean_ci(values)
    return {"mean": m, "low": lo, "high": hi, "n": len(values)}


# --- configs ----------------------------------------------------------------------------------------------

def base_data(args: argparse.Namespace, seed: int, run_dir: Path, model: str, model_kwargs: dict) -> dict:
    """The config every method shares (the method's algorithm, specialization and agents go on top)."""
    return {
        "run": {"name": run_dir.name, "run_dir": str(run_dir), "steps": 10_000, "seed": seed,
                "threads": args.threads, "eval_before": False, "eval_after": False},
        "policies": {"main": {"model": model, "model_kwargs": model_kwargs}},
        "task": {"name": "planpath", "options": {"size": args.size, "max_turns": args.turns,
                                                 "workflow": args.workflow},
                 "eval_size": args.eval_size},
        "algorithm": {"num_generations": args.k, "normalize_std": True, "alpha": args.alpha, "gamma": 1.0},
        "rollout": {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
                    "temperature": args.temperature, "history_turns": args.history_turns,
                    "max_prompt_tokens": 1536},
        "training": {"lr": args.lr, "micro_batch_size": 8, "warmup_steps": 0, "max_grad_norm": 1.0,
                     "bf16": args.bf16},
        "sft": {"instances": args.sft_instances, "eval_size": args.sft_eval_size, "noise": args.sft_noise,
                "steps": args.sft_steps, "batch_size": args.sft_batch, "lr": args.sft_lr},
        "logging": {"console": False, "report_to": [], "completions_every": 0},
    }


def method_config(args: argparse.Namespace, method: str, seed: int, run_dir: Path, model: str, model_kwargs: dict):
    from accord.config import config_from_dict
    from accord.build import build_task

    algorithm, specialization, _ = METHODS[method]
    data = base_data(args, seed, run_dir, model, model_kwargs)
    data["algorithm"].update(algorithm)
    if specialization == "separate":
        agents = build_task(config_from_dict(data)).agents
        data["specialization"] = "separate"
        data["policies"] = {a: {"model": model, "model_kwargs": model_kwargs} for a in agents}
        data["agents"] = [{"name": a, "policy": a} for a in agents]
    return config_from_dict(data)


# --- the warm start ---------------------------------------------------------------------------------------

def warm_start(args: argparse.Namespace, seed: int, root: Path) -> tuple[Path, dict]:
    """Fine-tune one model on the oracle's demonstrations of both layouts; returns (export dir, summary)."""
    import torch

    from accord.sft import (DemoError, _batches, _policies, collect_demos, encode_demos, mean_nll, sft_step,
                            write_demos)
    from accord.policies import seed_everything

    t0 = time.perf_counter()
    # tiny models: 2048 positions, so that the tool workflow's programs fit
    tiny = {"hidden_size": 64, "num_layers": 2, "max_position_embeddings": 2048}
    kwargs = tiny if args.model.startswith("tiny") else {}
    cfgs = [method_config(args, m, seed, root / f"sft-{m}", args.model, kwargs) for m in ("atgrpo_shared", "grpo")]
    torch.set_num_threads(args.threads)
    seed_everything(seed)
    train, held = [], []
    for cfg in cfgs:   # the two-role layout's demonstrations, then the solver's, on the same puzzles
        tr, ev = collect_demos(cfg)
        train += tr
        held += ev
    ((policy, _),) = _policies(cfgs[0]).values()   # one model with the RL runs' training setup, sft.lr constant
    try:
        data = encode_demos(policy, train, args.max_new_tokens)
        held_data = encode_demos(policy, held, args.max_new_tokens)
    except DemoError as err:   # the bench's flag, not the config key the library names
        raise SystemExit(f"planpath_compare: {err}; here: --max-new-tokens") from err
    micro = cfgs[0].training.micro_batch_size
    nll_before = mean_nll(policy, held_data, micro) if held_data else None
    batches = _batches(len(data), args.sft_batch, seed)
    losses, every = [], max(1, args.sft_steps // 5)
    for step in range(1, args.sft_steps + 1):
        t = time.perf_counter()
        metrics = sft_step(policy, [data[i] for i in next(batches)], micro, cfgs[0].training.max_grad_norm, step)
        losses.append(metrics["loss"])
        if step % every == 0 or step == args.sft_steps:
            LOG.info("seed %d sft step %d/%d: loss %.4f, %.1fs", seed, step, args.sft_steps, metrics["loss"],
                     time.perf_counter() - t)
    nll_after = mean_nll(policy, held_data, micro) if held_data else None
    out = root / f"warm-{seed}"
    policy.export(out)
    write_demos(train, out / "demos.jsonl")
    summary = {"demos": len(train), "noisy": sum(d.noisy for d in train),
               "by_agent": {a: sum(d.agent == a for d in train) for a in sorted({d.agent for d in train})},
               "held_out": len(held), "loss_first": losses[0] if losses else None,
               "loss_last": losses[-1] if losses else None, "held_out_nll_before": nll_before,
               "held_out_nll_after": nll_after, "seconds": round(time.perf_counter() - t0, 1)}
    LOG.info("seed %d warm start: %d demonstrations (%d imperfect), %d steps, held-out NLL %s -> %s, %.0fs", seed,
             summary["demos"], summary["noisy"], args.sft_steps, _fmt(nll_before), _fmt(nll_after),
             summary["seconds"])
    del policy
    gc.collect()
    return out, summary


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


# --- evaluation and training ------------------------------------------------------------------------------

def episodes(trainer, step: int) -> dict[str, dict]:
    """Greedy evaluation on the held-out puzzles: instance id -> {success, return} (one episode each)."""
    from accord.tracking.eval_completions import eval_completions_path

    t = time.perf_counter()
    trainer.evaluate(step=step)
    out = {}
    path = eval_completions_path(trainer.run_dir, step)
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        out[str(row["instance"])] = {"success": float(row["success"]), "return": float(row["reward"])}
    if len(out) != len(trainer.eval_rows):
        raise RuntimeError(f"{path}: {len(out)} episodes for {len(trainer.eval_rows)} held-out puzzles")
    LOG.info("  evaluated %d puzzles in %.0fs: success %.3f, return %.3f", len(out), time.perf_counter() - t,
             sum(e["success"] for e in out.values()) / len(out), sum(e["return"] for e in out.values()) / len(out))
    return out


def run_method(args: argparse.Namespace, method: str, seed: int, root: Path, warm: Path,
               before: dict[str, dict]) -> dict:
    """Train ``method`` from ``warm`` to the budget; evaluates the layout's "before" first if not done yet."""
    from accord.trainer import Trainer

    layout = METHODS[method][2]
    trainer = Trainer(method_config(args, method, seed, root / f"{method}-{seed}", str(warm), {}))
    if layout not in before:
        LOG.info("seed %d: before-evaluation of the %s layout", seed, layout)
        before[layout] = episodes(trainer, 0)
    tokens, steps, rewards, flat = 0, 0, [], []
    t_train = time.perf_counter()
    while tokens < args.budget:
        metrics, _ = trainer.train_step(steps)
        tokens += int(metrics["perf/gen_tokens"])
        rewards.append(metrics["team/reward"])
        flat.append(metrics["adv/zero_std_frac"])
        steps += 1
        LOG.info("seed %d %s step %d: %d/%d tokens, team reward %.3f, flat groups %.2f, %.1fs", seed, method, steps,
                 tokens, args.budget, metrics["team/reward"], metrics["adv/zero_std_frac"], metrics["time/step"])
    train_s = time.perf_counter() - t_train
    t_eval = time.perf_counter()
    after = episodes(trainer, steps)
    eval_s = time.perf_counter() - t_eval
    trainer.close()
    del trainer
    gc.collect()
    if set(after) != set(before[layout]):
        raise RuntimeError(f"{method} seed {seed}: the held-out puzzles after training differ from those before")
    return {"method": method, "seed": seed, "layout": layout, "steps": steps, "train_tokens": tokens,
            "train_s": round(train_s, 1), "eval_s": round(eval_s, 1), "train_reward_first": rewards[0],
            "train_reward_last": rewards[-1], "flat_group_frac": round(sum(flat) / len(flat), 3),
            "before": before[layout], "after": after}


def summarise(runs: list[dict], methods: list[str]) -> dict[str, dict]:
    """Per method: pooled success and return before/after with 95 % intervals, paired differences, per-seed values."""
    out = {}
    for method in methods:
        rs = [r for r in runs if r["method"] == method]
        keys = [(r, k) for r in rs for k in sorted(r["before"])]
        sb = [r["before"][k]["success"] for r, k in keys]
        sa = [r["after"][k]["success"] for r, k in keys]
        rb = [r["before"][k]["return"] for r, k in keys]
        ra = [r["after"][k]["return"] for r, k in keys]
        per_seed = [{"seed": r["seed"], "steps": r["steps"], "train_tokens": r["train_tokens"],
                     "train_s": r["train_s"], "flat_group_frac": r["flat_group_frac"],
                     "success_before": _mean([e["success"] for e in r["before"].values()]),
                     "success_after": _mean([e["success"] for e in r["after"].values()]),
                     "return_before": _mean([e["return"] for e in r["before"].values()]),
                     "return_after": _mean([e["return"] for e in r["after"].values()])} for r in rs]
        out[method] = {
            "layout": rs[0]["layout"], "seeds": len(rs), "episodes": len(keys),
            "steps": _mean([r["steps"] for r in rs]), "train_tokens": _mean([r["train_tokens"] for r in rs]),
            "train_s": _mean([r["train_s"] for r in rs]), "flat_group_frac": _mean([r["flat_group_frac"] for r in rs]),
            "success_before": proportion(sb), "success_after": proportion(sa),
            "return_before": average(rb), "return_after": average(ra),
            "success_change": average([a - b for a, b in zip(sa, sb)]),
            "return_change": average([a - b for a, b in zip(ra, rb)]),
            "per_seed": per_seed,
        }
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _ci(s: dict, digits: int = 2) -> str:
    return f"{s['mean']:.{digits}f} [{s['low']:.{digits}f}, {s['high']:.{digits}f}]"


def table(summary: dict[str, dict]) -> str:
    head = (f"{'method':14s} {'steps':>5s} {'tokens':>6s} {'train s':>7s} {'flat':>4s}  {'success before':>18s}  "
            f"{'success after':>18s}  {'change':>19s}  {'return before':>21s}  {'return after':>21s}  {'change':>21s}")
    lines = [head]
    for m, s in summary.items():
        lines.append(f"{m:14s} {s['steps']:5.1f} {s['train_tokens']:6.0f} {s['train_s']:7.0f} "
                     f"{s['flat_group_frac']:4.2f}  "
                     f"{_ci(s['success_before']):>18s}  {_ci(s['success_after']):>18s}  "
                     f"{_ci(s['success_change']):>19s}  {_ci(s['return_before']):>21s}  "
                     f"{_ci(s['return_after']):>21s}  {_ci(s['return_change']):>21s}")
    lines.append("")
    lines.append("per seed (success before -> after, return before -> after, steps):")
    for m, s in summary.items():
        cells = [f"seed {p['seed']}: {p['success_before']:.2f}->{p['success_after']:.2f}, "
                 f"{p['return_before']:.2f}->{p['return_after']:.2f}, {p['steps']}" for p in s["per_seed"]]
        lines.append(f"  {m:14s} " + " | ".join(cells))
    return "\n".join(lines)


def plot(summary: dict[str, dict], path: Path, title: str) -> None:
    """Two panels (success rate, mean team return), before and after per method, with 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(summary)
    xs = range(len(methods))
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.6 * len(methods), 4.2))
    for ax, key, label in ((axes[0], "success", "held-out success rate (Wilson 95 %)"),
                           (axes[1], "return", "held-out mean team return (t 95 %)")):
        for offset, when, color in ((-0.17, "before", "#9aa5b1"), (0.17, "after", "#1f77b4")):
            stats = [summary[m][f"{key}_{when}"] for m in methods]
            means = [s["mean"] for s in stats]
            err = [[s["mean"] - s["low"] for s in stats], [s["high"] - s["mean"] for s in stats]]
            ax.bar([x + offset for x in xs], means, width=0.34, color=color, label=when, yerr=err, capsize=3)
        ax.set_xticks(list(xs), methods, rotation=20)
        ax.set_title(label, fontsize=10)
        ax.axhline(0, color="black", linewidth=0.6)
        if key == "success":
            ax.set_ylim(0, 1.05)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="base model of the warm start")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget", type=int, default=1000, help="generated training tokens per method and seed")
    p.add_argument("--workflow", default="direct", choices=["direct", "tool_planner"],
                   help="Plan-Path roles (see the module docstring for why direct is the default)")
    p.add_argument("--size", type=int, default=4, help="Plan-Path grid size (the smallest setting)")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default 48 (direct) or 320 (tool_planner): the oracle's answers must fit")
    p.add_argument("--alpha", type=float, default=1.0, help="AT-GRPO team weight (independent: 0 by definition)")
    p.add_argument("--temperature", type=float, default=1.0, help="training sampling temperature")
    p.add_argument("--history-turns", type=int, default=0,
                   help="earlier exchanges kept in prompts (0: the observation already holds the whole state)")
    p.add_argument("--lr", type=float, default=2e-5)
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
    p.add_argument("--work-dir", type=Path, help="keep warm starts and runs here (default: a temporary directory)")
    p.add_argument("--plot", type=Path, default=REPO / ".bench" / "planpath_compare.png")
    p.add_argument("--json", type=Path)
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                   help="run nothing: summarise the --json outputs of earlier runs of one setting (for example "
                   "one per seed, run at different times) as one comparison; --plot and --json as usual")
    args = p.parse_args()
    if args.merge:
        return merge(args.merge, args.plot, args.json, p.error)
    if args.max_new_tokens is None:
        args.max_new_tokens = 320 if args.workflow == "tool_planner" else 48
    if args.budget < 1 or args.eval_size < 1 or args.sft_steps < 0:
        p.error("--budget and --eval-size must be >= 1, --sft-steps >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", force=True)
    t0 = time.perf_counter()
    runs, warm_starts = [], {}
    with tempfile.TemporaryDirectory(prefix="planpath_cmp_") as tmp:
        root = args.work_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            warm, warm_starts[seed] = warm_start(args, seed, root)
            before: dict[str, dict] = {}
            for method in args.methods:
                runs.append(run_method(args, method, seed, root, warm, before))
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "merge"}
    report(config, runs, warm_starts, round(time.perf_counter() - t0, 1), args.plot, args.json)
    return 0


def report(config: dict, runs: list[dict], warm_starts: dict, total_s: float, plot_path: Path,
           json_path: Path | None) -> dict:
    """Print the table, draw the plot, write and print the JSON of one comparison."""
    summary = summarise(runs, config["methods"])
    print(table(summary))
    title = (f"Plan-Path {config['size']}x{config['size']}, {config['workflow']}, {config['model']}, seeds "
             f"{config['seeds']}, {config['eval_size']} puzzles/seed, budget {config['budget']} tokens, warm start "
             f"{config['sft_steps']} steps")
    plot(summary, plot_path, title)
    print(f"plot: {plot_path}; total {total_s:.0f}s")
    out = {"config": config, "total_s": total_s, "warm_starts": warm_starts, "summary": summary, "runs": runs}
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return out


# settings that may differ between runs that are merged: where they ran and wrote, and their seeds
_MERGE_FREE = {"seeds", "json", "plot", "work_dir", "threads"}


def merge(paths: list[Path], plot_path: Path, json_path: Path | None, error) -> int:
    """One comparison from the JSON outputs of several runs of one setting (``--merge``)."""
    runs, warm_starts, seeds, total_s = [], {}, [], 0.0
    first: tuple[Path, dict] | None = None
    for path in paths:
        try:
            data = json.loads(path.read_text())
            config, these, their_seeds = data["config"], data["runs"], list(data["config"]["seeds"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            error(f"--merge {path}: not a --json output of this script ({exc}); give the files its --json wrote")
        if first is None:
            first = (path, config)
        for key in sorted((set(config) | set(first[1])) - _MERGE_FREE):
            if config.get(key) != first[1].get(key):
                error(f"--merge {path}: {key}={config.get(key)!r}, but {first[0]} has {first[1].get(key)!r}; "
                      "merge only runs of one setting (they may differ in --seeds)")
        again = sorted(set(their_seeds) & set(seeds))
        if again:
            error(f"--merge {path}: seed(s) {again} are already in an earlier file; give each seed once")
        seeds += their_seeds
        runs += these
        warm_starts.update(data.get("warm_starts", {}))
        total_s += data.get("total_s", 0.0)
    # where the merge wrote; the runs' own threads and work dirs may differ, so they are not kept
    config = {k: v for k, v in first[1].items() if k not in _MERGE_FREE}
    config.update(seeds=seeds, plot=str(plot_path), json=None if json_path is None else str(json_path),
                  merged_from=[str(p) for p in paths])
    report(config, runs, warm_starts, round(total_s, 1), plot_path, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
