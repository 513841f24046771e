"""Training curves over seeds (analysis/curves.py): per row and epoch, the seeds' mean and range, the
difference from the reference row with Welch's interval, the verdict among the rows, the epoch chosen on
validation, and pages that add up with new run folders."""
import gzip
import json
import math

import pytest

from fairseq_lnpos.analysis import curves as C
from fairseq_lnpos.analysis.frame import RUN_COLUMNS
from fairseq_lnpos.experiments.records import DoneRecord, Outcome
from fairseq_lnpos.experiments.rundir import RunDir


def write_run(out, name, ln, seed, nlls, bleus):
    """A run folder of the grid with one eval/epochN.json per epoch (validation NLL, tok BLEU)."""
    d = out / name / f"seed{seed}"
    (d / "eval").mkdir(parents=True)
    run = {"name": name, "dataset": "multi30k_cpu", "ln": ln, "optimizer": "adam", "lr": 1e-3}
    (d / "config.json").write_text(json.dumps({"hash": "0" * 16, "run": run, "seed": seed, "arch": f"transformer_{ln}_tiny"}))
    for e, (nll, bleu) in enumerate(zip(nlls, bleus), 1):
        (d / "eval" / f"epoch{e}.json").write_text(json.dumps({
            "epoch": e, "num_updates": 500 * e, "valid_loss": nll + 1.3, "valid_nll_loss": nll, "train_loss": nll + 1.4,
            "bleu_tok": bleu, "sacrebleu": bleu - 0.5, "length_ratio": 1.0, "repeat_4gram": 0.01}))
    RunDir(d).write_done(DoneRecord(outcome=Outcome.FINISHED, epochs=tuple(range(1, len(nlls) + 1)), initial_loss=13.0,
                                    updates=500 * len(nlls), final_valid_loss=nlls[-1] + 1.3, final_valid_nll=nlls[-1],
                                    unigram_bits=8.0, train_cpu_seconds=300.0 * len(nlls),
                                    provenance={"code": {"commit": "f" * 40, "dirty": False}, "model_code": "abc",
                                                "cpu": "a CPU", "cores": 2, "gpu": [], "load": 1.0}))


# Post-LN with warm-up closes on Pre-LN: far behind at epoch 1, level by epoch 3; seed 2 of Pre-LN selects epoch 2
NLL = {("real-preln-nowu", "preln"): ([5.0, 4.6, 4.5], [5.1, 4.4, 4.6], [4.9, 4.5, 4.4]),
       ("real-postln-wu500", "postln"): ([6.5, 5.0, 4.52], [6.6, 5.1, 4.55], [6.4, 5.05, 4.45])}


KINDS = {"self_attn": 1.0, "ffn": 10.0, "encoder_attn": 100.0}  # decoders only have encoder_attn


def write_residual(save_dir, seed, updates=(1, 10, 50, 51)):
    """diagnostics.jsonl with residual_ratio 0.1 x seed x (layer + 1) x update x KINDS[kind] for 2 layers per
    stack (and each layer's pooled value, which the page leaves out), as the task writes it."""
    save_dir.mkdir(parents=True, exist_ok=True)
    with open(save_dir / "diagnostics.jsonl", "w") as f:
        for u in updates:
            ratio = {}
            for side in ("encoder", "decoder"):
                for layer in (0, 1):
                    for kind, k in KINDS.items():
                        if side == "decoder" or kind != "encoder_attn":
                            ratio[f"{side}/{layer}/{kind}"] = 0.1 * seed * (layer + 1) * u * k
                    ratio[f"{side}/{layer}"] = -1.0
            f.write(json.dumps({"update": u, "residual_ratio": ratio}) + "\n")


@pytest.fixture
def grid(tmp_path):
    out = tmp_path / "grid"
    for (name, ln), seeds in NLL.items():
        for seed, nlls in enumerate(seeds, 1):
            write_run(out, name, ln, seed, nlls, [40 - 4 * n for n in nlls])
            if ln == "postln":
                write_residual(out / name / f"seed{seed}" / "checkpoints", seed)
    write_run(out, "demo-postln-nowu", "postln", 1, [5.0], [1.0])  # not selected by --only
    return out


