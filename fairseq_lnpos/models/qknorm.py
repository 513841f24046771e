"""QK-norm: ``--lnpos-qk-norm`` on every plugin arch.

The queries and keys of every attention (self- and cross-attention, encoder and decoder) are
normalised right after their projection, by forward hooks on ``q_proj`` and ``k_proj``:

* ``layernorm`` / ``rmsnorm``: ``N(W_Q x)``, ``N(W_K x)``, then fairseq's ``1/sqrt(d_head)``.
  ``--lnpos-qk-norm-scope head`` (default): one norm of width d_head per projection, shared by the
  heads, on each head's slice (ViT-22B, Wortsman et al. 2023, Gemma 3, Qwen3; HybridNorm's
  ``q_norm``/``k_norm`` of ``size=d_model // n_heads``); ``width``: one norm of width d over the
  whole projection, then the split into heads (OLMo-2: allenai/OLMo ``olmo/model.py``,
  ``OLMoBlock.attention`` normalises ``q``/``k`` of width d before the ``view`` into heads).
  Weight 1 (and bias 0 for layernorm), eps 1e-5 as fairseq's LayerNorm.
* ``l2`` (Henry, Dachapally, Pawar & Chen, Findings of EMNLP 2020, "Query-Key Normalization for
  Transformers"): q and k of each head at unit l2 length, the logits ``g q̂·k̂`` with one learned
  scalar ``g`` per attention module in place of fairseq's ``1/sqrt(d_head)`` (which is set to 1),
  ``g`` initialised to ``log2(L² - L)``. As the official code (CyndxAI/QKNorm, ``QKNorm/layers.py``:
  ``ScaleUp``, a scalar ``Parameter``; ``F.normalize(p=2, dim=-1)`` of q and k after the split into
  heads; ``mha_scale`` multiplies ``bmm(q, k^T)`` and nothing else scales it), where ``L`` is the
  97.5th percentile of the training set's sequence lengths (its ``seq_len_threshold``: 72 to 79 in
  ``QKNorm/configurations.py``). ``--lnpos-qk-norm-length L`` (default 72, its en-vi recipe
  ``bash_input.txt`` / ``en2vi()``). With ``--lnpos-qk-norm-scope width`` q and k have unit length
  over all heads together.

The hooks act on the projections, so the norm is part of every path: fairseq's own attention code
(which the module is switched to: torch's fused ``F.multi_head_attention_forward``, which fairseq
takes otherwise in training and validation, reads ``q_proj.weight`` directly and would skip them),
incremental decoding (k is normalised before fairseq caches it as ``prev_key``) and the attention
diagnostics, which recompute the logits from ``q_proj``/``k_proj``. A layer class whose attention
also normalises its values (HybridNorm) sets ``normalize_values``; ``v_proj`` then gets the same norm.

The parameters live in ``<attention>.qk_norm`` (``.q.weight``, ``.k.weight``, ``.v.weight``,
``.scale``); the norms draw no random numbers, so every other parameter equals the model's without
QK-norm of the same seed. ``--lnpos-norm`` does not replace them: their kind is this option's.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import LnposError, check

QK_NORMS = ("none", "layernorm", "rmsnorm", "l2")
QK_SCOPES = ("head", "width")
DEFAULT_QK_NORM, DEFAULT_QK_SCOPE = "none", "head"
DEFAULT_QK_LENGTH = 72
EPS = 1e-5


def qk_norm_options(cfg, fixed=None, arch=None):
    """``(kind, scope, length)`` of ``--lnpos-qk-norm``, ``--lnpos-qk-norm-scope`` and
    ``--lnpos-qk-norm-length``, checked. ``fixed``: the ``(kind, scope)`` an arch turns on when the
    options are not given (``variants.Variant.qk_norm``); such an arch refuses ``none``. A scope
    without a norm and a length without l2 are refused (they would change nothing)."""
    arch = arch or getattr(cfg, "arch", None) or "this arch"
    kind = getattr(cfg, "lnpos_qk_norm", None) or (fixed[0] if fixed else DEFAULT_QK_NORM)
    check(kind in QK_NORMS, f"--lnpos-qk-norm {kind!r}: one of {', '.join(QK_NORMS)}")
    check(not fixed or kind != "none", f"--lnpos-qk-norm none: {arch} normalises q and k by definition; give "
          f"{', '.join(QK_NORMS[1:])}, or --lnpos-qk-norm none with another arch")
    scope = getattr(cfg, "lnpos_qk_norm_scope", None)
    check(scope is None or kind != "none", f"--lnpos-qk-norm-scope {scope}: there is no QK-norm (--lnpos-qk-norm "
          f"none): drop --lnpos-qk-norm-scope or give --lnpos-qk-norm")
    scope = scope or (fixed[1] if fixed else DEFAULT_QK_SCOPE)
    check(scope in QK_SCOPES, f"--lnpos-qk-norm-scope {scope!r}: one of {', '.join(QK_SCOPES)}")
    length = getattr(cfg, "lnpos_qk_norm_length", None)
    if length is None:
        return kind, scope, DEFAULT_QK_LENGTH
    check(kind == "l2", f"--lnpos-qk-norm-length {length}: only --lnpos-qk-norm l2 has a length (its scale's "
          f"initial value), {arch} normalises q and k with {kind}: drop --lnpos-qk-norm-length")
    check(length >= 2, f"--lnpos-qk-norm-length must be at least 2 (the scale starts at log2(L^2 - L)), got {length}")
    return kind, scope, length


def initial_scale(length):
    """l2's ``g`` at initialization: ``log2(L² - L)``."""
    return math.log2(length * length - length)


