"""The project's errors: one class for bad input, raised by library code, printed by ``main()``.

Library code raises :class:`LnposError` (or a subclass) with a message that says what to do;
command-line entry points print it as one line and exit with :data:`USAGE_EXIT` (2). When fairseq's
own commands run the plugin (``--user-dir``), :func:`install_excepthook` does the same for errors
raised while fairseq builds a model, optimizer, scheduler or task. :func:`run_main` also keeps
third-party start-up noise off a command's terminal (:func:`quiet_terminal`).
"""
import logging
import os
import signal
import sys
import threading
import warnings

USAGE_EXIT = 2        # bad input: the message says what to do
INTERRUPT_EXIT = 130  # Ctrl-C / SIGTERM: a re-run resumes
MAX_SEED = 2 ** 32 - 1  # fairseq seeds numpy, whose seeds are 32-bit


class LnposError(ValueError):
    """Invalid user input or unusable state; the message says what to do."""


class StateError(LnposError):
    """A file the project wrote earlier (a run folder, a manifest) is missing or unreadable."""


def project_error(exc):
    """``exc`` if it is an :class:`LnposError`, else the first one it was raised from or while
    handling (fairseq re-raises some errors as a plain ``Exception``), else ``None``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, LnposError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _excepthook(exc_type, exc, tb, _previous=sys.excepthook):
    err = project_error(exc)
    if err is not None:
        print(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {err}", file=sys.stderr)
        sys.exit(USAGE_EXIT)
    _previous(exc_type, exc, tb)


def install_excepthook():
    """Print uncaught project errors as one line (exit 2): fairseq's commands, with ``--user-dir``."""
    if getattr(sys.excepthook, "__name__", "") != "_excepthook":
        sys.excepthook = _excepthook


def check(condition, message):
    if not condition:
        raise LnposError(message)


def interrupt_handler(on_interrupt=None):
    """A handler for SIGINT and SIGTERM that raises KeyboardInterrupt in this process (after
    ``on_interrupt(signum)``), so that SIGTERM stops a command as Ctrl-C does. A process forked
    meanwhile (a worker) ignores SIGINT, which the terminal sends to its whole group and this
    process answers, and dies of SIGTERM as it would without the handler (``Pool.terminate``)."""
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:
            if signum == signal.SIGTERM:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if on_interrupt is not None:
            on_interrupt(signum)
        raise KeyboardInterrupt

    return handler


# Start-up warnings of the libraries under fairseq, printed before anything useful when a command
# imports fairseq in its own process: (module the warning is attributed to, what it is)
THIRD_PARTY_WARNINGS = (
    (r"hydra\.", "the deprecation warnings of the hydra version fairseq pins (composing fairseq's configuration)"),
    (r"torch\.utils\.data\.", "torch's 'pin_memory' warning on a machine without GPU (fairseq's batch iterators)"),
)


def quiet_terminal():
    """Keep third-party noise off the terminal of a command of the project: messages of level WARNING
    and above still reach it; INFO and DEBUG lines only reach the log files their loggers write
    (fairseq-preprocess's preprocess.log, ...); the warnings of :data:`THIRD_PARTY_WARNINGS` are not
    shown. Without it, importing fairseq turns the root logger to DEBUG
    (``fairseq/models/wav2vec/wav2vec2_classification.py`` calls ``logging.basicConfig(level=DEBUG)``),
    and every INFO line of fairseq and DEBUG line of matplotlib goes to the terminal. A terminal
    handler installed first makes that ``basicConfig`` do nothing; a process whose root logger has
    handlers already (fairseq's own commands, pytest) is left as it is."""
    root = logging.getLogger()
    if not root.handlers:
        terminal = logging.StreamHandler()  # stderr
        terminal.setLevel(logging.WARNING)
        terminal.setFormatter(logging.Formatter("%(message)s"))  # as Python prints a warning without handlers
        root.addHandler(terminal)
        root.setLevel(logging.INFO)  # what file handlers of fairseq's loggers write
    for module, _ in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", category=UserWarning, module=module)


def run_main(prog, main, argv=None):
    """Call ``main(argv)`` as a command: its return value is the exit status; an
    :class:`LnposError` becomes one line ``PROG: error: ...`` and exit 2; Ctrl-C or SIGTERM one
    line and 130 (SIGTERM raises KeyboardInterrupt while ``main`` runs, so clean-ups run for both)."""
    quiet_terminal()
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        previous = signal.signal(signal.SIGTERM, interrupt_handler())
    try:
        status = main(argv)
    except LnposError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return USAGE_EXIT
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; run the same command again to resume", file=sys.stderr)
        return INTERRUPT_EXIT
    finally:
        if main_thread:  # a handler installed outside Python reads as None
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    return 0 if status is None else status
