"""The paper's experiment grid as data: one row per named run.

Every value the paper gives is in ``RUNS`` or ``DATASETS`` below; every value it does not give is an
explicit default in ``DATASETS`` / ``Run`` with the reason next to it (see "Defaults" below).
``commands.py`` turns a row into a fairseq-train command line, ``report.py`` puts the paper's value next
to the measured one. A new run is one more line in ``RUNS``; the demo, ``real-*`` and further Multi30k
rows are one per variant of their group (``variants.GROUPS``).

Sources: Xiong et al. ICML 2020 (Sec. 3.2, Sec. 4, App. A, App. H).

Defaults (the paper is silent; our rule: add nothing fairseq does not do by default):
- weight decay 0, gradient clipping off (``--clip-norm 0``), no embedding sharing: fairseq's
  defaults, i.e. exactly the flags the paper lists and nothing else.  (fairseq's own IWSLT recipe uses
  dropout 0.3, weight decay 1e-4 and shared decoder embeddings; the paper states dropout 0.1.)
- epochs: IWSLT 15 (the paper's Fig. 2 and text compare checkpoints up to the 15th epoch);
  App. H's fixed-lr run 27 epochs (as stated); WMT 20 (not stated; the decay at epoch 6 lies well
  inside).
- WMT dropout 0.1 (Transformer base; not stated by the paper).
- RAdam: betas (0.9, 0.98), eps 1e-8, lr_max 5e-4 like the Adam runs ("everything else unchanged");
  linear decay from lr_max to 0 over the whole run, which fairseq expresses as
  ``polynomial_decay --power 1`` with ``--total-num-update`` = updates per epoch x epochs
  (computed from the data dir at launch).
- WMT Pre-LN step decay: factor 0.1 at epoch 6 (the factor is not stated; 0.1 as for IWSLT), then
  inverse square root (``--inverse-sqrt-after-decay``).
- SGD: fairseq's ``sgd`` without momentum ("vanilla" in the paper).
- "No warm-up" is ``--warmup-updates 1`` (the paper's T_warmup = 1): the first update runs at lr_max.
- Inverse-square-root decay: "the same decay for every run" (the paper) is read as one decay
  curve shared by all warm-up lengths: lr_max is held until update 4000 (the longest warm-up), then
  lr_max * sqrt(4000 / t) (``--decay-anchor 4000``). For T = 4000 this is fairseq's usual
  ``inverse_sqrt``; T = 500 and T = 1 differ from it only before update 4000. (The literal
  alternative, decaying right after each run's own warm-up, would give the no-warm-up run
  lr_max / 10 by update 100, so it would fail by starving, not by instability.)
  ``--set decay_anchor=N`` changes it.
- Decoding: beam 5, length penalty 1.2 for both datasets (the paper states it; it does not say
  whether checkpoints were averaged: we do not average), in fp32 also when the grid trains with
  ``--fp16`` (fairseq-generate's default; ``decode_fp16`` for a row that decoded in fp16).
- Initialization: fairseq 0.8's (``init="fairseq-0.8"``, the fairseq of the paper's time) for every
  ``iwslt-*`` and ``wmt-*`` row; the demo, Multi30k and sweep rows keep fairseq 0.12's own.

The ``ref-*`` rows (``REFERENCE`` below) are other papers' recipes, knob for knob from their
official code, with their published numbers: docs/published.md lists them and their sources.
"""
import math
from dataclasses import asdict, dataclass, field, fields, replace

from ..common import plain_name
from ..data import BIN_DIRS
from ..cli import Range
from ..errors import LnposError
from ..launch import ADAM_BETAS, LABEL_SMOOTHING
from ..variants import DEFAULT_INIT, GROUPS, INITS, VARIANTS

