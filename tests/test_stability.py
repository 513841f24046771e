"""Stability map from run folders written here: cells, largest stable lr and LR sensitivity against
numbers worked out by hand, the heatmap's data, the CSV round trip and bad run folders."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_lnpos.analysis import stability as S
from fairseq_lnpos.experiments import report
from fairseq_lnpos.experiments.records import DoneRecord, Outcome
from fairseq_lnpos.experiments.rundir import RunDir, run_dirs

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "stability_map.sh"


def write_run(out, variant, lr, warmup, seed, final=None, initial=9.0, status="finished", layers=None,
              bleu=None, done=True):
    """One run folder as the grid writes it: config.json, eval/epoch1.json and (unless not ``done``) DONE.json
    (a "failed: WHY" ``status``: written as the grid's scheduler writes it)."""
    name = f"{variant}-L{layers or 6}-lr{lr:g}-w{warmup}"
    d = Path(out) / name / f"seed{seed}"
    (d / "eval").mkdir(parents=True)
    run = {"name": name, "dataset": "synthetic", "ln": variant, "optimizer": "adam", "lr": lr, "warmup": warmup}
    if layers is not None:
        run["layers"] = layers
    (d / "config.json").write_text(json.dumps({"hash": "0" * 16, "run": run, "seed": seed,
                                               "arch": f"transformer_{variant}_tiny"}))
    (d / "eval" / "epoch1.json").write_text(json.dumps({"epoch": 1, "num_updates": 100, "valid_loss": final,
                                                        "train_loss": final, "bleu_tok": bleu}))
    if done and status.startswith("failed: "):
        RunDir(d).write_done(DoneRecord.failed(status[len("failed: "):]))  # as the grid records a failed run
    elif done:
        diverged = status.startswith("diverged")
        (d / "DONE.json").write_text(json.dumps({
            "status": status, "diverged_at": 40 if diverged else None, "epochs": [1], "initial_loss": initial,
            "final_valid_loss": None if diverged else final, "updates": 40 if diverged else 100}))
    return d


@pytest.fixture
def sweep(tmp_path):
    """Post-LN at depth 6 (two seeds) and 12, Pre-LN at depth 6; lr x warm-up with divergences."""
    out = tmp_path / "sweep"
    for seed, init in ((1, 9.0), (2, 9.2)):
        write_run(out, "postln", 1e-4, 0, seed, final=5.0 + (seed - 1) * 0.2, initial=init)
        write_run(out, "postln", 1e-3, 0, seed, final=4.0 + (seed - 1) * 0.2, initial=init, bleu=20.0 + seed)
    write_run(out, "postln", 1e-2, 0, 1, status="diverged at update 40", initial=9.0)
    write_run(out, "postln", 1e-2, 0, 2, final=12.0, initial=9.2)  # finished, but above its initial loss
    write_run(out, "postln", 1e-3, 1000, 1, final=4.15)
    write_run(out, "postln", 1e-2, 1000, 1, final=4.18)
    write_run(out, "postln", 1e-3, 0, 1, final=4.5, layers=12)
    write_run(out, "postln", 1e-2, 0, 1, status="diverged at update 40", layers=12)
    write_run(out, "preln", 1e-3, 0, 1, final=4.3)
    write_run(out, "preln", 1e-2, 0, 1, final=4.35)
    write_run(out, "preln", 1e-1, 0, 1, final=7.0, done=False)  # unfinished: listed, not counted
    write_run(out, "keel", 1e-3, 0, 1, status="failed: fairseq-train exited 1")
    return out


def cell(cells, variant, layers, warmup, lr):
    (c,) = [c for c in cells if (c.variant, c.layers, c.warmup, c.lr) == (variant, layers, warmup, lr)]
    return c


def test_records(sweep):
    records = S.load_records(sweep)
    assert len(records) == 14
    status = {(r.variant, r.layers, r.lr, r.warmup, r.seed): r.outcome for r in records}
    assert status[("preln", 6, 1e-1, 0, 1)] == "unfinished" and status[("keel", 6, 1e-3, 0, 1)] == "failed"
    assert status[("postln", 12, 1e-2, 0, 1)] == "diverged"
    (r,) = [r for r in records if (r.variant, r.lr, r.warmup, r.seed, r.layers) == ("postln", 1e-3, 0, 2, 6)]
    assert (r.initial_loss, r.final_valid_loss, r.bleu) == (9.2, 4.2, 22.0)


def test_the_failed_run_is_the_grids_record_and_the_map_lists_it(sweep):
    failed = sweep / "keel-L6-lr0.001-w0" / "seed1"
    assert json.loads((failed / "DONE.json").read_text()) == {"status": "failed: fairseq-train exited 1",
                                                             "outcome": "failed", "reason": "fairseq-train exited 1"}
    rec = RunDir(failed).record()
    assert (rec.outcome, rec.outcome_text, rec.done, rec.evals[0].epoch) == (
        Outcome.FAILED, "failed: fairseq-train exited 1", DoneRecord.failed("fairseq-train exited 1"), 1)
    assert not rec.outcome.final  # a re-run retries it
    (r,) = [r for r in S.load_records(sweep) if r.path == str(failed)]
    assert (r.outcome, r.initial_loss, r.diverged_at) == ("failed", None, None)


def test_one_warm_up_rule_in_the_table_and_the_map(tmp_path):
    """Warm-up 1 is the paper's T_warmup = 1, no warm-up, as the sweeps name it (--warmup 1): the map puts
    it in the cell of warm-up 0, and the map and the table both call it "none"."""
    write_run(tmp_path, "postln", 1e-3, 1, 1, final=4.0)
    write_run(tmp_path, "postln", 1e-3, 0, 2, final=4.2)
    write_run(tmp_path, "postln", 1e-3, 100, 1, final=3.0)
    cells = S.make_cells(S.load_records(tmp_path))
    assert [(c.warmup, c.seeds) for c in cells] == [(0, 2), (100, 1)]
    md = S.markdown(tmp_path, S.load_records(tmp_path), cells, S.DEFAULT_RATIO)
    # none: 4.1 trains (<= 0.6 x 9) but is not near the best cell (3.0 with warm-up): by the seed noise,
    # s = 0.1414 (the two seeds 4.0, 4.2), delta = 2 x 0.1414 x sqrt(1/2 + 1/1) = 0.346 > 0.1 x 3.0; CI: t(0.975, 1)
    # = 12.706 x 0.1414 / sqrt(2) = 1.27 around 4.1
    assert "| none | 4.100 [4.00-4.20; CI 2.83-5.37] n2 poor |" in md and "| 100 | 3.000 n1 **good** |" in md
    table = report.markdown(report.collect(run_dirs(tmp_path)))
    assert [line.split(" | ")[4] for line in table.splitlines() if line.startswith("| postln-")] == ["none", "none", "100"]


def test_cells_and_largest_stable_lr_by_hand(sweep):
    records = S.load_records(sweep)
    cells = S.make_cells(records, ratio=0.6)
    c = cell(cells, "postln", 6, 0, 1e-2)
    assert (c.seeds, c.diverged, c.final_valid_loss, c.trains) == (2, 1, 12.0, False)
    c = cell(cells, "postln", 6, 0, 1e-3)
    assert (c.seeds, c.diverged, c.final_valid_loss, c.bleu, c.trains) == (2, 0, pytest.approx(4.1), 21.5, True)
    assert (c.loss_min, c.loss_max, c.loss_sd) == (4.0, 4.2, pytest.approx(0.2 / math.sqrt(2)))
    assert c.initial_loss == pytest.approx(9.1)
    assert cell(cells, "postln", 6, 0, 1e-4).trains  # 5.1 <= 0.6 x 9.1
    assert not any(c.variant == "keel" for c in cells)  # failed runs are not cells
    assert S.max_trains_lr(cells) == {("postln", 6, 0): 1e-3, ("postln", 6, 1000): 1e-2,
                                      ("postln", 12, 0): 1e-3, ("preln", 6, 0): 1e-2}
    # good: Post-LN's best at depth 6 is 4.1 (n 2); delta = max(0.41, 2 x 0.1414 x sqrt(1/n + 1/2)) = 0.41 for
    # n = 1 or 2: 4.15 and 4.18 are near it, 5.1 is not; Pre-LN's 4.3 and 4.35 are within 0.43 of 4.3
    assert S.max_good_lr(cells) == {("postln", 6, 0): (1e-3, False), ("postln", 6, 1000): (1e-2, False),
                                    ("postln", 12, 0): (1e-3, False), ("preln", 6, 0): (1e-2, False)}
    assert cell(cells, "postln", 6, 1000, 1e-2).good_limit == pytest.approx(4.1 + 0.41)
    assert cell(cells, "postln", 6, 0, 1e-4).verdict() == "poor"
    # at 0.48 x the initial loss: lr 1e-4 (5.1 > 4.37), depth 12 (4.5 > 4.32) and Pre-LN's 4.35 drop out
    narrow = S.make_cells(records, ratio=0.48)
    assert not cell(narrow, "postln", 6, 0, 1e-4).trains and cell(narrow, "postln", 6, 1000, 1e-2).trains
    assert S.max_trains_lr(narrow) == {("postln", 6, 0): 1e-3, ("postln", 6, 1000): 1e-2,
                                       ("postln", 12, 0): None, ("preln", 6, 0): 1e-3}


def test_verdicts_do_not_flip_on_run_to_run_noise(tmp_path):
    """The default map on two machines: Post-LN without warm-up reached 4.21 bits at lr 3e-4 on one and
    4.08 on the other, 4.0 with warm-up; from a first loss of 8.6 both train and both are near the best
    (within 0.1 x 4.0), a stall at 6.2 is neither (the rule of 0.1 bit of the best cell gave 3e-4 on one
    machine and none on the other)."""
    verdicts = []
    for machine, noisy in (("a", 4.21), ("b", 4.08)):
        out = tmp_path / machine
        write_run(out, "postln", 1e-4, 0, 1, final=5.6, initial=8.6)
        write_run(out, "postln", 3e-4, 0, 1, final=noisy, initial=8.6)
        write_run(out, "postln", 1e-3, 0, 1, final=6.2, initial=8.6)
        write_run(out, "postln", 1e-3, 1000, 1, final=4.0, initial=8.6)
        cells = S.make_cells(S.load_records(out))
        verdicts.append((S.max_trains_lr(cells)[("postln", 6, 0)], S.max_good_lr(cells)[("postln", 6, 0)],
                         [c.verdict() for c in cells]))
    assert verdicts[0] == verdicts[1] == (3e-4, (3e-4, False), ["no-train", "good", "no-train", "good"])


def demo_cells(tmp_path, postln_nowu=(4.55, 4.49), seeds=(1, 2)):
    """The demo's folder as recorded (docs/results.md, `make demo`, lr 1e-3, 300 updates): Post-LN without
    warm-up stalls near 4.5 bits (tok BLEU 0.7) while it trains by the lax rule (first loss about 9.3),
    Post-LN with 100 warm-up updates and Pre-LN reach about 1.4."""
    for seed, nowu in zip(seeds, postln_nowu):
        write_run(tmp_path, "postln", 1e-3, 0, seed, final=nowu, initial=9.3, bleu=0.7)
        write_run(tmp_path, "postln", 1e-3, 100, seed, final=1.42 + 0.03 * seed, initial=9.3, bleu=98.0)
        write_run(tmp_path, "preln", 1e-3, 0, seed, final=1.38 + 0.02 * seed, initial=9.3, bleu=99.0)
    return S.make_cells(S.load_records(tmp_path))


def test_the_demos_post_ln_without_warm_up_is_not_good(tmp_path):
    cells = demo_cells(tmp_path)
    bad = cell(cells, "postln", 6, 0, 1e-3)
    assert bad.trains and not bad.near_best and bad.verdict() == "poor"  # 4.52 <= 0.6 x 9.3, far from 1.465
    assert cell(cells, "postln", 6, 100, 1e-3).verdict() == "good" and cell(cells, "preln", 6, 0, 1e-3).good
    assert S.max_good_lr(cells)[("postln", 6, 0)] == (None, False)
    assert S.max_trains_lr(cells)[("postln", 6, 0)] == 1e-3  # the lax rule alone calls it stable


def test_seeds_that_straddle_the_threshold_are_marked(tmp_path):
    """Pre-LN at lr 1e-2: seeds 1.50 and 1.80 against a best of 1.40; s pooled over the two cells
    (1.39/1.41 and 1.50/1.80, one degree of freedom each) = 0.1503, delta = max(0.14, 2 x 0.1503 x
    sqrt(1/2 + 1/2)) = 0.3007: the mean 1.65 is good, seed 1 is good alone, seed 2 (1.80) is not."""
    for seed, (a, b) in enumerate(((1.39, 1.50), (1.41, 1.80)), 1):
        write_run(tmp_path, "preln", 1e-3, 0, seed, final=a, initial=9.0)
        write_run(tmp_path, "preln", 1e-2, 0, seed, final=b, initial=9.0)
    cells = S.make_cells(S.load_records(tmp_path))
    c = cell(cells, "preln", 6, 0, 1e-2)
    s = math.sqrt((2 * 0.01 ** 2 + 2 * 0.15 ** 2) / 2)
    assert c.good_limit == pytest.approx(1.40 + 2 * s)
    assert c.disagree and c.verdict() == "good" and not cell(cells, "preln", 6, 0, 1e-3).disagree
    md = S.markdown(tmp_path, S.load_records(tmp_path), cells, S.Rules())
    assert "n2 **good**?" in md and "| Pre-LN | 6 | 0.01 (seeds disagree) |" in md
    assert S.max_good_lr(cells)[("preln", 6, 0)] == (1e-2, True)


def test_one_seed_maps_say_so_and_use_the_floor(tmp_path):
    write_run(tmp_path, "preln", 1e-3, 0, 1, final=1.40, initial=9.0)
    write_run(tmp_path, "preln", 1e-2, 0, 1, final=1.53, initial=9.0)
    write_run(tmp_path, "preln", 3e-2, 0, 1, final=1.55, initial=9.0)
    cells = S.make_cells(S.load_records(tmp_path))
    assert [c.verdict() for c in cells] == ["good", "good", "poor"]  # limit 1.40 x 1.1 = 1.54
    md = S.markdown(tmp_path, S.load_records(tmp_path), cells, S.Rules())
    assert "1 seed per cell (no spread: one seed)" in md and "delta is the floor alone" in md


def test_best_loss_per_warmup_by_hand(sweep):
    best = S.best_loss(S.make_cells(S.load_records(sweep)))
    # Post-LN, 6 layers, no warm-up: cells 5.1, 4.1 and 12.0 (lr 1e-2: one seed diverged, excluded)
    assert best == {("postln", 6, 0): pytest.approx(4.1), ("postln", 6, 1000): 4.15, ("postln", 12, 0): 4.5,
                    ("preln", 6, 0): 4.3}


def test_lr_sensitivity_by_hand(sweep):
    sens = S.lr_sensitivity(S.load_records(sweep))
    # Post-LN, 6 layers, no warm-up; per lr the mean over seeds of min(final, initial), a diverged final = initial:
    #   1e-4: (5.0 + 5.2) / 2 = 5.1;  1e-3: (4.0 + 4.2) / 2 = 4.1;  1e-2: (min(9.0, 9.0) + min(12.0, 9.2)) / 2 = 9.1
    # best final on the grid: 4.1 (lr 1e-3)  ->  (5.1 + 4.1 + 9.1) / 3 - 4.1 = 2.0
    assert sens[("postln", 6, 0)] == pytest.approx(2.0)
    assert sens[("postln", 6, 1000)] == pytest.approx((4.15 + 4.18) / 2 - 4.15)
    assert sens[("postln", 12, 0)] == pytest.approx((4.5 + 9.0) / 2 - 4.5)  # the diverged lr counts as 9.0
    assert sens[("preln", 6, 0)] == pytest.approx(0.025)
    assert ("keel", 6, 0) not in sens


def test_non_finite_final_loss_counts_as_diverged(tmp_path):
    write_run(tmp_path, "postln", 1e-3, 0, 1, final=4.0)
    write_run(tmp_path, "postln", 1e-2, 0, 1, final=float("nan"), initial=9.5)
    (r,) = [r for r in S.load_records(tmp_path) if r.lr == 1e-2]
    assert r.outcome == "diverged"
    assert S.lr_sensitivity(S.load_records(tmp_path))[("postln", 6, 0)] == pytest.approx((4.0 + 9.5) / 2 - 4.0)


def test_sensitivity_needs_initial_losses(tmp_path):
    write_run(tmp_path, "preln", 1e-3, 0, 1, final=4.0, initial=None)
    write_run(tmp_path, "preln", 1e-2, 0, 1, final=4.4)
    assert S.lr_sensitivity(S.load_records(tmp_path)) == {("preln", 6, 0): None}
    md = S.markdown(tmp_path, S.load_records(tmp_path), S.make_cells(S.load_records(tmp_path)), 0.1)
    assert "Learning-rate grid: 0.001, 0.01.\n\n| architecture | layers | warm-up none |" in md
    assert "| Pre-LN | 6 | initial loss not recorded |" in md
    assert "Initialization: fairseq-0.12 (--lnpos-init)." in md  # the runs' own, the default for older runs


def test_heatmap_data_and_png(sweep, tmp_path):
    cells = S.make_cells(S.load_records(sweep))
    m = S.heatmap(cells, "postln", 6)
    assert (m["warmups"], m["lrs"]) == ([0, 1000], [1e-4, 1e-3, 1e-2])
    assert m["loss"][0][:2] == [pytest.approx(5.1), pytest.approx(4.1)] and m["loss"][0][2] == 12.0
    assert math.isnan(m["loss"][1][0]) and m["loss"][1][1:] == [4.15, 4.18]  # no run at lr 1e-4, warm-up 1000
    assert m["diverged"] == [[0, 0, 1], [0, 0, 0]] and m["seeds"] == [[2, 2, 2], [0, 1, 1]]
    assert m["bleu"][0] == [None, 21.5, None]
    drawn = S.plot_heatmaps(cells, tmp_path / "h.png")
    assert set(drawn) == {("postln", 6), ("postln", 12), ("preln", 6)} | {("preln", 12)}
    assert drawn[("postln", 12)]["diverged"] == [[0, 1]] and drawn[("preln", 12)]["lrs"] == []
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = S.plot_sensitivity(S.lr_sensitivity(S.load_records(sweep)), tmp_path / "s.png")
    assert lines[0] == {"postln": [(6, pytest.approx(2.0)), (12, pytest.approx(2.25))], "preln": [(6, pytest.approx(0.025))]}
    assert lines[1000] == {"postln": [(6, pytest.approx(0.015))]}


def test_csv_round_trip(sweep, tmp_path):
    cells = S.make_cells(S.load_records(sweep))
    S.write_csv(cells, tmp_path / "c.csv")
    assert S.read_csv(tmp_path / "c.csv") == cells
    assert (tmp_path / "c.csv").read_text().splitlines()[0].startswith("label,variant,layers,warmup,lr,")


def test_main_writes_everything_and_prints_the_markdown(sweep, capsys):
    assert S.main([str(sweep), "--ratio", "0.48"]) == 0
    md = capsys.readouterr().out
    assert md == (sweep / "stability.md").read_text()
    assert "14 runs: 10 finished, 2 diverged, 0 stopped early, 1 failed, 1 unfinished" in md
    assert "mean over the learning-rate grid of min(final loss, initial loss) minus the best final loss" in md
    assert ("| none | 5.100 [5.00-5.20; CI 3.83-6.37] n2 no-train | 4.100 [4.00-4.20; CI 2.83-5.37] n2 BLEU 21.5 "
            "**good** | 12.000 n2 no-train, x 1/2 |") in md  # Post-LN, 6 layers
    # largest good lr, largest lr that trains, then LR sensitivity (grids differ, so each value names its own)
    table = ("| architecture | layers | warm-up none | warm-up 1000 |\n|---|---|---|---|\n| Post-LN | 6 | 0.001 | 0.01 |\n"
             "| Post-LN | 12 | - |  |\n| Pre-LN | 6 | 0.001 |  |\n")
    assert md.count(table) == 1  # the lax rule's table; the headline's has two more columns
    assert ("| architecture | layers | warm-up none | warm-up 1000 | its best | best at this depth |\n|---|---|---|---|---|---|\n"
            "| Post-LN | 6 | 0.001 | 0.01 | 4.100 | 4.100 |\n| Post-LN | 12 | - |  | – | – |\n| Pre-LN | 6 | 0.001 |  | 4.300 | 4.100 |\n") in md
    assert "| Post-LN | 6 | 2.000 (lr 0.0001, 0.001, 0.01) | 0.015 (lr 0.001, 0.01) |" in md
    assert f"- unfinished: {sweep / 'preln-L6-lr0.1-w0' / 'seed1'}" in md
    assert "the final validation loss is at most 0.48 x the initial loss" in md
    assert len(S.read_csv(sweep / "stability.csv")) == 9
    for png in ("stability_heatmaps.png", "sensitivity_vs_depth.png"):
        assert (sweep / png).read_bytes()[:4] == b"\x89PNG"


def test_unreadable_done_json_is_one_line_and_exit_2(sweep, capsys):
    done = sweep / "postln-L6-lr0.001-w0" / "seed2" / "DONE.json"
    done.write_bytes(b"\xff\xfe")
    assert S.main([str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stability_map.sh: error: {done} cannot be read")
    assert not (sweep / "stability.md").exists()


@pytest.mark.slow  # the entry point imports the package, hence fairseq
def test_entry_point_exit_2_for_a_done_json_cut_short(sweep):
    done = sweep / "postln-L6-lr0.001-w0" / "seed2" / "DONE.json"
    done.write_text('{"status": "fini')
    res = subprocess.run([str(SCRIPT), str(sweep), "--no-figures"], capture_output=True, text=True,
                         env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"stability_map.sh: error: {done} is damaged")
    assert not (sweep / "stability.md").exists()


def test_bad_folders_are_one_line_errors(tmp_path, capsys):
    assert S.main([str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'} is not a folder: give the output folder of a sweep" in capsys.readouterr().err
    assert S.main([str(tmp_path)]) == 2
    assert f"no runs in {tmp_path} (no NAME/seedS/ with config.json): give the output folder" in capsys.readouterr().err
    d = write_run(tmp_path, "postln", 1e-3, 0, 1, final=4.0)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "run": {**cfg["run"], "ln": "midln"}}))
    assert S.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(d / "config.json") in err and "'midln'" in err


def test_the_results_table_over_seeds_by_hand(tmp_path):
    """make_table.sh: per run, n seeds, the mean, min-max and the 95 % CI (t(0.975, 2) = 4.303) of best
    tok BLEU and of the best validation loss; a run of one seed says so; the long CSV round-trips."""
    for seed, bleu in ((1, 20.0), (2, 22.0), (3, 27.0)):
        write_run(tmp_path, "postln", 1e-3, 0, seed, final=4.0 + seed / 10, bleu=bleu)
    write_run(tmp_path, "preln", 1e-3, 0, 1, final=3.0, bleu=30.0)
    md, written, _ = report.make_table(tmp_path, with_figures=False)
    # BLEU 20, 22, 27: mean 23, sd sqrt(13) = 3.606, half-width 4.303 x 3.606 / sqrt(3) = 8.957
    assert "| `postln-L6-lr0.001-w0` | 3 | 3 finished | 23.00 (20.00-27.00, CI 14.04-31.96, n=3) |" in md
    assert "| `preln-L6-lr0.001-w0` | 1 | 1 finished | 30.00 (1 seed) |" in md
    import csv
    rows = list(csv.DictReader(open(tmp_path / "results_by_run.csv")))
    bleu = next(r for r in rows if r["run"] == "postln-L6-lr0.001-w0" and r["metric"] == "best_bleu_tok")
    assert (int(bleu["n"]), float(bleu["mean"]), float(bleu["ci95_high"])) == (3, 23.0, pytest.approx(31.957, abs=1e-3))
    loss = next(r for r in rows if r["run"] == "postln-L6-lr0.001-w0" and r["metric"] == "best_valid_loss")
    assert (float(loss["min"]), float(loss["max"])) == (4.1, 4.3)
    assert tmp_path / "results_by_run.csv" in written


def test_the_overview_of_every_architecture(sweep, tmp_path):
    cells = S.make_cells(S.load_records(sweep))
    drawn = S.plot_overview(cells, tmp_path / "o.png")
    m = drawn[6]
    assert m["variants"] == ["postln", "preln"] and m["cols"] == [(0, 1e-4), (0, 1e-3), (0, 1e-2), (1000, 1e-3), (1000, 1e-2)]
    assert m["cells"][1][0] is None and m["cells"][0][1].final_valid_loss == pytest.approx(4.1)
    assert S.cell_mark(m["cells"][0][1]) == "4.10 G n2" and S.cell_mark(m["cells"][0][2]) == "12.00 - n2"
    assert S.cell_mark(drawn[12]["cells"][0][1]) == "x n1"
    assert S.overview_text(m["cells"][0][1]) == "4.10 [4.00-4.20] n2 G"
    assert S.overview_text(m["cells"][0][2]) == "12.00 n2 - x1"  # one seed diverged, the other finished above 0.6 x
    table = S.overview_table(cells)
    assert table[2] == "| architecture | wu none, lr 0.0001 | wu none, lr 0.001 | wu none, lr 0.01 | wu 1000, lr 0.001 | wu 1000, lr 0.01 |"
    assert table[4].startswith("| Post-LN | 5.10 [5.00-5.20] n2 p | 4.10 [4.00-4.20] n2 G | 12.00 n2 - x1 |")
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_results_csv_of_an_earlier_version_is_replaced_a_foreign_one_is_not(tmp_path):
    write_run(tmp_path, "postln", 1e-3, 0, 1, final=4.0, bleu=20.0)
    old = ("run,arch,optimizer,lr,warmup,schedule,seed,status,paper_bleu,paper_valid_loss,paper_note,best_bleu_tok,"
           "best_epoch,last_bleu_tok,last_epoch,sacrebleu,last_sacrebleu,best_valid_loss,epochs,avg_bleu_tok,"
           "avg_sacrebleu,avg_epochs,source\n")  # the header before the compound-split columns
    (tmp_path / "results.csv").write_text(old)
    report.make_table(tmp_path, with_figures=False)
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == ",".join(report.CSV_COLUMNS)
    (tmp_path / "results.csv").write_text("my,own,notes\n")
    with pytest.raises(Exception, match="was not written by make_table.sh"):
        report.make_table(tmp_path, with_figures=False)
    assert (tmp_path / "results.csv").read_text() == "my,own,notes\n"


def test_the_map_states_its_training_time_in_cpu_seconds_where_recorded(tmp_path):
    for seed, cpu in ((1, 30.0), (2, None)):
        d = write_run(tmp_path, "preln", 1e-3, 0, seed, final=1.5)
        done = json.loads((d / "DONE.json").read_text())
        (d / "DONE.json").write_text(json.dumps({**done, "train_seconds": 100.0,
                                                 **({"train_cpu_seconds": cpu} if cpu else {})}))
    assert S.cpu_line(S.load_records(tmp_path)) == (
        "Training time of the 2 counted runs: 200 s wall (fairseq-train, summed over runs); CPU time recorded by "
        "1 of them: 30 s, 30.0 s a run (DONE.json train_cpu_seconds).")


def test_good_against_the_best_of_any_architecture(tmp_path):
    """One cell per architecture: against its own best every cell that trains is good; against the best
    of the depth only the cells near the best architecture's are."""
    for seed in (1, 2):
        write_run(tmp_path, "preln", 1e-3, 0, seed, final=5.0 + 0.02 * seed, initial=13.8)
        write_run(tmp_path, "postln", 1e-3, 100, seed, final=5.9 + 0.02 * seed, initial=13.8)
        write_run(tmp_path, "keel", 1e-3, 0, seed, final=5.3 + 0.02 * seed, initial=13.8)
    records = S.load_records(tmp_path)
    own = {c.variant: c.good for c in S.make_cells(records)}
    assert own == {"preln": True, "postln": True, "keel": True}
    rules = S.Rules(against="all")
    cells = S.make_cells(records, rules=rules)
    assert {c.variant: c.good for c in cells} == {"preln": True, "postln": False, "keel": True}
    assert cell(cells, "postln", 6, 100, 1e-3).good_limit == pytest.approx(5.03 * 1.1)
    md = S.markdown(tmp_path, records, cells, rules)
    assert "the best cell of any architecture at that depth (--against)" in md
    with pytest.raises(ValueError, match="against 'depth'"):
        S.Rules(against="depth")


def test_the_bleu_figure_per_architecture(tmp_path):
    """Where BLEU was scored: per depth and warm-up, each architecture's best-BLEU cell with its seeds'
    min-max and its verdict; no BLEU, no figure."""
    for seed, (pre, post) in enumerate(((27.0, 2.0), (28.0, 0.0)), 1):
        write_run(tmp_path, "preln", 1e-3, 0, seed, final=5.0, initial=13.8, bleu=pre)
        write_run(tmp_path, "postln", 1e-3, 0, seed, final=11.0 + seed * 0.1, initial=13.8, bleu=post)
        write_run(tmp_path, "postln", 1e-3, 100, seed, final=5.9, initial=13.8, bleu=12.0)
    cells = S.make_cells(S.load_records(tmp_path), rules=S.Rules(against="all"))
    points = S.plot_bleu(cells, tmp_path / "bleu.png")
    assert points[6][0] == [("postln", 1.0, 0.0, 2.0, False), ("preln", 27.5, 27.0, 28.0, True)]
    assert points[6][100] == [("postln", 12.0, 12.0, 12.0, False)]
    assert (tmp_path / "bleu.png").stat().st_size > 0
    no_bleu = [S.replace(c, bleu=None) for c in cells]
    assert S.plot_bleu(no_bleu, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_against_auto_judges_one_cell_per_architecture_against_the_depths_best(tmp_path, capsys):
    """A depth map has one cell per architecture and depth: against its own best it would always be good,
    so ``--against auto`` (the default) judges it against the best of any architecture at that depth; a
    learning-rate map keeps each architecture's own best."""
    assert S.auto_against([("preln", 6, 0, 1e-3), ("postln", 6, 0, 1e-3), ("postln", 12, 0, 1e-3)]) == "all"
    assert S.auto_against([("preln", 6, 0, 1e-3), ("preln", 6, 0, 1e-2), ("postln", 6, 0, 1e-3),
                           ("postln", 6, 100, 1e-3)]) == "arch"
    for layers in (6, 24):
        for seed in (1, 2):
            write_run(tmp_path, "preln", 1e-3, 0, seed, final=1.6 + 0.02 * seed, layers=layers)
            write_run(tmp_path, "postln", 1e-3, 0, seed, final=(4.3 if layers == 6 else 5.0) + 0.02 * seed,
                      layers=layers)
    assert S.main([str(tmp_path), "--no-figures"]) == 0
    md = capsys.readouterr().out
    assert "the best cell of any architecture at that depth (--against)" in md
    cells = S.read_csv(tmp_path / "stability.csv")
    assert {(c.variant, c.layers): c.good for c in cells} == {
        ("preln", 6): True, ("preln", 24): True, ("postln", 6): False, ("postln", 24): False}
    assert all(c.trains for c in cells)  # trains (5.0 < 0.6 x 9), yet not good
    assert S.main([str(tmp_path), "--no-figures", "--against", "arch"]) == 0
    capsys.readouterr()
    assert all(c.good for c in S.read_csv(tmp_path / "stability.csv"))
