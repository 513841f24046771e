"""HybridNorm and HybridNorm* (Zhuo, Zeng, Wang, Zhang, Yang, Li, Zhou & Ma 2025, "HybridNorm: Towards
Stable and Efficient Transformer Training via Hybrid Normalization", arXiv 2503.04598), as in the
official code (BryceZhuo/HybridNorm, ``dense_model/olmo/model.py``: ``OLMoSequentialBlock.forward``
and ``OLMoBlock.attention`` with ``dense_model/configs/exps/1.2B-dense-HybriedNorm.yaml``:
``attn_norm: false``, ``use_query_norm``/``use_key_norm``/``use_value_norm: true``,
``ffn_norm: true``, ``ffn_residual_after_norm: true``)::

    y = x + Attn(QKV-Norm(x))          q, k and v normalised per head, no norm on the input
    x' = N(y) + FFN(N(y))              the FFN's residual taken after its norm

and a final norm per stack (``ln_f``). HybridNorm* (the README's
``norm_pos_special_config="_{0:{'attn_norm':True,'ffn_residual':False}}_"``) makes block 0 Pre-Norm:
``y = x + Attn(QKV-Norm(N_a(x)))``, ``x' = y + FFN(N_f(y))``, with its q, k, v still normalised.

Written with fairseq's layers: ``N(y) + FFN(N(y))`` after ``y = x + Attn(x)`` is fairseq's Post-LN
layer whose LayerNorm after the attention's residual is ``N`` and which has none after the FFN's. So
a HybridNorm layer is fairseq's Post-LN layer with ``final_layer_norm`` an identity (and, in the
decoder, ``self_attn_layer_norm``: ``N`` follows the cross-attention, ``encoder_attn_layer_norm``), in
a Pre-LN model (the arch sets ``--*-normalize-before``: fairseq's final LayerNorm per stack), each
layer's ``normalize_before`` set by its index as Mix-LN's; HybridNorm*'s first layer of each stack is
fairseq's Pre-LN layer (a stack of one layer has no HybridNorm layer left and is refused). q, k and v: ``--lnpos-qk-norm`` (default layernorm, per head: the official
``size=d_model // n_heads``) with the values normalised too (models/qknorm.py); l2 is refused.

The paper and code are decoder-only; for the encoder-decoder: the cross-attention is an attention
like the self-attention (no input norm, q, k, v normalised, plain residual), so the decoder computes
``y = x + SelfAttn(x)``, ``z = y + CrossAttn(y)``, ``x' = N(z) + FFN(N(z))``; HybridNorm*'s Pre-Norm
layer is the first of each stack. The official code's RMSNorm without bias (``layer_norm_type: rms``,
``bias_for_layer_norm: false``), bias-free projections and its initialisation (``full_megatron``) are
not taken: LayerNorm unless ``--lnpos-norm rmsnorm`` (with ``--lnpos-qk-norm rmsnorm``), fairseq's
biases and initialisation.
"""
from fairseq.models import register_model
from torch import nn

from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


class HybridNormLayer:
    normalize_values = True
    pre_norm_first = False  # HybridNorm*: the stack's first layer is Pre-Norm
    ffn_norm = None  # the LayerNorm slot that holds N, the FFN's norm

    def hybridize(self, index):
        self.normalize_before = self.pre_norm_first and index == 0
        if self.normalize_before:
            return
        for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
            if getattr(self, name, None) is not None and name != self.ffn_norm:
                setattr(self, name, nn.Identity())


class HybridNormEncoderLayer(HybridNormLayer, EncoderLayer):
    ffn_norm = "self_attn_layer_norm"

    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.hybridize(index)


class HybridNormDecoderLayer(HybridNormLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.ffn_norm = "self_attn_layer_norm" if self.encoder_attn is None else "encoder_attn_layer_norm"
        self.hybridize(index)


@register_model("transformer_hybridnorm")
class HybridNormTransformerModel(VariantTransformerModel):
    encoder_layer_cls = HybridNormEncoderLayer
    decoder_layer_cls = HybridNormDecoderLayer


class HybridNormStarEncoderLayer(HybridNormEncoderLayer):
    pre_norm_first = True


class HybridNormStarDecoderLayer(HybridNormDecoderLayer):
    pre_norm_first = True


@register_model("transformer_hybridnorm_star")
class HybridNormStarTransformerModel(VariantTransformerModel):
    encoder_layer_cls = HybridNormStarEncoderLayer
    decoder_layer_cls = HybridNormStarDecoderLayer

    @classmethod
    def same_as_another(cls, args):
        side = cls.one_layer_stack(args)
        return None if side is None else (f"a {side} of one layer is that Pre-Norm layer only, with no HybridNorm "
                                          f"layer after it: give --{side}-layers 2 or more, or use transformer_hybridnorm")
