"""T-Fixup (Huang, Perez, Ba & Volkovs, ICML 2020, "Improving Transformer Optimization Through
Better Initialization", PMLR 119:4475-4483), as in its official code (layer6ai-labs/T-Fixup,
``fairseq/modules/transformer_layer.py`` ``fixup_initialization`` and ``fairseq/models/transformer.py``
under ``--Tfixup --dont-use-layernorm``).

No LayerNorm anywhere: each sublayer computes ``x = x + F(x)`` (fairseq's Post-LN layer with its
LayerNorms replaced by identities, no final or embedding LayerNorm). Initialisation, the paper's
three-step T-Fixup procedure for N encoder and M decoder layers:

1. Xavier for the sublayer weights, Gaussian N(0, d^-1/2) (std d^-1/2) for the input embeddings.
2. Decoder: the value and output projections of every attention (self and cross) and fc1, fc2
   scaled by ``(9 M)^(-1/4)``; the input embeddings scaled by ``(9 N)^(-1/4)`` (encoder) and
   ``(9 M)^(-1/4)`` (decoder).
3. Encoder: the value and output projections of the self-attention and fc1, fc2 scaled by
   ``0.67 N^(-1/4)``.

As in the official code (where the paper, with N = M throughout, is silent):

* "Xavier" is Xavier-uniform with gain 1 for value/output projections and fc1/fc2 (biases of fc1,
  fc2 and the output projection zero); query/key projections keep fairseq's Xavier-uniform with
  gain 2^-1/2, attention input biases and the output embedding (when not tied) fairseq's init.
* The embedding factor uses each stack's own depth; an embedding shared by both stacks
  (``--share-all-embeddings``) is scaled once, by the encoder's factor. fairseq's
  ``sqrt(d)`` embedding scale stays.
"""
import logging

from fairseq.models import register_model
import torch
from torch import nn

from ..errors import check
from .sublayers import check_no_layernorm_embedding, drop_layer_norms
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel, layer_attentions

logger = logging.getLogger(__name__)


def tfixup_scales(encoder_layers, decoder_layers):
    """``{"encoder": (sublayer scale, embedding scale), "decoder": (...)}`` for N, M layers."""
    n, m = encoder_layers, decoder_layers
    check(n >= 1 and m >= 1, f"T-Fixup needs at least one encoder and one decoder layer, got {n} and {m}")
    return {"encoder": (0.67 * n ** -0.25, (9 * n) ** -0.25), "decoder": ((9 * m) ** -0.25, (9 * m) ** -0.25)}


class TFixupLayer:
    def tfixupify(self, scale):
        drop_layer_norms(self)
        for attn in layer_attentions(self):
            nn.init.xavier_uniform_(attn.v_proj.weight, gain=scale)
            nn.init.xavier_uniform_(attn.out_proj.weight, gain=scale)
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight, gain=scale)
            nn.init.zeros_(fc.bias)


class TFixupEncoderLayer(TFixupLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.tfixupify(tfixup_scales(cfg.encoder.layers, cfg.decoder.layers)["encoder"][0])


class TFixupDecoderLayer(TFixupLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.tfixupify(tfixup_scales(cfg.encoder.layers, cfg.decoder.layers)["decoder"][0])


@register_model("transformer_tfixup")
class TFixupTransformerModel(VariantTransformerModel):
    """The layers scale their own weights; the model scales the input embeddings."""

    encoder_layer_cls = TFixupEncoderLayer
    decoder_layer_cls = TFixupDecoderLayer

    def __init__(self, args, encoder, decoder):
        check_no_layernorm_embedding(args, "T-Fixup")
        super().__init__(args, encoder, decoder)
        scales = tfixup_scales(args.encoder_layers, args.decoder_layers)
        with torch.no_grad():
            encoder.embed_tokens.weight.mul_(scales["encoder"][1])
            if decoder.embed_tokens is not encoder.embed_tokens:
                decoder.embed_tokens.weight.mul_(scales["decoder"][1])
        logger.info(
            "T-Fixup %d-%d: encoder sublayers x%.4f, embeddings x%.4f; decoder sublayers x%.4f, embeddings x%.4f",
            args.encoder_layers, args.decoder_layers, *scales["encoder"], *scales["decoder"],
        )
