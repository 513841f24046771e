"""grid.sh slurm on submitit (array task -> run x seed, sbatch parameters, options passed through, the
requeue's stop, refusals) and grid.sh status; with a one-node SLURM on this machine
(tests/slurm_cluster.py) where SLURM is installed and starts."""
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from submitit.helpers import DelayedSubmission

from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.experiments import slurm
from fairseq_lnpos.experiments.commands import batch_plan
from fairseq_lnpos.experiments.options import RunOptions, run_parser
from fairseq_lnpos.experiments.plan import make_jobs, select_runs
from fairseq_lnpos.experiments.report import collect
from fairseq_lnpos.experiments.rundir import read_tasks, run_dirs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toydata import make_toy_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GRID = REPO / "scripts" / "grid.sh"
A, B = "iwslt-preln-adam-lr5e-4-step8", "iwslt-postln-adam-lr5e-4-wu4000"
TINY = ["--arch-size", "tiny", "--set", "max_tokens=512", "--set", "batch_tokens=512"]
BASE = ["slurm", "--only", f"{A},{B}", "--partition", "debug", "--time", "00:10:00"]


def call(*argv):
    """The exit status of grid.sh's main in this process (argparse's errors exit)."""
    try:
        return G.main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def fake_tool(folder, name, body):
    path = Path(folder) / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def fake_slurm(folder, monkeypatch, sbatch='echo "Submitted batch job 123"'):
    """sbatch (recording its argv in folder/sbatch-argv) and srun on PATH; returns the record."""
    rec = Path(folder) / "sbatch-argv"
    fake_tool(folder, "sbatch", f'echo "$@" >> {rec}; {sbatch}')
    fake_tool(folder, "srun", "exit 1")
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return rec


def dry_run(tmp_path, capsys, *extra):
    out = tmp_path / "out"
    assert call(*BASE, "--out", out, "--dry-run", *extra) == 0
    printed = capsys.readouterr().out
    scripts = list(out.glob("slurm-*.sbatch"))
    assert len(scripts) == 1
    return out, scripts[0], printed


def unit_options(task, gpus=None):
    """The options the per-run unit of ``task`` parses (its command after ``-m ...grid``)."""
    argv = task.unit_argv(gpus)
    assert argv[:3] == [sys.executable, "-m", "fairseq_lnpos.experiments.grid"] and argv[3] == "run"
    return G.build_parser().parse_args(argv[3:])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_toy_data(tmp_path_factory.mktemp("toy"))


def test_each_array_task_runs_the_unit_of_its_line_of_the_task_list(tmp_path, capsys, monkeypatch, data):
    """Submitted through submitit (sbatch faked): the script is the one --dry-run shows, and the pickle
    submitit gives array task i runs the per-run unit of line i+1, every option passed through."""
    extra = ["--seeds", "1,2,5", "--max-running", "2", "--gpus-per-run", "0", "--data", str(data), *TINY,
             "--beam", "4", "--no-bleu"]
    out, script, printed = dry_run(tmp_path, capsys, *extra)
    text = script.read_text()
    assert printed.startswith(text)
    assert "#SBATCH --array=0-5%2\n" in text  # 2 runs x 3 seeds, at most 2 at once
    assert "#SBATCH --requeue\n" in text and "#SBATCH --partition=debug\n" in text
    assert "#SBATCH --cpus-per-task=2\n" in text and "--gres" not in text
    assert "#SBATCH --time=10\n" in text and "#SBATCH --signal=USR2@60\n" in text

    rec = fake_slurm(tmp_path, monkeypatch)
    assert call(*BASE, "--out", out, *extra) == 0
    assert "submitted job array 123: 6 tasks" in capsys.readouterr().out
    logs = out / "slurm-logs"
    (submitted,) = rec.read_text().splitlines()  # one sbatch call, on the script submitit wrote in slurm-logs
    assert Path(submitted).parent == logs
    assert (logs / "123_submission.sh").read_text() == text.replace(" --dry-run", "")  # its comment: the command
    tasks = read_tasks(script.with_suffix(".tasks"))
    assert {(n, s) for n, s, _ in tasks} == {(n, s) for n in (A, B) for s in (1, 2, 5)}
    for i, (name, seed, fargs) in enumerate(tasks):
        task = DelayedSubmission.load(logs / f"123_{i}_submitted.pkl").function
        unit = unit_options(task)
        assert (unit.only, unit.seeds, unit.out, unit.fairseq_args) == (name, str(seed), str(out.resolve()), fargs)
        assert (unit.arch_size, unit.set, unit.beam, unit.no_bleu, unit.gpus) == (
            "tiny", ["max_tokens=512", "batch_tokens=512"], 4, True, None)
    assert not (logs / "123_6_submitted.pkl").exists()


