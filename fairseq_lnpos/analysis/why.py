"""Why does Post-LN need warm-up? The warm-up study's runs (``runs.WHY``, docs/warmup_study.md) judged:
which interventions make Post-LN train, and which early diagnostic tells the runs that will train from
those that will not.

    python -m fairseq_lnpos.analysis.why OUT [OUT ...] [--out-dir D] [--allow-mixed-code] [--publish DIR]

``OUT``: the grid's folders holding the ``why-*`` runs (``scripts/grid.sh run --only 'why-*'``; other
runs in them are left out), or results pages this command published: a page keeps each run's row of
runs.csv and its early values (why_early.csv), so seeds trained on other machines or days add up with
new run folders (``why PAGE NEW_OUT --publish PAGE``); a run given twice is refused. The runs of one
corpus, compared with each other, must share their model code (unless ``--allow-mixed-code``); the
page lists the versions. Per corpus (the generated one, Multi30k):

- **the rows** (:func:`row_table`): each intervention's seeds, how many trained (a run trains when it
  finished and its final validation NLL is at most :data:`~.verdict.DEFAULT_TRAINS` x the corpus's
  unigram bits, the maps' rule, or the fraction ``--trains CORPUS=F`` gives a corpus whose budget is
  too short for it), the final NLL (bits, no label smoothing) over the seeds, test BLEU of
  the last epoch, the difference from the Pre-LN control with Welch's 95 % interval, and the maps'
  verdict (:mod:`.verdict`) with the corpus's rows as one family: *good* = every seed trained and
  no other row is better by more than the margin (Welch, Holm-corrected over every ordered pair);
- **the early diagnostics** (:func:`early_values`, :data:`FEATURES`): the value of each diagnostic at
  updates :data:`UPDATES` of every run (``diagnostics.jsonl``, ``grad_norms.jsonl``, and the training
  loss from ``train.log`` as the plain baseline), and how well one threshold on it separates the runs
  that train from those that do not (:func:`separation`): the AUC (Mann-Whitney), the error of the best
  threshold chosen on all runs (optimistic), and the leave-one-out error (the threshold and its
  direction chosen on the other runs, the held-out run classified; Clopper-Pearson 95 % interval),
  beside the error of always answering the more common class. Runs of one row share their setting,
  so the runs are not independent draws: read the rates as descriptions of this study;
- **one paragraph per explanation** (:data:`EXPLANATIONS`): what it predicts, for which rows and
  diagnostics, and what the runs show, in words derived from the tables.

Writes into ``--out-dir`` (default ``why-report``): runs.csv, why_rows.csv, why_early.csv (every run's
diagnostic values: the per-seed data of the separation), why_separation.csv, why.md (printed too),
why_nll.png and why_diagnostics_<corpus>.png; ``--publish DIR`` the same as a results page.
"""
import math
import re
import sys
from pathlib import Path

import numpy as np

from ..cli import CommandParser, named_fraction
from ..common import DIAGNOSTICS_JSONL, GRAD_NORMS_JSONL, write_text
from ..errors import LnposError, run_main
from ..experiments.runs import WHY_BASELINES, WHY_INTERVENTIONS
from ..fairseq_log import LogState
from . import verdict as V
from .frame import COUNTED, FINISHED, check_model_code, gather, pandas
from .map_common import markdown_table, num, panels, save
from .publish import argv_of, write_outputs
from .train_curves import read_records

PROG = "python -m fairseq_lnpos.analysis.why"
CORPORA = {"synthetic": "the generated corpus", "multi30k": "Multi30k"}
ROWS = {suffix: note for suffix, _, note in WHY_INTERVENTIONS}
FAILING, PRELN = "postln-nowu", "preln-nowu"
OTHER_MODELS = (PRELN, "admin-nowu", "postln-L3")  # rows whose model differs from the failing setting's
MODEL_ONLY = "the failing setting's model alone (Post-LN, 6 layers; the Pre-LN, Admin and 3-layer rows left out)"
UPDATES = (10, 50, 100)
LOSS_WINDOW = 10  # the training loss "at update u": the mean of the logged losses of updates u-9 .. u
LAYER = re.compile(r"^(encoder|decoder)/\d+$")


