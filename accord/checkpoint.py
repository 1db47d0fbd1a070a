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

import contextlib
import errno
import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError

from accord.config import ConfigError
from accord.metric_names import TIME_CHECKPOINT
from accord.tracking.registry import folder_problem

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class CheckpointError(Exception):
    """A checkpoint cannot be used (corrupt, incomplete, or none verifies). The message names it and the fix."""


def rng_state() -> dict:
    """The process-wide random states, in types ``torch.load(weights_only=True)`` reads (NumPy's key as a list
    of ints, not an array). CUDA's default generators (one per visible GPU; dropout, e.g. LoRA's, draws from
    them) are saved where CUDA is initialised; sampling uses the policies' own streams."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached)),
             "torch": torch.get_rng_state()}
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


class DiskFullError(CheckpointError):
    """The disk of the run directory filled up. The message names the last intact checkpoint and the fix;
    ``what`` is the message without the way to go on (for a command that goes on otherwise, ``accord sft``)."""

    def __init__(self, message: str, what: str | None = None):
        super().__init__(message)
        self.what = message if what is None else what


DISK_FULL_MARGIN = 1 << 20
"""A write that failed with less than this many bytes left on the disk is taken for a full disk (torch.save
says only "unexpected pos" when it runs out of space)."""


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(err: BaseException, where: Path | None = None) -> bool:
    """Whether ``err`` means the disk is full: an OSError of ENOSPC or EDQUOT, the text safetensors gives
    them, or, for a RuntimeError of a write under ``where`` (torch.save's bare "unexpected pos"), less than
    :data:`DISK_FULL_MARGIN` left there."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    if "No space left on device" in str(err) or "os error 28" in str(err):
        return True
    if where is None or not isinstance(err, RuntimeError):
        return False
    free = _free_bytes(where)
    return free is not None and free < DISK_FULL_MARGIN


def disk_full_error(run_dir: Path, doing: str, err: BaseException) -> DiskFullError:
    """The one-line error of a full disk: what failed, the newest checkpoint (verified now, so that "intact" is a
    fact) and how to go on."""
    found = checkpoints(run_dir)[::-1]
    if not found:
        kept = "the run has no checkpoint yet (a resume starts it over)"
    else:
        problem = verify_checkpoint(found[0])
        kept = (f"the last checkpoint, {found[0]}, is intact (verified)" if problem is None else
                f"the last checkpoint, {found[0]}, does not verify ({problem})")
    free = _free_bytes(Path(run_dir))
    left = f" ({free // 2**20} MiB free now)" if free is not None else ""
    detail = (str(err).splitlines() or [type(err).__name__])[0]
    what = f"disk full while {doing} ({type(err).__name__}: {detail}); {kept}; free space on the disk of {run_dir}{left}"
    if not (Path(run_dir) / "config.yaml").is_file():   # not written yet: nothing a resume could read
        return DiskFullError(f"{what} and run the same command again", what)
    return DiskFullError(f"{what} and continue with `accord train --resume {run_dir}`", what)


def folder_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the folder ``path`` (None where nothing is there): a folder removed, or moved away and
    replaced by another of the same name, has another identity or none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def check_run_dir_kept(run_dir: Path, identity: tuple[int, int] | None, found: str) -> None:
    """A :class:`CheckpointError` when ``run_dir`` is no longer the folder of ``identity`` (removed, or moved away
    and replaced) while a run writes there: its open metrics file and its lock went with it, so going on would
    write the rest of the run where nothing can resume it. ``found``: when it was noticed, for the message."""
    if identity is None or folder_identity(run_dir) == identity:
        return
    raise CheckpointError(f"run directory {run_dir} was removed or replaced while the run was going on ({found}); "
                          "stopped without writing more. If it was moved, `accord train --resume` its new path "
                          "continues from its last checkpoint; else run the same command again")


# what a checkpoint's write raises where a file cannot be written (torch.save: RuntimeError; safetensors' own)
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


def write_checkpoint(run_dir: Path, step: int, policies: dict, state: dict, parts: dict | None = None) -> Path:
    """Write the checkpoint of ``step`` into a temporary directory (fsynced, manifest last); return it.
    ``parts``: further state of the run (critics, pair buffer, reward model: objects with ``save(directory)``
    and ``load(directory)``), each under ``extras/<name>``.

    Nothing under ``step_*`` changes until :func:`commit_checkpoint` renames it into place; the trainer
    logs the step's metrics in between, so a checkpoint never exists without its step's metrics. A write that
    fails removes the partial directory (freeing the space it took); a full disk is a :class:`DiskFullError`
    naming the last checkpoint, which nothing here touched."""
    root = checkpoint_dir(run_dir)
    root.mkdir(exist_ok=True)   # not its parents: a run directory removed meanwhile is not made again
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    try:
        return _write_into(tmp, step, policies, state, parts)
    except WRITE_ERRORS as err:
        full = is_disk_full(err, root)  # before the partial files are removed and free their space
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise disk_full_error(run_dir, f"writing the checkpoint of step {step}", err) from err
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def discard_written(tmp: Path) -> None:
    """Remove a checkpoint :func:`write_checkpoint` wrote (``tmp``) and, if that leaves it empty, the
    ``checkpoints`` folder it is in (made for it where the run directory was replaced meanwhile)."""
    shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):   # not empty: the run's own checkpoints are there
        tmp.parent.rmdir()


