"""The stability map's figures (``scripts/stability_map.sh``), views of its cells (the DataFrame of
:func:`.stability.make_cells`): heatmaps per architecture and depth, the overview of every architecture,
test BLEU, the loss against the learning rate and the LR sensitivity against depth."""
import math

import numpy as np

from ..common import FONT
from ..experiments.runs import warmup_label
from .frame import pandas
from .map_common import (RANK, all_lost, axis, label, lost, missing, num, ordered, outcome_mark, panels, pyplot, save,
                         variant_color)

KEY = ("k/n: seeds that train (white frame: every one; orange: some); against the cell's first reference (warm-up, "
       "else Pre-LN): W worse, B better,\nE equivalent, ? inconclusive, · not compared, R the reference; - no seed "
       "trains, x diverged, s stopped early")


def one_seed_note(cells):
    """A line for a map whose every cell has one seed (none can be judged), else ''."""
    if len(cells) and (cells["seeds"] <= 1).all():
        return ("\nEvery cell has one seed, so no cell is compared with its reference: a difference needs its seeds' "
                "spread, which one seed does not give (a sweep with --seeds 1,2,3 does)")
    return ""


def cell_mark(c, sep=" ", bleu=False):
    """A cell in short (the overview; with ``sep`` a newline and ``bleu``, the heatmaps): the mean NLL of the
    seeds that finished, test BLEU where scored, the seeds that train and the verdict's letter
    (:func:`~.map_common.outcome_mark`), then the seeds lost (x d/n diverged, s k/n stopped); x or s alone when
    every seed was."""
    if c.finished == 0:
        return f"{all_lost(c)} n{c.seeds}"
    parts = [num(c.nll, ".2f")] + ([f"{c.bleu:.1f}"] if bleu and not missing(c.bleu) else [])
    return sep.join(parts + [outcome_mark(c)]) + lost(c, ", " if sep == " " else sep)


def _heatmap(fig, ax, panel, cells, rows, cols, text, row_label, col_label, col_size=FONT):
    """One panel: the cells of ``panel`` on a grid of ``rows`` x ``cols`` (a cell's row and column; the ticks
    named by ``row_label`` and ``col_label``), the mean NLL as colour on the range of ``cells``, ``text`` of each
    cell, framed white where every seed trains, orange where its seeds disagree, hatched red where
    some seed diverged."""
    from matplotlib.patches import Rectangle

    finite = cells["nll"].dropna()
    vmin, vmax = (finite.min(), finite.max()) if len(finite) else (0, 1)
    r_keys, c_keys = sorted({rows(c) for c in panel.itertuples()}), sorted({cols(c) for c in panel.itertuples()})
    loss = np.full((len(r_keys), len(c_keys)), math.nan)
    for c in panel.itertuples():
        r, k = r_keys.index(rows(c)), c_keys.index(cols(c))
        loss[r, k] = c.nll
        if c.trains:
            ax.add_patch(Rectangle((k - 0.47, r - 0.45), 0.94, 0.9, fill=False, color="white", lw=1.5))
        if c.disagree:
            ax.add_patch(Rectangle((k - 0.4, r - 0.38), 0.8, 0.76, fill=False, color="orange", lw=1.2, ls="--"))
        if c.diverged:
            ax.add_patch(Rectangle((k - 0.5, r - 0.5), 1, 1, fill=False, hatch="xx", color="red", lw=0))
        dark = not math.isnan(c.nll) and (c.nll - vmin) > 0.6 * (vmax - vmin)  # viridis_r: dark at high loss
        ax.text(k, r, text(c), ha="center", va="center", fontsize=6, color="white" if dark else "black")
    fig.colorbar(ax.imshow(loss, cmap="viridis_r", vmin=vmin, vmax=vmax, aspect="auto"), ax=ax, fraction=0.046)
    ax.set_xticks(range(len(c_keys)), [col_label(k) for k in c_keys], fontsize=col_size)
    ax.set_yticks(range(len(r_keys)), [row_label(k) for k in r_keys], fontsize=FONT)