def test_every_run_option_a_task_does_not_set_passes_through_the_task_line():
    """The task's argv is written from the fields of RunOptions: each option at another value than its
    default reaches the per-run unit as given (a new field without a value here fails the test)."""
    from dataclasses import fields

    from fairseq_lnpos.experiments.options import SlurmOptions

    given = dict(max_epoch=4, data=["d", "wmt14=w x"], arch_size="tiny", arch="a", set=["lr=1", "a:warmup=2"],
                 task="translation_lnpos", gen_args="--nbest 2", beam=3, lenpen=0.5, average_last=2,
                 uncapped_len=True, eval_every=2, evaluators=3, no_bleu=True, patience=7, fp16=True,
                 log_interval=9, keep_checkpoints=True, early_stop=True, fork_server=False, cpu_bf16=True)
    options = {f.name for f in fields(RunOptions) if f.metadata}  # a plain field is no command-line option
    assert set(given) == options - slurm.PER_TASK - slurm.RUN_ONLY
    opts = SlurmOptions(partition="p", time=600, gpus_per_run=2, seeds="1,2", fairseq_args="--x", **given)
    unit = RunOptions.from_namespace(run_parser().parse_args(slurm.passthrough(opts)))
    assert {k: getattr(unit, k) for k in given} == given
    assert slurm.passthrough(SlurmOptions(partition="p", time=600)) == []


@pytest.mark.parametrize("extra, expected", [
    ([], dict(time=10, signal_delay_s=60, cpus_per_task=8, gres="gpu:2", array_parallelism=3, nodes=1)),
    (["--time", "2-00:00:59", "--max-running", "2", "--account", "lab"],
     dict(time=2880, signal_delay_s=300, array_parallelism=2, account="lab")),
    (["--gpus-per-run", "0", "--cpus-per-run", "3", "--time", "00:01:00"],
     dict(time=1, signal_delay_s=6, cpus_per_task=3, srun_args=["--cpus-per-task=3"])),
])
def test_sbatch_parameters_are_submitits(extra, expected):
    """The time in whole minutes, the warning a tenth of it before (at most 5 minutes), 4 CPUs a GPU;
    submitit takes every parameter (it refuses a name it does not know)."""
    opts = G.build_parser().parse_args(["slurm", "--partition", "p", "--time", "00:10:00", "--gpus-per-run", "2",
                                        *extra])
    opts = opts.options.from_namespace(opts)
    params = slurm.sbatch_parameters(opts, 3, "grid-x", "a comment")
    assert {k: params[k] for k in expected} == expected
    assert params["additional_parameters"] == {"requeue": True} and params["setup"] == ["# a comment"]
    slurm.Executor(".", max_num_timeout=slurm.REQUEUES).update_parameters(**params)


def test_gpu_runs_take_the_allocated_gpus(tmp_path, capsys):
    _, script, _ = dry_run(tmp_path, capsys, "--gpus-per-run", "2", "--fp16")
    text = script.read_text()
    assert "#SBATCH --gres=gpu:2\n" in text and "#SBATCH --cpus-per-task=8\n" in text
    task = slurm.Task(["--only", A, "--fp16"], 2)
    unit = unit_options(task, "4,5")  # the task's CUDA_VISIBLE_DEVICES: the unit names its places in it
    assert (unit.gpus, unit.gpus_per_run, unit.fp16) == ("0,1", 2, True)
    assert unit_options(task, "GPU-8a1b,MIG-3c4d").gpus == "0,1"
    with pytest.raises(LnposError, match="no GPU in the task's allocation"):
        task.unit_argv(None)