# Dataset-level settings. `batch_tokens` is the effective batch of one update (tokens), the same
# whatever the number of GPUs: commands.batch_plan picks --max-tokens/--update-freq to reach it.
DATASETS = {
    "iwslt14": dict(
        arch_size="iwslt_de_en", default_data=BIN_DIRS["iwslt14"], source_lang="de",
        target_lang="en", max_tokens=4096, batch_tokens=4096, max_epoch=15, dropout=0.1,
    ),
    # Multi30k task 1 (data-prep/prepare-multi30k.sh): real De-En text, 29k pairs, ~115 updates of
    # 4096 tokens an epoch; the paper's IWSLT model and settings, 12 epochs
    "multi30k": dict(
        arch_size="iwslt_de_en", default_data=BIN_DIRS["multi30k"], source_lang="de",
        target_lang="en", max_tokens=4096, batch_tokens=4096, max_epoch=12, dropout=0.1,
    ),
    # `make demo-real` (demo.py --data multi30k): the same Multi30k data dir on the `_tiny` archs on a
    # CPU, sized by timed runs ("Real text on a CPU" of `git show 36640e8:docs/results.md`): small batches, a budget
    # in updates, all embeddings shared (one joined dictionary), beam 5 on test2016
    "multi30k_cpu": dict(
        arch_size="tiny", default_data=BIN_DIRS["multi30k"], source_lang="de", target_lang="en",
        max_tokens=1024, batch_tokens=1024, max_epoch=2, dropout=0.1,
    ),
    # `make demo`: the generated corpus (data-prep/make-synthetic.sh) on the `_tiny` archs, on a CPU.
    # Small batches and 3 short epochs (~100 updates each with --train 4500) keep a run near 2 minutes
    # on 2 cores; see fairseq_lnpos/demo.py for the settings.
    "synthetic": dict(
        arch_size="tiny", default_data="demo-out/data/bin", source_lang="de", target_lang="en",
        max_tokens=512, batch_tokens=512, max_epoch=3, dropout=0.1,
    ),
    "wmt14": dict(
        arch_size="wmt_en_de", default_data=BIN_DIRS["wmt14"], source_lang="en",
        target_lang="de", max_tokens=8192, batch_tokens=8192 * 16, max_epoch=20, dropout=0.1,
    ),
}

# inverse_sqrt: warmup_inverse_sqrt (the paper's); fairseq_inverse_sqrt: fairseq's own inverse_sqrt, warm-up
# from warmup_init_lr; inverse_sqrt_nowarmup: lr * sqrt(A / (A + t)) (T-Fixup's); linear: fairseq's
# polynomial_decay --power 1 (warm-up from 0, then down to end_lr at the last update)
SCHEDULES = ("inverse_sqrt", "fairseq_inverse_sqrt", "inverse_sqrt_nowarmup", "step_decay", "linear", "fixed")
SHARES = ("none", "decoder", "all")  # --share-decoder-input-output-embed, --share-all-embeddings
OPTIMIZERS = ("adam", "sgd", "radam", "giadam")


