"""Numeric precision for any torch model: a leaf that imports nothing else of dalle_lab.

    modes.py       precision_mode(model, "fp32" | "bf16" | "fp16" | "tpu_default")
    op_kinds.py    which aten ops tpu_default rounds, refuses, runs untouched or reports
    reward_gap.py  a scoring function in a lower precision against float32 on the same inputs (the fine-tuning guard)
    reference.py   an independent float64 reference of tpu_default for a CLIP vision tower (what the mode is checked
                   against)

The rewards run in these modes, the alignment trainer logs the reward gap, and dalle_lab.precision writes the parity
reports on top of both.
"""
from dalle_lab.numerics.modes import PRECISION_MODES, check_mode, count_matrix_products, precision_mode, round_to_bf16
from dalle_lab.numerics.reward_gap import reward_gap, reward_gap_warning, score_in_precision, spearman

__all__ = ["PRECISION_MODES", "check_mode", "count_matrix_products", "precision_mode", "reward_gap",
           "reward_gap_warning", "round_to_bf16", "score_in_precision", "spearman"]
