"""Stability map from recorded runs: learning rate x warm-up x depth for every architecture.

    scripts/stability_map.sh OUT [options]                           (a sweep's folder; options: --help)
    scripts/stability_map.sh --runs-csv runs.csv --out-dir DIR ...   (a published map, re-judged)
    scripts/stability_map.sh OUT_A docs/results/NAME/runs.csv ... --out-dir DIR   (seeds run on other days, added)

The runs of OUT/NAME/seedS/ (:func:`~.frame.gather`: sweep folders and published runs.csv add up, each run
once) that share architecture, depth, warm-up and learning rate are one cell, its seeds; runs that differ in
another setting, a seed twice and runs of different model code (unless --allow-mixed-code) are refused. Each
cell: its seeds' outcomes, the final validation NLL's mean, spread and range (bits, no label smoothing), test
BLEU where scored, the verdicts of :mod:`.verdict`. Writes into OUT runs.csv, cells.csv, stability.md (printed
too), unless --no-figures the figures of :mod:`.map_figures` and :mod:`.depth`, and with ``--publish DIR`` a
results page (:mod:`.publish`).
"""
import math
import sys
from pathlib import Path

import numpy as np

from ..common import write_text
from ..cli import CommandParser
from ..errors import check, run_main
from ..experiments.records import Outcome
from ..experiments.runs import warmup_label
from . import depth, outcome as O, verdict as V
from .frame import (COUNTED, DIVERGED, FINISHED, GATHERED, STOPPED, check_model_code, check_one_experiment, gather,
                    write_runs_csv)
from .map_common import label, lost, markdown_table, missing, num, ordered, outcome_mark, pivot
from .map_figures import plot_bleu, plot_heatmaps, plot_loss_vs_lr, plot_overview, plot_sensitivity
from .publish import argv_of, publish

KEYS = ["variant", "layers", "warmup", "lr"]
SENSITIVITY = ("LR sensitivity (after Wortsman et al. 2023, \"Small-scale proxies for large-scale Transformer "
               "training instabilities\"): the mean over the learning-rate grid of min(final NLL, unigram bits) minus "
               "the least of those on the grid, per architecture, depth and warm-up (never below 0); a run that "
               "diverged or was "
               "stopped counts as the unigram bits; seeds are averaged per learning rate. 0: every learning rate "
               "of the grid reached the best.")
# how a cell sums up its seeds' runs, in the order of cells.csv (after ``seeds``, before the finished seeds' NLL)
OVER_SEEDS = {"diverged": "sum", "stopped": "sum", "finished": "sum", "seeds_train": "sum", "unigram_bits": "mean",
              "initial_loss": "mean", "grad_ratio_encoder": "mean", "grad_ratio_decoder": "mean", "peak_rss_mb": "max",
              "cuda_peak_mb": "max", "train_seconds": "mean", "train_cpu_seconds": "sum"}


def order(frame, keys=KEYS):
    """``frame`` sorted by ``keys``: architectures in the registry's order, then depth, warm-up, learning rate."""
    return ordered(frame, *keys).reset_index(drop=True)


def counted(runs):
    """The runs a cell counts: finished, diverged or stopped early."""
    return runs[runs["outcome"].isin(COUNTED)]


