"""SiameseNorm (Li, Han, Cao, Huang, Zhou, Chen, Zhao, Jiang, Jiang & Huang, ICML 2026, "SiameseNorm:
Breaking the Barrier to Reconciling Pre/Post-Norm", arXiv 2602.08064), its post-pre form as in the
official code (Qwen-Applications/SiameseNorm, ``deit-model-siamesenorm.py``: ``Block.forward`` and
``VisionTransformer.forward_features``; ``dit-model-siamesenorm.py``, ``DiTBlock.forward``, the same
with adaLN).

Two streams share every sublayer ``F``: ``x`` (Post-Norm-like) and ``y`` (Pre-Norm-like), both
starting from the embeddings (``y = x.clone()``). In layer ``l`` (from 0), for each sublayer::

    x = N_post(x)
    z = F(N_in(x + N_pre(y)))          (after dropout)
    x = x + z / c_l                    c_l = sqrt(2 (l + 1))
    y = y + z

and after the last layer ``N_final(N_a(x) + N_b(y))``. Every sublayer has its own three norms.

The official blocks have two sublayers; for the encoder-decoder, the decoder's cross-attention is a
third sublayer of the same form with its own ``N_post``, ``N_pre`` and ``N_in`` (its query is
``N_in(N_post(x) + N_pre(y))``, its keys and values the encoder's output), and ``c_l`` counts it:
``c_l = sqrt(s (l + 1))``, ``s`` the layer's sublayers (2 in the encoder, 3 in the decoder), the number
of branch outputs the streams have received by the end of layer ``l``, as ``2 (l + 1)`` is for the
official block. The OLMo language-model form (``changes.patch``, ``MODEL_TYPE=post_pre``) is not in
the snapshot read (the file is absent); ``OLMo_model_hybrid_pre.py`` there (``hybrid_pre``, not this
variant) has the same ``c = ((layer_id + 1) * 2) ** 0.5``.

Written with fairseq's Pre-LN layer: its ``*_layer_norm`` (applied to the sublayer's input) is
``N_post``; a forward pre-hook on the sublayer (models/sublayers.py) turns ``N_post(x)`` into
``N_in(N_post(x) + N_pre(y))`` and keeps ``N_post(x)``, which ``residual_connection`` uses as the
residual (``N_post(x) + z / c_l``) while adding ``z`` to ``y``. ``y`` travels beside ``x``
(``SecondStream``); the stack's ``layer_norm`` slot holds :class:`SiameseOutput`. New parameters:
``{self_attn,encoder_attn,ffn}_pre_norm`` and ``..._input_norm`` per layer,
``{encoder,decoder}.layer_norm.{post_norm,pre_norm,norm}``. Norms are LayerNorms (weight 1, bias 0),
``--lnpos-norm`` replaces them; weights fairseq's initialisation (the official DeiT code's is
timm's, not part of the method).
"""
import math

from fairseq.models import register_model
from fairseq.modules import LayerNorm
from torch import nn

from .sublayers import SecondStream, SublayerInputs, SublayerResiduals, split_streams, sublayer_names
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


class SiameseOutput(nn.Module):
    """``N_final(N_a(x) + N_b(y))`` after a stack's last layer."""

    def __init__(self, dim, export=False):
        super().__init__()
        self.dim = dim
        self.post_norm = LayerNorm(dim, export=export)  # N_a, on x
        self.pre_norm = LayerNorm(dim, export=export)  # N_b, on y
        self.norm = LayerNorm(dim, export=export)  # N_final

    def forward(self, x):
        x, y = split_streams(x, self.dim)
        return self.norm(self.post_norm(x) + self.pre_norm(y))


class SiameseLayer(SecondStream, SublayerInputs, SublayerResiduals):
    side = None  # "encoder" or "decoder"
    post = None  # N_post(x) of the running sublayer

    @classmethod
    def build_stack_output(cls, cfg):
        return SiameseOutput(getattr(cfg, cls.side).embed_dim, export=cfg.export)

    def siamese(self, cfg, index):
        names = sublayer_names(self)
        self.branch_scale = 1 / math.sqrt(len(names) * (index + 1))  # 1 / c_l
        for name in names:
            setattr(self, f"{name}_pre_norm", LayerNorm(self.embed_dim, export=cfg.export))
            setattr(self, f"{name}_input_norm", LayerNorm(self.embed_dim, export=cfg.export))
        self.hook_sublayer_inputs()

    def sublayer_input(self, name, x):  # x = N_post(x), fairseq's Pre-LN LayerNorm of the sublayer
        self.post = x
        return getattr(self, f"{name}_input_norm")(x + getattr(self, f"{name}_pre_norm")(self.stream))

    def sublayer_residual(self, name, x, residual):  # x = z, the sublayer's output after dropout
        self.stream = self.stream + x
        post, self.post = self.post, None
        return post + x * self.branch_scale


class SiameseEncoderLayer(SiameseLayer, EncoderLayer):
    side = "encoder"

    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.siamese(cfg, index)


class SiameseDecoderLayer(SiameseLayer, DecoderLayer):
    side = "decoder"

    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.siamese(cfg, index)


@register_model("transformer_siamesenorm")
class SiameseNormTransformerModel(VariantTransformerModel):
    """fairseq's Pre-LN model (the arch sets ``--*-normalize-before``) with a second stream per stack."""

    encoder_layer_cls = SiameseEncoderLayer
    decoder_layer_cls = SiameseDecoderLayer
