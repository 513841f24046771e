"""PNG figures from fig3.json, laid out like Fig. 3 of Xiong et al. (2020).

Per statistic one figure, rows = encoder / decoder (the paper does not say which stack its
layers are), columns = (a) W1 per layer, (b) W2 per layer, (c) the last layer's W2 by depth (the
paper's (c) Post-LN and (d) Pre-LN bar charts, here a line per architecture), on one logarithmic
scale shared by every panel. ``lemma2.png``: ||x||^2 / d at every LayerNorm input with the lemma's bounds.

    python -m fairseq_lnpos.analysis.plots analysis-out/fig3.json   # redraw
"""
import sys
from pathlib import Path

from fairseq_lnpos.cli import CommandParser
from fairseq_lnpos.common import FONT, integer_ticks, legend_right, read_json, write_figure
from fairseq_lnpos.errors import run_main
from fairseq_lnpos.analysis.map_common import label_color

STATS = {"mean_grad": ("mean", "fig3.png", "norm of the gradient averaged over batches (paper)"),
         "batch_norm": ("batch_norm_mean", "fig3_per_batch.png", "mean per-batch gradient norm")}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fig3(result, out, stat="mean_grad"):
    fig = fig3_figure(result, stat)
    path = write_figure(fig, Path(out) / STATS[stat][1], dpi=80)
    _plt().close(fig)
    return path


def fig3_figure(result, stat="mean_grad"):
    """The matplotlib figure :func:`plot_fig3` writes: rows encoder / decoder, three panels each, every
    architecture a line in each: (a) W1 and (b) W2 of the FFN per layer, (c) the last layer's W2 against the
    depth (the paper's (c) and (d), one bar chart per architecture there). One logarithmic gradient-norm
    scale for all six panels, so that panels compare at a glance and an architecture whose gradients are
    many times smaller than another's is still a line, not a flat bar."""
    plt = _plt()
    key, _, what = STATS[stat]
    per_layer, last = result["per_layer"], result["last_w2"]
    labels = list(dict.fromkeys(list(per_layer) + list(last)))
    color = {label: label_color(label) for label in labels}
    fig, axes = plt.subplots(2, 3, figsize=(3.9 * 3 + 2.4, 6.8), squeeze=False, sharey=True)
    err_of = lambda e: e["std"] if stat == "mean_grad" else None  # noqa: E731
    for row, stack in enumerate(("encoder", "decoder")):
        for col, w in enumerate(("fc1", "fc2")):
            ax = axes[row][col]
            for label, stacks in per_layer.items():
                e = stacks[stack][w]
                ax.errorbar(range(1, len(e[key]) + 1), e[key], yerr=err_of(e), marker="o", ms=3, capsize=2,
                            color=color[label], label=label)
            ax.set_xlabel("layer", fontsize=FONT)
            integer_ticks(ax.xaxis)
            ax.set_title(f"({'ab'[col]}) {'W1' if w == 'fc1' else 'W2'} of FFN per layer, {stack}", fontsize=FONT)
        ax = axes[row][2]
        depths = sorted({d for stacks in last.values() for d in stacks[stack]["depths"]})
        for label, stacks in last.items():
            e = stacks[stack]
            ax.errorbar(e["depths"], e[key], yerr=err_of(e), marker="s", ms=3, capsize=2, color=color[label],
                        label=label)
        if stat == "mean_grad" and any(label.lower().startswith("post") for label in last):
            ax.axhline(result["paper"]["post_ln_last_w2"], ls="--", lw=0.8, color="gray")
            ax.annotate(" Post-LN in the paper, ~1.6", (0, result["paper"]["post_ln_last_w2"]),
                        xycoords=("axes fraction", "data"), fontsize=FONT, va="bottom", color="0.35")
        ax.set_xticks(depths, [f"{d}-{d}" for d in depths], fontsize=FONT)
        ax.set_xlabel("layers (encoder-decoder)", fontsize=FONT)
        ax.set_title(f"(c) last layer's W2 against depth, {stack}", fontsize=FONT)
        axes[row][0].set_ylabel("gradient norm (Frobenius, log scale)", fontsize=FONT)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for ax in axes.flat:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))  # 0.02, not 2 x 10^-2
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(labelsize=FONT)
        ax.grid(alpha=0.3, which="major")
    s = result["settings"]
    bars = "; bars: std over seeds" if stat == "mean_grad" else ""
    fig.suptitle(
        f"Gradient norm at initialization ({what}); {s['seeds']} seeds, K={s['batches']} batches of "
        f"<= {s['tokens']} tokens, per architecture{bars}.\nRows: encoder / decoder (the paper "
        f"does not say which stack its layers are). Data: {s['data_desc']}", fontsize=FONT)
    fig.subplots_adjust(left=0.07, bottom=0.09, top=0.85, wspace=0.12, hspace=0.45)
    legend_right(fig, axes.flat, 1 - 2.4 / fig.get_figwidth())
    return fig


