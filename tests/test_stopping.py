"""Ctrl-C and SIGTERM handling (accord.stopping) with real signals sent to this process: a repeat that a launcher
passes on within the window is the same stop, a later one stops at once; torchrun's serving processes note the
first signal and go on. The whole runs are in tests/e2e/test_interruptions.py (one process) and
tests/distributed/test_data_parallel.py (torchrun)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from accord.stopping import REPEAT_WINDOW_S, FollowProcessZero, GracefulStop, StoppedAtOnce

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signal handlers are installed in the main thread only")


def _signal(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)   # Python runs its handler between bytecodes of the main thread


@pytest.mark.parametrize("sig, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_repeat_within_the_window_is_the_same_stop(sig, name):
    with GracefulStop(lambda: "finishing step 1", repeat_window=60.0) as stop:
        _signal(sig)
        _signal(sig)
    assert stop.requested and stop.signal_name == name


def _handlers() -> dict:
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def test_without_a_window_the_second_signal_stops_at_once():
    before = _handlers()   # an earlier test in this process (ray.init) may have put its own in place
    with pytest.raises(StoppedAtOnce) as stopped:
        with GracefulStop(lambda: "finishing step 1", repeat_window=0.0):
            _signal(signal.SIGTERM)
            _signal(signal.SIGINT)
    assert stopped.value.signal_name == "Ctrl-C"
    assert _handlers() == before   # restored on the way out


def test_the_window_is_torchruns_only(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert GracefulStop(lambda: "").repeat_window == 0.0
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert GracefulStop(lambda: "").repeat_window == REPEAT_WINDOW_S


def test_a_serving_process_notes_the_first_signal_and_goes_on(caplog):
    before = _handlers()
    with caplog.at_level("INFO", logger="accord.stopping"):
        with FollowProcessZero(1, repeat_window=60.0) as follow:
            _signal(signal.SIGTERM)
            _signal(signal.SIGTERM)   # torchrun passing on the one it got: the same stop
    assert follow.signal_name == "SIGTERM"
    assert [r.getMessage() for r in caplog.records] == [
        "torchrun process 1: SIGTERM; process 0 finishes its step and stops this process"]
    with pytest.raises(StoppedAtOnce):   # after the window: someone insists
        with FollowProcessZero(1, repeat_window=0.0):
            _signal(signal.SIGINT)
            _signal(signal.SIGINT)
    assert _handlers() == before   # restored on the way out
