"""Training curves over seeds: each row's validation NLL and test BLEU per epoch, with its seeds' range,
and per epoch its difference from a reference row and the lab's verdict among the rows.

    python -m fairseq_lnpos.analysis.curves OUT [OUT ...] [--only NAME,...] [--reference NAME]
        [--title T] [--out-dir D] [--publish DIR]

``OUT``: grid folders (``OUT/NAME/seedS/``), or pages this command published (their runs.csv and
epochs.csv: seeds trained elsewhere add up; a run given twice is refused). ``--only``: run names or globs
(default: every run that finished, diverged or stopped), chosen before that check: a run left out may be
in several sources. Per row (a run of the run table) and scored epoch: the seeds, the mean and range of
the validation NLL (bits, no label smoothing), tok BLEU, sacreBLEU, and the hypotheses' length ratio and
4-gram repetition (:mod:`~fairseq_lnpos.experiments.evaluate`); the row's mean NLL minus the reference
row's (``--reference``, default the first row whose variant is Pre-LN, else the first row) with Welch's
95 % interval; and the maps' verdict (:mod:`.verdict`) with that epoch's rows as one family: *poor* =
worse than another row by more than the margin (Welch, each row with its own variance, Holm over every
ordered pair), else *good*. Per row: the epoch of lowest validation NLL of each
seed (chosen without the test set) and its tok BLEU, and the first epoch from which the row is good at
every later epoch. Where runs wrote ``--log-diagnostics`` (``diagnostics.jsonl``), each row's residual
share ||F(x)|| / ||s x|| (:mod:`fairseq_lnpos.diagnostics`: what the sublayers add to the stream over what
the skip path carries) per kind of connection and seed, mean over the stack's layers, at the logged
updates of :data:`RESIDUAL_UPDATES`.

Writes into ``--out-dir`` (default ``curves-report``): runs.csv, epochs.csv (one row per run, seed and
epoch: the per-seed data), curves.csv (one row per run and epoch), curves.md (printed too) and
curves.png, and where runs logged diagnostics residual.csv.gz (gzip; one row per run, seed, logged
update and connection) and residual.png; ``--publish DIR`` the same as a results page.
"""
import fnmatch
import gzip
import math
import sys
from pathlib import Path

from ..cli import CommandParser
from ..common import DIAGNOSTICS_JSONL, replace_file, write_text
from ..errors import LnposError, run_main
from . import verdict as V
from .frame import COUNTED, EPOCH_COLUMNS, check_model_code, gather, pandas, read_folder
from .map_common import markdown_table, num, panels, save, variant_color
from .publish import argv_of, write_outputs
from .train_curves import read_jsonl

PROG = "python -m fairseq_lnpos.analysis.curves"
EPOCHS_CSV = "epochs.csv"
RESIDUAL_CSV = "residual.csv.gz"  # the largest per-run table: gzip (pandas reads it by its suffix)
RESIDUAL_COLUMNS = ["run", "seed", "update", "group", "ratio"]
RESIDUAL_UPDATES = (1, 10, 50, 100, 200, 500, 1000, 1500, 2000)  # the columns of the page's table, where logged
CONNECTIONS = ("encoder/self_attn", "encoder/ffn", "decoder/self_attn", "decoder/encoder_attn", "decoder/ffn")
METRICS = {"valid_nll_loss": "validation NLL (bits)", "bleu_tok": "tok BLEU", "sacrebleu": "sacreBLEU",
           "length_ratio": "length ratio", "repeat_4gram": "4-gram repetition"}


def load(sources, only=None, allow_mixed=False):
    """(runs, epochs, residual): the runs of ``sources`` that ``only`` selects and finished, diverged or
    stopped, one row per run, seed and scored epoch (:data:`~.frame.EPOCH_COLUMNS`), and one per run,
    seed, logged update and residual connection (:data:`RESIDUAL_COLUMNS`)."""
    pd = pandas()
    what = "the output folder of a grid (OUT/NAME/seedS/)"
    selected = (lambda n: any(fnmatch.fnmatchcase(n, g) for g in only)) if only else None
    runs, tables = gather(sources, {EPOCHS_CSV: EPOCH_COLUMNS, RESIDUAL_CSV: RESIDUAL_COLUMNS}, what,
                          read=lambda folder: read_grid(folder, what), keep=selected)
    epochs, residual = tables[EPOCHS_CSV], tables[RESIDUAL_CSV]
    for c in METRICS.keys() | {"epoch", "num_updates", "seed", "train_loss", "valid_loss"}:
        epochs[c] = pd.to_numeric(epochs[c])
    runs = runs[runs["outcome"].isin(COUNTED)].reset_index(drop=True)
    if runs.empty:
        raise LnposError(f"{', '.join(map(str, sources))}: no run finished, diverged or stopped"
                         + (f" among {','.join(only)}" if only else "") + ": let them run, or check --only")
    check_model_code(runs, allow_mixed)
    keys = runs[["run", "seed"]]
    epochs = epochs.merge(keys, on=["run", "seed"]).sort_values(["run", "seed", "epoch"], kind="stable")
    if len(residual):
        residual = residual.merge(keys, on=["run", "seed"])
    return runs, epochs.reset_index(drop=True), residual