def plot_lemma2(result, out):
    if not result["lemma2"]:
        return None
    fig = lemma2_figure(result)
    path = write_figure(fig, Path(out) / "lemma2.png", dpi=80)
    _plt().close(fig)
    return path


def lemma2_figure(result):
    """The matplotlib figure :func:`plot_lemma2` writes."""
    plt = _plt()
    labels = list(result["lemma2"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), squeeze=False)
    for col, stack in enumerate(("encoder", "decoder")):
        ax = axes[0][col]
        for label in labels:
            e = result["lemma2"][label][stack]
            c = label_color(label)
            if "stream" in e:
                st = e["stream"]
                ax.plot(st["layers_applied"], st["mean"], "o-", ms=3, color=c, label=f"{label}: x_l (stream)")
                ax.fill_between(st["layers_applied"], st["lemma_lower"], st["lemma_upper"], color=c, alpha=0.12,
                                label=f"{label}: Lemma 2 bounds")
            else:
                pts = e["points"]
                xs = [p["layer"] + (0.5 if p["ln"] != "self_attn_ln" else 0.0) + (0.25 if p["ln"] ==
                      "encoder_attn_ln" else 0.0) for p in pts if p["layer"] is not None]
                ys = [p["mean"] for p in pts if p["layer"] is not None]
                ax.plot([x + 1 for x in xs], ys, "s-", ms=3, color=c, label=f"{label}: LN inputs")
                ax.axhline(1.5, ls="--", lw=0.8, color=c)
        ax.set_xlabel("layers applied", fontsize=FONT)
        ax.set_ylabel("E ||x||^2 / d (per coordinate)", fontsize=FONT)
        integer_ticks(ax.xaxis)
        ax.set_title(f"{stack}, depth {result['lemma2'][labels[0]][stack]['depth']}", fontsize=FONT)
    fig.suptitle("Lemma 2: size of the LayerNorm inputs at initialization, per architecture (eval mode)",
                 fontsize=FONT)
    fig.subplots_adjust(left=0.07, bottom=0.14, top=0.86, wspace=0.25)
    legend_right(fig, axes.flat, 0.72)
    return fig


def plot_all(result, out):
    paths = [plot_fig3(result, out, stat) for stat in STATS]
    lemma = plot_lemma2(result, out)
    return paths + ([lemma] if lemma else [])


def main(argv=None):
    def command(argv):
        p = CommandParser(prog="plots", description="Redraw the figures of a fig3.json next to it.")
        p.add_argument("fig3_json")
        src = Path(p.parse_args(argv).fig3_json)
        result = read_json(src, what_to_do="pass a fig3.json written by scripts/init_grad_analysis.sh")
        print("\n".join(str(p) for p in plot_all(result, src.parent)))

    return run_main("plots", command, argv)


if __name__ == "__main__":
    sys.exit(main())
