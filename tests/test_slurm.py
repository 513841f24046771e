"""grid.sh slurm (job-array script, task -> run x seed, options passed through, refusals) and
grid.sh status; with a one-node SLURM on this machine (tests/slurm_cluster.py) when it can be started."""
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments.options import RunOptions, run_parser
from fairseq_lnpos.experiments.plan import make_jobs, select_runs
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.experiments.commands import batch_plan
from fairseq_lnpos.experiments.report import collect
from fairseq_lnpos.experiments.rundir import run_dirs

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


def task_argv(script, i, tmp_path, env=None, extra_path=None):
    """Run array task ``i`` of ``script`` with grid.sh replaced by a stub that records its argv."""
    rec = tmp_path / f"argv{i}.json"
    stub = fake_tool(tmp_path, "grid-stub", f"{sys.executable} -c 'import json,os,sys; json.dump("
                     f"[sys.argv[1:], os.environ.get(\"CUDA_VISIBLE_DEVICES\")], open(\"{rec}\", \"w\"))' \"$@\"; exit 3")
    text = script.read_text().replace('GRID="$ROOT/scripts/grid.sh"', f'GRID="{stub}"')
    copy = tmp_path / "task.sh"
    copy.write_text(text)
    e = dict(os.environ, SLURM_ARRAY_TASK_ID=str(i), SLURM_ARRAY_JOB_ID="7", **(env or {}))
    if extra_path:
        e["PATH"] = f"{extra_path}:{e['PATH']}"
    r = subprocess.run(["bash", str(copy)], env=e, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr  # the task exits with the unit's status
    return json.loads(rec.read_text())


def dry_run(tmp_path, capsys, *extra):
    out = tmp_path / "out"
    assert call(*BASE, "--out", out, "--dry-run", *extra) == 0
    printed = capsys.readouterr().out
    scripts = list(out.glob("slurm-*.sbatch"))
    assert len(scripts) == 1
    return out, scripts[0], printed


def test_array_has_one_task_per_run_and_seed_each_running_the_unit(tmp_path, capsys):
    out, script, printed = dry_run(tmp_path, capsys, "--seeds", "1,2,5", "--max-running", "2", "--gpus-per-run", "0",
                                   *TINY, "--beam", "4", "--no-bleu")
    text = script.read_text()
    assert printed.startswith(text)
    assert "#SBATCH --array=0-5%2\n" in text  # 2 runs x 3 seeds, at most 2 at once
    assert "#SBATCH --requeue\n" in text and "#SBATCH --partition=debug\n" in text
    assert "#SBATCH --cpus-per-task=2\n" in text and "--gres" not in text
    assert "#SBATCH --time=0:10:00\n" in text
    seen = set()
    for i in range(6):
        argv, _ = task_argv(script, i, tmp_path)
        assert argv[0] == "run"
        opt = {argv[k]: argv[k + 1] for k in range(1, len(argv) - 1) if argv[k] in ("--only", "--seeds", "--out")}
        seen.add((opt["--only"], int(opt["--seeds"])))
        assert opt["--out"] == str(out.resolve())
        # the options pass through unchanged: the unit parses to the same run options
        unit = G.build_parser().parse_args(argv)
        assert (unit.arch_size, unit.set, unit.beam, unit.no_bleu, unit.fairseq_args) == (
            "tiny", ["max_tokens=512", "batch_tokens=512"], 4, True, "")
        assert "--gpus" not in argv
    assert seen == {(n, s) for n in (A, B) for s in (1, 2, 5)}
    r = subprocess.run(["bash", str(script)], env=dict(os.environ, SLURM_ARRAY_TASK_ID="6"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no task 6" in r.stderr


def test_every_run_option_a_task_does_not_set_passes_through_the_task_line():
    """The task line is written from the fields of RunOptions: each option at another value than its
    default reaches the per-run unit as given (a new field without a value here fails the test)."""
    from dataclasses import fields

    from fairseq_lnpos.experiments.options import SlurmOptions
    from fairseq_lnpos.experiments.slurm import PER_TASK, passthrough

    given = dict(max_epoch=4, data=["d", "wmt14=w x"], arch_size="tiny", arch="a", set=["lr=1", "a:warmup=2"],
                 task="translation_lnpos", gen_args="--nbest 2", beam=3, lenpen=0.5, average_last=2,
                 uncapped_len=True, eval_every=2, evaluators=3, no_bleu=True, patience=7, fp16=True,
                 log_interval=9, keep_checkpoints=True, early_stop=True, fork_server=False)
    assert set(given) == {f.name for f in fields(RunOptions)} - PER_TASK
    opts = SlurmOptions(partition="p", time=600, gpus_per_run=2, seeds="1,2", fairseq_args="--x", **given)
    unit = RunOptions.from_namespace(run_parser().parse_args(passthrough(opts)))
    assert {k: getattr(unit, k) for k in given} == given
    assert passthrough(SlurmOptions(partition="p", time=600)) == []


def test_gpu_runs_take_the_allocated_gpus(tmp_path, capsys):
    _, script, _ = dry_run(tmp_path, capsys, "--gpus-per-run", "2", "--fp16")
    text = script.read_text()
    assert "#SBATCH --gres=gpu:2\n" in text and "#SBATCH --cpus-per-task=8\n" in text and "srun" not in text
    argv, visible = task_argv(script, 1, tmp_path, env={"CUDA_VISIBLE_DEVICES": "4,5"})
    unit = G.build_parser().parse_args(argv)
    assert (unit.gpus, unit.gpus_per_run, unit.fp16, visible) == ("4,5", 2, True, None)


def test_multi_node_runs_use_fairseqs_slurm_init_with_the_papers_batch(tmp_path, capsys):
    _, script, _ = dry_run(tmp_path, capsys, "--only", A, "--gpus-per-run", "2", "--nodes-per-run", "2",
                           "--set", "max_tokens=512", "--set", "batch_tokens=8192")
    assert "#SBATCH --nodes=2\n" in script.read_text() and "#SBATCH --ntasks-per-node=1\n" in script.read_text()
    rec = tmp_path / "srun.txt"
    fake_tool(tmp_path, "srun", f'printf "%s\\n" "$@" > {rec}')
    argv, _ = task_argv(script, 0, tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_NODELIST": "n[1-2]"},
                        extra_path=tmp_path)
    unit = G.build_parser().parse_args(argv)
    run = R.coerce(R.coerce(R.BY_NAME[A], "max_tokens", "512"), "batch_tokens", "8192").with_defaults()
    assert batch_plan(run, 4) == (512, 4)  # 8192 tokens an update over 2 nodes x 2 GPUs
    fa = unit.fairseq_args.split()
    assert fa[fa.index("--max-tokens") + 1] == "512" and fa[fa.index("--update-freq") + 1] == "4"
    assert int(fa[fa.index("--distributed-port") + 1]) > 0
    # the other node runs the same run options through the worker
    srun = rec.read_text().splitlines()
    assert srun[:4] == ["--nodes=1", "--ntasks-per-node=1", "--relative=1", "--kill-on-bad-exit=1"]
    assert srun[srun.index("worker") + 1:] == argv[1:]


def test_dry_run_writes_the_script_and_list_only_and_submits_nothing(tmp_path, capsys, monkeypatch):
    rec = tmp_path / "sbatch-called"
    fake_tool(tmp_path, "sbatch", f"touch {rec}")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out, script, _ = dry_run(tmp_path, capsys, "--seeds", "1,2", "--gpus-per-run", "0")
    assert sorted(p.name for p in out.rglob("*")) == sorted([script.name, script.stem + ".tasks"])
    assert not rec.exists()
    tasks = (out / (script.stem + ".tasks")).read_text().splitlines()
    assert [t.split("\t")[:2] for t in tasks] == [[n, s] for n in (B, A) for s in ("1", "2")]  # table order


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_toy_data(tmp_path_factory.mktemp("toy"))


def test_submission_calls_sbatch_once_and_reports_its_failure_in_one_line(tmp_path, capsys, monkeypatch, data):
    rec = tmp_path / "sbatch-argv"
    fake_tool(tmp_path, "sbatch", f'echo "$@" >> {rec}; echo "123;cluster"')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = tmp_path / "out"
    assert call(*BASE, "--out", out, "--data", data, "--gpus-per-run", "0") == 0
    script = next(out.glob("slurm-*.sbatch"))
    assert rec.read_text() == f"--parsable {script}\n"
    assert "submitted job array 123: 2 tasks" in capsys.readouterr().out
    assert (out / "slurm-logs").is_dir()
    fake_tool(tmp_path, "sbatch", 'echo "sbatch: error: invalid partition specified: debug" >&2; exit 1')
    assert call(*BASE, "--out", out, "--data", data, "--gpus-per-run", "0") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid partition" in err


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
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
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
        (d / "DONE.json").write_text(json.dumps({"status": done}))
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
WAIT = 360
LAUNCH = re.compile(r"^# grid: ", re.M)  # a launch of fairseq-train in train.log


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import slurm_cluster

    try:
        c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except slurm_cluster.Unavailable as e:
        pytest.skip(f"no SLURM here: {e}")
    c.env.update(PYTHON=sys.executable, OMP_NUM_THREADS="1")
    yield c
    subprocess.run(["scancel", "--full", "--user", "root"], env=c.env, capture_output=True, timeout=30)
    c.stop()


HOLD = Path(__file__).resolve().parent / "hold"  # sitecustomize.py: fairseq-train waits after an epoch


def submit(cluster, out, data, *extra, hold_after_epoch=None):
    """Submit the grid's array; with ``hold_after_epoch`` its fairseq-train stops after saving that epoch."""
    env = dict(cluster.env)
    if hold_after_epoch is not None:
        env.update(LNPOS_TEST_HOLD_AFTER_EPOCH=str(hold_after_epoch),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HOLD), env.get("PYTHONPATH")])))
    r = subprocess.run([str(GRID), "slurm", "--out", str(out), "--data", str(data), "--partition", cluster.partition,
                        "--time", "00:10:00", "--gpus-per-run", "0", "--cpus-per-run", "1", *TINY, *extra],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split("submitted job array ")[1].split(":")[0]


def wait_for(cluster, job, until=None):
    """Until the array has left the queue (or ``until()`` holds); bounded."""
    deadline = time.time() + WAIT
    while time.time() < deadline:
        if until is not None and until():
            return
        q = subprocess.run(["squeue", "-h", "-j", job], env=cluster.env, capture_output=True, text=True, timeout=30)
        if until is None and q.returncode == 0 and not q.stdout.strip():
            return
        time.sleep(2)
    subprocess.run(["scancel", job], env=cluster.env, timeout=30)
    pytest.fail(f"SLURM job {job} not done after {WAIT} s")


@pytest.mark.slow
def test_a_grid_as_a_slurm_array_finishes_skips_and_resumes(cluster, data, tmp_path):
    out = tmp_path / "out"
    job = submit(cluster, out, data, "--only", f"{A},{B}", "--max-epoch", "1", "--max-running", "2")
    wait_for(cluster, job)
    rows = {r["run"]: r for r in collect(run_dirs(out))}
    assert {n: r["status"] for n, r in rows.items()} == {A: "finished", B: "finished"}, list(out.rglob("*.out"))
    before = {n: (out / n / "seed1" / "DONE.json").stat().st_mtime_ns for n in (A, B)}
    # submitted again: both tasks find their runs finished and leave them alone
    again = submit(cluster, out, data, "--only", f"{A},{B}", "--max-epoch", "1")
    wait_for(cluster, again)
    assert {n: (out / n / "seed1" / "DONE.json").stat().st_mtime_ns for n in (A, B)} == before
    logs = "".join(p.read_text() for p in (out / "slurm-logs").glob(f"{again}_*.out"))
    assert logs.count("already finished, not redone") == 2, logs[-2000:]

    # a task cancelled after its first epoch (held there) resumes from checkpoint_last.pt when resubmitted
    out2 = tmp_path / "out2"
    log = out2 / A / "seed1" / "train.log"
    job = submit(cluster, out2, data, "--only", A, "--max-epoch", "2", hold_after_epoch=1)
    wait_for(cluster, job, until=lambda: log.exists() and "checkpoint1.pt (epoch 1 @" in log.read_text(errors="replace"))
    subprocess.run(["scancel", job], env=cluster.env, timeout=30)
    wait_for(cluster, job)
    assert not (out2 / A / "seed1" / "DONE.json").exists()
    job = submit(cluster, out2, data, "--only", A, "--max-epoch", "2")
    wait_for(cluster, job)
    launches = LAUNCH.split(log.read_text())
    assert len(launches) == 3 and "checkpoint_last.pt (epoch 2 @" in launches[2]  # resumed in epoch 2
    assert [r["status"] for r in collect(run_dirs(out2))] == ["finished"]

    # the warning before the time limit (--signal=B:USR1): the task stops the run and requeues
    # itself, and the requeued task resumes it
    out3 = tmp_path / "out3"
    log = out3 / A / "seed1" / "train.log"
    job = submit(cluster, out3, data, "--only", A, "--max-epoch", "2", hold_after_epoch=1)
    wait_for(cluster, job, until=lambda: log.exists() and "checkpoint1.pt (epoch 1 @" in log.read_text(errors="replace"))
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=cluster.env, timeout=30)
    wait_for(cluster, job)
    assert len(LAUNCH.split(log.read_text())) == 3
    st = subprocess.run([str(GRID), "status", str(out3)], env=cluster.env, capture_output=True, text=True, timeout=60)
    assert st.returncode == 0 and st.stdout.strip().splitlines()[-1] == "1 runs: 1 finished", st.stdout


