"""`make demo`: the paper's effect on a CPU in minutes, on data the project generates.

    python -m fairseq_lnpos.demo [--out demo-out] [--seeds 1,2] [--with-keel] [--with-admin]
                                 [--with-tfixup] [--with-<further variant>] [--quick]
    python -m fairseq_lnpos.demo --data multi30k [--orig DIR | --bin DIR]      # `make demo-real`

``--data multi30k`` runs the same steps on real German-English text: Multi30k task 1 prepared by
data-prep/prepare-multi30k.sh's code into OUT/data (downloaded, or from ``--orig DIR``; ``--bin DIR``
takes a data dir prepared before), the `real-*` rows of experiments/runs.py (Post-LN without and
with warm-up, Pre-LN without warm-up, sized for two CPU cores), tokenized BLEU and sacreBLEU on
test2016 (docs/results.md, "Real text on a CPU").

Steps (each resumes; a finished demo re-runs in seconds):
 1. the synthetic corpus (data-prep/make-synthetic.sh: 4500 training pairs, 300 valid, 300 test);
 2. a grid of `_tiny` runs (the `demo-*` rows of experiments/runs.py): Post-LN without warm-up,
    Post-LN with 100 warm-up updates, Pre-LN and DeepNorm without warm-up (Keel, Admin, T-Fixup and
    the further variants of ``variants.FURTHER`` on request), Adam lr 1e-3 (constant after the
    warm-up), 512-token batches, 3 epochs (~100 updates each), per-layer gradient norms logged at every update, test BLEU per epoch;
 3. the results table (scripts/make_table.sh): demo-out/results.csv, results.md, fig_demo.png;
 4. gradient norms of the first updates (grad_norms_first_updates.png);
 5. Fig. 3 at initialization at the tiny size (fig3/);
 6. a summary over seeds, saying whether the effect shows, and the time spent scoring against the
    time spent training.

The settings are the same for every architecture; with them Post-LN with warm-up and Pre-LN learn
the task within the 300 updates while Post-LN without warm-up does not (docs/results.md).
"""
import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from .common import GRAD_NORMS_JSONL
from .errors import check, run_main
from .experiments.runs import BY_NAME, DEMO_OPTIONAL, DEMO_ROWS
from .variants import FURTHER

RUNS = list(DEMO_ROWS["synthetic"])
# --with-keel, --with-admin, --with-tfixup, --with-dyt, --with-periln, ...: demo-<name>-nowu (real-<name>-nowu)
OPTIONAL = ("keel", "admin", "tfixup") + FURTHER
DATA = {"synthetic": "synthetic corpus", "multi30k": "Multi30k De-En (real text)"}  # --data: step 1's label
MULTI30K_BPE = 8000  # joint sentencepiece pieces of `--data multi30k` (docs/results.md, "Real text on a CPU")
FIRST_UPDATES = 100  # updates shown in the gradient-norm figure


def log(msg):
    print(f"[demo] {msg}", flush=True)


def make_data(out, quick, data="synthetic", orig=None, prepared=None):
    """The demo's binarized data dir: the generated corpus, or Multi30k (:func:`multi30k_data`)."""
    if data == "multi30k":
        return multi30k_data(out, orig, prepared)
    from .data import synthetic

    sizes = dict(train=600, valid=100, test=100) if quick else dict(train=4500, valid=300, test=300)
    synthetic.prepare(out / "data" / "text", out / "data" / "bin", seed=1, **sizes)
    return out / "data" / "bin"


def multi30k_data(out, orig=None, prepared=None):
    """``prepared`` (a data dir of data-prep/prepare-multi30k.sh, checked by its manifest), or Multi30k
    prepared into OUT/data from ``orig`` (the six published files) or downloaded; resumes, and a
    prepared folder is reused."""
    from .data import multi30k
    from .data.manifest import read_manifest

    if prepared:
        check(not orig, "give --orig (prepare the data) or --bin (a prepared data dir), not both")
        dataset = read_manifest(prepared).get("dataset")
        check(dataset == "multi30k.de-en", f"--bin {prepared}: a data dir of {dataset}, not Multi30k: pass the "
                                           f"--bin folder of data-prep/prepare-multi30k.sh")
        return Path(prepared)
    multi30k.prepare(out / "data" / "text", out / "data" / "bin", orig=orig, workers=2, bpe_size=MULTI30K_BPE)
    return out / "data" / "bin"


