"""Run the paper's grid (runs.py) with fairseq: train, evaluate every epoch, resume, record divergence.

    scripts/grid.sh list
    scripts/grid.sh run --dry-run [--only NAME,...]
    scripts/grid.sh run --only 'iwslt-postln-adam-*' --data data-bin/iwslt14.de-en --out grid-out
    scripts/grid.sh run --arch-size tiny --data data-bin/synthetic --max-epoch 3      # CPU

Layout of one run: OUT/NAME/seedS/{config.json, train.log, checkpoints/, eval/epochN.json,
eval/epochN.hyp, DONE.json}. DONE.json is written (atomically) only after the last evaluation:
a run with it is never redone; any other run resumes from checkpoints/checkpoint_last.pt (fairseq's
own resume). config.json holds a hash of everything that determines the results; a run dir made
with another config is refused.
"""
import argparse
import ctypes
import fcntl
import hashlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..data.manifest import ManifestError, read_manifest
from . import runs as R
from .evaluate import USER_DIR, console_script, evaluate_checkpoint, generate_cmd


class GridError(Exception):
    """A user error: printed as one line, exit status 2."""


# ----------------------------------------------------------------------------- commands


def arch_name(run, size):
    suffix = "tiny" if size == "tiny" else R.DATASETS[run.dataset]["arch_suffix"]
    return f"transformer_{run.ln}_{suffix}"


def batch_plan(run, world):
    """(--max-tokens, --update-freq) so that one update sees ``run.batch_tokens`` tokens."""
    per_step = run.max_tokens * world
    if run.batch_tokens % per_step == 0:
        return run.max_tokens, run.batch_tokens // per_step
    if run.batch_tokens < per_step and run.batch_tokens % world == 0:
        return run.batch_tokens // world, 1
    raise GridError(
        f"{run.name}: an update of {run.batch_tokens} tokens cannot be split over {world} GPU(s) x "
        f"{run.max_tokens} tokens; pick --set max_tokens=N with N x GPUs dividing {run.batch_tokens}"
    )


def optimizer_args(run):
    if run.optimizer == "sgd":
        return ["--optimizer", "sgd", "--momentum", str(run.momentum), "--weight-decay", str(run.weight_decay)]
    return ["--optimizer", run.optimizer, "--adam-betas", run.adam_betas, "--adam-eps", str(run.adam_eps),
            "--weight-decay", str(run.weight_decay)]


def schedule_args(run, total_updates):
    lr = ["--lr", str(run.lr)]
    if run.schedule == "inverse_sqrt":
        # the paper's T_warmup = 1 means no warm-up: the first update runs at lr_max
        return ["--lr-scheduler", "warmup_inverse_sqrt", *lr, "--warmup-updates", str(max(run.warmup, 1)),
                "--decay-anchor", str(max(run.decay_anchor, run.warmup, 1))]
    if run.schedule == "step_decay":
        a = ["--lr-scheduler", "step_decay", *lr, "--decay-epoch", str(run.decay_epoch),
             "--decay-factor", str(run.decay_factor)]
        return a + (["--inverse-sqrt-after-decay"] if run.inverse_sqrt_after_decay else [])
    if run.schedule == "linear":
        return ["--lr-scheduler", "polynomial_decay", *lr, "--power", "1", "--end-learning-rate", "0",
                "--warmup-updates", "0", "--total-num-update", str(total_updates)]
    if run.schedule == "fixed":
        return ["--lr-scheduler", "fixed", *lr]
    raise GridError(f"{run.name}: unknown schedule {run.schedule!r}")


