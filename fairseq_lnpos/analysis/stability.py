"""Stability map from recorded runs: learning rate x warm-up x depth for every architecture.

    scripts/stability_map.sh OUT [--ratio R] [--no-figures]

Reads every run folder ``OUT/NAME/seedS/`` the grid writes (config.json, DONE.json, eval/epochN.json);
a run without DONE.json is "unfinished" and listed, not counted; a file that exists but cannot be read
is an error naming it. Runs of one cell (architecture, depth, warm-up, learning rate) are its seeds.
The map's axes are its only differences: a folder whose runs differ in any other setting (optimizer,
schedule, model size, data, budget, ...) is refused, naming the setting (:func:`check_one_experiment`).
Writes OUT/stability.csv (one row per cell), OUT/stability.md (printed too),
OUT/stability_heatmaps.png (rows: depth, columns: architecture) and OUT/sensitivity_vs_depth.png;
a map of more than one depth also the largest trainable depth (OUT/largest_depth.csv) and
OUT/depth_loss.png (:mod:`.depth`). Gradient-norm ratios and peak memory are shown where the runs
recorded them.

Losses are fairseq's: base 2 (bits), with the training criterion (label smoothing included); the
initial loss is the training loss at the first update, the final loss the last validation loss.
"""
import csv
import io
import math
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..common import write_text
from ..errors import CommandParser, LnposError, StateError, run_main
from ..experiments.rundir import Status, grid_run_dirs
from ..experiments.runs import warmup_label, warmup_updates
from ..variants import DEFAULT_INIT, VARIANTS, arch_names
from . import depth
from .map_common import group, num, pyplot, save

DEFAULT_LAYERS = 6  # "layers" absent or null: the arch's default depth (6 for every size)
# Stable (one rule for learning rates and depths): no seed diverged and the cell's final validation
# loss is at most --ratio times its initial loss (the training loss of the first update). A cell is
# judged by its own runs alone, so noise elsewhere on the map cannot flip it (the earlier rule, 0.1
# bit of the architecture's best cell, gave Post-LN's largest stable lr as 3e-4 on one machine and
# none on another). Measured on the generated corpus (docs/grid.md): runs that stall end at
# 0.68-0.79 of their initial loss, runs that train (also slowly: a small lr, a deep Pre-LN) at
# 0.17-0.49; 0.6 lies between.
DEFAULT_RATIO = 0.6
SENSITIVITY = ("LR sensitivity (Wortsman et al. 2023, \"Small-scale proxies for large-scale Transformer "
               "training instabilities\"): the mean over the learning-rate grid of min(final loss, initial "
               "loss) minus the best final loss on the grid, per architecture, depth and warm-up; a diverged "
               "run's final loss counts as its initial loss; seeds are averaged per learning rate. Lower is "
               "more stable: 0 means every learning rate of the grid reached the best loss.")


@dataclass(frozen=True)
class Record:
    """One run (one seed) as recorded."""
    path: str
    variant: str
    layers: int
    lr: float
    warmup: int          # 0 = none (runs.warmup_updates)
    seed: int
    status: str          # finished | diverged | failed | unfinished (a Status's value; not started: unfinished)
    diverged_at: int = None
    initial_loss: float = None
    final_valid_loss: float = None
    bleu: float = None   # test tok BLEU of the last scored epoch
    settings: tuple = ()  # (name, value) of every other setting of the run (see settings())
    grad_ratio: tuple = None  # (encoder, decoder) first / last layer gradient norm (depth.grad_ratios)
    peak_rss_mb: float = None
    cuda_peak_mb: float = None
    train_seconds: float = None


AXES = "architecture, depth, warm-up, learning rate, seed"
# fields of a recorded run that are the map's axes (ln, layers, warmup, lr) or only name or describe it
NOT_SETTINGS = {"name", "ln", "layers", "warmup", "lr", "figure", "paper_bleu", "paper_valid_loss", "paper_note"}


@dataclass(frozen=True)
class Cell:
    """The seeds of one (variant, layers, warmup, lr) that finished or diverged."""
    variant: str
    layers: int
    warmup: int
    lr: float
    seeds: int
    diverged: int                   # how many of them diverged
    final_valid_loss: float = None  # mean over the seeds that did not diverge
    bleu: float = None              # mean over the seeds that did not diverge and were scored
    stable: bool = False            # see DEFAULT_RATIO
    initial_loss: float = None      # mean over the seeds
    grad_ratio_encoder: float = None  # mean over the seeds (depth.grad_ratios)
    grad_ratio_decoder: float = None
    peak_rss_mb: float = None       # largest over the seeds
    cuda_peak_mb: float = None
    train_seconds: float = None     # mean over the seeds


