"""The grid on a SLURM cluster (``grid.sh slurm``; ``grid.sh status`` is status.py), on submitit.

    scripts/grid.sh slurm --only 'iwslt-*' --seeds 1,2 --data data-bin/iwslt14.de-en --out grid-out \\
        --partition gpu --gpus-per-run 1 --time 24:00:00 --max-running 8 [--dry-run]

One grid is one submitit job array (``map_array``) of :class:`Task`: task i runs the grid's own per-run
unit, ``grid.sh run --only NAME --seeds S`` with the same options, for line i+1 of OUT/slurm-ID.tasks.
The unit takes the run folder's lock, checks its config hash, resumes from checkpoint_last.pt and skips
a finished run, so a requeued, preempted or resubmitted task goes on where it stopped. submitit writes
the sbatch script, pickles the tasks and requeues a task from its signal before the time limit or a
preemption (``Task.checkpoint``); its files and the logs are in OUT/slurm-logs.

Multi-node runs (``--nodes-per-run N`` > 1, GPUs only): submitit's srun starts one task per node, and
fairseq's SLURM initialisation (fairseq/distributed/utils.py ``_infer_slurm_init``, ``--distributed-port``)
reads that step's variables: node 0 runs the per-run unit (training, scoring, the run folder), the other
nodes the same fairseq-train (:meth:`Task.worker`). The paper's batch is kept through --update-freq
computed for N x G GPUs (commands.batch_plan).
"""
import contextlib
import hashlib
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from ..common import one_line, write_text
from ..errors import LnposError
from .commands import batch_plan, total_updates
from ..cli import to_argv
from .options import RunOptions, run_parser
from .plan import make_jobs, select_runs
from .rundir import tasks_text

# options of `grid.sh run` a task does not take from the command line: set per task or by the allocation
PER_TASK = {"only", "dry_run", "out", "seeds", "fairseq_args", "gpus", "runs_per_gpu", "jobs", "gpus_per_run"}
RUN_ONLY = {"extend"}  # options of `grid.sh run` that `grid.sh slurm` does not offer
PORT_BASE, PORT_SPAN = 20000, 20000
REQUEUES = 100  # time limits a task requeues itself after (submitit's max_num_timeout); preemptions are not counted
ROOT = Path(__file__).resolve().parents[2]  # where the package the tasks import lies


def check_options(opts):
    for flag, dest, default in (("--gpus", "gpus", None), ("--jobs", "jobs", 1), ("--runs-per-gpu", "runs_per_gpu", 1)):
        if getattr(opts, dest) != default:
            raise LnposError(f"{flag}: on SLURM the allocation decides where a run goes; drop {flag} "
                             f"(use --gpus-per-run, --nodes-per-run)")
    if opts.nodes_per_run > 1 and opts.gpus_per_run == 0:
        raise LnposError(f"--nodes-per-run {opts.nodes_per_run} needs --gpus-per-run >= 1: fairseq's multi-node "
                         f"training is GPU-only and would train nothing on CPUs while exiting 0")
    if opts.fp16 and opts.gpus_per_run == 0:
        raise LnposError("--fp16 needs GPUs: give --gpus-per-run >= 1 or drop --fp16")
    if opts.cpu_bf16 and opts.gpus_per_run:
        raise LnposError("--cpu-bf16 is mixed precision on the CPU: give --gpus-per-run 0, or --fp16 on GPUs")
    if "%" in opts.out:
        raise LnposError(f"--out {opts.out}: SLURM reads '%' in a log path as a pattern (%j, %a ...): "
                         f"give a folder without '%'")


def passthrough(opts):
    """The argv of the run options that every task takes unchanged (those not at their default)."""
    return to_argv(opts, RunOptions, skip=PER_TASK | RUN_ONLY)


