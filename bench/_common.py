"""Shared by the throughput benchmarks against other frameworks (``vs_trl.py``, ``vs_comlrl.py``): the
subprocess environment, the tiny model both sides load, the peer's own virtual environment, running
one side and summarising its rounds."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_VERSION = "2.13.0"


def worker_env(threads: int, bench_dir: Path, omp_wait_policy: str = "",
               extra: dict[str, str] | None = None) -> dict[str, str]:
    """Offline, telemetry-free, fixed-thread environment for both framework subprocesses."""
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    env.update({
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": str(bench_dir / "hf-home"),
        "HF_DATASETS_CACHE": str(bench_dir / "hf-home" / "datasets"),
        "WANDB_MODE": "disabled",
        "WANDB_DISABLED": "true",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(bench_dir / "wandb"),
        "DO_NOT_TRACK": "1",
        "TQDM_DISABLE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    })
    if omp_wait_policy:
        # PASSIVE: idle OpenMP workers sleep instead of spinning. On a machine shared with other
        # jobs, spinning workers of a 2-thread process fight for the cores and single steps can
        # take 10-100x longer; with passive waiting timings stay stable. Same setting both sides.
        env["OMP_WAIT_POLICY"] = omp_wait_policy
    else:
        env.pop("OMP_WAIT_POLICY", None)
    return env


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def installed_version(dist: str) -> str:
    from importlib.metadata import version
    return version(dist)


def ensure_model(args, bench_dir: Path) -> Path:
    """The tiny Qwen2 of ``args`` (hidden, layers, heads, vocab, seed), built once by accord and saved
    with ``save_pretrained`` under ``bench_dir/models``; both frameworks load that directory."""
    name = f"tiny-qwen2-h{args.hidden}-l{args.layers}-a{args.heads}-v{args.vocab}-s{args.seed}"
    path = bench_dir / "models" / name
    if (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file():
        return path
    from accord.models import build_tiny_model

    model, tokenizer = build_tiny_model(arch="qwen2", hidden_size=args.hidden, num_layers=args.layers,
                                        num_heads=args.heads, vocab_size=args.vocab, seed=args.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=name + ".tmp.", dir=path.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if path.exists():
        shutil.rmtree(path)
    shutil.move(str(tmp), str(path))
    return path


def ensure_peer_venv(bench_dir: Path, package: str, version: str, reinstall: bool,
                     also_import: tuple[str, ...] = ()) -> tuple[Path, float]:
    """Create (or reuse) ``bench_dir/venv-<package>`` holding ``package==version`` on the CPU torch wheel,
    with transformers and tokenizers pinned to this interpreter's versions; return (python, seconds
    spent installing). The install is checked: the pinned versions, no CUDA build, no vllm."""
    venv = bench_dir / f"venv-{package}"
    py = venv / "bin" / "python"
    marker = venv / f".vs_{package}.json"
    want = {
        package: version,
        "torch": TORCH_VERSION,
        "transformers": installed_version("transformers"),
        "tokenizers": installed_version("tokenizers"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    if not reinstall and py.exists() and marker.is_file():
        try:
            if json.loads(marker.read_text()) == want:
                return py, 0.0
        except ValueError:
            pass
    if venv.exists():
        shutil.rmtree(venv)
    print(f"[bench] creating {venv} (torch=={TORCH_VERSION}, {package}=={version}, "
          f"transformers=={want['transformers']}, tokenizers=={want['tokenizers']})", file=sys.stderr)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text(f"torch=={TORCH_VERSION}\ntransformers=={want['transformers']}\n"
                           f"tokenizers=={want['tokenizers']}\n")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    env = dict(os.environ, PIP_NO_INPUT="1")
    env.pop("PYTHONPATH", None)

    def pip_install(*reqs: str) -> None:
        print(f"[bench]   pip install {' '.join(reqs)}", file=sys.stderr)
        proc = subprocess.run(pip + list(reqs), check=False, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"pip install {' '.join(reqs)} failed in {venv}:\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")

    # torch first and alone: a bare `torch` requirement resolved later could pull a CUDA build
    pip_install(f"torch=={TORCH_VERSION}")
    pip_install("-c", str(constraints), f"{package}=={version}")
    modules = ", ".join((package,) + also_import)
    versions = ", ".join(f"'{m}': {m}.__version__" for m in (package,) + also_import)
    check = subprocess.run(
        [str(py), "-c", (f"import json, torch, transformers, importlib.util as u, {modules}; print(json.dumps("
                         "{'torch': torch.__version__, 'cuda': torch.version.cuda, 'transformers': "
                         f"transformers.__version__, {versions}, 'vllm': u.find_spec('vllm') is not None}}))")],
        check=True, capture_output=True, text=True, env=worker_env(1, bench_dir))
    got = json.loads(check.stdout.strip().splitlines()[-1])
    if (not got["torch"].startswith(TORCH_VERSION) or got["cuda"] is not None or got[package] != version
            or got["transformers"] != want["transformers"] or got["vllm"]):
        raise SystemExit(f"the {package} venv has unexpected versions: {got}; remove {venv} and retry")
    seconds = time.perf_counter() - t0
    marker.write_text(json.dumps(want))
    print(f"[bench] {package} venv ready in {seconds:.1f} s: {got}", file=sys.stderr)
    return py, seconds


def run_worker(cmd: list[str], env: dict, label: str, timeout: float, tag: str) -> dict:
    """Run one framework's side; its result is the last stdout line that starts with ``tag`` (JSON)."""
    print(f"[bench] running {label} (load average {os.getloadavg()[0]:.2f}) ...", file=sys.stderr)
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(REPO))
    lines = [line for line in proc.stdout.splitlines() if line.startswith(tag)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
        raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{tail}")
    res = json.loads(lines[-1][len(tag):])
    res["loadavg_1min_after"] = os.getloadavg()[0]  # other jobs on the machine disturb timings
    print(f"[bench]   {label}: {res['completions_per_s']:.1f} completions/s, steps "
          f"{' '.join(f'{t:.2f}' for t in res['step_times_s'])} s", file=sys.stderr)
    return res


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def summarize(runs: list[dict]) -> dict:
    """Best round (highest throughput: least disturbed by other load) plus robust aggregates."""
    best = max(runs, key=lambda r: r["completions_per_s"])
    all_steps = [t for r in runs for t in r["step_times_s"]]
    per_step = best["completions_per_step"]
    return {
        **best,
        "rounds": len(runs),
        "completions_per_s_rounds": [r["completions_per_s"] for r in runs],
        "completions_per_s_median_round": median([r["completions_per_s"] for r in runs]),
        "median_step_s": median(all_steps),
        "completions_per_s_median_step": per_step / median(all_steps),
        "completions_per_cpu_s": per_step * best["steps"] / best["measured_cpu_s"],
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
    }