@dataclass(frozen=True)
class Run:
    name: str
    dataset: str                 # key of DATASETS
    ln: str                      # the variant (variants.py; arch transformer_<variant>_<size>); `ln` as
    #                              config.json and --set name it
    optimizer: str               # adam | sgd | radam
    lr: float                    # lr_max
    warmup: int = 0              # warm-up updates; 0 = none (emitted as the paper's T_warmup = 1)
    schedule: str = "inverse_sqrt"
    decay_anchor: int = 4000     # inverse_sqrt: lr_max held until this update, then lr_max * sqrt(A / t)
    decay_epoch: int = 0         # step_decay: multiply the lr by decay_factor at this epoch
    decay_factor: float = 0.1
    inverse_sqrt_after_decay: bool = False
    figure: str = "misc"         # which figure the run is drawn in (report.py)
    paper_bleu: float = None     # the paper's reported test BLEU, where it gives one number
    paper_valid_loss: float = None
    paper_note: str = ""         # what the paper says about this run, in words
    # Filled from DATASETS when None (see with_defaults).
    max_epoch: int = None
    dropout: float = None
    max_tokens: int = None       # per GPU and forward pass
    batch_tokens: int = None     # per update, all GPUs and --update-freq together
    max_update: int = 0          # a budget in updates (stability sweeps); 0 = epochs only
    layers: int = None           # encoder and decoder depth; None = the arch's own
    # fairseq defaults, written out so that they are visible in every command.
    adam_betas: str = ADAM_BETAS
    adam_eps: float = 1e-8
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    label_smoothing: float = LABEL_SMOOTHING
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # Knobs of the other papers' recipes (the ref-* rows); the defaults are what the rows above use.
    warmup_init_lr: float = 0.0  # fairseq_inverse_sqrt: the warm-up starts at this rate (--warmup-init-lr)
    decay_period: int = 4000     # inverse_sqrt_nowarmup: lr * sqrt(A / (A + t)), A = decay_period
    end_lr: float = 0.0          # linear: the rate at the last update (--end-learning-rate)
    decoupled_weight_decay: bool = False  # radam: AdamW-style decay (fairseq's adam always decouples)
    share_embeddings: str = "none"  # none | decoder | all (needs a joined dictionary)
    init: str = DEFAULT_INIT     # --lnpos-init
    beam: int = 5                # decoding (fairseq-generate)
    lenpen: float = 1.2
    decode_fp16: bool = False    # under the grid's --fp16 also decode in fp16; else decoding is fp32
    average_last: int = 0        # also score the average of the last N epoch checkpoints; 0 = none
    compound_split_bleu: bool = False  # also tok BLEU with hyphenated compounds split (compound_split_bleu.sh)
    source: str = ""             # where the recipe and the published number come from
    task: str = "translation"    # "translation_lnpos" adds per-layer gradient-norm logging
    extra: tuple = field(default_factory=tuple)  # further fairseq-train flags for this row

    def with_defaults(self):
        ds = DATASETS[self.dataset]
        filled = {k: ds[k] for k in ("max_epoch", "dropout", "max_tokens", "batch_tokens")
                  if getattr(self, k) is None}
        return replace(self, **filled)

    @property
    def warmup_label(self):
        return warmup_label(self.warmup)

    def as_dict(self):
        """The fields as recorded in config.json (and hashed): those of :data:`LATER_FIELDS` only when
        set, so that a run folder written before they existed keeps its hash and resumes."""
        d = asdict(self)
        d["extra"] = list(self.extra)
        return {k: v for k, v in d.items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}

    @classmethod
    def from_dict(cls, d):
        """The Run that :meth:`as_dict` recorded as ``d``: a field it lacks (added later) has its
        default, a field this version does not know is not read."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        if "extra" in values:
            values["extra"] = tuple(values["extra"])
        return cls(**values)


# fields added to Run after run folders were first written, with the value older runs had
LATER_FIELDS = {"decode_fp16": False, "compound_split_bleu": False}


def warmup_updates(warmup):
    """The warm-up a run has, 0 for none: 0 and 1 (the paper's T_warmup = 1) both mean no warm-up."""
    return warmup if warmup > 1 else 0


def warmup_label(warmup):
    """The warm-up as the tables and the stability map show it: its updates, or "none" (:func:`warmup_updates`)."""
    return str(warmup) if warmup_updates(warmup) else "none"


XIONG = "Xiong et al. ICML 2020"
NOT_IN_PAPER = "not in the paper"
# the source of a row whose configuration the paper does not have: only its settings are the paper's
XIONG_SETTINGS = f"{XIONG}'s IWSLT14 settings; this arch is not in it"


def _iwslt(name, variant, opt, lr, **kw):
    source = XIONG_SETTINGS if kw.get("paper_note") == NOT_IN_PAPER else XIONG
    return Run(name=name, dataset="iwslt14", ln=variant, optimizer=opt, lr=lr, init="fairseq-0.8", source=source, **kw)


def _demo(name, variant, warmup=0):
    # constant lr 1e-3 after the warm-up: no decay inside the demo's ~300 updates
    return Run(name=name, dataset="synthetic", ln=variant, optimizer="adam", lr=1e-3, warmup=warmup,
               decay_anchor=100000, figure="demo", paper_note="CPU demo (synthetic corpus)")


def _real(name, variant, warmup=0, lr=1e-3):
    # the demo's schedule on real text: constant lr (1e-3) after the warm-up
    return Run(name=name, dataset="multi30k_cpu", ln=variant, optimizer="adam", lr=lr, warmup=warmup,
               decay_anchor=100000, share_embeddings="all", figure="real", paper_note="CPU demo (Multi30k)")


def _m30k(name, variant, opt, lr, **kw):
    return Run(name=name, dataset="multi30k", ln=variant, optimizer=opt, lr=lr, paper_note=NOT_IN_PAPER,
               source=f"{XIONG}'s IWSLT14 settings on Multi30k; not in it", **kw)


def _wmt(name, variant, opt, lr, **kw):
    return Run(name=name, dataset="wmt14", ln=variant, optimizer=opt, lr=lr, init="fairseq-0.8", source=XIONG, **kw)


# Other papers' IWSLT14 De-En recipes, every knob as their official code sets it (the file named in
# `source`; fairseq <= 0.9 defaults where a command line leaves a knob out, e.g. --clip-norm 25).
# What fairseq 0.12 cannot reproduce exactly is listed in docs/published.md.
CLINIC = dict(  # Admin's code: RAdam, warm-up from 1e-7, 90 epochs (at most 100k updates), last 10 averaged
    optimizer="radam", lr=7e-4, adam_betas="(0.9, 0.98)", decoupled_weight_decay=True,
    schedule="fairseq_inverse_sqrt", warmup=6000, warmup_init_lr=1e-7, dropout=0.3, attention_dropout=0.1,
    activation_dropout=0.1, weight_decay=1e-4, clip_norm=0.0, share_embeddings="all", max_tokens=4096,
    batch_tokens=4096, beam=5, lenpen=1.0, decode_fp16=True, average_last=10, init="fairseq-0.8", figure="reference",
    source="Liu et al. EMNLP 2020; LiyuanLucasLiu/Transformer-Clinic nmt-experiments/iwslt14_de-en.md, "
           "eval_iwslt_de-en.sh")
# T-Fixup's code: `--optimizer adam`, whose class in that fork takes RAdam's rectified step with decoupled
# weight decay (fairseq/optim/adam.py:204-253; plain Adam only through apex's FusedAdam, :31-41), without
# warm-up, lr * sqrt(4000 / (4000 + t)), 300 epochs; docs/published.md says why radam
TFIXUP = dict(
    optimizer="radam", decoupled_weight_decay=True, lr=5e-4, adam_betas="(0.9, 0.98)",
    schedule="inverse_sqrt_nowarmup", decay_period=4000, dropout=0.5, weight_decay=1e-4, clip_norm=25.0,
    share_embeddings="decoder", max_tokens=4000,
    batch_tokens=4000, beam=4, lenpen=0.3, average_last=10, compound_split_bleu=True, init="fairseq-0.9",
    figure="reference", source="Huang et al. ICML 2020; layer6ai-labs/T-Fixup Train_IWSLT_TFixup_example.sh, fairseq/optim/adam.py, "
           "InferenceIWSLT.py")
RADAM = dict(  # the RAdam repository's NMT recipe: Post-LN, betas (0.9, 0.999), linear decay over 70k updates
    ln="postln", lr=3e-4, adam_betas="(0.9, 0.999)", schedule="linear", end_lr=1e-9, dropout=0.3,
    weight_decay=1e-4, clip_norm=25.0, max_tokens=4000, batch_tokens=4000, beam=5, lenpen=1.0, average_last=10,
    init="fairseq-0.8", figure="reference",
    source="Liu et al. ICLR 2020; LiyuanLucasLiu/RAdam nmt/recipes.md, nmt/eval.sh")
# name, recipe, IWSLT14 length, Multi30k length (the same number of epochs; the RAdam repository's 70k
# updates are about 64 IWSLT14 epochs of 1100 updates), published BLEU, note
_REFERENCE = [
    ("clinic-admin", dict(CLINIC, ln="admin"), dict(max_epoch=90, max_update=100000), 90, 35.67, "mean of 5 seeds"),
    ("clinic-postln", dict(CLINIC, ln="postln"), dict(max_epoch=90, max_update=100000), 90, 35.64, "mean of 5 seeds"),
    ("clinic-preln", dict(CLINIC, ln="preln"), dict(max_epoch=90, max_update=100000), 90, 35.50, "mean of 5 seeds"),
    ("tfixup", dict(TFIXUP, ln="tfixup"), dict(max_epoch=300), 300, 35.73,
     "the best 10-epoch average ending at epochs 250-300, chosen on the test set (epochs 278-287)"),
    ("tfixup-adam", dict(TFIXUP, ln="tfixup", optimizer="adam", decoupled_weight_decay=False), dict(max_epoch=300),
     300, None, "the fork's Adam with apex's FusedAdam (plain Adam); 35.73 is the RAdam step's (docs/published.md)"),
    ("radamrepo-adam-wu4000", dict(RADAM, optimizer="adam", warmup=4000), dict(max_epoch=10 ** 6, max_update=70000),
     64, 34.66, "Adam with warm-up 4000"),
    ("radamrepo-radam-nowu", dict(RADAM, optimizer="radam", decoupled_weight_decay=True),
     dict(max_epoch=10 ** 6, max_update=70000), 64, 34.76, "RAdam without warm-up"),
]
REFERENCE = [
    *[Run(name=f"ref-iwslt-{name}", dataset="iwslt14", **recipe, **length, paper_bleu=bleu, paper_note=note)
      for name, recipe, length, _, bleu, note in _REFERENCE],
    *[Run(name=f"ref-multi30k-{name}", dataset="multi30k", **recipe, max_epoch=epochs,
          paper_note="Multi30k twin: no published number")
      for name, recipe, _, epochs, _, _ in _REFERENCE],
]

ABOUT_34 = "about 34 (Adam, warm-up 4000)"
RUNS = [
    # --- IWSLT14 Post-LN warm-up study, Adam (Sec. 3.2, Fig. 2) -------------------------------
    _iwslt("iwslt-postln-adam-lr5e-4-wu4000", "postln", "adam", 5e-4, warmup=4000, figure="warmup",
           paper_bleu=34.0, paper_note=ABOUT_34 + "; also the Pre-LN comparison baseline (Sec. 4)"),
    _iwslt("iwslt-postln-adam-lr5e-4-wu500", "postln", "adam", 5e-4, warmup=500, figure="warmup",
           paper_bleu=31.16, paper_note="31.16"),
    _iwslt("iwslt-postln-adam-lr5e-4-nowu", "postln", "adam", 5e-4, figure="warmup",
           paper_note="8.45 for Adam without warm-up; lr_max not stated"),
    _iwslt("iwslt-postln-adam-lr1e-3-wu4000", "postln", "adam", 1e-3, warmup=4000, figure="warmup",
           paper_note=ABOUT_34 + "; lr_max not stated"),
    _iwslt("iwslt-postln-adam-lr1e-3-wu500", "postln", "adam", 1e-3, warmup=500, figure="warmup",
           paper_bleu=2.77, paper_note="2.77"),
    _iwslt("iwslt-postln-adam-lr1e-3-nowu", "postln", "adam", 1e-3, figure="warmup",
           paper_note="8.45 for Adam without warm-up; lr_max not stated"),
    # --- IWSLT14 Post-LN warm-up study, SGD ---------------------------------------------------
    _iwslt("iwslt-postln-sgd-lr5e-3-wu4000", "postln", "sgd", 5e-3, warmup=4000, figure="warmup",
           paper_note="trains, well below Adam"),
    _iwslt("iwslt-postln-sgd-lr5e-3-nowu", "postln", "sgd", 5e-3, figure="warmup",
           paper_note="just above 0 after 15 epochs"),
    _iwslt("iwslt-postln-sgd-lr1e-3-wu4000", "postln", "sgd", 1e-3, warmup=4000, figure="warmup",
           paper_note="trains, well below Adam"),
    _iwslt("iwslt-postln-sgd-lr1e-3-nowu", "postln", "sgd", 1e-3, figure="warmup",
           paper_note="just above 0 after 15 epochs"),
    # --- App. H: Post-LN at a fixed small lr, no warm-up --------------------------------------
    _iwslt("iwslt-postln-adam-lr1e-4-fixed", "postln", "adam", 1e-4, schedule="fixed", max_epoch=27,
           figure="warmup", paper_valid_loss=4.3, paper_note="valid loss about 4.3 after 27 epochs"),
    # --- RAdam, no warm-up, linear decay (Sec. 4) ---------------------------------------------
    _iwslt("iwslt-postln-radam-lr5e-4-linear", "postln", "radam", 5e-4, schedule="linear",
           figure="radam", paper_note="trains Post-LN without warm-up"),
    _iwslt("iwslt-preln-radam-lr5e-4-linear", "preln", "radam", 5e-4, schedule="linear",
           figure="radam", paper_note="about as good as Pre-LN with Adam"),
    # --- Pre-LN without warm-up (Sec. 4); its Post-LN baseline is the first row -----------------
    _iwslt("iwslt-preln-adam-lr5e-4-step8", "preln", "adam", 5e-4, schedule="step_decay",
           decay_epoch=8, figure="main", paper_bleu=34.0, paper_valid_loss=4.0,
           paper_note="about 34; 9th epoch matches Post-LN's 15th; valid loss about 4"),
    # --- WMT14 En-De (Sec. 4) -----------------------------------------------------------------
    _wmt("wmt-preln-adam-lr7e-4-step6", "preln", "adam", 7e-4, schedule="step_decay", decay_epoch=6,
         inverse_sqrt_after_decay=True, figure="wmt"),
    _wmt("wmt-preln-adam-lr1.5e-3-step6", "preln", "adam", 1.5e-3, schedule="step_decay",
         decay_epoch=6, inverse_sqrt_after_decay=True, figure="wmt"),
    _wmt("wmt-postln-adam-lr7e-4-wu4000", "postln", "adam", 7e-4, warmup=4000, figure="wmt"),
    _wmt("wmt-postln-adam-lr1.5e-3-wu4000", "postln", "adam", 1.5e-3, warmup=4000, figure="wmt"),
    # --- DeepNorm (Wang et al. 2022): not in the paper ----------------------------------------
    _iwslt("iwslt-deepnorm-adam-lr5e-4-nowu", "deepnorm", "adam", 5e-4, figure="deepnorm",
           paper_note=NOT_IN_PAPER),
    _iwslt("iwslt-deepnorm-adam-lr1e-3-nowu", "deepnorm", "adam", 1e-3, figure="deepnorm",
           paper_note=NOT_IN_PAPER),
    _iwslt("iwslt-deepnorm-adam-lr5e-4-wu4000", "deepnorm", "adam", 5e-4, warmup=4000,
           figure="deepnorm", paper_note=NOT_IN_PAPER),
    # --- Keel (Chen & Wei 2026): not in the paper; the Keel paper has no translation result -----
    _iwslt("iwslt-keel-adam-lr5e-4-nowu", "keel", "adam", 5e-4, figure="keel", paper_note=NOT_IN_PAPER),
    _iwslt("iwslt-keel-adam-lr5e-4-wu4000", "keel", "adam", 5e-4, warmup=4000, figure="keel",
           paper_note=NOT_IN_PAPER),
    _iwslt("iwslt-keel-radam-lr5e-4-linear", "keel", "radam", 5e-4, schedule="linear", figure="keel",
           paper_note=NOT_IN_PAPER),
    # --- Admin (Liu et al. 2020) and T-Fixup (Huang et al. 2020): not in the paper ------------
    *[_iwslt(f"iwslt-{v}-adam-lr{lr_s}-nowu", v, "adam", lr, figure=v, paper_note=NOT_IN_PAPER)
      for v in ("admin", "tfixup") for lr, lr_s in ((5e-4, "5e-4"), (1e-3, "1e-3"))],
    # --- Multi30k (real De-En text, minutes on one GPU): the IWSLT Adam rows on the same model ------
    *[_m30k(f"multi30k-postln-adam-lr{lr_s}-{wu_s}", "postln", "adam", lr, warmup=wu, figure="multi30k")
      for lr, lr_s in ((5e-4, "5e-4"), (1e-3, "1e-3")) for wu, wu_s in ((0, "nowu"), (500, "wu500"), (4000, "wu4000"))],
    _m30k("multi30k-preln-adam-lr5e-4-nowu", "preln", "adam", 5e-4, figure="multi30k"),
    _m30k("multi30k-postln-radam-lr5e-4-linear", "postln", "radam", 5e-4, schedule="linear", figure="multi30k"),
    _m30k("multi30k-deepnorm-adam-lr5e-4-nowu", "deepnorm", "adam", 5e-4, figure="multi30k"),
    _m30k("multi30k-keel-adam-lr5e-4-nowu", "keel", "adam", 5e-4, figure="multi30k"),
    *[_m30k(f"multi30k-{v}-adam-lr{lr_s}-nowu", v, "adam", lr, figure="multi30k")
      for v in ("admin", "tfixup") for lr, lr_s in ((5e-4, "5e-4"), (1e-3, "1e-3"))],
    *[_m30k(f"multi30k-{v}-adam-lr5e-4-nowu", v, "adam", 5e-4, figure="multi30k") for v in GROUPS["further"]],
    # --- Other papers' recipes, with their published IWSLT14 De-En numbers (docs/published.md) ------
    *REFERENCE,
    # --- `make demo` (synthetic corpus, _tiny archs, CPU); same settings for every architecture ------
    _demo("demo-postln-nowu", "postln"),
    _demo("demo-postln-wu100", "postln", warmup=100),
    *[_demo(f"demo-{v}-nowu", v) for v in VARIANTS if v != "postln"],
    # --- `make demo-real` (Multi30k, _tiny archs, CPU) and every architecture on real text -------------
    *[_real(f"real-{v}-nowu", v) for v in VARIANTS],
    # the warm-up controls: Post-LN, Pre-LN, and the Post-LN fixes that are poor without warm-up on
    # real text after one epoch ("Every architecture on real text" of `git show 36640e8:docs/results.md`)
    *[_real(f"real-{v}-wu100", v, warmup=100) for v in ("postln", "preln", "deepnorm", "b2t")],
    # longer warm-ups of Post-LN (one and two epochs of 506 updates): how long, and how many epochs, until
    # Post-LN with warm-up is as good as Pre-LN per epoch (python -m fairseq_lnpos.analysis.curves)
    *[_real(f"real-postln-wu{w}", "postln", warmup=w) for w in (500, 1000)],
    # the paper's warm-up 500 works at lr_max 5e-4 (31.16 BLEU) and fails at 1e-3 (2.77; Sec. 3.2)
    _real("real-postln-wu500-lr5e-4", "postln", warmup=500, lr=5e-4),
    # DeepNorm and B2T at the paper-size Multi30k rows' lr: does their slow first epoch at 1e-3 come from the lr;
    # Pre-LN at that lr is their reference at the same lr
    *[_real(f"real-{v}-nowu-lr5e-4", v, lr=5e-4) for v in ("preln", "deepnorm", "b2t")],
]

# --- Why does Post-LN need warm-up? (docs/warmup_study.md) --------------------------------------------
# The failing setting of each CPU corpus (the demos' Post-LN without warm-up: Adam (0.9, 0.98), lr 1e-3)
# and one intervention at a time, each testing one explanation; the controls are Pre-LN and Post-LN with
# warm-up 100, which is also the warm-up of 2 / (1 - beta2) updates (Ma & Yarats 2021) at beta2 0.98, so
# one row is both. Every row writes the diagnostics (diagnostics.jsonl, grad_norms.jsonl). Three seeds:
#     scripts/grid.sh run --only 'why-*' --seeds 1,2,3 --data synthetic=DIR --data multi30k_cpu=DIR
WHY_DIAGNOSTICS = ("--log-grad-norms", "--log-diagnostics", "--diagnostics-first", "50", "--diagnostics-interval", "10",
                   "--diagnostics-hessian-updates", "1,50")
# Multi30k: one epoch (about 500 updates), where the demo trains two; who trains shows within it
WHY_BASELINES = {"synthetic": _demo("", "postln"), "multi30k": replace(_real("", "postln"), max_epoch=1)}
# (row name, the fields it changes (a function of the baseline where it scales one), what it tests)
WHY_INTERVENTIONS = [
    ("postln-nowu", {}, "the failing setting: Post-LN, Adam lr 1e-3, no warm-up"),
    ("preln-nowu", {"ln": "preln"}, "control: Pre-LN"),
    ("postln-wu100", {"warmup": 100}, "control: Post-LN with warm-up 100 = 2/(1-beta2) (Ma & Yarats 2021)"),
    ("postln-radam", {"optimizer": "radam"}, "RAdam: Adam's early second moment rectified"),
    ("postln-giadam", {"optimizer": "giadam"}, "GI-Adam: v_0 = g^2 of the first update (Kalra & Barkeshli 2024)"),
    ("postln-beta2-0.95", {"adam_betas": "(0.9, 0.95)"}, "beta2 0.95: a second moment that adapts sooner"),
    ("postln-beta2-0.999", {"adam_betas": "(0.9, 0.999)"}, "beta2 0.999: a slower second moment"),
    ("postln-clip1", {"clip_norm": 1.0}, "gradient clipping at norm 1.0"),
    ("postln-clip0.1", {"clip_norm": 0.1}, "gradient clipping at norm 0.1"),
    ("postln-lr5e-4", {"lr": 5e-4}, "lr 5e-4"),
    ("postln-lr3e-4", {"lr": 3e-4}, "lr 3e-4"),
    ("postln-batch-x4", {"batch_tokens": lambda b: 4 * b.batch_tokens}, "4 x the batch, the same tokens (epochs)"),
    ("postln-batch-div4", {"batch_tokens": lambda b: b.batch_tokens // 4}, "1/4 of the batch, the same tokens (epochs)"),
    ("postln-L3", {"layers": 3}, "3 layers instead of 6"),
    ("postln-init08", {"init": "fairseq-0.8"}, "fairseq 0.8's initialization (Xavier FFN, zero biases)"),
    ("admin-nowu", {"ln": "admin"}, "Admin: the output change kept small (Liu et al. 2020)"),
]


def _why(corpus, suffix, changes, note):
    base = WHY_BASELINES[corpus].with_defaults()
    changes = {k: v(base) if callable(v) else v for k, v in changes.items()}
    return replace(base, name=f"why-{corpus}-{suffix}", figure=f"why-{corpus}", paper_note=note,
                   task="translation_lnpos", extra=WHY_DIAGNOSTICS, **changes)


WHY = [_why(corpus, *row) for corpus in WHY_BASELINES for row in WHY_INTERVENTIONS]
RUNS += WHY

# The demos' rows, per corpus: `make demo` (the generated corpus) and `make demo-real` (Multi30k), each
# the row without warm-up of every variant of its group (variants.GROUPS "demo", "paper") with Post-LN's
# warm-up row second. The first three are the verdict's: Post-LN without warm-up, Post-LN with warm-up,
# Pre-LN without warm-up. ``--with-<variant>`` adds the corpus's row of that variant without warm-up
# (DEMO_OPTIONAL).
DEMO_GROUPS = {"synthetic": ("demo", "demo"), "multi30k": ("real", "paper")}  # corpus -> (row prefix, group)
DEMO_OPTIONAL = {data: f"{prefix}-{{}}-nowu" for data, (prefix, _) in DEMO_GROUPS.items()}
DEMO_ROWS = {data: (f"{prefix}-postln-nowu", f"{prefix}-postln-wu100",
                    *(f"{prefix}-{v}-nowu" for v in GROUPS[group] if v != "postln"))
             for data, (prefix, group) in DEMO_GROUPS.items()}

BY_NAME = {r.name: r for r in RUNS}
assert len(BY_NAME) == len(RUNS), "duplicate run names"


class RunTableError(LnposError):
    """A run name or a --set value that the table does not have."""


def select(only=None):
    """Runs named in ``only`` (a list of names or glob patterns), in table order; all when None."""
    import fnmatch

    if not only:
        return list(RUNS)
    chosen = []
    for pat in only:
        hits = [r for r in RUNS if fnmatch.fnmatchcase(r.name, pat)]
        if not hits:
            raise RunTableError(
                f"unknown run {pat!r}: `scripts/grid.sh list` shows the names (globs like 'iwslt-*' work)"
            )
        chosen += [r for r in hits if r not in chosen]
    return [r for r in RUNS if r in chosen]


UNIT = Range(0, 1)  # [0, 1)
POSITIVE = Range(0, low_open=True)
# the numbers every number field takes, for --set and for the grid's options that set a field of every
# run (--max-epoch, --beam, --lenpen, --average-last); the paper's values are free
RANGES = {
    "lr": POSITIVE, "decay_factor": POSITIVE, "adam_eps": POSITIVE,
    "max_epoch": Range(1), "max_tokens": Range(1), "batch_tokens": Range(1), "decay_anchor": Range(1),
    "layers": Range(1), "decay_period": Range(1), "beam": Range(1),
    "warmup": Range(0), "decay_epoch": Range(0), "max_update": Range(0), "average_last": Range(0),
    "weight_decay": Range(0), "clip_norm": Range(0), "warmup_init_lr": Range(0), "end_lr": Range(0),
    "lenpen": Range(0),
    "dropout": UNIT, "attention_dropout": UNIT, "activation_dropout": UNIT, "label_smoothing": UNIT,
    "momentum": UNIT,
}
FREE_NUMBERS = ("paper_bleu", "paper_valid_loss")
INT_FIELDS = tuple(f.name for f in fields(Run) if f.type is int)  # --set reads them as whole numbers
CHOICES = {"ln": VARIANTS, "dataset": DATASETS, "schedule": SCHEDULES, "optimizer": OPTIMIZERS,
           "share_embeddings": SHARES, "init": INITS}


def adam_betas(text, option):
    """``text`` if it is fairseq's ``--adam-betas`` as Python reads it, "(b1, b2)" with 0 <= b < 1."""
    import ast

    try:
        betas = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        betas = None
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) and b in UNIT for b in betas)):
        raise RunTableError(f"{option} must be two numbers {UNIT.text} written as \"(b1, b2)\", e.g. "
                            f"\"(0.9, 0.98)\", got {text!r}")
    return text


