"""Fault injection: results pages, published runs.csv files read back, and two maps compared.

A page is written only into a folder that is new, empty or a page of the same command (its marker
and its command line say so), through one function (analysis/publish.py); a runs.csv read back is
checked value by value (analysis/validate.py); a comparison refuses two sides that are not one
experiment trained twice. Rows run as in tests/test_faults.py (one error line, the exit status,
nothing changed outside the row's output folders)."""
import errno
import json
import shutil

import pandas as pd
import pytest

from fairseq_lnpos.analysis import publish as P
from fairseq_lnpos.analysis.frame import read_runs_csv, runs_frame, write_runs_csv
from fairseq_lnpos.analysis.publish import MARKER, publish
from test_faults import Case, check_case
from test_stability import write_run

MAP = ("fairseq_lnpos.analysis.stability", "{S}/sweep", "--no-figures", "--out-dir", "{S}/out")
PAGE = ("--publish", "{S}/P")
REJUDGE = ("fairseq_lnpos.analysis.stability", "--runs-csv", "{S}/runs.csv", "--out-dir", "{S}/out", "--no-figures")
AGREE = "fairseq_lnpos.analysis.agreement"
NOTEBOOK = "# my notebook\n"


def sweep(sandbox, name="sweep", unigram=9.6, model_code="abc123", shift=0.0):
    """A small map: Post-LN and Pre-LN at lr 1e-3, two seeds each."""
    for variant, final in (("postln", 3.0), ("preln", 1.0)):
        for seed in (1, 2):
            write_run(sandbox / name, variant, 1e-3, 0, seed, final=final + shift + 0.05 * seed, unigram=unigram,
                      model_code=model_code)
    return sandbox / name


def with_notebook(sandbox):
    sweep(sandbox)
    (sandbox / "P").mkdir()
    (sandbox / "P" / "index.md").write_text(NOTEBOOK)


def with_users_tables(sandbox):
    sweep(sandbox)
    (sandbox / "P").mkdir()
    for name in ("runs.csv", "cells.csv"):
        (sandbox / "P" / name).write_text("my,table\n1,2\n")


def with_demo_page(sandbox):
    """P: the page of another study (the demo's command wrote it)."""
    sweep(sandbox)
    (sandbox / "fig_demo.png").write_bytes(b"png")
    publish(sandbox / "P", "The demo", "body\n", None, [sandbox / "fig_demo.png"],
            "python -m fairseq_lnpos.demo --out demo-out --publish P")


def with_file_at_page(sandbox):
    sweep(sandbox)
    (sandbox / "P").write_text("a file\n")


