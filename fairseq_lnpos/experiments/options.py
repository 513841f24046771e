"""The options of ``grid.sh run`` (``sweep`` and ``slurm`` take them too): their definitions, the
parser of the per-run unit and the options with their defaults for Python callers.

grid.py builds the whole command line from these; slurm.py passes them on to every task.
"""
import argparse

from ..errors import CommandParser, finite_float


def positive_int(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is too small: give at least {minimum}")
        return value
    return parse


def add_selection_options(p):
    """The options that pick the runs of the table: ``--only`` and ``--max-epoch`` (``run`` and ``slurm``)."""
    p.add_argument("--only", help="comma-separated run names or globs (default: every run)")
    p.add_argument("--max-epoch", type=positive_int(1), help="override the epochs of every run")


def add_run_options(r):
    """The options of ``run`` (``sweep`` shares them)."""
    r.add_argument("--dry-run", action="store_true", help="print the fairseq commands and exit")
    r.add_argument("--data", action="append", metavar="[DATASET=]DIR",
                   help="binarized data dir for every run, or per dataset (iwslt14=DIR, multi30k=DIR, wmt14=DIR)")
    r.add_argument("--out", default="grid-out", help="output folder (default grid-out)")
    r.add_argument("--seeds", default="1", help="comma-separated seeds (default 1, fairseq's default)")
    r.add_argument("--arch-size", choices=("paper", "tiny"), default="paper",
                   help="tiny: the transformer_*_tiny archs (CPU)")
    r.add_argument("--arch", help="use this fairseq arch for every run (overrides --arch-size)")
    r.add_argument("--set", action="append", metavar="[RUN:]KEY=VALUE",
                   help="change a field of the run table (runs.py) for every selected run or one run")
    r.add_argument("--task", help="fairseq task for every run (e.g. translation_lnpos)")
    r.add_argument("--fairseq-args", default="", help="extra fairseq-train flags, one string")
    r.add_argument("--gen-args", default="", help="extra fairseq-generate flags, one string")
    r.add_argument("--beam", type=positive_int(1), help="beam size for every run (default: the run's, 5 for the paper)")
    r.add_argument("--lenpen", type=finite_float, help="length penalty for every run (default: the run's, 1.2 for the paper)")
    r.add_argument("--average-last", type=positive_int(0), metavar="N",
                   help="also score the parameter average of each run's last N epoch checkpoints "
                        "(default: the run's, 10 for the ref-* rows, else 0 = none)")
    r.add_argument("--uncapped-len", action="store_true",
                   help="score with fairseq's default output length (200 tokens) instead of 1.2 x source + 10")
    r.add_argument("--eval-every", type=positive_int(1), default=1, metavar="N",
                   help="score the test set every N epochs (and always the last; default 1)")
    r.add_argument("--evaluators", type=positive_int(1), default=1, metavar="N",
                   help="scoring processes per device, taking checkpoints from one queue (default 1)")
    r.add_argument("--no-bleu", action="store_true", help="no test BLEU: validation loss only")
    r.add_argument("--patience", type=positive_int(0), default=0, metavar="N",
                   help="stop a run as diverged when its training loss stays above its first loss for N "
                        "logged updates (0: only a non-finite loss counts; default 0)")
    r.add_argument("--gpus", help="GPU ids, e.g. 0,1: runs side by side on them")
    r.add_argument("--runs-per-gpu", type=positive_int(1), default=1, metavar="K",
                   help="with --gpus: K runs at once on each GPU (group); default 1")
    r.add_argument("--jobs", type=positive_int(1), default=1,
                   help="CPU only: runs side by side, sharing the cores")
    r.add_argument("--gpus-per-run", type=positive_int(1), default=1,
                   help="GPUs per run (fairseq distributed); --update-freq keeps the paper's batch")
    r.add_argument("--fp16", action="store_true", help="mixed precision (GPU only)")
    r.add_argument("--log-interval", type=positive_int(1), default=1,
                   help="fairseq --log-interval (1: divergence is located to the update)")
    r.add_argument("--keep-checkpoints", action="store_true",
                   help="keep checkpointN.pt after scoring (default: keep only _best and _last)")


def run_parser(prog="grid.sh run"):
    """The parser of ``grid.sh run`` alone (the per-run unit of a SLURM task parses with it)."""
    p = CommandParser(prog=prog, description="train and score runs (or print their commands with --dry-run)")
    add_selection_options(p)
    add_run_options(p)
    return p


def run_options(**values):
    """The options of ``grid.sh run`` with their defaults, changed by ``values`` (Python callers)."""
    opts = run_parser().parse_args([])
    unknown = set(values) - set(vars(opts))
    if unknown:
        raise TypeError(f"unknown grid options: {', '.join(sorted(unknown))}")
    vars(opts).update(values)
    return opts
