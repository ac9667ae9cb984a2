"""Where every random draw of a training run comes from.

A resumed run must draw exactly what the uninterrupted run drew, and a resume cannot replay global state (a
DataLoader that took one extra seed from the global RNG, a worker that handled another batch after the restart).
So every draw that shapes training is a pure function of the run's seed and *where* in the run it happens:

- initial weights: torch.manual_seed(seed) before the model is built (the same on every rank);
- caption dropout and attention/feed-forward dropout (drawn by the model from torch's global RNG): the global RNG
  is re-seeded before every micro-batch from (seed, rank, step, micro-batch attempt) - see `seed_micro_batch`;
- which caption of an image is used, the epoch's sample order, DataLoader worker seeds, shard and sample shuffles:
  generators seeded from (seed, epoch, position) in batches.py and dalle_lab.data.wds.

`derive_seed` turns such a tuple into a seed without Python's `hash()` (salted per process for strings).
"""
from __future__ import annotations

import hashlib

_SEED_MASK = (1 << 63) - 1


def derive_seed(*parts) -> int:
    """A 63-bit seed that depends on every part (ints or strings), the same in every process and on every machine."""
    digest = hashlib.blake2b(repr(tuple(parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


def generator(*parts):
    """A CPU torch.Generator seeded from `parts` (see derive_seed)."""
    import torch

    return torch.Generator().manual_seed(derive_seed(*parts))


def seed_micro_batch(seed: int, rank: int, step: int, attempt: int) -> None:
    """Re-seed torch's global RNG (CPU and every CUDA device) for one micro-batch: `step` is the 0-based optimizer
    step, `attempt` counts this step's micro-batches including skipped non-finite ones. Caption dropout and dropout
    inside the model then depend only on where the micro-batch is, never on what ran before it (a resume, a sample
    grid, a different logging interval)."""
    import torch

    torch.manual_seed(derive_seed("micro-batch", seed, rank, step, attempt))
