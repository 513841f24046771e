"""Running the grid's jobs: slots, fairseq-train processes, the evaluator, divergence, resume.

A slot is one place for a run: a GPU group (the ``CUDA_VISIBLE_DEVICES`` value of its processes,
plan.plan_slots), given ``--runs-per-gpu`` times, or a share of the CPU, whose runs' fairseq commands
all get ``--cpu``. The first job goes to the first slot, the second to the second and so on (what the
dry run shows); then each slot's worker takes the next job as it comes free, trains it with
fairseq-train (resuming from checkpoint_last.pt; on the CPU forked from the slot's fork server, which
imported fairseq once, unless ``--no-fork-server``: forkserver.py; on GPUs through
launch.recorded_train_cmd, which records the GPU and the memory each process took), follows its log,
and hands every saved epoch to the evaluator of its device; the slot is free again as soon as training ends. A run is finished
(DONE.json) when every saved epoch is recorded (scored, or left unscored by --eval-every) and its
last epoch scored, in its own folder still; a run that cannot get there is failed (DONE.json says
why; a re-run retries it). CPU threads are shared out among everything that runs at once: the slots
and the evaluators.
"""
import enum
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..common import fmt_time, open_log
from ..data.manifest import read_manifest
from ..errors import LnposError, StateError
from ..forkserver import ForkedRun, ForkServer, ServerGone, forkable
from ..launch import CUDA_RECORD, child_env, read_cuda_records, recorded_train_cmd
from ..precision import precision_of
from ..progress import Cadence
from ..provenance import provenance
from . import reap
from .commands import Job, total_updates
from .early_stop import DEFAULT_RULE
from .evaluator import Evaluator, Stopped
from ..fairseq_log import LogState, LogTail, number
from .records import AverageRecord, DoneRecord, EpochRecord, Outcome, Scores, ScoreRequest

# children get SIGTERM when the thread that started them dies, also when the grid is SIGKILLed
PDEATHSIG = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []


class RunFailed(Exception):
    pass


def _poll(proc):
    """``reap.poll`` for a process of this one, the fork server's answer for a forked run."""
    return proc.poll() if isinstance(proc, ForkedRun) else reap.poll(proc)


def _wait(proc):
    return proc.wait() if isinstance(proc, ForkedRun) else reap.wait(proc)


class Phase(enum.Enum):
    """Where the grid is with a job: its lifecycle (how a run ended is its :class:`~.records.Outcome`)."""
    PENDING = "pending"   # not started yet
    RUNNING = "running"   # training, or its scoring still going on
    DONE = "done"         # its outcome recorded (or failed where it could not be)
    SKIPPED = "skipped"   # its folder recorded a final outcome before: not redone


@dataclass(eq=False)
class Progress:
    """How far the grid got with one job (:class:`~.commands.Job`, the plan): written by the run's
    worker and the evaluator's callbacks, read by the progress line."""
    job: Job
    phase: Phase = Phase.PENDING
    slot: str = None                        # where it trains (a CUDA_VISIBLE_DEVICES value; None: the CPU)
    epoch: int = 0
    updates: int = 0
    loss: str = ""
    pace: tuple = None                      # (seconds, updates) fairseq-train ran in this grid, for the ETA
    # while the scheduler works on it
    manifest: dict = None
    log_state: LogState = None
    evaluator: Evaluator = None
    pending: set = field(default_factory=set)  # epochs being scored
    lock_fd: int = None
    released: bool = True                   # the run folder's lock is not held
    diverged: int = None                    # the update at which it diverged
    stopped: tuple = None                   # (update, why): stopped early (early_stop.py)
    error: str = None                       # why scoring failed
    done: DoneRecord = None                 # its outcome, once recorded

    @property
    def label(self):
        return self.job.label


def _or_dash(value):
    return "-" if value is None else value


TERMINAL_WIDTH = 100  # columns of the grid's progress lines on the terminal (progress.log has them in full)


def terminal_text(status, tail, msg, width=TERMINAL_WIDTH):
    """A progress line for the terminal: ``status`` (the time and runs done, then one short part per
    running run), ``tail`` (the evaluator's queue, the ETA) and ``msg``. The running runs become
    their count when the status does not fit in ``width`` columns; ``msg`` goes on a line of its own
    (indented, whole: it may name a path) when it does not fit beside the status."""
    head = " | ".join(status + tail)
    if len(head) > width:
        head = " | ".join(status[:1] + [f"{len(status) - 1} running"] + tail)
    if not msg or len(head) + 3 + len(msg) <= width:
        return head + (f" | {msg}" if msg else "")
    return f"{head}\n  {msg}"


