"""The figures read together: a variant has one colour in every figure (analysis.map_common.variant_color),
the legend sits right of the axes, layer axes are ticked at whole numbers, no text under 9 pt."""
import matplotlib

matplotlib.use("Agg")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from fairseq_lnpos.analysis import map_figures, plots  # noqa: E402
from fairseq_lnpos.common import FONT  # noqa: E402
from fairseq_lnpos.analysis.map_common import OTHER_COLOR, label_color, variant_color  # noqa: E402
from fairseq_lnpos.variants import VARIANTS  # noqa: E402


def fig3_result(labels=("Post-LN", "Pre-LN"), layers=6):
    """A fig3.json as init_grad.py writes it: two architectures, ``layers`` layers, two depths."""
    stat = {"mean": [0.1 * (i + 1) for i in range(layers)], "std": [0.01] * layers,
            "batch_norm_mean": [0.2] * layers}
    last = {"depths": [6, 8], "mean": [1.0, 1.1], "std": [0.1, 0.1], "batch_norm_mean": [1.2, 1.3]}
    points = [{"layer": i, "ln": ln, "mean": 1.0 + i} for i in range(layers) for ln in ("self_attn_ln", "final_ln")]
    stream = {"layers_applied": list(range(layers + 1)), "mean": [1.0 + i for i in range(layers + 1)],
              "lemma_lower": [1.0] * (layers + 1), "lemma_upper": [2.0 + i for i in range(layers + 1)]}
    lemma = {labels[0]: {"depth": layers, "points": points}, labels[1]: {"depth": layers, "stream": stream}}
    return {"per_layer": {lab: {s: {"fc1": stat, "fc2": stat} for s in ("encoder", "decoder")} for lab in labels},
            "last_w2": {lab: {s: last for s in ("encoder", "decoder")} for lab in labels},
            "paper": {"post_ln_last_w2": 1.6},
            "settings": {"seeds": 2, "batches": 2, "tokens": 256, "data_desc": "toy"},
            "lemma2": {lab: {s: lemma[lab] for s in ("encoder", "decoder")} for lab in labels}}


def line_colors(fig):
    """label -> colour of the lines (and error-bar lines) of every axes of ``fig``."""
    return {line.get_label(): to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()
            if not line.get_label().startswith("_")} | {
        c.get_label(): to_hex(c.lines[0].get_color()) for ax in fig.axes for c in ax.containers
        if hasattr(c, "lines") and not c.get_label().startswith("_")}


def legend_outside(fig):
    """The figure's one legend lies right of every axes (a closed figure gets a canvas again)."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
    legends = fig.legends
    assert len(legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    box = legends[0].get_window_extent(renderer)
    return all(box.x0 >= b.x1 for b in boxes)


def smallest_text(fig):
    return min(t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip())


def test_each_variant_has_its_own_colour_and_keeps_it():
    colors = [variant_color(v) for v in VARIANTS]
    assert len(set(colors)) == len(VARIANTS) and OTHER_COLOR not in colors
    assert colors[:2] == ["#1f77b4", "#ff7f0e"]  # Post-LN, Pre-LN: the two first dark colours of tab20
    assert label_color("Pre-LN") == variant_color("preln") and label_color("Post-LN after warm-up") == OTHER_COLOR


def test_a_variant_has_the_same_colour_in_fig3_and_in_the_sensitivity_figure(tmp_path, monkeypatch):
    fig3 = plots.fig3_figure(fig3_result())
    drawn = []
    real_save = map_figures.save
    monkeypatch.setattr(map_figures, "save", lambda fig, *a, **kw: (drawn.append(fig), real_save(fig, *a, **kw)))
    sens = {(v, layers, 1): 0.1 * layers for v in ("postln", "preln") for layers in (6, 12)}
    map_figures.plot_sensitivity(sens, tmp_path / "sens.png")
    in_fig3, in_sens = line_colors(fig3), line_colors(drawn[0])
    for variant in ("postln", "preln"):
        label = VARIANTS[variant].label
        assert in_fig3[label] == in_sens[label] == variant_color(variant)
    assert in_fig3["Post-LN"] != in_fig3["Pre-LN"]
    assert legend_outside(drawn[0])


def test_fig3_and_lemma2_tick_layers_at_whole_numbers_with_the_legend_outside():
    result = fig3_result()
    for fig in (plots.fig3_figure(result), plots.lemma2_figure(result)):
        fig.canvas.draw()
        layer_axes = [ax for ax in fig.axes if ax.get_xlabel() in ("layer", "layers applied")]
        assert layer_axes
        for ax in layer_axes:
            ticks = ax.get_xticks()
            assert all(float(t).is_integer() for t in ticks), ticks
        assert legend_outside(fig)
        assert smallest_text(fig) >= FONT
    lemma = plots.lemma2_figure(result)
    assert line_colors(lemma)["Pre-LN: x_l (stream)"] == variant_color("preln")


def test_fig3_of_every_architecture_names_each_panel():
    labels = tuple(VARIANTS[v].label for v in VARIANTS)  # every variant: a line each, not a panel each
    result = fig3_result()
    result["last_w2"] = {lab: result["last_w2"]["Post-LN"] for lab in labels}
    fig = plots.fig3_figure(result)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 2 * 3 and {t.split(")")[0] for t in titles} == {"(a", "(b", "(c"}
    depth_panels = [ax for ax in fig.axes if ax.get_title().startswith("(c)")]
    assert all({c.get_label() for c in ax.containers} == set(labels) for ax in depth_panels)
    # one logarithmic scale for every panel, the axes labelled
    assert {ax.get_yscale() for ax in fig.axes} == {"log"} and len({ax.get_ylim() for ax in fig.axes}) == 1
    assert all(ax.get_xlabel() for ax in fig.axes) and fig.axes[0].get_ylabel().startswith("gradient norm")
