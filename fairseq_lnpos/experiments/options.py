"""The options of the grid's commands, one dataclass each: :class:`RunOptions` (``grid.sh run``),
:class:`SweepOptions`, :class:`SlurmOptions`, :class:`StatusOptions` and :class:`ListOptions`.

A field made with :func:`option` is also a command-line option: its parser is generated from the
fields (:meth:`Options.add_to`, the pattern of fairseq's ``gen_parser_from_dataclass``, with the
argparse types, metavars and appending options the grid needs), :meth:`Options.from_namespace`
reads the parsed command line back as the dataclass and :func:`to_argv` writes options back as a
command line (the per-run unit of a SLURM task). Python callers build the dataclass directly,
e.g. ``RunOptions(only="iwslt-*", out="grid-out")``. Values derived from the options (``world``,
a sweep's preset) are computed here.
"""
import argparse
import math
import re
from dataclasses import MISSING, dataclass, field
from typing import List, Optional

from ..cli import CommandParser, Options, comma_list_type, finite_float, option, whole_number
from ..common import one_line
from ..errors import LnposError
from .sweep import ALL_MAP, DEPTH_MAP, DEPTH_MAP_REAL, PRESETS, STABILITY_MAP


TIME = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)")
NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a SLURM partition or account name


def parse_time(text):
    """SLURM's [D-]HH:MM:SS as seconds."""
    m = TIME.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: give HH:MM:SS or D-HH:MM:SS, e.g. 24:00:00")
    d, h, mi, s = (int(x or 0) for x in m.groups())
    secs = ((d * 24 + h) * 60 + mi) * 60 + s
    if secs < 60:
        raise argparse.ArgumentTypeError(f"--time {text}: give at least 00:01:00")
    return secs


def slurm_name(text):
    """A SLURM partition or account name: letters, digits, ``_``, ``.`` and ``-``."""
    if not NAME.fullmatch(text):
        raise ValueError(text)
    return text


