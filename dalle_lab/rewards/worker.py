"""Rewards computed in a background thread, so scoring one batch overlaps with sampling the next (as DDPO does)."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from dalle_lab.rewards.builtin import RewardFn


class RewardWorker:
    """Scores batches in a background thread so reward computation overlaps with sampling (as DDPO does).

    `future = worker.submit(images, prompts)` returns at once; `future.result()` gives the scores. Images are
    detached and moved to the CPU first so the sampler can keep using its own buffers. PIL's JPEG encoder and the
    checker release the GIL for much of their work, so one worker thread is enough to hide their cost.
    """

    def __init__(self, reward: RewardFn, max_workers: int = 1):
        self.reward = reward
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reward")

    def submit(self, images, prompts: Sequence[str]) -> Future:
        images = images.detach().cpu() if hasattr(images, "detach") else images
        return self._executor.submit(self.reward, images, list(prompts))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "RewardWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
