"""Results pages: a study as the lab's own command wrote it, never typed by hand.

:func:`publish` writes a folder (``docs/results/NAME/``): ``index.md`` with the command that made it,
the date, the machine and its load while the runs ran, the code versions of the runs and of the
command, then the study's own Markdown (tables, rules) and its figures; beside it ``runs.csv`` (one
row per run: the per-seed data every number on the page is derived from, :mod:`.frame`) and the
files the study wrote (figures, CSVs). A page is replaced whole when the command runs again.
"""
import datetime
import shlex
import sys
from pathlib import Path

from ..common import n_runs, replace_file, write_text
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


def publish(dest, title, body_md, runs, files, command, when=None):
    """Write the results page folder ``dest``; returns the path of its ``index.md``."""
    page_code = code_version()  # read before this page's own files change the checkout
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files = [Path(f) for f in files if f and Path(f).name != "runs.csv"]
    for f in files:
        if f.resolve() != (dest / f.name).resolve():
            replace_file(dest / f.name, lambda out, f=f: out.write(f.read_bytes()))
    if runs is not None:
        write_runs_csv(runs, dest / "runs.csv")
    return write_text(dest / PAGE, page_text(title, body_md, runs, command, files, when, page_code))


def write_outputs(out, dest, title, body_md, runs, files, command):
    """The end of a study's command: ``runs.csv`` beside its outputs in ``out`` (the table of its runs
    without where each was read from), and the results page ``dest`` when one is asked for."""
    runs = runs.drop(columns=[c for c in GATHERED if c in runs])
    write_runs_csv(runs, Path(out) / "runs.csv")
    if dest:
        publish(dest, title, body_md, runs, files, command)


def argv_of(prog, argv):
    """The command line as typed (for a results page)."""
    return " ".join([prog] + [shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)])