def test_per_epoch_means_ranges_differences_and_verdicts(grid):
    from scipy.stats import ttest_ind

    runs, epochs, residual = C.load([grid], only=["real-*"])
    assert sorted(runs["run"].unique()) == ["real-postln-wu500", "real-preln-nowu"] and len(epochs) == 18
    # 3 seeds x 4 updates x (2 + 3) connections x 2 layers; the layers' pooled values left out
    assert len(residual) == 120 and set(residual["run"]) == {"real-postln-wu500"}
    rt = C.residual_table(residual).set_index(["connection", "seed"])
    assert list(rt.index) == [(c, s) for c in C.CONNECTIONS for s in (1, 2, 3)]  # per seed: seeds may disagree
    assert 51 not in rt.columns  # only the updates of RESIDUAL_UPDATES
    # mean over the layers (1, 2): 0.1 x seed x 1.5 x update x KINDS
    assert rt.at[("encoder/self_attn", 2), 10] == pytest.approx(3.0)
    assert rt.at[("decoder/encoder_attn", 1), 1] == pytest.approx(15.0) and rt.at[("encoder/ffn", 3), 50] == pytest.approx(225.0)
    ref = C.reference_of(runs)
    assert ref == "real-preln-nowu"
    table = C.curves(epochs, ref).set_index(["run", "epoch"])
    post = table.loc["real-postln-wu500"]
    assert post.at[1, "valid_nll_loss_mean"] == pytest.approx(6.5) and post.at[1, "valid_nll_loss_max"] == 6.6
    ci = ttest_ind([6.5, 6.6, 6.4], [5.0, 5.1, 4.9], equal_var=False).confidence_interval(0.95)
    assert (post.at[1, "diff"], post.at[1, "diff_low"]) == (pytest.approx(1.5), pytest.approx(ci.low))
    assert post.at[1, "good"] is False and post.at[3, "good"] is True and table.at[("real-preln-nowu", 1), "good"] is True
    summ = C.summary(runs, epochs, C.curves(epochs, ref)).set_index("run")
    assert summ.at["real-preln-nowu", "sel_epochs"] == "3,2,3"  # each seed's epoch of lowest validation NLL
    assert summ.at["real-preln-nowu", "sel_bleu"] == pytest.approx(40 - 4 * (4.5 + 4.4 + 4.4) / 3)
    assert summ.at["real-postln-wu500", "good_from"] == 3 and summ.at["real-postln-wu500", "cpu_per_epoch"] == 300
    # the NLL drop over the last epoch, per seed: Pre-LN 0.1, -0.2, 0.1; Post-LN 0.48, 0.55, 0.6
    assert summ.at["real-preln-nowu", "last_gain"] == pytest.approx(0.0 / 3) and summ.at["real-preln-nowu", "last_gain_min"] == \
        pytest.approx(-0.2) and summ.at["real-postln-wu500", "last_gain_max"] == pytest.approx(0.6)


def test_a_seed_trained_for_fewer_epochs_counts_where_it_was_scored(grid):
    """A fourth Pre-LN seed of 2 epochs (e.g. added from a shorter run): in the per-epoch table at epochs 1-2,
    not in the row's last-epoch numbers (selected BLEU, last NLL, the last epoch's drop, CPU per run)."""
    write_run(grid, "real-preln-nowu", "preln", 4, [4.0, 2.0], [60, 70])
    runs, epochs, _ = C.load([grid], only=["real-*"])
    table = C.curves(epochs, "real-preln-nowu").set_index(["run", "epoch"])
    assert table.at[("real-preln-nowu", 2), "seeds"] == 4 and table.at[("real-preln-nowu", 3), "seeds"] == 3
    summ = C.summary(runs, epochs, C.curves(epochs, "real-preln-nowu")).set_index("run")
    row = summ.loc["real-preln-nowu"]
    assert (row["seeds"], row["seeds_full"], row["sel_epochs"]) == (4, 3, "3,2,3")
    assert row["last_gain"] == pytest.approx(0.0) and row["last_nll"] == pytest.approx(4.5)
    # CPU: 900 s per run of 3 epochs (not the mean with the 600 s of the short one); per epoch over all seeds
    assert row["cpu_seconds"] == 900 and row["cpu_per_epoch"] == pytest.approx((3 * 900 + 600) / 11)


