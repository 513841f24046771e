"""Calibrating early stopping: replay the rule over sweeps made without it, and score it on another.

    python scripts/tools/early_stop_replay.py OUT [--after F] [--ratio R] [--progress P]
                                              [--window W] [--scan] [--score-on OTHER ...]
                                              [--trains DIR=F ...] [--publish DIR] [--from-page PAGE]

OUT is a sweep's folder (``grid.sh sweep --no-early-stop``): every run that finished is replayed
update by update from its train.log (:func:`~fairseq_lnpos.experiments.early_stop.first_stop`) and
judged by how it really ended (:mod:`fairseq_lnpos.analysis.verdict`, on the table of every run,
:mod:`fairseq_lnpos.analysis.frame`): "good" (its cell is good against its architecture's cells),
"trains" (its own NLL within the "trains" threshold of the unigram bits, its cell not good), "not
trained". The threshold is the verdict's default (0.5) unless ``--trains DIR=F`` gives a folder the
one its map is judged with (``stability_map.sh --trains``: e.g. 0.8 for one epoch of real text, where
no run reaches half the unigram bits and 0.5 would leave no run that a stop could wrong). Printed:
the share of runs that end "not trained" that the rule stops and at which fraction of the budget,
every stop of a run that trains (a stop of a good run is a false stop), and the training time saved
(wall seconds from DONE.json, pro rata of the updates not run). A folder where a live rule stopped
runs is refused: their end is unknown, so they cannot score a rule.

``--scan`` replays a grid of ``--after`` x ``--ratio`` values and chooses the rule that stops the most
runs that end not trained without a false stop of a good run (then the one that saves most); with
``--score-on OTHER`` that chosen rule (without --scan: the given one) is then scored on OTHER, maps
it was not chosen on: a rule is only as good as it is on runs it was not tuned on. ``--publish DIR``
writes all of it as a results page (:mod:`fairseq_lnpos.analysis.publish`) with the runs of every
folder replayed and their logged training losses (:data:`LOSSES`); ``--from-page PAGE`` replays such a
page again, its runs and losses in place of the folders (named as its command named them).
"""
import gzip
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from fairseq_lnpos.cli import CommandParser, fraction, named_fraction
from fairseq_lnpos.common import replace_file
from fairseq_lnpos.errors import LnposError, run_main
from fairseq_lnpos.experiments.early_stop import DEFAULT_RULE, StopRule, first_stop
from fairseq_lnpos.fairseq_log import LogState
from fairseq_lnpos.analysis import stability as S
from fairseq_lnpos.analysis.frame import FINISHED, STOPPED, pandas, read_runs_csv, runs_frame
from fairseq_lnpos.analysis.verdict import DEFAULT_TRAINS

SCAN_AFTER = (0.3, 0.4, 0.5, 0.6, 0.7)
SCAN_RATIO = (0.6, 0.7, 0.8)


def logged_losses(path):
    """The (update, loss) pairs of the train.log in run folder ``path``; None without one."""
    log = Path(path) / "train.log"
    return LogState.of(log.read_text(encoding="utf-8", errors="replace")).losses if log.is_file() else None


def outcomes(out, trains=DEFAULT_TRAINS, page=None):
    """[(run row, how it ended: good | trains | not trained, [(update, loss)], budget)] of the runs of
    ``out`` that finished, "trains" at NLL <= ``trains`` x the unigram bits. A run's budget is its
    ``--max-update``, or for a run budgeted in epochs (the demo) the updates it ran, which a finished
    run ran in full. A folder where runs were stopped early is refused: how a stopped run would have
    ended is not known, and leaving it out would leave out the runs the rule is to stop. With ``page``
    (:func:`read_page`), ``out`` names a folder that page replayed, and its runs and losses are the page's."""
    if page is None:
        runs, losses_of = runs_frame(out, "a sweep's output folder, made with --no-early-stop"), logged_losses
    else:
        tables, losses = page
        runs, losses_of = tables.get(str(out)), losses.get
        if runs is None:
            raise LnposError(f"{out}: the page replayed no such folder (it replayed {', '.join(tables)}): give them "
                             f"as its command line does")
    stopped = runs[runs["outcome"] == STOPPED]
    if len(stopped):
        raise LnposError(f"{out}: {len(stopped)} of its {len(runs)} runs were stopped early ({stopped['path'].iloc[0]}, "
                         f"...), and the replay judges each run by how it ended at its budget: replay a sweep made "
                         f"with --no-early-stop")
    cells = S.make_cells(runs, trains=trains).set_index(S.KEYS)
    rows = []
    for r in runs[runs["outcome"] == FINISHED].itertuples():
        budget = r.max_update if r.max_update == r.max_update and r.max_update else r.updates
        losses = losses_of(r.path)
        if not budget or budget != budget or losses is None:
            continue
        trained = r.nll_ratio <= trains
        good = trained and cells.loc[(r.variant, r.layers, r.warmup, r.lr), "good_own"] is True
        rows.append((r, "good" if good else "trains" if trained else "not trained", losses, int(budget)))
    return rows