def make_cells(runs, trains=None, margin=O.MARGIN, alpha=O.ALPHA, keys=KEYS, families=V.FAMILIES,
               gain=O.SOURCE_GAIN):
    """The cells of the counted runs (a DataFrame, a row per cell) with their outcome (:mod:`.outcome`):
    ``seeds``, ``seeds_train`` (k of n seeds train) and its exact interval (``rate_low``, ``rate_high``), the
    NLL of the seeds that train (``nll_trained`` and its interval), the mean, min and max NLL of every
    finished seed (``nll``: the figures' and the LR sensitivity's), ``trains`` (every seed trains) and
    ``disagree`` (some do, some not). ``keys`` are the cells (the map's axes; ``["run"]``: each named run of
    a study). ``trains``: the NLL-ratio threshold of runs without a source-use measurement (None: each
    corpus's, :data:`.outcome.TRAINS`). ``verdict`` and ``vs_*`` come from :func:`compare`; ``good_own`` and
    ``good_depth`` (the earlier rule, :mod:`.verdict`, on every finished seed) from ``families``."""
    runs = counted(runs)
    runs = runs.assign(diverged=runs["outcome"] == DIVERGED, stopped=runs["outcome"] == STOPPED,
                       finished=runs["outcome"] == FINISHED)
    runs = runs.assign(seeds_train=O.run_trains(runs, gain, trains), threshold=O.threshold(runs, trains))
    cells = runs.groupby(keys).agg(seeds=("seed", "size"), threshold=("threshold", "first"),
                                   **{c: (c, f) for c, f in OVER_SEEDS.items()})
    nll, bleu = "final_valid_nll", "bleu_tok"
    cells = cells.join(runs[runs["finished"]].groupby(keys).agg(
        nll=(nll, "mean"), nll_var=(nll, "var"), nll_min=(nll, "min"), nll_max=(nll, "max"),
        loss=("final_valid_loss", "mean"), bleu=(bleu, "mean"), bleu_min=(bleu, "min"), bleu_max=(bleu, "max")))
    stalled = runs[runs["finished"] & ~runs["seeds_train"]].groupby(keys)[nll]
    cells = cells.join(stalled.agg(nll_stalled_min="min", nll_stalled_max="max"))
    trained = runs[runs["seeds_train"]].groupby(keys)[nll].agg(list).reindex(cells.index)
    columns = lambda rows, names: type(cells)(list(rows), index=cells.index, columns=names, dtype=float)  # noqa: E731
    cells = cells.join(columns((O.mean_interval(v if isinstance(v, list) else []) for v in trained),
                               ["nll_trained", "nll_trained_low", "nll_trained_high"]))
    cells = cells.join(columns((O.rate_interval(k, n) for k, n in zip(cells["seeds_train"], cells["seeds"])),
                               ["rate_low", "rate_high"])).reset_index()
    cells["nll_sd"] = cells["nll_var"] ** 0.5
    cells["trains"] = cells["seeds_train"] == cells["seeds"]
    cells["disagree"] = (cells["seeds_train"] > 0) & (cells["seeds_train"] < cells["seeds"])
    # the earlier rule (:mod:`.verdict`), which the studies of named runs and the predictor still read: a cell
    # trains when every seed finished and their mean NLL is at most the threshold; good: not shown worse
    cells["trains_mean"] = (cells["finished"] == cells["seeds"]) & (cells["nll"] <= cells["threshold"] * cells["unigram_bits"])
    earlier = cells[cells["trains_mean"]]
    for family, by in (V.FAMILIES if families is None else families).items():
        cells[f"good_{family}"] = V.good(earlier, list(by), margin=margin, alpha=alpha, lone=True, index=cells.index,
                                         other=False)
    cells = order(cells, keys)
    lost_all = cells["diverged"] + cells["stopped"] == cells["seeds"]
    cells["verdict"] = np.select([cells["diverged"] == cells["seeds"], lost_all, cells["seeds_train"] == 0],
                                 ["diverged", "stopped", "no-train"], "")
    return cells


def references(cells):
    """The comparisons a map states before its data: (cell, reference, name) for every cell with a
    shorter warm-up than the map's longest at its architecture, depth and learning rate (against that
    one: "warm-up"), and for every architecture's cell against Pre-LN's at the same depth, warm-up and
    learning rate ("Pre-LN"), where the map has those cells."""
    have = set(cells[KEYS].itertuples(index=False, name=None))
    longest = cells.groupby(["variant", "layers", "lr"])["warmup"].max()
    pairs = []
    for v, layers, w, lr in cells[KEYS].itertuples(index=False, name=None):
        top = longest[v, layers, lr]
        if w < top:
            pairs.append(((v, layers, w, lr), (v, layers, top, lr), "warm-up"))
        if v != "preln" and ("preln", layers, w, lr) in have:
            pairs.append(((v, layers, w, lr), ("preln", layers, w, lr), "Pre-LN"))
    return pairs


def pd_isin(cells, keys):
    """Whether each cell's :data:`KEYS` are among ``keys`` (a set of tuples)."""
    return cells[KEYS].apply(tuple, axis=1).isin(keys) if len(cells) else cells["variant"].astype(bool)


