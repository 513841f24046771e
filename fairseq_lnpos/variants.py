"""The architecture registry as data (no fairseq import): variants, sizes and their arch names.

``models/archs.py`` registers one fairseq architecture ``transformer_<variant><size>`` for every
pair below; the grid, the analyses and the benchmark read the same table, and take their lists of
variants from :data:`GROUPS`.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    label: str              # how tables and figures name it
    model: str              # the fairseq model the arch belongs to
    normalize_before: bool  # fairseq's --{encoder,decoder}-normalize-before
    norm: str = None        # --lnpos-norm the arch fixes (models/norms.py); None: the option decides
    options: tuple = ()     # further fairseq options the arch turns on (attribute names of args)
    qk_norm: tuple = None   # (--lnpos-qk-norm, --lnpos-qk-norm-scope) the arch has when they are not given
                            # (models/qknorm.py); None: no QK-norm unless the option asks for it


VARIANTS = {
    # fairseq's transformer and layers plus --lnpos-init (models/variant.py)
    "postln": Variant("Post-LN", "transformer_lnpos", False),
    "preln": Variant("Pre-LN", "transformer_lnpos", True),
    "deepnorm": Variant("DeepNorm", "transformer_deepnorm", False),
    "keel": Variant("Keel", "transformer_keel", False),
    "admin": Variant("Admin", "transformer_admin", False),
    "tfixup": Variant("T-Fixup", "transformer_tfixup", False),
    # Pre-LN with another normalization in place of every LayerNorm
    "preln_rmsnorm": Variant("Pre-RMSNorm", "transformer_lnpos", True, norm="rmsnorm"),
    "dyt": Variant("DyT", "transformer_lnpos", True, norm="dyt"),
    "derf": Variant("Derf", "transformer_lnpos", True, norm="derf"),
    "scalenorm": Variant("ScaleNorm+FixNorm", "transformer_scalenorm", True, norm="scalenorm"),
    "subln": Variant("Sub-LN", "transformer_subln", True),
    # further placements (models/<name>.py)
    "periln": Variant("Peri-LN", "transformer_periln", True),
    "b2t": Variant("B2T", "transformer_b2t", False),
    "residual": Variant("ResiDual", "transformer_residual", False),
    "mixln": Variant("Mix-LN", "transformer_mixln", True),
    "lnscaling": Variant("LN-Scaling", "transformer_lnscaling", True),
    "rezero": Variant("ReZero", "transformer_rezero", False),
    "rezero_postln": Variant("ReZero+Post-LN", "transformer_rezero_postln", False),
    "normformer": Variant("NormFormer", "transformer_normformer", True,
                          options=("scale_attn", "scale_fc", "scale_heads")),
    "olmo2": Variant("OLMo-2", "transformer_olmo2", True, qk_norm=("layernorm", "width")),
    "hybridnorm": Variant("HybridNorm", "transformer_hybridnorm", True, qk_norm=("layernorm", "head")),
    "hybridnorm_star": Variant("HybridNorm*", "transformer_hybridnorm_star", True, qk_norm=("layernorm", "head")),
    "siamesenorm": Variant("SiameseNorm", "transformer_siamesenorm", True),
}
# The named groups of variants, each in VARIANTS order; what reads each is said next to it. A group is
# given here only, by its variants' names; a command's default list of variants is a group.
GROUPS = {
    # the paper's two placements: the Fig. 3 analysis's default --archs (analysis/init_grad.py) and the
    # rows of `make demo-real` (experiments/runs.py, DEMO_ROWS)
    "paper": ("postln", "preln"),
    # `make demo`'s rows (DEMO_ROWS); every other variant is a --with-<variant> of the demo
    "demo": ("postln", "preln", "deepnorm"),
    # Pre-LN with another normalization, and the further placements (models/<name>.py): each has a
    # Multi30k row, a demo row and a throughput target of 0.95 (THROUGHPUT_TARGETS)
    "normalizations": ("preln_rmsnorm", "dyt", "derf", "scalenorm", "subln"),
    "placements": ("periln", "b2t", "residual", "mixln", "lnscaling", "rezero", "rezero_postln", "normformer",
                   "olmo2", "hybridnorm", "hybridnorm_star", "siamesenorm"),
    # the default --archs of the stability map and of the depth map (experiments/sweep.py)
    "stability_map": ("postln", "preln", "deepnorm", "keel"),
    "depth_map": ("postln", "preln", "deepnorm", "keel", "admin", "tfixup"),
    # scripts/tools/gpu_check.py: step 1's gradient norms under fp16 and bf16, step 5's Multi30k rows
    "gpu_precision": ("postln", "keel"),
    "gpu_multi30k": ("postln", "preln", "deepnorm", "keel", "admin"),
}
GROUPS["further"] = GROUPS["normalizations"] + GROUPS["placements"]
for _group in GROUPS.values():
    assert [v for v in VARIANTS if v in _group] == list(_group), _group  # known variants, in VARIANTS order
del _group

# scripts/tools/bench.py: plugin throughput / fairseq throughput at least this (no target for the other variants)
THROUGHPUT_TARGETS = {**dict.fromkeys(GROUPS["paper"], 0.99), **dict.fromkeys(("deepnorm", "admin", "tfixup"), 0.97),
                      **dict.fromkeys(GROUPS["further"], 0.95)}

# --lnpos-init: fairseq 0.12's own initialization (the default) or that of an older fairseq
# (models/variant.py says what each changes)
INITS = ("fairseq-0.12", "fairseq-0.9", "fairseq-0.8")
DEFAULT_INIT = INITS[0]

# size name -> arch-name suffix; dimensions come from fairseq's arch of the same suffix, except tiny
SIZES = {"base": "", "iwslt_de_en": "_iwslt_de_en", "wmt_en_de": "_wmt_en_de", "tiny": "_tiny"}

# the CPU size for demos and tests, per side (encoder_*/decoder_*)
TINY = {"embed_dim": 128, "ffn_embed_dim": 512, "attention_heads": 4, "layers": 6}


def arch_name(variant, size="base"):
    """``arch_name("preln", "tiny")`` -> ``transformer_preln_tiny``."""
    if variant not in VARIANTS:
        from .errors import LnposError

        raise LnposError(f"unknown architecture variant {variant!r}: one of {', '.join(VARIANTS)}")
    if size not in SIZES:
        from .errors import LnposError

        raise LnposError(f"unknown size {size!r}: one of {', '.join(SIZES)}")
    return f"transformer_{variant}{SIZES[size]}"


def arch_names():
    """Every registered arch name -> (variant, size)."""
    return {arch_name(v, s): (v, s) for v in VARIANTS for s in SIZES}
