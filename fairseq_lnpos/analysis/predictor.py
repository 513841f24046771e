"""Does the paper's explanation predict which architectures need warm-up? Fig. 3's statistics at
initialization against each architecture's need for warm-up in a stability map.

    python -m fairseq_lnpos.analysis.predictor --map MAP --init INIT [--out DIR] [--publish DIR]

``MAP`` is a map's folder (the sweep's ``--out``, :func:`~.frame.runs_frame`) or its published
``runs.csv`` (:func:`~.frame.read_runs_csv`); ``INIT`` the ``--out`` folder of
``python -m fairseq_lnpos.analysis.init_grad`` run on the map's model size (``--size``, ``--width``,
``--depths L --layers-depth L``) for every architecture of the map. Per architecture:

- the statistics at initialization (:data:`STATISTICS`), from init_grad's per-layer records
  (``records.jsonl``, the paper's statistic ``mean_grad``), each layer's norm averaged over the seeds first;
- whether it needs warm-up (:data:`NEEDS`) and by how much (:data:`GAP`), from the map's cells judged
  by :func:`~.stability.make_cells` (the verdicts of :mod:`.verdict`);
- the Spearman rank correlation of each statistic with the gap, with its 95 % interval
  (:func:`spearman`), and how well each statistic separates the architectures that need warm-up from
  those that do not (:func:`separation`).

Writes into ``--out`` (default ``predictor-out``): predictor.csv (one row per architecture),
predictor_seeds.csv (the statistics per architecture and seed), predictor.md (printed too) and
predictor.png (each statistic against the gap); ``--publish DIR`` the same as a results page
(:mod:`.publish`, with the map's runs.csv).
"""
import json
import math
import sys
from pathlib import Path

from ..cli import CommandParser
from ..common import FONT, read_json, write_text
from ..errors import LnposError, StateError, run_main
from ..experiments.runs import warmup_label
from ..variants import TINY, VARIANTS, arch_names
from .map_common import variant_color
from . import verdict as V
from .frame import check_model_code, check_one_experiment, pandas, read_runs
from .map_common import num, pyplot, save
from .publish import argv_of
from .stability import make_cells

PROG = "python -m fairseq_lnpos.analysis.predictor"
STACKS = ("encoder", "decoder")
# column -> (what it is, in a table's words; the figure's axis)
STATISTICS = {
    **{f"last_w2_{s}": (f"last-layer W2 gradient norm, {s}",
                        f"last layer's W2 gradient norm at init, {s}\n(Frobenius, of the loss per target token in nats)")
       for s in STACKS},
    **{f"ratio_{s}": (f"first/last-layer W2 gradient-norm ratio, {s}",
                      f"first over last layer's W2 gradient norm at init, {s}\n(ratio, no unit)") for s in STACKS},
}
STATISTICS_TEXT = (
    "Statistics at initialization: init_grad's `mean_grad` (Fig. 3 of Xiong et al. 2020: the gradient of the "
    "label-smoothed loss per target token, in nats, averaged element by element over K mini-batches, then its "
    "Frobenius norm) of the FFN's second matrix W2 (`fc2`), per stack: the last layer's norm, and the first layer's "
    "over the last layer's; each layer's norm is averaged over the seeds before the ratio is taken. The paper's "
    "account (a large gradient near the output at initialization makes an early large learning rate unsafe) "
    "predicts a larger last-layer norm and a smaller first/last ratio where warm-up is needed: Spearman's rho "
    "> 0 and AUC > 0.5 for the last-layer norm, < 0 and < 0.5 for the ratio.")
NEEDS = ("Needs warm-up: no cell without warm-up is good against its own architecture's cells (good_own) while "
         "some cell with warm-up is. 'no good cell': no cell of the architecture is good (it needs more than "
         "warm-up; left out of the AUC).")
