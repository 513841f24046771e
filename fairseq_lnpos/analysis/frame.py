"""One tidy table of every run: the data every map, table, summary and results page is a view of.

:func:`read_folder` reads a grid's folder (``OUT/NAME/seedS/``, :mod:`~fairseq_lnpos.experiments.rundir`)
into two pandas DataFrames: one row per run (one seed of one configuration; :func:`runs_frame`), and
one row per run and recorded epoch. The columns (:data:`RUN_COLUMNS`):

- the configuration: ``run`` (the run table's name), ``variant``, ``arch``, ``layers``, ``warmup``
  (updates, 0 = none), ``lr``, ``seed``, ``optimizer``, ``max_update``, ``precision`` (float32,
  bf16-autocast, fp16, ...: :mod:`~fairseq_lnpos.precision`), ``hash`` (the config's),
  ``settings`` (every other setting as JSON: runs that differ in it are not one experiment);
- the outcome, as the grid recorded it (:class:`~fairseq_lnpos.experiments.records.Outcome`: finished,
  diverged, stopped early, failed, unfinished, not started), ``diverged_at``, ``stopped_at``, ``updates``;
- the numbers: ``initial_loss`` (the first update's training loss, label-smoothed, bits),
  ``final_valid_loss`` (label-smoothed), ``final_valid_nll`` (the last validation NLL in bits, no
  smoothing: the quantity the verdicts are on), ``unigram_bits`` (what a trivial model reaches on this
  corpus, :func:`~fairseq_lnpos.data.unigram.unigram_bits`), ``nll_ratio`` = final_valid_nll / unigram_bits,
  ``nll_permuted`` and ``source_gain`` (the validation NLL with the sources permuted across sentences, and
  its excess over the true sources': :mod:`~fairseq_lnpos.experiments.source_use`; NaN where not measured), ``bleu_tok`` and
  ``sacrebleu`` of the last scored epoch, ``best_bleu_tok`` (best on the test set), ``epochs``;
- the cost: ``train_seconds`` (wall), ``train_cpu_seconds``, ``peak_rss_mb``, ``cuda_peak_mb``;
- ``grad_ratio_encoder`` / ``_decoder``: the first over the last layer's gradient norm in the first
  updates, where the run logged them (:func:`~.depth.grad_ratios`);
- the provenance (:mod:`~fairseq_lnpos.provenance`): ``code``, ``model_code``, ``python``, ``torch``,
  ``fairseq``, ``cpu``, ``cores``, ``gpu``, ``load``; empty for runs recorded before it was;
- ``path``: the run folder.

Columns a run did not record are NaN (numbers) or empty. ``runs.csv`` (:func:`write_runs_csv`) is
this table as CSV, the per-seed data a results page publishes and every verdict can be re-derived from.
"""
import json
import math
import shlex
from pathlib import Path

from ..common import n_runs, write_text
from ..data.unigram import unigram_bits
from ..errors import LnposError, StateError
from ..experiments.records import Outcome
from ..experiments import source_use
from ..experiments.rundir import grid_run_dirs
from ..experiments.runs import warmup_updates
from ..precision import precision_of
from ..provenance import describe_code
from ..variants import VARIANTS, arch_names
from .depth import grad_ratios

DEFAULT_LAYERS = 6  # "layers" absent or null: the arch's default depth (6 for every size)
# fields of a recorded run that are the maps' axes or only name or describe it
NOT_SETTINGS = {"name", "ln", "layers", "warmup", "lr", "figure", "paper_bleu", "paper_valid_loss", "paper_note"}
FINISHED, DIVERGED, STOPPED = Outcome.FINISHED.value, Outcome.DIVERGED.value, Outcome.STOPPED.value  # the column's words
COUNTED = (FINISHED, DIVERGED, STOPPED)  # what a cell counts
RUN_COLUMNS = ["run", "variant", "arch", "layers", "warmup", "lr", "seed", "optimizer", "max_update", "precision", "outcome",
               "diverged_at", "stopped_at", "updates", "epochs", "initial_loss", "final_valid_loss", "final_valid_nll",
               "unigram_bits", "nll_ratio", "nll_permuted", "source_gain", "bleu_tok", "sacrebleu", "best_bleu_tok", "train_seconds",
               "train_cpu_seconds", "peak_rss_mb", "cuda_peak_mb", "grad_ratio_encoder", "grad_ratio_decoder", "code", "model_code", "python", "torch", "fairseq",
               "cpu", "cores", "gpu", "load", "hash", "settings", "path"]
