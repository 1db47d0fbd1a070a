"""Where each policy's model lives: ``run.device`` and ``policies.<name>.device``.

A device setting is ``auto`` (CUDA if this process sees a GPU, else the CPU), ``cpu``, ``cuda``
(``cuda:0``) or ``cuda:N``. :func:`policy_devices` resolves every policy's setting before any model is
loaded and refuses what this machine cannot do (a CUDA device without CUDA, an index past the GPUs
present) with the devices that exist and the fix. Everything a policy computes follows its model:
inputs are built on the CPU and moved once, its sampling generators live on the model's device, and
checkpoints are loaded onto the CPU first (``map_location``) so that a run trained on a GPU resumes
on a CPU and the other way round.

Under ``run.backend: ray`` a policy's device is resolved inside its actor (:func:`actor_device`): Ray
sets the actor's ``CUDA_VISIBLE_DEVICES`` to the GPUs it reserved, so the first of them is ``cuda:0``
there; the driver only checks that a policy asking for CUDA reserves a GPU
(:func:`accord.config.rules.check_ray_devices`).

Random streams. A CPU generator's state (Mersenne Twister) and a CUDA generator's (Philox seed and
offset) cannot be converted into each other. A stream saved on one device type and loaded on the
other is reseeded from a hash of the saved state (:func:`restore_generator`, warned): the resumed run
is reproducible, but it is not the continuation an uninterrupted run on the first device would have
drawn (which would have sampled other tokens anyway: the kernels differ).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from accord.config import ConfigError, check_device_setting
from accord.config.rules import policy_setting
from accord.seeding import restored_stream_seed

logger = logging.getLogger(__name__)


def resolve_device(setting: str, key: str, *, cuda_count: int | None = None) -> torch.device:
    """The torch device of a setting on this machine, or a ConfigError naming what is available.

    ``cuda_count``: the number of visible GPUs (default: what torch sees; tests pass their own)."""
    check_device_setting(key, setting)
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    have = ["cpu"] + [f"cuda:{i}" for i in range(cuda_count)]
    if setting == "auto":
        return torch.device("cuda:0" if cuda_count else "cpu")
    if setting == "cpu":
        return torch.device("cpu")
    index = int(setting.partition(":")[2] or 0)
    if cuda_count == 0:
        raise ConfigError(f"{key}={setting}, but this machine has no CUDA device (torch {torch.__version__}, "
                          f"available: {have}); set {key}=cpu (or auto), or run on a machine with a GPU and a CUDA "
                          "build of torch")
    if index >= cuda_count:
        raise ConfigError(f"{key}={setting}, but this process sees {cuda_count} GPU(s) (available: {have}); set "
                          f"{key} to one of them (check CUDA_VISIBLE_DEVICES)")
    return torch.device(f"cuda:{index}")


def policy_devices(cfg, names: list[str], *, cuda_count: int | None = None) -> dict[str, torch.device]:
    """Every named policy's device on this machine (local backend), checked before any model is loaded.

    ``specialization: lora`` keeps all adapters on one base model, so its policies must resolve to one
    device."""
    out = {n: resolve_device(*policy_setting(cfg, n), cuda_count=cuda_count) for n in names}
    if cfg.specialization == "lora" and len(set(out.values())) > 1:
        desc = ", ".join(f"{n}: {d}" for n, d in sorted(out.items()))
        raise ConfigError(f"specialization=lora keeps every adapter on one base model, but the policies resolve to "
                          f"different devices ({desc}); give them one device (run.device, and no per-policy device)")
    check_vllm_devices(cfg, out)
    for n, d in out.items():
        logger.info("policy %s on %s", n, d)
    return out


def check_vllm_devices(cfg, devices: dict[str, torch.device]) -> None:
    """rollout.generation_backend=vllm in one process (local backend): every CUDA engine on cuda:0, at most one
    of them, and sleep mode only for CUDA engines; refused before any model is loaded.

    vLLM's in-process worker always uses the process's first GPU, so an engine for a policy on ``cuda:1``
    would land on ``cuda:0``; its sleep-mode allocator serves one engine per process, and a second engine
    at the default utilisation fails vLLM's free-memory check. Policies of ``specialization: lora`` share one
    engine. Under ``run.backend: ray`` each actor is a process of its own, with its GPU as ``cuda:0``."""
    r = cfg.rollout
    if r.generation_backend != "vllm":
        return
    engines: dict[torch.device, list[str]] = {}
    for n, d in sorted(devices.items()):
        engines.setdefault(d, []).append(n)
    if cfg.specialization == "lora":   # one base, one engine for every adapter
        engines = {d: ["+".join(ns)] for d, ns in engines.items()}
    ray = ("run.backend=ray with one GPU per policy (ray.num_gpus_per_policy=1: each actor's GPU is its cuda:0)")
    cuda = {d: ns for d, ns in engines.items() if d.type == "cuda"}
    for d, ns in cuda.items():
        if (d.index or 0) != 0:
            key = policy_setting(cfg, ns[0].split("+")[0])[1]
            raise ConfigError(f"{key}={d}, but rollout.generation_backend=vllm starts the engine of policy "
                              f"{ns[0]!r} on the first GPU of its process (cuda:0); use {ray}, or set {key}=cuda:0")
    names = [n for ns in cuda.values() for n in ns]
    if len(names) > 1:
        raise ConfigError(f"policies {names} would each start a vLLM engine on a GPU in this process, which vLLM "
                          f"does not support (one engine per process; a second fails its free-memory check); use "
                          f"{ray}, or specialization=lora (one engine serves every adapter)")
    if r.vllm_sleep in (1, 2) and not cuda:
        raise ConfigError(f"rollout.vllm_sleep={r.vllm_sleep} needs a CUDA engine, but every policy is on the CPU "
                          "(vLLM's CPU backend has no sleep mode); set rollout.vllm_sleep=auto or off")


def actor_device(setting: str, key: str, gpu_ids: list) -> torch.device:
    """A policy's device inside its Ray actor: ``auto`` and ``cuda`` are the first GPU Ray gave it
    (``cuda:0`` under the ``CUDA_VISIBLE_DEVICES`` Ray sets), the CPU when it reserved none."""
    if setting == "auto":
        setting = "cuda" if gpu_ids else "cpu"
    return resolve_device(setting, key)


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A random stream on ``device`` (the CPU one is exactly ``torch.Generator().manual_seed(seed)``)."""
    if device.type == "cpu":
        return torch.Generator().manual_seed(seed)
    return torch.Generator(device=device).manual_seed(seed)


