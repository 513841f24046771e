"""`make demo`: the paper's effect on a CPU in minutes, on data the project generates.

    python -m fairseq_lnpos.demo [--out demo-out] [--seeds 1,2] [--with-keel] [--with-admin]
                                 [--with-tfixup] [--with-<further variant>] [--quick]
    python -m fairseq_lnpos.demo --data multi30k [--orig DIR | --bin DIR]      # `make demo-real`

``--data multi30k`` runs the same steps on real German-English text: Multi30k task 1 prepared by
data-prep/prepare-multi30k.sh's code into OUT/data (downloaded, or from ``--orig DIR``; ``--bin DIR``
takes a data dir prepared before), the `real-*` rows of experiments/runs.py (Post-LN without and
with warm-up, Pre-LN without warm-up, sized for two CPU cores), tokenized BLEU and sacreBLEU on
test2016 (sized by timed runs made before the results pages: "Real text on a CPU" of
`git show 36640e8:docs/results.md`).

Steps (each resumes; a finished demo re-runs in seconds):
 1. the synthetic corpus (data-prep/make-synthetic.sh: 4500 training pairs, 300 valid, 300 test);
 2. a grid of `_tiny` runs (the `demo-*` rows of experiments/runs.py): Post-LN without warm-up,
    Post-LN with 100 warm-up updates, Pre-LN and DeepNorm without warm-up (``variants.GROUPS["demo"]``;
    every other variant on request: Keel, Admin, T-Fixup and the further variants), Adam lr 1e-3 (constant after the
    warm-up), 512-token batches, 3 epochs (~100 updates each), per-layer gradient norms logged at every update, test BLEU per epoch;
 3. the results table (scripts/make_table.sh): demo-out/results.csv, results.md (per seed), fig_demo.png;
 4. gradient norms of the first updates (grad_norms_first_updates.png);
 5. Fig. 3 at initialization at the tiny size (fig3/): on the analysis's own generated corpus, also
    with ``--data multi30k``, and its own seeds 1 and 2 (analysis/init_grad.py);
 6. the summary: the table over seeds (analysis/seeds.py: n, mean, min-max, 95 % CI), the verdict,
    the time spent scoring against the time spent training and what to do next, printed and
    written to summary.md and summary.json. It is over every seed of the rows recorded in OUT/grid:
    a re-run with other ``--seeds`` adds them to the earlier ones and says so in one line.

Each step prints a line at least every minute (progress.py): the grid and Fig. 3 their own, the
other steps their name and how long they have run.

The verdict: the effect is shown when the two controls, Post-LN with warm-up and Pre-LN without
it, have learned the task (every seed at tok BLEU >= ``LEARNED``: 20 on the generated corpus, 5 on
Multi30k) and the best seed of Post-LN without warm-up reaches at most half the BLEU of the worst seed of each control.

The settings are the same for every architecture; with them Post-LN with warm-up and Pre-LN learn
the task within the 300 updates while Post-LN without warm-up does not (docs/results/demo/index.md).
"""
import os
import re
import shlex
import sys
import textwrap
import time
from pathlib import Path

from .analysis.map_common import variant_color, wrap as wrap_title
from .analysis.seeds import ESTIMATOR, spread
from .cli import CommandParser, whole_number
from .common import (FONT, GRAD_NORMS_JSONL, RESULTS, hold_lock, integer_ticks, legend_right, release_lock,
                     write_figure, write_json, write_text)
from .errors import LnposError, check, run_main
from .experiments.runs import BY_NAME, DEMO_OPTIONAL, DEMO_ROWS
from .progress import Cadence
from .variants import GROUPS, VARIANTS

RUNS = list(DEMO_ROWS["synthetic"])
# --with-keel, --with-admin, --with-tfixup, --with-dyt, --with-periln, ...: demo-<name>-nowu (real-<name>-nowu)
OPTIONAL = tuple(v for v in VARIANTS if v not in GROUPS["demo"])
DATA = {"synthetic": "synthetic corpus", "multi30k": "Multi30k De-En (real text)"}  # --data: step 1's label
MULTI30K_BPE = 8000  # joint sentencepiece pieces of `--data multi30k` ("Real text on a CPU" of `git show 36640e8:docs/results.md`)
FIRST_UPDATES = 100  # updates shown in the gradient-norm figure
CONTROLS = ("demo-postln-wu100", "demo-preln-nowu")  # must learn for the verdict to mean anything
LEARNED_BLEU = 20.0  # a control has learned when every seed reaches this tok BLEU (full demo: 79-99)
# ... on real text (Multi30k, 1012 updates of the tiny model: Post-LN with warm-up 11.5, Pre-LN 28.3,
# Post-LN without warm-up 2.4; "Real text on a CPU" of `git show 36640e8:docs/results.md`)
LEARNED = {"synthetic": LEARNED_BLEU, "multi30k_cpu": 5.0}