def _write_into(tmp: Path, step: int, policies: dict, state: dict, parts: dict | None) -> Path:
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    # each folder made on its own, below the one before (saves make only their own): where the run directory is
    # removed or moved away meanwhile, a write fails instead of making the path again
    (tmp / "policies").mkdir()
    if parts:
        (tmp / "extras").mkdir()
    _hook("policies")
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
    if final.is_symlink() or (os.path.lexists(final) and not final.is_dir()):   # a user's: never replaced
        what = f"a symbolic link (to {os.readlink(final)!r})" if final.is_symlink() else "a file"
        raise CheckpointError(f"{final} is {what}, not a checkpoint of this run, and the checkpoint of step {step} "
                              f"goes by that name; move it out of {root}, then `accord train --resume {run_dir}` "
                              "(this step is run again)")
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
    older = [p for p in checkpoints(run_dir) if checkpoint_step(p) <= checkpoint_step(newest)]
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
    """Crash-test hook: ``ACCORD_TEST_CRASH_DELAY=<point>:<seconds>[,...]`` sleeps at ``point`` (``policies``: the
    temporary folder made, nothing saved in it yet; ``manifest``: files written, manifest not yet; ``commit``:
    manifest and the step's metrics written, not yet renamed; ``discard``: a pruned checkpoint renamed to
    ``.trash_*``, not yet deleted) so that a test's SIGKILL lands inside that window
    (tests/e2e/test_sigkill_resume.py), or a run's folder is removed there (tests/e2e/test_interruptions.py).
    Unset: does nothing."""
    spec = os.environ.get("ACCORD_TEST_CRASH_DELAY")
    if spec:
        import time

        for item in spec.split(","):
            name, _, seconds = item.partition(":")
            if name == point:
                time.sleep(float(seconds))


