"""Stability map from run folders written here: the table of every run, cells and verdicts against
numbers worked out by hand, the LR sensitivity, the published runs.csv round trip and bad run folders."""
import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import page_argv
from fairseq_lnpos.analysis import stability as S, verdict as V
from fairseq_lnpos.analysis.frame import read_runs_csv, runs_frame, write_runs_csv
from fairseq_lnpos.errors import LnposError, StateError
from fairseq_lnpos.experiments import report
from fairseq_lnpos.experiments.records import DoneRecord, Outcome
from fairseq_lnpos.experiments.rundir import RunDir, run_dirs

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "stability_map.sh"
SMOOTHING = 1.0  # the fixtures' label-smoothed loss: the NLL plus this


def write_run(out, variant, lr, warmup, seed, final=None, initial=9.0, status="finished", layers=None,
              bleu=None, done=True, unigram=9.6, model_code="abc123", nll_in_done=True):
    """One run folder as the grid writes it: config.json, eval/epoch1.json and (unless not ``done``)
    DONE.json; ``final`` is the final validation NLL (bits), the smoothed loss ``final + SMOOTHING``; a
    "failed: WHY" ``status`` is written as the grid's scheduler writes it."""
    name = f"{variant}-L{layers or 6}-lr{lr:g}-w{warmup}"
    d = Path(out) / name / f"seed{seed}"
    (d / "eval").mkdir(parents=True)
    run = {"name": name, "dataset": "synthetic", "ln": variant, "optimizer": "adam", "lr": lr, "warmup": warmup}
    if layers is not None:
        run["layers"] = layers
    (d / "config.json").write_text(json.dumps({"hash": "0" * 16, "run": run, "seed": seed,
                                               "arch": f"transformer_{variant}_tiny"}))
    loss = None if final is None else final + SMOOTHING
    (d / "eval" / "epoch1.json").write_text(json.dumps({"epoch": 1, "num_updates": 100, "valid_loss": loss,
                                                        "valid_nll_loss": final, "train_loss": loss, "bleu_tok": bleu}))
    prov = {"code": {"commit": "f" * 40, "dirty": False}, "model_code": model_code, "cpu": "a CPU", "cores": 2,
            "gpu": [], "load": 1.0}
    if done and status.startswith("failed: "):
        RunDir(d).write_done(DoneRecord.failed(status[len("failed: "):]))  # as the grid records a failed run
    elif done:
        diverged = status.startswith("diverged")
        assert status in ("finished", "diverged at update 40"), status
        RunDir(d).write_done(DoneRecord(
            outcome=Outcome.DIVERGED if diverged else Outcome.FINISHED, diverged_at=40 if diverged else None,
            epochs=(1,), initial_loss=initial, final_valid_loss=None if diverged else loss,
            updates=40 if diverged else 100, final_valid_nll=None if diverged or not nll_in_done else final,
            unigram_bits=unigram, provenance=prov))
    return d


@pytest.fixture
def sweep(tmp_path):
    """Post-LN at depth 6 (two seeds) and 12, Pre-LN at depth 6; lr x warm-up with divergences."""
    out = tmp_path / "sweep"
    for seed in (1, 2):
        write_run(out, "postln", 1e-4, 0, seed, final=4.0 + (seed - 1) * 0.05)
        write_run(out, "postln", 1e-3, 0, seed, final=3.0 + (seed - 1) * 0.05, bleu=20.0 + seed)
        write_run(out, "postln", 1e-3, 1000, seed, final=3.1 + (seed - 1) * 0.02)
    write_run(out, "postln", 1e-2, 0, 1, status="diverged at update 40")
    write_run(out, "postln", 1e-2, 0, 2, final=5.9)  # finished, but near the unigram bits
    write_run(out, "postln", 1e-2, 1000, 1, final=3.18)
    write_run(out, "postln", 1e-3, 0, 1, final=3.5, layers=12)
    write_run(out, "postln", 1e-2, 0, 1, status="diverged at update 40", layers=12)
    write_run(out, "preln", 1e-3, 0, 1, final=1.3)
    write_run(out, "preln", 1e-3, 0, 2, final=1.32)
    write_run(out, "preln", 1e-2, 0, 1, final=1.35)
    write_run(out, "preln", 1e-1, 0, 1, final=7.0, done=False)  # unfinished: listed, not counted
    write_run(out, "keel", 1e-3, 0, 1, status="failed: fairseq-train exited 1")
    return out


def cell(cells, variant, layers, warmup, lr):
    (c,) = [c for c in cells.itertuples() if (c.variant, c.layers, c.warmup, c.lr) == (variant, layers, warmup, lr)]
    return c


def test_the_table_of_every_run(sweep):
    runs = runs_frame(sweep)
    assert len(runs) == 16
    outcome = {(r.variant, r.layers, r.lr, r.warmup, r.seed): r.outcome for r in runs.itertuples()}
    assert outcome[("preln", 6, 1e-1, 0, 1)] == "unfinished" and outcome[("keel", 6, 1e-3, 0, 1)] == "failed"
    assert outcome[("postln", 12, 1e-2, 0, 1)] == "diverged"
    (r,) = runs[(runs.variant == "postln") & (runs.lr == 1e-3) & (runs.warmup == 0) & (runs.seed == 2)
                & (runs.layers == 6)].itertuples()
    assert (r.initial_loss, r.final_valid_nll, r.final_valid_loss, r.bleu_tok) == (9.0, 3.05, 4.05, 22.0)
    assert (r.unigram_bits, r.nll_ratio) == (9.6, pytest.approx(3.05 / 9.6))
    assert (r.code, r.model_code, r.cpu, r.cores) == ("f" * 10, "abc123", "a CPU", 2)
    keel = runs[runs.variant == "keel"].iloc[0]
    assert math.isnan(keel.final_valid_nll) and math.isnan(keel.initial_loss)


