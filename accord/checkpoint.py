"""Atomic checkpoints and exact resume.

``RUN_DIR/checkpoints/step_000010/`` holds, per policy, ``model.safetensors`` and ``optimizer.pt``
(optimizer and LR-scheduler state), plus ``state.pt`` (step, data position and the Python, NumPy and
torch RNG states). Under ``specialization: lora`` a policy's directory holds its adapter's tensors
(``adapter.safetensors``), ``optimizer.pt`` and ``base.json`` (the base model's spec and the LoRA
shape, checked on load) instead of the full model: the frozen base is rebuilt from the config.
A checkpoint is written into a temporary sibling directory and renamed into place, so a crash
leaves either the old set or the new one, never half a checkpoint.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger(__name__)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, policies: dict, state: dict, keep: int) -> Path:
    """Write the checkpoint of ``step`` atomically and prune all but the newest ``keep``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    for name, policy in policies.items():
        policy.save(tmp / "policies" / name)
    torch.save({**state, "step": step, "rng": rng_state()}, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old)
    logger.info("saved checkpoint %s", final)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted(checkpoint_dir(run_dir).glob("step_*"))
    return found[-1] if found else None


def load_checkpoint(path: Path, policies: dict) -> dict:
    """Restore policies and RNG states; return the saved trainer state (step, data position, ...)."""
    for name, policy in policies.items():
        src = path / "policies" / name
        if not src.is_dir():
            raise FileNotFoundError(f"checkpoint {path} has no policy {name!r}; was the config changed after it was saved?")
        policy.load(src)
    state = torch.load(path / "state.pt", weights_only=False, map_location="cpu")  # written on any device
    set_rng_state(state["rng"])
    return state
