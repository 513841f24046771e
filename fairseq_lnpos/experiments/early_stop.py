"""Early stopping of hopeless runs (sweeps; ``grid.sh sweep --no-early-stop`` turns it off).

A run is stopped at update u, and recorded as ``stopped early at update u: WHY`` (its own outcome,
never "finished"), when its training loss has stalled well above what a run that trains reaches:

- u is at least :attr:`StopRule.after` of the budget (``--max-update``), so that slow starters are
  not judged before they could have started;
- the mean training loss of the last ``window`` updates is above :attr:`StopRule.ratio` times the
  first logged loss, and
- it fell by less than :attr:`StopRule.progress` times the first loss from the ``window`` updates
  before (a stalled run no longer moves; a slow one still does).

- the budget is at least :attr:`StopRule.min_budget` updates (200): the rule was chosen and held out on
  budgets of 200 updates and more, and on a shorter one its windows (10 % of the budget) hold a few noisy
  batches each and it judges runs in their first tens of updates, where a run that goes on to learn can
  still be flat. Below it the rule stays off (:meth:`StopRule.off_reason` says why; the sweep prints it).

A run that diverges is stopped by the grid's other rules (a non-finite loss; ``--patience``). The
defaults (``after`` 0.3, ``ratio`` 0.6) are the rule that ``python scripts/tools/early_stop_replay.py
--scan`` chose on the full-length runs of one all-architecture map and scored on 653 runs of four
other sweeps it was not chosen on, where it stopped 3 runs that went on to train: one of 570 at width 128
and two of 69 on real text after one epoch (docs/results/early-stopping/index.md; tests/test_early_stop.py
holds the two together). The same
command replays any rule over a folder of runs made without it and reports what it would have
stopped, when, and what it would have saved.
"""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    after: float = 0.3      # no run is judged before this fraction of its budget
    ratio: float = 0.6      # stalled: the recent mean training loss above ratio x the first loss ...
    progress: float = 0.02  # ... that fell by less than progress x the first loss over the last window
    window: float = 0.1     # the window, a fraction of the budget (at least 5 updates)
    min_budget: int = 200   # off below this budget in updates: the shortest the rule was chosen and held out on

    def off_reason(self, budget):
        """Why the rule does not judge runs of ``budget`` updates (None when it does)."""
        if budget and budget < self.min_budget:
            return (f"early stopping is off for a budget of {budget} updates: the rule judges runs from "
                    f"{self.min_budget} updates on, the shortest budget it was chosen and checked on "
                    f"(docs/results/early-stopping/index.md); every run trains to its budget")
        return None

    def check(self, losses, budget):
        """``(update, why)`` when the run whose logged training losses are ``losses`` ((update, loss)
        pairs in order, finite losses only) should stop at its last logged update, else None."""
        if not losses or not budget or budget < self.min_budget:
            return None
        u, first = losses[-1][0], losses[0][1]
        width = max(5, round(self.window * budget))
        if u < self.after * budget or u < 2 * width or not first > 0:
            return None
        recent, before = [], []
        for v, loss in reversed(losses):  # the last two windows only: a check costs O(window), not O(run)
            if v <= u - 2 * width:
                break
            if v <= u:
                (recent if v > u - width else before).append(loss)
        if not recent or not before:
            return None
        now, then = sum(recent) / len(recent), sum(before) / len(before)
        if now > self.ratio * first and then - now < self.progress * first:
            return u, (f"training loss stalled at {now:.2f} bits ({now / first:.2f} x its first {first:.2f}; "
                       f"{then - now:+.2f} over the last {width} updates) at {u / budget:.0%} of the budget")
        return None


DEFAULT_RULE = StopRule()


def first_stop(losses, budget, rule=DEFAULT_RULE):
    """Replay ``rule`` over a whole curve: the first ``(update, why)`` at which it stops, or None."""
    finite = [(u, x) for u, x in losses if x is not None and math.isfinite(x)]
    for i in range(1, len(finite) + 1):
        hit = rule.check(finite[:i], budget)
        if hit:
            return hit
    return None
