"""ScaleNorm + FixNorm + Pre-LN + SmallInit (Nguyen & Salazar, IWSLT 2019, "Transformers without
Tears: Improving the Normalization of Self-Attention", arXiv 1910.05895), as in its official code
(tnq177/transformers_without_tears, ``layers.py`` and ``model.py``, with its default configuration
``configurations.py``: ``scnorm``, ``fix_norm``, ``pre_act``, ``use_bias`` all on).

* **Pre-LN** placement (``pre_act``), with a final norm per stack, as fairseq's
  ``--*-normalize-before``.
* **ScaleNorm** in place of every LayerNorm: ``g * x / ||x||``, one scalar ``g`` per norm initialised
  to sqrt(d) (``--lnpos-norm scalenorm``, models/norms.py).
* **FixNorm**: every word embedding is used at unit length, ``e / ||e||``, both where a token is
  looked up (then times fairseq's sqrt(d) embedding scale, as the official ``get_input``) and in the
  output projection (the official code ties it to the word embedding and normalises it there too;
  here the output projection's rows are normalised whether or not it is tied). The stored
  parameters are not changed; the normalisation is in the forward pass, so checkpoints and
  ``--share-*`` options are fairseq's. The official code initialises the word embedding
  U(-0.01, 0.01); fairseq's N(0, d^-1/2) is kept: with FixNorm only the direction matters, and both
  give directions spread over the sphere.
* **Output bias** (``use_bias``): the output projection has a bias, one per vocabulary entry,
  initialised to 0 (official ``model.py`` lines 37, 50-51, used in ``logit_fn``, line 114), tied
  weight or not.
* **Language embedding**: one learned vector per language added to every input token, after the
  sqrt(d) scaling and with the positions, before the input dropout (``get_input``, ``model.py``
  lines 62-69; dropout in ``layers.py`` lines 165 and 211). Initialised N(0, d^-1/2) (line 43). One
  table serves both stacks (line 36): the encoder adds its row of the source language, the decoder
  that of the target language (lines 77, 81), so here a (2, d) parameter ``lang_embedding``, row 0
  the source's, row 1 the target's. It is added where fairseq adds the positions (a forward hook of
  each stack's ``embed_positions``), so the arch needs positional embeddings.
* **SmallInit**: every attention projection (q, k, v, out) N(0, 2 / (5d)) - the official code's
  comment: Xavier-normal for a d x d matrix is too large, so the FFN's std for d_ff = 4d is used -
  and fc1, fc2 N(0, 2 / (d + d_ff)); all their biases 0. It replaces what ``--lnpos-init`` set for
  these weights.

Not taken from the official recipe (a training choice, not the architecture): its lr 3e-4 without
warm-up, decay on plateau and gradient clipping 1.0; rows of the run table set those.
"""
import functools
import math

from fairseq.models import register_model
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import check
from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel, layer_attentions


def small_init(layer):
    d = layer.embed_dim
    for attn in layer_attentions(layer):
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
            nn.init.normal_(proj.weight, std=math.sqrt(2 / (5 * d)))
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
    std = math.sqrt(2 / (layer.fc1.in_features + layer.fc1.out_features))
    for fc in (layer.fc1, layer.fc2):
        nn.init.normal_(fc.weight, std=std)
        nn.init.zeros_(fc.bias)


class SmallInitEncoderLayer(EncoderLayer):
    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        small_init(self)


class SmallInitDecoderLayer(DecoderLayer):
    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        small_init(self)


def unit_rows(module, inputs, output):
    """Forward hook of an embedding: each looked-up vector at unit length (the padding row stays 0)."""
    return F.normalize(output, dim=-1)


class FixNormLinear(nn.Linear):
    """The output projection with each row of its (possibly shared) weight at unit length."""

    def forward(self, x):
        return F.linear(x, F.normalize(self.weight, dim=-1), self.bias)


@register_model("transformer_scalenorm")
class ScaleNormTransformerModel(VariantTransformerModel):
    encoder_layer_cls = SmallInitEncoderLayer
    decoder_layer_cls = SmallInitDecoderLayer
    # parameters the first version of the architecture lacked: its checkpoints are refused by name
    # (checkpoint.guard_state_loading)
    later_parameters = {"lang_embedding": "language embedding", "decoder.output_projection.bias": "output bias"}

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        for embedding in {id(e): e for e in (encoder.embed_tokens, decoder.embed_tokens)}.values():
            embedding.register_forward_hook(unit_rows)
        projection = decoder.output_projection
        if type(projection) is nn.Linear:  # not an adaptive softmax
            # the same module with FixNorm's forward: parameters, names and weight sharing unchanged
            projection.__class__ = FixNormLinear
            projection.bias = nn.Parameter(torch.zeros(projection.out_features))
        d = encoder.embed_tokens.embedding_dim
        self.lang_embedding = nn.Parameter(torch.empty(2, d).normal_(std=d ** -0.5))
        for row, stack in enumerate((encoder, decoder)):
            check(stack.embed_positions is not None, f"{args.arch}: the language embedding is added with the "
                  "positions; drop --no-token-positional-embeddings")
            stack.embed_positions.register_forward_hook(functools.partial(self.add_language, row))

    def add_language(self, row, module, inputs, positions):
        """Forward hook of a stack's positional embedding: its language's vector added to every position."""
        return positions + self.lang_embedding[row].to(positions.dtype)
