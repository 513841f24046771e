"""The variant registry (variants.py): its groups, and the run rows, demo rows and selections made from them.

Nothing here lists the variants or the rows: a variant added as docs/contributing.md says passes
unchanged (tests/test_add_variant.py shows it)."""
from pathlib import Path

import pytest

from fairseq_lnpos import variants as V
from fairseq_lnpos.experiments import commands as C
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.launch import config_hash

# the config hash of a few rows written before the rows were generated: their run folders are named by
# it, so a change of these rows' fields (or of the hash) would leave those folders unfound
ROW_HASHES = {"iwslt-postln-adam-lr5e-4-wu4000": "d7afe0a8eb162e91", "iwslt-tfixup-adam-lr1e-3-nowu": "09dc949fbee6a0d0",
              "ref-iwslt-clinic-admin": "9ab3d48d365e0b73", "multi30k-normformer-adam-lr5e-4-nowu": "1952b42d3a01dc2a",
              "demo-postln-nowu": "d738df695895cbee", "demo-dyt-nowu": "c080bd21c5bcb8a3",
              "real-postln-nowu": "554ffa8b263f292e", "real-preln-wu100": "406194569da6e544"}


def test_the_named_rows_keep_their_config_hash():
    assert {n: config_hash(R.BY_NAME[n].as_dict()) for n in ROW_HASHES} == ROW_HASHES
    dyt = R.BY_NAME["demo-dyt-nowu"]
    assert (dyt.dataset, dyt.ln, dyt.lr, dyt.warmup, dyt.decay_anchor, dyt.figure) == ("synthetic", "dyt", 1e-3, 0, 100000, "demo")


def test_every_rows_training_command_parses_with_fairseqs_parser():
    from fairseq_lnpos.experiments.options import RunOptions
    from fairseq_lnpos.fairseq_build import parse

    assert len({r.name for r in R.RUNS}) == len(R.RUNS)
    for run in R.RUNS:
        run = run.with_defaults()
        assert run.ln in V.VARIANTS and run.dataset in R.DATASETS, run.name
        ds = R.DATASETS[run.dataset]
        for size in ("paper", "tiny"):
            job = C.Job(run, 3, Path("/data"), Path("/out") / run.name / "seed3", C.run_arch(run, size),
                        (ds["source_lang"], ds["target_lang"]), RunOptions())
            args = parse(job.train_cmd(1234, display=True)[1:])
            assert (args.arch, args.optimizer, args.lr[0], args.max_epoch, args.seed) == (
                job.arch, run.optimizer, run.lr, run.max_epoch, 3), run.name
            assert (args.encoder_normalize_before, args.decoder_normalize_before) == (
                (V.VARIANTS[run.ln].normalize_before,) * 2), run.name


def test_every_variant_has_its_rows():
    for v in V.VARIANTS:
        for name, dataset in ((f"demo-{v}-nowu", "synthetic"), (f"real-{v}-nowu", "multi30k_cpu")):
            row = R.BY_NAME[name]
            assert (row.ln, row.dataset, row.warmup) == (v, dataset, 0), name
    for v in V.GROUPS["further"]:
        row = R.BY_NAME[f"multi30k-{v}-adam-lr5e-4-nowu"]
        assert (row.ln, row.optimizer, row.lr, row.warmup) == (v, "adam", 5e-4, 0)
    # every variant has a Multi30k row without warm-up (the further ones through their group)
    assert {r.ln for r in R.RUNS if r.dataset == "multi30k" and r.warmup == 0} == set(V.VARIANTS)


def test_the_selections_made_from_the_registry_follow_its_groups():
    from conftest import tool
    from fairseq_lnpos import demo
    from fairseq_lnpos.analysis import init_grad
    from fairseq_lnpos.experiments import sweep

    bench, gpu_check = tool("bench"), tool("gpu_check")

    # the paper's two placements, and the demo's three: what `make demo` and `make demo-real` run
    assert V.GROUPS["paper"] == ("postln", "preln") and V.GROUPS["demo"] == ("postln", "preln", "deepnorm")
    for data, prefix, group in (("synthetic", "demo", "demo"), ("multi30k", "real", "paper")):
        assert R.DEMO_ROWS[data] == (f"{prefix}-postln-nowu", f"{prefix}-postln-wu100",
                                     *(f"{prefix}-{v}-nowu" for v in V.GROUPS[group][1:]))
        assert all(n in R.BY_NAME for n in R.DEMO_ROWS[data])
    # every other variant is a --with-<variant> of the demo, whose row exists on both corpora
    assert set(demo.OPTIONAL) == set(V.VARIANTS) - set(V.GROUPS["demo"])
    assert all(R.DEMO_OPTIONAL[data].format(v) in R.BY_NAME for v in demo.OPTIONAL for data in R.DEMO_OPTIONAL)
    # step 5 of the GPU check: a Multi30k row at lr 5e-4 of each of its variants, in the table's order
    rows = [R.BY_NAME[n] for n in gpu_check.m30k_rows()]
    assert {r.ln for r in rows} == set(V.GROUPS["gpu_multi30k"]) and all(r.dataset == "multi30k" for r in rows)
    assert [r.name for r in rows] == [r.name for r in R.RUNS if r in rows]
    assert bench.THROUGHPUT_TARGETS == {"postln": 0.99, "preln": 0.99, "deepnorm": 0.97, "admin": 0.97, "tfixup": 0.97,
                                        **{v: 0.95 for v in V.GROUPS["further"]}}
    assert sweep.STABILITY_MAP["archs"] == ",".join(V.GROUPS["stability_map"])
    assert sweep.DEPTH_MAP["archs"] == sweep.DEPTH_MAP_REAL["archs"] == ",".join(V.GROUPS["depth_map"])
    assert sweep.ALL_MAP["archs"] == ",".join(V.VARIANTS)
    assert init_grad.Options().archs == V.GROUPS["paper"]


def test_a_group_names_known_variants_in_the_registrys_order():
    for group in V.GROUPS.values():
        assert [v for v in V.VARIANTS if v in group] == list(group)
    assert set(V.GROUPS["further"]) == set(V.GROUPS["normalizations"]) | set(V.GROUPS["placements"])


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
    from fairseq_lnpos.errors import LnposError
    from fairseq_lnpos.models import archs

    monkeypatch.setitem(V.VARIANTS, "midln", V.Variant("Mid-LN", "transformer_midln", False))
    with pytest.raises(LnposError, match="registers the model transformer_midln"):
        archs.import_model_modules()
