"""The records of a run folder (experiments/records.py): folders written by an earlier version are refused
with the command that migrates them (migrate.py), and once migrated load to the same outcome, words and
numbers; new records keep the words and add the outcome as fields, which are what is read back; the
shape checks follow the dataclasses; a recorded run is read back as a Run."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from fairseq_lnpos.errors import StateError
from fairseq_lnpos.experiments import commands as C
from fairseq_lnpos.experiments import report, sweep
from fairseq_lnpos.experiments.migrate import migrate, migrated_done
from fairseq_lnpos.experiments.options import RunOptions
from fairseq_lnpos.experiments.records import (AverageRecord, DoneRecord, EpochRecord, Outcome, Scores,
                                               ScoreRequest)
from fairseq_lnpos.experiments.rundir import RunDir, run_dirs
from fairseq_lnpos.experiments.runs import BY_NAME, LATER_FIELDS, Run

# a sweep cell's config.json as an earlier version wrote it (a run of the all-architecture map)
CONFIG = {"arch": "transformer_postln_tiny", "beam": 5, "data": "/work/maps/demo/data/bin", "fairseq_args": "",
          "fp16": False, "gen_args": ["--max-len-a", "1.2", "--max-len-b", "10"], "hash": "304778d24880bf7b",
          "lenpen": 1.2, "run": {
              "activation_dropout": 0.0, "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-08, "attention_dropout": 0.0,
              "average_last": 0, "batch_tokens": 512, "beam": 5, "clip_norm": 0.0, "dataset": "synthetic",
              "decay_anchor": 1000000000, "decay_epoch": 0, "decay_factor": 0.1, "decay_period": 4000,
              "decoupled_weight_decay": False, "dropout": 0.1, "end_lr": 0.0, "extra": [], "figure": "sweep",
              "init": "fairseq-0.12", "inverse_sqrt_after_decay": False, "label_smoothing": 0.1, "layers": 6,
              "lenpen": 1.2, "ln": "postln", "lr": 0.003, "max_epoch": 1000000, "max_tokens": 512, "max_update": 200,
              "momentum": 0.0, "name": "sweep-postln-L6-lr0.003-wu1", "optimizer": "adam", "paper_bleu": None,
              "paper_note": "stability sweep", "paper_valid_loss": None, "schedule": "inverse_sqrt",
              "share_embeddings": "none", "source": "", "task": "translation", "warmup": 0, "warmup_init_lr": 0.0,
              "weight_decay": 0.0}, "seed": 2}
STALLED = ("training loss stalled at 6.78 bits (0.73 x its first 9.32; -0.03 over the last 20 updates) at 60% "
           "of the budget")
# DONE.json of each outcome as the earlier version wrote it: the outcome in words only
OLD_DONE = {
    "stopped": {"cuda_peak_mb": None, "diverged_at": None, "epochs": [1], "final_valid_loss": 6.772,
                "initial_loss": 9.325, "peak_rss_mb": 557.1, "status": f"stopped early at update 120: {STALLED}",
                "stopped_at": 120, "train_cpu_seconds": 27.8, "train_seconds": 90.4, "updates": 120},
    "finished": {"cuda_peak_mb": None, "diverged_at": None, "epochs": [1, 2], "final_valid_loss": 5.249,
                 "initial_loss": 9.4, "peak_rss_mb": 559.9, "status": "finished", "train_seconds": 69.1,
                 "updates": 200},  # before stopped_at and train_cpu_seconds
    "diverged": {"cuda_peak_mb": None, "diverged_at": 40, "epochs": [], "final_valid_loss": None,
                 "initial_loss": 9.3, "peak_rss_mb": 550.0, "status": "diverged at update 40", "stopped_at": None,
                 "train_cpu_seconds": 9.1, "train_seconds": 20.5, "updates": 40},
    "failed": {"status": "failed: fairseq-train exited 1; see /o/x/seed1/train.log"},
}
OLD_EPOCH = {"bleu_tok": None, "epoch": 1, "lr": 0.003, "num_updates": 99, "train_loss": 6.857,
             "valid_loss": 6.772, "valid_nll_loss": 6.375}
OLD_SCORED = {"bleu_tok": 3.21, "bleu_tok_settings": "fairseq bleu, lowercase=True, compound_split=False",
              "epoch": 2, "eval_seconds": 4.12, "lr": 0.003, "n_sentences": 500, "no_hypothesis": 0,
              "num_updates": 198, "sacrebleu": 2.9, "sacrebleu_signature": "nrefs:1|case:lc|eff:no|tok:13a",
              "train_loss": 5.7, "valid_loss": 5.2, "valid_nll_loss": 4.6}
OLD_AVERAGE = {"average_last": 2, "bleu_tok": 3.5, "bleu_tok_settings": "fairseq bleu, lowercase=True, "
               "compound_split=False", "epochs": [1, 2], "eval_seconds": 3.9, "n_sentences": 500, "no_hypothesis": 0,
               "sacrebleu": 3.1, "sacrebleu_signature": "nrefs:1|case:lc|eff:no|tok:13a"}


def old_folder(out, which):
    """A run folder as the earlier version wrote it, with the DONE.json of ``which``."""
    d = Path(out) / "sweep-postln-L6-lr0.003-wu1" / "seed2"
    (d / "eval").mkdir(parents=True)
    for name, obj in (("config.json", CONFIG), ("DONE.json", OLD_DONE[which]), ("eval/epoch1.json", OLD_EPOCH),
                      ("eval/epoch2.json", OLD_SCORED), ("eval/average.json", OLD_AVERAGE)):
        (d / name).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    return RunDir(d)


@pytest.mark.parametrize("which, outcome, fields", [
    ("stopped", Outcome.STOPPED, dict(stopped_at=120, reason=STALLED, diverged_at=None, train_cpu_seconds=27.8)),
    ("finished", Outcome.FINISHED, dict(stopped_at=None, reason=None, epochs=(1, 2), train_cpu_seconds=None)),
    ("diverged", Outcome.DIVERGED, dict(diverged_at=40, reason=None, updates=40)),
    ("failed", Outcome.FAILED, dict(reason="fairseq-train exited 1; see /o/x/seed1/train.log", updates=None)),
])
def test_a_folder_of_the_earlier_version_migrated_loads_to_its_outcome_and_fields(tmp_path, which, outcome, fields):
    rd = old_folder(tmp_path, which)
    with pytest.raises(StateError, match=rf"^{rd.done_path} was written by an earlier version \(its outcome in words "
                                         r"only\): run `scripts/grid.sh migrate OUT` once on its output folder"):
        rd.record()
    assert migrate(tmp_path) == [rd.done_path] and migrate(tmp_path) == []  # once; a second time changes nothing
    rec = rd.record()
    assert rec.outcome is outcome and rd.outcome() is outcome and rec.outcome.final == (which != "failed")
    assert rec.outcome_text == rec.done.text == OLD_DONE[which]["status"]  # the words, as before
    assert {k: getattr(rec.done, k) for k in fields} == fields
    assert [e.epoch for e in rec.evals] == [1, 2] and rec.best.bleu_tok == 3.21 and rec.best.sacrebleu == 2.9
    assert rec.evals[0] == EpochRecord(epoch=1, lr=0.003, num_updates=99, train_loss=6.857, valid_loss=6.772,
                                       valid_nll_loss=6.375)
    assert rec.average == AverageRecord(epochs=(1, 2), average_last=2, **Scores.from_json(
        {k: v for k, v in OLD_AVERAGE.items() if k not in ("epochs", "average_last")}).scores())
    (row,) = report.collect(run_dirs(tmp_path))
    assert (row["status"], row["outcome"], row["avg_epochs"]) == (OLD_DONE[which]["status"], outcome.value, "1-2")


def test_records_written_again_are_the_files_of_before_plus_the_outcome_fields(tmp_path):
    """Epoch and average records write what the earlier version wrote; DONE.json keeps its words and
    adds "outcome" (and "reason"), the same record when read back."""
    assert EpochRecord.from_json(OLD_EPOCH).to_json() == OLD_EPOCH
    assert EpochRecord.from_json(OLD_SCORED).to_json() == OLD_SCORED
    assert AverageRecord.from_json(OLD_AVERAGE).to_json() == OLD_AVERAGE
    for which, old in OLD_DONE.items():
        path = tmp_path / f"{which}.json"
        path.write_text(json.dumps(old))
        path.write_text(json.dumps(migrated_done(path).to_json()))
        assert migrated_done(path) is None  # the current schema now: nothing to migrate
        new = json.loads(path.read_text())
        done = DoneRecord.from_json(new)
        added = {"outcome": done.outcome.value, **({"reason": done.reason} if done.reason else {})}
        assert new == {**{k: v for k, v in old.items()},
                       **({} if which == "failed" else {"stopped_at": old.get("stopped_at"),
                                                        "train_cpu_seconds": old.get("train_cpu_seconds")}),
                       **added}, which
        assert DoneRecord.from_json(json.loads(json.dumps(new))) == done


def test_the_outcome_is_read_from_its_fields_never_from_the_words():
    done = DoneRecord.from_json({"status": "finished", "outcome": "stopped early", "reason": "stalled",
                                 "stopped_at": 7})
    assert (done.outcome, done.text) == (Outcome.STOPPED, "stopped early at update 7: stalled")
    assert DoneRecord.from_json({"status": "anything", "outcome": "failed", "reason": "x"}).text == "failed: x"


@pytest.mark.parametrize("obj, problem", [
    ({}, r"\(no 'outcome'\)"),
    ({"status": 1, "outcome": "finished"}, r"\('status' is 1, not a string\)"),
    ({"status": "finished", "outcome": "maybe"}, r"\('outcome' is 'maybe', not one of 'finished', 'diverged', "
                                                 r"'stopped early', 'failed'\)"),
    ({"status": "finished", "outcome": "unfinished"}, r"\('outcome' is 'unfinished', not one of"),
    ({"status": "finished", "outcome": "finished", "updates": "many"},
     r"\('updates' is 'many', not a whole number or null\)"),
    ({"outcome": "finished", "epochs": [1, "2"]}, r"\('epochs' is \[1, '2'\], not a list of whole numbers or null\)"),
])
def test_the_shape_of_done_json_follows_the_record(tmp_path, obj, problem):
    path = tmp_path / "run" / "seed1"
    path.mkdir(parents=True)
    (path / "DONE.json").write_text(json.dumps(obj))
    with pytest.raises(StateError, match=r"DONE\.json is not an outcome record the grid writes " + problem):
        RunDir(path).done()


def test_the_shapes_of_the_other_records_follow_their_fields():
    shape = EpochRecord.shape()
    assert shape["epoch"][1] and not shape["bleu_tok"][1] and shape["bleu_tok"][0](None)
    assert AverageRecord.shape()["bleu_tok"][1] and not AverageRecord.shape()["bleu_tok"][0](None)
    with pytest.raises(StateError, match=r"no 'average_last'"):
        AverageRecord.from_json({"epochs": [1], "bleu_tok": 1.0})
    with pytest.raises(StateError, match=r"'argv' is \['a', 2\], not a list of strings"):
        ScoreRequest.from_json({"argv": ["a", 2], "data": "d", "hyp_out": "h", "checkpoint": "c"})


def test_a_request_and_scores_cross_the_pipe_unchanged():
    req = ScoreRequest(argv=("d", "--path", "c.pt"), data="d", hyp_out="h", checkpoint="c.pt", average=("1.pt", "2.pt"))
    assert ScoreRequest.from_json(json.loads(json.dumps(req.to_json()))) == req
    assert ScoreRequest.from_json({"argv": [], "data": "d", "hyp_out": "h", "checkpoint": "c"}).compound_split is False
    scores = Scores(bleu_tok=1.0, n_sentences=3, sacrebleu=None)
    assert scores.to_json() == {"bleu_tok": 1.0, "n_sentences": 3}  # null scores are left out
    assert EpochRecord(epoch=3).scored_as(scores).to_json() == {
        "epoch": 3, "bleu_tok": 1.0, "n_sentences": 3, "num_updates": None, "valid_loss": None,
        "valid_nll_loss": None, "train_loss": None, "lr": None}


def test_a_recorded_run_is_read_back_as_its_run():
    run = BY_NAME["ref-iwslt-tfixup"].with_defaults()
    assert Run.from_dict(run.as_dict()) == run
    assert Run.from_dict(replace(run, compound_split_bleu=True).as_dict()).compound_split_bleu is True
    older = {k: v for k, v in run.as_dict().items() if k not in LATER_FIELDS}
    assert Run.from_dict({**older, "a_field_of_a_later_version": 1}) == replace(run, **LATER_FIELDS)


def test_the_config_of_a_recorded_run_is_computed_again_to_its_hash(tmp_path):
    """Resuming needs the recorded config hash: a sweep cell's job today gives the config (and hash)
    that the earlier version recorded."""
    migrate(old_folder(tmp_path, "finished").path.parent.parent)
    rec = RunDir(next(tmp_path.glob("*/seed2"))).record()
    run = sweep.expand(["postln"], [3e-3], [1], [6], 200)[0].with_defaults()
    run = C.R.coerce(run, "max_epoch", "1000000")
    assert rec.run == run
    job = C.Job(run, 2, Path(CONFIG["data"]), rec.dir.path, CONFIG["arch"], ("de", "en"), RunOptions())
    assert job.config_hash() == CONFIG["hash"] and job.config() == {k: v for k, v in CONFIG.items() if k != "hash"}
    rec.dir.check_config(job.config_hash())


def test_an_outcome_without_its_update_says_so_not_none():
    from fairseq_lnpos.experiments.records import DoneRecord, Outcome

    assert DoneRecord(outcome=Outcome.DIVERGED).text == "diverged"
    assert DoneRecord(outcome=Outcome.STOPPED, reason="stalled").text == "stopped early: stalled"
    assert DoneRecord(outcome=Outcome.DIVERGED, diverged_at=40).text == "diverged at update 40"
