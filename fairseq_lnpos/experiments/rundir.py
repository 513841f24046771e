"""One run's folder: ``OUT/NAME/seedS/``.

    config.json       everything that determines the results, and its hash
    train.log         fairseq-train's output, every launch appended (``# grid: <command>`` first)
    checkpoints/      fairseq's --save-dir (checkpoint_last.pt for resuming; checkpointN.pt until scored)
    eval/epochN.json  validation loss of epoch N (fairseq's), test BLEU when that epoch was scored
    eval/epochN.hyp   the hypotheses that were scored
    eval/average.json the average of the last N epoch checkpoints (--average-last N) scored, and .hyp
    TRAINED           fairseq-train finished
    extended.json     a run continued for more epochs (``grid.sh run --extend``): the outcome records
                      it had before, with their config hash and epochs
    DONE.json         written last, the outcome (records.py): finished, diverged at update N, stopped
                      early at update N: WHY (early_stop.py), or failed: WHY, in "status" as words and
                      in "outcome", "reason", "diverged_at", "stopped_at" (folders of earlier versions:
                      ``scripts/grid.sh migrate``);
                      a finished, diverged or stopped run is never redone, a failed one is retried;
                      also the first training loss, updates, training time, final validation loss and
                      peak memory (peak_rss_mb, cuda_peak_mb) and fairseq-train's CPU seconds
                      (train_cpu_seconds; null unknown)
    trained_by.json   the model code (provenance.py) that started the run's training: a run is resumed
                      by the same model code only (one run, one model)
    .lock             held (flock) while a grid works on the run; holds the grid's process id

Every JSON file is written atomically. Every state file is checked for shape where it is read,
here, with the shapes of records.py (the one schema of the run files): a file that
exists but cannot be read, or holds something else than the grid writes (``null``, a list, a missing
or mistyped field), is an error naming the path and what to do
(:class:`~fairseq_lnpos.errors.StateError`), never taken as absent.

The output folder (``--out``) holds the run folders, ``progress.log``, ``evaluator.log``, the SLURM
files (``slurm-ID.sbatch``, ``slurm-ID.tasks``) and :data:`GRID_MARKER`, which makes it a grid's: the
grid writes into no other folder that holds something (a folder with a SLURM task list is a grid's too).
"""
import dataclasses
import fcntl
import os
import platform
import re
from pathlib import Path

from ..common import hold_lock, open_fd, read_json, read_lines, write_json, write_text
from ..errors import LnposError, StateError
from ..data.unigram import unigram_bits
from ..provenance import model_code_hash, provenance
from .records import AverageRecord, DoneRecord, EpochRecord, Outcome, config_from_json, shape_error, short
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
    orphans = sorted(p.parent for p in out.glob("*/seed*/DONE.json") if not (p.parent / "config.json").exists())
    if orphans:  # the grid would call such a run finished; no reader leaves it out without a word
        raise StateError(f"{orphans[0]} has an outcome (DONE.json) but no config.json"
                         + (f" (and {len(orphans) - 1} more such folders)" if len(orphans) > 1 else "")
                         + ": delete it to redo that run, or move it out of the folder")
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


# ---------------------------------------------------------------- reading a state file

