"""Loading fairseq 0.12 checkpoints: torch >= 2.6, and one-line errors for unusable files.

torch 2.6 made ``torch.load`` default to ``weights_only=True``; fairseq 0.12 checkpoints pickle
an ``argparse.Namespace`` (the training args), so ``fairseq-generate``, ``--restore-file`` and a
resumed run (checkpoint_last.pt) fail with an UnpicklingError. Allow-listing just that class
keeps torch's safe loader on, instead of turning ``weights_only`` off (which would run arbitrary
pickled code). Older torch versions have no safe loader to configure, and need nothing.

With the plugin loaded (any ``--task``: :func:`guard_resume`) a checkpoint that cannot be read
(missing, truncated, not a checkpoint) raises :class:`CheckpointError`; with ``--task
translation_lnpos`` also one that does not fit the model being trained (``--restore-file`` of another
architecture). fairseq's commands print it as one line (:func:`fairseq_lnpos.errors.install_excepthook`),
instead of torch's or fairseq's traceback. :func:`check_resumable` is the grid's cheap look at a run's
``checkpoint_last.pt`` before anything starts.
"""
import argparse
import functools
import threading
import zipfile

from .errors import LnposError


class CheckpointError(LnposError):
    """A checkpoint file cannot be loaded, or does not fit the model."""


def allow_fairseq_checkpoints():
    import torch

    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:
        add_safe_globals([argparse.Namespace])


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def guard_checkpoint_loading():
    """Make fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` (used by fairseq-train's resume
    and ``--restore-file``, fairseq-generate and every model loader) raise :class:`CheckpointError`
    naming the file when torch or fairseq cannot read it. Idempotent."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "lnpos_guarded", False):
        return

    @functools.wraps(original)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return original(path, *args, **kwargs)
        except LnposError:
            raise
        except Exception as e:  # torch/pickle/zip errors of a damaged file, fairseq's asserts
            raise CheckpointError(
                f"cannot load checkpoint {path} ({_first_line(e)}): the file is damaged or not a fairseq "
                "checkpoint: pass a complete checkpoint") from e

    load_checkpoint_to_cpu.lnpos_guarded = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def guard_state_loading(model, arch):
    """Make ``model.load_state_dict`` raise :class:`CheckpointError` when the saved weights do not
    fit the model (another architecture or size, or a checkpoint written before the architecture
    gained the parameters of its ``later_parameters``). fairseq's trainer re-raises it as a plain
    ``Exception``, whose context the plugin's excepthook prints."""
    original = model.load_state_dict
    later = getattr(model, "later_parameters", {})

    @functools.wraps(original)
    def load_state_dict(state_dict, *args, **kwargs):
        lacking = [name for name in later if name not in state_dict]
        if lacking:
            raise CheckpointError(
                f"the checkpoint predates --arch {arch}'s {' and '.join(later[n] for n in lacking)} "
                f"({', '.join(lacking)}): it cannot be read by this version of the architecture: train the model "
                "again (the grid: remove its run folder)")
        try:
            return original(state_dict, *args, **kwargs)
        except (RuntimeError, KeyError) as e:
            if isinstance(e, KeyError):  # upstream fairseq 0.12.2's encoder layer reads its q/k/v weights itself
                detail = f'Missing key in state_dict: "{e.args[0] if e.args else ""}"'
            else:  # torch: "Error(s) in loading state_dict for X:" then one line per mismatch; the first says which
                lines = [l.strip() for l in str(e).splitlines() if l.strip()]
                detail = lines[1][:200] if len(lines) > 1 else _first_line(e)
            raise CheckpointError(
                f"the checkpoint's weights do not fit --arch {arch} ({detail}): pass a checkpoint of "
                "the same architecture and sizes (fairseq-train: or leave out --restore-file to start from scratch)"
            ) from e

    model.load_state_dict = load_state_dict
    return model


_loaded = threading.local()  # the model config of the checkpoint fairseq loaded last in this thread


def check_same_experiment(saved, current, path):
    """Refuse to train on from checkpoint ``path`` when its model config ``saved`` defines another
    experiment than ``current`` (:func:`fairseq_lnpos.models.variant.experiment`); options only one
    of them holds (a checkpoint of an older plugin) are not compared."""
    from .models.variant import experiment

    old, new = experiment(saved), experiment(current)
    differ = [k for k in new if k in old and old[k] != new[k]]
    if differ:
        said = "; ".join(f"--{k.replace('_', '-')} {old[k]} there, {new[k]} here" for k in differ[:3])
        raise CheckpointError(
            f"{path} is a checkpoint of another experiment ({said}): give another --save-dir (or --restore-file) "
            "to start this one, or add --reset-optimizer to train from its weights all the same")


