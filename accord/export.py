"""``accord export RUN_DIR [--step N] [--out DIR]``: a checkpoint as Hugging Face model directories.

The output directory (default ``RUN_DIR/export/step_NNNNNN``) holds one directory per policy:

- ``specialization: shared | separate``: ``OUT/<policy>/`` is the policy's model and tokenizer as
  written by ``save_pretrained`` (fp32, the checkpoint's weights):
  ``AutoModelForCausalLM.from_pretrained(OUT/<policy>)`` and ``AutoTokenizer.from_pretrained``
  load it, and so does a later accord run (``policies.main.model: OUT/main``).
- ``specialization: lora``: ``OUT/<policy>/`` is the policy's adapter in the PEFT format
  (``adapter_config.json``, ``adapter_model.safetensors``) plus the tokenizer, and ``OUT/base/``
  is the frozen base model (``save_pretrained``) the adapters were trained on. Each adapter's
  ``base_model_name_or_path`` names ``OUT/base`` (absolute), so
  ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(OUT/base), OUT/<policy>)``
  loads it, as does ``peft.AutoPeftModelForCausalLM.from_pretrained(OUT/<policy>)`` while ``OUT``
  stays where it was written.

The checkpoint is ``RUN_DIR/checkpoints/step_NNNNNN`` (``--step N``; default the newest whose manifest
verifies; one without a manifest only with ``--allow-unverified``). Models are
rebuilt from ``RUN_DIR/config.yaml`` on this machine's CPU whatever ``run.backend`` trained them.
Everything is written into a temporary sibling directory first and renamed to ``OUT`` at the end;
an existing ``OUT`` is an error, never overwritten.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_model

from accord.checkpoint import (
    CheckpointError,
    DiskFullError,
    checkpoint_dir,
    checkpoint_problem,
    checkpoint_step,
    checkpoints,
    in_checkpoints,
    is_disk_full,
    other_model,
    rotated_away,
    verified_checkpoint,
)
from accord.config import Config, ConfigError, load_config
from accord.tracking.registry import _UMASK, folder_problem

__all__ = ["checkpoint_of", "export_run"]

logger = logging.getLogger(__name__)


def checkpoint_of(run_dir: Path, step: int | None, allow_unverified: bool = False) -> Path:
    """The checkpoint directory of ``step`` in ``run_dir``, verified against its manifest (None: the newest that
    verifies). ``allow_unverified``: a checkpoint without a manifest is exported too, with a warning."""
    if step is None:
        found = verified_checkpoint(run_dir, allow_unverified)
        if found is None:
            raise FileNotFoundError(f"{run_dir} has no checkpoint under {checkpoint_dir(run_dir)}; train it first "
                                    "(every run saves one at its last step)")
        return found
    path = checkpoint_dir(run_dir) / f"step_{step:06d}"
    if not path.is_dir() or path.is_symlink():
        steps = [checkpoint_step(p) for p in checkpoints(run_dir)]
        if not steps:
            raise FileNotFoundError(f"{run_dir} has no checkpoint of step {step}, nor of any other step")
        raise FileNotFoundError(f"{run_dir} has no checkpoint of step {step}; it has steps {steps} (pass one of them "
                                "with --step, or leave --step out for the latest)")
    problem = checkpoint_problem(path, allow_unverified)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} cannot be exported: {problem}; export another --step (or leave "
                              "--step out for the newest that verifies)")
    return path


def _policy_names(cfg: Config, ckpt: Path) -> list[str]:
    names = sorted(p.name for p in (ckpt / "policies").iterdir() if p.is_dir())
    unknown = [n for n in names if n not in cfg.policies]
    if not names or unknown:
        raise ConfigError(f"checkpoint {ckpt} holds policies {names}, but the run's config.yaml defines "
                          f"{sorted(cfg.policies)}; export needs the config the checkpoint was trained with")
    return names


def _export_full(cfg: Config, names: list[str], ckpt: Path, out: Path) -> None:
    """Each policy's model: built as the config says, given the checkpoint's weights, saved."""
    from accord.models import load_model_and_tokenizer

    for name in names:
        spec = cfg.policies[name]
        model, tokenizer = load_model_and_tokenizer(spec.model, model_kwargs=spec.model_kwargs, seed=cfg.run.seed)
        weights = ckpt / "policies" / name / "model.safetensors"
        if not weights.is_file():
            raise ConfigError(f"{weights} does not exist; checkpoint {ckpt} was not written by a "
                              f"specialization={cfg.specialization} run (its config.yaml does not match it)")
        try:
            load_model(model, str(weights), strict=True)
        except (SafetensorError, RuntimeError, OSError) as err:
            other = other_model(err, ckpt, name)
            if other is not None:   # intact weights of another model than the config's
                raise other from err
            raise CheckpointError(f"checkpoint {ckpt}: {weights.name} of policy {name!r} does not load "
                                  f"({type(err).__name__}: {(str(err).splitlines() or [''])[0]}); the file is "
                                  "incomplete or corrupted: export another checkpoint with --step") from err
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)


def _export_lora(cfg: Config, names: list[str], ckpt: Path, out: Path, final_out: Path) -> None:
    """Each adapter in the PEFT format, and the base model once, under ``base``."""
    from accord.models import load_model_and_tokenizer
    from accord.policies.lora import build_lora_policies

    if "base" in names:
        raise ConfigError("a LoRA policy named 'base' clashes with the exported base model's directory OUT/base; "
                          "export cannot write both")
    policies = build_lora_policies(cfg, names, 1, seed=cfg.run.seed)
    for name in names:
        if not (ckpt / "policies" / name / "adapter.safetensors").is_file():
            raise ConfigError(f"checkpoint {ckpt} has no LoRA adapter for policy {name!r}; it was not written by a "
                              "specialization=lora run (its config.yaml does not match it)")
        policies[name].load(ckpt / "policies" / name)
        policies[name].export(out / name)
        config_path = out / name / "adapter_config.json"
        adapter = json.loads(config_path.read_text())
        adapter["base_model_name_or_path"] = str((final_out / "base").resolve())
        config_path.write_text(json.dumps(adapter, indent=2, sort_keys=True) + "\n")
    spec = cfg.policies[names[0]]  # every policy of a lora run names the same base
    base, tokenizer = load_model_and_tokenizer(spec.model, model_kwargs=spec.model_kwargs, seed=cfg.run.seed)
    base.save_pretrained(out / "base")
    tokenizer.save_pretrained(out / "base")


def _check_out(out: Path) -> None:
    """A ConfigError where the export cannot go to ``out``: it exists (a symbolic link too, even one that leads
    nowhere), or its folder cannot be made (:func:`folder_problem`)."""
    if out.exists() or out.is_symlink():
        link = f" (a symbolic link to {str(out.readlink())!r})" if out.is_symlink() else ""
        raise ConfigError(f"{out} already exists{link}; pass another --out or delete it")
    problem = folder_problem(out.parent)
    if problem is not None:
        raise ConfigError(f"--out {out}: {problem}; pass an --out in a folder that exists or can be made")


def export_run(run_dir: str | Path, *, step: int | None = None, out: str | Path | None = None,
               allow_unverified: bool = False) -> Path:
    """Write the checkpoint of ``step`` (None: the newest that verifies) of ``run_dir`` as Hugging Face model (or
    PEFT adapter) directories under ``out`` (default ``RUN_DIR/export/step_NNNNNN``); return ``out``. A
    checkpoint without a manifest is exported only with ``allow_unverified``."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} has no config.yaml; pass the directory of a training run")
    if step is not None and step < 0:
        raise ConfigError(f"--step {step} is negative; pass a checkpoint's step")
    cfg = load_config(run_dir / "config.yaml")
    if out is not None:   # before the checkpoint is looked for: a wrong --out is told first
        out = Path(out)
        _check_out(out)
    ckpt = checkpoint_of(run_dir, step, allow_unverified)
    if out is None:
        out = run_dir / "export" / ckpt.name
        _check_out(out)
    if in_checkpoints(out, run_dir):
        raise ConfigError(f"--out {out} lies in the run's checkpoints/, whose older checkpoints the run deletes as it "
                          f"goes on (run.keep_checkpoints), and the export with them; pass an --out outside it (the "
                          f"default is {run_dir / 'export' / ckpt.name})")
    names = _policy_names(cfg, ckpt)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the temporary directories of an export killed before it could clean up (mkdtemp's names, nothing else)
    ours = re.compile(rf"\.{re.escape(out.name)}\.[a-z0-9_]{{8}}")
    for leftover in out.parent.glob(f".{out.name}.*"):
        if leftover.is_dir() and ours.fullmatch(leftover.name):
            shutil.rmtree(leftover, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o777 & ~_UMASK)   # mkdtemp's 0700 would be the exported directory's mode
    try:
        if cfg.specialization == "lora":
            _export_lora(cfg, names, ckpt, tmp, out)
        else:
            _export_full(cfg, names, ckpt, tmp)
        os.replace(tmp, out)
    except (OSError, RuntimeError, SafetensorError, ConfigError, CheckpointError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        rotated = rotated_away(ckpt, run_dir, "it was exported")
        if rotated is not None:
            raise rotated from err
        if is_disk_full(err, out.parent):
            raise DiskFullError(f"disk full while exporting {ckpt} into {out} ({type(err).__name__}: "
                                f"{(str(err).splitlines() or [''])[0]}); nothing was written there: free space on "
                                "that disk and export again") from err
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("exported %s (%s) to %s: %s", ckpt, cfg.specialization,
                out, ", ".join(sorted(p.name for p in out.iterdir())))
    return out
