"""The maps' verdicts, stated once (:func:`describe` states them with their numbers): on the final
validation NLL in bits (fairseq's ``valid_nll_loss``, without the label smoothing that adds about 1.3
bits to every cell) of each cell (architecture, depth, warm-up, learning rate; its runs are its seeds).

- **trains**: no seed diverged or was stopped early and the mean NLL is at most ``trains`` times the
  corpus's unigram bits (:func:`~fairseq_lnpos.data.unigram.unigram_bits`): one threshold for every corpus.
- **poor**: worse than another cell of its family that trains by more than ``margin`` bits: every ordered
  pair (i, j) tests mu_i - mu_j <= margin with Welch's t, the k (k - 1) tests Holm-corrected at ``alpha``;
  no best cell is selected first, so of identical cells some is called poor at most ``alpha`` of the time.
- **the margin**: about what a re-run alone changes (:data:`DEFAULT_MARGIN`): a difference no larger
  than a second machine makes of the same runs is not one to call a cell poor for.
- **each cell's variance**: its seeds' own (Welch), nothing pooled or moderated: the cells' standard
  deviations differ a hundredfold (0.007 to 1.3 bit, 5th to 95th percentile, on the all-archs page), and
  variances moderated towards the map's (Smyth's empirical Bayes) understate a noisy cell's and called
  identical cells poor in up to 10 % of the maps below. A one-seed cell is not compared (NA). Simulated
  (tests/test_verdict.py, ``python scripts/tools/verdict_check.py --publish DIR``), identical cells
  are called poor in at most 5 % of maps of 6 x 3, 19 x 3, 23 x 2 and 6 x 2 seeds, with equal spreads
  and with spreads that differ.
- **good** = trains and not poor: ``good_own`` among the cells of the same architecture and depth,
  ``good_depth`` among every cell at that depth. **seeds disagree**: some seeds train, some do not.
"""
import math
import warnings

import numpy as np
from scipy.stats import t as student, ttest_ind

# "trains": the final NLL at most this fraction of the unigram bits. Its basis: the demo's per-seed data
# (docs/results/demo/runs.csv, column nll_ratio), where it lies between the runs that learn and Post-LN
# without warm-up, stalled (tests/test_verdict.py holds it there).
DEFAULT_TRAINS = 0.5
# "poor": worse by more than this many bits. Its basis: the same runs trained again on a second machine
# (docs/results/all-archs-second-machine: same seeds, code and data) moved 95 % of the cells' mean NLL
# by less than this ("|B - A| at most ... in 95 % of the cells" on that page; tests/test_verdict.py) and
# 95 % of the cells that train in both runs, the only ones it separates, by about this (the page's second
# "at most"); on real text: docs/results/why-warmup-second-machine.
DEFAULT_MARGIN = 0.1
DEFAULT_ALPHA = 0.05
FAMILIES = {"own": ("variant", "layers"), "depth": ("layers",)}


def describe(trains=DEFAULT_TRAINS, margin=DEFAULT_MARGIN, alpha=DEFAULT_ALPHA):
    """The rules in words, with their numbers, as every output states them."""
    return (f"Quantity: final validation NLL (bits, no label smoothing), mean over the seeds. Trains: no seed "
            f"diverged or was stopped early and the NLL is at most {trains:g} x the corpus's unigram bits "
            f"(--trains). Poor: worse than another cell of its family by more than {margin:g} bit (--margin), "
            f"Welch's t (each cell its own variance), every ordered pair of the family tested, Holm-corrected at "
            f"{alpha:g} (--alpha): identical cells are called poor at most {alpha:.0%} of the time. Good: trains "
            f"and not poor; good (own): against the cells of the same architecture and depth; good (depth): against "
            f"every cell at that depth. '?': the seeds disagree on 'trains'; NA: one seed, not compared.")


# ---------------------------------------------------------------- the test