def replay(rows, rule):
    """The rule over ``rows`` (:func:`outcomes`): a dict of what it stops and saves."""
    stops = [(r, how, first_stop(losses, budget, rule), budget) for r, how, losses, budget in rows]
    hopeless = [s for s in stops if s[1] == "not trained"]
    caught = [s for s in hopeless if s[2]]
    fractions = [hit[0] / budget for _, _, hit, budget in caught]
    seconds = sum(_secs(r) for r, _, _, _ in stops)
    saved = sum(_secs(r) * (1 - hit[0] / budget) for r, _, hit, budget in stops if hit)
    return {"runs": len(stops), "not_trained": len(hopeless), "stopped": len(caught),
            "fraction_median": statistics.median(fractions) if fractions else None,
            "fraction_max": max(fractions) if fractions else None,
            "false_good": [(r, hit) for r, how, hit, _ in stops if hit and how == "good"],
            "false_trains": [(r, hit) for r, how, hit, _ in stops if hit and how == "trains"],
            "seconds": seconds, "saved": saved}


def _secs(r):
    return 0.0 if r.train_seconds != r.train_seconds else r.train_seconds  # NaN: not recorded


def _pct(x):
    return "-" if x is None else f"{x:.0%}"


def report(res, rule, trains=DEFAULT_TRAINS):
    lines = [f"rule: after {rule.after:g}, ratio {rule.ratio:g}, progress {rule.progress:g}, window {rule.window:g}",
             f"runs replayed: {res['runs']} (finished, with a train.log); ending not trained: {res['not_trained']} "
             f"(trains: final NLL <= {trains:g} x the unigram bits)",
             f"stopped: {res['stopped']} of {res['not_trained']} not trained "
             f"({_pct(res['stopped'] / res['not_trained']) if res['not_trained'] else '-'}), at a median "
             f"{_pct(res['fraction_median'])} of the budget (latest {_pct(res['fraction_max'])})",
             f"false stops: {len(res['false_good'])} of runs that end good, {len(res['false_trains'])} of runs "
             f"that train but are not good",
             f"training time saved: {res['saved']:.0f} of {res['seconds']:.0f} s "
             f"({_pct(res['saved'] / res['seconds']) if res['seconds'] else '-'})"]
    for kind, found in (("good", res["false_good"]), ("trains", res["false_trains"])):
        lines += [f"  stopped, ends {kind}: {r.path} at update {hit[0]} (final NLL {r.final_valid_nll:.2f})"
                  for r, hit in found]
    return "\n".join(lines)


def choose(rows, rule):
    """(the rule of the scan that stops the most runs that end not trained with no false stop of a good
    run, then saves most; the scan's Markdown lines)."""
    lines = ["| after | ratio | stopped of not trained | median fraction | false stops (good / trains) | time saved |",
             "|---|---|---|---|---|---|"]
    best = None
    for after in SCAN_AFTER:
        for ratio in SCAN_RATIO:
            cand = replace(rule, after=after, ratio=ratio)
            res = replay(rows, cand)
            lines.append(f"| {after:g} | {ratio:g} | {res['stopped']}/{res['not_trained']} | "
                         f"{_pct(res['fraction_median'])} | {len(res['false_good'])} / {len(res['false_trains'])} | "
                         f"{_pct(res['saved'] / res['seconds']) if res['seconds'] else '-'} |")
            key = (res["stopped"], res["saved"])
            if not res["false_good"] and (best is None or key > best[0]):
                best = (key, cand)
    return (best[1] if best else rule), lines


def _replayable(out, trains, page=None):
    rows = outcomes(out if page else Path(out), trains, page)
    if not rows:
        raise LnposError(f"{out}: no finished run with a train.log: give a sweep's folder")
    return rows


# ---------------------------------------------------------------- the page's losses

LOSSES = "losses.csv.gz"  # a page's logged training losses of the runs it replayed (with runs.csv: the whole replay)


def _spans(updates):
    """[1, 2, 3, 1, 2] -> ``1-3 1-2``: runs of consecutive updates (a log restarted from scratch starts again)."""
    spans = []
    for u in updates:
        if spans and u == spans[-1][1] + 1:
            spans[-1][1] = u
        else:
            spans.append([u, u])
    return " ".join(f"{a}-{b}" for a, b in spans)


def _updates(text):
    return [u for span in text.split() for a, b in [span.split("-")] for u in range(int(a), int(b) + 1)]


def write_losses(runs, path):
    """``losses.csv.gz`` (its path): a row per run of ``runs`` with a train.log, its folder (``path``), the
    updates logged (:func:`_spans`) and their losses as the log wrote them (a float's shortest digits)."""
    rows = [(p, _spans([u for u, _ in got]), " ".join(repr(loss) for _, loss in got))
            for p in runs["path"] for got in [logged_losses(p)] if got is not None]
    text = pandas().DataFrame(rows, columns=["path", "updates", "losses"]).to_csv(index=False, lineterminator="\n")
    return replace_file(path, lambda f: f.write(gzip.compress(text.encode("utf-8"), mtime=0)))  # same data, same bytes