def _as_groups(value, key):
    """A record's value as {group: number}: a number is its own group (the Hessian's top eigenvalue)."""
    return value if isinstance(value, dict) else {key: value}


def _max(d, keep=lambda g: True):
    vals = [v for g, v in (d or {}).items() if keep(g) and v is not None and math.isfinite(v)]
    return max(vals) if vals else math.nan


def _min(d):
    vals = [v for v in (d or {}).values() if v is not None and math.isfinite(v)]
    return min(vals) if vals else math.nan


def _layer_ratio(norms, stack):
    """The first over the last layer's gradient norm of ``stack`` (whole layers)."""
    layers = sorted(int(g.split("/")[1]) for g in norms or {} if LAYER.match(g) and g.startswith(stack))
    if not layers or not norms.get(f"{stack}/{layers[-1]}"):
        return math.nan
    return norms[f"{stack}/{layers[0]}"] / norms[f"{stack}/{layers[-1]}"]


# feature -> (the record's key, how one number is taken from it, what it is); "train_loss" reads train.log
FEATURES = {
    "train_loss": (None, None, "training loss (label-smoothed, bits), mean of the 10 logged updates up to u"),
    "update_ratio_max": ("update_ratio", lambda d: _max(d, LAYER.match), "largest ‖dW‖/‖W‖ of a whole layer (the update over the weights)"),
    "adaptive_lr_max": ("adaptive_lr_max", _max, "Adam's largest per-weight step lr/(sqrt(v_hat)+eps); at most lr/eps, reached where some weight's v is still about 0"),
    "adaptive_lr_p99": ("adaptive_lr_p99", _max, "largest 99th percentile of Adam's per-weight step over sub-layers (also at most lr/eps)"),
    "attn_max_logit": ("attn_max_logit", _max, "largest attention logit over attention modules"),
    "attn_entropy_min": ("attn_entropy_min_head", _min, "smallest per-head attention entropy (nats)"),
    "output_logit_norm": ("output_logits", lambda d: (d or {}).get("l2_mean", math.nan), "mean L2 norm of the output logits"),
    "hessian_top": ("hessian_top", _max, "top Hessian eigenvalue (updates 1 and 50 only)"),
    "grad_norm_total": ("norms", lambda d: (d or {}).get("total", math.nan), "total gradient norm"),
    "grad_ratio_decoder": ("norms", lambda d: _layer_ratio(d, "decoder"), "decoder's first/last-layer gradient norm"),
    "grad_ratio_encoder": ("norms", lambda d: _layer_ratio(d, "encoder"), "encoder's first/last-layer gradient norm"),
}
HESSIAN_UPDATES = (1, 50)
EARLY_COLUMNS = ["corpus", "row", "seed", "trains", "feature", "update", "value"]

# explanation -> (its claim, rows it predicts to train, the diagnostics it predicts to separate)
EXPLANATIONS = [
    ("Adam's early second moment (Liu et al. 2020, RAdam; Ma & Yarats 2021)",
     "the first updates' second-moment estimate is poor, so Adam's early steps are too large",
     ("postln-radam", "postln-giadam", "postln-wu100", "postln-beta2-0.95"), ("adaptive_lr_max", "adaptive_lr_p99")),
    ("Amplified output change (Liu et al. 2020, Admin)",
     "the residual branches amplify each update's change of the output",
     ("admin-nowu", "postln-L3"), ("output_logit_norm",)),
    ("Large early angular updates (Kosson et al. 2024)",
     "the first updates are large against the weights", ("postln-wu100", "postln-lr5e-4", "postln-lr3e-4"),
     ("update_ratio_max",)),
    ("Sharpness and the catapult (Kalra & Barkeshli 2024)",
     "training starts in a sharp region; GI-Adam replaces warm-up", ("postln-giadam", "postln-wu100"),
     ("hessian_top",)),
    ("Attention-logit growth (Wortsman et al. 2023)",
     "the largest attention logits grow in runs that fail", (), ("attn_max_logit", "attn_entropy_min")),
    ("Gradient clipping and the learning rate (a common Multi30k recipe: 3 layers, lr 5e-4, clip 1.0)",
     "clipping, a smaller learning rate or fewer layers is what matters", ("postln-clip1", "postln-lr5e-4", "postln-L3"),
     ("grad_norm_total",)),
    ("Large gradients near the output (Xiong et al. 2020)",
     "Post-LN's last layers' gradients are large at the start; Pre-LN's are not", ("preln-nowu",),
     ("grad_ratio_decoder", "grad_ratio_encoder")),
    ("Noise of small batches", "the batch size at equal tokens matters", ("postln-batch-x4",), ()),
]