def test_the_nll_of_an_older_run_is_its_last_epochs(tmp_path):
    write_run(tmp_path, "preln", 1e-3, 0, 1, final=1.25, nll_in_done=False)
    assert runs_frame(tmp_path)["final_valid_nll"].tolist() == [1.25]


def test_the_failed_run_is_the_grids_record_and_the_map_lists_it(sweep, capsys):
    failed = sweep / "keel-L6-lr0.001-w0" / "seed1"
    done = json.loads((failed / "DONE.json").read_text())
    assert {k: done[k] for k in ("status", "outcome", "reason")} == {
        "status": "failed: fairseq-train exited 1", "outcome": "failed", "reason": "fairseq-train exited 1"}
    assert done["provenance"]["model_code"] and "final_valid_loss" not in done
    rec = RunDir(failed).record()
    assert (rec.outcome, rec.outcome_text) == (Outcome.FAILED, "failed: fairseq-train exited 1")
    assert not rec.outcome.final  # a re-run retries it
    assert S.main([str(sweep), "--no-figures"]) == 0
    assert f"- failed: {failed}" in capsys.readouterr().out


def test_one_warm_up_rule_in_the_table_and_the_map(tmp_path):
    """Warm-up 1 is the paper's T_warmup = 1, no warm-up, as the sweeps name it (--warmup 1): the map puts
    it in the cell of warm-up 0, and the map and the table both call it "none"."""
    write_run(tmp_path, "postln", 1e-3, 1, 1, final=3.0)
    write_run(tmp_path, "postln", 1e-3, 0, 2, final=3.2)
    write_run(tmp_path, "postln", 1e-3, 100, 1, final=2.0)
    cells = S.make_cells(runs_frame(tmp_path))
    assert list(zip(cells["warmup"], cells["seeds"])) == [(0, 2), (100, 1)]
    table = report.markdown(report.collect(run_dirs(tmp_path)))
    assert [line.split(" | ")[4] for line in table.splitlines() if line.startswith("| postln-")] == ["none", "none", "100"]


def test_cells_by_hand(sweep):
    cells = S.make_cells(runs_frame(sweep))
    c = cell(cells, "postln", 6, 0, 1e-2)
    assert (c.seeds, c.diverged, c.finished, c.nll, c.trains) == (2, 1, 1, 5.9, False)
    c = cell(cells, "postln", 6, 0, 1e-3)
    assert (c.seeds, c.finished, c.nll, c.bleu, c.trains) == (2, 2, pytest.approx(3.025), 21.5, True)
    assert (c.nll_min, c.nll_max, c.nll_sd) == (3.0, 3.05, pytest.approx(0.05 / math.sqrt(2)))
    assert cell(cells, "postln", 6, 0, 1e-4).trains  # 4.025 <= 0.5 x 9.6
    assert not (cells["variant"] == "keel").any()  # failed runs are not cells
    assert S.largest_lr(cells, "trains") == {("postln", 6, 0): 1e-3, ("postln", 6, 1000): 1e-2,
                                             ("postln", 12, 0): 1e-3, ("preln", 6, 0): 1e-2}
    # at 0.375 x the unigram bits (3.6): lr 1e-4 (4.025) drops out, depth 12 (3.5) stays
    narrow = S.make_cells(runs_frame(sweep), trains=0.375)
    assert not cell(narrow, "postln", 6, 0, 1e-4).trains and cell(narrow, "postln", 12, 0, 1e-3).trains


def test_cells_keep_the_seeds_that_train_apart(sweep):
    """A cell's train rate counts the seeds that train (each run's NLL at most 0.5 x 9.6 here: no source-use
    measurement), its exact interval; its NLL over them with the t interval; ``nll`` stays every finished
    seed's mean (the figures')."""
    cells = S.make_cells(runs_frame(sweep))
    c = cell(cells, "postln", 6, 0, 1e-2)  # one seed diverged, one finished at 5.9 > 4.8
    assert (c.seeds_train, c.trains, c.verdict, c.nll) == (0, False, "no-train", 5.9) and math.isnan(c.nll_trained)
    assert (c.rate_low, c.rate_high) == pytest.approx((0.0, 1 - 0.025 ** 0.5))
    c = cell(cells, "postln", 6, 0, 1e-3)  # 3.0 and 3.05: the t interval of two seeds
    half = 12.706204736174698 * 0.05 / math.sqrt(2) / math.sqrt(2)
    assert (c.seeds_train, c.nll_trained, c.nll_trained_low, c.nll_trained_high) == pytest.approx(
        (2, 3.025, 3.025 - half, 3.025 + half))


