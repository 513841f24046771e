"""The run table (experiments/runs.py) against the paper's stated settings (Xiong et al. ICML 2020), through the commands it generates."""
import shlex
from dataclasses import fields, replace

import pytest

from pathlib import Path

from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.experiments import commands as C
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.experiments.options import RunOptions


def opts(world=1):
    return RunOptions(gpus_per_run=world)


def command(run, size="paper", world=1, total=1234):
    run = run.with_defaults()
    ds = R.DATASETS[run.dataset]
    job = C.Job(run, 1, "/data", Path("/out") / run.name / "seed1", C.run_arch(run, size),
                (ds["source_lang"], ds["target_lang"]), opts(world=world))
    return job.train_cmd(total, display=True)


def flag(cmd, name):
    """The value after ``name`` in an argv list."""
    assert name in cmd, f"{name} missing from {shlex.join(cmd)}"
    return cmd[cmd.index(name) + 1]


def find(**want):
    """The one row of the table, other papers' recipes (``R.REFERENCE``) and the warm-up study's rows
    (``R.WHY``, tests/test_warmup_study.py) aside, with the fields ``want``."""
    hits = [r for r in R.RUNS if r not in R.REFERENCE and r not in R.WHY
            and all(getattr(r, k) == v for k, v in want.items())]
    assert len(hits) == 1, f"expected one run with {want}, found {[r.name for r in hits]}"
    return hits[0]


@pytest.mark.parametrize("lr", [5e-4, 1e-3])
@pytest.mark.parametrize("warmup", [4000, 500, 0])
def test_iwslt_adam_warmup_study(lr, warmup):
    cmd = command(find(dataset="iwslt14", ln="postln", optimizer="adam", lr=lr, warmup=warmup))
    assert flag(cmd, "--arch") == "transformer_postln_iwslt_de_en"
    assert flag(cmd, "--optimizer") == "adam" and flag(cmd, "--adam-betas") == "(0.9, 0.98)"
    assert float(flag(cmd, "--lr")) == lr
    assert flag(cmd, "--lr-scheduler") == "warmup_inverse_sqrt"
    assert int(flag(cmd, "--warmup-updates")) == (warmup or 1)  # the paper's T_warmup = 1 = none
    assert flag(cmd, "--decay-anchor") == "4000"  # the same decay for every warm-up length
    assert float(flag(cmd, "--dropout")) == 0.1 and float(flag(cmd, "--label-smoothing")) == 0.1
    assert flag(cmd, "--criterion") == "label_smoothed_cross_entropy"
    assert int(flag(cmd, "--max-tokens")) * int(flag(cmd, "--update-freq")) == 4096
    assert (flag(cmd, "--source-lang"), flag(cmd, "--target-lang")) == ("de", "en")
    assert float(flag(cmd, "--clip-norm")) == 0.0 and float(flag(cmd, "--weight-decay")) == 0.0


@pytest.mark.parametrize("lr", [5e-3, 1e-3])
@pytest.mark.parametrize("warmup", [4000, 0])
def test_iwslt_sgd(lr, warmup):
    cmd = command(find(dataset="iwslt14", optimizer="sgd", lr=lr, warmup=warmup))
    assert flag(cmd, "--optimizer") == "sgd" and float(flag(cmd, "--momentum")) == 0.0  # vanilla SGD
    assert "--adam-betas" not in cmd
    assert int(flag(cmd, "--warmup-updates")) == (warmup or 1)


@pytest.mark.parametrize("variant", ["postln", "preln"])
def test_radam_no_warmup_linear_decay(variant):
    cmd = command(find(dataset="iwslt14", ln=variant, optimizer="radam"), total=1234)
    assert flag(cmd, "--optimizer") == "radam" and flag(cmd, "--arch") == f"transformer_{variant}_iwslt_de_en"
    assert flag(cmd, "--lr-scheduler") == "polynomial_decay" and flag(cmd, "--power") == "1"
    assert float(flag(cmd, "--end-learning-rate")) == 0 and flag(cmd, "--warmup-updates") == "0"
    assert flag(cmd, "--total-num-update") == "1234"


