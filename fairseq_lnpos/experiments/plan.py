"""What a grid runs: the runs the options select, one :class:`~.commands.Job` per run x seed with its
data checked, and the slots (devices) the runs take. grid.py (the command line) and slurm.py plan
with it.
"""
import os
from pathlib import Path

from ..data.manifest import read_manifest
from ..cli import comma_list
from ..errors import MAX_SEED, LnposError
from ..precision import check_bf16_instructions
from . import runs as R
from .options import SlurmOptions
from .commands import Job, check_joined_dictionary, check_train_flags, run_arch, split_flags
from .rundir import check_out_dir
from .sweep import AXES


def parse_seeds(text):
    seeds = comma_list(text, "--seeds", int)
    if any(not 0 <= s <= MAX_SEED for s in seeds):
        raise LnposError(f"--seeds {text}: give distinct whole numbers from 0 to {MAX_SEED} (fairseq's seeds), "
                         f"e.g. --seeds 1,2,3")
    return seeds


def parse_data(values):
    """--data DIR (all datasets) or --data DATASET=DIR (repeatable)."""
    out = {}
    for v in values or []:
        key, sep, path = v.partition("=")
        if sep and key in R.DATASETS:
            out[key] = Path(path)
        else:
            out["*"] = Path(v)
    return out


def split_set(v):
    """(run or "", key, value) of one --set [RUN:]key=value."""
    target, _, assign = v.rpartition(":") if ":" in v.split("=", 1)[0] else ("", "", v)
    key, sep, value = assign.partition("=")
    if not sep:
        raise LnposError(f"--set {v}: expected key=value or RUN:key=value")
    return target, key, value


def parse_sets(values, runs):
    """--set [RUN:]key=value: change a field of every selected run (or of one run)."""
    runs = {r.name: r for r in runs}
    for v in values or []:
        target, key, value = split_set(v)
        if target and target not in runs:
            raise LnposError(f"--set {v}: run {target!r} is not selected (see --only)")
        for name in [target] if target else list(runs):
            runs[name] = R.coerce(runs[name], key, value)
    return list(runs.values())


def keep_axes(opts):
    """A sweep's axes and budget (:data:`~.sweep.AXES`) come from its own options: a ``--set``,
    ``--set extra=`` or ``--fairseq-args`` that would replace them in every cell (whose folder is
    named for its axes) is refused."""
    for v in opts.set or []:
        _, key, value = split_set(v)
        if key in AXES:
            raise LnposError(f"--set {v}: a sweep's cells take {key} from its option {AXES[key][0]} (their folders "
                             f"are named for it): give the values with {AXES[key][0]}, not --set")
        if key == "extra":
            _refuse_axis_flags(split_flags(value, f"--set {v}"), f"--set {v}")
    _refuse_axis_flags(split_flags(opts.fairseq_args, "--fairseq-args"), "--fairseq-args")


def _refuse_axis_flags(flags, option):
    for name in (token.split("=", 1)[0] for token in flags):
        for key, (sweep_option, train_flags) in AXES.items():
            if any(name == f or (len(name) >= 6 and f.startswith(name)) for f in train_flags):
                raise LnposError(f"{option}: {name} would replace the sweep's {key} axis in every cell (their "
                                 f"folders are named for it): give the values with {sweep_option}")


def select_runs(opts):
    """The runs of the table that ``--only``, ``--set`` and ``--max-epoch`` ask for; with
    ``--early-stop``, each must have a budget in updates (the rule judges a run at a fraction of it)."""
    selected = R.select(comma_list(opts.only, "--only", what="a run name or glob") if opts.only else None)
    runs = override(opts, [r.with_defaults() for r in parse_sets(opts.set, selected)])
    unbudgeted = [r.name for r in runs if not r.max_update]
    if opts.early_stop and unbudgeted:
        named = ", ".join(unbudgeted[:2]) + (", ..." if len(unbudgeted) > 2 else "")
        raise LnposError(f"--early-stop: {len(unbudgeted)} of the {len(runs)} runs ({named}) have no budget in updates, "
                         f"and early stopping judges a run at a fraction of its budget: give one with --set "
                         f"max_update=N, or drop --early-stop")
    return runs


OVERRIDES = ("max_epoch", "beam", "lenpen", "average_last")  # options that set a field of every run


