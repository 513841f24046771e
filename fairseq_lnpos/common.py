"""Small helpers shared by the plugin and the tooling around it; imports nothing heavy.

- ``USER_DIR``: the folder to pass to fairseq's ``--user-dir``; ``RESULTS``: the results pages of a checkout
  (``docs/results/``; absent from an installed copy).
- ``write_text`` / ``write_json`` / ``write_figure`` (``replace_file`` under them): write to a
  temporary file beside the target, then rename, so a reader never sees half a file, an interruption
  leaves the old file (or none), and a symbolic link at the target is replaced, never written through.
- ``open_log`` (``open_fd`` under it): a file opened to append to, or written afresh in place; a
  symbolic link there is refused (``O_NOFOLLOW``). These are the package's only opens for writing.
- ``plain_name``: a name from a record or an option that becomes part of a file name (no folder in it).
- ``read_json``: a JSON file that must be readable; a missing or damaged file raises
  :class:`~fairseq_lnpos.errors.StateError` naming the path.
- ``read_lines``: lines split on ``\\n`` only (as perl and grep do), without the newline.
- ``fmt_time``: seconds as ``H:MM:SS``.
- ``one_line``: a text with its control characters (newlines, tabs ...) written as escapes.
- ``hold_lock`` / ``release_lock``: an exclusive lock (flock) on a file, refused with a message
  while another process holds it (the grid's run folders, the data-prep output folders).
"""
import errno
import fcntl
import json
import os
import re
import secrets
import time
from pathlib import Path

from .errors import LnposError, StateError

USER_DIR = Path(__file__).resolve().parent
RESULTS = USER_DIR.parent / "docs" / "results"
GRAD_NORMS_JSONL = "grad_norms.jsonl"  # --task translation_lnpos --log-grad-norms writes it into --save-dir
DIAGNOSTICS_JSONL = "diagnostics.jsonl"  # --task translation_lnpos --log-diagnostics writes it into --save-dir
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def refuse_folder(path):
    """A folder where a file is to be written is an error that names it."""
    if Path(path).is_dir():
        raise LnposError(f"{path} is a folder, not a file: move it away or remove it, then run again")


def replace_file(path, write):
    """Atomically replace ``path`` with what ``write(f)`` writes to ``f``, a new binary file beside it
    (``.NAME.RANDOM.tmp``, a name of its own, created with ``O_EXCL``: writers of the same path at
    once, such as the tasks of a SLURM array on a shared file system, each rename their own file and
    the last one wins; a link under the name is never written through). A symbolic link at ``path``
    is replaced by the file, its target left alone; a folder at ``path`` is an error; nothing (no
    temporary file) stays when the write fails."""
    path = Path(path)
    refuse_folder(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path, text):
    """Atomically replace ``path`` with ``text`` (UTF-8), as :func:`replace_file`."""
    return replace_file(path, lambda f: f.write(text.encode("utf-8")))


def write_figure(fig, path, **savefig_kw):
    """Write matplotlib figure ``fig`` to ``path`` (its format from the suffix), as :func:`replace_file`."""
    path = Path(path)
    return replace_file(path, lambda f: fig.savefig(f, format=path.suffix.lstrip(".") or None, **savefig_kw))


FONT = 9  # the smallest text of a figure, in points at the written size


