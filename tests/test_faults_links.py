"""Fault injection: symbolic links and names that would lead a write out of an output folder.

A figure or a state file is written to a temporary file and renamed over its path, so that a link
there is replaced and its target left alone; a log the project appends to is opened with
``O_NOFOLLOW`` and a link there refused (one line, exit 2) before anything runs; a name from a
record or an option that becomes part of a file name (a run's ``figure``) is a plain name. Rows run
as in tests/test_faults.py (one error line, the exit status, nothing changed outside the output
folders)."""
import json
import os
import shlex

import pytest

from test_faults import GRID, ROW, TABLE, Case, check_case, grid_data, run_folder, snapshot  # noqa: F401
from conftest import toy_data  # noqa: F401

from fairseq_lnpos.common import open_log, write_figure, write_text
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


def figure_folder(sandbox):
    run_folder(**{"config.json": config(ROW, figure="x/../../outside/evil"), "eval__epoch1.json": EPOCH1})(sandbox)
    (sandbox / "out" / "fig_x").mkdir()
    (sandbox / "outside").mkdir()


CASES = [
    # --- logs the grid appends to: refused before anything runs
    *[Case(f"grid-{name.replace('/', '-')}-is-a-link", GRID_RUN, rf"^grid: error: \S*/{name} is a symbolic link",
           setup=linked_log(name), writes=("out",), needs=("data",))
      for name in ("progress.log", "evaluator.log", f"{ROW}/seed1/train.log")],
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


@pytest.mark.parametrize("leftover", [False, True], ids=["link-at-the-path", "link-at-the-temporary-name"])
def test_the_figure_writer_never_writes_through_a_link(tmp_path, leftover):
    """The shared writer of figures (stability map, depth map, table, Fig. 3): a link at the path,
    or at the temporary name beside it (left by someone else), is replaced; its target is not touched."""
    from fairseq_lnpos.analysis.map_common import pyplot, save

    target = victim(tmp_path)
    path = tmp_path / "stability_heatmaps.png"
    (tmp_path / ".stability_heatmaps.png.tmp" if leftover else path).symlink_to(target)
    fig = pyplot().figure()
    save(fig, path, "title")
    assert target.read_bytes() == VICTIM
    assert path.read_bytes().startswith(b"\x89PNG") and not path.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside", "stability_heatmaps.png"]


def test_text_files_are_not_written_through_a_leftover_temporary_link(tmp_path):
    target = victim(tmp_path)
    (tmp_path / ".results.md.tmp").symlink_to(target)
    write_text(tmp_path / "results.md", "table\n")
    assert target.read_bytes() == VICTIM and (tmp_path / "results.md").read_text() == "table\n"
    assert not (tmp_path / ".results.md.tmp").exists()


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
    from fairseq_lnpos.data import synthetic_check
    from fairseq_lnpos import gpu_check

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
