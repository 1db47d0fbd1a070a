"""Atomic checkpoints and exact resume.

``RUN_DIR/checkpoints/step_000010/`` holds, per policy, ``model.safetensors`` and ``optimizer.pt``
(optimizer and LR-scheduler state), the run's further parts under ``extras/`` (critics, madpo's pair buffer,
marlhf's reward model: :mod:`accord.trainer_steps`), plus ``state.pt`` (step, data position and the Python, NumPy and
torch RNG states). Under ``specialization: lora`` a policy's directory holds its adapter's tensors
(``adapter.safetensors``), ``optimizer.pt`` and ``base.json`` (the base model's spec and the LoRA
shape, checked on load) instead of the full model: the frozen base is rebuilt from the config.
A checkpoint is written into a temporary sibling directory (``.tmp_step_*``), every file and
directory fsynced, and ``manifest.json`` (the SHA-256 and size of every other file) written last;
then it is renamed into place. Pruned checkpoints are first renamed to ``.trash_step_*`` and then
deleted, so no ``step_*`` directory is ever half written or half deleted. :func:`clean_checkpoints`
removes what a crash leaves behind (temporary and trash directories), and a resume loads the newest
checkpoint whose manifest verifies (:func:`resume_checkpoint`), naming each one that does not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from accord.config import ConfigError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class CheckpointError(Exception):
    """A checkpoint cannot be used (corrupt, incomplete, or none verifies). The message names it and the fix."""


def rng_state() -> dict:
    """The process-wide random states. CUDA's default generators (one per visible GPU; dropout, e.g. LoRA's,
    draws from them) are saved where CUDA is initialised; sampling uses the policies' own streams."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is None:
        return
    if not torch.cuda.is_available():
        logger.warning("the checkpoint holds CUDA random states but this process has no GPU: CUDA-side dropout "
                       "draws are not restored (sampling streams are, on the CPU)")
    elif len(cuda) != torch.cuda.device_count():
        logger.warning("the checkpoint holds the CUDA random states of %d GPUs, this process sees %d: they are "
                       "not restored (sampling streams are)", len(cuda), torch.cuda.device_count())
    else:
        torch.cuda.set_rng_state_all(cuda)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def write_checkpoint(run_dir: Path, step: int, policies: dict, state: dict, parts: dict | None = None) -> Path:
    """Write the checkpoint of ``step`` into a temporary directory (fsynced, manifest last); return it.
    ``parts``: further state of the run (critics, pair buffer, reward model: objects with ``save(directory)``
    and ``load(directory)``), each under ``extras/<name>``.

    Nothing under ``step_*`` changes until :func:`commit_checkpoint` renames it into place; the trainer
    logs the step's metrics in between, so a checkpoint never exists without its step's metrics."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    for name, policy in policies.items():
        policy.save(tmp / "policies" / name)
    for name, part in (parts or {}).items():
        part.save(tmp / "extras" / name)
    torch.save({**state, "step": step, "rng": rng_state()}, tmp / "state.pt")
    files = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        _fsync(path)
        files[path.relative_to(tmp).as_posix()] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
    for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _fsync(d)
    _hook("manifest")
    with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump({"format": 1, "step": step, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync(tmp)
    return tmp


def commit_checkpoint(run_dir: Path, tmp: Path, step: int, keep: int) -> Path:
    """Rename a written checkpoint into place as ``step_<step>``, then prune all but the newest ``keep``."""
    root = checkpoint_dir(run_dir)
    final = root / f"step_{step:06d}"
    _hook("commit")
    if final.exists():  # redoing a step after resuming from an older checkpoint
        _discard(final)
    os.replace(tmp, final)
    _fsync(root)
    prune_checkpoints(run_dir, keep, final)
    logger.info("saved checkpoint %s", final)
    return final


def prune_checkpoints(run_dir: Path, keep: int, newest: Path) -> None:
    """Delete all but the ``keep`` newest checkpoints up to ``newest`` (the one just saved or loaded); newer
    ones (skipped as corrupt on resume) stay until the run writes their step again."""
    older = [p for p in sorted(checkpoint_dir(run_dir).glob("step_*")) if p.name <= newest.name]
    for old in older[:-keep]:
        _discard(old)


def _discard(path: Path) -> None:
    """Delete a checkpoint directory: renamed to ``.trash_*`` first, so that a crash never leaves a
    half-deleted ``step_*``."""
    trash = path.with_name(f".trash_{path.name}_{os.getpid()}")
    os.replace(path, trash)
    _fsync(path.parent)
    _hook("discard")
    shutil.rmtree(trash)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _hook(point: str) -> None:
    """Crash-test hook: ``ACCORD_TEST_CRASH_DELAY=<point>:<seconds>[,...]`` sleeps at ``point`` (``manifest``:
    files written, manifest not yet; ``commit``: manifest and the step's metrics written, not yet renamed;
    ``discard``: a pruned checkpoint renamed to ``.trash_*``, not yet deleted) so that a test's SIGKILL lands
    inside that window (tests/test_crash_safety.py). Unset: does nothing."""
    spec = os.environ.get("ACCORD_TEST_CRASH_DELAY")
    if spec:
        import time

        for item in spec.split(","):
            name, _, seconds = item.partition(":")
            if name == point:
                time.sleep(float(seconds))


def clean_checkpoints(run_dir: Path) -> list[Path]:
    """Remove what a crash can leave in ``RUN_DIR/checkpoints``: temporary directories of interrupted saves
    (``.tmp_step_*``) and checkpoints caught halfway through pruning (``.trash_*``). Logs each one."""
    root = checkpoint_dir(run_dir)
    removed = []
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if path.name.startswith((".tmp_step_", ".trash_")) and path.is_dir():
                logger.info("removing %s (left by an interrupted checkpoint save or prune)", path)
            elif (path.name.startswith("step_") and path.is_dir() and not (path / MANIFEST).exists()
                  and not _legacy_complete(path)):
                logger.info("removing %s (a checkpoint of an older accord, half deleted by an interrupted prune)",
                            path)
            else:
                continue
            shutil.rmtree(path)
            removed.append(path)
    return removed


def verify_checkpoint(path: Path) -> str | None:
    """None if every file listed in the checkpoint's manifest is there with its size and SHA-256; else the problem."""
    manifest = path / MANIFEST
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (an interrupted save, or a checkpoint of an older accord)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable {MANIFEST} ({err})"
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} lists no files"
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != want.get("bytes"):
            return f"{rel} has {f.stat().st_size} bytes, the manifest says {want.get('bytes')} (truncated?)"
        if _sha256(f) != want.get("sha256"):
            return f"{rel} does not match its SHA-256 in the manifest (corrupted)"
    return None