def restore_generator(gen: torch.Generator, state, saved_device: str | None, what: str) -> None:
    """Set ``gen`` from a saved state; across device types (a CPU state into a CUDA stream or back), reseed
    from a hash of the saved state instead (see the module docstring)."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
        raise ValueError(f"{what}: the saved random stream is a {type(state).__name__}, not a generator's state")
    if saved_device is not None and not isinstance(saved_device, str):
        raise ValueError(f"{what}: the saved random stream's device is {str(saved_device)[:40]!r}, not a device's name")
    saved_device = saved_device or "cpu"  # checkpoints from before device support were all CPU
    if saved_device == gen.device.type:
        gen.set_state(state)
        return
    gen.manual_seed(restored_stream_seed(state.cpu().numpy().tobytes()))
    logger.warning("%s: random stream saved on %s, resumed on %s; reseeded from the saved state (reproducible, but "
                   "not the stream an uninterrupted %s run would have drawn)", what, saved_device, gen.device.type,
                   saved_device)


def cuda_bf16(device: torch.device) -> bool:
    """Whether a CUDA device computes in bf16 natively (compute capability >= 8: Ampere and later)."""
    return torch.cuda.get_device_capability(device)[0] >= 8


# --- bf16: whether this device has the units, and training.bf16 as a decision -------------------------


def _cpu_flags(cpuinfo: str | None) -> set[str] | None:
    """The flags of ``cpuinfo`` (x86 ``flags``, Arm ``Features``), read from ``/proc/cpuinfo`` when None; None when
    there is no /proc to read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def cpu_bf16_units(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has bf16 instructions at all (AMX or AVX512-BF16 on x86, BF16 on Arm), so that bf16
    matmuls are not emulated, from torch's dispatch level or the flags of ``/proc/cpuinfo`` (``cpuinfo``: its
    text, for tests); None when it cannot be told (no /proc)."""
    if cpuinfo is None and torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX"):
        return True
    flags = _cpu_flags(cpuinfo)
    return None if flags is None else bool(flags & {"amx_bf16", "avx512_bf16", "bf16"})


def cpu_bf16_matrix_units(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has bf16 *matrix* units, where bf16 autocast makes an update faster than fp32: Intel AMX
    on x86 (``amx_bf16``), BF16 on Arm (its BFMMLA matrix instruction). AVX512-BF16 alone does not count: on a
    2-core Intel Xeon with ``avx512_bf16`` and no AMX, an update of 16 SmolLM2-135M samples took 23.0 s under bf16
    autocast against 14.4 s in fp32 (``bench/update_speed.py``, 2026-11-29), where a Xeon with AMX took 8.0 s
    against 12.0 s; on a 2-core AMD EPYC Zen 5 (``avx512_bf16``, no AMX) the default job's update of 8 samples took
    1.36 s against 3.50 s (2026-12-01) and on an AMD EPYC Zen 4 3.15 s against 4.50 s (2026-12-02), so there bf16
    is faster but left to ``training.bf16: true`` (the default job's learning under it measured on the Zen 5
    only). ``cpuinfo`` as for :func:`cpu_bf16_units` (a plain ``bf16`` flag is Arm's; x86 spells its flags
    ``avx512_bf16`` and ``amx_bf16``); None when it cannot be told."""
    if cpuinfo is None and torch.backends.cpu.get_cpu_capability() == "AMX":
        return True
    flags = _cpu_flags(cpuinfo)
    return None if flags is None else bool(flags & {"amx_bf16", "bf16"})


