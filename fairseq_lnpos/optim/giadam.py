"""`--optimizer giadam`: Adam whose second-moment estimate starts from the first squared gradient.

GI-Adam ("gradient-initialized Adam") is from Kalra & Barkeshli, "Why Warmup the Learning Rate?
Underlying Mechanisms and Improvements", NeurIPS 2024 (arXiv:2406.09405): Adam initializes its
second moment at v_0 = 0; GI-Adam sets v_0 = g_0 * g_0 (elementwise), the square of the gradient at
initialization, i.e. of the first update. Everything else is Adam's:

    v_0 = g_1^2,  m_0 = 0
    m_t = beta1 m_{t-1} + (1 - beta1) g_t,      v_t = beta2 v_{t-1} + (1 - beta2) g_t^2
    m_hat = m_t / (1 - beta1^t),                v_hat = v_t / (1 - beta2^t)
    w_t = w_{t-1} - lr (m_hat / (sqrt(v_hat) + eps) + weight_decay w_{t-1})

**Bias correction** is kept unchanged, as in the paper (only v_0 changes). Since v_0 is no longer
0, the second-moment correction 1 / (1 - beta2^t) now over-corrects: with gradients of steady
size, v_hat = g^2 / (1 - beta2^t), so the step is Adam's times sqrt(1 - beta2^t), a built-in warm-up
over about 1 / (1 - beta2) updates. The first update moves each weight by
lr * g / (|g| / sqrt(1 - beta2) + eps), sqrt(1 - beta2) times Adam's first step (0.14 x at
beta2 = 0.98). The first moment starts at 0 with its usual correction.

The optimizer is :class:`torch.optim.Adam` itself: :class:`GIAdam` only fills ``exp_avg_sq`` with
the squared gradient when Adam creates a parameter's state (its first step with a gradient), then
torch's Adam runs its own recursion. Options are fairseq's Adam's (``--adam-betas``,
``--adam-eps``, ``--weight-decay``, decoupled as fairseq's ``adam`` decouples it), so switching a run
between ``adam`` and ``giadam`` changes only ``--optimizer``. A resumed run restores the state and
is not initialized again.
"""
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from .checks import optimizer_options


class GIAdam(torch.optim.Adam):
    """:class:`torch.optim.Adam` with v_0 = g_1^2 (Kalra & Barkeshli 2024); see the module's text.
    ``amsgrad`` and the fused kernel are not offered."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=True):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         decoupled_weight_decay=decoupled_weight_decay, amsgrad=False, fused=False)

    def _init_group(self, group, *args, **kwargs):
        new = [p for p in group["params"] if p.grad is not None and len(self.state[p]) == 0]
        result = super()._init_group(group, *args, **kwargs)  # creates the state of `new` (zeros)
        for p in new:
            grad = p.grad.detach()
            self.state[p]["exp_avg_sq"].copy_(grad.abs().square() if grad.is_complex() else grad.square())
        return result


@dataclass
class GIAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default="(0.9, 0.999)", metadata={"help": "betas for GI-Adam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for GI-Adam"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay (decoupled, as fairseq's adam)"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("giadam", dataclass=GIAdamConfig)
class FairseqGIAdam(FairseqOptimizer):
    def __init__(self, cfg: GIAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = GIAdam(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        return optimizer_options(self.cfg)  # every option checked (checks.py), as radam's

    @property
    def supports_flat_params(self):
        return True