def test_the_requeue_stops_the_unit_cleanly_and_resubmits_the_same_task(tmp_path):
    """submitit's signal reaches every process of the step: the unit ignores it and is stopped by the task
    as on Ctrl-C (SIGTERM); the task submitit requeues is the same run x seed."""
    marker = tmp_path / "stopped"
    code = ("import signal, sys, pathlib\n"
            f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('TERM'), sys.exit(7)))\n"
            "print('ready', flush=True)\n"
            "while True: signal.pause()\n")
    task = slurm.Task(["--only", A, "--seeds", "3"], 0)
    task.unit = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                 preexec_fn=slurm.ignore_preempt_signal)
    assert task.unit.stdout.readline() == "ready\n"  # its handler is in place
    os.kill(task.unit.pid, signal.SIGUSR2)  # delivered before the SIGTERM below (lower number first)
    again = task.checkpoint()
    assert marker.read_text() == "TERM"
    again.dump(tmp_path / "task.pkl")
    requeued = DelayedSubmission.load(tmp_path / "task.pkl").function
    assert (requeued.argv, requeued.gpus_per_run, requeued.unit) == (task.argv, 0, None)


def test_multi_node_runs_use_fairseqs_slurm_init_with_the_papers_batch(tmp_path, capsys):
    out, script, _ = dry_run(tmp_path, capsys, "--only", A, "--gpus-per-run", "2", "--nodes-per-run", "2",
                             "--set", "max_tokens=512", "--set", "batch_tokens=8192")
    text = script.read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --ntasks-per-node=1\n" in text
    run = R.coerce(R.coerce(R.BY_NAME[A], "max_tokens", "512"), "batch_tokens", "8192").with_defaults()
    assert batch_plan(run, 4) == (512, 4)  # 8192 tokens an update over 2 nodes x 2 GPUs
    (_, _, fargs), = read_tasks(script.with_suffix(".tasks"))
    fa = fargs.split()
    assert fa[fa.index("--max-tokens") + 1] == "512" and fa[fa.index("--update-freq") + 1] == "4"
    assert int(fa[fa.index("--distributed-port") + 1]) > 0


def test_the_worker_on_another_node_starts_the_units_fairseq_train(tmp_path, monkeypatch, data):
    """submitit's srun runs the task on every node; a rank above 0 starts the fairseq-train node 0's unit
    starts (fairseq's SLURM init reads the step's variables)."""
    argv = ["--only", A, "--seeds", "3", "--out", str(tmp_path / "out"), "--data", str(data), *TINY,
            "--fairseq-args", "--distributed-port 23456 --max-tokens 256 --update-freq 1"]
    started = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: started.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert slurm.Task(argv, 2)() == 0
    opts = RunOptions.from_namespace(run_parser().parse_args(argv))
    job, = make_jobs(opts, select_runs(opts), dry_run=False)[0]
    assert started == [job.train_cmd(0)]
    assert job.train_cmd(0)[job.train_cmd(0).index("--distributed-port") + 1] == "23456"
    # a run already trained: nothing is started (node 0's unit only scores it)
    job.dir.claim(job.config(), job.config_hash())
    job.dir.mark_trained()
    assert slurm.Task(argv, 2)() == 0 and len(started) == 1


def test_dry_run_writes_the_script_and_list_only_and_submits_nothing(tmp_path, capsys, monkeypatch):
    rec = fake_slurm(tmp_path, monkeypatch)
    out, script, _ = dry_run(tmp_path, capsys, "--seeds", "1,2", "--gpus-per-run", "0")
    assert sorted(p.name for p in out.rglob("*")) == sorted([script.name, script.stem + ".tasks"])
    assert not rec.exists()
    tasks = (out / (script.stem + ".tasks")).read_text().splitlines()
    assert [t.split("\t")[:2] for t in tasks] == [[n, s] for n in (B, A) for s in ("1", "2")]  # table order


def test_a_failed_submission_is_one_line(tmp_path, capsys, monkeypatch, data):
    fake_slurm(tmp_path, monkeypatch, sbatch='echo "sbatch: error: invalid partition specified: debug" >&2; exit 1')
    assert call(*BASE, "--out", tmp_path / "out", "--data", data, "--gpus-per-run", "0") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sbatch failed: sbatch: error: invalid partition" in err, err
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert call(*BASE, "--out", tmp_path / "out", "--data", data, "--gpus-per-run", "0") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sbatch and srun not found: run this on a SLURM login node" in err, err


