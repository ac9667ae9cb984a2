"""One intra-op thread for few-row decode passes where OpenMP threads sleep between ops, restored afterwards.

A cached decode step at small batch is many tiny ops; with several threads each op wakes the OpenMP team, and under
OMP_WAIT_POLICY=PASSIVE (what a shared machine wants) every wake-up is a futex round trip that costs more than the
op's own arithmetic. Under OpenMP's default policy the threads spin a while before they sleep, and there the second
thread pays. So one thread is chosen only under PASSIVE (measured at 4 rows with 2 threads: docs/performance.md,
"Threads and the wait policy", lab/perf/wait_policy.py). Machines with many more cores were not measured: there all threads spinning over
tiny ops may lose; set torch.set_num_threads as measurements there say.
The 64-row bound was the issue's suggestion, not a measured crossover.
torch.set_num_threads is process-wide: a program that decodes from several Python threads at once should pass
single_thread=False.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

# Passes of fewer rows than this run on one thread (rows = batch, doubled under classifier-free guidance).
SINGLE_THREAD_MAX_ROWS = 64


def threads_sleep_between_ops() -> bool:
    """Whether this process's OpenMP threads sleep at once when idle (OMP_WAIT_POLICY=PASSIVE). OpenMP reads the
    variable at start-up; this reads the environment as it is now, so set it before Python starts, not after."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"


@contextmanager
def decode_threads(rows: int, enabled: bool = True):
    """Within the block torch uses one thread when rows < SINGLE_THREAD_MAX_ROWS and OpenMP threads sleep between
    ops; the count is restored on exit, exceptions included."""
    before = torch.get_num_threads()
    if not enabled or rows >= SINGLE_THREAD_MAX_ROWS or before == 1 or not threads_sleep_between_ops():
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
