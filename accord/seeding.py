"""Every seed accord derives, and each process's RNG and thread set-up.

A run is reproducible bit for bit (the same config and seed give the same run, resumed or not, on the local
or the Ray backend) because every random stream it draws from is seeded by a fixed function of ``run.seed``.
Those functions and their constants live here and nowhere else in the package (``tests/test_seeding.py``
checks the sources); a call site names what it seeds. The values are the ones accord has always used:
changing one changes the results of every run (and fails the determinism and resume tests).

Streams. ``s`` is ``run.seed``; ``i`` a policy's position among the sorted policy names and ``P = s + i`` its
seed; ``S`` is :data:`STREAM_STRIDE` (1_000_003); ``crc32(x)`` is ``zlib.crc32`` of ``x``'s UTF-8 bytes.

=============================  ==============================  =================================================
function                       seed                            what it seeds
=============================  ==============================  =================================================
setup_process                  ``s``                           the process's global RNGs (random, NumPy, torch):
                                                               the trainer, ``accord sft``, torchrun workers
policy_seed                    ``P = s + i``                   policy ``i``'s model init (tiny models; a LoRA
                                                               run's one base takes ``s``), its Ray actor's
                                                               global RNGs, ``accord sft``'s policy ``i``
sampling_stream_seed           ``P + 7_000_003``               policy ``i``'s sampling stream (a
                                                               ``torch.Generator``, saved in checkpoints)
lora_group_stream_seed         ``s + 9_000_011``               a LoRA group's mixed-generation stream
lora_adapter_seed              ``s * S + crc32(a)``            LoRA adapter ``a``'s initial weights
critic_seed                    ``s + 10_007 + c``              critic ``c``'s model init (``separate``: one per
                                                               agent, ``joint``: one)
value_head_seed                ``s + 10_007 + crc32(a)``       agent ``a``'s value head (``critic.mode: head``)
scalar_head_seed               model seed ``+ 1``              the linear head of a critic or the reward model
reward_model_seed              ``s + 20_011``                  the reward model's init (marlhf)
reward_model_prompt_seed       ``s * S + 424_242``             the order of the reward model's stage-1 prompts
reward_model_pair_seed         ``s * S + 777``                 the held-out split and batch order of its pairs
epoch_order_seed               ``s * S + e``                   the permutation of the training data in epoch
                                                               ``e``; ``accord sft``: ``P * S + e``, policy
                                                               ``i``'s demonstrations
rollout_seed                   ``s * S + t * n``               a multi-turn rollout of ``n`` rows at step ``t``
episode_seed                   batch seed ``+ b``              episode ``b``'s ``env.reset`` in a batch
extra_rows_seed                ``s * S + t * 1_009 + r``       dynamic sampling: extra round ``r`` of step ``t``
credit_seed                    ``s * S + t * 7919 + 17``       counterfactual credit's orderings at step ``t``
pair_selection_seed            ``crc32(f"{s}/{t}/{k}")``       the preference pairs of instance ``k``, step ``t``
eval_seed                      ``s + 7919``                    the batch seed of an evaluation (and of ``accord
                                                               sft``'s held-out play), and torch's global RNG
                                                               while an evaluation plays
eval_stream_seed               ``s + 7919 + crc32(p)``         policy ``p``'s ``eval`` sampling stream
                                                               (crossplay: the policy's name in its own run)
held_out_demo_seed             ``s + 1``                       ``accord sft``: the oracle's held-out
                                                               demonstrations
row_stream_seed                ``(c * S + k * 7_919 +          data parallel: prompt ``k`` of a generate call,
                               crc32(k, 8 bytes LE)) mod       ``c`` drawn from the policy's sampling stream
                               (2^63 - 1)``
restored_stream_seed           ``zlib.crc32`` of the saved     a stream resumed on another device type
                               state's bytes
=============================  ==============================  =================================================

Overlaps. Some of these coincide for the same ``s``, as they always have, and stay so: moving one would change
every run. Torch's: the process's global RNGs and policy 0's model init share ``s`` (and a Ray actor's globals
its policy's seed, by design); critic ``c``'s head and critic ``c + 1``'s model share ``s + 10_008 + c``.
Python's and the environments': the streams at ``s * S`` plus a small offset (epoch permutations, the episodes
of early steps, dynamic sampling's rounds at step 0, credit at step 0) share values; in ``accord sft`` the
demonstrations (``Random(s)``, resets ``s + b``) meet the global ``random`` seeded with ``s`` and the held-out
demonstrations (``s + 1 + b``); with ``s = 0``, ``s * S`` is 0 and the streams above it meet the globals too.
``tests/test_seeding.py`` lists every overlap, so that a new derivation cannot add one unseen.

Not here. A task's data is laid out by the task from ``run.seed`` itself (``tasks(split, limit, seed)``,
``rows(...)``): reasoning-gym datasets at ``seed * 10**7 (+ 5 * 10**6 for eval) + idx``
(``accord/envs/maths/data.py``), grid puzzles from ``Random(f"{name}:{seed}:{draws}")``, files and Hub rows
shuffled by ``Random(seed)``. That layout is part of the task's definition (its docstring documents it and
it is the same whoever reads the task), so it stays with the task. The sandbox seeds ``random`` in its child
process for the model-written code it runs (``accord/sandbox/child.py``); vLLM's per-request seeds are drawn
from the policy's sampling stream; a function given a seed (``bootstrap_ci(seed=0)``, ``oracle_demos``)
uses it as given.
"""