def clean_checkpoints(run_dir: Path) -> list[Path]:
    """Remove what a crash can leave in ``RUN_DIR/checkpoints``: temporary directories of interrupted saves
    (``.tmp_step_*``) and checkpoints caught halfway through pruning (``.trash_*``). Logs each one. A ``step_*``
    directory is never removed here: one without a manifest and some of a checkpoint's parts (copied in part, or
    trimmed by hand) is named in a warning and left."""
    root = checkpoint_dir(run_dir)
    removed = []
    if root.is_dir():
        for path in sorted(root.iterdir()):
            # accord writes no link: a user's, left alone (and never loaded or pruned); nor a file here
            if path.is_symlink() or not path.is_dir():
                continue
            if path.name.startswith((".tmp_step_", ".trash_")):
                logger.info("removing %s (left by an interrupted checkpoint save or prune)", path)
                shutil.rmtree(path)
                removed.append(path)
            elif (_CHECKPOINT_NAME.fullmatch(path.name) and not (path / MANIFEST).exists()
                  and not _legacy_complete(path)):   # this accord leaves none (a prune renames first)
                logger.warning("%s has no %s and not every part of a checkpoint (state.pt, each policy's "
                               "optimizer.pt): it is not loaded, and left as it is; delete it if it is not needed",
                               path, MANIFEST)
    return removed


def verify_checkpoint(path: Path) -> str | None:
    """None if every file listed in the checkpoint's manifest is there with its size and SHA-256; else the problem."""
    manifest = path / MANIFEST
    try:
        written = json.loads(manifest.read_text(encoding="utf-8"))
        files = written["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (an interrupted save, or a checkpoint of an older accord)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable {MANIFEST} ({err})"
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} lists no files"
    step = written.get("step")   # (a manifest of format 1 names its step)
    if step is not None and step != checkpoint_step(path):
        return (f"its {MANIFEST} is of step {str(step)[:40]}, its name of step {checkpoint_step(path)} (renamed? put "
                "it back as it was written)")
    for rel, want in files.items():
        if not isinstance(rel, str) or not isinstance(want, dict):
            return f"{MANIFEST} has an entry {rel!r} that is not a file's size and SHA-256"
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
    # each policy is a folder: a file beside them (a user's note) is not a policy that lost its optimizer state
    folders = [p for p in policies.iterdir() if p.is_dir()] if policies.is_dir() else []
    return (path / "state.pt").is_file() and bool(folders) and all((p / "optimizer.pt").is_file() for p in folders)


UNVERIFIED_HINT = "pass --allow-unverified to load it anyway"


def checkpoint_problem(path: Path, allow_unverified: bool = False) -> str | None:
    """None if the checkpoint ``path`` may be loaded; else the problem. A checkpoint without its manifest
    (deleted, or written by an accord before manifests) cannot be verified: it is loaded, with a warning, only
    when the user allows it (``--allow-unverified``); without that it is skipped like a corrupted one."""
    if not (path / MANIFEST).exists() and _legacy_complete(path):
        if allow_unverified:
            logger.warning("checkpoint %s has no %s: loading it unverified (--allow-unverified)", path, MANIFEST)
            return None
        return f"no {MANIFEST}, so its files cannot be verified (deleted, or an older accord's); {UNVERIFIED_HINT}"
    return verify_checkpoint(path)


def _none_usable(found: list[Path], run_dir: Path, what: str, unverifiable: bool) -> CheckpointError:
    hint = f"; or, for a checkpoint without {MANIFEST}, {UNVERIFIED_HINT}" if unverifiable else ""
    return CheckpointError(f"none of the {len(found)} checkpoint(s) in {checkpoint_dir(run_dir)} {what} (see the "
                           f"warnings above); restore them, or start the run over with `accord train --overwrite`"
                           f"{hint}")


def verified_checkpoint(run_dir: Path, allow_unverified: bool = False) -> Path | None:
    """The newest checkpoint of a run whose manifest verifies (or, with ``allow_unverified``, that has none);
    each newer one that fails is named in a warning. None if the run has no checkpoint; :class:`CheckpointError`
    if it has some but none verifies."""
    found = checkpoints(run_dir)[::-1]
    unverifiable = False
    for ckpt in found:
        problem = checkpoint_problem(ckpt, allow_unverified)
        if problem is None:
            return ckpt
        unverifiable |= UNVERIFIED_HINT in problem
        logger.warning("skipping checkpoint %s: %s", ckpt, problem)
    if found:
        raise _none_usable(found, run_dir, "verifies", unverifiable)
    return None


