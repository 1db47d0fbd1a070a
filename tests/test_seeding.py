"""accord.seeding: every derived seed keeps its value, streams of different purposes stay apart (up to the listed
overlaps that runs have always had), the set-up seeds and threads as before, and no other module of the package
derives a seed or seeds a global RNG."""

from __future__ import annotations

import io
import itertools
import random
import re
import tokenize
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from accord import seeding as sd

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "accord"


def crc(name: str) -> int:
    return zlib.crc32(name.encode())


# --- (a) the values are today's ------------------------------------------------------------------------------


@pytest.mark.parametrize("s", [0, 1, 42, 2**31 - 1])
def test_run_seed_derivations_keep_their_values(s):
    assert [sd.policy_seed(s, i) for i in range(3)] == [s, s + 1, s + 2]
    assert sd.sampling_stream_seed(s + 2) == s + 2 + 7000003
    assert sd.lora_group_stream_seed(s) == s + 9000011
    assert sd.lora_adapter_seed(s, "writer") == s * 1000003 + crc("writer")
    assert sd.critic_seed(s) == s + 10007
    assert sd.critic_seed(s, 3) == s + 10010
    assert sd.value_head_seed(sd.critic_seed(s), "alice") == s + 10007 + crc("alice")
    assert sd.scalar_head_seed(s + 10008) == s + 10009
    assert sd.reward_model_seed(s) == s + 20011
    assert sd.reward_model_prompt_seed(s) == s * 1000003 + 424242
    assert sd.reward_model_pair_seed(s) == s * 1000003 + 777
    assert sd.epoch_order_seed(s, 5) == s * 1000003 + 5
    assert sd.rollout_seed(s, 3, 4) == s * 1000003 + 12
    assert sd.episode_seed(s * 1000003 + 12, 2) == s * 1000003 + 14
    assert sd.extra_rows_seed(s, 3, 2) == s * 1000003 + 3 * 1009 + 2
    assert sd.credit_seed(s, 3) == s * 1000003 + 3 * 7919 + 17
    assert sd.pair_selection_seed(s, -3, 4) == zlib.crc32(f"{s}/-3/4".encode())
    assert sd.eval_seed(s) == s + 7919
    assert sd.eval_stream_seed(s, "main") == s + 7919 + crc("main")
    assert sd.held_out_demo_seed(s) == s + 1


def test_literal_values():
    """A few values written out, for the default seed and another."""
    assert sd.sampling_stream_seed(sd.policy_seed(0, 0)) == 7_000_003
    assert sd.epoch_order_seed(5, 2) == 5_000_017
    assert sd.reward_model_prompt_seed(1) == 1_424_245
    assert sd.credit_seed(2, 1) == 2_007_942
    assert sd.eval_stream_seed(0, "main") == 3_207_130_195   # 7919 + crc32(b"main")
    assert crc("main") == 3_207_122_276


@pytest.mark.parametrize("call_seed,index", [(0, 0), (5, 3), (2**62 - 1, 7), (123_456_789, 1000)])
def test_row_stream_seed_keeps_its_value(call_seed, index):
    expected = (call_seed * 1000003 + index * 7919 + zlib.crc32(index.to_bytes(8, "little"))) % (2**63 - 1)
    assert sd.row_stream_seed(call_seed, index) == expected


def test_restored_stream_seed_is_the_crc_of_the_state():
    state = torch.Generator().manual_seed(3).get_state()
    data = state.numpy().tobytes()
    assert sd.restored_stream_seed(data) == zlib.crc32(data)


def test_random_streams_are_the_ones_of_the_old_formulas():
    """The streams, not only the integers: Python's Random and a torch generator from the seeds."""
    a = random.Random(sd.epoch_order_seed(3, 1))
    b = random.Random(3 * 1_000_003 + 1)
    assert [a.random() for _ in range(3)] == [b.random() for _ in range(3)]
    g = torch.Generator().manual_seed(sd.sampling_stream_seed(sd.policy_seed(3, 1)))
    h = torch.Generator().manual_seed(3 + 1 + 7_000_003)
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=h))


# --- (b) distinct purposes, distinct seeds ------------------------------------------------------------------

NAMES = ("main", "writer", "editor", "alice", "bob", "coder", "tester", "solver")
IDX = range(8)


