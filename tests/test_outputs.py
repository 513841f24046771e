"""What the project's commands print on a terminal: the run list (compact and wide), the table of
a demo folder, no third-party start-up noise."""
import subprocess
import sys

import pytest

from conftest import REPO
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import report
from fairseq_lnpos.experiments import runs as R
from test_faults_state import RUN1, grid_out


def test_grid_list_fits_100_columns_and_wide_shows_every_column(capsys):
    assert G.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= G.LIST_WIDTH
    assert lines[0].split() == ["run", "init", "length", "paper"]
    assert [line.split()[0] for line in lines[1:len(R.RUNS) + 1]] == [r.name for r in R.RUNS]
    assert any(line.startswith("iwslt-postln-adam-lr5e-4-wu500 ") and line.endswith("31.16 BLEU") for line in lines)
    assert G.main(["list", "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert wide[0].split() == ["run", "arch", "init", "optimizer", "lr", "warm-up", "schedule", "length", "avg",
                               "paper", "source"]
    assert max(len(line) for line in wide) > G.LIST_WIDTH


def test_a_row_not_in_the_paper_does_not_give_the_paper_as_its_source(capsys):
    G.main(["list", "--wide"])
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:len(R.RUNS) + 1]}
    for r in R.RUNS:
        if r.paper_note == R.NOT_IN_PAPER:
            assert r.source != R.XIONG and "not in it" in r.source, r.name
            assert rows[r.name].endswith(r.source)
    assert R.BY_NAME["iwslt-postln-adam-lr5e-4-wu500"].source == R.XIONG  # a row of the paper
    assert R.BY_NAME["iwslt-deepnorm-adam-lr5e-4-nowu"].source == R.XIONG_SETTINGS


def test_make_table_on_a_demo_folder_tables_its_grid(tmp_path, capsys):
    grid_out({f"{RUN1}/DONE.json": '{"outcome": "finished"}'})(tmp_path)
    demo = tmp_path / "demo-out"
    demo.mkdir()
    (tmp_path / "out").rename(demo / "grid")
    assert report.main([str(demo), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{demo} is a demo folder: the table of its grid, {demo / 'grid'}\n")
    assert (demo / "grid" / "results.md").exists() and not (demo / "results.md").exists()
    # a folder that is neither: the one-line error names what to give
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 2
    assert "no runs in" in capsys.readouterr().err


@pytest.mark.slow
def test_an_analysis_that_imports_fairseq_prints_no_third_party_warnings_or_debug_lines(tmp_path):
    """fairseq's import turns the root logger to DEBUG (matplotlib's font manager then logs hundreds
    of lines) and torch and hydra warn at start-up; none of it reaches the terminal."""
    res = subprocess.run([sys.executable, "-m", "fairseq_lnpos.analysis.init_grad", "--size", "tiny",
                          "--archs", "deepnorm", "--depths", "2", "--layers-depth", "2", "--seeds", "1",
                          "--tokens", "128", "--out", str(tmp_path / "an")], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "an" / "fig3.png").exists()  # matplotlib ran
    assert res.stderr == ""
    assert "time taken" in res.stdout and "DEBUG" not in res.stdout and "INFO" not in res.stdout


def test_progress_lines_fit_the_terminal_and_the_log_has_them_in_full(tmp_path, capsys):
    from types import SimpleNamespace as NS

    from fairseq_lnpos.experiments import options
    from fairseq_lnpos.experiments.scheduler import TERMINAL_WIDTH, Grid, Phase

    def job(i, name):
        return NS(phase=Phase.RUNNING, label=f"{name} seed 1", updates=150, epoch=1, loss=4.21, pace=None,
                  job=NS(index=i, run=NS(max_update=0, max_epoch=3)))

    # 7 on one GPU, each with one epoch saved: the second in progress
    jobs = [job(i, f"multi30k-preln_rmsnorm-adam-lr5e-4-nowu-{i}") for i in range(1, 8)]
    grid = Grid([], options.RunOptions(out=str(tmp_path)), [None] * 7)
    grid.progress = jobs
    msg = f"{jobs[0].label}: training (new), log {tmp_path}/multi30k-preln_rmsnorm-adam-lr5e-4-nowu/seed1/train.log"
    grid.say(msg)
    grid.progress = jobs[:2]
    grid.say()
    for e in grid.evaluators.values():
        e.close()
    printed = capsys.readouterr().out.splitlines()
    assert all(len(line) <= TERMINAL_WIDTH for line in printed if "/" not in line)  # a path stays whole
    assert printed[0].endswith("0/7 runs done | 7 running | ETA ?") and len(printed) == 3
    assert printed[1] == f"  {msg}"  # on a line of its own, whole
    assert printed[-1].endswith("0/2 runs done | #1 ep 2/3 upd 150 loss 4.21 | #2 ep 2/3 upd 150 loss 4.21 | ETA ?")
    full = (tmp_path / "progress.log").read_text().splitlines()
    assert len(full) == 2 and full[0].endswith(f"| ETA ? | {msg}") and len(full[0]) > 700
    assert f"run 7/7 {jobs[6].label}: epoch 2/3, update 150, loss 4.21" in full[0]
