"""`make demo`: its verdict rule on hand-made summaries, and the whole demo in its quick setting."""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from fairseq_lnpos.analysis.seeds import ESTIMATOR, spread
from fairseq_lnpos.demo import LEARNED_BLEU, effect_shown, summarize, write_summary
from fairseq_lnpos.experiments import report
from fairseq_lnpos.experiments.rundir import run_dirs


def summary(bad, warmup, preln):
    """Best tok BLEU per seed of the three core runs -> the summary ``verdict`` reads."""
    runs = {"demo-postln-nowu": bad, "demo-postln-wu100": warmup, "demo-preln-nowu": preln}
    return {run: {"seeds": len(v), "best_bleu_tok": spread(v)} for run, v in runs.items()}


def test_verdict_shown_when_the_best_no_warmup_seed_is_at_most_half_the_worst_reference():
    shown, text = effect_shown(summary(bad=[0.0, 2.0], warmup=[68.0, 76.0], preln=[98.1, 99.3]))
    assert shown is True
    assert text == ("effect SHOWN: Post-LN without warm-up reaches tokenized BLEU 1.0 (best seed 2.0); "
                    "with warm-up 72.0 (worst seed 68.0); Pre-LN without warm-up 98.7 (worst seed 98.1)")


def test_verdict_boundary_of_the_half_rule():
    # worst reference seed 40.0: best no-warm-up seed 20.0 is exactly half (shown), 20.5 is not
    assert effect_shown(summary(bad=[20.0], warmup=[40.0, 80.0], preln=[90.0]))[1][:13] == "effect SHOWN:"
    assert effect_shown(summary(bad=[20.5], warmup=[40.0, 80.0], preln=[90.0]))[1][:17] == "effect NOT shown:"
    # the worst seed of either reference counts, and the best seed of Post-LN without warm-up
    assert effect_shown(summary(bad=[0.0, 30.0], warmup=[50.0], preln=[90.0]))[1].startswith("effect NOT shown")
    assert effect_shown(summary(bad=[16.0], warmup=[90.0], preln=[30.0, 99.0]))[1].startswith("effect NOT shown")


# recorded summaries: best tok BLEU per seed of the demo's three core runs (measured before the results pages:
# "The demo" of `git show 36640e8:docs/results.md`)
FULL_DEMO = dict(bad=[0.00, 1.36], warmup=[79.26, 79.89], preln=[97.91, 99.25])      # make demo, 2 seeds
QUICK_DEMO = dict(bad=[0.0], warmup=[0.0], preln=[0.0])                                # --quick: one epoch
FURTHER_DEMO = dict(bad=[0.00], warmup=[60.27], preln=[99.22])                         # one seed, 12 rows


@pytest.mark.parametrize("recorded, shown", [(FULL_DEMO, True), (FURTHER_DEMO, True), (QUICK_DEMO, False)])
def test_verdict_on_recorded_summaries(recorded, shown):
    assert effect_shown(summary(**recorded))[0] is shown


def test_verdict_requires_both_controls_to_have_learned():
    # nothing trained (the quick demo: tok BLEU 0.0 everywhere) is not the effect
    shown, text = effect_shown(summary(**QUICK_DEMO))
    assert shown is False and text.startswith("effect not shown: the controls did not train (each needs "
                                              f"tok BLEU >= {LEARNED_BLEU:g} in every seed): Post-LN without")
    # one control that did not learn in one seed is enough; a control at the threshold has learned
    assert effect_shown(summary(bad=[0.0], warmup=[80.0, 5.0], preln=[98.0]))[1].startswith("effect not shown: the controls")
    assert effect_shown(summary(bad=[0.0], warmup=[80.0], preln=[LEARNED_BLEU - 0.1]))[0] is False
    assert effect_shown(summary(bad=[0.0], warmup=[80.0], preln=[LEARNED_BLEU]))[0] is True


@pytest.mark.parametrize("missing", ["demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu"])
def test_verdict_cannot_be_judged_without_bleu_for_a_core_run(missing):
    s = summary(bad=[0.0], warmup=[70.0], preln=[98.0])
    s[missing] = {"seeds": 1, "status": ["diverged at update 3"], "best_bleu_tok": None}  # no scored epoch
    assert effect_shown(s) == (None, "the effect cannot be judged: some of the three core runs have no BLEU yet")
    del s[missing]
    assert effect_shown(s)[1].startswith("the effect cannot be judged")