def learned_bleu(need):
    """The tok BLEU every seed of a control must reach, by the dataset of the rows ``need``."""
    return LEARNED.get(BY_NAME[need[1]].dataset, LEARNED_BLEU) if need[1] in BY_NAME else LEARNED_BLEU
PAGE = {"synthetic": "demo", "multi30k": "demo-real"}  # --data: the demo's results page under RESULTS
WIDTH = 100  # the summary's prose lines
MAKE = {"synthetic": "make demo", "multi30k": "make demo-real"}  # --data: the command a user types
DEFAULT_OUT = {"synthetic": "demo-out", "multi30k": "demo-real-out"}
TEST_TEXT = {"synthetic": "the generated corpus", "multi30k": "Multi30k test2016"}
WHAT = {"synthetic": "a generated task", "multi30k": "real text (Multi30k test2016, the tiny model)"}  # the verdict's scope


def log(msg):
    print(f"[demo] {msg}", flush=True)


def make_data(out, quick, data="synthetic", orig=None, prepared=None):
    """The demo's binarized data dir: the generated corpus, or Multi30k (:func:`multi30k_data`)."""
    if data == "multi30k":
        return multi30k_data(out, orig, prepared)
    from .data import synthetic

    sizes = dict(train=600, valid=100, test=100) if quick else dict(train=4500, valid=300, test=300)
    synthetic.prepare(out / "data" / "text", out / "data" / "bin", seed=1, **sizes)
    return out / "data" / "bin"


def multi30k_data(out, orig=None, prepared=None):
    """``prepared`` (a data dir of data-prep/prepare-multi30k.sh, checked by its manifest), or Multi30k
    prepared into OUT/data from ``orig`` (the six published files) or downloaded; resumes, and a
    prepared folder is reused."""
    from .data import multi30k
    from .data.manifest import read_manifest

    if prepared:
        check(not orig, "give --orig (prepare the data) or --bin (a prepared data dir), not both")
        dataset = read_manifest(prepared).get("dataset")
        check(dataset == "multi30k.de-en", f"--bin {prepared}: a data dir of {dataset}, not Multi30k: pass the "
                                           f"--bin folder of data-prep/prepare-multi30k.sh")
        return Path(prepared)
    try:
        multi30k.prepare(out / "data" / "text", out / "data" / "bin", orig=orig, workers=2, bpe_size=MULTI30K_BPE)
    except LnposError as e:
        if orig or "--orig" not in str(e):
            raise
        raise type(e)(f"{e} (through make: {MAKE['multi30k']} DEMO_ARGS=\"--orig DIR\")") from e
    return out / "data" / "bin"


def grid_options(out, data, runs, seeds, jobs, quick, dry_run=False, cpu_bf16=False):
    """The demo's grid (``scripts/grid.sh run`` options) of ``runs`` on the data dir ``data``."""
    from .experiments import options

    return options.RunOptions(only=",".join(runs), data=[str(data)], out=str(out / "grid"), arch_size="tiny",
                              seeds=seeds, jobs=jobs, task="translation_lnpos",
                              fairseq_args="--log-grad-norms --grad-norm-interval 1",
                              max_epoch=1 if quick else None, dry_run=dry_run, cpu_bf16=cpu_bf16)  # --quick: one epoch


class _WithoutLine:
    """A text stream that passes everything on to ``stream`` except the line that starts with ``prefix``."""

    def __init__(self, stream, prefix):
        self.stream, self.prefix, self.dropping = stream, prefix, False

    def write(self, text):
        if text.startswith(self.prefix):
            self.dropping = not text.endswith("\n")  # print() writes its end ("\n") by itself
            return len(text)
        if self.dropping and text == "\n":
            self.dropping = False
            return len(text)
        self.dropping = False
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def run_grid(out, data, runs, seeds, jobs, quick, cpu_bf16=False):
    """The demo's grid; interrupted (Ctrl-C, SIGTERM), a KeyboardInterrupt, so that the demo says so in its
    own one line (the grid's own "grid: interrupted" line is not printed) and exits 130."""
    import contextlib

    from .errors import INTERRUPT_EXIT
    from .experiments import grid, plan

    opts = grid_options(out, data, runs, seeds, jobs, quick, cpu_bf16=cpu_bf16)
    with contextlib.redirect_stderr(_WithoutLine(sys.stderr, "grid: interrupted;")):
        status = grid.run_grid(opts, plan.select_runs(opts))
    if status == INTERRUPT_EXIT:
        raise KeyboardInterrupt
    check(status == 0, f"the grid stopped with status {status} (message above); the same command resumes it")


