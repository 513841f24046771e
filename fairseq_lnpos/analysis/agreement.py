"""Do two runs of one map reach the same verdicts? Each cell judged in both by the map's rule
(:mod:`.outcome`: how many of its seeds train, and its word against its reference) and by the earlier rule,
side by side.

    python -m fairseq_lnpos.analysis.agreement A B [--across SETTING] [--by-run] [--only NAME,...]
        [--seeds S,...] [--trains F] [--allow-mixed-code] [--out-dir D] [--publish DIR]

``A`` and ``B`` are two runs of the same sweep (its folder, or the ``runs.csv`` a results page
published): the same cells and settings, trained on another machine or another day, with the same
seeds (a re-run) or with other seeds (a replication: ``grid.sh sweep --seeds 4,5,6``); with
``--across SETTING`` the two differ in that one setting (e.g. ``precision``: the sweep with and without
``--cpu-bf16``) and the question is whether it changes the findings. Only the cells
complete in both (every seed finished, diverged or stopped) are judged, over those cells, so a map
still running can be compared on what it has. ``--only`` and ``--seeds`` select the runs of both (e.g. the
seeds a re-run trained again). With ``--by-run`` a cell is a named run of a study whose rows differ in
more than the map's axes (the warm-up study's ``why-*`` rows: :mod:`.why`), only the seeds that train
are compared, and the earlier rule is not applied. Compared per cell: whether its seeds train (every one,
some, none: over every cell), the map's word against the cell's first reference (over the cells whose
every seed trains in both runs: a cell that trains in neither agrees on nothing), and the earlier rule's
good / poor / no-train. For each, the share of the cells judged in both whose verdicts are equal, with its
95 % interval (Wilson's, treating the cells as independent, which neighbouring learning rates of one
architecture are not: read it as a description of this map), and Cohen's kappa (the agreement beyond what
the two runs' shares of each verdict give by chance).

Per cell, also the difference of the final validation NLL, B minus A, with Welch's 95 % interval
over the finished seeds, and whether it exceeds the seeds' noise: Welch's two-sided test, Holm over the
cells compared, at 5 % (:func:`differences`); over the cells, its mean, median, largest, and the size
|B - A| that 95 % of the cells stay within (for a re-run with the same seeds: how much training again
alone moves a cell, the basis of the verdict's margin, :data:`.outcome.MARGIN`).

The earlier rule (:func:`earlier_verdicts`), kept here only to be compared: on the label-smoothed
validation loss; trains = no seed diverged or stopped and the mean loss is at most 0.6 x the mean
first training loss; good = trains and the mean within delta of the best mean of the same
architecture and depth, delta = max(0.1 x best, 2 x s x sqrt(1/n + 1/n_best)), s the standard
deviation between seeds pooled over every cell that trains.

Writes ``agreement.csv`` (one row per cell: both runs' means and verdicts under both rules) and
``agreement.md`` into ``--out-dir`` (default: the current folder), and with ``--publish DIR`` a
results page whose ``runs.csv`` holds both runs (column ``map``: A or B).
"""
import fnmatch
import json
import math
import sys
from pathlib import Path

import numpy as np

from ..cli import CommandParser, comma_list, comma_list_type, fraction
from ..common import n_runs, write_text
from ..errors import LnposError, run_main
from . import outcome as O
from .frame import COUNTED, FINISHED, GATHERED, check_model_code, check_one_experiment, pandas, read_runs
from .publish import argv_of, write_outputs
from .stability import KEYS, compare as judge, make_cells, order

EARLIER = dict(ratio=0.6, near=0.10, noise_k=2.0)
BY_RUN = ["run"]  # the keys of a cell with --by-run; else the map's (KEYS)
RULES = {"trains": "seeds that train (every one, some, none)",
         "rule": "the word against the first reference (cells whose every seed trains in both)",
         "earlier": "the earlier rule (own architecture)"}
RULE_BY_RUN = {"trains": "seeds that train (every one, some, none)"}
SHORT = {"trains": "trains", "rule": "word", "earlier": "earlier"}  # a rule's columns in the page's tables


