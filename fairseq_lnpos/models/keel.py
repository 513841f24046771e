"""Keel (Chen & Wei 2026, "Post-LayerNorm Is Back", arXiv 2601.19895), for encoder-decoder.

Each sublayer computes ``x = LN_a(alpha * x + F(LN_b(x)))``: fairseq's Post-LN layer
(``LN_a`` is its ``*_layer_norm``) with the skip scaled by alpha and one more LayerNorm,
``LN_b``, on the branch input. The paper defines it for decoder-only stacks; here:

* alpha is the number of sublayers in the stack: 2 per encoder layer (self-attention, FFN),
  3 per decoder layer (self-attention, cross-attention, FFN); ``--keel-alpha`` overrides it.
* the first layer of each stack has no alpha (alpha = 1 for all its sublayers, the decoder's
  cross-attention included) and its self-attention has no ``LN_a``.
* LayerNorms have no bias (``--keel-ln-bias`` uses fairseq's LayerNorm with bias instead);
  weights keep fairseq's default initialisation.
"""
import logging
import math

from fairseq.models import register_model
from fairseq.modules import LayerNorm
from torch import nn

from ..errors import check
from .deepnorm import DeepNormResidual
from .sublayers import LAYER_NORMS, SublayerInputs, sublayer_names
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel

logger = logging.getLogger(__name__)


def keel_alpha(cfg, stack):
    """alpha for ``stack``: ``--keel-alpha`` if given, else the stack's number of sublayers."""
    alpha = getattr(cfg, "keel_alpha", None)
    if alpha is not None:
        check(math.isfinite(alpha) and alpha > 0, f"--keel-alpha must be a positive finite number, got {alpha}")
        return float(alpha)
    if stack == "encoder":
        return 2.0 * cfg.encoder.layers
    return (2.0 if cfg.no_cross_attention else 3.0) * cfg.decoder.layers


class KeelLayer(SublayerInputs, DeepNormResidual):
    """Turns a just-built fairseq Post-LN layer into a Keel layer."""

    def keelify(self, cfg, index, stack):
        dim = self.embed_dim

        def norm():
            return LayerNorm(dim) if getattr(cfg, "keel_ln_bias", False) else nn.LayerNorm(dim, bias=False)

        self.alpha = 1.0 if index == 0 else keel_alpha(cfg, stack)
        for name in LAYER_NORMS:  # LN_a
            if getattr(self, name, None) is not None:
                setattr(self, name, norm())
        if index == 0:
            self.self_attn_layer_norm = nn.Identity()
        # LN_b: the branch input is normalised by a forward pre-hook, so the parameter names
        # of fairseq's sublayers stay as they are (checkpoints, gradient-norm groups).
        for name in sublayer_names(self):
            setattr(self, f"{name}_branch_norm", norm())
        self.hook_sublayer_inputs()

    def sublayer_input(self, name, x):
        return getattr(self, f"{name}_branch_norm")(x)


class KeelEncoderLayer(KeelLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.keelify(cfg, index, "encoder")


class KeelDecoderLayer(KeelLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.keelify(cfg, index, "decoder")


@register_model("transformer_keel")
class KeelTransformerModel(VariantTransformerModel):
    encoder_layer_cls = KeelEncoderLayer
    decoder_layer_cls = KeelDecoderLayer

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--keel-alpha", type=float, metavar="A",
                            help="skip-path scale alpha (default: the number of sublayers in the stack)")
        parser.add_argument("--keel-ln-bias", action="store_true",
                            help="LayerNorms with bias (fairseq's LayerNorm) instead of the paper's bias-free ones")

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        logger.info("Keel %d-%d: encoder alpha %g, decoder alpha %g (first layer of each stack: 1)",
                    args.encoder_layers, args.decoder_layers,
                    model.encoder.layers[-1].alpha, model.decoder.layers[-1].alpha)
        return model
