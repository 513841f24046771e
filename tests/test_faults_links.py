"""Fault injection: symbolic links and names that would lead a write out of an output folder.

A figure or a state file is written to a temporary file and renamed over its path, so that a link
there is replaced and its target left alone; a log the project appends to is opened with
``O_NOFOLLOW`` and a link there refused (one line, exit 2) before anything runs; a name from a
record or an option that becomes part of a file name (a run's ``figure``) is a plain name. Rows run
as in tests/test_faults.py (one error line, the exit status, nothing changed outside the output
folders)."""
import ast
import functools
import io
import json
import os
import shlex

import pytest

from test_faults import GRID, ROW, TABLE, Case, check_case, grid_data, run_folder, snapshot  # noqa: F401
from conftest import REPO, TOOLS, tool, toy_data  # noqa: F401

from fairseq_lnpos.common import open_log, replace_file, write_figure, write_text
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.experiments import report
from fairseq_lnpos.experiments import runs as R

DEMO = "demo-preln-nowu"  # figure "demo": OUT/fig_demo.png
GRID_RUN = (GRID, "run", "--only", ROW, "--arch-size", "tiny", "--data", "{S}/data", "--out", "{S}/out")
DRY_RUN = (GRID, "run", "--only", ROW, "--dry-run", "--data", "{S}/B", "--out", "{S}/out")
VICTIM = b"a file outside the output folder\n"


def victim(sandbox):
    (sandbox / "outside").mkdir(exist_ok=True)
    path = sandbox / "outside" / "victim"
    path.write_bytes(VICTIM)
    return path


def config(name=DEMO, **run):
    return json.dumps({"hash": "0", "seed": 1, "arch": "transformer_preln_tiny",
                       "run": {**R.BY_NAME[name].with_defaults().as_dict(), **run}})


EPOCH1 = json.dumps({"epoch": 1, "num_updates": 10, "valid_loss": 5.0, "bleu_tok": 1.5})


def linked_log(name):
    """A grid's output folder whose ``name`` is a link to a file outside it."""
    def setup(sandbox):
        grid_data(sandbox)
        path = sandbox / "out" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (sandbox / "out" / ".lnpos-grid").write_text("")
        path.symlink_to(victim(sandbox))
    return setup


def linked_download(sandbox):
    """A Multi30k download whose partial file (``OUT/orig/<file>.gz.part``) is a link to a file outside."""
    (sandbox / "out" / "orig").mkdir(parents=True)
    (sandbox / "out" / "orig" / "train.de.gz.part").symlink_to(victim(sandbox))


class Served(io.BytesIO):
    status, headers = 206, {}


def serve_download(monkeypatch):
    """The download answers every request (a resumed one too) with a few bytes, no network."""
    from fairseq_lnpos.data import download, multi30k

    fetch = functools.partial(download.download, opener=lambda request: Served(b"appended bytes\n"))
    monkeypatch.setattr(multi30k, "download", fetch)


def figure_folder(sandbox):
    run_folder(**{"config.json": config(ROW, figure="x/../../outside/evil"), "eval__epoch1.json": EPOCH1})(sandbox)
    (sandbox / "out" / "fig_x").mkdir()
    (sandbox / "outside").mkdir()


