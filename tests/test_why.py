"""The warm-up study's report (analysis/why.py): the rows' verdicts, the early diagnostics read from
the files training writes, and the separation's error rates (the in-sample one optimistic, the
leave-one-out one not), checked by simulation."""
import json
import math

import numpy as np
import pytest

from fairseq_lnpos.analysis import why as W
from fairseq_lnpos.experiments.records import DoneRecord, Outcome
from fairseq_lnpos.experiments.rundir import RunDir

UNIGRAM = 6.0


def write_why_run(out, corpus, row, seed, nll, losses=(), diag=(), norms=()):
    """One why-* run folder in the grid's current schema: config.json, eval/epoch1.json, DONE.json,
    train.log with ``losses`` ((update, loss)), and the two JSONL files training writes."""
    d = out / f"why-{corpus}-{row}" / f"seed{seed}"
    (d / "eval").mkdir(parents=True)
    (d / "checkpoints").mkdir()
    ln = {"preln-nowu": "preln", "admin-nowu": "admin"}.get(row, "postln")
    run = {"name": f"why-{corpus}-{row}", "dataset": "synthetic", "ln": ln, "optimizer": "adam", "lr": 1e-3}
    (d / "config.json").write_text(json.dumps({"hash": "0" * 16, "run": run, "seed": seed, "arch": f"transformer_{ln}_tiny"}))
    (d / "eval" / "epoch1.json").write_text(json.dumps({"epoch": 1, "num_updates": 100, "valid_loss": nll + 1.3,
                                                        "valid_nll_loss": nll, "train_loss": nll + 1.3}))
    RunDir(d).write_done(DoneRecord(outcome=Outcome.FINISHED, epochs=(1,), initial_loss=9.0, updates=100,
                                    final_valid_loss=nll + 1.3, final_valid_nll=nll, unigram_bits=UNIGRAM,
                                    train_cpu_seconds=10.0,
                                    provenance={"code": {"commit": "f" * 40, "dirty": False}, "model_code": "abc",
                                                "cpu": "a CPU", "cores": 2, "gpu": [], "load": 1.0}))
    (d / "train.log").write_text("".join(
        f'2026-12-04 10:00:00 | INFO | train_inner | {{"epoch": 1, "num_updates": "{u}", "loss": "{loss}"}}\n'
        for u, loss in losses))
    (d / "checkpoints" / "diagnostics.jsonl").write_text("".join(json.dumps({"update": u, **r}) + "\n" for u, r in diag))
    (d / "checkpoints" / "grad_norms.jsonl").write_text("".join(json.dumps({"update": u, "norms": n}) + "\n" for u, n in norms))
    return d


def test_the_values_at_an_update_are_taken_as_each_feature_says(tmp_path):
    diag = [(u, {"update_ratio": {"encoder/0": 0.1 * u, "encoder/0/fc1": 99.0, "decoder/1": 0.2 * u},
                 "adaptive_lr_max": {"encoder/0/fc1": 3.0, "decoder/1/fc2": 7.0 + u},
                 "attn_entropy_min_head": {"encoder/0/self_attn": 1.5, "decoder/0/self_attn": 0.5},
                 "output_logits": {"l2_mean": 4.0, "max_abs": 9.0}, "hessian_top": 11.0 * u})
            for u in (1, 10, 50)]
    norms = [(10, {"decoder/0": 1.0, "decoder/1": 4.0, "encoder/0": 2.0, "encoder/1": 1.0, "total": 5.0})]
    losses = [(u, 10.0 - 0.01 * u) for u in range(1, 101)]
    d = write_why_run(tmp_path, "synthetic", "postln-nowu", 1, 4.0, losses, diag, norms)
    v = W.run_values(d)
    # a whole layer's ratio, not a sub-layer's (99.0 is encoder/0/fc1)
    assert v[("update_ratio_max", 10)] == pytest.approx(0.2 * 10)
    assert v[("adaptive_lr_max", 50)] == pytest.approx(57.0)
    assert v[("attn_entropy_min", 10)] == 0.5 and v[("output_logit_norm", 50)] == 4.0
    assert v[("hessian_top", 1)] == 11.0 and v[("hessian_top", 50)] == 550.0
    assert v[("grad_ratio_decoder", 10)] == 0.25 and v[("grad_ratio_encoder", 10)] == 2.0
    assert v[("grad_norm_total", 10)] == 5.0 and math.isnan(v[("grad_norm_total", 50)])
    # the training loss at u: the mean of updates u-9 .. u
    assert v[("train_loss", 10)] == pytest.approx(np.mean([10.0 - 0.01 * u for u in range(1, 11)]))
    assert v[("train_loss", 100)] == pytest.approx(np.mean([10.0 - 0.01 * u for u in range(91, 101)]))
    assert math.isnan(v[("update_ratio_max", 100)])  # no record at update 100