def load(source, allow_mixed=False, keys=KEYS, keep=None):
    """The table of every run of a map: a sweep's folder or a published runs.csv; ``keep`` (the table ->
    booleans), where given, selects its runs; ``keys``: a cell's (:data:`BY_RUN`: a named run)."""
    runs = read_runs(source, "the output folder of a sweep (OUT/NAME/seedS/)")
    if keep is not None:
        runs = runs[keep(runs)].reset_index(drop=True)
    check_one_experiment(source, runs, None if keys == KEYS else keys[0])
    check_model_code(runs, allow_mixed)
    if not runs["outcome"].isin(COUNTED).any():
        raise LnposError(f"{source}: no run" + (" selected" if keep is not None else "") + " finished, diverged or "
                         "was stopped early: run or resume the sweep first" + (", or check --only and --seeds"
                                                                               if keep is not None else ""))
    return runs


def check_two_runs(name_a, name_b, runs_a, runs_b, allow_mixed=False):
    """Both sides are one experiment trained twice, before anything says "re-run" or "replication": two
    sources (one folder or file given twice is refused), the same corpus (their unigram bits; the data
    folder's path may differ between machines), the same model code unless ``allow_mixed``, and not one
    set of runs copied (every run both hold with the same record, its training times included; runs that
    recorded no time cannot be told from a re-run that reproduced them).
    The settings are :func:`compare`'s."""
    if Path(name_a).resolve() == Path(name_b).resolve():
        raise LnposError(f"{name_a} is given twice: compare two runs of one map (two sweep folders or published "
                         f"runs.csv files)")
    bits = [r["unigram_bits"].dropna().round(5).unique() for r in (runs_a, runs_b)]
    if len(bits[0]) and len(bits[1]) and set(bits[0]) != set(bits[1]):
        raise LnposError(f"{name_a} and {name_b} were trained on different corpora (unigram bits {bits[0][0]:.5f} "
                         f"and {bits[1][0]:.5f}): compare two runs of one map on one corpus")
    codes = [set(r.loc[r["outcome"].isin(COUNTED) & (r["model_code"] != ""), "model_code"]) for r in (runs_a, runs_b)]
    if codes[0] and codes[1] and codes[0] != codes[1] and not allow_mixed:
        raise LnposError(f"{name_a} and {name_b} were trained by different versions of the model code "
                         f"({', '.join(sorted(codes[0]))} and {', '.join(sorted(codes[1]))}): re-run the older one, "
                         f"or pass --allow-mixed-code to compare them anyway")
    key = ["run", "seed"]
    record = [c for c in ("train_seconds", "train_cpu_seconds") if c in runs_a and c in runs_b]
    both = runs_a.merge(runs_b, on=key, suffixes=("_a", "_b"))
    measured = both[[f"{c}_a" for c in record]].notna().any(axis=1) if record else both["run"].isna()
    if len(both) and measured.all():
        compared = [c for c in runs_a.columns if c in runs_b.columns and c not in key + ["path", *GATHERED, "map"]]

        def same(c):
            a, b = both[f"{c}_a"], both[f"{c}_b"]
            if a.dtype.kind in "fi" and b.dtype.kind in "fi":
                return (a.map(lambda v: f"{v:.6g}") == b.map(lambda v: f"{v:.6g}")).all()
            return (a.astype(str) == b.astype(str)).all()

        if all(same(c) for c in compared):
            raise LnposError(f"{name_b} holds the same runs as {name_a} ({n_runs(len(both))} with the same records, "
                             f"times and load: a copy, not a second run): compare two runs of one map")