def torch_streams(s: int) -> dict[str, set[int]]:
    """The seeds of a training run's torch generators, by purpose (indices, names 0..7)."""
    policies = [sd.policy_seed(s, i) for i in IDX]
    return {
        "process globals": {s, *policies},   # the trainer's, and each Ray actor's
        "policy init": set(policies),
        "sampling": {sd.sampling_stream_seed(p) for p in policies},
        "lora group": {sd.lora_group_stream_seed(s)},
        "lora adapter": {sd.lora_adapter_seed(s, n) for n in NAMES},
        "critic init": {sd.critic_seed(s, i) for i in IDX},
        "critic head": {sd.scalar_head_seed(sd.critic_seed(s, i)) for i in IDX},
        "value head": {sd.value_head_seed(sd.critic_seed(s), n) for n in NAMES},
        "reward model init": {sd.reward_model_seed(s)},
        "reward model head": {sd.scalar_head_seed(sd.reward_model_seed(s))},
        "eval globals": {sd.eval_seed(s)},
        "eval streams": {sd.eval_stream_seed(s, n) for n in NAMES},
    }


def python_streams(s: int) -> dict[str, set[int]]:
    """The seeds of a training run's Python generators and environment resets, by purpose."""
    policies = [sd.policy_seed(s, i) for i in IDX]
    return {
        "process globals": {s, *policies},
        "epoch order": {sd.epoch_order_seed(s, e) for e in IDX},
        "rm prompts": {sd.reward_model_prompt_seed(s)},
        "rm pairs": {sd.reward_model_pair_seed(s)},
        "episodes": {sd.episode_seed(sd.rollout_seed(s, t, n), b) for t in IDX for n in range(1, 9) for b in range(n)},
        "extra rows": {sd.extra_rows_seed(s, t, r) for t in IDX for r in range(1, 9)},
        "credit": {sd.credit_seed(s, t) for t in IDX},
        "pair selection": {sd.pair_selection_seed(s, t, k) for t in IDX for k in IDX},
        "eval episodes": {sd.episode_seed(sd.eval_seed(s), b) for b in IDX},
    }


def sft_streams(s: int) -> dict[str, set[int]]:
    """The seeds of an ``accord sft`` run's Python generators and environment resets, by purpose."""
    policies = [sd.policy_seed(s, i) for i in IDX]
    return {
        "process globals": {s},
        "batches": {sd.epoch_order_seed(p, e) for p in policies for e in IDX},
        "demos": {sd.episode_seed(s, b) for b in IDX},            # oracle_demos(seed=s): Random(s), resets s + b
        "held-out demos": {sd.episode_seed(sd.held_out_demo_seed(s), b) for b in IDX},
        "eval episodes": {sd.episode_seed(sd.eval_seed(s), b) for b in IDX},
    }


# Overlaps the formulas have always had; kept, since moving one would change every run's results (see the
# module docstring). A new derivation must not add to them.
KNOWN_OVERLAPS = {
    torch_streams: {
        ("process globals", "policy init"),   # s + i: a Ray actor's globals are its policy's seed
        ("critic init", "critic head"),       # critic c's head is c's seed + 1, critic c + 1's seed
    },
    python_streams: {
        # all of these sit at s * 1_000_003 plus a small offset; with s = 0 that is also the process's seeds
        ("process globals", "epoch order"),
        ("process globals", "episodes"),
        ("process globals", "extra rows"),
        ("epoch order", "episodes"),
        ("epoch order", "extra rows"),
        ("episodes", "extra rows"),
        ("episodes", "credit"),
    },
    sft_streams: {
        ("process globals", "demos"),         # random.seed(s) and Random(s) are one stream
        ("demos", "held-out demos"),          # resets s + b and s + 1 + b
        ("process globals", "batches"),       # s = 0 only
        ("batches", "demos"),
        ("batches", "held-out demos"),
    },
}


def overlaps(streams) -> set[tuple[str, str]]:
    """The pairs of purposes of ``streams`` that share a seed for some run seed in 0..100."""
    found = set()
    for s in range(101):
        by_purpose = streams(s)
        for a, b in itertools.combinations(by_purpose, 2):
            if by_purpose[a] & by_purpose[b]:
                found.add((a, b))
    return found


@pytest.mark.parametrize("streams", list(KNOWN_OVERLAPS), ids=lambda f: f.__name__)
def test_distinct_purposes_give_distinct_seeds(streams):
    assert overlaps(streams) == KNOWN_OVERLAPS[streams]


def test_an_overlap_is_detected():
    def streams(s):
        return {"critic 1": {sd.critic_seed(s, 1)}, "critic 0's head": {sd.scalar_head_seed(sd.critic_seed(s))},
                "reward model": {sd.reward_model_seed(s)}}

    assert overlaps(streams) == {("critic 1", "critic 0's head")}