def override(opts, runs):
    """``runs`` with the fields that ``--max-epoch``, ``--beam``, ``--lenpen`` and ``--average-last`` give."""
    for key in OVERRIDES:
        value = getattr(opts, key, None)
        if value is not None:
            runs = [R.coerce(r, key, str(value), option="--" + key.replace("_", "-")) for r in runs]
    return runs


def make_jobs(opts, runs, dry_run):
    """One Job per run x seed, with its data dir checked (a dry run tolerates missing data). A dry run's
    jobs say where the grid would train them (:func:`placement`; CPU runs by their ``--cpu``); the
    scheduler places the others as their slots take them, and SLURM's allocation places its own."""
    data, seeds = parse_data(opts.data), parse_seeds(opts.seeds)
    slots = plan_slots(opts, dry_run=True) if dry_run and not isinstance(opts, SlurmOptions) else None
    out = Path(opts.out)
    check_out_dir(out)
    check_train_flags(split_flags(opts.fairseq_args, "--fairseq-args"), "--fairseq-args")
    split_flags(opts.gen_args, "--gen-args")
    jobs, manifests = [], {}
    for r in runs:
        d = data.get(r.dataset, data.get("*", Path(R.DATASETS[r.dataset]["default_data"]))).resolve()
        if d not in manifests:
            manifests[d] = None
            if d.is_dir() or not dry_run:
                if not d.is_dir():
                    raise LnposError(f"data dir {d} not found: prepare it with data-prep/*.sh or pass --data DIR")
                try:
                    manifests[d] = read_manifest(d)
                except LnposError:
                    if not dry_run:
                        raise
        m = manifests[d]
        ds = R.DATASETS[r.dataset]
        langs = (m["source_lang"], m["target_lang"]) if m else (ds["source_lang"], ds["target_lang"])
        if m and not dry_run and not (d / f"dict.{langs[0]}.txt").exists():
            raise LnposError(f"{d} has no dict.{langs[0]}.txt: not a fairseq-preprocess output")
        if m and not dry_run:
            check_joined_dictionary(r, d, langs)
        check_train_flags(r.extra, f"{r.name}: extra")
        arch = opts.arch or run_arch(r, opts.arch_size)
        for s in seeds:
            index = len(jobs) + 1
            where = {} if slots is None else {"cpu": slots[0] is None,
                                              "placement": slots[0] and placement(slots, index)}
            jobs.append(Job(r, s, d, out.resolve() / r.name / f"seed{s}", arch, langs, opts, index=index, **where))
    return jobs, manifests


