"""The stability map along depth: how deep each architecture trains (``scripts/stability_map.sh``).

For a map of more than one depth (``scripts/grid.sh sweep --depth-map``):

- the largest good depth per architecture, warm-up and learning rate: the deepest model of the
  grid whose cell is good against every cell at its depth (:mod:`.verdict`), and the deepest that trains, in OUT/largest_depth.csv and the
  Markdown, beside the final loss at every depth;
- OUT/depth_loss.png: final validation loss against depth (log axis), one line per architecture,
  one panel per warm-up and learning rate, error bars the seeds' min-max; cells that are not good
  hollow, diverged or stopped ones an x at their initial loss.

For any map whose runs recorded them:

- the first / last layer gradient-norm ratio over the first :data:`GRAD_UPDATES` updates, per
  encoder and decoder (:func:`grad_ratios`, from ``<save-dir>/grad_norms.jsonl`` of
  ``--task translation_lnpos --log-grad-norms``): Keel's claim is that Post-LN's gradients vanish
  towards the input as depth grows, i.e. this ratio falls with depth;
- peak memory (the resident set of fairseq-train, CUDA's peak on a GPU) and training time
  (DONE.json).
"""
import csv
import io
import math
import statistics
from pathlib import Path

from ..common import FONT, GRAD_NORMS_JSONL, write_text
from ..errors import StateError
from ..experiments.runs import warmup_label
from ..variants import VARIANTS, variant_color
from .map_common import group, num, pyplot, save
from .train_curves import read_jsonl

GRAD_UPDATES = 10  # "the first updates": the ratio is summed over updates 1 .. GRAD_UPDATES


def grad_ratios(save_dir, layers, updates=GRAD_UPDATES):
    """(encoder, decoder): the first layer's gradient norm summed over the first ``updates`` logged
    updates, over the last layer's (whole layers: groups ``encoder/0`` and ``encoder/<layers-1>``);
    None when the run logged no gradient norms (or none of those updates)."""
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

def along_depth(cells):
    """{(variant, warmup, lr): its cells by depth, shallowest first}; {} for a map of one depth."""
    if len({c.layers for c in cells}) < 2:
        return {}
    return {k: sorted(g, key=lambda c: c.layers) for k, g in group(cells, lambda c: (c.variant, c.warmup, c.lr)).items()}


def largest_depth(cells, ok=lambda c: c.good_depth):
    """{(variant, warmup, lr): (the deepest depth whose cell is ``ok`` (default: good) or None,
    [shallower depths that are not])}."""
    out = {}
    for key, line in along_depth(cells).items():
        top = max((c.layers for c in line if ok(c)), default=None)
        out[key] = (top, [c.layers for c in line if top is not None and c.layers < top and not ok(c)])
    return out


def _fmt_depth(value, deepest):
    top, gaps = value
    if top is None:
        return "-"
    return f"{top}" + (" (deepest run)" if top == deepest else "") + (f" (not {', '.join(map(str, gaps))})" if gaps else "")


def write_csv(cells, path):
    """OUT/largest_depth.csv: one row per architecture, warm-up and learning rate."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["label", "variant", "warmup", "lr", "depths", "largest_good_depth", "not_good_below",
                "largest_trains_depth"])
    trains = largest_depth(cells, lambda c: c.trains)
    for (v, warmup, lr), (top, gaps) in largest_depth(cells).items():
        depths = [c.layers for c in along_depth(cells)[v, warmup, lr]]
        t = trains[v, warmup, lr][0]
        w.writerow([VARIANTS[v].label, v, warmup, repr(lr), " ".join(map(str, depths)),
                    "" if top is None else top, " ".join(map(str, gaps)), "" if t is None else t])
    return write_text(path, buf.getvalue())


# ---------------------------------------------------------------- Markdown

def _table(values, corner, fmt, col_fmt=str):
    """{(row label, column): value} as a Markdown table: rows in their first-seen order, columns sorted."""
    rows = list(dict.fromkeys(r for r, _ in values))
    cols = sorted({c for _, c in values})
    lines = [f"| {corner} | " + " | ".join(map(col_fmt, cols)) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r} | " + " | ".join(fmt(values[r, c]) if (r, c) in values else "" for c in cols) + " |")
    return lines


def _cell_loss(c):
    if c.finished == 0:
        return "x" if c.diverged == c.seeds else "s" if c.stopped == c.seeds else f"x {c.diverged}/{c.seeds}, s {c.stopped}/{c.seeds}"
    text = num(c.nll, ".2f") + (f" [{c.nll_min:.2f} to {c.nll_max:.2f}]" if c.finished > 1 and c.nll is not None else "")
    text = (f"**{text}**" if c.good_depth else text if c.trains else f"({text})") + f" n{c.seeds}" + ("?" if c.disagree else "")
    return text + "".join(f", {m} {k}/{c.seeds}" for m, k in (("x", c.diverged), ("s", c.stopped)) if k)


def markdown(cells):
    """The depth sections of the map's Markdown (none for what the runs did not record)."""
    lines = []
    line = along_depth(cells)
    if line:
        deepest = max(c.layers for c in cells)
        label = {(v, w): f"{VARIANTS[v].label}, warm-up {warmup_label(w)}" for v, w, _ in line}
        lines += ["", "## Largest good depth", "",
                  "The deepest model of the grid whose cell is good against every cell at its depth (the rules above); '(not N)': shallower depths "
                  "that were not good; '-': none. Beside it, after '/', the deepest that trains (the lax rule alone).",
                  ""]
        trains = largest_depth(cells, lambda c: c.trains)
        lines += _table({(label[v, w], lr): (t, trains[v, w, lr]) for (v, w, lr), t in largest_depth(cells).items()},
                        "architecture", lambda t: f"{_fmt_depth(t[0], deepest)} / {_fmt_depth(t[1], deepest)}",
                        lambda lr: f"lr {lr:g}")
        for w, lr in dict.fromkeys((w, lr) for _, w, lr in line):
            lines += ["", f"### Final validation NLL along depth, warm-up {warmup_label(w)}, lr {lr:g} (bits)", "",
                      "**NLL**: good at its depth; NLL: trains, not good; (NLL): does not train; [min to max] over "
                      "the seeds; n seeds; ?: the seeds disagree; x: diverged; s: stopped early.", ""]
            lines += _table({(VARIANTS[c.variant].label, c.layers): c for c in cells if (c.warmup, c.lr) == (w, lr)},
                            "architecture \\ layers", _cell_loss)
    ratios = {(VARIANTS[v].label, layers): (statistics.median(e), statistics.median(d))
              for (v, layers), (e, d) in _collect(cells, ("grad_ratio_encoder", "grad_ratio_decoder")).items()}
    if ratios:
        lines += ["", "## Gradient norms along depth: first / last layer", "",
                  f"The first layer's gradient norm over the last layer's (whole layers), summed over updates 1-"
                  f"{GRAD_UPDATES}, encoder / decoder; median over the learning rates, warm-ups and seeds of that "
                  f"architecture and depth. Below 1: gradients shrink towards the input.", ""]
        lines += _table(ratios, "architecture \\ layers", lambda r: f"{r[0]:.3g} / {r[1]:.3g}")
    memory = {(VARIANTS[v].label, layers): (max(rss, default=None), max(cuda, default=None), statistics.mean(t) if t else None)
              for (v, layers), (rss, cuda, t) in _collect(cells, ("peak_rss_mb", "cuda_peak_mb", "train_seconds")).items()}
    if any(m[0] is not None or m[1] is not None for m in memory.values()):
        lines += ["", "## Peak memory and training time", "",
                  "Peak resident set of fairseq-train (MB; its own process, not the data loader's) and CUDA's peak "
                  "(MB, fairseq's per-update torch.cuda.max_memory_allocated) where it ran on a GPU, the largest over "
                  "the learning rates, warm-ups and seeds; and the mean training wall time (s).", ""]
        lines += _table(memory, "architecture \\ layers", _fmt_memory)
    return lines


