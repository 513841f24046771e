"""Fault injection, second round: values that would reach a generated script, paths with spaces,
concurrent data preparation, non-finite numbers, SIGTERM. Rows of the matrix run as in
tests/test_faults.py (one error line, the exit status, nothing changed outside the output folders);
the cases with more to check are tests of their own."""
import json
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from conftest import REPO
from test_faults import (GRID, INTERRUPTED, OUT, ROW, SYN, TABLE, TRAIN, Case, check_case, in_process, run_folder,
                         snapshot, toy_copy, write)
from toydata import make_toy_data

from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.experiments import slurm

EVALUATE = "fairseq_lnpos.experiments.evaluate"
SLURM = (GRID, "slurm", "--only", "demo-postln-nowu", "--arch-size", "tiny", "--data", "{S}/B", "--out", "{S}/out",
         "--time", "1:00:00", "--gpus-per-run", "0", "--dry-run")
DRY_RUN = (GRID, "run", "--only", ROW, "--dry-run", "--data", "{S}/B", "--out", "{S}/out")
SWEEP = (GRID, "sweep", "--dry-run", "--archs", "postln", "--warmup", "1", "--data", "{S}/B", "--out", "{S}/out")
KEEL_TRAIN = TRAIN + ("--arch", "transformer_keel_tiny")
FULL_CONFIG = json.dumps({"hash": "0", "seed": 1, "arch": "transformer_preln_tiny",
                          "run": R.BY_NAME[ROW].with_defaults().as_dict()})


def results_md_folder(sandbox):
    run_folder(**{"config.json": FULL_CONFIG})(sandbox)
    (sandbox / "out" / "results.md").mkdir()


