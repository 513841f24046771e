"""The run table (experiments/runs.py) against paper-facts.md, through the commands it generates."""
import argparse
import shlex

import pytest

from pathlib import Path

from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.experiments import commands as C
from fairseq_lnpos.experiments import runs as R


def opts(**kw):
    base = dict(task=None, fairseq_args="", gen_args="", beam=5, lenpen=1.2, world=1, fp16=False, log_interval=1,
                uncapped_len=False, eval_every=1, no_bleu=False, patience=0)
    base.update(kw)
    return argparse.Namespace(**base)


def command(run, size="paper", world=1, total=1234):
    run = run.with_defaults()
    ds = R.DATASETS[run.dataset]
    job = C.Job(run, 1, "/data", Path("/out") / run.name / "seed1", C.arch_name(run, size),
                (ds["source_lang"], ds["target_lang"]), opts(world=world))
    return job.train_cmd(total, display=True)


def flag(cmd, name):
    """The value after ``name`` in an argv list."""
    assert name in cmd, f"{name} missing from {shlex.join(cmd)}"
    return cmd[cmd.index(name) + 1]


def find(**want):
    hits = [r for r in R.RUNS if all(getattr(r, k) == v for k, v in want.items())]
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


@pytest.mark.parametrize("ln", ["postln", "preln"])
def test_radam_no_warmup_linear_decay(ln):
    cmd = command(find(dataset="iwslt14", ln=ln, optimizer="radam"), total=1234)
    assert flag(cmd, "--optimizer") == "radam" and flag(cmd, "--arch") == f"transformer_{ln}_iwslt_de_en"
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
    assert {r.warmup for r in R.RUNS if r.ln == "deepnorm"} == {0, 4000}
    assert find(dataset="iwslt14", ln="postln", optimizer="adam", lr=5e-4, warmup=500).paper_bleu == 31.16
    assert find(dataset="iwslt14", ln="postln", optimizer="adam", lr=1e-3, warmup=500).paper_bleu == 2.77
    assert find(dataset="iwslt14", ln="preln", optimizer="adam").paper_bleu == 34.0
    nowu = [r for r in R.RUNS if r.dataset == "iwslt14" and r.ln == "postln" and r.optimizer == "adam"
            and r.warmup == 0 and r.schedule == "inverse_sqrt"]
    assert len(nowu) == 2 and all("8.45" in r.paper_note and r.paper_bleu is None for r in nowu)
    fixed = find(schedule="fixed")
    assert fixed.lr == 1e-4 and fixed.max_epoch == 27 and fixed.paper_valid_loss == 4.3


def test_multi30k_rows_mirror_the_iwslt_adam_rows_on_the_iwslt_model():
    m30k = [r.with_defaults() for r in R.RUNS if r.dataset == "multi30k"]
    iwslt_adam = {(r.ln, r.lr, r.warmup) for r in R.RUNS if r.dataset == "iwslt14" and r.optimizer == "adam"
                  and r.ln == "postln" and r.schedule == "inverse_sqrt"}
    assert {(r.ln, r.lr, r.warmup) for r in m30k if r.ln == "postln" and r.optimizer == "adam"} == iwslt_adam
    assert {r.ln for r in m30k if r.warmup == 0 and r.optimizer == "adam"} == set(R.LN_KINDS)
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
