"""The depth map: the sweep's depth preset (dry run), the largest trainable depth, gradient-norm ratios
and peak memory from run folders written here with the grid's own run-record helpers, the depth
figure, peak memory from a child and from fairseq's log, and an interrupted depth sweep resumed."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairseq_lnpos.analysis import depth as D
from fairseq_lnpos.analysis import stability as S
from fairseq_lnpos.analysis.frame import runs_frame
from fairseq_lnpos.errors import run_main
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import reap
from fairseq_lnpos.experiments import sweep as W
from fairseq_lnpos.experiments.commands import Job
from fairseq_lnpos.fairseq_log import LogState
from fairseq_lnpos.experiments.options import RunOptions
from fairseq_lnpos.experiments.records import DoneRecord, EpochRecord, Outcome
from fairseq_lnpos.experiments.rundir import RunDir
from fairseq_lnpos.variants import VARIANTS

REPO = Path(__file__).resolve().parents[1]
HOLD = Path(__file__).resolve().parent / "hold"  # sitecustomize.py: fairseq-train waits after an epoch


def trains(capsys, *argv):
    assert run_main("grid", G.main, ["sweep", "--dry-run", *argv]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("fairseq-train ")]


def test_the_depth_preset_expands_along_depth(capsys, tmp_path):
    cmds = trains(capsys, "--depth-map", "--out", str(tmp_path / "d"))
    archs, depths, lrs = W.DEPTH_MAP["archs"].split(","), W.DEPTH_MAP["layers"].split(","), W.DEPTH_MAP["lr"].split(",")
    seeds = W.DEPTH_MAP["seeds"].split(",")
    assert len(cmds) == len(archs) * len(depths) * len(lrs) * len(seeds) and len(archs) == 6 and seeds == ["1", "2", "3"]
    assert depths == ["6", "12", "24", "48"]
    for n in depths:
        assert sum(f"--encoder-layers {n} --decoder-layers {n} " in c for c in cmds) == len(archs) * len(lrs) * 3
    width = W.DEPTH_MAP["width"]
    assert all(f"--encoder-embed-dim {width} --encoder-ffn-embed-dim {4 * width}" in c and "--warmup-updates 1 " in c
               and "--task translation_lnpos" in c and "--log-grad-norms" in c and "_tiny" in c for c in cmds)
    assert not any("--checkpoint-activations" in c or "--fp16" in c for c in cmds)
    # options given win over the preset; --checkpoint-activations reaches every cell
    cmds = trains(capsys, "--depth-map", "--archs", "keel", "--layers", "3,5", "--lr", "1e-3", "--seeds", "1",
                  "--checkpoint-activations", "--out", str(tmp_path / "e"))
    assert len(cmds) == 2 and all("--checkpoint-activations" in c and "transformer_keel_tiny" in c for c in cmds)
    assert "--encoder-layers 5 --decoder-layers 5" in cmds[1]
    # one GPU: the paper's IWSLT model, depths 6 to 100, fp16, no width change
    cmds = trains(capsys, "--depth-map", "--real", "--archs", "postln", "--out", str(tmp_path / "r"))
    assert [c.split("--encoder-layers ")[1].split()[0] for c in cmds[::2]] == ["6", "18", "36", "60", "100"]
    assert all("transformer_postln_iwslt_de_en" in c and "--fp16" in c and "embed-dim" not in c for c in cmds)
    assert all(f"--max-update {W.DEPTH_MAP_REAL['max_update']} " in c for c in cmds)
    # the stability map's defaults: 4 archs x 4 lrs x 2 warm-ups x 3 seeds at depth 6, no gradient logging
    cmds = trains(capsys, "--out", str(tmp_path / "s"))
    assert len(cmds) == preset_runs(W.STABILITY_MAP)
    assert not any("--log-grad-norms" in c or "--encoder-layers 12" in c for c in cmds)
    assert sorted({c.split("--seed ")[1].split()[0] for c in cmds}) == ["1", "2", "3"]
    assert run_main("grid", G.main, ["sweep", "--dry-run", "--depth-map", "--width", "30", "--out", str(tmp_path)]) == 2
    assert "--width 30: give a multiple of 4" in capsys.readouterr().err


def preset_runs(preset):
    """A preset's cells x seeds: its archs x learning rates x warm-ups x depths x seeds."""
    return math.prod(len(str(preset[axis]).split(",")) for axis in ("archs", "lr", "warmup", "layers", "seeds"))


