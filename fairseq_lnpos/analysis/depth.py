"""The stability map along depth (``scripts/stability_map.sh``). For a map of several depths (``grid.sh
sweep --depth-map``): the deepest depth at which every seed trains, per architecture, warm-up and learning
rate (:mod:`.outcome`), in largest_depth.csv
and the Markdown, and depth_loss.png (:func:`plot`). For any map whose runs recorded them: the first /
last layer gradient-norm ratio over the first :data:`GRAD_UPDATES` updates (:func:`grad_ratios`; Keel's
claim: Post-LN's falls with depth), peak memory and training time (DONE.json)."""
from pathlib import Path

from ..common import FONT, GRAD_NORMS_JSONL, write_text
from ..errors import StateError
from ..experiments.runs import warmup_label
from .map_common import all_lost, axis, label, lost, missing, nll_text, panels, pivot, save, variant_color
from .train_curves import read_jsonl

GRAD_UPDATES = 10  # "the first updates": the ratio is summed over updates 1 .. GRAD_UPDATES


def grad_ratios(save_dir, layers, updates=GRAD_UPDATES):
    """(encoder, decoder): the first whole layer's gradient norm (``encoder/0``) summed over the first ``updates``
    logged updates over the last's (``encoder/<layers-1>``); None where the run logged none of them."""
    path = Path(save_dir) / GRAD_NORMS_JSONL
    if not path.is_file():
        return None
    try:
        _, series = read_jsonl(path, max_update=updates)
    except (OSError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise StateError(f"{path} cannot be read as a gradient-norm log ({type(e).__name__}: {e}): delete it "
                         f"to map the run without its gradient norms") from None
    ratio = []
    for stack in ("encoder", "decoder"):
        pairs = [(a, b) for a, b in zip(series.get(f"{stack}/0", []), series.get(f"{stack}/{layers - 1}", []))
                 if a is not None and b is not None]
        last = sum(b for _, b in pairs)
        if not last > 0:
            return None
        ratio.append(sum(a for a, _ in pairs) / last)
    return tuple(ratio)


# ---------------------------------------------------------------- along depth

LINE = ["variant", "warmup", "lr"]  # a line along depth: one architecture, warm-up and learning rate
TRAINS = lambda c: c.trains  # noqa: E731


def along_depth(cells):
    """Whether the map has more than one depth (its depth sections and figure)."""
    return len(cells) > 0 and cells["layers"].nunique() > 1


def largest_depth(cells, ok=TRAINS):
    """{(variant, warmup, lr): (the deepest depth whose cell is ``ok`` (default: every seed trains) or None,
    [shallower depths that are not])}; {} for a map of one depth."""
    if not along_depth(cells):
        return {}
    cells = cells.assign(ok=cells.apply(ok, axis=1).astype(bool))
    out = {}
    for key, line in cells.groupby(LINE, sort=False):
        top = line.loc[line["ok"], "layers"].max()
        top = None if missing(top) else int(top)
        out[key] = (top, sorted(int(d) for d in line.loc[~line["ok"] & (line["layers"] < (top or 0)), "layers"]))
    return out


def _fmt_depth(value, deepest):
    top, gaps = value
    return "-" if top is None else (f"{top}" + (" (deepest run)" if top == deepest else "")
                                    + (f" (not {', '.join(map(str, gaps))})" if gaps else ""))


def write_csv(cells, path):
    """OUT/largest_depth.csv (its path), a row per architecture, warm-up and learning rate: its depths, the
    deepest at which every seed trains, the shallower ones at which some seed does not."""
    depths = cells.groupby(LINE, sort=False)["layers"].agg(lambda s: " ".join(map(str, sorted(s))))
    t = type(cells)([(label(v), v, w, lr, depths[v, w, lr], top, " ".join(map(str, gaps)))
                     for (v, w, lr), (top, gaps) in largest_depth(cells).items()],
                    columns=["label", "variant", "warmup", "lr", "depths", "largest_trains_depth", "not_trains_below"],
                    dtype=object)
    return write_text(path, t.to_csv(index=False, lineterminator="\n"))


# ---------------------------------------------------------------- Markdown

def _cell_loss(c):
    if c.finished == 0:
        return all_lost(c)
    text = nll_text(c)
    return (text if c.trains else f"({text})") + f" {c.seeds_train}/{c.seeds} train" + lost(c)


def _memory(m):
    return ", ".join(f.format(v) for f, v in (("RSS {:.0f}", m.rss), ("CUDA {:.0f}", m.cuda),
                                              ("{:.0f} s", m.seconds)) if not missing(v))


def markdown(cells):
    """The depth sections of the map's Markdown (none for what the runs did not record)."""
    if cells.empty:
        return []
    cells = cells.assign(label=cells["variant"].map(label))
    lines, by_depth = [], lambda t: pivot(t, "label", "layers", "text", "architecture \\ layers")  # noqa: E731
    if along_depth(cells):
        deepest = cells["layers"].max()
        t = type(cells)([(f"{label(v)}, warm-up {warmup_label(w)}", lr, _fmt_depth(top, deepest))
                         for (v, w, lr), top in largest_depth(cells).items()], columns=["label", "lr", "text"])
        lines += ["", "## Deepest that trains", "",
                  "The deepest model of the grid at which every seed trains (the rule above); '(not N)': shallower "
                  "depths at which some seed did not; '-': none.",
                  ""] + pivot(t, "label", "lr", "text", "architecture", lambda lr: f"lr {lr:g}")
        for (w, lr), panel in cells.assign(text=cells.apply(_cell_loss, axis=1)).groupby(["warmup", "lr"]):
            lines += ["", f"### Final validation NLL along depth, warm-up {warmup_label(w)}, lr {lr:g} (bits)", "",
                      "NLL: mean over the seeds that finished, [min to max]; (NLL): some seed does not train; k/n "
                      "seeds train; x: diverged; s: stopped early.", ""] + by_depth(panel)
    by = cells.groupby(["label", "layers"], sort=False)
    ratios = by[["grad_ratio_encoder", "grad_ratio_decoder"]].median().dropna(how="all").reset_index()
    if len(ratios):
        lines += ["", "## Gradient norms along depth: first / last layer", "",
                  f"The first layer's gradient norm over the last layer's (whole layers), summed over updates 1-"
                  f"{GRAD_UPDATES}, encoder / decoder; median over the learning rates, warm-ups and seeds of that "
                  f"architecture and depth. Below 1: gradients shrink towards the input.", ""]
        lines += by_depth(ratios.assign(text=[f"{e:.3g} / {d:.3g}" for e, d in zip(ratios["grad_ratio_encoder"],
                                                                                   ratios["grad_ratio_decoder"])]))
    memory = by.agg(rss=("peak_rss_mb", "max"), cuda=("cuda_peak_mb", "max"), seconds=("train_seconds", "mean"))
    if memory[["rss", "cuda"]].notna().any(axis=None):
        memory = memory.dropna(how="all").reset_index()
        lines += ["", "## Peak memory and training time", "",
                  "Peak resident set of fairseq-train (MB; its own process, not the data loader's) and CUDA's peak "
                  "(MB, fairseq's per-update torch.cuda.max_memory_allocated) where it ran on a GPU, the largest over "
                  "the learning rates, warm-ups and seeds; and the mean training wall time (s).", ""]
        lines += by_depth(memory.assign(text=[_memory(m) for m in memory.itertuples()]))
    return lines


# ---------------------------------------------------------------- the figure

def plot(cells, path):
    """OUT/depth_loss.png (its path): the final NLL against depth, a panel per warm-up and learning rate, a
    line per architecture (the marks as its title says)."""
    by_panel = cells.groupby(["warmup", "lr"])
    fig, axes = panels(by_panel.ngroups, max(4.4, 6.4 / by_panel.ngroups), 4.0, sharey=True)
    for ax, ((w, lr), panel) in zip(axes[0], by_panel):
        for v, line in panel.sort_values("layers").groupby("variant", sort=False):
            color, gone = variant_color(v), line["finished"] == 0
            ok = line[~gone & line["nll"].notna()]
            good = ok["trains"].to_numpy(bool)
            ax.plot(ok["layers"], ok["nll"], color=color, lw=1.2, label=label(v))
            ax.plot(ok["layers"][good], ok["nll"][good], "o", color=color)
            ax.plot(ok["layers"][~good], ok["nll"][~good], "o", color=color, mfc="none")
            ax.plot(line["layers"][gone], line["unigram_bits"][gone], "x", color=color, ms=9, mew=2)
            bars = ok[ok["finished"] > 1]
            ax.errorbar(bars["layers"], bars["nll"], yerr=[bars["nll"] - bars["nll_min"], bars["nll_max"] - bars["nll"]],
                        fmt="none", color=color, capsize=2, lw=1)
        axis(ax, f"warm-up {warmup_label(w)}, lr {lr:g}", "layers (encoder = decoder)", sorted(cells["layers"].unique()),
             base=2)
    axes[0][0].set_ylabel("final validation NLL (bits per token)", fontsize=FONT)
    return save(fig, path, "Final validation NLL against depth, per architecture: filled = every seed trains, hollow = some "
                           "does not,\nx = diverged or stopped (at the unigram bits); bars = the seeds' min-max",
                legend_from=axes.flat)