def residual_rows(run, seed, path):
    """The rows of :data:`RESIDUAL_COLUMNS` of one run folder (its ``residual_ratio`` per logged update
    and connection, e.g. ``encoder/3/ffn``; none where it logged no diagnostics)."""
    log = Path(path) / "checkpoints" / DIAGNOSTICS_JSONL
    if not log.is_file():
        return []
    updates, groups = read_jsonl(log, metric="residual_ratio")
    return [{"run": run, "seed": seed, "update": u, "group": g, "ratio": v} for g, values in groups.items()
            if g.count("/") == 2 for u, v in zip(updates, values) if v is not None]


def read_grid(folder, what):
    """(runs, {epochs.csv: its table, residual.csv.gz: its table}) of a grid's folder of run folders."""
    runs, epochs = read_folder(folder, what)
    rows = [row for r in runs.itertuples() for row in residual_rows(r.run, r.seed, r.path)]
    return runs, {EPOCHS_CSV: epochs, RESIDUAL_CSV: pandas().DataFrame(rows, columns=RESIDUAL_COLUMNS)}


def per_connection(residual):
    """``residual`` (:data:`RESIDUAL_COLUMNS`) as the mean over the stack's layers per run, seed, kind of
    connection (:data:`CONNECTIONS`, column ``connection``) and logged update."""
    parts = residual["group"].str.split("/", expand=True)
    df = residual.assign(connection=parts[0] + "/" + parts[2])
    df = df[df["connection"].isin(CONNECTIONS)]
    return df.groupby(["run", "seed", "connection", "update"], sort=False)["ratio"].mean().reset_index()


def residual_table(residual):
    """One row per run, kind of connection (:data:`CONNECTIONS`) and seed (seeds may disagree: one escapes
    a plateau, another does not), and per logged update of :data:`RESIDUAL_UPDATES` the mean of
    ||F(x)|| / ||s x|| over the stack's layers."""
    pd = pandas()
    df = per_connection(residual) if len(residual) else residual
    df = df[df["update"].isin(RESIDUAL_UPDATES)]
    if df.empty:
        return pd.DataFrame()
    order = {r: i for i, r in enumerate(dict.fromkeys(residual["run"]))}
    table = df.pivot(index=["run", "connection", "seed"], columns="update", values="ratio")
    return table.reset_index().sort_values(
        ["run", "connection", "seed"], kind="stable",
        key=lambda s: s.map(order) if s.name == "run" else s.map(CONNECTIONS.index) if s.name == "connection" else s
    ).reset_index(drop=True)


def reference_of(runs, name=None):
    """The reference row: ``name``, else the first row of a Pre-LN variant, else the first row."""
    names = list(dict.fromkeys(runs["run"]))
    if name is not None:
        if name not in names:
            raise LnposError(f"--reference {name}: not among the runs ({', '.join(names)}): give one of them")
        return name
    pre = runs.loc[runs["variant"] == "preln", "run"]
    return pre.iloc[0] if len(pre) else names[0]


