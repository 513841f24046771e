"""The grid on a SLURM cluster (``grid.sh slurm``; ``grid.sh status`` is status.py).

    scripts/grid.sh slurm --only 'iwslt-*' --seeds 1,2 --data data-bin/iwslt14.de-en --out grid-out \\
        --partition gpu --gpus-per-run 1 --time 24:00:00 --max-running 8 [--dry-run]

``slurm`` writes one sbatch script per grid, OUT/slurm-ID.sbatch, with OUT/slurm-ID.tasks next to it
(line i+1: run, seed and fairseq args of array task i), and submits it as one job array with ``%K``
running at once. Every task runs the grid's own per-run unit, ``grid.sh run --only NAME --seeds S``
with the same options: it takes the run folder's lock, checks its config hash, resumes from
checkpoint_last.pt and skips a finished run, so a requeued, preempted or resubmitted task goes on
where it stopped. Plain generated scripts, no new dependency: sbatch is the whole interface.

Multi-node runs (``--nodes-per-run N`` > 1, GPUs only) use fairseq's SLURM initialisation
(fairseq/distributed/utils.py ``_infer_slurm_init``, one task per node, ``--distributed-port``):
node 0 runs the per-run unit (training, scoring, the run folder); ``srun`` starts the same
fairseq-train (:func:`worker`) on the other nodes. The paper's batch is kept through --update-freq
computed for N x G GPUs (commands.batch_plan).
"""
import hashlib
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from ..common import one_line, write_text
from ..errors import LnposError, run_main
from .commands import batch_plan, total_updates
from .options import RunOptions, run_parser, to_argv
from .plan import make_jobs, select_runs
from .rundir import tasks_text

# options of `grid.sh run` a task does not take from the command line: set per task or by the allocation
PER_TASK = {"only", "dry_run", "out", "seeds", "fairseq_args", "gpus", "runs_per_gpu", "jobs", "gpus_per_run"}
PORT_BASE, PORT_SPAN = 20000, 20000


def slurm_time(secs):
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"


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


def passthrough(opts):
    """The argv of the run options that every task takes unchanged (those not at their default)."""
    return to_argv(opts, RunOptions, skip=PER_TASK)


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


SCRIPT = """\
#!/bin/bash
{sbatch}
# {ntasks} tasks: task i runs line i+1 of TASKS (run, seed, fairseq args) with the grid's per-run
# unit, which resumes a stopped run and skips a finished one. Written by: {command}
set -uo pipefail
ROOT={root}
. "$ROOT/scripts/_env.sh"
GRID="$ROOT/scripts/grid.sh"
TASKS={tasks}
I=${{SLURM_ARRAY_TASK_ID:?run this script with sbatch (a job array)}}
IFS=$'\\t' read -r NAME SEED FARGS < <(sed -n "$((I + 1))p" "$TASKS") || true
[ -n "${{NAME:-}}" ] || {{ echo "no task $I in $TASKS" >&2; exit 2; }}
ARGS=(--only "$NAME" --seeds "$SEED" --out {out} --fairseq-args "${{FARGS:-}}" {passthrough})
{devices}
stop_for=
on_signal() {{ stop_for=$1; [ -n "${{PID:-}}" ] && kill -TERM "$PID" 2>/dev/null; }}
trap 'on_signal cancel' TERM INT
trap 'on_signal limit' USR1
"$GRID" run "${{ARGS[@]}}" &
PID=$!
while :; do wait "$PID"; RC=$?; kill -0 "$PID" 2>/dev/null || break; done
{after}
if [ "$stop_for" = limit ]; then
  echo "time limit near: requeued, the run resumes from its last checkpoint" >&2
  scontrol requeue "${{SLURM_ARRAY_JOB_ID}}_${{I}}"
fi
exit "$RC"
"""

GPU_SETUP = """\
# the grid puts its runs on the allocated GPUs by id; CUDA_VISIBLE_DEVICES is then set per run
GPUS=${{CUDA_VISIBLE_DEVICES:?no GPU in the allocation: check --gres}}
unset CUDA_VISIBLE_DEVICES
ARGS+=(--gpus "$GPUS" --gpus-per-run {gpus})"""

MULTI_NODE = """
# fairseq's SLURM init: one task per node, rank = node id x GPUs per node, master = first node
export SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST"
srun --nodes={rest} --ntasks-per-node=1 --relative=1 --kill-on-bad-exit=1 \\
  "$PY" -m fairseq_lnpos.experiments.slurm worker "${{ARGS[@]}}" &
WORKERS=$!"""


