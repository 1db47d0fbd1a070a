#!/usr/bin/env python
"""Generation of the writing job's step: accord's decoding loop against its code before issue 25, Hugging
Face ``generate`` and (where installed) vLLM, side by side, with tokens per second and the fraction of
this machine's bound.

    python bench/generation_speed.py                         # SmolLM2-135M, the writing job's first step
    python bench/generation_speed.py --model tiny-qwen2      # the tiny test model on the same texts
    python bench/generation_speed.py --rounds 3 --json /tmp/gen.json
    python bench/generation_speed.py --profile new           # where one call's time goes (torch profiler)
    python bench/generation_speed.py --machine               # only this machine's fp32 GEMM rate and bandwidth
    python bench/generation_speed.py --kernels 1 12 24 48    # one decoding step's products alone, per row count
    python bench/generation_speed.py --paths new old --set rollout.top_p=0.9   # the job with a nucleus
    python bench/generation_speed.py --policies 2 --paths new old              # the default job's two policies
    python bench/generation_speed.py --policies 2 --paths new onednn old       # with the products on oneDNN too

The workload is the generate call of the first step of the writing job with one model for both agents (the
default job with ``specialization=shared task.eval_size=12 rollout.batch_size=3``, as measured for issue 25;
the default job's separate models each made half of it when it trained on 3 texts a step): the first 3 training texts, each prompted to its 2 agents and sampled
K=4 times (24 rows from 6 distinct prompts), ``rollout.max_new_tokens`` new tokens at ``rollout.temperature`` (and its
top-k / top-p), from one seeded random stream. ``--model`` swaps the policy's model (``policies.main.model``).
``--policies 2``: the default job's two policies instead of one model, each writing its agent's half of the rows from
a stream of its own, copies of the model that train their last ``policies.main.trainable_layers`` layers (the second's
moved by a seeded noise, the layers below equal): ``new`` decodes them in one ``generate_together`` call, as the
rollout does, and so does ``old`` where its tree has that function (``--old-ref`` of a tree since issue 25's
shared layers); ``hf`` and an older tree call each policy in turn.

Each path runs in its own worker process, all started before the first round and fed the same token ids;
the rounds alternate between the paths, so that the load of a shared machine falls on all of them alike. Each
worker applies the job's ``run.retain_freed_memory`` (on by default, as ``accord train`` does: large blocks from
the heap, freed memory kept for reuse; ``--set run.retain_freed_memory=false`` measures glibc's default), the
older tree's worker too:

- ``new``: :func:`accord.generation.generate` of this tree;
- ``onednn``: the same with accord's compiled CPU kernel turned off (``ACCORD_CPU_GEMM=0``), so that the
  products run on oneDNN's prepacked weights (where the kernel applies; elsewhere it is ``new``);
- ``old``: the same function of the tree before issue 25 (``--old-ref``, default ``7f2afbf``), extracted
  with ``git archive`` into a temporary folder and put first on the worker's ``PYTHONPATH``;
- ``hf``: this tree's :func:`accord.generation.generate` with accord's loop switched off, so that
  ``model.generate`` decodes, with accord's sampler as its only logits processor (same distribution and
  random stream);
- ``vllm``: accord's vLLM generator (:mod:`accord.generation.vllm_backend`) on the same prompts and
  settings, when ``vllm`` is importable; otherwise the path is skipped with a line saying so.

The bound is the least time this machine needs for the work the call must do: the prefill of each
distinct prompt once (a prefix that several prompts share once: each node of the prompts' token trie), and for
each decoding step the products of the rows still generating (a row stops
at its EOS) against every weight, and their attention over their prompt and tokens so far. A step takes
at least max(FLOP / GEMM rate, bytes / bandwidth), where the bytes are every weight once and each distinct
prompt's keys and values once plus each row's own; the prefill is counted at the GEMM rate. The GEMM rate
is fp32 ``2048 x 2048`` matrix products with the same threads, the bandwidth a sum over 512 MiB, both
best-of-5, measured before the rounds (``--gemm-gflops`` / ``--read-gbs`` replace them: a machine shared with
other jobs measures less than it has). ``fraction of bound`` = bound / the path's best time. ``faults``: the fewest
minor page faults of one call over the rounds (memory the process touched for the first time: its heap still
growing in the first calls, or freed memory handed back to the system).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_REF = "7f2afbf"  # accord before issue 25 (the decoding loop this benchmark compares against)
PATHS = ("new", "onednn", "old", "hf", "vllm")


# --- the workload ---------------------------------------------------------------------------------
def default_job_requests(model: str, overrides: list[str] | None = None) -> dict:
    """Token ids and sampling settings of the first step's generate call of ``accord train`` (no config),
    with ``policies.main.model`` set to ``model`` and the config ``overrides`` (``KEY=VALUE``) applied;
    ``trainable_layers``: the job's ``policies.main.trainable_layers`` (the ``--policies 2`` workload's)."""
    import random
    from types import SimpleNamespace

    from accord.build import build_env, check_run, split_data
    from accord.config import load_config
    from accord.models import load_model_and_tokenizer
    from accord.policies.model import ModelPolicy
    from accord.seeding import epoch_order_seed, policy_seed, sampling_stream_seed

    overrides = list(overrides or [])
    # issue 25's workload: 3 texts (the default job's batch then; it trains on 2 now), unless --set says otherwise
    texts = [] if any(o.split("=", 1)[0].strip() == "rollout.batch_size" for o in overrides) else [
        "rollout.batch_size=3"]
    cfg = load_config(None, [f"policies.main.model={model}", f"run.run_dir={tempfile.mkdtemp()}",
                             "specialization=shared", "task.eval_size=12", *texts, *overrides])
    env = build_env(cfg)
    check_run(cfg, env)
    train_rows, _ = split_data(cfg, env)
    perm = list(range(len(train_rows)))  # the trainer's order of step 0 (Trainer.batch_rows)
    random.Random(epoch_order_seed(cfg.run.seed, 0)).shuffle(perm)
    rows = [train_rows[perm[i]] for i in range(cfg.rollout.batch_size)]
    _, tokenizer = load_model_and_tokenizer(model)
    r, k = cfg.rollout, cfg.algorithm.num_generations
    # ModelPolicy.encode_chat without loading a second model: it reads only these attributes
    policy = SimpleNamespace(tokenizer=tokenizer, rollout=r, name="main", context_len=None)
    prompts = []
    for agent in cfg.agents:  # the rollout's order: agent, text, sample (accord.rollout.magrpo)
        for row in rows:
            prompts += [ModelPolicy.encode_chat(policy, env.prompt(agent.name, row))] * k
    return {"model": model, "prompts": prompts, "max_new_tokens": r.max_new_tokens, "temperature": r.temperature,
            "top_k": r.top_k, "top_p": r.top_p, "seed": sampling_stream_seed(policy_seed(cfg.run.seed, 0)),
            "trainable_layers": cfg.policies["main"].trainable_layers,
            "retain_freed_memory": cfg.run.retain_freed_memory}


# --- this machine ---------------------------------------------------------------------------------
def machine_rates(threads: int) -> dict[str, float]:
    """fp32 GEMM GFLOP/s (2048^3, best of 5) and memory read GB/s (sum over 512 MiB, best of 5)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    x = torch.randn(512 * 2**20 // 4)
    gemm, read = float("inf"), float("inf")
    a @ b
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        gemm = min(gemm, time.perf_counter() - t)
        t = time.perf_counter()
        x.sum()
        read = min(read, time.perf_counter() - t)
    return {"gemm_gflops": 2 * 2048**3 / gemm / 1e9, "read_gbs": x.numel() * 4 / read / 1e9}


def prompt_trie_positions(prompts: list[list[int]]) -> list[int]:
    """The position of each node of the token trie of ``prompts``: every distinct prefix once."""
    root: dict = {}
    positions = []
    for prompt in prompts:
        node = root
        for i, token in enumerate(prompt):
            if token not in node:
                node[token] = {}
                positions.append(i)
            node = node[token]
    return positions


def bound_seconds(config, prompts: list[list[int]], lengths: list[int], rates: dict[str, float],
                  own_layers: int = 0) -> dict[str, float]:
    """Least time for a generate call that produced completions of ``lengths`` tokens from ``prompts``
    (see the module docstring): FLOP at the GEMM rate, bytes at the read bandwidth, per decoding step the
    larger of the two. ``own_layers``: the last layers that a second policy holds apart (``--policies 2``):
    each decoding step reads their weights twice, the rest of the work is the same."""
    layers, hidden = config.num_hidden_layers, config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    q, kv = heads * head_dim, getattr(config, "num_key_value_heads", heads) * head_dim
    inter, vocab = config.intermediate_size, config.vocab_size
    body = layers * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter)  # multiply-adds per token
    head = vocab * hidden
    again = own_layers * body // layers  # weights read a second time per decoding step
    peak, bandwidth = rates["gemm_gflops"] * 1e9, rates["read_gbs"] * 1e9
    distinct: dict[tuple, int] = {}
    row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    prompt_len = [0] * len(distinct)
    for p, u in zip(prompts, row_prompt):
        prompt_len[u] = len(p)
    # the prefill: each position of the prompts' trie once (a prefix several prompts share is computed once),
    # its products and its attention over the positions before it, and the head at each prompt's last token
    positions = prompt_trie_positions([list(p) for p in distinct])
    prefill_flop = sum(2 * body + 4 * layers * q * (i + 1) for i in positions) + 2 * head * len(distinct)
    prefill = max(prefill_flop / peak, 4 * (body + head + again) / bandwidth)
    decode, decode_flop = 0.0, 0
    for s in range(1, max(lengths)):
        active = [r for r, n in enumerate(lengths) if n > s]
        context = sum(prompt_len[row_prompt[r]] + s for r in active)
        flop = len(active) * 2 * (body + head) + 4 * layers * q * context
        prompts_live = {row_prompt[r] for r in active}
        kv_bytes = 4 * layers * 2 * kv * (sum(prompt_len[u] for u in prompts_live) + s * len(active))
        decode += max(flop / peak, (4 * (body + head + again) + kv_bytes) / bandwidth)
        decode_flop += flop
    return {"bound_s": prefill + decode, "prefill_bound_s": prefill, "decode_bound_s": decode,
            "prefill_tflop": prefill_flop / 1e12, "decode_tflop": decode_flop / 1e12}