def test_iwslt_preln_step_decay_and_its_postln_baseline():
    pre = command(find(dataset="iwslt14", ln="preln", optimizer="adam"))
    assert flag(pre, "--arch") == "transformer_preln_iwslt_de_en"
    assert float(flag(pre, "--lr")) == 5e-4 and flag(pre, "--lr-scheduler") == "step_decay"
    assert flag(pre, "--decay-epoch") == "8" and float(flag(pre, "--decay-factor")) == 0.1
    assert "--warmup-updates" not in pre and "--inverse-sqrt-after-decay" not in pre
    post = command(find(dataset="iwslt14", ln="postln", optimizer="adam", lr=5e-4, warmup=4000))
    assert float(flag(post, "--lr")) == float(flag(pre, "--lr"))


@pytest.mark.parametrize("lr", [7e-4, 1.5e-3])
@pytest.mark.parametrize("world", [1, 2, 4, 8, 16])
def test_wmt_runs_and_effective_batch(lr, world):
    pre = command(find(dataset="wmt14", ln="preln", lr=lr), world=world)
    assert flag(pre, "--arch") == "transformer_preln_wmt_en_de"
    assert flag(pre, "--decay-epoch") == "6" and "--inverse-sqrt-after-decay" in pre
    assert "--warmup-updates" not in pre
    assert (flag(pre, "--source-lang"), flag(pre, "--target-lang")) == ("en", "de")
    # 8192 tokens per GPU x 16 GPUs, whatever the number of GPUs
    assert int(flag(pre, "--max-tokens")) * int(flag(pre, "--update-freq")) * world == 8192 * 16
    if world > 1:
        assert flag(pre, "--distributed-world-size") == str(world)
    post = command(find(dataset="wmt14", ln="postln", lr=lr))
    assert flag(post, "--warmup-updates") == "4000" and flag(post, "--lr-scheduler") == "warmup_inverse_sqrt"


def test_keel_rows_cover_adam_and_radam_with_and_without_warmup():
    keel = [r for r in R.RUNS if r.ln == "keel" and r.dataset == "iwslt14"]
    assert {(r.optimizer, r.warmup, r.schedule) for r in keel} == {
        ("adam", 0, "inverse_sqrt"), ("adam", 4000, "inverse_sqrt"), ("radam", 0, "linear")}
    assert all(flag(command(r), "--arch") == "transformer_keel_iwslt_de_en" for r in keel)


def test_deepnorm_rows_and_paper_values():
    assert {r.warmup for r in R.RUNS if r.ln == "deepnorm" and r.dataset == "iwslt14"} == {0, 4000}
    assert find(dataset="iwslt14", ln="postln", optimizer="adam", lr=5e-4, warmup=500).paper_bleu == 31.16
    assert find(dataset="iwslt14", ln="postln", optimizer="adam", lr=1e-3, warmup=500).paper_bleu == 2.77
    assert find(dataset="iwslt14", ln="preln", optimizer="adam").paper_bleu == 34.0
    nowu = [r for r in R.RUNS if r.dataset == "iwslt14" and r.ln == "postln" and r.optimizer == "adam"
            and r.warmup == 0 and r.schedule == "inverse_sqrt"]
    assert len(nowu) == 2 and all("8.45" in r.paper_note and r.paper_bleu is None for r in nowu)
    fixed = find(schedule="fixed")
    assert fixed.lr == 1e-4 and fixed.max_epoch == 27 and fixed.paper_valid_loss == 4.3


def test_multi30k_rows_mirror_the_iwslt_adam_rows_on_the_iwslt_model():
    m30k = [r.with_defaults() for r in R.RUNS if r.dataset == "multi30k" and r not in R.REFERENCE]
    iwslt_adam = {(r.ln, r.lr, r.warmup) for r in R.RUNS if r.dataset == "iwslt14" and r.optimizer == "adam"
                  and r.ln == "postln" and r.schedule == "inverse_sqrt"}
    assert {(r.ln, r.lr, r.warmup) for r in m30k if r.ln == "postln" and r.optimizer == "adam"} == iwslt_adam
    assert {r.ln for r in m30k if r.warmup == 0 and r.optimizer == "adam"} == set(R.VARIANTS)
    assert any(r.optimizer == "radam" and r.schedule == "linear" for r in m30k)
    for r in m30k:
        cmd = command(r)
        assert flag(cmd, "--arch").endswith("_iwslt_de_en") and flag(cmd, "--max-epoch") == "12"
        assert int(flag(cmd, "--max-tokens")) * int(flag(cmd, "--update-freq")) == 4096


