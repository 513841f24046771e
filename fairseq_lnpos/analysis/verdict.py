"""The maps' verdicts, stated once (:func:`describe` states them with their numbers): on the final
validation NLL in bits (fairseq's ``valid_nll_loss``, without the label smoothing that adds about 1.3
bits to every cell) of each cell (architecture, depth, warm-up, learning rate; its runs are its seeds).

- **trains**: no seed diverged or was stopped early and the mean NLL is at most ``trains`` times the
  corpus's unigram bits (:func:`~fairseq_lnpos.data.unigram.unigram_bits`): one threshold for every corpus.
- **poor**: worse than another cell of its family that trains by more than ``margin`` bits: every ordered
  pair (i, j) tests mu_i - mu_j <= margin with Welch's t, the k (k - 1) tests Holm-corrected at ``alpha``;
  no best cell is selected first, so of identical cells some is called poor at most ``alpha`` of the time.
- **each cell's variance**: its seeds' own (Welch), nothing pooled or moderated: the cells' standard
  deviations differ a hundredfold (0.007 to 1.3 bit, 5th to 95th percentile, on the all-archs page), and
  variances moderated towards the map's (Smyth's empirical Bayes) understate a noisy cell's and called
  identical cells poor in up to 10 % of the maps below. A one-seed cell is not compared (NA). Simulated
  (tests/test_verdict.py, ``python -m fairseq_lnpos.analysis.verdict --publish DIR``), identical cells
  are called poor in at most 5 % of maps of 6 x 3, 19 x 3, 23 x 2 and 6 x 2 seeds, with equal spreads
  and with spreads that differ.
- **good** = trains and not poor: ``good_own`` among the cells of the same architecture and depth,
  ``good_depth`` among every cell at that depth. **seeds disagree**: some seeds train, some do not.
"""
import math
import sys
import warnings

import numpy as np
from scipy.stats import t as student, ttest_ind

from ..cli import CommandParser
from ..errors import check, run_main
from .frame import pandas
from .map_common import markdown_table
from .publish import argv_of, publish

# "trains": the final NLL at most this fraction of the unigram bits. On the demo's per-seed data
# (docs/results/demo/runs.csv: unigram bits 6.26) the runs that learn end at 0.02-0.14 of it and
# Post-LN without warm-up, stalled, at 0.68-0.75; 0.5 lies between them.
DEFAULT_TRAINS = 0.5
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


def good(means, variances, ns, margin=DEFAULT_MARGIN, alpha=DEFAULT_ALPHA, lone=None):
    """The verdict of each cell of one family that trains (see :func:`poor`): True (good), False (poor) or
    None (not compared: no variance); ``lone``, when given, is that of a family's only cell."""
    if len(means) == 1 and lone is not None:
        return [lone]
    bad, tested = poor(means, variances, ns, margin, alpha)
    return [False if b else (True if t else None) for b, t in zip(bad, tested)]


# ---------------------------------------------------------------- checking the error rate

def poor_rate(cells, seeds, gap=0.0, sims=2000, margin=0.0, alpha=DEFAULT_ALPHA, sd=0.1, sd_spread=0.0, seed=0):
    """The share of ``sims`` simulated families of ``cells`` cells of ``seeds`` seeds each (normal, standard
    deviation ``sd``; each cell's own sd drawn log-normally with ``sd_spread`` in log units) in which, the
    cells identical (``gap`` 0), some cell is called poor: the false "poor" rate; or, the first cell worse
    than the others by ``gap`` bits, that cell is: the power."""
    rng, hits = np.random.default_rng(seed), 0
    for _ in range(sims):
        sds = sd * np.exp(sd_spread * rng.standard_normal(cells))
        x = rng.standard_normal((cells, seeds)) * sds[:, None]
        x[0] += gap
        var = x.var(axis=1, ddof=1) if seeds > 1 else np.full(cells, np.nan)
        bad = poor(x.mean(axis=1), var, [seeds] * cells, margin, alpha)[0]
        hits += bool(bad[0] if gap else bad.any())
    return hits / sims


# ---------------------------------------------------------------- the command

SHAPES = ((6, 3), (19, 3), (23, 2), (6, 2))
# the power's families: one architecture's learning-rate map, one setting of every architecture, and every
# cell of an all-architecture map at one depth (its "good (depth)"), with 3 seeds and with 5
POWER_SHAPES, GAPS = ((6, 3), (19, 3), (114, 3), (6, 5), (114, 5)), (0.3, 0.5, 1.0, 2.0)


def _table(rows, columns):
    return markdown_table(pandas().DataFrame(rows, columns=["cells x seeds"] + columns))


def check_table(sims=4000, spreads=(0.0, 0.5, 1.0)):
    """The false "poor" rates of :func:`poor_rate` at margin 0 for the maps' shapes, as Markdown."""
    return _table([[f"{c} x {n}"] + [f"{poor_rate(c, n, sims=sims, sd_spread=s):.1%}" for s in spreads]
                   for c, n in SHAPES], [f"sd spread {s:g}" for s in spreads])


def power_table(sims=1000, spread=1.0):
    """The power of :func:`poor_rate` (margin :data:`DEFAULT_MARGIN`) for :data:`POWER_SHAPES` and
    :data:`GAPS`, as Markdown."""
    return _table([[f"{c} x {n}"] + [f"{poor_rate(c, n, g, sims, DEFAULT_MARGIN, sd_spread=spread):.0%}" for g in GAPS]
                   for c, n in POWER_SHAPES], [f"gap {g:g} bit" for g in GAPS])


def _main(argv):
    p = CommandParser(prog="python -m fairseq_lnpos.analysis.verdict",
                      description="The verdict's false 'poor' rate, simulated on identical cells.")
    p.add_argument("--sims", type=int, default=4000, help="maps simulated per shape (default: %(default)s)")
    p.add_argument("--publish", metavar="DIR", help="also write the table as a results page into DIR")
    args = p.parse_args(argv)
    check(args.sims >= 100, f"--sims {args.sims}: give at least 100")
    power_sims = max(args.sims // 4, 100)
    md = "\n".join(["# The verdict's error rate, simulated", "",
                     f"Identical cells (the same mean), each cell's standard deviation 0.1 bit times exp(spread x N(0, 1)); "
                     f"margin 0, alpha {DEFAULT_ALPHA:g}; {args.sims} simulated maps per entry; the share of maps in which "
                     "some cell is called poor (at most alpha is the claim).", ""] + check_table(args.sims) + [
                     "", "## Power", "", f"One cell worse than the others by a gap (bits); every cell's standard deviation "
                     f"0.1 bit times exp(N(0, 1)) (the maps' cells differ about that much), margin {DEFAULT_MARGIN:g}, alpha "
                     f"{DEFAULT_ALPHA:g}; {power_sims} simulated maps per entry; the share of maps in which that cell "
                     "is called poor. 114 cells are an all-architecture map's family at one depth (its 'good (depth)').",
                     ""] + power_table(power_sims)) + "\n"
    print(md, end="")
    if args.publish:
        publish(args.publish, "The verdict's error rate, simulated", md, None, [],
                argv_of("python -m fairseq_lnpos.analysis.verdict", argv))
    return 0


def main(argv=None):
    return run_main("verdict", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
