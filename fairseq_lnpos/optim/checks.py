"""The one check of the plugin's optimizers' options (``--optimizer radam``, ``giadam``).

:data:`OPTIONS` names each option the optimizers take and the numbers it may be; :func:`optimizer_options`
reads a fairseq config through it: finite numbers only (an infinite ``--adam-eps`` makes every step
nearly 0, an infinite ``--weight-decay`` every weight NaN, and training goes on with exit 0),
``--adam-betas`` two numbers in [0, 1). A value outside is an
:class:`~fairseq_lnpos.errors.LnposError` naming the option, one line in fairseq's commands.
"""
import ast

from omegaconf import OmegaConf

from ..cli import Range
from ..errors import check

# config field -> (the option, the numbers it takes: Range refuses inf and nan as well)
OPTIONS = {
    "lr": ("--lr", Range(0, low_open=True)),
    "adam_eps": ("--adam-eps", Range(0, low_open=True)),
    "weight_decay": ("--weight-decay", Range(0)),
}


def parse_betas(betas):
    """``--adam-betas``: two numbers in [0, 1), given as the text ``(b1, b2)`` or a list."""
    if isinstance(betas, str):
        try:
            betas = ast.literal_eval(betas)
        except (ValueError, SyntaxError):
            betas = None
    elif betas is not None and not isinstance(betas, (tuple, list)):
        betas = OmegaConf.to_container(betas)
    ok = (
        isinstance(betas, (tuple, list))
        and len(betas) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)
    )
    check(ok, f"--adam-betas must be two numbers in [0, 1) such as '(0.9, 0.98)', got {betas!r}")
    return tuple(float(b) for b in betas)


def first_lr(lr):
    """fairseq's ``--lr`` is a list (one value per epoch); an optimizer starts from the first."""
    return lr[0] if isinstance(lr, (list, tuple)) or OmegaConf.is_list(lr) else lr


def optimizer_options(cfg):
    """{lr, betas, eps, weight_decay} of an optimizer's fairseq config ``cfg``, every value checked
    (:data:`OPTIONS`, :func:`parse_betas`)."""
    values = {"lr": first_lr(cfg.lr), "adam_eps": cfg.adam_eps, "weight_decay": cfg.weight_decay}
    for field, value in values.items():
        option, numbers = OPTIONS[field]
        check(isinstance(value, (int, float)) and not isinstance(value, bool), f"{option} must be a number, got {value!r}")
        numbers.check(option, value)
    return {"lr": values["lr"], "betas": parse_betas(cfg.adam_betas), "eps": values["adam_eps"],
            "weight_decay": values["weight_decay"]}
