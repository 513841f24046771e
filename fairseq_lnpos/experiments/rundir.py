"""One run's folder: ``OUT/NAME/seedS/``.

    config.json       everything that determines the results, and its hash
    train.log         fairseq-train's output, every launch appended (``# grid: <command>`` first)
    checkpoints/      fairseq's --save-dir (checkpoint_last.pt for resuming; checkpointN.pt until scored)
    eval/epochN.json  validation loss of epoch N (fairseq's), test BLEU when that epoch was scored
    eval/epochN.hyp   the hypotheses that were scored
    eval/average.json the average of the last N epoch checkpoints (--average-last N) scored, and .hyp
    TRAINED           fairseq-train finished
    DONE.json         written last, the outcome: finished, diverged at update N, or failed: WHY;
                      a finished or diverged run is never redone, a failed one is retried; also
                      the first training loss, updates, training time, final validation loss and
                      peak memory (peak_rss_mb, cuda_peak_mb: absent in older runs, null unknown)
                      and training CPU time (train_cpu_seconds: likewise)
    .lock             held (flock) while a grid works on the run

Every JSON file is written atomically. Every state file is checked for shape where it is read,
here (:data:`SHAPES`): a file that exists but cannot be read, or holds something else than the grid
writes (``null``, a list, a missing or mistyped field), is an error naming the path and what to do
(:class:`~fairseq_lnpos.errors.StateError`), never taken as absent.

The output folder (``--out``) holds the run folders, ``progress.log``, ``evaluator.log``, the SLURM
files (``slurm-ID.sbatch``, ``slurm-ID.tasks``) and :data:`GRID_MARKER`, which makes it a grid's: the
grid writes into no other folder that holds something (a folder with a SLURM task list is a grid's too).
"""
import dataclasses
import enum
import fcntl
import os
import re
from pathlib import Path

from ..common import hold_lock, read_json, read_lines, write_json, write_text
from ..errors import LnposError, StateError
from .runs import Run

EPOCH_FILE = re.compile(r"^epoch(\d+)\.json$")
CHECKPOINT_FILE = re.compile(r"^checkpoint(\d+)\.pt$")
GRID_MARKER = ".lnpos-grid"


def run_dirs(out):
    """The run folders ``out/NAME/seedS`` (those with a config.json), sorted by path."""
    return [RunDir(p.parent) for p in sorted(Path(out).glob("*/seed*/config.json"))]


def grid_run_dirs(out, what, keep=None, queued=()):
    """The run folders of ``out`` (those that ``keep`` keeps); an error when ``out`` is no folder or
    holds none (and no ``queued`` run either). ``what``: the folder to give instead, for the message."""
    out = Path(out)
    if not out.is_dir():
        raise LnposError(f"{out} is not a folder: give {what}")
    found = [rd for rd in run_dirs(out) if keep is None or keep(rd)]
    if not found and not queued:
        raise LnposError(f"no runs in {out} (no NAME/seedS/ with config.json"
                         + (" and train.log" if keep else "") + f"): give {what}")
    return found


# ---------------------------------------------------------------- the output folder

def is_grid_dir(out):
    """Is ``out`` a grid's output folder (its marker, a run folder or a SLURM task list in it)?"""
    out = Path(out)
    return (out / GRID_MARKER).exists() or bool(run_dirs(out)) or any(out.glob("slurm-*.tasks"))


def check_out_dir(out):
    """Refuse an --out that is a file, or a folder that holds something and is not a grid's."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LnposError(f"--out {out} is a file: give a folder (it is created when missing)")
    if out.is_dir() and any(out.iterdir()) and not is_grid_dir(out):
        raise LnposError(f"--out {out} is not empty and not a grid's output folder (no {GRID_MARKER}, no "
                         f"NAME/seedS/config.json): give a new or empty folder; nothing was written")


def make_out_dir(out):
    """Create ``out`` (after :func:`check_out_dir`) and mark it as a grid's."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not (out / GRID_MARKER).exists():
            write_text(out / GRID_MARKER, "A grid's output folder (fairseq_lnpos: scripts/grid.sh run, sweep, "
                                          "slurm write into it).\n")
    except OSError as e:
        raise LnposError(f"--out {out}: cannot create it ({e.strerror}): give a writable folder") from None
    return out


# ---------------------------------------------------------------- the shape of each state file

@dataclasses.dataclass(frozen=True)
class Kind:
    """A JSON value's expected kind: ``name`` for messages, ``test(value)``."""
    name: str
    test: object

    def __call__(self, value):
        return self.test(value)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


INT = Kind("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER = Kind("a number", _number)
STRING = Kind("a string", lambda v: isinstance(v, str))
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))


def optional(kind):
    return Kind(f"{kind.name} or null", lambda v: v is None or kind(v))