def pair_pvalues(means, variances, ns, dfs, margin):
    """P[i, j]: the one-sided p-value of mu_i - mu_j <= margin, Welch's t with Welch-Satterthwaite
    degrees of freedom on the cells' sample variances and their dfs (seeds - 1); NaN on the diagonal and
    where a cell has no variance (df 0)."""
    m, v, n, d = (np.asarray(x, float) for x in (means, variances, ns, dfs))
    a = v / n
    se2 = a[:, None] + a[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        part = a * a / d
        terms = part[:, None] + part[None, :]
        df = np.where(terms > 0, se2 * se2 / terms, 1e12)
        diff = m[:, None] - m[None, :] - margin
        p = student.sf(diff / np.sqrt(se2), np.minimum(df, 1e12))
    p = np.where(se2 > 0, p, np.where(diff > 0, 0.0, 1.0))
    bad = ~np.isfinite(a) | (d == 0)
    p[bad, :] = p[:, bad] = np.nan
    np.fill_diagonal(p, np.nan)
    return p


def holm_rejects(p, alpha):
    """The Holm step-down rejections of the finite p-values of ``p`` (same shape, booleans)."""
    flat, rejected = p.ravel(), np.zeros(p.size, bool)
    idx = np.argsort(flat, kind="stable")
    idx = idx[np.isfinite(flat[idx])]
    rejected[idx] = np.cumprod(flat[idx] <= alpha / (len(idx) - np.arange(len(idx)))).astype(bool)
    return rejected.reshape(p.shape)


def poor(means, variances, ns, margin=DEFAULT_MARGIN, alpha=DEFAULT_ALPHA):
    """For each cell of one family (its seeds' mean, sample variance and number): is it poor? Also
    whether it could be tested (two seeds or more)."""
    ns = np.asarray(ns, int)
    variances = np.where(ns > 1, np.asarray(variances, float), math.nan)
    has = ns > 1
    if len(means) < 2:
        return np.zeros(len(means), bool), has
    p = pair_pvalues(means, variances, ns, np.maximum(ns - 1, 0), margin)
    return holm_rejects(p, alpha).any(axis=1), has


def welch(x, ref):
    """(mean(x) - mean(ref), Welch's 95 % interval low, high, Welch's two-sided p-value): NaN where either
    is empty, the interval and p-value NaN where either has fewer than two values."""
    x, ref = np.asarray(x, float), np.asarray(ref, float)
    if not len(x) or not len(ref):
        return math.nan, math.nan, math.nan, math.nan
    if len(x) < 2 or len(ref) < 2:
        return x.mean() - ref.mean(), math.nan, math.nan, math.nan
    with warnings.catch_warnings():  # seeds equal to the logged digits: scipy warns of its moments' precision
        warnings.simplefilter("ignore", RuntimeWarning)
        test = ttest_ind(x, ref, equal_var=False)
        ci = test.confidence_interval(0.95)
    return x.mean() - ref.mean(), ci.low, ci.high, float(test.pvalue)


def good(table, by, mean="nll", var="nll_var", n="finished", margin=DEFAULT_MARGIN, alpha=DEFAULT_ALPHA, lone=None,
         index=None, other=None):
    """The verdict of each row of ``table`` (cells that train; its columns ``mean``, ``var`` and ``n``: the
    seeds' mean, sample variance and number), its families the groups of ``by`` (no columns: one family;
    :func:`poor`): True (good), False (poor) or None (not compared: no variance); ``lone``, when given, is
    that of a family's only cell.
    A Series of objects over ``index`` (default: ``table``'s), ``other`` where a row is not in ``table``."""
    import pandas as pd

    got = {}
    for _, f in table.groupby(by) if len(by) else [(None, table)]:
        if len(f) == 1 and lone is not None:
            got[f.index[0]] = lone
            continue
        bad, tested = poor(f[mean].to_numpy(), f[var].to_numpy(), f[n].to_numpy(), margin, alpha)
        got.update((i, False if b else True if t else None) for i, b, t in zip(f.index, bad, tested))
    index = table.index if index is None else index
    return pd.Series([got.get(i, other) for i in index], index, dtype=object)
