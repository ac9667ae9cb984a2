"""Image-text folders: recursive indexing, keys by relative path, bad files reported and skipped."""
import logging

import pytest
import torch
from PIL import Image

from dalle_lab.data.folder import TextImageFolder, iter_folder_captions


def image_file(path, color=(200, 30, 30), size=(40, 24), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


@pytest.fixture
def folder(tmp_path):
    """Two good pairs with the same stem in different folders, plus one of each kind of bad data."""
    image_file(tmp_path / "cats" / "001.png", (200, 30, 30))
    (tmp_path / "cats" / "001.txt").write_text("a red cat\n\n  a crimson cat  \n")
    image_file(tmp_path / "dogs" / "deep" / "001.JPG", (30, 30, 200))
    (tmp_path / "dogs" / "deep" / "001.txt").write_text("a blue dog")
    image_file(tmp_path / "no_caption.webp")
    image_file(tmp_path / "empty.bmp")
    (tmp_path / "empty.txt").write_text("\n   \n")
    (tmp_path / "corrupt.jpeg").write_bytes(b"\xff\xd8 this is not a jpeg")
    (tmp_path / "corrupt.txt").write_text("a broken picture")
    (tmp_path / "lonely.txt").write_text("a caption without its image")
    return tmp_path


def test_indexes_recursively_and_reports_bad_files(folder, caplog):
    with caplog.at_level(logging.WARNING):
        dataset = TextImageFolder(folder, image_size=16)
    # Colliding stems (cats/001, dogs/deep/001) stay separate items; the corrupt jpeg is not known yet.
    assert dataset.keys == ["cats/001.png", "corrupt.jpeg", "dogs/deep/001.JPG"]
    report = dataset.report
    assert report.missing_caption == ["no_caption.webp"] and report.empty_caption == ["empty.bmp"]
    assert report.orphan_captions == ["lonely.txt"]
    assert "no_caption.webp" in caplog.text and "empty.bmp" in caplog.text
    assert dataset.captions(0) == ["a red cat", "a crimson cat"]


def test_corrupt_image_is_reported_and_replaced(folder, caplog):
    dataset = TextImageFolder(folder, image_size=16)
    with caplog.at_level(logging.WARNING):
        image, caption = dataset[1]  # corrupt.jpeg: replaced by the next good item
    assert caption == "a blue dog" and image.shape == (3, 16, 16)
    assert dataset.report.corrupt_image == ["corrupt.jpeg"]
    assert "corrupt.jpeg" in caplog.text and dataset.report.images == 2
    assert "corrupt image: 1 (corrupt.jpeg)" in dataset.report.summary()
    # verify_images finds it while indexing instead.
    verified = TextImageFolder(folder, image_size=16, verify_images=True)
    assert verified.keys == ["cats/001.png", "dogs/deep/001.JPG"] and verified.report.corrupt_image == ["corrupt.jpeg"]


def test_items_are_resized_centre_cropped_tensors(folder):
    image, caption = TextImageFolder(folder, image_size=16)[2]
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert torch.allclose(image[:, 8, 8], torch.tensor([30, 30, 200]) / 255, atol=0.01)
    assert caption == "a blue dog"


def test_random_caption_line_per_access(folder):
    dataset = TextImageFolder(folder, image_size=8)
    seen = {dataset[0][1] for _ in range(60)}
    assert seen == {"a red cat", "a crimson cat"}


def test_transparent_png_is_composited_on_white(tmp_path):
    image_file(tmp_path / "ghost.png", (0, 0, 0, 0), mode="RGBA")
    (tmp_path / "ghost.txt").write_text("nothing")
    image, _ = TextImageFolder(tmp_path, image_size=8)[0]
    assert torch.all(image == 1.0)


class CharTokenizer:
    """Stand-in with the tokenizer contract: one id per character, pad 0."""

    vocab_size = 256

    def tokenize(self, texts, context_length, truncate_text=False):
        out = torch.zeros(len(texts), context_length, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = [ord(c) for c in text]
            if len(ids) > context_length:
                if not truncate_text:
                    raise ValueError(f"caption {text!r} is longer than {context_length} tokens")
                ids = ids[:context_length]
            out[row, : len(ids)] = torch.tensor(ids)
        return out


def test_tokenizer_gives_tokens_and_names_the_file_of_a_long_caption(folder):
    dataset = TextImageFolder(folder, image_size=8, tokenizer=CharTokenizer(), text_seq_len=16)
    tokens, image = dataset[2]
    assert tokens.shape == (16,) and tokens[0] == ord("a") and tokens[10:].eq(0).all()
    with pytest.raises(ValueError, match=r"001\.txt.*truncate_captions"):
        TextImageFolder(folder, image_size=8, tokenizer=CharTokenizer(), text_seq_len=4)[2]
    truncated = TextImageFolder(folder, image_size=8, tokenizer=CharTokenizer(), text_seq_len=4, truncate_captions=True)
    assert truncated[2][0].tolist() == [ord(c) for c in "a bl"]
    with pytest.raises(ValueError, match="text_seq_len"):
        TextImageFolder(folder, tokenizer=CharTokenizer())


def test_empty_or_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextImageFolder(tmp_path / "nowhere")
    image_file(tmp_path / "a.png")
    with pytest.raises(ValueError, match="(?s)no usable image-caption pairs.*no caption file: 1"):
        TextImageFolder(tmp_path)


def test_iter_folder_captions_yields_every_line_once(folder):
    captions = list(iter_folder_captions(folder))
    assert sorted(captions) == sorted(["a red cat", "a crimson cat", "a blue dog", "a broken picture"])