def coerce(run, key, value, option=None):
    """Return ``run`` with field ``key`` set from the string ``value`` (for --set key=value, or for
    the grid's ``option`` that sets that field), range-checked (:data:`RANGES`)."""
    known = {f.name: f for f in fields(Run)}
    if key not in known or key == "name":
        raise RunTableError(f"--set: unknown field {key!r}; fields are {', '.join(sorted(known))}")
    option = option or f"--set {key}"
    cur = getattr(run, key)
    try:
        if key == "extra":
            import shlex
            new = tuple(shlex.split(value))
        elif isinstance(cur, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            new = value.lower() in ("true", "1", "yes")
        elif key in INT_FIELDS:
            new = int(value)
        elif isinstance(cur, str):
            new = value
        else:
            new = None if value == "" else float(value)
    except ValueError:
        raise RunTableError(f"--set {key}={value}: not a valid value for {key}") from None
    if isinstance(new, float) and not math.isfinite(new):
        raise RunTableError(f"--set {key}={value}: give a finite number")
    if key in RANGES and new is not None:
        try:
            RANGES[key].check(option, new)
        except LnposError as e:
            raise RunTableError(str(e)) from None
    if key == "adam_betas":
        adam_betas(new, option)
    if key == "figure":
        plain_name(new, option)
    if key in CHOICES and new not in CHOICES[key]:
        raise RunTableError(f"--set {key}: one of {', '.join(CHOICES[key])}")
    return replace(run, **{key: new})
