"""ResiDual (Xie, Zhang, Guo, Tan, Bian, Awadalla, Menezes, Qin & Yan 2023, "ResiDual: Transformer
with Dual Residual Connections", arXiv 2304.14802), as in its official code (microsoft/ResiDual, a
fairseq 0.12.2 plugin: ``resi_dual/resi_dual_layers.py``, ``resi_dual/resi_dual.py``,
``hydra_config/*.yaml``).

Two streams run through each stack. Every sublayer ``F`` (with fairseq's dropout) reads the Post-LN
stream and its output is added to both::

    x_post = LN(x_post + F(x_post))        x_dual = x_dual + s * F(x_post)
    stack output: x_post_N + LN_dual(x_dual_N)

Details from the official code, where the paper is silent:

* Both streams start from the embeddings: ``res = x * scale`` with ``x`` fairseq's embedding
  output (positions added, ``--layernorm-embedding`` if on, dropout, padded source positions zeroed)
  - ``ResiDualEncoder.forward_scriptable`` and ``ResiDualDecoder.extract_features_scriptable`` in
  ``resi_dual.py``. So ``x_dual_N = s * (embedding + the sum of every sublayer's output)``.
* What the dual stream receives is the sublayer's output after fairseq's dropout, the same tensor
  the Post-LN residual adds (``res = res + x * cfg.enc_res_input_norm_scale`` right after
  ``x = self.dropout_module(x)``, ``ResiDualEncoderLayer.forward`` in ``resi_dual_layers.py``).
* The decoder does the same over its three sublayers: the cross-attention's output enters the dual
  stream too (``ResiDualDecoderLayer.forward``).
* ``LN_dual`` is a new LayerNorm per stack with eps 1e-7 (fairseq's default is 1e-5), weight 1,
  bias 0, put where fairseq's final Pre-LN LayerNorm sits (``self.layer_norm`` of both classes in
  ``resi_dual.py``). The output is ``x * alpha + LN_dual(res)`` there, ``alpha``
  (``enc_alpha``/``dec_alpha`` of ``ResiDualConfig``) 1 by default and in every config: fixed at 1
  here. Its configs set ``normalize_before: true``, which its layers ignore: their stream is Post-LN.
* The half-precision scale ``s`` (``enc_res_input_norm_scale``/``dec_res_input_norm_scale`` of
  ``ResiDualConfig``, default 1) multiplies the embeddings that start the dual stream and every
  sublayer output added to it; ``hydra_config/opus.yaml``, the one config trained with
  ``fp16``/``memory_efficient_fp16``, sets 0.05; ``iwslt.yaml`` (fp32) 1.0, ``wmt.yaml`` (``amp``)
  the default 1. The dual stream is never normalised until the end, so it grows with depth and can
  pass fp16's largest value (65504); ``LN_dual(s x) = LN_dual(x)`` up to eps, so ``s`` changes
  the magnitude only. Here ``--residual-dual-scale S``; by default 0.05 under fairseq's ``--fp16``
  or ``--memory-efficient-fp16`` and 1 otherwise (``--amp`` included), as those configs.
* Initialisation: fairseq's for every weight (the official code changes none).

How the dual stream crosses layers with fairseq's own encoder and decoder: it is the layer's second
stream (``sublayers.SecondStream``): between layers the two streams travel side by side in one tensor,
``[x_post, x_dual]`` along the feature axis (width 2d), and a layer given the embeddings (width d)
starts ``x_dual = s * x``. The layer runs fairseq's Post-LN forward on ``x_post``; its
``residual_connection`` also adds ``s * F`` to ``x_dual``. The stack's ``layer_norm`` slot, which fairseq applies after the last
layer, holds :class:`DualStreamOutput` (``x_post + LN_dual(x_dual)``, width d again). Hence
fairseq's embeddings, loops, generation and ``--checkpoint-activations`` (a layer's input and output
are plain tensors that carry the dual stream, so gradients flow through it when the layer is
recomputed) work unchanged; the dual stream is computed per position, so incremental decoding gives
each new position its own from that position only, as the full forward does. Parameter names are
fairseq's plus ``{encoder,decoder}.layer_norm.norm.*``, and ``--lnpos-norm`` replaces ``LN_dual``
too. fairseq's ``encoder_states``/``inner_states`` of the layers are the 2d-wide tensors.
"""
import logging
import math

from fairseq.models import register_model
from fairseq.modules import LayerNorm
import torch
from torch import nn

from ..errors import check
from .sublayers import SecondStream, split_streams
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel

logger = logging.getLogger(__name__)

DUAL_NORM_EPS = 1e-7
HALF_PRECISION_SCALE = 0.05


def dual_scale(cfg):
    """``s``: ``--residual-dual-scale``, else 0.05 under ``--fp16``/``--memory-efficient-fp16``, else 1."""
    scale = getattr(cfg, "residual_dual_scale", None)
    if scale is None:
        half = getattr(cfg, "fp16", False) or getattr(cfg, "memory_efficient_fp16", False)
        return HALF_PRECISION_SCALE if half else 1.0
    check(0 < scale < math.inf, f"--residual-dual-scale must be a positive number, got {scale}")
    return scale


class DualStreamOutput(nn.Module):
    """``x_post + LN_dual(x_dual)`` after a stack's last layer."""

    def __init__(self, dim, scale, export=False):
        super().__init__()
        self.dim, self.scale = dim, scale
        self.norm = LayerNorm(dim, eps=DUAL_NORM_EPS, export=export)

    def forward(self, x):
        post, dual = split_streams(x, self.dim, self.scale)
        return post + self.norm(dual)


class ResiDualLayer(SecondStream):
    """fairseq's Post-LN layer on ``x_post``, adding each sublayer's output to ``x_dual`` (the second
    stream, scaled by ``s``) too."""

    side = None  # "encoder" or "decoder"

    @property
    def dual(self):  # x_dual during the layer's forward
        return self.stream

    @property
    def dual_scale(self):
        return self.stream_scale

    @classmethod
    def build_stack_output(cls, cfg):
        return DualStreamOutput(getattr(cfg, cls.side).embed_dim, dual_scale(cfg), export=cfg.export)

    def residual_connection(self, x, residual):  # fairseq: residual + x
        self.stream = torch.add(self.stream, x, alpha=self.stream_scale)
        return residual + x


class ResiDualEncoderLayer(ResiDualLayer, EncoderLayer):
    side = "encoder"

    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.stream_scale = dual_scale(cfg)


class ResiDualDecoderLayer(ResiDualLayer, DecoderLayer):
    side = "decoder"

    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.stream_scale = dual_scale(cfg)


@register_model("transformer_residual")
class ResiDualTransformerModel(VariantTransformerModel):
    """fairseq's Post-LN model (the arch unsets ``--*-normalize-before``) with a dual stream per stack."""

    encoder_layer_cls = ResiDualEncoderLayer
    decoder_layer_cls = ResiDualDecoderLayer

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--residual-dual-scale", type=float, metavar="S",
                            help="factor of the dual stream (the embeddings and every sublayer output "
                                 "added to it); it keeps the stream inside fp16's range and leaves the "
                                 "output unchanged (default 0.05 with --fp16 or --memory-efficient-fp16, "
                                 "1 otherwise)")

    @classmethod
    def coefficients(cls, args):
        return f"ResiDual {args.encoder_layers}-{args.decoder_layers}: dual stream scaled by {dual_scale(args):g}"