LATER_COLUMNS = ("nll_permuted", "source_gain")  # absent from pages published before they were measured
EPOCH_COLUMNS = ["run", "variant", "layers", "warmup", "lr", "seed", "epoch", "num_updates", "train_loss",
                 "valid_loss", "valid_nll_loss", "bleu_tok", "sacrebleu", "length_ratio", "repeat_4gram", "path"]


def pandas():
    import pandas as pd

    return pd


def settings(cfg):
    """The settings of a recorded config besides the maps' axes, as sorted (name, value) pairs: the
    fields of its run, the model size (not the arch name, which names the architecture too) and the
    grid's options that change results (data, fp16, fairseq and generation flags, beam)."""
    run = {k: v for k, v in cfg["run"].items() if k not in NOT_SETTINGS}
    rest = {k: v for k, v in cfg.items() if k not in ("hash", "seed", "run", "arch")}
    variant_size = arch_names().get(cfg["arch"])
    arch = {"model size": variant_size[1]} if variant_size else {"arch": cfg["arch"]}
    return tuple(sorted({**run, **rest, **arch}.items(), key=lambda kv: kv[0]))


def _num(v):
    return math.nan if v is None else float(v)


def scores(rec):
    """The scored epochs of a run (a :class:`~fairseq_lnpos.experiments.rundir.RunRecord`) by the names of
    results.csv: the best on the test set (``sacrebleu`` its sacreBLEU), the last, the one selected on
    validation (``sel_``) and the average of the last checkpoints (``avg_``); a key is absent where the run
    has no such epoch."""
    best, scored, sel, avg = rec.best, rec.scored, rec.selected, rec.average
    out = {"best_valid_loss": rec.best_valid_loss}
    if best is not None:
        out.update(best_bleu_tok=best.bleu_tok, best_epoch=best.epoch, sacrebleu=best.sacrebleu,
                   signature=best.sacrebleu_signature, best_bleu_tok_cs=best.bleu_tok_cs,
                   last_bleu_tok=scored[-1].bleu_tok, last_epoch=scored[-1].epoch, last_sacrebleu=scored[-1].sacrebleu)
    if sel is not None:
        out.update(sel_bleu_tok=sel.bleu_tok, sel_epoch=sel.epoch, sel_sacrebleu=sel.sacrebleu,
                   sel_valid_nll=sel.valid_nll_loss)
    if avg is not None:
        out.update(avg_bleu_tok=avg.bleu_tok, avg_sacrebleu=avg.sacrebleu, avg_epochs=f"{avg.epochs[0]}-{avg.epochs[-1]}",
                   avg_bleu_tok_cs=avg.bleu_tok_cs)
    return out


def precision(cfg, done):
    """What a run trained in (:func:`~fairseq_lnpos.precision.precision_of`): as its DONE.json recorded it,
    else as its config's flags say (runs recorded before DONE.json held it)."""
    if done is not None and done.precision:
        return done.precision
    flags = shlex.split(cfg.get("fairseq_args") or "") + (["--fp16"] if cfg.get("fp16") else [])
    return cfg.get("precision") or precision_of(flags)


