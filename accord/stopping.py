"""Stopping a run on Ctrl-C (SIGINT) or SIGTERM without losing a completed step, in one process and under
``torchrun``.

One process (:class:`GracefulStop`): the first signal asks the run to stop after the step in progress, which
is finished and checkpointed; a second one stops at once.

Under ``torchrun`` every process gets the signal, some of them twice: a terminal's Ctrl-C reaches every process
of its foreground group, torchrun's agent among them, and the agent sends each worker the signal it got once
more (as it does with a SIGTERM sent to the agent alone, or by a scheduler to every process of a job). Process 0
runs the trainer: a repeat within ``REPEAT_WINDOW_S`` of the first signal is that same stop, not a second one.
Processes 1..N-1 serve process 0's calls (:func:`accord.distributed.data_parallel.serve_worker`) under
:class:`FollowProcessZero`: they go on serving the step process 0 is finishing, and end when it tells them to
(or, if it stopped at once, when it is gone). torchrun kills them all after its own grace period
(``--shutdown-timeout``, 30 s by default), which must cover a step and its checkpoint for the step to be kept.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
EXIT_CODES = {"Ctrl-C": 130, "SIGTERM": 143}   # 128 + the signal's number, as a shell reports a process it ended
# under torchrun, a signal this many seconds after the first is that same stop passed on by the launcher
REPEAT_WINDOW_S = 2.0


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (it sets ``TORCHELASTIC_RUN_ID`` in its workers)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM (``signal_name``) stopped a run after the step it was in: the last completed
    step is checkpointed (``checkpoint``; None when no step completed) and the message says how to resume. A
    KeyboardInterrupt, so that code which does not know accord stops as on any Ctrl-C."""

    def __init__(self, message: str, step: int, checkpoint: Path | None, signal_name: str = "Ctrl-C"):
        super().__init__(message)
        self.step, self.checkpoint, self.signal_name = step, checkpoint, signal_name


class StoppedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C or SIGTERM (``signal_name``) while a graceful stop was under way: stopped without
    finishing the step."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


class _SignalScope:
    """Handles SIGINT and SIGTERM with ``_handle`` while a ``with`` block runs in the main thread (elsewhere signals
    keep their handlers), and puts back the handlers that were there before on the way out."""

    _previous: dict

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNAL_NAMES}
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        raise NotImplementedError


class GracefulStop(_SignalScope):
    """While active (a ``with`` block in the main thread), the first SIGINT (Ctrl-C) or SIGTERM (what a scheduler
    or ``kill`` sends before it kills) asks the run to stop after the step in progress, which is finished and
    checkpointed, so no completed step is lost and the resumed run is exactly the uninterrupted one; a second
    one of either raises :class:`StoppedAtOnce` (a KeyboardInterrupt) at once (the steps after the last
    checkpoint are then lost). ``signal_name``: the first one's ("Ctrl-C" or "SIGTERM"). Elsewhere (another
    thread) both keep Python's defaults. ``repeat_window``: seconds after the first signal in which another is the
    same stop (default ``REPEAT_WINDOW_S`` under torchrun, which passes on the signal its workers may have got
    already, and 0 elsewhere).

    Finishing the step, rather than abandoning it, keeps resume exact: the step's sampling has already moved
    the random streams a checkpoint saves, and a half-applied update cannot be saved as any step."""

    def __init__(self, describe: Callable[[], str], repeat_window: float | None = None):
        self.requested = False
        self.signal_name = "Ctrl-C"
        self._describe = describe
        self._previous: dict = {}
        if repeat_window is None:
            repeat_window = REPEAT_WINDOW_S if launched_by_torchrun() else 0.0
        self.repeat_window = repeat_window
        self._first = 0.0

    def _handle(self, signum, frame) -> None:
        name = SIGNAL_NAMES[signum]
        if self.requested and time.monotonic() - self._first < self.repeat_window:
            logger.debug("%s again within %.0f s of the first: the same stop, passed on by the launcher", name,
                         self.repeat_window)
            return
        if self.requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            raise StoppedAtOnce(name)
        self.requested, self.signal_name, self._first = True, name, time.monotonic()
        again = "Ctrl-C again" if name == "Ctrl-C" else "another SIGTERM or a Ctrl-C"
        logger.warning("%s: %s; %s to stop at once (the steps after the last checkpoint are then lost)", name,
                       self._describe(), again)


class FollowProcessZero(_SignalScope):
    """While active (a ``with`` block in the main thread of a torchrun process other than 0), SIGINT and SIGTERM
    do not end the process: process 0 got the same signal and finishes its step, whose calls this process
    serves, then tells it to stop. The first one is logged and ``signal_name`` set; another one after
    ``repeat_window`` seconds (a person insisting, not the launcher passing it on) raises :class:`StoppedAtOnce`."""

    def __init__(self, process: int, repeat_window: float = REPEAT_WINDOW_S):
        self.process, self.repeat_window = process, repeat_window
        self.signal_name: str | None = None
        self._first = 0.0
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        name = SIGNAL_NAMES[signum]
        if self.signal_name is None:
            self.signal_name, self._first = name, time.monotonic()
            logger.info("torchrun process %d: %s; process 0 finishes its step and stops this process", self.process,
                        name)
        elif time.monotonic() - self._first >= self.repeat_window:
            raise StoppedAtOnce(name)
