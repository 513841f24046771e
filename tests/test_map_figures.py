"""The stability map's figures read: a map whose runs all diverged or stopped is written whole (no loss to
draw, no figure of it, no traceback), a title fits its figure however narrow, and every variant keeps a
colour of its own however many there are."""
import json

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from fairseq_lnpos.analysis import map_common, map_figures, stability  # noqa: E402
from fairseq_lnpos.variants import VARIANTS  # noqa: E402
from test_stability import write_run  # noqa: E402


def test_a_map_where_no_run_finished_is_written_whole(tmp_path, capsys):
    out = tmp_path / "sweep"
    for lr in (1e-3, 3e-3):
        for seed in (1, 2):
            write_run(out, "postln", lr, 0, seed, status="diverged at update 40")
    assert stability.main([str(out)]) == 0
    md = (out / "stability.md").read_text()
    assert md.startswith("# Stability map of ") and "4 runs: 4 diverged" in md
    assert (out / "stability_overview.png").exists() and (out / "stability_heatmaps.png").exists()
    assert not (out / "loss_vs_lr.png").exists()  # no seed finished: no loss to draw
    assert "Traceback" not in capsys.readouterr().err
    cells = stability.make_cells(stability.gather([out], {}, "a sweep")[0])
    assert map_figures.plot_loss_vs_lr(cells, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def drawn_title(path_fig):
    fig = path_fig
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return fig._suptitle.get_window_extent(renderer), fig.bbox


@pytest.mark.parametrize("panels", [1, 3])
def test_a_maps_title_is_never_clipped(tmp_path, monkeypatch, panels):
    drawn = []
    real_save = map_common.save

    def keep(fig, *a, **kw):
        drawn.append(fig)
        return real_save(fig, *a, **kw)

    monkeypatch.setattr(map_figures, "save", keep)
    out = tmp_path / "sweep"
    for warmup in (0, 100, 1000)[:panels]:
        for seed in (1, 2):
            write_run(out, "preln", 1e-3, warmup, seed, final=0.5 + seed / 100)
    cells = stability.make_cells(stability.gather([out], {}, "a sweep")[0])
    map_figures.plot_loss_vs_lr(cells, tmp_path / "loss.png")
    box, figure = drawn_title(drawn[0])
    assert figure.x0 <= box.x0 and box.x1 <= figure.x1 and box.y1 <= figure.y1
    assert ("\n" in drawn[0]._suptitle.get_text()) == (panels == 1)  # one panel: wrapped, not cut
    assert " ".join(drawn[0]._suptitle.get_text().split()) == (
        "Final validation NLL against the learning rate, per architecture: mean over the seeds that finished, bars = "
        "min-max over the seeds")


def test_the_wrap_keeps_every_word_and_each_lines_breaks():
    text = "first line\n" + "word " * 60
    wrapped = map_common.wrap(text, 4.0)
    assert wrapped.split("\n")[0] == "first line" and wrapped.split() == text.split()
    assert max(len(line) for line in wrapped.split("\n")) <= 4.0 * 72 / (0.6 * 9)


def test_every_variant_has_a_colour_of_its_own_for_any_number_of_variants():
    colours = [map_common.color(i) for i in range(200)]
    assert len(set(colours)) == 200 and "#000000" not in colours  # black: a curve that is no variant
    assert colours[:2] == ["#1f77b4", "#ff7f0e"]
    assert len({map_common.variant_color(v) for v in VARIANTS}) == len(VARIANTS)


def test_the_sensitivity_figure_draws_each_variant_in_its_colour(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(map_figures, "save", lambda fig, *a, **kw: drawn.append(fig))
    variants = list(VARIANTS)
    sens = {(v, layers, 1): 0.1 * layers for v in variants for layers in (6, 12)}
    map_figures.plot_sensitivity(sens, tmp_path / "sens.png")
    lines = {line.get_label(): line.get_color() for ax in drawn[0].axes for line in ax.get_lines()}
    assert lines == {VARIANTS[v].label: map_common.variant_color(v) for v in variants}
    assert len(set(lines.values())) == len(variants)


def test_a_one_seed_map_says_in_its_figures_why_no_cell_is_judged(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(map_figures, "save", lambda fig, path, title, *a, **kw: drawn.append(title))
    one, three = tmp_path / "one", tmp_path / "three"
    for lr in (1e-3, 3e-3):
        write_run(one, "preln", lr, 0, 1, final=0.5 + lr)
        for seed in (1, 2, 3):
            write_run(three, "preln", lr, 0, seed, final=0.5 + lr + seed / 100)
    for folder in (one, three):
        cells = stability.make_cells(stability.gather([folder], {}, "a sweep")[0])
        map_figures.plot_overview(cells, tmp_path / "o.png")
        map_figures.plot_heatmaps(cells, tmp_path / "h.png")
    assert all("Every cell has one seed, so no cell is compared with its reference" in t for t in drawn[:2])
    assert not any("one seed, so" in t for t in drawn[2:])


def test_the_sensitivity_figure_draws_a_negative_value_rather_than_cutting_it_off(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(map_figures, "save", lambda fig, *a, **kw: drawn.append(fig))
    map_figures.plot_sensitivity({("postln", 6, 1): -0.093, ("postln", 12, 1): 0.2}, tmp_path / "s.png")
    ax = drawn[0].axes[0]
    assert ax.get_ylim()[0] <= -0.093 and list(ax.get_lines()[0].get_ydata()) == [-0.093, 0.2]
    drawn.clear()
    map_figures.plot_sensitivity({("postln", 6, 1): 0.1, ("postln", 12, 1): 0.2}, tmp_path / "s.png")
    assert drawn[0].axes[0].get_ylim()[0] == 0