def earlier_verdicts(runs, ratio=EARLIER["ratio"], near=EARLIER["near"], noise_k=EARLIER["noise_k"]):
    """The earlier rule's verdict of each cell (a Series indexed by the cells' keys): good, poor or no-train."""
    counted = runs[runs["outcome"].isin(COUNTED)]
    fin = counted[counted["outcome"] == FINISHED]
    cells = counted.groupby(KEYS).agg(seeds=("seed", "size"), initial=("initial_loss", "mean")).join(
        fin.groupby(KEYS)["final_valid_loss"].agg(loss="mean", n="size", var="var"))
    cells["trains"] = (cells["n"] == cells["seeds"]) & (cells["loss"] <= ratio * cells["initial"])
    t = cells[cells["trains"]]
    dof = (t["n"] - 1).sum()
    s = math.sqrt(((t["n"] - 1) * t["var"].fillna(0)).sum() / dof) if dof else math.nan
    best = t.loc[t.groupby(["variant", "layers"])["loss"].idxmin()].droplevel(["warmup", "lr"])
    best = best.reindex(t.index.droplevel(["warmup", "lr"])).set_axis(t.index)
    delta = np.fmax(near * best["loss"], noise_k * s * (1 / t["n"] + 1 / best["n"]) ** 0.5)  # fmax: no s, the floor
    verdict = pandas().Series("no-train", index=cells.index)
    verdict[t.index] = (t["loss"] <= best["loss"] + delta).map({True: "good", False: "poor"})
    return verdict


def verdicts(runs, keys=KEYS, trains=None):
    """Per cell of ``runs`` (a DataFrame indexed by the keys): its mean NLL and label-smoothed loss, whether its
    seeds train (``trains``: every, some or none), and, for a map, the word against its first reference
    (``rule``: :func:`.stability.compare`) and the earlier rule's verdict (``earlier``)."""
    cells = make_cells(runs, trains, keys=keys, families={} if keys != KEYS else None)
    if keys == KEYS:
        cells = judge(cells, runs, trains)[0]
    cells = cells.set_index(keys)
    state = np.select([cells["seeds_train"] == cells["seeds"], cells["seeds_train"] == 0], ["every", "none"], "some")
    out = {"nll": cells["nll"], "loss": cells["loss"], "trains": pandas().Series(state, cells.index)}
    if keys == KEYS:
        out["rule"] = cells["verdict"]
        out["earlier"] = earlier_verdicts(runs)
    return pandas().DataFrame(out)


def complete_cells(runs, keys=KEYS):
    """The keys of the cells of ``runs`` whose every seed finished, diverged or was stopped (a set of tuples)."""
    seeds = runs.groupby(keys)["seed"].nunique()
    counted = runs[runs["outcome"].isin(COUNTED)].groupby(keys)["seed"].nunique()
    return {k if isinstance(k, tuple) else (k,) for k in counted[counted == seeds.reindex(counted.index)].index}


def setting_values(runs):
    """{setting: the set of its values (as JSON) among ``runs``}, from their ``settings``."""
    out = {}
    for text in set(runs["settings"]):
        for k, v in json.loads(text).items():
            out.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return out


def setting_differences(runs_a, runs_b, keys=KEYS):
    """The settings (but ``data``) whose values differ between the two maps; with ``keys`` :data:`BY_RUN`,
    between the runs of one name in both."""
    def per_cell(runs):
        return {k: setting_values(g) for k, g in runs.groupby(keys[0])} if keys != KEYS else {
            None: setting_values(runs)}
    a, b = per_cell(runs_a), per_cell(runs_b)
    return sorted({s for c in a.keys() & b.keys() for s in a[c].keys() | b[c].keys()
                   if s != "data" and a[c].get(s) != b[c].get(s)})


def compare(runs_a, runs_b, across=None, keys=KEYS, trains=None):
    """One row per cell complete in both maps: each map's means and verdicts (suffixes _a, _b), both
    judged over the same cells (a map still running, or run in part, is compared on what both have),
    and the NLL difference (:func:`differences`); ``attrs["left_out"]``: how many cells only one map has
    complete. The maps must have the same settings but ``across`` (a setting name), which must differ.
    ``keys``: a cell's; ``trains``: the map's rule's (:func:`verdicts`)."""
    differ = setting_differences(runs_a, runs_b, keys)
    if across is not None and across not in differ:
        raise LnposError(f"--across {across}: the two maps do not differ in it ({', '.join(differ) or 'nor in any other'}"
                         f"): give the setting they differ in")
    other = [k for k in differ if k != across]
    if other:
        raise LnposError(f"the two maps differ in a setting other than their axes ({other[0]}): compare two "
                         f"runs of the same sweep" + ("" if across else ", or name the one setting with --across"))
    ca, cb = complete_cells(runs_a, keys), complete_cells(runs_b, keys)
    common = ca & cb
    if not common:
        raise LnposError("the two maps have no cell complete in both: run or resume the sweeps first")
    keep = [r[[k in common for k in r[keys].itertuples(index=False, name=None)]] for r in (runs_a, runs_b)]
    both = verdicts(keep[0], keys, trains).merge(verdicts(keep[1], keys, trains), left_index=True, right_index=True,
                                                 suffixes=("_a", "_b"))
    both = both.join(differences(*keep, keys=keys))
    both["beyond_noise"] = both["beyond_noise"].astype(object).fillna(False).astype(bool)  # cells without an NLL
    both = order(both.reset_index(), keys)
    both.attrs["left_out"] = len(ca ^ cb)
    return both


