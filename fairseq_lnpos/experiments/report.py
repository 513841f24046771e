"""Results of a grid: Markdown table, results.csv and Fig. 2-style figures.

    scripts/make_table.sh OUT_DIR [--no-figures] [--allow-mixed-code]

Writes into OUT_DIR: runs.csv (every run, :mod:`~fairseq_lnpos.analysis.frame`), results.md (a row per run
and seed, then per run over its seeds: n, mean, min-max and 95 % CI, :mod:`~fairseq_lnpos.analysis.seeds`),
results.csv (per seed), results_by_run.csv (over seeds, a row per run and metric) and fig_<figure>.png per
`figure` group of runs.py (fig_all.png too for several): BLEU and validation loss per epoch, a column per
optimizer, warm-up as line styles. "best": the best epoch on the test set, as the paper's per-epoch curves;
"selected": the scored epoch of lowest validation NLL, chosen without the test set. A results file this
command did not write (without its first line: :data:`MD_MARKER`, the CSV header) is never overwritten.
results.md names the model code that trained the runs; runs of different model code are refused
(nothing written) unless ``--allow-mixed-code``.
"""
import sys
from itertools import product
from pathlib import Path

from ..analysis.frame import RUN_COLUMNS, check_model_code, pandas, run_row, scores, write_runs_csv
from ..analysis.map_common import markdown_table, missing, pyplot, variant_color
from ..analysis.seeds import ESTIMATOR, Spread, over_seeds as seeds_over_seeds
from ..cli import CommandParser
from ..common import FONT, integer_ticks, legend_right, plain_name, refuse_folder, write_figure, write_text
from ..errors import StateError, check, run_main
from . import runs as R
from ..variants import VARIANTS, arch_names
from .migrate import EARLIER_CSV_HEADERS
from .rundir import grid_run_dirs, run_dirs

CSV_COLUMNS = ["run", "arch", "optimizer", "lr", "warmup", "schedule", "seed", "status", "paper_bleu",
               "paper_valid_loss", "paper_note", "best_bleu_tok", "best_epoch", "last_bleu_tok", "last_epoch",
               "sacrebleu", "last_sacrebleu", "best_valid_loss", "epochs", "avg_bleu_tok", "avg_sacrebleu",
               "avg_epochs", "source", "best_bleu_tok_cs", "avg_bleu_tok_cs", "sel_bleu_tok", "sel_epoch",
               "sel_sacrebleu", "sel_valid_nll"]
MD_MARKER = "<!-- written by scripts/make_table.sh, which rewrites this file -->"
# the seeds of a run: (row key, label) of each metric aggregated
SEED_METRICS = {"best_bleu_tok": "tok BLEU best", "sel_bleu_tok": "tok BLEU selected", "avg_bleu_tok": "tok BLEU avg",
                "sacrebleu": "sacreBLEU", "best_valid_loss": "best valid loss"}
SEED_COLUMNS = ["run", "arch", "seeds", "status", "metric", "n", "mean", "min", "max", "sd", "ci95_low", "ci95_high"]
TOK_LABEL = "tok BLEU"
CS_LABEL = "tok BLEU compound-split"  # rows with compound_split_bleu (runs.py)
NOTE = ("tok BLEU: fairseq's BLEU scorer on the data's Moses tokens (lowercased for IWSLT, compound-split "
        "for WMT), the paper's metric; sacreBLEU: detokenized output against the raw references, at the "
        "epoch of best tok BLEU. Best = best epoch on the test set (the paper's per-epoch curves); selected = the "
        "scored epoch of lowest validation NLL, chosen without the test set (its tok BLEU is the unbiased one). Avg = the "
        "parameter average of the run's last epoch checkpoints (--average-last; the epochs averaged in brackets), "
        "as published numbers of IWSLT14/WMT14 are computed. " + CS_LABEL + ": tok BLEU with hyphenated "
        "compounds split on both sides (fairseq's compound_split_bleu.sh), for the rows that ask for it; the "
        "paper column is always compared with the plain tok BLEU.")


RUN_FIELDS = ("optimizer", "lr", "warmup", "schedule", "paper_bleu", "paper_valid_loss", "paper_note", "figure", "ln",
              "max_epoch", "source", "dataset")  # the fields of its run (runs.Run) a row carries