def settings(cfg):
    """The settings of a recorded config besides the map's axes, as sorted (name, value) pairs: the
    fields of its run, the model size (not the arch name, which names the architecture too) and the
    grid's options that change results (data, fp16, fairseq and generation flags, beam)."""
    run = {k: v for k, v in cfg["run"].items() if k not in NOT_SETTINGS}
    rest = {k: v for k, v in cfg.items() if k not in ("hash", "seed", "run", "arch")}
    variant_size = arch_names().get(cfg["arch"])
    arch = {"model size": variant_size[1]} if variant_size else {"arch": cfg["arch"]}
    return tuple(sorted({**run, **rest, **arch}.items(), key=lambda kv: kv[0]))


def load_record(rd):
    """The map's :class:`Record` of a run folder (:class:`~fairseq_lnpos.experiments.rundir.RunDir`)."""
    rec = rd.record()
    run = rec.run
    key = dict(path=str(rd.path), variant=run["ln"], layers=run["layers"] or DEFAULT_LAYERS, lr=float(run["lr"]),
               warmup=warmup_updates(run["warmup"] or 0), seed=rec.seed, settings=settings(rec.config))
    if key["variant"] not in VARIANTS:
        raise StateError(f"{rd.config_path}: unknown architecture {key['variant']!r} (known: {', '.join(VARIANTS)})")
    if rec.done is None:
        return Record(status="unfinished", **key)
    key.update(grad_ratio=depth.grad_ratios(rd.save_dir, key["layers"]), peak_rss_mb=rec.done.get("peak_rss_mb"),
               cuda_peak_mb=rec.done.get("cuda_peak_mb"), train_seconds=rec.done.get("train_seconds"))
    final, status = rec.final_valid_loss, rec.status.value
    if rec.status is Status.FINISHED and final is not None and not math.isfinite(final):
        status = Status.DIVERGED.value  # a NaN/inf final loss: diverged, though training ran to its end
    return Record(status=status, diverged_at=rec.done.get("diverged_at"), initial_loss=rec.done.get("initial_loss"),
                  final_valid_loss=final, bleu=rec.last("bleu_tok"), **key)


def check_one_experiment(out, records):
    """The map compares runs along its axes only: refuse ``records`` that differ in another setting."""
    first = dict(records[0].settings)
    for r in records[1:]:
        other = dict(r.settings)
        differ = sorted(k for k in first.keys() | other.keys() if first.get(k, "(absent)") != other.get(k, "(absent)"))
        if differ:
            k = differ[0]
            raise LnposError(
                f"{out}: its runs differ in {', '.join(differ)} ({k} {first.get(k, '(absent)')!r} in "
                f"{records[0].path}, {other.get(k, '(absent)')!r} in {r.path}), not only in the map's axes "
                f"({AXES}): map one experiment per folder (a sweep's --out)")


def load_records(out):
    records = [load_record(rd) for rd in grid_run_dirs(out, "the output folder of a sweep (OUT/NAME/seedS/)")]
    check_one_experiment(out, records)
    return records


def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def is_stable(cell, ratio=DEFAULT_RATIO):
    """The map's one rule (DEFAULT_RATIO): no seed diverged and the final validation loss at most
    ``ratio`` times the initial loss (means over the seeds)."""
    if cell.diverged or cell.final_valid_loss is None or cell.initial_loss is None:
        return False
    return cell.final_valid_loss <= ratio * cell.initial_loss


def make_cells(records, ratio=DEFAULT_RATIO):
    """Cells of the runs that finished or diverged, ``stable`` by :func:`is_stable`."""
    counted = [r for r in records if r.status in ("finished", "diverged")]
    cells = []
    for (variant, layers, warmup, lr), runs in group(counted, lambda r: (r.variant, r.layers, r.warmup, r.lr)).items():
        ok = [r for r in runs if r.status == "finished"]
        ratios = [r.grad_ratio for r in runs if r.grad_ratio]
        cells.append(Cell(variant, layers, warmup, lr, len(runs), len(runs) - len(ok),
                          _mean(r.final_valid_loss for r in ok), _mean(r.bleu for r in ok),
                          initial_loss=_mean(r.initial_loss for r in runs),
                          grad_ratio_encoder=_mean(x[0] for x in ratios), grad_ratio_decoder=_mean(x[1] for x in ratios),
                          peak_rss_mb=_max(r.peak_rss_mb for r in runs), cuda_peak_mb=_max(r.cuda_peak_mb for r in runs),
                          train_seconds=_mean(r.train_seconds for r in runs)))
    return [Cell(**{**asdict(c), "stable": is_stable(c, ratio)}) for c in cells]