@pytest.mark.parametrize("extra, message", [
    (["--max-running", "0"], "0 is too small"),
    (["--time", "ten"], "is not a time"),
    (["--time", "00:00:30"], "at least 00:01:00"),
    (["--gpus-per-run", "-1"], "-1 is too small"),
    (["--nodes-per-run", "0"], "0 is too small"),
    (["--nodes-per-run", "2", "--gpus-per-run", "0"], "--nodes-per-run 2 needs --gpus-per-run >= 1"),
    (["--gpus", "0"], "--gpus: on SLURM the allocation decides"),
    (["--jobs", "2"], "--jobs: on SLURM the allocation decides"),
    (["--gpus-per-run", "0", "--fp16"], "--fp16 needs GPUs"),
    (["--only", "nope"], "unknown run 'nope'"),
    (["--gpus-per-run", "3", "--set", "max_tokens=512", "--set", "batch_tokens=1024"], "cannot be split"),
    (["--out", "{tmp}/out%j"], "SLURM reads '%' in a log path as a pattern"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
    extra = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    assert call(*BASE, "--out", tmp_path / "out", "--dry-run", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not any(tmp_path.iterdir())


def test_a_partition_is_required(tmp_path, capsys):
    assert call("slurm", "--time", "1:00:00", "--out", tmp_path, "--dry-run") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--partition" in err


# -- status ------------------------------------------------------------------------------------
def record_run(out, name, seed, evals, done=None, max_epoch=3):
    run = R.coerce(R.BY_NAME[name], "max_epoch", str(max_epoch)).with_defaults()
    d = Path(out) / name / f"seed{seed}"
    (d / "eval").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"hash": "x", "run": run.as_dict(), "seed": seed, "arch": "a"}))
    for e, bleu in evals:
        (d / "eval" / f"epoch{e}.json").write_text(json.dumps({"epoch": e, "bleu_tok": bleu, "valid_loss": 5.0 - e}))
    if done:
        (d / "DONE.json").write_text(json.dumps({"outcome": done}))
    return d


def test_status_prints_one_line_per_run_and_the_counts(tmp_path, capsys):
    record_run(tmp_path, B, 1, [(1, 10.5), (2, 12.25), (3, 11.0)], done="finished")
    record_run(tmp_path, A, 1, [(1, 3.0)])
    record_run(tmp_path, A, 3, [])
    (tmp_path / "slurm-abc.tasks").write_text(f"{B}\t1\t\n{A}\t1\t\n{A}\t2\t\n{A}\t3\t\n")
    assert call("status", tmp_path) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5
    assert lines[0].split()[:4] == [B, "seed1", "finished", "epochs"] and "best BLEU 12.25 (epoch 2)" in lines[0]
    assert "3/3" in lines[0]
    assert "interrupted after epoch 1" in lines[1] and "best BLEU 3.00 (epoch 1)" in lines[1]
    assert lines[2].split()[:4] == [A, "seed3", "not", "started"] and "0/3" in lines[2]
    assert lines[3].split()[:3] == [A, "seed2", "queued"] and "best BLEU -" in lines[3]
    assert lines[4] == "4 runs: 1 finished, 1 not started, 1 queued, 1 unfinished"


def test_status_of_an_unreadable_folder_is_one_line_and_exit_2(tmp_path, capsys):
    d = record_run(tmp_path, A, 1, [(1, 10.5)], done="finished")
    (d / "DONE.json").write_text("{trunc")
    assert call("status", tmp_path) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and str(d / "DONE.json") in err
    assert "unreadable" in captured.out
    assert call("status", tmp_path / "nope") == 2
    assert "is not a folder" in capsys.readouterr().err


# -- a real one-node SLURM ---------------------------------------------------------------------
# SLURM offers no wait for a job's end without accounting: the tests check the queue (or a log) at most
# CHECKS times, PAUSE seconds apart. A tiny run trains in under a minute on idle cores (several on busy
# ones); SLURM holds a requeued task about two and a half minutes before it starts it again (its
# slurmctld.log), so 900 checks leave ample room. The runs skip test BLEU: the unit's scoring is
# tested elsewhere, and --time is far above what they take, so that no time limit interferes.
CHECKS, PAUSE = 900, 2
LAUNCH = re.compile(r"^# grid: ", re.M)  # a launch of fairseq-train in train.log
HOLD = Path(__file__).resolve().parent / "hold"  # sitecustomize.py: fairseq-train waits after an epoch


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import slurm_cluster

    try:
        c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except slurm_cluster.Unavailable as e:
        pytest.skip(f"no SLURM here: {e}")
    c.env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1")
    yield c
    c.stop()


def submit(cluster, out, data, *extra, hold_after_epoch=None):
    """Submit the grid's array; with ``hold_after_epoch`` its fairseq-train stops after saving that epoch."""
    env = dict(cluster.env)
    if hold_after_epoch is not None:
        env.update(LNPOS_TEST_HOLD_AFTER_EPOCH=str(hold_after_epoch),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HOLD), env.get("PYTHONPATH")])))
    r = subprocess.run([str(GRID), "slurm", "--out", str(out), "--data", str(data), "--partition", cluster.partition,
                        "--time", "01:00:00", "--gpus-per-run", "0", "--cpus-per-run", "1", "--no-bleu", *TINY, *extra],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return re.search(r"^submitted job (?:array )?(\d+):", r.stdout, re.M).group(1)


def wait_for(cluster, job, until=None):
    """Until the job has left the queue (or ``until()`` holds), checked at most CHECKS times."""
    for _ in range(CHECKS):
        if until is not None and until():
            return
        q = subprocess.run(["squeue", "-h", "-j", job], env=cluster.env, capture_output=True, text=True, timeout=30)
        if until is None and q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(PAUSE)
    subprocess.run(["scancel", job], env=cluster.env, timeout=30)
    pytest.fail(f"SLURM job {job} still queued after {CHECKS} checks")


def logs_of(out, job):
    return "".join(p.read_text(errors="replace") for p in sorted((out / "slurm-logs").glob(f"{job}_*_log.out")))


def saved_epoch_1(log):
    return lambda: log.exists() and "checkpoint1.pt (epoch 1 @" in log.read_text(errors="replace")


@pytest.mark.slow
def test_a_grid_as_a_slurm_array_finishes_skips_and_resumes(cluster, data, tmp_path):
    out = tmp_path / "out"
    job = submit(cluster, out, data, "--only", f"{A},{B}", "--max-epoch", "1", "--max-running", "2")
    wait_for(cluster, job)
    rows = {r["run"]: r for r in collect(run_dirs(out))}
    assert {n: r["status"] for n, r in rows.items()} == {A: "finished", B: "finished"}, logs_of(out, job)[-3000:]
    before = {n: (out / n / "seed1" / "DONE.json").stat().st_mtime_ns for n in (A, B)}
    # submitted again: both tasks find their runs finished and leave them alone
    again = submit(cluster, out, data, "--only", f"{A},{B}", "--max-epoch", "1")
    wait_for(cluster, again)
    assert {n: (out / n / "seed1" / "DONE.json").stat().st_mtime_ns for n in (A, B)} == before
    assert logs_of(out, again).count("already finished, not redone") == 2, logs_of(out, again)[-3000:]

    # a task cancelled after its first epoch (held there) resumes from checkpoint_last.pt when resubmitted
    out2 = tmp_path / "out2"
    log = out2 / A / "seed1" / "train.log"
    job = submit(cluster, out2, data, "--only", A, "--max-epoch", "2", hold_after_epoch=1)
    wait_for(cluster, job, until=saved_epoch_1(log))
    subprocess.run(["scancel", job], env=cluster.env, timeout=30)
    wait_for(cluster, job)
    assert not (out2 / A / "seed1" / "DONE.json").exists()
    job = submit(cluster, out2, data, "--only", A, "--max-epoch", "2")
    wait_for(cluster, job)
    launches = LAUNCH.split(log.read_text())
    assert len(launches) == 3 and "checkpoint_last.pt (epoch 2 @" in launches[2]  # resumed in epoch 2
    assert [r["status"] for r in collect(run_dirs(out2))] == ["finished"]

    # submitit's signal before the time limit (what submitit's job._interrupt(timeout=True) sends): the task
    # stops the run, submitit requeues it, and the requeued task resumes it
    out3 = tmp_path / "out3"
    log = out3 / A / "seed1" / "train.log"
    job = submit(cluster, out3, data, "--only", A, "--max-epoch", "2", hold_after_epoch=1)
    wait_for(cluster, job, until=saved_epoch_1(log))
    subprocess.run(["scancel", "--signal=USR2", job], env=cluster.env, timeout=30)
    wait_for(cluster, job)
    assert "Requeued job" in logs_of(out3, job), logs_of(out3, job)[-3000:]
    assert len(LAUNCH.split(log.read_text())) == 3
    st = subprocess.run([str(GRID), "status", str(out3)], env=cluster.env, capture_output=True, text=True, timeout=60)
    assert st.returncode == 0 and st.stdout.strip().splitlines()[-1] == "1 run: 1 finished", st.stdout