def test_budget_in_updates_and_depth():
    run = R.coerce(R.coerce(find(dataset="synthetic", ln="preln"), "max_update", "300"), "layers", "12")
    cmd = command(run)
    assert flag(cmd, "--max-update") == "300" and flag(cmd, "--encoder-layers") == flag(cmd, "--decoder-layers") == "12"
    assert "--max-update" not in command(find(dataset="synthetic", ln="preln"))
    for key, bad in (("layers", "0"), ("max_epoch", "0"), ("max_update", "-1"), ("lr", "0"), ("ln", "midln")):
        with pytest.raises(R.RunTableError):
            R.coerce(run, key, bad)


def test_tiny_size_switch_and_task_field():
    run = find(dataset="wmt14", ln="preln", lr=7e-4)
    assert flag(command(run, size="tiny"), "--arch") == "transformer_preln_tiny"
    cmd = command(R.coerce(run, "task", "translation_lnpos"))
    assert flag(cmd, "--task") == "translation_lnpos"


def test_select_and_coerce_errors():
    assert [r.name for r in R.select(["iwslt-preln-*"])] == ["iwslt-preln-radam-lr5e-4-linear",
                                                             "iwslt-preln-adam-lr5e-4-step8"]
    with pytest.raises(R.RunTableError, match="unknown run 'nope'"):
        R.select(["nope"])
    with pytest.raises(R.RunTableError, match="unknown field"):
        R.coerce(R.RUNS[0], "learning_rate", "1")
    with pytest.raises(R.RunTableError, match="not a valid value"):
        R.coerce(R.RUNS[0], "lr", "fast")
    assert R.coerce(R.RUNS[0], "lr", "1e3").lr == 1000.0


def test_batch_plan_refuses_uneven_split():
    run = R.coerce(find(dataset="wmt14", ln="preln", lr=7e-4).with_defaults(), "max_tokens", "5000")
    with pytest.raises(LnposError, match="cannot be split"):
        C.batch_plan(run, 3)


def flags_match(cmd, want):
    for name, value in want.items():
        got = flag(cmd, name)
        assert (float(got) == value) if isinstance(value, float) else (got == str(value)), (name, got, value)


# The reference recipes, as their official code gives them (the files named in each row's `source`)
CLINIC = {"--optimizer": "radam", "--adam-betas": "(0.9, 0.98)", "--lr": 7e-4, "--lr-scheduler": "inverse_sqrt",
          "--warmup-updates": 6000, "--warmup-init-lr": 1e-7, "--dropout": 0.3, "--attention-dropout": 0.1,
          "--activation-dropout": 0.1, "--weight-decay": 1e-4, "--clip-norm": 0.0, "--label-smoothing": 0.1,
          "--max-tokens": 4096, "--lnpos-init": "fairseq-0.8"}
TFIXUP = {"--arch": "transformer_tfixup_iwslt_de_en", "--optimizer": "radam", "--adam-betas": "(0.9, 0.98)",
          "--lr": 5e-4, "--lr-scheduler": "inverse_sqrt_nowarmup", "--decay-period": 4000, "--dropout": 0.5,
          "--attention-dropout": 0.0, "--activation-dropout": 0.0, "--weight-decay": 1e-4, "--clip-norm": 25.0,
          "--label-smoothing": 0.1, "--max-tokens": 4000, "--max-epoch": 300, "--lnpos-init": "fairseq-0.9"}
RADAM_REPO = {"--arch": "transformer_postln_iwslt_de_en", "--adam-betas": "(0.9, 0.999)", "--lr": 3e-4,
              "--lr-scheduler": "polynomial_decay", "--power": "1", "--end-learning-rate": 1e-9, "--dropout": 0.3,
              "--attention-dropout": 0.0, "--activation-dropout": 0.0, "--weight-decay": 1e-4, "--clip-norm": 25.0,
              "--max-tokens": 4000, "--max-update": 70000, "--total-num-update": 70000, "--lnpos-init": "fairseq-0.8"}


@pytest.mark.parametrize("variant,bleu", [("admin", 35.67), ("postln", 35.64), ("preln", 35.50)])
def test_transformer_clinic_rows(variant, bleu):
    run = R.BY_NAME[f"ref-iwslt-clinic-{variant}"]
    cmd = command(run)
    flags_match(cmd, {**CLINIC, "--arch": f"transformer_{variant}_iwslt_de_en", "--max-epoch": 90, "--max-update": 100000})
    assert "--share-all-embeddings" in cmd and "--decoupled-weight-decay" in cmd
    assert "--share-decoder-input-output-embed" not in cmd
    assert (run.beam, run.lenpen, run.average_last, run.paper_bleu) == (5, 1.0, 10, bleu)
    assert "Transformer-Clinic" in run.source and "eval_iwslt_de-en.sh" in run.source


