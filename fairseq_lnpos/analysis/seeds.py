"""Aggregating seeds: one estimator for every map and table of the project (:data:`ESTIMATOR`). A
cell or table row of n seeds: n, the mean, min to max and a 95 % CI of the mean, Student's t on the
sample standard deviation, clipped to the metric's range (BLEU: 0 to 100). With two seeds t(0.975, 1)
= 12.7 makes the interval say nothing a reader can use: it is printed from three seeds on."""
import math
from dataclasses import astuple, dataclass

ESTIMATOR = ("n seeds; mean; min to max; 95 % CI of the mean: mean +- t(0.975, n-1) s/sqrt(n) (Student's t, "
             "s the sample standard deviation), clipped to the metric's range; no CI for one or two seeds")
STATS = ["n", "mean", "min", "max", "sd", "ci95_low", "ci95_high"]  # the columns of over_seeds


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float
    min: float
    max: float
    sd: float = None      # sample standard deviation; None for one seed
    ci_low: float = None  # 95 % CI of the mean; None for one seed
    ci_high: float = None

    @classmethod
    def of(cls, row):
        """The Spread of a row of :func:`over_seeds`."""
        n, mean, lo, hi, *rest = (row[k] for k in STATS)
        return cls(int(n), float(mean), float(lo), float(hi), *(None if math.isnan(v) else float(v) for v in rest))

    def text(self, fmt=".2f"):
        """``mean (min to max, CI lo to hi, n=3)``, ``mean (min to max, n=2; no interval from 2 seeds)``
        or ``mean (1 seed)``."""
        if self.n == 1:
            return f"{self.mean:{fmt}} (1 seed)"
        ci = "n=2; no interval from 2 seeds" if self.n == 2 else f"CI {self.ci_low:{fmt}} to {self.ci_high:{fmt}}, n={self.n}"
        return f"{self.mean:{fmt}} ({self.min:{fmt}} to {self.max:{fmt}}, {ci})"

    def as_dict(self):
        return dict(zip(STATS, astuple(self)))


def over_seeds(frame, by, metrics):
    """The seeds of each ``by`` (a column of ``frame``, one row per seed) per metric: a DataFrame with the
    columns ``by``, ``metric`` and :data:`STATS`, one row per group and metric that has a finite value,
    in the groups' first-seen order; ``metrics``: {column: (low, high) the metric's range, None unbounded}."""
    import numpy as np
    import pandas as pd
    from scipy.stats import t

    long = frame.melt(id_vars=[by], value_vars=list(metrics), var_name="metric")
    long["value"] = pd.to_numeric(long["value"], errors="coerce")
    long = long[np.isfinite(long["value"])]
    out = long.groupby([by, "metric"], sort=False)["value"].agg(
        n="count", mean="mean", min="min", max="max", sd="std").reset_index()
    half = t.ppf(0.975, out["n"] - 1) * out["sd"] / np.sqrt(out["n"])
    bound = {i: out["metric"].map(lambda m: metrics[m][i]).astype(float) for i in (0, 1)}  # None: NaN, no clipping
    out["ci95_low"] = (out["mean"] - half).clip(lower=bound[0])
    out["ci95_high"] = (out["mean"] + half).clip(upper=bound[1])
    first = {k: i for i, k in enumerate(frame[by].unique())}
    return out.sort_values(by, key=lambda s: s.map(first), kind="stable").reset_index(drop=True)


def spread(values, bounds=(None, None)):
    """The :class:`Spread` of the finite numbers among ``values`` (None and NaN are left out), its
    interval clipped to ``bounds`` (low, high; None: unbounded); None when there are none."""
    import pandas as pd

    values = list(values)
    out = over_seeds(pd.DataFrame({"g": [0] * len(values), "x": pd.Series(values, dtype=object)}), "g", {"x": bounds})
    return Spread.of(out.iloc[0]) if len(out) else None
