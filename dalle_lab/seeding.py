"""Where every random draw of a training run comes from.

A resumed run must draw exactly what the uninterrupted run drew, and a resume cannot replay global state (a
DataLoader that took one extra seed from the global RNG, a worker that handled another batch after the restart).
So every draw that shapes training is a pure function of the run's seed and *where* in the run it happens:

- initial weights: torch.manual_seed(seed) before the model is built (the same on every rank);
- caption dropout and attention/feed-forward dropout (drawn by the model from torch's global RNG): the global RNG
  is re-seeded before every micro-batch from (seed, rank, step, micro-batch attempt) - see `seed_micro_batch`;
- which caption of an image is used, the epoch's sample order, DataLoader worker seeds, shard and sample shuffles:
  generators seeded from (seed, epoch, position) in batches.py and dalle_lab.data.wds.

`derive_seed` turns such a tuple into a seed without Python's `hash()` (salted per process for strings). It is
the package's one seeding scheme: training, the data streams and align's samplers all draw from it.
"""
from __future__ import annotations

import hashlib

import torch

_SEED_MASK = (1 << 63) - 1


def derive_seed(*parts) -> int:
    """A 63-bit seed that depends on every part (ints or strings), the same in every process and on every machine."""
    digest = hashlib.blake2b(repr(tuple(parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


def seeded_generator(device, *parts) -> torch.Generator:
    """A torch.Generator on `device` whose stream depends only on `parts` (see derive_seed): align's sampling and
    chunk orders, so the same tokens come out whatever the number of processes. The parts are integers; they are
    converted to int first, so a numpy or tensor integer gives the stream of the same Python int (repr differs)."""
    return torch.Generator(device=device).manual_seed(derive_seed(*(int(part) for part in parts)))


def seed_micro_batch(seed: int, rank: int, step: int, attempt: int) -> None:
    """Re-seed torch's global RNG (CPU and every CUDA device) for one micro-batch: `step` is the 0-based optimizer
    step, `attempt` counts this step's micro-batches including skipped non-finite ones. Caption dropout and dropout
    inside the model then depend only on where the micro-batch is, never on what ran before it (a resume, a sample
    grid, a different logging interval)."""
    torch.manual_seed(derive_seed("micro-batch", seed, rank, step, attempt))