def collect(run_dirs):
    """One dict per run folder of ``run_dirs``, in the run table's order: the run's fields (:data:`RUN_FIELDS`),
    scores (:func:`~fairseq_lnpos.analysis.frame.scores`), ``curve`` (its epoch records), ``record``, ``frame`` (its
    row of the table of every run, :func:`~fairseq_lnpos.analysis.frame.run_row`), ``status`` (the outcome in
    words) and ``outcome`` (:class:`~.records.Outcome`'s value). A folder with a file that cannot be read:
    status ``unreadable: ...`` (the path and what to do) and ``unreadable`` set."""
    order = {r.name: i for i, r in enumerate(R.RUNS)}
    rows = []
    for rd in run_dirs:
        try:
            rec = rd.record()
            row = {"run": rec.run.name, "arch": rec.config["arch"], "seed": rec.seed, "status": rec.outcome_text,
                   "outcome": rec.outcome.value, "curve": rec.evals, "epochs": len(rec.evals), "record": rec,
                   "frame": run_row(rec), **{k: getattr(rec.run, k) for k in RUN_FIELDS}, **scores(rec)}
        except StateError as e:
            row = {"run": rd.path.parent.name, "seed": rd.path.name[4:], "status": f"unreadable: {e}",
                   "outcome": "unreadable", "unreadable": str(e), "curve": [], "epochs": 0, "figure": "misc"}
        rows.append(row)
    rows.sort(key=lambda r: (order.get(r["run"], len(order)), r["run"], str(r["seed"])))
    return rows


def run_table(rows):
    """The table of every run (:mod:`~fairseq_lnpos.analysis.frame`) of the readable ``rows``, in the order of
    their folders (as :func:`~fairseq_lnpos.analysis.frame.runs_frame` reads them)."""
    return pandas().DataFrame(sorted((r["frame"] for r in rows if "frame" in r), key=lambda f: Path(f["path"])),
                              columns=RUN_COLUMNS)


def table(rows, columns):
    """``rows`` (dicts, a key missing: empty) as a DataFrame of ``columns`` holding the values themselves."""
    return pandas().DataFrame(rows, columns=columns, dtype=object)


def _text(col, f=lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)):
    """A column as text: ``f`` of each value, '' where there is none."""
    return col.map(lambda v: "" if missing(v) else f(v))


def over_seeds(rows):
    """The readable rows over seeds: a DataFrame with a row per run and metric (:data:`SEED_COLUMNS`,
    :func:`~fairseq_lnpos.analysis.seeds.over_seeds`)."""
    t = table([r for r in rows if not r.get("unreadable")], ["run", "arch", "outcome", "status", *SEED_METRICS])
    t["outcome"] = t["outcome"].fillna(t["status"])  # a row made by hand may lack the enum's value
    per_run = t.groupby("run", sort=False).agg(arch=("arch", "first"), seeds=("run", "size"), status=(
        "outcome", lambda s: ", ".join(f"{n} {k}" for k, n in s.value_counts(sort=False).items())))
    stats = seeds_over_seeds(t, "run", {k: (0.0, 100.0) if "bleu" in k else (None, None) for k in SEED_METRICS})
    return stats.join(per_run, on="run")[SEED_COLUMNS]


def seeds_markdown(agg):
    """The table over seeds (:func:`over_seeds`): a row per run (its name in backticks)."""
    text = agg.assign(text=[Spread.of(r).text(".3f" if r["metric"] == "best_valid_loss" else ".2f")
                            for _, r in agg.iterrows()])
    wide = text.pivot(index="run", columns="metric", values="text").reindex(index=agg["run"].unique(),
                                                                              columns=list(SEED_METRICS))
    runs = agg.drop_duplicates("run").set_index("run")
    wide = wide.rename(columns=SEED_METRICS).assign(seeds=runs["seeds"], status=runs["status"])
    wide.index = "`" + wide.index + "`"
    return (["## Over seeds", "", f"Per run: {ESTIMATOR}; '(1 seed)': no spread.", ""]
            + markdown_table(wide[["seeds", "status", *SEED_METRICS.values()]].rename_axis("run").reset_index()))