def plot_heatmaps(cells, path):
    """OUT/stability_heatmaps.png (its path), a panel per (depth, architecture): rows warm-up, columns learning rate."""
    variants, depths = list(dict.fromkeys(ordered(cells, "variant")["variant"])), sorted(cells["layers"].unique())
    fig, axes = pyplot().subplots(len(depths), len(variants), squeeze=False,
                                  figsize=(3.6 * len(variants), 3.0 * len(depths)))
    for (v, layers), panel in cells.groupby(["variant", "layers"]):
        ax = axes[depths.index(layers)][variants.index(v)]
        _heatmap(fig, ax, panel, cells, lambda c: c.warmup, lambda c: c.lr, lambda c: cell_mark(c, "\n", True),
                 warmup_label, "{:g}".format)
        ax.set_title(f"{label(v)}, {layers} layers", fontsize=FONT)
        ax.set_xlabel("learning rate (peak)", fontsize=FONT)
        ax.set_ylabel("warm-up (updates)", fontsize=FONT)
    for ax in axes.flat:
        if not ax.images:
            ax.axis("off")
    return save(fig, path, "Final validation NLL (bits, mean over the seeds that finished; then test tok BLEU where "
                           "scored; then k/n and the verdict)\n" + KEY + one_seed_note(cells))


def plot_overview(cells, path):
    """OUT/stability_overview.png (its path): a heatmap per depth, rows architecture, columns warm-up x learning
    rate: the mean final loss, its verdict mark and n."""
    depths, cols = sorted(cells["layers"].unique()), cells[["warmup", "lr"]].drop_duplicates()
    fig, axes = pyplot().subplots(1, len(depths), squeeze=False, figsize=(
        max(5.0, 1.05 * len(cols) + 2.2) * len(depths), 0.36 * cells["variant"].nunique() + 1.6))
    for ax, (d, panel) in zip(axes[0], cells.groupby("layers")):
        _heatmap(fig, ax, panel, cells, lambda c: (RANK[c.variant], c.variant), lambda c: (c.warmup, c.lr), cell_mark,
                 lambda k: label(k[1]), lambda k: f"wu {warmup_label(k[0])}\nlr {k[1]:g}", col_size=7)
        ax.set_title(f"{d} layers", fontsize=FONT)
    return save(fig, path, "Final validation NLL (bits), mean over the seeds that finished\n" + KEY + one_seed_note(cells))


def bleu_points(cells):
    """{layers: {warmup: [(variant, mean, min, max, every seed trains)]}}: the test tok BLEU (last scored epoch) of
    the cells that have one, per depth and warm-up, architectures in registry order, the learning
    rate of each architecture's best-BLEU cell of that warm-up."""
    scored = cells[cells["bleu"].notna()]
    best = ordered(scored.loc[scored.groupby(["layers", "warmup", "variant"])["bleu"].idxmax()], "layers", "warmup",
                   "variant")
    out = {}
    for c in best.assign(bleu_min=best["bleu_min"].fillna(best["bleu"]), bleu_max=best["bleu_max"].fillna(best["bleu"]),
                         good=best["trains"]).itertuples():
        out.setdefault(int(c.layers), {}).setdefault(int(c.warmup), []).append((c.variant, c.bleu, c.bleu_min, c.bleu_max, c.good))
    return out


