"""Sub-LN (Magneto; Wang et al., ICML 2023, "Magneto: A Foundation Transformer", arXiv 2210.06423),
encoder-decoder form, as in microsoft/torchscale (``torchscale/architecture/encoder.py`` and
``decoder.py`` under ``subln``; ``component/multihead_attention.py``, ``feedforward_network.py``).

Pre-LN with one more LayerNorm inside the sublayer, before its output projection::

    attention:  x + W_O · LN_sub(Attention(W_Q LN(x), W_K LN(x), W_V LN(x)))
    FFN:        x + W_2 · LN_sub(act(W_1 LN(x)))

``LN_sub`` is ``self_attn_sub_layer_norm`` (width d) and ``ffn_sub_layer_norm`` (width d_ff) of
each layer, applied by forward pre-hooks on ``self_attn.out_proj`` and ``fc2``, so fairseq's
parameter names stay (the self-attention is switched to fairseq's own attention code, which calls
``out_proj``, instead of torch's fused kernel). As torchscale (its ``inner_attn_ln`` exists only ``if subln and
self.self_attention``), the decoder's cross-attention has no ``LN_sub``; the paper names only
self-attention and the FFN.

Initialization (the paper's Figure 2, ``subln_init``, which is DeepNet's rule with another gain):
after the chosen ``--lnpos-init``, fc1/fc2 and the value and output projections are Xavier-normal
with gain gamma, the query and key projections Xavier-normal with gain 1 (``deepnorm.deepnorm_init``),
where gamma is, for N encoder and M decoder layers, ``sqrt(log(3M) · log(2N) / 3)`` in the encoder
and ``sqrt(log(3M))`` in the decoder (the paper's table of gammas per architecture). Biases keep
``--lnpos-init``'s (the paper names only weights). Where torchscale differs, this follows the paper:

* torchscale (``encoder.py`` / ``decoder.py``, ``if args.subln``) multiplies its default
  initialization by gamma, and that default is PyTorch's ``nn.Linear`` for every projection
  (``component/multihead_attention.py`` lines 43-48, ``feedforward_network.py``): weights uniform
  with std 1/sqrt(3 fan_in), biases uniform in +-1/sqrt(fan_in). Its
  ``MultiheadAttention.reset_parameters`` (Xavier-uniform with gain 2^-1/2 for q/k/v, zero out_proj
  bias, lines 61-66) is never called by the encoder-decoder (only for the second branch of a
  multiway network, ``multiway_network.py`` line 30). So v and out_proj are 1/sqrt(3) = 0.577 of
  the paper's, q/k 0.577 of the paper's gain 1, fc1 0.913 and fc2 0.456 of the paper's (d_ff = 4d), and every
  bias of fc1, fc2, v_proj and out_proj is non-zero and scaled by gamma too.
* torchscale skips the decoder's cross-attention (``if "encoder_attn" in name: continue``); the
  paper's rule names ``v_proj`` and ``out_proj`` without exception, so the cross-attention's get
  gamma here, as DeepNorm's do.

The constants are the same in both.
"""
import math

from fairseq.models import register_model
from fairseq.modules import LayerNorm

from ..errors import check
from .deepnorm import deepnorm_init
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel, layer_attentions


def subln_gammas(encoder_layers, decoder_layers):
    """``{"encoder": gamma, "decoder": gamma}`` for N encoder and M decoder layers."""
    n, m = encoder_layers, decoder_layers
    check(n >= 1 and m >= 1, f"Sub-LN needs at least one encoder and one decoder layer, got {n} and {m}")
    return {"encoder": math.sqrt(math.log(3 * m) * math.log(2 * n) / 3), "decoder": math.sqrt(math.log(3 * m))}


class SubLNLayer:
    def subln(self, cfg, gamma):
        check(self.normalize_before, "Sub-LN is a Pre-LN layer: its arch sets --*-normalize-before")
        self.self_attn_sub_layer_norm = LayerNorm(self.embed_dim)
        self.ffn_sub_layer_norm = LayerNorm(self.fc1.out_features)
        # fairseq's own attention path calls out_proj (torch's fused F.multi_head_attention_forward,
        # which fairseq takes in training otherwise, would use its weight directly)
        self.self_attn._set_skip_embed_dim_check()
        self.self_attn.out_proj.register_forward_pre_hook(self._sub_norm_attention)
        self.fc2.register_forward_pre_hook(self._sub_norm_ffn)
        deepnorm_init(layer_attentions(self), self.fc1, self.fc2, gamma)

    def _sub_norm_attention(self, module, args):
        return (self.self_attn_sub_layer_norm(args[0]),)

    def _sub_norm_ffn(self, module, args):
        return (self.ffn_sub_layer_norm(args[0]),)


class SubLNEncoderLayer(SubLNLayer, EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.subln(cfg, subln_gammas(cfg.encoder.layers, cfg.decoder.layers)["encoder"])


class SubLNDecoderLayer(SubLNLayer, DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        self.subln(cfg, subln_gammas(cfg.encoder.layers, cfg.decoder.layers)["decoder"])


@register_model("transformer_subln")
class SubLNTransformerModel(VariantTransformerModel):
    encoder_layer_cls = SubLNEncoderLayer
    decoder_layer_cls = SubLNDecoderLayer

    @classmethod
    def coefficients(cls, args):
        gammas = subln_gammas(args.encoder_layers, args.decoder_layers)
        return "Sub-LN %d-%d: init gamma encoder %.4f, decoder %.4f" % (
            args.encoder_layers, args.decoder_layers, gammas["encoder"], gammas["decoder"])