def markdown(rows, agg=None, code_line=None):
    """results.md's text: a row per run and seed, the notes (``code_line``: which model code trained the
    runs, :func:`~fairseq_lnpos.analysis.frame.check_model_code`), then the table over seeds (``agg``, when
    the caller has it: :func:`over_seeds` of ``rows``)."""
    t = table(rows, CSV_COLUMNS + ["signature"])
    at = lambda col, where: (_text(t[col]) + " (" + t[where].astype(str) + ")").where(t[col].notna(), "")  # noqa: E731
    show = {"run": t["run"], "arch": t["arch"], "opt": t["optimizer"], "lr": _text(t["lr"], lambda v: f"{v:g}"),
            "warm-up": _text(t["warmup"], R.warmup_label), "seed": t["seed"].astype(str), "status": t["status"],
            "paper": _text(t["paper_bleu"]).where(t["paper_bleu"].notna(), t["paper_note"]),
            f"{TOK_LABEL} best (epoch)": at("best_bleu_tok", "best_epoch"),
            f"{TOK_LABEL} selected (epoch)": at("sel_bleu_tok", "sel_epoch"),
            f"{TOK_LABEL} avg (epochs)": at("avg_bleu_tok", "avg_epochs")}
    if t[["best_bleu_tok_cs", "avg_bleu_tok_cs"]].notna().any(axis=None):  # the compound-split scores beside
        cs = _text(t["best_bleu_tok_cs"]) + " / " + _text(t["avg_bleu_tok_cs"])
        show[f"{CS_LABEL} best / avg"] = cs.where(cs != " / ", "")
    show.update({f"{TOK_LABEL} last": _text(t["last_bleu_tok"]), "sacreBLEU": _text(t["sacrebleu"]),
                 "best valid loss": _text(t["best_valid_loss"], lambda v: f"{v:.3f}")})
    lines = [MD_MARKER, ""] + markdown_table(type(t)(show)) + [""]  # an unreadable row: its run, seed and why
    published = t[t["paper_bleu"].notna() & t["source"].fillna("").astype(bool)]
    lines += [f"paper (published BLEU) of {', '.join(names)}: {source}"
              for source, names in published.groupby("source", sort=False)["run"].unique().items()]
    sigs = sorted(set(t["signature"].dropna()) - {""})
    lines += [f"sacreBLEU signature: {s}" for s in sigs] or ["sacreBLEU signature: (no run evaluated yet)"]
    lines += [f"Runs trained by {code_line}."] if code_line else []
    lines += ["", NOTE, ""] + seeds_markdown(over_seeds(rows) if agg is None else agg)
    return "\n".join(lines) + "\n"


LINESTYLES = {"none": "-", "500": "--", "4000": ":"}


def figures(rows, out_dir):
    """fig_<figure>.png per figure group of the rows with a curve (and fig_all.png for several): test BLEU
    and validation loss per epoch, a column per optimizer; returns the paths written."""
    plt, written, groups = pyplot(), [], sorted({r["figure"] for r in rows})
    for fig_name in groups + (["all"] if len(groups) > 1 else []):
        group = [r for r in rows if fig_name in ("all", r["figure"]) and r["curve"]]
        if not group:
            continue
        opts, seeds, markers = sorted({r["optimizer"] for r in group}), sorted({int(r["seed"]) for r in group}), {}
        fig, axes = plt.subplots(2, len(opts), figsize=(5 * len(opts) + 4, 7.5), squeeze=False)
        for r in group:  # colour: the variant; line style: the warm-up; marker: the learning rate
            warm = R.warmup_label(r["warmup"])
            label = (f"{VARIANTS[r['ln']].label} lr {r['lr']:g} warm-up {warm}"
                     + (f" {r['schedule']}" if r["schedule"] != "inverse_sqrt" else "")
                     + (f" seed {r['seed']}" if len(seeds) > 1 else ""))
            style = dict(color=variant_color(r["ln"]), linestyle=LINESTYLES.get(warm, "-."), label=label,
                         marker=markers.setdefault(r["lr"], ".ov^sD"[len(markers) % 6]))
            for row, key in enumerate(("bleu_tok", "valid_loss")):
                axes[row][opts.index(r["optimizer"])].plot([e.epoch for e in r["curve"]],
                                                           [getattr(e, key) for e in r["curve"]], **style)
        names = arch_names()  # on what: the corpora, the model sizes and the seeds
        on = (f"data {', '.join(sorted({r['dataset'] for r in group}))}; size "
              f"{', '.join(sorted({names.get(r['arch'], (None, r['arch']))[1] for r in group}))}; "
              f"seeds {', '.join(map(str, seeds))}")
        for (col, opt), (row, (what, ylabel)) in product(enumerate(opts), enumerate(
                (("test BLEU", f"test {TOK_LABEL}"), ("validation loss", "validation loss (bits per token)")))):
            ax = axes[row][col]
            ax.set_title(f"{fig_name}: {what} per LayerNorm placement, {opt}\n{on}", fontsize=FONT + 1)
            ax.set_ylabel(ylabel, fontsize=FONT)
            ax.set_xlabel("epoch", fontsize=FONT)
            integer_ticks(ax.xaxis)
            ax.grid(alpha=0.3)
        fig.subplots_adjust(left=0.08, bottom=0.08, top=0.93, hspace=0.4, wspace=0.25)
        legend_right(fig, axes.flat, 1 - 3.8 / fig.get_figwidth())
        written.append(write_figure(fig, Path(out_dir) / f"fig_{plain_name(fig_name, 'figure')}.png", dpi=100))
        plt.close(fig)
    return written


