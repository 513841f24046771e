"""Loading fairseq 0.12 checkpoints with torch >= 2.6.

torch 2.6 made ``torch.load`` default to ``weights_only=True``; fairseq 0.12 checkpoints pickle
an ``argparse.Namespace`` (the training args), so ``fairseq-generate``, ``--restore-file`` and a
resumed run (checkpoint_last.pt) fail with an UnpicklingError. Allow-listing just that class
keeps torch's safe loader on, instead of turning ``weights_only`` off (which would run arbitrary
pickled code). Older torch versions have no safe loader to configure, and need nothing.
"""
import argparse

import torch


def allow_fairseq_checkpoints():
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:
        add_safe_globals([argparse.Namespace])
