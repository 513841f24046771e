"""The grid's command line: ``scripts/grid.sh list | run | sweep | slurm | status | migrate``.

    scripts/grid.sh list
    scripts/grid.sh run --dry-run [--only NAME,...]
    scripts/grid.sh run --only 'iwslt-postln-adam-*' --data data-bin/iwslt14.de-en --out grid-out
    scripts/grid.sh run --only 'multi30k-*' --gpus 0 --runs-per-gpu 7 --fp16        # one GPU
    scripts/grid.sh run --arch-size tiny --data data-bin/synthetic --max-epoch 3 --jobs 2   # CPU

A run is a row of runs.py x a seed, in OUT/NAME/seedS (rundir.py). Runs resume after an
interruption (fairseq's checkpoint_last.pt); a finished run (DONE.json) is never redone; a folder
made with another config is refused. options.py defines the run options, plan.py picks the runs,
their jobs and slots, commands.py builds the fairseq commands, scheduler.py runs them, evaluator.py
scores every saved epoch on the test set while training goes on.
"""
import shlex
import signal
import sys
import threading
from dataclasses import fields
from pathlib import Path

from .. import provenance
from ..checkpoint import check_resumable
from ..common import CONTROL, one_line, refuse_link
from ..cli import CommandParser
from ..errors import INTERRUPT_EXIT, MAX_SEED, LnposError, StateError, run_main
from . import runs as R
from . import status, sweep
from .commands import batch_plan, run_arch, total_updates
from .options import ListOptions, MigrateOptions, RunOptions, SlurmOptions, StatusOptions, SweepOptions
from .plan import check_cpu_bf16, keep_axes, make_jobs, need_cuda, override, parse_sets, plan_slots, select_runs
from .rundir import make_out_dir
from .scheduler import Grid


LIST_WIDTH = 100  # columns of the compact view


def cmd_list(opts):
    """The run table: compact (run, init, length, the paper's number or words; LIST_WIDTH columns),
    or with ``--wide`` every column."""
    def short(text, n):
        return text if len(text) <= n else text[:max(n - 3, 0)] + "..."

    wide = ("run", "arch", "init", "optimizer", "lr", "warm-up", "schedule", "length", "avg", "paper", "source")
    rows = []
    for r in (x.with_defaults() for x in R.RUNS):
        sched = r.schedule + (f"@{r.decay_epoch}" if r.decay_epoch else "")
        paper = (f"{r.paper_bleu:g} BLEU" if r.paper_bleu is not None else "") or r.paper_note
        length = " / ".join(([f"{r.max_epoch} ep"] if r.max_epoch < 10 ** 6 else [])
                            + ([f"{r.max_update} upd"] if r.max_update else []))
        rows.append(dict(zip(wide, (r.name, run_arch(r, opts.arch_size), r.init, r.optimizer, f"{r.lr:g}",
                                    r.warmup_label, sched, length, str(r.average_last or ""), paper,
                                    r.source or "-"))))
    if opts.wide:
        cols, table = wide, [dict(zip(wide, wide))] + rows
    else:
        cols = ("run", "init", "length", "paper")
        table = [dict(zip(cols, cols))] + rows
        room = LIST_WIDTH - sum(max(len(row[c]) for row in table) + 2 for c in cols[:-1])
        table = [{**row, "paper": short(row["paper"], room)} for row in table]
    widths = {c: max(len(row[c]) for row in table) for c in cols}
    for row in table:
        print("  ".join(row[c].ljust(widths[c]) for c in cols).rstrip())
    print(f"\n{len(R.RUNS)} runs" + ("" if opts.wide else "; --wide: every column (arch, optimizer, lr, warm-up, "
                                     "schedule, avg, source)"))
    print("defaults the paper does not state: fairseq_lnpos/experiments/runs.py")
    print("the ref-* rows (other papers' recipes): docs/published.md")
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


def extend(jobs, write=True):
    """``--extend``: reopen the runs whose recorded config differs only in fewer epochs; every run is
    checked before the first is changed."""
    model_code = provenance.model_code_hash()
    for j in jobs:
        j.dir.extend(j.config(), j.config_hash(), model_code, write=False)
    for j in jobs:
        was = j.dir.extend(j.config(), j.config_hash(), model_code, write=write)
        if was is not None:
            print(f"{j.label}: {'continues' if write else 'would continue'} from epoch {was} to {j.run.max_epoch}")


def check_seed(job):
    """fairseq seeds numpy with the seed plus the epoch (its batch order, data/iterators.py), which must
    stay below 2^32: a seed near the top fails at a later epoch, and at every retry. The epochs of a
    run are its max_epoch, or at most its max_update (an update or more per epoch), and one more
    (fairseq makes the next epoch's iterator when one ends)."""
    run = job.run
    budgets = [b for b in (run.max_epoch, run.max_update) if b]
    if not budgets:
        return
    epochs = min(budgets) + 1
    if job.seed + epochs > MAX_SEED:
        raise LnposError(f"--seeds {job.seed}: fairseq seeds numpy with the seed plus the epoch, which must stay "
                         f"below 2^32, so with {run.name}'s {epochs - 1} epochs a seed is at most "
                         f"{MAX_SEED - epochs}: give a smaller seed")


