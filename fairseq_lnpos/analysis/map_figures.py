"""The stability map's figures (``scripts/stability_map.sh``, :mod:`.stability`) and the matrices
they draw: the heatmaps per architecture and depth, the overview of every architecture, the loss
against the learning rate with the seeds' min-max, and the LR sensitivity against depth."""
import math

from ..experiments.runs import warmup_label
from ..common import FONT
from ..variants import VARIANTS, variant_color
from .map_common import pyplot, save
from .map_common import num


def heatmap(cells, variant, layers):
    """The matrices one heatmap draws: rows warm-up, columns learning rate (both ascending)."""
    sel = {(c.warmup, c.lr): c for c in cells if (c.variant, c.layers) == (variant, layers)}
    warmups, lrs = sorted({w for w, _ in sel}), sorted({lr for _, lr in sel})

    def get(attr, empty):
        return [[getattr(sel[w, lr], attr) if (w, lr) in sel else empty for lr in lrs] for w in warmups]

    loss = [[math.nan if v is None else v for v in row] for row in get("nll", None)]
    verdicts = [[sel[w, lr].verdict if (w, lr) in sel else "" for lr in lrs] for w in warmups]
    return {"warmups": warmups, "lrs": lrs, "loss": loss, "bleu": get("bleu", None),
            "diverged": get("diverged", 0), "stopped": get("stopped", 0), "seeds": get("seeds", 0),
            "verdict": verdicts, "disagree": get("disagree", False)}


def plot_heatmaps(cells, path):
    """One panel per (depth, architecture); returns {(variant, layers): heatmap(...)} as drawn."""
    plt = pyplot()
    from matplotlib.patches import Rectangle

    variants = [v for v in VARIANTS if any(c.variant == v for c in cells)]
    depths = sorted({c.layers for c in cells})
    finite = [c.nll for c in cells if c.nll is not None and not c.diverged]
    vmin, vmax = (min(finite), max(finite)) if finite else (0, 1)
    fig, axes = plt.subplots(len(depths), len(variants), squeeze=False,
                             figsize=(3.6 * len(variants), 3.0 * len(depths)))
    drawn = {}
    for i, layers in enumerate(depths):
        for j, variant in enumerate(variants):
            ax, m = axes[i][j], heatmap(cells, variant, layers)
            drawn[variant, layers] = m
            ax.set_title(f"{VARIANTS[variant].label}, {layers} layers", fontsize=FONT)
            if not m["lrs"]:
                ax.axis("off")
                continue
            im = ax.imshow(m["loss"], cmap="viridis_r", vmin=vmin, vmax=vmax, aspect="auto")
            for r, w in enumerate(m["warmups"]):
                for k, _ in enumerate(m["lrs"]):
                    n, d, loss, bleu = m["seeds"][r][k], m["diverged"][r][k], m["loss"][r][k], m["bleu"][r][k]
                    stop, verdict = m["stopped"][r][k], m["verdict"][r][k]
                    text = "" if math.isnan(loss) else f"{loss:.2f}" + (f"\n{bleu:.1f}" if bleu is not None else "")
                    text += f"\n{VERDICT_MARK.get(verdict, '')}{'?' if m['disagree'][r][k] else ''} n{n}" if n else ""
                    if verdict == "good":
                        ax.add_patch(Rectangle((k - 0.48, r - 0.48), 0.96, 0.96, fill=False, color="white", lw=2))
                    if m["disagree"][r][k]:
                        ax.add_patch(Rectangle((k - 0.42, r - 0.42), 0.84, 0.84, fill=False, color="orange", lw=1.5,
                                               ls="--"))
                    if d:
                        ax.add_patch(Rectangle((k - 0.5, r - 0.5), 1, 1, fill=False, hatch="xx", color="red", lw=0))
                        text = "x" if d == n else f"{text}\nx {d}/{n}"
                    if stop:
                        text = f"s {stop}/{n}" if stop + d == n else f"{text}\ns {stop}/{n}"
                    dark = not math.isnan(loss) and (loss - vmin) > 0.6 * (vmax - vmin)  # viridis_r: dark at high loss
                    ax.text(k, r, text, ha="center", va="center", fontsize=6, color="white" if dark else "black")
            ax.set_xticks(range(len(m["lrs"])))
            ax.set_xticklabels([f"{lr:g}" for lr in m["lrs"]], fontsize=FONT)
            ax.set_yticks(range(len(m["warmups"])))
            ax.set_yticklabels([warmup_label(w) for w in m["warmups"]], fontsize=FONT)
            ax.set_xlabel("learning rate (peak)", fontsize=FONT)
            ax.set_ylabel("warm-up (updates)", fontsize=FONT)
            fig.colorbar(im, ax=ax, fraction=0.046)
    save(fig, path, "Final validation NLL (bits, mean over the seeds that finished; then test tok BLEU where "
                    "scored); G = good against its architecture's cells (white frame), p = poor, - = does not train,\n"
                    "· = one seed, ? = seeds disagree (orange), n = seeds; x = diverged, s = stopped early")
    return path


