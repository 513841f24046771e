"""GPU checks that the CPU test suite cannot make (fairseq's fp16 and amp need CUDA):

 1. per-layer gradient norms of the first update agree between fp32, --fp16 and --amp (the loss
    scale is removed), for Post-LN and Keel (fairseq 0.12's --bf16 implies --tpu and cannot train
    on a GPU);
 2. every plugin arch trains for a few hundred updates with --fp16 and RAdam;
 3. a two-run tiny grid on GPU 0 with --fp16, scored and tabled;
 4. throughput ratios against fairseq's transformer on the GPU (fp32 and fp16);
 5. with MULTI30K_ORIG=DIR (the six .gz files of Multi30k task 1): the multi30k-* rows the paper
    compares (:func:`m30k_rows`: Post-LN without warm-up and with 500 updates at 5e-4, Pre-LN, RAdam,
    DeepNorm, Keel, Admin; 12 epochs, --fp16), seeds $SEEDS (default 1,2), side by side on GPU 0
    (--runs-per-gpu $RUNS_PER_GPU, default 7; --evaluators $EVALUATORS, default 1), the test set
    scored every $EVAL_EVERY epochs (default 1) and at the last (evaluator.log times each scoring's
    phases): wall time and the table, whose "tok BLEU selected" is the scored epoch of lowest
    validation NLL. An epoch checkpoint stays until it is scored: 14 runs side by side with 4
    evaluators outran their scoring on an H200 machine, and the unscored checkpoints filled its
    64 GiB disk by epoch 9;
 6. with MULTI30K_ORIG=DIR, after step 5 in the same OUT_DIR: the Pre-LN row of step 5 alone on
    GPU 0 (12 epochs), and the aggregate words/s of step 5 against it (target >= 2.5);
 7. with MULTI30K_ORIG=DIR: the depth map's GPU preset (``grid.sh sweep --depth-map --real``: six
    archs x depths 6, 18, 36, 60, 100 x lr 5e-4, 1e-3, 600 updates, fp16; 60 runs, $RUNS_PER_GPU
    side by side) and its map: wall time, the deepest that trains, gradient ratios, CUDA peaks.
    Estimated 1.5-3.5 hours on an H200 (docs/grid.md), not measured: run it alone, resumable.

    [MULTI30K_ORIG=DIR] [SEEDS=S,S] [RUNS_PER_GPU=K] [EVALUATORS=N] [EVAL_EVERY=E] scripts/gpu_check.sh OUT STEP [STEP ...]

Each step is its own call, ``gpu_check.sh OUT 1``, then ``gpu_check.sh OUT 2`` and so on, and resumes:
run the same call again after an interruption (a command killed at a time limit) and what is done
is skipped (the corpus, each training of steps 1, 2 and 4 that ended well, the runs of a grid).
Before anything runs, the modules and programs the steps need are checked (:func:`missing`), and
what is missing is named in one line with the command that installs it. A training that fails is
reported as failed with its log, the others go on, and the call exits 1. :func:`plan` lists what
each step runs; :func:`main` runs it.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fairseq_lnpos.common import GRAD_NORMS_JSONL, open_log, write_text
from fairseq_lnpos.cli import CommandParser
from fairseq_lnpos.errors import LnposError, check, run_main
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.fairseq_log import LogState
from fairseq_lnpos.launch import NO_WARMUP, adam, script, train_cmd
from fairseq_lnpos.variants import GROUPS, VARIANTS, arch_name

PROG = "gpu_check.sh"
TOOLS = Path(__file__).resolve().parent  # scripts/tools: the benchmark and the throughput count
STEPS = range(1, 8)
# step 3: the paper's Post-LN baseline and its Pre-LN run without warm-up (Sec. 4)
GRID_ROWS = ("iwslt-postln-adam-lr5e-4-wu4000", "iwslt-preln-adam-lr5e-4-step8")
PRECISIONS = {"fp32": (), "fp16": ("--fp16",), "amp": ("--amp",)}
TOLERANCE = {"fp16": 0.02, "amp": 0.02}  # step 1: largest relative difference to fp32 that passes


# the Python modules each step imports (beside torch and this package), by the name pip installs them under
ANALYSIS = ("pandas", "scipy", "matplotlib")
SCORING = ("sacrebleu", "sacremoses")
NEEDS = {1: ("fairseq", "sentencepiece"), 2: ("fairseq", "sentencepiece"),
         3: ("fairseq", "sentencepiece", *SCORING, *ANALYSIS), 4: ("fairseq", "sentencepiece", "numpy"),
         5: ("fairseq", "sentencepiece", *SCORING, *ANALYSIS), 6: ("fairseq", "sentencepiece", *SCORING, *ANALYSIS),
         7: ("fairseq", "sentencepiece", *SCORING, *ANALYSIS)}
PROGRAMS = ("fairseq-train",)  # started by steps 1, 2 and the benchmark
# fairseq's distribution for this Python (setup.py): upstream 0.12.2 does not import on Python >= 3.11
FAIRSEQ_PIP = "fairseq-fixed==0.12.3.1" if sys.version_info >= (3, 11) else "fairseq==0.12.2"
PIP_NAMES = {"fairseq": FAIRSEQ_PIP, "torch": "torch"}


def missing(steps, find=importlib.util.find_spec, program=lambda name: Path(script(name)).exists() or
            shutil.which(name)):
    """The modules (by their pip name) and programs that ``steps`` need and this environment lacks."""
    modules = ["torch", *dict.fromkeys(m for s in steps for m in NEEDS[s])]
    lacking = [PIP_NAMES.get(m, m) for m in modules if find(m) is None]
    if FAIRSEQ_PIP in lacking:  # the programs come with fairseq
        return lacking
    return lacking + [p for p in PROGRAMS if not program(p)]


def check_installed(steps, **kw):
    """Refuse, in one line that says what to install, when something the steps need is missing."""
    lacking = missing(steps, **kw)
    if lacking:
        programs = [p for p in lacking if p in PROGRAMS]
        pip = " ".join(f"'{m}'" if "=" in m else m for m in lacking if m not in PROGRAMS) or FAIRSEQ_PIP
        raise LnposError(f"{', '.join(lacking)} {'is' if len(lacking) == 1 else 'are'} not installed for {sys.executable}"
                         f"{' (fairseq-train comes with fairseq)' if programs else ''}: install with "
                         f"{sys.executable} -m pip install {pip} (or everything the project needs: "
                         f"{sys.executable} -m pip install -e . in the repository)")


def m30k_rows():
    """Step 5's rows: the Multi30k rows at lr 5e-4 of the variants of ``variants.GROUPS["gpu_multi30k"]``
    with at most 500 warm-up updates, as the run table lists them."""
    return [r.name for r in R.RUNS if r.dataset == "multi30k" and r not in R.REFERENCE and r.lr == 5e-4
            and r.ln in GROUPS["gpu_multi30k"] and r.warmup <= 500]


def alone_row():
    """Step 6's row: the Pre-LN row of step 5."""
    return next(name for name in m30k_rows() if R.BY_NAME[name].ln == "preln")