class QKNorm(nn.Module):
    """One normalization of a projection's output (``... x C``) over groups of ``dim`` features
    (``dim`` = d_head: per head; ``dim`` = C: the full width)."""

    def __init__(self, kind, dim):
        super().__init__()
        self.kind, self.dim = kind, dim
        if kind in ("layernorm", "rmsnorm"):
            self.weight = nn.Parameter(torch.ones(dim))
        if kind == "layernorm":
            self.bias = nn.Parameter(torch.zeros(dim))
        if kind == "rmsnorm" and not hasattr(F, "rms_norm"):
            raise LnposError(f"--lnpos-qk-norm rmsnorm needs torch >= 2.4 (torch.nn.functional.rms_norm), this is "
                             f"torch {torch.__version__}: upgrade torch or choose another --lnpos-qk-norm")

    def extra_repr(self):
        return f"{self.kind}, {self.dim}"

    def forward(self, x):
        h = x.unflatten(-1, (-1, self.dim))
        if self.kind == "layernorm":
            h = F.layer_norm(h, (self.dim,), self.weight, self.bias, EPS)
        elif self.kind == "rmsnorm":
            h = F.rms_norm(h, (self.dim,), self.weight, EPS)
        else:
            h = F.normalize(h, p=2.0, dim=-1)
        return h.flatten(-2)


class QKNormalization(nn.Module):
    """The QK-norm of one fairseq ``MultiheadAttention`` (its ``qk_norm``): norms ``q``, ``k``
    (and ``v``), l2's ``scale``, and the hooks that apply them to the projections."""

    def __init__(self, attn, kind, scope, length, values=False):
        super().__init__()
        dim = attn.head_dim if scope == "head" else attn.embed_dim
        self.q, self.k = QKNorm(kind, dim), QKNorm(kind, dim)
        self.v = QKNorm(kind, dim) if values else None
        self.scale = None
        if kind == "l2":
            self.scale = nn.Parameter(torch.tensor(initial_scale(length)))
            attn.scaling = 1.0  # the logits are scale * q̂·k̂
        # fairseq's own attention code, which calls the projections (see the module docstring)
        attn._set_skip_embed_dim_check()
        attn.q_proj.register_forward_hook(self._query)
        attn.k_proj.register_forward_hook(self._key)
        if values:
            attn.v_proj.register_forward_hook(self._value)

    def _query(self, module, args, output):
        q = self.q(output)
        return q if self.scale is None else q * self.scale

    def _key(self, module, args, output):
        return self.k(output)

    def _value(self, module, args, output):
        return self.v(output)


def add_qk_norm(attentions, cfg, values=False):
    """Give each of a just-built layer's ``attentions`` the QK-norm ``cfg`` asks for (none: nothing)."""
    kind, scope, length = qk_norm_options(cfg)
    check(not values or kind != "l2", "--lnpos-qk-norm l2: this arch normalises the values as well, which l2 "
          "does not define (Henry et al. normalise q and k only): give layernorm or rmsnorm")
    if kind == "none":
        return
    for attn in attentions:
        attn.qk_norm = QKNormalization(attn, kind, scope, length, values=values)
