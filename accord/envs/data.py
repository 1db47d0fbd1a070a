"""Whether the Hugging Face Hub can be reached now (for loaders that fall back to offline data)."""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlparse

HUB_PROBE_S = 2.0


def hub_reachable(timeout: float = HUB_PROBE_S) -> bool:
    """Whether the Hub endpoint (``$HF_ENDPOINT``, default huggingface.co) accepts a TCP connection
    within ``timeout`` seconds. The probe runs in a daemon thread, so a stalled DNS lookup cannot hold
    the caller longer than that."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    answer: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, name="accord-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(answer and answer[0])
