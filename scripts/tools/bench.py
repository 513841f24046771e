"""Benchmarks, measured side by side in one process (``scripts/bench.sh``, ``make bench``).

* training throughput (target tokens/s through fairseq's own ``Trainer.train_step``) of each
  plugin architecture as a ratio to fairseq's ``transformer`` with the same sizes and flags and the
  variant's LayerNorm placement (``variants.VARIANTS``: Pre-LN against
  ``--encoder-normalize-before --decoder-normalize-before``, every other variant against Post-LN);
* the overhead of ``--log-grad-norms`` at intervals 1 and 100, as a ratio to the same run
  without it, and as the time spent inside the hook itself;
* the overhead of the task's ``--log-diagnostics`` (:mod:`fairseq_lnpos.diagnostics`) on every
  update and as the real-text studies log (the first 20 updates, then every 50th), measured the same
  way against the same run without it, and the share of the time spent inside the diagnostics' own
  work; reported without a target;
* bfloat16 autocast on the CPU (``--cpu-autocast-bf16``, :mod:`fairseq_lnpos.precision`): per-update
  time in float32 over time under autocast, Post-LN and Pre-LN at every size, on batches of
  Multi30k's CPU size (1024 tokens). On a CPU without bfloat16 instructions, where the option is
  refused, the same models are timed with the task's autocast switched on directly (bfloat16 as
  torch emulates it), and the result says so;
* with ``--startup N``, what the grid's fork server (:mod:`fairseq_lnpos.forkserver`) saves: N short
  fairseq-train runs of one configuration as processes of their own and N forked from one server,
  taking turns; total wall time and CPU time of the fresh processes over those of the server (its
  start included);
* with ``--sweep-cells N``, what a sweep saves by validating only at a cell's last update (the
  validation its map reads; ``commands.Job.unread_work_args``): N cells of the all-architecture map
  (Post-LN, lr 1e-3, width 96, 200 updates on the demo's corpus, whose epochs are ~100 updates)
  validated at every epoch's end as before and N as the sweep runs them, forked from one fork
  server, taking turns; CPU time of the first over the second, and each pair's final validation
  NLL, which must be the same;
* the wall time of the Fig. 3 analysis (``scripts/init_grad_analysis.sh``) with its defaults.

Timing: every configuration trains on the same batches; the configurations take turns at every
update (in a rotating order), so each update of a plugin model has a partner update of fairseq's
model on the same batch, measured moments apart. A ratio is the median of these per-update
ratios, with a bootstrap 95 % confidence interval of that median: on a shared or virtual CPU a
single update's time varies by 5-15 %, and only the interval says whether a 1 % target is
resolved. Work counts (aten operator calls, elements they write, matmul FLOPs of one training
update, counted by PyTorch's dispatcher) are exact and say what an extra cost consists of.
Beside each timing, how close it is to the machine's limit: the matmul FLOPs of one update over its
median time, the achieved FLOP/s, against the float32 matmul peak measured at the start on the same
device and threads (:func:`matmul_peak`: the best of repeated square ``torch.mm`` calls of
:data:`PEAK_N`, each ``2 n^3`` FLOPs). Only matmuls are counted (elementwise work, LayerNorm, softmax
and the optimizer are not), so the fraction is a lower bound on how busy the arithmetic units are.
Results go to a JSON file. Python callers use :func:`benchmark` and :func:`summary`.
"""
import gc
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

from fairseq_lnpos.common import open_fd, open_log, write_json
from fairseq_lnpos.cli import CommandParser, comma_list
from fairseq_lnpos.errors import check, run_main
from fairseq_lnpos.launch import NO_WARMUP, adam, train_args
from fairseq_lnpos.variants import SIZES, THROUGHPUT_TARGETS, TINY, VARIANTS, arch_name

# --log-grad-norms: time with / time without, minus 1, at most this (percent)
OVERHEAD_TARGETS = {"interval_1": 5.0, "interval_100": 1.0}
# --log-diagnostics, timed in two settings against the same run without it: every update, and as the
# real-text studies log (docs/results/README.md: the first 20 updates, then every 50th). No target: the
# diagnostics are an instrument a study switches on, and what they cost is reported, not judged
DIAGNOSTICS_SETTINGS = {"interval_1": ("--diagnostics-interval", "1"),
                        "first_20_interval_50": ("--diagnostics-first", "20", "--diagnostics-interval", "50")}
DEFAULT_SIZES = ("tiny", "iwslt_de_en")
# fewer paired updates than this give no verdict: the bootstrap interval of the median of a few
# ratios spans about their whole range, so one update slowed by another process (a ratio of 10 on a
# shared CPU) decides it; --quick times 2 x 2 = 4, the defaults 5 x 20 = 100
MIN_PAIRS = 20
# --cpu-autocast-bf16: time in float32 / time under autocast, at least this (per size)
AUTOCAST_TARGETS = {"tiny": 1.4}
AUTOCAST_VARIANTS = ("postln", "preln")
AUTOCAST_MAX_TOKENS = 1024  # Multi30k's batches on the CPU (runs.DATASETS["multi30k_cpu"])
NORMALIZE_BEFORE = ("--encoder-normalize-before", "--decoder-normalize-before")
PEAK_N = 1024  # the float32 peak: square matmuls of this size (4 MB operands: past a CPU's caches' tricks)
PEAK_REPS = 20


