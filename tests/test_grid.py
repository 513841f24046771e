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

from fairseq_lnpos.common import fmt_time, read_lines
from fairseq_lnpos.errors import run_main
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import options, plan, report
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.experiments.evaluate import tok_bleu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toydata import make_toy_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GRID, TABLE = REPO / "scripts" / "grid.sh", REPO / "scripts" / "make_table.sh"
# Post-LN, Adam, no warm-up: forced to diverge with lr 1e30 (at lr 1e3 the loss reaches 1e8 but
# stays finite under upstream fairseq 0.12.2 with torch 2.1)
BAD = "iwslt-postln-adam-lr5e-4-nowu"
GOOD = "iwslt-preln-adam-lr5e-4-step8"  # Pre-LN, no warm-up
ARGS = ["run", "--only", f"{BAD},{GOOD}", "--arch-size", "tiny", "--max-epoch", "2",
        "--set", "max_tokens=512", "--set", "batch_tokens=512", "--set", f"{BAD}:lr=1e30"]
ENV = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
HOLD = Path(__file__).resolve().parent / "hold"  # sitecustomize.py: fairseq-train waits at a chosen point


def held(**hold):
    """ENV under which fairseq-train stops where ``hold`` says (tests/hold/sitecustomize.py)."""
    return dict(ENV, **hold, PYTHONPATH=os.pathsep.join(filter(None, [str(HOLD), ENV.get("PYTHONPATH")])))


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
    # one progress line per state change, with the run index and an ETA (in full in progress.log)
    assert "| #2 ep " in run.stdout and "ETA 0:" in run.stdout
    assert f"run 2/2 {GOOD} seed 1: epoch" in (out / "progress.log").read_text()
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
    # scored by the grid's one evaluator process, with the default output-length cap
    assert all(e["eval_seconds"] > 0 for e in epochs)
    done = json.loads((good_dir / "DONE.json").read_text())
    assert done["initial_loss"] > done["final_valid_loss"] == epochs[1]["valid_loss"]
    assert 0 < done["train_seconds"] and done["updates"] == epochs[1]["num_updates"]
    r = rows(out)
    assert list(next(iter(r.values()))) == report.CSV_COLUMNS
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