def rows(bleu):
    """Table rows (report.collect's keys) of the three core runs, per seed."""
    return [{"run": run, "seed": i + 1, "outcome": "finished", "best_bleu_tok": b, "final_valid_nll": 1.4 + i}
            for run, seeds in bleu.items() for i, b in enumerate(seeds)]


def test_summary_files_are_labelled_and_give_the_seed_spread(tmp_path):
    recorded = {"demo-postln-nowu": FULL_DEMO["bad"], "demo-postln-wu100": FULL_DEMO["warmup"],
                "demo-preln-nowu": FULL_DEMO["preln"]}
    s = summarize(rows(recorded))
    runs = list(recorded) + ["demo-deepnorm-nowu"]
    md = write_summary(tmp_path, s, runs, effect_shown(s), [tmp_path / "fig_demo.png"], (600.0, 100.0), "1")
    assert (tmp_path / "summary.md").read_text() == "\n".join(md) + "\n"
    text = "\n".join(md)
    pre = spread(FULL_DEMO["preln"])
    assert (f"| Pre-LN, no warm-up (`demo-preln-nowu`) | 2 | {pre.text()} | 1.90 (1.40 to 2.40, n=2; no interval "
            f"from 2 seeds) | finished |") in text
    assert "| DeepNorm, no warm-up (`demo-deepnorm-nowu`) | 0 |  |  | not run |" in text
    flat = " ".join(md)  # prose is wrapped at 100 columns
    assert "Verdict: effect SHOWN: Post-LN without warm-up reaches tokenized BLEU 0.7 (best seed 1.4)" in flat
    assert ESTIMATOR in flat and "summed over the runs" in flat
    assert all(len(line) <= 100 for line in md if not line.startswith(("|", "    ")))
    # next steps: more rows, a translation through fairseq-interactive with this folder's files
    assert f'    make demo DEMO_ARGS="--out {tmp_path} --with-keel --with-admin --with-tfixup"' in md
    assert f"--path {tmp_path}/grid/demo-preln-nowu/seed1/checkpoints/checkpoint_best.pt" in text
    assert f"--sentencepiece-model {tmp_path}/data/text/bpe/spm.model" in text
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["verdict"]["shown"] is True and data["verdict"]["controls"] == ["demo-postln-wu100", "demo-preln-nowu"]
    assert data["estimator"] == ESTIMATOR
    bleu = data["runs"]["demo-preln-nowu"]["best_bleu_tok"]
    assert (bleu["n"], bleu["min"], bleu["max"]) == (2, 97.91, 99.25)
    assert bleu["ci95_low"] < bleu["mean"] < bleu["ci95_high"]
    assert data["runs"]["demo-preln-nowu"]["label"] == "Pre-LN, no warm-up"
    assert data["seconds"] == {"training_summed_over_runs": 600.0, "scoring_summed_over_runs": 100.0}


