"""Results of a grid: Markdown table, results.csv and Fig. 2-style figures.

    scripts/make_table.sh OUT_DIR [--no-figures]

Writes OUT_DIR/runs.csv (the table of every run, :mod:`~fairseq_lnpos.analysis.frame`: one row per run
and seed with every setting, outcome, number and provenance), OUT_DIR/results.md (a row per run and seed, then a row per run over its seeds: n, mean,
min-max and 95 % CI, :mod:`~fairseq_lnpos.analysis.seeds`), OUT_DIR/results.csv (per seed),
OUT_DIR/results_by_run.csv (over seeds: a row per run and metric) and OUT_DIR/fig_<figure>.png (one per `figure`
group of runs.py, and fig_all.png with every run when there are several groups: BLEU and
validation loss per epoch, one column per optimizer, warm-up as line styles). "best" is the best epoch on the test set, as the paper's per-epoch curves show it.
A results.md or results.csv this command did not write (results.md without its first line
:data:`MD_MARKER`, results.csv without its header) is never overwritten: it is an error.
"""
import csv
import io
import sys
from pathlib import Path

from ..analysis.seeds import ESTIMATOR, spread
from ..cli import CommandParser
from ..common import FONT, integer_ticks, legend_right, plain_name, refuse_folder, write_figure, write_text
from ..errors import LnposError, StateError, run_main
from . import runs as R
from ..variants import variant_color
from .rundir import grid_run_dirs, run_dirs

CSV_COLUMNS = ["run", "arch", "optimizer", "lr", "warmup", "schedule", "seed", "status", "paper_bleu",
               "paper_valid_loss", "paper_note", "best_bleu_tok", "best_epoch", "last_bleu_tok", "last_epoch",
               "sacrebleu", "last_sacrebleu", "best_valid_loss", "epochs", "avg_bleu_tok", "avg_sacrebleu",
               "avg_epochs", "source", "best_bleu_tok_cs", "avg_bleu_tok_cs"]
MD_MARKER = "<!-- written by scripts/make_table.sh, which rewrites this file -->"
# the header of results.csv before the compound-split columns (a file with it is replaced)
CSV_EARLIER = ",".join(c for c in CSV_COLUMNS if c not in ("best_bleu_tok_cs", "avg_bleu_tok_cs"))
# the seeds of a run: (row key, label) of each metric aggregated
SEED_METRICS = (("best_bleu_tok", "tok BLEU best"), ("avg_bleu_tok", "tok BLEU avg"), ("sacrebleu", "sacreBLEU"),
                ("best_valid_loss", "best valid loss"))
SEED_COLUMNS = ["run", "arch", "seeds", "status", "metric", "n", "mean", "min", "max", "sd", "ci95_low", "ci95_high"]
TOK_LABEL = "tok BLEU"
CS_LABEL = "tok BLEU compound-split"  # rows with compound_split_bleu (runs.py)
NOTE = ("tok BLEU: fairseq's BLEU scorer on the data's Moses tokens (lowercased for IWSLT, compound-split "
        "for WMT), the paper's metric; sacreBLEU: detokenized output against the raw references, at the "
        "epoch of best tok BLEU. Best = best epoch on the test set (the paper's per-epoch curves). Avg = the "
        "parameter average of the run's last epoch checkpoints (--average-last; the epochs averaged in brackets), "
        "as published numbers of IWSLT14/WMT14 are computed. " + CS_LABEL + ": tok BLEU with hyphenated "
        "compounds split on both sides (fairseq's compound_split_bleu.sh), for the rows that ask for it; the "
        "paper column is always compared with the plain tok BLEU.")