GAP = ("Warm-up gap (bits): the best mean final validation NLL over the cells without warm-up minus the best over "
       "the cells with warm-up, a cell that does not train counted at the corpus's unigram bits (what a model "
       "that ignores the source reaches; as the LR sensitivity counts a run that failed); > 0: warm-up helps.")
INTERVAL = ("Spearman's rho (scipy.stats.spearmanr, ties given their mean rank) of each statistic with the warm-up "
            "gap over the architectures; 95 % interval from Fisher's z with Bonett & Wright's (2000) standard error "
            "sqrt((1 + rho^2/2) / (n - 3)), n the architectures with a finite statistic. AUC: the chance that an "
            "architecture that needs warm-up has the larger statistic than one that does not (ties half; Mann-Whitney "
            "U / (n_needs x n_not), two-sided p), over the architectures with a good cell.")
VERDICT_MARKS = {"needs warm-up": ("o", True), "does not": ("s", False), "no good cell": ("X", True)}


# ---------------------------------------------------------------- the inputs

def read_map(path, allow_mixed_code=False):
    """(the map's table of every run, a line naming its code versions) from a map's folder or its runs.csv."""
    runs = read_runs(path, "a map's folder (a sweep's --out)")
    check_one_experiment(path, runs)
    return runs, check_model_code(runs, allow_mixed_code)


def init_files(path):
    """(records.jsonl, fig3.json) of ``--init``: a folder of init_grad, or its records.jsonl."""
    path = Path(path)
    folder, records_path = (path.parent, path) if path.is_file() else (path, path / "records.jsonl")
    return records_path, folder / "fig3.json"


