"""On PYTHONPATH of a test's jobs: fairseq-train stops for up to HOLD_SECONDS after it has saved the
checkpoint of epoch ``LNPOS_TEST_HOLD_AFTER_EPOCH``, so that a test can interrupt a run between two
epochs without racing an epoch that takes a second. fairseq.checkpoint_utils is patched when
fairseq-train imports it (importing it here would set up logging before fairseq-train does)."""
import importlib.abc
import importlib.util
import os
import sys
import time

HOLD_SECONDS = 300
MODULE = "fairseq.checkpoint_utils"


def _hold(module, epoch):
    save = module.save_checkpoint

    def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
        saved = save(cfg, trainer, epoch_itr, val_loss)
        if hasattr(save, "best"):  # fairseq's train loop reads the best score off this function
            save_checkpoint.best = save.best
        if epoch_itr.epoch == epoch and epoch_itr.end_of_epoch():
            time.sleep(HOLD_SECONDS)
        return saved

    module.save_checkpoint = save_checkpoint


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, epoch):
        self.epoch = epoch

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _hold(module, self.epoch)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("LNPOS_TEST_HOLD_AFTER_EPOCH") and sys.argv and sys.argv[0].endswith("fairseq-train"):
    sys.meta_path.insert(0, _PatchOnImport(int(os.environ["LNPOS_TEST_HOLD_AFTER_EPOCH"])))
