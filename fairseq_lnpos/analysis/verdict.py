"""The maps' verdicts, stated once: on the validation NLL, each cell with its own variance, the
number of cells and the choice of the best accounted for.

The quantity is the final validation NLL in bits (fairseq's ``valid_nll_loss``: no label smoothing,
which would add a constant of about 1.3 bits to every cell). A cell is one configuration
(architecture, depth, warm-up, learning rate); its runs are its seeds.

- **trains**: every seed of the cell ran to its end (none diverged or was stopped early) and the mean
  NLL is at most ``trains`` (default :data:`DEFAULT_TRAINS`) times the unigram bits of the corpus
  (:func:`~fairseq_lnpos.data.unigram.unigram_bits`: what a model that ignores source and context
  reaches), so that one threshold means the same on every corpus.
- **poor**: a cell that trains is poor when it is worse than some other cell of its family by more
  than the practical ``margin`` (bits), with the error rate controlled over the whole family:
  for every ordered pair (i, j) of the family's cells that train, the one-sided hypothesis
  mu_i - mu_j <= margin is tested with Welch's t (each cell with its own variance), and the k (k - 1) tests
  are corrected by Holm's step-down procedure at level ``alpha``; cell i is poor when one of its
  hypotheses is rejected. No best cell is selected before testing, so the selection needs no
  correction: when every cell of a family has the same mean, the chance that any cell is called
  poor is at most ``alpha`` (:func:`false_poor_rate` checks it by simulation).
- a cell of one seed has no variance: it is compared with nothing and cannot be called poor; its
  "good" is unknown (``NA``) unless it is the only cell of its family that trains. With two seeds a
  cell's variance rests on one degree of freedom and only large differences are detected: the
  rate is controlled, the power is not (run three seeds or more where the verdict matters).
- **good** = trains and not poor. Two families, two named verdicts: ``good_own`` among the cells of
  the same architecture and depth (does this architecture need its warm-up or a smaller learning rate),
  ``good_depth`` among every cell at that depth (is it as good as the best of any architecture there).
- **seeds disagree**: some seeds of a cell train on their own and some do not.
"""
import math

import numpy as np

DEFAULT_TRAINS = 0.8
DEFAULT_MARGIN = 0.1
DEFAULT_ALPHA = 0.05
FAMILIES = {"own": ("variant", "layers"), "depth": ("layers",)}
FAMILY_WORDS = {"own": "the cells of the same architecture and depth", "depth": "every cell at that depth"}


def describe(trains=DEFAULT_TRAINS, margin=DEFAULT_MARGIN, alpha=DEFAULT_ALPHA):
    """The rules in words, with their numbers, as every output states them."""
    return (f"Quantity: final validation NLL (bits, no label smoothing), mean over the seeds. Trains: no seed "
            f"diverged or was stopped early and the NLL is at most {trains:g} x the corpus's unigram bits "
            f"(--trains). Poor: worse than another cell of its family by more than {margin:g} bit (--margin), "
            f"Welch's t (each cell its own variance), every ordered pair of the family tested, Holm-corrected at "
            f"{alpha:g} (--alpha): identical cells are called poor at most {alpha:.0%} of the time. Good: trains "
            f"and not poor; good (own): against {FAMILY_WORDS['own']}; good (depth): against "
            f"{FAMILY_WORDS['depth']}. '?': the seeds disagree on 'trains'; NA: one seed, not compared.")


# ---------------------------------------------------------------- the test

def pair_pvalues(means, variances, ns, margin):
    """P[i, j]: the one-sided p-value of mu_i - mu_j <= margin, Welch's t with Welch-Satterthwaite
    degrees of freedom on the cells' sample variances; NaN on the diagonal and where a cell has
    fewer than two seeds (no variance)."""
    from scipy.stats import t as student

    m, v, n = (np.asarray(x, float) for x in (means, variances, ns))
    d = n - 1
    a = v / n
    se2 = a[:, None] + a[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        part = a * a / d
        terms = part[:, None] + part[None, :]
        df = np.where(terms > 0, se2 * se2 / terms, 1e12)
        diff = m[:, None] - m[None, :] - margin
        z = diff / np.sqrt(se2)
        p = student.sf(z, np.minimum(df, 1e12))
    p = np.where(se2 > 0, p, np.where(diff > 0, 0.0, 1.0))
    bad = ~np.isfinite(a) | (d == 0)
    p[bad, :] = np.nan
    p[:, bad] = np.nan
    np.fill_diagonal(p, np.nan)
    return p


def holm_rejects(p, alpha):
    """The Holm step-down rejections of the finite p-values of ``p`` (same shape, booleans)."""
    flat = p.ravel()
    idx = [i for i in np.argsort(flat, kind="stable") if math.isfinite(flat[i])]
    rejected = np.zeros(flat.shape, bool)
    m = len(idx)
    for r, i in enumerate(idx):
        if flat[i] > alpha / (m - r):
            break
        rejected[i] = True
    return rejected.reshape(p.shape)


def poor(means, variances, ns, margin=DEFAULT_MARGIN, alpha=DEFAULT_ALPHA):
    """For each cell of one family (its seeds' mean, sample variance and number): is it poor?"""
    if len(means) < 2:
        return np.zeros(len(means), bool)
    return holm_rejects(pair_pvalues(means, variances, ns, margin), alpha).any(axis=1)


# ---------------------------------------------------------------- checking the error rate

def false_poor_rate(cells, seeds, sims=2000, margin=0.0, alpha=DEFAULT_ALPHA, sd=0.1, sd_spread=0.0, seed=0):
    """The share of ``sims`` simulated families of ``cells`` identical cells of ``seeds`` seeds each
    (normal, standard deviation ``sd``; each cell's own sd drawn log-normally with ``sd_spread`` in
    log units) in which some cell is called poor."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        sds = sd * np.exp(sd_spread * rng.standard_normal(cells))
        x = rng.standard_normal((cells, seeds)) * sds[:, None]
        var = x.var(axis=1, ddof=1) if seeds > 1 else np.full(cells, np.nan)
        hits += bool(poor(x.mean(axis=1), var, [seeds] * cells, margin, alpha).any())
    return hits / sims