@dataclass
class Job:
    run: R.Run
    seed: int
    data: Path
    run_dir: Path
    arch: str
    langs: tuple
    opts: argparse.Namespace
    index: int = 0
    # progress, written by the worker thread and read by the printer
    state: str = "pending"
    epoch: int = 0
    updates: int = 0
    loss: str = ""
    status: str = ""
    epoch_times: list = field(default_factory=list)

    @property
    def label(self):
        return f"{self.run.name} seed {self.seed}"

    @property
    def save_dir(self):
        return self.run_dir / "checkpoints"

    def config(self):
        """Everything that determines the results (not the GPUs used)."""
        o = self.opts
        return {"run": self.run.as_dict(), "seed": self.seed, "data": str(self.data), "arch": self.arch,
                "fp16": o.fp16, "fairseq_args": o.fairseq_args, "beam": o.beam, "lenpen": o.lenpen,
                "gen_args": o.gen_args}

    def config_hash(self):
        return hashlib.sha256(json.dumps(self.config(), sort_keys=True).encode()).hexdigest()[:16]

    def train_cmd(self, total_updates="<updates per epoch x {e}>", display=False):
        r, o = self.run, self.opts
        max_tokens, update_freq = batch_plan(r, o.world)
        if isinstance(total_updates, str):
            total_updates = total_updates.format(e=r.max_epoch)
        exe = "fairseq-train" if display else console_script("fairseq-train")
        cmd = [exe, str(self.data), "--user-dir", str(USER_DIR), "--task", o.task or r.task,
               "--source-lang", self.langs[0], "--target-lang", self.langs[1],
               "--arch", self.arch, "--dropout", str(r.dropout),
               *optimizer_args(r), "--clip-norm", str(r.clip_norm), *schedule_args(r, total_updates),
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(r.label_smoothing),
               "--max-tokens", str(max_tokens), "--update-freq", str(update_freq),
               "--max-epoch", str(r.max_epoch), "--seed", str(self.seed),
               "--save-dir", str(self.save_dir),
               "--log-format", "json", "--log-interval", str(o.log_interval)]
        if o.world > 1:
            cmd += ["--distributed-world-size", str(o.world)]
        if o.fp16:
            cmd += ["--fp16"]
        return cmd + list(r.extra) + shlex.split(o.fairseq_args)

    def eval_cmd(self, epoch, manifest, display=False):
        cmd = generate_cmd(self.data, self.save_dir / f"checkpoint{epoch}.pt", manifest, self.opts.beam,
                           self.opts.lenpen, extra=self.gen_extra())
        if display:
            cmd[0] = "fairseq-generate"
        return cmd

    def gen_extra(self):
        return (["--fp16"] if self.opts.fp16 else []) + shlex.split(self.opts.gen_args)


def updates_per_epoch(job):
    """Updates in one epoch of ``job``'s training data, from fairseq's own parsing and batching."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), job.train_cmd(1)[1:])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, combine=False, epoch=1)
    itr = task.get_batch_iterator(
        task.dataset(cfg.dataset.train_subset), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size, max_positions=task.max_positions(),
        ignore_invalid_inputs=True, required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=job.seed, num_shards=job.opts.world, shard_id=0, epoch=1)
    return math.ceil(len(itr) / cfg.optimization.update_freq[0])


# ----------------------------------------------------------------------------- fairseq's log

LOG_LINE = re.compile(r"^\S+ \S+ \| \w+ \| (\S+) \| (.*)$")
SAVED = re.compile(r"Saved checkpoint (\S+) \(epoch (\d+) @ (\d+) updates")
LOADED = re.compile(r"Loaded checkpoint \S+ \(epoch (\d+) @ (\d+) updates\)")
FATAL_FP = re.compile(r"FloatingPointError|Minimum loss scale reached|gradients are Nan/Inf")


def _finite(value):
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


class LogState:
    """What fairseq's log says so far: per-epoch valid/train stats, saved epochs, updates, divergence."""

    def __init__(self):
        self.valid, self.train, self.saved = {}, {}, {}
        self.updates, self.loss, self.nonfinite_at, self.fatal_fp = 0, "", None, False

    def feed(self, line):
        m = LOG_LINE.match(line)
        if m is None:
            if FATAL_FP.search(line):
                self.fatal_fp = True
            return None
        name, msg = m.groups()
        if FATAL_FP.search(msg):
            self.fatal_fp = True
        if msg.startswith("{"):
            try:
                rec = json.loads(msg)
            except json.JSONDecodeError:
                return None
            if name == "train_inner":
                self.updates = int(rec.get("num_updates", self.updates))
                self.loss = rec.get("loss", "")
                if self.nonfinite_at is None and not _finite(self.loss):
                    self.nonfinite_at = self.updates
            elif name == "valid":
                self.valid[int(rec["epoch"])] = rec
                if self.nonfinite_at is None and not _finite(rec.get("valid_loss")):
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
        return None


