"""The map's two rules, stated once: "trains" and "good" (near the best of its architecture).

- **trains** (:func:`trains`): no seed diverged or was stopped early, and the final validation loss
  (mean over the seeds) is at most ``ratio`` times the initial loss (the training loss of the first
  update). It separates training from not training; on its own it calls a slow, poor run "stable".
- **near best** (:func:`threshold`): the cell's mean final loss is within ``delta`` of the best cell
  of the same architecture and depth (over every warm-up and learning rate of the map), where
  ``delta = max(near x best, noise_k x s x sqrt(1/n + 1/n_best))``: ``near`` a relative floor
  (default 10 % of the best loss), ``s`` the pooled standard deviation between seeds of the map's
  cells that train (:func:`~.seeds.pooled_sd`), ``n`` and ``n_best`` the seeds of the cell and of the
  best cell. A map of one seed per cell has no ``s``: its delta is the floor alone, and it says so.
- **good** = trains and near best: the headline ("largest good learning rate", "largest good depth").
- **seeds disagree** (:func:`seeds_disagree`): some seeds of the cell are good by themselves (their own
  final loss trains and is within the threshold) and some are not. Such a cell is marked, never
  silently decided: its verdict is the mean's, with the mark beside it.

Measured on the generated corpus (docs/results.md): runs that train end at 0.17-0.49 of their first
loss, stalled runs at 0.68-0.79; two machines running the same commands differed by 0.13 bit on a
cell near 4.1 bits, which the relative floor (0.41 bit there) absorbs.
"""
import math
from dataclasses import dataclass

DEFAULT_RATIO = 0.6
DEFAULT_NEAR = 0.10
DEFAULT_NOISE_K = 2.0
# the best cell "good" is judged against: of the same architecture and depth (a learning-rate map),
# or of any architecture at that depth (a map of one cell per architecture, e.g. every variant at one
# setting on real text, where an architecture's only cell is always its own best)
AGAINST = {"arch": "the best cell of the same architecture and depth", "all": "the best cell of any architecture at that depth"}


def auto_against(cells):
    """``--against auto`` for the cells (variant, layers, warm-up, lr) of a map: "all" where some
    architecture has a single cell at a depth, since against its own best such a cell is always good
    (the depth map; every architecture at one setting), else "arch" (a learning-rate map)."""
    settings = {}
    for variant, layers, warmup, lr in cells:
        settings.setdefault((variant, layers), set()).add((warmup, lr))
    return "all" if any(len(s) == 1 for s in settings.values()) else "arch"


@dataclass(frozen=True)
class Rules:
    ratio: float = DEFAULT_RATIO
    near: float = DEFAULT_NEAR
    noise_k: float = DEFAULT_NOISE_K
    against: str = "arch"

    def __post_init__(self):
        if self.against not in AGAINST:
            raise ValueError(f"against {self.against!r}: one of {', '.join(AGAINST)}")

    def reference(self, variant, layers):
        """The key of the best cell a cell of ``variant`` at ``layers`` is judged against."""
        return (variant, layers) if self.against == "arch" else layers

    def describe(self, noise=None):
        """The two rules in words, with their numbers, as the map's outputs state them."""
        s = ("no seed-to-seed spread measured (one seed per cell): delta is the floor alone" if noise is None
             else f"s = {noise[0]:.3f} bits pooled over {noise[1]} degrees of freedom")
        return (f"Trains: no seed diverged or stopped early and the final validation loss is at most "
                f"{self.ratio:g} x the initial loss (the training loss of the first update; means over the seeds; "
                f"--ratio). Good: trains, and the mean is within delta of {AGAINST[self.against]} "
                f"(--against), delta = max({self.near:g} x best, {self.noise_k:g} x s x sqrt(1/n + 1/n_best)) "
                f"(--near, --noise-k; {s}). '?': the seeds disagree on the verdict (some good on their own, "
                f"some not).")


def trains(final, initial, diverged, ratio):
    """The "trains" rule on means: no seed diverged or stopped (``diverged`` counts both)."""
    if diverged or final is None or initial is None or not math.isfinite(final):
        return False
    return final <= ratio * initial


def threshold(best, n_best, n, rules, noise):
    """The largest mean final loss that is near ``best`` (the best mean of the architecture and depth,
    over ``n_best`` seeds) for a cell of ``n`` seeds."""
    delta = rules.near * best
    if noise is not None and n and n_best:
        delta = max(delta, rules.noise_k * noise[0] * math.sqrt(1 / n + 1 / n_best))
    return best + delta


def seeds_disagree(seed_finals, seed_initials, limit, ratio):
    """Do the seeds of a cell (final losses, None for a diverged or stopped seed) disagree on "good"
    when each is judged alone against ``limit``?"""
    alone = [f is not None and i is not None and math.isfinite(f) and f <= ratio * i and f <= limit
             for f, i in zip(seed_finals, seed_initials)]
    return len(alone) > 1 and any(alone) and not all(alone)
