"""Results pages: a study as the lab's own command wrote it, never typed by hand.

:func:`publish` writes a folder (``docs/results/NAME/``): ``index.md`` with the command that made it,
the date, the machine and its load while the runs ran, the code versions of the runs and of the
command, then the study's own Markdown (tables, rules) and its figures; beside it ``runs.csv`` (one
row per run: the per-seed data every number on the page is derived from, :mod:`.frame`) and the
files the study wrote (figures, CSVs). A page is replaced whole when the command runs again: the
files the earlier page listed and the new one does not are removed.

:func:`publish` is the one writer of a page folder, and :func:`check_page` its one check: a page is
written only into a folder that is new, empty, or a page the same command wrote (its ``index.md``
starts with :data:`MARKER` and names a command of the same program); anything else there is the
user's or another study's, and is refused in one line before anything is written.
"""
import datetime
import errno
import re
import shlex
import shutil
import sys
from pathlib import Path

from ..common import n_runs, one_line, replace_file, write_text
from ..errors import LnposError
from ..provenance import code_version, describe_code, machine, software
from .frame import COUNTED, GATHERED, write_runs_csv

PAGE = "index.md"
MARKER = "<!-- written by the lab's own command (see below); run it again to rewrite this page -->"


def _machine_line(runs):
    """Where the runs ran, from their records (their versions are in runs.csv); the publishing machine and
    its Python, torch and fairseq where they recorded nothing (a measurement without runs: a benchmark)."""
    if runs is not None and len(runs) and (runs["cpu"] != "").any():
        rec = runs[runs["cpu"] != ""]
        machines = rec.groupby(["cpu", "cores", "gpu"], dropna=False).size()
        parts = [f"{cpu}, {cores:g} cores" + (f", {gpu}" if gpu else "") + f" ({n_runs(n)})"
                 for (cpu, cores, gpu), n in machines.items()]
        load = rec["load"].dropna()
        text = "; ".join(parts)
        if len(load):
            text += f". Load (1-minute average) when the runs ended: {load.min():.2f} to {load.max():.2f}, median {load.median():.2f}"
        cpu = rec["train_cpu_seconds"].dropna()
        if len(cpu):
            text += f". Training CPU time: {cpu.sum():.0f} CPU-s over {n_runs(len(cpu))}"
        return text
    m, v = machine(), software()
    return (f"{m['cpu']}, {m['cores']} cores" + (f", {', '.join(m['gpu'])}" if m["gpu"] else "")
            + f"; Python {v['python']}, torch {v['torch']}, fairseq {v['fairseq']} (this page's)")


def _code_line(runs, page_code):
    if runs is None or not len(runs):
        return f"page written by code {describe_code(page_code)}"
    codes = runs["code"].replace("", "not recorded").value_counts()
    return ("runs trained by code " + ", ".join(f"{c} ({n_runs(n)})" for c, n in codes.items())
            + f"; page written by code {describe_code(page_code)}")


def page_text(title, body_md, runs, command, files, when=None, page_code=None):
    """The text of ``index.md``; its machine and code lines describe the runs the study counts
    (finished, diverged or stopped early); ``page_code`` is the code version of the command that
    writes it (:func:`~fairseq_lnpos.provenance.code_version`, read now when not given)."""
    page_code = code_version() if page_code is None else page_code
    counted = None if runs is None else runs[runs["outcome"].isin(COUNTED)]
    when = when or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = body_md.split("\n", 1)[1].lstrip("\n") if body_md.startswith("# ") else body_md
    figures = [Path(f).name for f in files if str(f).endswith(".png")]
    data = [Path(f).name for f in files if not str(f).endswith(".png")]
    head = [MARKER, f"# {title}", "", f"- Command: `{command}`", f"- Written: {when}",
            f"- Machine: {_machine_line(counted)}", f"- Code: {_code_line(counted, page_code)}",
            "- Data: " + ", ".join((["[runs.csv](runs.csv) (one row per run and seed)"] if runs is not None else [])
                                   + [f"[{d}]({d})" for d in data] or ["none beside this page"]), ""]
    return "\n".join(head + [body.rstrip(), ""] + [f"![{f}]({f})" for f in figures]) + "\n"


COMMAND = "- Command: `"
LINKED = re.compile(r"\]\(([^()/\\]+)\)")  # a file the page links or shows: [name](name), ![name](name)
TEMPORARY = re.compile(r"^\..+\.tmp$")  # a write that was interrupted (common.replace_file's temporary name)


