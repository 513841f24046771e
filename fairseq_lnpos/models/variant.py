"""A fairseq ``transformer`` whose encoder and decoder layers are plugin layer classes.

Only the layer class differs from fairseq's model: options, embeddings, generation and
checkpoints are fairseq's own. Every plugin model has one option of its own, ``--lnpos-init``:

* ``fairseq-0.12`` (default): fairseq 0.12's initialization, untouched. fc1/fc2 of every layer and
  the q/k/v projection biases are PyTorch's default ``nn.Linear`` init (weights uniform with
  variance 1/(3 fan_in), biases uniform in +-1/sqrt(fan_in)): ``build_fc1``/``build_fc2`` in
  ``fairseq/modules/transformer_layer.py`` since v0.10.0, q/k/v ``nn.Linear`` in
  ``fairseq/modules/multihead_attention.py`` since v0.9.0.
* ``fairseq-0.9``: fc1/fc2 Xavier-uniform with zero bias, as v0.8.0 and v0.9.0 build them in
  ``fairseq/modules/transformer_layer.py`` (its ``Linear`` helper); q/k/v biases as in 0.12 (v0.9.0's
  ``multihead_attention.py`` made q/k/v separate ``nn.Linear``s with PyTorch's default bias). The
  fairseq of T-Fixup's official code.
* ``fairseq-0.8``: ``fairseq-0.9`` plus zero q/k/v biases (v0.8.0's ``multihead_attention.py``
  zeroes its single ``in_proj_bias``): the fairseq of Xiong et al.'s time and of Transformer-Clinic
  (Admin's official code).

Nothing else differs between these versions: v0.8.0's one Xavier-uniform ``in_proj_weight`` of
shape (3d, d) has the bound sqrt(6 / 4d) that 0.12 gets from Xavier-uniform with gain 2^-1/2 on each
(d, d) projection; out_proj (Xavier-uniform, zero bias), the embeddings (normal, std d^-1/2,
padding row zero), the output projection (normal, std d^-1/2) and LayerNorm (1, 0) are the same.

A layer applies the chosen initialization right after fairseq built it, before a variant's own
initialization (DeepNorm's, T-Fixup's; Admin's profiling comes later still), as those papers did.
"""
import argparse
import functools
import logging

from fairseq.distributed import fsdp_wrap
from fairseq.models import ARCH_MODEL_REGISTRY, register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from ..errors import check
from ..variants import DEFAULT_INIT, INITS
from .norms import DEFAULT_NORM, NORMS, replace_norms
from .qknorm import QK_NORMS, QK_SCOPES, add_qk_norm

logger = logging.getLogger(__name__)


def layer_attentions(layer):
    """The attention modules of a fairseq encoder or decoder layer (self, then cross if any)."""
    return [a for a in (layer.self_attn, getattr(layer, "encoder_attn", None)) if a is not None]


def apply_init(layer, cfg):
    """Re-initialise a just-built fairseq layer as ``--lnpos-init`` says (see the module docstring)."""
    init = getattr(cfg, "lnpos_init", None) or DEFAULT_INIT
    check(init in INITS, f"--lnpos-init {init!r}: one of {', '.join(INITS)}")
    if init == DEFAULT_INIT:
        return
    for fc in (layer.fc1, layer.fc2):
        nn.init.xavier_uniform_(fc.weight)
        nn.init.zeros_(fc.bias)
    if init == "fairseq-0.9":
        return
    for attn in layer_attentions(layer):
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)


class EncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with ``--lnpos-init`` applied and ``--lnpos-qk-norm`` on its attention;
    every plugin encoder layer subclasses it."""

    normalize_values = False  # the QK-norm normalises the values too (models/qknorm.py)

    def __init__(self, cfg, index=0, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        apply_init(self, cfg)
        add_qk_norm(layer_attentions(self), cfg, values=self.normalize_values)


class DecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with ``--lnpos-init`` applied and ``--lnpos-qk-norm`` on its self- and
    cross-attention; every plugin decoder layer subclasses it."""

    normalize_values = False

    def __init__(self, cfg, no_encoder_attn=False, index=0):
        super().__init__(cfg, no_encoder_attn)
        apply_init(self, cfg)
        add_qk_norm(layer_attentions(self), cfg, values=self.normalize_values)


