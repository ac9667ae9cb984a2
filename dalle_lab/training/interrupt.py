"""A clean stop: Ctrl-C (SIGINT) or SIGTERM (what torchrun, schedulers and `kill` send) asks the loop to stop at
the next optimizer-step boundary, where the weights, optimizer, schedule and data position agree, and save that
step. A signal that lands mid-step is only recorded; the step finishes first. A second Ctrl-C stops at once with
KeyboardInterrupt and saves nothing (the last checkpoint stays valid).
"""
from __future__ import annotations

import signal
import threading

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