def collect(run_dirs):
    """One dict per run folder of ``run_dirs`` (from :class:`~.rundir.RunRecord`), in the order of the run table.

    A row's ``status`` is its outcome in words (the column users see), ``outcome`` the
    :class:`~.records.Outcome`'s value. A run folder with a file that cannot be read gives a row with
    status ``unreadable: ...`` (the path and what to do) and ``unreadable`` set; nothing is skipped silently."""
    order = {r.name: i for i, r in enumerate(R.RUNS)}
    rows = []
    for rd in run_dirs:
        try:
            row = _row(rd.record())
        except StateError as e:
            row = {"run": rd.path.parent.name, "seed": rd.path.name[4:], "status": f"unreadable: {e}",
                   "outcome": "unreadable", "unreadable": str(e), "curve": [], "epochs": 0, "figure": "misc"}
        rows.append(row)
    rows.sort(key=lambda r: (order.get(r["run"], len(order)), r["run"], str(r["seed"])))
    return rows


def _row(rec):
    run = rec.run
    row = {"run": run.name, "arch": rec.config["arch"], "optimizer": run.optimizer, "lr": run.lr,
           "warmup": run.warmup, "schedule": run.schedule, "seed": rec.seed, "status": rec.outcome_text,
           "outcome": rec.outcome.value, "paper_bleu": run.paper_bleu, "paper_valid_loss": run.paper_valid_loss,
           "paper_note": run.paper_note, "figure": run.figure,
           "ln": run.ln, "max_epoch": run.max_epoch, "curve": rec.evals, "epochs": len(rec.evals),
           "source": run.source, "record": rec}
    avg = rec.average
    if avg is not None:
        row.update(avg_bleu_tok=avg.bleu_tok, avg_sacrebleu=avg.sacrebleu,
                   avg_epochs=f"{avg.epochs[0]}-{avg.epochs[-1]}", avg_bleu_tok_cs=avg.bleu_tok_cs)
    best, scored = rec.best, rec.scored
    if best is not None:
        row.update(best_bleu_tok=best.bleu_tok, best_epoch=best.epoch,
                   last_bleu_tok=scored[-1].bleu_tok, last_epoch=scored[-1].epoch,
                   sacrebleu=best.sacrebleu, last_sacrebleu=scored[-1].sacrebleu,
                   signature=best.sacrebleu_signature, best_bleu_tok_cs=best.bleu_tok_cs)
    row["best_valid_loss"] = rec.best_valid_loss
    return row


def _fmt(v, nd=2):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}" if nd is not None else f"{v:g}"
    return str(v)


def write_csv(rows, path):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else (f"{r[k]:g}" if k == "lr" else r[k])) for k in CSV_COLUMNS})
    write_text(path, buf.getvalue())


def over_seeds(rows):
    """{run: {"arch", "seeds", "status": {outcome: count}, metric: Spread or None}} of the readable rows."""
    out = {}
    for r in rows:
        if r.get("unreadable"):
            continue
        entry = out.setdefault(r["run"], {"arch": r["arch"], "seeds": 0, "status": {}, "values": {}})
        entry["seeds"] += 1
        outcome = r.get("outcome") or r.get("status", "")  # a row made by hand may lack the enum's value
        entry["status"][outcome] = entry["status"].get(outcome, 0) + 1
        for key, _ in SEED_METRICS:
            entry["values"].setdefault(key, []).append(r.get(key))
    for entry in out.values():
        for key, _ in SEED_METRICS:
            entry[key] = spread(entry["values"][key], (0.0, 100.0) if "bleu" in key else (None, None))
        del entry["values"]
    return out