@pytest.fixture
def compared(tmp_path):
    """Three seeds a cell. Post-LN without warm-up ends 0.5 bit above Post-LN with it, seed for seed; Pre-LN
    without warm-up is within 0.01 of Pre-LN with it; Post-LN with warm-up equals Pre-LN with it; Post-LN at
    lr 1e-2 without warm-up stalls in every seed (6.0 > 0.5 x 9.6), with warm-up it trains."""
    out = tmp_path / "compared"
    for seed, e in zip((1, 2, 3), (0.0, 0.01, 0.02)):
        write_run(out, "postln", 1e-3, 100, seed, final=3.0 + e)
        write_run(out, "postln", 1e-3, 0, seed, final=3.5 + e + (0.01, -0.01, 0.0)[seed - 1])
        write_run(out, "preln", 1e-3, 100, seed, final=3.005 + (0.0, 0.01, 0.005)[seed - 1])
        write_run(out, "preln", 1e-3, 0, seed, final=3.0 + (0.0, 0.01, 0.02)[seed - 1])
        write_run(out, "postln", 1e-2, 0, seed, final=6.0 + e)
        write_run(out, "postln", 1e-2, 100, seed, final=3.2 + e)
    return runs_frame(out)


def test_differences_against_the_references_by_hand(compared):
    cells, table = S.compare(S.make_cells(compared), compared)
    rows = {(r.variant, r.warmup, r.lr, r.reference): r for r in table.itertuples()}
    assert len(rows) == 5  # Post-LN: 2 x vs warm-up, 2 x vs Pre-LN (lr 1e-3); Pre-LN vs warm-up
    worse = rows["postln", 0, 1e-3, "warm-up"]  # paired: differences 0.51, 0.49, 0.50
    half = 4.302652729911275 * 0.01 / math.sqrt(3)
    assert (worse.paired, worse.compared) == (True, "3 pairs")
    assert (worse.diff, worse.low, worse.high) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    assert worse.word == "worse" and rows["postln", 0, 1e-3, "Pre-LN"].word == "worse"
    assert not rows["postln", 0, 1e-3, "Pre-LN"].paired  # another architecture: Welch
    assert rows["preln", 0, 1e-3, "warm-up"].word == "equivalent"
    assert rows["postln", 100, 1e-3, "Pre-LN"].word == "equivalent"
    stall = rows["postln", 0, 1e-2, "warm-up"]  # 0/3 against 3/3: Fisher's p 0.1, no word at 3 seeds
    assert (stall.k, stall.k_ref, stall.word, stall.rate_word) == (0, 3, "not compared", "")
    assert stall.rate_p == pytest.approx(0.1)
    verdict = {(c.variant, c.warmup, c.lr): c.verdict for c in cells.itertuples()}
    assert verdict == {("postln", 0, 1e-3): "worse", ("postln", 0, 1e-2): "no-train", ("postln", 100, 1e-3): "equivalent",
                       ("postln", 100, 1e-2): "reference", ("preln", 0, 1e-3): "equivalent",
                       ("preln", 100, 1e-3): "reference"}


def test_a_wider_margin_turns_worse_into_inconclusive(compared):
    """The margin decides: Post-LN without warm-up is 0.5 bit worse, so at a 0.5-bit margin it is neither
    worse nor shown equivalent, and at 0.6 bit it is equivalent."""
    words = [S.compare(S.make_cells(compared), compared, margin=m)[1].set_index(
        ["variant", "warmup", "lr", "reference"]).loc[("postln", 0, 1e-3, "warm-up"), "word"] for m in (0.5, 0.6)]
    assert words == ["inconclusive", "equivalent"]


def test_the_margin_keeps_noise_from_flipping_a_verdict(tmp_path):
    """Two machines ran the same cells: one's lr 3e-4 ended 0.04 bit above the warm-up cell, the other's 0.09
    above; both within the margin, both equivalent however small the seeds' spread."""
    verdicts = []
    for machine, noisy in (("a", 3.04), ("b", 3.09)):
        out = tmp_path / machine
        for seed in (1, 2, 3):
            write_run(out, "postln", 3e-4, 0, seed, final=noisy + 0.001 * seed)
            write_run(out, "postln", 3e-4, 100, seed, final=3.0 + 0.001 * seed)
            write_run(out, "postln", 1e-3, 0, seed, final=5.5 + 0.001 * seed)
            write_run(out, "postln", 1e-3, 100, seed, final=3.0 + 0.001 * seed)
        runs = runs_frame(out)
        verdicts.append(S.compare(S.make_cells(runs), runs)[0]["verdict"].tolist())
    assert verdicts[0] == verdicts[1] == ["equivalent", "no-train", "reference", "reference"]


def test_seeds_that_disagree_on_trains_are_marked(tmp_path):
    write_run(tmp_path, "preln", 1e-2, 0, 1, final=2.0)
    write_run(tmp_path, "preln", 1e-2, 0, 2, final=5.6)  # 5.6 > 0.5 x 9.6: this seed does not train
    write_run(tmp_path, "preln", 1e-3, 0, 1, final=2.0)
    write_run(tmp_path, "preln", 1e-3, 0, 2, final=2.1)
    cells = S.make_cells(runs_frame(tmp_path))
    c = cell(cells, "preln", 6, 0, 1e-2)
    assert not c.trains and c.disagree and c.seeds_train == 1 and not cell(cells, "preln", 6, 0, 1e-3).disagree
    assert c.nll_trained == 2.0 and c.nll == pytest.approx(3.8)


def test_lr_sensitivity_by_hand(sweep):
    sens = S.lr_sensitivity(runs_frame(sweep))
    # Post-LN, 6 layers, no warm-up; per lr the mean over seeds of min(final, unigram), a diverged run = 9.6:
    #   1e-4: 4.025;  1e-3: 3.025;  1e-2: (9.6 + 5.9) / 2 = 7.75; best on the grid 3.025
    assert sens[("postln", 6, 0)] == pytest.approx((4.025 + 3.025 + 7.75) / 3 - 3.025)
    assert sens[("postln", 12, 0)] == pytest.approx((3.5 + 9.6) / 2 - 3.5)
    assert sens[("preln", 6, 0)] == pytest.approx((1.31 + 1.35) / 2 - 1.31)
    assert ("keel", 6, 0) not in sens


