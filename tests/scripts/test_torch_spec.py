"""scripts/torch_spec.sh, the choice of torch build scripts/setup.sh installs: the CPU build where there is no
NVIDIA driver (the PyTorch CPU index when it answers), PyPI's CUDA build where there is one, the user's index when
set, and the plain name, fast, where no index answers. Run as bash runs it, against real local HTTP servers."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "torch_spec.sh"
NVIDIA_HERE = Path("/proc/driver/nvidia/version").exists()
BASH = shutil.which("bash") or "/bin/bash"


@pytest.fixture
def bin_dir(tmp_path):
    """A PATH of the script's tools only (python3, timeout), without a real nvidia-smi."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python3").symlink_to(sys.executable)
    if shutil.which("timeout"):
        (tools / "timeout").symlink_to(shutil.which("timeout"))
    return tools


def spec(bin_dir: Path, **env) -> str:
    full = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp"), "ACCORD_TORCH_VERSION": "2.13.0", **env}
    res = subprocess.run([BASH, str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.fixture
def cpu_index(tmp_path):
    """A local package index that answers: a directory with torch/ served over HTTP."""
    root = tmp_path / "index"
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(NVIDIA_HERE, reason="this machine has an NVIDIA driver: the script picks PyPI's CUDA build")
def test_no_driver_takes_the_cpu_index_when_it_answers(bin_dir, cpu_index):
    assert spec(bin_dir, ACCORD_TORCH_CPU_INDEX=cpu_index) == f"--index-url {cpu_index} torch==2.13.0"


def test_no_answer_falls_back_to_the_plain_name(bin_dir):
    """Offline (here download.pytorch.org does not resolve): pip's own index or mirror serves torch==2.13.0."""
    t = time.perf_counter()
    assert spec(bin_dir, ACCORD_TORCH_CPU_INDEX=f"http://127.0.0.1:{_closed_port()}") == "torch==2.13.0"
    assert time.perf_counter() - t < 5


@pytest.mark.slow
def test_an_index_that_never_answers_costs_at_most_five_seconds(bin_dir):
    with socket.socket() as silent:   # accepts connections (the backlog) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        t = time.perf_counter()
        out = spec(bin_dir, ACCORD_TORCH_CPU_INDEX=f"http://127.0.0.1:{silent.getsockname()[1]}")
        assert out == "torch==2.13.0" and time.perf_counter() - t < 8


def test_a_driver_takes_pypis_cuda_build(bin_dir, cpu_index):
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    assert spec(bin_dir, ACCORD_TORCH_CPU_INDEX=cpu_index) == "torch==2.13.0"


def test_the_users_index_wins(bin_dir, cpu_index):
    cuda = "https://download.pytorch.org/whl/cu128"
    got = spec(bin_dir, ACCORD_TORCH_INDEX=cuda, ACCORD_TORCH_CPU_INDEX=cpu_index)
    assert got == f"--index-url {cuda} torch==2.13.0"
    assert spec(bin_dir, ACCORD_TORCH_INDEX="", ACCORD_TORCH_CPU_INDEX=cpu_index) == "torch==2.13.0"


def test_setup_runs_what_the_script_prints():
    text = (REPO / "scripts" / "setup.sh").read_text()
    assert "scripts/torch_spec.sh" in text and 'pip install -q "${TORCH_ARGS[@]}"' in text
    assert 'python -m pip install -q "torch==' not in text   # no bare pin: that is PyPI's CUDA build
