"""A reward scored in a lower precision against float32 on the same images: the guard that would have caught the
published TPU artefact while fine-tuning (the alignment trainer logs it every epoch)."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from dalle_lab.numerics.modes import check_mode, precision_mode


class RewardGap(dict):
    """How a reward computed in a lower precision differs from float32 on the same images (a plain dict of numbers).

    Keys: n, precision, fp32_mean, fp32_std, precision_mean, mean_diff (precision - fp32), mean_abs_diff,
    max_abs_diff, spearman (rank correlation across the images; nan for fewer than 3). `float(gap)` is
    mean_abs_diff, the headline number a training log shows.
    """

    def __float__(self) -> float:
        return float(self["mean_abs_diff"])


def _reward_model(reward_fn, model):
    """The module a precision mode must act on: `model`, else the reward itself or its `.scorer` / `.model`."""
    if model is not None:
        return model
    if isinstance(reward_fn, torch.nn.Module):
        return reward_fn
    for name in ("scorer", "model"):
        candidate = getattr(reward_fn, name, None)
        if isinstance(candidate, torch.nn.Module):
            return candidate
    return None


def score_in_precision(reward_fn, images, prompts, precision: str, model=None):
    """float32 scores of `reward_fn(images, prompts)` computed in `precision`, without gradients.

    A reward model with its own `precision` attribute (the AestheticScorer) is switched to `precision` for the call;
    otherwise the call runs inside `precision_mode(model, precision)` (bf16/fp16 need the model to cast: passed as
    `model`, or found as the reward itself or its `.scorer` / `.model`).
    """
    check_mode(precision)
    module = _reward_model(reward_fn, model)
    with torch.no_grad():
        if module is not None and isinstance(getattr(module, "precision", None), str):
            with getattr(module, "precision_lock", contextlib.nullcontext()):  # no other thread sees the switch
                saved, module.precision = module.precision, precision
                try:
                    scores = reward_fn(images, prompts)
                finally:
                    module.precision = saved
        else:
            if module is None and precision in ("bf16", "fp16"):
                raise ValueError(f"cannot run this reward in {precision}: it exposes no torch model to cast "
                                 "(pass model=, or give the reward a .scorer or .model attribute)")
            with precision_mode(module, precision):
                scores = reward_fn(images, prompts)
    return torch.as_tensor(scores).detach().float().reshape(-1).cpu()


def reward_gap(reward_fn, images, prompts, precision: str, fraction: float = 1.0, *, scores=None, model=None,
               generator=None) -> RewardGap:
    """Score a `fraction` of the images (a random subset) in float32 and in `precision`, and compare.

    `scores`: the rewards already computed in `precision` for all the images (saves recomputing them).
    The guard that would have caught the published TPU artefact while training: log it each epoch.
    """
    check_mode(precision)
    count = len(images)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"reward_gap fraction must be in (0, 1], got {fraction}")
    chosen = max(1, int(round(fraction * count)))
    index = torch.randperm(count, generator=generator)[:chosen] if chosen < count else torch.arange(count)
    subset = images[index.to(images.device)] if torch.is_tensor(images) else [images[i] for i in index.tolist()]
    subset_prompts = None if prompts is None else [prompts[i] for i in index.tolist()]
    reference = score_in_precision(reward_fn, subset, subset_prompts, "fp32", model).double().numpy()
    if scores is not None:
        low = torch.as_tensor(scores).detach().float().reshape(-1).cpu()[index].double().numpy()
    else:
        low = score_in_precision(reward_fn, subset, subset_prompts, precision, model).double().numpy()
    difference = low - reference
    return RewardGap(
        n=int(chosen), precision=precision,
        fp32_mean=float(reference.mean()), fp32_std=float(reference.std()), precision_mean=float(low.mean()),
        mean_diff=float(difference.mean()), mean_abs_diff=float(np.abs(difference).mean()),
        max_abs_diff=float(np.abs(difference).max()), spearman=spearman(reference, low))


def spearman(x, y) -> float:
    """Spearman rank correlation (scipy); nan when it is undefined (fewer than 3 values, or a constant input)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    from scipy.stats import spearmanr  # scipy: optional heavy dependency, loaded by the first correlation

    return float(spearmanr(x, y).statistic)


def reward_gap_warning(gap: dict, max_mean_abs_diff: float = 0.1, min_spearman: float = 0.8,
                       min_count_for_spearman: int = 8) -> str | None:
    """A warning message when the low-precision reward disagrees with float32 beyond the thresholds, else None.

    Defaults: a mean |difference| above 0.1 (in reward units: a tenth of a point on the LAION 1-10 scale), or a rank
    correlation below 0.8 measured on at least 8 images (fewer make the rank correlation too noisy to act on).
    """
    problems = []
    if gap["mean_abs_diff"] > max_mean_abs_diff:
        problems.append(f"mean |difference| {gap['mean_abs_diff']:.4f} > {max_mean_abs_diff}")
    rho = gap.get("spearman", float("nan"))
    if gap["n"] >= min_count_for_spearman and rho == rho and rho < min_spearman:
        problems.append(f"rank correlation {rho:.3f} < {min_spearman}")
    if not problems:
        return None
    return (f"the reward in {gap['precision']} disagrees with float32 on {gap['n']} images ({'; '.join(problems)}): "
            "fine-tuning may be optimising a precision artefact rather than the reward; score in fp32 instead")
