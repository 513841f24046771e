"""The grid end to end on CPU: a tiny corpus, two runs (one forced to diverge), kill and resume, table, figures."""
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments.evaluate import read_lines, tok_bleu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toydata import make_toy_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GRID, TABLE = REPO / "scripts" / "grid.sh", REPO / "scripts" / "make_table.sh"
# Post-LN, Adam, no warm-up: forced to diverge with lr 1e30 (at lr 1e3 the loss reaches 1e8 but
# stays finite under upstream fairseq 0.12.2 with torch 2.1)
BAD = "iwslt-postln-adam-lr5e-4-nowu"
GOOD = "iwslt-preln-adam-lr5e-4-step8"  # Pre-LN, no warm-up
ARGS = ["run", "--only", f"{BAD},{GOOD}", "--arch-size", "tiny", "--max-epoch", "2",
        "--set", "max_tokens=512", "--set", "batch_tokens=512", "--set", f"{BAD}:lr=1e30",
        "--gen-args", "--max-len-b 20"]
ENV = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")


def sh(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, **kw)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_toy_data(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("grid-a")
    run = sh(GRID, *ARGS, "--data", data, "--out", out)
    table = sh(TABLE, out)
    return out, run, table


def rows(out):
    with open(out / "results.csv", newline="") as f:
        return {r["run"]: r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_grid_end_to_end(uninterrupted, data):
    out, run, table = uninterrupted
    assert run.returncode == 0, run.stderr[-2000:]
    assert table.returncode == 0, table.stderr[-2000:]
    # one progress line per state change, with the run index and an ETA
    assert f"run 2/2 {GOOD} seed 1: epoch" in run.stdout and "ETA 0:" in run.stdout
    bad = json.loads((out / BAD / "seed1" / "DONE.json").read_text())
    assert bad["status"].startswith("diverged at update ") and 1 <= bad["diverged_at"] <= 8
    good_dir = out / GOOD / "seed1"
    assert json.loads((good_dir / "DONE.json").read_text())["status"] == "finished"
    # evaluated checkpoints are removed; fairseq's _best and _last stay for resuming
    assert sorted(p.name for p in (good_dir / "checkpoints").iterdir()) == ["checkpoint_best.pt", "checkpoint_last.pt"]
    epochs = [json.loads((good_dir / "eval" / f"epoch{e}.json").read_text()) for e in (1, 2)]
    refs = read_lines(data.parent / "text" / "tok" / "test.en")
    # validation loss per epoch is the one fairseq logged
    logged = {json.loads(line.split(" | ", 3)[3])["epoch"]: json.loads(line.split(" | ", 3)[3])["valid_loss"]
              for line in (good_dir / "train.log").read_text().splitlines() if " | valid | " in line}
    for e, rec in zip((1, 2), epochs):
        assert rec["epoch"] == e and rec["n_sentences"] == len(refs) == 20
        assert rec["valid_loss"] == float(logged[e]) and math.isfinite(rec["valid_loss"])
        assert rec["sacrebleu_signature"].startswith("nrefs:1|case:lc|")
        hyps = read_lines(good_dir / "eval" / f"epoch{e}.hyp")
        assert rec["bleu_tok"] == round(tok_bleu(hyps, refs, lowercase=True), 2)
    assert epochs[0]["num_updates"] < epochs[1]["num_updates"]
    r = rows(out)
    assert set(G_CSV_REQUIRED) <= set(next(iter(r.values())))
    assert list(r) == [BAD, GOOD]  # table order
    assert r[BAD]["status"] == bad["status"] and r[BAD]["lr"] == "1e+30" and r[BAD]["best_bleu_tok"] == ""
    g = r[GOOD]
    assert g["arch"] == "transformer_preln_tiny" and g["optimizer"] == "adam" and g["warmup"] == "0"
    assert g["paper_bleu"] == "34.0" and g["seed"] == "1" and g["status"] == "finished"
    best = max(epochs, key=lambda x: (x["bleu_tok"], -x["epoch"]))
    assert float(g["best_bleu_tok"]) == best["bleu_tok"] and int(g["best_epoch"]) == best["epoch"]
    assert float(g["last_bleu_tok"]) == epochs[1]["bleu_tok"]
    assert float(g["sacrebleu"]) == best["sacrebleu"]
    assert float(g["best_valid_loss"]) == min(x["valid_loss"] for x in epochs)
    md = (out / "results.md").read_text()
    assert md.count("sacreBLEU signature: nrefs:1|case:lc") == 1 and "tok BLEU" in md
    png = out / "fig_main.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000


G_CSV_REQUIRED = "run,arch,optimizer,lr,warmup,seed,status,paper_bleu,best_bleu_tok,last_bleu_tok,sacrebleu,best_valid_loss".split(",")


def _launch_and_kill(data, out, ready):
    """Start the grid, SIGKILL it (no clean-up at all) as soon as ``ready()`` holds."""
    proc = subprocess.Popen([str(GRID), *ARGS, "--data", str(data), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.1)
    assert proc.poll() is None, "the grid ended before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _numbers_close(a, b):
    """CSV rows equal, numbers within 5 % or 1.0 (for a run resumed mid-training, see below)."""
    assert a.keys() == b.keys()
    for k in a:
        try:
            x, y = float(a[k]), float(b[k])
        except ValueError:
            assert a[k] == b[k], k
            continue
        assert abs(x - y) <= max(0.05 * abs(y), 1.0), (k, x, y)


@pytest.mark.slow
def test_kill_and_resume_gives_the_same_table(uninterrupted, data, tmp_path):
    ref_out = uninterrupted[0]
    ref_epoch1 = json.loads((ref_out / GOOD / "seed1" / "eval" / "epoch1.json").read_text())
    out = tmp_path / "grid-b"
    good, bad = out / GOOD / "seed1", out / BAD / "seed1"
    # 1. killed once the first run has finished (the second has not saved a checkpoint yet)
    _launch_and_kill(data, out, lambda: (bad / "DONE.json").exists())
    assert not (good / "checkpoints" / "checkpoint_last.pt").exists()
    before = ((bad / "DONE.json").stat().st_mtime_ns, (bad / "train.log").stat().st_size)
    again = sh(GRID, *ARGS, "--data", data, "--out", out)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{BAD} seed 1: already diverged at update" in again.stdout
    # the finished run was not redone: its marker and log are untouched
    assert ((bad / "DONE.json").stat().st_mtime_ns, (bad / "train.log").stat().st_size) == before
    assert sh(TABLE, out, "--no-figures").returncode == 0
    assert (out / "results.csv").read_text() == (ref_out / "results.csv").read_text()

    # 2. killed in the middle of a run, after its first epoch was saved: it resumes from
    #    checkpoint_last.pt (fairseq's own resume) and is evaluated as before
    for p in (good / "DONE.json", good / "TRAINED"):
        p.unlink()
    shutil.rmtree(good / "checkpoints")
    shutil.rmtree(good / "eval")
    (good / "train.log").unlink()
    log = good / "train.log"
    _launch_and_kill(data, out, lambda: log.exists() and "checkpoint1.pt (epoch 1 @" in log.read_text(errors="replace"))
    killed_at_epoch2 = "checkpoint2.pt (epoch 2 @" in log.read_text(errors="replace")
    third = sh(GRID, *ARGS, "--data", data, "--out", out)
    assert third.returncode == 0, third.stderr[-2000:]
    text = log.read_text()
    assert text.count("# grid: ") == 2  # two launches of fairseq-train, the second resumed
    if not killed_at_epoch2:  # fairseq names the epoch it resumes at: 2
        assert f"checkpoint_last.pt (epoch 2 @ {ref_epoch1['num_updates']} updates)" in text.split("# grid: ")[2]
    assert json.loads((good / "eval" / "epoch1.json").read_text()) == ref_epoch1
    assert sh(TABLE, out, "--no-figures").returncode == 0
    # fairseq's resume is close to, not bit-identical with, an uninterrupted run (README)
    for a, b in zip(rows(out).values(), rows(ref_out).values()):
        _numbers_close(a, b)

    # a different config in the same folder is refused, in one line
    fourth = sh(GRID, *ARGS, "--data", data, "--out", out, "--set", f"{GOOD}:lr=1e-3")
    assert fourth.returncode == 2
    # (the last line: importing fairseq may log a line about tensorboardX first)
    assert fourth.stderr.strip().splitlines()[-1].startswith("grid: error: ") and "different config" in fourth.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, data):
    def err(*argv):
        assert G.main(list(argv)) == 2
        msg = capsys.readouterr().err.strip()
        assert len(msg.splitlines()) == 1, msg
        return msg

    assert "unknown run 'nope'" in err("run", "--only", "nope", "--data", str(data))
    assert "not found" in err("run", "--only", GOOD, "--data", str(tmp_path / "missing"))
    assert "lnpos-data.json" in err("run", "--only", GOOD, "--data", str(tmp_path))
    assert "lists no GPU" in err("run", "--only", GOOD, "--data", str(data), "--gpus", ",")
    assert "unknown field" in err("run", "--only", GOOD, "--data", str(data), "--set", "speed=1")
    assert "is not selected" in err("run", "--only", GOOD, "--data", str(data), "--set", f"{BAD}:lr=1")
    import torch

    if torch.cuda.device_count() == 0:
        assert "no CUDA GPU" in err("run", "--only", GOOD, "--data", str(data), "--gpus", "0,1")
        assert "no CUDA GPU" in err("run", "--only", GOOD, "--data", str(data), "--gpus-per-run", "2")
        assert "no CUDA GPU" in err("run", "--only", GOOD, "--data", str(data), "--fp16")
    assert not any(tmp_path.iterdir())  # nothing written


def test_dry_run_prints_the_commands(capsys, data):
    assert G.main(["run", "--dry-run", "--only", "iwslt-postln-adam-*-wu4000,iwslt-preln-radam-*",
                   "--data", str(data), "--out", "/nonexistent/out", "--gpus", "0,1"]) == 0
    out = capsys.readouterr().out
    trains = [line for line in out.splitlines() if line.startswith("fairseq-train ")]
    assert len(trains) == 3
    assert all("--lr-scheduler warmup_inverse_sqrt" in t and "--warmup-updates 4000" in t for t in trains[:2])
    # the linear decay's length is computed from the data: updates per epoch x 15 epochs
    total = int(trains[2].split("--total-num-update ")[1].split()[0])
    assert total > 0 and total % 15 == 0
    assert out.count("fairseq-generate ") == 3 and "--beam 5 --lenpen 1.2" in out
    assert not Path("/nonexistent/out").exists()