CASES = [
    # --- values that would reach the generated sbatch script: refused, nothing written
    Case("slurm-partition-injects-a-line", SLURM + ("--partition", "gpu\ntouch {S}/PWNED #"),
         r"^grid\.sh slurm: error: argument --partition: 'gpu\\ntouch \S*PWNED #' is not a SLURM partition name",
         writes=()),
    Case("slurm-partition-with-a-space", SLURM + ("--partition", "gpu debug"),
         r"argument --partition: 'gpu debug' is not a SLURM partition name", writes=()),
    Case("slurm-account-injects-a-line", SLURM + ("--partition", "gpu", "--account", "lab\ntouch {S}/PWNED"),
         r"argument --account: lab\\ntouch \S*PWNED is not a SLURM account name", writes=()),
    Case("slurm-time-with-a-final-newline", SLURM + ("--partition", "gpu", "--time", "1:00:00\n"),
         r"argument --time: '1:00:00\\n' is not a time", writes=()),
    Case("slurm-out-with-a-newline", SLURM + ("--partition", "gpu", "--out", "{S}/out\ntouch {S}/PWNED"),
         r"^grid: error: --out \S*/out\\ntouch \S*PWNED: holds a control character", writes=()),
    Case("slurm-set-free-text-with-a-newline", SLURM + ("--partition", "gpu", "--set", "paper_note=a\ntouch PWNED"),
         r"^grid: error: --set paper_note=a\\ntouch PWNED: holds a control character", writes=()),
    Case("slurm-gen-args-with-a-newline", SLURM + ("--partition", "gpu", "--gen-args", "--quiet\ntouch PWNED"),
         r"^grid: error: --gen-args --quiet\\ntouch PWNED: holds a control character", writes=()),
    # --- the text and the binarized data in one folder: refused before either is locked
    Case("multi30k-out-is-bin", ("fairseq_lnpos.data.multi30k", "--out", "{S}/x", "--bin", "{S}/x"),
         r"^prepare-multi30k\.sh: error: --out \S*/x is --bin \S*/x, which is replaced whole when the data is "
         r"binarized: give the text and the binarized data folders of their own$", writes=()),
    Case("synthetic-out-inside-bin", (SYN, "--out", "{S}/b/text", "--bin", "{S}/b"),
         r"^make-synthetic\.sh: error: --out \S*/b/text is inside --bin \S*/b, which is replaced whole", writes=()),
    # --- numbers: finite only
    Case("sweep-lr-names-collide", SWEEP + ("--lr", "0.001,0.0010000001"),
         r"^grid: error: --lr 0\.001 and 0\.0010000001 give cells the same name sweep-postln-L6-lr0\.001-wu1",
         writes=()),
    Case("sweep-lr-inf", SWEEP + ("--lr", "1e-3,inf"), r"^grid: error: --lr 1e-3,inf: learning rates must be "
         r"positive finite numbers", writes=()),
    Case("run-lenpen-nan", DRY_RUN + ("--lenpen", "nan"), r"argument --lenpen: 'nan' is not a finite number",
         writes=()),
    Case("sweep-lenpen-inf", SWEEP + ("--lr", "1e-3", "--lenpen", "inf"),
         r"argument --lenpen: 'inf' is not a finite number", writes=()),
    Case("run-set-float-inf", DRY_RUN + ("--set", "decay_factor=inf"),
         r"^grid: error: --set decay_factor=inf: give a finite number", writes=()),
    Case("evaluate-lenpen-nan", (EVALUATE, "checkpoint", "--data", "{S}/B", "--path", "{S}/c.pt", "--lenpen", "nan"),
         r"argument --lenpen: 'nan' is not a finite number", writes=()),
    # --- scoring nothing; a folder where the table goes
    Case("evaluate-score-empty-files", (EVALUATE, "score", "--hyp", "{S}/hyp", "--ref-tok", "{S}/ref"),
         r"^evaluate: error: no sentence to score", setup=lambda s: (write("hyp", "")(s), write("ref", "")(s)),
         writes=()),
    Case("table-results-md-is-a-folder", (TABLE, "{S}/out", "--no-figures"),
         r"^make_table: error: \S*/out/results\.md is a folder, not a file", setup=results_md_folder, writes=(),
         needs=("data",)),
    # --- the generated corpus is built in memory: its size is bounded
    Case("synthetic-train-above-the-maximum", (SYN, "--train", "1000000000") + OUT,
         r"^make-synthetic\.sh: error: --train 1000000000: at most 1000000 sentence pairs"),
    # --- fairseq-train with the plugin
    Case("train-keel-alpha-inf", KEEL_TRAIN + ("--keel-alpha", "inf"),
         r"^fairseq-train: error: --keel-alpha must be a positive finite number, got inf",
         setup=toy_copy(), writes=("out",), needs=("data",), slow=True),
    Case("train-fp16-on-the-cpu", TRAIN + ("--fp16",),
         r"^fairseq-train: error: --fp16 needs a CUDA GPU .*drop --fp16 to train on the CPU",
         setup=toy_copy(), writes=("out",), needs=("data",), slow=True),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
                                  for c in CASES])
def test_fault(case, tmp_path, monkeypatch, capsys, request):
    check_case(case, tmp_path, monkeypatch, capsys, request)
    assert not (tmp_path / "sandbox" / "PWNED").exists()


# ---------------------------------------------------------------- the sbatch script

def slurm_script(tmp_path, capsys, out, *extra):
    """The script of ``grid.sh slurm --dry-run`` with --out ``out``; it passes ``bash -n``."""
    argv = [str(a).replace("{S}/out", str(out)).replace("{S}", str(tmp_path)) for a in SLURM[1:]]
    assert G.main(argv + list(extra)) == 0
    capsys.readouterr()
    (script,) = out.glob("slurm-*.sbatch")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    return script.read_text()


def sbatch_option(text, name):
    """The values of ``#SBATCH --name=...`` read as sbatch reads them (quotes as in a shell)."""
    found = [shlex.split(line[len("#SBATCH "):]) for line in text.splitlines() if line.startswith(f"#SBATCH --{name}=")]
    assert len(found) == 1 and len(found[0]) == 1, found
    return found[0][0][len(f"--{name}="):]


