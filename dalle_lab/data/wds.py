"""WebDataset tar shards: image + txt per sample, split across ranks (processes) and DataLoader workers.

Each sample in a shard is a group of files sharing a key, e.g. `000123.jpg` + `000123.txt` (extensions as in
`IMAGE_EXTENSIONS`; the txt may hold several caption lines, one is drawn per access). Shards are dealt out
round-robin: rank r of R gets shards r, r+R, ...; within a rank, DataLoader worker w of W gets every W-th of
those. So each shard is read by exactly one worker of one rank per epoch, and you want at least R*W shards.
Samples that cannot be decoded (no image, no caption, corrupt image) are logged and skipped.

With `shuffle=n`, every draw is a function of (seed, epoch, ...), never of global state, so the same epoch can be
replayed exactly (what a resumed training run does): the shard list is permuted from (seed, epoch) before it is
dealt out (the same permutation on every rank), and each worker shuffles its samples in a buffer of n seeded from
(seed, epoch, rank, worker). Which caption line of a sample is used is drawn from (seed, epoch, shard, key).
"""
from __future__ import annotations

import io
import logging
import os
import random
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Iterator, Sequence

from ..extras import needs_extra
from ..seeding import derive_seed
from .folder import IMAGE_EXTENSIONS
from .transforms import load_image

logger = logging.getLogger(__name__)

_IMAGE_KEYS = tuple(extension.lstrip(".") for extension in IMAGE_EXTENSIONS)


def distributed_rank() -> tuple[int, int]:
    """(rank, world_size) from torch.distributed when it is initialised, else from RANK/WORLD_SIZE, else (0, 1)."""
    import os

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def expand_urls(urls) -> list[str]:
    """Shard paths from a brace pattern ("data/shard-{000..099}.tar"), a directory (its *.tar files, sorted, as
    DALLE-pytorch read one) or a list. Every local shard is checked to exist here, so a typo is one line naming
    the first missing shard before anything is built, not an error from a worker mid-epoch."""
    with needs_extra("data", "reading WebDataset shards"):
        import webdataset as wds

    if isinstance(urls, (str, os.PathLike)) and Path(urls).expanduser().is_dir():
        return shards_in_directory(Path(urls).expanduser())
    if isinstance(urls, (str, os.PathLike)):
        shards = list(wds.shardlists.expand_urls(str(urls)))
    else:
        shards = [str(url) for url in urls]
    check_shards_exist(shards, urls)
    return shards


def shards_in_directory(directory: Path) -> list[str]:
    """The directory's *.tar shards, sorted by name (every rank deals out the same order)."""
    shards = sorted(str(path) for path in directory.glob("*.tar") if path.is_file())
    if not shards:
        raise ValueError(f"{directory} holds no .tar shards: put the WebDataset shards there, or give their paths "
                         "or a brace pattern, e.g. 'shards/data-{000..009}.tar'")
    return shards


def _is_local(url: str) -> bool:
    # webdataset also opens URLs (http://, s3://, ...) and commands (pipe:...): those cannot be checked up front
    return "://" not in url and not url.startswith("pipe:")


def check_shards_exist(shards: Sequence[str], given) -> None:
    """A FileNotFoundError naming the first local shard that is not a file, and how many of them are missing."""
    missing = [url for url in shards if _is_local(url) and not Path(url.removeprefix("file:")).expanduser().is_file()]
    if missing:
        more = f" ({len(missing)} of the {len(shards)} shards are missing)" if len(missing) > 1 else ""
        raise FileNotFoundError(f"WebDataset shard {missing[0]} does not exist{more}: check the path or brace "
                                f"pattern {given if isinstance(given, str) else missing[0]!s}")


def shard_samples(url: str) -> Iterator[dict]:
    """The raw samples of one shard in file order, unsplit (for tools that read every shard once: pretokenize)."""
    with needs_extra("data", "reading WebDataset shards"):
        import webdataset as wds

    return iter(wds.WebDataset([url], shardshuffle=False, nodesplitter=None, empty_check=False))


def shard_captions(path) -> Iterator[str]:
    """Every non-blank caption line of a shard's samples that have an image and a txt (what training reads), in
    file order, for training a vocabulary. Read with tarfile, so it needs no webdataset; a txt that is not UTF-8
    raises a ValueError naming the shard and member (training would read it with replacement characters)."""
    import tarfile

    with tarfile.open(path) as shard:
        members = [m for m in shard.getmembers() if m.isfile()]
        # webdataset's key: the member's path up to the first dot of its file name
        keys_with_image = {_sample_key(m.name) for m in members if _extension(m.name) in _IMAGE_KEYS}
        for member in members:
            if _extension(member.name) != "txt" or _sample_key(member.name) not in keys_with_image:
                continue
            try:
                text = shard.extractfile(member).read().decode("utf-8-sig")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{member.name} is not UTF-8 text ({error.reason} at byte {error.start}): "
                                 "write the shard's captions as UTF-8") from error
            yield from (line.strip() for line in text.splitlines() if line.strip())


def _sample_key(name: str) -> str:
    directory, _, base = name.rpartition("/")
    return f"{directory}/{base.split('.', 1)[0]}"


def _extension(name: str) -> str:
    base = name.rpartition("/")[2]
    return base.split(".", 1)[1].lower() if "." in base else ""


def _split_by_rank(shards: Iterator[dict], rank: int, world_size: int) -> Iterator[dict]:
    return islice(shards, rank, None, world_size)


def _seed(*parts) -> int:
    return derive_seed(*parts)


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return info.id if info is not None else 0