def expected_time(data, quick=False, results=RESULTS):
    """The start line's expected time: the wall time and machine of the demo's results page (the
    ``--publish`` run it records), else that it is not known here (an installed copy, ``--quick``)."""
    if quick:
        return "not measured for --quick (no results page times it)"
    page = Path(results) / PAGE[data] / "index.md"
    try:
        text = page.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    wall = re.search(r"^Wall time: (\d+) s", text, re.M)
    machine = re.search(r"^- Machine: (.+?) \(", text, re.M)
    if not wall:
        return f"not known here (no results page docs/results/{PAGE[data]} beside this code)"
    return (f"{wall.group(1)} s on the run its results page records (docs/results/{PAGE[data]}: "
            f"{machine.group(1) if machine else 'its machine'}), longer on a slower CPU")


def make_table(out):
    """The results table of the demo's grid, copied to ``out``, and its figure, drawn in ``out``;
    returns the table's rows and the figures' paths (report.py)."""
    from .experiments import report

    _, _, rows = report.make_table(out / "grid", with_figures=False, allow_mixed_code=True)  # results.md lists them
    for name in ("results.csv", "results.md"):
        write_text(out / name, (out / "grid" / name).read_text(encoding="utf-8"))
    readable = [r for r in rows if not r.get("unreadable") and r.get("curve")]
    return rows, [curves_figure(readable, out / f"fig_{name}.png")
                  for name in sorted({r["figure"] for r in readable})]


SEED_MARKERS = "osD^v<>p*hX"  # a marker per seed (cycled beyond 11 seeds, then told apart by the legend's order)
METRICS = (("bleu_tok", "test tok BLEU (tokenized, fairseq's scorer)"),
           ("valid_nll_loss", "validation NLL (bits per token, no label smoothing)"))