from __future__ import annotations

import contextlib
import random
import zlib
from typing import Iterator

STREAM_STRIDE = 1_000_003          # s * this + an offset or index (epochs, steps, adapters, data-parallel prompts)
SAMPLING_OFFSET = 7_000_003        # a policy's sampling stream: its seed + this
LORA_GROUP_OFFSET = 9_000_011      # a LoRA group's mixed-generation stream: s + this
CRITIC_OFFSET = 10_007             # critic models and value heads: s + this (+ critic index or crc32(agent))
SCALAR_HEAD_OFFSET = 1             # the linear head of a critic or reward model: its model's seed + this
REWARD_MODEL_OFFSET = 20_011       # the reward model: s + this
RM_PROMPT_OFFSET = 424_242         # reward model stage 1, prompt order: s * STREAM_STRIDE + this
RM_PAIR_OFFSET = 777               # reward model stage 1, pair split and batches: s * STREAM_STRIDE + this
EXTRA_ROUND_STEP_STRIDE = 1_009    # dynamic sampling: s * STREAM_STRIDE + step * this + round
CREDIT_STEP_STRIDE = 7919          # credit orderings: s * STREAM_STRIDE + step * this + CREDIT_OFFSET
CREDIT_OFFSET = 17
EVAL_OFFSET = 7919                 # evaluation: s + this (training's streams are untouched)
HELD_OUT_DEMO_OFFSET = 1           # sft's held-out demonstrations: s + this
ROW_INDEX_STRIDE = 7_919           # data-parallel prompt streams: call seed * STREAM_STRIDE + index * this + ...
ROW_SEED_MODULUS = 2**63 - 1


def _crc(name: str) -> int:
    return zlib.crc32(name.encode())


# --- policies ---------------------------------------------------------------------------------------


def policy_seed(run_seed: int, index: int) -> int:
    """Seed of the policy at ``index`` among the sorted policy names (model init, its Ray actor's RNGs)."""
    return run_seed + index


def sampling_stream_seed(seed: int) -> int:
    """Seed of the sampling stream of a policy whose seed is ``seed``."""
    return seed + SAMPLING_OFFSET


def lora_group_stream_seed(run_seed: int) -> int:
    """Seed of a LoRA group's mixed-generation stream."""
    return run_seed + LORA_GROUP_OFFSET


def lora_adapter_seed(run_seed: int, adapter: str) -> int:
    """Seed of the initial weights of LoRA adapter ``adapter``."""
    return run_seed * STREAM_STRIDE + _crc(adapter)


# --- critics and the reward model ----------------------------------------------------------------------


def critic_seed(run_seed: int, index: int = 0) -> int:
    """Seed of critic ``index`` (its model init); with index 0 also the base of the value heads' seeds."""
    return run_seed + CRITIC_OFFSET + index


def value_head_seed(seed: int, agent: str) -> int:
    """Seed of agent ``agent``'s value head on a policy, from :func:`critic_seed` ``seed``."""
    return seed + _crc(agent)


def scalar_head_seed(seed: int) -> int:
    """Seed of the linear head of a critic or reward model whose model seed is ``seed``."""
    return seed + SCALAR_HEAD_OFFSET