def task_fairseq_args(opts, run, seed):
    """--fairseq-args of one task: the grid's, and for a multi-node run the port of fairseq's SLURM
    init and the batch split over N x G GPUs (it enters the run's config hash)."""
    base = opts.fairseq_args
    if opts.nodes_per_run == 1:
        return base
    world = opts.nodes_per_run * opts.world
    if run.schedule == "linear" and not run.max_update:
        raise LnposError(f"{run.name}: its linear decay counts updates on one node; run it with "
                         f"--nodes-per-run 1 or give it --set {run.name}:max_update=N")
    max_tokens, update_freq = batch_plan(run, world)
    digest = hashlib.sha256(f"{run.name} {seed}".encode()).digest()
    port = PORT_BASE + int.from_bytes(digest[:4], "big") % PORT_SPAN
    extra = f"--distributed-port {port} --max-tokens {max_tokens} --update-freq {update_freq}"
    return f"{base} {extra}".strip()


def ignore_preempt_signal():
    """In the unit's processes (fairseq-train, the evaluator): SLURM signals every process of the step,
    and only the task answers submitit's signal, by stopping the unit cleanly (an ignored signal stays
    ignored through exec)."""
    signal.signal(getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG), signal.SIG_IGN)


@dataclass
class Task(Checkpointable):
    """One array task: the per-run unit of one run x seed. ``argv``: its ``grid.sh run`` options."""
    argv: list
    gpus_per_run: int
    unit: subprocess.Popen = field(default=None, init=False, repr=False, compare=False)

    def unit_argv(self, visible_gpus=None):
        """The unit's command; on GPUs it places its run on the allocated ones (``visible_gpus``: the task's
        CUDA_VISIBLE_DEVICES, which the unit keeps) by their places in that list, as ``--gpus`` takes them,
        so UUID and MIG entries work as numbers do."""
        argv = [sys.executable, "-m", "fairseq_lnpos.experiments.grid", "run", *self.argv]
        if self.gpus_per_run:
            if not visible_gpus:
                raise LnposError("no GPU in the task's allocation (CUDA_VISIBLE_DEVICES is unset): check --gres")
            places = ",".join(str(i) for i in range(len(visible_gpus.split(","))))
            argv += ["--gpus", places, "--gpus-per-run", str(self.gpus_per_run)]
        return argv

    def __call__(self):
        if submitit.JobEnvironment().global_rank > 0:
            return self.worker()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        visible = env.get("CUDA_VISIBLE_DEVICES")  # kept: the grid gives each run its entries of it
        self.unit = subprocess.Popen(self.unit_argv(visible), env=env, preexec_fn=ignore_preempt_signal)
        rc = self.unit.wait()
        if rc:
            raise LnposError(f"grid.sh run {shlex.join(self.argv[:4])} ... exited with status {rc}")
        return rc

    def checkpoint(self):
        """submitit's requeue (its signal before the time limit, or a preemption): the unit stops as on
        Ctrl-C, its run resumes from checkpoint_last.pt in the requeued task."""
        if self.unit is not None and self.unit.returncode is None:
            self.unit.send_signal(signal.SIGTERM)
            # not Popen.wait: __call__'s wait, interrupted by this signal, holds its lock
            os.waitpid(self.unit.pid, 0)
        return DelayedSubmission(replace(self))

    def worker(self):
        """fairseq-train of the run on a node other than the first (multi-node): the command node 0's unit
        builds, with fairseq's SLURM init reading this step's variables (node id, nodes)."""
        opts = RunOptions.from_namespace(run_parser().parse_args(self.argv))
        (job,), _ = make_jobs(opts, select_runs(opts), dry_run=False)
        done = job.dir.outcome()
        if job.dir.trained or (done is not None and done.final):  # node 0's unit only scores it
            return 0
        cmd = job.train_cmd(total_updates(job) if job.run.schedule == "linear" else 0)
        return subprocess.run(cmd, preexec_fn=ignore_preempt_signal).returncode


class Executor(submitit.SlurmExecutor):
    """submitit's SLURM executor; :meth:`script` is the sbatch script it submits, written without SLURM."""

    @classmethod
    def affinity(cls):
        return 1  # cmd_slurm checks for sbatch and srun itself, with an error that says what to do

    def script(self, ntasks):
        """The script ``map_array`` submits for ``ntasks`` tasks (an array from two on, as submitit does)."""
        if ntasks > 1:
            self.parameters["map_count"] = ntasks
        try:
            return self._make_submission_file_text(self._submitit_command_str, "")
        finally:
            self.parameters.pop("map_count", None)