# ---------------------------------------------------------------- the runs

EARLY_CSV = "why_early.csv"  # every run's diagnostic values; with runs.csv, what a page keeps of each run


def load(sources, allow_mixed=False, trains=None):
    """The table of every ``why-*`` run in ``sources``, with ``corpus``, ``row``, ``trains_at`` (the
    fraction of the unigram bits below which a run trains: ``trains[corpus]``, else the maps') and
    ``trains``; and the early values the pages among ``sources`` recorded (:data:`EARLY_COLUMNS`).
    A source is a grid's folder of run folders, or a results page this command published (its
    runs.csv and :data:`EARLY_CSV`): seeds run on different machines or days add up. A run (row and
    seed) given twice is refused."""
    runs, tables = gather(sources, {EARLY_CSV: EARLY_COLUMNS}, "the grid's --out folder of the why-* runs")
    recorded = tables[EARLY_CSV]
    runs = runs[runs["run"].str.match(r"^why-(%s)-" % "|".join(CORPORA))].copy()
    if runs.empty:
        raise LnposError(f"{', '.join(map(str, sources))}: no why-* run: run `scripts/grid.sh run --only 'why-*'` first")
    runs[["corpus", "row"]] = runs["run"].str.extract(r"^why-([^-]+)-(.+)$")
    runs = runs[runs["outcome"].isin(COUNTED)].reset_index(drop=True)
    if runs.empty:
        raise LnposError(f"{', '.join(map(str, sources))}: no why-* run finished, diverged or stopped: let them run")
    for _, part in runs.groupby("corpus"):  # the rows compared with each other, those of one corpus, share it
        check_model_code(part, allow_mixed)
    runs["trains_at"] = runs["corpus"].map(lambda c: (trains or {}).get(c, V.DEFAULT_TRAINS))
    runs["trains"] = (runs["outcome"] == FINISHED) & (runs["nll_ratio"] <= runs["trains_at"])
    order = {r: i for i, r in enumerate(ROWS)}
    runs = runs.sort_values(["corpus", "row", "seed"], key=lambda s: s.map(order) if s.name == "row" else s,
                            kind="stable").reset_index(drop=True)
    return runs, recorded


def row_table(runs, margin=V.DEFAULT_MARGIN, alpha=V.DEFAULT_ALPHA):
    """One row per corpus and row of the study: seeds, trained, NLL and BLEU over seeds, the difference
    from Pre-LN (Welch's 95 % interval) and the maps' verdict among the corpus's rows."""
    fin = runs["final_valid_nll"].where(runs["outcome"] == FINISHED)  # the seeds that finished
    table = runs.assign(fin=fin).groupby(["corpus", "row"], sort=False).agg(
        seeds=("seed", "size"), seeds_train=("trains", "sum"), nll=("fin", "mean"), nll_var=("fin", "var"),
        nll_min=("fin", "min"), nll_max=("fin", "max"), finished=("fin", "count"), bleu=("bleu_tok", "mean"),
        unigram_bits=("unigram_bits", "mean"), trains_at=("trains_at", "first"),
        cpu_seconds=("train_cpu_seconds", "sum")).reset_index()
    seeds = lambda c, r: fin[(runs["corpus"] == c) & (runs["row"] == r)].dropna()  # noqa: E731
    table[["diff_preln", "diff_low", "diff_high"]] = [V.welch(seeds(c, r), seeds(c, PRELN))[:3] if r != PRELN else
                                                      (math.nan,) * 3 for c, r in zip(table["corpus"], table["row"])]
    table["trains"] = table["seeds_train"] == table["seeds"]  # a seed that trains finished
    table["good"] = V.good(table[table["trains"]], "corpus", margin=margin, alpha=alpha, index=table.index, other=False)
    return table


