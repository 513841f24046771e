"""The outcome of a cell of seeds, stated once: how often it trains, how well the seeds that train do, and
how it differs from a reference named before the data; a word only where an interval decides.

Post-LN without warm-up does not train worse, it stalls: a seed either learns or ends where a decoder that
no longer reads its source ends. So a cell has two parts, never one mean over both kinds of seed:

- **trains** (a run): it finished and it *uses its source*: its validation NLL with the sources permuted
  across the validation sentences exceeds its NLL with the true sources by more than :data:`SOURCE_GAIN`
  bits (``source_gain``, :mod:`~fairseq_lnpos.experiments.source_use`), one rule for every corpus and budget.
  A run recorded without that measurement is judged by its corpus's NLL threshold (:data:`TRAINS`,
  a fraction of the unigram bits) calibrated against the gain on runs that have both.
- **train rate** (a cell): k of n seeds train, with the exact (Clopper-Pearson) 95 % interval; two cells'
  rates are compared by Fisher's exact test. With 3 seeds a side no rate difference can be shown (3/3 against
  0/3 gives p = 0.1): the page says so rather than a word.
- **NLL** (a cell): the mean final validation NLL (bits, no label smoothing) of the seeds that train, with
  its t interval.
- **difference** (a cell against its reference): NLL minus the reference's over the seeds that train in
  each, with its 95 % interval: paired by seed where both cells start from the same initialization and data
  order (the same architecture and depth; a paired t on the seeds that train in both), else Welch's. Words,
  each a one-sided test at :data:`ALPHA` with Holm's correction over every comparison of a page:
  *worse* (the difference exceeds +:data:`MARGIN`), *better* (below -:data:`MARGIN`), *equivalent* (within
  +-:data:`MARGIN`: two one-sided tests, TOST), else *inconclusive*; a side with fewer than two seeds that train
  is *not compared*. A train rate that differs is *trains less often* / *more often* (Fisher, Holm).
- **the margin**: above what training the same runs again on another machine moves a cell that trains
  (docs/results/all-archs-second-machine: 95 % of the cells whose every seed trains in both runs by at most
  0.071 bit; why-warmup-second-machine on real text: the 2 rows whose every seed trains in both, at most
  0.004), so a difference called worse or better is not one a re-run makes.

Error rates, simulated on maps shaped like ours (tests/test_outcome.py, ``scripts/tools/verdict_check.py``):
identical cells, with Gaussian seeds of the maps' spreads and with seeds that stall with probability 0.15
and 0.3, are called *worse* in at most 5 % of maps; cells that differ by exactly the margin are called
*equivalent* in at most 5 % of maps.
"""
import math
import warnings

import numpy as np
from scipy import stats

from .verdict import holm_rejects

# a run uses its source when permuting the sources raises its validation NLL by more than this (bits).
# Basis: docs/results/source-use, the demo's rows on the generated corpus (300 updates) and on Multi30k (one
# epoch): the runs that do not use their source gain at most 1.072 bit on either corpus, those that do at least
# 2.174; tests/test_source_use.py holds it between them.
SOURCE_GAIN = 1.5
# a run without the source-use measurement trains when its final NLL is at most this fraction of its
# corpus's unigram bits, per corpus (the settings' ``dataset``), calibrated against SOURCE_GAIN on the runs of
# that page: every fraction from 0.136 to 0.683 agrees with the gain on the generated corpus's, from 0.586 to
# 0.690 on Multi30k's (one epoch; 0.8, used before, misjudged 4 of its 8 runs: DeepNorm and Post-LN with
# warm-up end below it without reading the source). A fraction fit for one budget need not be for another:
# after 4 epochs DeepNorm's stalled runs end at 0.605 (docs/results/real-text-epochs); the gain is the rule.
TRAINS = {"synthetic": 0.5, "multi30k": 0.64}
MARGIN = 0.15
ALPHA = 0.05
LEVEL = 0.95
WORDS = ("worse", "better", "equivalent", "inconclusive", "not compared")


def describe(margin=MARGIN, alpha=ALPHA, gain=SOURCE_GAIN, trains=None):
    """The rule in words, with its numbers, as every page states it."""
    per = ", ".join(f"{c} {t:g}" for c, t in sorted((trains or TRAINS).items()))
    return (f"A run trains when it finished and uses its source: permuting the validation sources across "
            f"sentences raises its NLL by more than {gain:g} bit (where measured; otherwise its final NLL is at "
            f"most a calibrated fraction of the corpus's unigram bits: {per}). Train rate: k of n seeds, exact 95 % "
            f"interval; rates compared by Fisher's exact test. NLL: final validation NLL (bits, no label "
            f"smoothing) of the seeds that train, mean and 95 % interval. Difference: against the reference the "
            f"page names, over the seeds that train, 95 % interval (paired by seed within an architecture and "
            f"depth, else Welch). Words, one-sided tests at {alpha:g} with Holm's correction over the page's "
            f"comparisons: worse / better (beyond {margin:g} bit), equivalent (within {margin:g} bit, TOST), "
            f"else inconclusive; not compared: fewer than two seeds train on a side.")