VERDICT_MARK = {"good": "G", "poor": "p", "no-train": "-", "NA": "·"}


def cell_mark(c):
    """A cell's short text (overview): the mean NLL (or x / s), its verdict mark (+: good at its depth) and n."""
    if c.finished == 0:
        head = "x" if c.diverged == c.seeds else "s" if c.stopped == c.seeds else f"x{c.diverged} s{c.stopped}"
    else:
        head = (f"{num(c.nll, '.2f')} {VERDICT_MARK.get(c.verdict, '')}{'+' if c.good_depth else ''}"
                f"{'?' if c.disagree else ''}")
    return f"{head} n{c.seeds}"


def overview(cells, layers):
    """The matrices of one overview panel at depth ``layers``: rows architecture (registry order),
    columns (warm-up, learning rate), each entry the cell or None."""
    sel = {(c.variant, c.warmup, c.lr): c for c in cells if c.layers == layers}
    variants = [v for v in VARIANTS if any(k[0] == v for k in sel)]
    cols = sorted({(w, lr) for _, w, lr in sel})
    return {"variants": variants, "cols": cols, "cells": [[sel.get((v, w, lr)) for w, lr in cols] for v in variants]}


def plot_overview(cells, path):
    """OUT/stability_overview.png: every architecture in one heatmap per depth (rows architecture,
    columns warm-up x learning rate): the mean final loss, its verdict mark and n; returns
    {layers: overview(...)} as drawn."""
    plt = pyplot()
    from matplotlib.patches import Rectangle

    depths = sorted({c.layers for c in cells})
    drawn = {d: overview(cells, d) for d in depths}
    finite = [c.nll for c in cells if c.nll is not None]
    vmin, vmax = (min(finite), max(finite)) if finite else (0, 1)
    fig, axes = plt.subplots(1, len(depths), squeeze=False,
                             figsize=(max(5.0, 1.05 * len(drawn[depths[0]]["cols"]) + 2.2) * len(depths),
                                      0.36 * max(len(m["variants"]) for m in drawn.values()) + 1.6))
    for ax, d in zip(axes[0], depths):
        m = drawn[d]
        loss = [[math.nan if c is None or c.nll is None else c.nll for c in row]
                for row in m["cells"]]
        im = ax.imshow(loss, cmap="viridis_r", vmin=vmin, vmax=vmax, aspect="auto")
        for r, row in enumerate(m["cells"]):
            for k, c in enumerate(row):
                if c is None:
                    continue
                text = cell_mark(c)
                if c.good_own:
                    ax.add_patch(Rectangle((k - 0.47, r - 0.45), 0.94, 0.9, fill=False, color="white", lw=1.5))
                if c.disagree:
                    ax.add_patch(Rectangle((k - 0.4, r - 0.38), 0.8, 0.76, fill=False, color="orange", lw=1.2, ls="--"))
                dark = not math.isnan(loss[r][k]) and (loss[r][k] - vmin) > 0.6 * (vmax - vmin)
                ax.text(k, r, text, ha="center", va="center", fontsize=6, color="white" if dark else "black")
        ax.set_xticks(range(len(m["cols"])))
        ax.set_xticklabels([f"wu {warmup_label(w)}\nlr {lr:g}" for w, lr in m["cols"]], fontsize=7)
        ax.set_yticks(range(len(m["variants"])))
        ax.set_yticklabels([VARIANTS[v].label for v in m["variants"]], fontsize=FONT)
        ax.set_title(f"{d} layers", fontsize=FONT)
        fig.colorbar(im, ax=ax, fraction=0.03)
    save(fig, path, "Final validation NLL (bits), mean over seeds; n seeds\nG good against its architecture's "
                    "cells (white frame), + also against every cell at that depth,\np poor, - does not train, · one "
                    "seed, ? seeds disagree (orange), x diverged, s stopped early")
    return path


def bleu_points(cells):
    """{layers: {warmup: [(variant, mean, min, max, good)]}}: the test tok BLEU (last scored epoch) of
    the cells that have one, per depth and warm-up, architectures in registry order, the learning
    rate of each architecture's best-BLEU cell of that warm-up."""
    best = {}
    for c in cells:
        if c.bleu is not None:
            k = (c.layers, c.warmup, c.variant)
            if k not in best or c.bleu > best[k].bleu:
                best[k] = c
    out = {}
    for (layers, warmup, variant), c in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1], list(VARIANTS).index(kv[0][2]))):
        out.setdefault(layers, {}).setdefault(warmup, []).append(
            (variant, c.bleu, c.bleu if c.bleu_min is None else c.bleu_min,
             c.bleu if c.bleu_max is None else c.bleu_max, bool(c.good_own)))
    return out