def read_page(page):
    """({folder as the page's command named it: its runs}, {run folder: [(update, loss)]}) of a page this
    command published (runs.csv, column ``map``; :data:`LOSSES`)."""
    page = Path(page)
    if not (page / LOSSES).is_file() or not (page / "runs.csv").is_file():
        raise LnposError(f"{page}: no {LOSSES} and runs.csv: give a page this command published")
    runs = read_runs_csv(page / "runs.csv")
    try:
        table = pandas().read_csv(page / LOSSES, dtype=str, keep_default_na=False)
        losses = {p: list(zip(_updates(u), map(float, v.split())))
                  for p, u, v in zip(table["path"], table["updates"], table["losses"])}
    except (OSError, ValueError, EOFError, KeyError) as e:
        raise LnposError(f"{page / LOSSES}: cannot read it ({e}): give a page this command published") from None
    if "map" not in runs:
        raise LnposError(f"{page / 'runs.csv'} has no column 'map': give a page this command published")
    maps = runs.pop("map")
    return {m: runs[maps == m].reset_index(drop=True) for m in dict.fromkeys(maps)}, losses


def _main(argv):
    p = CommandParser(prog="early_stop_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="a sweep's output folder, made with --no-early-stop")
    for name in ("after", "ratio", "progress", "window"):
        p.add_argument(f"--{name}", type=fraction(name), default=getattr(DEFAULT_RULE, name),
                       help=f"the rule's {name} (default: %(default)s)")
    p.add_argument("--scan", action="store_true", help="also a grid of --after x --ratio, and the rule it chooses")
    p.add_argument("--score-on", nargs="+", default=[], metavar="OTHER",
                   help="score the rule (the scan's choice with --scan) on these sweeps' folders")
    p.add_argument("--trains", action="append", default=[], type=named_fraction("DIR", "real-out=0.8"),
                   metavar="DIR=F",
                   help=f"judge 'trains' in the folder DIR (OUT or an OTHER, as given) at final NLL <= F x the unigram "
                        f"bits, the --trains its map is judged with (default {DEFAULT_TRAINS:g}); repeatable")
    p.add_argument("--publish", metavar="DIR", help="also write the replay as a results page into DIR, with the "
                                                     "runs of every folder replayed and their logged losses")
    p.add_argument("--from-page", metavar="PAGE", help="replay the runs and losses a page of this command published "
                                                       "instead of the folders (OUT and OTHER as its command names them)")
    args = p.parse_args(argv)
    if args.publish is not None:  # before the replay: a folder the page may not be written into is refused first
        from fairseq_lnpos.analysis.publish import argv_of, check_page

        check_page(args.publish, argv_of("python scripts/tools/early_stop_replay.py", argv),
                   [Path(args.from_page) / LOSSES] if args.from_page else [])
    page = read_page(args.from_page) if args.from_page else None
    rule = StopRule(after=args.after, ratio=args.ratio, progress=args.progress, window=args.window)
    trains = dict.fromkeys([args.out, *args.score_on], DEFAULT_TRAINS)  # each folder's threshold
    unknown = sorted(set(dict(args.trains)) - set(trains))
    if unknown:
        raise LnposError(f"--trains {unknown[0]}=...: not a folder this replay reads: give OUT or one of --score-on "
                         f"as written there")
    trains.update(args.trains)
    rows = _replayable(args.out, trains[args.out], page)
    sections = [f"Replayed on {args.out}:", "", _block(report(replay(rows, rule), rule, trains[args.out]))]
    if args.scan:
        rule, lines = choose(rows, rule)
        sections += ["The scan (judged from a fraction of the budget x ratio):", ""] + lines + [
            "", f"chosen on {args.out}: after {rule.after:g}, ratio {rule.ratio:g}", ""]
    for other in args.score_on:
        held = _replayable(other, trains[other], page)
        sections += [f"held out, {other} (the rule was not chosen on it):", "",
                     _block(report(replay(held, rule), rule, trains[other]))]
    md = "\n".join(sections)
    if args.publish:
        from fairseq_lnpos.analysis.publish import argv_of, publish

        read = (lambda o: page[0][o]) if page else (lambda o: runs_frame(Path(o)))  # noqa: E731
        runs = pandas().concat([read(o).assign(map=str(o)) for o in dict.fromkeys([args.out] + args.score_on)],
                               ignore_index=True)  # each folder once, also where it was scored on as well
        with tempfile.TemporaryDirectory() as tmp:  # the page's code version is read before its files change
            losses = Path(args.from_page) / LOSSES if page else write_losses(runs, Path(tmp) / LOSSES)
            publish(args.publish, "Early stopping replayed", md, runs, [losses],
                    argv_of("python scripts/tools/early_stop_replay.py", argv))
    print(md, end="")
    return 0


def _block(text):
    return "```\n" + text + "\n```\n"


def main(argv=None):
    return run_main("early_stop_replay", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
