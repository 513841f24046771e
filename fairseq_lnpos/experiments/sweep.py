"""Sweeps: a base run expanded over architectures x learning rates x warm-ups x depths.

    scripts/grid.sh sweep --archs postln,preln,deepnorm,keel --lr 3e-4,1e-3,3e-3,1e-2 \\
        --warmup 1,100 --layers 6 --seeds 1,2,3 --max-update 200 --out sweep-out --jobs 2
    scripts/grid.sh sweep --depth-map --jobs 2 --out depth-out     # the depth map's defaults (DEPTH_MAP)
    scripts/grid.sh sweep --all-archs --jobs 2 --out all-out       # every architecture (ALL_MAP)
    scripts/stability_map.sh sweep-out

Every cell is a run of the grid (resume, runs side by side, scoring as everywhere), named
``sweep-<arch>-L<layers>-lr<lr>-wu<warm-up>`` (warm-up 1 = the paper's T_warmup = 1, no warm-up).
The budget is counted in updates (``--max-update``), so that cells are comparable. Adam, betas
(0.9, 0.98); after the warm-up the learning rate stays constant (the demo's schedule), so a cell
measures the learning rate it names. A run whose training loss stays above its first loss for
``--patience`` logged updates, or turns non-finite, stops early and is recorded as diverged; one
whose training loss has stalled well above what a run that trains reaches is stopped early and
recorded as such (:mod:`.early_stop`; not with ``--real``, where it stopped runs that went on to
train; ``--no-early-stop`` runs every cell to its budget, ``--early-stop`` asks for it; off, and said so,
for a budget under the 200 updates the rule was chosen on). A run stopped early is final: a sweep run
again with ``--no-early-stop`` over a folder that holds one is refused, naming the folders to move away
(their cells then train to the budget). The CPU
presets run 3 seeds per cell, so that the map reports a spread and a verdict that noise does not flip.

Presets: the default is the laptop map (the `_tiny` archs on the generated corpus, validation loss
only); ``--real`` is the paper's IWSLT model on Multi30k (data-prep/prepare-multi30k.sh) for one GPU.
``--depth-map`` changes the defaults of the axes, the budget and the width to the depth map's
(:data:`DEPTH_MAP`, with ``--real`` :data:`DEPTH_MAP_REAL`) and logs per-layer gradient norms;
``--all-archs`` to the map of every architecture's (:data:`ALL_MAP`, CPU only); options given on the
command line win.
"""
import logging
import math
from dataclasses import replace
from pathlib import Path

from ..cli import comma_list
from ..errors import LnposError
from ..variants import GROUPS, TINY, VARIANTS
from . import runs as R
from .early_stop import DEFAULT_RULE
from .records import Outcome
from .rundir import RunDir

LOG = logging.getLogger(__name__)

PRESETS = {
    # the demo's corpus and batches: ~100 updates an epoch
    "laptop": dict(dataset="synthetic", arch_size="tiny"),
    "real": dict(dataset="multi30k", arch_size="paper"),
}
# the defaults of the axes, the seeds and the budget: the stability map (learning rate x warm-up at
# depth 6; 4 x 4 x 2 cells x 3 seeds = 96 runs, 1.6 x the 60 one-seed runs of the earlier 5 x 3 grid) ...
STABILITY_MAP = dict(archs=",".join(GROUPS["stability_map"]), lr="3e-4,1e-3,3e-3,1e-2", warmup="1,100",
                     layers="6", max_update=200, width=None, seeds="1,2,3")
# ... and the depth map (no warm-up, depth 6 to 48 at a small width; 6 x 4 cells x 3 seeds = 72 runs,
# 1.5 x the 48 one-seed runs of the earlier two learning rates); `git show 36640e8:docs/results.md` shows the timed
# runs these were chosen from
DEPTH_MAP = dict(archs=",".join(GROUPS["depth_map"]), lr="1e-3", warmup="1",
                 layers="6,12,24,48", max_update=300, width=64, seeds="1,2,3")
# one GPU: the paper's IWSLT model (d 512) on Multi30k (~115 updates an epoch), fp16, one seed
DEPTH_MAP_REAL = dict(DEPTH_MAP, lr="5e-4,1e-3", layers="6,18,36,60,100", max_update=600, width=None, seeds="1")
# ... and the map of every architecture (every variant x 3 x 2 cells x 3 seeds; 342 runs for 19 variants)
# at width 96, where the 200 updates cost about two thirds of the tiny size's (d 128) and leave its
# contrasts; `git show 36640e8:docs/results.md` has the timed cells this was chosen from
ALL_MAP = dict(STABILITY_MAP, archs=",".join(VARIANTS), lr="3e-4,1e-3,3e-3", width=96)
# what the depth map measures beside the loss: per-layer gradient norms (<save-dir>/grad_norms.jsonl)
GRAD_NORMS = dict(task="translation_lnpos", extra=("--log-grad-norms",))
HEADS = TINY["attention_heads"]  # the tiny and the IWSLT size both have 4 heads
# what the cells of a sweep differ in, and their budget: the field of the run table, the sweep's own
# option and the fairseq-train flags that would set it
AXES = {"ln": ("--archs", ("--arch", "-a")), "lr": ("--lr", ("--lr",)), "warmup": ("--warmup", ("--warmup-updates",)),
        "layers": ("--layers", ("--encoder-layers", "--decoder-layers")),
        "max_update": ("--max-update", ("--max-update",))}


