"""A clean stop: Ctrl-C (SIGINT) or SIGTERM (what torchrun, schedulers and `kill` send) asks the loop to stop at
the next optimizer-step boundary, where the weights, optimizer, schedule and data position agree, and save that
step. A signal that lands mid-step is only recorded; the step finishes first. A second Ctrl-C stops at once with
KeyboardInterrupt and saves nothing (the last checkpoint stays valid).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    """Context manager: while active, the stop signals set `requested` instead of killing the process."""

    def __init__(self, notify=None):
        self.requested = False
        self.signal_name = None
        self._notify = notify  # called once with a message when the first signal arrives
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user does not want to wait for the step
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        if self._notify is not None:
            self._notify(f"{self.signal_name}: stopping after the current step, which is then saved "
                         "(Ctrl-C again to stop at once without saving)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False


HOLD_VARIABLE = "DALLE_LAB_HOLD_AFTER_STEP"


class StepHold:
    """A test hook: hold the run after optimizer step k until a stop is requested or the process is killed.

    The kill-and-resume tests set DALLE_LAB_HOLD_AFTER_STEP=k. After step k, and its checkpoint where one falls due,
    every rank writes `<output_dir>/held-after-step-<k>.rank<r>` and waits. The test waits for that file, then sends
    its signal: the run cannot finish before the signal on any machine, however fast, and no test sleeps for a
    guessed time. Unset (always, outside the tests) it does nothing."""

    def __init__(self, step: int | None, output_dir: Path, rank: int):
        self.step, self.output_dir, self.rank = step, Path(output_dir), rank

    @classmethod
    def from_environment(cls, output_dir, rank: int) -> "StepHold":
        value = os.environ.get(HOLD_VARIABLE)
        return cls(int(value) if value else None, output_dir, rank)

    def marker(self, step: int) -> Path:
        return self.output_dir / f"held-after-step-{step}.rank{self.rank}"

    def after_step(self, step: int, stop_requests: StopRequests) -> None:
        if step != self.step:
            return
        self.marker(step).write_text("held\n")
        while not stop_requests.requested:  # a SIGINT / SIGTERM sets it; SIGKILL ends the process here
            time.sleep(0.01)
