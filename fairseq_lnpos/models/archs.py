"""Named architectures: every variant of ``variants.VARIANTS`` x {base, iwslt_de_en, wmt_en_de, tiny}.

A variant fixes where LayerNorm sits (and, except for Post-LN and Pre-LN, the model class); a size fills in
fairseq's defaults for dimensions and depth, which the command line can override as usual.
Post-LN and Pre-LN are fairseq's ``transformer`` and its layers (model ``transformer_lnpos``, which adds
``--lnpos-init``): Pre-LN is exactly
``--encoder-normalize-before --decoder-normalize-before`` (fairseq then adds the final
LayerNorm of each stack itself), Post-LN is the same model without them.
"""
import importlib
import pkgutil

from fairseq.models import MODEL_REGISTRY, register_model_architecture
from fairseq.models.transformer import base_architecture, transformer_iwslt_de_en, transformer_wmt_en_de

from ..errors import LnposError, check
from .norms import norm_options
from .qknorm import qk_norm_options
from ..variants import SIZES, TINY, VARIANTS, arch_name


def import_model_modules():
    """Import every module of this package: each registers the fairseq models it defines (those that
    variants.VARIANTS names); a variant whose model none registers is an error."""
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):
        if f"{__package__}.{info.name}" != __name__:
            importlib.import_module(f"{__package__}.{info.name}")
    missing = sorted({v.model for v in VARIANTS.values()} - set(MODEL_REGISTRY))
    if missing:
        raise LnposError(f"no module of {package.__path__[0]} registers the model {', '.join(missing)} that "
                         f"variants.VARIANTS names: register it there with @register_model")


import_model_modules()


def tiny_architecture(args):
    """A CPU size for demos and tests (``variants.TINY``): 6+6 layers, d 128, FFN 512, 4 heads."""
    for side in ("encoder", "decoder"):
        for key, value in TINY.items():
            if not hasattr(args, f"{side}_{key}"):
                setattr(args, f"{side}_{key}", value)
    base_architecture(args)


FILL_DEFAULTS = {
    "base": base_architecture,
    "iwslt_de_en": transformer_iwslt_de_en,
    "wmt_en_de": transformer_wmt_en_de,
    "tiny": tiny_architecture,
}
assert set(FILL_DEFAULTS) == set(SIZES)

ARCHS = {}  # arch name -> variant


def register_variant(variant, model, normalize_before, norm, options, qk_norm):
    for size, fill_defaults in FILL_DEFAULTS.items():
        name = arch_name(variant, size)

        def arch(args, fill_defaults=fill_defaults, name=name):
            # The variant is what the name says: it overrides --{encoder,decoder}-normalize-before
            # (and --lnpos-norm where it names a normalization, and the fairseq options it turns on).
            args.encoder_normalize_before = args.decoder_normalize_before = normalize_before
            norm_options(args, fixed=norm, arch=name)
            if norm is not None:
                args.lnpos_norm = norm
            for option in options:
                setattr(args, option, True)
            kind, scope, _ = qk_norm_options(args, fixed=qk_norm, arch=name)
            if qk_norm is not None:  # what the arch has, written where fairseq saves the model's options
                args.lnpos_qk_norm, args.lnpos_qk_norm_scope = kind, scope
            fill_defaults(args)
            for side in ("encoder", "decoder"):
                layers = getattr(args, f"{side}_layers")
                check(layers >= 1, f"--{side}-layers must be at least 1 for {name}, got {layers}")

        register_model_architecture(model, name)(arch)
        ARCHS[name] = variant


for _name, _v in VARIANTS.items():
    register_variant(_name, _v.model, _v.normalize_before, _v.norm, _v.options, _v.qk_norm)
