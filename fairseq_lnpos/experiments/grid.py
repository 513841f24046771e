"""The grid's command line: ``scripts/grid.sh list | run | sweep | slurm | status``.

    scripts/grid.sh list
    scripts/grid.sh run --dry-run [--only NAME,...]
    scripts/grid.sh run --only 'iwslt-postln-adam-*' --data data-bin/iwslt14.de-en --out grid-out
    scripts/grid.sh run --only 'multi30k-*' --gpus 0 --runs-per-gpu 7 --fp16        # one GPU
    scripts/grid.sh run --arch-size tiny --data data-bin/synthetic --max-epoch 3 --jobs 2   # CPU

A run is a row of runs.py x a seed, in OUT/NAME/seedS (rundir.py). Runs resume after an
interruption (fairseq's checkpoint_last.pt); a finished run (DONE.json) is never redone; a folder
made with another config is refused. commands.py builds the fairseq commands, scheduler.py runs
them, evaluator.py scores every saved epoch on the test set while training goes on.
"""
import argparse
import shlex
import signal
import sys
import threading
from pathlib import Path

from ..common import CONTROL, one_line
from ..data.manifest import read_manifest
from ..errors import INTERRUPT_EXIT, CommandParser, LnposError, finite_float, run_main
from . import runs as R
from .commands import Job, arch_name, batch_plan, check_joined_dictionary, total_updates
from .rundir import check_out_dir, make_out_dir
from .scheduler import Grid