def _legacy_complete(path: Path) -> bool:
    """A checkpoint without a manifest (written by an accord before manifests) that has all its parts."""
    policies = path / "policies"
    return ((path / "state.pt").is_file() and policies.is_dir() and any(policies.iterdir())
            and all((p / "optimizer.pt").is_file() for p in policies.iterdir()))


def _usable(path: Path) -> str | None:
    """None if ``path`` may be loaded (verified, or a complete checkpoint of an older accord); else the problem."""
    if not (path / MANIFEST).exists() and _legacy_complete(path):
        logger.warning("checkpoint %s has no %s (written by an older accord): loading it unverified", path, MANIFEST)
        return None
    return verify_checkpoint(path)


def verified_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint of a run whose manifest verifies; each newer one that fails is named in a
    warning. None if the run has no checkpoint; :class:`CheckpointError` if it has some but none verifies."""
    found = sorted(checkpoint_dir(run_dir).glob("step_*"), reverse=True)
    for ckpt in found:
        problem = _usable(ckpt)
        if problem is None:
            return ckpt
        logger.warning("skipping checkpoint %s: %s", ckpt, problem)
    if found:
        raise CheckpointError(f"none of the {len(found)} checkpoint(s) in {checkpoint_dir(run_dir)} verifies (see the "
                              "warnings above); restore them, or start the run over with `accord train --overwrite`")
    return None


def resume_checkpoint(run_dir: Path, policies: dict, parts: dict | None = None) -> dict | None:
    """Load the newest checkpoint that verifies and loads; return its trainer state (None: the run has none).

    A checkpoint that fails verification or loading is named in a warning and the next older one is tried;
    :class:`CheckpointError` when checkpoints exist but none can be used."""
    found = sorted(checkpoint_dir(run_dir).glob("step_*"), reverse=True)
    for ckpt in found:
        problem = _usable(ckpt)
        if problem is None:
            try:
                state = load_checkpoint(ckpt, policies, parts)
            except CheckpointError as err:
                problem = str(err)
            else:
                logger.info("loaded checkpoint %s%s", ckpt, " (manifest verified)" if (ckpt / MANIFEST).exists() else "")
                state["path"] = ckpt
                return state
        logger.warning("skipping checkpoint %s: %s", ckpt, problem)
    if found:
        raise CheckpointError(f"none of the {len(found)} checkpoint(s) in {checkpoint_dir(run_dir)} verifies or loads "
                              "(see the warnings above); restore them, or start the run over with "
                              "`accord train --overwrite`")
    return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest ``step_*`` directory, verified or not (see :func:`verified_checkpoint`)."""
    found = sorted(checkpoint_dir(run_dir).glob("step_*"))
    return found[-1] if found else None