def curves(epochs, reference, margin=V.DEFAULT_MARGIN, alpha=V.DEFAULT_ALPHA):
    """One row per run and epoch: seeds, mean/min/max of each of :data:`METRICS`, the NLL minus the
    reference's (Welch's 95 % interval) and the verdict among that epoch's rows."""
    order = {r: i for i, r in enumerate(dict.fromkeys(epochs["run"]))}
    g = epochs.groupby(["run", "epoch"], sort=False)
    out = g.size().rename("seeds").to_frame()
    for m in METRICS:
        out = out.join(g[m].agg(["mean", "min", "max"]).add_prefix(f"{m}_"))
    out["nll_var"] = g["valid_nll_loss"].var(ddof=1)
    out = out.reset_index()
    out["diff"], out["diff_low"], out["diff_high"] = math.nan, math.nan, math.nan
    for epoch, idx in out.groupby("epoch").groups.items():
        ref = epochs.loc[(epochs["run"] == reference) & (epochs["epoch"] == epoch), "valid_nll_loss"].dropna().to_numpy()
        for i in idx:
            if out.at[i, "run"] != reference:
                x = epochs.loc[(epochs["run"] == out.at[i, "run"]) & (epochs["epoch"] == epoch), "valid_nll_loss"].dropna()
                out.loc[i, ["diff", "diff_low", "diff_high"]] = V.welch(x, ref)[:3]
    fam = out[out["valid_nll_loss_mean"].notna()]
    fam = fam[fam.groupby("epoch")["epoch"].transform("size") > 1]  # an epoch with one row compares nothing
    out["good"] = V.good(fam, "epoch", "valid_nll_loss_mean", "nll_var", "seeds", margin, alpha, index=out.index)
    return out.sort_values(["run", "epoch"], key=lambda s: s.map(order) if s.name == "run" else s,
                           kind="stable").reset_index(drop=True)


def summary(runs, epochs, table):
    """One row per run: seeds (all, and those scored at its last epoch), epochs, CPU seconds (per run of
    the full length, and per epoch over every seed), then over the seeds scored at its last epoch: the
    validation-selected epoch's tok BLEU, the last epoch's NLL and how much it fell over that epoch
    (mean and range: a row still learning or stalled); and the first epoch from which the row is good
    at every later epoch."""
    pd = pandas()
    rows = []
    for name, part in epochs.groupby("run", sort=False):
        last_epoch = int(part["epoch"].max())
        full = part[part["seed"].isin(part.loc[part["epoch"] == last_epoch, "seed"])]  # seeds trained to the end
        scored = full.dropna(subset=["valid_nll_loss"])
        sel = full.loc[scored.groupby("seed")["valid_nll_loss"].idxmin()]
        nll = scored.pivot(index="seed", columns="epoch", values="valid_nll_loss").reindex(
            columns=[last_epoch - 1, last_epoch])  # a column of NaN where no seed has a finite NLL (diverged)
        gain = (nll[last_epoch - 1] - nll[last_epoch]).dropna()
        verdicts = table[table["run"] == name].sort_values("epoch")
        good_from = None
        for e, good in zip(verdicts["epoch"][::-1], verdicts["good"][::-1]):
            if good is not True:
                break
            good_from = e
        cpu = runs[runs["run"] == name].set_index("seed")["train_cpu_seconds"]
        per_seed = part.groupby("seed")["epoch"].max()
        rows.append({"run": name, "seeds": part["seed"].nunique(), "seeds_full": full["seed"].nunique(),
                     "epochs": last_epoch, "cpu_seconds": cpu.reindex(full["seed"].unique()).mean(),
                     "cpu_per_epoch": cpu.sum() / per_seed.reindex(cpu.index).sum(),
                     "last_nll": nll[last_epoch].mean(), "sel_epochs": ",".join(map(str, sel["epoch"])),
                     "sel_bleu": sel["bleu_tok"].mean(), "sel_bleu_min": sel["bleu_tok"].min(),
                     "sel_bleu_max": sel["bleu_tok"].max(), "good_from": good_from,
                     "last_gain": gain.mean() if len(gain) else math.nan,
                     "last_gain_min": gain.min() if len(gain) else math.nan,
                     "last_gain_max": gain.max() if len(gain) else math.nan})
    return pd.DataFrame(rows)


def _range(mean, lo, hi, fmt):
    return "" if mean is None or math.isnan(mean) else num(mean, fmt) + ("" if lo == hi else f" [{lo:{fmt}} to {hi:{fmt}}]")


