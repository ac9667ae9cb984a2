"""WebDataset shards: samples decode, ranks see disjoint shards, bad samples are skipped."""
import io
import logging

import pytest
import torch
import webdataset as wds
from PIL import Image

from dalle_lab.data.wds import expand_urls, webdataset_dataset, webdataset_loader


def png_bytes(color):
    buffer = io.BytesIO()
    Image.new("RGB", (20, 12), color).save(buffer, "png")
    return buffer.getvalue()


@pytest.fixture
def shards(tmp_path):
    """Two shards of three samples each, written by webdataset's ShardWriter."""
    pattern = str(tmp_path / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=3, verbose=0) as sink:
        for i in range(6):
            sink.write({"__key__": f"sample{i:03d}", "png": png_bytes((40 * i, 0, 0)), "txt": f"caption {i}".encode()})
    paths = sorted(str(p) for p in tmp_path.glob("shard-*.tar"))
    assert len(paths) == 2
    return paths


def test_two_ranks_see_disjoint_samples_that_cover_everything(shards):
    seen = [[caption for _, caption in webdataset_dataset(shards, image_size=8, rank=rank, world_size=2)]
            for rank in range(2)]
    assert seen[0] and seen[1]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == [f"caption {i}" for i in range(6)]


def test_one_rank_reads_all_and_images_are_tensors(shards):
    items = list(webdataset_dataset(shards, image_size=8, rank=0, world_size=1))
    assert len(items) == 6
    image, caption = items[4]
    assert image.shape == (3, 8, 8) and torch.allclose(image[0, 4, 4], torch.tensor(160 / 255), atol=0.01)
    with pytest.raises(ValueError, match="2 shards cannot feed 3 ranks"):
        webdataset_dataset(shards, rank=0, world_size=3)


def test_loader_batches_and_brace_patterns(shards, tmp_path):
    loader = webdataset_loader(str(tmp_path / "shard-{000000..000001}.tar"), batch_size=4, image_size=8,
                               rank=0, world_size=1)
    batches = list(loader)
    assert [len(captions) for _, captions in batches] == [4, 2]
    assert batches[0][0].shape == (4, 3, 8, 8)


def test_bad_samples_are_skipped_with_a_warning(tmp_path, caplog):
    path = str(tmp_path / "bad.tar")
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "good", "png": png_bytes((1, 2, 3)), "txt": b"fine"})
        sink.write({"__key__": "nocaption", "png": png_bytes((1, 2, 3))})
        sink.write({"__key__": "empty", "png": png_bytes((1, 2, 3)), "txt": b"  \n"})
        sink.write({"__key__": "corrupt", "jpg": b"not a jpeg", "txt": b"broken"})
    with caplog.at_level(logging.WARNING):
        items = list(webdataset_dataset([path], image_size=8, rank=0, world_size=1))
    assert [caption for _, caption in items] == ["fine"]
    for key in ("nocaption", "empty", "corrupt"):
        assert key in caplog.text


def test_a_directory_means_its_tar_shards_sorted(shards, tmp_path):
    """DALLE-pytorch took a directory of shards; webdataset itself would open the directory as a file."""
    (tmp_path / "notes.txt").write_text("not a shard")
    assert expand_urls(str(tmp_path)) == sorted(shards)
    captions = sorted(caption for _, caption in webdataset_dataset(str(tmp_path), image_size=8, rank=0, world_size=1))
    assert captions == [f"caption {i}" for i in range(6)]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"^{empty} holds no .tar shards"):
        expand_urls(str(empty))


def test_a_missing_shard_is_named_up_front_the_first_one(shards, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"shard \S*nope/000.tar does not exist \(2 of the 2"):
        expand_urls(str(tmp_path / "nope" / "{000..001}.tar"))
    with pytest.raises(FileNotFoundError, match=r"shard \S*shard-000002.tar does not exist: check"):
        webdataset_dataset(str(tmp_path / "shard-{000000..000002}.tar"), rank=0, world_size=1)
    assert expand_urls(["http://example.com/a.tar", "pipe:cat x.tar"]) == ["http://example.com/a.tar", "pipe:cat x.tar"]
