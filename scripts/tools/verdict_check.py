"""The maps' verdict rule (:mod:`fairseq_lnpos.analysis.verdict`) checked by simulation: its false "poor"
rate on identical cells of the maps' shapes, and its power to call a cell that is worse by a gap poor.

    python scripts/tools/verdict_check.py [--sims N] [--publish DIR]

tests/test_verdict.py runs the same simulation (:func:`poor_rate`) and asserts the rate at most 5 %.
"""
import sys

import numpy as np

from fairseq_lnpos.analysis import verdict as V
from fairseq_lnpos.analysis.frame import pandas
from fairseq_lnpos.analysis.map_common import markdown_table
from fairseq_lnpos.analysis.publish import argv_of, publish
from fairseq_lnpos.cli import CommandParser
from fairseq_lnpos.errors import check, run_main


def poor_rate(cells, seeds, gap=0.0, sims=2000, margin=0.0, alpha=V.DEFAULT_ALPHA, sd=0.1, sd_spread=0.0, seed=0):
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
        bad = V.poor(x.mean(axis=1), var, [seeds] * cells, margin, alpha)[0]
        hits += bool(bad[0] if gap else bad.any())
    return hits / sims


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
    """The power of :func:`poor_rate` (margin ``DEFAULT_MARGIN`` of the rule) for :data:`POWER_SHAPES` and
    :data:`GAPS`, as Markdown."""
    return _table([[f"{c} x {n}"] + [f"{poor_rate(c, n, g, sims, V.DEFAULT_MARGIN, sd_spread=spread):.0%}" for g in GAPS]
                   for c, n in POWER_SHAPES], [f"gap {g:g} bit" for g in GAPS])


def _main(argv):
    p = CommandParser(prog="python scripts/tools/verdict_check.py",
                      description="The verdict's false 'poor' rate, simulated on identical cells.")
    p.add_argument("--sims", type=int, default=4000, help="maps simulated per shape (default: %(default)s)")
    p.add_argument("--publish", metavar="DIR", help="also write the table as a results page into DIR")
    args = p.parse_args(argv)
    check(args.sims >= 100, f"--sims {args.sims}: give at least 100")
    power_sims = max(args.sims // 4, 100)
    md = "\n".join(["# The verdict's error rate, simulated", "",
                     f"Identical cells (the same mean), each cell's standard deviation 0.1 bit times exp(spread x N(0, 1)); "
                     f"margin 0, alpha {V.DEFAULT_ALPHA:g}; {args.sims} simulated maps per entry; the share of maps in which "
                     "some cell is called poor (at most alpha is the claim).", ""] + check_table(args.sims) + [
                     "", "## Power", "", f"One cell worse than the others by a gap (bits); every cell's standard deviation "
                     f"0.1 bit times exp(N(0, 1)) (the maps' cells differ about that much), margin {V.DEFAULT_MARGIN:g}, alpha "
                     f"{V.DEFAULT_ALPHA:g}; {power_sims} simulated maps per entry; the share of maps in which that cell "
                     "is called poor. 114 cells are an all-architecture map's family at one depth (its 'good (depth)').",
                     ""] + power_table(power_sims)) + "\n"
    print(md, end="")
    if args.publish:
        publish(args.publish, "The verdict's error rate, simulated", md, None, [],
                argv_of("python scripts/tools/verdict_check.py", argv))
    return 0


def main(argv=None):
    return run_main("verdict_check", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
