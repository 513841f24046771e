"""Aggregating seeds: one estimator for every map and table of the project.

A cell (or a table row) run with n seeds is reported as n, the mean, the range (min to max) and a
95 % confidence interval of the mean, Student's t: mean +- t(0.975, n-1) * s / sqrt(n), with s the
sample standard deviation (n-1 in the denominator), clipped to the metric's range where it has one
(BLEU: 0 to 100). With one seed there is no interval ("1 seed"); with two, t(0.975, 1) = 12.7 makes
the interval say nothing a reader can use, so none is given ("no interval from 2 seeds"); from three
seeds on it is printed.
"""
import math
import statistics
from dataclasses import dataclass

ESTIMATOR = ("n seeds; mean; min to max; 95 % CI of the mean: mean +- t(0.975, n-1) s/sqrt(n) (Student's t, "
             "s the sample standard deviation), clipped to the metric's range; no CI for one or two seeds")


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float
    min: float
    max: float
    sd: float = None      # sample standard deviation; None for one seed
    ci_low: float = None  # 95 % CI of the mean; None for one seed
    ci_high: float = None

    def text(self, fmt=".2f"):
        """``mean (min to max, CI lo to hi, n=3)``, ``mean (min to max, n=2; no interval from 2 seeds)``
        or ``mean (1 seed)``."""
        if self.n == 1:
            return f"{self.mean:{fmt}} (1 seed)"
        if self.n == 2:
            return f"{self.mean:{fmt}} ({self.min:{fmt}} to {self.max:{fmt}}, n=2; no interval from 2 seeds)"
        return (f"{self.mean:{fmt}} ({self.min:{fmt}} to {self.max:{fmt}}, CI {self.ci_low:{fmt}} to {self.ci_high:{fmt}}, "
                f"n={self.n})")

    def as_dict(self):
        return {"n": self.n, "mean": self.mean, "min": self.min, "max": self.max, "sd": self.sd,
                "ci95_low": self.ci_low, "ci95_high": self.ci_high}


def t975(df):
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def spread(values, bounds=(None, None)):
    """The :class:`Spread` of the finite numbers among ``values`` (None and NaN are left out), its
    interval clipped to ``bounds`` (low, high; None: unbounded); None when there are none."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None
    mean = statistics.fmean(xs)
    if len(xs) == 1:
        return Spread(1, mean, xs[0], xs[0])
    sd = statistics.stdev(xs)
    half = t975(len(xs) - 1) * sd / math.sqrt(len(xs))
    low, high = mean - half, mean + half
    low, high = (low if bounds[0] is None else max(low, bounds[0])), (high if bounds[1] is None else min(high, bounds[1]))
    return Spread(len(xs), mean, min(xs), max(xs), sd, low, high)