def visible_entries():
    """The entries of this process's ``CUDA_VISIBLE_DEVICES`` in CUDA's order (physical ids, ``GPU-<UUID>``
    or ``MIG-...`` ids, as the user or a scheduler gave them), or None when it is unset (every GPU,
    numbered 0..n-1). CUDA reads the list up to its first empty entry."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = []
    for entry in value.split(","):
        if not entry.strip():
            break
        entries.append(entry.strip())
    return entries


def gpu_entries(ids, what):
    """The ``CUDA_VISIBLE_DEVICES`` entries of the GPUs at positions ``ids`` (strings of whole numbers)
    of what this process sees: the entries of its own variable where it is set (a run given position 0
    under ``CUDA_VISIBLE_DEVICES=4,5`` sees GPU 4 alone), else the physical ids. Positions beyond what is
    visible are refused, in one line that says what is."""
    entries = visible_entries()
    if entries is None:
        n = need_cuda(1, what)
        shown = f"this machine has {n}: 0..{n - 1}"
    else:
        if not entries:
            raise LnposError(f"{what}: CUDA_VISIBLE_DEVICES is empty, so no GPU is visible here: unset it or "
                             f"give it the GPUs to use")
        n = len(entries)
        shown = (f"CUDA_VISIBLE_DEVICES={','.join(entries)} shows {n}: 0..{n - 1}, and --gpus counts in it "
                 f"(0 is GPU {entries[0]})")
    bad = [g for g in ids if not g.isdigit() or int(g) >= n]
    if bad:
        raise LnposError(f"{what}: no GPU {', '.join(bad)} here ({shown})")
    return [entries[int(g)] if entries is not None else str(int(g)) for g in ids]


def plan_slots(opts, dry_run):
    """Where runs go: a list of ``CUDA_VISIBLE_DEVICES`` values of the runs' processes (None = the CPU),
    one per run at once. ``--gpus`` gives positions in what this process sees (:func:`gpu_entries`);
    ``--gpus-per-run K`` without ``--gpus`` is one run at a time on the first K. A dry run with the
    variable unset takes the positions as the GPUs' ids unchecked (no CUDA needed to print commands)."""
    if opts.jobs != 1 and (opts.gpus or opts.world > 1):
        raise LnposError("--jobs is for CPU runs; with --gpus, use --runs-per-gpu K for K runs on each GPU")
    if not opts.gpus and opts.world == 1:
        if opts.runs_per_gpu != 1:
            raise LnposError("--runs-per-gpu needs --gpus; on the CPU, --jobs sets the runs side by side")
        return [None] * opts.jobs
    ids = comma_list(opts.gpus, "--gpus", what="a GPU id") if opts.gpus else [str(i) for i in range(opts.world)]
    what = f"--gpus {opts.gpus}" if opts.gpus else f"--gpus-per-run {opts.world}"
    if len(ids) % opts.world:
        raise LnposError(f"--gpus {opts.gpus}: {len(ids)} GPUs do not split into runs of --gpus-per-run {opts.world}")
    shown = visible_entries() or []
    if opts.world > 1 and any(g.isdigit() and int(g) < len(shown) and shown[int(g)].startswith("MIG-") for g in ids):
        raise LnposError(f"{what} --gpus-per-run {opts.world}: a MIG instance is the only GPU CUDA shows a process, "
                         f"so one run cannot train on several: give --gpus-per-run 1 (a run per MIG instance)")
    if not dry_run:
        need_cuda(opts.world, what)
    if dry_run and visible_entries() is None:
        bad = [g for g in ids if not g.isdigit()]
        if bad:
            raise LnposError(f"{what}: {', '.join(bad)} is not a GPU position: give whole numbers 0, 1, ... (the "
                             f"GPUs as CUDA_VISIBLE_DEVICES lists them, else as the driver numbers them)")
        entries = [str(int(g)) for g in ids]
    else:
        entries = gpu_entries(ids, what)
    groups = [",".join(entries[i:i + opts.world]) for i in range(0, len(entries), opts.world)]
    return [g for _ in range(opts.runs_per_gpu) for g in groups]


def slot_text(slot):
    """Where a slot's runs go, in words: ``the CPU``, ``GPU 4``, ``GPUs 4,5`` or the entry that names it
    (``MIG-...``): its CUDA_VISIBLE_DEVICES value."""
    if slot is None:
        return "the CPU"
    if "," in slot:
        return "GPUs " + slot
    return f"GPU {slot}" if slot.isdigit() else slot


def placement(slots, index):
    """Where the job numbered ``index`` (from 1) of a grid with these ``slots`` trains, in words: the slot
    it takes when the runs start (the first ``len(slots)`` jobs), else the first slot to come free."""
    if index <= len(slots) or len(set(slots)) == 1:
        return slot_text(slots[(index - 1) % len(slots)])
    return "the first free of " + ", ".join(slot_text(s) for s in dict.fromkeys(slots))


def check_cpu_bf16(opts):
    """``--cpu-bf16`` trains on this machine's CPU under the plugin's task: refused with ``--fp16`` or
    ``--gpus``, with a ``--task`` other than fairseq's translation or the plugin's, and (unless a dry run)
    on a CPU without bfloat16 instructions."""
    if not opts.cpu_bf16:
        return
    if opts.fp16:
        raise LnposError("--cpu-bf16 and --fp16 are two kinds of mixed precision (the CPU's and the GPU's): give one")
    if opts.gpus or opts.world > 1:
        raise LnposError("--cpu-bf16 is mixed precision on the CPU, and this grid trains on GPUs: give --fp16 there")
    if opts.task not in (None, "translation", "translation_lnpos"):
        raise LnposError(f"--cpu-bf16 is an option of the task translation_lnpos, not of --task {opts.task}: drop "
                         f"one of them")
    if not opts.dry_run:
        check_bf16_instructions("--cpu-bf16")


def need_cuda(k, what):
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        raise LnposError(f"{what}: no CUDA GPU is visible here, and fairseq's multi-GPU training would train "
                         f"nothing on the CPU while exiting 0; drop the option to train on the CPU")
    if k > n:
        raise LnposError(f"{what}: needs {k} GPUs but this machine has {n}")
    return n
