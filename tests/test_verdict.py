"""The earlier verdict's statistics (analysis/verdict.py: Welch's t per ordered pair, Holm), still used by the
studies of named runs: Welch's t against scipy's and Holm's procedure by hand."""
import math

import numpy as np
import pytest
from scipy import stats

from fairseq_lnpos.analysis import verdict as V



def test_a_cell_far_worse_than_the_others_is_found():
    """Not a test that can never reject: one cell 1 bit (10 standard deviations) worse than five others
    is called poor in nearly every simulated map of 3 seeds."""
    rng = np.random.default_rng(2)
    found = 0
    for _ in range(200):
        x = rng.standard_normal((6, 3)) * 0.1
        x[0] += 1.0
        var = x.var(axis=1, ddof=1)
        bad, _ = V.poor(x.mean(axis=1), var, [3] * 6, margin=0.1)
        found += bool(bad[0]) and not bad[1:].any()
    assert found >= 190


def test_welchs_p_value_is_scipys():
    a, b = np.array([4.0, 4.3, 4.1]), np.array([3.0, 3.05, 3.2, 3.1])
    p = V.pair_pvalues([a.mean(), b.mean()], [a.var(ddof=1), b.var(ddof=1)], [3, 4], [2, 3], margin=0.0)
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    assert p[0, 1] == pytest.approx(ref, rel=1e-9)
    assert p[1, 0] == pytest.approx(1 - ref, rel=1e-9) and math.isnan(p[0, 0])
    # a margin shifts the hypothesis: mu_a - mu_b <= 0.5
    shifted = V.pair_pvalues([a.mean(), b.mean()], [a.var(ddof=1), b.var(ddof=1)], [3, 4], [2, 3], margin=0.5)
    assert shifted[0, 1] == pytest.approx(stats.ttest_ind(a - 0.5, b, equal_var=False, alternative="greater").pvalue)


def test_holm_step_down_by_hand():
    p = np.array([[np.nan, 0.005, 0.04], [0.5, np.nan, 0.009], [0.9, 0.03, np.nan]])
    # six p-values; sorted 0.005 <= 0.05/6, 0.009 <= 0.05/5, 0.03 > 0.05/4: stop
    assert V.holm_rejects(p, 0.05).tolist() == [[False, True, False], [False, False, True], [False, False, False]]


def test_a_difference_within_the_margin_is_never_poor():
    """Two cells without spread (the same numbers from every seed): 0.09 bit apart is within the margin
    of 0.1; 0.11 is beyond it."""
    assert not V.poor([1.09, 1.0], [0.0, 0.0], [3, 3], margin=0.1)[0].any()
    assert V.poor([1.11, 1.0], [0.0, 0.0], [3, 3], margin=0.1)[0].tolist() == [True, False]


def test_each_cell_is_tested_on_its_own_variance_and_a_one_seed_cell_not_at_all():
    """A tight cell beside a noisy one: the noisy cell's spread is its own, not the family's, so 0.5 bit
    worse with sd 0.3 on 3 seeds is not shown worse (Welch: t = 2.3 on ~2 df), while the same gap
    between two tight cells is; a one-seed cell, however far off, has no variance and is not tested."""
    assert V.poor([1.5, 1.0, 1.0], [0.09, 0.0001, 0.0001], [3, 3, 3], margin=0.1)[0].tolist() == [False] * 3
    assert V.poor([1.5, 1.0, 1.0], [0.0001] * 3, [3, 3, 3], margin=0.1)[0].tolist() == [True, False, False]
    bad, tested = V.poor([9.0, 1.0, 1.1], [math.nan, 0.01, 0.01], [1, 3, 3])
    assert tested.tolist() == [False, True, True] and not bad.any()


def test_the_rule_is_stated_with_its_numbers():
    text = V.describe(0.5, 0.1, 0.05)
    assert "at most 0.5 x the corpus's unigram bits" in text and "by more than 0.1 bit" in text
    assert "Holm-corrected at 0.05" in text and "NA: one seed, not compared" in text


def test_the_difference_of_seeds_equal_to_the_logged_digits_is_quiet_and_finite():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's precision warning would be printed to the user
        d, low, high = V.welch([4.229, 4.214], [5.225, 5.225])[:3]
    assert d == pytest.approx(-1.0035) and low < d < high and math.isfinite(low) and math.isfinite(high)
