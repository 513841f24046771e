"""Reading fairseq's logs: fairseq-train's (``--log-format json``) while it is being written, and
the BLEU line of fairseq-generate (:func:`bleu4`).

:class:`LogState` keeps what the log says so far: per-epoch validation and training statistics,
the epochs whose checkpoint was saved, the update count, the first training loss, and whether
(and where) the run diverged. :class:`LogTail` feeds it the complete lines added since the last
poll.

Memory: the peak resident set of every launch (the scheduler's line after it) and, on a GPU, CUDA's
peak: fairseq logs ``gb_free`` = the GPU's total memory minus ``torch.cuda.max_memory_allocated()``
since the last update (to 0.1 GB) and the total once at start, so the peak is total - min(gb_free).

Divergence: a non-finite training or validation loss, fairseq's own floating-point failures
(``FloatingPointError``, minimum loss scale reached), or, when ``patience`` is set, a training
loss above the first logged loss for ``patience`` consecutive logged updates.

Early stopping: with a ``stop_rule`` (:class:`~.experiments.early_stop.StopRule`), ``stopped`` is the
rule's ``(update, why)`` once the training loss has stalled (a status of its own, not divergence).
"""
import json
import math
import re
from pathlib import Path

LOG_LINE = re.compile(r"^\S+ \S+ \| \w+ \| (\S+) \| (.*)$")
# an epoch's own checkpoint (checkpointN.pt); a run stopped by --max-update inside an epoch saves
# only checkpoint_best/_last, which is not an epoch to score. A path may hold spaces: it is what
# lies between "checkpoint " and " (epoch".
SAVED = re.compile(r"Saved checkpoint (.*?checkpoint\d+\.pt) \(epoch (\d+) @ (\d+) updates")
LOADED = re.compile(r"Loaded checkpoint .+ \(epoch (\d+) @ (\d+) updates\)")
RAN = re.compile(r"^# fairseq-train ran ([0-9.]+) s")  # written by the scheduler after each launch
PEAK_RSS = re.compile(r"peak resident set ([0-9.]+) MB")  # ... with fairseq-train's peak (reap.py)
CPU_SECONDS = re.compile(r"([0-9.]+) CPU s|, CPU ([0-9.]+) s")  # ... and its CPU time (both spellings)
CUDA_TOTAL = re.compile(r"rank +0: capabilities = .* total memory = ([0-9.]+) GB")  # fairseq's CUDA environment
FATAL_FP = re.compile(r"FloatingPointError|Minimum loss scale reached|gradients are Nan/Inf")
BLEU4 = re.compile(r"BLEU4 = ([0-9.]+)")  # fairseq's BLEU scorer: fairseq-generate's last line, fairseq-score


def number(value):
    """A float from a logged value, ``None`` when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _nonfinite(value):
    x = number(value)
    return x is not None and not math.isfinite(x)


def bleu4(text):
    """The last BLEU score (0-100) fairseq's scorer printed in ``text``, or None."""
    found = BLEU4.findall(text)
    return float(found[-1]) if found else None