@dataclass
class Command:
    """One process of a step. ``log``: its stdout and stderr go to this file; ``show``: only these
    lines of its stdout are printed (("tail", N), ("head", N) or ("from", prefix)), with its stderr
    too when ``merge``; ``timed``: the grid folder whose wall time is written to ``<folder>.seconds``
    when the folder is new (a resumed grid is not timed); ``check``: a failure stops the check (else it
    is reported with its log, the step goes on and the call exits 1); ``stamp``: written when the
    command ended well, and while it exists a later call skips the command."""
    argv: list
    log: Path = None
    show: tuple = None
    merge: bool = False
    timed: Path = None
    check: bool = True
    stamp: Path = None


@dataclass
class Call:
    """A function of this module that reads what the commands before it wrote (and may run one)."""
    fn: object
    args: tuple = ()


def module(name, *args):
    """A module of the package, run by this interpreter."""
    return [sys.executable, "-m", name, *map(str, args)]


def tool(name, *args):
    """A script of ``scripts/tools/`` (beside this one), run by this interpreter."""
    return [sys.executable, str(TOOLS / f"{name}.py"), *map(str, args)]


def plan(out, steps, m30k_orig=None, runs_per_gpu=7, evaluators=1, seeds="1,2", eval_every=1):
    """``[(title, [Command or Call, ...]), ...]``: what ``gpu_check.sh OUT STEP...`` runs, in order
    (a title of None: no heading)."""
    out, syn = Path(out), Path(out) / "syn"
    todo = []
    if set(steps) & {1, 2, 3, 4}:
        todo.append(("synthetic corpus", [Command(module(
            "fairseq_lnpos.data.synthetic", "--out", out / "syn.text", "--bin", syn, "--train", 8000,
            "--workers", 4), show=("tail", 3))]))
    if 1 in steps:
        items = []
        for arch in (arch_name(v, "tiny") for v in GROUPS["gpu_precision"]):
            for prec, flags in PRECISIONS.items():
                name = f"gn-{arch}-{prec}"
                items.append(Command(train_cmd(
                    syn, arch, max_tokens=4096, task="translation_lnpos", model=["--dropout", "0"],
                    optim=["--optimizer", "adam", "--lr", "1e-4"], label_smoothing=None, budget=["--max-update", "1"],
                    seed=1, save_dir=out / name, extra=["--log-grad-norms", "--grad-norm-interval", "1", "--no-save",
                                                       "--fp16-init-scale", "1024", *flags]),
                    log=out / f"{name}.log", check=False, stamp=out / f"{name}.done"))
            items.append(Call(compare_norms, (out, arch)))
        todo.append(("1. gradient norms of update 1: fp32 vs --fp16 vs --amp", items))
    if 2 in steps:
        items = []
        for v in VARIANTS:
            items.append(Command(train_cmd(
                syn, arch_name(v, "tiny"), max_tokens=4096, optim=[*adam(5e-4, "radam"), *NO_WARMUP, "--decay-anchor",
                                                                 "4000"],
                budget=["--max-update", "300"], save_dir=out / f"train-{v}", log_format="json", log_interval=50,
                extra=["--fp16", "--no-save"]), log=out / f"train-{v}.log", check=False,
                stamp=out / f"train-{v}.done"))
            items.append(Call(losses, (v, out / f"train-{v}.log")))
        todo.append(("2. every arch, 300 updates, --fp16, RAdam, no warm-up", items))
    if 3 in steps:
        todo.append(("3. tiny grid on GPU 0 with --fp16", [
            Command(module("fairseq_lnpos.experiments.grid", "run", "--only", ",".join(GRID_ROWS), "--arch-size",
                           "tiny", "--data", syn, "--out", out / "grid", "--gpus", 0, "--fp16", "--max-epoch", 2,
                           "--set", "max_tokens=4096", "--set", "batch_tokens=4096"), show=("tail", 4)),
            Command(module("fairseq_lnpos.experiments.report", out / "grid"), show=("head", 12))]))
    if 4 in steps:
        bench = ("bench", "--device", "cuda", "--data", syn, "--steps", 20, "--reps", 5,
                 "--max-tokens", 4096, "--no-analysis")
        todo.append(("4. throughput ratios on the GPU", [
            Command(tool(*bench, "--sizes", "tiny,iwslt_de_en", "--out", out / "bench-gpu-fp32.json"),
                    show=("tail", 12), stamp=out / "bench-gpu-fp32.done"),
            Command(tool(*bench, "--sizes", "iwslt_de_en", "--fairseq-args=--fp16", "--out",
                           out / "bench-gpu-fp16.json"), show=("tail", 8), stamp=out / "bench-gpu-fp16.done")]))
    if not set(steps) & {5, 6, 7}:
        return todo
    if not m30k_orig:
        todo.append(("5, 6, 7: skipped: set MULTI30K_ORIG=DIR to run the Multi30k grid", []))
        return todo
    m30k, grid = out / "m30k", out / "m30k-grid"
    todo.append((None, [Command(module("fairseq_lnpos.data.multi30k", "--orig", m30k_orig, "--out",
                                             out / "m30k.text", "--bin", m30k, "--workers", 8),
                                      show=("tail", 2), merge=True)]))
    k = runs_per_gpu
    if 5 in steps:
        rows = m30k_rows()
        n = len(rows) * len(str(seeds).split(","))
        todo.append((f"5. Multi30k grid on one GPU: {n} runs (seeds {seeds}), {k} side by side", [
            Command(module("fairseq_lnpos.experiments.grid", "run", "--only", ",".join(rows), "--data", m30k,
                           "--out", grid, "--gpus", 0, "--runs-per-gpu", k, "--evaluators", evaluators, "--fp16",
                           "--seeds", seeds, "--eval-every", eval_every),
                    show=("tail", 3), timed=grid),
            Call(wall_time, (grid, f"for {n} runs with --runs-per-gpu {k}, --evaluators {evaluators}")),
            Command(module("fairseq_lnpos.experiments.report", grid, "--no-figures"), show=("head", 12))]))
    if 6 in steps:
        alone = out / "m30k-alone"
        todo.append(("6. one of those runs alone on the GPU, and the aggregate words/s of step 5 against it", [
            Call(require_timed, (grid, f"no timed step 5 in {out}; run step 5 in a new OUT_DIR first")),
            Command(module("fairseq_lnpos.experiments.grid", "run", "--only", alone_row(), "--data", m30k,
                           "--out", alone, "--gpus", 0, "--fp16"), show=("tail", 3), timed=alone),
            Call(require_timed, (alone, f"{alone} was resumed, not timed; remove it and run step 6 again")),
            Call(throughput, (grid, alone))]))
    if 7 in steps:
        depth = out / "depth-real"
        todo.append((f"7. the depth map on one GPU (grid.sh sweep --depth-map --real), {k} runs side by side", [
            Command(module("fairseq_lnpos.experiments.grid", "sweep", "--depth-map", "--real", "--data", m30k,
                           "--out", depth, "--gpus", 0, "--runs-per-gpu", k), show=("tail", 3), timed=depth),
            Call(wall_time, (depth, "(estimate: 1.5-3.5 hours)")),
            Command(module("fairseq_lnpos.analysis.stability", depth), show=("from", "## Deepest that trains"))]))
    return todo


