"""Numeric precision for any torch model, and what it does to a reward model's scores.

    modes.py       precision_mode(model, "fp32" | "bf16" | "fp16" | "tpu_default")
    op_kinds.py    which aten ops tpu_default rounds, refuses, runs untouched or reports
    reward_gap.py  a reward in a lower precision against float32 on the same images (the fine-tuning guard)
    parity.py      the parity report: embeddings and scores per image and per layer (`python -m dalle_lab.precision.parity`)
"""
from dalle_lab.precision.modes import PRECISION_MODES, check_mode, count_matrix_products, precision_mode, round_to_bf16
from dalle_lab.precision.reward_gap import reward_gap, reward_gap_warning, score_in_precision, spearman

__all__ = ["PRECISION_MODES", "check_mode", "count_matrix_products", "precision_mode", "reward_gap",
           "reward_gap_warning", "round_to_bf16", "score_in_precision", "spearman"]
