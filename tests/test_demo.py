"""`make demo`: its verdict rule on hand-made summaries, and the whole demo in its quick setting."""
import csv
import subprocess
import sys

import pytest

from conftest import REPO
from fairseq_lnpos.demo import verdict
from fairseq_lnpos.experiments import report


def summary(bad, warmup, preln):
    """Best tok BLEU per seed of the three core runs -> the summary ``verdict`` reads."""
    runs = {"demo-postln-nowu": bad, "demo-postln-wu100": warmup, "demo-preln-nowu": preln}
    return {run: {"seeds": len(v), "best_bleu_tok": (sum(v) / len(v), min(v), max(v))} for run, v in runs.items()}


def test_verdict_shown_when_the_best_no_warmup_seed_is_at_most_half_the_worst_reference():
    text = verdict(summary(bad=[0.0, 2.0], warmup=[68.0, 76.0], preln=[98.1, 99.3]))
    assert text.startswith("effect SHOWN: Post-LN without warm-up reaches tokenized BLEU 1.0 (best seed 2.0); "
                           "with warm-up 72.0 (worst seed 68.0); Pre-LN without warm-up 98.7 (worst seed 98.1)")


def test_verdict_boundary_of_the_half_rule():
    # worst reference seed 40.0: best no-warm-up seed 20.0 is exactly half (shown), 20.5 is not
    assert verdict(summary(bad=[20.0], warmup=[40.0, 80.0], preln=[90.0]))[:13] == "effect SHOWN:"
    assert verdict(summary(bad=[20.5], warmup=[40.0, 80.0], preln=[90.0]))[:17] == "effect NOT shown:"
    # the worst seed of either reference counts, and the best seed of Post-LN without warm-up
    assert verdict(summary(bad=[0.0, 30.0], warmup=[50.0], preln=[90.0])).startswith("effect NOT shown")
    assert verdict(summary(bad=[10.0], warmup=[90.0], preln=[19.0, 99.0])).startswith("effect NOT shown")


@pytest.mark.parametrize("missing", ["demo-postln-nowu", "demo-postln-wu100", "demo-preln-nowu"])
def test_verdict_cannot_be_judged_without_bleu_for_a_core_run(missing):
    s = summary(bad=[0.0], warmup=[70.0], preln=[98.0])
    s[missing] = {"seeds": 1, "status": ["diverged at update 3"]}  # a run with no scored epoch
    assert verdict(s) == "the effect cannot be judged: some of the three core runs have no BLEU yet"
    del s[missing]
    assert verdict(s).startswith("the effect cannot be judged")


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
    for fig in ("grid/fig_demo.png", "grad_norms_first_updates.png", "fig3/fig3.png", "fig3/lemma2.png"):
        assert (out / fig).stat().st_size > 10_000, fig
    assert "| demo-preln-nowu | 1 |" in first.stdout
    assert "[demo] effect" in first.stdout and "total wall time" in first.stdout
    # a finished demo re-runs without training or evaluating anything again
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "training (new)" not in again.stdout and "tok BLEU" in again.stdout
    with open(out / "results.csv", newline="") as f:
        assert list(csv.DictReader(f)) == rows


def test_every_demo_option_names_a_demo_row():
    from fairseq_lnpos.demo import OPTIONAL
    from fairseq_lnpos.experiments.runs import BY_NAME
    from fairseq_lnpos.variants import FURTHER

    assert set(FURTHER) <= set(OPTIONAL)
    for name in OPTIONAL:
        row = BY_NAME[f"demo-{name}-nowu"]
        assert (row.ln, row.dataset, row.warmup) == (name, "synthetic", 0)