class Grid:
    def __init__(self, jobs, opts, slots):
        self.progress, self.opts, self.slots = [Progress(j) for j in jobs], opts, slots
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.procs = set()
        self.t0 = time.time()
        self.failed = False
        self.out = Path(opts.out)
        self.progress_log = self.out / "progress.log"
        self.progress_lost = False  # progress.log could not be written (said once)
        devices = sorted(set(slots), key=str)
        self.threads = max(1, (os.cpu_count() or 1) // (len(slots) + len(devices) * opts.evaluators))
        self.evaluators = {d: Evaluator(self.env(d), self.out / "evaluator.log", self.popen, opts.evaluators,
                                        stopping=self.stop.is_set)
                           for d in devices}
        self.finished = threading.Condition(self.lock)
        self.servers = {}  # worker thread -> its ForkServer (CPU slots)
        self.cadence = Cadence(self.say)  # between events, the status line at least every minute

    # processes ----------------------------------------------------------------
    def env(self, device):
        return child_env(self.threads, device)

    def popen(self, cmd, env, **kw):
        if self.stop.is_set():
            raise Stopped()
        p = subprocess.Popen(PDEATHSIG + list(cmd), env=env, start_new_session=True, **kw)
        with self.lock:
            self.procs.add(p)
        return p

    def start(self, cmd, env, log_path, slot):
        """fairseq-train ``cmd`` with its output appended to ``log_path``: forked from this worker's
        fork server where it can be (:func:`~fairseq_lnpos.forkserver.forkable`), else a process of
        its own. Tracked for :meth:`kill_all` either way."""
        if not (getattr(self.opts, "fork_server", False) and forkable(cmd, slot)):
            with open_log(log_path, binary=True) as log:
                return self.popen(cmd, env, stdout=log, stderr=subprocess.STDOUT)
        me = threading.get_ident()
        server = self.servers.get(me)
        for attempt in (1, 2):  # a server that ended (killed, crashed) is replaced once
            if server is None or not server.alive:
                if server is not None:
                    with self.lock:
                        self.procs.discard(server.proc)
                with open_log(self.out / "forkserver.log", binary=True) as errors:
                    server = self.servers[me] = ForkServer(self.popen, env, errors)
            try:
                proc = server.spawn(cmd[1:], env, log_path)
                break
            except ServerGone:
                if self.stop.is_set():
                    raise Stopped() from None
                if attempt == 2:
                    raise RunFailed(f"the fork server ended before it could start fairseq-train; see "
                                    f"{self.out / 'forkserver.log'} (--no-fork-server starts it on its own)") from None
        with self.lock:
            if self.stop.is_set():  # kill_all ran meanwhile: it did not see this run
                os.killpg(proc.pid, signal.SIGTERM)
            self.procs.add(proc)
        return proc

    def close_server(self):
        """End the calling worker's fork server, if it has one."""
        server = self.servers.pop(threading.get_ident(), None)
        if server is not None:
            server.close()
            with self.lock:
                self.procs.discard(server.proc)

    def kill_all(self):
        self.stop.set()
        with self.lock:
            procs = list(self.procs)
            self.finished.notify_all()
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    # progress -----------------------------------------------------------------
    def say(self, msg=None):
        """The progress line: the runs done, each running run's progress, the ETA, and ``msg`` (an event;
        None: the status line alone, which the cadence prints when no event came for a while)."""
        with self.lock:
            n = len(self.progress)
            done = sum(p.phase in (Phase.DONE, Phase.SKIPPED) for p in self.progress)
            parts = [f"[grid {fmt_time(time.time() - self.t0)}] {done}/{n} runs done"]
            brief = list(parts)  # the terminal's version (terminal_text)
            for p in self.progress:
                if p.phase is Phase.RUNNING:
                    run = p.job.run
                    epoch = min(p.epoch + 1, run.max_epoch or p.epoch + 1)  # the one in progress (p.epoch: saved)
                    budget = f"update {p.updates}/{run.max_update}" if run.max_update else \
                        f"epoch {epoch}/{run.max_epoch}, update {p.updates}"
                    parts.append(f"run {p.job.index}/{n} {p.label}: {budget}" + (f", loss {p.loss}" if p.loss else ""))
                    brief.append(f"#{p.job.index} " + (f"upd {p.updates}/{run.max_update}" if run.max_update else
                                                       f"ep {epoch}/{run.max_epoch} upd {p.updates}")
                                 + (f" loss {p.loss}" if p.loss else ""))
            queued = sum(e.pending for e in self.evaluators.values())
            tail = ([f"eval queue {queued}"] if queued else []) + [f"ETA {self.eta()}"]
            line = " | ".join(parts + tail) + (f" | {msg}" if msg else "")
            print(terminal_text(brief, tail, msg), flush=True)
            self.cadence.printed()
            try:
                with open_log(self.progress_log) as f:
                    f.write(line + "\n")
            except (LnposError, OSError) as e:  # replaced by a link or made unwritable while the runs go on
                if not self.progress_lost:
                    why = ("is a symbolic link, not written through" if isinstance(e, LnposError)
                           else f"cannot be written ({e.strerror or e})")
                    print(f"grid: warning: {self.progress_log} {why}: the runs go on, their progress shown here only",
                          flush=True)
                self.progress_lost = True

    def eta(self):
        """Time left from the training pace seen so far (seconds per update over every launch of
        fairseq-train, its start included), the updates left and the slots; "?" until a run has
        made updates. For budgets in epochs, the updates an epoch: at the saved epochs' ends, else from the
        fraction of its first epoch a running run has logged (fairseq's train_inner ``update``)."""
        paces = [p.pace for p in self.progress if p.pace and p.pace[1] > 0]
        if not paces:
            return "?"
        per_update = sum(t for t, _ in paces) / sum(u for _, u in paces)
        # updates in an epoch: at the last saved epoch's end (a run in the middle of the next one would count more)
        seen = [(p.log_state.saved.get(p.epoch, p.updates) if p.log_state else p.updates, p.epoch)
                for p in self.progress if p.epoch]
        per_epoch = sum(u for u, _ in seen) / sum(e for _, e in seen) if seen else None
        part = [(p.log_state.updates, p.log_state.epochs_done) for p in self.progress
                if per_epoch is None and p.log_state and getattr(p.log_state, "epochs_done", None)]
        per_epoch = sum(u for u, _ in part) / sum(e for _, e in part) if part else per_epoch
        left = 0.0
        for p in self.progress:
            if p.phase in (Phase.PENDING, Phase.RUNNING):
                run = p.job.run
                if run.max_update:
                    left += max(run.max_update - p.updates, 0)
                elif per_epoch is None:
                    return "?"
                else:
                    left += max(run.max_epoch * per_epoch - p.updates, 0)
        return fmt_time(per_update * left / len(self.slots))

    # one run ------------------------------------------------------------------
    def execute(self, p, slot):
        p.slot, p.job = slot, replace(p.job, cpu=slot is None)  # a CPU slot's commands get --cpu
        job, rd = p.job, p.job.dir
        done = rd.done()
        if done is not None and done.outcome.final:
            p.phase = Phase.SKIPPED
            self.say(f"{job.label}: already {done.text}, not redone")
            return
        p.lock_fd, p.released = rd.lock(), False
        try:
            if done is not None:  # it failed: retried
                self.say(f"{job.label}: retried (it {done.text})")
                rd.done_path.unlink(missing_ok=True)
            rd.claim(job.config(), job.config_hash())
            rd.evals()  # a damaged record is an error now, not a silently re-scored epoch later
            p.phase = Phase.RUNNING
            p.manifest = read_manifest(job.data)
            rule = DEFAULT_RULE if self.opts.early_stop and job.run.max_update else None
            p.log_state = LogState(patience=self.opts.patience, stop_rule=rule, budget=job.run.max_update)
            p.evaluator = self.evaluators[slot]
            self._train(p, slot)
        except RunFailed as e:
            self._fail(p, e)  # recorded while the run's lock is held
            self._release(p)
            return
        except BaseException:
            self._release(p)
            raise
        self._after_training(p)

    def _train(self, p, slot):
        job = p.job
        rd, state = job.dir, p.log_state
        tail = LogTail(rd.log_path, state)
        tail.poll(ended=True)  # the history of earlier launches
        p.epoch, p.updates = max(state.saved, default=0), state.updates
        for ep in sorted(state.saved):  # saved in an earlier launch, not scored before an interruption
            if not rd.has_eval(ep):
                self._epoch_saved(p, ep)
        if rd.trained:
            return
        total = total_updates(job) if job.run.schedule == "linear" else 0
        cmd, env = job.train_cmd(total), self.env(slot)
        if slot is not None:  # each process of the run records its GPU and memory in the run folder
            cmd, env = recorded_train_cmd(cmd), dict(env, **{CUDA_RECORD: str(rd.path)})
        with open_log(rd.log_path, binary=True) as log:
            log.write(f"# grid: {shlex.join(cmd)}\n".encode())
        proc = self.start(cmd, env, rd.log_path, slot)
        self.say(f"{job.label}: training ({'resumed' if state.saved else 'new'}), log {rd.log_path}")
        t_launch, updates_before, paced = time.time(), state.updates, p.pace or (0.0, 0)
        try:
            while True:
                ended = _poll(proc) is not None
                for ep in tail.poll(ended):
                    p.epoch = ep
                    self._epoch_saved(p, ep)
                p.updates, p.loss = state.updates, state.loss
                p.pace = (paced[0] + time.time() - t_launch, paced[1] + state.updates - updates_before)
                if (state.diverged_at is not None or state.stopped is not None) and not ended:
                    os.killpg(proc.pid, signal.SIGTERM)
                    _wait(proc)
                    ended = True
                if ended:
                    with open_log(rd.log_path) as log:
                        log.write(f"\n# fairseq-train ran {time.time() - t_launch:.1f} s{reap.peak_text(proc)}\n")
                    for ep in tail.poll(ended=True):  # saved just before a diverged run was stopped
                        self._epoch_saved(p, ep)
                    break
                if self.stop.is_set():
                    raise Stopped()
                time.sleep(0.5)
        finally:
            if _poll(proc) is None:
                os.killpg(proc.pid, signal.SIGTERM)
                _wait(proc)
            with self.lock:
                self.procs.discard(proc)
        if self.stop.is_set():
            raise Stopped()
        if state.diverged_at is not None:
            p.diverged = state.diverged_at
        elif state.stopped is not None:
            p.stopped = state.stopped
        elif proc.returncode != 0 and state.fatal_fp:
            p.diverged = state.updates + 1  # fairseq raised before counting the failing update
        elif proc.returncode != 0:
            raise RunFailed(f"fairseq-train exited {proc.returncode}; see {rd.log_path}")
        elif (max(state.saved, default=0) < job.run.max_epoch and not job.run.max_update
              and "--max-update" not in job.opts.fairseq_args):
            raise RunFailed(f"fairseq-train exited 0 but saved only {max(state.saved, default=0)} of "
                            f"{job.run.max_epoch} epochs; see {rd.log_path}")
        else:
            rd.mark_trained()

    def _epoch_saved(self, p, epoch):
        """Record fairseq's statistics of ``epoch``; queue its scoring (or not, with --eval-every)."""
        rd, st = p.job.dir, p.log_state
        v, tr = st.valid.get(epoch, {}), st.train.get(epoch, {})
        record = EpochRecord(epoch=epoch, num_updates=st.saved.get(epoch), valid_loss=number(v.get("valid_loss")),
                             valid_nll_loss=number(v.get("valid_nll_loss")), train_loss=number(tr.get("train_loss")),
                             lr=number(tr.get("train_lr")))
        if not rd.checkpoint(epoch).exists():
            raise RunFailed(f"{rd.checkpoint(epoch)} is missing, so epoch {epoch} cannot be scored; "
                            f"delete {rd.path} to redo the run")
        if not p.job.scored(epoch):
            rd.write_eval(record)  # unscored; its checkpoint stays until the next epoch is saved
            self._drop_checkpoints(p, below=epoch)
            return
        self._score(p, record)

    def _score(self, p, record):
        job, epoch = p.job, record.epoch
        rd = job.dir
        t = time.time()

        def scored(scores):
            rd.write_eval(record.scored_as(scores))
            self._drop_checkpoints(p, below=epoch + 1)
            self.say(f"{job.label}: epoch {epoch} tok BLEU {scores.bleu_tok}, sacreBLEU "
                     f"{_or_dash(scores.sacrebleu)}, valid loss {record.valid_loss} "
                     f"({time.time() - t:.0f} s after it was saved)")

        self._submit(p, epoch, self._request(p, job.generate_argv(epoch, p.manifest), rd.hyp_path(epoch),
                                             rd.checkpoint(epoch)), scored)

    @staticmethod
    def _request(p, generate_argv, hyp_out, checkpoint, average=()):
        job = p.job
        return ScoreRequest(argv=tuple(generate_argv[1:]), data=str(job.data), hyp_out=str(hyp_out),
                            checkpoint=str(checkpoint), compound_split=job.run.compound_split_bleu,
                            average=tuple(str(path) for path in average))

    def _submit(self, p, key, request, scored):
        """Queue ``request`` (:class:`~.records.ScoreRequest`) with the job's evaluator under ``key``
        (in ``p.pending`` until answered); ``scored(scores)`` records the :class:`~.records.Scores`,
        an evaluator's failure becomes ``p.error``."""
        with self.lock:
            p.pending.add(key)

        def answered(result, error):
            try:
                if error is None:
                    scored(Scores.from_json(result, f"the evaluator's answer for {request.checkpoint}",
                                            "a score record", f"see {self.out / 'evaluator.log'}"))
                elif not isinstance(error, Stopped):  # the grid is stopping: it is scored on resume
                    p.error = str(error)
            except StateError as e:  # an answer of another shape: that request failed
                p.error = str(e)
            finally:
                with self.lock:
                    p.pending.discard(key)
                    self.finished.notify_all()

        p.evaluator.submit(request, answered)

    def _average_due(self, p):
        """Is the average of the run's last --average-last epoch checkpoints still to be scored?"""
        return p.job.run.average_last > 0 and not self.opts.no_bleu and p.diverged is None \
            and p.stopped is None and p.job.dir.average() is None

    def _score_average(self, p):
        """Queue the scoring of the parameter average of the last --average-last epoch checkpoints
        (fewer when the run saved fewer); False when there is none to score."""
        if not self._average_due(p):
            return False
        job = p.job
        rd, n = job.dir, job.run.average_last
        last = rd.epoch_checkpoints()[-n:]
        if not last:
            return False
        epochs, out = tuple(ep for ep, _ in last), rd.average_checkpoint

        def scored(scores):
            rd.write_average(AverageRecord(epochs=epochs, average_last=n, **scores.scores()))
            if not self.opts.keep_checkpoints:
                out.unlink(missing_ok=True)
            self.say(f"{job.label}: average of epochs {epochs[0]}-{epochs[-1]} tok BLEU {scores.bleu_tok}, "
                     f"sacreBLEU {_or_dash(scores.sacrebleu)}")

        self._submit(p, "average", self._request(p, job.generate_argv(None, p.manifest, checkpoint=out),
                                                 rd.average_hyp_path, out, average=[path for _, path in last]), scored)
        return True

    def _drop_checkpoints(self, p, below):
        """Delete checkpointN.pt (N < below) whose epoch is recorded, unless --keep-checkpoints; the
        newest --average-last of them stay until their average is scored."""
        if self.opts.keep_checkpoints:
            return
        rd = p.job.dir
        found = rd.epoch_checkpoints()
        keep = {ep for ep, _ in found[-p.job.run.average_last:]} if self._average_due(p) else set()
        for ep, path in found:
            if ep < below and rd.has_eval(ep) and ep not in keep:
                path.unlink()

    def _after_training(self, p):
        """The slot is free; the run is finished once its scoring is (in the evaluator's thread)."""
        rd = p.job.dir
        last = max(p.log_state.saved, default=0)
        rec = rd.eval(last) if last else None  # None: being scored
        if rec is not None and rec.bleu_tok is None and not self.opts.no_bleu and rd.checkpoint(last).exists():
            self._score(p, rec)  # the last epoch is always scored
        threading.Thread(target=self._finish, args=(p,), daemon=True).start()

    def _wait_for_scoring(self, p):
        """Wait until ``p``'s queued scoring is done; False when the grid stops meanwhile."""
        with self.lock:
            while p.pending and not self.stop.is_set():
                self.finished.wait()
        if self.stop.is_set():
            return False
        if p.error:
            raise RunFailed(p.error)
        return True

    def _finish(self, p):
        try:
            if not self._wait_for_scoring(p):
                return
            self._check_complete(p)
            if self._score_average(p) and not self._wait_for_scoring(p):
                return
            self._drop_checkpoints(p, below=float("inf"))
            st, rd = p.log_state, p.job.dir
            diverged, stopped = p.diverged, p.stopped
            outcome = Outcome.DIVERGED if diverged else Outcome.STOPPED if stopped else Outcome.FINISHED
            done = DoneRecord(outcome=outcome, reason=stopped and stopped[1], diverged_at=diverged,
                              stopped_at=stopped and stopped[0], epochs=tuple(sorted(st.saved)),
                              initial_loss=st.first_loss, updates=st.updates,
                              train_seconds=round(st.train_seconds, 1),
                              train_cpu_seconds=st.cpu_seconds and round(st.cpu_seconds, 1),
                              final_valid_loss=st.final_valid_loss, final_valid_nll=st.final_valid_nll,
                              peak_rss_mb=st.peak_rss_mb, cuda_peak_mb=self.cuda_peak_mb(p),
                              precision=precision_of(p.job.train_cmd()[1:]), provenance=self.provenance(p))
            rd.write_done(done)
            p.phase, p.done = Phase.DONE, done
            self.say(f"{p.label}: {done.text}")
        except (RunFailed, LnposError) as e:
            self._fail(p, e)
        finally:
            self._release(p)

    @staticmethod
    def cuda_peak_mb(p):
        """What the run took on a GPU, in MB: the largest over its processes (one per GPU) of what each
        recorded (launch.cuda_record: PyTorch's reserved peak plus the CUDA context, the driver's figure
        where it can be read); from fairseq's log (its allocated peak) where no process recorded it."""
        records = read_cuda_records(p.job.dir.path) if p.slot is not None else []
        recorded = [r["cuda_mb"] for r in records if isinstance(r.get("cuda_mb"), (int, float))]
        if recorded:
            return max(recorded)
        return p.log_state.cuda_peak_mb if p.log_state else None

    @staticmethod
    def provenance(p):
        """The run's provenance: the machine's, with ``gpu`` the run's own GPUs by the names its
        processes recorded (none for a CPU run) and ``cuda_visible_devices`` what they were given."""
        if p.slot is None:
            return provenance(gpu=[])
        names = [r.get("gpu") for r in read_cuda_records(p.job.dir.path)]
        return provenance(gpu=[n for n in names if isinstance(n, str)], cuda_visible_devices=p.slot)

    def _check_complete(self, p):
        """The run is over only when its folder is still its own and every saved epoch is recorded:
        scored, or left unscored on purpose (--eval-every, --no-bleu), and the last one scored."""
        rd = p.job.dir
        rd.check_intact(p.job.config_hash())
        records = {e: rd.eval(e) for e in sorted(p.log_state.saved)}
        lost = [e for e, rec in records.items() if rec is None]
        if lost:
            raise RunFailed(f"epoch {', '.join(map(str, lost))} saved but never scored; re-run to score it")
        saved = list(records)
        if saved and not self.opts.no_bleu and records[saved[-1]].bleu_tok is None:
            raise RunFailed(f"its last epoch ({saved[-1]}) was not scored; re-run to score it")

    def _release(self, p):
        if p.lock_fd is not None:
            os.close(p.lock_fd)
            p.lock_fd = None
        with self.lock:
            p.released = True
            self.finished.notify_all()

    def _fail(self, p, error):
        """Say why the run failed; while this grid holds the run, record it (DONE.json), so that
        the table and ``grid.sh status`` show it and a re-run retries it."""
        p.phase = Phase.DONE
        p.done = replace(DoneRecord.failed(" ".join(str(error).split())), provenance=self.provenance(p))
        self.failed = True
        if p.lock_fd is not None:
            try:
                p.job.dir.write_done(p.done)
            except OSError:  # the run folder is gone: nothing to record it in
                pass
        self.say(f"{p.label}: FAILED: {error} (re-run to retry)")

    # the whole grid -----------------------------------------------------------
    def run(self):
        queue, errors = list(self.progress), []
        qlock = threading.Lock()
        first = {i: queue.pop(0) for i in range(len(self.slots)) if queue}  # slot i starts with job i + 1

        def worker(i, slot):
            try:
                work(i, slot)
            finally:
                self.close_server()

        def work(i, slot):
            while not self.stop.is_set():
                with qlock:
                    if i in first:
                        p = first.pop(i)
                    elif not queue:
                        return
                    else:
                        p = queue.pop(0)
                try:
                    self.execute(p, slot)
                except Stopped:
                    return
                except (RunFailed, StateError) as e:  # this run cannot go on; the others can
                    self._fail(p, e)
                except LnposError as e:  # unusable input or state: stop the grid, say why
                    errors.append(str(e))
                    self.kill_all()
                    return
                except Exception as e:  # a bug or an unexpected fairseq output: record it, go on
                    self._fail(p, f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(i, s), daemon=True) for i, s in enumerate(self.slots)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
        with self.lock:  # every started run released (finished, failed or stopped)
            while not self.stop.is_set() and not all(p.released for p in self.progress):
                self.finished.wait(0.5)
        for e in self.evaluators.values():
            if self.stop.is_set():
                e.stop()
            else:
                e.close()
        if errors:
            raise LnposError(errors[0])
