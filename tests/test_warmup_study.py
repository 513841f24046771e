"""The warm-up study's rows (runs.WHY): the runs it expands to, and that each is the failing setting
changed in exactly one setting, with a fairseq-train command that fairseq parses."""
from dataclasses import fields
from pathlib import Path

import pytest

from fairseq_lnpos import fairseq_build
from fairseq_lnpos.errors import run_main
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.experiments.commands import Job, run_arch
from fairseq_lnpos.experiments.options import RunOptions

CORPORA = {"synthetic": "synthetic", "multi30k": "multi30k_cpu"}  # row name -> dataset of the run table
INTERVENTIONS = {  # row suffix -> the one field it changes, and its value
    "preln-nowu": ("ln", "preln"), "postln-wu100": ("warmup", 100), "postln-radam": ("optimizer", "radam"),
    "postln-giadam": ("optimizer", "giadam"), "postln-beta2-0.95": ("adam_betas", "(0.9, 0.95)"),
    "postln-beta2-0.999": ("adam_betas", "(0.9, 0.999)"), "postln-clip1": ("clip_norm", 1.0),
    "postln-clip0.1": ("clip_norm", 0.1), "postln-lr5e-4": ("lr", 5e-4), "postln-lr3e-4": ("lr", 3e-4),
    "postln-batch-x4": ("batch_tokens", "x4"), "postln-batch-div4": ("batch_tokens", "/4"),
    "postln-L3": ("layers", 3), "postln-init08": ("init", "fairseq-0.8"), "admin-nowu": ("ln", "admin"),
}
LABELS = ("name", "figure", "paper_note")  # what names a row, not what it runs


def changed(row, base):
    return {f.name for f in fields(R.Run) if f.name not in LABELS and getattr(row, f.name) != getattr(base, f.name)}


def test_the_study_is_the_failing_setting_and_one_intervention_per_row():
    assert [r.name for r in R.select(["why-*"])] == [r.name for r in R.WHY]
    assert len(R.WHY) == 2 * (1 + len(INTERVENTIONS)) == 32
    for corpus, dataset in CORPORA.items():
        base = R.BY_NAME[f"why-{corpus}-postln-nowu"].with_defaults()
        demo = R.BY_NAME[R.DEMO_ROWS["synthetic" if corpus == "synthetic" else "multi30k"][0]].with_defaults()
        # the baseline is the demo's failing row (Post-LN, Adam, lr 1e-3, no warm-up), diagnostics on
        # (on Multi30k one epoch of the demo's two)
        assert changed(base, demo) == {"task", "extra"} | ({"max_epoch"} if corpus == "multi30k" else set())
        assert base.dataset == dataset and base.max_epoch == (1 if corpus == "multi30k" else demo.max_epoch)
        assert (base.ln, base.optimizer, base.lr, base.warmup, base.adam_betas) == ("postln", "adam", 1e-3, 0, "(0.9, 0.98)")
        assert "--log-diagnostics" in base.extra and base.task == "translation_lnpos"
        for suffix, (key, value) in INTERVENTIONS.items():
            row = R.BY_NAME[f"why-{corpus}-{suffix}"].with_defaults()
            assert changed(row, base) == {key}, suffix
            want = {"x4": 4 * base.batch_tokens, "/4": base.batch_tokens // 4}.get(value, value)
            assert getattr(row, key) == want, suffix
    # Ma & Yarats' untuned warm-up, 2 / (1 - beta2) updates, is the warm-up control's length
    beta2 = float(R.WHY_BASELINES["synthetic"].adam_betas.strip("()").split(",")[1])
    assert R.BY_NAME["why-synthetic-postln-wu100"].warmup == round(2 / (1 - beta2))


def _jobs(tmp_path, seeds=(1, 2, 3)):
    opts = RunOptions(out=str(tmp_path))
    return [Job(r.with_defaults(), seed, Path("/data") / r.dataset, tmp_path / r.name / f"seed{seed}",
                run_arch(r, "paper"), ("de", "en"), opts) for r in R.WHY for seed in seeds]


def flags(cmd):
    """``{--flag: value}`` of a command line (the last value of a repeated flag; True for a switch)."""
    out, i = {}, 0
    while i < len(cmd):
        if cmd[i].startswith("--"):
            has_value = i + 1 < len(cmd) and not cmd[i + 1].startswith("--")
            out[cmd[i]] = cmd[i + 1] if has_value else True
            i += 2 if has_value else 1
        else:
            i += 1
    return out


def test_each_command_parses_and_differs_from_the_baseline_in_its_setting(tmp_path):
    jobs = _jobs(tmp_path)
    assert len(jobs) == 96 and len({j.config_hash() for j in jobs}) == 96
    base = {j.run.dataset: flags(j.train_cmd()[1:]) for j in jobs if j.run.name.endswith("-postln-nowu") and j.seed == 1}
    expected = {  # the fairseq flags each intervention changes
        "preln-nowu": {"--arch"}, "admin-nowu": {"--arch"}, "postln-wu100": {"--warmup-updates"},
        "postln-radam": {"--optimizer"}, "postln-giadam": {"--optimizer"}, "postln-beta2-0.95": {"--adam-betas"},
        "postln-beta2-0.999": {"--adam-betas"}, "postln-clip1": {"--clip-norm"}, "postln-clip0.1": {"--clip-norm"},
        "postln-lr5e-4": {"--lr"}, "postln-lr3e-4": {"--lr"}, "postln-batch-x4": {"--update-freq"},
        "postln-batch-div4": {"--max-tokens"}, "postln-L3": {"--encoder-layers", "--decoder-layers"},
        "postln-init08": {"--lnpos-init"},
    }
    for job in (j for j in jobs if j.seed == 1):
        argv = job.train_cmd()[1:]
        args = fairseq_build.parse(argv)  # fairseq-train's own parser, the plugin's options included
        assert args.task == "translation_lnpos" and args.log_diagnostics and args.log_grad_norms
        assert args.diagnostics_hessian_updates == "1,50"
        suffix = job.run.name.split("-", 2)[2]
        mine, ref = flags(argv), base[job.run.dataset]
        diff = {k for k in mine.keys() | ref.keys() if mine.get(k) != ref.get(k) and k != "--save-dir"}
        assert diff == expected.get(suffix, set()), (job.run.name, diff)
    giadam = next(j for j in jobs if j.run.name == "why-synthetic-postln-giadam")
    assert fairseq_build.parse(giadam.train_cmd()[1:]).optimizer == "giadam"
    x4 = flags(next(j for j in jobs if j.run.name == "why-multi30k-postln-batch-x4").train_cmd()[1:])
    assert (x4["--max-tokens"], x4["--update-freq"]) == ("1024", "4")


@pytest.mark.parametrize("pattern,count", [("why-*", 96), ("why-synthetic-*", 48)])
def test_one_command_runs_the_study(capsys, tmp_path, pattern, count):
    """``grid.sh run --only 'why-*' --seeds 1,2,3`` is the whole study (dry run: the commands)."""
    data = [f"--data=synthetic={tmp_path}", f"--data=multi30k_cpu={tmp_path}"]
    (tmp_path / "dict.de.txt").write_text("a 1\n")
    (tmp_path / "dict.en.txt").write_text("a 1\n")
    assert run_main("grid", G.main, ["run", "--dry-run", "--only", pattern, "--seeds", "1,2,3", *data,
                                     "--out", str(tmp_path / "out")]) == 0
    cmds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fairseq-train ")]
    assert len(cmds) == count and all("--log-diagnostics" in c for c in cmds)
