"""Where training batches come from, and how far into them a run has got (so a resume continues exactly).

Every source yields (captions, images) for this rank: a list of strings and a float tensor (B, 3, H, W) in [0, 1],
or, from pre-tokenized data (`pretokenized` True), the image token ids (B, fmap_size**2) the VQGAN made once.
Each source reports a `position` dict that goes into the checkpoint and is handed back to resume.

- ShapesStream: the built-in Shapes data, freshly rendered. Sample i of the stream is a deterministic function of
  (seed, i); rank r of W takes the rank-strided indices base + r, base + r + W, ..., so W processes with batch b see
  exactly the samples one process with batch W*b would see. With `caption_noise` p, sample i's caption has one
  attribute changed (dalle_lab.data.shapes.perturb_spec; the image stays true) when a draw from (seed, i) falls
  below p, so noise keeps every one of those properties.
- FolderBatches: an image-text folder, reshuffled every epoch from (seed, epoch), split rank-strided. Which of
  an image's captions is used is drawn from (seed, epoch, position in the epoch's order), not by the worker that
  happens to load it, so num_workers and a mid-epoch resume change nothing. Pre-tokenized data
  (dalle_lab.data.tokens.TokenShards) goes through the same class: the same order and caption draws as the folder
  it was made from.
- WebDatasetBatches: WebDataset shards (the loader splits shards across ranks, shuffles shards and samples from
  (seed, epoch)); resume replays the epoch's stream and skips the consumed batches.
"""
from __future__ import annotations

import torch

from dalle_lab.seeding import derive_seed

SHAPES_SPLIT = "train"
# The stream is unbounded in practice; ShapesDataset wants a length, and 2**31 - 1 samples is never exhausted.
SHAPES_STREAM_LENGTH = 2**31 - 1


class ShapesStream:
    pretokenized = False

    def __init__(self, batch_size: int, image_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 position: dict | None = None, caption_noise: float = 0.0):
        from dalle_lab.data.shapes import ShapesDataset

        if not 0.0 <= caption_noise <= 1.0:
            raise ValueError(f"--caption_noise {caption_noise} must be a probability in [0, 1]")
        self.dataset = ShapesDataset(split=SHAPES_SPLIT, length=SHAPES_STREAM_LENGTH, image_size=image_size, seed=seed)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.seed, self.caption_noise = seed, float(caption_noise)
        self.samples = int(position["samples"]) if position else 0  # global samples consumed, all ranks together
        self.epoch = 0  # the stream never ends: one endless epoch

    @property
    def position(self) -> dict:
        return {"kind": "shapes", "samples": self.samples}

    def next_batch(self):
        start = self.samples + self.rank
        indices = [start + j * self.world_size for j in range(self.batch_size)]
        self.samples += self.batch_size * self.world_size
        images, captions = self.dataset.batch(indices)
        if self.caption_noise > 0:  # at 0 nothing is drawn: the stream is exactly the noise-free one
            captions = [self.noisy_caption(i, caption) for i, caption in zip(indices, captions)]
        return captions, images

    def noisy_caption(self, index: int, caption: str) -> str:
        """Sample `index`'s caption after caption noise. The draws come from (seed, index) alone, so ranks, resumes
        and reruns agree; the first draw decides, so a larger p keeps the wrong captions of a smaller one."""
        import numpy as np

        from dalle_lab.data.shapes import perturb_caption

        rng = np.random.default_rng(derive_seed("caption_noise", self.seed, index))
        if rng.random() >= self.caption_noise:
            return caption
        return perturb_caption(caption, rng, split=SHAPES_SPLIT)  # a train caption: held-out pairs stay unseen


