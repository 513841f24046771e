"""OLMo-2's reordered norm (OLMo et al. 2024, "2 OLMo 2 Furious", arXiv 2501.00656), as in its
official code (allenai/OLMo, ``olmo/model.py``, ``OLMoSequentialBlock.forward`` under
``norm_after: true``, with ``attention_layer_norm: true``: ``configs/official-1124/OLMo2-7B-stage1.yaml``).

Each sublayer computes ``x = x + N(F(x))``: the norm on the sublayer's output only, before the
dropout (``x + self.dropout(self.attn_norm(att))``), and a final norm per stack (``ln_f``). The
queries and keys are normalised over the full width before the split into heads (``q_norm`` of
width d_model, ``OLMoBlock.attention``): ``--lnpos-qk-norm layernorm --lnpos-qk-norm-scope width`` by
default (``variants.VARIANTS``; models/qknorm.py), on every attention here, cross-attention included.

It is Peri-LN (models/periln.py: ``x + LN_out(F(LN_in(x)))``, ``LN_out`` before fairseq's dropout, a
final LayerNorm per stack) without ``LN_in``: fairseq's Pre-LN layer with its input LayerNorms
replaced by identities and Peri-LN's output norms (``self_attn_out_norm``, ``encoder_attn_out_norm``,
``ffn_out_norm``). OLMo-2 uses RMSNorm everywhere (``layer_norm_type: rms``), no biases and its own
initialisation (normal, std 0.02); here LayerNorm unless ``--lnpos-norm rmsnorm`` (with
``--lnpos-qk-norm rmsnorm`` for q and k), fairseq's biases and initialisation.
"""
from fairseq.models import register_model

from .periln import PeriLNLayer
from .sublayers import drop_layer_norms
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


class OLMo2Layer(PeriLNLayer):
    def reorder_norms(self):
        drop_layer_norms(self)
        self.add_output_norms()


class OLMo2EncoderLayer(OLMo2Layer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.reorder_norms()


class OLMo2DecoderLayer(OLMo2Layer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.reorder_norms()


@register_model("transformer_olmo2")
class OLMo2TransformerModel(VariantTransformerModel):
    """fairseq's Pre-LN model (the arch sets ``--*-normalize-before``: the final LayerNorm per stack)
    with the norms moved from the sublayers' inputs to their outputs, QK-norm on."""

    encoder_layer_cls = OLMo2EncoderLayer
    decoder_layer_cls = OLMo2DecoderLayer
