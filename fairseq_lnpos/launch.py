"""Launching fairseq: its console scripts, a child process's environment, the training and
generation recipes the project's commands share, and the hash that names a configuration.
Imports nothing heavy.

- :func:`script`: ``fairseq-train``, ``fairseq-generate`` ... of the running interpreter's
  environment, else the bare name (found on ``PATH`` when it starts: fairseq installed elsewhere).
- :func:`child_env`: this process's environment with the thread count of torch's OpenMP and MKL
  pools and, where given, the GPUs the child sees (entries of ``CUDA_VISIBLE_DEVICES``).
- :func:`recorded_train_cmd` / :func:`main`: fairseq-train on GPUs, each process of the run (one per
  GPU under fairseq's distributed training) writing its GPU's name and the memory it took to
  ``cuda-rank<R>.json`` (:func:`read_cuda_records` reads them back).
- :func:`train_args` / :func:`train_cmd`: fairseq-train in the project's recipe (the plugin's
  ``--user-dir``, label-smoothed cross-entropy 0.1); :func:`adam` and :data:`NO_WARMUP` are the
  optimizer and schedule the benchmark and the checks share with the run table's defaults.
- :func:`generate_cmd`: fairseq-generate of one checkpoint on a data folder with a manifest.
- :func:`config_hash`: a short stable hash of a JSON-able configuration (run folders, data-prep
  stages, the Fig. 3 analysis's records).

fairseq's logs are read by :mod:`fairseq_lnpos.fairseq_log` (training logs, the BLEU
line of fairseq-generate).
"""
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

from .common import USER_DIR, write_json

# the paper's and fairseq's translation recipe: the defaults of the run table (runs.Run) and of every
# other command that trains (bench, the GPU check, the Fig. 3 analysis)
ADAM_BETAS = "(0.9, 0.98)"
LABEL_SMOOTHING = 0.1
# the paper's T_warmup = 1: the first update runs at lr_max (optim/lr_scheduler.py)
NO_WARMUP = ("--lr-scheduler", "warmup_inverse_sqrt", "--warmup-updates", "1")


def script(name):
    """A fairseq console script of the running interpreter's environment, else ``name`` (PATH)."""
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


def child_env(threads, device=None):
    """The environment of a fairseq child: this one, ``threads`` OpenMP/MKL threads, and with
    ``device`` (a ``CUDA_VISIBLE_DEVICES`` value: entries of this process's own variable, or physical
    ids where it is unset; experiments/plan.py) only those GPUs visible."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
    return env


def adam(lr, optimizer="adam", betas=ADAM_BETAS):
    """An Adam-family optimizer (fairseq's ``adam``, the plugin's ``radam``) at learning rate ``lr``."""
    return ["--optimizer", optimizer, "--adam-betas", betas, "--lr", str(lr)]


def train_args(data, arch, *, max_tokens, optim=(), task=None, langs=None, model=(),
               label_smoothing=LABEL_SMOOTHING, budget=(), seed=None, save_dir=None, log_format=None,
               log_interval=None, extra=()):
    """fairseq-train's arguments (without the program): ``data``, the plugin's ``--user-dir``,
    ``--task``, the languages, ``--arch``, the ``model`` flags, the optimizer and schedule flags
    ``optim``, label-smoothed cross-entropy (fairseq's plain ``cross_entropy`` when
    ``label_smoothing`` is None), ``--max-tokens``, the ``budget`` flags (update frequency, epochs,
    updates), the seed, the checkpoint folder, the log format, then ``extra``."""
    argv = [str(data), "--user-dir", str(USER_DIR)]
    if task:
        argv += ["--task", task]
    if langs:
        argv += ["--source-lang", langs[0], "--target-lang", langs[1]]
    argv += ["--arch", arch, *model, *optim]
    if label_smoothing is not None:
        argv += ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(label_smoothing)]
    argv += ["--max-tokens", str(max_tokens), *budget]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if save_dir is not None:
        argv += ["--save-dir", str(save_dir)]
    if log_format is not None:
        argv += ["--log-format", log_format]
    if log_interval is not None:
        argv += ["--log-interval", str(log_interval)]
    return argv + list(extra)


def train_cmd(data, arch, **kw):
    """fairseq-train's command line (see :func:`train_args`)."""
    return [script("fairseq-train"), *train_args(data, arch, **kw)]


def generate_cmd(data_dir, checkpoint, manifest, beam=5, lenpen=1.2, subset="test", extra=()):
    """fairseq-generate of ``checkpoint`` on ``subset`` of ``data_dir``, whose ``manifest``
    (data/manifest.py) gives the languages and the ``--post-process`` of its text."""
    return [
        script("fairseq-generate"), str(data_dir), "--user-dir", str(USER_DIR),
        # fairseq's translation task, and under upstream fairseq 0.12.2 + torch >= 2.0 a Post-LN
        # checkpoint decodes instead of failing (see tasks/translation_lnpos.py)
        "--task", "translation_lnpos",
        "--path", str(checkpoint), "--gen-subset", subset,
        "--source-lang", manifest["source_lang"], "--target-lang", manifest["target_lang"],
        "--beam", str(beam), "--lenpen", str(lenpen),
        "--post-process", manifest["post_process"], "--max-tokens", "8192",
        # fairseq (0.12.3 / fairseq-fixed) drops the last batch when its size is not a multiple of
        # --required-batch-size-multiple (default 8): with 1 every test sentence is translated
        "--required-batch-size-multiple", "1",
        # the test set is read in the generating process: a DataLoader worker per call costs a
        # process start and, when it is shut down, seconds of waiting (docs/grid.md); same batches
        "--num-workers", "0",
        *extra,
    ]


