"""Data: the built-in Shapes dataset and its checker, image-text folders, WebDataset shards.

See docs/data.md for the caption grammar, the splits, the checker's attributes and the folder/shard formats.
"""
from .shapes import (
    DEFAULT_IMAGE_SIZE,
    Scene,
    SceneSpec,
    ShapesDataset,
    ShapesItem,
    all_captions,
    all_words,
    describe,
    heldout_captions,
    parse,
    render,
    split_of,
    validation_captions,
)

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "Scene",
    "SceneSpec",
    "ShapesDataset",
    "ShapesItem",
    "all_captions",
    "all_words",
    "describe",
    "heldout_captions",
    "parse",
    "render",
    "split_of",
    "validation_captions",
]