def residual_markdown(rtable):
    """The page's section on the residual share (none where no run logged it)."""
    if rtable is None or rtable.empty:
        return []
    updates = [u for u in RESIDUAL_UPDATES if u in rtable.columns]
    df = pandas().DataFrame({"row": [f"`{r}`" for r in rtable["run"]], "connection": rtable["connection"],
                             "seed": rtable["seed"],
                             **{f"update {u}": [num(v, ".3g") for v in rtable[u]] for u in updates}})
    return ["", "## Residual share", "",
            "||F(x)|| / ||s x|| of each residual connection (fairseq_lnpos/diagnostics.py, `--log-diagnostics`): what "
            "the sublayer adds to the stream over what the skip path carries (DeepNorm's alpha x, B2T's extra layer "
            "input count as skip), pooled over the update's batch, mean over the stack's layers, per seed; "
            "per layer in residual.csv.gz.", ""] + markdown_table(df)


def markdown(runs, table, summ, reference, title, code_line, rtable=None):
    lines = [f"# {title}", "",
             f"Runs: {len(runs)} ({', '.join(f'`{r}` seeds {s}' for r, s in runs.groupby('run', sort=False)['seed'].agg(lambda s: ','.join(map(str, sorted(s)))).items())}); "
             f"{code_line}. Training CPU time: {runs['train_cpu_seconds'].sum():.0f} CPU-s.", "",
             f"Quantity: the validation NLL (bits, no label smoothing) of each scored epoch; tok BLEU and sacreBLEU on the "
             f"test set. Reference row: `{reference}`; 'minus reference': the row's mean NLL minus the reference's at that "
             f"epoch, Welch's 95 % interval. Verdict per epoch, the maps' rule (fairseq_lnpos/analysis/verdict.py) with "
             f"that epoch's rows as one family: poor = worse than another row by more than {V.DEFAULT_MARGIN:g} bit "
             f"(Welch's t over every ordered pair, Holm-corrected at {V.DEFAULT_ALPHA:g}), else good; NA: not compared. "
             "Per row, over the seeds scored at its last epoch: the selected epoch, each seed's epoch of lowest "
             "validation NLL (the test set not used), and its tok BLEU; the NLL drop over the last epoch, the NLL of "
             "the epoch before the last minus the last's, mean [min to max] (still learning: clearly above 0). CPU-s "
             "per epoch: over every seed.", "",
             "## Per row", ""]
    df = pandas().DataFrame({
        "row": [f"`{r}`" for r in summ["run"]],
        "seeds (to the last epoch)": [f"{n}" if n == k else f"{n} ({k})" for n, k in zip(summ["seeds"], summ["seeds_full"])],
        "epochs": summ["epochs"],
        "CPU-s per run (per epoch)": [f"{c:.0f} ({e:.0f})" if not math.isnan(c) else "" for c, e in
                                      zip(summ["cpu_seconds"], summ["cpu_per_epoch"])],
        "last epoch's NLL": [num(v, ".3f") for v in summ["last_nll"]],
        "NLL drop over the last epoch": [_range(m, lo, hi, ".3f") for m, lo, hi in
                                         zip(summ["last_gain"], summ["last_gain_min"], summ["last_gain_max"])],
        "selected epochs": summ["sel_epochs"],
        "tok BLEU, selected epoch": [_range(m, lo, hi, ".1f") for m, lo, hi in
                                     zip(summ["sel_bleu"], summ["sel_bleu_min"], summ["sel_bleu_max"])],
        "good from epoch": ["never" if g is None or (isinstance(g, float) and math.isnan(g)) else str(int(g))
                            for g in summ["good_from"]]})
    lines += markdown_table(df) + ["", "## Per epoch", ""]
    df = pandas().DataFrame({
        "row": [f"`{r}`" for r in table["run"]], "epoch": table["epoch"], "seeds": table["seeds"],
        "valid NLL: mean [min to max]": [_range(m, lo, hi, ".3f") for m, lo, hi in
                                         zip(table["valid_nll_loss_mean"], table["valid_nll_loss_min"], table["valid_nll_loss_max"])],
        "minus reference (95 % CI)": ["" if math.isnan(d) else f"{d:+.3f}" + ("" if math.isnan(lo) else f" ({lo:+.3f} to {hi:+.3f})")
                                      for d, lo, hi in zip(table["diff"], table["diff_low"], table["diff_high"])],
        "verdict": ["NA" if g is None else "good" if g else "poor" for g in table["good"]],
        "tok BLEU": [_range(m, lo, hi, ".1f") for m, lo, hi in zip(table["bleu_tok_mean"], table["bleu_tok_min"], table["bleu_tok_max"])],
        "sacreBLEU": [num(v, ".1f") for v in table["sacrebleu_mean"]],
        "length ratio": [num(v, ".2f") for v in table["length_ratio_mean"]],
        "4-gram repetition": [num(v, ".3f") for v in table["repeat_4gram_mean"]]})
    lines += markdown_table(df) + residual_markdown(rtable)
    return "\n".join(lines) + "\n"


