"""NormFormer (Shleifer, Weston & Ott 2021, "NormFormer: Improved Transformer Pretraining with Extra
Normalization", arXiv 2110.09456), as fairseq implements it for its decoder layer.

fairseq's Pre-LN layer with three additions, each a fairseq 0.12 option that the arch turns on
(``variants.VARIANTS``): ``--scale-heads`` (a learned scale per attention head, ``c_attn``, init 1),
``--scale-attn`` (a LayerNorm after self-attention, ``attn_ln``) and ``--scale-fc`` (a LayerNorm
between fc1's activation and fc2, ``ffn_layernorm``); ``--scale-resids`` (a learned per-channel
scale of the FFN's residual, ``w_resid``, init 1) is an option here, off by default::

    h   = x + attn_ln(HeadScale(SelfAttn(LN(x))))
    out = w_resid * h + fc2(ffn_layernorm(act(fc1(LN(h)))))        (w_resid = 1 without --scale-resids)

Sources:

* fairseq 0.12, ``fairseq/modules/transformer_layer.py`` (``TransformerDecoderLayerBase``): the four
  options and their parameters; the head scale multiplies the attention's output after its output
  projection, viewed as (heads, head dim); ``attn_ln`` comes before the dropout, ``ffn_layernorm``
  after the activation dropout, ``w_resid`` multiplies the FFN's residual only.
* fairseq, ``examples/normformer/README.md``: NormFormer is ``--scale-attn --scale-fc --scale-heads``
  ("if your model is small, you may want to add ``--scale-resids``"; its 125M "best command" has it,
  its 1.3B and 2.7B NormFormer commands do not). The paper's abstract names the three operations;
  followed here: ``--scale-resids`` is off unless asked for.
* The paper scales each head before the output projection (``Concat(g_1 h_1, ..., g_n h_n) W_O``);
  fairseq scales after it, which the paper's first author (fairseq issue 3973, pointing to the end
  of the paper's section 2) gives as a little faster with the same perplexity, though not the same
  function. fairseq's is followed, in both stacks.

Choices for an encoder-decoder:

* The decoder layer is fairseq's own, with the options on: post-attention LayerNorm and head scale
  on self-attention only (the only attention of the language models the paper trains), none on
  cross-attention.
* fairseq 0.12's encoder layer has none of the four: the encoder layer here adds them with the
  decoder's parameter names, at the same places, read from the same options (forward hooks on
  ``self_attn`` and ``fc2``, ``models/sublayers.py``'s residual hook), so both stacks are NormFormer.
* Every new weight has fairseq's initialisation (LayerNorms 1 and 0, scales 1); the final LayerNorm
  of each stack is fairseq's Pre-LN one. ``--lnpos-norm`` replaces the new LayerNorms too.
"""
from fairseq.models import register_model
from fairseq.modules import LayerNorm
from fairseq.utils import safe_getattr
import torch
from torch import nn

from .sublayers import SublayerOutputs, SublayerResiduals
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


def scale_heads(x, c_attn):
    """fairseq's head scale: the last dimension of ``x`` viewed as (heads, head dim), times ``c_attn`` per head."""
    return (x.unflatten(-1, (c_attn.numel(), -1)) * c_attn.unsqueeze(-1)).flatten(-2)


class NormFormerEncoderLayer(SublayerOutputs, SublayerResiduals, EncoderLayer):
    """fairseq's encoder layer with the NormFormer options of fairseq's decoder layer."""

    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        self.attn_ln = LayerNorm(self.embed_dim) if safe_getattr(cfg, "scale_attn", False) else None
        heads = self.self_attn.num_heads
        self.c_attn = nn.Parameter(torch.ones(heads)) if safe_getattr(cfg, "scale_heads", False) else None
        self.ffn_layernorm = LayerNorm(cfg.encoder.ffn_embed_dim) if safe_getattr(cfg, "scale_fc", False) else None
        self.w_resid = nn.Parameter(torch.ones(self.embed_dim)) if safe_getattr(cfg, "scale_resids", False) else None
        self.self_attn.register_forward_hook(self._attention_output)
        if self.ffn_layernorm is not None:
            self.fc2.register_forward_pre_hook(self._ffn_hidden)

    def _ffn_hidden(self, module, args):  # fc2's input: after the activation and its dropout
        return (self.ffn_layernorm(args[0]),)

    def sublayer_output(self, name, x):  # self-attention's output, before fairseq's dropout
        if self.c_attn is not None:
            x = scale_heads(x, self.c_attn)
        return x if self.attn_ln is None else self.attn_ln(x)

    def sublayer_residual(self, name, x, residual):
        if name == "ffn" and self.w_resid is not None:
            residual = self.w_resid * residual
        return residual + x


@register_model("transformer_normformer")
class NormFormerTransformerModel(VariantTransformerModel):
    """fairseq's Pre-LN model (the arch sets ``--*-normalize-before`` and ``--scale-{attn,fc,heads}``)."""

    encoder_layer_cls = NormFormerEncoderLayer
    decoder_layer_cls = DecoderLayer

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--scale-resids", action="store_true",
                            help="NormFormer's learned scale of each FFN residual (fairseq's option; off "
                                 "by default, as the paper's three operations)")
