"""Aggregating seeds: one estimator for every map and table of the project.

A cell (or a table row) run with n seeds is reported as n, the mean, the range (min-max) and a 95 %
confidence interval of the mean, Student's t: mean +- t(0.975, n-1) * s / sqrt(n), with s the sample
standard deviation (n-1 in the denominator). With one seed there is no interval, and the outputs
say "1 seed". With 2 or 3 seeds the interval is wide (t = 12.7 and 4.3): it says how little a few
seeds pin down, which is the point of printing it.
"""
import math
import statistics
from dataclasses import dataclass

ESTIMATOR = ("n seeds; mean; min-max; 95 % CI of the mean: mean +- t(0.975, n-1) s/sqrt(n) (Student's t, "
             "s the sample standard deviation); no CI for one seed")


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
        """``mean (min to max, CI lo to hi, n=3)``, or ``mean (1 seed)``."""
        if self.n == 1:
            return f"{self.mean:{fmt}} (1 seed)"
        return (f"{self.mean:{fmt}} ({self.min:{fmt}} to {self.max:{fmt}}, CI {self.ci_low:{fmt}} to {self.ci_high:{fmt}}, "
                f"n={self.n})")

    def as_dict(self):
        return {"n": self.n, "mean": self.mean, "min": self.min, "max": self.max, "sd": self.sd,
                "ci95_low": self.ci_low, "ci95_high": self.ci_high}


def t975(df):
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def spread(values):
    """The :class:`Spread` of the finite numbers among ``values`` (None and NaN are left out); None
    when there are none."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None
    mean = statistics.fmean(xs)
    if len(xs) == 1:
        return Spread(1, mean, xs[0], xs[0])
    sd = statistics.stdev(xs)
    half = t975(len(xs) - 1) * sd / math.sqrt(len(xs))
    return Spread(len(xs), mean, min(xs), max(xs), sd, mean - half, mean + half)


def pooled_sd(groups):
    """The pooled within-group sample standard deviation of ``groups`` (lists of numbers; groups of
    fewer than two finite values add nothing), and its degrees of freedom; (None, 0) without any."""
    ss, df = 0.0, 0
    for g in groups:
        xs = [float(v) for v in g if v is not None and math.isfinite(v)]
        if len(xs) >= 2:
            m = statistics.fmean(xs)
            ss += sum((x - m) ** 2 for x in xs)
            df += len(xs) - 1
    return (math.sqrt(ss / df), df) if df else (None, 0)
