"""Data parallelism inside a policy: ``policies.<name>.replicas: N``.

A policy with replicas is a group of N learner *ranks* (one ``torch.distributed`` process group: gloo
on the CPU, NCCL on GPUs, plus a gloo group for Python objects). Every rank holds the whole model and
optimizer (built from the same seed: identical weights) and receives the same calls with the same
arguments; the trainer sees the group as one policy handle.

- ``generate``: rank ``r`` decodes the ``r``-th contiguous ``1/N`` of the prompts and the parts are
  gathered in order, so every rank returns the whole list. Sampling uses one random stream *per
  prompt*: each call draws one seed from the policy's stream (every rank draws the same, so the
  ranks' streams stay equal and a checkpoint of rank 0's holds all of them) and prompt ``i`` of the
  call samples from a generator seeded with (that seed, ``i``). A prompt's tokens therefore do not
  depend on which rank decodes it: the rollouts of ``replicas: 1`` and ``replicas: N`` are the same
  draws, and bit-identical where the per-rank parts fall on the same ``rollout.generation_batch_size``
  batches as on one rank (another batch shape can round the logits differently). This differs from a
  policy without ``replicas`` (one stream for a whole batch): same distribution, other draws.
- ``kl_rewards``: each rank scores its ``1/N`` of the samples; the parts are gathered in order.
- ``update``: every rank gets the whole batch and builds the same mini-batches. Within a mini-batch
  (ordered by prompt, as on one process) rank ``r`` takes the ``r``-th contiguous ``1/N`` and computes
  its loss normalised by the *whole* mini-batch's token and sequence counts, so the sum of the ranks'
  gradients is the one-process gradient. Gradients are summed with one all-reduce per mini-batch
  (flattened; a parameter without a gradient on every rank keeps none), then every rank clips with the
  same norm and steps: weights stay identical. Loss statistics are gathered and summed in rank order.
  Summing in another order than one process does is not bit-exact in general; it is when each rank's
  part is one micro-batch of the one-process run and N = 2 (float addition of two terms commutes).
- ``save`` / ``export`` run on rank 0 only (its state is every rank's); ``load`` and ``seed_stream`` on
  every rank.

Launchers. Under ``run.backend: ray`` each rank is a Ray actor (see
:mod:`accord.distributed.ray_backend`); the driver passes rank 0's address and a free port. Under
``torchrun --nproc_per_node N -m accord.cli train CONFIG`` process 0 runs the trainer (and is rank 0 of
every group); processes 1..N-1 run :func:`serve_worker`: they receive each call by a broadcast from
process 0, and only process 0 writes the run directory. A policy with ``replicas: k`` uses processes
0..k-1; a policy without replicas lives in process 0. With ``run.backend: local`` and no torchrun,
``replicas: 1`` runs in the trainer's process and more replicas are an error naming the launchers.

Not supported with replicas (errors before any model loads): ``specialization: lora`` (one base
holds every adapter), ``rollout.generation_backend: vllm``. Every rank holds a full copy, unless
``training.fsdp: true`` shards parameters, gradients and AdamW state across the ranks
(:mod:`accord.distributed.fsdp`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from accord.config import Config
from accord.config.rules import check_distributed, policy_setting, replicated
from accord.devices import policy_devices, resolve_device
from accord.distributed.ranks import TIMEOUT, DataParallelPolicy
from accord.seeding import policy_seed, setup_process
from accord.stopping import EXIT_CODES, FollowProcessZero

logger = logging.getLogger(__name__)

def check_replicas(cfg: Config, names: list[str], *, world: int, cuda_count: int | None = None,
                   cpu_count: int | None = None) -> dict[str, int]:
    """Refuse what data parallelism cannot do here, before any model loads: returns ``replicated``.

    The rules are the config's distributed tier (:func:`accord.config.rules.check_distributed`), given this
    machine's counts; then, with ``training.fsdp``, whether this torch can shard
    (:func:`accord.distributed.fsdp.check_fsdp_support`).
    ``world``: processes launched (torchrun's WORLD_SIZE; 1 without torchrun), for run.backend=local.
    ``cuda_count`` / ``cpu_count``: this machine's GPUs and CPU cores (default: detected)."""
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cpus = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    reps = check_distributed(cfg, names, world=world, cuda_count=cuda_count, cpu_count=cpus)
    if reps and cfg.training.fsdp:
        from accord.distributed.fsdp import check_fsdp_support

        check_fsdp_support(cfg, sorted(reps), cuda_count=cuda_count)
    return reps


def rank_device(cfg: Config, name: str, local_rank: int) -> torch.device:
    """Device of a data-parallel rank under torchrun / in-process: the policy's setting, with CUDA at
    ``cuda:<local rank>`` (one GPU per rank)."""
    setting, key = policy_setting(cfg, name)
    device = resolve_device(setting, key)
    if device.type == "cuda":
        return resolve_device(f"cuda:{local_rank}", f"{key} (rank {local_rank})")
    return device


def build_rank(cfg: Config, name: str, index: int, total_optimizer_steps: int, *, rank: int, world: int,
               device: torch.device, group=None, object_group=None) -> DataParallelPolicy:
    """Rank ``rank`` of policy ``name`` (``index``: its position among the sorted policy names, which gives
    its seed as in :func:`accord.policies.model.build_policy`)."""
    cls = DataParallelPolicy
    if cfg.training.fsdp:
        from accord.distributed.fsdp import FsdpPolicy

        cls = FsdpPolicy
    return cls(name, cfg.policies[name], cfg.training, cfg.algorithm, cfg.rollout,
                              total_optimizer_steps, seed=policy_seed(cfg.run.seed, index), device=device, rank=rank,
                              world=world, group=group, object_group=object_group)


def tensor_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


# --- torchrun: process 0 runs the trainer, the others serve -----------------------------------


def wants_data_parallel(cfg: Config, names: list[str]) -> bool:
    """Whether run.backend=local needs :class:`LocalGroups`: a policy sets replicas, or torchrun launched us."""
    return launched_world() > 1 or bool(replicated(cfg, names))


def launched_world() -> int:
    """Processes torchrun started (``WORLD_SIZE``; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _init_world() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=TIMEOUT)  # env:// from torchrun; commands and objects


def _send(message: tuple) -> None:
    box = [message]
    dist.broadcast_object_list(box, src=0)


def _receive() -> tuple:
    box: list = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def bind_cuda(cfg: Config, names: list[str], reps: dict[str, int], rank: int, local_rank: int) -> torch.device | None:
    """This process's GPU (``cuda:<local rank>``) made current, where one of its ranks is on CUDA; None
    otherwise. Called before any NCCL group is created: NCCL binds a communicator to the current device, and
    a group created before ``set_device`` would use ``cuda:0`` on every process."""
    for n in names:
        k = reps.get(n)
        if k is not None and rank < k:
            device = rank_device(cfg, n, local_rank)
            if device.type == "cuda":
                torch.cuda.set_device(device)
                return device
    return None


def _groups(cfg: Config, names: list[str], reps: dict[str, int], world: int, total_optimizer_steps: int,
            rank: int) -> dict[str, DataParallelPolicy]:
    """Create every policy's process groups (every process, same order) and build this process's ranks."""
    mine = {}
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    bound = bind_cuda(cfg, names, reps, rank, local_rank)  # before any group: see bind_cuda
    for i, n in enumerate(names):
        k = reps.get(n)
        if k is None:
            continue
        device = rank_device(cfg, n, local_rank) if rank < k else None
        group = obj = None
        if world > 1:
            ranks = list(range(k))
            # every process takes part in creating every group (same order); NCCL where the policy is on GPUs,
            # formed at once on this process's GPU (device_id)
            backend = tensor_backend(rank_device(cfg, n, 0))
            extra = {"device_id": bound} if backend == "nccl" and bound is not None else {}
            group = dist.new_group(ranks, backend=backend, timeout=TIMEOUT, **extra)
            obj = dist.new_group(ranks, backend="gloo", timeout=TIMEOUT) if backend != "gloo" else group
        if rank < k:
            mine[n] = build_rank(cfg, n, i, total_optimizer_steps, rank=rank, world=k, device=device,
                                 group=group, object_group=obj)
    return mine


class GroupHandle:
    """Process 0's handle of a data-parallel policy under torchrun: each call is broadcast to the other
    processes, then run here (rank 0 of the group); collectives inside make the result whole."""

    def __init__(self, backend: "LocalGroups", policy: DataParallelPolicy):
        self._backend, self.policy = backend, policy
        self.name = policy.name

    def __getattr__(self, attr: str) -> Any:  # tokenizer, encode_chat, decode, context_len, model, ...
        return getattr(self.policy, attr)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._backend.call(self.name, method, *args, **kwargs)

    def generate(self, prompts, *, greedy: bool, temperature: float, stream: str | None = None, sampling=None):
        return self._call("generate", prompts, greedy=greedy, temperature=temperature, stream=stream,
                          sampling=sampling)

    def kl_rewards(self, samples):
        return self._call("kl_rewards", samples)

    def update(self, samples, step: int):
        return self._call("update", samples, step)

    def seed_stream(self, stream: str, seed: int) -> None:
        self._call("seed_stream", stream, seed)

    def load(self, directory: Path) -> None:
        self._call("load", Path(directory))

    def save(self, directory: Path) -> None:  # rank 0 holds every rank's state (FSDP: gathered from all)
        if self.policy.training.fsdp:
            self._call("save", Path(directory))
        else:
            self.policy.save(directory)

    def export(self, directory: Path) -> None:
        if self.policy.training.fsdp:
            self._call("export", Path(directory))
        else:
            self.policy.export(directory)


class LocalGroups:
    """``run.backend: local`` with replicas: in-process ``replicas: 1`` policies, or, under torchrun,
    process 0's side of every data-parallel policy (see the module docstring)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.world = launched_world()
        self.busy = False
        self.started = False

    def start_policies(self, cfg: Config, names: list[str], total_optimizer_steps: int,
                       build_policy) -> dict[str, Any]:
        """Build every policy: data-parallel ones as groups, the others with :func:`accord.trainer.build_policy`
        (passed as ``build_policy``) in this process. Checks come first: no model loads before they pass."""
        reps = check_replicas(cfg, names, world=self.world)
        devices = policy_devices(cfg, [n for n in names if n not in reps])
        for n in reps:
            rank_device(cfg, n, 0)
        if self.world > 1:
            _init_world()
            self.started = True
            _send(("build", cfg, names, reps, total_optimizer_steps))
        groups = _groups(cfg, names, reps, self.world, total_optimizer_steps, rank=0)
        out: dict[str, Any] = {}
        for i, n in enumerate(names):
            if n in groups:
                out[n] = GroupHandle(self, groups[n]) if self.world > 1 else groups[n]
                logger.info("policy %s: %d data-parallel rank(s), rank 0 on %s", n, reps[n], groups[n].device)
            else:
                out[n] = build_policy(cfg, n, i, total_optimizer_steps, device=devices[n])
        self.groups = groups
        return out

    def call(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        self.busy = True
        _send(("call", name, method, args, kwargs))
        value = getattr(self.groups[name], method)(*args, **kwargs)
        self.busy = False
        return value

    def close(self) -> None:
        """Stop the other processes (unless a call failed midway: then they are stuck in a collective
        and torchrun ends them when this process exits with the error)."""
        if self.started and not self.busy:
            _send(("stop",))
            dist.destroy_process_group()
        self.started = False


def serve_worker() -> int:
    """Body of torchrun processes 1..N-1: build this process's ranks when process 0 says so, run every call
    sent to a policy this process is a rank of, return on stop (0). A Ctrl-C or SIGTERM does not end it while
    process 0 finishes its step (:class:`accord.stopping.FollowProcessZero`); if process 0 is gone after one (it
    stopped at once), this process ends with the signal's exit code and one line."""
    _init_world()
    rank = dist.get_rank()
    policies: dict[str, DataParallelPolicy] = {}
    with FollowProcessZero(rank) as follow:
        while True:
            try:
                message = _receive()
                kind = message[0]
                if kind == "build":
                    _, cfg, names, reps, total = message
                    from accord.envs.registry import import_modules

                    import_modules(cfg.imports)
                    setup_process(cfg.run.seed, cfg.run.threads, cfg.run.retain_freed_memory)
                    policies = _groups(cfg, names, reps, dist.get_world_size(), total, rank=rank)
                    logger.info("torchrun process %d: ranks of %s", rank, sorted(policies))
                elif kind == "call":
                    _, name, method, args, kwargs = message
                    if name in policies:
                        getattr(policies[name], method)(*args, **kwargs)
                elif kind == "stop":
                    dist.destroy_process_group()
                    return 0
                else:  # pragma: no cover - a message of a newer process 0
                    raise RuntimeError(f"torchrun worker {rank}: unknown message {kind!r}")
            except RuntimeError as err:   # after a signal: process 0 stopped at once, its connections closed
                if follow.signal_name is None:
                    raise
                logger.warning("torchrun process %d: ended after %s, its call to process 0 failing: %s", rank,
                               follow.signal_name, str(err).splitlines()[0][:200])
                return EXIT_CODES[follow.signal_name]