def grid_options(out, data, runs, seeds, jobs, quick, dry_run=False):
    """The demo's grid (``scripts/grid.sh run`` options) of ``runs`` on the data dir ``data``."""
    from .experiments import options

    # --quick: one epoch of the generated corpus; a few updates of Multi30k's
    quick_set = ["max_update=20"] if quick and BY_NAME[runs[0]].dataset == "multi30k_cpu" else None
    return options.RunOptions(only=",".join(runs), data=[str(data)], out=str(out / "grid"), arch_size="tiny",
                              seeds=seeds, jobs=jobs, task="translation_lnpos",
                              fairseq_args="--log-grad-norms --grad-norm-interval 1",
                              max_epoch=1 if quick else None, set=quick_set, dry_run=dry_run)


def run_grid(out, data, runs, seeds, jobs, quick):
    from .experiments import grid, plan

    opts = grid_options(out, data, runs, seeds, jobs, quick)
    status = grid.run_grid(opts, plan.select_runs(opts))
    check(status == 0, f"the grid stopped with status {status} (message above); `make demo` resumes it")


def make_table(out):
    """The results table of the demo's grid, copied to ``out``; returns its rows (report.py)."""
    from .experiments import report

    _, _, rows = report.make_table(out / "grid")
    for name in ("results.csv", "results.md"):
        shutil.copyfile(out / "grid" / name, out / name)
    return rows


def time_split(rows):
    """(seconds fairseq-train ran, seconds the evaluator spent scoring) over the demo's runs."""
    records = [r["record"] for r in rows if "record" in r]
    train = sum((rec.done or {}).get("train_seconds") or 0.0 for rec in records)
    score = sum(e.get("eval_seconds") or 0.0 for rec in records for e in rec.evals)
    return train, score