def differences(runs_a, runs_b, alpha=0.05, keys=KEYS):
    """Per cell of both (indexed by the keys): ``diff`` (B's mean final NLL minus A's, finished seeds),
    ``diff_low`` / ``diff_high`` (Welch's 95 % interval), ``p`` (Welch's two-sided p-value) and ``beyond_noise``
    (Holm over the cells with a p-value, at ``alpha``); NaN where a map has no finished seed (no interval
    or p-value below two seeds each)."""
    from .verdict import holm_rejects, welch

    fin = [r[r["outcome"] == FINISHED].groupby(keys)["final_valid_nll"].apply(list) for r in (runs_a, runs_b)]
    rows = {key: welch(fin[1][key], fin[0][key]) for key in fin[0].index.intersection(fin[1].index)}
    pd = pandas()
    out = pd.DataFrame(list(rows.values()), columns=["diff", "diff_low", "diff_high", "p"],
                       index=pd.MultiIndex.from_tuples(list(rows), names=keys) if len(keys) > 1
                       else pd.Index(list(rows), name=keys[0]))
    out["beyond_noise"] = holm_rejects(out["p"].to_numpy(float), alpha)
    return out


def seeds_text(runs):
    """The seeds of a map, as ``1, 2, 3``."""
    return ", ".join(map(str, sorted(runs["seed"].astype(int).unique())))


def rules_of(both):
    """The rules ``both`` judged by (:func:`compare`), in :data:`RULES`' order."""
    return [rule for rule in RULES if f"{rule}_a" in both.columns]


def by_run(both):
    """Whether the cells of ``both`` are named runs (``--by-run``)."""
    return "variant" not in both.columns


def cell_head(both):
    """A cell's columns in the page's tables: its header and rule lines' start."""
    return ("| run |", "|---|") if by_run(both) else ("| arch | layers | warm-up | lr |", "|---|---:|---:|---:|")


def cell_row(r):
    """A cell's columns in a line of the page's tables (``r`` a row of :func:`compare`'s table)."""
    return "| " + " | ".join(map(str, [r.run] if getattr(r, "variant", None) is None else
                                 [r.variant, r.layers, r.warmup, f"{r.lr:g}"])) + " |"


def kappa(a, b):
    """Cohen's kappa of two raters' labels (Series): observed agreement beyond the chance agreement of their
    marginal shares; NaN where chance alone agrees always."""
    observed = float((a == b).mean())
    pa, pb = a.value_counts(normalize=True), b.value_counts(normalize=True)
    chance = float(sum(pa.get(k, 0.0) * pb.get(k, 0.0) for k in set(pa.index) | set(pb.index)))
    return (observed - chance) / (1 - chance) if chance < 1 else math.nan


def judged_cells(both, rule):
    """The cells a rule's agreement is stated over: every cell for ``trains``; for the word against the
    reference, the cells whose every seed trains in both runs; for the earlier rule, every cell."""
    if rule == "rule":
        return both[(both["trains_a"] == "every") & (both["trains_b"] == "every")]
    return both


def shares(both):
    """Per rule: cells judged in both, how many agree, the share and its 95 % Wilson interval, and kappa."""
    from scipy.stats import binomtest

    rows = []
    for rule in rules_of(both):
        words = (RULE_BY_RUN if by_run(both) else RULES)[rule]
        judged = judged_cells(both, rule)
        agree = int((judged[f"{rule}_a"] == judged[f"{rule}_b"]).sum())
        ci = binomtest(agree, len(judged)).proportion_ci(method="wilson") if len(judged) else None
        rows.append(dict(rule=words, judged=len(judged), agree=agree, share=agree / len(judged) if len(judged) else math.nan,
                         low=ci.low if ci else math.nan, high=ci.high if ci else math.nan,
                         kappa=kappa(judged[f"{rule}_a"], judged[f"{rule}_b"]) if len(judged) else math.nan))
    return pandas().DataFrame(rows)


