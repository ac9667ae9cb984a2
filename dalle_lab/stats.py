"""Small-sample statistics: the mean with its standard error or t-interval, Welch's test, Holm's adjustment.

The one place for them: the alignment evaluation, the precision report and the lab's studies all use these.

With 3 to 10 seeds per setting the normal approximation is badly optimistic (z = 1.96 where t(2) = 4.30), so
intervals use Student's t, and comparisons use Welch's t-test, which does not assume the two settings have equal
variance across seeds. scipy (imported inside the functions) provides only the t distribution's quantiles and tails.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence


@dataclass(frozen=True)
class Interval:
    """mean +- half_width is a two-sided `confidence` interval for the mean; half_width is nan below 2 values."""

    mean: float
    half_width: float
    n: int
    std: float  # sample standard deviation (ddof = 1)
    confidence: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def to_dict(self) -> dict:
        return {**asdict(self), "low": self.low, "high": self.high}


@dataclass(frozen=True)
class WelchResult:
    """Welch's two-sample t-test of mean(a) - mean(b), with the matching confidence interval of the difference."""

    difference: float
    half_width: float  # the difference's `confidence` interval is difference +- half_width
    t: float
    df: float  # Welch-Satterthwaite degrees of freedom
    p_value: float  # two-sided
    n_a: int
    n_b: int
    confidence: float = 0.95

    def significant(self, alpha: float = 0.05) -> bool:
        return math.isfinite(self.p_value) and self.p_value < alpha

    def to_dict(self) -> dict:
        return asdict(self)


def _clean(values: Sequence[float], name: str) -> list[float]:
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f"{name}: no values (did every run of this setting fail or get skipped?)")
    return values


def _mean_var(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else math.nan
    return mean, var


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean, s / sqrt(n) with the sample standard deviation (nan below 2 values)."""
    values = _clean(values, "mean_se")
    mean, var = _mean_var(values)
    return mean, math.sqrt(var / len(values)) if len(values) > 1 else math.nan


def t_quantile(confidence: float, df: float) -> float:
    """The two-sided critical value of Student's t with `df` degrees of freedom (4.303 for 95 % and df = 2)."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.5 + confidence / 2, df))


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean and t-based confidence interval: mean +- t_{(1+c)/2, n-1} * s / sqrt(n)."""
    values = _clean(values, "mean_ci")
    n = len(values)
    mean, var = _mean_var(values)
    if n < 2:
        return Interval(mean, math.nan, n, math.nan, confidence)
    std = math.sqrt(var)
    return Interval(mean, t_quantile(confidence, n - 1) * std / math.sqrt(n), n, std, confidence)


def detectable_effect(std: float, n: int, confidence: float = 0.95, power: float = 0.8) -> float:
    """The smallest true mean a paired (one-sample) t-test of n values with this spread finds with probability
    `power` at two-sided level 1 - confidence: (t_{(1+c)/2, n-1} + t_{power, n-1}) * std / sqrt(n).

    With 3 seeds the t quantiles are large (4.30 + 1.06), so only an effect of about 3 standard deviations of the
    per-seed differences shows; with hundreds of paired captions it is about 2.8 standard errors. nan below 2 values.
    """
    if n < 2 or not math.isfinite(std):
        return math.nan
    from scipy.stats import t as student_t

    return (t_quantile(confidence, n - 1) + float(student_t.ppf(power, n - 1))) * std / math.sqrt(n)


def welch_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> WelchResult:
    """Welch's t-test of mean(a) - mean(b). Needs 2+ values per side (else t, p and the interval are nan).

    Two sides with zero spread (e.g. an exact-match rate of 1/200 in every seed): an exact tie gives p = 1; a
    difference gives nan, not the test's limit p = 0, because a few identical seeds are no evidence of certainty.
    """
    from scipy.stats import t as student_t

    a, b = _clean(a, "welch_test a"), _clean(b, "welch_test b")
    (mean_a, var_a), (mean_b, var_b) = _mean_var(a), _mean_var(b)
    diff = mean_a - mean_b
    if len(a) < 2 or len(b) < 2:
        return WelchResult(diff, math.nan, math.nan, math.nan, math.nan, len(a), len(b), confidence)
    se_a, se_b = var_a / len(a), var_b / len(b)
    se2 = se_a + se_b
    if se2 == 0:
        return WelchResult(diff, 0.0 if diff == 0 else math.nan, 0.0 if diff == 0 else math.nan, math.nan,
                           1.0 if diff == 0 else math.nan, len(a), len(b), confidence)
    df = se2 ** 2 / (se_a ** 2 / (len(a) - 1) + se_b ** 2 / (len(b) - 1))
    t = diff / math.sqrt(se2)
    p = float(2 * student_t.sf(abs(t), df))
    half_width = t_quantile(confidence, df) * math.sqrt(se2)
    return WelchResult(diff, half_width, t, df, p, len(a), len(b), confidence)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of p-values for testing several comparisons at once (nan stays nan).

    Controls the chance of any false "significant" among the family, and is never more conservative than
    Bonferroni: sort ascending, multiply the k-th smallest (k from 0) by (m - k), keep the sequence monotone, cap at 1.
    """
    indexed = [(p, i) for i, p in enumerate(p_values) if math.isfinite(p)]
    indexed.sort()
    m = len(indexed)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def groups_of(keys: Sequence) -> list[list[int]]:
    """The indices of each distinct key, in first-seen order: the samples of each prompt (a GRPO group)."""
    groups: dict = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return list(groups.values())


__all__ = ["Interval", "WelchResult", "detectable_effect", "groups_of", "holm_adjust", "mean_ci", "mean_se",
           "t_quantile", "welch_test"]