def _launch_and_kill(data, out, ready, env):
    """Start the grid, SIGKILL it (no clean-up at all) as soon as ``ready()`` holds; ``env`` holds a
    fairseq-train there, so that the kill does not race it."""
    proc = subprocess.Popen([str(GRID), *ARGS, "--data", str(data), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
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
    # 1. killed once the first run has finished (the second, held before training, has not saved a checkpoint)
    _launch_and_kill(data, out, lambda: (bad / "DONE.json").exists(), held(LNPOS_TEST_HOLD_BEFORE_TRAINING=GOOD))
    assert not (good / "checkpoints" / "checkpoint_last.pt").exists()
    before = ((bad / "DONE.json").stat().st_mtime_ns, (bad / "train.log").stat().st_size)
    # resumed with two evaluator processes (not part of a run's config: same folder, same results)
    again = sh(GRID, *ARGS, "--data", data, "--out", out, "--evaluators", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{BAD} seed 1: already diverged at update" in again.stdout
    # the finished run was not redone: its marker and log are untouched
    assert ((bad / "DONE.json").stat().st_mtime_ns, (bad / "train.log").stat().st_size) == before
    assert sh(TABLE, out, "--no-figures").returncode == 0
    assert (out / "results.csv").read_text() == (ref_out / "results.csv").read_text()

    # 2. killed in the middle of a run, after its first epoch was saved (held there): it resumes from
    #    checkpoint_last.pt (fairseq's own resume) and is evaluated as before
    for p in (good / "DONE.json", good / "TRAINED"):
        p.unlink()
    shutil.rmtree(good / "checkpoints")
    shutil.rmtree(good / "eval")
    (good / "train.log").unlink()
    log = good / "train.log"
    epoch1_logged = '| train | {"epoch": 1,'  # fairseq's statistics of epoch 1, logged after its checkpoint
    _launch_and_kill(data, out, lambda: log.exists() and epoch1_logged in log.read_text(errors="replace"),
                     held(LNPOS_TEST_HOLD_AFTER_EPOCH="1"))
    assert "checkpoint2.pt (epoch 2 @" not in log.read_text(errors="replace")
    scored_before = {e for e in (1, 2) if (good / "eval" / f"epoch{e}.json").exists()}
    third = sh(GRID, *ARGS, "--data", data, "--out", out, "--evaluators", "2")
    assert third.returncode == 0, third.stderr[-2000:]
    # each epoch scored exactly once over the two launches: none twice, none lost (two evaluators
    # share one queue)
    for e in (1, 2):
        again_scored = third.stdout.count(f"{GOOD} seed 1: epoch {e} tok BLEU")
        assert (e in scored_before) + again_scored == 1, (e, scored_before, third.stdout[-1500:])
    text = log.read_text()
    assert text.count("# grid: ") == 2  # two launches of fairseq-train, the second resumed
    # fairseq names the epoch it resumes at: 2
    assert f"checkpoint_last.pt (epoch 2 @ {ref_epoch1['num_updates']} updates)" in text.split("# grid: ")[2]
    timing = ("eval_seconds",)  # how long scoring took is not a result
    without = lambda rec: {k: v for k, v in rec.items() if k not in timing}  # noqa: E731
    assert without(json.loads((good / "eval" / "epoch1.json").read_text())) == without(ref_epoch1)
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
        assert run_main("grid", G.main, list(argv)) == 2
        msg = capsys.readouterr().err.strip()
        assert len(msg.splitlines()) == 1, msg
        return msg

    assert "unknown run 'nope'" in err("run", "--only", "nope", "--data", str(data))
    assert "not found" in err("run", "--only", GOOD, "--data", str(tmp_path / "missing"))
    assert "lnpos-data.json" in err("run", "--only", GOOD, "--data", str(tmp_path))
    assert "--gpus: ',' lists nothing" in err("run", "--only", GOOD, "--data", str(data), "--gpus", ",")
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


@pytest.mark.slow
def test_a_grid_that_reads_the_training_data_prints_nothing_of_fairseq_on_stderr(data):
    """A linear decay's length is computed in the grid's own process with fairseq's task and batches;
    fairseq's INFO lines and hydra's deprecation warnings stay out of the grid's output."""
    res = sh(GRID, "run", "--dry-run", "--only", "iwslt-preln-radam-*", "--data", data, "--gpus", "0")
    assert res.returncode == 0 and "--total-num-update " in res.stdout, res.stderr
    assert res.stderr == ""



def test_runs_sized_side_by_side_compose_fairseq_config_one_thread_at_a_time(data):
    """The grid's slots size their linear-decay runs in threads of one process; fairseq's config
    goes through Hydra's one process-wide GlobalHydra, and two composes at once failed a run with
    "GlobalHydra is already initialized" (an H200 grid of 14 runs side by side)."""
    import threading

    from fairseq_lnpos import fairseq_build

    args = fairseq_build.parse([data, "--arch", "transformer_preln_tiny", "--optimizer", "adam", "--lr", "1e-3"])
    errors, cfgs = [], []

    def compose():
        try:
            cfgs.append(fairseq_build.to_config(args))
        except Exception as e:  # noqa: BLE001 - the failure this test is about
            errors.append(repr(e))

    threads = [threading.Thread(target=compose) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(cfgs) == 6
    assert {c.optimization.lr[0] for c in cfgs} == {1e-3}

def _opts(**kw):
    return options.RunOptions(**kw)


def test_runs_per_gpu_puts_k_runs_on_each_gpu_and_shares_the_cores(monkeypatch, tmp_path):
    opts = _opts(gpus="0,1", runs_per_gpu=3, out=str(tmp_path))
    slots = plan.plan_slots(opts, dry_run=True)
    assert sorted(slots) == ["0", "0", "0", "1", "1", "1"]
    opts = _opts(gpus="0,1,2,3", gpus_per_run=2, runs_per_gpu=2, out=str(tmp_path))
    assert sorted(plan.plan_slots(opts, dry_run=True)) == ["0,1", "0,1", "2,3", "2,3"]
    assert plan.plan_slots(_opts(jobs=3), dry_run=True) == [None, None, None]
    # 16 cores, 7 runs on GPU 0 and its evaluator: 2 threads each; CPU: 2 cores, 2 runs + evaluator: 1
    from fairseq_lnpos.experiments.scheduler import Grid

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    grid = Grid([], _opts(out=str(tmp_path)), ["0"] * 7)
    env = grid.env("0")
    assert grid.threads == 2 and env["OMP_NUM_THREADS"] == "2" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert list(grid.evaluators) == ["0"]
    # ... and with 2 evaluator processes for GPU 0: 16 // (7 + 2) = 1 thread each
    two = Grid([], _opts(out=str(tmp_path), evaluators=2), ["0"] * 7)
    assert two.threads == 1 and len(two.evaluators["0"].threads) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cpu = Grid([], _opts(out=str(tmp_path)), [None, None])
    assert cpu.threads == 1 and cpu.env(None).get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    for g in (grid, two, cpu):
        for e in g.evaluators.values():
            e.close()


# stands in for ``python -m fairseq_lnpos.experiments.evaluator``: answers each request line with its
# pid, but only once a request is being scored by another process too (a file per process and request
# in $SCORING): requests served one at a time would never be answered; a request for checkpoint
# "crash" ends the process
FAKE_EVALUATOR = """
import json, os, sys, time
scoring = os.environ["SCORING"]
for line in sys.stdin:
    req = json.loads(line)
    if req["checkpoint"] == "crash":
        sys.exit(3)
    open(os.path.join(scoring, f"{os.getpid()}-{req['checkpoint']}"), "w").close()
    while len({name.split("-")[0] for name in os.listdir(scoring)}) < 2:
        time.sleep(0.05)
    print(json.dumps({"result": {"pid": os.getpid(), "checkpoint": req["checkpoint"]}}), flush=True)
"""


def test_evaluator_processes_share_one_queue(tmp_path):
    """--evaluators 2: two processes take the requests of one queue, each answered once, two scored at
    the same time (the fake answers only then); a process that dies fails its request only and is
    started again."""
    import threading

    from fairseq_lnpos.experiments.evaluator import EvalFailed, Evaluator
    from fairseq_lnpos.experiments.records import ScoreRequest

    def request(checkpoint):
        return ScoreRequest(argv=(), data="", hyp_out="", checkpoint=checkpoint)

    started, scoring = [], tmp_path / "scoring"
    scoring.mkdir()

    def launch(cmd, env, **kw):
        started.append(subprocess.Popen([sys.executable, "-c", FAKE_EVALUATOR], env=dict(env, SCORING=str(scoring)), **kw))
        return started[-1]

    ev = Evaluator(dict(os.environ), tmp_path / "evaluator.log", launch, processes=2)
    answers, done = {}, threading.Semaphore(0)

    def callback(name):
        def cb(result, error):
            answers[name] = (result, error)
            done.release()
        return cb

    for name in ("c1", "c2", "c3", "c4"):
        ev.submit(request(name), callback(name))
    for _ in range(4):
        assert done.acquire(timeout=60), "requests were not scored two at a time"
    assert sorted(answers) == ["c1", "c2", "c3", "c4"]
    assert all(err is None and res["checkpoint"] == name for name, (res, err) in answers.items())
    assert len({res["pid"] for res, _ in answers.values()}) == 2 and len(started) == 2
    assert ev.pending == 0 and len({p.name.split("-")[0] for p in scoring.iterdir()}) == 2
    ev.submit(request("crash"), callback("crash"))
    assert done.acquire(timeout=60)
    assert answers["crash"][0] is None and isinstance(answers["crash"][1], EvalFailed)
    assert "the evaluator exited (3) while scoring crash" in str(answers["crash"][1])
    ev.submit(request("c5"), callback("c5"))
    assert done.acquire(timeout=60) and answers["c5"][1] is None
    ev.close()
    assert all(p.poll() is not None for p in started)


def test_eta_from_the_training_pace(tmp_path):
    """The progress line's ETA: seconds per update seen so far x updates left / slots, for budgets
    in updates (sweeps, where no epoch may end) and in epochs."""
    from types import SimpleNamespace as NS

    from fairseq_lnpos.experiments.scheduler import Grid, Phase

    def job(phase, updates=0, epoch=0, pace=None, max_update=None, max_epoch=None):
        return NS(phase=Phase(phase), updates=updates, epoch=epoch, pace=pace, log_state=None,
                  job=NS(run=NS(max_update=max_update, max_epoch=max_epoch)))

    sweep = [job("done", 200, 0, (100.0, 200), max_update=200), job("running", 50, 0, (20.0, 50), max_update=200),
             job("pending", max_update=200), job("pending", max_update=200)]
    grid = Grid([], _opts(out=str(tmp_path)), [None, None])
    grid.progress = sweep
    # 120 s / 250 updates = 0.48 s an update; 150 + 200 + 200 updates left on 2 slots: 132 s
    assert grid.eta() == fmt_time(132)
    epochs = [job("running", 30, 1, (60.0, 30), max_epoch=3), job("pending", max_epoch=3)]
    grid.progress = epochs  # 30 updates an epoch: 60 + 90 updates left at 2 s each on 2 slots: 150 s
    assert grid.eta() == fmt_time(150)
    middle = job("running", 80, 2, (160.0, 80), max_epoch=3)  # epochs 1 and 2 saved at 30 and 60 updates
    middle.log_state = NS(saved={1: 30, 2: 60})
    grid.progress = [middle]  # 30 updates an epoch, not 80 / 2: 10 updates left at 2 s each on 2 slots
    assert grid.eta() == fmt_time(10)
    grid.progress = [job("running", 30, 0, (60.0, 30), max_epoch=3)]  # no epoch ended, none logged: unknown
    assert grid.eta() == "?"
    first = job("running", 30, 0, (60.0, 30), max_epoch=3)
    first.log_state = NS(saved={}, updates=30, epochs_done=0.75)  # 30 updates are 3/4 of the first epoch
    grid.progress = [first]  # 40 updates an epoch: 90 updates left at 2 s each on 2 slots
    assert grid.eta() == fmt_time(90)
    grid.progress = [job("running", 0, 0, (12.0, 0), max_update=200)]  # fairseq still starting: unknown
    assert grid.eta() == "?"
    for e in grid.evaluators.values():
        e.close()


def test_runs_per_gpu_and_numbers_are_checked(tmp_path, capsys, data):
    def err(*argv):
        assert run_main("grid", G.main, ["run", "--only", GOOD, "--data", str(data), "--out", str(tmp_path / "o"), *argv]) == 2
        msg = capsys.readouterr().err.strip()
        assert len(msg.splitlines()) == 1, msg
        return msg

    assert "--runs-per-gpu needs --gpus" in err("--runs-per-gpu", "2")
    for flag_, bad in (("--max-epoch", "0"), ("--jobs", "0"), ("--runs-per-gpu", "0"), ("--eval-every", "0"),
                       ("--beam", "0"), ("--log-interval", "0"), ("--gpus-per-run", "0"), ("--patience", "-1"),
                       ("--max-epoch", "x")):
        with pytest.raises(SystemExit) as e:
            G.main(["run", "--only", GOOD, flag_, bad])
        assert e.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert "--seeds: 'x' is not a whole number" in err("--seeds", "x")
    assert "--seeds: '1' is listed twice" in err("--seeds", "1,1")
    assert "--seeds -1: give distinct whole numbers from 0 to 4294967295" in err("--seeds", "-1")
    (tmp_path / "file").write_text("")
    assert "is a file" in err("--out", str(tmp_path / "file"))


def test_length_cap_and_eval_every():
    from fairseq_lnpos.experiments.commands import LEN_CAP, Job
    from fairseq_lnpos.experiments.runs import BY_NAME

    run = BY_NAME[GOOD].with_defaults()
    job = Job(run, 1, Path("/d"), Path("/o"), "transformer_preln_tiny", ("de", "en"), _opts(eval_every=4))
    argv = job.generate_argv(3, {"source_lang": "de", "target_lang": "en", "post_process": "sentencepiece"})
    assert argv[argv.index("--max-len-a") + 1] == "1.2" and argv[argv.index("--max-len-b") + 1] == "10"
    assert list(LEN_CAP) == ["--max-len-a", "1.2", "--max-len-b", "10"]
    uncapped = Job(run, 1, Path("/d"), Path("/o"), "a", ("de", "en"), _opts(uncapped_len=True))
    assert "--max-len-a" not in uncapped.gen_extra() and "--max-len-b" not in uncapped.gen_extra()
    assert uncapped.config_hash() != job.config_hash()  # the cap changes the results
    # every 4th epoch and the last (15); --no-bleu scores none
    assert [e for e in range(1, 16) if job.scored(e)] == [4, 8, 12, 15]
    assert not any(Job(run, 1, Path("/d"), Path("/o"), "a", ("de", "en"), _opts(no_bleu=True)).scored(e)
                   for e in range(1, 16))
    # how often it is scored is not part of the config: a grid can change it and resume
    assert Job(run, 1, Path("/d"), Path("/o"), "transformer_preln_tiny", ("de", "en"), _opts()).config_hash() == job.config_hash()


@pytest.mark.slow
def test_the_evaluator_writes_what_fairseq_generate_writes(uninterrupted, data, tmp_path):
    """fairseq-generate's own main() in the evaluator: the same hypotheses, byte for byte."""
    out = uninterrupted[0]
    good_dir = out / GOOD / "seed1"
    ckpt = good_dir / "checkpoints" / "checkpoint_last.pt"
    from fairseq_lnpos.data.manifest import read_manifest
    from fairseq_lnpos.experiments.evaluate import generate_cmd, parse_generate, run_generate

    manifest = read_manifest(data)
    cmd = generate_cmd(data, ckpt, manifest, extra=["--max-len-a", "1.2", "--max-len-b", "10"])
    cli = sh(*cmd)
    assert cli.returncode == 0, cli.stderr[-2000:]
    inproc = run_generate(cmd[1:])
    lines = lambda text: [l for l in text.splitlines() if l[:2] in ("S-", "T-", "H-", "D-", "P-")]  # noqa: E731
    assert lines(inproc) == lines(cli.stdout) and len(lines(inproc)) == 5 * 20
    # and the grid scored its last epoch from the same checkpoint's hypotheses
    seen, hyps = parse_generate(inproc)
    assert read_lines(good_dir / "eval" / "epoch2.hyp") == [hyps.get(i, "") for i in range(len(seen))]
    # a second checkpoint in the same process (fairseq's configuration is composed once per command
    # line and reused): its own hypotheses, again those of the command line
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state["model"] = {k: v * 0.7 if v.is_floating_point() else v for k, v in state["model"].items()}
    other = tmp_path / "other.pt"
    torch.save(state, other)
    cmd2 = generate_cmd(data, other, manifest, extra=["--max-len-a", "1.2", "--max-len-b", "10"])
    cli2 = sh(*cmd2)
    assert cli2.returncode == 0, cli2.stderr[-2000:]
    inproc2 = run_generate(cmd2[1:])
    assert lines(inproc2) == lines(cli2.stdout) and lines(inproc2) != lines(inproc)
    assert lines(run_generate(cmd[1:])) == lines(inproc)


def test_the_last_n_epoch_checkpoints_stay_until_their_average_is_scored(tmp_path):
    """--average-last N: scored epochs are dropped as before, except the newest N, kept until their
    average is recorded; a diverged run has no average and keeps none."""
    from types import SimpleNamespace as NS

    from fairseq_lnpos.experiments.records import AverageRecord, EpochRecord
    from fairseq_lnpos.experiments.rundir import RunDir
    from fairseq_lnpos.experiments.scheduler import Grid

    grid = Grid([], _opts(out=str(tmp_path)), [None])
    rd = RunDir(tmp_path / "run")
    rd.save_dir.mkdir(parents=True)
    rd.eval_dir.mkdir()

    def saved(*epochs):
        for e in epochs:
            rd.checkpoint(e).write_bytes(b"")
            rd.write_eval(EpochRecord(epoch=e))

    left = lambda: [e for e, _ in rd.epoch_checkpoints()]  # noqa: E731
    job = NS(job=NS(dir=rd, run=NS(average_last=2)), diverged=None, stopped=None)
    saved(1, 2, 3)
    grid._drop_checkpoints(job, below=4)
    assert left() == [2, 3]
    saved(4)
    grid._drop_checkpoints(job, below=5)
    assert left() == [3, 4]
    rd.write_average(AverageRecord(epochs=(3, 4), average_last=2, bleu_tok=1.0))
    grid._drop_checkpoints(job, below=float("inf"))
    assert left() == []
    for average_last, diverged in ((0, None), (2, 7)):  # no averaging asked / a diverged run
        saved(5, 6)
        (rd.eval_dir / "average.json").unlink(missing_ok=True)
        grid._drop_checkpoints(NS(job=NS(dir=rd, run=NS(average_last=average_last)), diverged=diverged, stopped=None),
                               below=7)
        assert left() == []
    for e in grid.evaluators.values():
        e.close()


def test_the_evaluators_answer_is_read_as_scores_and_one_of_another_shape_fails_that_request(tmp_path):
    from types import SimpleNamespace as NS

    from fairseq_lnpos.experiments.records import ScoreRequest, Scores
    from fairseq_lnpos.experiments.scheduler import Grid, Progress

    grid = Grid([], _opts(out=str(tmp_path)), [None])
    scored = []

    def answering(result):
        return NS(submit=lambda request, answered: answered(result, None))

    p = Progress(job=None, evaluator=answering({"bleu_tok": 2.5, "n_sentences": 3}))
    grid._submit(p, 1, ScoreRequest(argv=(), data="d", hyp_out="h", checkpoint="c1.pt"), scored.append)
    assert scored == [Scores(bleu_tok=2.5, n_sentences=3)] and not p.pending and p.error is None
    p.evaluator = answering({"bleu_tok": "high"})
    grid._submit(p, 2, ScoreRequest(argv=(), data="d", hyp_out="h", checkpoint="c2.pt"), scored.append)
    assert len(scored) == 1 and not p.pending
    assert p.error.startswith("the evaluator's answer for c2.pt is not a score record the grid writes ('bleu_tok' is "
                              "'high', not a number or null): see ")
    for e in grid.evaluators.values():
        e.close()


# Two rows of other papers' recipes (Transformer-Clinic's Post-LN, T-Fixup's) at the tiny size: three
# epochs (Transformer-Clinic's 100k-update cap dropped), the average of the last two scored as well
REF = ["ref-iwslt-clinic-postln", "ref-iwslt-tfixup"]
REF_ARGS = ["run", "--only", ",".join(REF), "--arch-size", "tiny", "--max-epoch", "3", "--set", "max_update=0",
            "--set", "max_tokens=512", "--set", "batch_tokens=512", "--average-last", "2"]


@pytest.mark.slow
def test_reference_recipes_end_to_end_with_averaging(data, tmp_path):
    import torch

    from fairseq_lnpos.checkpoint import load_checkpoint_file
    from fairseq_lnpos.data.manifest import read_manifest
    from fairseq_lnpos.experiments.evaluate import generate_cmd, parse_generate, run_generate

    out = tmp_path / "ref"
    run = sh(GRID, *REF_ARGS, "--data", data, "--out", out, "--keep-checkpoints")
    assert run.returncode == 0, run.stderr[-2000:]
    refs = read_lines(data.parent / "text" / "tok" / "test.en")
    for name in REF:
        rd = out / name / "seed1"
        train = (rd / "train.log").read_text().split("# grid: ")[1].splitlines()[0]
        assert "--lnpos-init" in train and " --max-update" not in train
        assert ("--share-all-embeddings" if "clinic" in name else "--share-decoder-input-output-embed") in train
        avg = json.loads((rd / "eval" / "average.json").read_text())
        assert avg["epochs"] == [2, 3] and avg["average_last"] == 2 and avg["n_sentences"] == 20
        hyps = read_lines(rd / "eval" / "average.hyp")
        assert avg["bleu_tok"] == round(tok_bleu(hyps, refs, lowercase=True), 2)
        # T-Fixup's rows also score compound-split (compound_split_bleu), the others do not
        assert avg.get("bleu_tok_cs") == (round(tok_bleu(hyps, refs, lowercase=True, split_compounds=True), 2)
                                          if "tfixup" in name else None)
        # the scored model is the parameter mean of epochs 2 and 3, computed here by hand
        ckpt = rd / "checkpoints"
        two, three = (load_checkpoint_file(ckpt / f"checkpoint{e}.pt")["model"] for e in (2, 3))
        mean = load_checkpoint_file(ckpt / "checkpoint_average.pt")["model"]
        assert set(mean) == set(two)
        for k, v in mean.items():
            if v.is_floating_point():
                assert torch.allclose(v, (two[k].double() + three[k].double()).div(2).to(v.dtype)), k
        assert any(not torch.equal(mean[k], three[k]) for k in mean)
        # ... decoded with the row's beam and length penalty (T-Fixup: beam 4, lenpen 0.3)
        row = R.BY_NAME[name]
        cmd = generate_cmd(data, ckpt / "checkpoint_average.pt", read_manifest(data), row.beam, row.lenpen,
                           extra=["--max-len-a", "1.2", "--max-len-b", "10"])
        seen, again = parse_generate(run_generate(cmd[1:]))
        assert hyps == [again.get(i, "") for i in range(len(seen))]
    cfg = json.loads((out / REF[1] / "seed1" / "config.json").read_text())
    assert (cfg["beam"], cfg["lenpen"], cfg["run"]["average_last"]) == (4, 0.3, 2)  # --average-last 2 overrides 10

    # the table: published beside measured, the average in its own column
    table = sh(TABLE, out, "--no-figures")
    assert table.returncode == 0, table.stderr[-2000:]
    r = rows(out)
    for name, published in zip(REF, ("35.64", "35.73")):
        avg = json.loads((out / name / "seed1" / "eval" / "average.json").read_text())
        assert r[name]["paper_bleu"] == published and float(r[name]["avg_bleu_tok"]) == avg["bleu_tok"]
        assert r[name]["avg_epochs"] == "2-3" and "Transformer-Clinic" in r[REF[0]]["source"]
        line = next(l for l in (out / "results.md").read_text().splitlines() if l.startswith(f"| {name} |"))
        assert f"| {published} | " in line and f"{avg['bleu_tok']:.2f} (2-3)" in line
    assert "tok BLEU avg (epochs)" in (out / "results.md").read_text()

    # resumed after training and scoring the epochs, before the average: the average is scored once,
    # no epoch again, then the epoch checkpoints go (no --keep-checkpoints this time)
    first = {n: json.loads((out / n / "seed1" / "eval" / "average.json").read_text()) for n in REF}
    for name in REF:
        (out / name / "seed1" / "DONE.json").unlink()
        (out / name / "seed1" / "eval" / "average.json").unlink()
    again = sh(GRID, *REF_ARGS, "--data", data, "--out", out)
    assert again.returncode == 0, again.stderr[-2000:]
    assert " tok BLEU " not in again.stdout.replace("average of epochs 2-3 tok BLEU", "")
    for name in REF:
        assert again.stdout.count(f"{name} seed 1: average of epochs 2-3 tok BLEU") == 1
        rec = json.loads((out / name / "seed1" / "eval" / "average.json").read_text())
        assert {k: v for k, v in rec.items() if k != "eval_seconds"} == \
            {k: v for k, v in first[name].items() if k != "eval_seconds"}
        assert sorted(p.name for p in (out / name / "seed1" / "checkpoints").iterdir()) == \
            ["checkpoint_best.pt", "checkpoint_last.pt"]
    # and a finished run is not redone
    third = sh(GRID, *REF_ARGS, "--data", data, "--out", out)
    assert third.returncode == 0 and third.stdout.count("already finished, not redone") == 2


def test_grid_without_a_command_lists_the_commands(capsys):
    assert G.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert all(c in err for c in ("list", "run", "sweep", "slurm", "status")), err


def _recorded_run(tmp_path, done=None, **fields):
    """A run folder as the grid leaves it (config.json, DONE.json ``done``, TRAINED), without training."""
    from fairseq_lnpos.experiments.rundir import RunDir
    from fairseq_lnpos.launch import config_hash

    run = R.Run(name="r", dataset="multi30k_cpu", ln="preln", optimizer="adam", lr=1e-3, **{"max_epoch": 2, **fields})
    config = {"run": run.as_dict(), "seed": 1, "data": "d", "arch": "a"}
    rd = RunDir(tmp_path / "r" / "seed1")
    rd.claim(config, config_hash(config))
    if done is not None:
        rd.write_done(done)
    rd.mark_trained()
    return rd, run, config


def _more(run, config, **fields):
    from dataclasses import replace

    from fairseq_lnpos.launch import config_hash

    new = dict(config, run=replace(run, **fields).as_dict())
    return new, config_hash(new)


def test_extend_reopens_a_finished_run_for_more_epochs_and_keeps_its_record(tmp_path):
    from fairseq_lnpos.experiments.records import DoneRecord, Outcome

    done = DoneRecord(outcome=Outcome.FINISHED, epochs=(1, 2), updates=20, train_cpu_seconds=5.0,
                      provenance={"model_code": "m1"}, unigram_bits=6.0)
    rd, run, config = _recorded_run(tmp_path, done)
    old_hash = rd.config()["hash"]
    assert rd.extend(config, old_hash, "m1") is None  # the same config: nothing to extend
    new, new_hash = _more(run, config, max_epoch=4)
    assert rd.extend(new, new_hash, "m1", write=False) == 2 and rd.config()["hash"] == old_hash  # a check only
    assert rd.extend(new, new_hash, "m1") == 2
    assert rd.config()["hash"] == new_hash and rd.config()["run"]["max_epoch"] == 4
    assert rd.done() is None and not rd.trained  # the grid resumes it
    history = json.loads(rd.extended_path.read_text())
    assert [(h["hash"], h["max_epoch"], h["done"]["epochs"]) for h in history] == [(old_hash, 2, [1, 2])]


@pytest.mark.parametrize("done, fields, model_code, message", [
    (None, {"lr": 2e-3}, "m1", "its config differs in run.lr: use another --out"),
    (None, {"max_epoch": 4, "lr": 2e-3}, "m1", "its config differs in run.lr, run.max_epoch: use another --out"),
    (None, {"max_epoch": 1}, "m1", "it has 2 epochs already, more than --max-epoch 1: give --max-epoch 2 or more"),
    ("diverged", {"max_epoch": 4}, "m1", "it diverged at update 7: more epochs would not continue it; give --max-epoch 2"),
    ("finished", {"max_epoch": 4}, "m2", "its epochs were trained by other model code (m1, now m2)"),
])
def test_extend_refuses_what_would_not_continue_the_same_run_and_changes_nothing(tmp_path, done, fields, model_code,
                                                                                   message):
    from fairseq_lnpos.errors import LnposError
    from fairseq_lnpos.experiments.records import DoneRecord, Outcome

    record = done and DoneRecord(outcome=Outcome(done), diverged_at=7 if done == "diverged" else None, epochs=(1, 2),
                                 provenance={"model_code": "m1"}, unigram_bits=6.0)
    rd, run, config = _recorded_run(tmp_path, record)
    before = {p.name: p.read_bytes() for p in rd.path.iterdir() if p.is_file()}
    new, new_hash = _more(run, config, **fields)
    with pytest.raises(LnposError, match=r"--extend continues a finished run for more epochs only, and ") as e:
        rd.extend(new, new_hash, model_code)
    assert message in str(e.value)
    assert {p.name: p.read_bytes() for p in rd.path.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("fields, message", [
    ({"max_update": 300}, "its budget also sets max_update 300"),
    ({"schedule": "linear"}, "its budget also sets its learning-rate schedule (linear)"),
    ({"average_last": 3}, "its budget also sets which checkpoints are averaged (average_last 3)"),
])
def test_extend_refuses_a_run_whose_budget_is_more_than_its_epochs(tmp_path, fields, message):
    from fairseq_lnpos.errors import LnposError

    rd, run, config = _recorded_run(tmp_path, None, **fields)
    new, new_hash = _more(run, config, max_epoch=3)
    with pytest.raises(LnposError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rd.extend(new, new_hash, "m1")


@pytest.mark.slow
def test_extend_continues_a_finished_run_and_scores_only_its_new_epoch(uninterrupted, data, tmp_path):
    out = tmp_path / "grid"
    shutil.copytree(uninterrupted[0], out)
    good = out / GOOD / "seed1"
    before = {e: (good / "eval" / f"epoch{e}.json").read_bytes() for e in (1, 2)}
    done_before = json.loads((good / "DONE.json").read_text())
    # without --extend a run of 3 epochs is another config; with it the diverged run is refused first
    assert "was made with a different config" in sh(GRID, *ARGS, "--data", data, "--out", out, "--max-epoch", "3").stderr
    refused = sh(GRID, *ARGS, "--data", data, "--out", out, "--max-epoch", "3", "--extend")
    assert refused.returncode == 2 and "it diverged at update" in refused.stderr
    assert json.loads((good / "DONE.json").read_text()) == done_before  # nothing changed
    run = sh(GRID, *ARGS[:2], GOOD, *ARGS[3:-2], "--data", data, "--out", out, "--max-epoch", "3", "--extend")
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"{GOOD} seed 1: continues from epoch 2 to 3" in run.stdout
    done = json.loads((good / "DONE.json").read_text())
    assert done["status"] == "finished" and done["epochs"] == [1, 2, 3] and done["updates"] > done_before["updates"]
    assert done["train_cpu_seconds"] > done_before["train_cpu_seconds"]  # both launches of fairseq-train
    assert {e: (good / "eval" / f"epoch{e}.json").read_bytes() for e in (1, 2)} == before  # scored once
    assert json.loads((good / "eval" / "epoch3.json").read_text())["num_updates"] == done["updates"]
    assert json.loads((good / "extended.json").read_text())[0]["done"] == done_before
    assert (good / "train.log").read_text().count("# grid: ") == 2
