"""The study's statistics: exact t-intervals, Welch's test and Holm's correction on numbers worked out by hand."""
import math

import pytest

from dalle_lab.stats import detectable_effect, holm_adjust, mean_ci, t_quantile, welch_test


def t_two_sided_95_df2() -> float:
    # Student's t with 2 degrees of freedom has a closed-form quantile: t = (1 - 2a) / sqrt(2 a (1 - a)), a = 0.025
    a = 0.025
    return (1 - 2 * a) / math.sqrt(2 * a * (1 - a))


def test_t_quantiles_match_closed_forms():
    assert t_quantile(0.95, 2) == pytest.approx(t_two_sided_95_df2(), rel=1e-9)  # 4.3027
    assert t_quantile(0.95, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)  # 12.706
    assert t_quantile(0.95, 1e7) == pytest.approx(1.959964, abs=1e-5)  # the normal limit


def test_mean_ci_is_the_exact_t_interval():
    interval = mean_ci([1.0, 2.0, 3.0])  # mean 2, s = 1, n = 3
    half = t_two_sided_95_df2() * 1.0 / math.sqrt(3)  # 2.4841
    assert interval.mean == pytest.approx(2.0)
    assert interval.std == pytest.approx(1.0)
    assert interval.half_width == pytest.approx(half, rel=1e-9)
    assert (interval.low, interval.high) == pytest.approx((2 - half, 2 + half))
    assert interval.n == 3 and interval.to_dict()["high"] == pytest.approx(2 + half)

    wide = mean_ci([0.5, 0.7])  # s = 0.1414, t(0.975, 1) = 12.706: two seeds give a very wide interval
    assert wide.half_width == pytest.approx(math.tan(math.pi * 0.475) * math.sqrt(0.02) / math.sqrt(2), rel=1e-9)
    assert mean_ci([0.3, 0.3, 0.3]).half_width == 0.0


def test_detectable_effect_is_the_sum_of_the_two_t_quantiles_times_the_standard_error():
    # df = 2 closed forms: two-sided 95 % 4.3027; the 80 % quantile (2p - 1) / sqrt(2 p (1 - p)) = 1.0607 at p = 0.8
    t80 = 0.6 / math.sqrt(2 * 0.8 * 0.2)
    assert detectable_effect(0.02, 3) == pytest.approx((t_two_sided_95_df2() + t80) * 0.02 / math.sqrt(3), rel=1e-9)
    # many paired values: the normal limit, (1.960 + 0.842) standard errors
    assert detectable_effect(0.5, 10**7) == pytest.approx(2.8016 * 0.5 / math.sqrt(10**7), rel=1e-4)
    assert detectable_effect(0.5, 400, power=0.5) == pytest.approx(t_quantile(0.95, 399) * 0.5 / 20, rel=1e-9)
    assert math.isnan(detectable_effect(0.1, 1))


def test_mean_ci_of_one_value_has_no_interval_and_of_none_is_an_error():
    single = mean_ci([0.42])
    assert single.mean == 0.42 and math.isnan(single.half_width)
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])


def test_welch_test_by_hand():
    # a: mean 2, var 1, n 3; b: mean 5.5, var 5/3, n 4 -> se^2 = 1/3 + 5/12 = 0.75
    result = welch_test([1, 2, 3], [4, 5, 6, 7])
    df = 0.75 ** 2 / ((1 / 3) ** 2 / 2 + (5 / 12) ** 2 / 3)  # Welch-Satterthwaite: 4.9592
    assert result.difference == pytest.approx(-3.5)
    assert result.t == pytest.approx(-3.5 / math.sqrt(0.75))
    assert result.df == pytest.approx(df)
    assert result.half_width == pytest.approx(t_quantile(0.95, df) * math.sqrt(0.75))
    assert result.p_value == pytest.approx(0.0100769433, rel=1e-6)  # scipy.stats.ttest_ind(equal_var=False)
    assert result.significant() and not result.significant(alpha=0.01)
    # the interval excludes 0 exactly when p < 0.05
    assert result.difference + result.half_width < 0


def test_welch_test_agrees_with_scipy_on_unequal_spreads():
    from scipy.stats import ttest_ind

    a, b = [0.61, 0.58, 0.66, 0.60], [0.52, 0.71, 0.43]
    expected = ttest_ind(a, b, equal_var=False)
    result = welch_test(a, b)
    assert result.t == pytest.approx(float(expected.statistic))
    assert result.p_value == pytest.approx(float(expected.pvalue))
    assert not result.significant()


def test_welch_test_edge_cases():
    tie = welch_test([0.0, 0.0], [0.0, 0.0])
    assert tie.p_value == 1.0 and tie.half_width == 0.0
    apart = welch_test([1.0, 1.0], [0.0, 0.0])  # constant but different: untestable, never "significant"
    assert apart.difference == 1.0 and math.isnan(apart.p_value) and not apart.significant()
    one_seed = welch_test([1.0], [0.0, 0.5])
    assert one_seed.difference == pytest.approx(0.75) and math.isnan(one_seed.p_value) and not one_seed.significant()


def test_holm_adjustment_by_hand():
    # sorted: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> kept monotone at 0.06; nan is not a test
    adjusted = holm_adjust([0.01, 0.04, 0.03, math.nan])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(adjusted[3])
    assert holm_adjust([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm_adjust([]) == []