def slurm_names(option, several):
    """argparse type of a SLURM name (``several``: a comma-separated list of them, as sbatch takes
    partitions, read by :func:`~fairseq_lnpos.cli.comma_list`)."""
    if several:
        return comma_list_type(slurm_name, what=f"a SLURM {option} name (letters, digits, '_', '.' and '-')")

    def parse(text):
        try:
            return slurm_name(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{one_line(text)} is not a SLURM {option} name: letters, digits, '_', '.' and '-'") from None
    return parse


# ---------------------------------------------------------------- the commands' options

@dataclass
class Selection(Options):
    """The options that pick the runs of the table (``run`` and ``slurm``)."""
    only: Optional[str] = option(help="comma-separated run names or globs (default: every run)")
    max_epoch: Optional[int] = option(type=whole_number(1), help="override the epochs of every run")


@dataclass
class RunFields(Options):
    """The options of ``run`` besides the selection (``sweep`` and ``slurm`` share them)."""
    dry_run: bool = option(False, "print the fairseq commands and exit")
    data: Optional[List[str]] = option(
        action="append", metavar="[DATASET=]DIR",
        help="binarized data dir for every run, or per dataset (iwslt14=DIR, multi30k=DIR, wmt14=DIR)")
    out: str = option("grid-out", "output folder (default %(default)s)")
    seeds: str = option("1", "comma-separated seeds (default 1, fairseq's default)")
    arch_size: str = option("paper", "tiny: the transformer_*_tiny archs (CPU)", choices=("paper", "tiny"))
    arch: Optional[str] = option(help="use this fairseq arch for every run (overrides --arch-size)")
    set: Optional[List[str]] = option(
        action="append", metavar="[RUN:]KEY=VALUE",
        help="change a field of the run table (runs.py) for every selected run or one run")
    task: Optional[str] = option(help="fairseq task for every run (e.g. translation_lnpos)")
    fairseq_args: str = option("", "extra fairseq-train flags, one string", action="flags", metavar="FLAGS")
    gen_args: str = option("", "extra fairseq-generate flags, one string", action="flags", metavar="FLAGS")
    beam: Optional[int] = option(
        type=whole_number(1), help="beam size for every run (default: the run's, 5 for the paper)")
    lenpen: Optional[float] = option(
        type=finite_float, help="length penalty for every run (default: the run's, 1.2 for the paper)")
    average_last: Optional[int] = option(
        type=whole_number(0), metavar="N",
        help="also score the parameter average of each run's last N epoch checkpoints "
             "(default: the run's, 10 for the ref-* rows, else 0 = none)")
    uncapped_len: bool = option(
        False, "score with fairseq's default output length (200 tokens) instead of 1.2 x source + 10")
    eval_every: int = option(1, "score the test set every N epochs (and always the last; default 1)",
                             type=whole_number(1), metavar="N")
    evaluators: int = option(1, "scoring processes per device, taking checkpoints from one queue (default 1)",
                             type=whole_number(1), metavar="N")
    no_bleu: bool = option(False, "no test BLEU: validation loss only")
    patience: int = option(
        0, "stop a run as diverged when its training loss stays above its first loss for N "
           "logged updates (0: only a non-finite loss counts; default %(default)s)", type=whole_number(0), metavar="N")
    early_stop: bool = option(
        False, "stop a run whose training loss has stalled well above what a run that trains reaches "
               "(recorded as 'stopped early'; early_stop.py; a sweep on the generated corpus does this by default, a "
               "--real sweep does not: docs/results/early-stopping)")
    gpus: Optional[str] = option(help="GPU ids, e.g. 0,1: runs side by side on them")
    runs_per_gpu: int = option(1, "with --gpus: K runs at once on each GPU (group); default 1",
                               type=whole_number(1), metavar="K")
    jobs: int = option(1, "CPU only: runs side by side, sharing the cores", type=whole_number(1))
    fork_server: bool = option(
        True, "start each CPU run's fairseq-train as a process of its own (default: forked from one process "
              "per slot that imported fairseq once; forkserver.py)", flag="--no-fork-server")
    gpus_per_run: int = option(1, "GPUs per run (fairseq distributed); --update-freq keeps the paper's batch",
                               type=whole_number(1))
    fp16: bool = option(False, "mixed precision (GPU only)")
    cpu_bf16: bool = option(
        False, "bfloat16 mixed precision on the CPU: the task's --cpu-autocast-bf16 (matmuls in bfloat16, weights "
               "and optimizer state float32; a CPU with AVX-512 BF16 or AMX; precision.py; not faster at the tiny "
               "and IWSLT sizes where measured: docs/results/cpu-bf16-speed)")
    log_interval: int = option(1, "fairseq --log-interval (1: divergence is located to the update)",
                               type=whole_number(1))
    keep_checkpoints: bool = option(False, "keep checkpointN.pt after scoring (default: keep only _best and _last)")
    final_validation_only: bool = False  # a sweep's (commands.Job.unread_work_args); not an option of run

    @property
    def world(self):
        """GPUs of one run (1 on the CPU): fairseq's --distributed-world-size on a node, and the
        GPUs one update's batch is split over."""
        return max(self.gpus_per_run, 1)


@dataclass
class RunOptions(RunFields, Selection):
    """``grid.sh run``: train and score the selected runs."""
    extend: bool = option(
        False, "continue the finished runs whose config differs only in more epochs (--max-epoch) from their "
               "last checkpoint; their scored epochs stay (rundir.RunDir.extend)")


def run_parser(prog="grid.sh run"):
    """The parser of ``grid.sh run`` alone (the per-run unit of a SLURM task parses with it)."""
    p = CommandParser(prog=prog, description="train and score runs (or print their commands with --dry-run)")
    return RunOptions.add_to(p)


def _describe(preset):
    return ", ".join(f"{k.replace('_', '-')} {v}" for k, v in preset.items() if v is not None)


def _runs(preset):
    """How many runs a preset's map is: its archs x learning rates x warm-ups x depths x seeds."""
    return math.prod(len(str(preset[axis]).split(",")) for axis in ("archs", "lr", "warmup", "layers", "seeds"))


@dataclass
class SweepAxes(Options):
    """The options of ``grid.sh sweep`` besides the grid's own; the axes default to the preset's."""
    archs: Optional[str] = option(help="variants (default: %s)" % STABILITY_MAP["archs"])
    lr: Optional[str] = option(help="learning rates (default: %s)" % STABILITY_MAP["lr"])
    warmup: Optional[str] = option(help="warm-up updates, 1 = none (default: %s)" % STABILITY_MAP["warmup"])
    layers: Optional[str] = option(help="encoder = decoder depths (default: %s)" % STABILITY_MAP["layers"])
    max_update: Optional[int] = option(
        type=whole_number(1), help="the budget of every cell, in updates (default: %s)" % STABILITY_MAP["max_update"])
    width: Optional[int] = option(type=whole_number(1), help="model width d (embeddings d, FFN 4d; default: the size's own)")
    real: bool = option(
        False, "the paper's IWSLT model on Multi30k (one GPU) instead of the tiny model on the generated corpus")
    depth_map: bool = option(
        False, f"the depth map: defaults {_describe(DEPTH_MAP)}; with --real {_describe(DEPTH_MAP_REAL)}, "
               f"--fp16; logs per-layer gradient norms (the stability map's defaults: {_describe(STABILITY_MAP)})")
    all_archs: bool = option(
        False, f"the map of every architecture (CPU): defaults {_describe(ALL_MAP)}; {_runs(ALL_MAP)} runs "
               f"(their CPU time: docs/results/all-archs/index.md)")
    checkpoint_activations: bool = option(
        False, "fairseq's --checkpoint-activations for every cell (less memory; activations are "
               "recomputed in the backward pass)")
    # the default (no BLEU) is SweepOptions'
    no_bleu: bool = option(help="also score test BLEU (the last epoch)", flag="--bleu", action="store_false")
    # the default (on, off with --real) is SweepOptions'
    early_stop: Optional[bool] = option(
        help="run every cell to its budget: do not stop runs whose training loss has stalled (early_stop.py; "
             "on by default on the generated corpus, off with --real: on real text it stopped runs that went on "
             "to train, docs/results/early-stopping/index.md)", flag="--no-early-stop", action="store_false")
    # the default (the last update only) is SweepOptions'
    final_validation_only: bool = option(
        help="also validate at every epoch's end (default without --bleu: at the last update only, the "
             "validation the map reads)", flag="--validate-each-epoch", action="store_false")


@dataclass
class SweepOptions(RunFields, SweepAxes):
    """``grid.sh sweep`` (sweep.py). The preset (``--real``, ``--depth-map``, ``--all-archs``) fills the
    axes not given, and sets ``arch_size`` and, for the depth map on a GPU, ``fp16``."""
    out: str = "sweep-out"
    patience: int = 50
    no_bleu: bool = True
    early_stop: Optional[bool] = None  # the preset's: on, off with --real; --early-stop / --no-early-stop win
    final_validation_only: bool = True
    seeds: Optional[str] = option(help=(
        "comma-separated seeds of every cell (default: %s, %d runs; the depth map's: %s, %d runs; with --real %s; "
        "--all-archs: %s, %d runs)" % (STABILITY_MAP["seeds"], _runs(STABILITY_MAP), DEPTH_MAP["seeds"],
                                      _runs(DEPTH_MAP), DEPTH_MAP_REAL["seeds"], ALL_MAP["seeds"], _runs(ALL_MAP))))
    arch_size: str = None  # the preset's; given, it must be the preset's

    def __post_init__(self):
        # the cells' architectures are --archs at the preset's size: an option that would replace them is refused
        if self.arch is not None:
            raise LnposError(f"--arch {self.arch}: a sweep trains the architectures of --archs, and --arch would "
                             f"replace every one of them: drop --arch (give the variants with --archs)")
        preset = PRESETS["real" if self.real else "laptop"]["arch_size"]
        if self.arch_size not in (None, preset):
            raise LnposError(f"--arch-size {self.arch_size}: this sweep's cells are of size {preset} "
                             f"({'--real' if self.real else 'without --real'}): drop --arch-size")
        if self.all_archs and self.depth_map:
            raise LnposError("--all-archs and --depth-map are two presets: give one (--depth-map --archs ... "
                             "puts other architectures on the depth map)")
        if self.all_archs and self.real:
            raise LnposError("--all-archs is a CPU map (the tiny model on the generated corpus): drop --real, or "
                             "train every architecture on Multi30k with grid.sh run --only 'real-*'")
        defaults = ((DEPTH_MAP_REAL if self.real else DEPTH_MAP) if self.depth_map
                    else ALL_MAP if self.all_archs else STABILITY_MAP)
        for key, value in defaults.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        self.arch_size = preset
        self.fp16 = self.fp16 or (self.depth_map and self.real)
        if self.early_stop is None:
            self.early_stop = not self.real


@dataclass
class SlurmFields(Options):
    """The options of ``grid.sh slurm`` beyond those of ``grid.sh run`` (they replace its --gpus-per-run
    and --dry-run)."""
    partition: Optional[str] = option(help="SLURM partition (or several, comma-separated)", required=True,
                                      type=slurm_names("partition", several=True))
    time: Optional[int] = option(
        required=True, type=parse_time, metavar="HH:MM:SS",
        help="time limit of one task; a task stopped at the limit requeues itself and resumes")
    gpus_per_run: int = option(1, "GPUs per node of one run, --gres=gpu:G (0: a CPU run; default 1)",
                               type=whole_number(0), metavar="G")
    nodes_per_run: int = option(1, "nodes of one run (N > 1: fairseq's multi-node training, GPUs only)",
                                type=whole_number(1), metavar="N")
    cpus_per_run: Optional[int] = option(help="--cpus-per-task (default: 2 on the CPU, 4 per GPU)",
                                         type=whole_number(1), metavar="C")
    account: Optional[str] = option(help="SLURM account", type=slurm_names("account", several=False))
    max_running: Optional[int] = option(help="at most K tasks at once (%%K)", type=whole_number(1), metavar="K")
    dry_run: bool = option(False, "write the script and its task list into OUT and print the script; submit nothing")
    argv: List[str] = field(default_factory=list)  # the command line as given, named in the script


@dataclass
class SlurmOptions(SlurmFields, RunFields, Selection):
    """``grid.sh slurm`` (slurm.py): the runs as one SLURM job array of ``grid.sh run`` units."""


@dataclass
class StatusOptions(Options):
    """``grid.sh status``."""
    out_dir: str = option(MISSING, "the --out folder of run or slurm", positional=True)


@dataclass
class MigrateOptions(Options):
    """``grid.sh migrate``."""
    out_dir: str = option(MISSING, "an --out folder written by an earlier version of the grid", positional=True)


@dataclass
class ListOptions(Options):
    """``grid.sh list``."""
    arch_size: str = option("paper", choices=("paper", "tiny"))
    wide: bool = option(False, "every column: arch, optimizer, lr, schedule, the paper's words, the source")