def _shuffle_samples(samples: Iterator, buffer_size: int, seed: int, epoch: int, rank: int) -> Iterator:
    """A buffer shuffle whose generator is seeded from (seed, epoch, rank, worker): replayable."""
    rng = random.Random(_seed("wds-samples", seed, epoch, rank, _worker_id()))
    buffer = []
    for sample in samples:
        if len(buffer) < buffer_size:
            buffer.append(sample)
            continue
        index = rng.randrange(buffer_size)
        yield buffer[index]
        buffer[index] = sample
    rng.shuffle(buffer)
    yield from buffer


class BadSample(ValueError):
    """A shard sample that cannot be used (no image, no caption, corrupt image); the message says why."""


def sample_location(sample: dict) -> str:
    return f"{sample.get('__url__', '?')}:{sample.get('__key__', '?')}"


def read_sample(sample: dict, image_size: int) -> tuple:
    """(image (3, S, S) in [0, 1], every caption line) of one raw shard sample; BadSample says why it is unusable.
    The one place a shard sample is read: training (`_decode`) and pre-tokenizing (pretokenize.py) both use it."""
    image_key = next((key for key in _IMAGE_KEYS if key in sample), None)
    if image_key is None or "txt" not in sample:
        raise BadSample(f"needs an image ({'/'.join(_IMAGE_KEYS)}) and a txt, has "
                        f"{sorted(k for k in sample if not k.startswith('__'))}")
    captions = [line.strip() for line in sample["txt"].decode("utf-8", "replace").splitlines() if line.strip()]
    if not captions:
        raise BadSample("empty caption")
    try:
        image = load_image(io.BytesIO(sample[image_key]), image_size)
    except Exception as error:  # PIL raises many types for bad files
        raise BadSample(f"corrupt image ({type(error).__name__}: {error})") from error
    return image, captions


def _decode(samples: Iterator[dict], image_size: int, tokenizer, text_seq_len, truncate_captions, seed: int = 0,
            epoch: int = 0, long_captions=None) -> Iterator[tuple]:
    for sample in samples:
        where = sample_location(sample)
        try:
            image, captions = read_sample(sample, image_size)
        except BadSample as error:
            logger.warning("skipping shard sample %s: %s", where, error)
            continue
        caption = captions[_seed("wds-caption", seed, epoch, where) % len(captions)] if len(captions) > 1 \
            else captions[0]
        if long_captions is not None and not long_captions(caption, where):
            continue
        if tokenizer is None:
            yield image, caption
            continue
        try:
            tokens = tokenizer.tokenize([caption], text_seq_len, truncate_text=truncate_captions)[0]
        except ValueError as error:
            raise ValueError(f"shard sample {where}: {error} (pass truncate_captions=True / --truncate_captions)") from error
        yield tokens, image


def webdataset_dataset(urls, image_size: int = 32, tokenizer=None, text_seq_len: int | None = None,
                       truncate_captions: bool = False, shuffle: int = 0, rank: int | None = None,
                       world_size: int | None = None, seed: int = 0, epoch: int = 0, long_captions=None):
    """An IterableDataset of `(image, caption)` (or `(text_tokens, image)` with a tokenizer) from tar shards.

    urls: a brace pattern ("data/shard-{000..099}.tar") or a list of paths/URLs. rank/world_size default to
    `distributed_rank()`. shuffle > 0 shuffles the shard order and the samples (buffer of that size) from
    (seed, epoch). long_captions: optional picklable callable (caption, where) -> keep?, which may also raise.
    """
    with needs_extra("data", "reading WebDataset shards"):
        import webdataset as wds

    if tokenizer is not None and not text_seq_len:
        raise ValueError("webdataset_dataset with a tokenizer needs text_seq_len (the model's text context length)")
    shards = expand_urls(urls)
    if not shards:
        raise ValueError(f"no WebDataset shards in {urls!r}")
    default_rank, default_world = distributed_rank()
    rank = default_rank if rank is None else rank
    world_size = default_world if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if len(shards) < world_size:
        raise ValueError(f"{len(shards)} shards cannot feed {world_size} ranks: write at least one shard per rank "
                         f"(and ideally one per DataLoader worker of every rank)")

    # Module-level functions through partial (not closures), so DataLoader workers can be spawned as well as forked.
    if shuffle:  # the same permutation on every rank, so the split below stays disjoint
        import torch

        order = torch.randperm(len(shards), generator=torch.Generator().manual_seed(_seed("wds-shards", seed, epoch)))
        shards = [shards[i] for i in order.tolist()]
    dataset = wds.WebDataset(shards, shardshuffle=False,
                             nodesplitter=partial(_split_by_rank, rank=rank, world_size=world_size),
                             workersplitter=wds.split_by_worker, empty_check=False)
    if shuffle:
        dataset = dataset.compose(partial(_shuffle_samples, buffer_size=shuffle, seed=seed, epoch=epoch, rank=rank))
    return dataset.compose(partial(_decode, image_size=image_size, tokenizer=tokenizer, text_seq_len=text_seq_len,
                                   truncate_captions=truncate_captions, seed=seed, epoch=epoch,
                                   long_captions=long_captions))


def webdataset_loader(urls, batch_size: int, num_workers: int = 0, worker_init_fn=None, generator=None,
                      **dataset_kwargs):
    """A DataLoader of batches from tar shards (see `webdataset_dataset` for the other arguments).

    Batches are stacked tensors plus a list of captions (or two tensors with a tokenizer). The loader ends after
    one pass over this rank's shards; the last batch may be smaller.
    """
    import torch
    from torch.utils.data import DataLoader

    def collate(batch: Sequence[tuple]):
        first, second = zip(*batch)
        if isinstance(second[0], str):  # (image, caption)
            return torch.stack(first), list(second)
        return torch.stack(first), torch.stack(second)  # (text_tokens, image)

    dataset = webdataset_dataset(urls, **dataset_kwargs)
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate,
                      worker_init_fn=worker_init_fn, generator=generator)