def test_tfixup_and_radam_repository_rows():
    run = R.BY_NAME["ref-iwslt-tfixup"]
    cmd = command(run)
    flags_match(cmd, TFIXUP)
    assert "--share-decoder-input-output-embed" in cmd and "--share-all-embeddings" not in cmd
    assert "--max-update" not in cmd and "--warmup-updates" not in cmd
    assert (run.beam, run.lenpen, run.average_last, run.paper_bleu) == (4, 0.3, 10, 35.73)
    # the fork's `adam` takes RAdam's step with decoupled weight decay; its twin runs fairseq's Adam
    assert "--decoupled-weight-decay" in cmd
    twin = R.BY_NAME["ref-iwslt-tfixup-adam"]
    flags_match(command(twin), {**TFIXUP, "--optimizer": "adam"})
    assert "--decoupled-weight-decay" not in command(twin) and twin.paper_bleu is None
    assert {k: v for k, v in twin.as_dict().items() if k not in ("name", "optimizer", "decoupled_weight_decay",
                                                                  "paper_bleu", "paper_note")} == \
        {k: v for k, v in run.as_dict().items() if k not in ("name", "optimizer", "decoupled_weight_decay",
                                                              "paper_bleu", "paper_note")}
    adam, radam = R.BY_NAME["ref-iwslt-radamrepo-adam-wu4000"], R.BY_NAME["ref-iwslt-radamrepo-radam-nowu"]
    flags_match(command(adam, total=70000), {**RADAM_REPO, "--optimizer": "adam", "--warmup-updates": 4000})
    flags_match(command(radam, total=70000), {**RADAM_REPO, "--optimizer": "radam", "--warmup-updates": 0})
    assert "--decoupled-weight-decay" in command(radam) and "--decoupled-weight-decay" not in command(adam)
    assert not any(f.startswith("--share") for f in command(adam) + command(radam))
    assert (adam.paper_bleu, radam.paper_bleu) == (34.66, 34.76)
    assert all((r.beam, r.lenpen, r.average_last) == (5, 1.0, 10) for r in (adam, radam))


def test_multi30k_twins_keep_the_recipe_and_change_the_length():
    twins = [r for r in R.REFERENCE if r.dataset == "multi30k"]
    assert len(twins) == 7
    length = ("max_epoch", "max_update", "paper_bleu", "paper_note", "name", "dataset")
    for twin in twins:
        ref = R.BY_NAME[twin.name.replace("ref-multi30k-", "ref-iwslt-")]
        recipe = {k: v for k, v in twin.as_dict().items() if k not in length}
        assert recipe == {k: v for k, v in ref.as_dict().items() if k not in length}
        assert twin.paper_bleu is None and twin.max_update == 0
        assert twin.max_epoch == (ref.max_epoch if ref.max_epoch < 10 ** 6 else 64)


def test_initialization_of_each_kind_of_row():
    for r in R.RUNS:
        if r.name.startswith(("iwslt-", "wmt-")):
            assert r.init == "fairseq-0.8", r.name
        elif r.name.startswith(("demo-", "multi30k-")):
            assert r.init == "fairseq-0.12", r.name
    assert flag(command(find(dataset="synthetic", ln="postln", warmup=0)), "--lnpos-init") == "fairseq-0.12"
    assert R.coerce(R.RUNS[0], "init", "fairseq-0.12").init == "fairseq-0.12"
    with pytest.raises(R.RunTableError, match="--set init: one of fairseq-0.12"):
        R.coerce(R.RUNS[0], "init", "xavier")
    # fairseq's own archs have no --lnpos-init: only the default init is possible there
    run = R.BY_NAME["ref-iwslt-clinic-postln"].with_defaults()
    job = C.Job(run, 1, "/d", Path("/o"), "transformer_iwslt_de_en", ("de", "en"), opts())
    with pytest.raises(LnposError, match="needs one of the plugin's archs"):
        job.train_cmd(1)
    plain = C.Job(R.coerce(run, "init", "fairseq-0.12"), 1, "/d", Path("/o"), "transformer_iwslt_de_en", ("de", "en"), opts())
    assert "--lnpos-init" not in plain.train_cmd(1)


