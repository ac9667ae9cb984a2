"""Data: the built-in Shapes dataset and its checker, the emoji dataset, image-text folders, WebDataset shards.

See docs/data.md for the caption grammar, the splits, the checker's attributes and the folder/shard formats.
"""
from .builtin import BUILTIN_DATASETS, builtin_dataset
from .emoji import EmojiDataset
from .folder import TextImageFolder, iter_folder_captions
from .folder_report import FolderReport
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
from .checker import check, evaluate
from .wds import webdataset_dataset, webdataset_loader

__all__ = [
    "BUILTIN_DATASETS",
    "builtin_dataset",
    "EmojiDataset",
    "FolderReport",
    "TextImageFolder",
    "iter_folder_captions",
    "check",
    "evaluate",
    "webdataset_dataset",
    "webdataset_loader",
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