# ---------------------------------------------------------------- what the steps read back

def compare_norms(out, arch):
    """Step 1: the gradient norms of update 1 under --fp16 and --amp against fp32."""
    norms = {}
    for prec in PRECISIONS:
        path = Path(out) / f"gn-{arch}-{prec}" / GRAD_NORMS_JSONL
        log, stamp = Path(out) / f"gn-{arch}-{prec}.log", Path(out) / f"gn-{arch}-{prec}.done"
        if path.exists() and stamp.exists():
            norms[prec] = json.loads(path.read_text().splitlines()[0])["norms"]
        elif not stamp.exists():
            print(f"{arch} {prec}: FAILED: its training did not end well (see {log})")
        else:
            print(f"{arch} {prec}: FAILED: fairseq-train exited 0 but wrote no gradient norms (see {log})")
    for prec, tol in TOLERANCE.items():
        if prec not in norms or "fp32" not in norms:
            continue
        rel = {k: abs(norms[prec][k] - v) / v for k, v in norms["fp32"].items() if v}
        worst = max(rel, key=rel.get)
        print(f"{arch} {prec}: {len(rel)} groups, total {norms[prec]['total']:.4f} vs fp32 "
              f"{norms['fp32']['total']:.4f}, max rel diff {rel[worst]:.4f} ({worst}) -> "
              f"{'OK' if rel[worst] < tol else 'MISMATCH'}")


