"""DeepNorm (Wang et al. 2022, "DeepNet", arXiv 2203.00555), encoder-decoder form.

Each sublayer computes ``x = LN(alpha * x + G(x))`` (Post-LN with the skip scaled by alpha);
FFN fc1/fc2 and the value/output projections of every attention (self and cross) are
Xavier-normal initialised with gain beta, query/key projections with gain 1. Biases keep
fairseq's initialisation (the paper says nothing about them).

This follows the paper, not microsoft/torchscale: torchscale divides the default-initialised
weights (and biases) by an init scale, which for encoder-decoder amounts to an encoder beta of
1.15 (N^4 M)^(-1/16) instead of the paper's 0.87 (N^4 M)^(-1/16).
"""

from fairseq.models import register_model
import torch
from torch import nn

from ..errors import check
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel, layer_attentions

def deepnorm_coefficients(encoder_layers, decoder_layers):
    """``{"encoder": (alpha, beta), "decoder": (alpha, beta)}`` for N encoder and M decoder layers."""
    n, m = encoder_layers, decoder_layers
    check(n >= 1 and m >= 1, f"DeepNorm needs at least one encoder and one decoder layer, got {n} and {m}")
    return {
        "encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
        "decoder": ((3 * m) ** (1 / 4), (12 * m) ** (-1 / 4)),
    }


def deepnorm_init(attentions, fc1, fc2, beta):
    for attn in attentions:
        nn.init.xavier_normal_(attn.q_proj.weight, gain=1.0)
        nn.init.xavier_normal_(attn.k_proj.weight, gain=1.0)
        nn.init.xavier_normal_(attn.v_proj.weight, gain=beta)
        nn.init.xavier_normal_(attn.out_proj.weight, gain=beta)
    nn.init.xavier_normal_(fc1.weight, gain=beta)
    nn.init.xavier_normal_(fc2.weight, gain=beta)


class DeepNormResidual:
    alpha = 1.0

    def residual_connection(self, x, residual):  # fairseq: residual + x
        # x + alpha * residual in one operator: the same operator count as fairseq's Post-LN
        return torch.add(x, residual, alpha=self.alpha)


class DeepNormEncoderLayer(DeepNormResidual, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.alpha, beta = deepnorm_coefficients(cfg.encoder.layers, cfg.decoder.layers)["encoder"]
        deepnorm_init(layer_attentions(self), self.fc1, self.fc2, beta)


class DeepNormDecoderLayer(DeepNormResidual, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.alpha, beta = deepnorm_coefficients(cfg.encoder.layers, cfg.decoder.layers)["decoder"]
        deepnorm_init(layer_attentions(self), self.fc1, self.fc2, beta)


@register_model("transformer_deepnorm")
class DeepNormTransformerModel(VariantTransformerModel):
    encoder_layer_cls = DeepNormEncoderLayer
    decoder_layer_cls = DeepNormDecoderLayer

    @classmethod
    def coefficients(cls, args):
        coef = deepnorm_coefficients(args.encoder_layers, args.decoder_layers)
        return ("DeepNorm %d-%d: encoder alpha %.4f beta %.4f, decoder alpha %.4f beta %.4f"
                % (args.encoder_layers, args.decoder_layers, *coef["encoder"], *coef["decoder"]))
