"""B2T connection (Takase, Kiyono, Kobayashi & Suzuki, Findings of ACL 2023, "B2T Connection:
Serving Stability and Performance in Deep Transformers", arXiv 2206.00330), as in its official
code (takase/b2t_connection, a fairseq fork: ``fairseq/modules/transformer_layer.py`` under
``--residual-bottom-to-top``).

fairseq's Post-LN layer in which the layer's input ``x`` is also added before the layer's last
LayerNorm (a "bottom-to-top" connection)::

    encoder:  y = LN(x + Attn(x));                          out = LN(x + y + FFN(y))
    decoder:  y = LN(x + Attn(x)); z = LN(y + CrossAttn(y)); out = LN(x + z + FFN(z))

Initialisation (``rescaling_init`` in the same file, applied to every layer whenever
``--residual-bottom-to-top`` is on): every weight of a layer but its LayerNorms' (the q, k, v and
output projections of each attention, fc1, fc2) is multiplied by ``L^(-1/2)``, ``L`` the number of
layers of the layer's own stack (``args.encoder_layers`` / ``args.decoder_layers``); biases and
embeddings keep fairseq's initialisation.

As in the official code, where the paper is silent: the connection is added after fairseq's
dropout of the FFN output, in the order ``(y + FFN(y)) + x``; the scaling multiplies fairseq's
initialisation (here: the one ``--lnpos-init`` chose), it does not draw new weights.
"""
import logging

from fairseq.models import register_model
import torch
from torch import nn

from .sublayers import SublayerResiduals
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel

logger = logging.getLogger(__name__)


def b2t_scale(layers):
    """The factor of every sublayer weight in a stack of ``layers`` layers."""
    return layers ** -0.5


class B2TLayer(SublayerResiduals):
    def b2t_init(self, layers):
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    m.weight.mul_(b2t_scale(layers))

    def sublayer_residual(self, name, x, residual):
        x = residual + x
        return self.layer_input + x if name == "ffn" else x


class B2TEncoderLayer(B2TLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.b2t_init(cfg.encoder.layers)


class B2TDecoderLayer(B2TLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.b2t_init(cfg.decoder.layers)


@register_model("transformer_b2t")
class B2TTransformerModel(VariantTransformerModel):
    encoder_layer_cls = B2TEncoderLayer
    decoder_layer_cls = B2TDecoderLayer

    @classmethod
    def build_model(cls, args, task):
        logger.info("B2T %d-%d: sublayer weights x%.4f (encoder), x%.4f (decoder)", args.encoder_layers,
                    args.decoder_layers, b2t_scale(args.encoder_layers), b2t_scale(args.decoder_layers))
        return super().build_model(args, task)
