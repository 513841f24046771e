"""`--optimizer radam`: fairseq's optimizer wrapper around :class:`torch.optim.RAdam`.

Takes Adam's option names (``--adam-betas``, ``--adam-eps``) so that switching a run between
``adam`` and ``radam`` changes only ``--optimizer``. Works under fairseq's ``--fp16``/``--bf16``
(FP16Optimizer keeps fp32 master weights); ``--memory-efficient-fp16`` is refused by fairseq
because torch's RAdam keeps its state in the parameters' dtype.
"""
import inspect
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from ..errors import check
from .checks import optimizer_options


@dataclass
class RAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default="(0.9, 0.999)", metadata={"help": "betas for RAdam"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for RAdam"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    decoupled_weight_decay: bool = field(
        default=False, metadata={"help": "AdamW-style decoupled weight decay (torch.optim.RAdam)"}
    )
    lr: List[float] = II("optimization.lr")


def supports_decoupled_weight_decay():
    return "decoupled_weight_decay" in inspect.signature(torch.optim.RAdam.__init__).parameters


@register_optimizer("radam", dataclass=RAdamConfig)
class FairseqRAdam(FairseqOptimizer):
    def __init__(self, cfg: RAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = torch.optim.RAdam(params, **self.optimizer_config)

    @property
    def optimizer_config(self):
        config = optimizer_options(self.cfg)  # every option checked (checks.py)
        if self.cfg.decoupled_weight_decay:  # older torch releases' RAdam lacks the option
            check(supports_decoupled_weight_decay(),
                  f"--decoupled-weight-decay: the RAdam of torch {torch.__version__} has no decoupled weight "
                  "decay; upgrade torch or drop the flag")
            config["decoupled_weight_decay"] = True
        return config

    @property
    def supports_flat_params(self):
        return True