def test_sbatch_paths_with_spaces_are_quoted(tmp_path, capsys):
    out = tmp_path / "out sp"
    text = slurm_script(tmp_path, capsys, out, "--partition", "gpu,debug-2", "--account", "lab.a_b-c")
    assert sbatch_option(text, "output") == f"{out}/slurm-logs/%j_0_log.out"  # one task: a job, no array
    assert sbatch_option(text, "partition") == "gpu,debug-2" and sbatch_option(text, "account") == "lab.a_b-c"
    (srun,) = [shlex.split(line) for line in text.splitlines() if line.startswith("srun ")]
    assert srun[srun.index("--output") + 1] == f"{out}/slurm-logs/%j_%t_log.out" and srun[-1] == f"{out}/slurm-logs"


def test_the_provenance_comment_stays_one_line(tmp_path, capsys, monkeypatch):
    """Whatever the recorded command line holds, it stays in its comment: no line of the script
    comes from it."""
    real_plan = slurm.plan

    def plan(opts):
        opts.argv = [*opts.argv, "--note", "x\ntouch PWNED\r\n#"]
        return real_plan(opts)

    monkeypatch.setattr(slurm, "plan", plan)
    text = slurm_script(tmp_path, capsys, tmp_path / "out", "--partition", "gpu")
    assert not any(line.startswith("touch") for line in text.splitlines())
    (comment,) = [line for line in text.splitlines() if "Written by:" in line]
    assert comment.startswith("# ") and comment.endswith(r"'x\ntouch PWNED\r\n#'")


# ---------------------------------------------------------------- fairseq's log: paths with spaces

def test_saved_and_loaded_checkpoints_are_read_from_paths_with_spaces():
    from fairseq_lnpos.fairseq_log import LogState

    st = LogState()
    prefix = "2026-11-30 22:09:03 | INFO | fairseq.checkpoint_utils | "
    assert st.feed(prefix + "Saved checkpoint /x/out sp/r (1)/seed1/checkpoints/checkpoint3.pt (epoch 3 @ 24 updates, "
                            "score 5.0) (writing took 0.8 seconds)") == "saved"
    assert st.saved == {3: 24}
    st.feed(prefix.replace("checkpoint_utils", "trainer") + "Loaded checkpoint /x/out sp/checkpoint_last.pt "
            "(epoch 3 @ 30 updates)")
    assert st.updates == 30