def disk_full(monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(P, "write_runs_csv", full)


# ---------------------------------------------------------------- a published runs.csv, edited

def published(edit):
    """{S}/runs.csv: the runs.csv of a map (a sweep's table written as a page writes it), then ``edit(table)``
    on its text (every value a string) returns the table to write."""
    def setup(sandbox):
        write_runs_csv(runs_frame(sweep(sandbox)), sandbox / "runs.csv")
        table = pd.read_csv(sandbox / "runs.csv", dtype=str, keep_default_na=False)
        edit(table).to_csv(sandbox / "runs.csv", index=False)
    return setup


def set_value(column, value, row=0):
    def edit(table):
        table.loc[row, column] = value
        return table
    return edit


def row_again(seed, new_path=False, timed=True):
    """The first row once more with another seed (and with ``new_path`` another run folder); with ``timed``
    every row has its training time, as a real run's."""
    def edit(table):
        if timed:
            table["train_seconds"] = [str(100.0 + i) for i in range(len(table))]
        again = table.iloc[[0]].copy()
        again["seed"] = str(seed)
        if new_path:
            again["path"] = again["path"] + "-copy"
        return pd.concat([table, again], ignore_index=True)
    return edit


# ---------------------------------------------------------------- two maps compared

def one_map_twice(sandbox):
    sweep(sandbox, "a")


def timed(out, start=100.0):
    """Give each run of ``out`` a training time in its DONE.json, as the grid records one."""
    for i, path in enumerate(sorted(out.glob("*/seed*/DONE.json"))):
        done = json.loads(path.read_text())
        done["train_seconds"] = start + i
        path.write_text(json.dumps(done))
    return out


def a_copy(sandbox):
    shutil.copytree(timed(sweep(sandbox, "a")), sandbox / "b")


def two_corpora(sandbox):
    sweep(sandbox, "a", unigram=9.6)
    sweep(sandbox, "b", unigram=9.7, shift=0.01)


def two_model_codes(sandbox):
    sweep(sandbox, "a", model_code="abc123")
    sweep(sandbox, "b", model_code="def456", shift=0.01)


CASES = [
    # --- a page never overwrites what it did not write
    Case("publish-over-a-notebook", MAP + PAGE, r"^stability_map\.sh: error: --publish \S*/P: its index\.md was not "
         r"written by the lab's command \(no marker on its first line\): give a new or empty folder", setup=with_notebook,
         writes=("out",)),
    Case("publish-over-users-tables", MAP + PAGE, r"^stability_map\.sh: error: --publish \S*/P holds files that no "
         r"results page wrote \((cells|runs)\.csv and 1 more\): give a new or empty folder", setup=with_users_tables,
         writes=("out",)),
    Case("publish-into-another-studys-page", MAP + PAGE, r"^stability_map\.sh: error: --publish \S*/P is the page of "
         r"another command \(python -m fairseq_lnpos\.demo; this is stability_map\.sh\)", setup=with_demo_page,
         writes=("out",)),
    Case("replay-publish-over-a-notebook", ("scripts/tools/early_stop_replay.py", "{S}/sweep") + PAGE,
         r"^early_stop_replay: error: --publish \S*/P: its index\.md was not written by the lab's command",
         setup=with_notebook, writes=()),
    # --- a page that cannot be written: one line, nothing left behind
    Case("publish-to-a-file", MAP + PAGE, r"^stability_map\.sh: error: --publish \S*/P is a file: give a folder",
         setup=with_file_at_page, writes=("out",)),
    Case("publish-name-too-long", MAP + ("--publish", "{S}/" + "x" * 300), r"^stability_map\.sh: error: --publish "
         r"\S*/x+: cannot write the page \(File name too long\): give a shorter name", setup=sweep, writes=("out",)),
    Case("publish-on-a-full-disk", MAP + PAGE, r"^stability_map\.sh: error: --publish \S*/P: cannot write the page "
         r"\(No space left on device\): free some space on its disk", setup=sweep, writes=("out",), patch=disk_full),
    Case("publish-empty", MAP + ("--publish", ""), r"^stability_map\.sh: error: argument --publish: '' names no folder",
         setup=sweep, writes=("out",)),
    Case("agreement-publish-empty", (AGREE, "{S}/a", "{S}/b", "--out-dir", "{S}/out", "--publish", ""),
         r"^python -m fairseq_lnpos\.analysis\.agreement: error: argument --publish: '' names no folder",
         setup=two_corpora),
    # --- a published runs.csv re-judged: its values are checked
    Case("runs-csv-negative-nll", REJUDGE, r"^stability_map\.sh: error: \S*/runs\.csv, line 2, column final_valid_nll: "
         r"-3(\.0)? is not at least 0", setup=published(set_value("final_valid_nll", "-3"))),
    Case("runs-csv-text-in-lr", REJUDGE, r"^stability_map\.sh: error: \S*/runs\.csv, line 3, column lr: 'fast' is not "
         r"a number", setup=published(set_value("lr", "fast", row=1))),
    Case("runs-csv-nan-text-in-lr", REJUDGE, r"\S*/runs\.csv, line 2, column lr: no value, and every run has one",
         setup=published(set_value("lr", "nan"))),
    Case("runs-csv-unknown-outcome", REJUDGE, r"\S*/runs\.csv, line 2, column outcome: 'exploded' is not an outcome "
         r"\(finished, diverged, stopped early, failed", setup=published(set_value("outcome", "exploded"))),
    Case("runs-csv-row-again-with-a-new-seed", REJUDGE, r"\S*/runs\.csv, line 6, column path: the run folder \S*/seed1 "
         r"is listed twice \(also line 2\)", setup=published(row_again(9))),
    Case("runs-csv-row-again-as-a-new-run", REJUDGE, r"\S*/runs\.csv, line 6, column seed: the row repeats line 2 .*"
         r"with only the seed changed", setup=published(row_again(9, new_path=True))),
    Case("runs-csv-one-run-twice", REJUDGE, r"\S*/runs\.csv, line 6, column seed: the run \S+ seed 1 is listed twice",
         setup=published(row_again(1, new_path=True, timed=False))),
    # --- a comparison of two sides that are not one experiment trained twice
    Case("agreement-one-folder-twice", (AGREE, "{S}/a", "{S}/a", "--out-dir", "{S}/out"),
         r"^agreement: error: \S*/a is given twice: compare two runs of one map", setup=one_map_twice),
    Case("agreement-a-copy", (AGREE, "{S}/a", "{S}/b", "--out-dir", "{S}/out"),
         r"^agreement: error: \S*/b holds the same runs as \S*/a \(4 runs with the same records, times and load: a "
         r"copy, not a second run\)", setup=a_copy),
    Case("agreement-two-corpora", (AGREE, "{S}/a", "{S}/b", "--out-dir", "{S}/out"),
         r"^agreement: error: \S*/a and \S*/b were trained on different corpora \(unigram bits 9\.60000 and 9\.70000\)",
         setup=two_corpora),
    Case("agreement-two-model-codes", (AGREE, "{S}/a", "{S}/b", "--out-dir", "{S}/out"),
         r"^agreement: error: \S*/a and \S*/b were trained by different versions of the model code \(abc123 and "
         r"def456\): .*--allow-mixed-code", setup=two_model_codes),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_fault(case, tmp_path, monkeypatch, capsys, request):
    check_case(case, tmp_path, monkeypatch, capsys, request)


def test_a_page_written_again_by_its_command_replaces_it_and_drops_the_files_it_no_longer_writes(tmp_path):
    page = tmp_path / "page"
    old, kept = tmp_path / "old.png", tmp_path / "kept.png"
    for f in (old, kept):
        f.write_bytes(b"png")
    publish(page, "A map", "body\n", None, [old, kept], "stability_map.sh first --publish page")
    (page / "notes.txt").write_text("the user's\n")  # listed by no page: left alone
    assert sorted(p.name for p in page.iterdir()) == ["index.md", "kept.png", "notes.txt", "old.png"]
    publish(page, "A map", "body again\n", None, [kept], "stability_map.sh second --publish page")
    assert sorted(p.name for p in page.iterdir()) == ["index.md", "kept.png", "notes.txt"]
    text = (page / "index.md").read_text()
    assert text.startswith(MARKER + "\n") and "body again" in text and "old.png" not in text


def test_a_full_disk_leaves_a_page_folder_it_found_in_place(tmp_path, monkeypatch):
    page = tmp_path / "page"
    publish(page, "A map", "body\n", None, [], "stability_map.sh x --publish page")
    before = (page / "index.md").read_text()
    monkeypatch.setattr(P, "write_text", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    with pytest.raises(Exception, match=r"cannot write the page \(No space\): free some space"):
        publish(page, "A map", "body again\n", None, [], "stability_map.sh x --publish page")
    assert (page / "index.md").read_text() == before


def test_nan_in_an_optional_number_column_is_not_recorded_and_the_page_reads(tmp_path):
    setup = published(set_value("bleu_tok", "nan"))
    setup(tmp_path)
    runs = read_runs_csv(tmp_path / "runs.csv")
    assert runs["bleu_tok"].isna().all() and runs["lr"].dtype.kind == "f" and runs["seed"].dtype.kind == "i"


def test_an_agreement_page_holds_each_run_once_per_map(tmp_path):
    a, b = sweep(tmp_path, "a"), sweep(tmp_path, "b", shift=0.01)
    from fairseq_lnpos.analysis import agreement as A

    assert A.main([str(a), str(b), "--out-dir", str(tmp_path / "cmp"), "--publish", str(tmp_path / "page")]) == 0
    runs = read_runs_csv(tmp_path / "page" / "runs.csv")
    assert sorted(runs["map"].unique()) == ["A", "B"] and len(runs) == 8