def kernel_floor(model_spec: str, rows_list: list[int], threads: int, rates: dict[str, float],
                 repeats: int = 5) -> list[dict]:
    """One decoding step's products as the decoding loop runs them (:class:`accord.generation.fast_decode.DecodeStep`'s
    projections of every layer and the output head, each weight read once per step as in a real step), timed
    alone at each row count (best of ``repeats``), against the machine's bound for the same products:
    max(FLOP / GEMM rate, weight bytes / read bandwidth), and the sum of the two (the time of a kernel that
    does not overlap its reads with its arithmetic); ``rates`` as :func:`machine_rates` gives them."""
    import torch

    from accord.generation.fast_decode import DecodeStep
    from accord.models import load_model_and_tokenizer

    torch.set_num_threads(threads)
    model = load_model_and_tokenizer(model_spec)[0]
    out = []
    with torch.no_grad():
        for rows in rows_list:
            step = DecodeStep.build(model, 8, rows=rows)
            if step is None:
                raise SystemExit(f"{model_spec}: the direct decoding step does not apply to this model")
            c = model.config
            hidden, q = c.hidden_size, step.heads * step.head_dim
            kv = step.kv_heads * step.head_dim
            # (projection, input width, output width, the elementwise step the loop fuses into it) in a step's
            # order: q/k/v, o (+ residual), gate (SiLU), up (x gate), down (+ residual); then the output head
            parts = [(layer[i], width, n, post) for layer in step.layers for i, width, n, post in
                     ((1, hidden, q + 2 * kv, "none"), (3, q, hidden, "add"), (5, hidden, c.intermediate_size, "swish"),
                      (6, hidden, c.intermediate_size, "mul"), (7, c.intermediate_size, hidden, "add"))]
            parts.append((step.head, hidden, c.vocab_size, "none"))
            calls = [(proj, torch.randn(rows, width), post, None if post in ("none", "swish") else torch.randn(rows, n))
                     for proj, width, n, post in parts]
            weights = sum(width * n for _, width, n, _ in parts)
            flop = 2 * rows * weights
            best = float("inf")
            for _ in range(repeats + 1):  # the first pass warms oneDNN's primitive cache
                t = time.perf_counter()
                for proj, x, post, other in calls:
                    proj(x, post, other)
                best = min(best, time.perf_counter() - t)
            compute, read = flop / (rates["gemm_gflops"] * 1e9), 4 * weights / (rates["read_gbs"] * 1e9)
            out.append({"rows": rows, "products_ms": 1e3 * best, "bound_ms": 1e3 * max(compute, read),
                        "sum_ms": 1e3 * (compute + read), "compute_ms": 1e3 * compute, "read_ms": 1e3 * read,
                        "gflops": flop / best / 1e9, "weights_gb": 4 * weights / 1e9, **rates})
            del step, calls
    return out