def mm_flops(m, k, n):
    """FLOPs of an (m x k) @ (k x n) matmul, a multiply and an add per term: 2 m k n (the convention of
    torch.utils.flop_counter, whose counts the work columns report)."""
    return 2 * m * k * n


def matmul_peak(n=PEAK_N, reps=PEAK_REPS, device="cpu", dtype=None):
    """The measured float32 matmul peak: the best FLOP/s of ``reps`` timed ``torch.mm`` calls of two n x n
    matrices (after one untimed call) on ``device`` with torch's threads as they are set."""
    import torch

    dtype = dtype or torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - start)
    return {"n": n, "reps": reps, "dtype": str(dtype).replace("torch.", ""), "device": device,
            "threads": torch.get_num_threads(), "best_seconds": best, "flops_per_second": mm_flops(n, n, n) / best}


def achieved(work, seconds_per_update, peak):
    """The matmul FLOP/s one update achieved (its matmul FLOPs over its median seconds) and the share of
    the measured peak (``peak``: FLOP/s; None where no peak was measured)."""
    rate = work["matmul_flops"] / seconds_per_update
    return {"flops_per_second": rate, "peak_fraction": rate / peak if peak else None}


def baseline(variant):
    """fairseq's own ``transformer`` with the variant's LayerNorm placement: (name, flags).

    Every variant is compared with the model it modifies: Pre-LN placements with fairseq's
    Pre-LN, all others with fairseq's Post-LN."""
    if VARIANTS[variant].normalize_before:
        return "fairseq_preln", list(NORMALIZE_BEFORE)
    return "fairseq_postln", []


def fairseq_size(size):
    """fairseq's own arch and flags with the dimensions of the plugin's archs of ``size``."""
    if size == "tiny":  # fairseq has no tiny arch: its base arch with the registry's tiny dimensions
        return "transformer", [f for side in ("encoder", "decoder") for key, value in TINY.items()
                               for f in (f"--{side}-{key.replace('_', '-')}", str(value))]
    return "transformer" + SIZES[size], []


def make_trainer(data, arch, extra=(), max_tokens=2048, device="cpu", save_dir=None):
    """A fairseq Trainer built exactly as fairseq-train builds it, and a list of its batches."""
    from fairseq.trainer import Trainer

    from fairseq_lnpos.fairseq_build import build

    argv = train_args(data, arch, max_tokens=max_tokens, task=None if "--task" in extra else "translation",
                      optim=[*adam(5e-4), *NO_WARMUP], seed=1, save_dir=save_dir,
                      extra=["--no-progress-bar", *extra, *(["--cpu"] if device == "cpu" else [])])
    _, cfg, task, model = build(argv, seed=1)
    task.load_dataset("train")
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    itr = task.get_batch_iterator(dataset=task.dataset("train"), max_tokens=max_tokens, seed=1,
                                  max_positions=(1024, 1024)).next_epoch_itr(shuffle=False)
    return trainer, itr


def _time_hook(trainer, spent):
    """Add the seconds spent in ``--log-grad-norms``' own work (norms, logging) to ``spent[0]`` and
    count the logged updates in ``spent[1]``."""
    logger = getattr(trainer.task, "grad_norm_logger", None)
    if logger is None:
        return
    for name in ("measure", "record"):
        inner = getattr(logger, name)

        def timed(*args, _inner=inner, _logged=int(name == "record"), **kwargs):
            start = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
                spent[1] += _logged

        setattr(logger, name, timed)