def compare(cells, runs, trains=None, margin=O.MARGIN, alpha=O.ALPHA, gain=O.SOURCE_GAIN):
    """(cells with ``vs_warmup`` and ``vs_preln``, the words of their comparisons, and ``verdict``: the word
    against the warm-up reference, else Pre-LN's, else 'reference' for a cell others are compared with; the table of the map's comparisons,
    :func:`.outcome.compare_cells`, every one Holm-corrected with the others)."""
    runs = counted(runs)
    runs = runs.assign(trains=O.run_trains(runs, gain, trains))
    table = O.compare_cells(cells, runs, references(cells), KEYS, margin=margin, alpha=alpha)
    cells = cells.copy()
    for name, column in (("warm-up", "vs_warmup"), ("Pre-LN", "vs_preln")):
        got = table[table["reference"] == name].set_index(KEYS)["word"] if len(table) else {}
        cells[column] = [got.get(k, "") for k in cells[KEYS].itertuples(index=False, name=None)]
    first = cells["vs_warmup"].where(cells["vs_warmup"] != "", cells["vs_preln"])
    refs = {r for _, r, _ in references(cells)}
    first = first.where((first != "") | ~pd_isin(cells, refs), "reference")
    cells["verdict"] = cells["verdict"].where(cells["verdict"] != "", first)
    return cells, table


def lr_sensitivity(runs):
    """{(variant, layers, warmup): the LR sensitivity over the learning rates run (:data:`SENSITIVITY`)}."""
    runs = counted(runs)
    final = runs["final_valid_nll"].where(runs["outcome"] == FINISHED, runs["unigram_bits"])
    by_lr = runs.assign(final=final, clipped=final.clip(upper=runs["unigram_bits"])).groupby(KEYS)[
        ["final", "clipped"]].mean()
    per = by_lr.groupby(["variant", "layers", "warmup"])
    return {k: float(v) for k, v in (per["clipped"].mean() - per["clipped"].min()).dropna().items()}


# ---------------------------------------------------------------- Markdown

REFERENCES = ("References, stated before the data: each cell against the same architecture, depth and learning "
              "rate with the map's longest warm-up (vs warm-up), and against Pre-LN at the same depth, warm-up and "
              "learning rate (vs Pre-LN).")


def outcome_text(c, fmt=".3f"):
    """``k/n train [rate interval]``, the NLL of the seeds that train with its 95 % interval, and where the
    finished seeds that do not train end (``stall at`` their NLL, or its range)."""
    text = f"{c.seeds_train}/{c.seeds} train [{c.rate_low:.2f}, {c.rate_high:.2f}]"
    if c.seeds_train:
        text += f", NLL {c.nll_trained:{fmt}}" + ("" if missing(c.nll_trained_low) else
                                                  f" [{c.nll_trained_low:{fmt}}, {c.nll_trained_high:{fmt}}]")
    if not missing(c.nll_stalled_min):
        text += f", stall at {c.nll_stalled_min:{fmt}}" + (
            "" if c.nll_stalled_max == c.nll_stalled_min else f" to {c.nll_stalled_max:{fmt}}")
    return text


def cell_text(c):
    """A cell in the map's tables: its outcome (:func:`outcome_text`), BLEU, the words against its
    references (decided ones bold); x d/n diverged, s k/n stopped."""
    if c.finished == 0:
        return lost(c)[2:]
    words = [f"vs {name}: " + (f"**{w}**" if w in ("worse", "better", "equivalent") else w)
             for name, w in (("warm-up", c.vs_warmup), ("Pre-LN", c.vs_preln)) if w]
    return "; ".join([outcome_text(c) + ("" if missing(c.bleu) else f", BLEU {c.bleu:.1f}")] + words) + lost(c)


def _texts(cells, fmt):
    """``cells`` with a column ``text``: ``fmt`` of each cell."""
    return cells.assign(text=[fmt(c) for c in cells.itertuples()])


def overview_table(cells):
    """Markdown lines, one table per depth: rows architecture, columns warm-up and learning rate."""
    lines, columns = [], sorted(set(zip(cells["warmup"], cells["lr"])))
    for d, at in cells.groupby("layers"):
        at = _texts(at, outcome_mark).assign(architecture=at["variant"].map(label),
                                              column=[columns.index(k) for k in zip(at["warmup"], at["lr"])])
        lines += [f"## Overview, {d} layers: seeds that train, and the verdict", ""]
        lines += pivot(at, "architecture", "column", "text", "architecture",
                       col_fmt=lambda i: f"wu {warmup_label(columns[i][0])}, lr {columns[i][1]:g}") + [""]
    return lines


