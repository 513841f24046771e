"""fairseq-lnpos: a fairseq --user-dir plugin to study where LayerNorm sits in a Transformer.

Importing the package (or any of its data, analysis and experiment modules) imports neither
fairseq nor torch and changes nothing in the process. The plugin's components (architectures,
optimizer, schedulers, task) are registered with fairseq

- by fairseq itself, when a fairseq command runs with ``--user-dir``: fairseq imports this
  package after importing itself, so ``"fairseq" in sys.modules`` holds and :func:`register`
  runs here; in that case (and only then) the command also gets the plugin's one-line errors
  (:func:`fairseq_lnpos.errors.install_excepthook`) and does not show the known deprecation
  warnings of fairseq and the libraries under it (:func:`fairseq_lnpos.errors.quiet_warnings`);
  a misspelt ``--arch`` is one line naming the closest registered ones
  (:func:`fairseq_lnpos.errors.check_arch`);
- by :func:`register`, for code that builds fairseq objects in its own process (the analyses,
  the tests, :mod:`fairseq_lnpos.fairseq_build`). fairseq skips a ``--user-dir`` package that is
  imported already, so such code must call it.
"""
import sys

from .common import USER_DIR
from .errors import LnposError

__all__ = ["LnposError", "USER_DIR", "register"]


def register():
    """Register the plugin's components with fairseq and let torch's safe loader read fairseq
    checkpoints (:mod:`fairseq_lnpos.checkpoint`). Imports fairseq and torch; idempotent."""
    from .checkpoint import allow_fairseq_checkpoints, guard_resume

    allow_fairseq_checkpoints()
    from . import models, optim, tasks  # noqa: F401
    from .models import archs  # noqa: F401

    guard_resume()


def _imported_by_fairseq_command():
    """Is fairseq's ``utils.import_user_module`` (``--user-dir``) importing this package now?"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "import_user_module" and frame.f_globals.get("__name__") == "fairseq.utils":
            return True
        frame = frame.f_back
    return False


def print_user_dir():
    """Console script ``fairseq-lnpos-userdir``: the folder to pass to ``--user-dir``."""
    print(USER_DIR)


if "fairseq" in sys.modules:  # imported by fairseq (--user-dir) or next to it: fairseq and torch are loaded
    register()
    if _imported_by_fairseq_command():
        from fairseq.models import ARCH_MODEL_REGISTRY

        from .errors import check_arch, install_excepthook, quiet_warnings

        install_excepthook()
        quiet_warnings()
        check_arch(sys.argv[1:], ARCH_MODEL_REGISTRY)