@pytest.mark.slow
def test_quick_demo_writes_table_and_figures_and_resumes(tmp_path):
    out = tmp_path / "demo-out"
    cmd = [sys.executable, "-m", "fairseq_lnpos.demo", "--quick", "--seeds", "1", "--out", str(out)]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == report.CSV_COLUMNS
    assert [r["run"] for r in rows] == ["demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu", "demo-deepnorm-nowu"]
    assert {r["arch"] for r in rows} == {f"transformer_{v}_tiny" for v in ("postln", "preln", "deepnorm")}
    assert all(r["status"] == "finished" and r["best_bleu_tok"] != "" and float(r["best_valid_loss"]) > 0 for r in rows)
    assert [r["warmup"] for r in rows] == ["0", "100", "0", "0"]
    for fig in ("fig_demo.png", "grad_norms_first_updates.png", "fig3/fig3.png", "fig3/lemma2.png"):
        assert (out / fig).stat().st_size > 10_000, fig
    assert "| Pre-LN, no warm-up (`demo-preln-nowu`) | 1 |" in first.stdout
    # one epoch of 600 pairs teaches no run anything: the verdict says so
    assert "[demo] effect not shown: the controls did not train" in first.stdout
    assert json.loads((out / "summary.json").read_text())["verdict"]["shown"] is False
    assert "Next steps:" in (out / "summary.md").read_text() and "total wall time" in first.stdout
    assert first.stdout.splitlines()[0].startswith("[demo] expected time: not measured for --quick")
    # nothing of fairseq's, torch's or matplotlib's start-up on the terminal
    assert "UserWarning" not in first.stderr and "DEBUG:" not in first.stderr and "INFO:" not in first.stderr
    # a finished demo re-runs without training or evaluating anything again; its results page says
    # how long the command took and what the demo leaves on disk
    again = subprocess.run(cmd + ["--publish", str(tmp_path / "page")], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    page = (tmp_path / "page" / "index.md").read_text()
    assert re.search(r"^Wall time: \d+ s from the command's start to this page", page, re.M)
    assert re.search(r"^Disk: \d+ MB left in `demo-out/`, \d+ MB of it the runs' 8 checkpoints", page, re.M)
    assert "training (new)" not in again.stdout and "tok BLEU" in again.stdout
    with open(out / "results.csv", newline="") as f:
        assert list(csv.DictReader(f)) == rows


def test_every_demo_option_names_a_demo_row():
    from fairseq_lnpos.demo import OPTIONAL
    from fairseq_lnpos.experiments.runs import BY_NAME
    from fairseq_lnpos.variants import GROUPS

    assert set(GROUPS["further"]) <= set(OPTIONAL)
    for name in OPTIONAL:
        row = BY_NAME[f"demo-{name}-nowu"]
        assert (row.ln, row.dataset, row.warmup) == (name, "synthetic", 0)


# ---------------------------------------------------------------- `make demo-real`: Multi30k

from fairseq_lnpos import demo  # noqa: E402
from fairseq_lnpos.experiments.runs import BY_NAME, DATASETS, DEMO_ROWS  # noqa: E402

REAL_ROWS = DEMO_ROWS["multi30k"]


def dry_run(capsys, *argv):
    assert demo.main(["--data", "multi30k", *argv]) == 0
    blocks = [b.splitlines() for b in capsys.readouterr().out.strip().split("\n\n")]
    return [(b[0], b[1].split()) for b in blocks]  # (header, fairseq-train argv) per run x seed


def value(argv, name):
    assert name in argv, name
    return argv[argv.index(name) + 1]


def test_real_preset_plan_rows_seeds_and_sizes(tmp_path, capsys):
    plan = dry_run(capsys, "--dry-run", "--out", str(tmp_path / "o"), "--bin", str(tmp_path / "b"))
    assert not (tmp_path / "o").exists()  # a dry run writes nothing
    heads = [h.split("] ")[1].split(" ->")[0] for h, _ in plan]
    assert sorted(heads) == sorted(f"{r} seed {s}" for r in REAL_ROWS for s in (1, 2))  # default seeds 1,2
    assert set(REAL_ROWS) == {"real-postln-nowu", "real-postln-wu100", "real-preln-nowu"}
    ds = DATASETS["multi30k_cpu"]
    for head, argv in plan:
        run = BY_NAME[head.split("] ")[1].split(" seed")[0]]
        assert argv[1] == str(tmp_path / "b")
        assert value(argv, "--arch") == f"transformer_{run.ln}_tiny"
        assert (value(argv, "--max-tokens"), value(argv, "--update-freq")) == (str(ds["max_tokens"]), "1")
        assert value(argv, "--max-epoch") == str(ds["max_epoch"])
        assert (value(argv, "--lr"), value(argv, "--lr-scheduler")) == ("0.001", "warmup_inverse_sqrt")
        assert value(argv, "--warmup-updates") == ("100" if run.name == "real-postln-wu100" else "1")
        assert "--share-all-embeddings" in argv and "--log-grad-norms" in argv
    # the three rows differ in their variant and warm-up only
    same = [{k: v for k, v in BY_NAME[r].as_dict().items() if k not in ("name", "ln", "warmup")} for r in REAL_ROWS]
    assert all(s == same[0] for s in same)


def test_real_preset_options_refused_with_one_line(tmp_path, capsys):
    from fairseq_lnpos.errors import run_main

    from fairseq_lnpos.data.manifest import write_manifest

    (tmp_path / "bin").mkdir()
    write_manifest(tmp_path / "bin", dataset="synthetic", source_lang="de", target_lang="en",
                   post_process="sentencepiece", refs={})
    rc = run_main("demo", demo.main, ["--data", "multi30k", "--bin", str(tmp_path / "bin"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not Multi30k" in err[0], err
    with pytest.raises(SystemExit) as e:
        demo.main(["--orig", str(tmp_path), "--out", str(tmp_path / "o")])  # --orig without --data multi30k
    assert e.value.code == 2 and "options of --data multi30k" in capsys.readouterr().err


# Measured: `make demo-real` on the real Multi30k, seed 1 ("Real text on a CPU" of `git show 36640e8:docs/results.md`):
# test2016 tok BLEU per row, seed and epoch
MEASURED = {"real-postln-nowu": {1: [2.29, 2.41]},
            "real-postln-wu100": {1: [7.96, 11.51]},
            "real-preln-nowu": {1: [17.62, 28.29]}}


def record_grid(root, bleu):
    """The demo's grid folder as the grid records it: config, per-epoch evals, DONE.json."""
    from fairseq_lnpos.experiments.commands import Job
    from fairseq_lnpos.experiments.records import DoneRecord, EpochRecord, Outcome
    from fairseq_lnpos.experiments.rundir import RunDir

    opts = demo.grid_options(root, root / "data" / "bin", list(REAL_ROWS), "1,2", 1, False)
    for name, seeds in bleu.items():
        for seed, curve in seeds.items():
            run = BY_NAME[name].with_defaults()
            job = Job(run, seed, root / "data" / "bin", root / "grid" / name / f"seed{seed}",
                      f"transformer_{run.ln}_tiny", ("de", "en"), opts)
            rd = RunDir(job.run_dir)
            rd.claim(job.config(), job.config_hash())
            for epoch, b in enumerate(curve, 1):
                rd.write_eval(EpochRecord(epoch=epoch, valid_loss=9.0 - b / 10, bleu_tok=b, sacrebleu=b,
                                          sacrebleu_signature="nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"))
            rd.write_done(DoneRecord(outcome=Outcome.FINISHED, epochs=tuple(range(1, len(curve) + 1)), updates=1012,
                                     initial_loss=13.86, final_valid_loss=9.0 - curve[-1] / 10,
                                     train_seconds=400.0, train_cpu_seconds=390.0))
    return root


def test_real_verdict_on_recorded_results(tmp_path):
    rows, _ = demo.make_table(record_grid(tmp_path, MEASURED))
    assert sorted({r["run"] for r in rows}) == sorted(REAL_ROWS) and len(rows) == 3
    summary = demo.summarize(rows)
    best = {run: max(max(c) for c in seeds.values()) for run, seeds in MEASURED.items()}
    assert summary["real-preln-nowu"]["best_bleu_tok"].max == best["real-preln-nowu"]
    shown, text = demo.effect_shown(summary, REAL_ROWS)
    assert shown and text == ("effect SHOWN: Post-LN without warm-up reaches tokenized BLEU 2.4 (best seed 2.4); with "
                              "warm-up 11.5 (worst seed 11.5); Pre-LN without warm-up 28.3 (worst seed 28.3)")
    assert "sacreBLEU signature: nrefs:1|case:lc" in (tmp_path / "results.md").read_text()
    # the synthetic demo's rows are not these: judged on them, the verdict cannot be given
    assert demo.effect_shown(summary) == (None, "the effect cannot be judged: some of the three core runs have no BLEU yet")


def test_real_verdict_not_shown_when_one_no_warmup_seed_learns(tmp_path):
    learned = dict(MEASURED, **{"real-postln-nowu": {1: [2.29, 2.41], 2: [4.0, 6.0]}})  # 6.0 > 11.51 / 2
    summary = demo.summarize(demo.make_table(record_grid(tmp_path, learned))[0])
    shown, text = demo.effect_shown(summary, REAL_ROWS)
    assert shown is False and text.startswith("effect NOT shown")


def test_real_summary_names_its_own_command_rows_and_data(tmp_path):
    """The summary of `make demo-real` on a data dir given with --bin: its own command, its Pre-LN row's
    checkpoint and the text its manifest records (prepare-multi30k.sh's --out, BIN.text by default),
    not the generated corpus's."""
    from fairseq_lnpos.data.manifest import write_manifest

    out, data = tmp_path / "demo-real-out", tmp_path / "m30k" / "bin"
    data.mkdir(parents=True)
    text_dir = tmp_path / "m30k" / "bin.text"
    write_manifest(data, dataset="multi30k.de-en", source_lang="de", target_lang="en", post_process="sentencepiece",
                   refs={"tok": {"test": text_dir / "tok" / "test.en"}})
    summary = demo.summarize(demo.make_table(record_grid(out, MEASURED))[0])
    md = write_summary(out, summary, list(REAL_ROWS), demo.effect_shown(summary, REAL_ROWS), [], (0, 0), "2",
                       REAL_ROWS[1:], corpus="multi30k", data_dir=data)
    text = "\n".join(md)
    assert md[0] == "# `make demo-real`: summary"
    assert f'    make demo-real DEMO_ARGS="--out {out} --with-keel --with-admin --with-tfixup"' in md
    assert f"--path {out}/grid/real-preln-nowu/seed2/checkpoints/checkpoint_best.pt" in text
    assert f"head -3 {text_dir}/tok/test.de | " in text and f" {data} --user-dir" in text
    assert f"--sentencepiece-model {text_dir}/bpe/spm.model" in text
    assert "Multi30k test2016" in text and "generated corpus" not in text


@pytest.mark.slow
def test_real_preset_end_to_end_on_a_multi30k_format_fixture(tmp_path):
    """`make demo-real` on the six .gz files in the published format (generated captions, a small
    corpus), prepared with prepare-multi30k.sh's code: the three rows trained and scored with both BLEUs."""
    import contextlib
    import io

    from fairseq_lnpos.data import multi30k
    from test_data_multi30k import make_orig, recorded, sums_for

    folder = make_orig(tmp_path / "orig")
    with recorded(sums_for(folder, tmp_path / "SHA256SUMS")), contextlib.redirect_stdout(io.StringIO()):
        multi30k.prepare(tmp_path / "text", tmp_path / "bin", orig=folder, bpe_size=200)
    out = tmp_path / "demo-real-out"
    cmd = [sys.executable, "-m", "fairseq_lnpos.demo", "--data", "multi30k", "--bin", str(tmp_path / "bin"),
           "--seeds", "1", "--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["real-postln-nowu", "real-preln-nowu", "real-postln-wu100"]
    assert [r["arch"] for r in rows] == [f"transformer_{v}_tiny" for v in ("postln", "preln", "postln")]
    assert all(r["status"] == "finished" and r["best_bleu_tok"] != "" and r["sacrebleu"] != "" for r in rows)
    assert "sacreBLEU signature: nrefs:1|case:lc|" in (out / "results.md").read_text()
    assert "[demo] effect" in res.stdout and "real text (Multi30k test2016" in res.stdout
    assert (out / "grad_norms_first_updates.png").stat().st_size > 10_000
    assert not (out / "data").exists()  # --bin: the prepared data dir is used as it is


def test_stability_map_reads_the_real_text_comparison(tmp_path, capsys):
    """The `real-*` rows differ only in the map's axes (variant, warm-up), so the stability map
    reads their grid folder: one cell per variant and warm-up, the seeds pooled."""
    from fairseq_lnpos.analysis import stability

    recorded = dict(MEASURED, **{"real-deepnorm-nowu": {1: [15.0, 25.0]}, "real-preln-wu100": {1: [18.0, 27.0]}},
                    **{"real-postln-nowu": {1: [2.29, 2.41], 2: [2.0, 2.2]}})
    out = record_grid(tmp_path, recorded) / "grid"
    assert stability.main([str(out), "--no-figures"]) == 0
    with open(out / "cells.csv", newline="") as f:
        cells = {(c["variant"], c["warmup"]): c for c in csv.DictReader(f)}
    assert sorted(cells) == [("deepnorm", "0"), ("postln", "0"), ("postln", "100"), ("preln", "0"), ("preln", "100")]
    assert cells["postln", "0"]["seeds"] == "2" and {c["seeds"] for k, c in cells.items() if k != ("postln", "0")} == {"1"}
    assert float(cells["postln", "0"]["bleu"]) == pytest.approx((2.41 + 2.2) / 2)  # the last epoch, seeds averaged
    assert cells["postln", "0"]["trains"] == "False"  # no unigram bits of a data dir that is gone: not judged
    assert float(cells["preln", "0"]["bleu"]) == 28.29


def test_the_real_texts_controls_learn_at_a_lower_bleu():
    """On Multi30k, 1012 updates: Post-LN with warm-up reached 11.5, which is learned there (>= 5), and
    would not be on the generated corpus (< 20)."""
    assert demo.learned_bleu(REAL_ROWS) == 5.0 and demo.learned_bleu(tuple(demo.RUNS[:3])) == demo.LEARNED_BLEU == 20.0


# ---------------------------------------------------------------- bad input: one line, nothing prepared

@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "make demo: error: argument --jobs: 0 is too small: give at least 1 (see --help)"),
    (["--jobs", "x"], "make demo: error: argument --jobs: 'x' is not a whole number (see --help)"),
    (["--data", "nowhere"], "make demo: error: argument --data: invalid choice: 'nowhere' (choose from "),
    (["--orig", "o"], "make demo: error: --orig and --bin are options of --data multi30k (see --help)"),
    (["--data", "multi30k", "--quick"], "make demo: error: --quick is the check of the generated corpus (one epoch "
                                        "of 600 pairs); Multi30k has no quick setting: drop --quick (make demo-real)"),
    (["--seeds", "1,4294967296"], "demo: error: --seeds 1,4294967296: give distinct whole numbers from 0 to "
                                  "4294967295 (fairseq's seeds), e.g. --seeds 1,2,3"),
])
def test_bad_demo_options_are_one_line_before_anything_is_prepared(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo, "make_data", lambda *a, **k: pytest.fail("data prepared"))
    try:
        code = demo.main([*argv, "--out", str(tmp_path / "o")])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_a_second_demo_on_the_same_out_is_refused(tmp_path, capsys, monkeypatch):
    from fairseq_lnpos.common import hold_lock

    out = tmp_path / "o"
    out.mkdir()
    held = hold_lock(out / ".demo.lock", "held by the test")
    monkeypatch.setattr(demo, "make_data", lambda *a, **k: pytest.fail("data prepared"))
    try:
        assert demo.main(["--quick", "--out", str(out)]) == 2
    finally:
        os.close(held)
    assert capsys.readouterr().err == (f"demo: error: --out {out} is in use by another demo (lock {out}/.demo.lock): "
                                       f"wait for it to finish or stop it, or give another --out\n")


# ---------------------------------------------------------------- a re-run with other seeds

def test_a_rerun_with_other_seeds_says_which_seeds_it_merged(tmp_path, capsys, monkeypatch):
    """`make demo-real DEMO_ARGS="--seeds 0"` into a folder whose runs of seed 1 are recorded: the
    summary is over seeds 0 and 1 and says, in one line, that 1 comes from the earlier runs. No training:
    the grid's folder is recorded, the training, table and Fig. 3 steps are stand-ins."""
    out = tmp_path / "demo-real-out"
    record_grid(out, {run: {0: curve, 1: curve} for run, seeds in MEASURED.items() for curve in seeds.values()})
    monkeypatch.setattr(demo, "make_data", lambda *a, **k: out / "data" / "bin")
    monkeypatch.setattr(demo, "run_grid", lambda *a, **k: None)
    # the table's rows without its files and figures (those: test_real_verdict_on_recorded_results)
    monkeypatch.setattr(demo, "make_table", lambda out: (report.collect(run_dirs(out / "grid")), []))
    monkeypatch.setattr(demo, "fig3", lambda out, *a: out / "fig3")
    monkeypatch.setattr(demo, "grad_norm_figure", lambda out, *a: out / "grad_norms_first_updates.png")
    assert demo.main(["--data", "multi30k", "--seeds", "0", "--out", str(out)]) == 0
    line = f"summary over seeds 0 and 1: 0 asked for (--seeds 0), 1 from earlier runs in {out}/grid"
    printed = capsys.readouterr().out
    assert f"[demo] {line}" in printed.splitlines()  # one line, beside the verdict
    assert f"{line}." in " ".join((out / "summary.md").read_text().splitlines())  # the summary's prose, wrapped
    seeds = json.loads((out / "summary.json").read_text())["seeds"]
    assert seeds == {"asked": [0], "in_summary": [0, 1], "from_earlier_runs": [1], "not_recorded": []}
    # Post-LN and Pre-LN at 5 depths, 2 seeds of their own
    assert "step 5/5: Fig. 3 at initialization: 20 tiny models (seeds 1 and 2, not --seeds) on a generated " \
           "Markov corpus, not the demo's Multi30k De-En (real text)" in printed


@pytest.mark.parametrize("asked, recorded, line", [
    ([1, 2], {1, 2}, "summary over seeds 1 and 2, those asked for (--seeds 1,2)"),
    ([0], {0, 1, 2}, "summary over seeds 0, 1 and 2: 0 asked for (--seeds 0), 1 and 2 from earlier runs in G"),
    ([3, 1], {1}, "summary over seeds 1, those asked for (--seeds 3,1); no run of seed 3 recorded"),
])
def test_the_seeds_line(asked, recorded, line):
    summary = {"demo-preln-nowu": {"seed_list": sorted(recorded)}, "demo-keel-nowu": {"seed_list": [7]}}
    assert demo.seeds_line(summary, ["demo-preln-nowu", "demo-postln-nowu"], asked, "G") == line


def test_the_disk_line_counts_every_file_and_the_checkpoints(tmp_path):
    from fairseq_lnpos.demo import disk_line

    (tmp_path / "grid" / "r" / "seed1" / "checkpoints").mkdir(parents=True)
    (tmp_path / "grid" / "r" / "seed1" / "checkpoints" / "checkpoint_last.pt").write_bytes(b"x" * 3_000_000)
    (tmp_path / "grid" / "r" / "seed1" / "checkpoints" / "checkpoint_best.pt").write_bytes(b"x" * 2_000_000)
    (tmp_path / "summary.md").write_bytes(b"x" * 1_600_000)
    assert disk_line(tmp_path) == (f"Disk: 7 MB left in `{tmp_path.name}/`, 5 MB of it the runs' 2 checkpoints "
                                   "(`checkpoint_best.pt` and `checkpoint_last.pt`).")


def test_the_expected_time_is_the_results_pages_never_a_number_typed_into_the_code(tmp_path):
    """The start line quotes the wall time and machine each demo's page recorded; without a page (an
    installed copy) it says it is not known."""
    for data, page in demo.PAGE.items():
        text = (REPO / "docs" / "results" / page / "index.md").read_text()
        wall = re.search(r"^Wall time: (\d+) s from the command's start", text, re.M).group(1)
        assert demo.expected_time(data).startswith(f"{wall} s on the run its results page records (docs/results/{page}: ")
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "index.md").write_text("- Machine: a CPU, 8 cores (8 runs).\n\nWall time: 99 s from the command's start\n")
    assert demo.expected_time("synthetic", results=tmp_path) == ("99 s on the run its results page records "
                                                                 "(docs/results/demo: a CPU, 8 cores), longer on a slower CPU")
    assert demo.expected_time("multi30k", results=tmp_path).startswith("not known here")


@pytest.mark.parametrize("page", ["demo", "demo-real"])
def test_a_demo_page_is_the_summary_of_its_own_runs_csv(page):
    """The demo pages' table over seeds and verdict ("effect SHOWN") follow from their per-seed runs.csv:
    summarize() of its rows gives summary.json's runs, and effect_shown() its verdict."""
    from fairseq_lnpos.analysis.frame import read_runs_csv

    folder = REPO / "docs" / "results" / page
    published = json.loads((folder / "summary.json").read_text())
    summary = summarize(read_runs_csv(folder / "runs.csv").to_dict("records"))
    again = {run: {**s, **{k: s[k].as_dict() if s.get(k) else None for k in demo.SUMMARY_METRICS}}
             for run, s in summary.items()}
    assert json.loads(json.dumps(again)) == published["runs"]
    verdict = published["verdict"]
    need = tuple(r for r in published["runs"] if r.endswith("postln-nowu")) + tuple(verdict["controls"])
    assert effect_shown(summary, need) == (verdict["shown"], verdict["text"]) and verdict["shown"] is True


# ---------------------------------------------------------------- the demo's figure and its interruptions

def curve_rows():
    """The demo's table rows as make_table gives them: two seeds of the four core rows, their epochs'
    records (NLL and the label-smoothed loss 1.2 bits apart)."""
    from fairseq_lnpos.experiments.records import EpochRecord
    from fairseq_lnpos.experiments.runs import BY_NAME

    rows = []
    for i, run in enumerate(("demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu", "demo-deepnorm-nowu")):
        r = BY_NAME[run]
        for seed in (1, 2):
            curve = [EpochRecord(epoch=e, bleu_tok=10.0 * e + i + seed / 10, valid_nll_loss=4.0 - e - i / 10 + seed / 100,
                                 valid_loss=5.2 - e - i / 10 + seed / 100) for e in (1, 2, 3)]
            rows.append({"run": run, "seed": seed, "ln": r.ln, "warmup": r.warmup, "dataset": r.dataset,
                         "figure": r.figure, "curve": curve})
    return rows


def test_the_demo_figure_plots_the_nll_in_bits_tells_seeds_apart_and_names_each_thing_once():
    from fairseq_lnpos.analysis.map_common import variant_color
    from fairseq_lnpos.demo import curves_plot, label

    rows = curve_rows()
    fig = curves_plot(rows)
    bleu_ax, nll_ax = fig.axes[:2]
    assert nll_ax.get_ylabel() == "validation NLL (bits per token, no label smoothing)"
    assert bleu_ax.get_ylabel().startswith("test tok BLEU") and nll_ax.get_xlabel() == bleu_ax.get_xlabel() == "epoch"
    # a line per run and seed: the NLL, not the label-smoothed loss
    assert len(nll_ax.get_lines()) == len(rows) == 8
    drawn = sorted(tuple(line.get_ydata()) for line in nll_ax.get_lines())
    assert drawn == sorted(tuple(e.valid_nll_loss for e in r["curve"]) for r in rows)
    assert sorted(tuple(line.get_ydata()) for line in bleu_ax.get_lines()) == sorted(
        tuple(e.bleu_tok for e in r["curve"]) for r in rows)
    # the two seeds of a run: its colour and line style, each seed its marker
    for run in {r["run"] for r in rows}:
        lines = [line for line in nll_ax.get_lines() if line.get_label().startswith(f"_{run} seed")]
        assert len({(line.get_color(), line.get_linestyle()) for line in lines}) == 1 and len(lines) == 2
        assert len({line.get_marker() for line in lines}) == 2
    assert {line.get_color() for line in nll_ax.get_lines()} == {variant_color(v) for v in ("postln", "preln", "deepnorm")}
    # the legend: each run once, each seed once
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == [label(r) for r in ("demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu",
                                        "demo-deepnorm-nowu")] + ["seed 1", "seed 2"]
    assert len(set(texts)) == len(texts)


def test_make_table_draws_the_demo_figure_of_the_nll(tmp_path, monkeypatch):
    from fairseq_lnpos import demo as D
    from fairseq_lnpos.experiments import report as Rp

    rows = curve_rows()
    (tmp_path / "grid").mkdir()
    for name in ("results.csv", "results.md"):
        (tmp_path / "grid" / name).write_text("x\n")
    monkeypatch.setattr(Rp, "make_table", lambda *a, **k: (None, [], rows + [{"run": "x", "unreadable": "why"}]))
    got, figures = D.make_table(tmp_path)
    assert got[:-1] == rows and figures == [tmp_path / "fig_demo.png"] and figures[0].stat().st_size > 10_000


def test_a_refused_demo_real_leaves_no_folder_and_says_how_to_run_it_offline(tmp_path, capsys, monkeypatch):
    from fairseq_lnpos.data import multi30k
    from fairseq_lnpos.data.download import DataError

    def offline(out, *a, **k):
        (out / "orig").mkdir(parents=True)  # what a failed download leaves: folders, no file
        raise DataError("cannot download https://x/train.de.gz (no network): check the network, or download the six "
                        "files of https://x/ yourself and pass their folder with --orig")

    monkeypatch.setattr(multi30k, "prepare", offline)
    assert demo.main(["--data", "multi30k", "--out", str(tmp_path / "new" / "demo-real-out")]) == 2
    assert not (tmp_path / "new").exists()  # the parent it made too
    capsys.readouterr()
    out = tmp_path / "demo-real-out"
    assert demo.main(["--data", "multi30k", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("demo: error: cannot download")
    assert err.endswith('pass their folder with --orig (through make: make demo-real DEMO_ARGS="--orig DIR")\n')
    assert not out.exists()
    # a folder that was there before, or one with a file in it, stays
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert demo.main(["--data", "multi30k", "--out", str(out)]) == 2
    assert (out / "notes.txt").read_text() == "mine" and (out / "data" / "text" / "orig").is_dir()


def test_an_interrupted_grid_is_one_line_of_the_demo_and_exit_130(tmp_path, capsys, monkeypatch):
    from fairseq_lnpos.experiments import grid

    def interrupted(opts, runs):
        print("[grid 0:00:03] 0/8 runs done | ETA ?")
        print("grid: interrupted; run the same command again to resume", file=sys.stderr)
        return 130

    monkeypatch.setattr(demo, "make_data", lambda out, *a, **k: out / "data" / "bin")
    monkeypatch.setattr(grid, "run_grid", interrupted)
    monkeypatch.setattr("fairseq_lnpos.experiments.plan.select_runs", lambda opts: [])
    assert demo.main(["--out", str(tmp_path / "o")]) == 130
    captured = capsys.readouterr()
    assert captured.err == "demo: interrupted; run the same command again to resume\n"
    assert "[grid 0:00:03] 0/8 runs done" in captured.out


def test_the_demo_figure_ticks_the_epochs_it_scored():
    from fairseq_lnpos.demo import curves_plot

    one = [{**r, "curve": r["curve"][:1]} for r in curve_rows() if r["seed"] == 1]
    fig = curves_plot(one)
    assert [list(ax.get_xticks()) for ax in fig.axes[:2]] == [[1], [1]]
    assert fig._suptitle.get_text().endswith("(data synthetic; seed 1)")
    assert [list(ax.get_xticks()) for ax in curves_plot(curve_rows()).axes[:2]] == [[1, 2, 3], [1, 2, 3]]