def grad_norm_figure(out, rows, runs, seed):
    """Total and top-decoder-layer FFN W2 gradient norms over the first updates, one line per run of
    ``runs`` (its row of the table, ``rows``) with seed ``seed``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .analysis.train_curves import read_jsonl

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for row in rows:
        if row["run"] not in runs or str(row["seed"]) != seed or "record" not in row:
            continue
        path, run = row["record"].dir.save_dir / GRAD_NORMS_JSONL, row["run"]
        if not path.exists():
            continue
        updates, series = read_jsonl(path)  # sorted; a resumed run's last record per update
        n = sum(1 for u in updates if u <= FIRST_UPDATES)
        top = max(int(g.split("/")[1]) for g in series if g.startswith("decoder/") and g.count("/") == 2)
        for ax, key in zip(axes, ("total", f"decoder/{top}/fc2")):
            ax.plot(updates[:n], series[key][:n], label=run.replace("demo-", ""))
            ax.set_title(f"gradient norm: {key}")
    for ax in axes:
        ax.set_xlabel("update")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"per-layer gradient norms of the mean loss, first {FIRST_UPDATES} updates (seed {seed})")
    fig.tight_layout()
    path = out / "grad_norms_first_updates.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def fig3(out, archs, quick):
    from .analysis import init_grad

    size = dict(depths=[6, 8], seeds=1, tokens=256) if quick else dict(depths=[6, 8, 10, 12, 14], seeds=2)
    init_grad.run(init_grad.Options(out=str(out / "fig3"), size="tiny", archs=list(archs), **size))
    return out / "fig3"


def summarize(rows):
    """Mean and spread over seeds of best tokenized BLEU and best validation loss, per run."""
    by_run = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    out = {}
    for run, rs in by_run.items():
        entry = {"seeds": len(rs), "status": sorted({r["status"] for r in rs})}
        for key in ("best_bleu_tok", "best_valid_loss"):
            vals = [r[key] for r in rs if r.get(key) is not None]
            if vals:
                entry[key] = (statistics.mean(vals), min(vals), max(vals))
        out[run] = entry
    return out


def verdict(summary, need=tuple(RUNS[:3])):
    """Does Post-LN without warm-up come out clearly worse than both references? ``need``: the rows of
    Post-LN without warm-up, Post-LN with warm-up and Pre-LN without warm-up (DEMO_ROWS)."""
    if not all("best_bleu_tok" in summary.get(r, {}) for r in need):
        return "the effect cannot be judged: some of the three core runs have no BLEU yet"
    bad, wu, pre = (summary[r]["best_bleu_tok"] for r in need)
    shown = bad[2] <= 0.5 * min(wu[1], pre[1])  # the worst seed of each reference vs the best no-warm-up seed
    word = "SHOWN" if shown else "NOT shown"
    return (f"effect {word}: Post-LN without warm-up reaches tokenized BLEU {bad[0]:.1f} (best seed {bad[2]:.1f}); "
            f"with warm-up {wu[0]:.1f} (worst seed {wu[1]:.1f}); Pre-LN without warm-up {pre[0]:.1f} (worst seed {pre[1]:.1f})")


def main(argv=None):
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    p = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=tuple(DATA), default="synthetic",
                   help="synthetic: the generated corpus (default); multi30k: real German-English text "
                        "(`make demo-real`)")
    p.add_argument("--orig", help="--data multi30k: the folder of the six published .gz files (no download)")
    p.add_argument("--bin", help="--data multi30k: a data dir data-prep/prepare-multi30k.sh prepared (no preparation)")
    p.add_argument("--out", help="output folder (default demo-out/, with --data multi30k demo-real-out/)")
    p.add_argument("--seeds", default="1,2", help="seeds, comma-separated (default 1,2)")
    for name in OPTIONAL:
        p.add_argument(f"--with-{name.replace('_', '-')}", action="store_true",
                       help=f"add demo-{name}-nowu, about 2 more minutes (--data multi30k: real-{name}-nowu)")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side on the CPU (default 2)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the grid's fairseq commands (rows x seeds) and exit; prepares no data, trains nothing")
    p.add_argument("--quick", action="store_true",
                   help="CI check: 600 training pairs, one epoch, small Fig. 3 (shows no effect)")
    args = p.parse_args(argv)
    if args.data != "multi30k" and (args.orig or args.bin):
        p.error("--orig and --bin are options of --data multi30k")
    t0 = time.time()
    out = Path(args.out or {"synthetic": "demo-out", "multi30k": "demo-real-out"}[args.data])
    extra = [name for name in OPTIONAL if getattr(args, f"with_{name}")]
    core = list(DEMO_ROWS[args.data])
    runs = core + [DEMO_OPTIONAL[args.data].format(name) for name in extra if DEMO_OPTIONAL[args.data].format(name) not in core]
    if args.dry_run:
        from .experiments import grid, plan

        opts = grid_options(out, Path(args.bin) if args.bin else out / "data" / "bin", runs, args.seeds, args.jobs,
                            args.quick, dry_run=True)
        return grid.run_grid(opts, plan.select_runs(opts))
    out.mkdir(parents=True, exist_ok=True)
    archs = list(dict.fromkeys(BY_NAME[r].ln for r in runs))
    inits = sorted({BY_NAME[r].init for r in runs})
    steps = [DATA[args.data], f"grid of {len(runs)} runs x seeds {args.seeds} (initialization "
             f"{', '.join(inits)})", "results table",
             "gradient norms of the first updates", "Fig. 3 at initialization (tiny size)"]
    say = lambda i: log(f"step {i}/{len(steps)}: {steps[i - 1]} (elapsed {time.time() - t0:.0f} s)")  # noqa: E731

    say(1)
    data = make_data(out, args.quick, args.data, args.orig, args.bin)
    say(2)
    run_grid(out, data, runs, args.seeds, args.jobs, args.quick)
    say(3)
    rows = make_table(out)
    say(4)
    first_seed = args.seeds.split(",")[0].strip()
    grad_png = grad_norm_figure(out, rows, runs, first_seed)
    say(5)
    fig3_dir = fig3(out, archs, args.quick)

    summary = summarize(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print()
    print("| run | seeds | tok BLEU best, mean (min-max) | best valid loss, mean (min-max) | status |")
    print("|---|---|---|---|---|")
    for run in runs:
        s = summary.get(run, {})
        fmt = lambda k: "%.2f (%.2f-%.2f)" % s[k] if k in s else ""  # noqa: E731
        print(f"| {run} | {s.get('seeds', 0)} | {fmt('best_bleu_tok')} | {fmt('best_valid_loss')} | "
              f"{', '.join(s.get('status', []))} |")
    print()
    log(verdict(summary, tuple(core[:3])))
    what = "a generated task" if args.data == "synthetic" else "real text (Multi30k test2016, the tiny model)"
    log(f"this is a CPU-scale illustration on {what}, not the paper's IWSLT14 numbers; "
        "see README.md for how it relates to them")
    log(f"table: {out / 'results.md'} and {out / 'results.csv'} (per seed)")
    log(f"figures: {out / 'grid' / 'fig_demo.png'} (BLEU and validation loss per epoch), {grad_png}, "
        f"{fig3_dir / 'fig3.png'}, {fig3_dir / 'lemma2.png'}")
    train, score = time_split(rows)
    if train:
        log(f"scoring took {score:.0f} s of evaluator time against {train:.0f} s of training "
            f"(ratio {score / train:.2f})")
    log(f"total wall time {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_main("demo", main))