def test_the_all_archs_preset_is_every_variant_on_the_stability_grid_at_width_96(capsys, tmp_path):
    cmds = trains(capsys, "--all-archs", "--out", str(tmp_path / "a"))
    assert W.ALL_MAP["archs"].split(",") == list(VARIANTS) and len(cmds) == preset_runs(W.ALL_MAP)
    assert {c.split("--arch ")[1].split()[0] for c in cmds} == {f"transformer_{v}_tiny" for v in VARIANTS}
    assert {c.split("--lr ")[1].split()[0] for c in cmds} == {"0.0003", "0.001", "0.003"}
    assert {c.split("--warmup-updates ")[1].split()[0] for c in cmds} == {"1", "100"}
    assert {c.split("--seed ")[1].split()[0] for c in cmds} == {"1", "2", "3"}
    assert all("--encoder-embed-dim 96 --encoder-ffn-embed-dim 384 --decoder-embed-dim 96" in c
               and "--encoder-layers 6 --decoder-layers 6 " in c and "--max-update 200 " in c
               and "--log-grad-norms" not in c for c in cmds)
    # options given win over the preset
    cmds = trains(capsys, "--all-archs", "--archs", "keel", "--width", "128", "--seeds", "1", "--out", str(tmp_path / "b"))
    assert len(cmds) == 6 and all("transformer_keel_tiny" in c and "--encoder-embed-dim 128 " in c for c in cmds)
    # two presets, or the CPU map on the GPU preset: refused with what to do
    for other, hint in (("--depth-map", "give one"), ("--real", "drop --real")):
        assert run_main("grid", G.main, ["sweep", "--dry-run", "--all-archs", other, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert hint in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- a recorded depth map

INITIAL = 8.6
# (arch, lr) -> final validation loss per depth 6, 12, 24, 48; None = diverged
UNIGRAM = 9.6  # the corpus's unigram bits: "trains" up to 0.5 x 9.6 = 4.8
FINALS = {("postln", 1e-3): (4.0, 4.3, 6.5, None),   # trains to 12 layers, stalls at 24, diverges at 48
          ("postln", 3e-4): (4.2, 6.8, 4.4, None),   # a stall at 12 between two stable depths
          ("preln", 1e-3): (3.0, 3.1, 3.2, 3.3),
          ("preln", 3e-4): (3.5, 3.6, 3.7, 3.9)}
DEPTHS = (6, 12, 24, 48)


def grad_log(layers, first, last, scale=1.0):
    """grad_norms.jsonl lines of updates 1-12: the first and last layer's norms of each stack (updates
    11 and 12 ten times larger: beyond the ratio's first 10 updates), and a line cut short."""
    lines = []
    for u in range(1, 13):
        f = 10.0 if u > 10 else 1.0
        norms = {"encoder/0": first * f * scale, f"encoder/{layers - 1}": last * f, "decoder/0": first * f,
                 f"decoder/{layers - 1}": last * f * scale, "total": 1.0}
        lines.append(json.dumps({"update": u, "time": 0.0, "lr": 1e-3, "norms": norms}))
    return "\n".join(lines) + '\n{"update": 13, "ti'


@pytest.fixture
def depth_map(tmp_path):
    """The depth preset's runs as the grid records them (config, DONE.json, eval record), with
    gradient norms and peak memory; Post-LN's first/last ratio falls with depth, Pre-LN's does not."""
    out = tmp_path / "depth"
    opts = RunOptions(out=str(out), no_bleu=True)
    runs = W.expand(["postln", "preln"], [3e-4, 1e-3], [1], list(DEPTHS), max_update=200, **W.GRAD_NORMS)
    for run in runs:
        for seed in (1, 2):
            final = FINALS[run.ln, run.lr][DEPTHS.index(run.layers)]
            final = None if final is None else final + 0.02 * (seed - 1)
            job = Job(run, seed, Path("/data/syn"), out / run.name / f"seed{seed}", f"transformer_{run.ln}_tiny",
                      ("de", "en"), opts)
            rd = RunDir(job.run_dir)
            rd.claim(job.config(), job.config_hash())
            rd.write_eval(EpochRecord(epoch=1, num_updates=200, valid_loss=final, valid_nll_loss=final))
            outcome = Outcome.FINISHED if final is not None else Outcome.DIVERGED
            rd.write_done(DoneRecord(outcome=outcome, diverged_at=None if final else 30, epochs=(1,),
                                     initial_loss=INITIAL, updates=200, train_seconds=run.layers * 2.0,
                                     final_valid_loss=final, final_valid_nll=final, unigram_bits=UNIGRAM,
                                     peak_rss_mb=300.0 + run.layers * (10 if run.lr == 1e-3 else 9)))
            rd.save_dir.mkdir()
            falls = 6 / run.layers if run.ln == "postln" else 1.0  # Post-LN: first/last = 0.5 x 6 / depth
            (rd.save_dir / "grad_norms.jsonl").write_text(grad_log(run.layers, 0.5, 1.0, scale=falls))
    return out


def cells_of(out, **rules):
    return S.make_cells(runs_frame(out), **rules)


def test_largest_trainable_depth_by_hand(depth_map):
    """Two seeds a cell (the second 0.02 bit above the first). A seed trains up to 0.5 x 9.6 = 4.8: Post-LN's
    stalls at 6.5 and 6.8 do not."""
    cells = cells_of(depth_map)
    assert D.largest_depth(cells) == {
        ("postln", 0, 3e-4): (24, [12]), ("postln", 0, 1e-3): (12, []), ("preln", 0, 3e-4): (48, []),
        ("preln", 0, 1e-3): (48, [])}
    # at 0.45 (up to 4.32) Post-LN's 4.41 at 24 layers drops out
    assert D.largest_depth(cells_of(depth_map, trains=0.45), lambda c: c.trains)[("postln", 0, 3e-4)] == (6, [])
    D.write_csv(cells, depth_map / "largest_depth.csv")
    assert (depth_map / "largest_depth.csv").read_text().splitlines()[1] == "Post-LN,postln,0,0.0003,6 12 24 48,24,12"


def test_gradient_ratios_and_memory_from_the_records(depth_map):
    runs = runs_frame(depth_map)
    ratio = {(r.variant, r.layers, r.lr, r.seed): (r.grad_ratio_encoder, r.grad_ratio_decoder) for r in runs.itertuples()}
    # updates 1-10 only: encoder 0.5 x 6/L / 1.0, decoder 0.5 / (1.0 x 6/L) for Post-LN
    assert ratio["postln", 48, 1e-3, 1] == pytest.approx((0.5 * 6 / 48, 0.5 / (6 / 48)))
    assert ratio["preln", 24, 3e-4, 2] == pytest.approx((0.5, 0.5))
    cells = S.make_cells(runs)
    c = next(c for c in cells.itertuples() if (c.variant, c.layers, c.lr) == ("postln", 12, 1e-3))
    assert (c.peak_rss_mb, c.train_seconds) == (420.0, 24.0) and math.isnan(c.cuda_peak_mb)
    md = "\n".join(D.markdown(cells))
    assert "| Post-LN | 0.5 / 0.5 | 0.25 / 1 | 0.125 / 2 | 0.0625 / 4 |" in md
    assert "| Pre-LN | 0.5 / 0.5 | 0.5 / 0.5 | 0.5 / 0.5 | 0.5 / 0.5 |" in md
    assert "| Post-LN | RSS 360, 12 s | RSS 420, 24 s | RSS 540, 48 s | RSS 780, 96 s |" in md  # largest of the lrs
    assert "| architecture | lr 0.0003 | lr 0.001 |" in md
    assert "| Post-LN, warm-up none | 24 (not 12) | 12 |" in md
    assert "| Pre-LN, warm-up none | 48 (deepest run) | 48 (deepest run) |" in md
    assert ("| Post-LN | 4.01 [4.00 to 4.02] 2/2 train | 4.31 [4.30 to 4.32] 2/2 train | (6.51 [6.50 to 6.52]) 0/2 train "
            "| x |") in md
    assert "| Pre-LN | 3.01 [3.00 to 3.02] 2/2 train |" in md


def test_the_depth_figure_from_recorded_results(depth_map, tmp_path):
    cells = cells_of(depth_map)
    assert D.plot(cells, tmp_path / "depth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_map_writes_the_depth_outputs_and_states_its_rule(depth_map, capsys):
    assert S.main([str(depth_map)]) == 0
    md = capsys.readouterr().out
    assert "the corpus's unigram bits: multi30k 0.64, synthetic 0.5" in md and "## Deepest that trains" in md
    assert "## Gradient norms along depth: first / last layer" in md and "## Peak memory and training time" in md
    for name in ("largest_depth.csv", "depth_loss.png", "cells.csv", "runs.csv", "stability_heatmaps.png"):
        assert (depth_map / name).stat().st_size > 0, name
    cells = read_cells(depth_map / "cells.csv")
    row = cells[(cells.variant == "postln") & (cells.layers == 48) & (cells.lr == 1e-3)].iloc[0]
    assert row.grad_ratio_encoder == pytest.approx(0.0625) and row.peak_rss_mb == 780.0 and row.diverged == 2


def read_cells(path):
    import pandas as pd

    return pd.read_csv(path)


def test_a_map_of_one_depth_has_no_depth_section(tmp_path, capsys):
    from test_stability import write_run

    write_run(tmp_path, "postln", 1e-3, 0, 1, final=4.0)
    write_run(tmp_path, "postln", 1e-2, 0, 1, final=6.0)
    assert S.main([str(tmp_path), "--no-figures"]) == 0
    md = capsys.readouterr().out
    assert "Deepest that trains" not in md and "Gradient norms" not in md and "Peak memory" not in md
    assert not (tmp_path / "largest_depth.csv").exists()


# ---------------------------------------------------------------- peak memory

def test_peak_resident_set_of_a_child():
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    proc = subprocess.Popen([sys.executable, "-c", spin + "b = bytearray(300 * 2 ** 20); b[::4096] = b'x' * len(b[::4096])"])
    assert reap.wait(proc) == 0 and proc.poll() == 0
    assert 300 < proc.peak_rss_mb < 1000 and proc.cpu_seconds >= 0.3  # it spun 0.3 s of its own CPU time
    assert reap.peak_text(proc) == f", peak resident set {proc.peak_rss_mb:.1f} MB, {proc.cpu_seconds:.1f} CPU s"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # until it has exited, without reaping it
    assert reap.poll(proc) == 3 and proc.returncode == 3 and proc.peak_rss_mb > 0


def test_peak_memory_from_the_log():
    st = LogState()
    st.feed("# fairseq-train ran 12.5 s, peak resident set 812.3 MB, 11.0 CPU s")
    st.feed("# fairseq-train ran 3.0 s, peak resident set 640.0 MB")  # an older grid: no CPU time
    st.feed("# fairseq-train ran 9.0 s, CPU 8.25 s, peak resident set 700.0 MB")  # the other spelling
    st.feed("# fairseq-train ran 1.0 s")  # an older grid still: no peak
    assert (st.train_seconds, st.peak_rss_mb, st.cuda_peak_mb, st.cpu_seconds) == (25.5, 812.3, None, 19.25)
    st.feed("2026-12-01 10:00:00 | INFO | fairseq.utils | rank   0: capabilities =  9.0  ; total memory = 139.812 GB "
            "; name = NVIDIA H200                             ")
    for free in ("137.1", "136.6", "137.0"):
        st.feed('2026-12-01 10:00:01 | INFO | train_inner | {"epoch": 1, "loss": "9.1", "num_updates": "1", '
                f'"gb_free": "{free}", "wall": "3"}}')
    assert st.cuda_peak_mb == pytest.approx((139.812 - 136.6) * 1024, abs=0.1)


# ---------------------------------------------------------------- an interrupted depth sweep

@pytest.mark.slow
def test_an_interrupted_depth_sweep_resumes(tmp_path):
    """A depth sweep of two cells on the toy corpus, stopped by Ctrl-C while its first run waits after
    epoch 1 (tests/hold): exit 130; the same command resumes that run from its checkpoint and runs
    the other; the map has both depths, their gradient ratios and peak memory."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from toydata import make_toy_data

    data, out = make_toy_data(tmp_path / "toy"), tmp_path / "depth"
    argv = [str(REPO / "scripts" / "grid.sh"), "sweep", "--depth-map", "--archs", "postln", "--lr", "1e-3",
            "--layers", "1,2", "--width", "16", "--max-update", "12", "--seeds", "1", "--jobs", "1", "--data", str(data),
            "--out", str(out), "--set", "max_tokens=512", "--set", "batch_tokens=512"]
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    held = dict(env, LNPOS_TEST_HOLD_AFTER_EPOCH="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(HOLD), env.get("PYTHONPATH")])))
    first = out / "sweep-postln-L1-lr0.001-wu1" / "seed1"
    log = first / "train.log"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=held,
                            start_new_session=True)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and not (
            log.exists() and "checkpoint1.pt (epoch 1 @" in log.read_text(errors="replace")):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted; run the same command again to resume" in err, err[-2000:]
    assert not list(out.glob("*/seed1/DONE.json"))

    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    launches = log.read_text().split("# grid: ")
    assert len(launches) == 3 and "checkpoint_last.pt (epoch 2 @" in launches[2]  # resumed in epoch 2
    done = {p.parent.parent.name: json.loads(p.read_text()) for p in out.glob("*/seed1/DONE.json")}
    assert sorted(done) == ["sweep-postln-L1-lr0.001-wu1", "sweep-postln-L2-lr0.001-wu1"]
    assert all(d["updates"] == 12 and d["peak_rss_mb"] > 100 and d["cuda_peak_mb"] is None for d in done.values())
    smap = subprocess.run([str(REPO / "scripts" / "stability_map.sh"), str(out), "--no-figures"],
                          capture_output=True, text=True, env=env)
    assert smap.returncode == 0, smap.stderr
    assert "2 runs: 2 finished" in smap.stdout and "## Deepest that trains" in smap.stdout
    ratios = {c.layers: (c.grad_ratio_encoder, c.peak_rss_mb) for c in read_cells(out / "cells.csv").itertuples()}
    assert ratios[1][0] == pytest.approx(1.0) and ratios[2][0] > 0 and all(m > 100 for _, m in ratios.values())
