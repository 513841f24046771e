"""The variant registry (variants.py): its groups, and the run rows, demo rows and selections made from them."""
from fairseq_lnpos import variants as V
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.launch import config_hash

# the run table's names in order, as they were when the rows were written out by hand
ROW_NAMES = [
    "iwslt-postln-adam-lr5e-4-wu4000", "iwslt-postln-adam-lr5e-4-wu500", "iwslt-postln-adam-lr5e-4-nowu", "iwslt-postln-adam-lr1e-3-wu4000",
    "iwslt-postln-adam-lr1e-3-wu500", "iwslt-postln-adam-lr1e-3-nowu", "iwslt-postln-sgd-lr5e-3-wu4000", "iwslt-postln-sgd-lr5e-3-nowu",
    "iwslt-postln-sgd-lr1e-3-wu4000", "iwslt-postln-sgd-lr1e-3-nowu", "iwslt-postln-adam-lr1e-4-fixed", "iwslt-postln-radam-lr5e-4-linear",
    "iwslt-preln-radam-lr5e-4-linear", "iwslt-preln-adam-lr5e-4-step8", "wmt-preln-adam-lr7e-4-step6", "wmt-preln-adam-lr1.5e-3-step6",
    "wmt-postln-adam-lr7e-4-wu4000", "wmt-postln-adam-lr1.5e-3-wu4000", "iwslt-deepnorm-adam-lr5e-4-nowu", "iwslt-deepnorm-adam-lr1e-3-nowu",
    "iwslt-deepnorm-adam-lr5e-4-wu4000", "iwslt-keel-adam-lr5e-4-nowu", "iwslt-keel-adam-lr5e-4-wu4000", "iwslt-keel-radam-lr5e-4-linear",
    "iwslt-admin-adam-lr5e-4-nowu", "iwslt-admin-adam-lr1e-3-nowu", "iwslt-tfixup-adam-lr5e-4-nowu", "iwslt-tfixup-adam-lr1e-3-nowu",
    "multi30k-postln-adam-lr5e-4-nowu", "multi30k-postln-adam-lr5e-4-wu500", "multi30k-postln-adam-lr5e-4-wu4000", "multi30k-postln-adam-lr1e-3-nowu",
    "multi30k-postln-adam-lr1e-3-wu500", "multi30k-postln-adam-lr1e-3-wu4000", "multi30k-preln-adam-lr5e-4-nowu", "multi30k-postln-radam-lr5e-4-linear",
    "multi30k-deepnorm-adam-lr5e-4-nowu", "multi30k-keel-adam-lr5e-4-nowu", "multi30k-admin-adam-lr5e-4-nowu", "multi30k-admin-adam-lr1e-3-nowu",
    "multi30k-tfixup-adam-lr5e-4-nowu", "multi30k-tfixup-adam-lr1e-3-nowu", "multi30k-preln_rmsnorm-adam-lr5e-4-nowu", "multi30k-dyt-adam-lr5e-4-nowu",
    "multi30k-derf-adam-lr5e-4-nowu", "multi30k-scalenorm-adam-lr5e-4-nowu", "multi30k-subln-adam-lr5e-4-nowu", "multi30k-periln-adam-lr5e-4-nowu",
    "multi30k-b2t-adam-lr5e-4-nowu", "multi30k-residual-adam-lr5e-4-nowu", "multi30k-mixln-adam-lr5e-4-nowu", "multi30k-lnscaling-adam-lr5e-4-nowu",
    "multi30k-rezero-adam-lr5e-4-nowu", "multi30k-rezero_postln-adam-lr5e-4-nowu", "multi30k-normformer-adam-lr5e-4-nowu", "ref-iwslt-clinic-admin",
    "ref-iwslt-clinic-postln", "ref-iwslt-clinic-preln", "ref-iwslt-tfixup", "ref-iwslt-tfixup-adam",
    "ref-iwslt-radamrepo-adam-wu4000", "ref-iwslt-radamrepo-radam-nowu", "ref-multi30k-clinic-admin", "ref-multi30k-clinic-postln",
    "ref-multi30k-clinic-preln", "ref-multi30k-tfixup", "ref-multi30k-tfixup-adam", "ref-multi30k-radamrepo-adam-wu4000",
    "ref-multi30k-radamrepo-radam-nowu", "demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu",
    "demo-deepnorm-nowu", "demo-keel-nowu", "demo-admin-nowu", "demo-tfixup-nowu",
    "demo-preln_rmsnorm-nowu", "demo-dyt-nowu", "demo-derf-nowu", "demo-scalenorm-nowu",
    "demo-subln-nowu", "demo-periln-nowu", "demo-b2t-nowu", "demo-residual-nowu",
    "demo-mixln-nowu", "demo-lnscaling-nowu", "demo-rezero-nowu", "demo-rezero_postln-nowu",
    "demo-normformer-nowu", "real-postln-nowu", "real-preln-nowu", "real-deepnorm-nowu",
    "real-keel-nowu", "real-admin-nowu", "real-tfixup-nowu", "real-preln_rmsnorm-nowu",
    "real-dyt-nowu", "real-derf-nowu", "real-scalenorm-nowu", "real-subln-nowu",
    "real-periln-nowu", "real-b2t-nowu", "real-residual-nowu", "real-mixln-nowu",
    "real-lnscaling-nowu", "real-rezero-nowu", "real-rezero_postln-nowu", "real-normformer-nowu",
    "real-postln-wu100", "real-preln-wu100", "real-deepnorm-wu100", "real-b2t-wu100",
]
# the config hash of every row together, and of a few rows: a row's fields (and so its run folders' hash) unchanged
ALL_ROWS_HASH = "951d0e183e582bb3f39617aa1eac545b98e4d784d67145d2a5ed4bb22f95cd3a"
ROW_HASHES = {"demo-dyt-nowu": "c080bd21c5bcb8a3", "multi30k-normformer-adam-lr5e-4-nowu": "1952b42d3a01dc2a",
              "real-preln-wu100": "406194569da6e544", "iwslt-tfixup-adam-lr1e-3-nowu": "09dc949fbee6a0d0"}