def load_checkpoint(path: Path, policies: dict, parts: dict | None = None) -> dict:
    """Restore policies, the run's ``parts`` (see :func:`write_checkpoint`) and RNG states; return the saved
    trainer state (step, data position, ...)."""
    for name, policy in policies.items():
        src = path / "policies" / name
        if not src.is_dir():
            raise FileNotFoundError(f"checkpoint {path} has no policy {name!r}; was the config changed after it was saved?")
        try:
            policy.load(src)
        except ConfigError:  # the checkpoint is intact but of another config (e.g. a LoRA base mismatch)
            raise
        except (OSError, RuntimeError, EOFError, KeyError, ValueError, pickle.UnpicklingError) as err:
            raise CheckpointError(f"checkpoint {path}: policy {name!r} cannot be loaded ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''}); the files are incomplete or "
                                  "corrupted: resume from an older checkpoint or start over") from err
    for name, part in (parts or {}).items():
        src = path / "extras" / name
        if not src.is_dir():
            raise ConfigError(f"checkpoint {path} has no {name!r} (critics, pair buffer or reward model of this "
                              "algorithm); resume with the config the checkpoint was trained with")
        try:
            part.load(src)
        except ConfigError:
            raise
        except (OSError, RuntimeError, EOFError, KeyError, ValueError, pickle.UnpicklingError) as err:
            raise CheckpointError(f"checkpoint {path}: {name!r} cannot be loaded ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''}); resume from an older checkpoint "
                                  "or start over") from err
    try:
        state = torch.load(path / "state.pt", weights_only=False, map_location="cpu")  # written on any device
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise CheckpointError(f"checkpoint {path}: state.pt cannot be loaded ({type(err).__name__}: {err}); resume "
                              "from an older checkpoint or start over") from err
    set_rng_state(state["rng"])
    return state


RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "completions", "tb", "audit")
"""What makes a directory hold a run (any one of them); ``overwrite`` deletes these and ``report``, ``eval``,
``crossplay``."""


def claim_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Make ``run_dir`` ready for a new run (or a resume) without overwriting another run by accident.

    A new run into a directory that already holds one is a :class:`ConfigError` naming the fixes;
    ``overwrite`` deletes the old run's files first (logged). A resume removes what a crash left behind.
    Nothing is created here: a config refused later leaves no directory behind."""
    run_dir = Path(run_dir)
    for parent in (run_dir, *run_dir.parents):
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ConfigError(f"run directory {run_dir}: {parent} is a file, not a directory; set run.output_dir "
                                  "(or run.run_dir) to a directory path")
            break
    if resume:
        clean_checkpoints(run_dir)
        return
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if held and not overwrite:
        raise ConfigError(f"{run_dir} already holds a run ({', '.join(held)}); continue it with "
                          f"`accord train --resume {run_dir}`, start it over with --overwrite (deletes the old run), "
                          "or choose another run.name")
    if held:
        logger.warning("--overwrite: deleting the earlier run in %s", run_dir)
        for name in (*RUN_FILES, "report", "eval", "crossplay"):
            path = run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()


def discard_uncheckpointed(run_dir: Path) -> None:
    """Resuming a run that has no checkpoint yet starts it over: its logs of steps never checkpointed go."""
    for name in ("metrics.jsonl", "completions", "tb", "audit"):
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