def _time_diagnostics(trainer, spent):
    """Add the seconds spent in ``--log-diagnostics``' own work to ``spent[0]`` and count the logged
    updates in ``spent[1]``. The task's :class:`~fairseq_lnpos.diagnostics.Diagnostics`
    (``task.diagnostics``) sums its own seconds of a logged update in ``overhead`` (the forward
    hooks, the weights' copy before the step, the record) and starts again from 0 at the next
    logged update: they are read when it writes the record, and the writing is timed too."""
    diagnostics = getattr(trainer.task, "diagnostics", None)
    if diagnostics is None:
        return
    inner = diagnostics.write

    def write(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += diagnostics.overhead + time.perf_counter() - start
            spent[1] += 1

    diagnostics.write = write


def measure(configs, data, steps, reps, log, max_tokens, device, save_dir, prepare=None):
    """``configs``: name -> (arch, extra flags). Every configuration trains on the same ``steps``
    batches ``reps`` times, the configurations taking turns at every update. ``prepare``: name ->
    a function called with that configuration's trainer once it is built.

    Returns (name -> seconds of each timed update, name -> seconds inside the grad-norm hook or the
    diagnostics, name -> work counts of one update, name -> how many timed updates they logged).
    The update that counts the work comes after the timed ones: the second and last leave it out."""
    import torch

    built, hook = {}, {}
    for name, (arch, extra) in configs.items():
        trainer, itr = make_trainer(data, arch, extra, max_tokens, device, Path(save_dir) / name)
        if prepare and name in prepare:
            prepare[name](trainer)
        batches = list(islice(itr, steps + 1))
        check(len(batches) == steps + 1, f"{data} has fewer than {steps + 1} training batches: use --steps")
        trainer.train_step([batches[0]])  # lazy optimizer state, allocator warm-up: not timed
        hook[name] = [0.0, 0]
        _time_hook(trainer, hook[name])
        _time_diagnostics(trainer, hook[name])
        built[name] = (trainer, batches[1:])
    names = list(built)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    seconds = {name: [] for name in names}
    start_all = time.time()
    gc.collect()
    gc.disable()  # a collection inside one update would land on whichever configuration runs then
    try:
        for r in range(reps):
            for i in range(steps):
                k = (r * steps + i) % len(names)
                for name in names[k:] + names[:k]:
                    trainer, batches = built[name]
                    sync()
                    start = time.perf_counter()
                    trainer.train_step([batches[i]])
                    sync()
                    seconds[name].append(time.perf_counter() - start)
            gc.collect()
            elapsed = time.time() - start_all
            log(f"  rep {r + 1}/{reps} ({elapsed:.0f} s, ETA {elapsed / (r + 1) * (reps - r - 1):.0f} s): "
                + ", ".join(f"{n} {sum(b['ntokens'] for b in built[n][1]) / sum(v[-steps:]):.0f} tok/s"
                            for n, v in seconds.items()))
    finally:
        gc.enable()
    inside, logged = {n: h[0] for n, h in hook.items()}, {n: h[1] for n, h in hook.items()}
    work = {name: work_counts(trainer, batches[0]) for name, (trainer, batches) in built.items()}
    return seconds, inside, work, logged


def work_counts(trainer, batch):
    """Exact work of one training update: aten operator calls, elements of their outputs, and
    matmul FLOPs (``torch.utils.flop_counter``), forward, backward and optimizer step together."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import FlopCounterMode

    class Count(TorchDispatchMode):
        calls = elements = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.calls += 1
            self.elements += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            return out

    flops = FlopCounterMode(display=False)
    with flops, Count() as count:
        trainer.train_step([batch])
    return {"aten_calls": count.calls, "output_elements": count.elements, "matmul_flops": flops.get_total_flops()}


def median_ci(values, resamples=2000, seed=0):
    """Median and a percentile-bootstrap 95 % confidence interval of the median."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    medians = np.median(np.random.default_rng(seed).choice(x, (resamples, len(x))), axis=1)
    lo, hi = np.quantile(medians, [0.025, 0.975])
    return float(np.median(x)), [float(lo), float(hi)]


def paired(numerator, denominator):
    """Per-update ratios numerator[i] / denominator[i]: median, its 95 % CI, quartiles, count."""
    r = [a / b for a, b in zip(numerator, denominator)]
    med, ci = median_ci(r)
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    return {"median": med, "ci95": ci, "quartiles": [q[0], q[2]], "n": len(r)}


def target_reached(ci, target, at_least):
    """'met' when the whole 95 % interval is on the right side of the target, 'missed' when it is
    all on the wrong side, otherwise 'unresolved' (the measurement cannot tell)."""
    lo, hi = ci
    if at_least:
        return "met" if lo >= target else "missed" if hi < target else "unresolved"
    return "met" if hi <= target else "missed" if lo > target else "unresolved"


def work_ratios(work, base):
    return {k: work[k] / base[k] if base[k] else None for k in work}


def judged(r, target, at_least, min_pairs):
    """The verdict of paired result ``r`` against ``target``, or why there is none (too few pairs)."""
    if r["n"] < min_pairs:
        return f"not judged: {r['n']} pairs (< {min_pairs})"
    return target_reached(r["ci95"] if at_least else [100 * (c - 1) for c in r["ci95"]], target, at_least)


def throughput_results(seconds, work, variants, fairseq_arch, min_pairs=MIN_PAIRS, peak=None):
    """Per variant: its per-update times paired with those of its fairseq baseline (same batches,
    so the time ratio is the throughput ratio), the work ratios, the matmul FLOP/s achieved against
    ``peak`` (FLOP/s, :func:`achieved`) and, where a target exists, the verdict. ``seconds``/``work``:
    configuration name -> update times / work counts."""
    out = {}
    for v in variants:
        base, flags = baseline(v)
        r = paired(seconds[base], seconds[v])
        per_update = statistics.median(seconds[v])
        r.update(baseline=" ".join(["fairseq", fairseq_arch, *flags]),
                 seconds_per_update=per_update, work=work[v], achieved=achieved(work[v], per_update, peak),
                 work_ratio=work_ratios(work[v], work[base]),
                 # against fairseq's Post-LN whatever the placement: one reference for every variant
                 to_postln=paired(seconds["fairseq_postln"], seconds[v]))
        if v in THROUGHPUT_TARGETS:
            r.update(target=THROUGHPUT_TARGETS[v], verdict=judged(r, THROUGHPUT_TARGETS[v], True, min_pairs))
        out[v] = r
    return out


def overhead_results(seconds, hook, min_pairs=MIN_PAIRS):
    """``--log-grad-norms`` at each interval against the same model without it ("off"); ``hook``:
    configuration name -> seconds spent inside the hook's own work."""
    out = {}
    for k, target in OVERHEAD_TARGETS.items():
        r = paired(seconds[k], seconds["off"])  # time with / time without
        ci = [100 * (c - 1) for c in r["ci95"]]
        out[k] = {
            "time_ratio": r, "overhead_percent": 100 * (r["median"] - 1), "overhead_percent_ci95": ci,
            "target_percent": target, "verdict": judged(r, target, False, min_pairs),
            # the hook's own work over the rest of the update: the cost without the timing noise
            "hook_percent": 100 * hook[k] / (sum(seconds[k]) - hook[k]),
        }
    return out


def diagnostics_overhead_results(seconds, inside, logged):
    """``--log-diagnostics`` in each of :data:`DIAGNOSTICS_SETTINGS` (configuration
    ``diagnostics_<setting>``) against the same model without it ("off"), without a verdict;
    ``inside``: configuration name -> seconds spent inside the diagnostics' own work, ``logged``: ->
    how many of its timed updates were diagnosed (a sparse setting's median ratio is that of the
    updates not diagnosed; its share inside depends on how many of the timed updates were)."""
    out = {}
    for k, flags in DIAGNOSTICS_SETTINGS.items():
        name = f"diagnostics_{k}"
        r = paired(seconds[name], seconds["off"])  # time with / time without
        out[k] = {
            "flags": " ".join(["--log-diagnostics", *flags]), "time_ratio": r,
            "overhead_percent": 100 * (r["median"] - 1), "overhead_percent_ci95": [100 * (c - 1) for c in r["ci95"]],
            "logged_updates": logged[name], "timed_updates": len(seconds[name]),
            # the share of the time with the diagnostics spent in their own work
            "inside_percent": 100 * inside[name] / sum(seconds[name]),
        }
    return out


def autocast_results(seconds, variants, target=None, min_pairs=MIN_PAIRS):
    """Per variant: its per-update times in float32 (``seconds[v + "_float32"]``) paired with those
    under bfloat16 autocast (``seconds[v + "_bf16"]``) on the same batches: the speed-up, and the
    verdict where the size has a ``target``."""
    out = {}
    for v in variants:
        r = paired(seconds[f"{v}_float32"], seconds[f"{v}_bf16"])
        r.update(seconds_per_update_float32=statistics.median(seconds[f"{v}_float32"]),
                 seconds_per_update_bf16=statistics.median(seconds[f"{v}_bf16"]))
        if target is not None:
            r.update(target=target, verdict=judged(r, target, True, min_pairs))
        out[v] = r
    return out


def measure_autocast(data, sizes, steps, reps, log, save_dir, extra=()):
    """``--cpu-autocast-bf16`` against float32 (:func:`autocast_results` per size), the plugin's
    Post-LN and Pre-LN, on batches of :data:`AUTOCAST_MAX_TOKENS`; where the CPU has no bfloat16
    instructions the task's autocast is switched on directly (emulated bfloat16), at the first size
    only (emulated, an update of the IWSLT model took about 100 s on 2 shared cores; 6 s in float32)."""
    from fairseq_lnpos.precision import FLAG, cpu_bf16_instructions

    found = cpu_bf16_instructions()
    sizes = sizes if found else sizes[:1]
    out = {"cpu_bf16_instructions": list(found), "emulated": not found, "max_tokens": AUTOCAST_MAX_TOKENS,
           "sizes": {}}

    def switch_on(trainer):
        trainer.task.autocast = True

    task = ["--task", "translation_lnpos", *extra]
    for size in sizes:
        configs, prepare = {}, {}
        for v in AUTOCAST_VARIANTS:
            configs[f"{v}_float32"] = (arch_name(v, size), task)
            configs[f"{v}_bf16"] = (arch_name(v, size), task + [FLAG] if found else task)
            if not found:
                prepare[f"{v}_bf16"] = switch_on
        where = "CPU: " + ", ".join(found) if found else "emulated: no bfloat16 instructions on this CPU"
        log(f"bf16 autocast at size {size} ({where}; {reps} reps x {steps} updates)")
        secs, *_ = measure(configs, data, steps, reps, log, AUTOCAST_MAX_TOKENS, "cpu", save_dir, prepare)
        out["sizes"][size] = autocast_results(secs, AUTOCAST_VARIANTS, AUTOCAST_TARGETS.get(size))
    return out


def _popen(cmd, env, **kw):
    """A process in a session of its own, as the grid starts fairseq-train."""
    return subprocess.Popen(cmd, env=env, start_new_session=True, **kw)


def started_fork_server(env):
    """The grid's fork server (:mod:`fairseq_lnpos.forkserver`), ready, its own output discarded; the
    caller closes it."""
    from fairseq_lnpos.forkserver import ForkServer

    with os.fdopen(open_fd(os.devnull, os.O_WRONLY), "wb") as null:
        server = ForkServer(_popen, env, null)
    server.ready.wait()
    return server


def measure_startup(data, runs, log, updates=2, threads=1):
    """``runs`` fairseq-train runs of ``updates`` updates (the tiny Pre-LN model, one thread each) as
    fresh processes and as many forked from one fork server, taking turns: wall and CPU seconds of
    each side, the server's start counted on its side."""
    from fairseq_lnpos.experiments import reap
    from fairseq_lnpos.launch import child_env, script

    env = child_env(threads)
    fresh, forked = [], []
    with tempfile.TemporaryDirectory() as tmp:
        argv = train_args(data, arch_name("preln", "tiny"), max_tokens=AUTOCAST_MAX_TOKENS, task="translation_lnpos",
                          optim=[*adam(1e-3), *NO_WARMUP], seed=1, save_dir=Path(tmp) / "save",
                          extra=["--cpu", "--max-update", str(updates), "--no-save", "--disable-validation",
                                 "--num-workers", "0"])
        log_path = Path(tmp) / "train.log"
        start = time.perf_counter()
        server = started_fork_server(env)
        server_start = time.perf_counter() - start
        try:
            for i in range(runs):
                start = time.perf_counter()
                with open_log(log_path, binary=True) as out:
                    proc = _popen([script("fairseq-train"), *argv], env, stdout=out, stderr=subprocess.STDOUT)
                check(reap.wait(proc) == 0, f"fairseq-train failed; see {log_path}")
                fresh.append((time.perf_counter() - start, proc.cpu_seconds))
                start = time.perf_counter()
                run = server.spawn(argv, env, log_path)
                check(run.wait() == 0, "a forked fairseq-train failed")
                forked.append((time.perf_counter() - start, run.cpu_seconds))
                log(f"  run {i + 1}/{runs}: fresh {fresh[-1][0]:.1f} s, forked {forked[-1][0]:.1f} s")
        finally:
            server.close()
    fresh_wall, forked_wall = sum(t for t, _ in fresh), server_start + sum(t for t, _ in forked)
    fresh_cpu = sum(c for _, c in fresh)
    server_cpu = getattr(server.proc, "cpu_seconds", None)  # the server's own and its runs'
    return {"runs": runs, "updates": updates, "threads": threads, "server_start_seconds": server_start,
            "fresh_seconds": [t for t, _ in fresh], "forked_seconds": [t for t, _ in forked],
            "fresh_cpu_seconds": fresh_cpu, "forked_cpu_seconds": server_cpu,
            "wall_ratio": fresh_wall / forked_wall, "cpu_ratio": server_cpu and fresh_cpu / server_cpu,
            "per_run": paired([t for t, _ in fresh], [t for t, _ in forked])}


def measure_sweep_cells(runs, log, work_dir):
    """``runs`` pairs of one cell of the all-architecture map as ``grid.sh sweep --validate-each-epoch``
    and as ``grid.sh sweep`` runs it (validated at its last update only), forked from one fork server,
    taking turns (the order alternating); CPU seconds of each, its validations and its final NLL."""
    from fairseq_lnpos.demo import make_data
    from fairseq_lnpos.experiments.grid import build_parser
    from fairseq_lnpos.experiments.options import SweepOptions
    from fairseq_lnpos.experiments.plan import make_jobs
    from fairseq_lnpos.experiments.sweep import sweep_runs
    from fairseq_lnpos.fairseq_log import LogState
    from fairseq_lnpos.launch import child_env

    work_dir = Path(work_dir)
    data = work_dir / "data" / "bin"
    if not (data / "lnpos-data.json").exists():
        log(f"generating the demo's corpus in {data}")
        make_data(work_dir, quick=False)
    env = child_env(1)

    def cell(out, *flags):
        ns = build_parser().parse_args(["sweep", "--all-archs", "--archs", "postln", "--lr", "1e-3", "--warmup", "1",
                                        "--seeds", "1", "--data", str(data), "--out", str(out), *flags])
        opts = SweepOptions.from_namespace(ns)
        (job,), _ = make_jobs(opts, sweep_runs(opts), dry_run=False)
        return job.train_cmd()[1:]

    arms = {"every_epoch": ("--validate-each-epoch",), "last_update": ()}
    got = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        server = started_fork_server(env)
        try:
            for i in range(runs):
                for arm in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
                    out = Path(tmp) / f"{arm}-{i}"
                    log_path = out / "train.log"
                    out.mkdir()
                    run = server.spawn(cell(out, *arms[arm]), env, log_path)
                    check(run.wait() == 0, f"a fairseq-train of the sweep cell failed; see {log_path}")
                    state = LogState.of(log_path.read_text(encoding="utf-8"))
                    got[arm].append({"cpu_seconds": run.cpu_seconds, "validations": len(state.valid),
                                     "final_valid_nll": state.final_valid_nll})
                log(f"  pair {i + 1}/{runs}: " + ", ".join(
                    f"{arm} {got[arm][-1]['cpu_seconds']:.1f} CPU s" for arm in arms))
        finally:
            server.close()
    before, after = ([r["cpu_seconds"] for r in got[arm]] for arm in arms)
    same = all(a["final_valid_nll"] == b["final_valid_nll"] for a, b in zip(got["every_epoch"], got["last_update"]))
    return {"runs": runs, "arms": got, "cpu_ratio": sum(before) / sum(after), "per_run": paired(before, after),
            "same_final_nll": same}


def default_data(out_dir, log):
    """The project's synthetic corpus (generated once under out_dir)."""
    bin_dir = Path(out_dir) / "synthetic-bin"
    if not (bin_dir / "lnpos-data.json").exists():
        log(f"generating the synthetic corpus in {bin_dir}")
        from fairseq_lnpos.data import synthetic

        synthetic.prepare(Path(out_dir) / "synthetic-text", bin_dir, seed=1)
    return bin_dir


def check_choices(kind, given, known):
    unknown = [x for x in given if x not in known]
    check(not unknown, f"unknown {kind} {', '.join(unknown)}: choose from {', '.join(known)}")


def benchmark(data, sizes=DEFAULT_SIZES, variants=tuple(VARIANTS), steps=20, reps=5, max_tokens=2048,
              device="cpu", fairseq_args=(), analysis=True, log=print, overhead=True, autocast=True, startup=0,
              throughput=True, sweep_cells=0, work_dir="."):
    """Measure, with ``throughput``, throughput of every variant at every size against fairseq's own
    model; with ``overhead``, the overheads of ``--log-grad-norms`` and ``--log-diagnostics`` (the
    Pre-LN model of the first size, one shared run without either); with ``autocast`` (on the CPU) the speed-up
    of bfloat16 autocast at every size and, with ``analysis``, the wall time of the Fig. 3
    analysis; with ``startup`` N > 0, what the fork server saves on N short runs
    (:func:`measure_startup`); with ``sweep_cells`` N > 0, what validating a sweep's cells at their last
    update only saves (:func:`measure_sweep_cells`, its corpus and runs under ``work_dir``). Returns the result as a dict (what :func:`summary` prints)."""
    check_choices("size", sizes, list(SIZES))
    check_choices("variant", variants, list(VARIANTS))
    check(steps >= 1 and reps >= 1, "--steps and --reps must be at least 1")
    data = Path(data)
    check(data.is_dir() and any(data.glob("dict.*.txt")), f"{data} is not a binarized data dir (no dict.*.txt)")
    import torch

    if device == "cuda":
        check(torch.cuda.is_available(), "--device cuda: torch sees no GPU here")
    extra = list(fairseq_args)
    result = {"data": str(data), "steps": steps, "reps": reps, "cpu_count": os.cpu_count(),
              "torch_threads": torch.get_num_threads(), "device": device, "fairseq_args": extra,
              "max_tokens": max_tokens, "throughput": {}, "grad_norm_overhead": {}, "diagnostics_overhead": {},
              "load_average": {"start": os.getloadavg()[0]}}
    t0 = time.time()
    peak = None
    if throughput:
        result["matmul_peak"] = matmul_peak(device=device)
        peak = result["matmul_peak"]["flops_per_second"]
        log(f"float32 matmul peak ({PEAK_N} x {PEAK_N}, {result['matmul_peak']['threads']} threads): "
            f"{peak / 1e9:.1f} GFLOP/s")
    with tempfile.TemporaryDirectory() as save_dir:  # the logging options write their JSONL there
        for size in sizes if throughput else ():
            fairseq_arch, size_flags = fairseq_size(size)
            configs = {"fairseq_postln": (fairseq_arch, size_flags + extra)}  # every variant's second reference
            for v in variants:
                base, flags = baseline(v)  # one fairseq model per LayerNorm placement, shared
                configs[base] = (fairseq_arch, size_flags + flags + extra)
                configs[v] = (arch_name(v, size), extra)
            log(f"throughput at size {size} ({len(configs)} configurations, {reps} reps x {steps} updates)")
            secs, _, work, _ = measure(configs, data, steps, reps, log, max_tokens, device, save_dir)
            result["throughput"][size] = throughput_results(secs, work, variants, fairseq_arch, peak=peak)
        if overhead:
            arch = arch_name("preln", sizes[0])
            log(f"--log-grad-norms and --log-diagnostics overhead ({arch})")
            task = ["--task", "translation_lnpos", *extra]
            configs = {"off": (arch, task),
                       "interval_1": (arch, task + ["--log-grad-norms", "--grad-norm-interval", "1"]),
                       "interval_100": (arch, task + ["--log-grad-norms", "--grad-norm-interval", "100"])}
            for k, flags in DIAGNOSTICS_SETTINGS.items():
                configs[f"diagnostics_{k}"] = (arch, task + ["--log-diagnostics", *flags])
            secs, inside, _, logged = measure(configs, data, steps, reps, log, max_tokens, device, save_dir)
            result["grad_norm_overhead"] = overhead_results(secs, inside)
            result["diagnostics_overhead"] = diagnostics_overhead_results(secs, inside, logged)
        if autocast and device == "cpu":
            result["autocast"] = measure_autocast(data, sizes, steps, reps, log, save_dir, extra)
    if startup:
        log(f"fork server: {startup} short fairseq-train runs as fresh processes and {startup} forked")
        result["startup"] = measure_startup(data, startup, log)
    if sweep_cells:
        log(f"sweep cells: {sweep_cells} validated at every epoch's end and {sweep_cells} at their last update only")
        result["sweep_cells"] = measure_sweep_cells(sweep_cells, log, work_dir)
    if analysis:
        log("Fig. 3 analysis with its default settings (scripts/init_grad_analysis.sh)")
        with tempfile.TemporaryDirectory() as tmp:  # timed as the command a user runs
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "fairseq_lnpos.analysis.init_grad", "--out", tmp],
                                  stdout=subprocess.DEVNULL)
            check(done.returncode == 0, f"the Fig. 3 analysis failed (exit {done.returncode}, message above): "
                                        "rerun with --no-analysis")
            result["fig3_analysis_seconds"] = time.perf_counter() - start
    result["total_seconds"] = time.time() - t0
    result["load_average"]["end"] = os.getloadavg()[0]
    return result