def test_best_threshold_finds_the_separating_cut_and_its_direction():
    x = np.array([1.0, 2.0, 3.0, 10.0, 11.0])
    fails = np.array([False, False, False, True, True])
    assert W.best_threshold(x, fails) == (0, 6.5, 1)
    assert W.best_threshold(-x, fails) == (0, -6.5, -1)
    # equal values cannot be cut apart: one error at least
    assert W.best_threshold(np.array([1.0, 1.0, 2.0]), np.array([True, False, False]))[0] == 1
    assert W.loo_errors(x, fails) == 0


def test_without_information_leave_one_out_is_not_better_than_the_common_class():
    """Simulated: a diagnostic drawn independently of the outcome. The threshold chosen on all runs
    looks informative (its error below always answering the common class); leave-one-out does not."""
    rng = np.random.default_rng(0)
    n, k, sims = 24, 8, 300
    fails = np.arange(n) < k
    insample, loo = [], []
    for _ in range(sims):
        x = rng.standard_normal(n)
        insample.append(W.best_threshold(x, fails)[0] / n)
        loo.append(W.loo_errors(x, fails) / n)
    base = k / n
    assert np.mean(insample) < base - 0.05
    assert np.mean(loo) >= base - 0.02
    # and with an informative diagnostic leave-one-out finds it
    x = rng.standard_normal(n) + 4 * fails
    assert W.loo_errors(x, fails) / n < 0.1


@pytest.fixture
def study(tmp_path):
    out = tmp_path / "why"
    rng = np.random.default_rng(1)
    losses = {True: [(u, 9.0 - 0.05 * u) for u in range(1, 101)], False: [(u, 9.0) for u in range(1, 101)]}
    nlls = {"postln-nowu": (4.5, 4.6, 4.4), "preln-nowu": (0.10, 0.12, 0.11), "postln-radam": (0.11, 0.13, 0.12),
            "postln-lr3e-4": (0.9, 0.95, 1.0), "postln-clip1": (0.2, 4.5, 0.25)}
    for row, values in nlls.items():
        for seed, nll in enumerate(values, 1):
            trains = nll < 3
            diag = [(u, {"update_ratio": {"encoder/0": (0.5 if not trains else 0.05) + 0.01 * rng.random()}})
                    for u in (10, 50, 100)]
            write_why_run(out, "synthetic", row, seed, nll, losses[trains], diag)
    return out


def test_the_rows_verdicts_and_the_difference_from_pre_ln(study):
    from scipy.stats import ttest_ind

    runs, _ = W.load([study])
    table = W.row_table(runs).set_index("row")
    assert table.at["postln-nowu", "seeds_train"] == 0 and table.at["postln-nowu", "good"] is False
    assert table.at["postln-clip1", "seeds_train"] == 2 and not table.at["postln-clip1", "trains"]
    # RAdam is as good as Pre-LN; lr 3e-4 trains but is worse by more than the margin
    assert table.at["postln-radam", "good"] is True and table.at["preln-nowu", "good"] is True
    assert table.at["postln-lr3e-4", "trains"] and table.at["postln-lr3e-4", "good"] is False
    ci = ttest_ind([0.9, 0.95, 1.0], [0.10, 0.12, 0.11], equal_var=False).confidence_interval(0.95)
    assert table.at["postln-lr3e-4", "diff_low"] == pytest.approx(ci.low)
    assert table.at["postln-lr3e-4", "diff_preln"] == pytest.approx(0.95 - 0.11)


def test_the_report_separates_by_the_diagnostic_that_carries_the_outcome(study, tmp_path):
    rc = W.main([str(study), "--out-dir", str(tmp_path / "r")])
    assert rc == 0
    sep = __import__("pandas").read_csv(tmp_path / "r" / "why_separation.csv")
    at = sep[sep["scope"] == "synthetic"].set_index(["feature", "update"])
    assert at.loc[("update_ratio_max", 10), "loo_error"] == 0 and at.loc[("train_loss", 50), "loo_error"] == 0
    assert at.loc[("update_ratio_max", 10), "failing"] == 4 and at.loc[("update_ratio_max", 10), "runs"] == 15
    # the same model alone: the Pre-LN control's runs left out
    model = sep[sep["scope"] == "synthetic+postln6"].set_index(["feature", "update"])
    assert model.loc[("update_ratio_max", 10), "runs"] == 12 and model.loc[("update_ratio_max", 10), "failing"] == 4
    md = (tmp_path / "r" / "why.md").read_text()
    assert "| `postln-clip1` | gradient clipping at norm 1.0 | 2/3 |" in md
    assert "`postln-radam` 3/3 seeds trained" in md
    assert (tmp_path / "r" / "why_diagnostics_synthetic.png").stat().st_size > 0
    # every line of a Markdown table has its header's number of columns
    table = []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            table.append(line.count("|"))
        elif table:
            assert set(table) == {table[0]}, table
            table = []