# ---------------------------------------------------------------- a run, a cell

def corpus_of(settings):
    """The corpus a run trained on, from its settings' JSON: the run table's ``dataset`` up to a '_' (after
    it, a size: ``multi30k_cpu`` is Multi30k on a CPU's settings); '' where not recorded."""
    import json

    try:
        return str(json.loads(settings).get("dataset") or "").split("_")[0]
    except (TypeError, ValueError, AttributeError):
        return ""


def threshold(runs, trains=None):
    """Each run's NLL-ratio threshold: ``trains`` where a number (one for every corpus), else its corpus's
    in ``trains`` or :data:`TRAINS` (a corpus in neither: the generated corpus's)."""
    if trains is not None and not isinstance(trains, dict):
        return runs["outcome"].map(lambda _: float(trains))
    trains = trains or TRAINS
    return runs["settings"].map(corpus_of).map(lambda c: trains.get(c, TRAINS["synthetic"]))


def run_trains(runs, gain=SOURCE_GAIN, trains=None):
    """Per run (a row of the table of every run): does it train? A boolean Series: finished and, where its
    source gain was measured, gain above ``gain``; else its NLL ratio at most its :func:`threshold`."""
    finished = runs["outcome"] == "finished"
    at = threshold(runs, trains)
    by_ratio = runs["nll_ratio"] <= at
    measured = runs["source_gain"].notna() if "source_gain" in runs else finished & False
    by_gain = runs["source_gain"] > gain if "source_gain" in runs else by_ratio
    return finished & np.where(measured, by_gain, by_ratio).astype(bool)


def rate_interval(k, n, level=LEVEL):
    """The exact (Clopper-Pearson) interval of a rate of k in n (NaN, NaN for n = 0)."""
    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(int(k), int(n)).proportion_ci(level, method="exact")
    return float(ci.low), float(ci.high)


def mean_interval(x, level=LEVEL):
    """(mean, low, high) of ``x`` with the t interval; the interval NaN below two values."""
    x = np.asarray(x, float)
    if not len(x):
        return math.nan, math.nan, math.nan
    if len(x) < 2:
        return float(x.mean()), math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


# ---------------------------------------------------------------- a difference

def welch_parts(mean, var, n, mean_ref, var_ref, n_ref):
    """(difference, its standard error, Welch-Satterthwaite df) of two independent samples given by their
    means, sample variances and sizes (arrays or numbers)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = np.asarray(var, float) / n, np.asarray(var_ref, float) / n_ref
        terms = a * a / (np.asarray(n) - 1) + b * b / (np.asarray(n_ref) - 1)
        df = np.where(terms > 0, (a + b) ** 2 / terms, 1e12)
    return np.asarray(mean, float) - mean_ref, np.sqrt(a + b), df


def paired_parts(mean_d, var_d, n):
    """(difference, its standard error, df) of paired differences given by their mean, variance and number."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(mean_d, float), np.sqrt(np.asarray(var_d, float) / n), np.asarray(n, float) - 1


def sided_tests(diff, se, df, margin=MARGIN):
    """The one-sided p-values (arrays) of a difference with standard error ``se`` and ``df``: worse (H0:
    diff <= margin), better (H0: diff >= -margin) and equivalent (TOST: the larger of H0: diff >= margin and
    H0: diff <= -margin). A zero standard error (seeds equal to the logged digits) makes the difference known:
    p 0 where the alternative holds, else 1."""
    diff, se, df = np.broadcast_arrays(*(np.asarray(x, float) for x in (diff, se, df)))
    with np.errstate(divide="ignore", invalid="ignore"):
        hi, lo = (diff - margin) / se, (diff + margin) / se
        known = se == 0
        worse = np.where(known, np.where(diff > margin, 0.0, 1.0), stats.t.sf(hi, df))
        better = np.where(known, np.where(diff < -margin, 0.0, 1.0), stats.t.cdf(lo, df))
        below = np.where(known, np.where(diff < margin, 0.0, 1.0), stats.t.cdf(hi, df))
        above = np.where(known, np.where(diff > -margin, 0.0, 1.0), stats.t.sf(lo, df))
    bad = ~np.isfinite(se) | ~(df > 0)
    return tuple(np.where(bad, np.nan, p) for p in (worse, better, np.maximum(below, above)))


