"""Peri-LN / Sandwich-LN (Ding et al. 2021, "CogView", arXiv 2105.13290; Kim et al., ICML 2025,
"Peri-LN: Revisiting Normalization Layer in the Transformer Architecture", arXiv 2502.02732).

Each sublayer computes ``x = x + LN_out(F(LN_in(x)))``: fairseq's Pre-LN layer (``LN_in`` is its
``*_layer_norm``, the final LayerNorm of each stack is fairseq's) with one more LayerNorm,
``LN_out``, on the sublayer's output. Sources:

* CogView, ``mpu/sparse_transformer.py`` (``GPT2ParallelTransformerLayer``, ``third_layernorm`` /
  ``fourth_layernorm`` under ``scale_normalization``): the output LayerNorm of the attention and of
  the MLP, added to the residual stream; a final LayerNorm (``final_layernorm``).
* allenai/OLMo-core, ``src/olmo_core/nn/transformer/block.py`` (``PeriNormTransformerBlock``):
  ``h = x + dropout(LN_out(F(LN_in(x))))`` (the dropout is in ``nn/residual_stream.py``); an
  embedding LayerNorm is a separate option there (``embedding_norm``), as fairseq's
  ``--layernorm-embedding`` is here.

Choices for an encoder-decoder and fairseq:

* Every sublayer has its ``LN_out``: self-attention, the decoder's cross-attention, the FFN
  (``self_attn_out_norm``, ``encoder_attn_out_norm``, ``ffn_out_norm``).
* ``LN_out`` comes before fairseq's dropout, as in OLMo-core: ``x + dropout(LN_out(F))``. CogView
  normalises after the sublayer's output dropout (``LN_out(dropout(F))``); the two differ only
  while dropout is on.
* ``LN_out`` is fairseq's LayerNorm with fairseq's initialisation (weight 1, bias 0), as are all
  other weights; neither reference scales an initialisation for this block.
"""
from fairseq.models import register_model
from fairseq.modules import LayerNorm

from .sublayers import SublayerOutputs, sublayer_names
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


class PeriLNLayer(SublayerOutputs):
    def add_output_norms(self):
        for name in sublayer_names(self):
            setattr(self, f"{name}_out_norm", LayerNorm(self.embed_dim))
        self.hook_sublayer_outputs()

    def sublayer_output(self, name, x):
        return getattr(self, f"{name}_out_norm")(x)


class PeriLNEncoderLayer(PeriLNLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.add_output_norms()


class PeriLNDecoderLayer(PeriLNLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.add_output_norms()


@register_model("transformer_periln")
class PeriLNTransformerModel(VariantTransformerModel):
    """fairseq's Pre-LN (the arch sets ``--*-normalize-before``) with output LayerNorms."""

    encoder_layer_cls = PeriLNEncoderLayer
    decoder_layer_cls = PeriLNDecoderLayer