def title(across=None, study=False):
    return (f"One map trained two ways: across {across}" if across else
            f"Verdicts of two runs of one {'study' if study else 'map'}")


def noise_lines(both, across=None):
    """The page's paragraph on the NLL differences B - A and the cells where they exceed the seeds' noise."""
    d = both.dropna(subset=["diff"])
    if d.empty:
        return []
    tested, beyond = d["p"].notna().sum(), d[d["beyond_noise"] == True]  # noqa: E712
    big = d.loc[d["diff"].abs().idxmax()]
    name = big["run"] if by_run(d) else f"{big['variant']}, warm-up {big['warmup']}, lr {big['lr']:g}"
    within = lambda t: f"{t['diff'].abs().quantile(0.95, interpolation='higher'):.3f}"  # noqa: E731  (an observed value)
    trained = d[(d["trains_a"] == "every") & (d["trains_b"] == "every")]
    lines = [f"Final validation NLL, B minus A{f' (across {across})' if across else ''}, over the {len(d)} cells with "
             f"finished seeds in both: mean {d['diff'].mean():+.3f} bits, median {d['diff'].median():+.3f}, |B - A| at "
             f"most {within(d)} in 95 % of the cells, largest {big['diff']:+.3f} ({name}); "
             + (f"over the {len(trained)} cells whose every seed trains in both (those the verdict's margin separates), at most "
                f"{within(trained)} in 95 %; " if len(trained) else "no cell trains in both; ")
             + f"beyond the seeds' noise (Welch, two-sided, Holm over the {tested} cells with two seeds or more in "
             f"each, 5 %): {len(beyond)}.", ""]
    shown = d if across or by_run(d) else beyond  # across a setting or for a study's rows, every difference is the finding
    if len(shown):
        head, rule = cell_head(d)
        lines += ["Every cell:" if len(shown) == len(d) and (across or by_run(d)) else "The cells beyond the noise:", "",
                  head + " NLL A | NLL B | B - A | 95 % interval | p | beyond the noise |",
                  rule + "---:|---:|---:|---|---:|---|"]
        lines += [cell_row(r) + f" {r.nll_a:.3f} | {r.nll_b:.3f} | {r.diff:+.3f} | "
                  f"{r.diff_low:+.3f} to {r.diff_high:+.3f} | {r.p:.2g} | {'yes' if r.beyond_noise else 'no'} |"
                  for r in shown.itertuples()] + [""]
    return lines