def run_row(rec):
    """The row of one run (a :class:`~fairseq_lnpos.experiments.rundir.RunRecord`)."""
    run, done, cfg = rec.run, rec.done, rec.config
    if run.ln not in VARIANTS:
        raise StateError(f"{rec.dir.config_path}: unknown architecture {run.ln!r} (known: {', '.join(VARIANTS)})")
    nll = done.final_valid_nll if done is not None and done.final_valid_nll is not None else rec.last("valid_nll_loss")
    if done is None or done.outcome is Outcome.FAILED:
        nll = None  # an unfinished or failed run has no final loss
    prov = (done.provenance if done is not None else None) or {}
    uni = done.unigram_bits if done is not None and done.unigram_bits is not None else (
        unigram_bits(str(Path(cfg["data"]).resolve())) if cfg.get("data") else None)
    got = scores(rec)
    row = {
        "run": run.name, "variant": run.ln, "arch": cfg["arch"], "layers": run.layers or DEFAULT_LAYERS,
        "warmup": warmup_updates(run.warmup or 0), "lr": float(run.lr), "seed": rec.seed,
        "optimizer": run.optimizer, "max_update": run.max_update, "precision": precision(cfg, done),
        "outcome": rec.outcome.value,
        "diverged_at": _num(done and done.diverged_at), "stopped_at": _num(done and done.stopped_at),
        "updates": _num(done and done.updates), "epochs": len(rec.evals),
        "initial_loss": _num(done and done.initial_loss),
        "final_valid_loss": _num(rec.final_valid_loss if done is not None and done.outcome is not Outcome.FAILED
                                 else None),
        "final_valid_nll": _num(nll), "unigram_bits": _num(uni),
        "bleu_tok": _num(got.get("last_bleu_tok")), "sacrebleu": _num(got.get("last_sacrebleu")),
        "best_bleu_tok": _num(got.get("best_bleu_tok")),
        "train_seconds": _num(done and done.train_seconds), "train_cpu_seconds": _num(done and done.train_cpu_seconds),
        "peak_rss_mb": _num(done and done.peak_rss_mb), "cuda_peak_mb": _num(done and done.cuda_peak_mb),
        "code": describe_code(prov.get("code")) if prov else "", "model_code": prov.get("model_code", ""),
        "python": prov.get("python", ""), "torch": prov.get("torch", ""), "fairseq": prov.get("fairseq", ""),
        "cpu": prov.get("cpu", ""), "cores": _num(prov.get("cores")), "gpu": ", ".join(prov.get("gpu") or []),
        "load": _num(prov.get("load")), "hash": cfg["hash"],
        "settings": json.dumps(dict(settings(cfg)), sort_keys=True, default=str), "path": str(rec.dir.path),
    }
    row["nll_ratio"] = row["final_valid_nll"] / row["unigram_bits"] if row["unigram_bits"] else math.nan
    use = source_use.read(rec.dir.path) if done is not None and done.outcome is Outcome.FINISHED else None
    row["nll_permuted"], row["source_gain"] = (use["nll_permuted"], use["gain"]) if use else (math.nan, math.nan)
    ratios = grad_ratios(rec.dir.save_dir, row["layers"]) if done is not None else None
    row["grad_ratio_encoder"], row["grad_ratio_decoder"] = ratios or (math.nan, math.nan)
    return row


def epoch_rows(rec):
    """The rows of :data:`EPOCH_COLUMNS` of one run, one per recorded epoch."""
    key = {"run": rec.run.name, "variant": rec.run.ln, "layers": rec.run.layers or DEFAULT_LAYERS,
           "warmup": warmup_updates(rec.run.warmup or 0), "lr": float(rec.run.lr), "seed": rec.seed}
    return [{**key, "epoch": e.epoch, "num_updates": _num(e.num_updates), "train_loss": _num(e.train_loss),
             "valid_loss": _num(e.valid_loss), "valid_nll_loss": _num(e.valid_nll_loss),
             "bleu_tok": _num(e.bleu_tok), "sacrebleu": _num(e.sacrebleu), "length_ratio": _num(e.length_ratio),
             "repeat_4gram": _num(e.repeat_4gram), "path": str(rec.dir.path)} for e in rec.evals]


def read_folder(out, what="the output folder of a sweep or grid (OUT/NAME/seedS/)"):
    """(runs, epochs): :data:`RUN_COLUMNS`, one row per run folder of ``out``, and :data:`EPOCH_COLUMNS`, one
    row per run and recorded epoch, each run read once; a run folder that cannot be read raises
    :class:`StateError` naming it."""
    records = [rd.record() for rd in grid_run_dirs(out, what)]
    pd = pandas()
    return (pd.DataFrame([run_row(rec) for rec in records], columns=RUN_COLUMNS),
            pd.DataFrame([row for rec in records for row in epoch_rows(rec)], columns=EPOCH_COLUMNS))


def runs_frame(out, what="the output folder of a sweep or grid (OUT/NAME/seedS/)"):
    """The table of every run of ``out`` (:func:`read_folder`'s runs)."""
    return read_folder(out, what)[0]


