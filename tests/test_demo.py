"""`make demo` end to end in its quick setting: table structure and every figure written."""
import csv
import subprocess
import sys

from conftest import REPO


def test_quick_demo_writes_table_and_figures_and_resumes(tmp_path):
    out = tmp_path / "demo-out"
    cmd = [sys.executable, "-m", "fairseq_lnpos.demo", "--quick", "--seeds", "1", "--out", str(out)]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    required = "run,arch,optimizer,lr,warmup,seed,status,paper_bleu,best_bleu_tok,last_bleu_tok,sacrebleu,best_valid_loss"
    assert set(required.split(",")) <= set(rows[0])
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
