"""One intra-op thread for few-row decode passes, restored afterwards.

A cached decode step at small batch is many tiny ops; with several threads each op wakes the OpenMP team, and under
OMP_WAIT_POLICY=PASSIVE (what run.py and a shared machine want) every wake-up is a futex round trip that costs more
than the op's own arithmetic. Measured at 4 rows with 2 threads on a shared 2-core machine: about a quarter less
CPU time per generation on one thread (docs/performance.md, benchmarks/perf/step_profile.py --levers threads).
The 64-row bound was the issue's suggestion, not a measured crossover: re-measure it on an idle machine.
torch.set_num_threads is process-wide: a program that decodes from several Python threads at once should pass
single_thread=False.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

# Passes of fewer rows than this run on one thread (rows = batch, doubled under classifier-free guidance).
SINGLE_THREAD_MAX_ROWS = 64


@contextmanager
def decode_threads(rows: int, enabled: bool = True):
    """Within the block torch uses one thread when rows < SINGLE_THREAD_MAX_ROWS; the count is restored on exit,
    exceptions included."""
    before = torch.get_num_threads()
    if not enabled or rows >= SINGLE_THREAD_MAX_ROWS or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