def curves_figure(rows, path):
    """fig_demo.png (``path``; its path): :func:`curves_plot` of ``rows``, written and closed."""
    fig = curves_plot(rows)
    path = write_figure(fig, path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def curves_plot(rows):
    """Test tok BLEU and the validation NLL in bits (fairseq's valid_nll_loss: the quantity of the tables,
    not the label-smoothed loss) per epoch, a line per run and seed: the run's variant's colour, a line
    style per warm-up, a marker per seed. The legend names each run once (colour and style) and each
    seed once (its marker)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.4), squeeze=False)
    seeds = sorted({int(r["seed"]) for r in rows})
    marker = {s: SEED_MARKERS[i % len(SEED_MARKERS)] for i, s in enumerate(seeds)}
    styles = {}
    for r in sorted(rows, key=lambda r: (list(BY_NAME).index(r["run"]) if r["run"] in BY_NAME else 10 ** 6,
                                         r["run"], int(r["seed"]))):
        style = styles.setdefault(r["run"], dict(color=variant_color(r["ln"]),
                                                 linestyle="--" if r["warmup"] > 1 else "-"))
        for ax, (key, _) in zip(axes[0], METRICS):
            ax.plot([e.epoch for e in r["curve"]], [getattr(e, key) for e in r["curve"]], marker=marker[int(r["seed"])],
                    ms=5, mfc="white", lw=1.3, **style, label=f"_{r['run']} seed {r['seed']}")
    epochs = sorted({e.epoch for r in rows for e in r["curve"]})
    for ax, (key, ylabel) in zip(axes[0], METRICS):
        ax.set_xlabel("epoch", fontsize=FONT)
        ax.set_ylabel(ylabel, fontsize=FONT)
        ax.set_xticks(epochs)  # the epochs scored, whole numbers (one epoch: one tick)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylim(-2, 102)
    axes[0][1].set_ylim(bottom=0)
    handles = [Line2D([], [], lw=1.5, **style, label=label(run) if run in BY_NAME else run)
               for run, style in styles.items()]
    handles += [Line2D([], [], ls="none", marker=marker[s], mfc="white", color="0.3", label=f"seed {s}")
                for s in seeds]
    fig.subplots_adjust(left=0.07, bottom=0.13, top=0.84, wspace=0.28, right=0.78)
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.79, 0.5), fontsize=FONT, frameon=False)
    data = sorted({r["dataset"] for r in rows})
    fig.suptitle(wrap_title(f"Test BLEU and validation NLL per epoch, a line per run and seed (data {', '.join(data)}; "
                      f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})", fig.get_figwidth(), FONT + 1),
                 fontsize=FONT + 1)
    return fig


def time_split(rows):
    """(seconds fairseq-train ran, seconds the evaluator spent scoring) over the demo's runs."""
    records = [r["record"] for r in rows if "record" in r]
    train = sum((rec.done.train_seconds if rec.done else None) or 0.0 for rec in records)
    score = sum(e.eval_seconds or 0.0 for rec in records for e in rec.evals)
    return train, score


def grad_norm_figure(out, rows, runs, seed):
    """Total and top-decoder-layer FFN W2 gradient norms over the first updates, one line per run of
    ``runs`` (its row of the table, ``rows``) with seed ``seed``, in its variant's colour (dashed:
    with warm-up); the path of the PNG."""
    fig = grad_norm_plot(rows, runs, seed)
    path = out / "grad_norms_first_updates.png"
    write_figure(fig, path, dpi=90)  # a link there is replaced, not written through
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def grad_norm_plot(rows, runs, seed):
    """The matplotlib figure :func:`grad_norm_figure` writes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .analysis.train_curves import read_jsonl

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    for row in rows:
        if row["run"] not in runs or str(row["seed"]) != seed or "record" not in row:
            continue
        path, run = row["record"].dir.save_dir / GRAD_NORMS_JSONL, row["run"]
        if not path.exists():
            continue
        updates, series = read_jsonl(path)  # sorted; a resumed run's last record per update
        n = sum(1 for u in updates if u <= FIRST_UPDATES)
        top = max(int(g.split("/")[1]) for g in series if g.startswith("decoder/") and g.count("/") == 2)
        for ax, key in zip(axes, ("total", f"decoder/{top}/fc2")):
            ax.plot(updates[:n], series[key][:n], label=label(run), color=variant_color(row["ln"]),
                    linestyle="--" if row["warmup"] > 1 else "-")
            ax.set_title(f"{'all parameters' if key == 'total' else 'last decoder layer, FFN W2'} ({key})", fontsize=FONT)
    for ax in axes:
        ax.set_xlabel("update", fontsize=FONT)
        ax.set_ylabel("gradient norm (Frobenius, log scale)", fontsize=FONT)
        ax.set_yscale("log")
        integer_ticks(ax.xaxis)
    fig.suptitle(f"Gradient norms of the mean loss per architecture, first {FIRST_UPDATES} updates (seed {seed})",
                 fontsize=FONT + 1)
    fig.subplots_adjust(left=0.07, bottom=0.13, top=0.86, wspace=0.25)
    legend_right(fig, axes, 0.76)
    return fig


FIG3 = {True: dict(depths=[6, 8], seeds=1, tokens=256), False: dict(depths=[6, 8, 10, 12, 14], seeds=2)}  # by --quick


def fig3(out, variants, quick):
    from .analysis import init_grad

    init_grad.run(init_grad.Options(out=str(out / "fig3"), size="tiny", archs=list(variants), **FIG3[quick]))
    return out / "fig3"


def fig3_step(variants, quick, data):
    """The words of the Fig. 3 step: what it measures, on what (init_grad's generated corpus, whatever
    ``data`` the runs trained on), with which seeds."""
    size = FIG3[quick]
    seeds = " and ".join(str(s) for s in range(1, size["seeds"] + 1))
    return (f"Fig. 3 at initialization: {len(variants) * len(size['depths']) * size['seeds']} tiny models "
            f"(seed{'s' if size['seeds'] > 1 else ''} {seeds}, not --seeds) on a generated Markov corpus, "
            f"not the demo's {DATA[data]}")


def label(run):
    """``demo-postln-wu100`` -> ``Post-LN, warm-up 100``."""
    row = BY_NAME[run]
    return f"{VARIANTS[row.ln].label}, " + (f"warm-up {row.warmup}" if row.warmup > 1 else "no warm-up")


SUMMARY_METRICS = {"best_bleu_tok": (0.0, 100.0), "final_valid_nll": (0.0, None)}  # and their ranges


def summarize(rows):
    """Per run: its label, seeds, outcomes, and the :class:`~.analysis.seeds.Spread` over seeds of
    best tokenized BLEU and the final validation NLL (None without a value); ``rows``: the rows of the
    table of every run (dicts of :data:`~.analysis.frame.RUN_COLUMNS`: make_table's, or a runs.csv's records)."""
    by_run = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    return {run: {"label": label(run) if run in BY_NAME else run, "seeds": len(rs),
                  "seed_list": sorted({int(r["seed"]) for r in rs}),
                  "status": sorted({r["outcome"] for r in rs}),
                  **{key: spread((r.get(key) for r in rs), bounds) for key, bounds in SUMMARY_METRICS.items()}}
            for run, rs in by_run.items()}


def effect_shown(summary, need=tuple(RUNS[:3])):
    """(shown: True, False or None when it cannot be judged, the verdict in words). ``need``: the rows of
    Post-LN without warm-up and of the two controls, Post-LN with warm-up and Pre-LN without it
    (DEMO_ROWS). Shown: both controls learned (every seed at tok BLEU >= :func:`learned_bleu`) and the best
    seed of Post-LN without warm-up reaches at most half the BLEU of the worst seed of each control."""
    if not all((summary.get(r) or {}).get("best_bleu_tok") for r in need):
        return None, "the effect cannot be judged: some of the three core runs have no BLEU yet"
    bad, wu, pre = (summary[r]["best_bleu_tok"] for r in need)
    numbers = (f"Post-LN without warm-up reaches tokenized BLEU {bad.mean:.1f} (best seed {bad.max:.1f}); "
               f"with warm-up {wu.mean:.1f} (worst seed {wu.min:.1f}); Pre-LN without warm-up {pre.mean:.1f} "
               f"(worst seed {pre.min:.1f})")
    limit = learned_bleu(need)
    if min(wu.min, pre.min) < limit:
        return False, (f"effect not shown: the controls did not train (each needs tok BLEU >= {limit:g} "
                       f"in every seed): {numbers}")
    shown = bad.max <= 0.5 * min(wu.min, pre.min)
    return shown, f"effect {'SHOWN' if shown else 'NOT shown'}: {numbers}"


def seed_table(summary, runs):
    """The table over seeds (Markdown) of ``runs``, in that order."""
    cell = lambda sp: sp.text() if sp else ""  # noqa: E731
    lines = ["| run | seeds | tok BLEU best: mean (min to max, 95 % CI) | final valid NLL, bits: mean (min to max, "
             "95 % CI) | status |", "|---|---|---|---|---|"]
    for run in runs:
        s = summary.get(run) or {"label": label(run), "seeds": 0, "status": ["not run"]}
        lines.append(f"| {s['label']} (`{run}`) | {s['seeds']} | {cell(s.get('best_bleu_tok'))} | "
                     f"{cell(s.get('final_valid_nll'))} | {', '.join(s['status'])} |")
    return lines


def and_list(items):
    """``[0, 1, 2]`` -> ``0, 1 and 2``."""
    items = [str(i) for i in items]
    return " and ".join(filter(None, [", ".join(items[:-1]), items[-1]])) if items else "none"


def seeds_merged(summary, runs, asked):
    """(the seeds of ``runs`` in ``summary``, those of them not in ``asked``: merged from earlier runs in
    the same folder, the seeds of ``asked`` with no run recorded)."""
    found = sorted({s for run in runs for s in (summary.get(run) or {}).get("seed_list", ())})
    return found, [s for s in found if s not in asked], [s for s in asked if s not in found]


def seeds_line(summary, runs, asked, grid):
    """One line: the seeds the summary is over, which of them ``asked`` (--seeds) gave and which come
    from earlier runs in the grid folder ``grid``."""
    found, earlier, missing = seeds_merged(summary, runs, asked)
    flag = f"--seeds {','.join(map(str, asked))}"
    if earlier:
        new = [s for s in found if s in asked]
        text = (f"summary over seeds {and_list(found)}: {and_list(new)} asked for ({flag}), {and_list(earlier)} "
                f"from earlier runs in {grid}")
    else:
        text = f"summary over seeds {and_list(found)}, those asked for ({flag})"
    return text + (f"; no run of seed {and_list(missing)} recorded" if missing else "")


def text_folder(data):
    """The text folder of binarized data dir ``data``: where its manifest's references lie (TEXT/tok/),
    else ``data/../text`` (the demo's own OUT/data/text)."""
    from .data.manifest import read_manifest

    try:
        return Path(read_manifest(data)["refs"]["tok"]["test"]).parent.parent
    except (LnposError, KeyError):
        return Path(data).parent / "text"


def next_steps(out, seed, corpus="synthetic", data_dir=None):
    """What to do next: more rows, a translation with a trained checkpoint, what to read. ``data_dir``:
    the binarized data dir the runs trained on (default OUT/data/bin), its text where its manifest says."""
    more = " ".join(([] if str(out) == DEFAULT_OUT[corpus] else ["--out", shlex.quote(str(out))])
                    + [f"--with-{n.replace('_', '-')}" for n in OPTIONAL[:3]])
    data = Path(data_dir) if data_dir else out / "data" / "bin"
    text = text_folder(data)
    ckpt = out / "grid" / DEMO_ROWS[corpus][2] / f"seed{seed}" / "checkpoints" / "checkpoint_best.pt"
    translate = (f"head -3 {shlex.quote(str(text / 'tok' / 'test.de'))} | .venv/bin/fairseq-interactive "
                 + shlex.join([str(data), "--user-dir", "fairseq_lnpos", "--task", "translation_lnpos",
                               "--source-lang", "de", "--target-lang", "en", "--path", str(ckpt),
                               "--bpe", "sentencepiece", "--sentencepiece-model", str(text / "bpe" / "spm.model"),
                               "--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10", "--cpu"])
                 + " | grep '^D-'")
    return ["Next steps:",
            "- more rows (the finished runs are kept; every option: python -m fairseq_lnpos.demo --help):",
            f"    {MAKE[corpus]} DEMO_ARGS=\"{more}\"",
            f"- translate test sentences (tokenized German of {TEST_TEXT[corpus]}) with the Pre-LN checkpoint:",
            f"    {translate}",
            "- read: README.md (what the demo shows, how it relates to the paper), docs/grid.md (the grid it",
            "  ran), docs/results/README.md (the results pages the lab's commands wrote)"]


def write_summary(out, summary, runs, shown_text, figures, seconds, seed, controls=CONTROLS, corpus="synthetic",
                  data_dir=None, asked=None):
    """summary.md and summary.json in ``out``; returns the Markdown's lines. ``asked``: the seeds the
    command was given (--seeds): the summary says which seeds it merged from earlier runs."""
    controls_need = (None, *controls)
    shown, text = shown_text
    train, score = seconds
    wrap = lambda text: textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False)  # noqa: E731
    merged = [] if asked is None else [*wrap(seeds_line(summary, runs, asked, out / "grid") + "."), ""]
    md = [f"# `{MAKE[corpus]}`: summary", "", *seed_table(summary, runs), "", *merged,
          *wrap(f"Over seeds: {ESTIMATOR}."), "",
          *wrap(f"Verdict: {text}."), "",
          *wrap(f"The rule: the controls (Post-LN with warm-up, Pre-LN without) must learn the task (tok BLEU >= "
                f"{learned_bleu(controls_need):g} in every seed), and the best seed of Post-LN without warm-up must reach at most "
                f"half the BLEU of the worst seed of each control. A CPU-scale illustration on {WHAT[corpus]}, "
                "not the paper's IWSLT14 numbers (README.md)."), "",
          *wrap("Figures: " + ", ".join(str(f) for f in figures)), ""]
    if train:
        md += [*wrap(f"Time: scoring {score:.0f} s of evaluator time, training {train:.0f} s (both summed over "
                     f"the runs, which ran side by side; ratio {score / train:.2f})."), ""]
    md += next_steps(out, seed, corpus, data_dir)
    write_text(out / "summary.md", "\n".join(md) + "\n")
    write_json(out / "summary.json", {
        **({} if asked is None else {"seeds": dict(zip(("in_summary", "from_earlier_runs", "not_recorded"),
                                                       seeds_merged(summary, runs, asked)), asked=list(asked))}),
        "estimator": ESTIMATOR, "verdict": {"shown": shown, "text": text, "learned_bleu": learned_bleu(controls_need),
                                             "controls": list(controls)},
        "runs": {run: {**s, **{k: s[k].as_dict() if s.get(k) else None for k in SUMMARY_METRICS}}
                 for run, s in summary.items()},
        "seconds": {"training_summed_over_runs": train, "scoring_summed_over_runs": score},
        "figures": [str(f) for f in figures]})
    return md


def command(argv=None):
    p = CommandParser(prog="make demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=tuple(DATA), default="synthetic",
                   help="synthetic: the generated corpus (default); multi30k: real German-English text "
                        "(`make demo-real`)")
    p.add_argument("--orig", help="--data multi30k: the folder of the six published .gz files (no download)")
    p.add_argument("--bin", help="--data multi30k: a data dir data-prep/prepare-multi30k.sh prepared (no preparation)")
    p.add_argument("--out", help="output folder (default demo-out/, with --data multi30k demo-real-out/)")
    p.add_argument("--seeds", default="1,2", help="seeds, comma-separated (default 1,2)")
    for name in OPTIONAL:
        p.add_argument(f"--with-{name.replace('_', '-')}", action="store_true",
                       help=f"add the row demo-{name}-nowu (--data multi30k: real-{name}-nowu): its seeds take as long "
                            "as a row of the demo's results page")
    p.add_argument("--jobs", type=whole_number(1), default=2, help="runs side by side on the CPU (default 2)")
    p.add_argument("--cpu-bf16", action="store_true",
                   help="train in bfloat16 mixed precision (grid.sh's --cpu-bf16; a CPU with AVX-512 BF16 or AMX; "
                        "not faster at the demos' sizes: docs/results/cpu-bf16-speed)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the grid's fairseq commands (rows x seeds) and exit; prepares no data, trains nothing")
    p.add_argument("--quick", action="store_true",
                   help="CI check of the generated corpus: 600 training pairs, one epoch, small Fig. 3 (shows no effect)")
    p.add_argument("--publish", metavar="DIR",
                   help="also write the summary, the per-seed table (runs.csv) and the figures as a results page "
                        "into DIR (docs/results/demo)")
    args = p.parse_args(argv)
    if args.data != "multi30k" and (args.orig or args.bin):
        p.error("--orig and --bin are options of --data multi30k")
    if args.data == "multi30k" and args.quick:
        p.error("--quick is the check of the generated corpus (one epoch of 600 pairs); Multi30k has no quick "
                "setting: drop --quick (make demo-real), or drop --data multi30k (make demo --quick)")
    from .experiments.plan import parse_seeds

    asked = parse_seeds(args.seeds)  # a bad --seeds is refused before anything is prepared
    t0 = time.time()
    out = Path(args.out or DEFAULT_OUT[args.data])
    extra = [name for name in OPTIONAL if getattr(args, f"with_{name}")]
    core = list(DEMO_ROWS[args.data])
    runs = core + [DEMO_OPTIONAL[args.data].format(name) for name in extra if DEMO_OPTIONAL[args.data].format(name) not in core]
    if args.dry_run:
        from .experiments import grid, plan

        opts = grid_options(out, Path(args.bin) if args.bin else out / "data" / "bin", runs, args.seeds, args.jobs,
                            args.quick, dry_run=True, cpu_bf16=args.cpu_bf16)
        return grid.run_grid(opts, plan.select_runs(opts))
    made = next((p for p in reversed([out, *out.parents]) if not p.exists()), None)  # the first folder made here
    out.mkdir(parents=True, exist_ok=True)
    lock = out / ".demo.lock"
    fd = hold_lock(lock, f"--out {out} is in use by another demo (lock {lock}): wait for it to finish or stop it, "
                         f"or give another --out")
    done = False
    try:
        status = run_steps(args, out, runs, core, asked, t0, argv)
        done = True
        return status
    finally:
        release_lock(fd, lock)
        if made is not None and not done:
            remove_empty(out, made)


def remove_empty(folder, top):
    """Remove ``folder``, the folders under it and those above it up to ``top`` that hold no file (a refused
    or interrupted demo's folders, made before anything was written into them); any folder with a file
    stays, with its file."""
    folder = Path(folder)
    above = [folder, *folder.parents]
    for path in sorted((p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()),
                       key=lambda p: len(p.parts), reverse=True) + above[:above.index(Path(top)) + 1]:
        try:
            path.rmdir()  # only an empty folder
        except OSError:
            pass


def run_steps(args, out, runs, core, asked, t0, argv=None):
    """The demo's steps in ``out`` (locked), from the command line ``args`` (``argv``: as typed, for a
    results page; ``asked``: its seeds); returns 0. The grid and Fig. 3 print their own progress; while
    another step runs, its status line comes at least every minute (:class:`~.progress.Cadence`)."""
    variants = list(dict.fromkeys(BY_NAME[r].ln for r in runs))
    inits = sorted({BY_NAME[r].init for r in runs})
    steps = [DATA[args.data], f"grid of {len(runs)} runs x seeds {args.seeds} (initialization "
             f"{', '.join(inits)})", "results table",
             "gradient norms of the first updates", fig3_step(variants, args.quick, args.data)]
    current = {"step": 0, "since": t0}

    def say(i):
        current.update(step=i, since=time.time())
        log(f"step {i}/{len(steps)}: {steps[i - 1]} (elapsed {time.time() - t0:.0f} s)")
        cadence.printed()

    def status():
        i = current["step"]
        log(f"step {i}/{len(steps)}: {steps[i - 1]}: running for {time.time() - current['since']:.0f} s, "
            f"no estimate of the time left in this step (elapsed {time.time() - t0:.0f} s)")

    cadence = Cadence(status)
    log(f"expected time: {expected_time(args.data, args.quick)}; the same "
        "command resumes after an interruption")
    say(1)
    with cadence:
        data = make_data(out, args.quick, args.data, args.orig, args.bin)
    say(2)
    run_grid(out, data, runs, args.seeds, args.jobs, args.quick, args.cpu_bf16)  # the grid's own progress lines
    say(3)
    with cadence:
        rows, figures = make_table(out)
        say(4)
        figures.append(grad_norm_figure(out, rows, runs, str(asked[0])))
    say(5)
    fig3_dir = fig3(out, variants, args.quick)  # a line per model
    figures += [fig3_dir / "fig3.png", fig3_dir / "lemma2.png"]

    from .experiments.report import run_table

    runs_table = run_table(rows)  # the table of every run, as make_table built it while reading the folders
    summary = summarize(runs_table.to_dict("records"))
    shown_text = effect_shown(summary, tuple(core[:3]))
    md = write_summary(out, summary, runs, shown_text, figures, time_split(rows), str(asked[0]), core[1:3], args.data,
                       data, asked)
    print()
    verdict_at = md.index(next(line for line in md if line.startswith("Verdict: ")))
    end = md.index("", verdict_at)
    print("\n".join(md[2:verdict_at] + md[end + 1:]))  # the verdict comes last
    print()
    log(seeds_line(summary, runs, asked, out / "grid"))
    log(shown_text[1])
    log(f"a CPU-scale illustration on {WHAT[args.data]}, not the paper's IWSLT14 numbers (README.md)")
    log(f"written: {out / 'summary.md'}, {out / 'summary.json'}, {out / 'results.md'} and "
        f"{out / 'results.csv'} (per seed); total wall time {time.time() - t0:.0f} s")
    if args.publish:
        from .analysis.publish import publish
        from .analysis.publish import argv_of

        page = publish(args.publish, f"The demo (`{MAKE[args.data]}`)",
                       "\n".join(md[:md.index("Next steps:")] + [
                           f"Wall time: {time.time() - t0:.0f} s from the command's start to this page "
                           f"(a resumed demo counts only its last part), load (1-minute average) "
                           f"{os.getloadavg()[0]:.2f} at the end. Precision: "
                           f"{'bfloat16 autocast (--cpu-bf16)' if args.cpu_bf16 else 'float32'}.", "",
                           disk_line(out), ""]),
                       runs_table, figures + [out / "summary.json"], argv_of("python -m fairseq_lnpos.demo", argv))
        log(f"results page: {page}")
    return 0


def disk_line(out):
    """What the demo leaves on disk in ``out``, and how much of it is checkpoints."""
    files = [f for f in Path(out).rglob("*") if f.is_file() and not f.is_symlink()]
    mb = lambda fs: sum(f.stat().st_size for f in fs) / 1e6  # noqa: E731
    checkpoints = [f for f in files if f.suffix == ".pt"]
    return (f"Disk: {mb(files):.0f} MB left in `{Path(out).name}/`, {mb(checkpoints):.0f} MB of it the runs' "
            f"{len(checkpoints)} checkpoints (`checkpoint_best.pt` and `checkpoint_last.pt`).")


def main(argv=None):
    """The command: one line and exit 2 for bad input, 130 when interrupted."""
    return run_main("demo", command, argv)


if __name__ == "__main__":
    sys.exit(main())
