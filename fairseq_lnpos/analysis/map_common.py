"""What the stability map (stability.py) and its depth sections (depth.py) share: the order of
architectures, number formatting and the figures' setup."""
import math

from ..common import FONT, legend_right, write_figure
from ..variants import VARIANTS


def rank(key):
    """Sort key: architectures in the registry's order (Post-LN, Pre-LN, DeepNorm, Keel), then the rest."""
    return (list(VARIANTS).index(key[0]),) + key[1:] if isinstance(key, tuple) else key


def group(items, key):
    groups = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return dict(sorted(groups.items(), key=lambda kv: rank(kv[0])))


def num(v, fmt=".3f"):
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def pyplot():
    import logging

    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's import turns DEBUG on
    import matplotlib.pyplot as plt

    return plt


LEGEND_INCHES = 2.0  # the width a legend right of the axes takes


def save(fig, path, title=None, legend_from=None):
    """Title, lay out, write (dpi 90, :func:`~fairseq_lnpos.common.write_figure`) and close a figure of
    the map; with ``legend_from`` (axes) the legend of its lines right of all axes."""
    if title:
        fig.suptitle(title, fontsize=FONT)
    right = 1 - LEGEND_INCHES / fig.get_figwidth() if legend_from is not None else 1
    fig.tight_layout(rect=(0, 0, right, 1))
    if legend_from is not None:
        legend_right(fig, legend_from, right)
    write_figure(fig, path, dpi=90)
    pyplot().close(fig)