def losses(variant, log):
    """Step 2: the training and validation loss of every epoch, from fairseq's log of a training that
    ended well (a failed one is reported by :func:`execute`)."""
    if not Path(f"{Path(log).with_suffix('')}.done").exists():
        print(f"{variant}: FAILED: see {log}")
        return
    state = LogState.of(Path(log).read_text(errors="replace"))
    print(f"{variant}: " + "; ".join(
        f"epoch {e} train_loss {state.train.get(e, {}).get('train_loss', '?')} "
        f"valid_loss {state.valid.get(e, {}).get('valid_loss', '?')}" for e in sorted({*state.train, *state.valid})))


def seconds_of(folder):
    """The wall time written for a timed grid folder, or None."""
    path = Path(f"{folder}.seconds")
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


def wall_time(folder, note):
    if seconds_of(folder) is not None:
        print(f"wall time {seconds_of(folder)} s {note}")


def require_timed(folder, message):
    check(seconds_of(folder) is not None, message)


def throughput(grid, alone):
    """Step 6: the aggregate words/s of the grid against the run alone."""
    execute(Command(tool("throughput", grid, seconds_of(grid), "--alone", alone, seconds_of(alone))))


# ---------------------------------------------------------------- running

def shown(text, show):
    lines = text.splitlines()
    kind, arg = show
    if kind == "tail":
        lines = lines[-arg:]
    elif kind == "head":
        lines = lines[:arg]
    else:
        start = next((i for i, line in enumerate(lines) if line.startswith(arg)), len(lines))
        lines = lines[start:]
    return "".join(line + "\n" for line in lines)


