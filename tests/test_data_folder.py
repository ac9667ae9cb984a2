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
    # Colliding stems (cats/001, dogs/deep/001) stay separate items; the jpeg whose header is garbage is left out.
    assert dataset.keys == ["cats/001.png", "dogs/deep/001.JPG"]
    report = dataset.report
    assert report.missing_caption == ["no_caption.webp"] and report.empty_caption == ["empty.bmp"]
    assert report.corrupt_image == ["corrupt.jpeg"] and report.orphan_captions == ["lonely.txt"]
    assert report.blank_lines == ["cats/001.txt"] and report.images == 2 and report.skipped == 3
    summary = report.summary().splitlines()
    assert summary[0].endswith(": 2 usable image-caption pairs, 3 left out")
    for name, fix in (("no_caption.webp", "add a same-name .txt"), ("empty.bmp", "write a caption"),
                      ("corrupt.jpeg", "re-save them"), ("lonely.txt", "add the image"), ("cats/001.txt", "ignored")):
        line = next(line for line in summary if name in line)
        assert fix in line, line
    assert "no_caption.webp" in caplog.text and "empty.bmp" in caplog.text
    assert dataset.captions(0) == ["a red cat", "a crimson cat"]


def test_truncated_image_is_reported_once_counted_and_replaced(folder, caplog):
    """Its header is fine, so indexing keeps it; loading finds it cut, names it, counts it, and moves on."""
    import io

    import numpy as np

    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)  # large enough to cut
    whole = io.BytesIO()
    Image.fromarray(noise).save(whole, "JPEG")
    (folder / "cut.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    (folder / "cut.txt").write_text("a picture cut in half")
    dataset = TextImageFolder(folder, image_size=16)
    assert "cut.jpg" in dataset.keys
    with caplog.at_level(logging.WARNING):
        image, caption = dataset.get(dataset.keys.index("cut.jpg"), caption_draw=0)
    assert caption == "a blue dog" and image.shape == (3, 16, 16)  # the next good item
    assert dataset.report.corrupt_image == ["corrupt.jpeg", "cut.jpg"] and dataset.report.images == 2
    assert "cut.jpg cannot be decoded" in caplog.text and "re-save or delete it" in caplog.text
    # verify_images decodes everything while indexing instead
    verified = TextImageFolder(folder, image_size=16, verify_images=True)
    assert verified.keys == ["cats/001.png", "dogs/deep/001.JPG"]


def test_items_are_resized_centre_cropped_tensors(folder):
    image, caption = TextImageFolder(folder, image_size=16)[1]
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
    tokens, image = dataset[1]
    assert tokens.shape == (16,) and tokens[0] == ord("a") and tokens[10:].eq(0).all()
    with pytest.raises(ValueError, match=r"001\.txt.*truncate_captions"):
        TextImageFolder(folder, image_size=8, tokenizer=CharTokenizer(), text_seq_len=4)[1]
    truncated = TextImageFolder(folder, image_size=8, tokenizer=CharTokenizer(), text_seq_len=4, truncate_captions=True)
    assert truncated[1][0].tolist() == [ord(c) for c in "a bl"]
    with pytest.raises(ValueError, match="text_seq_len"):
        TextImageFolder(folder, tokenizer=CharTokenizer())


def test_empty_or_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextImageFolder(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="holds no images .*each with a same-name .txt caption file"):
        TextImageFolder(tmp_path)
    (tmp_path / "a.txt").write_text("a caption alone")
    with pytest.raises(ValueError, match=r"1 .txt files found without an image"):
        TextImageFolder(tmp_path)
    image_file(tmp_path / "b.png")
    with pytest.raises(ValueError, match=r"no usable image-caption pairs in .* \(1 image\(s\) without a caption file \(b.png\)\)"):
        TextImageFolder(tmp_path)


def test_non_utf8_caption_files_are_named_with_the_fix(tmp_path):
    for name in ("a", "b"):
        image_file(tmp_path / f"{name}.png")
    (tmp_path / "a.txt").write_text("a good caption", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes("une pomme d\xe9licieuse".encode("latin-1"))
    with pytest.raises(ValueError, match=r"1 caption file\(s\) in .* are not UTF-8 text \(b.txt\): convert them, e.g. "
                                         r"iconv -f latin1 -t utf-8"):
        TextImageFolder(tmp_path)
    with pytest.raises(ValueError, match="b.txt is not UTF-8 text"):
        list(iter_folder_captions(tmp_path))
    (tmp_path / "b.txt").write_bytes("\ufeffune pomme d\xe9licieuse\n".encode("utf-8"))  # UTF-8 with a BOM is fine
    assert TextImageFolder(tmp_path).captions(1) == ["une pomme d\xe9licieuse"]


def _png(path, mode, value):
    """A 4x4 PNG of one PIL mode, every pixel `value` (16-bit written through numpy: PIL's own I;16 fill)."""
    import numpy as np

    if mode == "I;16":
        Image.fromarray(np.full((4, 4), value, np.uint16)).save(path)
    elif mode == "P":
        image = Image.new("P", (4, 4), 0)
        image.putpalette([*value, *([0] * 765)])
        image.save(path)
    else:
        Image.new(mode, (4, 4), value).save(path)


@pytest.mark.parametrize("mode,value,rgb", [
    ("L", 64, (64, 64, 64)),
    ("I;16", 51400, (200, 200, 200)),  # 16-bit: 51400 / 257 = 200, not PIL's clipped 255
    ("P", (10, 120, 230), (10, 120, 230)),
    ("RGBA", (0, 0, 255, 0), (255, 255, 255)),  # fully transparent: white, not the hidden blue
    ("LA", (0, 128), (128, 128, 128)),  # half-transparent black on white
])
def test_grayscale_16bit_palette_and_transparent_pngs_load_as_their_colours(tmp_path, mode, value, rgb):
    _png(tmp_path / "x.png", mode, value)
    (tmp_path / "x.txt").write_text("a caption")
    dataset = TextImageFolder(tmp_path, image_size=4)
    image, _ = dataset[0]
    assert torch.allclose(image[:, 2, 2], torch.tensor(rgb, dtype=torch.float32) / 255, atol=1.5 / 255)
    assert dataset.report.converted and "converted to RGB (x.png)" in dataset.report.summary()


def test_iter_folder_captions_yields_every_line_once(folder):
    captions = list(iter_folder_captions(folder))
    assert sorted(captions) == sorted(["a red cat", "a crimson cat", "a blue dog", "a broken picture"])


def test_macos_resource_forks_are_not_images_without_captions(tmp_path):
    """"._002.png" (AppleDouble metadata a Mac leaves on other disks) is not an image of the data."""
    Image.new("RGB", (8, 8), (200, 0, 0)).save(tmp_path / "002.png")
    (tmp_path / "002.txt").write_text("a red square\n")
    (tmp_path / "._002.png").write_bytes(b"\x00\x05\x16\x07")
    (tmp_path / "._002.txt").write_bytes(b"\x00\x05\x16\x07")
    folder = TextImageFolder(tmp_path, image_size=8)
    assert folder.keys == ["002.png"] and not folder.report.problems()
