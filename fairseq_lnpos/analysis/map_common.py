"""What the map reports share (stability.py, depth.py, map_figures.py, report.py): the registry's order,
a cell's words, Markdown tables and the figures' setup."""
import math

from ..common import FONT, legend_right, write_figure
from ..variants import VARIANTS

RANK = {v: i for i, v in enumerate(VARIANTS)}  # architectures in the registry's order (Post-LN, Pre-LN, ...)


def ordered(df, *by):
    """``df`` sorted by the columns ``by``, ``variant`` in the registry's order."""
    return df.sort_values(list(by), key=lambda s: s.map(RANK) if s.name == "variant" else s, kind="stable")


def label(variant):
    return VARIANTS[variant].label


def missing(v):
    """None or NaN: a number a cell or run does not have."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def num(v, fmt=".3f"):
    return "–" if missing(v) else format(v, fmt)


def nll_text(c, fmt=".2f"):
    """A cell's mean NLL and, from two finished seeds on, ``[min to max]``."""
    return num(c.nll, fmt) + (f" [{c.nll_min:.2f} to {c.nll_max:.2f}]" if c.finished > 1 and not missing(c.nll) else "")


def lost(c, sep=", "):
    """``, x d/n, s k/n``: the seeds of a cell that diverged (x) or were stopped early (s), each after ``sep``."""
    return "".join(f"{sep}{mark} {k}/{c.seeds}" for mark, k in (("x", c.diverged), ("s", c.stopped)) if k)


def all_lost(c):
    """A cell none of whose seeds finished: ``x`` (every seed diverged), ``s`` (every one stopped early), else
    ``x d/n, s k/n``."""
    return "x" if c.diverged == c.seeds else "s" if c.stopped == c.seeds else lost(c)[2:]


def markdown_table(df):
    """``df`` as Markdown lines, its columns the header, every cell as text ('|' written '/'). Unlike
    DataFrame.to_markdown, columns are not padded: a line of a table can be found by its text."""
    return (["| " + " | ".join(map(str, df.columns)) + " |", "|---" * len(df.columns) + "|"]
            + ["| " + " | ".join("" if missing(v) else str(v).replace("|", "/") for v in row) + " |"
               for row in df.itertuples(index=False)])


def pivot(df, index, columns, values, corner, col_fmt=str):
    """Markdown lines of ``df[values]`` with a row per ``index`` (first-seen order) headed ``corner``, and
    a column per ``columns`` (sorted, named by ``col_fmt``); '' where there is none."""
    t = df.pivot(index=index, columns=columns, values=values).reindex(df[index].unique())
    t = t.reindex(columns=sorted(t.columns))
    return markdown_table(t.rename(columns=col_fmt).rename_axis(corner).reset_index())


def pyplot():
    import logging

    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's import turns DEBUG on
    import matplotlib.pyplot as plt

    return plt


def panels(n, width, height, **kw):
    """A figure of ``n`` panels side by side, ``width`` inches each and 2 more for the legend."""
    return pyplot().subplots(1, n, squeeze=False, figsize=(width * n + 2, height), **kw)


def axis(ax, title, xlabel, log_ticks=None, base=10):
    """A panel's title, x label and grid; with ``log_ticks`` a log x axis (``base``) marked at those values."""
    if log_ticks is not None:
        ax.set_xscale("log", base=base)
        ax.set_xticks(log_ticks)
        ax.set_xticklabels([f"{t:g}" for t in log_ticks], fontsize=FONT)
        ax.minorticks_off()
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_title(title, fontsize=FONT)
    ax.grid(alpha=0.3)


def save(fig, path, title=None, legend_from=None):
    """``path``, where a figure of the map is written (dpi 90, :func:`~fairseq_lnpos.common.write_figure`) titled,
    laid out and closed; with ``legend_from`` (axes) the legend of its lines right of all axes, in 2 inches."""
    if title:
        fig.suptitle(title, fontsize=FONT)
    right = 1 - 2.0 / fig.get_figwidth() if legend_from is not None else 1
    fig.tight_layout(rect=(0, 0, right, 1))
    if legend_from is not None:
        legend_right(fig, legend_from, right)
    path = write_figure(fig, path, dpi=90)
    pyplot().close(fig)
    return path