def read_runs(source, what="the output folder of a sweep or grid (OUT/NAME/seedS/)"):
    """The table of every run of ``source``: a folder of run folders, or a published runs.csv."""
    path = Path(source)
    if path.is_file():
        return read_runs_csv(path)
    if not path.is_dir():
        raise LnposError(f"{source}: no such folder or file: give {what}, or a published runs.csv")
    return runs_frame(path, what)


GATHERED = ("source", "page")  # the columns gather adds: where a run was read from (a page or not), not its data


def gather(sources, page_tables, what="the output folder of a sweep or grid (OUT/NAME/seedS/)", read=None, keep=None):
    """(the table of every run in ``sources`` with the columns :data:`GATHERED`, {file name: table} of
    the per-run data the study reads beyond runs.csv). ``page_tables`` is {file name: columns} of those
    tables as the study's pages keep them: a source holding the first is a results page the study
    published (its runs.csv and those tables, each with exactly its columns; the others may be absent),
    so seeds trained on other machines or days add up with new run folders. Any other source is a
    folder of run folders, read by ``read`` (the study's reader: (runs, {file name: table})) where
    given, else a folder or a runs.csv whose runs alone are read. A run (name and seed) given twice is
    refused. With no ``page_tables`` every source is a folder of run folders or a runs.csv. ``keep`` (a
    run name -> bool), where given, selects the runs before that check: a run left out may be in
    several sources."""
    pd = pandas()
    names = list(page_tables)
    frames, tables = [], {name: [] for name in names}
    for s in map(Path, sources):
        if names and (s / names[0]).is_file():
            for name, columns in page_tables.items():
                if name != names[0] and not (s / name).is_file():
                    continue
                try:
                    table = pd.read_csv(s / name)
                except (OSError, ValueError) as e:
                    raise LnposError(f"{s / name}: cannot read it ({e}): give a page the study published") from None
                if list(table.columns) != list(columns):
                    raise LnposError(f"{s / name} is not the study's {name} (columns {', '.join(columns)}): "
                                     f"give a page the study published")
                tables[name].append(table)
            frames.append(read_runs_csv(s / "runs.csv")[RUN_COLUMNS].assign(source=str(s), page=True))
        elif read is not None and s.is_dir():
            runs, got = read(s)
            frames.append(runs.assign(source=str(s), page=False))
            for name, columns in page_tables.items():
                tables[name].append(got[name][list(columns)])
        else:
            frames.append(read_runs(s, what).assign(source=str(s), page=False))
    runs = pd.concat(frames, ignore_index=True)
    if keep is not None:
        runs = runs[runs["run"].map(keep).astype(bool)].reset_index(drop=True)
    twice = runs[runs.duplicated(["run", "seed"], keep=False)].sort_values(["run", "seed", "source"])
    if not twice.empty:
        a, b = twice.iloc[0], twice.iloc[1]
        if a["source"] == b["source"]:  # a copied run folder
            raise LnposError(f"{a['path']} and {b['path']} hold the same run ({a['run']} seed {a['seed']}): a run's "
                             f"seeds must be distinct runs; move the copies away")
        raise LnposError(f"{a['run']} seed {a['seed']} is in {a['source']} and in {b['source']}: give each run once "
                         f"(leave out the page, or move the run folder away)")
    return runs, {name: (pd.concat([t for t in parts if len(t)], ignore_index=True) if any(len(t) for t in parts)
                         else pd.DataFrame(columns=list(page_tables[name]))) for name, parts in tables.items()}