# ---------------------------------------------------------------- the early diagnostics

def _train_losses(path):
    log = Path(path) / "train.log"
    return LogState.of(log.read_text(encoding="utf-8", errors="replace")).losses if log.is_file() else []


def run_values(path):
    """{(feature, update): value} of one run folder at :data:`UPDATES` (and the Hessian's updates)."""
    save_dir = Path(path) / "checkpoints"
    values = {}
    losses = _train_losses(path)
    for u in UPDATES:
        window = [loss for upd, loss in losses if u - LOSS_WINDOW < upd <= u]
        values[("train_loss", u)] = float(np.mean(window)) if window else math.nan
    records = {}  # update -> the last record of each file at that update, merged (the files' keys differ)
    for name in (DIAGNOSTICS_JSONL, GRAD_NORMS_JSONL):
        if (save_dir / name).is_file():
            for rec in read_records(save_dir / name, max(UPDATES)):
                records.setdefault(rec["update"], {}).update(rec)
    for feature, (key, take, _) in FEATURES.items():
        if key is None:
            continue
        for u in (HESSIAN_UPDATES if feature == "hessian_top" else UPDATES):
            rec = records.get(u, {})
            values[(feature, u)] = float(take(_as_groups(rec[key], key))) if key in rec else math.nan
    return values


def early_values(runs, recorded=None):
    """The long table of every run's diagnostic values (:data:`EARLY_COLUMNS`), in the order of ``runs``:
    read from the run folder, or, for a run that came from a page, the values the page recorded
    (``recorded``, :func:`load`); ``trains`` is the run's under this report's rule."""
    pd = pandas()
    parts = []
    for r in runs.itertuples():
        if r.page:
            got = recorded[(recorded["corpus"] == r.corpus) & (recorded["row"] == r.row) & (recorded["seed"] == r.seed)]
        else:
            got = pd.DataFrame([{"corpus": r.corpus, "row": r.row, "seed": r.seed, "feature": f, "update": u, "value": v}
                                for (f, u), v in run_values(r.path).items()])
        parts.append(got.assign(trains=bool(r.trains))[EARLY_COLUMNS])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=EARLY_COLUMNS)


def best_threshold(x, fails):
    """(errors, threshold, direction) of the one-threshold rule on ``x`` that misclassifies fewest of
    ``fails`` (booleans): direction +1 calls a run failing when x > threshold, -1 when x < threshold;
    the threshold halfway between neighbouring values, the first of equal rules."""
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], fails[order].astype(int)
    cuts = np.concatenate([[xs[0] - 1], (xs[:-1] + xs[1:]) / 2, [xs[-1] + 1]])
    # runs at or below each cut: fails below (missed by +1), trains above (false alarms of +1)
    below_fail = np.concatenate([[0], np.cumsum(ys)])
    below_train = np.concatenate([[0], np.cumsum(1 - ys)])
    err_up = below_fail + (below_train[-1] - below_train)
    err_down = below_train + (below_fail[-1] - below_fail)
    distinct = np.concatenate([[True], xs[1:] != xs[:-1], [True]])  # a cut between equal values is no rule
    err_up, err_down = np.where(distinct, err_up, len(x) + 1), np.where(distinct, err_down, len(x) + 1)
    i, j = int(np.argmin(err_up)), int(np.argmin(err_down))
    return (int(err_up[i]), float(cuts[i]), 1) if err_up[i] <= err_down[j] else (int(err_down[j]), float(cuts[j]), -1)


def loo_errors(x, fails):
    """Leave-one-out: for each run, the rule of :func:`best_threshold` chosen on the others; the number of
    held-out runs it misclassifies."""
    wrong = 0
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        _, t, d = best_threshold(x[keep], fails[keep])
        wrong += bool((d * (x[i] - t) > 0) != fails[i])
    return wrong


