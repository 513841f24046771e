"""Do two runs of one map reach the same verdicts? Each cell judged in both, by the map's rule
(:mod:`.verdict`, on NLL) and by the earlier rule, side by side.

    python -m fairseq_lnpos.analysis.agreement A B [--across SETTING] [--allow-mixed-code] [--out-dir D]
        [--publish DIR]

``A`` and ``B`` are two runs of the same sweep (its folder, or the ``runs.csv`` a results page
published): the same cells and settings, trained on another machine or another day, with the same
seeds (a re-run) or with other seeds (a replication: ``grid.sh sweep --seeds 4,5,6``); with
``--across SETTING`` the two differ in that one setting (e.g. ``precision``: the sweep with and without
``--cpu-bf16``) and the question is whether it changes the findings. Only the cells
complete in both (every seed finished, diverged or stopped) are judged, over those cells, so a map
still running can be compared on what it has. For each
rule, a cell's verdict is one of good, poor, no-train (diverged and stopped count as no-train) or NA
(not compared); the share of the cells judged in both (NA in neither) whose verdicts are equal is
reported with its 95 % interval (Wilson's, treating the cells as independent, which neighbouring
learning rates of one architecture are not: read it as a description of this map).

Per cell, also the difference of the final validation NLL, B minus A, with Welch's 95 % interval
over the finished seeds, and whether it exceeds the seeds' noise: Welch's two-sided test, Holm over the
cells compared, at 5 % (:func:`differences`); over the cells, its mean, median, largest, and the size
|B - A| that 95 % of the cells stay within (for a re-run with the same seeds: how much training again
alone moves a cell, the basis of the verdict's margin, :data:`.verdict.DEFAULT_MARGIN`).

The earlier rule (:func:`earlier_verdicts`), kept here only to be compared: on the label-smoothed
validation loss; trains = no seed diverged or stopped and the mean loss is at most 0.6 x the mean
first training loss; good = trains and the mean within delta of the best mean of the same
architecture and depth, delta = max(0.1 x best, 2 x s x sqrt(1/n + 1/n_best)), s the standard
deviation between seeds pooled over every cell that trains.

Writes ``agreement.csv`` (one row per cell: both runs' means and verdicts under both rules) and
``agreement.md`` into ``--out-dir`` (default: the current folder), and with ``--publish DIR`` a
results page whose ``runs.csv`` holds both runs (column ``map``: A or B).
"""
import json
import math
import sys
from pathlib import Path

import numpy as np

from ..cli import CommandParser
from ..common import write_text
from ..errors import LnposError, run_main
from .frame import COUNTED, FINISHED, check_model_code, check_one_experiment, pandas, read_runs
from .publish import argv_of, write_outputs
from .stability import KEYS, make_cells, order

EARLIER = dict(ratio=0.6, near=0.10, noise_k=2.0)
NO_TRAIN = {"no-train", "diverged", "stopped"}


def load(source, allow_mixed=False):
    """The table of every run of a map: a sweep's folder or a published runs.csv."""
    runs = read_runs(source, "the output folder of a sweep (OUT/NAME/seedS/)")
    check_one_experiment(source, runs)
    check_model_code(runs, allow_mixed)
    if not runs["outcome"].isin(COUNTED).any():
        raise LnposError(f"{source}: no run finished, diverged or was stopped early: run or resume the sweep first")
    return runs


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


def verdicts(runs):
    """Both rules' verdicts and the mean NLL of every cell of ``runs`` (a DataFrame indexed by the keys)."""
    cells = make_cells(runs).set_index(KEYS)
    now = cells["verdict"].where(~cells["verdict"].isin(NO_TRAIN), "no-train")
    depth = cells["good_depth"].map({True: "good", False: "poor"}).where(cells["trains"], "no-train").fillna("NA")
    return pandas().DataFrame({"nll": cells["nll"], "loss": cells["loss"], "rule": now, "rule_depth": depth,
                               "earlier": earlier_verdicts(runs)})


def complete_cells(runs):
    """The keys of the cells of ``runs`` whose every seed finished, diverged or was stopped (a set)."""
    seeds = runs.groupby(KEYS)["seed"].nunique()
    counted = runs[runs["outcome"].isin(COUNTED)].groupby(KEYS)["seed"].nunique()
    return set(counted[counted == seeds.reindex(counted.index)].index)


def setting_values(runs):
    """{setting: the set of its values (as JSON) among ``runs``}, from their ``settings``."""
    out = {}
    for text in set(runs["settings"]):
        for k, v in json.loads(text).items():
            out.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return out


