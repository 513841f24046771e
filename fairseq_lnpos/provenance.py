"""Where and with what a run ran: recorded in every run's DONE.json (``provenance``) and printed on
every results page, so that a number can be traced to the code and the machine that made it.

:func:`provenance` gives a JSON object:

- ``code``: the git commit of the checkout the package was imported from and whether its tracked
  files differed from it (``dirty``); outside a git checkout the installed package's version;
- ``model_code``: a short hash of the plugin's sources that decide what a run computes (the models,
  optimizers, schedules, the task and the registry of variants): two runs with the same value trained
  the same code, whatever else changed in the repository (documents, the lab, the report);
- ``python``, ``torch``, ``fairseq`` (with the distribution that provides it: ``fairseq`` or
  ``fairseq-fixed``): versions, read from the installed distributions (nothing is imported);
- ``cpu`` (the model name), ``cores`` (usable by this process), ``gpu`` (the NVIDIA GPUs the
  driver lists, empty without one; in a run's record the run's own GPUs, by the names its processes
  read from CUDA, ``torch.cuda.get_device_name``, and none for a CPU run), ``load`` (the 1-minute load
  average when it was recorded), ``host``; a GPU run's record adds ``cuda_visible_devices``, the
  ``CUDA_VISIBLE_DEVICES`` its processes were given.

Imports nothing heavy; the git and file reads happen once per process (:func:`pin`: at its start).
"""
import functools
import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# the sources whose change changes what a run computes
MODEL_CODE = ("models", "optim", "tasks", "variants.py")


def _version(*dists):
    for d in dists:
        try:
            return d, metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def _git(*args):
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE.parent), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def code_version():
    """{"commit": SHA or None, "dirty": bool or None, "package": version}."""
    commit = _git("rev-parse", "HEAD") if (PACKAGE.parent / ".git").exists() else None
    dirty = None
    if commit:
        status = _git("status", "--porcelain", "--untracked-files=no")
        dirty = None if status is None else bool(status)
    return {"commit": commit, "dirty": dirty, "package": _version("fairseq-lnpos")[1]}


@functools.lru_cache(maxsize=None)
def model_code_hash():
    """A 12-hex-digit hash of the plugin's sources in :data:`MODEL_CODE` (file names and contents)."""
    h = hashlib.sha256()
    for part in MODEL_CODE:
        path = PACKAGE / part
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(PACKAGE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus():
    """The model names of the NVIDIA GPUs the driver lists (no CUDA initialised)."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return names


@functools.lru_cache(maxsize=None)
def machine():
    """The machine: cpu, cores, gpu, host."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cores": cores, "gpu": _gpus(), "host": platform.node()}


def pin():
    """Read the code versions now and keep them for this process: a grid's runs then record the code
    they were started with (its workers import it at the start), not the files as an edit left them by
    the time a run ends."""
    code_version()
    model_code_hash()


def software():
    """The versions a run or a measurement ran with: python, torch, fairseq and fairseq_dist (its distribution)."""
    fairseq_dist, fairseq_version = _version("fairseq-fixed", "fairseq")
    return {"python": platform.python_version(), "torch": _version("torch")[1], "fairseq": fairseq_version,
            "fairseq_dist": fairseq_dist}


def provenance(gpu=None, cuda_visible_devices=None):
    """The JSON object a run records (see the module's docstring); ``gpu``: the run's GPUs by name in
    place of the machine's (the driver's list), ``cuda_visible_devices``: the GPUs it was given."""
    out = {"code": code_version(), "model_code": model_code_hash(), **software(), **machine(),
           "load": round(os.getloadavg()[0], 2)}
    if gpu is not None:
        out["gpu"] = list(gpu)
    if cuda_visible_devices is not None:
        out["cuda_visible_devices"] = cuda_visible_devices
    return out


def describe_code(code):
    """A code version in words: ``abc1234`` (``+ changes`` when dirty), else ``package 0.1.0``."""
    if not code:
        return "unknown"
    if code.get("commit"):
        return code["commit"][:10] + (" + uncommitted changes" if code.get("dirty") else "")
    return f"package {code.get('package')}"
