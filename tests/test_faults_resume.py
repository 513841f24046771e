"""Fault injection: what would stop a run later, refused before the grid starts it; what grid.sh status
says of odd run folders; the plugin's optimizers' options; a damaged checkpoint with fairseq's own task.

The grid runs in this process with test_faults_state's stand-ins for fairseq-train and the evaluator
(no fairseq), except the row marked slow, which runs fairseq-train itself."""
import json
import math
import os
import shutil
import zipfile

import pytest
import torch
from fairseq.optim import build_optimizer
from omegaconf import OmegaConf

import fairseq_lnpos
from conftest import USER_DIR
from fairseq_lnpos.errors import MAX_SEED, LnposError
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments.records import DoneRecord
from fairseq_lnpos.experiments.rundir import RunDir
from fairseq_lnpos.provenance import model_code_hash
from test_faults import TOY, Case, check_case, snapshot, toy_checkpoint, toy_copy  # noqa: F401  (a fixture)
from test_faults_state import RUN1, grid_out, stand_ins  # noqa: F401  (a fixture)
from test_stability import write_run

fairseq_lnpos.register()  # giadam and radam


def files_of(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def interrupted(run_dir, trained_by, checkpoint=None):
    """Make a finished stand-in run look interrupted after its first checkpoint: no outcome, no TRAINED,
    its training started by model code ``trained_by``; ``checkpoint``: checkpoint_last.pt's bytes (default:
    a complete zip archive, as torch writes one)."""
    for name in ("DONE.json", "TRAINED"):
        (run_dir / name).unlink()
    (run_dir / "trained_by.json").write_text(json.dumps({"model_code": trained_by}))
    last = run_dir / "checkpoints" / "checkpoint_last.pt"
    if checkpoint is None:
        with zipfile.ZipFile(last, "w") as z:
            z.writestr("archive/data.pkl", b"x")
    else:
        last.write_bytes(checkpoint)


# ---------------------------------------------------------------- one run, one model code

def test_a_run_resumed_after_the_model_code_changed_is_refused_and_left_as_it_was(stand_ins):
    code, out = stand_ins()
    d = stand_ins.run_dir
    assert code == 0, out[-2000:]
    assert json.loads((d / "trained_by.json").read_text()) == {"model_code": model_code_hash()}
    interrupted(d, "0123456789ab")
    before = files_of(d)
    code, out = stand_ins()
    assert code == 2 and stand_ins.err.count("\n") == 1, stand_ins.err
    assert stand_ins.err.startswith(f"grid: error: {d} was trained up to its last checkpoint by model code 0123456789ab, "
                                    f"and the plugin's model code is now {model_code_hash()}: resuming would make one "
                                    f"run of two models; restore the code it started with to resume it, or delete {d}")
    assert files_of(d) == before
    # the code that started it resumes it
    (d / "trained_by.json").write_text(json.dumps({"model_code": model_code_hash()}))
    code, out = stand_ins()
    assert code == 0 and json.loads((d / "DONE.json").read_text())["outcome"] == "finished", out[-2000:] + stand_ins.err


def test_a_cut_short_checkpoint_to_resume_from_is_refused_before_the_grid_starts(stand_ins):
    code, out = stand_ins()
    d = stand_ins.run_dir
    assert code == 0, out[-2000:]
    interrupted(d, model_code_hash(), checkpoint=b"PK\x03\x04 cut short")
    before = files_of(d)
    code, out = stand_ins()
    assert code == 2 and stand_ins.err.count("\n") == 1, stand_ins.err
    assert stand_ins.err.startswith(f"grid: error: {d}/checkpoints/checkpoint_last.pt is damaged (BadZipFile: ")
    assert "the run cannot resume from it; delete the run's folder to train it again" in stand_ins.err
    assert files_of(d) == before


# ---------------------------------------------------------------- a seed that fails at a later epoch

def test_a_seed_whose_epochs_pass_2_to_the_32_is_refused_before_anything_is_written(stand_ins, tmp_path):
    limit = MAX_SEED - 3  # 2 epochs, and the iterator fairseq makes for the next
    code, out = stand_ins("normal", "", "--seeds", str(limit + 1))
    assert code == 2 and not (tmp_path / "out").exists(), stand_ins.err
    assert stand_ins.err == (f"grid: error: --seeds {limit + 1}: fairseq seeds numpy with the seed plus the epoch, which "
                             f"must stay below 2^32, so with iwslt-preln-adam-lr5e-4-step8's 2 epochs a seed is at "
                             f"most {limit}: give a smaller seed\n")
    code, out = stand_ins("normal", "", "--seeds", str(limit), "--dry-run")
    assert code == 0, stand_ins.err


# ---------------------------------------------------------------- a second grid on a folder in use

def test_a_second_grid_on_a_run_in_use_is_one_line_and_changes_nothing(stand_ins):
    code, out = stand_ins()
    d = stand_ins.run_dir
    assert code == 0, out[-2000:]
    fd = RunDir(d).lock(wait=0)  # held as a grid holds it while it works on the run
    try:
        before = snapshot(d.parent.parent)
        code, out = stand_ins()
        after = snapshot(d.parent.parent)
    finally:
        os.close(fd)
    assert code == 2 and stand_ins.err == (f"grid: error: {d} is in use by another grid (lock {d}/.lock, process "
                                           f"{os.getpid()}): wait for it to finish or stop it, then run again; "
                                           f"nothing was changed\n")
    assert after == before
    code, out = stand_ins()  # released: the run is finished, not redone
    assert code == 0 and "already finished, not redone" in out


# ---------------------------------------------------------------- grid.sh status of odd folders

def test_status_of_an_outcome_without_its_update_or_reason(tmp_path, capsys):
    grid_out({f"{RUN1}/DONE.json": '{"outcome": "stopped early"}'})(tmp_path)
    assert G.main(["status", str(tmp_path / "out")]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "stopped early" in line and "None" not in line
    assert DoneRecord.from_json({"outcome": "failed"}).text == "failed"
    assert DoneRecord.from_json({"outcome": "stopped early", "stopped_at": 7, "reason": "stalled"}).text == \
        "stopped early at update 7: stalled"


def test_status_lists_a_copied_seed_folder_once_as_a_copy_and_exits_2(tmp_path, capsys):
    d = write_run(tmp_path / "out", "preln", 1e-3, 0, 1, final=1.3)
    shutil.copytree(d, d.parent / "seed2")  # its config.json still says seed 1
    assert G.main(["status", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("preln-L6-lr0.001-w0 seed1 ") and "finished" in lines[0]
    assert lines[1].startswith("preln-L6-lr0.001-w0 seed2 ") and "a copy of preln-L6-lr0.001-w0 seed1" in lines[1]
    assert lines[2] == "2 runs: 1 copy, 1 finished"
    assert err == (f"grid: error: {d} and {d.parent / 'seed2'} hold the same run (preln-L6-lr0.001-w0 seed 1): a run's "
                   f"seeds must be distinct runs; move the copies away\n")


# ---------------------------------------------------------------- the plugin's optimizers: one check

def params():
    return [torch.nn.Parameter(torch.ones(3))]


@pytest.mark.parametrize("optimizer", ["giadam", "radam"])
@pytest.mark.parametrize("values, message", [
    (dict(adam_eps=math.inf), r"^--adam-eps must be positive, got inf$"),
    (dict(adam_eps=math.nan), r"^--adam-eps must be positive, got nan$"),
    (dict(weight_decay=math.inf), r"^--weight-decay must be at least 0, got inf$"),
    (dict(lr=[math.inf]), r"^--lr must be positive, got inf$"),
    (dict(lr=[math.nan]), r"^--lr must be positive, got nan$"),
    (dict(adam_betas="(0.9, 1.0)"), r"^--adam-betas must be two numbers in \[0, 1\)"),
])
def test_every_option_of_the_plugins_optimizers_is_checked(optimizer, values, message):
    config = dict(_name=optimizer, lr=[1e-3], adam_betas="(0.9, 0.98)", adam_eps=1e-8, weight_decay=0.0,
                  **({"decoupled_weight_decay": False} if optimizer == "radam" else {}))
    with pytest.raises(LnposError, match=message):
        build_optimizer(OmegaConf.create({**config, **values}), params())


# ---------------------------------------------------------------- fairseq-train's own task, a damaged checkpoint

def cut_short_last_checkpoint(sandbox):
    toy_copy()(sandbox)
    data = open(TOY["ckpt"], "rb").read()
    (sandbox / "out").mkdir()
    (sandbox / "out" / "checkpoint_last.pt").write_bytes(data[: len(data) // 3])


TRAIN = ("fairseq-train", "{DATA}", "--user-dir", USER_DIR, "--cpu", "--max-tokens", "500", "--max-update", "1",
         "--arch", "transformer_postln_tiny", "--encoder-layers", "1", "--decoder-layers", "1", "--lr", "1e-3",
         "--save-dir", "{S}/out", "--num-workers", "0")
CASES = [
    Case("train-translation-resumes-a-cut-short-checkpoint", TRAIN + ("--task", "translation", "--optimizer", "adam"),
         r"^fairseq-train: error: cannot load checkpoint \S*/out/checkpoint_last\.pt \(.*\): the file is damaged or not "
         r"a fairseq checkpoint", setup=cut_short_last_checkpoint, needs=("data", "ckpt"), slow=True,
         writes=("out",)),  # fairseq checks that it can write into its --save-dir (a file made and removed)
    Case("train-giadam-infinite-eps", TRAIN + ("--task", "translation", "--optimizer", "giadam", "--adam-eps", "inf"),
         r"^fairseq-train: error: --adam-eps must be positive, got inf$", setup=toy_copy(), needs=("data",), slow=True,
         writes=("out",)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
                                  for c in CASES])
def test_fault(case, tmp_path, monkeypatch, capsys, request):
    check_case(case, tmp_path, monkeypatch, capsys, request)