class LogState:
    """What fairseq's log says so far."""

    def __init__(self, patience=0, stop_rule=None, budget=None):
        self.valid, self.train, self.saved = {}, {}, {}
        # early stopping (early_stop.StopRule over a budget of ``budget`` updates): the finite
        # training losses as (update, loss), and the rule's (update, why) once it fires
        self.stop_rule, self.budget, self.losses, self.stopped = stop_rule, budget, [], None
        self.updates, self.loss, self.first_loss = 0, "", None
        self.epochs_done = None  # fractional epochs at the last logged update (fairseq's train_inner "update")
        self.nonfinite_at, self.fatal_fp = None, False
        self.patience, self.above, self.above_since = patience, 0, None
        self.train_seconds = 0.0  # wall time of the launches of fairseq-train that ended
        self.peak_rss_mb = None   # largest peak resident set of those launches
        self.cpu_seconds = None   # their CPU time, user + system (None: not recorded)
        self.cuda_total_gb, self.min_gb_free = None, None

    @classmethod
    def of(cls, text, patience=0):
        """The state after every line of ``text`` (a whole log)."""
        state = cls(patience)
        for line in text.splitlines():
            state.feed(line)
        return state

    @property
    def final_valid_loss(self):
        """The last validation loss fairseq logged (also one after an epoch cut by --max-update)."""
        return number(self.valid[max(self.valid)].get("valid_loss")) if self.valid else None

    @property
    def final_valid_nll(self):
        """The last validation NLL fairseq logged (bits, no label smoothing), or None."""
        return number(self.valid[max(self.valid)].get("valid_nll_loss")) if self.valid else None

    @property
    def cuda_peak_mb(self):
        """CUDA's peak over the logged updates (MB), or None off a GPU."""
        if self.cuda_total_gb is None or self.min_gb_free is None:
            return None
        return round((self.cuda_total_gb - self.min_gb_free) * 1024, 1)

    @property
    def diverged_at(self):
        """The update at which the run diverged (non-finite loss or the patience rule), or None."""
        if self.nonfinite_at is not None:
            return self.nonfinite_at
        if self.patience and self.above >= self.patience:
            return self.above_since
        return None

    def feed(self, line):
        """Take one line; return ``"saved"``, the JSON record's name, or None."""
        m = LOG_LINE.match(line)
        if m is None:
            ran = RAN.match(line)
            if ran:
                self.train_seconds += float(ran.group(1))
                cpu = CPU_SECONDS.search(line)
                if cpu:
                    self.cpu_seconds = (self.cpu_seconds or 0.0) + float(cpu.group(1) or cpu.group(2))
                peak = PEAK_RSS.search(line)
                if peak:
                    self.peak_rss_mb = max(self.peak_rss_mb or 0.0, float(peak.group(1)))
            self.fatal_fp |= bool(FATAL_FP.search(line))
            return None
        name, msg = m.groups()
        self.fatal_fp |= bool(FATAL_FP.search(msg))
        if msg.startswith("{"):
            try:
                rec = json.loads(msg)
            except json.JSONDecodeError:
                return None
            if name == "train_inner":
                self._train_inner(rec)
            elif name == "valid":
                self.valid[int(rec["epoch"])] = rec
                if self.nonfinite_at is None and _nonfinite(rec.get("valid_loss")):
                    self.nonfinite_at = int(rec.get("valid_num_updates", self.updates))
            elif name == "train":
                self.train[int(rec["epoch"])] = rec
            return name
        m = SAVED.search(msg)
        if m:
            self.saved[int(m.group(2))] = int(m.group(3))
            return "saved"
        m = LOADED.search(msg)
        if m:
            self.updates = int(m.group(2))
        m = CUDA_TOTAL.search(msg)
        if m:
            self.cuda_total_gb = float(m.group(1))
        return None

    def _train_inner(self, rec):
        self.updates = int(rec.get("num_updates", self.updates))
        self.epochs_done = number(rec.get("update")) or self.epochs_done
        self.loss = rec.get("loss", "")
        free = number(rec.get("gb_free"))
        if free is not None:
            self.min_gb_free = free if self.min_gb_free is None else min(self.min_gb_free, free)
        if self.nonfinite_at is None and _nonfinite(self.loss):
            self.nonfinite_at = self.updates
        loss = number(self.loss)
        if loss is None or not math.isfinite(loss):
            return
        self.losses.append((self.updates, loss))
        if self.stop_rule is not None and self.stopped is None and self.diverged_at is None:
            self.stopped = self.stop_rule.check(self.losses, self.budget)
        if self.first_loss is None:
            self.first_loss = loss
        elif loss > self.first_loss:
            self.above += 1
            self.above_since = self.above_since or self.updates
        else:
            self.above, self.above_since = 0, None


class LogTail:
    """Feeds the lines appended to ``path`` since the last poll to ``state``."""

    def __init__(self, path, state, offset=0):
        self.path, self.state, self.offset, self.buf = Path(path), state, offset, b""
        self.pending = []  # saved epochs whose training statistics are not logged yet

    def poll(self, ended=False):
        """Feed new complete lines; return the epochs whose checkpoint was saved and whose training
        statistics fairseq logged meanwhile (it logs them just after the save), every saved epoch
        once the process has ``ended`` (a process stopped in between never logs them)."""
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
            self.offset += len(data)
            self.buf += data
            *lines, self.buf = self.buf.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if self.state.feed(line) == "saved":
                    self.pending.append(int(SAVED.search(line).group(2)))
        saved = [ep for ep in self.pending if ended or ep in self.state.train]
        self.pending = [ep for ep in self.pending if ep not in saved]
        return saved