def config_hash(config, length=16):
    """The first ``length`` hex digits of the SHA-256 of ``config`` as key-sorted JSON (values
    JSON cannot write, such as paths, as their ``str``)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:length]


# ---------------------------------------------------------------- fairseq-train on GPUs, recorded

CUDA_RECORD = "LNPOS_CUDA_RECORD"  # the folder where each process of a run writes cuda-rank<R>.json
# what a CUDA context (the driver's state and the loaded kernels) takes beyond what PyTorch's allocator
# reserves, where the driver's own figure for the process cannot be read (no nvidia-ml-py): an estimate
# (a few hundred MB on recent GPUs and CUDA versions), not a measurement
CONTEXT_ESTIMATE_MB = 500
_fairseq_main = None  # fairseq_cli.train.main, in the process that replaced it by recorded_main


def recorded_train_cmd(cmd):
    """fairseq-train's command line ``cmd`` run through :func:`main`: the same training, with
    :data:`CUDA_RECORD` in its environment naming where its records go."""
    return [sys.executable, "-m", "fairseq_lnpos.launch", *cmd[1:]]


def _mb(n):
    return round(n / 2 ** 20, 1)


def driver_mb(device):
    """The memory the driver counts for this process on ``device`` (a torch device index), in MB,
    through NVML (nvidia-ml-py); None where it cannot be read."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory:
                return _mb(proc.usedGpuMemory)
    except Exception:  # no NVML, no permission, a MIG or container setup it does not see into
        return None
    return None


def cuda_record(rank):
    """This process's record on its current CUDA device: the GPU's name, the peak that PyTorch's
    allocator reserved and allocated, and what the run took on the GPU (``cuda_mb``): the driver's
    figure for the process where it can be read, else the reserved peak plus
    :data:`CONTEXT_ESTIMATE_MB` (``context`` says which)."""
    import torch

    device = torch.cuda.current_device()
    reserved = _mb(torch.cuda.max_memory_reserved(device))
    driver = driver_mb(device)
    return {"rank": rank, "gpu": torch.cuda.get_device_name(device), "reserved_mb": reserved,
            "allocated_mb": _mb(torch.cuda.max_memory_allocated(device)), "driver_mb": driver,
            "cuda_mb": driver if driver is not None and driver >= reserved else round(reserved + CONTEXT_ESTIMATE_MB, 1),
            "context": "driver" if driver is not None and driver >= reserved else f"estimate {CONTEXT_ESTIMATE_MB} MB"}


PEAKS = ("reserved_mb", "allocated_mb", "driver_mb", "cuda_mb", "context")  # a record's memory fields


def _write_record(folder, record):
    """Write ``record`` as ``cuda-rank<R>.json`` in ``folder``, keeping the larger peaks of an earlier
    launch of the same run (a resumed run reserves again from nothing); a record without peaks (the
    one written when training starts) keeps the earlier ones."""
    path = Path(folder) / f"cuda-rank{record['rank']}.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    new = record.get("cuda_mb")
    if isinstance(old, dict) and isinstance(old.get("cuda_mb"), (int, float)) and (new is None or old["cuda_mb"] > new):
        record = {**record, **{k: old.get(k) for k in PEAKS}}
    write_json(path, record)


def _stop(signum, frame):
    raise SystemExit(128 + signum)  # the record is written on the way out (the grid stops runs with SIGTERM)


def recorded_main(cfg, **kwargs):
    """fairseq-train's ``main`` for one process of the run (fairseq's ``call_main`` starts one per GPU):
    the training, then, on CUDA and with :data:`CUDA_RECORD` set, this process's :func:`cuda_record`,
    also when training fails or is stopped."""
    import torch

    inner = _fairseq_main
    if inner is None:  # a process that fairseq started per GPU imported fairseq unchanged
        from fairseq_cli import train

        inner = train.main
    folder = os.environ.get(CUDA_RECORD)
    if not folder or cfg.common.cpu or not torch.cuda.is_available():
        return inner(cfg, **kwargs)
    rank = cfg.distributed_training.distributed_rank or 0
    try:  # the GPU first: a run killed outright (out of host memory) still names it
        _write_record(folder, {"rank": rank, "gpu": torch.cuda.get_device_name(torch.cuda.current_device()),
                               "cuda_mb": None})
    except (OSError, RuntimeError, ValueError) as e:
        print(f"fairseq-train: warning: no CUDA record written ({e})", file=sys.stderr)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return inner(cfg, **kwargs)
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            _write_record(folder, cuda_record(rank))
        except (OSError, RuntimeError, ValueError) as e:  # the record is what is lost, never the run's outcome
            print(f"fairseq-train: warning: no CUDA record written ({e})", file=sys.stderr)


def read_cuda_records(folder):
    """The records :func:`recorded_main` wrote in ``folder``, ordered by rank (unreadable ones skipped)."""
    records = []
    for path in Path(folder).glob("cuda-rank*.json"):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("rank"), int):
            records.append(rec)
    return sorted(records, key=lambda r: r["rank"])


def main(argv=None):
    """``python -m fairseq_lnpos.launch FAIRSEQ_TRAIN_ARGS``: fairseq-train (its ``cli_main``), with
    :func:`recorded_main` in place of its ``main``."""
    global _fairseq_main
    from fairseq_cli import train

    sys.argv = ["fairseq-train", *(sys.argv[1:] if argv is None else argv)]
    _fairseq_main, train.main = train.main, recorded_main
    train.cli_main()
    return 0


if __name__ == "__main__":
    # the package's module, not this __main__: fairseq's processes per GPU find recorded_main by its name
    from fairseq_lnpos.launch import main as launch_main

    sys.exit(launch_main())