def comparison_lines(table):
    """The map's comparisons as a Markdown table: a row per cell and reference."""
    if table.empty:
        return ["No cell has a reference on this map.", ""]
    rows = table.assign(
        cell=[f"{label(r.variant)}, {r.layers} layers, wu {warmup_label(r.warmup)}, lr {r.lr:g}" for r in table.itertuples()],
        rates=[f"{r.k}/{r.n} vs {r.k_ref}/{r.n_ref} (p {r.rate_p:.2g})" + (f" **{r.rate_word}**" if r.rate_word else "")
               for r in table.itertuples()],
        difference=["–" if missing(r.diff) else f"{r.diff:+.3f}" + ("" if missing(r.low) else f" [{r.low:+.3f}, {r.high:+.3f}]")
                    for r in table.itertuples()],
        seeds=[("paired, " if r.paired else "Welch, ") + r.compared for r in table.itertuples()],
        verdict=[f"**{w}**" if w in ("worse", "better", "equivalent") else w for w in table["word"]])
    return markdown_table(rows[["cell", "reference", "rates", "difference", "seeds", "verdict"]].rename(columns={
        "rates": "seeds that train (Fisher's p)", "difference": "NLL difference, bits [95 % interval]",
        "seeds": "seeds compared"})) + [""]


def largest_lr(cells, column):
    """{(variant, layers, warmup): the largest learning rate whose cell has ``column`` true, or None}."""
    ok = cells["lr"].where(cells[column] == True)  # noqa: E712  (None: unknown, not true)
    best = ok.groupby([cells[k] for k in KEYS[:3]], sort=False).max()
    return {k: None if math.isnan(v) else float(v) for k, v in best.items()}


def _arch_table(values, fmt, cells):
    """{(variant, layers, warmup): value} as a table: a row per architecture and depth, a column per
    warm-up, then the architecture's best NLL and the best at that depth (cells that train)."""
    warmups = sorted({w for _, _, w in values})
    own, at_depth = cells.groupby(["variant", "layers"])["nll_trained"].min(), cells.groupby("layers")["nll_trained"].min()
    lines = ["| architecture | layers | " + " | ".join(f"warm-up {warmup_label(w)}" for w in warmups)
             + " | its best NLL | best at this depth |", "|---|---|" + "---|" * (len(warmups) + 2)]
    for v, layers in dict.fromkeys((v, l) for v, l, _ in values):
        row = [fmt(values[v, layers, w]) if (v, layers, w) in values else "" for w in warmups]
        lines.append(f"| {label(v)} | {layers} | " + " | ".join(row)
                     + f" | {num(own.get((v, layers)))} | {num(at_depth.get(layers))} |")
    return lines


def cost_line(runs):
    """The training time of the counted runs: CPU seconds where recorded, and wall seconds."""
    runs = counted(runs)
    cpu = runs["train_cpu_seconds"].dropna()
    text = f"Training time of the {len(runs)} counted runs: {runs['train_seconds'].sum():.0f} s wall (summed over runs)"
    if len(cpu):
        text += f"; CPU time recorded by {len(cpu)} of them: {cpu.sum():.0f} s, {cpu.mean():.1f} s a run"
    return text + "."