def plot(table, variants, path, title):
    """NLL and tok BLEU per epoch, a line per row (its variant's colour; a line style per row of one
    variant) and the seeds' range as a band."""
    fig, axes = panels(2, 5.0, 3.6)
    styles, seen = {}, {}
    for name in dict.fromkeys(table["run"]):
        v = variants[name]
        styles[name] = dict(color=variant_color(v), linestyle=("-", "--", ":", "-.")[seen.setdefault(v, [0])[0] % 4])
        seen[v][0] += 1
    for ax, m in zip(axes[0], ("valid_nll_loss", "bleu_tok")):
        for name, part in table.groupby("run", sort=False):
            ax.plot(part["epoch"], part[f"{m}_mean"], marker="o", ms=3, label=name, **styles[name])
            ax.fill_between(part["epoch"], part[f"{m}_min"], part[f"{m}_max"], color=styles[name]["color"], alpha=0.15)
        ax.set_xlabel("epoch")
        ax.set_ylabel(METRICS[m])
        ax.set_xticks(sorted(table["epoch"].unique()))
    save(fig, path, f"{title}: mean over seeds, band = the seeds' range", legend_from=axes[0][0])


def plot_residual(residual, variants, path, title):
    """The residual share per logged update, a panel per kind of connection (:data:`CONNECTIONS`), a line
    per row and seed (the row's colour, a line style per seed): the mean over the stack's layers."""
    fig, axes = panels(len(CONNECTIONS), 3.4, 3.4, sharey=True)
    df = per_connection(residual)
    for ax, connection in zip(axes[0], CONNECTIONS):
        for (name, seed), part in df[df["connection"] == connection].groupby(["run", "seed"], sort=False):
            part = part.sort_values("update")
            ax.plot(part["update"], part["ratio"], lw=1, label=f"{name} s{seed}", color=variant_color(variants[name]),
                    linestyle=("-", "--", ":", "-.")[(int(seed) - 1) % 4])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("update")
        ax.set_title(connection)
    axes[0][0].set_ylabel("||F(x)|| / ||s x||, mean over layers")
    save(fig, path, f"{title}: residual share per connection and seed", legend_from=axes[0][0])


def _main(argv):
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="+", help="grid --out folders, or pages of this command")
    p.add_argument("--only", help="comma-separated run names or globs (default: every run)")
    p.add_argument("--reference", help="the row the others are compared with (default: the first Pre-LN row)")
    p.add_argument("--title", default="Training curves over seeds", help="the page's title (default: %(default)s)")
    p.add_argument("--allow-mixed-code", action="store_true", help="compare runs trained by different model code")
    p.add_argument("--out-dir", default="curves-report", help="where to write (default: %(default)s)")
    p.add_argument("--publish", metavar="DIR", help="also write a results page into DIR")
    args = p.parse_args(argv)
    only = [g for g in (args.only or "").split(",") if g] or None
    runs, epochs, residual = load(args.out, only, args.allow_mixed_code)
    reference = reference_of(runs, args.reference)
    table = curves(epochs, reference)
    summ = summary(runs, epochs, table)
    md = markdown(runs, table, summ, reference, args.title, check_model_code(runs, True), residual_table(residual))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / EPOCHS_CSV, out / "curves.csv", out / "curves.md", out / "curves.png"]
    write_text(written[0], epochs.to_csv(index=False, lineterminator="\n"))  # read back from a page: every digit
    write_text(written[1], table.drop(columns="nll_var").to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    write_text(written[2], md)
    variants = dict(zip(runs["run"], runs["variant"]))
    plot(table, variants, written[3], args.title)
    if not residual.empty:
        written += [out / RESIDUAL_CSV, out / "residual.png"]
        text = residual.to_csv(index=False, float_format="%.6g", lineterminator="\n").encode("utf-8")
        replace_file(written[4], lambda f: f.write(gzip.compress(text, mtime=0)))  # mtime 0: same data, same bytes
        plot_residual(residual, variants, written[5], args.title)
    write_outputs(out, args.publish, args.title, md, runs, written, argv_of(PROG, argv))
    print(md, end="")
    return 0


def main(argv=None):
    return run_main("curves", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