def parse_axes(archs, lrs, warmups, layers):
    """The axes from their command-line strings, range-checked."""
    variant_list = comma_list(archs, "--archs", choices=VARIANTS, what="a variant")
    lr_list = comma_list(lrs, "--lr", float)
    if any(not (math.isfinite(lr) and lr > 0) for lr in lr_list):
        raise LnposError(f"--lr {lrs}: learning rates must be positive finite numbers")
    warm_list, layer_list = comma_list(warmups, "--warmup", int), comma_list(layers, "--layers", int)
    if any(w < 1 for w in warm_list):
        raise LnposError(f"--warmup {warmups}: give warm-up lengths of at least 1 (1 = none)")
    if any(n < 1 for n in layer_list):
        raise LnposError(f"--layers {layers}: depths must be at least 1")
    return variant_list, lr_list, warm_list, layer_list


def cell_name(variant, layers, lr, warmup):
    return f"sweep-{variant}-L{layers}-lr{lr:g}-wu{warmup}"


def width_args(width):
    """fairseq flags for model width ``width``: embeddings d, FFN 4d (the tiny size's ratio)."""
    if width is None:
        return ()
    if width < HEADS or width % HEADS:
        raise LnposError(f"--width {width}: give a multiple of {HEADS} (the attention heads)")
    return tuple(a for side in ("encoder", "decoder")
                 for a in (f"--{side}-embed-dim", str(width), f"--{side}-ffn-embed-dim", str(4 * width)))


def expand(variants, lrs, warmups, layers, max_update, dataset="synthetic", task="translation", extra=()):
    """One Run per cell, in a fixed order (variant, depth, warm-up, learning rate); names are unique.
    ``task`` and ``extra`` (fairseq-train flags) are the same for every cell."""
    if max_update < 1:
        raise LnposError(f"--max-update {max_update}: give the budget in updates, at least 1")
    base = R.Run(name="", dataset=dataset, ln="postln", optimizer="adam", lr=1.0, decay_anchor=10 ** 9,
                 max_epoch=10 ** 6, max_update=max_update, figure="sweep", paper_note="stability sweep",
                 task=task, extra=tuple(extra))
    runs = [replace(base, name=cell_name(v, n, lr, w), ln=v, lr=lr, warmup=R.warmup_updates(w), layers=n)
            .with_defaults()
            for v in variants for n in layers for w in warmups for lr in lrs]
    names = {}
    for r in runs:
        if r.name in names:
            raise LnposError(f"--lr {names[r.name]!r} and {r.lr!r} give cells the same name {r.name}: give "
                             f"learning rates that differ in their first 6 significant digits")
        names[r.name] = r.lr
    return runs


def sweep_runs(opts):
    """The cells that ``opts`` (options.SweepOptions, its preset filled in) ask for."""
    preset = PRESETS["real" if opts.real else "laptop"]
    extra = width_args(opts.width) + (("--checkpoint-activations",) if opts.checkpoint_activations else ())
    logging = GRAD_NORMS if opts.depth_map else dict(task="translation", extra=())
    axes = parse_axes(opts.archs, opts.lr, opts.warmup, opts.layers)
    runs = expand(*axes, max_update=opts.max_update, dataset=preset["dataset"], task=logging["task"],
                  extra=logging["extra"] + extra)
    if opts.early_stop:
        off = DEFAULT_RULE.off_reason(opts.max_update)
        if off:
            LOG.warning("grid: note: %s", off)
    else:
        refuse_stopped(opts.out, runs)
    return runs


def stopped_runs(out, runs):
    """The run folders of ``runs`` in ``out`` (any seed) whose recorded outcome is 'stopped early'."""
    return [rd.path for r in runs for rd in map(RunDir, sorted(Path(out).glob(f"{r.name}/seed*")))
            if rd.path.is_dir() and rd.outcome() is Outcome.STOPPED]


def refuse_stopped(out, runs):
    """``--no-early-stop`` over a folder that holds runs stopped early: such a run is final (never redone),
    so its cell would keep the stop while the command asks for every run to reach its budget; refused,
    naming the folders to move away."""
    stopped = stopped_runs(out, runs)
    if stopped:
        named = " ".join(str(p) for p in stopped[:3]) + (" ..." if len(stopped) > 3 else "")
        raise LnposError(f"--no-early-stop: {len(stopped)} run(s) in {out} were stopped early and a stopped run "
                         f"is never redone ({named}): move those folders away (or give another --out) and run "
                         f"again to train them to the budget")
