"""One rank of a data-parallel policy: the :class:`DataParallelPolicy` that every launcher
(:mod:`accord.distributed.data_parallel` for torchrun and in-process groups, the Ray backend) builds per
rank, and the helpers it shares with :mod:`accord.distributed.fsdp`."""

from __future__ import annotations

import datetime
import logging
from typing import Any

import torch
import torch.distributed as dist

from accord.devices import make_generator
from accord.generation import Generation
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample
from accord.seeding import row_stream_seed

logger = logging.getLogger(__name__)

TIMEOUT = datetime.timedelta(minutes=30)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A (FSDP-sharded) DTensor gathered whole (a collective: every rank calls it), any other tensor as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def part(n: int, rank: int, world: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` items (the first ``n % world`` ranks get one more)."""
    q, r = divmod(n, world)
    start = rank * q + min(rank, r)
    return slice(start, start + q + (rank < r))


class DataParallelPolicy(ModelPolicy):
    """One rank of a data-parallel policy (see the module docstring). ``group``: the process group of the
    policy's ranks for tensors (None: the default group); ``object_group``: a gloo group of the same ranks
    for Python objects. With ``world == 1`` no collective runs."""

    def __init__(self, *args: Any, rank: int, world: int, group=None, object_group=None, **kwargs: Any):
        # set first: FsdpPolicy shards the model on the group while ModelPolicy.__init__ places it
        self.rank, self.world, self.group, self.object_group = rank, world, group, object_group
        super().__init__(*args, **kwargs)

    # --- collectives ---------------------------------------------------------------------------
    def _gather(self, mine: list) -> list:
        """Concatenation of every rank's list, in rank order (on every rank)."""
        if self.world == 1:
            return list(mine)
        parts: list = [None] * self.world
        dist.all_gather_object(parts, list(mine), group=self.object_group)
        return [x for p in parts for x in p]

    # --- generation ----------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], *, greedy: bool, temperature: float,
                 stream: str | None = None, sampling: list | None = None) -> list[Generation]:
        """This rank's share of the prompts, each sampled from its own stream; the whole list is returned."""
        if stream is not None and stream not in self._streams:
            raise KeyError(f"policy {self.name!r} has no random stream {stream!r}; call seed_stream first")
        gen = self.generator if stream is None else self._streams[stream]
        # one draw per call on every rank (greedy too), so that all ranks' streams stay in step
        call_seed = int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device))
        mine = part(len(prompts), self.rank, self.world)
        out: list[Generation] = []
        if mine.stop > mine.start:
            rows = [make_generator(self.device, row_stream_seed(call_seed, i)) for i in range(mine.start, mine.stop)]
            out = self.backend.generate(self.model, self.tokenizer, prompts[mine], greedy=greedy,
                                        temperature=temperature, generator=None, name=self.name,
                                        row_generators=rows, sampling=None if sampling is None else sampling[mine])
        return self._gather(out)

    def kl_rewards(self, samples: list[Sample]) -> list[tuple[float, int]]:
        mine = samples[part(len(samples), self.rank, self.world)]
        return self._gather(super().kl_rewards(mine) if mine else [])

    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        mine = samples[part(len(samples), self.rank, self.world)]
        return self._gather(super().logprobs(mine) if mine else [])

    # --- update hooks (see ModelPolicy.update) ------------------------------------------------------
    def _local_samples(self, mini_batch: list[Sample]) -> list[Sample]:
        return mini_batch[part(len(mini_batch), self.rank, self.world)]

    @torch.no_grad()
    def _sync_gradients(self) -> None:
        if self.world == 1:
            return
        present = torch.tensor([p.grad is not None for p in self.params], dtype=torch.int32)
        dist.all_reduce(present, op=dist.ReduceOp.MAX, group=self.object_group)
        used = [p for p, has in zip(self.params, present.tolist()) if has]
        if not used:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in used])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for p in used:
            n = p.numel()
            summed = flat[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = summed.clone()
            else:  # in place: the gradient keeps its memory layout (a norm over another layout rounds differently)
                p.grad.copy_(summed)
            offset += n

    def _reduce_stats(self, sums: dict[str, float], tokens: int) -> tuple[dict[str, float], int]:
        if self.world == 1:
            return sums, tokens
        parts: list = [None] * self.world
        dist.all_gather_object(parts, (sums, tokens), group=self.object_group)
        total: dict[str, float] = {}
        for s, _ in parts:  # in rank order: the same float sums on every rank
            for key, v in s.items():
                total[key] = total.get(key, 0.0) + v
        return total, sum(t for _, t in parts)


# --- checks before any model is loaded ---------------------------------------------------------
