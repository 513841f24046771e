"""ReZero (Bachlechner, Majumder, Mao, Cottrell & McAuley 2020, "ReZero is All You Need: Fast
Convergence at Large Depth", arXiv 2003.04887) and Transformer-Clinic's ReZero with Post-LN.

* ``transformer_rezero``: ``x = x + a * F(x)`` and no LayerNorm anywhere (fairseq's Post-LN layer
  with its LayerNorms replaced by identities, no final or embedding LayerNorm).
* ``transformer_rezero_postln``: ``x = LN(x + a * F(x))``, fairseq's Post-LN layer otherwise.

``a`` is one trainable scalar per layer, initialised to 0 and shared by all sublayers of the layer
(self-attention and FFN; in the decoder cross-attention too), so every layer is the identity at
initialisation. ``F(x)`` is the sublayer's output after fairseq's dropout. All other weights keep
fairseq's initialisation. Sources:

* majumderb/rezero, ``rezero/transformer/rztx.py`` (``RZTXEncoderLayer``, ``RZTXDecoderLayer``):
  one ``resweight = nn.Parameter(torch.Tensor([0]))`` per layer, used by every sublayer, the
  decoder's cross-attention included; no LayerNorm.
* LiyuanLucasLiu/Transformer-Clinic, ``fairseq/fairseq/modules/transformer_layer.py``
  (``--init-type rezero`` and ``rezero_postln``): the same per-layer ``rezero_weight`` in fairseq's
  layers, ``residual + rezero_weight * x`` after dropout; ``rezero`` drops the layer's LayerNorms
  (``maybe_layer_norm`` returns its input), ``rezero_postln`` keeps Post-LN's. Its recipes train
  Post-LN encoders and decoders (no final LayerNorm). The parameter keeps that code's name.
"""
from fairseq.models import register_model
import torch
from torch import nn

from .sublayers import check_no_layernorm_embedding, drop_layer_norms
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


class ReZeroLayer:
    keep_layer_norms = False

    def rezero_init(self):
        self.rezero_weight = nn.Parameter(torch.zeros(1))
        if not self.keep_layer_norms:
            drop_layer_norms(self)

    def residual_connection(self, x, residual):  # fairseq: residual + x
        return torch.addcmul(residual, x, self.rezero_weight)


class ReZeroEncoderLayer(ReZeroLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.rezero_init()


class ReZeroDecoderLayer(ReZeroLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.rezero_init()


@register_model("transformer_rezero")
class ReZeroTransformerModel(VariantTransformerModel):
    encoder_layer_cls = ReZeroEncoderLayer
    decoder_layer_cls = ReZeroDecoderLayer

    def __init__(self, args, encoder, decoder):
        check_no_layernorm_embedding(args, "ReZero")
        super().__init__(args, encoder, decoder)


class ReZeroPostLNEncoderLayer(ReZeroEncoderLayer):
    keep_layer_norms = True


class ReZeroPostLNDecoderLayer(ReZeroDecoderLayer):
    keep_layer_norms = True


@register_model("transformer_rezero_postln")
class ReZeroPostLNTransformerModel(VariantTransformerModel):
    encoder_layer_cls = ReZeroPostLNEncoderLayer
    decoder_layer_cls = ReZeroPostLNDecoderLayer