def positive_int(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is too small: give at least {minimum}")
        return value
    return parse


def parse_seeds(text):
    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise LnposError(f"--seeds {text}: give whole numbers separated by commas, e.g. --seeds 1,2,3") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise LnposError(f"--seeds {text}: give distinct non-negative whole numbers, e.g. --seeds 1,2,3")
    return seeds


def parse_data(values):
    """--data DIR (all datasets) or --data DATASET=DIR (repeatable)."""
    out = {}
    for v in values or []:
        key, sep, path = v.partition("=")
        if sep and key in R.DATASETS:
            out[key] = Path(path)
        else:
            out["*"] = Path(v)
    return out


def parse_sets(values, runs):
    """--set [RUN:]key=value: change a field of every selected run (or of one run)."""
    runs = {r.name: r for r in runs}
    for v in values or []:
        target, _, assign = v.rpartition(":") if ":" in v.split("=", 1)[0] else ("", "", v)
        key, sep, value = assign.partition("=")
        if not sep:
            raise LnposError(f"--set {v}: expected key=value or RUN:key=value")
        if target and target not in runs:
            raise LnposError(f"--set {v}: run {target!r} is not selected (see --only)")
        for name in [target] if target else list(runs):
            runs[name] = R.coerce(runs[name], key, value)
    return list(runs.values())


def select_runs(opts):
    """The runs of the table that ``--only``, ``--set`` and ``--max-epoch`` ask for."""
    selected = R.select(opts.only.split(",") if opts.only else None)
    return override(opts, [r.with_defaults() for r in parse_sets(opts.set, selected)])


OVERRIDES = ("max_epoch", "beam", "lenpen", "average_last")  # options that set a field of every run


def override(opts, runs):
    """``runs`` with the fields that ``--max-epoch``, ``--beam``, ``--lenpen`` and ``--average-last`` give."""
    for key in OVERRIDES:
        value = getattr(opts, key, None)
        if value is not None:
            runs = [R.coerce(r, key, str(value)) for r in runs]
    return runs


def make_jobs(opts, runs, dry_run):
    """One Job per run x seed, with its data dir checked (a dry run tolerates missing data)."""
    data, seeds = parse_data(opts.data), parse_seeds(opts.seeds)
    out = Path(opts.out)
    check_out_dir(out)
    jobs, manifests = [], {}
    for r in runs:
        d = data.get(r.dataset, data.get("*", Path(R.DATASETS[r.dataset]["default_data"]))).resolve()
        if d not in manifests:
            manifests[d] = None
            if d.is_dir() or not dry_run:
                if not d.is_dir():
                    raise LnposError(f"data dir {d} not found: prepare it with data-prep/*.sh or pass --data DIR")
                try:
                    manifests[d] = read_manifest(d)
                except LnposError:
                    if not dry_run:
                        raise
        m = manifests[d]
        ds = R.DATASETS[r.dataset]
        langs = (m["source_lang"], m["target_lang"]) if m else (ds["source_lang"], ds["target_lang"])
        if m and not dry_run and not (d / f"dict.{langs[0]}.txt").exists():
            raise LnposError(f"{d} has no dict.{langs[0]}.txt: not a fairseq-preprocess output")
        if m and not dry_run:
            check_joined_dictionary(r, d, langs)
        arch = opts.arch or arch_name(r, opts.arch_size)
        for s in seeds:
            jobs.append(Job(r, s, d, out.resolve() / r.name / f"seed{s}", arch, langs, opts))
    for i, j in enumerate(jobs, 1):
        j.index = i
    return jobs, manifests


def plan_slots(opts, dry_run):
    """Where runs go: a list of CUDA_VISIBLE_DEVICES values (None = the CPU), one per run at once."""
    opts.world = opts.gpus_per_run
    if not opts.gpus:
        if opts.world > 1 and not dry_run:
            need_cuda(opts.world, f"--gpus-per-run {opts.world}")
        if opts.runs_per_gpu != 1:
            raise LnposError("--runs-per-gpu needs --gpus; on the CPU, --jobs sets the runs side by side")
        return [None] * opts.jobs
    if opts.jobs != 1:
        raise LnposError("--jobs is for CPU runs; with --gpus, use --runs-per-gpu K for K runs on each GPU")
    ids = [g.strip() for g in opts.gpus.split(",") if g.strip()]
    if not ids:
        raise LnposError("--gpus lists no GPU: give ids like --gpus 0,1, or drop --gpus to use the default device")
    if len(set(ids)) != len(ids):
        raise LnposError(f"--gpus {opts.gpus}: a GPU is listed twice")
    if len(ids) % opts.world:
        raise LnposError(f"--gpus {opts.gpus}: {len(ids)} GPUs do not split into runs of --gpus-per-run {opts.world}")
    if not dry_run:
        n = need_cuda(len(ids), f"--gpus {opts.gpus}")
        bad = [g for g in ids if not g.isdigit() or int(g) >= n]
        if bad:
            raise LnposError(f"--gpus: no GPU {', '.join(bad)} on this machine (it has {n}: 0..{n - 1})")
    groups = [",".join(ids[i:i + opts.world]) for i in range(0, len(ids), opts.world)]
    return [g for _ in range(opts.runs_per_gpu) for g in groups]


def need_cuda(k, what):
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise LnposError(f"{what}: no CUDA GPU is visible here, and fairseq's multi-GPU training would train "
                         f"nothing on the CPU while exiting 0; drop the option to train on the CPU")
    if k > n:
        raise LnposError(f"{what}: needs {k} GPUs but this machine has {n}")
    return n


def cmd_list(opts):
    rows = [("run", "arch", "init", "optimizer", "lr", "warm-up", "schedule", "length", "avg", "paper", "source")]
    short = lambda text, n: text if len(text) < n else text[:n - 3] + "..."  # noqa: E731
    for r in (x.with_defaults() for x in R.RUNS):
        sched = r.schedule + (f"@{r.decay_epoch}" if r.decay_epoch else "")
        paper = (f"{r.paper_bleu:g} BLEU" if r.paper_bleu is not None else "") or r.paper_note
        length = " / ".join(([f"{r.max_epoch} ep"] if r.max_epoch < 10 ** 6 else [])
                            + ([f"{r.max_update} upd"] if r.max_update else []))
        rows.append((r.name, arch_name(r, opts.arch_size), r.init, r.optimizer, f"{r.lr:g}", r.warmup_label, sched, length,
                     str(r.average_last or ""), short(paper, 50), short(r.source, 60)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"\n{len(R.RUNS)} runs; defaults the paper does not state: see fairseq_lnpos/experiments/runs.py; "
          f"the ref-* rows (other papers' recipes): docs/published.md")
    return 0


def print_dry_run(jobs, manifests):
    for j in jobs:
        m = manifests.get(j.data) or {"source_lang": j.langs[0], "target_lang": j.langs[1],
                                      "post_process": "sentencepiece"}
        total = "<updates per epoch x {e}>"
        if j.run.schedule == "linear" and (manifests.get(j.data) or j.run.max_update):
            total = total_updates(j)
        print(f"# [{j.index}/{len(jobs)}] {j.label} -> {j.run_dir}")
        print(shlex.join(j.train_cmd(total, display=True)))
        if j.opts.no_bleu:
            print("# no test BLEU (--no-bleu): validation loss only\n")
            continue
        scored = (f"epochs {j.opts.eval_every}, {2 * j.opts.eval_every}, ... and the last"
                  if j.opts.eval_every > 1 else "every epoch")
        ev = shlex.join(j.generate_argv(999, m, display=True)).replace("checkpoint999.pt", "checkpoint$E.pt")
        print(f"# test BLEU ({scored}): {ev}  # then score (evaluate.py)")
        if j.run.average_last:
            print(f"# and the parameter average of the last {j.run.average_last} epoch checkpoints "
                  f"(checkpoint.average_checkpoints, as fairseq's scripts/average_checkpoints.py), scored the same way")
        print()


def run_grid(opts, runs):
    """Train and score ``runs`` (Run rows) with the grid's options; returns the exit status."""
    slots = plan_slots(opts, opts.dry_run)
    if opts.fp16 and not opts.dry_run:
        need_cuda(1, "--fp16")
    jobs, manifests = make_jobs(opts, runs, opts.dry_run)
    for j in jobs:
        j.dir.check()  # every state file of the run: a bad one stops the grid before it starts
        j.dir.check_config(j.config_hash())
        batch_plan(j.run, opts.world)
    if opts.dry_run:
        print_dry_run(jobs, manifests)
        return 0
    make_out_dir(opts.out)
    grid = Grid(jobs, opts, slots)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: grid.kill_all())
    try:
        grid.say(f"{len(jobs)} runs -> {Path(opts.out).resolve()}, {len(slots)} at once")
        grid.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if grid.stop.is_set():
        print("grid: interrupted; run the same command again to resume", file=sys.stderr)
        return INTERRUPT_EXIT
    summary = "stability map: scripts/stability_map.sh" if getattr(opts, "cmd", None) == "sweep" \
        else "table: scripts/make_table.sh"
    grid.say(f"all runs processed; {summary} {opts.out}")
    return 1 if grid.failed else 0


def add_run_options(r):
    """The options of ``run`` (``sweep`` shares them)."""
    r.add_argument("--dry-run", action="store_true", help="print the fairseq commands and exit")
    r.add_argument("--data", action="append", metavar="[DATASET=]DIR",
                   help="binarized data dir for every run, or per dataset (iwslt14=DIR, multi30k=DIR, wmt14=DIR)")
    r.add_argument("--out", default="grid-out", help="output folder (default grid-out)")
    r.add_argument("--seeds", default="1", help="comma-separated seeds (default 1, fairseq's default)")
    r.add_argument("--arch-size", choices=("paper", "tiny"), default="paper",
                   help="tiny: the transformer_*_tiny archs (CPU)")
    r.add_argument("--arch", help="use this fairseq arch for every run (overrides --arch-size)")
    r.add_argument("--set", action="append", metavar="[RUN:]KEY=VALUE",
                   help="change a field of the run table (runs.py) for every selected run or one run")
    r.add_argument("--task", help="fairseq task for every run (e.g. translation_lnpos)")
    r.add_argument("--fairseq-args", default="", help="extra fairseq-train flags, one string")
    r.add_argument("--gen-args", default="", help="extra fairseq-generate flags, one string")
    r.add_argument("--beam", type=positive_int(1), help="beam size for every run (default: the run's, 5 for the paper)")
    r.add_argument("--lenpen", type=finite_float, help="length penalty for every run (default: the run's, 1.2 for the paper)")
    r.add_argument("--average-last", type=positive_int(0), metavar="N",
                   help="also score the parameter average of each run's last N epoch checkpoints "
                        "(default: the run's, 10 for the ref-* rows, else 0 = none)")
    r.add_argument("--uncapped-len", action="store_true",
                   help="score with fairseq's default output length (200 tokens) instead of 1.2 x source + 10")
    r.add_argument("--eval-every", type=positive_int(1), default=1, metavar="N",
                   help="score the test set every N epochs (and always the last; default 1)")
    r.add_argument("--evaluators", type=positive_int(1), default=1, metavar="N",
                   help="scoring processes per device, taking checkpoints from one queue (default 1)")
    r.add_argument("--no-bleu", action="store_true", help="no test BLEU: validation loss only")
    r.add_argument("--patience", type=positive_int(0), default=0, metavar="N",
                   help="stop a run as diverged when its training loss stays above its first loss for N "
                        "logged updates (0: only a non-finite loss counts; default 0)")
    r.add_argument("--gpus", help="GPU ids, e.g. 0,1: runs side by side on them")
    r.add_argument("--runs-per-gpu", type=positive_int(1), default=1, metavar="K",
                   help="with --gpus: K runs at once on each GPU (group); default 1")
    r.add_argument("--jobs", type=positive_int(1), default=1,
                   help="CPU only: runs side by side, sharing the cores")
    r.add_argument("--gpus-per-run", type=positive_int(1), default=1,
                   help="GPUs per run (fairseq distributed); --update-freq keeps the paper's batch")
    r.add_argument("--fp16", action="store_true", help="mixed precision (GPU only)")
    r.add_argument("--log-interval", type=positive_int(1), default=1,
                   help="fairseq --log-interval (1: divergence is located to the update)")
    r.add_argument("--keep-checkpoints", action="store_true",
                   help="keep checkpointN.pt after scoring (default: keep only _best and _last)")


def build_parser():
    p = CommandParser(prog="grid.sh", description="The paper's experiment grid on fairseq.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=CommandParser)
    ls = sub.add_parser("list", help="show the table of runs")
    ls.add_argument("--arch-size", choices=("paper", "tiny"), default="paper")
    r = sub.add_parser("run", help="train and score runs (or print their commands with --dry-run)")
    r.add_argument("--only", help="comma-separated run names or globs (default: every run)")
    r.add_argument("--max-epoch", type=positive_int(1), help="override the epochs of every run")
    add_run_options(r)
    w = sub.add_parser("sweep", help="a stability sweep: archs x learning rates x warm-ups x depths (sweep.py)")
    from . import sweep

    sweep.add_options(w)
    add_run_options(w)
    w.set_defaults(out="sweep-out", patience=50, no_bleu=True)
    from . import slurm

    s = sub.add_parser("slurm", conflict_handler="resolve",
                       help="submit runs as one SLURM job array of `run` units (slurm.py; --dry-run prints it)")
    s.add_argument("--only", help="comma-separated run names or globs (default: every run)")
    s.add_argument("--max-epoch", type=positive_int(1), help="override the epochs of every run")
    add_run_options(s)
    slurm.add_options(s)
    st = sub.add_parser("status", help="one line per run of an --out folder: status, epochs, best BLEU")
    st.add_argument("out_dir", help="the --out folder of run or slurm")
    return p


def run_options(**values):
    """The options of ``grid.sh run`` with their defaults, changed by ``values`` (Python callers)."""
    opts = build_parser().parse_args(["run"])
    unknown = set(values) - set(vars(opts))
    if unknown:
        raise TypeError(f"unknown grid options: {', '.join(sorted(unknown))}")
    vars(opts).update(values)
    return opts


def check_one_line(opts):
    """No control character (newline, tab ...) in any text option: a value may reach a generated
    script (grid.sh slurm), a log line or a table, where it would start a new line."""
    for dest, value in vars(opts).items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and CONTROL.search(v):
                raise LnposError(f"--{dest.replace('_', '-')} {one_line(v)}: holds a control character (a newline, "
                                 f"a tab ...): give the value on one line without them")


def command(argv=None):
    opts = build_parser().parse_args(argv)
    check_one_line(opts)
    if opts.cmd == "list":
        return cmd_list(opts)
    if opts.cmd in ("slurm", "status"):
        from . import slurm

        opts.argv = list(sys.argv[1:] if argv is None else argv)[1:]
        return slurm.cmd_slurm(opts) if opts.cmd == "slurm" else slurm.cmd_status(opts)
    if opts.cmd == "sweep":
        from . import sweep

        runs = sweep.sweep_runs(opts)
        return run_grid(opts, override(opts, [R.coerce(r, "max_epoch", "1000000") for r in parse_sets(opts.set, runs)]))
    return run_grid(opts, select_runs(opts))


def main(argv=None):
    """The command: one line and exit 2 for bad input, 130 when interrupted."""
    return run_main("grid", command, argv)


if __name__ == "__main__":
    sys.exit(main())