def resume_checkpoint(run_dir: Path, policies: dict, parts: dict | None = None, allow_unverified: bool = False,
                      verified: Path | None = None) -> dict | None:
    """Load the newest checkpoint that verifies and loads; return its trainer state (None: the run has none).

    A checkpoint that fails verification or loading, or has no manifest (unless ``allow_unverified``), is named
    in a warning and the next older one is tried; :class:`CheckpointError` when checkpoints exist but none can
    be used. ``verified``: the checkpoint the caller chose with :func:`verified_checkpoint` (not hashed again;
    the newer ones it skipped, and warned about, are not tried again)."""
    found = checkpoints(run_dir)[::-1]
    if verified is not None:
        found = [ckpt for ckpt in found if checkpoint_step(ckpt) <= checkpoint_step(verified)]
    unverifiable = False
    for ckpt in found:
        problem = None if verified is not None and ckpt == verified else checkpoint_problem(ckpt, allow_unverified)
        if problem is None:
            try:
                state = load_checkpoint(ckpt, policies, parts)
            except CheckpointError as err:
                problem = str(err)
            else:
                logger.info("loaded checkpoint %s%s", ckpt, " (manifest verified)" if (ckpt / MANIFEST).exists() else "")
                state["path"] = ckpt
                return state
        unverifiable |= UNVERIFIED_HINT in problem
        logger.warning("skipping checkpoint %s: %s", ckpt, problem)
    if found:
        raise _none_usable(found, run_dir, "verifies or loads", unverifiable)
    return None


def checkpoint_step(path: Path) -> int:
    """The step of a checkpoint directory, from its name (``step_000010`` -> 10)."""
    return int(Path(path).name.split("_", 1)[1])


_CHECKPOINT_NAME = re.compile(r"step_\d{6,}")


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoint directories, oldest first: ``checkpoints/step_NNNNNN`` only (a copy a user made
    beside them, ``step_000010.bak`` or ``step_000010_best``, a symbolic link (accord writes none) or a file of a
    checkpoint's name, is not the run's: never loaded, exported or pruned)."""
    found = [p for p in checkpoint_dir(run_dir).glob("step_*") if _CHECKPOINT_NAME.fullmatch(p.name)
             and p.is_dir() and not p.is_symlink()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint directory (:func:`checkpoints`), verified or not (see :func:`verified_checkpoint`)."""
    found = checkpoints(run_dir)
    return found[-1] if found else None


