"""Aggregate training throughput of a grid (scripts/tools/throughput.py; scripts/gpu_check.sh compares K runs side by side with one
alone): words counted from fairseq's per-epoch train records, ratios and bad input by hand."""
import json

import pytest

from conftest import tool
from fairseq_lnpos.experiments.records import EpochRecord
from fairseq_lnpos.experiments.rundir import RunDir
from fairseq_lnpos.experiments.runs import BY_NAME

TP = tool("throughput")

# fairseq-train 0.12's end-of-epoch record with --log-format json (Multi30k, paper-size model)
EPOCH = ('2026-12-01 00:31:32 | INFO | train | {"epoch": %d, "train_loss": "6.341", "train_wps": "2553.2", '
         '"train_wpb": "%s", "train_bsz": "45.5", "train_num_updates": "%d", "train_wall": "38"}')
INNER = ('2026-12-01 00:31:20 | INFO | train_inner | {"epoch": 1, "loss": "9.1", "wpb": "9999", '
         '"num_updates": "5"}')


def write_run(out, name, epochs, eval_seconds=()):
    """A run folder (config.json) with a fairseq log: ``epochs`` = [(words per batch, updates at the epoch's end)],
    and an eval/epochN.json for each of ``eval_seconds``."""
    run = out / name / "seed1"
    rd = RunDir(run)
    rd.claim({"seed": 1, "arch": "transformer_postln_tiny", "run": BY_NAME["demo-postln-nowu"].as_dict()}, "0" * 16)
    for epoch, seconds in enumerate(eval_seconds, 1):
        rd.write_eval(EpochRecord(epoch=epoch, eval_seconds=seconds))
    lines = ["# grid: fairseq-train ...", INNER]
    lines += [EPOCH % (e, wpb, n) for e, (wpb, n) in enumerate(epochs, 1)]
    (run / "train.log").write_text("\n".join(lines + ["# fairseq-train ran 12.0 s", ""]))
    return run / "train.log"


def test_words_are_words_per_batch_times_the_updates_of_each_epoch(tmp_path):
    log = write_run(tmp_path, "a", [("100", 10), ("50.5", 30)])
    assert TP.words_trained(log) == 100 * 10 + 50.5 * 20   # the train_inner record is not counted
    write_run(tmp_path, "b", [("200", 3)])
    assert TP.grid_words(tmp_path) == {"a/seed1": 2010.0, "b/seed1": 600.0}


def test_ratio_against_one_run_alone(tmp_path, capsys):
    for name in ("a", "b", "c"):
        write_run(tmp_path / "grid", name, [("100", 10), ("100", 20)], eval_seconds=(2.5, 1.5))  # 2000 words each
    # an epoch left unscored (--eval-every) is recorded without eval_seconds: not a checkpoint scored
    (tmp_path / "grid" / "c" / "seed1" / "eval" / "epoch3.json").write_text(json.dumps({"epoch": 3, "bleu_tok": None}))
    write_run(tmp_path / "alone", "a", [("100", 20)])                    # 2000 words
    assert TP.main([str(tmp_path / "grid"), "30", "--alone", str(tmp_path / "alone"), "40"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-4] == "grid: 3 runs, 6,000 target words in 30 s of wall time: 200 words/s"
    assert out[-3] == "scoring: 6 checkpoints, 12 s in the evaluator, 40 % of the wall time"
    assert out[-2] == "alone: 1 run, 2,000 target words in 40 s: 50 words/s"
    # 6000 words at 50 words/s = 120 s one after another, against 30 s side by side
    assert out[-1].startswith("ratio 4.00: ") and out[-1].endswith("take about 120 s, side by side they took 30 s")


@pytest.mark.parametrize("argv, message", [
    (["{t}/nowhere", "10"], "{t}/nowhere is not a folder: give the --out folder of a grid run"),
    (["{t}/empty", "10"], "no runs in {t}/empty (no NAME/seedS/ with config.json and train.log): give the --out folder of a grid run"),
    (["{t}/grid", "0"], "the wall time must be a number of seconds above 0, got '0'"),
    (["{t}/grid", "ten"], "the wall time must be a number of seconds above 0, got 'ten'"),
    (["{t}/grid", "10", "--alone", "{t}/grid", "5"], "{t}/grid holds 2 runs; --alone takes a grid of one run"),
    (["{t}/bad", "10"], "{t}/bad/a/seed1/train.log: the train record of epoch 1 has no train_wpb"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    write_run(tmp_path / "grid", "a", [("100", 10)])
    write_run(tmp_path / "grid", "b", [("100", 10)])
    (tmp_path / "empty").mkdir()
    bad = write_run(tmp_path / "bad", "a", [])
    bad.write_text(bad.read_text() + '2026-12-01 00:31:32 | INFO | train | {"epoch": 1, "train_loss": "6.3"}\n')
    assert TP.main([a.format(t=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("throughput: error: " + message.format(t=tmp_path)), err
