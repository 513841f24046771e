"""Per-layer gradient norms: which group a parameter belongs to, and one fused norm pass.

Shared by the ``translation_lnpos`` task (``--log-grad-norms``) and by the Fig. 3 analysis.

Group names (a ``/`` hierarchy, so TensorBoard shows them as ``gnorm/<group>``):

    encoder/3/fc2, encoder/3/self_attn, encoder/3/self_attn_ln, encoder/3/ffn_ln, ...
    decoder/5/encoder_attn, decoder/5/encoder_attn_ln, ...   one layer's sub-layers
    encoder/3, decoder/5                                     everything in that layer
    encoder/embed, decoder/embed, encoder/final_ln, ...      stack-level modules
    encoder, decoder                                         everything under that stack
    embed, output_projection, total

fairseq names the LayerNorm in front of/after the FFN ``final_layer_norm`` (inside a layer)
and the stack's last LayerNorm ``layer_norm``; they are reported as ``ffn_ln`` and
``final_ln``. Sub-modules this table does not know (e.g. a Keel branch LayerNorm) keep their
own name, grouped by layer: ``encoder/3/<module name>``. A tensor shared by several modules
(``--share-decoder-input-output-embed``) belongs to every group of every name it has, and
counts once in ``total``.
"""
import math
import re
from collections import OrderedDict

import torch

# fairseq's sub-module names -> the names used in the tags
ALIASES = {
    "self_attn_layer_norm": "self_attn_ln",
    "encoder_attn_layer_norm": "encoder_attn_ln",
    "final_layer_norm": "ffn_ln",  # inside a layer fairseq's "final" LN is the FFN's LN
}
STACK_ALIASES = {
    "embed_tokens": "embed",
    "embed_positions": "embed",
    "layernorm_embedding": "embed_ln",
    "layer_norm": "final_ln",
}
_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.+)$")
LAYER_GROUP = re.compile(r"^(encoder|decoder)/\d+$")  # the group of a whole layer: encoder/3, decoder/5
# Upstream fairseq 0.12.2 gives every encoder layer zero-initialised copies of its attention
# and FFN weights (``encoder.layers.N.fc1_weight`` ...) for an inference-only fused kernel;
# training never uses them (their .grad stays None), so they are not reported.
_INFERENCE_COPY = re.compile(r"^encoder\.layers\.\d+\.(in_proj|out_proj|fc1|fc2)_(weight|bias)$")


def is_inference_copy(name):
    """Is ``name`` one of upstream fairseq 0.12.2's inference-only weight copies?"""
    return bool(_INFERENCE_COPY.match(strip_wrappers(name)))


def strip_wrappers(name):
    """Drop the ``module.`` prefixes that DDP-style wrappers add."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


def parse_name(name):
    """``encoder.layers.3.fc2.weight`` -> ``("encoder", 3, "fc2", "weight")``.

    Non-layer parameters give ``(stack or None, None, module, leaf)``.
    """
    name = strip_wrappers(name)
    m = _LAYER.match(name)
    if m:
        stack, idx, rest = m.group(1), int(m.group(2)), m.group(3)
        sub, _, leaf = rest.partition(".")
        return stack, idx, ALIASES.get(sub, sub), leaf or sub
    parts = name.split(".")
    if parts[0] in ("encoder", "decoder") and len(parts) >= 2:
        return parts[0], None, STACK_ALIASES.get(parts[1], parts[1]), parts[-1]
    return None, None, parts[0] if len(parts) > 1 else name, parts[-1]


def groups_of(name):
    """The groups one parameter name contributes to (``total`` last)."""
    stack, idx, sub, _ = parse_name(name)
    if sub == "output_projection":
        return ("output_projection", "total") if stack is None else (
            "output_projection", stack, "total")
    out = []
    if idx is not None:
        out += [f"{stack}/{idx}/{sub}", f"{stack}/{idx}", stack]
    elif stack is not None:
        out += [f"{stack}/{sub}", stack]
        if sub == "embed":
            out.append("embed")
    else:
        out.append(sub)
    out.append("total")
    return tuple(out)


def _layer_sort_key(group):
    # encoder before decoder, layers in numeric order, summaries last
    parts = group.split("/")
    order = {"encoder": 0, "decoder": 1}
    if parts[0] in order:
        if len(parts) == 1:
            return (order[parts[0]], 3, 0, "")
        if parts[1].isdigit():
            return (order[parts[0]], 1, int(parts[1]), "/".join(parts[2:]))
        return (order[parts[0]], 0 if parts[1] == "embed" else 2, 0, parts[1])
    return (2, {"embed": 0, "output_projection": 1}.get(group, 2 if group != "total" else 3), 0, group)


class GradNormPlan:
    """The grouping of one model's parameters, built once and reused at every logged update."""

    def __init__(self, model):
        named = list(model.named_parameters(remove_duplicate=False))
        self.params, self.names, tensor_groups = [], [], []
        index = {}
        for name, p in named:
            if not p.requires_grad or is_inference_copy(name):
                continue
            if id(p) not in index:
                index[id(p)] = len(self.params)
                self.params.append(p)
                self.names.append(strip_wrappers(name))
                tensor_groups.append(set())
            tensor_groups[index[id(p)]].update(groups_of(name))
        groups = sorted(set().union(*tensor_groups) if tensor_groups else set(), key=_layer_sort_key)
        self.groups = groups
        gi = {g: i for i, g in enumerate(groups)}
        # groups x tensors 0/1 matrix: group squared norm = member @ tensor squared norms
        self.member = torch.zeros(len(groups), len(self.params), dtype=torch.float64)
        for t, gs in enumerate(tensor_groups):
            for g in gs:
                self.member[gi[g], t] = 1.0

    def tensor_norms(self, scale=1.0):
        """Norms of every parameter's ``.grad`` times ``scale`` (0 where there is no grad):
        one ``torch._foreach_norm`` call per device, one host sync."""
        scale = float(scale.item() if torch.is_tensor(scale) else scale)
        return self.norms_of([p.grad for p in self.params]) * abs(scale)

    def norms_of(self, tensors):
        """Norms of ``tensors`` (one per parameter, in the plan's order; ``None`` counts 0): one
        ``torch._foreach_norm`` call per device, one host sync."""
        present = [i for i, t in enumerate(tensors) if t is not None]
        sq = torch.zeros(len(tensors), dtype=torch.float64)
        by_device = OrderedDict()
        for i in present:
            by_device.setdefault(tensors[i].device, []).append(i)
        for idx in by_device.values():
            sq[idx] = torch.stack(float32_norms([tensors[i] for i in idx])).double().cpu() ** 2
        return sq.sqrt()

    def group_norms(self, tensor_norms):
        """Frobenius norm of each group from per-tensor norms."""
        return (self.member @ (tensor_norms.double() ** 2)).sqrt()

    def compute(self, scale=1.0):
        """``{group: norm}`` and ``{param name: norm}`` as Python floats."""
        tn = self.tensor_norms(scale)
        gn = self.group_norms(tn)
        return (
            OrderedDict(zip(self.groups, gn.tolist())),
            OrderedDict(zip(self.names, tn.tolist())),
        )


def float32_norms(tensors):
    """L2 norm of each tensor, accumulated in float32 (fp16/bf16 gradients included)."""
    try:
        return torch._foreach_norm(tensors, 2, dtype=torch.float32)
    except TypeError:  # older torch: no dtype argument, so upcast the half-precision tensors first
        return torch._foreach_norm([t.float() for t in tensors], 2)


def finite_or_none(x):
    return x if math.isfinite(x) else None