def separation(values):
    """Per scope (each corpus, both, and both with the failing setting's model alone: ``+postln6``), feature
    and update: runs, failing runs, AUC, in-sample and leave-one-out errors (with its interval) and the
    error of always answering the more common class."""
    from scipy.stats import binomtest, mannwhitneyu

    out = []
    scopes = [(c, values[values["corpus"] == c]) for c in values["corpus"].unique()]
    if values["corpus"].nunique() > 1:
        scopes.append(("both", values))
    # a diagnostic that only tells the models apart separates the rows, not the runs: the same model alone
    scopes.append((scopes[-1][0] + "+postln6", values[~values["row"].isin(OTHER_MODELS)]))
    for scope, part in scopes:
        for (feature, u), g in part.groupby(["feature", "update"], sort=False):
            g = g[np.isfinite(g["value"])]
            x, fails = g["value"].to_numpy(float), ~g["trains"].to_numpy(bool)
            n, k = len(x), int(fails.sum())
            rec = {"scope": scope, "feature": feature, "update": u, "runs": n, "failing": k,
                   "base_error": min(k, n - k) / n if n else math.nan}
            if n >= 3 and 0 < k < n:
                auc = mannwhitneyu(x[fails], x[~fails]).statistic / (k * (n - k))
                wrong = loo_errors(x, fails)
                ci = binomtest(wrong, n).proportion_ci(0.95)
                rec.update(auc=auc, insample_error=best_threshold(x, fails)[0] / n, loo_error=wrong / n,
                           loo_low=ci.low, loo_high=ci.high)
            out.append(rec)
    return pandas().DataFrame(out, columns=["scope", "feature", "update", "runs", "failing", "base_error", "auc",
                                            "insample_error", "loo_error", "loo_low", "loo_high"])


# ---------------------------------------------------------------- Markdown

def _seeds_of(runs):
    return ", ".join(f"{CORPORA.get(c, c)}: seeds {', '.join(map(str, sorted(g['seed'].unique())))} "
                     f"({len(g)} runs)" for c, g in runs.groupby("corpus", sort=False))


def rows_markdown(table):
    lines = []
    for corpus, part in table.groupby("corpus", sort=False):
        at, uni = part["trains_at"].iloc[0], part["unigram_bits"].iloc[0]
        ends = {r: part.loc[part["row"] == r, "nll"] / uni for r in (PRELN, FAILING)}
        ends = " and ".join(f"`{r}` at {v.iloc[0]:.2f}" for r, v in ends.items() if len(v) and not math.isnan(v.iloc[0]))
        lines += [f"### {CORPORA.get(corpus, corpus)}", "",
                  f"Unigram bits of the corpus: {uni:.3f} (trains: final NLL at most {at:g} x it, {at * uni:.2f} bits"
                  + ("" if at == V.DEFAULT_TRAINS else f"; the maps' {V.DEFAULT_TRAINS:g} replaced by --trains") + ")."
                  + (f" The controls end (mean NLL over unigram bits): {ends}." if ends else ""), ""]
        df = pandas().DataFrame({
            "row `why-%s-...`" % corpus: [f"`{r}`" for r in part["row"]],
            "what it tests": [ROWS.get(r, "") for r in part["row"]],
            "trained (seeds)": [f"{a}/{b}" for a, b in zip(part["seeds_train"], part["seeds"])],
            "NLL / unigram bits": [num(m / u, ".2f") for m, u in zip(part["nll"], part["unigram_bits"])],
            "final valid NLL, bits: mean [min to max]": [
                num(m, ".3f") + (f" [{lo:.3f} to {hi:.3f}]" if f > 1 else "")
                for m, lo, hi, f in zip(part["nll"], part["nll_min"], part["nll_max"], part["finished"])],
            "minus Pre-LN (Welch 95 % CI)": [
                "" if math.isnan(d) else f"{d:+.3f}" + ("" if math.isnan(lo) else f" ({lo:+.3f} to {hi:+.3f})")
                for d, lo, hi in zip(part["diff_preln"], part["diff_low"], part["diff_high"])],
            "tok BLEU (last epoch)": [num(b, ".1f") for b in part["bleu"]],
            "verdict": [_verdict(g, t) for g, t in zip(part["good"], part["trains"])],
        })
        lines += markdown_table(df) + [""]
    return lines