# --- set-up ----------------------------------------------------------------------------------------------


def test_setup_process_seeds_every_global_generator(restore_threads):
    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        threads = torch.get_num_threads()
        sd.setup_process(11, None)
        assert torch.get_num_threads() == threads   # None leaves torch's count
        got = random.random(), np.random.random(), torch.rand(1).item()
        random.seed(11)
        np.random.seed(11)
        torch.manual_seed(11)
        assert got == (random.random(), np.random.random(), torch.rand(1).item())
        sd.setup_process(None, 1)
        assert torch.get_num_threads() == 1
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(th)


def test_setup_process_with_no_seed_leaves_the_generators():
    py, th = random.getstate(), torch.get_rng_state()
    sd.setup_process(None, None)
    assert random.getstate() == py and torch.equal(torch.get_rng_state(), th)


def test_seeded_torch_seeds_inside_and_restores_after():
    state = torch.get_rng_state()
    with sd.seeded_torch(5, devices=[]):
        inside = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(inside, torch.rand(3, generator=torch.Generator().manual_seed(5)))


# --- (c) no other module derives a seed or seeds a global generator ----------------------------------------

# the numeric constants seeding.py owns, by value (1_009, 777 and 17 are too common to forbid)
MAGIC = {1_000_003, 10_007, 20_011, 7_000_003, 9_000_011, 424_242, 7919}
GLOBAL_SEEDING = re.compile(r"\b(torch(?:\.cuda|\.random)?\.manual_seed(?:_all)?|(?:np|numpy)\.random\.seed"
                            r"|random\.seed|set_num_threads)\s*\(")
ALLOWED = {
    "accord/seeding.py": "everything",
    # the sandbox's child process seeds `random` for the model-written code it runs: the sandbox's own business
    "accord/sandbox/child.py": "random.seed",
    # building a vLLM engine replaces torch.set_num_threads; the backend puts the thread count back
    "accord/generation/vllm_backend.py": "set_num_threads",
}
# Task data modules lay out their data from run.seed themselves (accord.seeding's docstring says why); they use
# none of the constants or calls above, so none is exempted here.


def violations(path: Path, text: str) -> list[str]:
    """The forbidden constants and global seeding calls in ``text`` (code only: strings and comments are
    skipped), except those ``ALLOWED`` gives ``path``."""
    rel = path.relative_to(REPO).as_posix()
    allowed = ALLOWED.get(rel, "")
    if allowed == "everything":
        return []
    out, lines = [], text.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NUMBER and tok.string.replace("_", "").isdigit() and int(tok.string) in MAGIC:
            out.append(f"{rel}:{tok.start[0]}: constant {tok.string}")
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):   # blanked: only code is searched
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0, r1 + 1):
                line = lines[r - 1]
                a, b = (c0 if r == r0 else 0), (c1 if r == r1 else len(line))
                lines[r - 1] = line[:a] + " " * (b - a) + line[b:]
    for row, line in enumerate(lines, 1):
        for m in GLOBAL_SEEDING.finditer(line):
            if m.group(1) != allowed:
                out.append(f"{rel}:{row}: {m.group(0)}")
    return out


def test_no_module_but_seeding_derives_seeds_or_seeds_globals():
    found = [v for p in sorted(PACKAGE.rglob("*.py")) for v in violations(p, p.read_text())]
    assert not found, ("seeds are derived, and global RNGs and threads set up, in accord/seeding.py only; move these "
                       f"there: {found}")


@pytest.mark.parametrize("line", ["rng = random.Random(seed * 1_000_003 + epoch)\n", "x = seed + 7919\n",
                                  "torch.manual_seed(seed)\n", "random.seed(1)\n", "np.random.seed(1)\n",
                                  "torch.set_num_threads(4)\n", "torch.cuda.manual_seed_all(3)\n"])
def test_the_guard_catches(line):
    assert violations(PACKAGE / "trainer.py", line)


def test_the_guard_skips_text_and_the_allowed():
    assert not violations(PACKAGE / "trainer.py", '"""seed * 1_000_003; torch.manual_seed(seed)"""  # random.seed(1)\n')
    assert not violations(PACKAGE / "trainer.py", "gen = torch.Generator().manual_seed(seed)\n")
    assert not violations(PACKAGE / "sandbox" / "child.py", "random.seed(index)\n")
    assert violations(PACKAGE / "sandbox" / "child.py", "torch.manual_seed(index)\n")
    assert not violations(PACKAGE / "generation" / "vllm_backend.py", "torch.set_num_threads(threads)\n")