def plot_bleu(cells, path):
    """OUT/bleu.png, where test BLEU was scored: tok BLEU per architecture (rows), one marker per
    warm-up, bars the seeds' min-max, filled where the cell is good; one panel per depth. Returns
    :func:`bleu_points` as drawn, or None when no cell has a BLEU."""
    points = bleu_points(cells)
    if not points:
        return None
    plt = pyplot()
    variants = [v for v in VARIANTS if any(p[0] == v for w in points.values() for pts in w.values() for p in pts)]
    fig, axes = plt.subplots(1, len(points), squeeze=False, figsize=(6.0 * len(points) + 2, 0.32 * len(variants) + 1.8),
                             sharey=True)
    for ax, (layers, by_warmup) in zip(axes[0], points.items()):
        for j, (warmup, pts) in enumerate(by_warmup.items()):
            y = [variants.index(p[0]) + 0.18 * (j - (len(by_warmup) - 1) / 2) for p in pts]
            color = f"C{j % 10}"
            ax.errorbar([p[1] for p in pts], y, xerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                        fmt="none", ecolor=color, capsize=2, lw=1)
            for yy, p in zip(y, pts):
                ax.plot(p[1], yy, "o", ms=5, color=color, mfc=color if p[4] else "white")
            ax.plot([], [], "o", color=color, label=f"warm-up {warmup_label(warmup)}")
        ax.set_yticks(range(len(variants)))
        ax.set_yticklabels([VARIANTS[v].label for v in variants], fontsize=FONT)
        ax.invert_yaxis()
        ax.set_xlabel("test tok BLEU (last scored epoch)", fontsize=FONT)
        ax.set_title(f"{layers} layers", fontsize=FONT)
        ax.grid(alpha=0.3, axis="x")
    save(fig, path, "Test BLEU per architecture: mean over seeds, bars = min-max\nfilled: good against its "
                    "architecture's cells", legend_from=axes.flat)
    return path


def loss_curves(cells):
    """{(layers, warmup): {variant: [(lr, mean, min, max)]}}: the final loss against the learning rate
    of the cells with a finished seed, as :func:`plot_loss_vs_lr` draws it."""
    panels = {}
    for c in sorted(cells, key=lambda c: c.lr):
        if c.nll is not None:
            panels.setdefault((c.layers, c.warmup), {}).setdefault(c.variant, []).append(
                (c.lr, c.nll, c.nll_min, c.nll_max))
    return {k: dict(sorted(v.items(), key=lambda kv: list(VARIANTS).index(kv[0]))) for k, v in sorted(panels.items())}


def plot_loss_vs_lr(cells, path):
    """OUT/loss_vs_lr.png: the final loss against the learning rate, one line per architecture, one
    panel per depth and warm-up, error bars the seeds' min-max; returns :func:`loss_curves`."""
    plt = pyplot()
    panels = loss_curves(cells)
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(5.2 * len(panels) + 2, 4.2), sharey=True)
    for ax, ((layers, warmup), lines) in zip(axes[0], panels.items()):
        for v, pts in lines.items():
            lo = [m - (m if a is None else a) for _, m, a, _ in pts]
            hi = [(m if b is None else b) - m for _, m, _, b in pts]
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[lo, hi], marker="o", ms=3, capsize=2,
                        lw=1, color=variant_color(v), label=VARIANTS[v].label)
        ax.set_xscale("log")
        lrs = sorted({p[0] for pts in lines.values() for p in pts})
        ax.set_xticks(lrs)
        ax.set_xticklabels([f"{lr:g}" for lr in lrs], fontsize=FONT)
        ax.minorticks_off()
        ax.set_xlabel("learning rate (peak, log scale)", fontsize=FONT)
        ax.set_title(f"{layers} layers, warm-up {warmup_label(warmup)}", fontsize=FONT)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final validation NLL (bits per token)", fontsize=FONT)
    save(fig, path, "Final validation NLL against the learning rate, per architecture: mean over the seeds that "
                    "finished, bars = min-max over the seeds", legend_from=axes.flat)
    return path


def plot_sensitivity(sens, path):
    """LR sensitivity against depth, one line per architecture, one panel per warm-up; returns
    {warmup: {variant: [(layers, sensitivity), ...]}} as drawn."""
    plt = pyplot()
    warmups = sorted({w for _, _, w in sens})
    fig, axes = plt.subplots(1, len(warmups), squeeze=False, figsize=(4 * len(warmups) + 2, 3.4))
    drawn = {}
    for j, w in enumerate(warmups):
        ax = axes[0][j]
        drawn[w] = {v: [(l, s) for (v2, l, w2), s in sorted(sens.items()) if v2 == v and w2 == w and s is not None]
                    for v in VARIANTS}
        drawn[w] = {v: pts for v, pts in drawn[w].items() if pts}
        for v, pts in drawn[w].items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=variant_color(v),
                    label=VARIANTS[v].label)
        ax.set_title(f"warm-up {warmup_label(w)}", fontsize=FONT)
        ax.set_xticks(sorted({l for pts in drawn[w].values() for l, _ in pts}))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("layers (encoder = decoder)", fontsize=FONT)
        ax.set_ylabel("LR sensitivity (bits per token)", fontsize=FONT)
        ax.grid(alpha=0.3)
    save(fig, path, "Learning-rate sensitivity against depth, per architecture",
         legend_from=axes.flat)
    return path
