"""Faults in a grid's state: results lost while a run is called finished, state files of the wrong
shape, a user's folder written into, a stability map over runs that differ in more than its axes.

The bad-input rows run through test_faults.test_fault (one line, exit 2, nothing written outside
the row's output folders). The grid's own faults run the real scheduler and evaluator client with
stand-ins for fairseq-train and the evaluator process (no fairseq): the stand-ins kill themselves
or remove their run folder at a fixed point, so nothing races.
"""
import json
import os
import queue
import subprocess
import sys
from pathlib import Path

import pytest

import test_faults as F
from fairseq_lnpos.data.manifest import write_manifest
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments.commands import Job
from fairseq_lnpos.experiments.evaluator import EvalFailed, Evaluator, Stopped
from fairseq_lnpos.experiments.records import ScoreRequest
from fairseq_lnpos.experiments.report import collect, make_table
from fairseq_lnpos.experiments.rundir import run_dirs
from fairseq_lnpos.experiments.runs import BY_NAME
from fairseq_lnpos.experiments.scheduler import Grid
from test_faults import GRID, GRID_RUN, ROW, TABLE, Case
from test_stability import write_run

RUN1 = f"{ROW}/seed1"
CONFIG = json.dumps({"hash": "0", "seed": 1, "arch": "transformer_preln_tiny", "data": "/data", "fp16": False,
                     "run": BY_NAME[ROW].with_defaults().as_dict()})
STATUS = (GRID, "status", "{S}/out")
TABLE_OUT = (TABLE, "{S}/out", "--no-figures")
MAP = ("fairseq_lnpos.analysis.stability", "{S}/out", "--no-figures")
NOT_DONE = r"\S*/seed1/DONE\.json is not an outcome record the grid writes"


def fake_data(folder):
    """A data folder the grid accepts (manifest, dictionaries), for stand-in fairseq processes."""
    folder.mkdir(parents=True)
    for lang in ("de", "en"):
        (folder / f"dict.{lang}.txt").write_text("a 1\n")
    (folder / "test.en").write_text("a\n")
    write_manifest(folder, dataset="synthetic", source_lang="de", target_lang="en", post_process="sentencepiece",
                   refs={"tok": {"test": folder / "test.en"}})
    return folder


def grid_out(files, data=False):
    """A grid's output folder {S}/out holding run ROW seed 1 (a valid config.json) and ``files``
    (path under out -> text); with ``data``, {DATA} as well."""
    def setup(sandbox):
        if data:
            fake_data(sandbox / "data")
        for name, text in {f"{RUN1}/config.json": CONFIG, **files}.items():
            path = sandbox / "out" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return setup


def users_folder(sandbox):
    """{S}/out: a folder of the user's (no grid made it), and {DATA}."""
    fake_data(sandbox / "data")
    (sandbox / "out").mkdir()
    for name, text in (("results.md", "my results\n"), ("progress.log", "my progress\n"), ("notes.txt", "x\n")):
        (sandbox / "out" / name).write_text(text)


def runs_differing_in_the_optimizer(sandbox):
    """Two seeds of one stability cell, one trained with Adam and one with SGD at the same lr."""
    write_run(sandbox / "out", "postln", 1e-3, 0, 1, final=6.93)
    d = write_run(sandbox / "out", "postln", 1e-3, 0, 2, final=8.619)
    cfg = json.loads((d / "config.json").read_text())
    cfg["run"]["optimizer"] = "sgd"
    (d / "config.json").write_text(json.dumps(cfg))


def done_without_config(sandbox):
    """A grid's folder whose run ROW seed 1 holds a final DONE.json and no config.json."""
    fake_data(sandbox / "data")
    (sandbox / "out" / RUN1).mkdir(parents=True)
    (sandbox / "out" / ".lnpos-grid").write_text("")
    (sandbox / "out" / RUN1 / "DONE.json").write_text(json.dumps({"status": "finished", "outcome": "finished"}))