def _scope_words(scope):
    """A scope of :func:`separation` in words: a corpus or "both", "+postln6" for its failing model's rows only."""
    corpus, _, only = scope.partition("+")
    return ("both corpora" if corpus == "both" else CORPORA.get(corpus, corpus)) + (f", {MODEL_ONLY}" if only else "")


def _best(sep, scope, features=None):
    s = sep[(sep["scope"] == scope) & sep["loo_error"].notna()]
    if features is not None:
        s = s[s["feature"].isin(features)]
    return s.sort_values(["loo_error", "insample_error", "update"], kind="stable")


def separation_markdown(sep):
    lines = []
    for scope in sep["scope"].unique():
        s = sep[sep["scope"] == scope]
        title = _scope_words(scope)
        first = s.iloc[0]
        lines += [f"### {title}: {first['runs']} runs, {first['failing']} do not train", ""]
        if s["loo_error"].isna().all():
            lines += ["Every run trains, or none does: nothing to separate.", ""]
            continue
        df = s.assign(
            diagnostic=[f"`{f}`" for f in s["feature"]],
            AUC=[num(a, ".2f") for a in s["auc"]],
            **{"error, threshold on all runs": [num(e, ".2f") for e in s["insample_error"]],
               "error, leave-one-out (95 % CI)": [
                   "" if math.isnan(e) else f"{e:.2f} ({lo:.2f} to {hi:.2f})"
                   for e, lo, hi in zip(s["loo_error"], s["loo_low"], s["loo_high"])],
               "error, always the common class": [num(b, ".2f") for b in s["base_error"]]})
        df = df[df["loo_error"].notna()]
        lines += markdown_table(df[["diagnostic", "update", "AUC", "error, threshold on all runs",
                                    "error, leave-one-out (95 % CI)", "error, always the common class"]]) + [""]
    return lines


def _row_words(table, corpus, row):
    r = table[(table["corpus"] == corpus) & (table["row"] == row)]
    if r.empty:
        return None
    r = r.iloc[0]
    words = f"`{row}` {r['seeds_train']}/{r['seeds']} seeds trained"
    if not math.isnan(r["diff_preln"]):
        words += f", {r['diff_preln']:+.2f} bit from Pre-LN"
    return words + f" ({_verdict(r['good'], r['trains'])})"


def _verdict(good, trains):
    return ("good" if good else "poor" if trains else "no-train") if good is not None else "NA"


def _separates(sep, scope, features):
    """The best of ``features`` on ``scope`` against the training loss's best there, in words ('' if none)."""
    best, loss = _best(sep, scope, features), _best(sep, scope, ("train_loss",))
    if not len(best):
        return ""
    b = best.iloc[0]
    than = ""
    if len(loss) and b["feature"] != "train_loss":
        lo = loss.iloc[0]
        than = (f"; {'better than' if b['loo_error'] < lo['loo_error'] else 'no better than'} the training loss's "
                f"best, {lo['loo_error']:.2f} at update {lo['update']}")
    return (f"`{b['feature']}` at update {b['update']} separates the {b['runs']} runs ({b['failing']} do not train) "
            f"with leave-one-out error {b['loo_error']:.2f} (always the common class: {b['base_error']:.2f}; "
            f"AUC {b['auc']:.2f}{than})")


