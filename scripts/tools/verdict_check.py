"""The maps' outcome rule (:mod:`fairseq_lnpos.analysis.outcome`) checked by simulation on maps shaped like
the published ones, with seeds that stall: its false *worse*, *better*, *trains less / more often* and
*equivalent* rates, and the gap it finds 80 % of the time at 3, 5 and 8 seeds.

    python scripts/tools/verdict_check.py [--sims N] [--publish DIR]

tests/test_outcome.py runs the same simulation (:func:`simulate`, :func:`map_rate`) and asserts each rate at
most 5 %.
"""
import sys

import numpy as np

from fairseq_lnpos.analysis import outcome as O
from fairseq_lnpos.analysis.frame import pandas
from fairseq_lnpos.analysis.map_common import markdown_table
from fairseq_lnpos.analysis.publish import argv_of, publish
from fairseq_lnpos.analysis.verdict import holm_rejects
from fairseq_lnpos.cli import CommandParser
from fairseq_lnpos.errors import check, run_main

# a map's comparisons x seeds a cell, as the published maps have them (6 architectures at one setting x 3
# seeds; 19 x 3; 23 x 2; 23 x 3)
SHAPES = ((6, 3), (19, 3), (23, 2), (23, 3))
STALLS = (0.0, 0.15, 0.3)  # the chance that a seed stalls
# the spread (sd, bits) of a cell's seeds that train: log-uniform over the all-archs page's 5th to 95th percentile
SPREADS = (0.007, 1.3)


def _moments(values, trains):
    n = trains.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(trains, values, 0).sum(-1) / n
        var = np.where(trains, (values - mean[..., None]) ** 2, 0).sum(-1) / (n - 1)
    return mean, var, n


def simulate(rng, comparisons, seeds, stall, shift, paired=False, maps=2000, spreads=SPREADS):
    """Simulated maps (``maps`` x ``comparisons``): each comparison a cell and its reference, the cell's seeds
    that train ``shift`` bits above the reference's (a number, or an array over the comparisons), each seed
    stalling with probability ``stall``, each comparison's spread log-uniform in ``spreads`` (a number: that
    spread). Returns the p-values of worse, better and equivalent (:func:`~.outcome.sided_tests`, NaN where a
    side has fewer than two seeds that train) and Fisher's p of the train rates."""
    size = (maps, comparisons, seeds)
    sd = (np.exp(rng.uniform(*np.log(spreads), size[:2])) if np.ndim(spreads) else np.full(size[:2], spreads))[..., None]
    common = rng.normal(0, 1, size) if paired else 0.0  # a seed's initialization shared by both cells
    x = np.reshape(shift, (1, -1, 1)) + (common + rng.normal(0, 1, size)) * sd
    r = (common + rng.normal(0, 1, size)) * sd
    tx, tr = rng.random(size) >= stall, rng.random(size) >= stall
    if paired:
        mean, var, n = _moments(x - r, tx & tr)
        diff, se, df = O.paired_parts(mean, var, n)
        ok = n >= 2
    else:
        (mx, vx, nx), (mr, vr, nr) = _moments(x, tx), _moments(r, tr)
        diff, se, df = O.welch_parts(mx, vx, nx, mr, vr, nr)
        ok = (nx >= 2) & (nr >= 2)
    worse, better, equivalent = (np.where(ok, p, np.nan) for p in O.sided_tests(diff, se, df))
    table = {(k, k0): O.rate_p(k, seeds, k0, seeds) for k in range(seeds + 1) for k0 in range(seeds + 1)}
    rate = np.vectorize(lambda k, k0: table[k, k0])(tx.sum(-1), tr.sum(-1))
    return worse, better, equivalent, rate


def map_rate(p, alpha=O.ALPHA, which=None):
    """The share of maps in which Holm's procedure over a map's comparisons rejects anything (``which``: the
    comparison whose rejection counts, e.g. 0 for the power)."""
    hits = [holm_rejects(row, alpha) for row in p]
    return float(np.mean([h.any() if which is None else h[which] for h in hits]))


def _table(rows, columns):
    return markdown_table(pandas().DataFrame(rows, columns=columns))