def test_lr_sensitivity_is_never_negative(tmp_path):
    """Every learning rate ending above the unigram bits (9.6) clips to it: nothing reached, nothing lost."""
    for lr, final in ((1e-3, 9.9), (3e-3, 10.4)):
        write_run(tmp_path, "postln", lr, 0, 1, final=final)
    assert S.lr_sensitivity(runs_frame(tmp_path)) == {("postln", 6, 0): 0.0}


def test_main_writes_the_map_and_its_runs_csv_round_trips(sweep, tmp_path, capsys):
    assert S.main([str(sweep)]) == 0
    md = capsys.readouterr().out
    assert md == (sweep / "stability.md").read_text()
    assert "16 runs: 12 finished, 2 diverged, 1 failed, 1 unfinished" in md
    assert "Unigram bits of the corpus: 9.600" in md and "model code abc123 (14 runs)" in md
    assert "4 comparisons, Holm-corrected together" in md and "the corpus's unigram bits: multi30k 0.64, synthetic 0.5" in md
    assert ("| none | 2/2 train [0.16, 1.00], NLL 4.025 [3.707, 4.343] | 2/2 train [0.16, 1.00], NLL 3.025 [2.707, 3.343], "
            "BLEU 21.5; vs warm-up: inconclusive; vs Pre-LN: **worse** | 0/2 train [0.00, 0.84], stall at 5.900; "
            "vs warm-up: not compared; "
            "vs Pre-LN: not compared, x 1/2 |") in md
    assert f"- unfinished: {sweep / 'preln-L6-lr0.1-w0' / 'seed1'}" in md
    for png in ("stability_heatmaps.png", "stability_overview.png", "sensitivity_vs_depth.png", "loss_vs_lr.png"):
        assert (sweep / png).read_bytes()[:4] == b"\x89PNG"
    # the published per-seed data give the same map
    runs = read_runs_csv(sweep / "runs.csv")
    assert len(runs) == 16
    assert S.main(["--runs-csv", str(sweep / "runs.csv"), "--out-dir", str(tmp_path / "again"), "--no-figures"]) == 0
    capsys.readouterr()
    assert (tmp_path / "again" / "cells.csv").read_text() == (sweep / "cells.csv").read_text()


