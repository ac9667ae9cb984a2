"""How much of a fine-tuning gain measured with a low-precision reward is real: the arithmetic of
lab/studies/parity/finetune_gap.py, kept apart so it can be tested exactly.

Each fine-tuned model is evaluated on the same prompts with the same sampling noise as its starting model (common
random numbers), and every image is scored twice, in float32 and in the low precision. Per image i:

    apparent gain  low_after[i]  - low_before[i]      what the low-precision reward says training gained
    real gain      fp32_after[i] - fp32_before[i]     what the float32 reward says
    artefact       apparent - real = gap_after[i] - gap_before[i], gap = low - fp32

The artefact is what the policy gained by pleasing the rounding rather than the reward: zero when the gain
survives whole. Within one run the standard errors over images are evaluation noise only; across training seeds,
mean_ci gives the t-interval that also holds the run-to-run spread, and only that interval supports a claim.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from dalle_lab.stats import mean_ci, mean_se

MEASURES = ("apparent", "real", "artefact")
# summary keys of the low-precision run minus the float32-reward control, paired by seed
KEYS = {"real": "real_gain_low_minus_fp32_arm", "artefact": "artefact_low_minus_fp32_arm"}


def _mean_se(values: np.ndarray) -> dict:
    gain, se = mean_se(values)
    return {"gain": gain, "se": se}


def paired_gains(before: Mapping[str, Sequence[float]], after: Mapping[str, Sequence[float]]) -> dict:
    """Apparent and real gain and the artefact of one run, each with its paired standard error over images.

    `before` / `after`: {"fp32": per-image scores, "low": per-image scores}, the same images scored in both
    precisions, image i of `after` sampled for the same prompt with the same noise as image i of `before`."""
    arrays = {name: {key: np.asarray(scores[key], dtype=np.float64) for key in ("fp32", "low")}
              for name, scores in (("before", before), ("after", after))}
    lengths = {len(v) for scores in arrays.values() for v in scores.values()}
    if len(lengths) != 1:
        raise ValueError(f"paired gains need the same images before and after in both precisions, got lengths "
                         f"{sorted(lengths)}")
    apparent = arrays["after"]["low"] - arrays["before"]["low"]
    real = arrays["after"]["fp32"] - arrays["before"]["fp32"]
    return {"apparent": _mean_se(apparent), "real": _mean_se(real), "artefact": _mean_se(apparent - real)}


def verdict(interval) -> str:
    """Whether a 95 % interval (a dalle_lab.stats.Interval) excludes zero."""
    if not math.isfinite(interval.half_width):
        return "one seed: no interval"
    if interval.low > 0:
        return "above zero"
    if interval.high < 0:
        return "below zero"
    return "cannot tell from zero"


def seed_summary(per_seed: Mapping[str, Mapping[str, dict]], low_arm: str, fp32_arm: str | None = None) -> dict:
    """Across training seeds: mean and t-interval of each arm's apparent gain, real gain and artefact; the real gain
    and the artefact of the low-precision arm minus the float32-reward control's, paired by seed; and the share of
    the apparent gain that survives (a ratio of means, only meaningful when the apparent gain is clearly above zero).

    `per_seed[seed][arm]` is a paired_gains result; `low_arm` / `fp32_arm` name the arms."""
    seeds = sorted(per_seed)
    arms = [arm for arm in (low_arm, fp32_arm) if arm is not None]
    summary: dict = {"seeds": seeds, "arms": {}}
    for arm in arms:
        rows = {}
        for measure in MEASURES:
            interval = mean_ci([per_seed[seed][arm][measure]["gain"] for seed in seeds])
            rows[measure] = {**interval.to_dict(), "verdict": verdict(interval)}
        summary["arms"][arm] = rows
    low = summary["arms"][low_arm]
    apparent_clear = low["apparent"]["verdict"] == "above zero"
    summary["share_surviving"] = {
        "value": low["real"]["mean"] / low["apparent"]["mean"] if low["apparent"]["mean"] else float("nan"),
        "meaningful": apparent_clear,
        "why": "the apparent gain's interval is above zero" if apparent_clear else
               "the apparent gain cannot be told from zero, so no share of it can be judged; the artefact is the measure",
    }
    if fp32_arm is not None:
        for measure in ("real", "artefact"):
            # the artefact of the float32-reward control is what fine-tuning alone does to the rounding gap; only
            # the low-precision run's excess over it can come from the policy climbing the rounding
            interval = mean_ci([per_seed[seed][low_arm][measure]["gain"] - per_seed[seed][fp32_arm][measure]["gain"]
                                for seed in seeds])
            summary[KEYS[measure]] = {**interval.to_dict(), "verdict": verdict(interval)}
    return summary
