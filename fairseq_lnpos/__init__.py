"""fairseq-lnpos: a fairseq --user-dir plugin to study where LayerNorm sits in a Transformer.

Importing the package registers its architectures, optimizer, schedulers and task with fairseq
and makes fairseq checkpoints load on torch >= 2.6.
"""
import os

from .checkpoint import allow_fairseq_checkpoints
from .errors import LnposError, install_excepthook

allow_fairseq_checkpoints()
install_excepthook()

from . import models, optim, tasks  # noqa: E402,F401
from .models import archs  # noqa: E402,F401

USER_DIR = os.path.dirname(os.path.abspath(__file__))


def print_user_dir():
    """Console script ``fairseq-lnpos-userdir``: the folder to pass to ``--user-dir``."""
    print(USER_DIR)


__all__ = ["LnposError", "USER_DIR"]