def resolve_bf16(setting: bool | str, device: torch.device | None = None) -> bool:
    """``training.bf16`` as a decision for the policy's ``device`` (default the CPU): 'auto' is on exactly
    where the device has bf16 matrix units (CUDA compute capability >= 8; on a CPU, :func:`cpu_bf16_matrix_units`);
    true on a device without bf16 instructions is honoured with a warning."""
    if device is not None and device.type == "cuda":
        has = cuda_bf16(device)
        if setting == "auto":
            logger.info("training.bf16=auto: %s on %s (compute capability %s)", "bf16 autocast for updates" if has
                        else "fp32 updates", device, ".".join(map(str, torch.cuda.get_device_capability(device))))
            return has
        if setting and not has:
            logger.warning("training.bf16=true on %s (compute capability %s < 8): bf16 is emulated there and slow; "
                           "set training.bf16=auto", device, torch.cuda.get_device_capability(device))
        return bool(setting)
    if setting == "auto":
        use = cpu_bf16_matrix_units() is True
        logger.info("training.bf16=auto: %s (torch CPU capability %s)", "bf16 autocast for updates" if use else
                    "fp32 updates, no bf16 matrix units (AMX, Arm BF16) found", torch.backends.cpu.get_cpu_capability())
        return use
    if setting:
        warn_if_no_bf16_units()
    return bool(setting)


def warn_if_no_bf16_units() -> None:
    """training.bf16 on a CPU without bf16 instructions: matmuls fall back to slow emulation."""
    if cpu_bf16_units() is False:
        logger.warning(
            "training.bf16=true on a CPU without bf16 instructions (no amx_bf16, avx512_bf16 or bf16 flag; torch "
            "reports %s): bf16 matmuls run 10-100x slower than fp32 here; set training.bf16=false",
            torch.backends.cpu.get_cpu_capability())
