"""What the normalization is: ``--lnpos-norm`` on every plugin arch.

Every LayerNorm a model uses (each sublayer's, a Pre-LN stack's final one, ``--layernorm-embedding``,
Keel's branch and bias-free ones) is replaced, after fairseq built the encoder or decoder, by

* ``layernorm`` (default): left as it is.
* ``rmsnorm``: ``torch.nn.RMSNorm`` (``x / sqrt(mean(x^2) + eps) * g``, no bias), with the eps of the
  LayerNorm it replaces (fairseq's: 1e-5). ``torch.nn.RMSNorm`` exists from torch 2.4 on; on an
  older torch the option is refused with one line.
* ``dyt``: Dynamic Tanh (Zhu, Chen, He, LeCun & Liu, CVPR 2025, "Transformers without
  Normalization"): ``weight * tanh(alpha * x) + bias``, ``alpha`` one learned scalar per module
  initialised to ``--lnpos-norm-alpha`` (default 0.5, the paper's default and
  jiachenzhu/DyT ``dynamic_tanh.py``'s ``alpha_init_value``), ``weight`` 1, ``bias`` 0. The paper
  finds 0.5 right for most non-LLM models; for LLMs it tunes alpha by width and position (its LLaMA
  recipes, ``other_tasks/LLaMA/README.md``: a larger alpha for the norms before attention than for
  those before the FFN and the final one, e.g. 0.8 / 0.2 at 7B) - not done here, one alpha for all.
* ``scalenorm``: ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears"):
  ``g * x / max(||x||, eps)``, ``g`` one learned scalar initialised to sqrt(d), eps 1e-5, as
  tnq177/transformers_without_tears ``layers.py`` (``ScaleNorm``).
* ``derf``: Dynamic erf (arXiv 2512.10938): ``weight * erf(alpha * x + shift) + bias``, learned
  scalars ``alpha`` (initial ``--lnpos-norm-alpha``, 0.5) and ``shift`` (0), as the ``Derf`` class of
  lucidrains/x-transformers (``x_transformers/x_transformers.py``, without its ``unit_offset``).

The replacement keeps the module's name, so its parameters keep theirs (``...final_layer_norm.weight``)
and checkpoints of one normalization reload into a model of the same one. Nothing else of the
model changes: with ``layernorm`` the model is the one fairseq builds, parameter for parameter.
"""
import torch
from torch import nn

from ..cli import Range
from ..errors import LnposError, check

NORMS = ("layernorm", "rmsnorm", "dyt", "derf", "scalenorm")
DEFAULT_NORM = "layernorm"
DEFAULT_ALPHA = 0.5
ALPHA_NORMS = ("dyt", "derf")  # the normalizations that have an alpha
# up to half precision's largest number: the parameter fits float32 and --fp16 alike
ALPHA_RANGE = Range(0, float(torch.finfo(torch.float16).max), low_open=True, high_open=False)


def norm_options(cfg, fixed=None, arch=None):
    """``(kind, alpha)`` of ``--lnpos-norm`` and ``--lnpos-norm-alpha``, checked: an arch that
    ``fixed`` its normalization refuses another ``--lnpos-norm``, an alpha is in :data:`ALPHA_RANGE`
    and refused where the normalization has none (it would change nothing)."""
    arch = arch or getattr(cfg, "arch", None) or "this arch"
    kind = getattr(cfg, "lnpos_norm", None) or DEFAULT_NORM
    check(kind in NORMS, f"--lnpos-norm {kind!r}: one of {', '.join(NORMS)}")
    check(fixed is None or kind in (DEFAULT_NORM, fixed),
          f"--lnpos-norm {kind}: {arch} has its own normalization ({fixed}), which the option would not "
          f"change: drop --lnpos-norm, or give it with a Pre-LN arch")
    kind = fixed or kind
    alpha = getattr(cfg, "lnpos_norm_alpha", None)
    if alpha is None:
        return kind, DEFAULT_ALPHA
    check(kind in ALPHA_NORMS, f"--lnpos-norm-alpha {alpha:g}: {arch} normalizes with {kind}, which has no alpha "
          f"(only {' and '.join(ALPHA_NORMS)} have one): drop --lnpos-norm-alpha")
    return kind, ALPHA_RANGE.check("--lnpos-norm-alpha", alpha)


class DyT(nn.Module):
    def __init__(self, dim, alpha=DEFAULT_ALPHA):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return torch.addcmul(self.bias, torch.tanh(self.alpha * x), self.weight)


class Derf(nn.Module):
    def __init__(self, dim, alpha=DEFAULT_ALPHA):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha)))
        self.shift = nn.Parameter(torch.zeros(1))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return torch.addcmul(self.bias, torch.erf(torch.addcmul(self.shift, self.alpha, x)), self.weight)


class ScaleNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.full((1,), float(dim) ** 0.5))  # the scalar g
        self.eps = eps

    def forward(self, x):
        return x * (self.weight / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps))


def is_layer_norm(module):
    """torch's LayerNorm (what fairseq's ``LayerNorm`` returns on a CPU) or fairseq's fused one."""
    return isinstance(module, nn.LayerNorm) or type(module).__name__ == "FusedLayerNorm"


def build_norm(kind, ln, alpha):
    """The ``kind`` module that replaces the LayerNorm ``ln``."""
    (dim,) = ln.normalized_shape
    if kind == "rmsnorm":
        if not hasattr(nn, "RMSNorm"):
            raise LnposError(f"--lnpos-norm rmsnorm needs torch >= 2.4 (torch.nn.RMSNorm), this is torch "
                             f"{torch.__version__}: upgrade torch or choose another --lnpos-norm")
        return nn.RMSNorm(dim, eps=ln.eps)
    if kind == "scalenorm":
        return ScaleNorm(dim)
    return {"dyt": DyT, "derf": Derf}[kind](dim, alpha)


def replace_norms(module, cfg):
    """Replace every LayerNorm inside ``module`` as ``cfg.lnpos_norm`` says; returns how many."""
    kind, alpha = norm_options(cfg)
    if kind == DEFAULT_NORM:
        return 0
    found = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if is_layer_norm(child)]
    for parent, name, child in found:
        setattr(parent, name, build_norm(kind, child, alpha))
    return len(found)
