"""The project's errors: one class for bad input, raised by library code, printed by ``main()``.

Library code raises :class:`LnposError` (or a subclass) with a message that says what to do;
command-line entry points print it as one line and exit with :data:`USAGE_EXIT` (2). When fairseq's
own commands run the plugin (``--user-dir``), :func:`install_excepthook` does the same for errors
raised while fairseq builds a model, optimizer, scheduler or task. :func:`run_main` also keeps
third-party start-up noise off a command's terminal (:func:`quiet_terminal`).
"""
import argparse
import difflib
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


# Warnings of fairseq and the libraries under it, printed before anything useful when a command
# imports fairseq in its own process or fairseq's own commands run the plugin (--user-dir):
# (category, module the warning is attributed to, start of its message, what it is)
THIRD_PARTY_WARNINGS = (
    (UserWarning, r"hydra\.", "", "the deprecation warnings of the hydra version fairseq pins (composing fairseq's configuration)"),
    (UserWarning, "", r"\s*'config' is validated against ConfigStore schema",
     "hydra's deprecation of schema matching, attributed to no module ('sys:1')"),
    (UserWarning, r"torch\.utils\.data\.", "", "torch's 'pin_memory' warning on a machine without GPU (fairseq's batch iterators)"),
    (FutureWarning, r"fairseq\.tasks\.fairseq_task", r"`torch\.cuda\.amp\.autocast",
     "torch's deprecation of the autocast call fairseq makes at every training step"),
    (UserWarning, r"torch\.nn\.functional", r"Support for mismatched key_padding_mask and attn_mask is deprecated",
     "torch's deprecation of the mask types fairseq's attention passes"),
)


def quiet_warnings():
    """Do not show the warnings of :data:`THIRD_PARTY_WARNINGS`; any other warning still shows."""
    for category, module, message, _ in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


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
    quiet_warnings()


def closest(name, choices, n=3):
    """The names of ``choices`` closest to ``name`` (difflib), closest first; at most ``n``."""
    return difflib.get_close_matches(name, list(choices), n=n, cutoff=0.6)


def check_arch(argv, archs):
    """An :class:`LnposError` naming the closest of ``archs`` if the ``--arch``/``-a`` that the
    command line ``argv`` gives is not one of them (fairseq's answer is its whole usage message
    and every arch name)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--arch", "-a")
    arch = parser.parse_known_args(argv)[0].arch
    if arch is None or arch in archs:
        return
    near = closest(arch, archs)
    hint = f"did you mean {' or '.join(near)}?" if near else "no registered arch has a similar name"
    raise LnposError(f"--arch {arch} is not a registered architecture: {hint} "
                     f"(docs/architectures.md lists the plugin's)")


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