def sbatch_parameters(opts, ntasks, name, comment):
    """submitit's SLURM parameters of the grid's array (``executor.update_parameters``)."""
    g, n = opts.gpus_per_run, opts.nodes_per_run
    cpus = opts.cpus_per_run or (4 * g if g else 2)
    params = dict(job_name=name, partition=opts.partition, time=opts.time // 60, nodes=n, ntasks_per_node=1,
                  cpus_per_task=cpus, srun_args=[f"--cpus-per-task={cpus}"],  # srun >= 22.05 does not inherit it
                  signal_delay_s=min(300, opts.time // 10), array_parallelism=opts.max_running or ntasks,
                  stderr_to_stdout=True, additional_parameters={"requeue": True}, setup=[f"# {comment}"])
    if g:
        params["gres"] = f"gpu:{g}"
    if opts.account:
        params["account"] = opts.account
    return params


def plan(opts):
    """(tasks [(run, seed, fairseq args)], their :class:`Task`, the task list's text, grid id); checks
    what can be checked before queueing."""
    check_options(opts)
    runs = select_runs(opts)
    opts = replace(opts, out=str(Path(opts.out).resolve()))
    jobs, _ = make_jobs(opts, runs, dry_run=opts.dry_run)
    tasks, units = [], []
    for j in jobs:
        batch_plan(j.run, opts.world)
        fargs = task_fairseq_args(opts, j.run, j.seed)
        j = replace(j, opts=replace(opts, fairseq_args=fargs))
        j.dir.check_config(j.config_hash(), j.config())
        tasks.append((j.run.name, j.seed, fargs))
        units.append(Task(["--only", j.run.name, "--seeds", str(j.seed), "--out", opts.out, "--fairseq-args", fargs,
                           *passthrough(opts)], opts.gpus_per_run))
    listing = tasks_text(tasks)
    return tasks, units, listing, hashlib.sha256(listing.encode()).hexdigest()[:8]


def cmd_slurm(opts):
    tasks, units, listing, grid_id = plan(opts)
    out = Path(opts.out).resolve()
    tasks_path, logs = out / f"slurm-{grid_id}.tasks", out / "slurm-logs"
    comment = (f"{len(tasks)} tasks: task i runs line i+1 of {tasks_path} (run, seed, fairseq args) with the "
               f"grid's per-run unit. Written by: {one_line(shlex.join(['grid.sh', 'slurm'] + opts.argv))}")
    params = sbatch_parameters(opts, len(tasks), f"grid-{grid_id}", comment)
    missing = [tool for tool in ("sbatch", "srun") if not shutil.which(tool)]
    if missing and not opts.dry_run:
        raise LnposError(f"{' and '.join(missing)} not found: run this on a SLURM login node (--dry-run writes "
                         f"the script here)")
    executor = Executor(logs, max_num_timeout=REQUEUES)
    executor.update_parameters(**params)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text(tasks_path, listing)
        if opts.dry_run:
            script = out / f"slurm-{grid_id}.sbatch"
            write_text(script, executor.script(len(tasks)))
    except OSError as e:
        raise LnposError(f"--out {out}: cannot write there ({e.strerror}): give a writable folder")
    if opts.dry_run:
        print(script.read_text(), end="")
        print(f"# {len(tasks)} tasks listed in {tasks_path}; not submitted (--dry-run)")
        return 0
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's error; it is raised below
            jobs = executor.submit_array(units)
    except (submitit.core.utils.FailedSubmissionError, submitit.core.utils.FailedJobError) as e:
        err = (str(e).strip().splitlines() or ["no message"])[-1]
        raise LnposError(f"sbatch failed: {err}") from None
    print(f"submitted job {'array ' if len(jobs) > 1 else ''}{jobs[0].job_id.split('_')[0]}: {len(tasks)} tasks "
          f"({tasks_path}); logs {logs}; progress: scripts/grid.sh status {out}")
    return 0
