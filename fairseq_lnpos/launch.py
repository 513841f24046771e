"""Launching fairseq: its console scripts, a child process's environment, the training and
generation recipes the project's commands share, and the hash that names a configuration.
Imports nothing heavy.

- :func:`script`: ``fairseq-train``, ``fairseq-generate`` ... of the running interpreter's
  environment, else the bare name (found on ``PATH`` when it starts: fairseq installed elsewhere).
- :func:`child_env`: this process's environment with the thread count of torch's OpenMP and MKL
  pools and, where given, the one GPU the child sees.
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
import sys
from pathlib import Path

from .common import USER_DIR

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
    ``device`` only that GPU visible."""
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
