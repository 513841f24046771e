"""The basis of "trains" (:mod:`.outcome`): which runs use their source, and the NLL fraction that tells
them apart where that was not measured.

    python -m fairseq_lnpos.analysis.source_basis OUT [OUT ...] --out-dir DIR [--publish DIR]

OUT: grid folders whose finished runs were measured (``python -m fairseq_lnpos.experiments.source_use OUT``),
or published runs.csv with the measurement. Per corpus (the settings' ``dataset``), every finished run's
source gain (the validation NLL with the sources permuted across sentences minus the NLL with the true ones,
bits) and its final NLL as a fraction of the corpus's unigram bits. States, with the runs behind them:

- the gains of the runs below and above :data:`~.outcome.SOURCE_GAIN` (the rule's gap: the largest gain of a
  run that does not use its source, the smallest of one that does);
- per corpus, the NLL fractions of the two groups and the range of thresholds that agree with the gain on
  every run (none where the groups overlap: then the NLL alone cannot tell them apart at that budget), and
  whether :data:`~.outcome.TRAINS` lies in it.
"""
import math
import sys
from pathlib import Path

from ..cli import CommandParser
from ..common import write_text
from ..errors import check, run_main
from . import outcome as O
from .frame import FINISHED, GATHERED, gather, write_runs_csv
from .map_common import label, markdown_table
from .publish import argv_of, publish


def corpus_table(runs, gain=O.SOURCE_GAIN, trains=None):
    """A row per corpus: runs measured, how many use their source (gain above ``gain``), the largest gain
    below it and the smallest above, the NLL fractions of each group (max of the users, min of the others),
    the range of NLL thresholds that agree with the gain on every run, and the rule's threshold."""
    import pandas as pd

    runs = runs[(runs["outcome"] == FINISHED) & runs["source_gain"].notna()]
    runs = runs.assign(corpus=runs["settings"].map(O.corpus_of), uses=runs["source_gain"] > gain)
    rows = []
    for corpus, g in runs.groupby("corpus"):
        use, not_use = g[g["uses"]], g[~g["uses"]]
        low, high = use["nll_ratio"].max(), not_use["nll_ratio"].min()
        rule = O.threshold(g.head(1), trains).iloc[0]
        agrees = (low if len(use) else 0.0), (high if len(not_use) else 1.0)
        rows.append({"corpus": corpus, "runs": len(g), "updates": f"{g['updates'].min():g} to {g['updates'].max():g}",
                     "use the source": len(use),
                     "largest gain not using": not_use["source_gain"].max(), "smallest gain using": use["source_gain"].min(),
                     "NLL fraction, users (max)": low, "NLL fraction, others (min)": high,
                     "thresholds that agree": agrees if agrees[0] < agrees[1] else None, "rule's threshold": rule,
                     "runs the rule's threshold misjudges": int(((g["nll_ratio"] <= rule) != g["uses"]).sum())})
    return pd.DataFrame(rows)


def markdown(runs, table, gain=O.SOURCE_GAIN):
    fmt = lambda v: "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"  # noqa: E731
    shown = table.assign(**{c: table[c].map(fmt) for c in table.columns if c.startswith(("largest", "smallest", "NLL"))})
    shown["thresholds that agree"] = [("none: the groups overlap" if t is None else f"({t[0]:.3f}, {t[1]:.3f})")
                                      for t in table["thresholds that agree"]]
    shown["rule's threshold"] = table["rule's threshold"].map(lambda t: f"{t:g}")
    runs = runs[(runs["outcome"] == FINISHED) & runs["source_gain"].notna()].sort_values("source_gain")
    per_run = runs.assign(corpus=runs["settings"].map(O.corpus_of), architecture=runs["variant"].map(label),
                          **{"NLL (fairseq's log)": runs["final_valid_nll"].map(fmt),
                             "true sources": (runs["nll_permuted"] - runs["source_gain"]).map(fmt),
                             "sources permuted": runs["nll_permuted"].map(fmt),
                             "gain": runs["source_gain"].map(fmt), "NLL fraction": runs["nll_ratio"].map(fmt)})
    lines = ["# Which runs use their source", "",
             f"A run uses its source when permuting the validation sources across sentences raises its NLL by more "
             f"than {gain:g} bit (the rule's SOURCE_GAIN). Per corpus: the runs measured, the gains on either side "
             f"of it, the final NLL as a fraction of the unigram bits in each group, the NLL thresholds that agree "
             f"with the gain on every run, and the rule's threshold for runs without the measurement.", ""]
    lines += markdown_table(shown) + ["", "## Every run measured", ""]
    lines += ["The final NLL as fairseq's log gave it (the NLL fraction's), and the measurement's pass over every "
              "validation sentence with the true and the permuted sources (bits a token; fairseq's validation may "
              "leave out a few sentences, fairseq_lnpos/experiments/source_use.py); the gain is the last two's "
              "difference.", ""]
    lines += markdown_table(per_run[["corpus", "run", "architecture", "seed", "updates", "NLL (fairseq's log)",
                                     "true sources", "sources permuted", "gain", "NLL fraction"]]) + [""]
    return "\n".join(lines)


def _main(argv):
    p = CommandParser(prog="python -m fairseq_lnpos.analysis.source_basis", description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="+", metavar="OUT", help="grid folders whose runs were measured, or runs.csv files")
    p.add_argument("--out-dir", required=True, help="where to write basis.md, corpora.csv and runs.csv")
    p.add_argument("--publish", metavar="DIR", help="also write a results page into DIR (docs/results/NAME)")
    args = p.parse_args(argv)
    runs = gather(args.sources, {}, "a grid's folder whose runs were measured for source use")[0].drop(columns=list(GATHERED))
    measured = runs[(runs["outcome"] == FINISHED) & runs["source_gain"].notna()]
    check(len(measured), f"{' '.join(args.sources)}: no finished run was measured for source use: run "
                         f"python -m fairseq_lnpos.experiments.source_use OUT first")
    table = corpus_table(runs)
    md = markdown(runs, table)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [write_runs_csv(runs, out / "runs.csv"), write_text(out / "basis.md", md),
               write_text(out / "corpora.csv", table.to_csv(index=False, float_format="%.6g", lineterminator="\n"))]
    if args.publish:
        written.append(publish(args.publish, "Which runs use their source: the basis of 'trains'", md, runs, written,
                               argv_of("python -m fairseq_lnpos.analysis.source_basis", argv)))
    print(md, end="")
    return 0


def main(argv=None):
    return run_main("source_basis", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
