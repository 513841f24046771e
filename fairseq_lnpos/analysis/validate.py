"""The values of a published ``runs.csv``, checked where it is read (:func:`~.frame.read_runs_csv`).

A runs.csv is data a results page derived every number from, and a re-judged map (``stability_map.sh
--runs-csv``), an agreement or a replay reads it back: a value a command never writes would turn into
a verdict. :func:`check_runs` refuses, in one line naming the file, the row (its line in the file)
and the column:

- a number column holding text (``fast`` in ``lr``), an infinite number, or no number where every run
  has one (:data:`REQUIRED`); an empty field, or ``nan``, is "not recorded" elsewhere;
- a number out of its range (:data:`RANGES`: a negative NLL, a BLEU above 100, a fractional seed);
- an outcome that is none of :class:`~fairseq_lnpos.experiments.records.Outcome`'s;
- a run listed twice: the same run folder (``path``) twice, the same run and seed twice, or a row
  that repeats another's settings and measurements with only its seed (and folder) changed. A page
  of two maps (an agreement's, column ``map``) may hold a run once per map.

It returns the table with its number columns as numbers.
"""
import math

from ..cli import Range
from ..errors import LnposError
from ..experiments.records import Outcome

# the number columns of runs.csv (frame.RUN_COLUMNS) and the numbers each takes
WHOLE = ("layers", "warmup", "seed", "max_update", "diverged_at", "stopped_at", "updates", "epochs")
RANGES = {
    "layers": Range(1), "warmup": Range(0), "lr": Range(0, low_open=True), "seed": Range(0), "max_update": Range(0),
    "diverged_at": Range(0), "stopped_at": Range(0), "updates": Range(0), "epochs": Range(0),
    "initial_loss": Range(0), "final_valid_loss": Range(0), "final_valid_nll": Range(0),
    "unigram_bits": Range(0, low_open=True), "nll_ratio": Range(0), "nll_permuted": Range(0), "source_gain": Range(),
    "bleu_tok": Range(0, 100, high_open=False), "sacrebleu": Range(0, 100, high_open=False),
    "best_bleu_tok": Range(0, 100, high_open=False),
    "train_seconds": Range(0), "train_cpu_seconds": Range(0), "peak_rss_mb": Range(0), "cuda_peak_mb": Range(0),
    "grad_ratio_encoder": Range(0), "grad_ratio_decoder": Range(0), "cores": Range(1), "load": Range(0),
}
REQUIRED = ("layers", "warmup", "lr", "seed")  # every run has them; the others may be empty (not recorded)
MISSING = ("", "nan", "NaN", "NAN")  # how a number that was not recorded is written
OUTCOMES = tuple(o.value for o in Outcome)
GROUPS = ("map",)  # a column that holds several maps' runs side by side (agreement: A and B)
# what a run measured that no two runs share: the same values with another seed are a copied row
MEASURED = ("train_seconds", "train_cpu_seconds")


def _refuse(path, row, column, problem):
    """The one-line error for the value in ``row`` (0-based, the file's line is row + 2) of ``column``."""
    return LnposError(f"{path}, line {row + 2}, column {column}: {problem}: give the runs.csv a results page "
                      f"published (restore the page's file)")


def _numbers(runs, path, column):
    """The column as floats (NaN where empty or ``nan``), every value checked."""
    values = []
    for row, v in enumerate(runs[column].tolist()):
        if v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v.strip() in MISSING):
            if column in REQUIRED:
                raise _refuse(path, row, column, "no value, and every run has one")
            values.append(math.nan)
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise _refuse(path, row, column, f"{str(v)[:40]!r} is not a number") from None
        if not math.isfinite(x):
            raise _refuse(path, row, column, f"{v!r} is not a finite number")
        if column in WHOLE and x != int(x):
            raise _refuse(path, row, column, f"{v!r} is not a whole number")
        if x not in RANGES[column]:
            raise _refuse(path, row, column, f"{v!r} is not {RANGES[column].text}")
        values.append(x)
    return values


def _check_twice(runs, path):
    groups = [c for c in GROUPS if c in runs.columns]
    seen = {}
    for key in (["path"], ["run", "seed"]):
        if not all(c in runs.columns for c in key):
            continue
        for row, values in enumerate(runs[groups + key].itertuples(index=False, name=None)):
            if values in seen.setdefault(tuple(key), {}):
                first = seen[tuple(key)][values]
                what = f"run folder {values[-1]}" if key == ["path"] else f"run {values[-2]} seed {values[-1]:g}"
                raise _refuse(path, row, key[-1], f"the {what} is listed twice (also line {first + 2}): a run's "
                                                  f"row appears once")
            seen[tuple(key)][values] = row
    measured = [c for c in MEASURED if c in runs.columns]
    if not measured:
        return
    rest = [c for c in runs.columns if c not in ("seed", "path")]
    rows = {}
    for row, r in enumerate(runs[rest].itertuples(index=False, name=None)):
        values = dict(zip(rest, r))
        if all(isinstance(values[c], float) and math.isnan(values[c]) for c in measured):
            continue  # nothing measured: rows of runs that did not train may well be alike
        key = tuple(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r)
        if key in rows:
            raise _refuse(path, row, "seed", f"the row repeats line {rows[key] + 2} (its settings and every "
                                             f"measurement) with only the seed changed: a run's row appears once")
        rows[key] = row


def check_runs(runs, path):
    """``runs`` (a published runs.csv, read as text where a value is not a number) with its number columns
    as numbers, every value checked (the module's text); :class:`LnposError` naming ``path``, the line
    and the column otherwise."""
    runs = runs.copy()
    for column in RANGES:
        if column in runs.columns:
            values = _numbers(runs, path, column)
            if runs[column].dtype.kind not in "iuf":  # read as text (``nan`` written out): numbers now
                whole = column in WHOLE and not any(math.isnan(v) for v in values)
                runs[column] = [int(v) for v in values] if whole else values
    if "outcome" in runs.columns:
        for row, v in enumerate(runs["outcome"].tolist()):
            if v not in OUTCOMES:
                raise _refuse(path, row, "outcome", f"{str(v)[:40]!r} is not an outcome ({', '.join(OUTCOMES)})")
    _check_twice(runs, path)
    return runs