def test_recipe_knobs_that_do_not_fit_their_schedule_or_optimizer_are_refused():
    run = R.BY_NAME["ref-iwslt-tfixup"]
    with pytest.raises(LnposError, match="warmup_init_lr is an option of schedule fairseq_inverse_sqrt"):
        command(R.coerce(run, "warmup_init_lr", "1e-7"))
    with pytest.raises(LnposError, match="has no warm-up"):
        command(R.coerce(run, "warmup", "100"))
    with pytest.raises(LnposError, match="decoupled_weight_decay is an option of radam"):
        command(R.coerce(R.BY_NAME["ref-iwslt-tfixup-adam"], "decoupled_weight_decay", "true"))
    for key, bad in (("share_embeddings", "encoder"), ("schedule", "cosine"), ("beam", "0"), ("average_last", "-1")):
        with pytest.raises(R.RunTableError):
            R.coerce(run, key, bad)


def test_share_all_embeddings_needs_a_joined_dictionary(tmp_path):
    run = R.BY_NAME["ref-iwslt-clinic-admin"]
    (tmp_path / "dict.de.txt").write_text("haus 5\nkatze 3\n")
    (tmp_path / "dict.en.txt").write_text("haus 7\nkatze 1\n")  # the same words: one joined dictionary
    C.check_joined_dictionary(run, tmp_path, ("de", "en"))
    (tmp_path / "dict.en.txt").write_text("house 7\ncat 1\n")
    with pytest.raises(LnposError, match="dict.de.txt and dict.en.txt .* differ: binarize with fairseq-preprocess "
                                         "--joined-dictionary"):
        C.check_joined_dictionary(run, tmp_path, ("de", "en"))
    C.check_joined_dictionary(R.BY_NAME["ref-iwslt-tfixup"], tmp_path, ("de", "en"))  # shares the decoder's only


def test_default_data_folders_are_where_data_prep_writes_them():
    import inspect

    from fairseq_lnpos.data import iwslt, multi30k, wmt

    for dataset, module in (("iwslt14", iwslt), ("multi30k", multi30k), ("wmt14", wmt)):
        bin_default = inspect.signature(module.prepare).parameters["bin_dir"].default
        assert R.DATASETS[dataset]["default_data"] == bin_default, dataset


@pytest.mark.parametrize("dataset, prep", [("iwslt14", "iwslt"), ("multi30k", "multi30k"), ("wmt14", "wmt")])
def test_the_grid_reads_the_folder_its_data_prep_writes(dataset, prep):
    """A row's default data folder is the one data-prep/prepare-*.sh writes by default (and its
    Python entry point ``prepare``), so that the README's two commands meet."""
    import importlib
    import inspect

    module = importlib.import_module(f"fairseq_lnpos.data.{prep}")
    assert module.parser().parse_args([]).bin == R.DATASETS[dataset]["default_data"]
    assert inspect.signature(module.prepare).parameters["bin_dir"].default == R.DATASETS[dataset]["default_data"]


def test_decoding_is_fp32_under_fp16_unless_the_row_decoded_in_fp16():
    """T-Fixup (InferenceIWSLT.py) and the RAdam repository (nmt/eval.sh) decode without --fp16,
    Transformer-Clinic (eval_iwslt_de-en.sh) with it; the paper's rows keep fairseq-generate's fp32."""
    manifest = {"source_lang": "de", "target_lang": "en", "post_process": "sentencepiece"}
    fp16 = RunOptions(fp16=True)
    for name, decode_fp16 in (("ref-iwslt-tfixup", False), ("ref-iwslt-radamrepo-radam-nowu", False),
                              ("ref-iwslt-clinic-admin", True), ("iwslt-postln-adam-lr5e-4-wu4000", False)):
        run = R.BY_NAME[name].with_defaults()
        job = C.Job(run, 1, Path("/d"), Path("/o"), "transformer_postln_iwslt_de_en", ("de", "en"), fp16)
        assert "--fp16" in job.train_cmd(1), name
        assert ("--fp16" in job.generate_argv(1, manifest)) == decode_fp16, name
        plain = C.Job(run, 1, Path("/d"), Path("/o"), "transformer_postln_iwslt_de_en", ("de", "en"), opts())
        assert "--fp16" not in plain.generate_argv(1, manifest) + plain.train_cmd(1), name