def check_job(job, config, model_code, dry_run):
    """What would stop a run later, refused before anything starts: a seed too large for its epochs, a
    folder another grid works on now, and for a run to resume (its recorded ``config``): a resume by other
    model code than the one that started its training, a checkpoint_last.pt that cannot be resumed from."""
    check_seed(job)
    if dry_run:
        return
    job.dir.check_free()
    if config is None:  # nothing to resume (a folder without config.json is the scheduler's to refuse)
        return
    rd = job.dir
    rd.check_resume(model_code)
    done = rd.done()
    if not rd.trained and not (done is not None and done.outcome.final) and rd.last_checkpoint.exists():
        check_resumable(rd.last_checkpoint)


def run_grid(opts, runs):
    """Train and score ``runs`` (Run rows) with the grid's options; returns the exit status."""
    check_cpu_bf16(opts)
    slots = plan_slots(opts, opts.dry_run)
    if opts.fp16 and not opts.dry_run:
        need_cuda(1, "--fp16")
    jobs, manifests = make_jobs(opts, runs, opts.dry_run)
    if getattr(opts, "extend", False):
        extend(jobs, write=not opts.dry_run)
    for j in jobs:
        config, done = j.dir.check(), j.dir.done()  # every state file of the run: a bad one stops the grid before it starts
        if config is None and done is not None and done.outcome.final:  # would be skipped, and no reader takes it
            raise StateError(f"{j.dir.path} holds the outcome of a run (DONE.json: {one_line(done.text)}) but no "
                             f"config.json, so no table or map can read it: move the folder away or delete it, "
                             f"then run again")
        j.dir.check_config(j.config_hash(), j.config())
        check_job(j, config, provenance.model_code_hash(), opts.dry_run)
        refuse_link(j.dir.log_path)
        batch_plan(j.run, opts.world)
    for log in ("progress.log", "evaluator.log"):  # appended to while the runs go on
        refuse_link(Path(opts.out) / log)
    if opts.dry_run:
        print_dry_run(jobs, manifests)
        return 0
    make_out_dir(opts.out)
    provenance.pin()  # the runs record the code the workers start with
    grid = Grid(jobs, opts, slots)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: grid.kill_all())
    try:
        grid.say(f"{len(jobs)} runs -> {Path(opts.out).resolve()}, {len(slots)} at once "
                 f"(the full progress lines: {grid.progress_log})")
        with grid.cadence:
            grid.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if grid.stop.is_set():
        print("grid: interrupted; run the same command again to resume", file=sys.stderr)
        return INTERRUPT_EXIT
    summary = "stability map: scripts/stability_map.sh" if isinstance(opts, SweepOptions) \
        else "table: scripts/make_table.sh"
    grid.say(f"all runs processed; {summary} {shlex.quote(str(opts.out))}")
    return 1 if grid.failed else 0


def build_parser():
    p = CommandParser(prog="grid.sh", description="The paper's experiment grid on fairseq.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=CommandParser)
    ListOptions.add_command(sub, "list", help="show the table of runs")
    RunOptions.add_command(sub, "run", help="train and score runs (or print their commands with --dry-run)")
    SweepOptions.add_command(sub, "sweep", help="a stability sweep: archs x learning rates x warm-ups x depths (sweep.py)",
                             conflict_handler="resolve")
    SlurmOptions.add_command(sub, "slurm", conflict_handler="resolve",
                             help="submit runs as one SLURM job array of `run` units (slurm.py; --dry-run prints it)")
    StatusOptions.add_command(sub, "status", help="one line per run of an --out folder: status, epochs, best BLEU")
    MigrateOptions.add_command(sub, "migrate", help="bring an --out folder of an earlier version to the current run files")
    p.commands = list(sub.choices)
    return p


def check_one_line(opts):
    """No control character (newline, tab ...) in any text option: a value may reach a generated
    script (grid.sh slurm), a log line or a table, where it would start a new line."""
    for f in fields(opts):
        dest, value = f.name, getattr(opts, f.name)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and CONTROL.search(v):
                raise LnposError(f"--{dest.replace('_', '-')} {one_line(v)}: holds a control character (a newline, "
                                 f"a tab ...): give the value on one line without them")


def command(argv=None):
    parser = build_parser()
    if not list(sys.argv[1:] if argv is None else argv):
        raise LnposError(f"give a command: {', '.join(parser.commands)} (grid.sh COMMAND --help says what it does)")
    ns = parser.parse_args(argv)
    opts = ns.options.from_namespace(ns)
    check_one_line(opts)
    if ns.cmd == "list":
        return cmd_list(opts)
    if ns.cmd == "status":
        return status.cmd_status(opts)
    if ns.cmd == "migrate":
        from .migrate import cmd_migrate

        return cmd_migrate(opts)
    if ns.cmd == "slurm":
        from . import slurm  # submitit takes about a second to import; no other command needs it

        opts.argv = list(sys.argv[1:] if argv is None else argv)[1:]
        return slurm.cmd_slurm(opts)
    if ns.cmd == "sweep":
        keep_axes(opts)
        return run_grid(opts, override(opts, parse_sets(opts.set, sweep.sweep_runs(opts))))
    return run_grid(opts, select_runs(opts))


def main(argv=None):
    """The command: one line and exit 2 for bad input, 130 when interrupted."""
    return run_main("grid", command, argv)


if __name__ == "__main__":
    sys.exit(main())
