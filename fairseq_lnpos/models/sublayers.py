"""What several variants change around fairseq's sublayers, written once.

A fairseq layer names its sublayers ``self_attn``, ``encoder_attn`` (a decoder layer with
cross-attention) and the FFN (``fc1``, ``fc2``), here ``"ffn"``; its LayerNorms
``self_attn_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm``; and its forward calls
``residual_connection(x, residual)`` once per sublayer, in that order, with ``x`` the sublayer's
output after dropout. The mixins below give a variant one method per change, called with the
sublayer's name:

* ``SublayerInputs``: ``sublayer_input(name, x)`` rewrites what enters a sublayer (a forward
  pre-hook on the attention module, for self-attention its query, key and value, for
  cross-attention its query only; on ``fc1`` for the FFN).
* ``SublayerOutputs``: ``sublayer_output(name, x)`` rewrites what a sublayer returns, before
  fairseq's dropout (a forward hook on the attention module, on ``fc2`` for the FFN).
* ``SublayerResiduals``: ``sublayer_residual(name, x, residual)`` replaces fairseq's
  ``residual + x``; ``self.layer_input`` is the layer's input during its forward.
* ``SecondStream``: the layer carries a second residual stream beside fairseq's (ResiDual,
  SiameseNorm); ``self.stream`` is it during the layer's forward.

Hooks on the sublayers, not on the LayerNorms, so parameter names stay fairseq's and
``--lnpos-norm``, which replaces LayerNorm modules after the stack is built, keeps them.
"""
import torch
from torch import nn

from ..errors import check

LAYER_NORMS = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")


def sublayer_names(layer):
    """``["self_attn", "encoder_attn", "ffn"]`` in forward order (no ``encoder_attn`` where there is none)."""
    return ["self_attn"] + (["encoder_attn"] if getattr(layer, "encoder_attn", None) is not None else []) + ["ffn"]


def drop_layer_norms(layer):
    """Replace the layer's LayerNorms by identities (variants without LayerNorm)."""
    for name in LAYER_NORMS:
        if getattr(layer, name, None) is not None:
            setattr(layer, name, nn.Identity())


def check_no_layernorm_embedding(args, label):
    """A variant without LayerNorm refuses fairseq's ``--layernorm-embedding``."""
    check(not getattr(args, "layernorm_embedding", False), f"{label} has no LayerNorm: drop --layernorm-embedding")


class SublayerInputs:
    def hook_sublayer_inputs(self):
        for name in sublayer_names(self)[:-1]:
            getattr(self, name).register_forward_pre_hook(self._attention_input, with_kwargs=True)
        self.fc1.register_forward_pre_hook(self._ffn_input)

    def _attention_input(self, module, args, kwargs):
        query = kwargs["query"]
        new = self.sublayer_input("self_attn" if module is self.self_attn else "encoder_attn", query)
        if kwargs.get("key") is query:  # self-attention: keys and values are the same input
            kwargs["key"] = kwargs["value"] = new
        kwargs["query"] = new
        return args, kwargs

    def _ffn_input(self, module, args):
        return (self.sublayer_input("ffn", args[0]),)


class SublayerOutputs:
    def hook_sublayer_outputs(self):
        for name in sublayer_names(self)[:-1]:
            getattr(self, name).register_forward_hook(self._attention_output)
        self.fc2.register_forward_hook(self._ffn_output)

    def _attention_output(self, module, args, output):
        attn, *rest = output
        return (self.sublayer_output("self_attn" if module is self.self_attn else "encoder_attn", attn), *rest)

    def _ffn_output(self, module, args, output):
        return self.sublayer_output("ffn", output)


class SublayerResiduals:
    layer_input = None

    def forward(self, x, *args, **kwargs):
        self._sublayer, self.layer_input = 0, x
        try:
            return super().forward(x, *args, **kwargs)
        finally:
            self.layer_input = None

    def residual_connection(self, x, residual):  # fairseq: residual + x
        names = sublayer_names(self)
        name = names[self._sublayer]
        self._sublayer += 1
        return self.sublayer_residual(name, x, residual)


def split_streams(x, dim, scale=1.0):
    """``(x, y)``, fairseq's stream and the second one, from what a layer (or the module after a stack's
    last layer) receives: the two side by side (width ``2 dim``), or the embeddings (width ``dim``),
    which start both, the second times ``scale``."""
    if x.size(-1) == dim:
        return x, x * scale if scale != 1 else x
    x, y = x.split(dim, dim=-1)
    # contiguous: a strided input would cost every Linear reading it a separate bias add (mm + add, not addmm)
    return x.contiguous(), y


class SecondStream:
    """A layer that carries a second stream ``y`` beside the stream fairseq's layer computes.

    Between layers the two travel side by side in one tensor, ``[x, y]`` along the feature axis (width
    2d), so fairseq's encoder and decoder loops, generation and ``--checkpoint-activations`` carry it
    unchanged; the module in the stack's ``layer_norm`` slot (``build_stack_output``,
    ``models/variant.py``) joins them to width d. A layer given width d (the embeddings: the stack's
    first layer, or a later one when ``--*-layerdrop`` dropped those before it) starts
    ``y = stream_scale * x``. fairseq's layer runs on ``x``; its hooks update ``self.stream``."""

    stream = None  # y during the layer's forward
    stream_scale = 1.0

    def forward(self, x, *args, **kwargs):
        x, self.stream = split_streams(x, self.embed_dim, self.stream_scale)
        try:
            out = super().forward(x, *args, **kwargs)
            if isinstance(out, tuple):  # encoder with return_fc: (x, fc); decoder: (x, attn, state)
                return (torch.cat((out[0], self.stream), -1), *out[1:])
            return torch.cat((out, self.stream), -1)
        finally:
            self.stream = None
