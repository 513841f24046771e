"""What the map reports share (stability.py, depth.py, map_figures.py, report.py): the registry's order,
a cell's words, Markdown tables and the figures' setup."""
import math
from functools import lru_cache

from ..common import FONT, legend_right, write_figure
from ..variants import VARIANTS

RANK = {v: i for i, v in enumerate(VARIANTS)}  # architectures in the registry's order (Post-LN, Pre-LN, ...)


def ordered(df, *by):
    """``df`` sorted by the columns ``by``, ``variant`` in the registry's order."""
    return df.sort_values(list(by), key=lambda s: s.map(RANK) if s.name == "variant" else s, kind="stable")


def label(variant):
    return VARIANTS[variant].label


# beyond the 20 colours of COLOR_MAP (the first 20 variants), the 40 of these maps, then hues spread by the
# golden ratio: every index has a colour of its own, whatever the number of variants
MORE_COLOR_MAPS = ("tab20b", "tab20c")
# Figures draw a variant in one colour everywhere (:func:`variant_color`): its place in the registry picks it
# from matplotlib's 20-colour qualitative map, the ten dark colours first, then the ten light ones, and
# beyond those :func:`color`'s further colours; a curve that is no variant (a trained checkpoint) is black.
COLOR_MAP = "tab20"
OTHER_COLOR = "#000000"


@lru_cache(maxsize=None)
def color(i):
    """The colour (``#rrggbb``) of the ``i``-th variant of the registry: for i < 20 the one
    :func:`variant_color` gives (the dark colours of tab20, then the light ones);
    then the colours of :data:`MORE_COLOR_MAPS`, in the same order; then hues spread by the golden ratio at
    two lightnesses, none of them equal to an earlier one."""
    from colorsys import hls_to_rgb

    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    if i < 20:
        return to_hex(colormaps[COLOR_MAP](2 * i % 20 + i // 10 % 2))
    k = i - 20
    if k < 20 * len(MORE_COLOR_MAPS):
        # tab20b/c: 5 hues x 4 shades; the darkest shade of each hue first, then the next shade
        return to_hex(colormaps[MORE_COLOR_MAPS[k // 20]](4 * (k % 20 % 5) + k % 20 // 5))
    k -= 20 * len(MORE_COLOR_MAPS)
    taken = {color(j) for j in range(20 + 20 * len(MORE_COLOR_MAPS))}
    n = 0
    while True:  # a golden-ratio hue at an alternating lightness; skipped where it rounds to a colour taken
        c = to_hex(hls_to_rgb((0.618033988749895 * n) % 1.0, 0.35 + 0.2 * (n % 2), 0.75))
        n += 1
        if c in taken:
            continue
        if k == 0:
            return c
        taken.add(c)
        k -= 1


def variant_color(variant):
    """The colour figures draw ``variant`` (a key of :data:`VARIANTS`) in: :func:`color` of its place in the
    registry, one of its own for any number of variants."""
    return color(list(VARIANTS).index(variant))


def label_color(label):
    """The colour of the variant that figures name ``label`` (``"Post-LN"``); :data:`OTHER_COLOR`
    (black) for a label that is no variant's."""
    variant = next((v for v, spec in VARIANTS.items() if spec.label == label), None)
    return OTHER_COLOR if variant is None else variant_color(variant)


def missing(v):
    """None or NaN: a number a cell or run does not have."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def num(v, fmt=".3f"):
    return "–" if missing(v) else format(v, fmt)


def nll_text(c, fmt=".2f"):
    """A cell's mean NLL and, from two finished seeds on, ``[min to max]``."""
    return num(c.nll, fmt) + (f" [{c.nll_min:.2f} to {c.nll_max:.2f}]" if c.finished > 1 and not missing(c.nll) else "")


# a cell's verdict in a letter (:func:`.stability.compare`): its word against its first reference, or what it is
WORD_MARK = {"worse": "W", "better": "B", "equivalent": "E", "inconclusive": "?", "not compared": "·",
             "reference": "R", "no-train": "-", "diverged": "x", "stopped": "s"}


def outcome_mark(c):
    """A cell in short: k/n seeds that train and its verdict's letter (:data:`WORD_MARK`)."""
    return f"{c.seeds_train}/{c.seeds} {WORD_MARK.get(c.verdict, '')}".rstrip()


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


def wrap(text, width_in, fontsize=FONT):
    """``text`` with each of its lines broken at spaces to fit ``width_in`` inches at ``fontsize`` points (a
    character of DejaVu Sans is at most about 0.6 of the font size wide), so that a title is never clipped."""
    import textwrap

    chars = max(20, int(width_in * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) if line else line for line in text.split("\n"))


def save(fig, path, title=None, legend_from=None):
    """``path``, where a figure of the map is written (dpi 90, :func:`~fairseq_lnpos.common.write_figure`) titled
    (each line of the title wrapped to the figure's width, :func:`wrap`, the figure taller by its lines), laid
    out and closed; with ``legend_from``
    (axes) the legend of its lines right of all axes, in 2 inches."""
    if title:
        # the figure grows by the wrapped title's lines (tight_layout makes room for a suptitle), so that the
        # axes keep the room they were given
        text = wrap(title, fig.get_figwidth())
        width, height = fig.get_size_inches()
        fig.set_size_inches(width, height + (text.count("\n") + 1) * FONT * 1.35 / 72)
        fig.suptitle(text, fontsize=FONT)
    right = 1 - 2.0 / fig.get_figwidth() if legend_from is not None else 1
    fig.tight_layout(rect=(0, 0, right, 1))
    if legend_from is not None:
        legend_right(fig, legend_from, right)
    path = write_figure(fig, path, dpi=90)
    pyplot().close(fig)
    return path