def test_fields_added_later_keep_older_run_folders_resumable():
    """A row's recorded config (and so its hash) holds decode_fp16 and compound_split_bleu only when set:
    a run folder written before they existed has the same config and resumes; reading one back fills
    them with the old behaviour."""
    row = R.BY_NAME["demo-postln-nowu"].with_defaults()
    d = row.as_dict()
    assert not set(R.LATER_FIELDS) & set(d) and set(d) | set(R.LATER_FIELDS) == {f.name for f in fields(R.Run)}
    assert replace(row, compound_split_bleu=True).as_dict()["compound_split_bleu"] is True
    assert {f.name: f.default for f in fields(R.Run) if f.name in R.LATER_FIELDS} == R.LATER_FIELDS


def test_every_architecture_on_real_text_plan(tmp_path, capsys):
    """The real-text comparison, `grid.sh run --only 'real-*' --seeds 1,2` (dry run): every variant
    without warm-up and the warm-up controls (Post-LN, Pre-LN, DeepNorm, B2T; Post-LN's longer warm-ups), DeepNorm and
    B2T at lr 5e-4, at the tiny size on Multi30k, the
    commands alike but for the arch, the warm-up and the seed."""
    import re

    from fairseq_lnpos.experiments import grid
    from fairseq_lnpos.variants import VARIANTS

    assert grid.main(["run", "--dry-run", "--only", "real-*", "--seeds", "1,2", "--data", str(tmp_path / "bin"),
                      "--out", str(tmp_path / "out")]) == 0
    blocks = [b.splitlines() for b in capsys.readouterr().out.strip().split("\n\n")]
    runs = [re.match(r"# \[\d+/\d+\] (\S+) seed (\d)", b[0]).groups() for b in blocks]
    want = [f"real-{v}-nowu" for v in VARIANTS] + [f"real-{v}-wu100" for v in ("postln", "preln", "deepnorm", "b2t")] \
        + ["real-postln-wu500", "real-postln-wu1000", "real-postln-wu500-lr5e-4", "real-preln-nowu-lr5e-4",
           "real-deepnorm-nowu-lr5e-4", "real-b2t-nowu-lr5e-4"]
    assert sorted(runs) == sorted((r, s) for r in want for s in "12") and len(runs) == 2 * len(want)
    generic = set()
    for (name, seed), block in zip(runs, blocks):
        argv = block[1].split()
        variant, warm = R.BY_NAME[name].ln, name.rpartition("-wu")[2].split("-")[0] if "-wu" in name else "1"
        assert (flag(argv, "--arch"), flag(argv, "--warmup-updates"), flag(argv, "--seed")) == (
            f"transformer_{variant}_tiny", warm, seed)
        assert float(flag(argv, "--lr")) == (5e-4 if name.endswith("-lr5e-4") else 1e-3)
        assert argv[1] == str(tmp_path / "bin")
        generic.add(" ".join(block[1].replace(f"transformer_{variant}_tiny", "ARCH").replace(f"{name}/seed{seed}", "DIR")
                             .replace(f"--warmup-updates {warm} ", "").replace(f"--seed {seed} ", "")
                             .replace(f"--lr {flag(argv, '--lr')} ", "").split()))
    assert len(generic) == 1  # nothing else differs


@pytest.mark.parametrize("name, seed, arch, options, pinned", [
    ("iwslt-postln-adam-lr5e-4-wu4000", 1, None, {}, "220f7b146773eeec"),
    ("ref-iwslt-tfixup", 1, None, {}, "5ce39473d0c783d9"),
    ("demo-postln-nowu", 1, None, {}, "21b01437d6390c0d"),
    ("sweep", 2, "transformer_postln_tiny", {"fp16": True, "fairseq_args": "--foo 1"}, "22c63a668da4c0f5"),
])
def test_config_hashes_stay_what_existing_run_folders_hold(name, seed, arch, options, pinned):
    """A run folder resumes only when its config hash is computed again to the same value: these were
    computed by an earlier version and must not change."""
    from fairseq_lnpos.experiments import sweep

    run = (sweep.expand(["postln"], [1e-3], [1], [6], 200)[0] if name == "sweep" else R.BY_NAME[name]).with_defaults()
    ds = R.DATASETS[run.dataset]
    job = C.Job(run, seed, Path("/data"), Path("/out") / run.name / f"seed{seed}", arch or C.run_arch(run, "paper"),
                (ds["source_lang"], ds["target_lang"]), RunOptions(**options))
    assert job.config_hash() == pinned