class LogTail:
    def __init__(self, path, state, offset=0):
        self.path, self.state, self.offset, self.buf = Path(path), state, offset, b""

    def poll(self):
        """Feed new complete lines to the state; return the epochs whose checkpoint was saved."""
        saved = []
        if not self.path.exists():
            return saved
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if self.state.feed(line) == "saved":
                saved.append(int(SAVED.search(line).group(2)))
        return saved


# ----------------------------------------------------------------------------- files


def write_json(path, obj):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def check_run_dir(job):
    """Refuse a run dir that holds another config."""
    cfg = read_json(job.run_dir / "config.json")
    if cfg is not None and cfg.get("hash") != job.config_hash():
        raise GridError(
            f"{job.run_dir} was made with a different config (hash {cfg.get('hash')} != "
            f"{job.config_hash()}): use another --out or delete that folder; results are not mixed"
        )


def _pdeathsig():
    """Child dies with the grid even when the grid is killed with SIGKILL (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# ----------------------------------------------------------------------------- one run


class Stopped(Exception):
    pass


class Grid:
    def __init__(self, jobs, opts):
        self.jobs, self.opts = jobs, opts
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.procs = set()
        self.t0 = time.time()
        self.failed = False
        self.progress_log = Path(opts.out) / "progress.log"

    # progress ---------------------------------------------------------------
    def say(self, msg=None):
        with self.lock:
            n = len(self.jobs)
            done = sum(j.state in ("done", "skipped") for j in self.jobs)
            active = [j for j in self.jobs if j.state == "running"]
            parts = [f"[grid {fmt_time(time.time() - self.t0)}] {done}/{n} runs done"]
            for j in active:
                parts.append(f"run {j.index}/{n} {j.label}: epoch {j.epoch}/{j.run.max_epoch}, "
                             f"update {j.updates}" + (f", loss {j.loss}" if j.loss else ""))
            parts.append(f"ETA {self.eta()}")
            line = " | ".join(parts) + (f" | {msg}" if msg else "")
            print(line, flush=True)
            with open(self.progress_log, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def eta(self):
        times = [t for j in self.jobs for t in j.epoch_times]
        if not times:
            return "?"
        left = sum(max(j.run.max_epoch - j.epoch, 0) for j in self.jobs if j.state in ("pending", "running"))
        return fmt_time(sum(times) / len(times) * left / max(1, len(self.opts.slots)))

    # subprocesses -----------------------------------------------------------
    def popen(self, cmd, env, lock_fd, **kw):
        if self.stop.is_set():
            raise Stopped()
        p = subprocess.Popen(cmd, env=env, preexec_fn=_pdeathsig, start_new_session=True,
                             pass_fds=(lock_fd,), **kw)
        with self.lock:
            self.procs.add(p)
        return p

    def release(self, p):
        with self.lock:
            self.procs.discard(p)

    def kill_all(self):
        self.stop.set()
        with self.lock:
            procs = list(self.procs)
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    # one run ----------------------------------------------------------------
    def execute(self, job, slot):
        job.run_dir.mkdir(parents=True, exist_ok=True)
        if (job.run_dir / "DONE.json").exists():
            job.state = "skipped"
            self.say(f"{job.label}: already {read_json(job.run_dir / 'DONE.json')['status']}, not redone")
            return
        lock_fd = os.open(job.run_dir / ".lock", os.O_CREAT | os.O_RDWR)
        try:
            self._lock(job, lock_fd)
            job.state = "running"
            self._execute(job, slot, lock_fd)
        finally:
            os.close(lock_fd)

    def _lock(self, job, fd):
        deadline = time.time() + 60  # a killed grid's fairseq child may still be exiting
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.time() > deadline:
                    raise GridError(f"{job.run_dir} is in use by another grid (lock {job.run_dir / '.lock'})")
                time.sleep(1)

    def _execute(self, job, slot, lock_fd):
        write_json(job.run_dir / "config.json", {"hash": job.config_hash(), **job.config()})
        (job.run_dir / "eval").mkdir(exist_ok=True)
        env = dict(os.environ)
        if slot is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot
        elif len(self.opts.slots) > 1:  # CPU runs side by side share the cores
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // len(self.opts.slots)))
        manifest = read_manifest(job.data)
        log_path = job.run_dir / "train.log"
        state = LogState()
        LogTail(log_path, state).poll()  # the history of earlier launches
        job.epoch, job.updates = max(state.saved, default=0), state.updates
        diverged = None
        if not (job.run_dir / "TRAINED").exists():
            total = updates_per_epoch(job) * job.run.max_epoch if job.run.schedule == "linear" else 0
            cmd = job.train_cmd(total)
            tail = LogTail(log_path, state, offset=log_path.stat().st_size if log_path.exists() else 0)
            fresh = LogState()
            tail.state = fresh
            fresh.updates = state.updates
            with open(log_path, "ab") as log:
                log.write(f"# grid: {shlex.join(cmd)}\n".encode())
                log.flush()
                proc = self.popen(cmd, env, lock_fd, stdout=log, stderr=subprocess.STDOUT)
            self.say(f"{job.label}: training ({'resumed' if state.saved else 'new'}), log {log_path}")
            t_epoch = time.time()
            try:
                while True:
                    ended = proc.poll() is not None
                    for ep in tail.poll():
                        job.epoch = ep
                        job.epoch_times.append(time.time() - t_epoch)
                        self._evaluate(job, ep, manifest, {**state.valid, **fresh.valid},
                                       {**state.train, **fresh.train}, fresh.saved[ep], env, lock_fd)
                        t_epoch = time.time()
                    job.updates, job.loss = fresh.updates, fresh.loss
                    if fresh.nonfinite_at is not None and not ended:
                        os.killpg(proc.pid, signal.SIGTERM)
                        proc.wait()
                        ended = True
                    if ended:
                        tail.poll()
                        break
                    if self.stop.is_set():
                        raise Stopped()
                    time.sleep(0.5)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait()
                self.release(proc)
            state.valid.update(fresh.valid)
            state.train.update(fresh.train)
            state.saved.update(fresh.saved)
            if self.stop.is_set():
                raise Stopped()
            if fresh.nonfinite_at is not None:
                diverged = fresh.nonfinite_at
            elif proc.returncode != 0 and fresh.fatal_fp:
                diverged = fresh.updates + 1  # fairseq raised before counting the failing update
            elif proc.returncode != 0:
                raise RunFailed(f"fairseq-train exited {proc.returncode}; see {log_path}")
            elif max(state.saved, default=0) < job.run.max_epoch and "--max-update" not in job.opts.fairseq_args:
                raise RunFailed(f"fairseq-train exited 0 but saved only {max(state.saved, default=0)} of "
                                f"{job.run.max_epoch} epochs; see {log_path}")
            else:
                (job.run_dir / "TRAINED").write_text("")
        # epochs saved in an earlier launch and not evaluated before an interruption
        for ep in sorted(state.saved):
            if not (job.run_dir / "eval" / f"epoch{ep}.json").exists():
                self._evaluate(job, ep, manifest, state.valid, state.train, state.saved[ep], env, lock_fd)
        status = f"diverged at update {diverged}" if diverged else "finished"
        write_json(job.run_dir / "DONE.json", {"status": status, "diverged_at": diverged,
                                               "epochs": sorted(state.saved)})
        job.state, job.status = "done", status
        self.say(f"{job.label}: {status}")

    def _evaluate(self, job, epoch, manifest, valid, train, updates, env, lock_fd):
        out = job.run_dir / "eval" / f"epoch{epoch}.json"
        ckpt = job.save_dir / f"checkpoint{epoch}.pt"
        if out.exists():
            return
        if not ckpt.exists():
            raise RunFailed(f"{ckpt} is missing, so epoch {epoch} cannot be evaluated; delete "
                            f"{job.run_dir} to redo the run")
        if self.stop.is_set():
            raise Stopped()
        t = time.time()
        try:
            res = evaluate_checkpoint(job.data, ckpt, manifest, job.opts.beam, job.opts.lenpen,
                                      extra=job.gen_extra(), hyp_out=job.run_dir / "eval" / f"epoch{epoch}.hyp",
                                      env=env, log=job.run_dir / "eval.log", runner=lambda c, **kw: self._run(c, env, lock_fd, **kw))
        except RuntimeError as e:
            if self.stop.is_set():
                raise Stopped() from None
            raise RunFailed(str(e)) from None
        v, tr = valid.get(epoch, {}), train.get(epoch, {})
        rec = {"epoch": epoch, "num_updates": updates, **res,
               "valid_loss": _num(v.get("valid_loss")), "valid_nll_loss": _num(v.get("valid_nll_loss")),
               "train_loss": _num(tr.get("train_loss")), "lr": _num(tr.get("train_lr"))}
        write_json(out, rec)
        if not self.opts.keep_checkpoints:
            ckpt.unlink()
        self.say(f"{job.label}: epoch {epoch} tok BLEU {res['bleu_tok']}, sacreBLEU "
                 f"{res.get('sacrebleu', '-')}, valid loss {rec['valid_loss']} ({time.time() - t:.0f}s eval)")

    def _run(self, cmd, env, lock_fd, **kw):
        p = self.popen(cmd, env, lock_fd, **kw)
        try:
            out, err = p.communicate()
        finally:
            self.release(p)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    # the whole grid ---------------------------------------------------------
    def run(self):
        queue = list(self.jobs)
        qlock = threading.Lock()
        errors = []

        def worker(slot):
            while not self.stop.is_set():
                with qlock:
                    if not queue:
                        return
                    job = queue.pop(0)
                try:
                    self.execute(job, slot)
                except Stopped:
                    return
                except RunFailed as e:
                    job.state, job.status = "done", f"failed: {e}"
                    self.failed = True
                    self.say(f"{job.label}: FAILED: {e} (re-run to retry)")
                except (GridError, ManifestError) as e:
                    errors.append(str(e))
                    self.kill_all()
                    return
                except Exception as e:  # a bug or an unexpected fairseq output: record it, go on
                    job.state, job.status = "done", f"failed: {type(e).__name__}: {e}"
                    self.failed = True
                    self.say(f"{job.label}: FAILED: {type(e).__name__}: {e} (re-run to retry)")

        threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in self.opts.slots]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
        if errors:
            raise GridError(errors[0])


class RunFailed(Exception):
    pass


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def fmt_time(s):
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


# ----------------------------------------------------------------------------- CLI


def parse_data(values):
    """--data DIR (all datasets) or --data iwslt14=DIR (repeatable)."""
    out = {}
    for v in values or []:
        key, sep, path = v.partition("=")
        if sep and key in R.DATASETS:
            out[key] = Path(path)
        else:
            out["*"] = Path(v)
    return out


def parse_sets(values, runs):
    """--set [RUN:]key=value: change a field of every selected run (or of one run)."""
    runs = {r.name: r for r in runs}
    for v in values or []:
        target, _, assign = v.rpartition(":") if ":" in v.split("=", 1)[0] else ("", "", v)
        key, sep, value = assign.partition("=")
        if not sep:
            raise GridError(f"--set {v}: expected key=value or RUN:key=value")
        if target and target not in runs:
            raise GridError(f"--set {v}: run {target!r} is not selected (see --only)")
        for name in [target] if target else list(runs):
            try:
                runs[name] = R.coerce(runs[name], key, value)
            except R.RunTableError as e:
                raise GridError(str(e)) from None
    return list(runs.values())


def make_jobs(opts, dry_run):
    try:
        selected = R.select(opts.only.split(",") if opts.only else None)
    except R.RunTableError as e:
        raise GridError(str(e)) from None
    selected = [r.with_defaults() for r in parse_sets(opts.set, selected)]
    if opts.max_epoch is not None:
        selected = [R.coerce(r, "max_epoch", str(opts.max_epoch)) for r in selected]
    data = parse_data(opts.data)
    seeds = [int(s) for s in str(opts.seeds).split(",") if s.strip()]
    jobs = []
    manifests = {}
    for r in selected:
        d = data.get(r.dataset, data.get("*", Path(R.DATASETS[r.dataset]["default_data"])))
        d = d.resolve()
        if d not in manifests:
            if not d.is_dir():
                if dry_run:
                    manifests[d] = None
                else:
                    raise GridError(f"data dir {d} not found: prepare it with data-prep/*.sh or pass --data DIR")
            else:
                try:
                    manifests[d] = read_manifest(d)
                except ManifestError as e:
                    if not dry_run:
                        raise GridError(str(e)) from None
                    manifests[d] = None
        m = manifests[d]
        langs = (m["source_lang"], m["target_lang"]) if m else (R.DATASETS[r.dataset]["source_lang"],
                                                                  R.DATASETS[r.dataset]["target_lang"])
        if m and not dry_run and not (d / f"dict.{langs[0]}.txt").exists():
            raise GridError(f"{d} has no dict.{langs[0]}.txt: not a fairseq-preprocess output")
        arch = opts.arch or arch_name(r, opts.arch_size)
        for s in seeds:
            jobs.append(Job(r, s, d, Path(opts.out).resolve() / r.name / f"seed{s}", arch, langs, opts))
    for i, j in enumerate(jobs, 1):
        j.index = i
    return jobs, manifests


def plan_devices(opts, dry_run):
    """Slots of CUDA_VISIBLE_DEVICES values, one per concurrently running run (None = default device)."""
    opts.world = opts.gpus_per_run
    if opts.jobs < 1:
        raise GridError(f"--jobs {opts.jobs}: give at least 1")
    if not opts.gpus:
        if opts.world > 1 and not dry_run:
            _need_cuda(opts.world, f"--gpus-per-run {opts.world}")
        opts.slots = [None] * opts.jobs
        return
    if opts.jobs != 1:
        raise GridError("--jobs is for CPU runs; with --gpus, runs go side by side one per GPU slot")
    ids = [g.strip() for g in opts.gpus.split(",") if g.strip()]
    if not ids:
        raise GridError("--gpus lists no GPU: give ids like --gpus 0,1, or drop --gpus to use the default device")
    if len(set(ids)) != len(ids):
        raise GridError(f"--gpus {opts.gpus}: a GPU is listed twice")
    if len(ids) % opts.world:
        raise GridError(f"--gpus {opts.gpus}: {len(ids)} GPUs do not split into runs of --gpus-per-run {opts.world}")
    if not dry_run:
        n = _need_cuda(len(ids), f"--gpus {opts.gpus}")
        bad = [g for g in ids if not g.isdigit() or int(g) >= n]
        if bad:
            raise GridError(f"--gpus: no GPU {', '.join(bad)} on this machine (it has {n}: 0..{n - 1})")
    opts.slots = [",".join(ids[i:i + opts.world]) for i in range(0, len(ids), opts.world)]


def _need_cuda(k, what):
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise GridError(
            f"{what}: no CUDA GPU is visible here, and fairseq's multi-GPU training would train nothing "
            f"on the CPU while exiting 0; drop the option to train on the CPU"
        )
    if k > n:
        raise GridError(f"{what}: needs {k} GPUs but this machine has {n}")
    return n


def cmd_list(opts):
    rows = [("run", "arch", "optimizer", "lr", "warm-up", "schedule", "epochs", "paper")]
    for r in (x.with_defaults() for x in R.RUNS):
        sched = r.schedule + (f"@{r.decay_epoch}" if r.decay_epoch else "")
        paper = (f"{r.paper_bleu:g} BLEU" if r.paper_bleu is not None else "") or r.paper_note
        rows.append((r.name, arch_name(r, opts.arch_size), r.optimizer, f"{r.lr:g}", r.warmup_label, sched,
                     str(r.max_epoch), paper if len(paper) < 50 else paper[:47] + "..."))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"\n{len(R.RUNS)} runs; defaults the paper does not state: see fairseq_lnpos/experiments/runs.py")


def cmd_run(opts):
    plan_devices(opts, opts.dry_run)
    if opts.fp16 and not opts.dry_run:
        _need_cuda(1, "--fp16")
    jobs, manifests = make_jobs(opts, opts.dry_run)
    for j in jobs:
        check_run_dir(j)
        batch_plan(j.run, opts.world)
    if opts.dry_run:
        for j in jobs:
            m = manifests.get(j.data) or {"source_lang": j.langs[0], "target_lang": j.langs[1],
                                          "post_process": "sentencepiece"}
            total = "<updates per epoch x {e}>"
            if j.run.schedule == "linear" and manifests.get(j.data):
                total = updates_per_epoch(j) * j.run.max_epoch
            print(f"# [{j.index}/{len(jobs)}] {j.label} -> {j.run_dir}")
            print(shlex.join(j.train_cmd(total, display=True)))
            ev = shlex.join(j.eval_cmd(999, m, display=True)).replace("checkpoint999.pt", "checkpoint$E.pt")
            print(f"for E in $(seq 1 {j.run.max_epoch}); do {ev}; done  # then score (evaluate.py)\n")
        return 0
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    grid = Grid(jobs, opts)

    def on_signal(signum, frame):
        grid.kill_all()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    grid.say(f"{len(jobs)} runs -> {Path(opts.out).resolve()}")
    grid.run()
    if grid.stop.is_set():
        print("grid: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    grid.say("all runs processed; table: scripts/make_table.sh " + str(opts.out))
    return 1 if grid.failed else 0


def build_parser():
    p = argparse.ArgumentParser(prog="grid.sh", description="The paper's experiment grid on fairseq.")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="show the table of runs")
    ls.add_argument("--arch-size", choices=("paper", "tiny"), default="paper")
    r = sub.add_parser("run", help="train and evaluate runs (or print their commands with --dry-run)")
    r.add_argument("--dry-run", action="store_true", help="print the fairseq commands and exit")
    r.add_argument("--only", help="comma-separated run names or globs (default: every run)")
    r.add_argument("--data", action="append", metavar="[DATASET=]DIR",
                   help="binarized data dir for every run, or per dataset (iwslt14=DIR, wmt14=DIR)")
    r.add_argument("--out", default="grid-out", help="output folder (default grid-out)")
    r.add_argument("--seeds", default="1", help="comma-separated seeds (default 1, fairseq's default)")
    r.add_argument("--arch-size", choices=("paper", "tiny"), default="paper",
                   help="tiny: the transformer_*_tiny archs (CPU)")
    r.add_argument("--arch", help="use this fairseq arch for every run (overrides --arch-size)")
    r.add_argument("--max-epoch", type=int, help="override the epochs of every run")
    r.add_argument("--set", action="append", metavar="[RUN:]KEY=VALUE",
                   help="change a field of the run table (runs.py) for every selected run or one run")
    r.add_argument("--task", help="fairseq task for every run (e.g. translation_lnpos)")
    r.add_argument("--fairseq-args", default="", help="extra fairseq-train flags, one string")
    r.add_argument("--gen-args", default="", help="extra fairseq-generate flags, one string")
    r.add_argument("--beam", type=int, default=5)
    r.add_argument("--lenpen", type=float, default=1.2)
    r.add_argument("--gpus", help="GPU ids, e.g. 0,1: independent runs side by side")
    r.add_argument("--jobs", type=int, default=1,
                   help="CPU only: runs side by side, sharing the cores (OMP_NUM_THREADS = cores / jobs)")
    r.add_argument("--gpus-per-run", type=int, default=1,
                   help="GPUs per run (fairseq distributed); --update-freq keeps the paper's batch")
    r.add_argument("--fp16", action="store_true", help="mixed precision (GPU only)")
    r.add_argument("--log-interval", type=int, default=1,
                   help="fairseq --log-interval (1: divergence is located to the update)")
    r.add_argument("--keep-checkpoints", action="store_true",
                   help="keep checkpointN.pt after evaluation (default: keep only _best and _last)")
    return p


def main(argv=None):
    opts = build_parser().parse_args(argv)
    try:
        if opts.cmd == "list":
            cmd_list(opts)
            return 0
        if opts.gpus_per_run < 1:
            raise GridError("--gpus-per-run must be at least 1")
        return cmd_run(opts)
    except GridError as e:
        print(f"grid: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