def markdown(title, runs, cells, table, rules, code_line):
    """The map's Markdown; ``table`` its comparisons (:func:`compare`); ``rules``: (trains, margin, alpha,
    gain) as :func:`make_cells` takes them."""
    trains, margin, alpha, gain = rules
    counts = runs["outcome"].value_counts()
    outcomes = [o.value for o in Outcome]
    uni = runs["unigram_bits"].dropna()
    measured = int(counted(runs)["source_gain"].notna().sum())
    lines = [f"# Stability map of {title}", "",
             f"{len(runs)} runs: " + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in outcomes if counts.get(s, 0))
             + ". Failed, unfinished and not started runs are not counted. "
             + (f"Unigram bits of the corpus: {uni.iloc[0]:.3f}. " if len(uni) and uni.nunique() == 1 else "")
             + f"Seeds per cell: {', '.join(map(str, sorted(cells['seeds'].unique())))}. {code_line}. "
             + f"Source use measured for {measured} of the {len(counted(runs))} counted runs.", "",
             O.describe(margin, alpha, gain, trains if isinstance(trains, dict) else None)
             + ("" if trains is None or isinstance(trains, dict) else
                f" This map replaces the corpus's NLL fraction by {trains:g} (--trains)."), "",
             REFERENCES + f" {len(table)} comparisons, Holm-corrected together.", "", cost_line(runs), ""]
    if cells.empty:
        return "\n".join(lines + ["No run finished, diverged or was stopped early: nothing to map.", ""])
    lines += overview_table(cells)
    lines += ["Marks: k/n seeds that train; against the cell's first reference (warm-up, else Pre-LN): W worse, "
              "B better, E equivalent, ? inconclusive, · not compared (fewer than two seeds train on a side), "
              "R the reference itself; - no seed trains, x every seed diverged, s every seed stopped early.", ""]
    for (variant, layers), g in cells.groupby(["variant", "layers"], sort=False):
        g = _texts(g, cell_text).assign(wu=g["warmup"].map(warmup_label))
        lines += [f"## {label(variant)}, {layers} layers: seeds that train, their final validation NLL (bits)", ""]
        lines += pivot(g, "wu", "lr", "text", "warm-up \\ lr", col_fmt=lambda lr: f"{lr:g}") + [""]
    lines += ["## Comparisons", "", "Each cell against its references: the seeds that train in each (k/n; Fisher's "
              "exact p, the word where Holm's correction over the map decides), and the NLL difference over the "
              "seeds that train with its 95 % interval (paired by seed within an architecture and depth, else Welch) "
              "and its word.", ""] + comparison_lines(table)
    lr_text = lambda lr: "-" if lr is None else f"{lr:g}"  # noqa: E731
    lines += ["## Largest learning rate that trains, per warm-up", "",
              "The largest learning rate at which every seed trains; '-': none; beside it the architecture's best NLL "
              "(seeds that train) and the best of any architecture at that depth.", ""]
    lines += _arch_table(largest_lr(cells, "trains"), lr_text, cells)
    no_need = cells.assign(no_need=cells["trains"] & cells["vs_warmup"].isin(["equivalent", "better"]))
    lines += ["", "## Warm-up not needed: the largest learning rate", "",
              "The largest learning rate at which the cell trains in every seed and is equivalent to or better than "
              "the same architecture with the map's longest warm-up (the words above); '-': none.", ""]
    lines += _arch_table({k: v for k, v in largest_lr(no_need, "no_need").items()
                          if (k[0], k[1]) in set(zip(table["variant"], table["layers"]))
                          and k[2] < cells["warmup"].max()} if len(table) else {}, lr_text, cells)
    lines += ["", "## LR sensitivity (bits)", "", SENSITIVITY, ""]
    lines += _arch_table(lr_sensitivity(runs), lambda s: f"{s:.3f}", cells)
    lines += depth.markdown(cells)
    left = runs[~runs["outcome"].isin(COUNTED)]
    if len(left):
        lines += ["", "## Not counted", ""] + [f"- {r.outcome}: {r.path}" for r in left.itertuples()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the command

def write_map(out, runs, cells, md, figures=True, table=None):
    """Write the map's files into ``out`` (with ``table``, the comparisons, comparisons.csv); returns the
    paths written."""
    out = Path(out)
    csv = lambda t, name: write_text(out / name, t.to_csv(index=False, float_format="%.6g", lineterminator="\n"))  # noqa: E731
    written = [write_runs_csv(runs, out / "runs.csv"), csv(cells, "cells.csv"),
               *([] if table is None else [csv(table, "comparisons.csv")]),
               write_text(out / "stability.md", md)]
    deep, sens = depth.along_depth(cells), lr_sensitivity(runs)
    if deep:
        written.append(depth.write_csv(cells, out / "largest_depth.csv"))
    if len(cells) and figures:
        written += [plot_overview(cells, out / "stability_overview.png"),
                    plot_heatmaps(cells, out / "stability_heatmaps.png"), plot_loss_vs_lr(cells, out / "loss_vs_lr.png"),
                    plot_bleu(cells, out / "bleu.png"), sens and plot_sensitivity(sens, out / "sensitivity_vs_depth.png"),
                    deep and depth.plot(cells, out / "depth_loss.png")]
    return [p for p in written if p]


def _source_name(source):
    """How a page's title names a source: a sweep folder by its name, a published runs.csv by its page's."""
    path = Path(source)
    return path.parent.name if path.is_file() else path.name


def _main(argv):
    p = CommandParser(prog="stability_map.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="*", metavar="OUT",
                   help="the output folder of a sweep (OUT/NAME/seedS/ run folders) or a published runs.csv; "
                        "several add up into one map (e.g. seeds run on other days), each run given once")
    p.add_argument("--runs-csv", action="append", default=[],
                   help="a published runs.csv to judge (the same as giving it as OUT; may be repeated)")
    p.add_argument("--out-dir", help="where to write the map's files (default: OUT when it is the one source given)")
    p.add_argument("--trains", type=float,
                   help="a run not measured for source use trains when its final validation NLL is at most this times "
                        "the corpus's unigram bits (default: the corpus's calibrated fraction, "
                        + ", ".join(f"{c} {t:g}" for c, t in sorted(O.TRAINS.items())) + ")")
    p.add_argument("--source-gain", type=float, default=O.SOURCE_GAIN,
                   help="a run trains when permuting its sources raises its NLL by more than this many bits "
                        "(default: %(default)s)")
    p.add_argument("--margin", type=float, default=O.MARGIN,
                   help="worse / better: by more than this many bits; equivalent: within it (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=O.ALPHA,
                   help="each word's error rate over the map's comparisons, at most (default: %(default)s)")
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="map runs trained by different versions of the model code (listed in the output)")
    p.add_argument("--no-figures", action="store_true", help="write the CSV and Markdown only")
    p.add_argument("--publish", metavar="DIR", help="also write the map as a results page into DIR (docs/results/NAME)")
    p.add_argument("--title", help="the page's title (default: 'Stability map: ' and the sources' names)")
    args = p.parse_args(argv)
    for name, value, ok, want in (("--trains", 0.5 if args.trains is None else args.trains,
                                   args.trains is None or 0 < args.trains <= 1, "a number in (0, 1]"),
                                  ("--source-gain", args.source_gain, args.source_gain >= 0, "a number of bits of at least 0"),
                                  ("--margin", args.margin, args.margin >= 0, "a number of bits of at least 0"),
                                  ("--alpha", args.alpha, 0 < args.alpha < 1, "a number in (0, 1)")):
        check(math.isfinite(value) and ok, f"{name} {value}: give {want}")
    sources = args.sources + args.runs_csv
    check(sources, "give a sweep's folder OUT, or a published runs.csv with --out-dir DIR")
    one_folder = len(sources) == 1 and not args.runs_csv and not Path(sources[0]).is_file()
    check(args.out_dir or one_folder, f"{' and '.join(sources)}: " + ("a runs.csv" if len(sources) == 1 else "several sources")
          + " needs --out-dir DIR: where to write the map")
    title = " + ".join(sources)
    runs = gather(sources, {}, "the output folder of a sweep (OUT/NAME/seedS/)")[0].drop(columns=list(GATHERED))
    out = Path(args.out_dir or sources[0])
    out.mkdir(parents=True, exist_ok=True)
    check_one_experiment(title, runs)
    code_line, rules = check_model_code(runs, args.allow_mixed_code), (args.trains, args.margin, args.alpha)
    cells = make_cells(runs, *rules, gain=args.source_gain)
    cells, table = compare(cells, runs, *rules, gain=args.source_gain)
    md = markdown(title, runs, cells, table, (*rules, args.source_gain), code_line)
    written = write_map(out, runs, cells, md, not args.no_figures, table)
    if args.publish:
        page_title = args.title or "Stability map: " + " + ".join(map(_source_name, sources))
        written.append(publish(args.publish, page_title, md, runs, written, argv_of("stability_map.sh", argv)))
    print(md, end="")
    check(not cells.empty, f"{title}: no run finished, diverged or was stopped early, so there is no map "
                           f"(the runs are listed in {out / 'stability.md'}): run or resume the sweep first")
    return 0


def main(argv=None):
    return run_main("stability_map.sh", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