def sbatch_lines(opts, ntasks, name, logs):
    g, n = opts.gpus_per_run, opts.nodes_per_run
    cpus = opts.cpus_per_run or (4 * g if g else 2)
    cap = f"%{opts.max_running}" if opts.max_running else ""
    margin = min(300, opts.time // 10)
    lines = [f"--job-name={name}", f"--array=0-{ntasks - 1}{cap}", f"--partition={opts.partition}",
             f"--time={slurm_time(opts.time)}", f"--nodes={n}", "--ntasks-per-node=1",
             f"--cpus-per-task={cpus}"]
    if g:
        lines.append(f"--gres=gpu:{g}")
    if opts.account:
        lines.append(f"--account={opts.account}")
    # sbatch reads quotes in #SBATCH lines as a shell does; in --output, %% is a literal %
    output = str(logs).replace("%", "%%") + "/%A_%a.out"
    lines += ["--requeue", f"--signal=B:USR1@{margin}", "--open-mode=append",
              "--output=" + shlex.quote(output), "--chdir=" + shlex.quote(str(Path.cwd()))]
    return "\n".join(f"#SBATCH {x}" for x in lines)


def plan(opts):
    """(tasks, script path, tasks path, script text); checks what can be checked before queueing."""
    check_options(opts)
    runs = select_runs(opts)
    out = Path(opts.out).resolve()
    opts = replace(opts, out=str(out))
    jobs, _ = make_jobs(opts, runs, dry_run=opts.dry_run)
    tasks = []
    for j in jobs:
        batch_plan(j.run, opts.world)
        fargs = task_fairseq_args(opts, j.run, j.seed)
        j = replace(j, opts=replace(opts, fairseq_args=fargs))
        j.dir.check_config(j.config_hash())
        tasks.append((j.run.name, j.seed, fargs))
    listing = tasks_text(tasks)
    grid_id = hashlib.sha256(listing.encode()).hexdigest()[:8]
    script, tasks_path = out / f"slurm-{grid_id}.sbatch", out / f"slurm-{grid_id}.tasks"
    devices = GPU_SETUP.format(gpus=opts.gpus_per_run) if opts.gpus_per_run else ""
    after = ""
    if opts.nodes_per_run > 1:
        devices += MULTI_NODE.format(rest=opts.nodes_per_run - 1)
        after = 'kill -TERM "$WORKERS" 2>/dev/null; wait "$WORKERS" 2>/dev/null'
    text = SCRIPT.format(
        sbatch=sbatch_lines(opts, len(tasks), f"grid-{grid_id}", out / "slurm-logs"),
        ntasks=len(tasks), command=one_line(shlex.join(["grid.sh", "slurm"] + opts.argv)),
        root=shlex.quote(str(G_ROOT)),
        tasks=shlex.quote(str(tasks_path)), out=shlex.quote(str(out)),
        passthrough=shlex.join(passthrough(opts)), devices=devices, after=after)
    return tasks, script, tasks_path, text, listing


G_ROOT = Path(__file__).resolve().parents[2]


def cmd_slurm(opts):
    tasks, script, tasks_path, text, listing = plan(opts)
    try:
        script.parent.mkdir(parents=True, exist_ok=True)
        write_text(tasks_path, listing)
        write_text(script, text)
    except OSError as e:
        raise LnposError(f"--out {script.parent}: cannot write the script there ({e.strerror}): give a writable folder")
    if opts.dry_run:
        print(text, end="")
        print(f"# {len(tasks)} tasks listed in {tasks_path}; not submitted (--dry-run)")
        return 0
    (script.parent / "slurm-logs").mkdir(exist_ok=True)
    try:
        r = subprocess.run(["sbatch", "--parsable", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise LnposError(f"sbatch not found: run this on a SLURM login node, or submit {script} there") from None
    if r.returncode != 0:
        err = (r.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise LnposError(f"sbatch {script} failed: {err}")
    job = r.stdout.decode().strip().split(";")[0]
    print(f"submitted job array {job}: {len(tasks)} tasks ({script}); "
          f"logs {script.parent / 'slurm-logs'}; progress: scripts/grid.sh status {script.parent}")
    return 0


def worker(argv):
    """fairseq-train of one run on a node other than the first (multi-node): the same command as the
    per-run unit builds on node 0, with fairseq's SLURM init seeing the job's nodes."""
    import socket

    opts = RunOptions.from_namespace(run_parser().parse_args(list(argv)))
    runs = select_runs(opts)
    jobs, _ = make_jobs(opts, runs, dry_run=False)
    if len(jobs) != 1:
        raise LnposError(f"worker: {len(jobs)} runs selected, expected one (--only NAME --seeds S)")
    job = jobs[0]
    done = job.dir.outcome()
    if job.dir.trained or (done is not None and done.final):
        print(f"worker: {job.label} already trained", file=sys.stderr)
        return 0
    hosts = subprocess.check_output(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]).decode().split()
    me = socket.gethostname()
    node = next((i for i, h in enumerate(hosts) if h == me or h == me.split(".")[0]), None)
    if node is None:
        raise LnposError(f"worker: host {me} is not in the job's nodes {hosts}")
    total = total_updates(job) if job.run.schedule == "linear" else 0
    cmd = job.train_cmd(total)
    env = dict(os.environ, SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
               SLURM_NNODES=os.environ["SLURM_JOB_NUM_NODES"], SLURM_NODEID=str(node), SLURM_NTASKS_PER_NODE="1")
    os.execvpe(cmd[0], cmd, env)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["worker"]:
        raise LnposError("usage: python -m fairseq_lnpos.experiments.slurm worker RUN-OPTIONS "
                         "(started on the other nodes by the script of grid.sh slurm)")
    return worker(argv[1:])


if __name__ == "__main__":
    sys.exit(run_main("slurm", main))
