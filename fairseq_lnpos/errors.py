"""One-line errors for bad user input.

fairseq's command-line tools print a full traceback for any exception raised while building a
model, optimizer or scheduler. The plugin raises :class:`LnposError` for bad input instead and,
when fairseq runs as a command, prints it as a single ``error: ...`` line (exit status 2) through
``sys.excepthook``; library callers get an ordinary ``ValueError`` subclass.
"""
import sys


class LnposError(ValueError):
    """Invalid user input; the message says what to do."""


def _excepthook(exc_type, exc, tb, _previous=sys.excepthook):
    if issubclass(exc_type, LnposError):
        print(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    _previous(exc_type, exc, tb)


def install_excepthook():
    if sys.excepthook is not _excepthook and getattr(sys.excepthook, "__name__", "") != "_excepthook":
        sys.excepthook = _excepthook


def check(condition, message):
    if not condition:
        raise LnposError(message)
