"""Mix-LN (Li, Yin & Liu 2024, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN
and Post-LN", arXiv 2412.13795), as in its official code (pixeli99/MixLN,
``peft_pretraining/modeling_llama.py``, ``NORM_TYPE=post_pre``).

The first ``floor(alpha L)`` layers of a stack of ``L`` layers are Post-LN (``x = LN(x + F(x))``),
the others Pre-LN (``x = x + F(LN(x))``), and the stack ends with a final LayerNorm. Each layer is
fairseq's own layer with its ``normalize_before`` set by its index; the final LayerNorm is
fairseq's Pre-LN one. alpha is ``--mixln-post-ratio`` (default 0.25, the paper's; the official
scripts pass the count, ``POST_NUM``: 3 of 12 and 6 of 24 layers in the README's examples).

From the official code, where the paper is silent: the final norm is there whatever alpha
(``LlamaModel.norm``, applied after the last layer for every ``NORM_TYPE``); the Post-LN layers
are plain Post-LN (``post_attention_layernorm`` and ``post_feedforward_layernorm`` after each
residual add), with no extra scaling. Its LLaMA initialisation (normal, std 0.02) is the trainer's
for every norm type, not Mix-LN's: here fairseq's, as for Post-LN and Pre-LN.

For an encoder-decoder: each stack counts its own layers, so the first ``floor(alpha N)`` encoder
layers and the first ``floor(alpha M)`` decoder layers are Post-LN (all sublayers of a decoder
layer, cross-attention included, share the layer's placement). A stack left with no Post-LN layer (alpha 0, or
``floor(0.25 x 2) = 0``: fairseq's Pre-LN, parameter for parameter) or no Pre-LN layer is another
variant, and refused at build time (:meth:`MixLNTransformerModel.same_as_another`).
"""
import logging
import math

from fairseq.models import register_model

from ..errors import check
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel

logger = logging.getLogger(__name__)

DEFAULT_POST_RATIO = 0.25


def post_ratio(cfg):
    """``--mixln-post-ratio``, checked."""
    ratio = getattr(cfg, "mixln_post_ratio", None)
    ratio = DEFAULT_POST_RATIO if ratio is None else ratio
    check(0 <= ratio <= 1, f"--mixln-post-ratio must be between 0 and 1, got {ratio}")
    return ratio


def post_ln_layers(cfg, layers):
    """How many of a stack's ``layers`` (the first ones) are Post-LN."""
    return math.floor(post_ratio(cfg) * layers + 1e-9)  # 1e-9: 0.29 * 100 is 28.999999999999996


class MixLNEncoderLayer(EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.normalize_before = index >= post_ln_layers(cfg, cfg.encoder.layers)


class MixLNDecoderLayer(DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.normalize_before = index >= post_ln_layers(cfg, cfg.decoder.layers)


@register_model("transformer_mixln")
class MixLNTransformerModel(VariantTransformerModel):
    """fairseq's Pre-LN model (the arch sets ``--*-normalize-before``) whose first layers are Post-LN."""

    encoder_layer_cls = MixLNEncoderLayer
    decoder_layer_cls = MixLNDecoderLayer

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--mixln-post-ratio", type=float, default=DEFAULT_POST_RATIO, metavar="A",
                            help="share of each stack's layers, from the first, that are Post-LN: "
                                 "floor(A x layers) (default 0.25)")

    @classmethod
    def same_as_another(cls, args):
        for side in ("encoder", "decoder"):
            layers = getattr(args, f"{side}_layers")
            post = post_ln_layers(args, layers)
            if post in (0, layers):
                kind, other = ("Post-LN", "Pre-LN") if post == 0 else ("Pre-LN", "Post-LN with a final LayerNorm")
                return (f"--mixln-post-ratio {post_ratio(args):g} makes {post} of the {layers} {side} layers "
                        f"Post-LN, so that stack has no {kind} layer and is {other}, not Mix-LN: give a ratio "
                        f"that leaves both kinds in every stack, or more layers")
        return None

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        logger.info("Mix-LN %d-%d: Post-LN layers %d of %d (encoder), %d of %d (decoder), the rest Pre-LN",
                    args.encoder_layers, args.decoder_layers,
                    sum(not layer.normalize_before for layer in model.encoder.layers), args.encoder_layers,
                    sum(not layer.normalize_before for layer in model.decoder.layers), args.decoder_layers)
        return model