def test_the_worker_on_another_node_starts_the_units_fairseq_train_as_its_rank(tmp_path, monkeypatch, data):
    import socket

    from fairseq_lnpos.experiments import slurm

    fake_tool(tmp_path, "scontrol", 'echo "n1 n2"')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setattr(socket, "gethostname", lambda: "n2")
    started = []
    monkeypatch.setattr(os, "execvpe", lambda exe, cmd, env: started.append((cmd, env)))
    argv = ["--only", A, "--seeds", "3", "--out", str(tmp_path / "out"), "--data", str(data), *TINY,
            "--gpus-per-run", "2", "--fairseq-args", "--distributed-port 23456 --max-tokens 256 --update-freq 1"]
    slurm.main(["worker", *argv])
    (cmd, env), = started
    opts = RunOptions.from_namespace(run_parser().parse_args(argv))
    job, = make_jobs(opts, select_runs(opts), dry_run=False)[0]
    assert cmd == job.train_cmd(0)  # the command node 0's unit starts
    assert cmd[cmd.index("--distributed-port") + 1] == "23456"
    assert (env["SLURM_NODEID"], env["SLURM_STEP_NODELIST"], env["SLURM_NNODES"], env["SLURM_NTASKS_PER_NODE"]) == (
        "1", "n[1-2]", "2", "1")
    # a run already trained: nothing is started (node 0's unit only scores it)
    job.dir.claim(job.config(), job.config_hash())
    job.dir.mark_trained()
    assert slurm.main(["worker", *argv]) == 0 and len(started) == 1