def test_a_corpus_can_be_given_its_own_threshold_of_trains(study, tmp_path, capsys):
    """``--trains CORPUS=F`` moves that corpus's line only; a bad one is refused in one line."""
    runs, _ = W.load([study], trains={"synthetic": 0.75})  # 0.75 x 6.0 = 4.5 bits: the 4.4 and 4.5 seeds train
    table = W.row_table(runs).set_index("row")
    assert table.at["postln-nowu", "seeds_train"] == 2 and table.at["postln-clip1", "seeds_train"] == 3
    assert W.load([study], trains={"multi30k": 0.8})[0]["trains"].equals(W.load([study])[0]["trains"])
    assert W.main([str(study), "--trains", "synthetic=0.75", "--out-dir", str(tmp_path / "r")]) == 0
    assert "at most 0.75 x it, 4.50 bits; the maps' 0.5 replaced by --trains" in capsys.readouterr().out
    for bad in ("synthetic=1.5", "wmt=0.5", "synthetic"):
        with pytest.raises(SystemExit) as e:
            W.main([str(study), "--trains", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "give CORPUS=F" in err[0]


def test_a_folder_without_the_study_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert W.main([str(tmp_path / "empty"), "--out-dir", str(tmp_path / "r")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no runs in" in err[0]
    write_why_run(tmp_path / "other", "elsewhere", "postln-nowu", 1, 4.0)  # runs, none of the study's corpora
    assert W.main([str(tmp_path / "other"), "--out-dir", str(tmp_path / "r")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid.sh run --only 'why-*'" in err[0]
    assert not (tmp_path / "r").exists()  # nothing written
    assert W.main([str(tmp_path / "nope")]) != 0
    assert "no such folder" in capsys.readouterr().err


def test_a_published_page_adds_up_with_new_run_folders(study, tmp_path, capsys):
    """Seeds run elsewhere add up: the page alone gives the report it was written from, and the page with a
    folder of new seeds gives the report of all the run folders together; a run given twice is refused."""
    import shutil

    pd = __import__("pandas")
    old, new = tmp_path / "old", tmp_path / "new"
    for run in study.iterdir():
        for seed in run.iterdir():
            dest = (new if seed.name == "seed3" else old) / run.name / seed.name
            shutil.copytree(seed, dest)
    assert W.main([str(study), "--out-dir", str(tmp_path / "all")]) == 0
    assert W.main([str(old), "--out-dir", str(tmp_path / "page")]) == 0
    assert W.main([str(tmp_path / "page"), "--out-dir", str(tmp_path / "again")]) == 0
    assert W.main([str(tmp_path / "page"), str(new), "--out-dir", str(tmp_path / "both")]) == 0
    for name in ("why.md", "why_rows.csv", "why_early.csv", "why_separation.csv"):
        assert (tmp_path / "again" / name).read_text() == (tmp_path / "page" / name).read_text(), name
        assert (tmp_path / "both" / name).read_text() == (tmp_path / "all" / name).read_text(), name
    # the page keeps every digit of the values it is read back from (the fixture's are random floats)
    runs, _ = W.load([old])
    assert pd.read_csv(tmp_path / "page" / W.EARLY_CSV)["value"].equals(W.early_values(runs)["value"].astype(float))
    both = pd.read_csv(tmp_path / "both" / "runs.csv")
    assert len(both) == 15 and sorted(both["seed"].unique()) == [1, 2, 3] and "source" not in both.columns
    capsys.readouterr()
    assert W.main([str(tmp_path / "page"), str(study), "--out-dir", str(tmp_path / "r")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed 1 is in" in err[0] and "give each run once" in err[0]
    (tmp_path / "page" / W.EARLY_CSV).write_text("corpus,row\nsynthetic,x\n")
    assert W.main([str(tmp_path / "page"), "--out-dir", str(tmp_path / "r")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the study's why_early.csv" in err[0]


def test_one_command_trains_the_rows_then_writes_the_report(tmp_path):
    """scripts/why_study.sh: the grid with the study's rows and the options before "--", then the report on
    the same folder with what follows; a missing OUT is a usage error (exit 2, one line)."""
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "why_study.sh"
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n')
    stub.chmod(0o755)
    env = {**os.environ, "PYTHON": str(stub)}
    done = subprocess.run([str(script), "OUT", "--seeds", "3", "--data", "multi30k_cpu=D", "--", "PAGE",
                           "--publish", "P"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == [
        "-m fairseq_lnpos.experiments.grid run --only why-* --seeds 3 --data multi30k_cpu=D --out OUT",
        "-m fairseq_lnpos.analysis.why OUT PAGE --publish P"]
    bad = subprocess.run([str(script), "--seeds", "3"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "OUT" in bad.stderr
