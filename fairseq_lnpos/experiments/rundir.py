"""One run's folder: ``OUT/NAME/seedS/``.

    config.json       everything that determines the results, and its hash
    train.log         fairseq-train's output, every launch appended (``# grid: <command>`` first)
    checkpoints/      fairseq's --save-dir (checkpoint_last.pt for resuming; checkpointN.pt until scored)
    eval/epochN.json  validation loss of epoch N (fairseq's), test BLEU when that epoch was scored
    eval/epochN.hyp   the hypotheses that were scored
    TRAINED           fairseq-train finished
    DONE.json         written last: a run with it is never redone
    .lock             held (flock) while a grid works on the run

Every JSON file is written atomically. A file that exists but cannot be read is an error naming
the path (:class:`~fairseq_lnpos.errors.StateError`), never taken as absent.
"""
import fcntl
import os
import re
from pathlib import Path

from ..common import hold_lock, read_json, write_json
from ..errors import LnposError

EPOCH_FILE = re.compile(r"^epoch(\d+)\.json$")
CHECKPOINT_FILE = re.compile(r"^checkpoint(\d+)\.pt$")


def run_dirs(out):
    """The run folders ``out/NAME/seedS`` (those with a config.json), sorted by path."""
    return [RunDir(p.parent) for p in sorted(Path(out).glob("*/seed*/config.json"))]


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
        """The recorded config, None when there is none yet."""
        return read_json(self.config_path, missing_ok=True, what_to_do=self._redo())

    def check_config(self, config_hash):
        """Refuse a folder that holds another config (results are not mixed)."""
        old = self.config()
        if old is not None and old.get("hash") != config_hash:
            raise LnposError(
                f"{self.path} was made with a different config (hash {old.get('hash')} != {config_hash}): "
                f"use another --out or delete that folder; results are not mixed")

    def claim(self, config, config_hash):
        """Record ``config`` (after :meth:`check_config`)."""
        self.check_config(config_hash)
        self.path.mkdir(parents=True, exist_ok=True)
        self.eval_dir.mkdir(exist_ok=True)
        write_json(self.config_path, {"hash": config_hash, **config})

    # markers ------------------------------------------------------------------
    def done(self):
        return read_json(self.done_path, missing_ok=True, what_to_do=self._redo())

    def write_done(self, record):
        write_json(self.done_path, record)

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

    def evals(self):
        """Every eval/epochN.json, in epoch order (an unreadable one raises)."""
        if not self.eval_dir.is_dir():
            return []
        found = sorted((int(m.group(1)), p) for p in self.eval_dir.iterdir()
                       if (m := EPOCH_FILE.match(p.name)) and not p.name.startswith("."))
        return [read_json(p, what_to_do=f"delete it and run the grid again to re-score epoch {e}")
                for e, p in found]

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