def _best(cells):
    """The lowest final validation loss of ``cells`` that did not diverge, or None."""
    return min((c.final_valid_loss for c in cells if not c.diverged and c.final_valid_loss is not None), default=None)


def max_stable_lr(cells):
    """{(variant, layers, warmup): the largest stable learning rate, or None}."""
    return {k: max((c.lr for c in g if c.stable), default=None)
            for k, g in group(cells, lambda c: (c.variant, c.layers, c.warmup)).items()}


def best_loss(cells):
    """{(variant, layers, warmup): the lowest final validation loss over the learning rates, or None}."""
    return {k: _best(g) for k, g in group(cells, lambda c: (c.variant, c.layers, c.warmup)).items()}


def lr_sensitivity(records):
    """{(variant, layers, warmup): Wortsman et al.'s LR sensitivity over the learning rates run, or None
    where a run of the group lacks its initial loss}; see SENSITIVITY."""
    counted = [r for r in records if r.status in ("finished", "diverged")]
    result = {}
    for key, runs in group(counted, lambda r: (r.variant, r.layers, r.warmup)).items():
        if any(r.initial_loss is None or (r.status == "finished" and r.final_valid_loss is None) for r in runs):
            result[key] = None
            continue
        final = {id(r): r.initial_loss if r.status == "diverged" else r.final_valid_loss for r in runs}
        by_lr = group(runs, lambda r: r.lr).values()
        clipped = [sum(min(final[id(r)], r.initial_loss) for r in g) / len(g) for g in by_lr]
        best = min(sum(final[id(r)] for r in g) / len(g) for g in by_lr)
        result[key] = sum(clipped) / len(clipped) - best
    return result


# ---------------------------------------------------------------- CSV

def write_csv(cells, path):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["label"] + [f.name for f in fields(Cell)])
    for c in cells:
        w.writerow([VARIANTS[c.variant].label] + ["" if v is None else repr(v) if isinstance(v, float) else str(v) for v in asdict(c).values()])
    return write_text(path, buf.getvalue())


def read_csv(path):
    types = {f.name: float for f in fields(Cell)}
    types.update(variant=str, layers=int, warmup=int, seeds=int, diverged=int, stable=lambda s: s == "True")
    with open(path, encoding="utf-8", newline="") as f:
        return [Cell(**{k: (types[k](v) if v != "" else None) for k, v in row.items() if k in types})
                for row in csv.DictReader(f)]


# ---------------------------------------------------------------- figures

def heatmap(cells, variant, layers):
    """The matrices one heatmap draws: rows warm-up, columns learning rate (both ascending)."""
    sel = {(c.warmup, c.lr): c for c in cells if (c.variant, c.layers) == (variant, layers)}
    warmups, lrs = sorted({w for w, _ in sel}), sorted({lr for _, lr in sel})

    def get(attr, empty):
        return [[getattr(sel[w, lr], attr) if (w, lr) in sel else empty for lr in lrs] for w in warmups]

    loss = [[math.nan if v is None else v for v in row] for row in get("final_valid_loss", None)]
    return {"warmups": warmups, "lrs": lrs, "loss": loss, "bleu": get("bleu", None),
            "diverged": get("diverged", 0), "seeds": get("seeds", 0)}