def _status_words(counts):
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def seeds_markdown(agg):
    """The table over seeds: a row per run (its name in backticks)."""
    head = ["run", "seeds", "status"] + [label for _, label in SEED_METRICS]
    lines = ["## Over seeds", "", f"Per run: {ESTIMATOR}; '(1 seed)': no spread.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run, e in agg.items():
        cells = [f"`{run}`", str(e["seeds"]), _status_words(e["status"])]
        cells += [e[k].text(".3f" if k == "best_valid_loss" else ".2f") if e[k] else "" for k, _ in SEED_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_seeds_csv(agg, path):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SEED_COLUMNS)
    for run, e in agg.items():
        for key, _ in SEED_METRICS:
            if e[key] is not None:
                d = e[key].as_dict()
                w.writerow([run, e["arch"], e["seeds"], _status_words(e["status"]), key] +
                           ["" if d[k] is None else repr(d[k]) for k in ("n", "mean", "min", "max", "sd", "ci95_low",
                                                                         "ci95_high")])
    write_text(path, buf.getvalue())


def markdown(rows):
    head = ["run", "arch", "opt", "lr", "warm-up", "seed", "status", "paper",
            f"{TOK_LABEL} best (epoch)", f"{TOK_LABEL} avg (epochs)", f"{TOK_LABEL} last", "sacreBLEU", "best valid loss"]
    split = any(r.get(k) is not None for r in rows for k in ("best_bleu_tok_cs", "avg_bleu_tok_cs"))
    if split:  # the compound-split scores beside the plain ones
        head.insert(10, f"{CS_LABEL} best / avg")
    lines = [MD_MARKER, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("unreadable"):
            lines.append(f"| {r['run']} | | | | | {r['seed']} | {r['status'].replace('|', '/')} |" + " |" * (len(head) - 7))
            continue
        paper = _fmt(r["paper_bleu"]) if r["paper_bleu"] is not None else r["paper_note"]
        best = f"{_fmt(r.get('best_bleu_tok'))} ({r['best_epoch']})" if r.get("best_bleu_tok") is not None else ""
        avg = f"{_fmt(r['avg_bleu_tok'])} ({r['avg_epochs']})" if r.get("avg_bleu_tok") is not None else ""
        warm = R.warmup_label(r["warmup"])
        cells = [r["run"], r["arch"], r["optimizer"], f"{r['lr']:g}", warm, str(r["seed"]), r["status"], paper,
                 best, avg, _fmt(r.get("last_bleu_tok")), _fmt(r.get("sacrebleu")), _fmt(r.get("best_valid_loss"), 3)]
        if split:
            cs = [_fmt(r.get(k)) for k in ("best_bleu_tok_cs", "avg_bleu_tok_cs")]
            cells.insert(10, " / ".join(cs) if any(cs) else "")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    sigs = sorted({r["signature"] for r in rows if r.get("signature")})
    lines.append("")
    published = {}  # source -> the runs whose published number it gives
    for r in rows:
        if r.get("paper_bleu") is not None and r.get("source") and r["run"] not in published.get(r["source"], []):
            published.setdefault(r["source"], []).append(r["run"])
    lines += [f"paper (published BLEU) of {', '.join(names)}: {source}" for source, names in published.items()]
    lines += [f"sacreBLEU signature: {s}" for s in sigs] or ["sacreBLEU signature: (no run evaluated yet)"]
    lines.append("")
    lines.append(NOTE)
    lines += [""] + seeds_markdown(over_seeds(rows))
    return "\n".join(lines) + "\n"


LINESTYLES = {"none": "-", "500": "--", "4000": ":"}


def figures(rows, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    groups = sorted({r["figure"] for r in rows})
    for fig_name in groups + (["all"] if len(groups) > 1 else []):
        group = [r for r in rows if fig_name in ("all", r["figure"]) and r["curve"]]
        if not group:
            continue
        opts = sorted({r["optimizer"] for r in group})
        fig, axes = plt.subplots(2, len(opts), figsize=(5 * len(opts) + 4, 7.5), squeeze=False)
        markers = {}
        for r in group:  # colour: the variant; line style: the warm-up; marker: the learning rate
            color = variant_color(r["ln"])
            marker = markers.setdefault(r["lr"], ".ov^sD"[len(markers) % 6])
            warm = R.warmup_label(r["warmup"])
            col = opts.index(r["optimizer"])
            label = f"{r['ln']} lr {r['lr']:g} warm-up {warm}" + (
                f" {r['schedule']}" if r["schedule"] != "inverse_sqrt" else "") + (
                f" seed {r['seed']}" if len({x['seed'] for x in group}) > 1 else "")
            ep = [e.epoch for e in r["curve"]]
            style = dict(color=color, linestyle=LINESTYLES.get(warm, "-."), marker=marker, label=label)
            axes[0][col].plot(ep, [e.bleu_tok for e in r["curve"]], **style)
            axes[1][col].plot(ep, [e.valid_loss for e in r["curve"]], **style)
        for col, opt in enumerate(opts):
            axes[0][col].set_title(f"{fig_name}: test BLEU per LayerNorm placement, {opt}", fontsize=FONT + 1)
            axes[1][col].set_title(f"{fig_name}: validation loss per LayerNorm placement, {opt}", fontsize=FONT + 1)
            axes[0][col].set_ylabel(f"test {TOK_LABEL}", fontsize=FONT)
            axes[1][col].set_ylabel("validation loss (bits per token)", fontsize=FONT)
            for row in (0, 1):
                axes[row][col].set_xlabel("epoch", fontsize=FONT)
                integer_ticks(axes[row][col].xaxis)
                axes[row][col].grid(alpha=0.3)
        fig.subplots_adjust(left=0.08, bottom=0.08, top=0.95, hspace=0.3, wspace=0.25)
        legend_right(fig, axes.flat, 1 - 3.8 / fig.get_figwidth())
        path = write_figure(fig, Path(out_dir) / f"fig_{plain_name(fig_name, 'figure')}.png", dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _check_ours(path, first_line):
    """Refuse to replace ``path`` unless this command wrote it: its first line is ``first_line``, or, for
    results.csv, the header of the earlier version (:data:`CSV_EARLIER`); a header with a column of the
    user's (an extra one) is not ours."""
    if not path.exists() and not path.is_symlink():
        return
    refuse_folder(path)
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().rstrip("\n")
        ours = line == first_line or (line == CSV_EARLIER and first_line == ",".join(CSV_COLUMNS))
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise LnposError(f"{path} was not written by make_table.sh, so it is not replaced: move it away, then "
                         f"run make_table.sh again; nothing was written")


def make_table(out_dir, with_figures=True, skip_unreadable=False):
    """Write OUT/results.md, results.csv (and the figures); returns (markdown, [written paths], rows).

    The table is written also when a run folder is unreadable (its row says why); then, unless
    ``skip_unreadable``, :class:`StateError` is raised afterwards naming the first one."""
    out = Path(out_dir)
    rows = collect(grid_run_dirs(out, "the --out folder of `scripts/grid.sh run`"))
    for path, first in ((out / "results.md", MD_MARKER), (out / "results.csv", ",".join(CSV_COLUMNS)),
                        (out / "results_by_run.csv", ",".join(SEED_COLUMNS))):
        _check_ours(path, first)
    md = markdown(rows)
    written = [write_text(out / "results.md", md), out / "results.csv", out / "results_by_run.csv"]
    write_csv(rows, out / "results.csv")
    write_seeds_csv(over_seeds(rows), out / "results_by_run.csv")
    bad = [r for r in rows if r.get("unreadable")]
    if not bad:  # the per-seed table of every run (analysis/frame.py), as a results page publishes it
        from ..analysis.frame import runs_frame, write_runs_csv

        written.append(write_runs_csv(runs_frame(out), out / "runs.csv"))
    if with_figures:
        written += figures([r for r in rows if not r.get("unreadable")], out)
    if bad and not skip_unreadable:
        raise StateError(f"{len(bad)} run folder(s) unreadable, marked in {out / 'results.md'}; the first: "
                         f"{bad[0]['unreadable']} (or pass --skip-unreadable)")
    return md, written, rows


def command(argv=None):
    p = CommandParser(prog="make_table.sh", description=__doc__.split("\n")[0])
    p.add_argument("out_dir", help="the --out folder of scripts/grid.sh run")
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="exit 0 even when a run folder has an unreadable file (its row says why)")
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    if out.is_dir() and not run_dirs(out) and run_dirs(out / "grid"):  # a `make demo` folder: its grid
        out = out / "grid"
        print(f"{a.out_dir} is a demo folder: the table of its grid, {out}\n")
    md, written, _ = make_table(out, not a.no_figures, a.skip_unreadable)
    print(md, end="")
    print("\n" + "\n".join(f"wrote {path}" for path in written))
    return 0


def main(argv=None):
    """The command: one line and exit 2 for bad input, 130 when interrupted."""
    return run_main("make_table", command, argv)


if __name__ == "__main__":
    sys.exit(main())