def _check_ours(path, first_line):
    """Refuse to replace ``path`` unless this command wrote it: its first line is ``first_line`` (a header
    with a column of the user's, an extra one, is not ours; one of an earlier version: ``grid.sh migrate``)."""
    if not path.exists() and not path.is_symlink():
        return
    refuse_folder(path)
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        line = None
    check(line == first_line or line not in EARLIER_CSV_HEADERS, f"{path} was written by an earlier version of "
          f"make_table.sh: run `scripts/grid.sh migrate {path.parent}` once, then make_table.sh again; nothing was written")
    check(line == first_line, f"{path} was not written by make_table.sh, so it is not replaced: move it away, then "
                              f"run make_table.sh again; nothing was written")


def make_table(out_dir, with_figures=True, skip_unreadable=False, allow_mixed_code=False):
    """Write OUT/results.md, results.csv (and the figures); returns (markdown, [written paths], rows). The table
    is written also when a run folder is unreadable (its row says why); then, unless ``skip_unreadable``,
    :class:`StateError` is raised afterwards naming the first one. Runs trained by different model code are
    refused before anything is written, unless ``allow_mixed_code`` (results.md lists the versions)."""
    out = Path(out_dir)
    rows = collect(grid_run_dirs(out, "the --out folder of `scripts/grid.sh run`"))
    readable, bad = [r for r in rows if not r.get("unreadable")], [r for r in rows if r.get("unreadable")]
    runs = run_table(readable)
    code_line = check_model_code(runs, allow_mixed_code)
    agg, t = over_seeds(rows), table(rows, CSV_COLUMNS)
    md = markdown(rows, agg, code_line)
    files = {"results.md": (MD_MARKER, md), "results.csv": (",".join(CSV_COLUMNS), t.assign(
                 lr=_text(t["lr"], lambda v: f"{v:g}")).to_csv(index=False, lineterminator="\n")),
             "results_by_run.csv": (",".join(SEED_COLUMNS), agg.to_csv(index=False, lineterminator="\n"))}
    for name, (first, _) in files.items():
        _check_ours(out / name, first)
    written = [write_text(out / name, text) for name, (_, text) in files.items()]
    if not bad:  # the per-seed table of every run (analysis/frame.py, in runs_frame's order), as a page publishes it
        written.append(write_runs_csv(runs, out / "runs.csv"))
    if with_figures:
        written += figures(readable, out)
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
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="tabulate runs trained by different versions of the model code (listed in results.md)")
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    if out.is_dir() and not run_dirs(out) and run_dirs(out / "grid"):  # a `make demo` folder: its grid
        out = out / "grid"
        print(f"{a.out_dir} is a demo folder: the table of its grid, {out}\n")
    md, written, _ = make_table(out, not a.no_figures, a.skip_unreadable, a.allow_mixed_code)
    print(md, end="")
    print("\n" + "\n".join(f"wrote {path}" for path in written))
    return 0


def main(argv=None):
    """The command: one line and exit 2 for bad input, 130 when interrupted."""
    return run_main("make_table", command, argv)


if __name__ == "__main__":
    sys.exit(main())