def without_fused_inference(module):
    """Keep every encoder layer in ``module`` off upstream fairseq 0.12.2's fused inference path.

    Upstream 0.12.2 runs a Post-LN encoder layer that was loaded from a checkpoint, in eval mode,
    through torch's ``_transformer_encoder_layer_fwd``. That kernel computes plain Post-LN (wrong
    for DeepNorm's scaled skip and Keel's extra LayerNorms) and, with torch >= 2.0, fails on padded
    batches ("Mask Type should be defined", fairseq issue 4858) for fairseq's own Post-LN too.
    fairseq-fixed 0.12.3.1 has no such path, and the attribute set here is then unused.
    """
    for m in module.modules():
        if hasattr(m, "can_use_fastpath"):
            m.can_use_fastpath = False
    return module


def wrap_like_fairseq(layer, cfg):
    """Activation checkpointing and FSDP, with the policy fairseq applies to its own layers."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


def finish_stack(stack, cfg):
    """After fairseq built an encoder or decoder: the module that follows its last layer (fairseq's
    ``layer_norm`` slot: Pre-LN's final LayerNorm or nothing) becomes the layer class's own where it
    has one (``layer_cls.build_stack_output(cfg)``), then ``--lnpos-norm`` replaces every LayerNorm
    of the stack. Returns how many it replaced."""
    build = getattr(stack.layer_cls, "build_stack_output", None)
    if build is not None:
        stack.layer_norm = build(cfg)
    return replace_norms(stack, cfg)


class VariantEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, layer_cls, return_fc=False):
        self.layer_cls, self._built = layer_cls, 0
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.norms_replaced = finish_stack(self, cfg)

    def build_encoder_layer(self, cfg):
        layer = without_fused_inference(self.layer_cls(cfg, index=self._built, return_fc=self.return_fc))
        self._built += 1
        return wrap_like_fairseq(layer, cfg)


class VariantDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, layer_cls, no_encoder_attn=False):
        self.layer_cls, self._built = layer_cls, 0
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.norms_replaced = finish_stack(self, cfg)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = self.layer_cls(cfg, no_encoder_attn, index=self._built)
        self._built += 1
        return wrap_like_fairseq(layer, cfg)


class VariantTransformerModel(TransformerModel):
    """Subclasses set the two layer classes (constructed as ``cls(cfg, ..., index=i)``)."""

    encoder_layer_cls = EncoderLayer
    decoder_layer_cls = DecoderLayer

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--lnpos-init", choices=INITS, default=DEFAULT_INIT,
                            help="fairseq-0.12: fairseq 0.12's own initialization (default); fairseq-0.9: "
                            "Xavier-uniform fc1/fc2 with zero biases; fairseq-0.8: also zero q/k/v biases "
                            "(the fairseq of Xiong et al. 2020 and Admin)")
        parser.add_argument("--lnpos-norm", choices=NORMS, default=DEFAULT_NORM,
                            help="what every LayerNorm of the model becomes: layernorm (unchanged, default), "
                            "rmsnorm, dyt (weight * tanh(alpha x) + bias), derf (weight * erf(alpha x + s) + bias) "
                            "or scalenorm (g x / ||x||)")
        parser.add_argument("--lnpos-norm-alpha", type=float, metavar="A",
                            help="initial alpha of dyt and derf (default 0.5)")
        parser.add_argument("--lnpos-qk-norm", choices=QK_NORMS,
                            help="normalise the queries and keys of every attention after their projection: "
                            "none (default; transformer_olmo2 and transformer_hybridnorm*: layernorm), layernorm, "
                            "rmsnorm, or l2 (unit length, logits times a learned scalar g, Henry et al. 2020)")
        parser.add_argument("--lnpos-qk-norm-scope", choices=QK_SCOPES,
                            help="head: one norm per head (default); width: over the full width, then split "
                            "into heads (OLMo-2; transformer_olmo2's default)")
        parser.add_argument("--lnpos-qk-norm-length", type=int, metavar="L",
                            help="l2's g starts at log2(L^2 - L), L the 97.5th percentile of the training "
                            "sequence lengths (default 72)")

    @classmethod
    def coefficients(cls, args):
        """One line for the training log with the variant's depth-dependent constants, or None."""
        return None

    @staticmethod
    def one_layer_stack(args):
        """The first stack of ``args`` ("encoder" or "decoder") that has a single layer, or None: where a
        variant differs from another only from its second layer on, such a stack is that other variant."""
        return next((side for side in ("encoder", "decoder") if getattr(args, f"{side}_layers") == 1), None)

    @classmethod
    def same_as_another(cls, args):
        """Why ``args`` make this variant another one (a Mix-LN stack without Post-LN layers is Pre-LN),
        as the end of one line, or None. Such a model is refused: it would be labelled with a
        variant it is not."""
        return None

    @classmethod
    def build_model(cls, args, task):
        why = cls.same_as_another(args)
        check(why is None, f"{args.arch}: {why}")
        line = cls.coefficients(args)
        if line:
            logger.info(line)
        return super().build_model(args, task)

    def __init__(self, args, encoder, decoder):
        norm = getattr(args, "lnpos_norm", None) or DEFAULT_NORM
        check(norm == DEFAULT_NORM or encoder.norms_replaced + decoder.norms_replaced > 0,
              f"--lnpos-norm {norm}: {args.arch} has no LayerNorm to replace; drop the option")
        super().__init__(args, encoder, decoder)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return VariantEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens, cls.encoder_layer_cls)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return VariantDecoder(cfg, tgt_dict, embed_tokens, cls.decoder_layer_cls,
                              no_encoder_attn=cfg.no_cross_attention)


