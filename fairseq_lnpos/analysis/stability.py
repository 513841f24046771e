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
from . import depth, verdict as V
from .frame import (COUNTED, DIVERGED, FINISHED, GATHERED, STOPPED, check_model_code, check_one_experiment, gather,
                    write_runs_csv)
from .map_common import label, lost, missing, nll_text, num, ordered, pivot
from .map_figures import cell_mark, plot_bleu, plot_heatmaps, plot_loss_vs_lr, plot_overview, plot_sensitivity
from .publish import argv_of, publish

KEYS = ["variant", "layers", "warmup", "lr"]
SENSITIVITY = ("LR sensitivity (after Wortsman et al. 2023, \"Small-scale proxies for large-scale Transformer "
               "training instabilities\"): the mean over the learning-rate grid of min(final NLL, unigram bits) minus "
               "the best final NLL on the grid, per architecture, depth and warm-up; a run that diverged or was "
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


def make_cells(runs, trains=V.DEFAULT_TRAINS, margin=V.DEFAULT_MARGIN, alpha=V.DEFAULT_ALPHA, keys=KEYS,
               families=V.FAMILIES):
    """The cells of the counted runs (a DataFrame, a row per cell) with their seeds' statistics and
    verdicts (:mod:`.verdict`); ``verdict`` in a word against its own architecture. A cell is a value of
    ``keys`` (the map's axes; ``["run"]``: each named run of a study), judged within each of ``families``
    ({name: the columns of a family}; no columns: every cell one family)."""
    runs = counted(runs)
    runs = runs.assign(diverged=runs["outcome"] == DIVERGED, stopped=runs["outcome"] == STOPPED,
                       finished=runs["outcome"] == FINISHED)
    runs = runs.assign(seeds_train=runs["finished"] & (runs["nll_ratio"] <= trains))
    cells = runs.groupby(keys).agg(seeds=("seed", "size"), **{c: (c, f) for c, f in OVER_SEEDS.items()})
    nll, bleu = "final_valid_nll", "bleu_tok"
    cells = cells.join(runs[runs["finished"]].groupby(keys).agg(
        nll=(nll, "mean"), nll_var=(nll, "var"), nll_min=(nll, "min"), nll_max=(nll, "max"),
        loss=("final_valid_loss", "mean"), bleu=(bleu, "mean"), bleu_min=(bleu, "min"), bleu_max=(bleu, "max"))
    ).reset_index()
    cells["nll_sd"] = cells["nll_var"] ** 0.5
    cells["trains"] = (cells["finished"] == cells["seeds"]) & (cells["nll"] <= trains * cells["unigram_bits"])
    cells["disagree"] = (cells["seeds_train"] > 0) & (cells["seeds_train"] < cells["seeds"])
    trained = cells[cells["trains"]]
    for family, by in families.items():
        cells[f"good_{family}"] = V.good(trained, list(by), margin=margin, alpha=alpha, lone=True, index=cells.index,
                                         other=False)
        cells[f"gap_{family}"] = trained["nll"] - (trained.groupby(list(by))["nll"].transform("min") if by
                                                   else trained["nll"].min())
    own, lost_all = cells["good_own"], cells["diverged"] + cells["stopped"] == cells["seeds"]
    cells["verdict"] = np.select([cells["diverged"] == cells["seeds"], lost_all, ~cells["trains"], own.isna(),
                                  own == True], ["diverged", "stopped", "no-train", "NA", "good"], "poor")  # noqa: E712
    return order(cells, keys)


def lr_sensitivity(runs):
    """{(variant, layers, warmup): the LR sensitivity over the learning rates run (:data:`SENSITIVITY`)}."""
    runs = counted(runs)
    final = runs["final_valid_nll"].where(runs["outcome"] == FINISHED, runs["unigram_bits"])
    by_lr = runs.assign(final=final, clipped=final.clip(upper=runs["unigram_bits"])).groupby(KEYS)[
        ["final", "clipped"]].mean()
    per = by_lr.groupby(["variant", "layers", "warmup"])
    return {k: float(v) for k, v in (per["clipped"].mean() - per["final"].min()).dropna().items()}


# ---------------------------------------------------------------- Markdown

def cell_text(c):
    """A cell in the map's tables: NLL mean [min-max] n, BLEU, verdicts; x d/n diverged, s k/n stopped."""
    if c.finished == 0:
        return lost(c)[2:]
    text = nll_text(c, ".3f") + f" n{c.seeds}" + ("" if missing(c.bleu) else f" BLEU {c.bleu:.1f}")
    text += f" **{c.verdict}**" if c.verdict == "good" else f" {c.verdict}"
    return text + (" +depth" if c.good_depth else "") + ("?" if c.disagree else "") + lost(c)


def _texts(cells, fmt):
    """``cells`` with a column ``text``: ``fmt`` of each cell."""
    return cells.assign(text=[fmt(c) for c in cells.itertuples()])


def overview_table(cells):
    """Markdown lines, one table per depth: rows architecture, columns warm-up and learning rate."""
    lines, columns = [], sorted(set(zip(cells["warmup"], cells["lr"])))
    for d, at in cells.groupby("layers"):
        at = _texts(at, cell_mark).assign(architecture=at["variant"].map(label),
                                          column=[columns.index(k) for k in zip(at["warmup"], at["lr"])])
        lines += [f"## Overview, {d} layers: final validation NLL (bits), mean n seeds, verdict", ""]
        lines += pivot(at, "architecture", "column", "text", "architecture",
                       col_fmt=lambda i: f"wu {warmup_label(columns[i][0])}, lr {columns[i][1]:g}") + [""]
    return lines


def largest_lr(cells, column):
    """{(variant, layers, warmup): the largest learning rate whose cell has ``column`` true, or None}."""
    ok = cells["lr"].where(cells[column] == True)  # noqa: E712  (None: unknown, not true)
    best = ok.groupby([cells[k] for k in KEYS[:3]], sort=False).max()
    return {k: None if math.isnan(v) else float(v) for k, v in best.items()}


def _arch_table(values, fmt, cells):
    """{(variant, layers, warmup): value} as a table: a row per architecture and depth, a column per
    warm-up, then the architecture's best NLL and the best at that depth (cells that train)."""
    warmups, trained = sorted({w for _, _, w in values}), cells[cells["trains"]]
    own, at_depth = trained.groupby(["variant", "layers"])["nll"].min(), trained.groupby("layers")["nll"].min()
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


def markdown(title, runs, cells, rules, code_line):
    """The map's Markdown; ``rules``: (trains, margin, alpha)."""
    counts = runs["outcome"].value_counts()
    outcomes = [o.value for o in Outcome]
    uni = runs["unigram_bits"].dropna()
    lines = [f"# Stability map of {title}", "",
             f"{len(runs)} runs: " + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in outcomes if counts.get(s, 0))
             + ". Failed, unfinished and not started runs are not counted. "
             + (f"Unigram bits of the corpus: {uni.iloc[0]:.3f}. " if len(uni) and uni.nunique() == 1 else "")
             + f"Seeds per cell: {', '.join(map(str, sorted(cells['seeds'].unique())))}. {code_line}.", "",
             V.describe(*rules), "", cost_line(runs), ""]
    if cells.empty:
        return "\n".join(lines + ["No run finished, diverged or was stopped early: nothing to map.", ""])
    lines += overview_table(cells)
    lines += ["Marks: G good, p poor, - does not train, · one seed (not compared) (against its own architecture's "
              "cells at that depth); +: not shown worse than any cell at that depth (among many more cells: a "
              "weaker test); ?: the seeds disagree on 'trains'; x diverged, s stopped early.", ""]
    for (variant, layers), g in cells.groupby(["variant", "layers"], sort=False):
        g = _texts(g, cell_text).assign(wu=g["warmup"].map(warmup_label))
        lines += [f"## {label(variant)}, {layers} layers: final validation NLL (bits)", ""]
        lines += pivot(g, "wu", "lr", "text", "warm-up \\ lr", col_fmt=lambda lr: f"{lr:g}") + [""]
    lines += ["## Largest good learning rate per warm-up", "",
              "The largest learning rate whose cell is good against its own architecture's cells at that depth; "
              "'-': none; beside it the architecture's best NLL and the best of any architecture at that depth.", ""]
    lr_text = lambda lr: "-" if lr is None else f"{lr:g}"  # noqa: E731
    lines += _arch_table(largest_lr(cells, "good_own"), lr_text, cells)
    lines += ["", "## Largest learning rate that trains, per warm-up", ""]
    lines += _arch_table(largest_lr(cells, "trains"), lr_text, cells)
    lines += ["", "## LR sensitivity (bits)", "", SENSITIVITY, ""]
    lines += _arch_table(lr_sensitivity(runs), lambda s: f"{s:.3f}", cells)
    lines += depth.markdown(cells)
    left = runs[~runs["outcome"].isin(COUNTED)]
    if len(left):
        lines += ["", "## Not counted", ""] + [f"- {r.outcome}: {r.path}" for r in left.itertuples()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the command

def write_map(out, runs, cells, md, figures=True):
    """Write the map's files into ``out``; returns the paths written."""
    out = Path(out)
    written = [write_runs_csv(runs, out / "runs.csv"),
               write_text(out / "cells.csv", cells.to_csv(index=False, float_format="%.6g", lineterminator="\n")),
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
    p.add_argument("--trains", type=float, default=V.DEFAULT_TRAINS,
                   help="trains: the final validation NLL at most this times the corpus's unigram bits (default: %(default)s)")
    p.add_argument("--margin", type=float, default=V.DEFAULT_MARGIN,
                   help="poor: worse than another cell of its family by more than this many bits (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=V.DEFAULT_ALPHA,
                   help="the rate at which identical cells are called poor, at most (default: %(default)s)")
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="map runs trained by different versions of the model code (listed in the output)")
    p.add_argument("--no-figures", action="store_true", help="write the CSV and Markdown only")
    p.add_argument("--publish", metavar="DIR", help="also write the map as a results page into DIR (docs/results/NAME)")
    p.add_argument("--title", help="the page's title (default: 'Stability map: ' and the sources' names)")
    args = p.parse_args(argv)
    for name, value, ok, want in (("--trains", args.trains, 0 < args.trains <= 1, "a number in (0, 1]"),
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
    cells = make_cells(runs, *rules)
    md = markdown(title, runs, cells, rules, code_line)
    written = write_map(out, runs, cells, md, not args.no_figures)
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