def reward_model_seed(run_seed: int) -> int:
    """Seed of the reward model (its model init)."""
    return run_seed + REWARD_MODEL_OFFSET


def reward_model_prompt_seed(run_seed: int) -> int:
    """Seed of the order of the training prompts the reward model's stage 1 plays."""
    return run_seed * STREAM_STRIDE + RM_PROMPT_OFFSET


def reward_model_pair_seed(run_seed: int) -> int:
    """Seed of the reward model's held-out split of its pairs and of its batch order."""
    return run_seed * STREAM_STRIDE + RM_PAIR_OFFSET


# --- data and rollouts ---------------------------------------------------------------------------------


def epoch_order_seed(seed: int, epoch: int) -> int:
    """Seed of epoch ``epoch``'s permutation of the training data (sft: of a policy's demonstrations)."""
    return seed * STREAM_STRIDE + epoch


def rollout_seed(run_seed: int, step: int, n_rows: int) -> int:
    """Batch seed of a multi-turn rollout of ``n_rows`` instances at step ``step``."""
    return run_seed * STREAM_STRIDE + step * n_rows


def episode_seed(batch_seed: int, position: int) -> int:
    """``env.reset`` seed of the episode at ``position`` in a batch seeded ``batch_seed``."""
    return batch_seed + position


def extra_rows_seed(run_seed: int, step: int, round_: int) -> int:
    """Seed of the instances of dynamic sampling's extra round ``round_`` at step ``step``."""
    return run_seed * STREAM_STRIDE + step * EXTRA_ROUND_STEP_STRIDE + round_


def credit_seed(run_seed: int, step: int) -> int:
    """Seed of the agent orderings counterfactual credit samples at step ``step``."""
    return run_seed * STREAM_STRIDE + step * CREDIT_STEP_STRIDE + CREDIT_OFFSET


def pair_selection_seed(run_seed: int, step: int, instance: int) -> int:
    """Seed of the preference pairs chosen among instance ``instance``'s candidates at step ``step``."""
    return zlib.crc32(f"{run_seed}/{step}/{instance}".encode())


# --- evaluation and sft --------------------------------------------------------------------------------


def eval_seed(run_seed: int) -> int:
    """Batch seed of an evaluation's rollout, and torch's global seed while it plays."""
    return run_seed + EVAL_OFFSET


def eval_stream_seed(run_seed: int, policy: str) -> int:
    """Seed of policy ``policy``'s ``eval`` sampling stream."""
    return eval_seed(run_seed) + _crc(policy)


def held_out_demo_seed(run_seed: int) -> int:
    """Seed of the oracle's held-out demonstrations in ``accord sft``."""
    return run_seed + HELD_OUT_DEMO_OFFSET


# --- streams derived from other streams ----------------------------------------------------------------


def row_stream_seed(call_seed: int, index: int) -> int:
    """Seed of prompt ``index``'s stream within a data-parallel generate call seeded ``call_seed``."""
    return (call_seed * STREAM_STRIDE + index * ROW_INDEX_STRIDE + zlib.crc32(index.to_bytes(8, "little"))
            ) % ROW_SEED_MODULUS


def restored_stream_seed(state: bytes) -> int:
    """Seed of a stream resumed on another device type, from its saved state's bytes."""
    return zlib.crc32(state)


# --- set-up ----------------------------------------------------------------------------------------------


def setup_process(seed: int | None, threads: int | None, retain_freed_memory: bool = False) -> None:
    """Set this process's torch threads to ``threads`` and seed Python's, NumPy's and torch's global RNGs
    with ``seed``; None leaves that part as it is (``threads``: torch's default). ``retain_freed_memory``:
    :func:`accord.allocator.retain_freed_memory` (``run.retain_freed_memory``)."""
    import torch

    if retain_freed_memory:
        from accord.allocator import retain_freed_memory as retain

        retain()
    if threads:
        torch.set_num_threads(threads)
    if seed is not None:
        import numpy as np

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)


@contextlib.contextmanager
def seeded_torch(seed: int, devices: list | None = None) -> Iterator[None]:
    """Torch's global RNG seeded with ``seed`` inside the block and restored after it; ``devices`` are the CUDA
    devices forked too, as in ``torch.random.fork_rng`` (None: all)."""
    import torch

    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