def _numpy_globals() -> list:
    """What unpickling a NumPy array needs: state.pt of an accord before the RNG state was saved as lists."""
    reconstruct = np.zeros(1).__reduce__()[0]
    return [reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


# what loading a policy's files raises where they are damaged (or, unverified, not accord's)
LOAD_ERRORS = (OSError, RuntimeError, EOFError, KeyError, ValueError, pickle.UnpicklingError, SafetensorError)


def _why(err: BaseException) -> str:
    """What went wrong loading a checkpoint's file, in one line: torch's refusal of a pickle that is not plain
    tensors and containers without its advice to load it unsafely (``weights_only=False`` would run its code)."""
    if isinstance(err, pickle.UnpicklingError) and "weights_only" in str(err):
        return ("UnpicklingError: it holds Python objects other than tensors and plain containers, which accord does "
                "not load")
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def load_state(path: Path) -> dict:
    """A checkpoint's ``state.pt`` with ``torch.load(weights_only=True)``: plain containers, numbers and tensors
    only, so a crafted file cannot run code. Files of older accords hold NumPy's random state as an array: they
    are read with NumPy's array type allowed (still weights-only) where torch can allow it (>= 2.5)."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")  # written on any device
    except pickle.UnpicklingError:
        allow = getattr(torch.serialization, "safe_globals", None)
        if allow is None:
            raise
        with allow(_numpy_globals()):
            return torch.load(path, weights_only=True, map_location="cpu")


def load_checkpoint(path: Path, policies: dict, parts: dict | None = None) -> dict:
    """Restore policies, the run's ``parts`` (see :func:`write_checkpoint`) and RNG states; return the saved
    trainer state (step, data position, ...)."""
    for name, policy in policies.items():
        src = path / "policies" / name
        if not src.is_dir():
            raise FileNotFoundError(f"checkpoint {path} has no policy {name!r}; was the config changed after it was saved?")
        load_policy(policy, path, name, "the files are incomplete or corrupted: resume from an older checkpoint or "
                    "start over")
    for name, part in (parts or {}).items():
        src = path / "extras" / name
        if not src.is_dir():
            raise ConfigError(f"checkpoint {path} has no {name!r} (critics, pair buffer or reward model of this "
                              "algorithm); resume with the config the checkpoint was trained with")
        try:
            part.load(src)
        except ConfigError:
            raise
        except LOAD_ERRORS as err:
            other = other_layout(err, path, repr(name))
            if other is not None:
                raise other from err
            raise CheckpointError(f"checkpoint {path}: {name!r} cannot be loaded ({_why(err)}); resume from an older "
                                  "checkpoint or start over") from err
    try:
        state = load_state(path / "state.pt")
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        raise CheckpointError(f"checkpoint {path}: state.pt cannot be loaded ({_why(err)}); resume from an older "
                              "checkpoint or start over") from err
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step != checkpoint_step(path):
        # every checkpoint is written with its step: a renamed one, or another's state.pt, would resume the run
        # at the wrong step (and cut its logs there)
        raise CheckpointError(f"checkpoint {path}: its state.pt is of step {str(step)[:40]}, its name of step "
                              f"{checkpoint_step(path)} (renamed, or a state.pt of another checkpoint); put it back as "
                              "it was written, resume from an older checkpoint, or start over")
    try:
        set_rng_state(state["rng"])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as err:
        raise CheckpointError(f"checkpoint {path}: state.pt holds no usable random state ({type(err).__name__}: "
                              f"{err}); resume from an older checkpoint or start over") from err
    return state


def other_model(err: BaseException, ckpt: Path, name: str) -> ConfigError | None:
    """The :class:`ConfigError` for policy ``name``'s weights of checkpoint ``ckpt`` that ``err`` found intact but
    not fitting the model the config builds (another model: the config's model settings differ from the run's);
    None for another error."""
    if "Error(s) in loading state_dict" not in str(err):
        return None
    return ConfigError(f"checkpoint {ckpt}: the weights of policy {name!r} do not fit the model this config builds "
                       f"({_first_mismatch(err)}); use the model settings the run was trained with (its config.yaml): "
                       f"an override of policies.{name}.model or model_kwargs changes the model")


def load_policy(policy, ckpt: Path, name: str, fix: str) -> None:
    """Load policy ``name`` of checkpoint ``ckpt`` (``ckpt/policies/name``) into ``policy``: a :class:`ConfigError`
    where its files are intact but of another model (the config's model settings differ from the run's), a
    :class:`CheckpointError` ending with ``fix`` where they do not load."""
    try:
        policy.load(ckpt / "policies" / name)
    except ConfigError:  # the checkpoint is intact but of another config (e.g. a LoRA base mismatch)
        raise
    except LOAD_ERRORS as err:
        other = other_model(err, ckpt, name) or other_layout(err, ckpt, f"policy {name!r}")
        if other is not None:
            raise other from err
        raise CheckpointError(f"checkpoint {ckpt}: policy {name!r} cannot be loaded ({_why(err)}); {fix}") from err


def other_layout(err: BaseException, ckpt: Path, what: str) -> ConfigError | None:
    """The :class:`ConfigError` for a file that ``what`` of a checkpoint whose manifest verified (so none of its
    files is missing) does not hold: it was saved by another kind of run (a whole model where this run's
    ``specialization: lora`` reads an adapter, or the reverse; separate critics where a value head or a joint critic
    is read), so the config differs from the run's; None for another error, or a checkpoint without a manifest."""
    if not isinstance(err, FileNotFoundError) or not (Path(ckpt) / MANIFEST).is_file():
        return None
    named = getattr(err, "filename", None) or next(
        iter(re.findall(r"[\w.-]+\.(?:safetensors|pt|json)\b", str(err))), "")
    missing = Path(named).name or "a file"
    return ConfigError(f"checkpoint {ckpt}: {what} has no {missing}: it was saved by a run of other settings "
                       "(specialization, algorithm.name or critic.mode) and its files are intact; resume with the "
                       "config the run was trained with (its config.yaml), without overriding those")


def _first_mismatch(err: BaseException) -> str:
    """The first mismatch of a ``load_state_dict`` error, in one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 else (lines[0] if lines else type(err).__name__)


RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "completions", "tb", "audit")
"""What makes a directory hold a run (any one of them)."""
_RUN_OUTPUTS = (*RUN_FILES, "eval_completions", "trackers.json", "report", "eval", "crossplay")
"""What a run writes: deleted by ``overwrite``, and when a run that never completed a step is started over."""
LOCK_FILE = ".accord.lock"
SFT_DEMOS = "demos.jsonl"   # every warm start of accord sft holds it (accord.sft), no run of accord train does


def _logged_lines(run_dir: Path):
    """Each line of ``run_dir``'s metrics.jsonl as a dict (None where a line does not read as one)."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        return
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        yield record if isinstance(record, dict) else None


def _logged_steps(run_dir: Path):
    """The ``step`` of each line of ``run_dir``'s metrics.jsonl (None where a line does not read or has none)."""
    for record in _logged_lines(run_dir):
        yield None if record is None else record.get("step")


def checkpointed_steps(run_dir: Path) -> list[int]:
    """The steps of ``run_dir``'s metrics.jsonl whose line says a checkpoint was written with it (it carries
    ``time/checkpoint``: :meth:`accord.trainer.Trainer._save` logs a step's metrics as it writes its checkpoint)."""
    return [r["step"] for r in _logged_lines(run_dir)
            if r is not None and TIME_CHECKPOINT in r and isinstance(r.get("step"), int)]


def completed_step(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a completed training step: a checkpoint, or a metrics line of a step >= 1
    (step 0 is the evaluation before training). A run that failed at start-up (a tracker that would not log in,
    a model that would not load) or was stopped during its first step has none: there is nothing to protect.
    A line that cannot be read protects the run too (no guessing)."""
    if checkpoints(run_dir):
        return True
    return any(not isinstance(step, int) or step >= 1 for step in _logged_steps(run_dir))


def last_logged_step(run_dir: Path) -> int:
    """The largest step in ``run_dir``'s metrics.jsonl (0 without one; lines that do not read are passed over)."""
    return max((step for step in _logged_steps(run_dir) if isinstance(step, int) and not isinstance(step, bool)),
               default=0)


_HELD: dict[str, list] = {}  # run directory -> [open lock file, holders in this process]


def _no_link(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o644)


def hold_run_dir(run_dir: Path):
    """Hold ``RUN_DIR/.accord.lock`` (an exclusive ``flock``) while this process runs in ``run_dir``; returns
    the function that lets it go. Another process holding it is a :class:`ConfigError`: two runs in one
    directory would write over each other. The kernel releases the lock when the process ends, however it
    ends (SIGKILL too), so a crashed run never blocks its resume. Nested holds in one process are counted.
    Where the file system has no locks (some network mounts) the run goes on unlocked."""
    import fcntl

    key = str(Path(run_dir).resolve())
    if key in _HELD:
        _HELD[key][1] += 1
    else:
        lock = Path(run_dir) / LOCK_FILE
        try:   # the pid is written into it: through no link (a link to a user's file would be overwritten)
            fh = open(lock, "a+", encoding="utf-8", opener=_no_link)  # noqa: SIM115 - held until released
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            raise ConfigError(f"{lock} is a symbolic link (to {os.readlink(lock)!r}); accord writes its process id "
                              f"into its lock file and follows no link there: delete the link (rm {lock})") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            owner = fh.read().strip() or "another process"
            fh.close()
            raise ConfigError(f"{run_dir} is in use by a running accord ({owner}); wait for it to end, or choose "
                              "another run.name") from None
        except OSError as err:
            logger.debug("no lock on %s (%s): running unlocked", run_dir, err)
            fh.close()
            return lambda: None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()}\n")
            fh.flush()
        except OSError as err:   # a full disk: the write names no file
            with contextlib.suppress(OSError):   # the unwritten pid fails the close's flush too; the file is closed
                fh.close()
            raise OSError(err.errno, err.strerror, str(lock)) from err
        _HELD[key] = [fh, 1]

    def release() -> None:
        entry = _HELD.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[key]
            entry[0].close()   # closing the file releases the flock

    return release


def _delete_run(run_dir: Path) -> None:
    for name in _RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def run_in_use(run_dir: Path) -> str | None:
    """Who holds ``run_dir``'s lock (what :func:`hold_run_dir` wrote: its pid) while a run of accord goes on there,
    probed without waiting and let go at once; None when nobody does, or when it cannot be told (no lock file, a
    file system without locks, or this process holding it)."""
    import fcntl

    if str(Path(run_dir).resolve()) in _HELD:
        return None
    try:
        fh = open(Path(run_dir) / LOCK_FILE, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return fh.read().strip() or "another process"
        except OSError:
            return None
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


def rotated_away(ckpt: Path, run_dir: Path, doing: str) -> CheckpointError | None:
    """The error to give when ``ckpt`` went away while it was read because the run of ``run_dir`` goes on (or went
    on meanwhile: a newer checkpoint is there) and deletes its older checkpoints; None when the checkpoint is still
    there, or when no run holds the directory and none is newer."""
    if Path(ckpt).is_dir():
        return None
    owner = run_in_use(run_dir)
    if owner is None:
        newer = [c for c in checkpoints(run_dir) if checkpoint_step(c) > checkpoint_step(ckpt)]
        if not newer:
            return None
        return CheckpointError(f"checkpoint {ckpt} was deleted while {doing}: the run of {run_dir} went on meanwhile "
                               f"and kept only its newest checkpoints (now {newer[-1].name}); run the command again "
                               "(it takes the newest)")
    return CheckpointError(f"checkpoint {ckpt} was deleted while {doing}: {run_dir} is in use by a running accord "
                           f"({owner}), which keeps only its newest checkpoints (run.keep_checkpoints); run the "
                           "command again (it takes the newest), or once the run has ended")


def in_checkpoints(path: Path, run_dir: Path) -> bool:
    """Whether ``path`` lies in ``run_dir``'s ``checkpoints/``, whose older checkpoints the run deletes as it goes on
    (``run.keep_checkpoints``): no place for an export or an evaluation. False where either cannot be resolved (a
    link loop)."""
    try:
        return Path(path).resolve().is_relative_to(checkpoint_dir(run_dir).resolve())
    except (OSError, RuntimeError):
        return False


def warm_start_problem(run_dir: Path) -> str | None:
    """A line saying that ``run_dir`` holds a warm start of ``accord sft`` (finished, or its unfinished
    ``.partial``), which a run of accord train must neither resume nor overwrite; None otherwise."""
    if not (Path(run_dir) / SFT_DEMOS).is_file():
        return None
    return (f"{run_dir} holds a warm start of accord sft ({SFT_DEMOS} beside it), not a run of accord train, and a "
            f"run there would overwrite it; train from a finished one with policies.<name>.model={run_dir}/<name>, "
            "into another run.name (or run.run_dir)")


def check_still_new(run_dir: Path) -> None:
    """A :class:`ConfigError` where ``run_dir``, which did not exist when this run claimed it (so no lock was held
    while the run was built), now holds a run: another ``accord train`` into the same new directory got there
    first (and may have finished). Call with the directory's lock held (:func:`hold_run_dir`)."""
    held = [name for name in RUN_FILES if (Path(run_dir) / name).exists()]
    if held:
        raise ConfigError(f"{run_dir} was new when this run started, but another run wrote {', '.join(held)} there "
                          f"while this one was being built; nothing of it was changed: continue that run with "
                          f"`accord train --resume {run_dir}`, or choose another run.name (or run.run_dir)")


def claim_run_dir(run_dir: Path, *, resume: bool, overwrite: bool):
    """Make ``run_dir`` ready for a new run (or a resume) without overwriting another run by accident; returns
    the release of the directory's lock (:func:`hold_run_dir`; a no-op when the directory does not exist yet).

    A new run into a directory that holds a run with a completed step is a :class:`ConfigError` naming the
    fixes; ``overwrite`` deletes the old run's files first (logged). A directory whose run never completed a
    step (:func:`completed_step`) is started over with a warning, so that the same command can simply be run
    again after a failed start; a directory holding such names without the lock file every run of accord's
    writes first (another tool's ``config.yaml`` or ``tb/``) is a :class:`ConfigError`, not started over. A resume removes what a crash left behind. A directory in use by another
    process is refused in every case. Nothing is created here: a config refused later leaves no directory
    behind."""
    run_dir = Path(run_dir)
    problem = folder_problem(run_dir)
    if problem is not None:
        raise ConfigError(f"run directory {run_dir}: {problem}; point run.output_dir (or run.run_dir) at a directory")
    problem = warm_start_problem(run_dir)
    if problem is not None:   # with --overwrite too: a warm start is not a run that option deletes
        raise ConfigError(problem)
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    # every run of accord's holds its directory's lock from the start: without the file, the names are another's
    # (a directory with a completed step is refused below in any case, as a run)
    if held and not resume and not overwrite and not (run_dir / LOCK_FILE).exists() and not completed_step(run_dir):
        raise ConfigError(f"{run_dir} holds {', '.join(held)} but is not a run directory of accord's (no "
                          f"{LOCK_FILE}); choose another run.name (or run.run_dir), or pass --overwrite to delete "
                          f"{', '.join(held)} and what else a run writes there ({', '.join(_RUN_OUTPUTS)})")
    release = hold_run_dir(run_dir) if run_dir.is_dir() else (lambda: None)
    try:
        if resume:
            clean_checkpoints(run_dir)
            return release
        held = [name for name in RUN_FILES if (run_dir / name).exists()]
        if held and overwrite:
            logger.warning("--overwrite: deleting the earlier run in %s", run_dir)
        elif held and completed_step(run_dir) and not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"{run_dir} holds {', '.join(held)} without the config.yaml of a run of accord's, so "
                              "nothing there can be resumed; choose another run.name (or run.run_dir), or pass "
                              f"--overwrite to delete {', '.join(held)}")
        elif held and completed_step(run_dir):
            raise ConfigError(f"{run_dir} already holds a run ({', '.join(held)}); continue it with "
                              f"`accord train --resume {run_dir}`, start it over with --overwrite (deletes the old "
                              "run), or choose another run.name (from Python: accord.train(cfg, resume=True), or "
                              "overwrite=True)")
        elif held:
            logger.warning("%s holds a run that stopped before completing a step (%s): starting it over", run_dir,
                           ", ".join(held))
        if held:
            _delete_run(run_dir)
    except BaseException:
        release()
        raise
    return release


def discard_uncheckpointed(run_dir: Path) -> None:
    """Resuming a run that has no checkpoint yet starts it over: its logs of steps never checkpointed go."""
    for name in ("metrics.jsonl", "completions", "tb", "audit"):
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
