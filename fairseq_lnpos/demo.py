"""`make demo`: the paper's effect on a CPU in minutes, on data the project generates.

    python -m fairseq_lnpos.demo [--out demo-out] [--seeds 1,2] [--with-keel] [--with-admin]
                                 [--with-tfixup] [--with-<further variant>] [--quick]

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
from .experiments.runs import BY_NAME
from .variants import FURTHER

RUNS = ["demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu", "demo-deepnorm-nowu"]
# --with-keel, --with-admin, --with-tfixup, --with-dyt, --with-periln, ...: demo-<name>-nowu
OPTIONAL = ("keel", "admin", "tfixup") + FURTHER
FIRST_UPDATES = 100  # updates shown in the gradient-norm figure


def log(msg):
    print(f"[demo] {msg}", flush=True)


def make_data(out, quick):
    from .data import synthetic

    sizes = dict(train=600, valid=100, test=100) if quick else dict(train=4500, valid=300, test=300)
    synthetic.prepare(out / "data" / "text", out / "data" / "bin", seed=1, **sizes)
    return out / "data" / "bin"


def run_grid(out, data, runs, seeds, jobs, quick):
    from .experiments import grid, options, plan

    opts = options.RunOptions(only=",".join(runs), data=[str(data)], out=str(out / "grid"), arch_size="tiny",
                           seeds=seeds, jobs=jobs, task="translation_lnpos",
                           fairseq_args="--log-grad-norms --grad-norm-interval 1",
                           max_epoch=1 if quick else None)
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


def verdict(summary):
    """Does Post-LN without warm-up come out clearly worse than both references?"""
    need = ("demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu")
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
    p.add_argument("--out", default="demo-out", help="output folder (default demo-out/)")
    p.add_argument("--seeds", default="1,2", help="seeds, comma-separated (default 1,2)")
    for name in OPTIONAL:
        p.add_argument(f"--with-{name.replace('_', '-')}", action="store_true",
                       help=f"add demo-{name}-nowu (about 2 more minutes)")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side on the CPU (default 2)")
    p.add_argument("--quick", action="store_true",
                   help="CI check: 600 training pairs, one epoch, small Fig. 3 (shows no effect)")
    args = p.parse_args(argv)
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = [name for name in OPTIONAL if getattr(args, f"with_{name}")]
    runs = RUNS + [f"demo-{name}-nowu" for name in extra]
    archs = ["postln", "preln", "deepnorm"] + extra
    inits = sorted({BY_NAME[r].init for r in runs})
    steps = ["synthetic corpus", f"grid of {len(runs)} runs x seeds {args.seeds} (initialization "
             f"{', '.join(inits)})", "results table",
             "gradient norms of the first updates", "Fig. 3 at initialization (tiny size)"]
    say = lambda i: log(f"step {i}/{len(steps)}: {steps[i - 1]} (elapsed {time.time() - t0:.0f} s)")  # noqa: E731

    say(1)
    data = make_data(out, args.quick)
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
    log(verdict(summary))
    log("this is a CPU-scale illustration on a generated task, not the paper's IWSLT14 numbers; "
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