class FolderBatches:
    """A map-style dataset of (image, caption), epoch by epoch; drops the last incomplete global batch."""

    def __init__(self, dataset, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 position: dict | None = None, num_workers: int = 0, kind: str = "folder"):
        self.dataset, self.batch_size, self.seed, self.kind = dataset, batch_size, seed, kind
        self.pretokenized = kind == "tokens"  # items are (image token ids, caption): no VQGAN encoding to do
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.epoch = int(position["epoch"]) if position else 0
        self.batch_in_epoch = int(position["batch"]) if position else 0
        self.batches_per_epoch = len(dataset) // (batch_size * world_size)
        if self.batches_per_epoch == 0:
            raise ValueError(f"the dataset has {len(dataset)} usable samples, fewer than one global batch "
                             f"({batch_size} x {world_size} processes); lower --batch_size")
        self._iterator = None

    @property
    def position(self) -> dict:
        return {"kind": self.kind, "epoch": self.epoch, "batch": self.batch_in_epoch}

    def _epoch_items(self) -> list[tuple[int, int]]:
        """This rank's remaining (dataset index, caption draw) pairs of the epoch. The draw is a function of (seed,
        epoch, global position), so it is the same whichever rank, worker or resumed run loads the item."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        usable = order[: self.batches_per_epoch * self.batch_size * self.world_size]
        items = [(index, derive_seed("caption", self.seed, self.epoch, position))
                 for position, index in enumerate(usable)]
        mine = items[self.rank :: self.world_size]
        return mine[self.batch_in_epoch * self.batch_size :]

    def _start_epoch(self):
        from torch.utils.data import DataLoader

        items = self._epoch_items()
        batches = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        # the loader's generator only seeds its workers; seeded from (seed, rank, epoch), never the global RNG
        loader = DataLoader(_DrawnCaptions(self.dataset), batch_sampler=batches, num_workers=self.num_workers,
                            collate_fn=_collate, worker_init_fn=_worker_init if self.num_workers else None,
                            generator=torch.Generator().manual_seed(
                                derive_seed("loader", self.seed, self.rank, self.epoch)))
        self._iterator = iter(loader)

    def next_batch(self):
        if self._iterator is None:
            self._start_epoch()
        batch = next(self._iterator)
        self.batch_in_epoch += 1
        if self.batch_in_epoch == self.batches_per_epoch:  # count the epoch as done now, so --epochs stops here
            self.epoch, self.batch_in_epoch, self._iterator = self.epoch + 1, 0, None
        return batch


class WebDatasetBatches:
    """WebDataset shards through dalle_lab.data.webdataset_loader. Resume replays the stream and skips the batches
    already consumed (shards stream; there is no random access), so the position is the batch count."""

    pretokenized = False

    def __init__(self, urls, batch_size: int, image_size: int, seed: int = 0, position: dict | None = None,
                 num_workers: int = 0, long_captions=None, rank: int = 0):
        self.make_loader = lambda epoch: _webdataset_loader(urls, batch_size, image_size, seed, epoch, num_workers,
                                                            long_captions, rank)
        self.epoch = int(position["epoch"]) if position else 0
        self.batches = int(position["batch"]) if position else 0
        self._iterator = None

    @property
    def position(self) -> dict:
        return {"kind": "webdataset", "epoch": self.epoch, "batch": self.batches}

    def next_batch(self):
        if self._iterator is None:
            self._iterator = iter(self.make_loader(self.epoch))
            for _ in range(self.batches):
                next(self._iterator)
        try:
            batch = next(self._iterator)
        except StopIteration:
            self.epoch, self.batches = self.epoch + 1, 0
            self._iterator = iter(self.make_loader(self.epoch))
            batch = next(self._iterator)
        self.batches += 1
        images, captions = batch
        return list(captions), images


# samples shuffled within each worker's stream; shards are permuted too (dalle_lab.data.wds), both from (seed, epoch)
WDS_SHUFFLE_BUFFER = 1000


def _webdataset_loader(urls, batch_size, image_size, seed, epoch, num_workers, long_captions, rank):
    from dalle_lab.data import webdataset_loader

    # the loader finds the image (jpg/png/...) and txt members itself and splits shards across ranks and workers;
    # its generator (worker seeds) comes from (seed, rank, epoch), never from the global RNG
    return webdataset_loader(urls, batch_size=batch_size, num_workers=num_workers, image_size=image_size, seed=seed,
                             epoch=epoch, shuffle=WDS_SHUFFLE_BUFFER, long_captions=long_captions,
                             worker_init_fn=_worker_init if num_workers else None,
                             generator=torch.Generator().manual_seed(derive_seed("loader", seed, rank, epoch)))


class _DrawnCaptions(torch.utils.data.Dataset):
    """Items addressed by (index, caption draw): datasets with several captions per image (TextImageFolder's
    `get`) use the draw to pick one; single-caption datasets ignore it."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        index, draw = key
        get = getattr(self.dataset, "get", None)
        return get(index, caption_draw=draw) if get is not None else self.dataset[index]


def _worker_init(worker_id: int) -> None:
    """Ctrl-C reaches the whole process group; the main process stops at the next step boundary (see
    interrupt.py) and still needs its workers until then, so they ignore SIGINT (the main process ends them)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _collate(items):
    images, captions = zip(*items)
    return list(captions), torch.stack(list(images))


def epoch_size(source) -> int | None:
    """Optimizer steps are counted by the loop; this is the batches in one epoch (None: endless stream)."""
    return getattr(source, "batches_per_epoch", None)