def plot_heatmaps(cells, path):
    """One panel per (depth, architecture); returns {(variant, layers): heatmap(...)} as drawn."""
    plt = pyplot()
    from matplotlib.patches import Rectangle

    variants = [v for v in VARIANTS if any(c.variant == v for c in cells)]
    depths = sorted({c.layers for c in cells})
    finite = [c.final_valid_loss for c in cells if c.final_valid_loss is not None and not c.diverged]
    vmin, vmax = (min(finite), max(finite)) if finite else (0, 1)
    fig, axes = plt.subplots(len(depths), len(variants), squeeze=False,
                             figsize=(3.6 * len(variants), 3.0 * len(depths)))
    drawn = {}
    for i, layers in enumerate(depths):
        for j, variant in enumerate(variants):
            ax, m = axes[i][j], heatmap(cells, variant, layers)
            drawn[variant, layers] = m
            ax.set_title(f"{VARIANTS[variant].label}, {layers} layers", fontsize=9)
            if not m["lrs"]:
                ax.axis("off")
                continue
            im = ax.imshow(m["loss"], cmap="viridis_r", vmin=vmin, vmax=vmax, aspect="auto")
            for r, w in enumerate(m["warmups"]):
                for k, _ in enumerate(m["lrs"]):
                    n, d, loss, bleu = m["seeds"][r][k], m["diverged"][r][k], m["loss"][r][k], m["bleu"][r][k]
                    text = "" if math.isnan(loss) else f"{loss:.2f}" + (f"\n{bleu:.1f}" if bleu is not None else "")
                    if d:
                        ax.add_patch(Rectangle((k - 0.5, r - 0.5), 1, 1, fill=False, hatch="xx", color="red", lw=0))
                        text = "x" if d == n else f"{text}\nx {d}/{n}"
                    dark = not math.isnan(loss) and (loss - vmin) > 0.6 * (vmax - vmin)  # viridis_r: dark at high loss
                    ax.text(k, r, text, ha="center", va="center", fontsize=6, color="white" if dark else "black")
            ax.set_xticks(range(len(m["lrs"])))
            ax.set_xticklabels([f"{lr:g}" for lr in m["lrs"]], fontsize=7)
            ax.set_yticks(range(len(m["warmups"])))
            ax.set_yticklabels([warmup_label(w) for w in m["warmups"]], fontsize=7)
            ax.set_xlabel("learning rate", fontsize=8)
            ax.set_ylabel("warm-up updates", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046)
    save(fig, path, "Final validation loss (bits, mean over seeds; second line: test tok BLEU where scored); "
                    "x = diverged")
    return drawn


def plot_sensitivity(sens, path):
    """LR sensitivity against depth, one line per architecture, one panel per warm-up; returns
    {warmup: {variant: [(layers, sensitivity), ...]}} as drawn."""
    plt = pyplot()
    warmups = sorted({w for _, _, w in sens})
    fig, axes = plt.subplots(1, len(warmups), squeeze=False, figsize=(4 * len(warmups), 3.2))
    drawn = {}
    for j, w in enumerate(warmups):
        ax = axes[0][j]
        drawn[w] = {v: [(l, s) for (v2, l, w2), s in sorted(sens.items()) if v2 == v and w2 == w and s is not None]
                    for v in VARIANTS}
        drawn[w] = {v: pts for v, pts in drawn[w].items() if pts}
        for v, pts in drawn[w].items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=VARIANTS[v].label)
        ax.set_title(f"warm-up {warmup_label(w)}", fontsize=9)
        ax.set_xticks(sorted({l for pts in drawn[w].values() for l, _ in pts}))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("layers (encoder = decoder)")
        ax.set_ylabel("LR sensitivity (bits)")
        ax.grid(alpha=0.3)
        if drawn[w]:
            ax.legend(fontsize=7)
    save(fig, path)
    return drawn


# ---------------------------------------------------------------- Markdown

def _table(values, fmt):
    """{(variant, layers, warmup): value} as a table: a row per architecture and depth, a column per warm-up."""
    warmups = sorted({w for _, _, w in values})
    lines = ["| architecture | layers | " + " | ".join(f"warm-up {warmup_label(w)}" for w in warmups) + " |",
             "|---|---|" + "---|" * len(warmups)]
    for (v, layers), _ in group(values, lambda k: k[:2]).items():
        row = [fmt(values[v, layers, w]) if (v, layers, w) in values else "" for w in warmups]
        lines.append(f"| {VARIANTS[v].label} | {layers} | " + " | ".join(row) + " |")
    return lines


def _init_of(records):
    """The runs' --lnpos-init (one value: the map refuses runs that differ in it); older runs: the default."""
    return dict(records[0].settings).get("init", DEFAULT_INIT) if records else DEFAULT_INIT


def stable_rule(ratio):
    """The rule of :func:`is_stable` in words, as the map's outputs state it."""
    return (f"Stable: no seed diverged and the final validation loss is at most {ratio:g} x the initial loss "
            f"(the training loss of the first update; means over the seeds; --ratio). A cell is judged by its "
            f"own runs alone. The same rule decides the largest stable learning rate and the largest trainable "
            f"depth.")