def read_init(path):
    """init_grad's per-model records (``records.jsonl`` in ``path``, or that file itself) and its fig3.json
    (None where absent)."""
    records_path, fig3_path = init_files(path)
    if not records_path.is_file():
        raise LnposError(f"--init {path}: no records.jsonl there: give the --out folder of python -m "
                         f"fairseq_lnpos.analysis.init_grad, run on the map's model size for its architectures")
    records = []
    for i, line in enumerate(records_path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
            if not all(isinstance(rec["mean_grad"][s]["fc2"], list) for s in STACKS) or "seed" not in rec:
                raise KeyError("mean_grad or seed")
            records.append(rec)
        except (ValueError, KeyError, TypeError) as e:
            raise StateError(f"{records_path} line {i} is not a record of init_grad ({type(e).__name__}: {e}): "
                             f"run init_grad again into a fresh --out") from None
    return records, read_json(fig3_path, missing_ok=True, what_to_do="run init_grad again to rewrite it")


def map_settings(runs):
    """The settings the map's runs share (:func:`~.frame.check_one_experiment`), {} where not recorded."""
    return json.loads(runs["settings"].iloc[0]) if len(runs) and runs["settings"].iloc[0] else {}


def map_model(runs):
    """(model size, width d, depths) of the map's runs: the size from their settings, the width from the
    sweep's --width flags (:func:`~fairseq_lnpos.experiments.sweep.width_args`) or the tiny size's own d;
    None where the runs do not say."""
    settings = map_settings(runs)
    size, extra = settings.get("model size"), list(settings.get("extra") or [])
    width = int(extra[extra.index("--encoder-embed-dim") + 1]) if "--encoder-embed-dim" in extra else (
        TINY["embed_dim"] if size == "tiny" else None)
    return size, width, sorted(set(runs["layers"].astype(int)))


def init_frame(records, layers):
    """One row per architecture and seed of the records of ``layers``-layer models with every layer's W2
    norm: variant, seed, size, d and each stack's first- and last-layer W2 gradient norm."""
    names = arch_names()
    rows = []
    for rec in records:
        if rec["depth"] != layers or not rec.get("full") or rec.get("depth_requested") is None or rec["arch"] not in names:
            continue
        variant, size = names[rec["arch"]]
        row = {"variant": variant, "seed": rec["seed"], "size": size, "d": rec.get("d")}
        for stack in STACKS:
            w2 = rec["mean_grad"][stack]["fc2"]
            row[f"first_w2_{stack}"], row[f"last_w2_{stack}"] = w2[0], w2[-1]
        rows.append(row)
    return pandas().DataFrame(rows, columns=["variant", "seed", "size", "d"]
                              + [f"{w}_w2_{s}" for s in STACKS for w in ("first", "last")])


def check_model(init, source, size, width, layers):
    """Refuse records of another model size, width or depth than the map's."""
    if init.empty:
        raise LnposError(f"--init {source}: no per-layer records of {layers}-layer models: run init_grad with "
                         f"--depths {layers} --layers-depth {layers}"
                         + (f" --size {size}" if size else "") + (f" --width {width}" if width else ""))
    for column, want, flag in (("size", size, "--size"), ("d", width, "--width")):
        other = sorted(set(init[column]) - {want}) if want is not None else []
        if other:
            raise LnposError(f"--init {source}: measured with {column} {other[0]}, the map's models have {column} {want}: "
                             f"run init_grad with {flag} {want} (the same model size as the map)")


def init_statistics(init):
    """{variant: row} of the statistics of :data:`STATISTICS`, each layer's norm averaged over the seeds
    first, and the seeds."""
    g = init.groupby("variant")
    means = g[[c for c in init.columns if "_w2_" in c]].mean()
    for stack in STACKS:
        last = means[f"last_w2_{stack}"]
        means[f"ratio_{stack}"] = (means[f"first_w2_{stack}"] / last).where(last > 0)
    means["init_seeds"] = g["seed"].nunique()
    return means


# ---------------------------------------------------------------- the warm-up verdicts

def warmup_need(cells):
    """One row per variant of ``cells`` (:func:`~.stability.make_cells` at one depth): ``needs_warmup``
    (:data:`NEEDS`), ``verdict`` in words, ``gap`` (:data:`GAP`) and the best cell of each kind (its
    counted NLL and learning rate)."""
    pd = pandas()
    value = cells["nll"].where(cells["trains_mean"].astype(bool), cells["unigram_bits"])
    cells = cells.assign(value=value, with_warmup=cells["warmup"] > 0, good=cells["good_own"] == True)  # noqa: E712
    rows = []
    for variant, g in cells.groupby("variant", sort=False):
        kinds = {}
        for has, k in g.groupby("with_warmup"):
            best = k.loc[k["value"].idxmin()] if k["value"].notna().any() else None
            kinds[has] = (bool(k["good"].any()), best)
        for has, what in ((False, "without"), (True, "with")):
            if has not in kinds:
                raise LnposError(f"the map has no counted cell {what} warm-up for {VARIANTS[variant].label}: map "
                                 f"each architecture with warm-up 1 (none) and a longer one, e.g. scripts/grid.sh "
                                 f"sweep --warmup 1,100, and let its runs finish")
        (good_no, best_no), (good_wu, best_wu) = kinds[False], kinds[True]
        needs = not good_no and good_wu
        row = {"variant": variant, "needs_warmup": needs,
               "verdict": "needs warm-up" if needs else "does not" if good_no else "no good cell",
               "cells_without": int((~g["with_warmup"]).sum()), "cells_with": int(g["with_warmup"].sum())}
        for key, best in (("without", best_no), ("with", best_wu)):
            row[f"best_nll_{key}"] = math.nan if best is None else float(best["value"])
            row[f"best_lr_{key}"] = math.nan if best is None else float(best["lr"])
            row[f"best_warmup_{key}"] = math.nan if best is None else int(best["warmup"])
        row["gap"] = row["best_nll_without"] - row["best_nll_with"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def join(need, stats, source):
    """The table of :func:`predictor_table`: every variant of the map with its init statistics;
    a variant the records lack raises :class:`LnposError` naming it."""
    missing = [v for v in need.index if v not in stats.index]
    if missing:
        raise LnposError(f"--init {source}: no records of {', '.join(missing)}: run init_grad with --archs "
                         f"{','.join(need.index)} (every architecture of the map) into that folder")
    frame = need.join(stats, how="left")
    frame.insert(0, "label", [VARIANTS[v].label for v in frame.index])
    return frame


def predictor_table(runs, init, layers):
    """(one row per variant: verdict, gap, statistics; the map's cells at ``layers`` layers)."""
    at = runs[runs["layers"] == layers]
    cells = make_cells(at)
    if cells.empty:
        raise LnposError(f"the map has no run at {layers} layers that finished, diverged or was stopped early: "
                         f"wait for its runs, or resume the sweep")
    return join(warmup_need(cells), init_statistics(init), init.attrs.get("source", "the records")), cells


# ---------------------------------------------------------------- the statistics

def spearman(x, y, level=0.95):
    """(rho, p, low, high, n): Spearman's rank correlation of the finite pairs of ``x`` and ``y`` and its
    interval from Fisher's z with Bonett & Wright's standard error (NaN with fewer than 4 pairs)."""
    import numpy as np
    from scipy.stats import norm, spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y, n = x[keep], y[keep], int(keep.sum())
    if n < 4 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan, math.nan, math.nan, math.nan, n
    res = spearmanr(x, y)
    rho = float(res.statistic)
    half = norm.ppf(0.5 + level / 2) * math.sqrt((1 + rho * rho / 2) / (n - 3))
    with np.errstate(divide="ignore"):
        z = float(np.arctanh(rho))
    return rho, float(res.pvalue), math.tanh(z - half), math.tanh(z + half), n


def separation(x, needs):
    """(AUC, two-sided Mann-Whitney p, n needing, n not) of the finite values of ``x`` between the
    variants that need warm-up (``needs`` True) and those that do not; NaN where a group is empty."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    x, needs = np.asarray(x, float), np.asarray(needs, bool)
    a, b = x[needs & np.isfinite(x)], x[~needs & np.isfinite(x)]
    if not len(a) or not len(b):
        return math.nan, math.nan, len(a), len(b)
    res = mannwhitneyu(a, b, alternative="two-sided")
    return float(res.statistic) / (len(a) * len(b)), float(res.pvalue), len(a), len(b)


def correlations(frame):
    """One row per statistic: Spearman's rho with the gap (:func:`spearman`) and the separation of the
    verdicts (:func:`separation`, over the variants with a good cell)."""
    judged = frame[frame["verdict"] != "no good cell"]
    rows = []
    for column, (what, _) in STATISTICS.items():
        rho, p, low, high, n = spearman(frame[column], frame["gap"])
        auc, p_mw, n_needs, n_not = separation(judged[column], judged["needs_warmup"])
        rows.append({"statistic": column, "what": what, "n": n, "rho": rho, "p": p, "low": low, "high": high,
                     "auc": auc, "mw_p": p_mw, "n_needs": n_needs, "n_not": n_not})
    return pandas().DataFrame(rows)


# ---------------------------------------------------------------- outputs

def plot(frame, path, title):
    """Each statistic (log axis) against the warm-up gap, one panel per statistic; a variant in its
    colour, its marker its verdict; values a log axis cannot show (0, undefined) named in the panel's title."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(2, 2, figsize=(12, 10))
    for ax, (column, (what, axis)) in zip(axes.T.flat, STATISTICS.items()):
        shown = frame[frame[column] > 0].sort_values(["gap", column])
        for i, (v, r) in enumerate(shown.iterrows()):
            marker, filled = VERDICT_MARKS[r["verdict"]]
            color = variant_color(v)
            ax.scatter(r[column], r["gap"], marker=marker, s=55, color=color if filled else "none",
                       edgecolors=color, linewidths=1.5, zorder=3)
            ax.annotate(r["label"], (r[column], r["gap"]), xytext=(4, 3 if i % 2 else -11), textcoords="offset points",
                        fontsize=FONT - 1, color="#222222")  # neighbours' labels above and below by turns
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.axhline(0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(axis + ", log scale", fontsize=FONT)
        ax.set_ylabel("warm-up gap (bits): best NLL without\nminus best with warm-up", fontsize=FONT)
        ax.tick_params(labelsize=FONT)
        hidden = frame[~(frame[column] > 0)]
        ax.set_title(what + ("\nnot on the log axis: " + ", ".join(
            f"{r['label']} ({num(r[column], '.3g')})" for _, r in hidden.iterrows()) if len(hidden) else ""),
            fontsize=FONT)
    axes[0][0].legend(handles=[Line2D([], [], marker=m, ls="", color="black", markerfacecolor="black" if filled else "none",
                                      label=word) for word, (m, filled) in VERDICT_MARKS.items()],
                      fontsize=FONT, loc="center right", title="verdict", title_fontsize=FONT)
    save(fig, path, title)
    return path


def _fmt(v, fmt=".3g"):
    return num(v, fmt)


def markdown(frame, corr, cells, context):
    """The study's Markdown; ``context``: the lines that say what was compared (map, init, rules)."""
    lines = ["# Does Fig. 3's statistic at initialization predict warm-up need?", ""] + context + [
        "", f"- {STATISTICS_TEXT}", f"- {NEEDS}", f"- {GAP}",
        f"- Verdicts: {V.describe()}", "",
        f"## Rank correlation with the warm-up gap (n = {len(frame)} architectures)", "", INTERVAL, "",
        "| statistic | n | Spearman rho | 95 % interval | p | AUC (needs vs not) | Mann-Whitney p | n needs / not |",
        "|---|---|---|---|---|---|---|---|"]
    for r in corr.itertuples():
        lines.append(f"| {r.what} | {r.n} | {_fmt(r.rho, '.2f')} | [{_fmt(r.low, '.2f')}, {_fmt(r.high, '.2f')}] | "
                     f"{_fmt(r.p, '.2g')} | {_fmt(r.auc, '.2f')} | {_fmt(r.mw_p, '.2g')} | {r.n_needs} / {r.n_not} |")
    lines += ["", "## Per architecture", "",
              "Best NLL: the best counted cell of each kind (bits; its learning rate and warm-up); statistics averaged "
              "over the init seeds.", "",
              "| architecture | warm-up need | gap (bits) | best without warm-up | best with warm-up | "
              + " | ".join(w for w, _ in STATISTICS.values()) + " | init seeds |",
              "|---" * (6 + len(STATISTICS)) + "|"]
    for v, r in frame.iterrows():
        best = [f"{_fmt(r[f'best_nll_{k}'], '.3f')}" + (f" (lr {r[f'best_lr_{k}']:g}, wu {warmup_label(int(r[f'best_warmup_{k}']))})"
                                                   if math.isfinite(r[f"best_lr_{k}"]) else "") for k in ("without", "with")]
        lines.append(f"| {r['label']} | {r['verdict']} | {_fmt(r['gap'], '.3f')} | {best[0]} | {best[1]} | "
                     + " | ".join(_fmt(r[c]) for c in STATISTICS) + f" | {int(r['init_seeds'])} |")
    return "\n".join(lines) + "\n"


def context_lines(map_path, runs, code_line, init_path, fig3, size, width, layers, cells, init):
    """What the study compared, in words: the map, the model, the seeds, the init measurement."""
    settings = map_settings(runs)
    corpus = settings.get("dataset", "?") + (f" ({settings['data']})" if settings.get("data") else "")
    s = (fig3 or {}).get("settings", {})
    init_text = (f"K = {s.get('batches')} mini-batches of at most {s.get('tokens')} tokens of {s.get('data_desc')}, "
                 f"dropout {s.get('dropout')}, label smoothing {s.get('label_smoothing')}"
                 + (f"; {fig3['cpu_seconds']:.0f} CPU-s" if fig3.get("cpu_seconds") is not None else "")) if s else \
        "no fig3.json beside its records"
    return [f"- Map: `{map_path}`: {len(runs)} runs, {len(cells)} cells at {layers} layers; corpus {corpus}; "
            f"model size {size}, d {width}; seeds per cell {', '.join(map(str, sorted(cells['seeds'].unique())))}; "
            f"{code_line}.",
            f"- Initialization: `{init_path}` (init_grad): seeds {', '.join(map(str, sorted(init['seed'].unique())))}; "
            f"{init_text}."]


def title_of(runs, size, width, layers, cells, init):
    return (f"Fig. 3 statistics at initialization against the warm-up gap: {map_settings(runs).get('dataset', '?')} corpus, "
            f"{size} size d {width}, {layers} layers; map seeds per cell "
            f"{'/'.join(map(str, sorted(cells['seeds'].unique())))}, init seeds {init['seed'].nunique()}")


def analyse(map_path, init_path, layers=None, allow_mixed_code=False):
    """Everything the command writes, as data: a dict of the runs, cells, per-seed init statistics, the
    table, the correlations, the Markdown and the title."""
    runs, code_line = read_map(map_path, allow_mixed_code)
    records, fig3 = read_init(init_path)
    size, width, depths = map_model(runs)
    if layers is None:
        if len(depths) != 1:
            raise LnposError(f"--map {map_path} has depths {depths}: choose one with --layers")
        layers = depths[0]
    elif layers not in depths:
        raise LnposError(f"--layers {layers}: the map has depths {depths}")
    init = init_frame(records, layers)
    check_model(init, init_path, size, width, layers)
    init.attrs["source"] = str(init_path)
    frame, cells = predictor_table(runs, init, layers)
    init = init[init["variant"].isin(frame.index)]
    corr = correlations(frame)
    context = context_lines(map_path, runs, code_line, init_path, fig3, size, width, layers, cells, init)
    return dict(runs=runs, cells=cells, init=init, frame=frame, corr=corr, md=markdown(frame, corr, cells, context),
                title=title_of(runs, size, width, layers, cells, init))


def write(result, out):
    """predictor.csv, predictor_seeds.csv, predictor.md and predictor.png in ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv = dict(index=False, float_format="%.6g", lineterminator="\n")
    return [write_text(out / "predictor.csv", result["frame"].reset_index().to_csv(**csv)),
            write_text(out / "predictor_seeds.csv", result["init"].to_csv(**csv)),
            write_text(out / "predictor.md", result["md"]),
            plot(result["frame"], out / "predictor.png", result["title"])]


def _main(argv):
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--map", required=True, help="a map's folder (a sweep's --out) or its runs.csv")
    p.add_argument("--init", required=True, help="the --out folder of python -m fairseq_lnpos.analysis.init_grad "
                                                 "(its records.jsonl), run on the map's model size")
    p.add_argument("--layers", type=int, help="the depth to compare at (default: the map's only depth)")
    p.add_argument("--out", default="predictor-out", help="output folder (default: %(default)s)")
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="use runs trained by different versions of the model code (listed in the output)")
    p.add_argument("--publish", metavar="DIR", help="also write a results page into DIR (docs/results/NAME)")
    args = p.parse_args(argv)
    result = analyse(args.map, args.init, args.layers, args.allow_mixed_code)
    written = write(result, args.out)
    if args.publish:
        from .publish import publish

        init = [f for f in init_files(args.init) if f.is_file()]  # the per-seed data of both sides: rebuildable
        publish(args.publish, "Fig. 3 at initialization as a predictor of warm-up need", result["md"],
                result["runs"], [p for p in written if p.name != "predictor.md"] + init, argv_of(PROG, argv))
    print(result["md"], end="")
    return 0


def main(argv=None):
    return run_main("predictor", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