def _collect(cells, attrs):
    """{(variant, layers): one list per attribute of ``attrs``, of its cells' recorded values}."""
    out = {}
    for c in cells:
        lists = out.setdefault((c.variant, c.layers), tuple([] for _ in attrs))
        for values, a in zip(lists, attrs):
            if getattr(c, a) is not None:
                values.append(getattr(c, a))
    return {k: v for k, v in out.items() if any(v)}


def _fmt_memory(m):
    rss, cuda, seconds = m
    parts = ([f"RSS {rss:.0f}"] if rss is not None else []) + ([f"CUDA {cuda:.0f}"] if cuda is not None else [])
    return ", ".join(parts + ([f"{seconds:.0f} s"] if seconds is not None else []))


# ---------------------------------------------------------------- the figure

def plot(cells, path):
    """OUT/depth_loss.png; returns {(warmup, lr): {variant: [(layers, loss, "good"|"not good"|"diverged",
    (min, max) or None)]}} as drawn (a cell whose seeds all diverged or stopped at its initial loss)."""
    plt = pyplot()
    panels = {}
    for (v, w, lr), line in along_depth(cells).items():
        points = []
        for c in line:
            if c.finished == 0:
                points.append((c.layers, c.unigram_bits, "diverged", None))
            elif c.nll is not None:
                points.append((c.layers, c.nll, "good" if c.good_depth else "not good",
                               (c.nll_min, c.nll_max) if c.finished > 1 else None))
        panels.setdefault((w, lr), {})[v] = points
    keys = sorted(panels)
    fig, axes = plt.subplots(1, len(keys), squeeze=False, figsize=(max(6.4, 4.4 * len(keys)) + 2, 4.0), sharey=True)
    depths = sorted({c.layers for c in cells})
    for ax, key in zip(axes[0], keys):
        for v, points in panels[key].items():
            color = variant_color(v)
            drawn = [(x, y) for x, y, kind, _ in points if kind != "diverged" and y is not None and math.isfinite(y)]
            ax.plot([x for x, _ in drawn], [y for _, y in drawn], color=color, lw=1.2, label=VARIANTS[v].label)
            for x, y, kind, span in points:
                if y is None:
                    continue
                marker = {"good": dict(marker="o", color=color), "not good": dict(marker="o", mfc="none", color=color),
                          "diverged": dict(marker="x", color=color, ms=9, mew=2)}[kind]
                ax.plot([x], [y], ls="none", **marker)
                if span:
                    ax.errorbar([x], [y], yerr=[[y - span[0]], [span[1] - y]], color=color, capsize=2, lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths)
        ax.set_xticklabels([str(d) for d in depths], fontsize=FONT)
        ax.minorticks_off()
        ax.set_xlabel("layers (encoder = decoder)", fontsize=FONT)
        ax.set_title(f"warm-up {warmup_label(key[0])}, lr {key[1]:g}", fontsize=FONT)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("final validation NLL (bits per token)", fontsize=FONT)
    save(fig, path, "Final validation NLL against depth, per architecture: filled = good at its depth, hollow = not "
                    "good,\nx = diverged or stopped (at the unigram bits); bars = the seeds' min-max",
         legend_from=axes.flat)
    return path