def execute(cmd):
    """Run one :class:`Command` (not when its stamp says it ended well before); a failure raises
    :class:`LnposError` when ``cmd.check``, else it is said with the log and False is returned."""
    if cmd.stamp is not None and cmd.stamp.exists():
        print(f"{cmd.stamp.with_suffix('').name}: done before, skipped ({cmd.stamp} exists)", flush=True)
        return True
    if cmd.stamp is not None:
        cmd.stamp.unlink(missing_ok=True)
    fresh = cmd.timed is None or not cmd.timed.exists()
    if not fresh:
        print(f"{cmd.timed} exists: resuming it, not timing it", flush=True)
        Path(f"{cmd.timed}.seconds").unlink(missing_ok=True)
    start = time.time()
    try:
        code = run(cmd)
    except OSError as e:  # the program is missing (fairseq not installed here) or the log unwritable
        raise LnposError(f"cannot run {cmd.argv[0]}: {e}; install fairseq into this environment, "
                         f"or check that {cmd.log or 'OUT_DIR'} is writable") from None
    if code:
        where = f"see {cmd.log}" if cmd.log else "its messages are above"
        message = f"{' '.join(map(str, cmd.argv[:3]))} ... failed (exit {code}): {where}"
        if cmd.check:
            raise LnposError(message)
        print(f"FAILED: {message}", flush=True)
        return False
    if cmd.timed is not None and fresh:
        write_text(f"{cmd.timed}.seconds", f"{round(time.time() - start)}\n")
    if cmd.stamp is not None:
        write_text(cmd.stamp, f"exit 0 after {round(time.time() - start)} s\n")
    return True


def run(cmd):
    """Start ``cmd`` and wait; its exit status."""
    if cmd.log is not None:
        with open_log(cmd.log, truncate=True) as f:
            return subprocess.run(cmd.argv, stdout=f, stderr=subprocess.STDOUT).returncode
    if cmd.show is not None:
        done = subprocess.run(cmd.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if cmd.merge else None,
                              text=True, errors="replace")
        print(shown(done.stdout, cmd.show), end="", flush=True)
        return done.returncode
    return subprocess.run(cmd.argv).returncode


def parse_steps(words):
    for w in words:
        check(w in {str(s) for s in STEPS}, f"unknown step {w!r}; the steps are 1 to 7")
    check(words, "give the step to run, 1 to 7 (each is its own call and resumes: gpu_check.sh OUT 1, then "
                 "gpu_check.sh OUT 2, ...)")
    return sorted({int(w) for w in words})


def command(argv):
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("out", metavar="OUT_DIR")
    p.add_argument("steps", metavar="STEP", nargs="*", help="1 to 7, each its own call")
    a = p.parse_args(argv)
    steps = parse_steps(a.steps)
    env = os.environ
    todo = plan(a.out, steps, env.get("MULTI30K_ORIG"), env.get("RUNS_PER_GPU", "7"), env.get("EVALUATORS", "1"),
                env.get("SEEDS", "1,2"), env.get("EVAL_EVERY", "1"))
    check_installed(steps)
    import torch

    check(torch.cuda.is_available(), f"torch {torch.__version__} sees no GPU here: run it on a machine with CUDA")
    print(torch.__version__, torch.cuda.get_device_name(0))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    failed = 0
    for title, items in todo:
        if title is not None:
            print(f"== {title}", flush=True)
        for item in items:
            if isinstance(item, Call):
                item.fn(*item.args)
            elif execute(item) is False:
                failed += 1
    if failed:
        print(f"{failed} command(s) failed: their logs are named above", flush=True)
    return 1 if failed else 0


def main(argv=None):
    """The command: one line and exit 2 for bad input or no GPU, 130 when interrupted."""
    return run_main(PROG, command, argv)


if __name__ == "__main__":
    sys.exit(main())
