"""Stability map from recorded runs: learning rate x warm-up x depth for every architecture.

    scripts/stability_map.sh OUT [--ratio R] [--near F] [--noise-k K] [--no-figures]

Reads every run folder ``OUT/NAME/seedS/`` the grid writes (config.json, DONE.json, eval/epochN.json);
a run without DONE.json is "unfinished" and listed, not counted; a file that exists but cannot be read
is an error naming it. Runs of one cell (architecture, depth, warm-up, learning rate) are its seeds.
The map's axes are its only differences: a folder whose runs differ in any other setting (optimizer,
schedule, model size, data, budget, ...) is refused, naming the setting (:func:`check_one_experiment`).
Every cell reports its seeds: n, the mean, min-max and a 95 % interval (:mod:`.seeds`), and two
verdicts (:mod:`.verdict`): "trains" (the final loss a fraction of the initial loss) and "good"
(trains, and near the best cell of its architecture and depth, within a margin set from the measured
seed noise), the headline. Seeds that disagree on the verdict are marked.
Writes OUT/stability.csv (one row per cell), OUT/stability.md (printed too),
OUT/stability_heatmaps.png (rows: depth, columns: architecture), OUT/stability_overview.png (every
architecture in one heatmap per depth), OUT/loss_vs_lr.png (error bars: the seeds' min-max) and
OUT/sensitivity_vs_depth.png;
a map of more than one depth also the largest good depth (OUT/largest_depth.csv) and
OUT/depth_loss.png (:mod:`.depth`). Gradient-norm ratios and peak memory are shown where the runs
recorded them.

Losses are fairseq's: base 2 (bits), with the training criterion (label smoothing included); the
initial loss is the training loss at the first update, the final loss the last validation loss.
"""
import csv
import io
import math
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..common import write_text
from ..errors import CommandParser, LnposError, StateError, fraction, run_main
from ..experiments.records import Outcome
from ..experiments.rundir import grid_run_dirs
from ..experiments.runs import warmup_label, warmup_updates
from ..variants import DEFAULT_INIT, VARIANTS, arch_names
from . import depth
from .map_common import group, num
from .map_figures import (VERDICT_MARK, cell_mark, heatmap, loss_curves, overview,  # noqa: F401  (S.plot_* in tests)
                          bleu_points, plot_bleu, plot_heatmaps, plot_loss_vs_lr, plot_overview, plot_sensitivity)
from .seeds import ESTIMATOR, pooled_sd, spread
from .verdict import (AGAINST, DEFAULT_NEAR, DEFAULT_NOISE_K, DEFAULT_RATIO, Rules, auto_against, seeds_disagree,
                      threshold, trains)

DEFAULT_LAYERS = 6  # "layers" absent or null: the arch's default depth (6 for every size)
SENSITIVITY = ("LR sensitivity (Wortsman et al. 2023, \"Small-scale proxies for large-scale Transformer "
               "training instabilities\"): the mean over the learning-rate grid of min(final loss, initial "
               "loss) minus the best final loss on the grid, per architecture, depth and warm-up; a diverged "
               "run's final loss counts as its initial loss, a run stopped early's as its last validation loss; "
               "seeds are averaged per learning rate. Lower is more stable: 0 means every learning rate of the grid reached the best loss.")


@dataclass(frozen=True)
class Record:
    """One run (one seed) as recorded."""
    path: str
    variant: str
    layers: int
    lr: float
    warmup: int          # 0 = none (runs.warmup_updates)
    seed: int
    outcome: str         # finished | diverged | stopped early | failed | unfinished (an Outcome's value; not
    #                      started: unfinished)
    diverged_at: int = None
    stopped_at: int = None   # stopped early at this update (experiments/early_stop.py)
    initial_loss: float = None
    final_valid_loss: float = None
    bleu: float = None   # test tok BLEU of the last scored epoch
    settings: tuple = ()  # (name, value) of every other setting of the run (see settings())
    grad_ratio: tuple = None  # (encoder, decoder) first / last layer gradient norm (depth.grad_ratios)
    peak_rss_mb: float = None
    cuda_peak_mb: float = None
    train_seconds: float = None
    train_cpu_seconds: float = None  # fairseq-train's CPU time (absent in runs of older grids)


