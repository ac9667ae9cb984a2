"""Issue 7 inside fine-tuning: the reward model scored in a lower precision (bf16, fp16, TPU default), and each
epoch a share of the images re-scored in float32 to log how far the two disagree (dalle_lab.numerics.reward_gap)."""
from __future__ import annotations

import warnings

from dalle_lab.numerics.reward_gap import reward_gap, reward_gap_warning


def set_reward_precision(reward, precision: str, reward_name: str) -> None:
    """Put the reward's model in `precision`. A lower precision only means something for a reward backed by a torch
    model that carries its own precision setting (the AestheticScorer, clip_score); refuse it elsewhere rather than
    silently scoring in float32."""
    if precision == "fp32":
        return
    model = getattr(reward, "scorer", None) or getattr(reward, "model", None)
    if not isinstance(getattr(model, "precision", None), str):
        raise ValueError(f"reward_precision={precision!r} needs a reward model with a precision setting (aesthetic, "
                         f"clip_score); {reward_name!r} has none: use fp32")
    model.precision = precision


def epoch_reward_gap(reward, images, prompts, scores, config, epoch: int, generator) -> dict:
    """The log entries of one epoch's precision gap ({} in float32): `config.reward_gap_fraction` of the images
    re-scored in float32, with a warning beyond `config.reward_gap_warn`."""
    if config.reward_precision == "fp32":
        return {}
    gap = reward_gap(reward, images, prompts, config.reward_precision, config.reward_gap_fraction, scores=scores,
                     generator=generator)
    message = reward_gap_warning(gap, max_mean_abs_diff=config.reward_gap_warn)
    if message:
        warnings.warn(f"epoch {epoch}: {message}")
    return {"reward_gap": gap["mean_abs_diff"], "reward_gap_mean_diff": gap["mean_diff"],
            "reward_gap_spearman": gap["spearman"], "reward_gap_n": gap["n"]}