def plot_bleu(cells, path):
    """OUT/bleu.png (its path; None when no cell has a BLEU): tok BLEU per architecture (rows) of
    :func:`bleu_points`, one marker per warm-up, filled where every seed of the cell trains; a panel per depth."""
    points = bleu_points(cells)
    if not points:
        return None
    variants = sorted({p[0] for w in points.values() for pts in w.values() for p in pts}, key=RANK.get)
    fig, axes = panels(len(points), 6.0, 0.32 * len(variants) + 1.8, sharey=True)
    for ax, (layers, by_warmup) in zip(axes[0], points.items()):
        for j, (warmup, pts) in enumerate(by_warmup.items()):
            y = [variants.index(p[0]) + 0.18 * (j - (len(by_warmup) - 1) / 2) for p in pts]
            color = f"C{j % 10}"
            ax.errorbar([p[1] for p in pts], y, xerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                        fmt="none", ecolor=color, capsize=2, lw=1)
            for yy, p in zip(y, pts):
                ax.plot(p[1], yy, "o", ms=5, color=color, mfc=color if p[4] else "white")
            ax.plot([], [], "o", color=color, label=f"warm-up {warmup_label(warmup)}")
        ax.set_yticks(range(len(variants)), [label(v) for v in variants], fontsize=FONT)
        ax.invert_yaxis()
        ax.set_xlabel("test tok BLEU (last scored epoch)", fontsize=FONT)
        ax.set_title(f"{layers} layers", fontsize=FONT)
        ax.grid(alpha=0.3, axis="x")
    return save(fig, path, "Test BLEU per architecture: mean over seeds, bars = min-max\nfilled: every seed trains; hollow: "
                           "some seed does not", legend_from=axes.flat)


def plot_loss_vs_lr(cells, path):
    """OUT/loss_vs_lr.png (its path; None when no cell has a seed that finished, so no loss to draw): the final
    loss against the learning rate, a line per architecture, a panel per depth and warm-up, error bars the
    seeds' min-max."""
    done = ordered(cells[cells["nll"].notna()], "variant", "lr")
    if done.empty:
        return None
    by_panel = done.groupby(["layers", "warmup"])
    fig, axes = panels(by_panel.ngroups, 5.2, 4.2, sharey=True)
    for ax, ((layers, warmup), panel) in zip(axes[0], by_panel):
        for v, line in panel.groupby("variant", sort=False):
            ax.errorbar(line["lr"], line["nll"], yerr=[line["nll"] - line["nll_min"].fillna(line["nll"]),
                                                       line["nll_max"].fillna(line["nll"]) - line["nll"]],
                        marker="o", ms=3, capsize=2, lw=1, color=variant_color(v), label=label(v))
        axis(ax, f"{layers} layers, warm-up {warmup_label(warmup)}", "learning rate (peak, log scale)",
             sorted(panel["lr"].unique()))
    axes[0][0].set_ylabel("final validation NLL (bits per token)", fontsize=FONT)
    return save(fig, path, "Final validation NLL against the learning rate, per architecture: mean over the seeds that "
                           "finished, bars = min-max over the seeds", legend_from=axes.flat)


def plot_sensitivity(sens, path):
    """OUT/sensitivity_vs_depth.png (its path): LR sensitivity ({(variant, layers, warmup): bits}) against
    depth, a line per architecture, a panel per warm-up."""
    s = pandas().Series(sens, dtype=float).dropna().rename_axis(["variant", "layers", "warmup"]).reset_index(name="bits")
    by_panel = ordered(s, "variant", "layers").groupby("warmup")
    fig, axes = panels(by_panel.ngroups, 4, 3.4)
    for ax, (w, panel) in zip(axes[0], by_panel):
        for v, line in panel.groupby("variant", sort=False):
            ax.plot(line["layers"], line["bits"], marker="o", color=variant_color(v), label=label(v))
        axis(ax, f"warm-up {warmup_label(w)}", "layers (encoder = decoder)")
        ax.set_xticks(sorted(panel["layers"].unique()))
        ax.set_ylim(bottom=min(0.0, float(panel["bits"].min())))  # a negative value is drawn, not cut off
        ax.set_ylabel("LR sensitivity (bits per token)", fontsize=FONT)
    return save(fig, path, "Learning-rate sensitivity against depth, per architecture", legend_from=axes.flat)