def explanation_paragraphs(table, sep):
    lines = []
    for scope in sep["scope"].unique():
        loss = sep[(sep["scope"] == scope) & (sep["feature"] == "train_loss") & sep["loo_error"].notna()]
        if len(loss):
            lines += [f"The plain baseline on {_scope_words(scope)}: the training loss itself separates the runs with "
                      "leave-one-out error " + ", ".join(f"{e:.2f} at update {u}" for u, e in zip(loss["update"], loss["loo_error"]))
                      + "; a diagnostic tells more than the loss only where it does better.", ""]
    model_only = [s for s in sep["scope"].unique() if s.endswith("+postln6")]
    if model_only and _separates(sep, model_only[0], None):
        lines += [f"Of every diagnostic, on {_scope_words(model_only[0])}: {_separates(sep, model_only[0], None)}.", ""]
    for name, claim, rows, features in EXPLANATIONS:
        text = [f"**{name}**: {claim}."]
        for corpus in table["corpus"].unique():
            said = [w for w in (_row_words(table, corpus, row) for row in rows) if w]
            part = table[table["corpus"] == corpus].set_index("row")
            held = [row for row in rows if row in part.index and part.at[row, "trains"]]
            where = CORPORA.get(corpus, corpus)
            if said:
                text.append(f"On {where} it predicts that {', '.join(f'`{r}`' for r in rows)} "
                            f"train{'s' if len(rows) == 1 else ''}: {'; '.join(said)}. "
                            f"{len(held)} of these {len(said)} rows trained in every seed.")
            if features and _separates(sep, corpus, features):
                text.append(f"Its best diagnostic on {where}: {_separates(sep, corpus, features)}.")
        if model_only and features and _separates(sep, model_only[0], features):
            text.append(f"With the failing setting's model alone ({_scope_words(model_only[0].partition('+')[0])}): "
                        f"{_separates(sep, model_only[0], features)}.")
        lines += [" ".join(text), ""]
    return lines


def markdown(runs, table, sep, code_line):
    lines = ["# Why does Post-LN need warm-up? The explanations side by side", "",
             "The study's rows (`fairseq_lnpos/experiments/runs.py`, `WHY_INTERVENTIONS`; docs/warmup_study.md): "
             "the failing setting of each CPU corpus (`transformer_postln_tiny`, Adam (0.9, 0.98), lr 1e-3, no warm-up; "
             f"{WHY_BASELINES['synthetic'].with_defaults().max_epoch} epochs on the generated corpus, "
             f"{WHY_BASELINES['multi30k'].with_defaults().max_epoch} on Multi30k) and one intervention per row.", "",
             f"Runs: {_seeds_of(runs)}; {code_line}. Training CPU time: {runs['train_cpu_seconds'].sum():.0f} CPU-s.", "",
             "## Which interventions make Post-LN train", "",
             f"A run trains when it finished and its final validation NLL is at most {V.DEFAULT_TRAINS:g} x the "
             "corpus's unigram bits (the maps' rule) or the fraction given below for a corpus. Verdict: the maps' rule (fairseq_lnpos/analysis/verdict.py) with the corpus's "
             f"rows as one family: poor = worse than another row by more than {V.DEFAULT_MARGIN:g} bit, Welch's t "
             f"over every ordered pair, Holm-corrected at {V.DEFAULT_ALPHA:g}; good = every seed trained and not "
             "poor; no-train: some seed did not train; NA: one seed, not compared. 'Minus Pre-LN': the row's mean "
             "NLL minus the Pre-LN control's, Welch's 95 % interval (from two seeds in each).", ""]
    lines += rows_markdown(table)
    lines += ["## Which early diagnostic tells who will train", "",
              "One threshold on a diagnostic's value at update u calls a run failing above it (or below it); "
              "its error is the share of runs misclassified. 'Threshold on all runs' chooses the threshold on the "
              "runs it is scored on (optimistic); 'leave-one-out' chooses it on the other runs for each run "
              "(Clopper-Pearson interval); compare both with always answering the more common class. AUC: the chance "
              "that a failing run has the larger value (Mann-Whitney). The runs of one row share their setting, so "
              "they are not independent draws.", "",
              "| diagnostic | what |", "|---|---|"]
    lines += [f"| `{f}` | {d} |" for f, (_, _, d) in FEATURES.items()] + [""]
    lines += separation_markdown(sep)
    lines += ["## The explanations", ""] + explanation_paragraphs(table, sep)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- figures

