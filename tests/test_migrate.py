"""``scripts/grid.sh migrate OUT``: an output folder of an earlier version (each earlier layout: DONE.json
with the outcome in words only, of every outcome; results.csv with an earlier header) is brought to the
one schema of records.py, after which every reader takes it; running it again changes nothing; a run a
grid holds, a status in no known words, a damaged file of another run and a missing folder are one-line
errors that change nothing."""
import json
import os

import pytest

from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import report
from fairseq_lnpos.experiments.migrate import EARLIER_CSV_HEADERS
from fairseq_lnpos.experiments.records import Outcome
from fairseq_lnpos.experiments.rundir import RunDir, run_dirs

from test_records import OLD_DONE, old_folder

# the header of results.csv before the compound-split and the validation-selected columns
FIRST_CSV = ("run,arch,optimizer,lr,warmup,schedule,seed,status,paper_bleu,paper_valid_loss,paper_note,best_bleu_tok,"
             "best_epoch,last_bleu_tok,last_epoch,sacrebleu,last_sacrebleu,best_valid_loss,epochs,avg_bleu_tok,"
             "avg_sacrebleu,avg_epochs,source")


def earlier_out(tmp_path):
    """An output folder of an earlier version: one run folder per outcome, and its results.csv."""
    out = tmp_path / "out"
    for which in OLD_DONE:
        old_folder(out / which, which).path.parent.rename(out / f"sweep-{which}")
        (out / which).rmdir()
    (out / "results.csv").write_text(FIRST_CSV + "\nsweep-finished,,,,,,2,finished\n")
    return out


def test_an_output_folder_of_an_earlier_version_is_migrated_once(tmp_path, capsys):
    out = earlier_out(tmp_path)
    assert EARLIER_CSV_HEADERS == {FIRST_CSV, ",".join(c for c in report.CSV_COLUMNS if not c.startswith("sel_"))}
    with pytest.raises(Exception, match=rf"^{out}/results.csv was written by an earlier version of make_table.sh: run "
                                        rf"`scripts/grid.sh migrate {out}` once"):
        report.make_table(out, with_figures=False)
    assert G.main(["migrate", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines[:-1]) == sorted([f"rewritten: {out}/sweep-{w}/seed2/DONE.json" for w in OLD_DONE]
                                        + [f"removed (make_table.sh writes it anew): {out}/results.csv"])
    assert lines[-1] == f"5 file(s) brought to the current schema; 4 runs in {out}, every one readable"
    outcomes = {rd.path.parent.name: rd.record() for rd in run_dirs(out)}
    assert {k: (r.outcome, r.outcome_text) for k, r in outcomes.items()} == {
        f"sweep-{w}": (Outcome(json.loads((out / f"sweep-{w}/seed2/DONE.json").read_text())["outcome"]), d["status"])
        for w, d in OLD_DONE.items()}
    assert outcomes["sweep-diverged"].done.diverged_at == 40 and outcomes["sweep-stopped"].done.stopped_at == 120
    _, _, rows = report.make_table(out, with_figures=False)  # every reader takes it now
    assert sorted(r["status"] for r in rows) == sorted(d["status"] for d in OLD_DONE.values())
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert G.main(["migrate", str(out)]) == 0  # a second time: nothing to do
    assert capsys.readouterr().out.splitlines()[-1].startswith("0 file(s) brought to the current schema; 4 runs")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_run_in_use_a_status_in_no_known_words_a_damaged_file_and_no_folder_are_refused(tmp_path, capsys):
    out = earlier_out(tmp_path)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    rd = RunDir(out / "sweep-finished" / "seed2")
    fd = rd.lock()
    try:
        assert G.main(["migrate", str(out)]) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{rd.path} is in use by a grid (lock {rd.lock_path}): migrate {out} after" in err
    (out / "sweep-diverged/seed2/DONE.json").write_text(json.dumps({"status": "done"}))
    assert G.main(["migrate", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DONE.json: its status 'done' is none of 'finished', 'diverged at update N'" in err
    (out / "sweep-diverged/seed2/DONE.json").write_bytes(before[out / "sweep-diverged/seed2/DONE.json"])
    (out / "sweep-stopped/seed2/eval/epoch1.json").write_text("[]")  # the last run read: the others stay as they were
    assert G.main(["migrate", str(out)]) == 2
    assert "sweep-stopped/seed2/eval/epoch1.json is not an epoch's record" in capsys.readouterr().err
    (out / "sweep-stopped/seed2/eval/epoch1.json").write_bytes(before[out / "sweep-stopped/seed2/eval/epoch1.json"])
    (out / "sweep-diverged/seed2/DONE.json").write_text(json.dumps({"status": "done"}))
    assert G.main(["migrate", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder: give the --out folder of `scripts/grid.sh run` to migrate" in capsys.readouterr().err
    changed = {p for p, b in before.items() if p.read_bytes() != b} if all(p.exists() for p in before) else None
    assert changed == {out / "sweep-diverged/seed2/DONE.json"}  # only the file this test wrote: nothing migrated