AXES = "architecture, depth, warm-up, learning rate, seed"
# fields of a recorded run that are the map's axes (ln, layers, warmup, lr) or only name or describe it
NOT_SETTINGS = {"name", "ln", "layers", "warmup", "lr", "figure", "paper_bleu", "paper_valid_loss", "paper_note"}


COUNTED = ("finished", "diverged", "stopped early")  # outcomes a cell counts; failed and unfinished are listed


@dataclass(frozen=True)
class Cell:
    """The seeds of one (variant, layers, warmup, lr) that finished, diverged or were stopped early."""
    variant: str
    layers: int
    warmup: int
    lr: float
    seeds: int
    diverged: int                   # how many of them diverged
    final_valid_loss: float = None  # mean over the seeds that finished
    bleu: float = None              # mean over the seeds that finished and were scored
    trains: bool = False            # verdict.trains
    initial_loss: float = None      # mean over the seeds
    grad_ratio_encoder: float = None  # mean over the seeds (depth.grad_ratios)
    grad_ratio_decoder: float = None
    peak_rss_mb: float = None       # largest over the seeds
    cuda_peak_mb: float = None
    train_seconds: float = None     # mean over the seeds
    stopped: int = 0                # how many seeds were stopped early
    loss_min: float = None          # the finished seeds' final losses (seeds.Spread)
    loss_max: float = None
    loss_sd: float = None
    loss_ci_low: float = None
    loss_ci_high: float = None
    bleu_min: float = None
    bleu_max: float = None
    good_limit: float = None        # the largest mean final loss near the best of its architecture and depth
    near_best: bool = False
    good: bool = False              # trains and near best: the headline
    disagree: bool = False          # the seeds disagree on "good"

    @property
    def finished(self):
        return self.seeds - self.diverged - self.stopped

    def verdict(self):
        """The cell's verdict in a word: good, poor (trains, not near best), no-train, diverged, stopped."""
        if self.diverged == self.seeds:
            return "diverged"
        if self.stopped + self.diverged == self.seeds:
            return "stopped"
        return "good" if self.good else "poor" if self.trains else "no-train"


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
    key = dict(path=str(rd.path), variant=run.ln, layers=run.layers or DEFAULT_LAYERS, lr=float(run.lr),
               warmup=warmup_updates(run.warmup or 0), seed=rec.seed, settings=settings(rec.config))
    if key["variant"] not in VARIANTS:
        raise StateError(f"{rd.config_path}: unknown architecture {key['variant']!r} (known: {', '.join(VARIANTS)})")
    done = rec.done
    if done is None or rec.outcome is Outcome.UNFINISHED:
        return Record(outcome=Outcome.UNFINISHED.value, **key)
    key.update(grad_ratio=depth.grad_ratios(rd.save_dir, key["layers"]), peak_rss_mb=done.peak_rss_mb,
               cuda_peak_mb=done.cuda_peak_mb, train_seconds=done.train_seconds,
               train_cpu_seconds=done.train_cpu_seconds)
    final, outcome = rec.final_valid_loss, rec.outcome.value
    if rec.outcome is Outcome.FINISHED and final is not None and not math.isfinite(final):
        outcome = Outcome.DIVERGED.value  # a NaN/inf final loss: diverged, though training ran to its end
    return Record(outcome=outcome, diverged_at=done.diverged_at, stopped_at=done.stopped_at,
                  initial_loss=done.initial_loss,
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


def make_cells(records, ratio=DEFAULT_RATIO, rules=None):
    """Cells of the runs that finished, diverged or were stopped early, with their seeds' spread and
    both verdicts (:mod:`.verdict`; ``rules`` default to ``Rules(ratio)``)."""
    rules = rules or Rules(ratio=ratio)
    counted = [r for r in records if r.outcome in COUNTED]
    cells, finals = [], {}
    for (variant, layers, warmup, lr), runs in group(counted, lambda r: (r.variant, r.layers, r.warmup, r.lr)).items():
        ok = [r for r in runs if r.outcome == "finished"]
        stopped = sum(r.outcome == "stopped early" for r in runs)
        ratios = [r.grad_ratio for r in runs if r.grad_ratio]
        loss, bleu = spread(r.final_valid_loss for r in ok), spread(r.bleu for r in ok)
        finals[variant, layers, warmup, lr] = runs
        cell = Cell(variant, layers, warmup, lr, len(runs), len(runs) - len(ok) - stopped,
                    loss and loss.mean, bleu and bleu.mean,
                    initial_loss=_mean(r.initial_loss for r in runs),
                    grad_ratio_encoder=_mean(x[0] for x in ratios), grad_ratio_decoder=_mean(x[1] for x in ratios),
                    peak_rss_mb=_max(r.peak_rss_mb for r in runs), cuda_peak_mb=_max(r.cuda_peak_mb for r in runs),
                    train_seconds=_mean(r.train_seconds for r in runs), stopped=stopped,
                    **({} if loss is None else dict(loss_min=loss.min, loss_max=loss.max, loss_sd=loss.sd,
                                                    loss_ci_low=loss.ci_low, loss_ci_high=loss.ci_high)),
                    **({} if bleu is None else dict(bleu_min=bleu.min, bleu_max=bleu.max)))
        cells.append(replace(cell, trains=trains(cell.final_valid_loss, cell.initial_loss,
                                                 cell.diverged + cell.stopped, rules.ratio)))
    noise = noise_of(cells, records)
    best = {k: min(g, key=lambda c: c.final_valid_loss)
            for k, g in group([c for c in cells if c.trains], lambda c: rules.reference(c.variant, c.layers)).items()}
    judged = []
    for c in cells:
        b = best.get(rules.reference(c.variant, c.layers))
        if b is None or c.final_valid_loss is None:
            judged.append(c)
            continue
        limit = threshold(b.final_valid_loss, b.finished, c.finished, rules, noise)
        runs = finals[c.variant, c.layers, c.warmup, c.lr]
        disagree = c.trains and seeds_disagree([r.final_valid_loss if r.outcome == "finished" else None for r in runs],
                                               [r.initial_loss for r in runs], limit, rules.ratio)
        near = c.final_valid_loss <= limit
        judged.append(replace(c, good_limit=limit, near_best=near, good=c.trains and near, disagree=disagree))
    return judged


def noise_of(cells, records):
    """The map's seed noise, (pooled sd, degrees of freedom) over the final losses of the seeds of the
    cells that train (:func:`.seeds.pooled_sd`); None when no such cell has two seeds."""
    keep = {(c.variant, c.layers, c.warmup, c.lr) for c in cells if c.trains}
    by_cell = group([r for r in records if r.outcome == "finished" and (r.variant, r.layers, r.warmup, r.lr) in keep],
                    lambda r: (r.variant, r.layers, r.warmup, r.lr))
    s, df = pooled_sd([r.final_valid_loss for r in g] for g in by_cell.values())
    return None if s is None else (s, df)


def _best(cells):
    """The lowest mean final validation loss of ``cells`` whose seeds all finished, or None."""
    return min((c.final_valid_loss for c in cells if c.finished == c.seeds and c.final_valid_loss is not None),
               default=None)


def _largest(cells, ok):
    return {k: max((c.lr for c in g if ok(c)), default=None)
            for k, g in group(cells, lambda c: (c.variant, c.layers, c.warmup)).items()}


def max_trains_lr(cells):
    """{(variant, layers, warmup): the largest learning rate whose cell trains, or None}."""
    return _largest(cells, lambda c: c.trains)


def max_good_lr(cells):
    """{(variant, layers, warmup): (the largest learning rate whose cell is good, or None; whether that
    cell's seeds disagree)}: the map's headline."""
    top = _largest(cells, lambda c: c.good)
    marks = {(c.variant, c.layers, c.warmup, c.lr): c.disagree for c in cells}
    return {k: (lr, lr is not None and marks[(*k, lr)]) for k, lr in top.items()}


def best_loss(cells):
    """{(variant, layers, warmup): the lowest final validation loss over the learning rates, or None}."""
    return {k: _best(g) for k, g in group(cells, lambda c: (c.variant, c.layers, c.warmup)).items()}


def lr_sensitivity(records):
    """{(variant, layers, warmup): Wortsman et al.'s LR sensitivity over the learning rates run, or None
    where a run of the group lacks its initial loss}; see SENSITIVITY."""
    counted = [r for r in records if r.outcome in COUNTED]
    result = {}
    for key, runs in group(counted, lambda r: (r.variant, r.layers, r.warmup)).items():
        if any(r.initial_loss is None or (r.outcome == "finished" and r.final_valid_loss is None) for r in runs):
            result[key] = None
            continue
        final = {id(r): r.initial_loss if r.outcome == "diverged" or r.final_valid_loss is None else r.final_valid_loss
                 for r in runs}
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
    """The cells of :func:`write_csv` (a CSV of the earlier one-rule map: its ``stable`` column as ``trains``)."""
    types = {f.name: float for f in fields(Cell)}
    flag = lambda s: s == "True"  # noqa: E731
    types.update(variant=str, layers=int, warmup=int, seeds=int, diverged=int, stopped=int, trains=flag,
                 near_best=flag, good=flag, disagree=flag)
    with open(path, encoding="utf-8", newline="") as f:
        rows = [{("trains" if k == "stable" else k): v for k, v in row.items()} for row in csv.DictReader(f)]
    return [Cell(**{k: (types[k](v) if v != "" else None) for k, v in row.items() if k in types}) for row in rows]


# ---------------------------------------------------------------- Markdown

def overview_table(cells):
    """The overview (:func:`overview`) as Markdown, one table per depth: mean [min-max] n, verdict."""
    lines = []
    for d in sorted({c.layers for c in cells}):
        m = overview(cells, d)
        lines += [f"## Overview, {d} layers: final validation loss, mean [min-max] over the seeds", "",
                  "| architecture | " + " | ".join(f"wu {warmup_label(w)}, lr {lr:g}" for w, lr in m["cols"]) + " |",
                  "|---" * (len(m["cols"]) + 1) + "|"]
        for v, row in zip(m["variants"], m["cells"]):
            lines.append(f"| {VARIANTS[v].label} | " + " | ".join("" if c is None else overview_text(c) for c in row) + " |")
        lines.append("")
    return lines


def overview_text(c):
    """A cell of the overview table: ``1.58 [1.49-1.65] n3 G`` (G good, p poor, - no-train; ? disagree)."""
    if c.finished == 0:
        return cell_mark(c)
    span = f" [{c.loss_min:.2f}-{c.loss_max:.2f}]" if c.finished > 1 else ""
    mark = VERDICT_MARK.get(c.verdict(), "") + ("?" if c.disagree else "")
    stops = "".join(f" {m}{k}" for m, k in (("x", c.diverged), ("s", c.stopped)) if k)
    return f"{c.final_valid_loss:.2f}{span} n{c.seeds} {mark}{stops}"


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


def cell_text(c):
    """A cell in the map's tables: mean [min-max; 95 % CI] n, BLEU, verdict ('?': seeds disagree)."""
    if c.finished == 0:
        return ", ".join(f"{mark} {k}/{c.seeds}" for mark, k in (("x", c.diverged), ("s", c.stopped)) if k)
    text = num(c.final_valid_loss)
    if c.finished > 1:
        text += f" [{c.loss_min:.2f}-{c.loss_max:.2f}; CI {c.loss_ci_low:.2f}-{c.loss_ci_high:.2f}]"
    text += f" n{c.seeds}" + (f" BLEU {c.bleu:.1f}" if c.bleu is not None else "")
    text += f" **{c.verdict()}**" if c.good else f" {c.verdict()}"
    text += "?" if c.disagree else ""
    return text + "".join(f", {mark} {k}/{c.seeds}" for mark, k in (("x", c.diverged), ("s", c.stopped)) if k)


def _seed_counts(cells):
    counts = sorted({c.seeds for c in cells})
    if not counts:
        return "no cells"
    if len(counts) == 1:
        return f"{counts[0]} seed{'s' if counts[0] > 1 else ''} per cell" + (" (no spread: one seed)" if counts == [1] else "")
    return f"{counts[0]}-{counts[-1]} seeds per cell (n in each cell)"


def _good_lr(v):
    lr, disagree = v
    return "-" if lr is None else f"{lr:g}" + (" (seeds disagree)" if disagree else "")


def _with_bests(table, cells):
    """``table`` (:func:`_table`) with two more columns: the architecture's best cell and the map's best
    at that depth (mean final losses of cells that train)."""
    trained = [c for c in cells if c.trains]
    own = {k: min(c.final_valid_loss for c in g) for k, g in group(trained, lambda c: (c.variant, c.layers)).items()}
    at_depth = {k: min(c.final_valid_loss for c in g) for k, g in group(trained, lambda c: c.layers).items()}
    rows = list(group(cells, lambda c: (c.variant, c.layers)))
    out = [table[0] + " its best | best at this depth |", table[1] + "---|---|"]
    for line, (v, layers) in zip(table[2:], rows):
        out.append(line + f" {num(own.get((v, layers)))} | {num(at_depth.get(layers))} |")
    return out


def cpu_line(records):
    """The training time of the counted runs: CPU seconds where recorded, and wall seconds."""
    counted = [r for r in records if r.outcome in COUNTED]
    cpu = [r.train_cpu_seconds for r in counted if r.train_cpu_seconds is not None]
    wall = sum(r.train_seconds or 0.0 for r in counted)
    text = f"Training time of the {len(counted)} counted runs: {wall:.0f} s wall (fairseq-train, summed over runs)"
    if cpu:
        text += (f"; CPU time recorded by {len(cpu)} of them: {sum(cpu):.0f} s, {sum(cpu) / len(cpu):.1f} s a run "
                 f"(DONE.json train_cpu_seconds)")
    return text + "."


def markdown(out, records, cells, rules):
    """The map's Markdown; ``rules`` (:class:`.verdict.Rules`; a number: the --ratio of the default rules)."""
    rules = rules if isinstance(rules, Rules) else Rules(ratio=rules)
    outcomes = ("finished", "diverged", "stopped early", "failed", "unfinished")
    counts = {s: sum(r.outcome == s for r in records) for s in outcomes}
    noise = noise_of(cells, records)
    lines = [f"# Stability map of {out}", "",
             f"{len(records)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ". Unfinished and "
             "failed runs are not counted. Losses in bits (fairseq's base 2), label smoothing included. "
             f"Initialization: {_init_of(records)} (--lnpos-init). {_seed_counts(cells)}; seeds: {ESTIMATOR}.", "",
             rules.describe(noise), "", cpu_line(records), ""]
    lines += overview_table(cells)
    for (variant, layers), group_cells in group(cells, lambda c: (c.variant, c.layers)).items():
        m = heatmap(cells, variant, layers)
        sel = {(c.warmup, c.lr): c for c in group_cells}
        lines += [f"## {VARIANTS[variant].label}, {layers} layers: final validation loss", "",
                  "| warm-up \\ lr | " + " | ".join(f"{lr:g}" for lr in m["lrs"]) + " |",
                  "|---" * (len(m["lrs"]) + 1) + "|"]
        for w in m["warmups"]:
            lines.append(f"| {warmup_label(w)} | " + " | ".join(cell_text(sel[w, lr]) if (w, lr) in sel else ""
                                                              for lr in m["lrs"]) + " |")
        lines.append("")
    lines += ["Each cell: mean over the seeds that finished [min-max; 95 % CI], n seeds, test tok BLEU where scored, "
              "the verdict (good, poor = trains but not near the best, no-train; '?': the seeds disagree). "
              "x d/n: d of n seeds diverged; s k/n: k stopped early (their losses are not in the mean).", ""]
    sens = lr_sensitivity(records)
    lines += ["## Largest good learning rate per warm-up", "",
              "The largest learning rate whose cell is good (the rules above); '-': none. Good is judged against "
              f"{AGAINST[rules.against]}: beside it, the architecture's best and the best of any architecture at "
              "that depth (bits), which say whether the architecture trains well at all on this budget.", ""]
    lines += _with_bests(_table(max_good_lr(cells), _good_lr), cells)
    lines += ["", "## Largest learning rate that trains, per warm-up", "",
              "The earlier, lax rule alone: the final loss at most the ratio times the initial loss.", ""]
    lines += _table(max_trains_lr(cells), lambda lr: "-" if lr is None else f"{lr:g}")
    grids = {k: ", ".join(f"{lr:g}" for lr in sorted({c.lr for c in cells if (c.variant, c.layers, c.warmup) == k}))
             for k in sens}
    lines += ["", "## Best final validation loss per warm-up (bits)", "",
              "The lowest final validation loss over the learning-rate grid (mean over seeds). Read the LR "
              "sensitivity beside it: sensitivity is measured from each row's own best, so an architecture "
              "whose best loss is poor can score as insensitive.", ""]
    lines += _table(best_loss(cells), num)
    lines += ["", "## LR sensitivity (bits)", "", SENSITIVITY, ""]
    if len(set(grids.values())) == 1:
        lines += [f"Learning-rate grid: {next(iter(grids.values()))}.", ""]
        lines += _table(sens, lambda s: "initial loss not recorded" if s is None else f"{s:.3f}")
    else:
        lines += _table({k: (s, grids[k]) for k, s in sens.items()},
                        lambda v: ("initial loss not recorded" if v[0] is None else f"{v[0]:.3f}") + f" (lr {v[1]})")
    lines += depth.markdown(cells)
    left = [r for r in records if r.outcome in ("failed", "unfinished")]
    if left:
        lines += ["", "## Not counted", ""] + [f"- {r.outcome}: {r.path}" for r in left]
    return "\n".join(lines) + "\n"


def _main(argv):
    p = CommandParser(prog="stability_map.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the output folder of a sweep (OUT/NAME/seedS/ run folders)")
    p.add_argument("--ratio", type=fraction("ratio"), default=DEFAULT_RATIO,
                   help="trains: the final validation loss at most this times the initial loss (default: %(default)s)")
    p.add_argument("--near", type=fraction("near"), default=DEFAULT_NEAR,
                   help="good: within this fraction of the best cell (--against), at the least "
                        "(default: %(default)s)")
    p.add_argument("--noise-k", type=float, default=DEFAULT_NOISE_K,
                   help="good: or within K seed standard deviations of the difference of means, if more "
                        "(default: %(default)s)")
    p.add_argument("--against", choices=sorted(AGAINST) + ["auto"], default="auto",
                   help="good: near the best cell of the same architecture and depth (arch: a learning-rate map) "
                        "or of any architecture there (all: one cell per architecture); auto (default): all where "
                        "some architecture has one cell at a depth (the depth map), else arch")
    p.add_argument("--no-figures", action="store_true", help="write the CSV and Markdown only")
    args = p.parse_args(argv)
    if not (math.isfinite(args.noise_k) and args.noise_k >= 0):
        raise LnposError(f"--noise-k {args.noise_k}: give a number of at least 0")
    out = Path(args.out)
    records = load_records(out)
    against = args.against if args.against != "auto" else auto_against(
        (r.variant, r.layers, r.warmup, r.lr) for r in records if r.outcome in COUNTED)
    rules = Rules(ratio=args.ratio, near=args.near, noise_k=args.noise_k, against=against)
    cells = make_cells(records, rules=rules)
    write_csv(cells, out / "stability.csv")
    deep = depth.along_depth(cells)
    if deep:
        depth.write_csv(cells, out / "largest_depth.csv")
    md = markdown(out, records, cells, rules)
    write_text(out / "stability.md", md)
    if cells and not args.no_figures:
        plot_heatmaps(cells, out / "stability_heatmaps.png")
        plot_overview(cells, out / "stability_overview.png", AGAINST[rules.against])
        plot_bleu(cells, out / "bleu.png", AGAINST[rules.against])
        plot_loss_vs_lr(cells, out / "loss_vs_lr.png")
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
