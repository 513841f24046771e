"""LayerNorm Scaling (Sun, Song, Li, Yin, Zheng & Liu 2025, "The Curse of Depth in Large Language
Models", arXiv 2502.05795), as in its official code (lmsdss/LayerNorm-Scaling,
``peft_pretraining/modeling_llama.py``, ``NORM_TYPE=LNS``).

fairseq's Pre-LN layer with the output of each sublayer's LayerNorm scaled by ``1/sqrt(l)``, ``l``
the layer's index in its stack counted from 1: ``x = x + F(LN(x) / sqrt(l))``; the final LayerNorm
of each stack is fairseq's and unscaled (the official ``LlamaModel.norm``). The scale is applied by
a forward pre-hook on the sublayer (``models/sublayers.py``), so ``--lnpos-norm`` keeps it.

From the official code, where the paper is silent: both sublayers of a layer use the same
``1/sqrt(l)`` (the code computes ``1 / math.sqrt(self.layer_index + 1)`` before the attention and
before the MLP); the scale is a constant, not learned. Initialisation: fairseq's, which is not
depth-scaled (the official README advises against combining LayerNorm Scaling with a scaled
initialisation).

For an encoder-decoder: each stack counts its own layers (encoder layer l and decoder layer l
have the same scale); in a decoder layer the cross-attention's query (its LayerNorm's output) is
scaled like the other sublayers' inputs, its keys and values (the encoder's output, after the
encoder's final LayerNorm) are not.
"""
import math

from fairseq.models import register_model

from .sublayers import SublayerInputs
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


class LNScalingLayer(SublayerInputs):
    def scale_norms(self, index):
        self.ln_scale = 1 / math.sqrt(index + 1)
        self.hook_sublayer_inputs()

    def sublayer_input(self, name, x):
        return x * self.ln_scale


class LNScalingEncoderLayer(LNScalingLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.scale_norms(index)


class LNScalingDecoderLayer(LNScalingLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.scale_norms(index)


@register_model("transformer_lnscaling")
class LNScalingTransformerModel(VariantTransformerModel):
    """fairseq's Pre-LN model (the arch sets ``--*-normalize-before``) with scaled LayerNorm outputs."""

    encoder_layer_cls = LNScalingEncoderLayer
    decoder_layer_cls = LNScalingDecoderLayer

    @classmethod
    def same_as_another(cls, args):
        side = cls.one_layer_stack(args)
        return None if side is None else (f"one {side} layer is scaled by 1/sqrt(1) = 1, so that stack is Pre-LN, "
                                          f"not LN-Scaling: give at least 2 layers, or use a Pre-LN arch")