def test_the_generated_rows_are_the_table_as_written_before():
    # the warm-up study's rows (R.WHY, tests/test_warmup_study.py) come last and leave the others unchanged
    assert [r.name for r in R.RUNS] == ROW_NAMES + [r.name for r in R.WHY]
    assert config_hash([r.as_dict() for r in R.RUNS if r not in R.WHY], 64) == ALL_ROWS_HASH
    assert {n: config_hash(R.BY_NAME[n].as_dict()) for n in ROW_HASHES} == ROW_HASHES
    dyt = R.BY_NAME["demo-dyt-nowu"]
    assert (dyt.dataset, dyt.ln, dyt.lr, dyt.warmup, dyt.decay_anchor, dyt.figure) == ("synthetic", "dyt", 1e-3, 0, 100000, "demo")


def test_the_selections_made_from_the_registry_are_those_written_before():
    from fairseq_lnpos import bench, demo, gpu_check
    from fairseq_lnpos.analysis import init_grad
    from fairseq_lnpos.experiments import sweep

    assert R.DEMO_ROWS == {"synthetic": ("demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu", "demo-deepnorm-nowu"),
                           "multi30k": ("real-postln-nowu", "real-postln-wu100", "real-preln-nowu")}
    assert demo.OPTIONAL == ("keel", "admin", "tfixup", "preln_rmsnorm", "dyt", "derf", "scalenorm", "subln", "periln",
                             "b2t", "residual", "mixln", "lnscaling", "rezero", "rezero_postln", "normformer")
    assert gpu_check.m30k_rows() == [
        "multi30k-postln-adam-lr5e-4-nowu", "multi30k-postln-adam-lr5e-4-wu500", "multi30k-preln-adam-lr5e-4-nowu",
        "multi30k-postln-radam-lr5e-4-linear", "multi30k-deepnorm-adam-lr5e-4-nowu", "multi30k-keel-adam-lr5e-4-nowu",
        "multi30k-admin-adam-lr5e-4-nowu"]
    further = ("preln_rmsnorm", "dyt", "derf", "scalenorm", "subln", "periln", "b2t", "residual", "mixln", "lnscaling",
               "rezero", "rezero_postln", "normformer")
    assert bench.THROUGHPUT_TARGETS == {"postln": 0.99, "preln": 0.99, "deepnorm": 0.97, "admin": 0.97, "tfixup": 0.97,
                                        **{v: 0.95 for v in further}}
    assert sweep.STABILITY_MAP["archs"] == "postln,preln,deepnorm,keel"
    assert sweep.DEPTH_MAP["archs"] == sweep.DEPTH_MAP_REAL["archs"] == "postln,preln,deepnorm,keel,admin,tfixup"
    assert init_grad.Options().archs == ("postln", "preln")


def test_every_arch_of_the_registry_is_registered_with_fairseq_and_no_other():
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_lnpos import register
    from fairseq_lnpos.models import archs

    register()
    assert set(archs.ARCHS) == set(V.arch_names())
    for arch, (variant, _) in V.arch_names().items():
        assert ARCH_MODEL_REGISTRY[arch] is archs.MODEL_REGISTRY[V.VARIANTS[variant].model]
    plugin = {a for a, model in ARCH_MODEL_REGISTRY.items() if model.__module__.startswith("fairseq_lnpos.")}
    assert plugin == set(V.arch_names())


def test_a_variant_whose_model_no_module_registers_is_an_error(monkeypatch):
    import pytest

    from fairseq_lnpos.errors import LnposError
    from fairseq_lnpos.models import archs

    monkeypatch.setitem(V.VARIANTS, "midln", V.Variant("Mid-LN", "transformer_midln", False))
    with pytest.raises(LnposError, match="registers the model transformer_midln"):
        archs.import_model_modules()
