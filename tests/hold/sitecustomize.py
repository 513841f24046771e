"""On PYTHONPATH of a test's jobs: a process stops for up to HOLD_SECONDS at a chosen point, so that a
test can interrupt it there instead of racing work that takes a second.

- ``LNPOS_TEST_HOLD_AFTER_EPOCH=E``: fairseq-train stops after epoch E: its checkpoint saved and its
  training statistics logged.
- ``LNPOS_TEST_HOLD_BEFORE_TRAINING=TEXT``: fairseq-train stops before it loads or saves any checkpoint
  when its command line contains TEXT (a run's name: the other runs of a grid go on).
- ``LNPOS_TEST_HOLD_STAGE=LABEL`` and ``LNPOS_TEST_HOLD_MARKER=FILE``: a data-prep stage stops while it
  builds, in the process doing its work, and writes FILE first: stage ``binarize`` in a worker of
  fairseq-preprocess (after binarizing its chunk), any other stage (``tok`` ...) after its build wrote
  its files into the stage's temporary folder.

The modules are patched when the command imports them (importing fairseq here would set up logging
before fairseq-train does). fairseq-train is either the console script or a run forked from the grid's
fork server (``python -m fairseq_lnpos.forkserver``, which imports fairseq once for all its runs).
"""
import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from pathlib import Path

HOLD_SECONDS = 300


def _hold_in_training(module, epoch, text):
    """fairseq_cli.train: stop once epoch ``epoch`` is saved and its statistics logged (``train``
    returned), or before training when the command line holds ``text``. ``main`` and ``cli_main``
    look these functions up when they call them, so a run forked from the fork server finds them too."""
    train, main = module.train, module.main

    @functools.wraps(train)
    def held_train(cfg, trainer, task, epoch_itr):
        result = train(cfg, trainer, task, epoch_itr)
        if epoch_itr.epoch == epoch and epoch_itr.end_of_epoch():
            time.sleep(HOLD_SECONDS)
        return result

    @functools.wraps(main)
    def held_main(cfg, *args, **kwargs):
        if text in " ".join(sys.argv):
            time.sleep(HOLD_SECONDS)
        return main(cfg, *args, **kwargs)

    if epoch is not None:
        module.train = held_train
    if text is not None:
        module.main = held_main


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


_TRAINS = (sys.argv and sys.argv[0].endswith("fairseq-train")) or "fairseq_lnpos.forkserver" in sys.orig_argv
_EPOCH, _TEXT = os.environ.get("LNPOS_TEST_HOLD_AFTER_EPOCH"), os.environ.get("LNPOS_TEST_HOLD_BEFORE_TRAINING")
if _TRAINS and (_EPOCH or _TEXT):
    sys.meta_path.insert(0, _PatchOnImport("fairseq_cli.train",
                                           lambda m: _hold_in_training(m, int(_EPOCH) if _EPOCH else None, _TEXT or None)))
if os.environ.get("LNPOS_TEST_HOLD_STAGE"):
    _stage, _marker = os.environ["LNPOS_TEST_HOLD_STAGE"], os.environ["LNPOS_TEST_HOLD_MARKER"]
    if _stage == "binarize":
        sys.meta_path.insert(0, _PatchOnImport("fairseq.binarizer", lambda m: _hold_in_binarize_worker(m, _marker)))
    else:
        sys.meta_path.insert(0, _PatchOnImport("fairseq_lnpos.data.pipeline",
                                               lambda m: _hold_in_stage(m, _stage, _marker)))