@pytest.mark.slow
def test_a_grid_run_with_spaces_in_data_and_out(tmp_path):
    """A real run (tiny model, one epoch) whose data and output folders have spaces: trained,
    scored, finished."""
    data = make_toy_data(tmp_path / "B sp", n_train=120)
    out = tmp_path / "out sp"
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    res = subprocess.run([str(REPO / "scripts" / "grid.sh"), "run", "--only", ROW, "--arch-size", "tiny",
                          "--max-epoch", "1", "--set", "max_tokens=512", "--set", "batch_tokens=512",
                          "--data", str(data), "--out", str(out)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run_dir = out / ROW / "seed1"
    assert json.loads((run_dir / "DONE.json").read_text())["status"] == "finished"
    assert json.loads((run_dir / "eval" / "epoch1.json").read_text())["bleu_tok"] is not None


# ---------------------------------------------------------------- data-prep: a lock on its output folders

@pytest.mark.parametrize("held", ["out", "bin"])
def test_data_prep_refuses_a_folder_another_command_holds(tmp_path, capsys, held):
    from fairseq_lnpos.common import hold_lock, release_lock
    from fairseq_lnpos.data import synthetic
    from fairseq_lnpos.data.pipeline import lock_path

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes").write_text("the other command's\n")
    lock = lock_path(tmp_path / held)
    fd = hold_lock(lock, "held by the test")
    before = snapshot(tmp_path)
    try:
        code = synthetic.main(["--out", str(tmp_path / "out"), "--bin", str(tmp_path / "bin"), "--train", "20"])
    finally:
        release_lock(fd, lock)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert re.fullmatch(rf"make-synthetic\.sh: error: --{held} \S+/{held} is in use by another command \(lock "
                        rf"\S+/\.{held}\.lock\): wait for it to finish or stop it, or give another folder\n", err)
    assert snapshot(tmp_path) == {k: v for k, v in before.items() if k != f".{held}.lock"}


def test_data_prep_leaves_no_lock_behind(tmp_path, capsys):
    from fairseq_lnpos.data import synthetic

    argv = ["--out", str(tmp_path / "out"), "--bin", str(tmp_path / "bin"), "--train", "30", "--valid", "5",
            "--test", "5", "--bpe-size", "300"]
    assert synthetic.main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "out"]


# ---------------------------------------------------------------- SIGTERM: as Ctrl-C

SIGTERM_IN_GENERATE = """
import os, signal, sys
from fairseq_lnpos.data import synthetic
real = synthetic.generate
def generate(*args, **kwargs):  # while the first stage builds its temporary folder
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
synthetic.generate = generate
sys.exit(synthetic.main(sys.argv[1:]))
"""


def test_sigterm_to_data_prep_is_one_line_130_and_leaves_no_temporary_folder(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-c", SIGTERM_IN_GENERATE, "--out", str(out), "--bin", str(tmp_path / "bin"),
                          "--train", "20"], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 130 and res.stderr == f"make-synthetic.sh: {INTERRUPTED}\n", (res.returncode, res.stderr)
    assert list(tmp_path.rglob("*.tmp")) == [] and list(tmp_path.rglob("*.lock")) == []


def test_sigterm_ends_a_forked_worker_and_sigint_leaves_it_to_the_main_process():
    """A worker forked under the handler (multiprocessing's pool) dies of SIGTERM as without it, so
    that Pool.terminate ends it; it ignores SIGINT, which the terminal sends to the whole group."""
    from fairseq_lnpos.errors import interrupt_handler

    handler = interrupt_handler()
    pid = os.fork()
    if pid == 0:
        try:
            handler(signal.SIGINT, None)
            handler(signal.SIGTERM, None)
        finally:
            os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGTERM, None)


# ---------------------------------------------------------------- whole numbers: range-checked where parsed

@pytest.mark.parametrize("module, argv, message", [
    (GRID, ["run", "--dry-run", "--only", ROW, "--seeds", "1,4294967296"],
     "grid: error: --seeds 1,4294967296: give distinct whole numbers from 0 to 4294967295 (fairseq's seeds)"),
    (GRID, ["sweep", "--dry-run", "--max-update", "0"], "grid.sh sweep: error: argument --max-update: 0 is too small"),
    (GRID, ["sweep", "--dry-run", "--width", "0"], "grid.sh sweep: error: argument --width: 0 is too small"),
    (GRID, ["run", "--dry-run", "--jobs", "0"], "grid.sh run: error: argument --jobs: 0 is too small: give at least 1"),
    ("scripts/tools/synthetic_check.py", ["--bin", "b", "--work", "w", "--seed", "4294967296"],
     "check-synthetic.sh: error: --seed must be in [0, 4294967295], got 4294967296"),
    (EVALUATE, ["checkpoint", "--data", "d", "--path", "p", "--beam", "0"],
     "evaluate checkpoint: error: argument --beam: 0 is too small"),
    ("fairseq_lnpos.analysis.init_grad", ["--seeds", "2", "--first-seed", "4294967295"],
     "init_grad_analysis: error: --first-seed must be in [0, 4294967294], got 4294967295"),
])
def test_a_whole_number_out_of_range_is_one_line(module, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    try:
        code = in_process(module).main([*argv, *(["--out", "out"] if module == GRID else [])])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
