"""Bring an output folder written by an earlier version to the one schema of the run files
(records.py), once: ``scripts/grid.sh migrate OUT``.

The earlier layouts it knows:

- DONE.json with the outcome in words only (``"status"``: finished, diverged at update N, stopped
  early at update N: WHY, failed: WHY) and no ``outcome`` field: the outcome, ``diverged_at``,
  ``stopped_at`` and ``reason`` are written from the words (a number the file holds wins);
- results.csv of make_table.sh with the header of an earlier version (before the
  validation-selected columns, or before the compound-split ones too): removed, as make_table.sh
  writes it anew.

Every run folder is read whole before the first file changes (a file in no known layout is an error
that leaves the folder as it was); a run a grid is working on is refused; each is held (its lock)
while its file changes. A folder already in the current schema is left as it
is, so the command can run twice.
"""
import os
import re
from pathlib import Path

from ..common import n_runs, read_json, write_json
from ..errors import LnposError, StateError
from .records import DoneRecord, short
from .rundir import grid_run_dirs

# the outcome in words, as DONE.json's "status" holds it
WORDS = re.compile(r"^(?:(finished)|(diverged) at update (\d+)|(stopped early) at update (\d+): (.*)|"
                   r"(failed): (.*))$", re.S)
WORD_FORMS = "'finished', 'diverged at update N', 'stopped early at update N: WHY', 'failed: WHY'"
# results.csv's headers of earlier versions: the first, then with the compound-split columns (the
# validation-selected columns came next)
_FIRST_CSV = ("run,arch,optimizer,lr,warmup,schedule,seed,status,paper_bleu,paper_valid_loss,paper_note,best_bleu_tok,"
              "best_epoch,last_bleu_tok,last_epoch,sacrebleu,last_sacrebleu,best_valid_loss,epochs,avg_bleu_tok,"
              "avg_sacrebleu,avg_epochs,source")
EARLIER_CSV_HEADERS = {_FIRST_CSV, _FIRST_CSV + ",best_bleu_tok_cs,avg_bleu_tok_cs"}


def outcome_of_words(status):
    """The outcome fields of a DONE.json that holds them in words only; None when ``status`` is none of
    :data:`WORD_FORMS`."""
    m = WORDS.match(status)
    if m is None:
        return None
    finished, diverged, at, stopped, stopped_at, why, failed, reason = m.groups()
    if diverged:
        return {"outcome": diverged, "diverged_at": int(at)}
    if stopped:
        return {"outcome": stopped, "stopped_at": int(stopped_at), "reason": why}
    if failed:
        return {"outcome": failed, "reason": reason}
    return {"outcome": finished}


def migrated_done(path):
    """The DONE.json ``path`` in the current schema (a :class:`~.records.DoneRecord`) when it holds its
    outcome in words only; None when it needs no change (the current schema, no file, or not an earlier
    one: reading it says what is wrong)."""
    what_to_do = f"delete {Path(path).parent} to redo that run"
    obj = read_json(path, missing_ok=True, what_to_do=what_to_do)
    if not DoneRecord.words_only(obj):
        return None
    fields = outcome_of_words(obj["status"])
    if fields is None:
        raise StateError(f"{path}: its status {short(obj['status'])} is none of {WORD_FORMS}: {what_to_do}")
    return DoneRecord.from_json({**fields, **{k: v for k, v in obj.items() if v is not None}}, path,
                                "an outcome record", what_to_do)


def migrate(out):
    """Bring the output folder ``out`` to the current schema; returns the files changed or removed.
    Everything is checked before the first file changes: a run a grid holds, or a file in no known
    layout, is an error that leaves the folder as it was."""
    plan = []
    for rd in grid_run_dirs(out, "the --out folder of `scripts/grid.sh run`"):
        if rd.locked():
            raise LnposError(f"{rd.path} is in use by a grid (lock {rd.lock_path}): migrate {out} after it "
                             f"stops; nothing was changed")
        rd.config(), rd.evals(), rd.average()  # the files no migration changes read as they are
        done = migrated_done(rd.done_path)
        if done is None:
            rd.done()  # already the current schema (or no file): it reads
        plan.append((rd, done))
    results = Path(out) / "results.csv"
    stale = False
    if results.is_file():
        with open(results, encoding="utf-8", errors="replace") as f:
            stale = f.readline().rstrip("\n") in EARLIER_CSV_HEADERS
    changed = []
    for rd, done in plan:
        if done is None:
            continue
        fd = rd.lock(wait=0)  # held while its file changes; a grid that took it meanwhile: refused
        try:
            write_json(rd.done_path, done.to_json())
            changed.append(rd.done_path)
        finally:
            os.close(fd)
    if stale:
        results.unlink()
        changed.append(results)
    return changed


def cmd_migrate(opts):
    out = Path(opts.out_dir)
    if not out.is_dir():
        raise LnposError(f"{out} is not a folder: give the --out folder of `scripts/grid.sh run` to migrate")
    changed = migrate(out)
    for path in changed:
        print(("removed (make_table.sh writes it anew): " if path.name == "results.csv" else "rewritten: ") + str(path))
    runs = len(grid_run_dirs(out, "the --out folder"))
    print(f"{len(changed)} file(s) brought to the current schema; {n_runs(runs)} in {out}, every one readable")
    return 0