def list_of(kind):
    return Kind(f"a list of {kind.name.split(' ', 1)[1]}s", lambda v: isinstance(v, list) and all(map(kind, v)))


def _run_fields():
    """The fields of a recorded run (``runs.Run``): required where Run has no default."""
    kinds = {"str": STRING, "float": NUMBER, "int": INT, "bool": BOOL, "tuple": list_of(STRING)}
    shape = {}
    for f in dataclasses.fields(Run):
        kind = kinds[f.type if isinstance(f.type, str) else f.type.__name__]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        shape[f.name] = (optional(kind) if f.default is None else kind, required)
    return shape


RUN_DEFAULTS = {k: v for k, v in Run(name="", dataset="", ln="", optimizer="", lr=0.0).as_dict().items()
                if k not in ("name", "dataset", "ln", "optimizer", "lr")}
# file -> {field: (kind, required)}; fields not listed are not read, so not checked
SHAPES = {
    "config.json": {"hash": (STRING, True), "seed": (INT, True), "arch": (STRING, True), "run": (OBJECT, True),
                    "data": (STRING, False), "fp16": (BOOL, False), "fairseq_args": (STRING, False),
                    "beam": (INT, False), "lenpen": (NUMBER, False), "gen_args": (list_of(STRING), False)},
    "run": _run_fields(),
    "DONE.json": {"status": (STRING, True), "diverged_at": (optional(INT), False), "epochs": (list_of(INT), False),
                  "initial_loss": (optional(NUMBER), False), "updates": (INT, False),
                  "train_seconds": (NUMBER, False), "train_cpu_seconds": (optional(NUMBER), False),
                  "final_valid_loss": (optional(NUMBER), False),
                  "peak_rss_mb": (optional(NUMBER), False), "cuda_peak_mb": (optional(NUMBER), False)},
    "epochN.json": {"epoch": (INT, True), "num_updates": (optional(INT), False),
                    **{k: (optional(NUMBER), False) for k in ("valid_loss", "valid_nll_loss", "train_loss", "lr",
                                                              "bleu_tok", "sacrebleu")},
                    "eval_seconds": (NUMBER, False), "n_sentences": (INT, False),
                    "sacrebleu_signature": (STRING, False)},
    "average.json": {"epochs": (list_of(INT), True), "average_last": (INT, True), "bleu_tok": (NUMBER, True),
                     "sacrebleu": (optional(NUMBER), False), "eval_seconds": (NUMBER, False),
                     "n_sentences": (INT, False), "sacrebleu_signature": (STRING, False)},
}
OUTCOME = re.compile(r"^(?:(finished)|(diverged) at update \d+|(failed): .*)$", re.S)


def _shape_error(path, what, problem, what_to_do):
    return StateError(f"{path} is not {what} the grid writes ({problem}): {what_to_do}")


def check_shape(obj, shape, path, what, what_to_do, where=""):
    """``obj`` (read from ``path``) as ``shape`` of :data:`SHAPES` says, else :class:`StateError`."""
    if not isinstance(obj, dict):
        raise _shape_error(path, what, f"it holds {_short(obj)}, not an object", what_to_do)
    for key, (kind, required) in shape.items():
        if key not in obj:
            if required:
                raise _shape_error(path, what, f"no '{where}{key}'", what_to_do)
        elif not kind(obj[key]):
            raise _shape_error(path, what, f"'{where}{key}' is {_short(obj[key])}, not {kind.name}", what_to_do)
    return obj


def read_checked(path, shape, what, what_to_do):
    """The JSON object in ``path`` checked against ``SHAPES[shape]``; None when there is no file."""
    obj = read_json(path, missing_ok=True, what_to_do=what_to_do)
    if obj is None and not Path(path).exists():
        return None
    return check_shape(obj, SHAPES[shape], path, what, what_to_do)


def _short(value):
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Status(enum.Enum):
    """Where a run stands: the outcome its DONE.json records, or, without one, whether it started."""
    FINISHED = "finished"
    DIVERGED = "diverged"
    FAILED = "failed"            # a re-run retries it
    UNFINISHED = "unfinished"    # running, or stopped before its outcome (a re-run resumes it)
    NOT_STARTED = "not started"

    @property
    def final(self):
        """A finished or diverged run is never redone."""
        return self in (Status.FINISHED, Status.DIVERGED)