def program(command):
    """The program of a page's command line: ``python -m MODULE``, a script's file name
    (``scripts/bench.sh`` -> ``bench.sh``), else its first word."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if len(words) >= 3 and words[0].startswith("python") and words[1] == "-m":
        return " ".join(words[:3])
    if len(words) >= 2 and words[0].startswith("python"):
        return Path(words[1]).name
    return Path(words[0]).name if words else ""


def _dest(dest):
    text = str(dest) if dest is not None else ""
    if not text.strip():
        raise LnposError(f"--publish {text!r} names no folder: give the page's folder (docs/results/NAME)")
    return Path(dest)


def _cannot_write(dest, e):
    what = {errno.ENOSPC: "free some space on its disk", errno.ENAMETOOLONG: "give a shorter name",
            errno.EDQUOT: "free some space on its disk"}.get(e.errno, "give a folder that can be written")
    return LnposError(f"--publish {one_line(str(dest))}: cannot write the page ({e.strerror or e}): {what}, then "
                      f"run the command again (its other outputs are written)")


def check_page(dest, command, own=()):
    """The files the page in folder ``dest`` lists (names), or an :class:`LnposError` when a page of
    ``command`` may not be written there: ``dest`` names no folder or is a file, or it holds something
    that no page of the same program (:func:`program`) wrote. ``own``: paths of this command's outputs
    that may already be in ``dest`` (its output folder may be the page's)."""
    dest = _dest(dest)
    shown = one_line(str(dest))
    try:
        if dest.exists() and not dest.is_dir():
            raise LnposError(f"--publish {shown} is a file: give a folder (docs/results/NAME; it is created when "
                             f"missing)")
        entries = [e for e in dest.iterdir() if not TEMPORARY.match(e.name)] if dest.is_dir() else []
    except OSError as e:  # a name too long, a folder that cannot be read
        raise _cannot_write(dest, e) from None
    own = {Path(f).resolve() for f in own if f}
    page = dest / PAGE
    if not page.exists() or page.is_symlink():
        foreign = [e for e in entries if e.resolve() not in own and e != page]
        if foreign:
            raise LnposError(f"--publish {shown} holds files that no results page wrote ({one_line(foreign[0].name)}"
                             + (f" and {len(foreign) - 1} more" if len(foreign) > 1 else "") + "): give a new or "
                             "empty folder; nothing was written there")
        return set()
    try:
        lines = page.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LnposError(f"--publish {shown}: its {PAGE} cannot be read ({e}): give a new or empty folder; nothing "
                         f"was written there") from None
    if not lines or lines[0] != MARKER:
        raise LnposError(f"--publish {shown}: its {PAGE} was not written by the lab's command (no marker on its first "
                         f"line): give a new or empty folder, or move that file away; nothing was written there")
    was = next((line[len(COMMAND):line.rfind("`")] for line in lines if line.startswith(COMMAND)), "")
    if program(was) != program(command):
        raise LnposError(f"--publish {shown} is the page of another command ({program(was) or 'none named'}; this is "
                         f"{program(command)}): give a new or empty folder, or run that page's own command; "
                         f"nothing was written there")
    return {name for line in lines for name in LINKED.findall(line)} - {PAGE}


def publish(dest, title, body_md, runs, files, command, when=None):
    """Write the results page folder ``dest`` (after :func:`check_page`); returns the path of its
    ``index.md``. The files the earlier page there listed and this one does not are removed. A write
    that fails (a full disk) is one line, and a page folder this call created is removed again."""
    dest = _dest(dest)
    own = [Path(f) for f in files if f]
    listed = check_page(dest, command, own)
    page_code = code_version()  # read before this page's own files change the checkout
    files = [f for f in own if f.name != "runs.csv"]
    created = not dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for f in files:
            if f.resolve() != (dest / f.name).resolve():
                replace_file(dest / f.name, lambda out, f=f: out.write(f.read_bytes()))
        if runs is not None:
            write_runs_csv(runs, dest / "runs.csv")
        index = write_text(dest / PAGE, page_text(title, body_md, runs, command, files, when, page_code))
        keep = {f.name for f in files} | ({"runs.csv"} if runs is not None else set())
        for name in sorted(listed - keep):
            stale = dest / name
            if stale.is_file() or stale.is_symlink():
                stale.unlink()
    except OSError as e:
        if created:
            shutil.rmtree(dest, ignore_errors=True)
        raise _cannot_write(dest, e) from None
    return index


def write_outputs(out, dest, title, body_md, runs, files, command):
    """The end of a study's command: ``runs.csv`` beside its outputs in ``out`` (the table of its runs
    without where each was read from), and the results page ``dest`` when one is asked for (given as
    an empty text: refused)."""
    if dest is not None:
        check_page(dest, command, list(files))
    runs = runs.drop(columns=[c for c in GATHERED if c in runs])
    written = write_runs_csv(runs, Path(out) / "runs.csv")
    if dest is not None:
        publish(dest, title, body_md, runs, list(files) + [written], command)


def argv_of(prog, argv):
    """The command line as typed (for a results page)."""
    return " ".join([prog] + [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)])