def read_record(path, from_json, what, what_to_do):
    """The record in ``path`` that ``from_json`` (a record class's, or :func:`~.records.config_from_json`)
    makes of it, checked; None when there is no file."""
    obj = read_json(path, missing_ok=True, what_to_do=what_to_do)
    if obj is None and not Path(path).exists():
        return None
    return getattr(from_json, "from_json", from_json)(obj, path, what, what_to_do)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run as its folder records it (:meth:`RunDir.record`), every file checked."""
    dir: "RunDir"
    config: dict            # config.json; the fields its run lacks are Run's defaults
    run: Run                # config.json's run
    outcome: Outcome
    outcome_text: str       # the outcome in words: DONE.json's (DoneRecord.text: "diverged at update 40",
    #                         "failed: WHY"), "running", "interrupted after epoch N" or "not started"
    done: DoneRecord = None
    evals: tuple = ()       # EpochRecord of each eval/epochN.json, in epoch order
    average: AverageRecord = None

    @property
    def name(self):
        return self.run.name

    @property
    def seed(self):
        return self.config["seed"]

    def last(self, key):
        """``key`` of the latest epoch record where it is not null, or None."""
        found = [getattr(e, key) for e in self.evals if getattr(e, key) is not None]
        return found[-1] if found else None

    @property
    def final_valid_loss(self):
        """DONE.json's final validation loss, else the last epoch's (None: none recorded)."""
        final = self.done.final_valid_loss if self.done else None
        return self.last("valid_loss") if final is None else final

    @property
    def scored(self):
        """The epoch records with a test BLEU, in epoch order."""
        return [e for e in self.evals if e.bleu_tok is not None]

    @property
    def best(self):
        """The epoch record of the best test BLEU (the earliest of equals), None when none was scored."""
        return max(self.scored, key=lambda e: (e.bleu_tok, -e.epoch), default=None)

    @property
    def selected(self):
        """The scored epoch record chosen on validation: the lowest validation NLL, the earliest of
        equals; the label-smoothed validation loss instead, for every epoch, when some scored epoch
        logged no NLL (one quantity is compared across a run's epochs); None when none was scored."""
        scored = self.scored
        key = "valid_nll_loss" if all(e.valid_nll_loss is not None for e in scored) else "valid_loss"
        return min((e for e in scored if getattr(e, key) is not None), key=lambda e: (getattr(e, key), e.epoch),
                   default=None)

    @property
    def best_valid_loss(self):
        losses = [e.valid_loss for e in self.evals if e.valid_loss is not None]
        return min(losses) if losses else None


def read_tasks(path):
    """[(run, seed, fairseq args)] of a ``slurm-ID.tasks`` file, one tab-separated task a line."""
    tasks = []
    for i, line in enumerate(read_lines(path), 1):
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
            raise StateError(f"{path}, line {i}: {short(line)} is not RUN<tab>SEED<tab>FAIRSEQ-ARGS as grid.sh "
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
        self.extended_path = self.path / "extended.json"
        self.trained_by_path = self.path / "trained_by.json"
        self.last_checkpoint = self.save_dir / "checkpoint_last.pt"

    def __repr__(self):
        return f"RunDir({str(self.path)!r})"

    def _redo(self):
        return f"delete {self.path} to redo that run"

    # config -------------------------------------------------------------------
    def config(self):
        """The recorded config (checked, :func:`~.records.config_from_json`: fields of its run that it
        lacks are Run's defaults), None when there is none yet."""
        what_to_do = f"delete {self.path} to redo that run, or move it out of {self.path.parent.parent} if it is no run"
        return read_record(self.config_path, config_from_json, "a run's config", what_to_do)

    def check_config(self, config_hash, config=None):
        """Refuse a folder that holds another config (results are not mixed); where ``config`` (the new
        one) differs in its precision, say which flag continues the run as it was."""
        old = self.config()
        if old is not None and old["hash"] != config_hash:
            was, now = ((c or {}).get("precision", "float32") for c in (old, config))
            if config is not None and was != now:
                raise LnposError(f"{self.path} trained in {was} and this command would train it in {now}: "
                                 f"{'drop' if was == 'float32' else 'give'} --cpu-bf16 to continue it as it was, or "
                                 f"use another --out; results are not mixed")
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
        if not self.trained and not self.last_checkpoint.exists():  # its training starts now, from scratch
            write_json(self.trained_by_path, {"model_code": model_code_hash()})

    def trained_by(self):
        """The model code that started the run's training (trained_by.json), None where not recorded."""
        what_to_do = f"delete it (the run then resumes unchecked) or {self._redo()}"
        obj = read_json(self.trained_by_path, missing_ok=True, what_to_do=what_to_do)
        if obj is None:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("model_code"), str):
            raise shape_error(self.trained_by_path, "the record of the model code", f"it holds {short(obj)}",
                              what_to_do)
        return obj["model_code"]

    def check_resume(self, model_code):
        """Refuse to resume training (from checkpoint_last.pt) with another model code than the one that
        started it: the run would be recorded as trained by one model it is not. A run whose training
        ended (TRAINED, or a final outcome), or that has no checkpoint to resume from, is not resumed."""
        done = self.done()
        if self.trained or (done is not None and done.outcome.final) or not self.last_checkpoint.exists():
            return
        started = self.trained_by()
        if started is not None and started != model_code:
            raise LnposError(f"{self.path} was trained up to its last checkpoint by model code {started}, and the "
                             f"plugin's model code is now {model_code}: resuming would make one run of two models; "
                             f"restore the code it started with to resume it, or {self._redo()} with this code")

    def extend(self, config, config_hash, model_code, write=True):
        """Reopen this run for more epochs (``grid.sh run --extend``) when ``config`` differs from the
        recorded one only in a larger ``run.max_epoch``: its outcome record moves to extended.json (a
        list, oldest first, each with the config hash and epochs it had), config.json takes ``config``
        and TRAINED goes, so the grid resumes it from checkpoint_last.pt and scores the new epochs.
        Returns the epochs it had, or None when there is nothing to extend (no run yet, or the same
        config); raises, changing nothing, where more epochs would not continue the same run.
        ``write=False`` only checks."""
        old = self.config()
        if old is None or old["hash"] == config_hash:
            return None
        new = config_from_json({"hash": config_hash, **config}, self.config_path)
        changed = sorted({k for k in {**old, **new} if k not in ("hash", "run") and old.get(k) != new.get(k)}
                         | {f"run.{k}" for k in new["run"] if old["run"].get(k) != new["run"][k]})
        was, more = old["run"]["max_epoch"], new["run"]["max_epoch"]
        refuse = f"{self.path}: --extend continues a finished run for more epochs only, and "
        if changed != ["run.max_epoch"]:
            raise LnposError(refuse + f"its config differs in {', '.join(changed)}: use another --out")
        if more < was:
            raise LnposError(refuse + f"it has {was} epochs already, more than --max-epoch {more}: give "
                                      f"--max-epoch {was} or more")
        run = new["run"]
        if run["max_update"] or run["schedule"] == "linear" or run["average_last"]:
            raise LnposError(refuse + "its budget also sets " + (
                f"max_update {run['max_update']}" if run["max_update"] else "its learning-rate schedule (linear)"
                if run["schedule"] == "linear" else f"which checkpoints are averaged (average_last {run['average_last']})")
                + ", which more epochs would change: run it again in another --out")
        done = self.done()
        if done is not None and done.outcome in (Outcome.DIVERGED, Outcome.STOPPED):
            raise LnposError(refuse + f"it {done.text}: more epochs would not continue it; give --max-epoch {was}")
        trained_by = ((done.provenance or {}) if done else {}).get("model_code")
        if trained_by and trained_by != model_code:
            raise LnposError(refuse + f"its epochs were trained by other model code ({trained_by}, now "
                                      f"{model_code}): one run would mix two models; use another --out")
        if write:
            fd = self.lock()
            try:
                history = read_json(self.extended_path) if self.extended_path.exists() else []
                write_json(self.extended_path, history + [{"hash": old["hash"], "max_epoch": was,
                                                           "done": done and done.to_json()}])
                write_json(self.config_path, {"hash": config_hash, **config})
                self.done_path.unlink(missing_ok=True)
                self.trained_path.unlink(missing_ok=True)
            finally:
                os.close(fd)
        return was

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
            outcome, text = done.outcome, done.text
        elif self.locked():
            outcome, text = Outcome.UNFINISHED, "running"
        elif evals:
            outcome, text = Outcome.UNFINISHED, f"interrupted after epoch {evals[-1].epoch}"
        else:
            outcome, text = Outcome.NOT_STARTED, "not started"
        return RunRecord(self, cfg, Run.from_dict(cfg["run"]), outcome, text, done, tuple(evals), self.average())

    # markers ------------------------------------------------------------------
    def done(self):
        """The outcome record (:class:`~.records.DoneRecord`, checked), None when there is none."""
        what_to_do = f"delete it and run the grid again to rewrite it (or {self._redo()})"
        return read_record(self.done_path, DoneRecord, "an outcome record", what_to_do)

    def outcome(self):
        """The :class:`~.records.Outcome` DONE.json records, or None when the run has no outcome yet."""
        done = self.done()
        return None if done is None else done.outcome

    def write_done(self, record):
        """Write DONE.json (a :class:`~.records.DoneRecord`), with this process's provenance
        (:func:`~fairseq_lnpos.provenance.provenance`) and the unigram bits of the run's data
        (:func:`~fairseq_lnpos.data.unigram.unigram_bits`) where the record has none."""
        if record.provenance is None:
            record = dataclasses.replace(record, provenance=provenance())
        if record.unigram_bits is None and record.outcome is not Outcome.FAILED:
            cfg = self.config() or {}
            if cfg.get("data"):
                try:
                    bits = unigram_bits(str(Path(cfg["data"]).resolve()))
                except (OSError, ValueError, IndexError):  # a damaged data folder: the reference stays unknown
                    bits = None
                record = dataclasses.replace(record, unigram_bits=bits)
        write_json(self.done_path, record.to_json())

    @property
    def trained(self):
        return self.trained_path.exists()

    def mark_trained(self):
        write_text(self.trained_path, "")

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

    def write_eval(self, record):
        """Write eval/epochN.json (an :class:`~.records.EpochRecord`)."""
        write_json(self.eval_path(record.epoch), record.to_json())

    def eval(self, epoch):
        """eval/epochN.json of ``epoch`` (checked, records.py), None when there is none."""
        path = self.eval_path(epoch)
        what_to_do = f"delete it and run the grid again to re-score epoch {epoch}"
        rec = read_record(path, EpochRecord, "an epoch's record", what_to_do)
        if rec is not None and rec.epoch != epoch:
            raise shape_error(path, "an epoch's record", f"it is of epoch {rec.epoch}", what_to_do)
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
        """eval/average.json (checked, records.py): the epochs averaged, N and the scores; None when
        it is not scored yet."""
        return read_record(self.eval_dir / "average.json", AverageRecord, "an average's record",
                            "delete it (the table then shows no average for that run)")

    def write_average(self, record):
        """Write eval/average.json (an :class:`~.records.AverageRecord`)."""
        write_json(self.eval_dir / "average.json", record.to_json())

    # lock ---------------------------------------------------------------------
    def lock(self, wait=60):
        """Hold the run's lock; returns the open fd (close it to release). A grid killed a moment
        ago may still have a fairseq child exiting, hence the wait."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = hold_lock(self.lock_path, f"{self.path} is in use by another grid (lock {self.lock_path}); "
                                       f"wait for it or stop it", wait)
        try:  # who holds it: a second grid refuses the folder while that process lives (check_free)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {platform.node()}\n".encode(), 0)
        except OSError:
            pass
        return fd

    def holder(self):
        """(process id, host) the lock file names (the grid that holds or held it), None where it names none."""
        try:
            pid, _, host = self.lock_path.read_text(encoding="utf-8", errors="replace").strip().partition(" ")
        except OSError:
            return None
        return (int(pid), host) if pid.isdigit() else None

    def check_free(self):
        """Refuse a run folder that another grid works on now: its lock is held, and the process the lock
        file names lives (or it names none). A lock whose grid has died (a fairseq process of it still
        exiting), or one held on another machine (a shared file system, where this one cannot tell), is
        waited for by :meth:`lock` instead."""
        if not self.locked():
            return
        holder = self.holder()
        pid, alive = (None, True) if holder is None else (holder[0], holder[1] == platform.node())
        if alive and pid is not None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                alive = False
            except OSError:
                pass
        if alive:
            raise LnposError(f"{self.path} is in use by another grid (lock {self.lock_path}"
                             + (f", process {pid}" if pid is not None else "") + "): wait for it to finish or stop "
                             "it, then run again; nothing was changed")

    def locked(self):
        """Is a grid working on this run now?"""
        if not self.lock_path.exists():
            return False
        fd = open_fd(self.lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