# --- workers --------------------------------------------------------------------------------------
def old_tree(ref: str) -> Path:
    """The ``accord`` package of git ``ref``, extracted into a temporary folder (its parent is returned)."""
    folder = Path(tempfile.mkdtemp(prefix="accord-old-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "accord"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


class Worker:
    """One path in its own process: loads the model once, then runs the generate call on request."""

    def __init__(self, path: str, work: Path, threads: int, old: Path | None):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
        env.pop("PYTHONPATH", None)
        if path == "old":
            env["PYTHONPATH"] = str(old)  # ahead of the installed (editable) accord of this tree
        if path == "onednn":
            env["ACCORD_CPU_GEMM"] = "0"  # this tree with its products on oneDNN's prepacked weights
        self.path = path
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", path, "--work", str(work),
                                      "--threads", str(threads)], cwd=tempfile.gettempdir(), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.path!r} exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, op: str, **fields) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """Let the worker exit; one still freeing a profiler's trace after 60 s is killed (its answers are in)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def second_policy(model, layers: int) -> list[str]:
    """Make ``model`` the ``--policies 2`` workload's second policy: the weights of its last ``layers`` decoder
    layers and final norm (what ``trainable_layers`` trains) moved by a seeded 1 % noise, as after training, the
    layers below left equal to the first policy's. The same ops in every worker, so all paths decode the same
    weights. Returns the names of the moved parameters."""
    import torch

    total = model.config.num_hidden_layers
    upper = tuple(f"model.layers.{i}." for i in range(total - layers, total)) + ("model.norm.",)
    noise = torch.Generator().manual_seed(1)
    moved = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(upper):
                param.mul_(1 + 0.01 * torch.randn(param.shape, generator=noise))
                moved.append(name)
    return moved


def retain_freed_memory() -> bool:
    """The allocator setting ``accord train`` applies under ``run.retain_freed_memory`` (on by default), taken from
    this tree's :mod:`accord.allocator` file so that every path's process, an older tree's too, runs under it."""
    spec = importlib.util.spec_from_file_location("accord_allocator_of_this_tree", REPO / "accord" / "allocator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.retain_freed_memory()


def worker_main(path: str, work: Path, threads: int) -> None:
    """Serve ``run`` / ``profile`` requests on stdin for one path; answers are JSON lines on stdout."""
    job = json.loads(work.read_text())
    retained = job["retain_freed_memory"] and retain_freed_memory()
    import torch

    torch.set_num_threads(threads)
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter stays off the answer channel
    import accord
    import accord.generation.hf as hf
    from accord.models import load_model_and_tokenizer

    policies = job.get("policies", 1)
    models, tokenizer = [], None
    # the policies' shared layers decoded as one batch, where the tree can (an old tree before them cannot)
    together = policies > 1 and path in ("new", "onednn", "old") and hasattr(hf, "generate_together")
    for i in range(policies):
        model, tokenizer = load_model_and_tokenizer(job["model"])
        if policies > 1:
            layers = job["trainable_layers"]
            if path != "old" or together:  # freeze what lies below, as the job's policies do
                from accord.policies.learner import train_last_layers

                train_last_layers(model, layers)
            if i == 1:
                moved = second_policy(model, layers)
                if (path != "old" or together) and set(moved) != {
                        n for n, p in model.named_parameters() if p.requires_grad}:
                    raise SystemExit("the noised parameters are not the ones trainable_layers trains")
        model.eval()
        models.append(model)
    model = models[0]
    share = len(job["prompts"]) // policies  # the rollout's order: the first agent's rows, then the second's
    parts = [job["prompts"][i * share:(i + 1) * share] for i in range(policies)]
    kwargs = dict(max_new_tokens=job["max_new_tokens"], temperature=job["temperature"], top_k=job["top_k"],
                  top_p=job["top_p"])
    trunk = 0
    if path == "hf":
        hf.supports_own_loop = lambda m: False
    if together:
        from accord.generation.fast_decode import shared_trunk

        trunk = shared_trunk(models)
        if not trunk:
            raise SystemExit("--policies 2: the two policies share no frozen layers")
    if path == "vllm":
        if policies > 1:   # compare() leaves the path out; a worker asked for it directly
            raise SystemExit("--policies 2 has no vllm path (one engine per model); use --paths new old hf")
        from accord.generation.vllm_backend import VLLMGenerator

        engine = VLLMGenerator(model, tokenizer, name="main", seed=0, gpu_memory_utilization=0.5,
                               llm_kwargs={"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30})

        def call():
            return engine.generate(model, job["prompts"], greedy=False, name="main",
                                   generator=torch.Generator().manual_seed(job["seed"]), **kwargs)
    elif trunk:  # the policies' shared layers decoded as one batch, as the rollout's generate_by_policy runs them
        def call():
            jobs = [hf.DecodeJob(m, tokenizer, ps, False, torch.Generator().manual_seed(job["seed"] + i), str(i),
                                 kwargs) for i, (m, ps) in enumerate(zip(models, parts))]
            return [g for gens in hf.generate_together(jobs, trunk) for g in gens]
    else:  # one call per policy, each from its own stream
        def call():
            return [g for i, (m, ps) in enumerate(zip(models, parts))
                    for g in hf.generate(m, tokenizer, ps, generator=torch.Generator().manual_seed(job["seed"] + i),
                                         batch_size=len(ps), **kwargs)]

    def answer(data: dict) -> None:
        out.write(json.dumps(data) + "\n")
        out.flush()

    answer({"accord": accord.__file__, "retained": retained})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "profile":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                t = time.perf_counter()
                gens = call()
                seconds = time.perf_counter() - t
            table = prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total",
                                                                       row_limit=request["rows"])
            answer({"seconds": seconds, "shares": profile_shares(prof, len(job["prompts"]), model.config, seconds),
                    "table": table})
            continue
        t, c, faults = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        gens = call()
        answer({"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
                "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                "ids": [g.ids for g in gens], "logprobs": [g.logprobs for g in gens]})


def profile_shares(prof, rows: int, config, seconds: float) -> dict[str, float]:
    """Seconds of the profiled call by kind of work, from the operators' own (self) times; the rest of the
    wall time is Python and dispatch between operators."""
    vocab = config.vocab_size
    shares: dict[str, float] = {}
    for event in prof.key_averages(group_by_input_shape=True):
        name, shapes = event.key, event.input_shapes or []
        first = shapes[0] if shapes and shapes[0] else []
        second = shapes[1] if len(shapes) > 1 and shapes[1] else []
        gemm = re.fullmatch(r"accord::gemm \[(\d+), \d+\] -> (\d+)", name)   # accord's CPU kernel
        if gemm or name in ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"):
            m = first[0] if first else 0
            n = (second[0] if name == "mkldnn::_linear_pointwise" else second[-1]) if second else 0
            if name == "aten::addmm":  # addmm(bias, x, w)
                m = second[0] if second else 0
                n = shapes[2][-1] if len(shapes) > 2 and shapes[2] else 0
            if gemm:
                m, n = int(gemm[1]), int(gemm[2])
            kind = ("prefill products" if m > rows else "output head (decoding)" if n == vocab
                    else "projections (decoding)")
        elif name in ("mkldnn::_reorder_linear_weight", "accord::pack"):
            kind = "weight layout (oneDNN or accord's kernel)"
        elif "attention" in name or name.startswith("accord::attend") or name in (
                "aten::bmm", "aten::baddbmm", "aten::_softmax") and (not first or first[-1] != vocab):
            kind = "attention"
        elif first and first[-1] == vocab or name in ("aten::searchsorted", "aten::cumsum_", "aten::cumsum"):
            kind = "sampling (full-vocabulary passes)"
        elif name in ("aten::index_select", "aten::index", "aten::cat", "aten::_index_put_impl_", "aten::index_copy_"):
            kind = "cache and row copies"
        else:
            kind = "other operators (norms, rotary, activations, small copies)"
        shares[kind] = shares.get(kind, 0.0) + event.self_cpu_time_total / 1e6
    shares["Python and dispatch between operators"] = max(0.0, seconds - sum(shares.values()))
    return shares


# --- the comparison -------------------------------------------------------------------------------
def workload(args) -> dict:
    """The job's requests, with ``--policies``."""
    job = default_job_requests(args.model, args.set)
    job["policies"] = args.policies
    if args.policies > 1 and job["trainable_layers"] is None:
        raise SystemExit("--policies 2 needs policies.main.trainable_layers (the layers each policy trains; the "
                         "rest they share): set it with --set policies.main.trainable_layers=N")
    return job


def compare(args) -> dict:
    import torch
    from accord.models import load_model_and_tokenizer

    job = workload(args)
    work = Path(tempfile.mkdtemp(prefix="accord-genbench-")) / "job.json"
    work.write_text(json.dumps(job))
    paths = [p for p in args.paths if p != "vllm" or importlib.util.find_spec("vllm") is not None]
    if "vllm" in args.paths and "vllm" not in paths:
        print("vllm: not installed here (pip install 'accord[vllm]'); skipped")
    elif "vllm" in paths and args.policies > 1:
        paths.remove("vllm")
        print("vllm: no --policies 2 path (one engine per model); skipped")
    old = old_tree(args.old_ref) if "old" in paths else None
    workers = {p: Worker(p, work, args.threads, old) for p in paths}
    try:
        for p, w in workers.items():
            print(f"{p}: accord from {w.ready['accord']}; freed memory retained (run.retain_freed_memory): "
                  f"{w.ready['retained']}")
        rates = machine_rates(args.threads)
        measured = dict(rates)
        if args.gemm_gflops:
            rates["gemm_gflops"] = args.gemm_gflops
        if args.read_gbs:
            rates["read_gbs"] = args.read_gbs
        torch.set_num_threads(args.threads)
        load = os.getloadavg()
        times: dict[str, list[float]] = {p: [] for p in paths}
        cpu: dict[str, list[float]] = {p: [] for p in paths}
        faults: dict[str, list[int]] = {p: [] for p in paths}
        outs = {}
        for r in range(args.rounds):
            for p in (paths if r % 2 == 0 else paths[::-1]):
                res = workers[p].ask("run")
                times[p].append(res["seconds"])
                cpu[p].append(res["cpu_seconds"])
                faults[p].append(res["minor_faults"])
                outs[p] = res
        load = (load, os.getloadavg())
    finally:
        for w in workers.values():
            w.close()
    config = load_model_and_tokenizer(args.model)[0].config
    distinct = len({tuple(p) for p in job["prompts"]})
    own = job["trainable_layers"] if args.policies > 1 else 0
    if own:
        print(f"2 policies, {len(job['prompts']) // 2} rows each, copies of the model whose last {own} layers (and "
              f"final norm) differ; new (and old from a tree that can) decodes their shared layers together, hf "
              f"calls each policy in turn")
    print(f"{args.model}: {len(job['prompts'])} rows ({distinct} distinct prompts of "
          f"{min(map(len, job['prompts']))}-{max(map(len, job['prompts']))} tokens), up to {job['max_new_tokens']} new "
          f"tokens, temperature {job['temperature']}, top-k {job['top_k']}, top-p {job['top_p']}; {args.threads} "
          f"threads, {args.rounds} rounds; load average {load[0][0]:.1f} before, {load[1][0]:.1f} after")
    print(f"machine: fp32 GEMM {measured['gemm_gflops']:.0f} GFLOP/s, memory read {measured['read_gbs']:.1f} GB/s "
          f"measured; the bound uses {rates['gemm_gflops']:.0f} GFLOP/s and {rates['read_gbs']:.1f} GB/s")
    results = {}
    ref = outs.get("old")
    header = (f"{'path':6} {'best s':>7} {'median s':>8} {'cpu s':>6} {'tokens':>6} {'tokens/s':>8} {'bound s':>7} "
              f"{'of bound':>8} {'vs old':>7} {'same rows as old':>16} {'max logp gap':>12} {'faults':>7}")
    print(header)
    for p in paths:
        lengths = [len(ids) for ids in outs[p]["ids"]]
        bound = bound_seconds(config, job["prompts"], lengths, rates, own)
        best = min(times[p])
        row = {"best_s": best, "median_s": statistics.median(times[p]), "times_s": times[p], "cpu_s": min(cpu[p]),
               "minor_faults": faults[p], "tokens": sum(lengths), "tokens_per_s": sum(lengths) / best,
               "lengths": lengths, **bound, "fraction_of_bound": bound["bound_s"] / best}
        if ref is not None:
            row["speedup_vs_old"] = min(times["old"]) / best
            row["same_rows_as_old"] = sum(a == b for a, b in zip(outs[p]["ids"], ref["ids"]))
            row["max_logprob_gap"] = max((abs(u - v) for a, b, la, lb in zip(outs[p]["ids"], ref["ids"],
                                                                           outs[p]["logprobs"], ref["logprobs"])
                                          if a == b for u, v in zip(la, lb)), default=0.0)
        results[p] = row
        vs = f"{row['speedup_vs_old']:6.2f}x" if ref is not None else ""
        same = f"{row['same_rows_as_old']}/{len(lengths)}" if ref is not None else ""
        gap = f"{row['max_logprob_gap']:.1e}" if ref is not None else ""
        print(f"{p:6} {best:7.2f} {row['median_s']:8.2f} {row['cpu_s']:6.2f} {row['tokens']:6d} "
              f"{row['tokens_per_s']:8.1f} {bound['bound_s']:7.2f} {row['fraction_of_bound']:8.2f} {vs:>7} {same:>16} "
              f"{gap:>12} {min(faults[p]):7d}")
    b = results[paths[0]]
    print(f"bound: prefill {b['prefill_tflop']:.3f} TFLOP ({b['prefill_bound_s']:.2f} s), decoding "
          f"{b['decode_tflop']:.3f} TFLOP ({b['decode_bound_s']:.2f} s) for the {paths[0]} path's completions")
    for p in paths:
        if p != "hf" and "hf" in results:
            print(f"{p} against Hugging Face generate: {min(times['hf']) / min(times[p]):.2f}x")
    if "new" in results and "onednn" in results:
        print(f"new (accord's CPU kernel where it applies) against onednn: "
              f"{min(times['onednn']) / min(times['new']):.2f}x best, "
              f"{results['onednn']['median_s'] / results['new']['median_s']:.2f}x median")
    return {"config": vars(args), "job": {k: v for k, v in job.items() if k != "prompts"},
            "prompt_lengths": [len(p) for p in job["prompts"]], "machine": measured, "bound_rates": rates, "load": load,
            "results": results}


def profile_path(args) -> None:
    """One profiled generate call of a path: seconds by kind of work, then the operator table."""
    job = workload(args)
    work = Path(tempfile.mkdtemp(prefix="accord-genbench-")) / "job.json"
    work.write_text(json.dumps(job))
    old = old_tree(args.old_ref) if args.profile == "old" else None
    worker = Worker(args.profile, work, args.threads, old)
    try:
        worker.ask("run")  # warm-up
        res = worker.ask("profile", rows=args.profile_rows)
    finally:
        worker.close()
    print(f"{args.profile} ({worker.ready['accord']}; freed memory retained: {worker.ready['retained']}), "
          f"{args.model}, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.1f}: {res['seconds']:.2f} s under the profiler")
    for kind, s in sorted(res["shares"].items(), key=lambda kv: -kv[1]):
        print(f"  {kind:58} {s:7.2f} s {100 * s / res['seconds']:5.1f} %")
    print(res["table"])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="accord model spec (smollm2-135m, tiny-qwen2, a path)")
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS, help="paths to compare")
    p.add_argument("--old-ref", default=OLD_REF, help="git ref of the code to compare against (the 'old' path)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="calls per path, alternating between the paths")
    p.add_argument("--gemm-gflops", type=float, help="bound with this GEMM rate instead of the measured one "
                   "(a shared machine measures less than it has)")
    p.add_argument("--read-gbs", type=float, help="bound with this memory bandwidth instead of the measured one")
    p.add_argument("--profile", choices=PATHS, help="profile one call of this path instead of comparing")
    p.add_argument("--profile-rows", type=int, default=30, metavar="N",
                   help="--profile: the operator table's N rows of most self time (default 30)")
    p.add_argument("--machine", action="store_true", help="only measure the GEMM rate and memory bandwidth")
    p.add_argument("--kernels", type=int, nargs="+", metavar="ROWS",
                   help="only time one decoding step's products alone at these row counts, against the bound")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides of the workload's job (e.g. rollout.top_p=0.9)")
    p.add_argument("--policies", type=int, choices=(1, 2), default=1,
                   help="2: the default job's two policies, each writing its agent's rows from a copy of the model "
                        "that trains its last policies.main.trainable_layers layers (the rest frozen and shared)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker_main(args.worker, args.work, args.threads)
    if args.machine:
        print(json.dumps(machine_rates(args.threads)))
        return None
    if args.kernels:
        rates = machine_rates(args.threads)
        rates.update({k: v for k, v in (("gemm_gflops", args.gemm_gflops), ("read_gbs", args.read_gbs)) if v})
        rows = kernel_floor(args.model, args.kernels, args.threads, rates)
        r0 = rows[0]
        print(f"{args.model}, {args.threads} threads, load average {os.getloadavg()[0]:.1f}: one decoding step's "
              f"products ({r0['weights_gb']:.3f} GB of fp32 weights); machine {r0['gemm_gflops']:.0f} GFLOP/s, "
              f"{r0['read_gbs']:.1f} GB/s")
        print(f"{'rows':>4} {'products ms':>11} {'GFLOP/s':>7} {'bound ms':>8} {'compute+read ms':>15} {'of bound':>8}")
        for r in rows:
            print(f"{r['rows']:4d} {r['products_ms']:11.1f} {r['gflops']:7.0f} {r['bound_ms']:8.1f} {r['sum_ms']:15.1f} "
                  f"{r['bound_ms'] / r['products_ms']:8.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return None
    if args.profile:
        return profile_path(args)
    results = compare(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return None


if __name__ == "__main__":
    main()