CASES = [
    # --- state files of the wrong shape: an error naming the file, in every command that reads them
    Case("status-done-null", STATUS, rf"^grid: error: {NOT_DONE} \(it holds null, not an object\): delete it",
         setup=grid_out({f"{RUN1}/DONE.json": "null"}), writes=()),
    Case("table-done-empty-object", TABLE_OUT, rf"^make_table: error: 1 run folder\(s\) unreadable, .*{NOT_DONE} "
         r"\(no 'outcome'\)", setup=grid_out({f"{RUN1}/DONE.json": "{}"}), writes=("out",)),
    Case("table-done-list", TABLE_OUT, rf"{NOT_DONE} \(it holds \[\], not an object\)",
         setup=grid_out({f"{RUN1}/DONE.json": "[]"}), writes=("out",)),
    Case("table-done-unknown-outcome", TABLE_OUT, rf"{NOT_DONE} \('outcome' is 'done', not one of 'finished'",
         setup=grid_out({f"{RUN1}/DONE.json": '{"outcome": "done"}'}), writes=("out",)),
    Case("table-done-of-an-earlier-version", TABLE_OUT, r"DONE\.json was written by an earlier version \(its outcome in "
         r"words only\): run `scripts/grid\.sh migrate OUT` once", setup=grid_out({f"{RUN1}/DONE.json": '{"status": "finished"}'}),
         writes=("out",)),
    Case("status-config-empty-object", STATUS,
         r"^grid: error: \S*/seed1/config\.json is not a run's config the grid writes \(no 'hash'\): delete \S*/seed1",
         setup=grid_out({f"{RUN1}/config.json": "{}"}), writes=()),
    Case("status-foreign-config", STATUS, r"^grid: error: \S*/foo/seed1/config\.json is not a run's config the grid "
         r"writes \(no 'hash'\): .* or move it out of \S*/out if it is no run",
         setup=grid_out({"foo/seed1/config.json": '{"a": 1}'}), writes=()),
    Case("table-config-mistyped-run-field", TABLE_OUT, r"config\.json is not a run's config the grid writes "
         r"\('run\.lr' is 'fast', not a number\)",
         setup=grid_out({f"{RUN1}/config.json": CONFIG.replace('"lr": 0.0005', '"lr": "fast"')}), writes=("out",)),
    Case("table-eval-list", TABLE_OUT, r"\S*/eval/epoch1\.json is not an epoch's record the grid writes \(it holds "
         r"\[\], not an object\): delete it and run the grid again to re-score epoch 1",
         setup=grid_out({f"{RUN1}/eval/epoch1.json": "[]"}), writes=("out",)),
    Case("table-eval-of-another-epoch", TABLE_OUT, r"eval/epoch1\.json is not an epoch's record .*\(it is of epoch 2\)",
         setup=grid_out({f"{RUN1}/eval/epoch1.json": '{"epoch": 2}'}), writes=("out",)),
    Case("status-tasks-line-without-tab", STATUS, r"^grid: error: \S*/slurm-abc\.tasks, line 2: 'x 1' is not "
         r"RUN<tab>SEED<tab>FAIRSEQ-ARGS as grid\.sh slurm writes it: delete the file",
         setup=grid_out({"slurm-abc.tasks": f"{ROW}\t1\t\nx 1\n"}), writes=()),
    Case("grid-run-done-null", GRID_RUN, rf"^grid: error: {NOT_DONE} \(it holds null",
         setup=grid_out({f"{RUN1}/DONE.json": "null"}, data=True), writes=()),
    Case("grid-run-finished-without-config", GRID_RUN, r"^grid: error: \S*/seed1 holds the outcome of a run \(DONE\.json: "
         r"finished\) but no config\.json, so no table or map can read it: move the folder away or delete it, then "
         r"run again$", setup=done_without_config, writes=()),
    Case("map-done-null", MAP, rf"^stability_map\.sh: error: {NOT_DONE} \(it holds null",
         setup=grid_out({f"{RUN1}/DONE.json": "null"}), writes=()),
    Case("map-eval-list", MAP, r"^stability_map\.sh: error: \S*/eval/epoch1\.json is not an epoch's record",
         setup=grid_out({f"{RUN1}/DONE.json": '{"outcome": "finished"}', f"{RUN1}/eval/epoch1.json": "[]"}), writes=()),
    # --- a folder of the user's is not written into
    Case("grid-out-of-the-user", GRID_RUN + ("--max-epoch", "1"), r"^grid: error: --out \S*/out is not empty and not "
         r"a grid's output folder .*: give a new or empty folder; nothing was written", setup=users_folder, writes=()),
    Case("grid-dry-run-out-of-the-user", GRID_RUN + ("--dry-run",), r"^grid: error: --out \S*/out is not empty",
         setup=users_folder, writes=()),
    Case("table-results-md-of-the-user", TABLE_OUT, r"^make_table: error: \S*/out/results\.md was not written by "
         r"make_table\.sh, so it is not replaced: move it away", setup=grid_out({"results.md": "my notes\n"}), writes=()),
    Case("table-results-csv-of-the-user", TABLE_OUT, r"^make_table: error: \S*/out/results\.csv was not written by "
         r"make_table\.sh", setup=grid_out({"results.csv": "a,b\n1,2\n"}), writes=()),
    # --- the stability map compares runs along its axes only
    Case("map-runs-differ-in-the-optimizer", MAP, r"^stability_map\.sh: error: \S*/out: its runs differ in optimizer "
         r"\(optimizer 'adam' in \S*/seed1, 'sgd' in \S*/seed2\), not only in the map's axes \(architecture, depth, "
         r"warm-up, learning rate, seed\)", setup=runs_differing_in_the_optimizer, writes=()),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_fault(case, tmp_path, monkeypatch, capsys, request):
    F.test_fault(case, tmp_path, monkeypatch, capsys, request)


def test_the_grid_and_the_table_use_their_own_folders_again(tmp_path, capsys):
    """An empty folder, a grid's folder and the table's own files are no refusal."""
    from fairseq_lnpos.experiments.rundir import check_out_dir, make_out_dir

    check_out_dir(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty")
    make_out_dir(tmp_path / "empty")
    (tmp_path / "empty" / "progress.log").write_text("the grid's\n")
    check_out_dir(tmp_path / "empty")  # marked: a grid's
    grid_out({f"{RUN1}/DONE.json": '{"outcome": "finished"}'})(tmp_path)
    check_out_dir(tmp_path / "out")  # a run folder in it: a grid's, also without the mark
    make_table(tmp_path / "out", with_figures=False)
    (tmp_path / "out" / f"{RUN1}/DONE.json").write_text('{"outcome": "failed", "reason": "fairseq-train exited 1"}')
    make_table(tmp_path / "out", with_figures=False)  # its own files: replaced
    assert "failed: fairseq-train exited 1" in (tmp_path / "out" / "results.md").read_text()


# ---------------------------------------------------------------- the evaluator's death

# stands in for ``python -m fairseq_lnpos.experiments.evaluator``: FAKE_EVAL_KILL=NAME:once kills the
# process (SIGKILL, as the out-of-memory killer does) on its first request for checkpoint NAME, :always
# on every one; other requests get BLEU 1.5
FAKE_EVALUATOR = r"""
import json, os, signal, sys
name, _, when = os.environ.get("FAKE_EVAL_KILL", "").partition(":")
for line in sys.stdin:
    req = json.loads(line)
    if os.path.basename(req["checkpoint"]) == name:
        flag = os.path.join(os.environ["FAKE_EVAL_FLAGS"], name)
        if when == "always" or not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    print(json.dumps({"result": {"bleu_tok": 1.5, "n_sentences": 1}}), flush=True)
"""

# stands in for fairseq-train: argv SAVE_DIR EPOCHS MODE; logs and saves each epoch as fairseq does;
# MODE "vanish" first removes the run folder, then makes the save dir again (fairseq's saving does);
# MODE "link-progress" replaces the grid's progress.log by a link to the file FAKE_LINK_TARGET
FAKE_TRAIN = r"""
import json, os, shutil, sys
save, epochs, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "vanish":
    shutil.rmtree(os.path.dirname(save))
if mode == "link-progress":
    progress = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(save))), "progress.log")
    os.remove(progress)
    os.symlink(os.environ["FAKE_LINK_TARGET"], progress)
os.makedirs(save, exist_ok=True)
def log(name, msg):
    print(f"2024-01-01 00:00:00 | INFO | {name} | {msg}", flush=True)
for e in range(1, epochs + 1):
    log("train_inner", json.dumps({"epoch": e, "loss": "5.0", "num_updates": str(4 * e)}))
    log("train", json.dumps({"epoch": e, "train_loss": "5.0", "train_num_updates": str(4 * e)}))
    log("valid", json.dumps({"epoch": e, "valid_loss": "4.0", "valid_num_updates": str(4 * e)}))
    for name in (f"checkpoint{e}.pt", "checkpoint_last.pt"):
        open(os.path.join(save, name), "w").close()
    log("fairseq.checkpoint_utils", f"Saved checkpoint {save}/checkpoint{e}.pt (epoch {e} @ {4 * e} updates, score 4.0)")
"""


def test_an_evaluator_killed_while_scoring_is_replaced_not_taken_for_the_grid_stopping(tmp_path):
    started, answers = [], queue.Queue()

    def launch(cmd, env, **kw):
        started.append(subprocess.Popen([sys.executable, "-c", FAKE_EVALUATOR], env=env, **kw))
        return started[-1]

    def score(kill, stopping=None):
        env = dict(os.environ, FAKE_EVAL_KILL=kill, FAKE_EVAL_FLAGS=str(tmp_path / kill))
        (tmp_path / kill).mkdir()
        ev = Evaluator(env, tmp_path / "evaluator.log", launch, **({"stopping": stopping} if stopping else {}))
        ev.submit(ScoreRequest(argv=(), data="", hyp_out="", checkpoint="/run/checkpoints/checkpoint1.pt"),
                  lambda result, error: answers.put((result, error)))
        answer = answers.get(timeout=120)
        ev.close()
        return answer

    result, error = score("checkpoint1.pt:once")  # killed once: a new process scores it
    assert error is None and result["bleu_tok"] == 1.5 and len(started) == 2
    result, error = score("checkpoint1.pt:always")  # killed each time: that request fails, in one line
    assert result is None and isinstance(error, EvalFailed) and len(started) == 4
    assert str(error).startswith("the evaluator was killed (signal 9) while scoring /run/checkpoints/checkpoint1.pt, "
                                 "2 times") and "\n" not in str(error)
    result, error = score("checkpoint1.pt", stopping=lambda: True)  # the grid is stopping: no failure, no retry
    assert isinstance(error, Stopped) and len(started) == 5


@pytest.fixture
def stand_ins(tmp_path, monkeypatch, capsys):
    """``grid(train_mode, kill, *options)`` runs ``grid.sh run`` of ROW (2 epochs) in this process with
    the stand-ins; returns (exit status, stdout). ``kill``: FAKE_EVAL_KILL of the evaluator."""
    popen = Grid.popen

    def stand_in_evaluator(grid, cmd, env, **kw):
        if cmd[-1] == "fairseq_lnpos.experiments.evaluator":
            cmd = [sys.executable, "-c", FAKE_EVALUATOR]
        return popen(grid, cmd, env, **kw)

    monkeypatch.setattr(Grid, "popen", stand_in_evaluator)
    data, out = fake_data(tmp_path / "data"), tmp_path / "out"

    def grid(train_mode="normal", kill="", *options):
        flags = tmp_path / f"flags-{len(list(tmp_path.glob('flags-*')))}"
        flags.mkdir()
        monkeypatch.setenv("FAKE_EVAL_KILL", kill)
        monkeypatch.setenv("FAKE_EVAL_FLAGS", str(flags))
        monkeypatch.setattr(Job, "train_cmd", lambda job, *a, **k: [sys.executable, "-c", FAKE_TRAIN, str(job.save_dir),
                                                                      str(job.run.max_epoch), train_mode])
        capsys.readouterr()
        code = G.main(["run", "--only", ROW, "--arch-size", "tiny", "--data", str(data), "--out", str(out),
                       "--max-epoch", "2", *options])
        printed = capsys.readouterr()
        grid.err = printed.err
        return code, printed.out

    grid.run_dir = out / RUN1
    return grid


def done(run_dir):
    return json.loads((run_dir / "DONE.json").read_text())


def epoch(run_dir, e):
    return json.loads((run_dir / "eval" / f"epoch{e}.json").read_text())


def test_an_evaluator_killed_once_scores_the_epoch_again(stand_ins):
    code, out = stand_ins("normal", "checkpoint1.pt:once")
    d = stand_ins.run_dir
    assert code == 0 and done(d)["status"] == "finished", out[-2000:]
    assert epoch(d, 1)["bleu_tok"] == epoch(d, 2)["bleu_tok"] == 1.5
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["checkpoint_last.pt"]  # scored: removed


def test_an_epoch_never_scored_fails_the_run_and_a_rerun_retries_it(stand_ins, capsys):
    code, out = stand_ins("normal", "checkpoint1.pt:always")
    d = stand_ins.run_dir
    status = done(d)["status"]
    assert code == 1 and status.startswith("failed: the evaluator was killed (signal 9) while scoring "
                                           f"{d}/checkpoints/checkpoint1.pt, 2 times"), out[-2000:]
    assert "\n" not in status and f"{ROW} seed 1: FAILED: the evaluator was killed" in out
    assert (d / "checkpoints" / "checkpoint1.pt").exists() and not (d / "eval" / "epoch1.json").exists()
    # the table and grid.sh status show it
    assert [r["status"] for r in collect(run_dirs(d.parent.parent))] == [status]
    assert G.main(["status", str(d.parent.parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "failed: the evaluator was" in lines[0] and lines[-1] == "1 run: 1 failed"
    # a re-run retries it (training is not redone: only the lost epoch is scored)
    code, out = stand_ins("normal", "")
    assert code == 0 and f"{ROW} seed 1: retried (it failed: the evaluator was killed" in out, out[-2000:]
    assert done(d)["status"] == "finished" and epoch(d, 1)["bleu_tok"] == 1.5
    assert (d / "train.log").read_text().count("# grid: ") == 1


def test_an_eval_every_gap_is_no_lost_epoch(stand_ins):
    code, out = stand_ins("normal", "", "--eval-every", "2", "--max-epoch", "3")
    d = stand_ins.run_dir
    assert code == 0 and done(d)["status"] == "finished", out[-2000:]
    assert [epoch(d, e)["bleu_tok"] for e in (1, 2, 3)] == [None, 1.5, 1.5]


def test_a_progress_log_replaced_by_a_link_is_one_line_and_the_run_goes_on(stand_ins, tmp_path, monkeypatch):
    target = tmp_path / "outside"
    target.write_text("a file outside the output folder\n")
    monkeypatch.setenv("FAKE_LINK_TARGET", str(target))
    code, out = stand_ins("link-progress", "")
    d = stand_ins.run_dir
    assert code == 0 and done(d)["status"] == "finished", out[-2000:] + stand_ins.err[-2000:]
    assert target.read_text() == "a file outside the output folder\n"
    warnings = [line for line in out.splitlines() if "progress.log" in line and "warning" in line]
    assert warnings == [f"grid: warning: {d.parent.parent}/progress.log is a symbolic link, not written through: "
                        f"the runs go on, their progress shown here only"]
    assert "Traceback" not in stand_ins.err and f"{ROW} seed 1: finished" in out


def test_a_run_whose_folder_vanished_is_failed_not_finished(stand_ins):
    code, out = stand_ins("vanish", "", "--set", "max_update=8")  # a budget in updates, as in a sweep
    d = stand_ins.run_dir
    assert code == 1 and f"{ROW} seed 1: FAILED: {d}/config.json is gone: the run folder was removed" in out, out
    assert done(d)["status"].startswith(f"failed: {d}/config.json is gone")
    # a re-run does not train into what is left of it
    code, out = stand_ins("normal", "", "--set", "max_update=8")
    assert code == 1 and f"{d} holds files but no config.json" in out, out[-2000:]
    assert not (d / "config.json").exists()