def check_table(maps=2000, seed=0):
    """The false rates of each word on identical cells (and equivalent on cells a margin apart), as Markdown."""
    rng, rows = np.random.default_rng(seed), []
    for comparisons, seeds in SHAPES:
        for stall in STALLS:
            worse, better, _, rate = simulate(rng, comparisons, seeds, stall, 0.0, maps=maps)
            apart = simulate(rng, comparisons, seeds, stall, O.MARGIN, maps=maps)[2]
            rows.append([f"{comparisons} x {seeds}", f"{stall:g}"] + [f"{map_rate(p):.1%}" for p in (worse, better, rate, apart)])
    return _table(rows, ["comparisons x seeds", "P(seed stalls)", "false worse", "false better",
                         "false 'trains less / more often'", "false equivalent (a margin apart)"])


POWER_SEEDS, POWER_SDS, POWER_COMPARISONS = (3, 5, 8), (0.05, 0.2, 0.5), 23
GAPS = np.round(np.arange(0.2, 6.01, 0.05), 2)


def gap_found(seeds, sd, stall=0.0, maps=400, comparisons=POWER_COMPARISONS, seed=0, power=0.8):
    """The smallest gap (bits, on :data:`GAPS`) at which one cell worse than its reference by it is called
    worse in at least ``power`` of simulated maps of ``comparisons`` comparisons (the others identical),
    Welch, each comparison's spread ``sd``; None beyond the grid."""
    rng = np.random.default_rng(seed)
    lo, hi = 0, len(GAPS) - 1
    found = lambda g: map_rate(simulate(rng, comparisons, seeds, stall, np.r_[g, np.zeros(comparisons - 1)], maps=maps,  # noqa: E731
                                        spreads=sd)[0], which=0) >= power
    if not found(GAPS[hi]):
        return None
    while lo < hi:  # the rate grows with the gap: bisect the grid
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if found(GAPS[mid]) else (mid + 1, hi)
    return float(GAPS[lo])


def power_table(maps=400, stall=0.0):
    rows = [[seeds] + [("> 6" if g is None else f"{g:g}") for g in (gap_found(seeds, sd, stall, maps) for sd in POWER_SDS)]
            for seeds in POWER_SEEDS]
    return _table(rows, ["seeds a cell"] + [f"sd {sd:g} bit" for sd in POWER_SDS])


def _main(argv):
    p = CommandParser(prog="python scripts/tools/verdict_check.py",
                      description="The outcome rule's error rates and power, simulated on maps shaped like ours.")
    p.add_argument("--sims", type=int, default=2000, help="maps simulated per entry (default: %(default)s)")
    p.add_argument("--publish", metavar="DIR", help="also write the tables as a results page into DIR")
    args = p.parse_args(argv)
    check(args.sims >= 100, f"--sims {args.sims}: give at least 100")
    power_maps = max(args.sims // 5, 100)
    md = "\n".join([
        "# The outcome rule's error rates, simulated", "",
        f"Maps of comparisons, each a cell against its reference, with the cells' seeds that train drawn from "
        f"normal distributions whose spread is log-uniform from {SPREADS[0]:g} to {SPREADS[1]:g} bit (the all-archs "
        f"page's cells, 5th to 95th percentile), and each seed stalling with the probability given (a stalled seed "
        f"counts in the train rate, not in the NLL). Margin {O.MARGIN:g} bit, alpha {O.ALPHA:g}, Holm over each map's "
        f"comparisons; {args.sims} maps per entry. Identical cells: the share of maps with any comparison called "
        f"worse, better or training less / more often; cells exactly a margin apart: the share called equivalent. "
        f"At most {O.ALPHA:.0%} each is the claim.", ""] + check_table(args.sims) + [
        "", "## Power: the gap found", "",
        f"One cell worse than its reference by a gap, in a map of {POWER_COMPARISONS} comparisons whose other cells "
        f"equal their references, no seed stalling; Welch; every comparison's spread the sd given. The smallest gap "
        f"(bits, in steps of 0.05) at which that cell is called worse in at least 80 % of {power_maps} simulated maps. "
        f"With stalling seeds the seeds that train are fewer: read the row of that many seeds.", ""] + power_table(power_maps)) + "\n"
    print(md, end="")
    if args.publish:
        publish(args.publish, "The outcome rule's error rates, simulated", md, None, [],
                argv_of("python scripts/tools/verdict_check.py", argv))
    return 0


def main(argv=None):
    return run_main("verdict_check", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