def test_seeds_run_apart_add_up_into_one_map(sweep, tmp_path, capsys):
    """A map split over days: the second seeds in another folder, the first published; each run once."""
    assert S.main([str(sweep), "--no-figures"]) == 0
    later = tmp_path / "later"
    for d in sorted(sweep.glob("*/seed2")):
        later.joinpath(d.parent.name).mkdir(parents=True)
        d.rename(later / d.parent.name / "seed2")
    assert S.main([str(sweep), "--no-figures", "--out-dir", str(tmp_path / "first")]) == 0
    assert S.main([str(tmp_path / "first" / "runs.csv"), str(later), "--no-figures",
                   "--out-dir", str(tmp_path / "both")]) == 0
    md = capsys.readouterr().out
    assert (tmp_path / "both" / "cells.csv").read_text() == (sweep / "cells.csv").read_text()
    assert f"# Stability map of {tmp_path / 'first' / 'runs.csv'} + {later}" in md
    assert S.main([str(tmp_path / "first" / "runs.csv"), str(sweep), "--no-figures", "--out-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed 1 is in" in err and "give each run once" in err
    assert S.main([str(later), str(sweep), "--no-figures"]) == 2
    assert "several sources needs --out-dir DIR" in capsys.readouterr().err


def test_one_corpus_in_two_folders_is_one_map_and_two_corpora_are_refused(tmp_path, capsys):
    """The data folder may differ between machines; the corpus, told by its unigram bits, may not."""
    runs = [write_run(tmp_path / "a", "preln", 1e-3, 0, 1, final=1.3), write_run(tmp_path / "b", "preln", 1e-3, 0, 2, final=1.4)]
    for d, data in zip(runs, ("/one/bin", "/other/bin")):
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "data": data}))
    assert S.main([str(tmp_path / "a"), str(tmp_path / "b"), "--no-figures", "--out-dir", str(tmp_path / "m")]) == 0
    assert "| none | 2/2 train [0.16, 1.00], NLL 1.350 [0.715, 1.985] |" in capsys.readouterr().out
    write_run(tmp_path / "c", "preln", 1e-3, 0, 3, final=1.2, unigram=8.1)
    assert S.main([str(tmp_path / "a"), str(tmp_path / "c"), "--no-figures", "--out-dir", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trained on different corpora (unigram bits 9.60000 in" in err
    assert "8.10000 in" in err and "map one corpus at a time" in err


def test_the_map_is_published_as_a_results_page(sweep, tmp_path, capsys):
    page = tmp_path / "docs" / "results" / "map"
    assert S.main([str(sweep), "--no-figures", "--publish", str(page)]) == 0
    text = (page / "index.md").read_text()
    assert f"- Command: `stability_map.sh {sweep} --no-figures --publish {page}`" in text
    assert "- Machine: a CPU, 2 cores (14 runs). Load (1-minute average) when the runs ended: 1.00 to 1.00" in text
    assert "- Code: runs trained by code ffffffffff (14 runs); page written by code " in text
    assert (page / "runs.csv").read_text() == (sweep / "runs.csv").read_text()
    assert "| none | 2/2 train [0.16, 1.00], NLL 4.025 [3.707, 4.343] |" in text
    assert text.split("\n")[1] == f"# Stability map: {sweep.name}"  # the default title names the sweep's folder
    assert S.main([str(sweep), "--no-figures", "--publish", str(page), "--title", "Every variant, one epoch"]) == 0
    assert (page / "index.md").read_text().split("\n")[1] == "# Every variant, one epoch"


def test_runs_of_different_model_code_are_not_compared_unless_asked(tmp_path, capsys):
    write_run(tmp_path, "preln", 1e-3, 0, 1, final=1.3)
    d = write_run(tmp_path, "preln", 1e-3, 0, 2, final=1.4, model_code="def456")
    assert S.main([str(tmp_path), "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 versions of the model code (abc123: 1 run" in err
    assert f"def456: 1 run, e.g. {d}" in err and "--allow-mixed-code" in err
    assert S.main([str(tmp_path), "--no-figures", "--allow-mixed-code"]) == 0
    assert "model code abc123 (1 run), def456 (1 run)" in capsys.readouterr().out


def test_a_copied_seed_folder_is_refused(tmp_path, capsys):
    d = write_run(tmp_path, "preln", 1e-3, 0, 1, final=1.3)
    shutil.copytree(d, d.parent / "seed2")  # config.json still says seed 1
    assert S.main([str(tmp_path), "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hold the same run (preln-L6-lr0.001-w0 seed 1)" in err and "move the copies away" in err


def test_one_cell_and_seed_under_two_run_names_is_refused(tmp_path, capsys):
    d = write_run(tmp_path, "preln", 1e-3, 0, 1, final=1.3)
    shutil.copytree(d.parent, tmp_path / "preln-again")  # another name, the same architecture, lr, warm-up, seed
    cfg = json.loads((tmp_path / "preln-again" / "seed1" / "config.json").read_text())
    cfg["run"]["name"] = "preln-again"
    (tmp_path / "preln-again" / "seed1" / "config.json").write_text(json.dumps(cfg))
    assert S.main([str(tmp_path), "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 run folders hold the same cell and seed" in err and "move the copies away" in err

def test_a_map_where_nothing_counts_says_so_and_exits_2(tmp_path, capsys):
    write_run(tmp_path, "preln", 1e-3, 0, 1, status="failed: fairseq-train exited 1")
    write_run(tmp_path, "preln", 1e-2, 0, 1, final=1.0, done=False)
    assert S.main([str(tmp_path), "--no-figures"]) == 2
    out, err = capsys.readouterr()
    assert "No run finished, diverged or was stopped early: nothing to map." in out
    assert err.count("\n") == 1 and "run or resume the sweep first" in err
    assert (tmp_path / "runs.csv").exists()


@pytest.mark.parametrize("args, message", [
    (["--trains", "0"], "--trains 0.0: give a number in (0, 1]"),
    (["--margin", "-1"], "--margin -1.0: give a number of bits of at least 0"),
    (["--alpha", "nan"], "--alpha nan: give a number in (0, 1)"),
    (["--runs-csv", "x.csv"], "x.csv: a runs.csv needs --out-dir DIR: where to write the map"),
])
def test_bad_numbers_are_one_line_errors(sweep, capsys, args, message):
    assert S.main(([] if "--runs-csv" in args else [str(sweep)]) + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_the_map_states_its_training_time_in_cpu_seconds_where_recorded(tmp_path):
    for seed, cpu in ((1, 30.0), (2, None)):
        d = write_run(tmp_path, "preln", 1e-3, 0, seed, final=1.5)
        done = json.loads((d / "DONE.json").read_text())
        (d / "DONE.json").write_text(json.dumps({**done, "train_seconds": 100.0,
                                                 **({"train_cpu_seconds": cpu} if cpu else {})}))
    assert S.cost_line(runs_frame(tmp_path)) == (
        "Training time of the 2 counted runs: 200 s wall (summed over runs); CPU time recorded by 1 of them: "
        "30 s, 30.0 s a run.")


def test_the_overview_gives_the_seeds_that_train_and_the_word_against_the_first_reference(sweep):
    runs = runs_frame(sweep)
    cells, _ = S.compare(S.make_cells(runs), runs)
    table = S.overview_table(cells)
    assert table[2] == ("| architecture | wu none, lr 0.0001 | wu none, lr 0.001 | wu none, lr 0.01 | wu 1000, lr 0.001 "
                        "| wu 1000, lr 0.01 |")
    # lr 1e-4: no reference on this map; 1e-3 against its warm-up cell (2 pairs: inconclusive); 1e-2: no seed
    # trains; the warm-up cells are references
    assert table[4] == "| Post-LN | 2/2 | 2/2 ? | 0/2 - | 2/2 R | 1/1 R |"
    assert table[5] == "| Pre-LN |  | 2/2 R | 1/1 R |  |  |"


def test_unreadable_done_json_is_one_line_and_exit_2(sweep, capsys):
    done = sweep / "postln-L6-lr0.001-w0" / "seed2" / "DONE.json"
    done.write_bytes(b"\xff\xfe")
    assert S.main([str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stability_map.sh: error: {done} cannot be read")
    assert not (sweep / "stability.md").exists()


@pytest.mark.slow  # the entry point imports the package, hence fairseq
def test_entry_point_exit_2_for_a_done_json_cut_short(sweep):
    done = sweep / "postln-L6-lr0.001-w0" / "seed2" / "DONE.json"
    done.write_text('{"status": "fini')
    res = subprocess.run([str(SCRIPT), str(sweep), "--no-figures"], capture_output=True, text=True,
                         env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"stability_map.sh: error: {done} is damaged")
    assert not (sweep / "stability.md").exists()


def test_bad_folders_are_one_line_errors(tmp_path, capsys):
    assert S.main([str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: no such folder or file: give the output folder of a sweep" in capsys.readouterr().err
    assert S.main([str(tmp_path)]) == 2
    assert f"no runs in {tmp_path} (no NAME/seedS/ with config.json): give the output folder" in capsys.readouterr().err
    d = write_run(tmp_path, "postln", 1e-3, 0, 1, final=4.0)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "run": {**cfg["run"], "ln": "midln"}}))
    assert S.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(d / "config.json") in err and "'midln'" in err


def test_the_results_table_over_seeds_by_hand(tmp_path):
    """make_table.sh: per run, n seeds, the mean, min-max and the 95 % CI (t(0.975, 2) = 4.303) of best
    tok BLEU and of the best validation loss; a run of one seed says so; the long CSV round-trips."""
    for seed, bleu in ((1, 20.0), (2, 22.0), (3, 27.0)):
        write_run(tmp_path, "postln", 1e-3, 0, seed, final=3.0 + seed / 10, bleu=bleu)
    write_run(tmp_path, "preln", 1e-3, 0, 1, final=2.0, bleu=30.0)
    md, written, _ = report.make_table(tmp_path, with_figures=False)
    # BLEU 20, 22, 27: mean 23, sd sqrt(13) = 3.606, half-width 4.303 x 3.606 / sqrt(3) = 8.957
    assert "| `postln-L6-lr0.001-w0` | 3 | 3 finished | 23.00 (20.00 to 27.00, CI 14.04 to 31.96, n=3) |" in md
    assert "| `preln-L6-lr0.001-w0` | 1 | 1 finished | 30.00 (1 seed) |" in md
    import csv
    rows = list(csv.DictReader(open(tmp_path / "results_by_run.csv")))
    bleu = next(r for r in rows if r["run"] == "postln-L6-lr0.001-w0" and r["metric"] == "best_bleu_tok")
    assert (int(bleu["n"]), float(bleu["mean"]), float(bleu["ci95_high"])) == (3, 23.0, pytest.approx(31.957, abs=1e-3))
    loss = next(r for r in rows if r["run"] == "postln-L6-lr0.001-w0" and r["metric"] == "best_valid_loss")
    assert (float(loss["min"]), float(loss["max"])) == (4.1, 4.3)
    assert tmp_path / "results_by_run.csv" in written
    assert read_runs_csv(tmp_path / "runs.csv")["final_valid_nll"].tolist() == [3.1, 3.2, 3.3, 2.0]
    # the table's runs.csv is the folder's table of every run, in the same order (read once, by make_table)
    assert (tmp_path / "runs.csv").read_text() == write_runs_csv(runs_frame(tmp_path), tmp_path / "again.csv").read_text()


def test_a_results_csv_of_the_user_is_not_replaced(tmp_path):
    write_run(tmp_path, "postln", 1e-3, 0, 1, final=4.0, bleu=20.0)
    report.make_table(tmp_path, with_figures=False)
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == ",".join(report.CSV_COLUMNS)
    report.make_table(tmp_path, with_figures=False)  # its own: replaced
    for foreign in ("my,own,notes\n", ",".join(report.CSV_COLUMNS) + ",my_notes\n"):
        (tmp_path / "results.csv").write_text(foreign)
        with pytest.raises(Exception, match="was not written by make_table.sh"):
            report.make_table(tmp_path, with_figures=False)
        assert (tmp_path / "results.csv").read_text() == foreign


def test_the_selected_epoch_is_chosen_on_validation_nll_not_on_the_test_set(tmp_path):
    d = write_run(tmp_path, "postln", 1e-3, 0, 1, final=3.0, bleu=20.0)
    # epoch 2: the best test BLEU; epoch 3: the lowest validation NLL (its smoothed loss is not the lowest)
    for epoch, loss, nll, bleu in ((2, 3.5, 2.9, 24.0), (3, 3.6, 2.5, 22.0)):
        (d / "eval" / f"epoch{epoch}.json").write_text(json.dumps({
            "epoch": epoch, "num_updates": 100 * epoch, "valid_loss": loss, "valid_nll_loss": nll,
            "train_loss": loss, "bleu_tok": bleu}))
    (d / "eval" / "epoch4.json").write_text(json.dumps({  # lower NLL still, but not scored on the test set
        "epoch": 4, "num_updates": 400, "valid_loss": 3.0, "valid_nll_loss": 2.0, "train_loss": 3.0, "bleu_tok": None}))
    md, _, rows = report.make_table(tmp_path, with_figures=False)
    assert (rows[0]["best_epoch"], rows[0]["best_bleu_tok"]) == (2, 24.0)
    assert (rows[0]["sel_epoch"], rows[0]["sel_bleu_tok"], rows[0]["sel_valid_nll"]) == (3, 22.0, 2.5)
    assert "| 24.00 (2) | 22.00 (3) |" in md
    with open(tmp_path / "results.csv", newline="") as f:
        row = next(csv.DictReader(f))
    assert (row["sel_epoch"], row["sel_bleu_tok"]) == ("3", "22.0")

def test_the_selected_epoch_compares_one_quantity_across_the_epochs(tmp_path):
    """An epoch that logged no NLL makes the whole run select on the smoothed loss: an NLL is about
    1.3 bits below its smoothed loss, so mixing them would pick the epoch that has the NLL."""
    d = write_run(tmp_path, "postln", 1e-3, 0, 1, final=3.0, bleu=20.0)  # epoch 1: NLL 3.0, loss 3.0 + SMOOTHING
    (d / "eval" / "epoch2.json").write_text(json.dumps({
        "epoch": 2, "num_updates": 200, "valid_loss": 2.9 + SMOOTHING, "valid_nll_loss": None, "train_loss": 4.0,
        "bleu_tok": 21.0}))
    assert RunDir(d).record().selected.epoch == 2
    (d / "eval" / "epoch2.json").write_text(json.dumps({
        "epoch": 2, "num_updates": 200, "valid_loss": 2.9 + SMOOTHING, "valid_nll_loss": 3.1, "train_loss": 4.0,
        "bleu_tok": 21.0}))
    assert RunDir(d).record().selected.epoch == 1


def test_the_bleu_figure_per_architecture(tmp_path):
    for seed, (pre, post) in enumerate(((27.0, 2.0), (28.0, 0.0)), 1):
        write_run(tmp_path, "preln", 1e-3, 0, seed, final=2.0, bleu=pre)
        write_run(tmp_path, "postln", 1e-3, 0, seed, final=5.5 + seed * 0.1, bleu=post)
        write_run(tmp_path, "postln", 1e-3, 100, seed, final=2.9, bleu=12.0)
    from fairseq_lnpos.analysis.map_figures import bleu_points, plot_bleu

    cells = S.make_cells(runs_frame(tmp_path))
    points = bleu_points(cells)
    assert points[6][0] == [("postln", 1.0, 0.0, 2.0, False), ("preln", 27.5, 27.0, 28.0, True)]
    assert points[6][100] == [("postln", 12.0, 12.0, 12.0, True)]
    assert plot_bleu(cells, tmp_path / "bleu.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_bleu(cells.assign(bleu=math.nan), tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_a_run_with_an_outcome_but_no_config_is_not_dropped_without_a_word(sweep, capsys):
    """Every reader of a grid's folder (the map, the table, status) says so, as the grid does."""
    d = sweep / "postln-L6-lr0.001-w0" / "seed2"
    (d / "config.json").unlink()
    assert S.main([str(sweep), "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{d} has an outcome (DONE.json) but no config.json" in err
    with pytest.raises(Exception, match="has an outcome"):
        report.make_table(sweep, with_figures=False)


def test_a_page_without_runs_links_no_runs_csv(tmp_path):
    from fairseq_lnpos.analysis.publish import publish

    import platform

    import torch

    text = publish(tmp_path / "page", "A check", "# A check\n\nbody\n", None, [], "cmd").read_text()
    assert "- Data: none beside this page" in text and "runs.csv" not in text
    assert not (tmp_path / "page" / "runs.csv").exists()
    # a measurement without runs (a benchmark) names the versions it ran with, as a run's record does
    (line,) = [line for line in text.splitlines() if line.startswith("- Machine: ")]
    assert f"; Python {platform.python_version()}, torch {torch.__version__}, fairseq " in line
    assert line.endswith(" (this page's)")



def test_a_page_names_the_code_as_it_was_before_its_own_files_were_written(tmp_path, monkeypatch):
    """Republishing a committed page rewrites its tracked files: the checkout is then "dirty" by the
    page alone, which must not be reported as uncommitted changes of the code that wrote it."""
    from fairseq_lnpos import provenance as P
    from fairseq_lnpos.analysis.publish import publish

    page = tmp_path / "page"
    figure = tmp_path / "fig.png"
    figure.write_bytes(b"png")

    def git(*args):  # the checkout changes once the page's first file is written
        if args[0] == "rev-parse":
            return "a" * 40
        return " M docs/results/page/fig.png" if (page / "fig.png").exists() else ""

    monkeypatch.setattr(P, "_git", git)
    P.code_version.cache_clear()
    try:
        text = publish(page, "A check", "body\n", None, [figure], "cmd").read_text()
    finally:
        P.code_version.cache_clear()
    assert "page written by code aaaaaaaaaa\n" in text and "uncommitted" not in text

def test_a_published_runs_csv_keeps_identifiers_that_look_like_numbers(tmp_path):
    """A commit or model-code hash such as 36640e8826 reads back as itself, not as a number (inf)."""
    from fairseq_lnpos.analysis.frame import write_runs_csv

    write_run(tmp_path / "out", "postln", 1e-3, 0, 1, final=3.0, model_code="36640e8826")
    write_runs_csv(runs_frame(tmp_path / "out"), tmp_path / "runs.csv")
    assert read_runs_csv(tmp_path / "runs.csv")["model_code"].tolist() == ["36640e8826"]


def test_a_runs_csv_without_a_column_of_this_version_is_one_line_that_says_what_to_do(tmp_path, capsys):
    """A runs.csv of an earlier version (here without ``precision``) or of something else is refused by name."""
    from fairseq_lnpos.analysis.frame import write_runs_csv

    write_run(tmp_path / "out", "postln", 1e-3, 0, 1, final=3.0)
    write_runs_csv(runs_frame(tmp_path / "out").drop(columns=["precision"]), tmp_path / "old.csv")
    assert S.main(["--runs-csv", str(tmp_path / "old.csv"), "--out-dir", str(tmp_path / "map")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "old.csv is not a runs.csv of this version of the project (no column 'precision')" in err
    assert "publish the page again with this version's command" in err


def test_a_run_whose_gradient_log_is_damaged_is_marked_in_the_results_table_which_is_still_written(tmp_path):
    """make_table.sh loses nothing it can compute: a run folder whose table row cannot be built (here its
    grad_norms.jsonl is damaged) is a row that says why, the other runs' rows and results.md are written,
    and the command then ends in the one-line error (exit 2 from the command)."""
    write_run(tmp_path, "postln", 1e-3, 0, 1, final=3.0, bleu=20.0)
    bad = write_run(tmp_path, "preln", 1e-3, 0, 1, final=2.0, bleu=30.0)
    (bad / "checkpoints").mkdir()
    (bad / "checkpoints" / "grad_norms.jsonl").write_text('{"norms": {"encoder/0": 1.0}}\n')  # no "update"
    with pytest.raises(StateError, match=r"1 run folder\(s\) unreadable, .*grad_norms\.jsonl cannot be read as a "
                                         r"gradient-norm log .*delete it to map the run without its gradient norms"):
        report.make_table(tmp_path, with_figures=False)
    md = (tmp_path / "results.md").read_text()
    assert "| postln-L6-lr0.001-w0 |" in md and "unreadable: " in md and "grad_norms.jsonl" in md
    assert not (tmp_path / "runs.csv").exists()  # the table of every run is not written with a run left out


def test_the_results_table_names_the_model_code_and_refuses_a_mix_unless_asked(tmp_path):
    """make_table.sh, like the map: results.md says which model code trained the runs; runs of two versions
    are refused with one line naming both and the option, before anything is written, unless allowed."""
    write_run(tmp_path, "postln", 1e-3, 0, 1, final=3.0, bleu=20.0)
    md, _, _ = report.make_table(tmp_path, with_figures=False)
    assert "Runs trained by model code abc123 (1 run)." in md
    d = write_run(tmp_path, "preln", 1e-3, 0, 1, final=2.0, bleu=30.0, model_code="def456")
    for name in ("results.md", "results.csv", "results_by_run.csv", "runs.csv"):
        (tmp_path / name).unlink()
    with pytest.raises(LnposError, match=f"def456: 1 run, e.g. {d}.*--allow-mixed-code"):
        report.make_table(tmp_path, with_figures=False)
    assert not any((tmp_path / n).exists() for n in ("results.md", "results.csv", "runs.csv"))
    assert report.main([str(tmp_path), "--no-figures"]) == 2
    md, _, _ = report.make_table(tmp_path, with_figures=False, allow_mixed_code=True)
    assert "Runs trained by model code abc123 (1 run), def456 (1 run)." in md


MAP_PAGES = sorted(p.parent.name for p in (REPO_ROOT / "docs" / "results").glob("*/cells.csv"))


def judged(page, **rules):
    """A published map's runs.csv judged now, with the rules its command line gave and ``rules``."""
    command = page_argv(page)
    assert command[0].endswith("stability_map.sh")
    for option, name, kind in (("--trains", "trains", float), ("--margin", "margin", float), ("--alpha", "alpha", float),
                               ("--source-gain", "gain", float)):
        if option in command and name not in rules:
            rules[name] = kind(command[command.index(option) + 1])
    runs = read_runs_csv(page / "runs.csv")
    return S.compare(S.make_cells(runs, **rules), runs, **{k: v for k, v in rules.items()})


@pytest.mark.parametrize("name", MAP_PAGES)
def test_every_published_maps_verdicts_follow_from_its_own_runs_csv_under_the_current_rule(name):
    """A map page is a view of its per-seed data: its runs.csv judged now, with the rules its command
    line gave, gives the page's cells, their seeds that train, NLL and every word, and its comparisons. A
    change of the rule that would change a published claim fails here until the page is written again."""
    import pandas as pd

    page = REPO_ROOT / "docs" / "results" / name
    cells, table = judged(page)
    words = ["verdict", "vs_warmup", "vs_preln"]
    published = pd.read_csv(page / "cells.csv")
    published[words] = published[words].fillna("")
    keys = ["variant", "layers", "warmup", "lr", "seeds", "finished", "seeds_train", "trains", *words]
    assert cells[keys].astype(str).values.tolist() == published[keys].astype(str).values.tolist()
    for column in ("nll", "nll_trained", "nll_trained_low", "nll_trained_high"):  # cells.csv keeps 6 digits
        assert cells[column].fillna(-1).tolist() == pytest.approx(published[column].fillna(-1).tolist(), abs=1e-4)
    comparisons = pd.read_csv(page / "comparisons.csv")
    assert table["word"].tolist() == comparisons["word"].tolist()
    assert table["diff"].fillna(-1).tolist() == pytest.approx(comparisons["diff"].fillna(-1).tolist(), abs=1e-4)


def test_the_published_map_check_sees_a_rule_that_changes_a_verdict():
    """Not a check that cannot fail: the width-96 page judged with a 0.5-bit margin is another map."""
    import pandas as pd

    page = REPO_ROOT / "docs" / "results" / "all-archs"
    cells, _ = judged(page, margin=0.5)
    assert cells["verdict"].tolist() != pd.read_csv(page / "cells.csv")["verdict"].fillna("").tolist()