def check_resumable(path):
    """Refuse a checkpoint file that cannot be a complete one, without loading it: empty, cut short
    (torch's zip archive without its directory at the end) or neither a zip archive nor torch's legacy
    pickle. What passes may still fail to load (damage inside): fairseq-train then says so in one line."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head.startswith(b"PK"):
            with zipfile.ZipFile(path) as archive:
                archive.namelist()
            return
        problem = "it is empty" if not head else None if head.startswith(b"\x80") else "it is not a torch checkpoint"
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        problem = f"{type(e).__name__}: {str(e)[:120]}"
    if problem:
        raise CheckpointError(f"{path} is damaged ({problem}): the run cannot resume from it; delete the run's folder "
                              f"to train it again, or put back a complete checkpoint")


def guard_resume():
    """Make fairseq's ``Trainer.load_checkpoint`` (fairseq-train's resume from checkpoint_last.pt and
    its ``--restore-file``, with any task) refuse a checkpoint of another experiment
    (:func:`check_same_experiment`), unless ``--reset-optimizer`` (which ``--finetune-from-model``
    implies) says that training starts over from its weights. Checked after the weights loaded, so
    that weights of another size keep their own error. A checkpoint that cannot be read at all is
    :func:`guard_checkpoint_loading`'s one line, with any task too. Idempotent."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    trainer_load = Trainer.load_checkpoint
    if getattr(trainer_load, "lnpos_guarded", False):
        return
    guard_checkpoint_loading()
    state_load = checkpoint_utils.load_checkpoint_to_cpu

    @functools.wraps(state_load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        state = state_load(path, *args, **kwargs)
        cfg = state.get("cfg") if isinstance(state, dict) else None
        _loaded.model = cfg["model"] if cfg is not None and "model" in cfg else None
        return state

    @functools.wraps(trainer_load)
    def load_checkpoint(self, filename, reset_optimizer=False, *args, **kwargs):
        _loaded.model = None
        extra_state = trainer_load(self, filename, reset_optimizer, *args, **kwargs)
        if _loaded.model is not None and not reset_optimizer:  # None: nothing loaded, or another rank loaded it
            check_same_experiment(_loaded.model, self.cfg.model, filename)
        return extra_state

    load_checkpoint.lnpos_guarded = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    Trainer.load_checkpoint = load_checkpoint


def load_checkpoint_file(path):
    """A fairseq checkpoint as saved (``torch.load`` on the CPU, fairseq's Namespace allow-listed as
    for every other load here); :class:`CheckpointError` naming the file when it cannot be read."""
    import torch

    allow_fairseq_checkpoints()
    try:
        return torch.load(path, map_location="cpu")
    except Exception as e:  # missing, truncated, not a checkpoint
        raise CheckpointError(f"cannot load checkpoint {path} ({_first_line(e)}): pass a complete checkpoint") from e


def average_checkpoints(paths):
    """The state of the newest checkpoint, ``paths[-1]`` (``paths`` oldest first, as the grid passes
    the last N epochs), with every entry of ``"model"`` replaced by its mean over ``paths``, as
    fairseq's ``scripts/average_checkpoints.py`` computes it (which the pip package lacks). The
    optimizer state, ``extra_state`` and args are the newest's as in fairseq's script, which copies
    them from its first input (v0.12.2 lines 40-42) and lists ``--num-epoch-checkpoints`` newest
    first (line 96).

    Like fairseq's: each key is accumulated separately from a copy (a parameter shared by two keys,
    such as tied embeddings, is counted once per key, never twice through a shared storage), the
    keys of every checkpoint must be those of the first, and integer entries are floor-divided.
    Unlike fairseq's, which sums fp16 in fp32 and leaves the result fp32 (and bf16 in bf16),
    floating-point entries are summed in float64 and returned in their own dtype, so the average has
    the dtypes (and size) of the checkpoints it averages."""
    import torch

    if not paths:
        raise CheckpointError("no checkpoints to average")
    newest, sums, keys = None, {}, None
    for path in paths:
        state = load_checkpoint_file(path)
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, dict):
            raise CheckpointError(f"{path} has no model weights: pass fairseq checkpoints")
        if keys is None:
            keys = list(model)
        elif list(model) != keys:
            raise CheckpointError(f"{path} holds other weights than {paths[0]} (keys differ): average checkpoints "
                                  "of one run")
        newest = state  # its weights go into ``sums``; what else it holds is kept
        for k, v in model.items():
            v = v.to(torch.float64) if v.is_floating_point() else v
            if k in sums and sums[k].shape != v.shape:
                raise CheckpointError(f"{path} holds other weights than {paths[0]} ({k} of shape {list(v.shape)}, "
                                      f"not {list(sums[k].shape)}): average checkpoints of one run")
            if k in sums:
                sums[k] += v
            else:
                sums[k] = v.clone()  # a copy: never add into a loaded tensor (tied keys share one)
    n = len(paths)
    dtypes = {k: v.dtype for k, v in newest["model"].items()}
    newest["model"] = type(newest["model"])(
        (k, (v / n).to(dtypes[k]) if v.is_floating_point() else v // n) for k, v in sums.items())
    return newest


def write_average(paths, out):
    """Average ``paths`` (:func:`average_checkpoints`) into the checkpoint file ``out``, atomically
    (:func:`~fairseq_lnpos.common.replace_file`)."""
    import torch

    from .common import replace_file

    average = average_checkpoints(paths)
    replace_file(out, lambda f: torch.save(average, f))
    return out
