"""The outcome rule (fairseq_lnpos.analysis.outcome): its intervals and tests by hand, and its error rates
simulated on maps shaped like the published ones, with seeds that stall."""
import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, tool
from fairseq_lnpos.analysis import outcome as O
from fairseq_lnpos.analysis.verdict import holm_rejects

CHECK = tool("verdict_check")  # scripts/tools/verdict_check.py: the simulation and its page
MAPS = 3000
simulate = lambda *a, **kw: CHECK.simulate(*a, maps=MAPS, **kw)  # noqa: E731
map_rate = CHECK.map_rate


@pytest.mark.parametrize("stall", [0.0, 0.15, 0.3])
@pytest.mark.parametrize("comparisons,seeds", CHECK.SHAPES)
def test_identical_cells_are_called_worse_better_or_to_train_differently_in_at_most_5_percent_of_maps(
        comparisons, seeds, stall):
    rng = np.random.default_rng(comparisons * 100 + seeds * 10 + int(stall * 100))
    worse, better, _, rate = simulate(rng, comparisons, seeds, stall, 0.0)
    assert map_rate(worse) <= 0.05 and map_rate(better) <= 0.05
    assert map_rate(rate) <= 0.05


@pytest.mark.parametrize("stall", [0.0, 0.15, 0.3])
@pytest.mark.parametrize("comparisons,seeds", CHECK.SHAPES)
def test_cells_a_margin_apart_are_called_equivalent_in_at_most_5_percent_of_maps(comparisons, seeds, stall):
    rng = np.random.default_rng(7 + comparisons * 100 + seeds * 10 + int(stall * 100))
    for shift in (O.MARGIN, -O.MARGIN):
        assert map_rate(simulate(rng, comparisons, seeds, stall, shift)[2]) <= 0.05


@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_paired_comparisons_keep_the_rates_too(stall):
    rng = np.random.default_rng(11)
    worse, _, _, _ = simulate(rng, 23, 3, stall, 0.0, paired=True)
    assert map_rate(worse) <= 0.05
    assert map_rate(simulate(rng, 23, 3, stall, O.MARGIN, paired=True)[2]) <= 0.05


def test_the_earlier_rule_over_stalled_and_learned_seeds_is_what_fails():
    """Why the rule keeps the two parts apart: the earlier verdict (Welch over every seed of a cell, stalled
    ones ending 3 bits above, every pair of a family Holm-corrected) calls identical cells poor in far more
    than 5 % of maps once seeds stall with probability 0.3."""
    from fairseq_lnpos.analysis.verdict import poor

    rng = np.random.default_rng(3)
    size = (500, 19, 3)
    nll = rng.normal(0, 0.05, size) + 3.0 * (rng.random(size) < 0.3)
    called = [poor(m, v, np.full(19, 3)).__getitem__(0).any() for m, v in zip(nll.mean(-1), nll.var(-1, ddof=1))]
    assert np.mean(called) > 0.2


def test_a_real_difference_is_found_with_enough_seeds():
    """Power: a cell 0.5 bit worse than its reference at a spread of 0.1 bit is called worse in most maps."""
    rng = np.random.default_rng(5)
    size = (500, 23, 5)
    x, r = rng.normal(0.5, 0.1, size), rng.normal(0, 0.1, size)
    diff, se, df = O.welch_parts(x.mean(-1), x.var(-1, ddof=1), 5, r.mean(-1), r.var(-1, ddof=1), 5)
    worse = O.sided_tests(diff, se, df)[0]
    assert np.mean([holm_rejects(row, O.ALPHA).all() for row in worse]) > 0.8


# ---------------------------------------------------------------- by hand

def test_train_rate_intervals_are_the_exact_ones():
    assert O.rate_interval(0, 3) == pytest.approx((0.0, 1 - 0.025 ** (1 / 3)))
    assert O.rate_interval(3, 3) == pytest.approx((0.025 ** (1 / 3), 1.0))
    assert all(math.isnan(v) for v in O.rate_interval(0, 0))


def test_three_seeds_a_side_cannot_show_a_rate_difference_and_five_can():
    assert O.rate_p(3, 3, 0, 3) == pytest.approx(0.1)
    assert O.rate_p(5, 5, 0, 5) == pytest.approx(2 / 252)


def test_a_paired_difference_by_hand():
    x = pd.Series([1.0, 2.0, 3.0, 9.0], index=[1, 2, 3, 4])
    ref = pd.Series([0.5, 1.6, 2.4], index=[1, 2, 3])  # seed 4 did not train in the reference
    got = O.difference(x, ref, paired=True)
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n) of the differences .5 .4 .6
    assert got["compared"] == "3 pairs"
    assert (got["diff"], got["low"], got["high"]) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    assert got["p_worse"] < 0.05 < got["p_equivalent"]