def plot_nll(runs, table, path):
    corpora = list(table["corpus"].unique())
    fig, axes = panels(len(corpora), 5.5, 0.32 * max(len(ROWS), 8) + 1.2)
    for ax, corpus in zip(axes[0], corpora):
        part = runs[runs["corpus"] == corpus]
        rows = [r for r in ROWS if r in set(part["row"])]
        pos = {r: i for i, r in enumerate(reversed(rows))}
        for trains, color, lab in ((True, "tab:blue", "trains"), (False, "tab:red", "does not train")):
            sel = part[part["trains"] == trains]
            ax.scatter(sel["final_valid_nll"], sel["row"].map(pos), color=color, s=18, label=lab, zorder=3)
        uni, at = part["unigram_bits"].mean(), part["trains_at"].iloc[0]
        ax.axvline(at * uni, color="grey", ls="--", lw=1, label="trains below this")
        ax.set_yticks(list(pos.values()), list(pos.keys()))
        ax.set_xlabel("final validation NLL (bits)")
        ax.set_title(CORPORA.get(corpus, corpus))
    save(fig, path, "The warm-up study: final validation NLL per seed", legend_from=axes[0][0])


def plot_diagnostics(values, corpus, path, features=("train_loss", "update_ratio_max", "adaptive_lr_p99",
                                                      "attn_max_logit", "output_logit_norm", "grad_norm_total")):
    part = values[(values["corpus"] == corpus) & values["feature"].isin(features)]
    fig, axes = panels(len(features), 3.2, 3.0)
    for ax, f in zip(axes[0], features):
        g = part[(part["feature"] == f) & np.isfinite(part["value"])]
        ax.set_title(f, fontsize=9)
        if g.empty:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
            continue
        for trains, color, lab in ((True, "tab:blue", "trains"), (False, "tab:red", "does not train")):
            sel = g[g["trains"] == trains]
            jitter = {u: u * (1.06 if not trains else 0.94) for u in UPDATES}
            ax.scatter(sel["update"].map(jitter), sel["value"], color=color, s=10, alpha=0.7, label=lab)
        ax.set_xscale("log")
        ax.set_xticks(list(UPDATES), [str(u) for u in UPDATES])
        if (g["value"] > 0).all() and g["value"].max() > 5 * g["value"].min():
            ax.set_yscale("log")
        ax.set_xlabel("update")
    save(fig, path, f"Early diagnostics, {CORPORA.get(corpus, corpus)}: each run at updates "
                    f"{', '.join(map(str, UPDATES))}", legend_from=axes[0][0])


# ---------------------------------------------------------------- the command

def _main(argv):
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="+", help="the grid's --out folders holding the why-* runs, or pages of this study")
    p.add_argument("--out-dir", default="why-report", help="where to write the tables and figures (default: %(default)s)")
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="judge runs trained by different versions of the model code")
    p.add_argument("--trains", metavar="CORPUS=F", action="append", default=[],
                   type=named_fraction("CORPUS", "multi30k=0.8", CORPORA),
                   help=f"a run of CORPUS ({', '.join(CORPORA)}) trains below F x its unigram bits, 0 < F <= 1 "
                        f"(default: the maps' {V.DEFAULT_TRAINS:g}); repeat for each corpus")
    p.add_argument("--publish", metavar="DIR", help="also write a results page into DIR")
    args = p.parse_args(argv)
    runs, recorded = load(args.out, args.allow_mixed_code, dict(args.trains))
    code_line = check_model_code(runs, True)
    table = row_table(runs)
    values = early_values(runs, recorded)
    sep = separation(values)
    md = markdown(runs, table, sep, code_line)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "why_rows.csv", out / EARLY_CSV, out / "why_separation.csv", out / "why.md",
               out / "why_nll.png"]
    for df, f in ((table, written[0]), (sep, written[2])):
        write_text(f, df.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    # read back when the page is a source: every digit, or values that differ only past the sixth tie
    write_text(written[1], values.to_csv(index=False, lineterminator="\n"))
    write_text(written[3], md)
    plot_nll(runs, table, written[4])
    for corpus in table["corpus"].unique():
        written.append(out / f"why_diagnostics_{corpus}.png")
        plot_diagnostics(values, corpus, written[-1])
    write_outputs(out, args.publish, "Why does Post-LN need warm-up? The explanations side by side", md, runs, written,
                  argv_of(PROG, argv))
    print(md, end="")
    return 0


def main(argv=None):
    return run_main("why", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