def test_a_row_without_a_finite_last_nll_has_no_last_numbers(grid):
    """A row whose runs diverged in their last epoch (NaN NLL) and one of a single epoch: NaN, not an error."""
    write_run(grid, "real-postln-nowu", "postln", 1, [9.0, float("nan")], [0.0, 0.0])
    write_run(grid, "real-keel-nowu", "keel", 1, [5.0], [10.0])
    runs, epochs, _ = C.load([grid], only=["real-*"])
    summ = C.summary(runs, epochs, C.curves(epochs, "real-preln-nowu")).set_index("run")
    assert math.isnan(summ.at["real-postln-nowu", "last_nll"]) and math.isnan(summ.at["real-postln-nowu", "last_gain"])
    assert summ.at["real-keel-nowu", "last_nll"] == 5.0 and math.isnan(summ.at["real-keel-nowu", "last_gain"])


def test_a_page_adds_up_with_new_seeds_and_the_command_refuses_bad_input(grid, tmp_path, capsys):
    import shutil

    old, new = tmp_path / "old", tmp_path / "new"
    for run in grid.iterdir():
        for seed in run.iterdir():
            shutil.copytree(seed, (new if seed.name == "seed3" else old) / run.name / seed.name)
    assert C.main([str(grid), "--only", "real-*", "--out-dir", str(tmp_path / "all")]) == 0
    assert C.main([str(old), "--only", "real-*", "--out-dir", str(tmp_path / "page")]) == 0
    assert C.main([str(tmp_path / "page"), str(new), "--only", "real-*", "--out-dir", str(tmp_path / "both")]) == 0
    for name in ("curves.md", "curves.csv", "epochs.csv"):
        assert (tmp_path / "both" / name).read_text().replace(str(new), str(grid)).replace(str(old), str(grid)) == \
            (tmp_path / "all" / name).read_text(), name
    # the residual table: gzip of its CSV, the same bytes for the same data (no time stamp in the gzip header)
    assert (tmp_path / "both" / C.RESIDUAL_CSV).read_bytes() == (tmp_path / "all" / C.RESIDUAL_CSV).read_bytes()
    assert gzip.decompress((tmp_path / "all" / C.RESIDUAL_CSV).read_bytes()).decode().split("\n", 1)[0] == \
        ",".join(C.RESIDUAL_COLUMNS)
    md = (tmp_path / "all" / "curves.md").read_text()
    assert "| `real-postln-wu500` | 3 | 3 |" in md and "| 3 |" in md and "NLL drop over the last epoch" in md
    assert "| `real-postln-wu500` | encoder/self_attn | 2 | 0.3 | 3 | 15 |" in md  # the residual share of seed 2
    # runs.csv is the per-seed table alone, also when its runs came from a page (no column saying from where)
    assert (tmp_path / "both" / "runs.csv").read_text().split("\n", 1)[0] == ",".join(RUN_COLUMNS)
    # --only chooses before the check that each run is given once: beside the page, a folder with seed 3 of
    # every row and copies of the page's other rows; only real-postln-wu500 is asked for, given once
    mixed = tmp_path / "mixed"
    shutil.copytree(new, mixed)
    for run in old.iterdir():
        if run.name != "real-postln-wu500":
            shutil.copytree(run, mixed / run.name, dirs_exist_ok=True)
    assert C.main([str(tmp_path / "page"), str(mixed), "--only", "real-postln-wu500", "--out-dir", str(tmp_path / "one")]) == 0
    assert C.main([str(grid), "--only", "real-postln-wu500", "--out-dir", str(tmp_path / "one-all")]) == 0
    assert (tmp_path / "one" / "curves.csv").read_text() == (tmp_path / "one-all" / "curves.csv").read_text()
    assert "| `real-postln-wu500` | 3 | 3 |" in (tmp_path / "one" / "curves.md").read_text()
    capsys.readouterr()
    for argv, words in (([str(grid), "--only", "iwslt-*"], "no run finished"),
                        ([str(grid), "--reference", "real-nope"], "--reference real-nope: not among the runs"),
                        ([str(tmp_path / "page"), str(grid)], "give each run once"),
                        ([str(tmp_path / "page"), str(tmp_path / "mixed")], "give each run once"),
                        ([str(tmp_path / "missing")], "no such folder")):
        assert C.main(argv + ["--out-dir", str(tmp_path / "r")]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (argv, err)