def outcome(done):
    """:class:`Status` finished, diverged or failed: the outcome of a (checked) DONE.json record."""
    return Status(next(g for g in OUTCOME.match(done["status"]).groups() if g))


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run as its folder records it (:meth:`RunDir.record`), every file checked."""
    dir: "RunDir"
    config: dict          # config.json; the fields its run lacks are Run's defaults
    status: Status
    state: str            # the status in words: DONE.json's ("diverged at update 40", "failed: WHY"),
    #                       "running", "interrupted after epoch N" or "not started"
    done: dict = None     # DONE.json
    evals: list = ()      # eval/epochN.json, in epoch order
    average: dict = None  # eval/average.json

    @property
    def run(self):
        return self.config["run"]

    @property
    def name(self):
        return self.run["name"]

    @property
    def seed(self):
        return self.config["seed"]

    def last(self, key):
        """``key`` of the latest epoch record where it is not null, or None."""
        found = [e[key] for e in self.evals if e.get(key) is not None]
        return found[-1] if found else None

    @property
    def final_valid_loss(self):
        """DONE.json's final validation loss, else the last epoch's (None: none recorded)."""
        final = (self.done or {}).get("final_valid_loss")
        return self.last("valid_loss") if final is None else final

    @property
    def scored(self):
        """The epoch records with a test BLEU, in epoch order."""
        return [e for e in self.evals if e.get("bleu_tok") is not None]

    @property
    def best(self):
        """The epoch record of the best test BLEU (the earliest of equals), None when none was scored."""
        return max(self.scored, key=lambda e: (e["bleu_tok"], -e["epoch"]), default=None)

    @property
    def best_valid_loss(self):
        losses = [e["valid_loss"] for e in self.evals if e.get("valid_loss") is not None]
        return min(losses) if losses else None


def read_tasks(path):
    """[(run, seed, fairseq args)] of a ``slurm-ID.tasks`` file, one tab-separated task a line."""
    tasks = []
    for i, line in enumerate(read_lines(path), 1):
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
            raise StateError(f"{path}, line {i}: {_short(line)} is not RUN<tab>SEED<tab>FAIRSEQ-ARGS as grid.sh "
                             f"slurm writes it: delete the file, or submit the grid again to rewrite it")
        tasks.append((parts[0], int(parts[1]), parts[2]))
    return tasks


def tasks_text(tasks):
    """The text of a ``slurm-ID.tasks`` file for [(run, seed, fairseq args)]."""
    return "".join(f"{name}\t{seed}\t{fargs}\n" for name, seed, fargs in tasks)


class RunDir:
    def __init__(self, path):
        self.path = Path(path)
        self.config_path = self.path / "config.json"
        self.done_path = self.path / "DONE.json"
        self.trained_path = self.path / "TRAINED"
        self.log_path = self.path / "train.log"
        self.save_dir = self.path / "checkpoints"
        self.eval_dir = self.path / "eval"
        self.lock_path = self.path / ".lock"

    def __repr__(self):
        return f"RunDir({str(self.path)!r})"

    def _redo(self):
        return f"delete {self.path} to redo that run"

    # config -------------------------------------------------------------------
    def config(self):
        """The recorded config (checked, :data:`SHAPES`; fields of its run that it lacks are Run's
        defaults), None when there is none yet."""
        what_to_do = f"delete {self.path} to redo that run, or move it out of {self.path.parent.parent} if it is no run"
        cfg = read_checked(self.config_path, "config.json", "a run's config", what_to_do)
        if cfg is not None:
            check_shape(cfg["run"], SHAPES["run"], self.config_path, "a run's config", what_to_do, where="run.")
            cfg["run"] = {**RUN_DEFAULTS, **cfg["run"]}
        return cfg

    def check_config(self, config_hash):
        """Refuse a folder that holds another config (results are not mixed)."""
        old = self.config()
        if old is not None and old["hash"] != config_hash:
            raise LnposError(
                f"{self.path} was made with a different config (hash {old['hash']} != {config_hash}): "
                f"use another --out or delete that folder; results are not mixed")

    def claim(self, config, config_hash):
        """Record ``config`` (after :meth:`check_config`); a folder that holds files of a run but no
        config.json (its folder was removed and partly made again) is refused."""
        self.check_config(config_hash)
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists() and any(p.name not in (".lock", "eval") for p in self.path.iterdir()):
            raise StateError(f"{self.path} holds files but no config.json (was the folder removed while a run "
                             f"was going on?): {self._redo()}")
        self.eval_dir.mkdir(exist_ok=True)
        write_json(self.config_path, {"hash": config_hash, **config})

    def check_intact(self, config_hash):
        """The folder still holds this run (its config.json and train.log): not removed or replaced
        while the run was going on."""
        for path in (self.config_path, self.log_path):
            if not path.exists():
                raise StateError(f"{path} is gone: the run folder was removed while the run was going on; "
                                 f"{self._redo()}")
        self.check_config(config_hash)

    def check(self):
        """Read (and so check) every state file of the run; returns the config or None."""
        cfg = self.config()
        self.done()
        self.evals()
        return cfg

    def record(self):
        """The run as recorded (:class:`RunRecord`); :class:`StateError` when a file cannot be read
        or the folder holds no config.json."""
        cfg = self.config()
        if cfg is None:
            raise StateError(f"{self.config_path} is missing: {self.path} is not a run folder of the grid; move it away")
        evals, done = self.evals(), self.done()
        if done is not None:
            status, state = outcome(done), done["status"]
        elif self.locked():
            status, state = Status.UNFINISHED, "running"
        elif evals:
            status, state = Status.UNFINISHED, f"interrupted after epoch {evals[-1]['epoch']}"
        else:
            status, state = Status.NOT_STARTED, "not started"
        return RunRecord(self, cfg, status, state, done, evals, self.average())

    # markers ------------------------------------------------------------------
    def done(self):
        """The outcome record (checked, :data:`SHAPES` and :data:`OUTCOME`), None when there is none."""
        what_to_do = f"delete it and run the grid again to rewrite it (or {self._redo()})"
        done = read_checked(self.done_path, "DONE.json", "an outcome record", what_to_do)
        if done is not None and not OUTCOME.match(done["status"]):
            raise _shape_error(self.done_path, "an outcome record", f"status {_short(done['status'])} is none of "
                               f"'finished', 'diverged at update N', 'failed: WHY'", what_to_do)
        return done

    def outcome(self):
        """:class:`Status` finished, diverged or failed (:func:`outcome`), or None when the run has no outcome yet."""
        done = self.done()
        return None if done is None else outcome(done)

    def write_done(self, record):
        write_json(self.done_path, record)

    def write_failed(self, reason):
        """Record that the run failed (a re-run retries it)."""
        write_json(self.done_path, {"status": f"failed: {reason}"})

    @property
    def trained(self):
        return self.trained_path.exists()

    def mark_trained(self):
        self.trained_path.write_text("")

    # evaluations --------------------------------------------------------------
    def eval_path(self, epoch):
        return self.eval_dir / f"epoch{epoch}.json"

    def hyp_path(self, epoch):
        return self.eval_dir / f"epoch{epoch}.hyp"

    def checkpoint(self, epoch):
        return self.save_dir / f"checkpoint{epoch}.pt"

    def epoch_checkpoints(self):
        """(epoch, path) of every checkpointN.pt in the save dir."""
        if not self.save_dir.is_dir():
            return []
        return sorted((int(m.group(1)), p) for p in self.save_dir.iterdir() if (m := CHECKPOINT_FILE.match(p.name)))

    def has_eval(self, epoch):
        return self.eval_path(epoch).exists()

    def write_eval(self, epoch, record):
        write_json(self.eval_path(epoch), record)

    def eval(self, epoch):
        """eval/epochN.json of ``epoch`` (checked, :data:`SHAPES`), None when there is none."""
        path = self.eval_path(epoch)
        what_to_do = f"delete it and run the grid again to re-score epoch {epoch}"
        rec = read_checked(path, "epochN.json", "an epoch's record", what_to_do)
        if rec is not None and rec["epoch"] != epoch:
            raise _shape_error(path, "an epoch's record", f"it is of epoch {rec['epoch']}", what_to_do)
        return rec

    def evals(self):
        """Every eval/epochN.json, in epoch order (checked: a bad one raises)."""
        if not self.eval_dir.is_dir():
            return []
        found = sorted(int(m.group(1)) for p in self.eval_dir.iterdir() if (m := EPOCH_FILE.match(p.name)))
        return [self.eval(e) for e in found]

    # the average of the last epoch checkpoints ----------------------------------
    @property
    def average_checkpoint(self):
        return self.save_dir / "checkpoint_average.pt"

    @property
    def average_hyp_path(self):
        return self.eval_dir / "average.hyp"

    def average(self):
        """eval/average.json (checked, :data:`SHAPES`): the epochs averaged, N and the scores; None when
        it is not scored yet."""
        return read_checked(self.eval_dir / "average.json", "average.json", "an average's record",
                            "delete it (the table then shows no average for that run)")

    def write_average(self, record):
        write_json(self.eval_dir / "average.json", record)

    # lock ---------------------------------------------------------------------
    def lock(self, wait=60):
        """Hold the run's lock; returns the open fd (close it to release). A grid killed a moment
        ago may still have a fairseq child exiting, hence the wait."""
        self.path.mkdir(parents=True, exist_ok=True)
        return hold_lock(self.lock_path, f"{self.path} is in use by another grid (lock {self.lock_path}); "
                                         f"wait for it or stop it", wait)

    def locked(self):
        """Is a grid working on this run now?"""
        if not self.lock_path.exists():
            return False
        fd = os.open(self.lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
