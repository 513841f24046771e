"""On PYTHONPATH of a test's jobs: a process stops for up to HOLD_SECONDS at a chosen point, so that a
test can interrupt it there instead of racing work that takes a second.

- ``LNPOS_TEST_HOLD_AFTER_EPOCH=E``: fairseq-train stops after it has saved the checkpoint of epoch E.
- ``LNPOS_TEST_HOLD_STAGE=LABEL`` and ``LNPOS_TEST_HOLD_MARKER=FILE``: a data-prep stage stops while it
  builds, in the process doing its work, and writes FILE first: stage ``binarize`` in a worker of
  fairseq-preprocess (after binarizing its chunk), any other stage (``tok`` ...) after its build wrote
  its files into the stage's temporary folder.

The modules are patched when the command imports them (importing fairseq here would set up logging
before fairseq-train does).
"""
import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from pathlib import Path

HOLD_SECONDS = 300


def _hold_after_epoch(module, epoch):
    save = module.save_checkpoint

    def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
        saved = save(cfg, trainer, epoch_itr, val_loss)
        if hasattr(save, "best"):  # fairseq's train loop reads the best score off this function
            save_checkpoint.best = save.best
        if epoch_itr.epoch == epoch and epoch_itr.end_of_epoch():
            time.sleep(HOLD_SECONDS)
        return saved

    module.save_checkpoint = save_checkpoint


def _hold_here(marker):
    Path(marker).write_text(str(os.getpid()))
    time.sleep(HOLD_SECONDS)


def _hold_in_stage(module, stage, marker):
    """pipeline.run_stage: the build of stage ``stage`` holds once it has written its files."""
    run_stage = module.run_stage

    def patched(final, params, build, stamp_name=module.STAMP, label=None):
        if (label or Path(final).name) != stage:
            return run_stage(final, params, build, stamp_name, label)

        def held(tmp):
            build(tmp)
            _hold_here(marker)

        return run_stage(final, params, held, stamp_name, label)

    module.run_stage = patched


def _hold_in_binarize_worker(module, marker):
    """fairseq.binarizer: a worker of fairseq-preprocess holds once it has binarized its chunk."""
    binarizer = module.FileBinarizer
    chunk = binarizer._binarize_chunk_and_finalize.__func__

    @functools.wraps(chunk)  # the pool sends the method to the worker by its name
    def patched(cls, *args, **kwargs):
        summary = chunk(cls, *args, **kwargs)
        _hold_here(marker)
        return summary

    binarizer._binarize_chunk_and_finalize = classmethod(patched)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """``patch(module)`` right after ``name`` is imported."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("LNPOS_TEST_HOLD_AFTER_EPOCH") and sys.argv and sys.argv[0].endswith("fairseq-train"):
    _epoch = int(os.environ["LNPOS_TEST_HOLD_AFTER_EPOCH"])
    sys.meta_path.insert(0, _PatchOnImport("fairseq.checkpoint_utils", lambda m: _hold_after_epoch(m, _epoch)))
if os.environ.get("LNPOS_TEST_HOLD_STAGE"):
    _stage, _marker = os.environ["LNPOS_TEST_HOLD_STAGE"], os.environ["LNPOS_TEST_HOLD_MARKER"]
    if _stage == "binarize":
        sys.meta_path.insert(0, _PatchOnImport("fairseq.binarizer", lambda m: _hold_in_binarize_worker(m, _marker)))
    else:
        sys.meta_path.insert(0, _PatchOnImport("fairseq_lnpos.data.pipeline",
                                               lambda m: _hold_in_stage(m, _stage, _marker)))