def difference(x, ref, paired=False, margin=MARGIN, level=LEVEL):
    """The difference of ``x`` from ``ref`` (NLLs of the seeds that train; with ``paired`` both Series by
    seed, the seeds in both compared) as a dict: ``diff``, its ``low`` and ``high`` (``level`` interval),
    ``compared`` (pairs, or the two counts) and the p-values of :func:`sided_tests`; NaN where a side has fewer than
    two values."""
    if paired:
        both = x.index.intersection(ref.index)
        d = (x[both] - ref[both]).to_numpy(float)
        n = f"{len(d)} pairs"
        ok = len(d) >= 2
        diff, se, df = paired_parts(d.mean(), d.var(ddof=1), len(d)) if ok else (math.nan,) * 3
    else:
        a, b = np.asarray(x, float), np.asarray(ref, float)
        n = f"{len(a)} and {len(b)}"
        ok = len(a) >= 2 and len(b) >= 2
        diff, se, df = welch_parts(a.mean(), a.var(ddof=1), len(a), b.mean(), b.var(ddof=1), len(b)) if ok \
            else (math.nan,) * 3
    if not ok:
        return dict(diff=math.nan, low=math.nan, high=math.nan, p_worse=math.nan, p_better=math.nan,
                    p_equivalent=math.nan, compared=n)
    half = float(stats.t.ppf(0.5 + level / 2, df) * se)
    worse, better, equivalent = (float(p) for p in sided_tests(diff, se, df, margin))
    return dict(diff=float(diff), low=float(diff) - half, high=float(diff) + half, p_worse=worse, p_better=better,
                p_equivalent=equivalent, compared=n)


def rate_p(k, n, k_ref, n_ref):
    """Fisher's exact two-sided p-value of k of n against k_ref of n_ref (NaN where a side has no seed)."""
    if not n or not n_ref:
        return math.nan
    return float(stats.fisher_exact([[k, n - k], [k_ref, n_ref - k_ref]])[1])


def words(table, alpha=ALPHA):
    """The words of a page's comparisons (a DataFrame with the columns of :func:`difference` and
    ``rate_p``, ``rate``, ``rate_ref``), each family Holm-corrected over the page at ``alpha``: a Series
    ``word`` (:data:`WORDS`) and a Series ``rate_word`` ('trains less often', 'trains more often' or '')."""
    import pandas as pd

    def holm(col):
        return holm_rejects(table[col].to_numpy(float), alpha) if len(table) else np.zeros(0, bool)

    worse, better, equiv, rate = holm("p_worse"), holm("p_better"), holm("p_equivalent"), holm("rate_p")
    word = np.select([table["p_worse"].isna().to_numpy(), worse, better, equiv],
                     ["not compared", "worse", "better", "equivalent"], "inconclusive")
    less = (table["rate"] < table["rate_ref"]).to_numpy()
    rate_word = np.where(rate, np.where(less, "trains less often", "trains more often"), "")
    return pd.Series(word, table.index), pd.Series(rate_word, table.index)


def compare_cells(cells, runs, pairs, keys, paired_by=("variant", "layers"), margin=MARGIN, alpha=ALPHA):
    """The comparisons of a page: ``pairs`` is a list of (cell key, reference key, reference name), keys
    being tuples of ``keys``; ``runs`` the table of every run with a boolean ``trains``; ``cells`` the
    cells with ``seeds`` and ``seeds_train``. A DataFrame, a row per pair: the keys, ``reference``,
    the two train rates, Fisher's p, the difference and its interval, and the words (:func:`words`)."""
    import pandas as pd

    keys = list(keys)
    by = runs.set_index(keys).sort_index()
    trained = by[by["trains"]]
    cell = cells.set_index(keys)
    rows = []
    for key, ref, name in pairs:
        x = trained.loc[[key]].set_index("seed")["final_valid_nll"] if key in trained.index else pd.Series(dtype=float)
        r = trained.loc[[ref]].set_index("seed")["final_valid_nll"] if ref in trained.index else pd.Series(dtype=float)
        paired = all(key[keys.index(k)] == ref[keys.index(k)] for k in paired_by)
        k, n = int(cell.at[key, "seeds_train"]), int(cell.at[key, "seeds"])
        k0, n0 = int(cell.at[ref, "seeds_train"]), int(cell.at[ref, "seeds"])
        rows.append({**dict(zip(keys, key)), "reference": name, "k": k, "n": n, "k_ref": k0, "n_ref": n0,
                     "rate": k / n, "rate_ref": k0 / n0, "rate_p": rate_p(k, n, k0, n0), "paired": paired,
                     **difference(x, r, paired=paired, margin=margin)})
    table = pd.DataFrame(rows)
    if len(table):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            table["word"], table["rate_word"] = words(table, alpha)
    return table
