"""Stability sweeps: a base run expanded over architectures x learning rates x warm-ups x depths.

    scripts/grid.sh sweep --archs postln,preln,deepnorm,keel --lr 1e-4,3e-4,1e-3,3e-3,1e-2 \\
        --warmup 1,100,1000 --layers 6 --seeds 1 --max-update 300 --out sweep-out --jobs 2
    scripts/stability_map.sh sweep-out

Every cell is a run of the grid (resume, runs side by side, scoring as everywhere), named
``sweep-<arch>-L<layers>-lr<lr>-wu<warm-up>`` (warm-up 1 = the paper's T_warmup = 1, no warm-up).
The budget is counted in updates (``--max-update``), so that cells are comparable. Adam, betas
(0.9, 0.98); after the warm-up the learning rate stays constant (the demo's schedule), so a cell
measures the learning rate it names. A run whose training loss stays above its first loss for
``--patience`` logged updates, or turns non-finite, stops early and is recorded as diverged.

Presets: the default is the laptop map (the `_tiny` archs on the generated corpus, validation loss
only); ``--real`` is the paper's IWSLT model on Multi30k (data-prep/prepare-multi30k.sh) for one GPU.
"""
import math
from dataclasses import replace

from ..errors import LnposError
from ..variants import VARIANTS
from . import runs as R

PRESETS = {
    # the demo's corpus and batches: ~100 updates an epoch
    "laptop": dict(dataset="synthetic", arch_size="tiny"),
    "real": dict(dataset="multi30k", arch_size="paper"),
}


def _list(text, kind, name):
    try:
        values = [kind(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise LnposError(f"--{name} {text}: give a comma-separated list of numbers") from None
    if not values:
        raise LnposError(f"--{name} is empty")
    if len(set(values)) != len(values):
        raise LnposError(f"--{name} {text}: a value is listed twice")
    return values


def parse_axes(archs, lrs, warmups, layers):
    """The axes from their command-line strings, range-checked."""
    arch_list = [a.strip() for a in str(archs).split(",") if a.strip()]
    unknown = [a for a in arch_list if a not in VARIANTS]
    if unknown or not arch_list:
        raise LnposError(f"--archs {archs}: give variants from {', '.join(VARIANTS)}")
    lr_list = _list(lrs, float, "lr")
    if any(not (math.isfinite(lr) and lr > 0) for lr in lr_list):
        raise LnposError(f"--lr {lrs}: learning rates must be positive finite numbers")
    warm_list, layer_list = _list(warmups, int, "warmup"), _list(layers, int, "layers")
    if any(w < 1 for w in warm_list):
        raise LnposError(f"--warmup {warmups}: give warm-up lengths of at least 1 (1 = none)")
    if any(n < 1 for n in layer_list):
        raise LnposError(f"--layers {layers}: depths must be at least 1")
    return arch_list, lr_list, warm_list, layer_list


def cell_name(ln, layers, lr, warmup):
    return f"sweep-{ln}-L{layers}-lr{lr:g}-wu{warmup}"


def expand(archs, lrs, warmups, layers, max_update, dataset="synthetic"):
    """One Run per cell, in a fixed order (arch, depth, warm-up, learning rate); names are unique."""
    if max_update < 1:
        raise LnposError(f"--max-update {max_update}: give the budget in updates, at least 1")
    base = R.Run(name="", dataset=dataset, ln="postln", optimizer="adam", lr=1.0, decay_anchor=10 ** 9,
                 max_epoch=10 ** 6, max_update=max_update, figure="sweep", paper_note="stability sweep")
    runs = [replace(base, name=cell_name(ln, n, lr, w), ln=ln, lr=lr, warmup=w if w > 1 else 0, layers=n)
            .with_defaults()
            for ln in archs for n in layers for w in warmups for lr in lrs]
    names = {}
    for r in runs:
        if r.name in names:
            raise LnposError(f"--lr {names[r.name]!r} and {r.lr!r} give cells the same name {r.name}: give "
                             f"learning rates that differ in their first 6 significant digits")
        names[r.name] = r.lr
    return runs