def integer_ticks(axis):
    """Tick a matplotlib axis (a layer or epoch axis) at whole numbers only."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def legend_right(fig, axes, right):
    """One legend for matplotlib figure ``fig``, right of its axes, from the lines of ``axes`` (one
    or several; a label once): the axes end at ``right`` (a fraction of the figure's width), the
    legend starts there. ``None`` where no line has a label."""
    fig.subplots_adjust(right=right)
    lines = {}
    for ax in [axes] if hasattr(axes, "get_legend_handles_labels") else axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            lines.setdefault(label, handle)
    if not lines:
        return None
    return fig.legend(list(lines.values()), list(lines), loc="center left", bbox_to_anchor=(right + 0.01, 0.5),
                      fontsize=FONT, frameon=False)


def refuse_link(path):
    """A symbolic link where the project writes a file of its own is an error that names it."""
    if Path(path).is_symlink():
        raise LnposError(f"{path} is a symbolic link, and the file there is written to: remove the link "
                         f"(or move it away), then run again")


def open_fd(path, flags):
    """A file descriptor of ``path`` opened with ``flags`` (created with mode 0o666, less the umask).
    A symbolic link there is refused (:func:`refuse_link`), not followed: the open itself refuses it
    (``O_NOFOLLOW``)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_link(path)
        raise


def open_log(path, binary=False, truncate=False):
    """``path`` opened to append to (created when missing, UTF-8 unless ``binary``); with ``truncate``
    emptied first, the open of every file written in place (a log afresh, a stage's text file, a
    download's partial file). A symbolic link there is refused (:func:`open_fd`)."""
    fd = open_fd(path, os.O_WRONLY | (os.O_TRUNC if truncate else os.O_APPEND) | os.O_CREAT)
    return os.fdopen(fd, "ab") if binary else os.fdopen(fd, "a", encoding="utf-8")


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def is_plain_name(text):
    """Letters, digits, ``_ . + -``, starting with a letter or digit, no ``..``: a name that becomes
    part of a file name inside an output folder and cannot lead out of it."""
    return isinstance(text, str) and bool(PLAIN_NAME.fullmatch(text)) and ".." not in text


def plain_name(text, what):
    """``text`` if :func:`is_plain_name`, else an :class:`LnposError` naming ``what``."""
    if not is_plain_name(text):
        raise LnposError(f"{what} {one_line(str(text))!r}: give a plain name (letters, digits, '_', '.', '+', '-'; "
                         f"no '/', no '..')")
    return text


def write_json(path, obj):
    """Atomically replace ``path`` with ``obj`` as indented, key-sorted JSON."""
    return write_text(path, json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def read_json(path, missing_ok=False, what_to_do="delete it to redo that step"):
    """The JSON object in ``path``; ``None`` for a missing file when ``missing_ok``.

    A file that exists but cannot be read or parsed is never taken as absent: it raises
    :class:`StateError` with the path and ``what_to_do``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise StateError(f"{path} is missing: {what_to_do}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise StateError(f"{path} cannot be read ({e}): {what_to_do}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise StateError(f"{path} is damaged (not JSON: {e.msg}, line {e.lineno}): {what_to_do}") from None


def read_lines(path):
    """Lines of a UTF-8 text file, split on ``\\n`` only, without the newline."""
    try:
        with open(path, encoding="utf-8", newline="\n", errors="strict") as f:
            return [line[:-1] if line.endswith("\n") else line for line in f]
    except UnicodeDecodeError as e:
        raise LnposError(f"{path}: not UTF-8 text ({e}): pass the original file") from None


def one_line(text):
    """``text`` with its control characters written as escapes (a newline as backslash-n)."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def n_runs(n):
    """``"1 run"``, ``"2 runs"``."""
    return f"{n} run" + ("" if n == 1 else "s")


def fmt_time(seconds):
    """``3725`` -> ``1:02:05``."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def hold_lock(path, busy, wait=0):
    """Hold an exclusive lock on file ``path`` (created when missing); returns the open fd (close
    it, or :func:`release_lock`, to release). While another process holds it, tries again for
    ``wait`` seconds, then raises :class:`LnposError` ``busy``. A lock file that its holder removed
    meanwhile (:func:`release_lock`) is not taken: the lock is tried on the file now at ``path``."""
    deadline = time.time() + wait
    while True:
        fd = open_fd(path, os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.time() >= deadline:
                raise LnposError(busy) from None
            time.sleep(0.5)
            continue
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def release_lock(fd, path):
    """Remove lock file ``path`` and release the lock ``fd`` held on it (see :func:`hold_lock`)."""
    Path(path).unlink(missing_ok=True)
    os.close(fd)
