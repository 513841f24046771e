"""The learning-rate schedules of Xiong et al. (2020) that fairseq lacks or gets subtly wrong.

* ``warmup_inverse_sqrt``: lr(t) = lr_max * min(t / T, 1) * min(1, sqrt(A / t)) for update t:
  linear warm-up over T updates (the first update already runs at lr_max / T, unlike fairseq's
  ``inverse_sqrt`` whose first update runs at ``--warmup-init-lr``, 0 by default), constant
  lr_max up to update A = ``--decay-anchor`` (default T), then inverse-square-root decay.
  T = 0 or 1 means no warm-up. With the default A = T this is fairseq's ``inverse_sqrt``
  shifted by one update; a fixed A (e.g. 4000 for every run) gives runs with different T the
  same decay, so that they differ only in the warm-up.
* ``step_decay``: lr_max until epoch K, lr_max * factor from epoch K on (the Pre-LN recipe:
  "x0.1 at the 8th epoch"); with ``--inverse-sqrt-after-decay`` it then decays as
  lr_max * factor * sqrt(U_K / t), U_K being the update count when epoch K began (WMT recipe).
* ``inverse_sqrt_nowarmup``: lr_max * sqrt(A / (A + n)) after n updates, A = ``--decay-period``:
  T-Fixup's schedule (layer6ai-labs/T-Fixup, ``fairseq/optim/lr_scheduler/inverse_sqrt_nowarmup_schedule.py``,
  the same name and option), which none of fairseq's own schedules gives.
* Linear decay to 0 (RAdam's recipe) is fairseq's own ``polynomial_decay --power 1
  --end-learning-rate 0 --warmup-updates 0 --total-num-update N``: no new code.

fairseq calls ``step_update(n)`` after update n (and with n = 0 before the first), so
``step_update(n)`` sets the rate of update n + 1.
"""
import math
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II

from ..errors import check


def _lr_max(cfg):
    lr = cfg.lr
    if not isinstance(lr, (int, float)):
        check(len(lr) == 1, f"this scheduler takes one --lr value, got {list(lr)}")
        lr = lr[0]
    check(lr > 0 and math.isfinite(lr), f"--lr must be a positive number, got {lr}")
    return float(lr)


def warmup_inverse_sqrt(update, lr_max, warmup, anchor=None):
    """The rate of update ``update`` (1-based)."""
    warmup = max(warmup, 1)
    anchor = warmup if anchor is None else anchor
    return lr_max * min(update / warmup, 1.0) * min(1.0, math.sqrt(anchor / update))


@dataclass
class WarmupInverseSqrtConfig(FairseqDataclass):
    warmup_updates: int = field(default=4000, metadata={"help": "linear warm-up updates T (0 or 1: none)"})
    decay_anchor: Optional[int] = field(
        default=None, metadata={"help": "decay as lr_max * sqrt(A / t) after update A (default: T)"}
    )
    lr: List[float] = II("optimization.lr")


class UpdateSchedule(FairseqLRScheduler):
    """A rate that depends on the update count alone: ``rate(n)`` for the update after n updates."""

    def __init__(self, cfg, optimizer):
        super().__init__(cfg, optimizer)
        self.lr_max = _lr_max(cfg)
        self.step_update(0)

    def step_update(self, num_updates):
        lr = self.rate(num_updates)
        self.optimizer.set_lr(lr)
        return lr


@register_lr_scheduler("warmup_inverse_sqrt", dataclass=WarmupInverseSqrtConfig)
class WarmupInverseSqrtSchedule(UpdateSchedule):
    def __init__(self, cfg, optimizer):
        check(cfg.warmup_updates >= 0, f"--warmup-updates must be >= 0, got {cfg.warmup_updates}")
        check(cfg.decay_anchor is None or cfg.decay_anchor >= 1,
              f"--decay-anchor must be >= 1, got {cfg.decay_anchor}")
        super().__init__(cfg, optimizer)

    def rate(self, num_updates):
        return warmup_inverse_sqrt(num_updates + 1, self.lr_max, self.cfg.warmup_updates, self.cfg.decay_anchor)


@dataclass
class StepDecayConfig(FairseqDataclass):
    decay_epoch: int = field(default=8, metadata={"help": "first epoch (1-based) run at the decayed rate"})
    decay_factor: float = field(default=0.1, metadata={"help": "multiply the rate by this at --decay-epoch"})
    inverse_sqrt_after_decay: bool = field(
        default=False, metadata={"help": "after the step, decay as 1/sqrt(update) (Pre-LN WMT recipe)"}
    )
    lr: List[float] = II("optimization.lr")


@register_lr_scheduler("step_decay", dataclass=StepDecayConfig)
class StepDecaySchedule(FairseqLRScheduler):
    def __init__(self, cfg, optimizer):
        super().__init__(cfg, optimizer)
        check(cfg.decay_epoch >= 1, f"--decay-epoch must be >= 1, got {cfg.decay_epoch}")
        check(0 < cfg.decay_factor <= 1, f"--decay-factor must be in (0, 1], got {cfg.decay_factor}")
        self.lr_max = _lr_max(cfg)
        self.decayed_at_update = None  # U_K, restored from the checkpoint on resume
        self._num_updates = 0
        self.optimizer.set_lr(self.lr_max)

    def state_dict(self):
        return {"best": self.best, "decayed_at_update": self.decayed_at_update}

    def load_state_dict(self, state_dict):
        self.best = state_dict.get("best")
        self.decayed_at_update = state_dict.get("decayed_at_update")

    def _lr(self, num_updates):
        if self.decayed_at_update is None:
            return self.lr_max
        lr = self.lr_max * self.cfg.decay_factor
        if self.cfg.inverse_sqrt_after_decay and num_updates > self.decayed_at_update > 0:
            lr *= math.sqrt(self.decayed_at_update / num_updates)
        return lr

    def step_begin_epoch(self, epoch):
        if epoch >= self.cfg.decay_epoch and self.decayed_at_update is None:
            self.decayed_at_update = self._num_updates
        self.optimizer.set_lr(self._lr(self._num_updates + 1))
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        self._num_updates = num_updates
        lr = self._lr(num_updates + 1)
        self.optimizer.set_lr(lr)
        return lr


@dataclass
class InverseSqrtNoWarmupConfig(FairseqDataclass):
    decay_period: int = field(default=4000, metadata={"help": "A in lr * sqrt(A / (A + updates))"})
    lr: List[float] = II("optimization.lr")


@register_lr_scheduler("inverse_sqrt_nowarmup", dataclass=InverseSqrtNoWarmupConfig)
class InverseSqrtNoWarmupSchedule(UpdateSchedule):
    def __init__(self, cfg, optimizer):
        check(cfg.decay_period >= 1, f"--decay-period must be >= 1, got {cfg.decay_period}")
        super().__init__(cfg, optimizer)

    def rate(self, num_updates):
        return self.lr_max * math.sqrt(self.cfg.decay_period / (self.cfg.decay_period + num_updates))