def compare(runs_a, runs_b, across=None):
    """One row per cell complete in both maps: each map's means and verdicts (suffixes _a, _b), both
    judged over the same cells (a map still running, or run in part, is compared on what both have),
    and the NLL difference (:func:`differences`); ``attrs["left_out"]``: how many cells only one map has
    complete. The maps must have the same settings but ``across`` (a setting name), which must differ."""
    a, b = setting_values(runs_a), setting_values(runs_b)
    differ = sorted(k for k in a.keys() | b.keys() if k != "data" and a.get(k) != b.get(k))
    if across is not None and across not in differ:
        raise LnposError(f"--across {across}: the two maps do not differ in it ({', '.join(differ) or 'nor in any other'}"
                         f"): give the setting they differ in")
    other = [k for k in differ if k != across]
    if other:
        raise LnposError(f"the two maps differ in a setting other than their axes ({other[0]}): compare two "
                         f"runs of the same sweep" + ("" if across else ", or name the one setting with --across"))
    ca, cb = complete_cells(runs_a), complete_cells(runs_b)
    common = ca & cb
    if not common:
        raise LnposError("the two maps have no cell complete in both: run or resume the sweeps first")
    keep = [r[[k in common for k in r[KEYS].itertuples(index=False, name=None)]] for r in (runs_a, runs_b)]
    both = verdicts(keep[0]).merge(verdicts(keep[1]), left_index=True, right_index=True, suffixes=("_a", "_b"))
    both = both.join(differences(*keep))
    both["beyond_noise"] = both["beyond_noise"].astype(object).fillna(False).astype(bool)  # cells without an NLL
    both = order(both.reset_index())
    both.attrs["left_out"] = len(ca ^ cb)
    return both


def differences(runs_a, runs_b, alpha=0.05):
    """Per cell of both (indexed by the keys): ``diff`` (B's mean final NLL minus A's, finished seeds),
    ``diff_low`` / ``diff_high`` (Welch's 95 % interval), ``p`` (Welch's two-sided p-value) and ``beyond_noise``
    (Holm over the cells with a p-value, at ``alpha``); NaN where a map has no finished seed (no interval
    or p-value below two seeds each)."""
    from .verdict import holm_rejects, welch

    fin = [r[r["outcome"] == FINISHED].groupby(KEYS)["final_valid_nll"].apply(list) for r in (runs_a, runs_b)]
    rows = {key: welch(fin[1][key], fin[0][key]) for key in fin[0].index.intersection(fin[1].index)}
    pd = pandas()
    out = pd.DataFrame(list(rows.values()), columns=["diff", "diff_low", "diff_high", "p"],
                       index=pd.MultiIndex.from_tuples(list(rows), names=KEYS))
    out["beyond_noise"] = holm_rejects(out["p"].to_numpy(float), alpha)
    return out


def seeds_text(runs):
    """The seeds of a map, as ``1, 2, 3``."""
    return ", ".join(map(str, sorted(runs["seed"].astype(int).unique())))


def shares(both):
    """Per rule: cells judged in both, how many agree, the share and its 95 % Wilson interval."""
    from scipy.stats import binomtest

    rows = []
    for rule, words in (("rule", "the map's rule (own architecture)"), ("rule_depth", "the map's rule (every cell at the depth)"),
                        ("earlier", "the earlier rule (own architecture)")):
        judged = both[both[f"{rule}_a"].notna() & both[f"{rule}_b"].notna()
                      & (both[f"{rule}_a"] != "NA") & (both[f"{rule}_b"] != "NA")]
        agree = int((judged[f"{rule}_a"] == judged[f"{rule}_b"]).sum())
        ci = binomtest(agree, len(judged)).proportion_ci(method="wilson") if len(judged) else None
        rows.append(dict(rule=words, judged=len(judged), agree=agree, share=agree / len(judged) if len(judged) else math.nan,
                         low=ci.low if ci else math.nan, high=ci.high if ci else math.nan))
    return pandas().DataFrame(rows)


def title(across=None):
    return f"One map trained two ways: across {across}" if across else "Verdicts of two runs of one map"


