"""What both parity reports measure and how they print it: embedding cosines and the report's number formats.

aesthetic_parity.py (the LAION aesthetic scorer) and clip_parity.py (the project's CLIP) compare each mode with
float32 in the same terms, so a reader can set one report beside the other.
"""
from __future__ import annotations

import math

import numpy as np
import torch.nn.functional as F

DEFAULT_MODES = ("bf16", "fp16", "tpu_default")  # what each report compares with fp32 unless told otherwise


def embedding_cosine(a, b) -> np.ndarray:
    """Cosine similarity of matching rows (anything after the first axis is flattened), in float64."""
    return F.cosine_similarity(a.double().flatten(1), b.double().flatten(1), dim=1).cpu().numpy()


def token_cosine(a, b) -> np.ndarray:
    """Per image: the mean over tokens of the cosine between matching token vectors of (B, T, D) hidden states."""
    return F.cosine_similarity(a.double(), b.double(), dim=-1).mean(dim=-1).cpu().numpy()


def json_safe(value):
    """`value` with every non-finite float as None (JSON has no nan) and numpy scalars as Python numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def fmt(value, digits=4) -> str:
    """A number for a markdown table: fixed digits for floats, "n/a" for None and non-finite values."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)