def summary(result):
    lines = [] if not result["throughput"] else [  # none with --no-throughput
        "| size | arch | s/update | ratio to fairseq (same placement): median [95 % CI] | target | verdict "
        "| ratio to fairseq Post-LN | aten calls | elements written | matmul FLOPs | matmul GFLOP/s (of peak) |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for size, archs in result["throughput"].items():
        for v, r in archs.items():
            w, a = r["work_ratio"], r.get("achieved")
            rate = "-" if not a else f"{a['flops_per_second'] / 1e9:.1f}" + (
                f" ({100 * a['peak_fraction']:.0f} %)" if a["peak_fraction"] is not None else "")
            lines.append(f"| {size} | {v} | {r['seconds_per_update']:.3f} | {r['median']:.3f} "
                         f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | {r.get('target', '-')} | "
                         f"{r.get('verdict', '-')} | {r['to_postln']['median']:.3f} [{r['to_postln']['ci95'][0]:.3f}, "
                         f"{r['to_postln']['ci95'][1]:.3f}] | " + " | ".join(f"{w[k]:.3f}" for k in
                                                                     ("aten_calls", "output_elements", "matmul_flops"))
                         + f" | {rate} |")
    mp = result.get("matmul_peak")
    if mp:
        lines.append(f"matmul GFLOP/s: each update's matmul FLOPs (torch.utils.flop_counter; forward, backward and "
                     f"step) over its median time, against the float32 matmul peak measured here, "
                     f"{mp['flops_per_second'] / 1e9:.1f} GFLOP/s (the best of {mp['reps']} {mp['n']} x {mp['n']} "
                     f"torch.mm on {mp['device']}, {mp['threads']} threads); matmuls only, so a lower bound on how "
                     f"busy the arithmetic units are")
    for k, r in result["grad_norm_overhead"].items():
        lo, hi = r["overhead_percent_ci95"]
        lines.append(f"--log-grad-norms {k.replace('_', ' ')}: {r['overhead_percent']:+.1f} % time "
                     f"[{lo:+.1f}, {hi:+.1f}] (target <= {r['target_percent']:g} %: {r['verdict']}); "
                     f"inside the hook: {r['hook_percent']:.2f} %")
    diagnostics = result.get("diagnostics_overhead", {})
    for r in diagnostics.values():
        lo, hi = r["overhead_percent_ci95"]
        lines.append(f"{r['flags']}: {r['overhead_percent']:+.1f} % time [{lo:+.1f}, {hi:+.1f}] (time with / "
                     f"without {r['time_ratio']['median']:.3f}; no target); {r['logged_updates']} of "
                     f"{r['timed_updates']} timed updates diagnosed; inside the diagnostics' own work: "
                     f"{r['inside_percent']:.2f} % of the time")
    ac = result.get("autocast")
    if ac:
        where = "emulated: this CPU has no bfloat16 instructions" if ac["emulated"] else \
            "CPU " + ", ".join(ac["cpu_bf16_instructions"])
        for size, archs in ac["sizes"].items():
            for v, r in archs.items():
                lines.append(f"--cpu-autocast-bf16 {size} {v} ({ac['max_tokens']} tokens, {where}): float32 / bf16 "
                             f"time {r['median']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] "
                             f"({r['seconds_per_update_float32']:.3f} / {r['seconds_per_update_bf16']:.3f} s/update)"
                             + (f" (target >= {r['target']:g}: {r['verdict']})" if "target" in r else ""))
    few = min([r["n"] for archs in result["throughput"].values() for r in archs.values()]
              + [r["time_ratio"]["n"] for r in [*result["grad_norm_overhead"].values(), *diagnostics.values()]]
              + [r["n"] for archs in (ac or {}).get("sizes", {}).values() for r in archs.values()], default=MIN_PAIRS)
    if few < MIN_PAIRS:
        lines.append(f"{few} paired updates per configuration: too few for the intervals to say anything (with so "
                     f"few ratios a bootstrap interval spans about their whole range, and one update slowed by "
                     f"another process gives a ratio far from 1), so no verdict; verdicts need {MIN_PAIRS} pairs "
                     f"(steps x reps; the defaults give 100)")
    st = result.get("startup")
    if st:
        lines.append(f"fork server, {st['runs']} runs of {st['updates']} updates: fresh processes / forked (the "
                     f"server's {st['server_start_seconds']:.1f} s start included): wall time {st['wall_ratio']:.2f}x, "
                     f"CPU time " + (f"{st['cpu_ratio']:.2f}x" if st["cpu_ratio"] else "?") +
                     f"; per run {st['per_run']['median']:.2f}x [{st['per_run']['ci95'][0]:.2f}, "
                     f"{st['per_run']['ci95'][1]:.2f}]")
    sc = result.get("sweep_cells")
    if sc:
        every, last = sc["arms"]["every_epoch"], sc["arms"]["last_update"]
        lines.append(f"sweep cells (the all-architecture map's, Post-LN lr 1e-3), {sc['runs']} runs of each: validated "
                     f"at every epoch's end ({every[0]['validations']} validations) / at the last update only "
                     f"({last[0]['validations']}): CPU time {sc['cpu_ratio']:.3f}x; per run "
                     f"{sc['per_run']['median']:.3f}x [{sc['per_run']['ci95'][0]:.3f}, {sc['per_run']['ci95'][1]:.3f}]; "
                     f"final validation NLL " + ("the same in every pair" if sc["same_final_nll"] else "DIFFERS"))
    if "fig3_analysis_seconds" in result:
        lines.append(f"Fig. 3 analysis (defaults): {result['fig3_analysis_seconds']:.0f} s")
    return "\n".join(lines)


def page_markdown(result):
    """The results page's body: the settings and the machine's load, the table, then one item per
    further measurement (:func:`summary`'s lines)."""
    lines = summary(result).split("\n")
    table = [line for line in lines if line.startswith("|")]
    load = result.get("load_average", {})
    timed = (result["throughput"] or result["grad_norm_overhead"] or result.get("diagnostics_overhead")
             or result.get("autocast"))  # measured update by update
    settings = ((f"{result['steps']} x {result['reps']} timed updates per configuration, batches of "
                 f"{result['max_tokens']} tokens, data `{Path(result['data']).name}`, " if timed else "")
                + f"device {result['device']}, {result['torch_threads']} torch threads on {result['cpu_count']} cores"
                + (f", fairseq flags `{' '.join(result['fairseq_args'])}`" if result["fairseq_args"] else "")
                + (f"; load (1-minute average) {load['start']:.2f} at the start, {load['end']:.2f} at the end"
                   if "end" in load else "") + f"; {result['total_seconds']:.0f} s in all.")
    return "\n".join([settings, ""] + (table + [""] if table else [])
                     + [f"- {line}" for line in lines if not line.startswith("|")]) + "\n"


def parse_args(argv=None):
    p = CommandParser(prog="bench.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="binarized data dir (default: the synthetic corpus, generated)")
    p.add_argument("--out", default="bench-out/bench.json", help="JSON result file")
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help=f"comma list of: {', '.join(SIZES)}")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: every variant)")
    p.add_argument("--steps", type=int, default=20, help="timed updates per repetition")
    p.add_argument("--reps", type=int, default=5, help="repetitions (each configuration: steps x reps updates)")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: fairseq's GPU training (fp32; add flags with --fairseq-args)")
    p.add_argument("--fairseq-args", default="", action="flags", help="extra fairseq-train flags for every configuration, e.g. --fp16")
    p.add_argument("--no-analysis", action="store_true", help="skip timing the Fig. 3 analysis")
    p.add_argument("--no-throughput", action="store_true",
                   help="skip measuring each architecture's throughput against fairseq's model")
    p.add_argument("--no-overhead", action="store_true",
                   help="skip measuring the overheads of --log-grad-norms and of --log-diagnostics (both)")
    p.add_argument("--no-autocast", action="store_true",
                   help="skip measuring --cpu-autocast-bf16 against float32 (CPU only)")
    p.add_argument("--startup", type=int, default=0, metavar="N",
                   help="also time N short runs as fresh fairseq-train processes against N forked from the "
                        "grid's fork server (default 0: not measured)")
    p.add_argument("--sweep-cells", type=int, default=0, metavar="N",
                   help="also time N cells of the all-architecture map validated at every epoch's end against N "
                        "validated at their last update only, as grid.sh sweep runs them (default 0: not measured)")
    p.add_argument("--quick", action="store_true", help="CI mode: tiny size, 2 reps of 2 steps, no analysis")
    p.add_argument("--publish", metavar="DIR", help="also write the result as a results page into DIR "
                                                    "(docs/results/NAME: its command, date, machine and code version)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.steps, args.reps, args.no_analysis = "tiny", 2, 2, True
    return args


def main(argv=None):
    args = parse_args(argv)
    sizes = comma_list(args.sizes, "--sizes", choices=SIZES, what="a size")
    variants = comma_list(args.variants, "--variants", choices=VARIANTS, what="a variant")
    check(args.threads >= 0, "--threads must be at least 0")
    check(args.startup >= 0, "--startup must be at least 0")
    check(args.sweep_cells >= 0, "--sweep-cells must be at least 0")
    check(not (args.no_throughput and args.no_overhead and (args.no_autocast or args.device != "cpu")
               and args.no_analysis and not args.startup and not args.sweep_cells),
          "nothing to measure: every measurement is turned off; drop one of the --no-* flags or give --startup N "
          "or --sweep-cells N")
    check(not (args.publish and Path(args.publish).is_file()), f"--publish {args.publish} is a file: give a folder")
    logging.disable(logging.WARNING)  # fairseq's per-model INFO lines would drown the progress
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if not (args.no_throughput and args.no_overhead and (args.no_autocast or args.device != "cpu")):
        log(f"expected time: it grows with the {args.steps * args.reps} timed updates per configuration and size "
            f"(docs/results/benchmarks records the time of its run and its machine)")
    if args.sweep_cells:
        log(f"expected time: {2 * args.sweep_cells} runs of a map cell (docs/results/sweep-validation records the "
            f"time of its run and its machine)")
    data = Path(args.data) if args.data else default_data(out.parent, log)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = benchmark(data, sizes, variants, args.steps, args.reps, args.max_tokens, args.device,
                       args.fairseq_args.split(), not args.no_analysis, log, overhead=not args.no_overhead,
                       autocast=not args.no_autocast, startup=args.startup,
                       throughput=not args.no_throughput, sweep_cells=args.sweep_cells, work_dir=out.parent)
    write_json(out, result)
    log(summary(result))
    log(f"written {out}")
    if args.publish:
        from fairseq_lnpos.analysis.publish import argv_of, publish

        page = publish(args.publish, "Benchmarks (`scripts/bench.sh`)", page_markdown(result), None, [out],
                       argv_of("scripts/bench.sh", argv))
        log(f"results page: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main("bench.sh", main))
