"""Loading fairseq 0.12 checkpoints: torch >= 2.6, and one-line errors for unusable files.

torch 2.6 made ``torch.load`` default to ``weights_only=True``; fairseq 0.12 checkpoints pickle
an ``argparse.Namespace`` (the training args), so ``fairseq-generate``, ``--restore-file`` and a
resumed run (checkpoint_last.pt) fail with an UnpicklingError. Allow-listing just that class
keeps torch's safe loader on, instead of turning ``weights_only`` off (which would run arbitrary
pickled code). Older torch versions have no safe loader to configure, and need nothing.

With ``--task translation_lnpos`` a checkpoint that cannot be read (missing, truncated, not a
checkpoint) or that does not fit the model being trained (``--restore-file`` of another
architecture) raises :class:`CheckpointError`, which fairseq's commands print as one line
(:func:`fairseq_lnpos.errors.install_excepthook`), instead of torch's or fairseq's traceback.
"""
import argparse
import functools

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
    fit the model (another architecture or size). fairseq's trainer re-raises it as a plain
    ``Exception``, whose context the plugin's excepthook prints."""
    original = model.load_state_dict

    @functools.wraps(original)
    def load_state_dict(state_dict, *args, **kwargs):
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
                "the same architecture and sizes, or leave out --restore-file to start from scratch") from e

    model.load_state_dict = load_state_dict
    return model