def markdown(name_a, name_b, both, table, seeds=None, across=None):
    """The page; ``seeds``: (A's, B's) as text; ``across``: the setting A and B differ in."""
    same = seeds is not None and seeds[0] == seeds[1]
    kind = ("" if seeds is None else f" Seeds: A {seeds[0]}; B {seeds[1]}: " + (
        "the same seeds (a re-run)." if same else "other seeds (a replication: the verdicts are drawn anew)."))
    left = both.attrs.get("left_out", 0)
    rules = rules_of(both)
    lines = [f"# {title(across, by_run(both))}", "",
             f"A: `{name_a}`; B: `{name_b}`" + (f", differing in {across}" if across else "")
             + f". {len(both)} cells complete in both, judged over those cells only"
             + (f" ({left} cells complete in one map only are left out)" if left else "") + f".{kind}", "",
             "| compared | cells judged in both | agree | share | 95 % interval | kappa |", "|---|---:|---:|---:|---|---:|"]
    lines += [f"| {r.rule} | {r.judged} | {r.agree} | {r.share:.0%} | "
              + ("–" if math.isnan(r.low) else f"{r.low:.0%} to {r.high:.0%}") + " | "
              + ("–" if math.isnan(r.kappa) else f"{r.kappa:.2f}") + " |" for r in table.itertuples()]
    lines += ["", "Seeds that train: every one, some, none (fairseq_lnpos/analysis/outcome.py). "
              + ("The word: the cell against its first reference (its architecture with the map's longest warm-up, "
                 "else Pre-LN), as the map states it: worse, better, equivalent, inconclusive, not compared, "
                 "reference, no-train, diverged, stopped. The earlier rule: label-smoothed loss within max(10 % of "
                 "the best, 2 pooled sd) of the architecture's best (fairseq_lnpos/analysis/agreement.py): good, "
                 "poor, no-train. " if "rule" in rules else "")
              + "The interval treats cells as independent; kappa: Cohen's, the agreement beyond chance.", ""]
    lines += noise_lines(both, across)
    differ = both[np.logical_or.reduce([both[f"{rule}_a"] != both[f"{rule}_b"] for rule in rules])]
    if len(differ):
        head, rule_line = cell_head(both)
        lines += ["Cells whose verdicts differ between the runs in any comparison:", "",
                  head + " NLL A | NLL B | " + " | ".join(f"{SHORT[r]} A | {SHORT[r]} B" for r in rules) + " |",
                  rule_line + "---:|---:|" + "---|---|" * len(rules)]
        lines += [cell_row(r) + f" {r.nll_a:.3f} | {r.nll_b:.3f} | "
                  + " | ".join(f"{getattr(r, rule + '_a')} | {getattr(r, rule + '_b')}" for rule in rules) + " |"
                  for r in differ.itertuples()]
    else:
        lines += ["Every cell has the same verdicts in both runs, " + ("in each comparison above." if len(rules) > 1
                                                                          else "in the comparison above.")]
    return "\n".join(lines) + "\n"


def _main(argv):
    p = CommandParser(prog="python -m fairseq_lnpos.analysis.agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="the first run of the map: its sweep folder or published runs.csv")
    p.add_argument("b", help="the second run, the same way")
    p.add_argument("--across", metavar="SETTING",
                   help="the one setting the two maps differ in (a key of runs.csv's settings, e.g. precision)")
    p.add_argument("--by-run", action="store_true",
                   help="a cell is a named run of a study (e.g. the warm-up study's why-* rows), all one family")
    p.add_argument("--only", help="comma-separated run names or globs: compare these runs only (default: every run)")
    p.add_argument("--seeds", type=comma_list_type(int), help="comma-separated seeds: compare these seeds only")
    p.add_argument("--trains", type=fraction("trains"),
                   help="a run not measured for source use trains when its final NLL is at most this times the unigram "
                        "bits (default: the corpus's calibrated fraction, "
                        + ", ".join(f"{c} {t:g}" for c, t in sorted(O.TRAINS.items())) + ")")
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="judge a map whose runs were trained by different versions of the model code")
    p.add_argument("--out-dir", default=".", help="where to write agreement.csv and agreement.md (default: here)")
    p.add_argument("--publish", metavar="DIR", help="also write a results page into DIR")
    args = p.parse_args(argv)
    only = comma_list(args.only, "--only") if args.only else None
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    keep = None if only is None and seeds is None else lambda r: (
        r["run"].map(lambda n: only is None or any(fnmatch.fnmatchcase(n, g) for g in only))
        & (seeds is None or r["seed"].isin(seeds)))
    keys = BY_RUN if args.by_run else KEYS
    runs_a, runs_b = (load(s, args.allow_mixed_code, keys, keep) for s in (args.a, args.b))
    both = compare(runs_a, runs_b, args.across, keys, args.trains)
    check_two_runs(args.a, args.b, runs_a, runs_b, args.allow_mixed_code)
    md = markdown(args.a, args.b, both, shares(both), (seeds_text(runs_a), seeds_text(runs_b)), args.across)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "agreement.csv", out / "agreement.md"]
    write_text(written[0], both.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    write_text(written[1], md)
    runs = pandas().concat([runs_a.assign(map="A"), runs_b.assign(map="B")], ignore_index=True)
    write_outputs(out, args.publish, title(args.across, args.by_run), md, runs, written,
                  argv_of("python -m fairseq_lnpos.analysis.agreement", argv))
    print(md, end="")
    return 0


def main(argv=None):
    return run_main("agreement", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