CASES = [
    # --- logs the grid appends to: refused before anything runs
    *[Case(f"grid-{name.replace('/', '-')}-is-a-link", GRID_RUN, rf"^grid: error: \S*/{name} is a symbolic link",
           setup=linked_log(name), writes=("out",), needs=("data",))
      for name in ("progress.log", "evaluator.log", f"{ROW}/seed1/train.log")],
    # --- a download's partial file: never appended to through a link, nor renamed into place
    Case("multi30k-download-part-is-a-link", ("fairseq_lnpos.data.multi30k", "--out", "{S}/out", "--bin", "{S}/bin"),
         r"^prepare-multi30k\.sh: error: \S*/out/orig/train\.de\.gz\.part is a symbolic link, and the file there is "
         r"written to: remove the link", setup=linked_download, patch=serve_download),
    # --- a figure name from an option or a record: a plain name
    Case("set-figure-leads-out", DRY_RUN + ("--set", "figure=x/../../outside/evil"),
         r"^grid: error: --set figure 'x/\.\./\.\./outside/evil': give a plain name", writes=()),
    Case("table-config-figure-leads-out", (TABLE, "{S}/out"),
         r"^make_table: error: 1 run folder\(s\) unreadable, .*config\.json is not a run's config the grid writes "
         r"\('run\.figure' is 'x/\.\./\.\./outside/evil', not a plain name", setup=figure_folder, writes=("out",),
         needs=("data",)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_fault(case, tmp_path, monkeypatch, capsys, request):
    check_case(case, tmp_path, monkeypatch, capsys, request)
    assert not list(tmp_path.rglob("evil*"))
    if (tmp_path / "sandbox" / "outside" / "victim").exists():
        assert (tmp_path / "sandbox" / "outside" / "victim").read_bytes() == VICTIM
    for link in (tmp_path / "sandbox").rglob("*.part"):
        assert link.is_symlink()  # left where it was, not renamed into place


# ---------------------------------------------------------------- figures: the link is replaced

def test_make_table_replaces_a_linked_figure_and_leaves_its_target(tmp_path, capsys, toy_data, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_folder(**{"config.json": config(), "eval__epoch1.json": EPOCH1})(tmp_path)
    os.rename(tmp_path / "out" / ROW, tmp_path / "out" / DEMO)
    target = victim(tmp_path)
    fig = tmp_path / "out" / "fig_demo.png"
    fig.symlink_to(target)
    assert report.main([str(tmp_path / "out")]) == 0
    assert target.read_bytes() == VICTIM
    assert not fig.is_symlink() and fig.read_bytes().startswith(b"\x89PNG")


def test_the_figure_writer_never_writes_through_a_link(tmp_path):
    """The shared writer of figures (stability map, depth map, table, Fig. 3): a link at the path is
    replaced; its target is not touched."""
    from fairseq_lnpos.analysis.map_common import pyplot, save

    target = victim(tmp_path)
    path = tmp_path / "stability_heatmaps.png"
    path.symlink_to(target)
    fig = pyplot().figure()
    save(fig, path, "title")
    assert target.read_bytes() == VICTIM
    assert path.read_bytes().startswith(b"\x89PNG") and not path.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "stability_heatmaps.png"]


def test_text_files_are_not_written_through_a_temporary_link_left_beside_them(tmp_path):
    """A link left under the old fixed temporary name is neither followed nor needed."""
    target = victim(tmp_path)
    (tmp_path / ".results.md.tmp").symlink_to(target)
    write_text(tmp_path / "results.md", "table\n")
    assert target.read_bytes() == VICTIM and (tmp_path / "results.md").read_text() == "table\n"


def test_two_writers_of_one_file_at_once_both_succeed_and_the_last_rename_wins(tmp_path):
    """Writers of the same file overlapping (the tasks of a SLURM array marking their shared --out):
    the second writes and renames while the first is still writing; neither fails, no temporary file
    stays, and the file holds the writer that renamed last."""
    path = tmp_path / "marker"

    def first(f):
        write_text(path, "second\n")  # another writer, start to end, inside the first's write
        f.write(b"first\n")

    replace_file(path, first)
    assert path.read_text() == "first\n" and [p.name for p in tmp_path.iterdir()] == ["marker"]


def test_write_figure_takes_the_format_from_the_suffix(tmp_path):
    from fairseq_lnpos.analysis.map_common import pyplot

    fig = pyplot().figure()
    write_figure(fig, tmp_path / "f.svg")
    assert (tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")


# ---------------------------------------------------------------- logs: a link is refused

def test_open_log_appends_and_refuses_a_link(tmp_path):
    log = tmp_path / "train.log"
    for text in ("one\n", "two\n"):
        with open_log(log) as f:
            f.write(text)
    assert log.read_text() == "one\ntwo\n"
    target = victim(tmp_path)
    (tmp_path / "grad_norms.jsonl").symlink_to(target)
    for binary in (False, True):
        with pytest.raises(LnposError, match=r"grad_norms\.jsonl is a symbolic link, and the file there is written "
                                             r"to: remove the link"):
            open_log(tmp_path / "grad_norms.jsonl", binary=binary)
    assert target.read_bytes() == VICTIM


def test_a_log_written_afresh_empties_its_file_and_refuses_a_link(tmp_path):
    """The GPU check's and the synthetic check's logs are written afresh (truncate), through the same open."""
    synthetic_check, gpu_check = tool("synthetic_check"), tool("gpu_check")
    log = tmp_path / "step.log"
    log.write_text("an earlier run's log\n")
    with open_log(log, truncate=True) as f:
        f.write("new\n")
    assert log.read_text() == "new\n"
    target = victim(tmp_path)
    (tmp_path / "check.log").symlink_to(target)
    with pytest.raises(LnposError, match=r"check\.log is a symbolic link"):
        synthetic_check.run(["true"], None, tmp_path / "check.log")
    with pytest.raises(LnposError, match=r"check\.log is a symbolic link"):
        gpu_check.run(gpu_check.Command(["true"], log=tmp_path / "check.log"))
    assert target.read_bytes() == VICTIM


# ---------------------------------------------------------------- the grid's closing hint

def test_the_closing_hint_quotes_the_folder_as_a_shell_needs_it(tmp_path, capsys):
    from fairseq_lnpos.experiments.grid import run_grid
    from fairseq_lnpos.experiments.options import RunOptions

    out = tmp_path / "out dir; $(touch PWNED)"
    assert run_grid(RunOptions(out=str(out)), []) == 0
    (line,) = [l for l in capsys.readouterr().out.splitlines() if "table:" in l]
    assert shlex.split(line.split("table: ", 1)[1]) == ["scripts/make_table.sh", str(out)]


# ---------------------------------------------------------------- one writer for the whole package

WRITER = "fairseq_lnpos/common.py"
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}
WRITING_METHODS = {"write_text", "write_bytes", "touch", "symlink_to", "hardlink_to", "savefig"}
NOT_CONVERTED = set()


def _names(node):
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(node)
            if isinstance(n, (ast.Attribute, ast.Name))}


def _opened_files(tree):
    """The ids of the names that are a lambda's parameter inside it (``lambda f: torch.save(x, f)``:
    ``f`` is a file the writer opened)."""
    return {id(n) for lam in ast.walk(tree) if isinstance(lam, ast.Lambda) for n in ast.walk(lam.body)
            if isinstance(n, ast.Name) and n.id in {a.arg for a in lam.args.args}}


def raw_writes(tree):
    """(line, what) of every call in ``tree`` that opens a file to write without the package's writer:
    ``open`` / ``X.open`` with a mode that is not read-only (or not a literal), ``os.open`` with a flag
    that writes, the writing methods of paths and figures, and ``torch.save`` / ``np.save`` to a path."""
    opened = _opened_files(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
        target = node.args[1 if name == "save" else 0] if len(node.args) > (name == "save") else None
        if name == "open" and owner == "os":
            if len(node.args) > 1 and _names(node.args[1]) & WRITE_FLAGS:
                found.append((node.lineno, "os.open"))
        elif name == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            if mode is not None and not (isinstance(mode, ast.Constant) and set(str(mode.value)) <= set("rbt")):
                found.append((node.lineno, name))
        elif isinstance(func, ast.Attribute) and name in WRITING_METHODS | {"save"}:
            if (name != "save" or owner in ("torch", "np", "numpy")) and id(target) not in opened:
                found.append((node.lineno, f"{owner}.{name}" if name == "save" else name))
    return found


def test_every_write_of_the_package_goes_through_its_writer():
    """Every file the package or a script of ``scripts/tools/`` writes or appends to is opened by the
    writer of ``common.py`` (``replace_file``, ``open_log``), which never follows a link: no other
    module opens a file to write."""
    paths = sorted((REPO / "fairseq_lnpos").rglob("*.py")) + sorted(TOOLS.glob("*.py"))
    assert {p.name for p in paths} >= {"bench.py", "gpu_check.py", "synthetic_check.py", "early_stop_replay.py"}
    found = []
    for path in paths:
        rel = path.relative_to(REPO).as_posix()
        if rel == WRITER or rel in NOT_CONVERTED:
            continue
        found += [f"{rel}:{line}: {what}" for line, what in raw_writes(ast.parse(path.read_text(encoding="utf-8")))]
    assert found == []


def test_the_writer_check_finds_each_kind_of_raw_write():
    source = "\n".join([
        "open(p, 'w')", "open(p, mode='ab')", "open(p, m)", "gzip.open(p, 'wt')", "os.open(p, os.O_WRONLY | os.O_CREAT)",
        "Path(p).write_text(t)", "p.write_bytes(b)", "p.touch()", "fig.savefig(p)", "torch.save(x, p)",
        "open(p)", "open(p, 'rb')", "os.open(p, os.O_RDONLY)", "write_text(p, t)", "tarfile.open(p)",
        "replace_file(p, lambda f: torch.save(x, f))", "replace_file(p, lambda f: fig.savefig(f, format='png'))"])
    assert sorted(line for line, _ in raw_writes(ast.parse(source))) == list(range(1, 11))