def noise_lines(both, across=None):
    """The page's paragraph on the NLL differences B - A and the cells where they exceed the seeds' noise."""
    d = both.dropna(subset=["diff"])
    if d.empty:
        return []
    tested, beyond = d["p"].notna().sum(), d[d["beyond_noise"] == True]  # noqa: E712
    big = d.loc[d["diff"].abs().idxmax()]
    lines = [f"Final validation NLL, B minus A{f' (across {across})' if across else ''}, over the {len(d)} cells with "
             f"finished seeds in both: mean {d['diff'].mean():+.3f} bits, median {d['diff'].median():+.3f}, |B - A| at "
             f"most {d['diff'].abs().quantile(0.95, interpolation='higher'):.3f} in 95 % of the cells, largest "
             f"{big['diff']:+.3f} ({big['variant']}, warm-up {big['warmup']}, lr {big['lr']:g}); beyond the seeds' "
             f"noise (Welch, two-sided, Holm over the {tested} cells with two seeds or more in each, 5 %): "
             f"{len(beyond)}.", ""]
    shown = d if across else beyond  # across a setting, every cell's difference is the finding
    if len(shown):
        lines += ["Every cell:" if across else "The cells beyond the noise:", "",
                  "| arch | layers | warm-up | lr | NLL A | NLL B | B - A | 95 % interval | p | beyond the noise |",
                  "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
        lines += [f"| {r.variant} | {r.layers} | {r.warmup} | {r.lr:g} | {r.nll_a:.3f} | {r.nll_b:.3f} | {r.diff:+.3f} | "
                  f"{r.diff_low:+.3f} to {r.diff_high:+.3f} | {r.p:.2g} | {'yes' if r.beyond_noise else 'no'} |"
                  for r in shown.itertuples()] + [""]
    return lines


def markdown(name_a, name_b, both, table, seeds=None, across=None):
    """The page; ``seeds``: (A's, B's) as text; ``across``: the setting A and B differ in."""
    same = seeds is not None and seeds[0] == seeds[1]
    kind = ("" if seeds is None else f" Seeds: A {seeds[0]}; B {seeds[1]}: " + (
        "the same seeds (a re-run)." if same else "other seeds (a replication: the verdicts are drawn anew)."))
    left = both.attrs.get("left_out", 0)
    lines = [f"# {title(across)}", "",
             f"A: `{name_a}`; B: `{name_b}`" + (f", differing in {across}" if across else "")
             + f". {len(both)} cells complete in both, judged over those cells only"
             + (f" ({left} cells complete in one map only are left out)" if left else "") + f".{kind}", "",
             "| rule | cells judged in both | agree | share | 95 % interval |", "|---|---:|---:|---:|---|"]
    lines += [f"| {r.rule} | {r.judged} | {r.agree} | {r.share:.0%} | {r.low:.0%} to {r.high:.0%} |"
              for r in table.itertuples()]
    lines += ["", "Verdicts: good, poor, no-train (diverged or stopped count as no-train), NA (not compared). "
              "The map's rule: final validation NLL, Welch per ordered pair, Holm (fairseq_lnpos/analysis/verdict.py). "
              "The earlier rule: label-smoothed loss within max(10 % of the best, 2 pooled sd) of the "
              "architecture's best (fairseq_lnpos/analysis/agreement.py). The interval treats cells as independent.", ""]
    lines += noise_lines(both, across)
    differ = both[(both["rule_a"] != both["rule_b"]) | (both["earlier_a"] != both["earlier_b"])
                  | (both["rule_depth_a"] != both["rule_depth_b"])]
    if len(differ):
        lines += ["Cells whose verdicts differ between the runs under either rule:", "",
                  "| arch | layers | warm-up | lr | NLL A | NLL B | rule A | rule B | depth A | depth B | earlier A | earlier B |",
                  "|---|---:|---:|---:|---:|---:|---|---|---|---|---|---|"]
        lines += [f"| {r.variant} | {r.layers} | {r.warmup} | {r.lr:g} | {r.nll_a:.3f} | {r.nll_b:.3f} | {r.rule_a} | "
                  f"{r.rule_b} | {r.rule_depth_a} | {r.rule_depth_b} | {r.earlier_a} | {r.earlier_b} |"
                  for r in differ.itertuples()]
    else:
        lines += ["Every cell has the same verdicts in both runs under both rules."]
    return "\n".join(lines) + "\n"


def _main(argv):
    p = CommandParser(prog="python -m fairseq_lnpos.analysis.agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="the first run of the map: its sweep folder or published runs.csv")
    p.add_argument("b", help="the second run, the same way")
    p.add_argument("--across", metavar="SETTING",
                   help="the one setting the two maps differ in (a key of runs.csv's settings, e.g. precision)")
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="judge a map whose runs were trained by different versions of the model code")
    p.add_argument("--out-dir", default=".", help="where to write agreement.csv and agreement.md (default: here)")
    p.add_argument("--publish", metavar="DIR", help="also write a results page into DIR")
    args = p.parse_args(argv)
    runs_a, runs_b = (load(s, args.allow_mixed_code) for s in (args.a, args.b))
    both = compare(runs_a, runs_b, args.across)
    md = markdown(args.a, args.b, both, shares(both), (seeds_text(runs_a), seeds_text(runs_b)), args.across)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "agreement.csv", out / "agreement.md"]
    write_text(written[0], both.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    write_text(written[1], md)
    runs = pandas().concat([runs_a.assign(map="A"), runs_b.assign(map="B")], ignore_index=True)
    write_outputs(out, args.publish, title(args.across), md, runs, written,
                  argv_of("python -m fairseq_lnpos.analysis.agreement", argv))
    print(md, end="")
    return 0


def main(argv=None):
    return run_main("agreement", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
