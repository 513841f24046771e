"""Calibrating early stopping: replay the rule over a sweep made without it.

    python -m fairseq_lnpos.analysis.early_stop_replay OUT [--after F] [--ratio R] [--progress P]
                                                          [--window W] [--scan]

OUT is a sweep's folder (``grid.sh sweep --no-early-stop``): every run that finished is replayed
update by update from its train.log (:func:`~fairseq_lnpos.experiments.early_stop.first_stop`) and
judged by how it really ended, each seed alone against its cell's threshold (:mod:`.verdict`):
"good" (it trains and is within the good limit of its architecture and depth), "trains" (only the
lax rule), "not trained". Printed: the share of runs that end "not trained" that the rule stops and
at which fraction of the budget, every stop of a run that trains (a stop of a good run is a false
stop; the calibration asks for none), and the training time saved (fairseq-train's wall seconds
from DONE.json, pro rata of the updates not run). ``--scan`` prints the same for a grid of
``--after`` x ``--ratio`` values.
"""
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from ..errors import CommandParser, LnposError, fraction, run_main
from ..experiments.early_stop import DEFAULT_RULE, StopRule, first_stop
from ..fairseq_log import LogState
from . import stability as S
from .verdict import DEFAULT_RATIO


def outcomes(out):
    """[(record, how it ended: good | trains | not trained, [(update, loss)], budget)] of the runs of
    ``out`` that finished. A folder where runs were stopped early is refused: how a stopped run would
    have ended is not known, and leaving it out would leave out the runs the rule is to stop."""
    records = S.load_records(out)
    stopped = [r for r in records if r.outcome == "stopped early"]
    if stopped:
        raise LnposError(f"{out}: {len(stopped)} of its {len(records)} runs were stopped early ({stopped[0].path}, ...), "
                         f"and the replay judges each run by how it ended at its budget: replay a sweep made with "
                         f"--no-early-stop")
    cells = {(c.variant, c.layers, c.warmup, c.lr): c for c in S.make_cells(records)}
    rows = []
    for r in records:
        if r.outcome != "finished":
            continue
        budget = dict(r.settings).get("max_update")
        log = Path(r.path) / "train.log"
        if not budget or not log.is_file():
            continue
        losses = LogState.of(log.read_text(encoding="utf-8", errors="replace")).losses
        c = cells[r.variant, r.layers, r.warmup, r.lr]
        trained = (r.final_valid_loss is not None and r.initial_loss is not None
                   and r.final_valid_loss <= DEFAULT_RATIO * r.initial_loss)
        good = trained and c.good_limit is not None and r.final_valid_loss <= c.good_limit
        rows.append((r, "good" if good else "trains" if trained else "not trained", losses, budget))
    return rows


def replay(rows, rule):
    """The rule over ``rows`` (:func:`outcomes`): a dict of what it stops and saves."""
    stops = [(r, how, first_stop(losses, budget, rule), budget) for r, how, losses, budget in rows]
    hopeless = [s for s in stops if s[1] == "not trained"]
    caught = [s for s in hopeless if s[2]]
    fractions = [hit[0] / budget for _, _, hit, budget in caught]
    seconds = sum(r.train_seconds or 0.0 for r, _, _, _ in stops)
    saved = sum((r.train_seconds or 0.0) * (1 - hit[0] / budget) for r, _, hit, budget in stops if hit)
    return {"runs": len(stops), "not_trained": len(hopeless), "stopped": len(caught),
            "fraction_median": statistics.median(fractions) if fractions else None,
            "fraction_max": max(fractions) if fractions else None,
            "false_good": [(r, hit) for r, how, hit, _ in stops if hit and how == "good"],
            "false_trains": [(r, hit) for r, how, hit, _ in stops if hit and how == "trains"],
            "seconds": seconds, "saved": saved}


def _pct(x):
    return "-" if x is None else f"{x:.0%}"


def report(res, rule):
    lines = [f"rule: after {rule.after:g}, ratio {rule.ratio:g}, progress {rule.progress:g}, window {rule.window:g}",
             f"runs replayed: {res['runs']} (finished, with a train.log); ending not trained: {res['not_trained']}",
             f"stopped: {res['stopped']} of {res['not_trained']} not trained "
             f"({_pct(res['stopped'] / res['not_trained']) if res['not_trained'] else '-'}), at a median "
             f"{_pct(res['fraction_median'])} of the budget (latest {_pct(res['fraction_max'])})",
             f"false stops: {len(res['false_good'])} of runs that end good, {len(res['false_trains'])} of runs "
             f"that train but are not good",
             f"training time saved: {res['saved']:.0f} of {res['seconds']:.0f} s "
             f"({_pct(res['saved'] / res['seconds']) if res['seconds'] else '-'})"]
    for kind, found in (("good", res["false_good"]), ("trains", res["false_trains"])):
        lines += [f"  stopped, ends {kind}: {r.path} at update {hit[0]} (final {r.final_valid_loss:.2f})"
                  for r, hit in found]
    return "\n".join(lines)


def _main(argv):
    p = CommandParser(prog="early_stop_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="a sweep's output folder, made with --no-early-stop")
    for name in ("after", "ratio", "progress", "window"):
        p.add_argument(f"--{name}", type=fraction(name), default=getattr(DEFAULT_RULE, name),
                       help=f"the rule's {name} (default: %(default)s)")
    p.add_argument("--scan", action="store_true", help="also a grid of --after x --ratio")
    args = p.parse_args(argv)
    rule = StopRule(after=args.after, ratio=args.ratio, progress=args.progress, window=args.window)
    rows = outcomes(Path(args.out))
    if not rows:
        raise LnposError(f"{args.out}: no finished run with a train.log and a budget in updates: give a sweep's folder")
    print(report(replay(rows, rule), rule))
    if args.scan:
        print("\n| after | ratio | stopped of not trained | median fraction | false stops (good / trains) | time saved |")
        print("|---|---|---|---|---|---|")
        for after in (0.3, 0.4, 0.5, 0.6, 0.7):
            for ratio in (0.6, 0.7, 0.8):
                res = replay(rows, replace(rule, after=after, ratio=ratio))
                print(f"| {after:g} | {ratio:g} | {res['stopped']}/{res['not_trained']} | {_pct(res['fraction_median'])} "
                      f"| {len(res['false_good'])} / {len(res['false_trains'])} | "
                      f"{_pct(res['saved'] / res['seconds']) if res['seconds'] else '-'} |")
    return 0


def main(argv=None):
    return run_main("early_stop_replay", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