@register_model("transformer_lnpos")
class LnposTransformerModel(VariantTransformerModel):
    """Post-LN and Pre-LN: fairseq's transformer and its layers, plus ``--lnpos-init``. With the
    default initialization its parameters equal those of fairseq's ``transformer`` built with the
    same seed and options."""


def _dests(add_args):
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser)
    return [action.dest for action in parser._actions]


@functools.lru_cache(maxsize=None)
def own_options(model_cls):
    """The options a plugin model adds to fairseq's transformer (``lnpos_init``, ``lnpos_norm``,
    ``mixln_post_ratio`` ...), as attribute names."""
    fairseq = set(_dests(TransformerModel.add_args))
    return tuple(d for d in _dests(model_cls.add_args) if d not in fairseq)


ABSENT = object()


def _option(cfg, key):
    if hasattr(cfg, "keys"):  # a DictConfig (a checkpoint's cfg.model) or a dict
        return cfg[key] if key in cfg else ABSENT
    return getattr(cfg, key, ABSENT)  # an argparse Namespace (fairseq-train's cfg.model)


def experiment(model_cfg):
    """What defines the experiment of a model configuration (fairseq's ``cfg.model``, which fairseq
    saves in every checkpoint): its ``--arch``, where its LayerNorms sit (``--*-normalize-before``)
    and, for a plugin arch, every option of the plugin's model (:func:`own_options`: the
    initialization, the normalization, the variant's own constants). A dict of the options the
    configuration holds; sizes are not in it (weights of other sizes do not load anyway)."""
    arch = _option(model_cfg, "arch")
    keys = ["arch", "encoder_normalize_before", "decoder_normalize_before"]
    model_cls = ARCH_MODEL_REGISTRY.get(arch) if isinstance(arch, str) else None
    if model_cls is not None and issubclass(model_cls, VariantTransformerModel):
        keys += own_options(model_cls)
    found = {k: _option(model_cfg, k) for k in keys}
    return {k: v for k, v in found.items() if v is not ABSENT}