def markdown(out, records, cells, ratio):
    counts = {s: sum(r.status == s for r in records) for s in ("finished", "diverged", "failed", "unfinished")}
    lines = [f"# Stability map of {out}", "",
             f"{len(records)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ". Unfinished and "
             "failed runs are not counted. Losses in bits (fairseq's base 2), label smoothing included. "
             f"Initialization: {_init_of(records)} (--lnpos-init).", ""]
    for (variant, layers), _ in group(cells, lambda c: (c.variant, c.layers)).items():
        m = heatmap(cells, variant, layers)
        lines += [f"## {VARIANTS[variant].label}, {layers} layers: final validation loss (mean over seeds)", "",
                  "| warm-up \\ lr | " + " | ".join(f"{lr:g}" for lr in m["lrs"]) + " |",
                  "|---" * (len(m["lrs"]) + 1) + "|"]
        for r, w in enumerate(m["warmups"]):
            row = []
            for k in range(len(m["lrs"])):
                n, d, loss, bleu = m["seeds"][r][k], m["diverged"][r][k], m["loss"][r][k], m["bleu"][r][k]
                text = num(loss) + (f" (BLEU {bleu:.1f})" if bleu is not None else "") if n else ""
                row.append(("x" if d == n else f"{text}, x {d}/{n}") if d else text)
            lines.append(f"| {warmup_label(w)} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["x: diverged (x d/n: d of n seeds diverged; the loss shown is the mean of the others).", ""]
    stable, sens = max_stable_lr(cells), lr_sensitivity(records)
    lines += ["## Largest stable learning rate per warm-up", "",
              stable_rule(ratio) + " '-': no stable learning rate.", ""]
    lines += _table(stable, lambda lr: "-" if lr is None else f"{lr:g}")
    grids = {k: ", ".join(f"{lr:g}" for lr in sorted({c.lr for c in cells if (c.variant, c.layers, c.warmup) == k}))
             for k in sens}
    lines += ["", "## Best final validation loss per warm-up (bits)", "",
              "The lowest final validation loss over the learning-rate grid. Read the LR sensitivity beside it: "
              "sensitivity is measured from each row's own best, so an architecture whose best loss is poor "
              "can score as insensitive.", ""]
    lines += _table(best_loss(cells), num)
    lines += ["", "## LR sensitivity (bits)", "", SENSITIVITY, ""]
    if len(set(grids.values())) == 1:
        lines += [f"Learning-rate grid: {next(iter(grids.values()))}.", ""]
        lines += _table(sens, lambda s: "initial loss not recorded" if s is None else f"{s:.3f}")
    else:
        lines += _table({k: (s, grids[k]) for k, s in sens.items()},
                        lambda v: ("initial loss not recorded" if v[0] is None else f"{v[0]:.3f}") + f" (lr {v[1]})")
    lines += depth.markdown(cells)
    left = [r for r in records if r.status in ("failed", "unfinished")]
    if left:
        lines += ["", "## Not counted", ""] + [f"- {r.status}: {r.path}" for r in left]
    return "\n".join(lines) + "\n"


def _main(argv):
    p = CommandParser(prog="stability_map.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the output folder of a sweep (OUT/NAME/seedS/ run folders)")
    p.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                   help="stable: the final validation loss at most this times the initial loss (default: %(default)s)")
    p.add_argument("--no-figures", action="store_true", help="write the CSV and Markdown only")
    args = p.parse_args(argv)
    if not 0 < args.ratio < 1:
        raise LnposError(f"--ratio {args.ratio}: give a fraction between 0 and 1 (the final loss over the initial loss)")
    out = Path(args.out)
    records = load_records(out)
    cells = make_cells(records, args.ratio)
    write_csv(cells, out / "stability.csv")
    deep = depth.along_depth(cells)
    if deep:
        depth.write_csv(cells, out / "largest_depth.csv")
    md = markdown(out, records, cells, args.ratio)
    write_text(out / "stability.md", md)
    if cells and not args.no_figures:
        plot_heatmaps(cells, out / "stability_heatmaps.png")
        sens = lr_sensitivity(records)
        if sens:
            plot_sensitivity(sens, out / "sensitivity_vs_depth.png")
        if deep:
            depth.plot(cells, out / "depth_loss.png")
    print(md, end="")
    return 0


def main(argv=None):
    return run_main("stability_map.sh", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
