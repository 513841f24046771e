"""Aggregate training throughput of a grid against one run alone.

    python scripts/tools/throughput.py GRID_OUT SECONDS [--alone OUT SECONDS]

Counts the target words every run under ``GRID_OUT`` trained (``OUT/NAME/seedS/train.log``: per
epoch, fairseq's words per batch times the updates of that epoch) and divides their sum by the
grid's wall time, measured by the caller around the grid command: so the words/s include starting
fairseq, evaluation and the runs that finished early, as a user waiting for the grid sees them.
With ``--alone``, the same for a grid of one run, and the ratio: how many times faster K runs side
by side train than one after another would. Also the evaluator's time (``eval_seconds`` of every
``eval/epochN.json``) against the wall time: near one evaluator per device x 100 %, scoring is what
the grid waits for.
"""
import sys
from fairseq_lnpos.cli import CommandParser
from fairseq_lnpos.errors import LnposError, check, run_main
from fairseq_lnpos.fairseq_log import LogState, number
from fairseq_lnpos.experiments import rundir


def words_trained(log_path):
    """Target words trained in one run, from the per-epoch ``train`` records of its fairseq log."""
    state = LogState()
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            state.feed(line)
    words, before = 0.0, 0
    for epoch in sorted(state.train):
        rec = state.train[epoch]
        wpb, updates = number(rec.get("train_wpb")), number(rec.get("train_num_updates"))
        if wpb is None or updates is None:
            raise LnposError(f"{log_path}: the train record of epoch {epoch} has no train_wpb/train_num_updates; "
                             "was it written by fairseq-train with --log-format json?")
        words += wpb * (updates - before)
        before = updates
    return words


def trained_runs(out):
    """The run folders (:class:`rundir.RunDir`) under a grid's output folder that have a fairseq log;
    an error when there is none."""
    return rundir.grid_run_dirs(out, "the --out folder of a grid run", keep=lambda rd: rd.log_path.exists())


def grid_words(out):
    """``{run folder: words trained}`` for every run under a grid's output folder."""
    return {str(rd.path.relative_to(out)): words_trained(rd.log_path) for rd in trained_runs(out)}


def scoring_seconds(out):
    """(checkpoints scored, seconds the evaluator spent on them) over every run under ``out``; an
    epoch left unscored by ``--eval-every`` has a record without ``eval_seconds``."""
    records = [e for rd in trained_runs(out) for e in rd.record().evals if number(e.eval_seconds) is not None]
    return len(records), sum(number(rec.eval_seconds) for rec in records)


def _seconds(text):
    value = number(text)
    if value is None or not value > 0:
        raise LnposError(f"the wall time must be a number of seconds above 0, got {text!r}")
    return value


def summary(out, seconds):
    """(words per run, total words, words per second of wall time) of one grid."""
    words = grid_words(out)
    total = sum(words.values())
    return words, total, total / seconds


def _main(argv):
    p = CommandParser(prog="throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("grid", help="a grid's --out folder")
    p.add_argument("seconds", help="the grid's wall time in seconds")
    p.add_argument("--alone", nargs=2, metavar=("OUT", "SECONDS"), help="a grid of one run and its wall time")
    args = p.parse_args(argv)
    grid_s = _seconds(args.seconds)
    words, total, rate = summary(args.grid, grid_s)
    for name, w in words.items():
        print(f"  {name}: {w:,.0f} target words")
    print(f"grid: {len(words)} runs, {total:,.0f} target words in {grid_s:.0f} s of wall time: {rate:,.0f} words/s")
    scored, eval_s = scoring_seconds(args.grid)
    print(f"scoring: {scored} checkpoints, {eval_s:.0f} s in the evaluator, {100 * eval_s / grid_s:.0f} % of the wall time")
    if args.alone:
        alone_s = _seconds(args.alone[1])
        alone_words, alone_total, alone_rate = summary(args.alone[0], alone_s)
        check(len(alone_words) == 1, f"{args.alone[0]} holds {len(alone_words)} runs; --alone takes a grid of one run")
        print(f"alone: 1 run, {alone_total:,.0f} target words in {alone_s:.0f} s: {alone_rate:,.0f} words/s")
        print(f"ratio {rate / alone_rate:.2f}: the grid's {len(words)} runs one after another at the pace of the run "
              f"alone would take about {total / alone_rate:.0f} s, side by side they took {grid_s:.0f} s")
    return 0


def main(argv=None):
    return run_main("throughput", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