def test_a_welch_difference_by_hand():
    from scipy.stats import ttest_ind

    x, ref = np.array([3.1, 3.3, 3.2]), np.array([3.0, 2.9, 3.05, 2.95])
    got = O.difference(x, ref)
    ci = ttest_ind(x, ref, equal_var=False).confidence_interval(0.95)
    assert (got["low"], got["high"]) == pytest.approx((ci.low, ci.high))
    # worse: H0 diff <= margin, i.e. Welch's one-sided test of x - margin against ref
    assert got["p_worse"] == pytest.approx(ttest_ind(x - O.MARGIN, ref, equal_var=False, alternative="greater").pvalue)


def test_seeds_equal_to_the_logged_digits_give_a_known_difference():
    same = O.difference(pd.Series([1.0, 1.0]), pd.Series([0.5, 0.5]))
    assert (same["diff"], same["p_worse"], same["p_equivalent"]) == (0.5, 0.0, 1.0)
    close = O.difference(pd.Series([1.0, 1.0]), pd.Series([0.95, 0.95]))
    assert (close["p_worse"], close["p_equivalent"]) == (1.0, 0.0)


def test_a_side_with_one_seed_that_trains_is_not_compared():
    got = O.difference(pd.Series([1.0]), pd.Series([0.5, 0.6]))
    assert math.isnan(got["p_worse"]) and got["compared"] == "1 and 2"


def test_words_are_holm_corrected_over_the_page():
    table = pd.DataFrame({"p_worse": [0.01, 0.04, 0.5, np.nan], "p_better": [1, 1, 1, np.nan],
                          "p_equivalent": [1, 1, 0.01, np.nan], "rate_p": [1.0, 1.0, 0.004, np.nan],
                          "rate": [1, 1, 0, 1], "rate_ref": [1, 1, 1, 1]})
    word, rate_word = O.words(table)
    # three finite p-values: 0.01 <= 0.05/3 rejected, then 0.04 > 0.05/2 stops
    assert word.tolist() == ["worse", "inconclusive", "equivalent", "not compared"]
    assert rate_word.tolist() == ["", "", "trains less often", ""]


def _runs(**columns):
    base = {"outcome": ["finished"] * 4, "settings": [json.dumps({"dataset": "synthetic"})] * 2
            + [json.dumps({"dataset": "multi30k"})] * 2, "nll_ratio": [0.3, 0.7, 0.6, 0.9],
            "source_gain": [math.nan] * 4}
    return pd.DataFrame({**base, **columns})


def test_a_run_trains_by_its_source_gain_where_measured_and_by_its_corpus_threshold_elsewhere():
    assert O.run_trains(_runs()).tolist() == [True, False, True, False]
    gains = [0.2, 5.0, math.nan, 3.0]
    assert O.run_trains(_runs(source_gain=gains)).tolist() == [False, True, True, True]
    assert O.run_trains(_runs(outcome=["diverged"] * 4, source_gain=gains)).tolist() == [False] * 4


def test_the_power_grows_with_the_seeds_and_falls_with_the_spread():
    """The power table's simulation: the gap found 80 % of the time is smaller with 8 seeds than with 3, and
    larger at a spread of 0.5 bit than of 0.05."""
    assert CHECK.gap_found(8, 0.2, maps=200) < CHECK.gap_found(3, 0.2, maps=200)
    assert CHECK.gap_found(5, 0.05, maps=200) < CHECK.gap_found(5, 0.5, maps=200)


@pytest.mark.slow
def test_the_verdict_check_page_is_what_the_tool_writes_now(tmp_path, capsys):
    """docs/results/verdict-check: the simulation is seeded, so the tool run again with the page's command line
    writes the same tables (the page's command, date and code lines aside)."""
    from conftest import page_argv

    page = REPO / "docs" / "results" / "verdict-check"
    argv = page_argv(page)[2:]
    argv[argv.index("--publish") + 1] = str(tmp_path / "page")
    assert CHECK.main(argv) == 0
    capsys.readouterr()
    keep = lambda path: [line for line in path.read_text().splitlines()  # noqa: E731
                         if not line.startswith(("- Command:", "- Written:", "- Code:", "- Machine:"))]
    assert keep(tmp_path / "page" / "index.md") == keep(page / "index.md")


def test_the_margin_is_above_what_a_rerun_on_another_machine_moves_a_cell_that_trains():
    """The basis MARGIN states: the re-run page (same seeds, another machine) says how far 95 % of its cells,
    and of the cells that train in both runs, moved; the margin lies above both."""
    text = (REPO / "docs" / "results" / "all-archs-second-machine" / "index.md").read_text(encoding="utf-8")
    (every,) = re.findall(r"\|B - A\| at most (\d+\.\d+) in 95 % of the cells", text)
    (trained,) = re.findall(r"cells whose every seed trains in both \([^)]*\), at most (\d+\.\d+) in 95 %", text)
    assert 0 < float(every) < O.MARGIN and 0 < float(trained) < O.MARGIN
