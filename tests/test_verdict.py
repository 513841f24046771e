"""The verdict's statistics: Welch's t against scipy's, Holm's procedure by hand, and the error rate
on identical cells checked by simulation for the maps' shapes."""
import math
import re

import numpy as np
import pytest
from scipy import stats

from conftest import REPO, tool
from fairseq_lnpos.analysis import verdict as V
from fairseq_lnpos.analysis.frame import read_runs_csv

CHECK = tool("verdict_check")  # scripts/tools/verdict_check.py: the simulation


@pytest.mark.parametrize("spread", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("cells, seeds", CHECK.SHAPES)
def test_identical_cells_are_called_poor_at_most_five_percent_of_the_time(cells, seeds, spread):
    """The maps' shapes (a learning-rate map of one architecture: 6 cells of 3 seeds, or of 2; one
    setting of every architecture: 19 x 3; real text: 23 x 2): simulated maps of identical cells,
    margin 0 (the strictest), the rate at which some cell is called poor, every cell's spread the same
    and spreads that differ (log-normal, sd 0.5 and 1 in log units; the maps' cells differ about 1).
    Variances moderated towards the map's (Smyth) failed this: 6.1 % at 6 x 3, 9.9 % at 23 x 2 (4000 maps)."""
    assert CHECK.poor_rate(cells, seeds, sims=2000, sd_spread=spread, seed=1) <= 0.05


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


def test_the_power_grows_with_the_gap_and_the_seeds_and_falls_with_the_cells():
    """The power table's simulation: a cell 1 bit worse than 113 others is called poor less often than
    among 5 others, more often with 5 seeds than with 3, and a 0.3-bit gap less often than a 2-bit one."""
    rate = lambda cells, seeds, gap: CHECK.poor_rate(cells, seeds, gap, sims=200, margin=0.1, sd_spread=1.0, seed=3)
    assert rate(114, 3, 1.0) < rate(6, 3, 1.0) and rate(114, 3, 1.0) < rate(114, 5, 1.0)
    assert rate(6, 3, 0.3) < rate(6, 3, 2.0)


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


@pytest.mark.slow
def test_the_verdict_check_page_is_what_the_tool_writes_now(tmp_path, capsys):
    """docs/results/verdict-check: the simulation is seeded, so the tool run again writes the same tables
    (the page's command, date and code lines aside)."""
    assert CHECK.main(["--publish", str(tmp_path / "page")]) == 0
    capsys.readouterr()
    keep = lambda path: [line for line in path.read_text().splitlines()  # noqa: E731
                         if not line.startswith(("- Command:", "- Written:", "- Code:", "- Machine:"))]
    assert keep(tmp_path / "page" / "index.md") == keep(REPO / "docs" / "results" / "verdict-check" / "index.md")


RESULTS = REPO / "docs" / "results"


def test_the_trains_threshold_lies_between_the_demos_runs_that_learn_and_those_that_stall():
    """The basis DEFAULT_TRAINS states: on the demo's page, every run of a warm-up or Pre-LN-like row
    ends below it (as a fraction of the unigram bits) and Post-LN without warm-up above it."""
    runs = read_runs_csv(RESULTS / "demo" / "runs.csv")
    stalled = runs["run"] == "demo-postln-nowu"
    assert stalled.any() and (~stalled).any()
    assert runs.loc[~stalled, "nll_ratio"].max() < V.DEFAULT_TRAINS < runs.loc[stalled, "nll_ratio"].min()


def test_the_margin_is_above_what_a_rerun_on_another_machine_moves_a_cell():
    """The basis DEFAULT_MARGIN states: the re-run page (same seeds, another machine) says how far 95 % of
    its cells moved; the margin lies above it. (test_docs rebuilds that page from its own runs.csv.)"""
    page = (RESULTS / "all-archs-second-machine" / "index.md").read_text(encoding="utf-8")
    assert "the same seeds (a re-run)" in page
    (moved,) = re.findall(r"\|B - A\| at most (\d+\.\d+) in 95 % of the cells", page)
    assert 0 < float(moved) < V.DEFAULT_MARGIN