def check_one_experiment(out, runs, by=None):
    """A map compares runs along its axes only: refuse ``runs`` that differ in another setting, and
    cells whose seeds are not distinct runs (the same seed twice: a copied folder). The corpus is the
    same where its unigram bits are (its folder may differ: runs of another machine or day). With ``by``
    (a column: ``run`` for a study of named runs, whose settings differ from row to row), a cell is a
    value of ``by`` and only its seeds must share every setting."""
    if runs.empty:
        return
    bits = runs.dropna(subset=["unigram_bits"])
    if bits["unigram_bits"].round(5).nunique() > 1:
        a, b = bits.iloc[0], bits[bits["unigram_bits"].round(5) != round(bits["unigram_bits"].iloc[0], 5)].iloc[0]
        raise LnposError(f"{out}: its runs were trained on different corpora (unigram bits {a['unigram_bits']:.5f} in "
                         f"{a['path']}, {b['unigram_bits']:.5f} in {b['path']}): map one corpus at a time")
    for _, cell in runs.groupby(by, sort=False) if by else [(None, runs)]:
        first = json.loads(cell["settings"].iloc[0])
        for _, r in cell.iterrows():
            other = json.loads(r["settings"])
            differ = sorted(k for k in first.keys() | other.keys()
                            if k != "data" and first.get(k, "(absent)") != other.get(k, "(absent)"))
            if differ:
                k = differ[0]
                raise LnposError(
                    f"{out}: its runs differ in {', '.join(differ)} ({k} {first.get(k, '(absent)')!r} in "
                    f"{cell['path'].iloc[0]}, {other.get(k, '(absent)')!r} in {r['path']}), not only in the "
                    + (f"{by} and seed: a {by}'s seeds share its settings; train the odd one again or move it away"
                       if by else "map's axes (architecture, depth, warm-up, learning rate, seed): map one "
                       "experiment per folder (a sweep's --out)"))
    twice = runs[runs.duplicated([by, "seed"] if by else ["variant", "layers", "warmup", "lr", "seed"], keep=False)]
    if not twice.empty:
        paths = sorted(twice["path"])
        raise LnposError(f"{out}: {len(paths)} run folders hold the same cell and seed ({paths[0]}, {paths[1]}): "
                         f"a cell's seeds must be distinct runs; move the copies away")


def check_model_code(runs, allow_mixed=False):
    """Counted runs (:data:`COUNTED`) whose model code differs (``model_code``,
    :mod:`~fairseq_lnpos.provenance`) are not compared unless ``allow_mixed``: :class:`LnposError`
    listing the versions and a run of each. Returns a line saying which code versions the runs used."""
    runs = runs[runs["outcome"].isin(COUNTED)]
    known = runs[runs["model_code"] != ""]
    versions = known.groupby("model_code")["path"].agg(["count", "first"])
    unknown = len(runs) - len(known)
    text = ("model code " + ", ".join(f"{v} ({n_runs(n)})" for v, (n, _) in versions.iterrows()) if len(versions)
            else "model code not recorded") + (f"; {n_runs(unknown)} recorded no code version" if unknown and len(versions) else "")
    if len(versions) > 1 and not allow_mixed:
        listed = "; ".join(f"{v}: {n_runs(n)}, e.g. {first}" for v, (n, first) in versions.iterrows())
        raise LnposError(f"the runs were trained by {len(versions)} versions of the model code ({listed}): "
                         f"re-run the older ones, or pass --allow-mixed-code to compare them anyway")
    return text


def write_runs_csv(runs, path):
    """``runs.csv``: the table as CSV, one row per run (floats to six significant digits: the
    NLLs the verdicts compare keep five decimals; a study's own per-run table keeps every digit)."""
    return write_text(path, runs.to_csv(index=False, float_format="%.6g", lineterminator="\n"))


def read_runs_csv(path):
    """The table of :func:`write_runs_csv` (a published ``runs.csv``)."""
    pd = pandas()
    text = ("code", "model_code", "python", "torch", "fairseq", "cpu", "gpu", "settings", "hash")
    try:  # identifiers as text: a commit such as 36640e8826 would otherwise be read as a number (inf)
        runs = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=dict.fromkeys(text, str))
    except (OSError, ValueError) as e:
        raise LnposError(f"{path}: cannot read it as a runs.csv ({e}): give a runs.csv a results page published") from None
    for c in LATER_COLUMNS:  # a page published before the column was measured: not measured
        if c not in runs.columns:
            runs[c] = math.nan
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise LnposError(f"{path} is not a runs.csv of this version of the project (no column {missing[0]!r}): give "
                         f"one a results page published, or publish the page again with this version's command")
    for c in text[:-1]:
        runs[c] = runs[c].astype(object).where(runs[c].notna(), "").astype(str)
    from .validate import check_runs  # every value checked: one line naming the file, row and column

    return check_runs(runs, path)
