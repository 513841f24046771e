"""Reading fairseq's log (recorded lines) and expanding stability sweeps."""

import pytest

from fairseq_lnpos.errors import LnposError, run_main
from fairseq_lnpos.experiments import grid as G
from fairseq_lnpos.experiments import sweep as S
from fairseq_lnpos.fairseq_log import LogState, LogTail, bleu4

# lines as fairseq-train 0.12 writes them with --log-format json (tiny model, synthetic corpus)
T = ('2026-11-30 22:08:59 | INFO | train_inner | {"epoch": 1, "update": 0.125, "loss": "%s", "nll_loss": "6.409", '
     '"ppl": "84.99", "wps": "0", "ups": "0", "wpb": "420", "bsz": "32", "num_updates": "%d", "lr": "0.001", '
     '"gnorm": "6.439", "train_wall": "1", "wall": "4"}')
VALID = ('2026-11-30 22:09:02 | INFO | valid | {"epoch": %d, "valid_loss": "%s", "valid_nll_loss": "4.863", '
         '"valid_ppl": "29.09", "valid_wps": "0", "valid_wpb": "172", "valid_bsz": "16", "valid_num_updates": "%d"}')
TRAIN = ('2026-11-30 22:09:03 | INFO | train | {"epoch": 1, "train_loss": "5.576", "train_nll_loss": "5.434", '
         '"train_num_updates": "8", "train_lr": "0.001"}')
SAVED = ("2026-11-30 22:09:03 | INFO | fairseq.checkpoint_utils | Saved checkpoint /o/checkpoints/%s "
         "(epoch %d @ %d updates, score 5.056) (writing took 0.88 seconds)")
LOADED = ("2026-11-30 22:10:00 | INFO | fairseq.trainer | Loaded checkpoint /o/checkpoints/checkpoint_last.pt "
          "(epoch 2 @ 8 updates)")


def feed(state, lines):
    return [state.feed(line) for line in lines]


def test_a_whole_log_at_once():
    st = LogState.of("\n".join([T % ("6.431", 1), VALID % (1, "5.056", 8), TRAIN, "other"]))
    assert (st.updates, st.first_loss, st.final_valid_loss, list(st.train)) == (1, 6.431, 5.056, [1])
    assert st.epochs_done == 0.125  # train_inner's "update": the fraction of the epochs done


def test_bleu_of_fairseq_generate_and_fairseq_score():
    gen = ("2026-11-30 22:10:00 | INFO | fairseq_cli.generate | Generate test with beam=5: BLEU4 = 31.16, "
           "64.1/38.0/24.7/16.4 (BP=1.000, ratio=1.013, syslen=1500, reflen=1480)")
    assert bleu4(gen) == 31.16
    score = "Namespace(...)\nBLEU4 = 0.00, 1.0/0.0/0.0/0.0 (BP=1.000)\nBLEU4 = 7.50, 20.0/10.0/5.0/2.5 (BP=0.9)"
    assert bleu4(score) == 7.5  # the last score printed
    assert bleu4("no score here") is None

def test_epochs_valid_train_and_saves_from_recorded_lines():
    st = LogState()
    kinds = feed(st, [T % ("6.431", 1), T % ("5.327", 2), VALID % (1, "5.056", 8), TRAIN,
                      SAVED % ("checkpoint1.pt", 1, 8), "some other line", (T % ("7.7", 9))[:-1]])
    assert kinds[:5] == ["train_inner", "train_inner", "valid", "train", "saved"]
    assert st.updates == 2 and st.loss == "5.327" and st.first_loss == 6.431
    assert st.valid[1]["valid_loss"] == "5.056" and st.train[1]["train_loss"] == "5.576"
    assert st.saved == {1: 8} and st.diverged_at is None and st.final_valid_loss == 5.056
    # a run stopped by --max-update inside an epoch saves checkpoint_last only: not an epoch to score
    assert st.feed(SAVED % ("checkpoint_last.pt", 2, 12)) is None and st.saved == {1: 8}
    st.feed(LOADED)
    assert st.updates == 8


def test_divergence_nonfinite_fatal_and_patience():
    st = LogState()
    feed(st, [T % ("6.4", 1), T % ("nan", 2), T % ("7.0", 3)])
    assert st.diverged_at == 2
    st = LogState()
    feed(st, [T % ("6.4", 1), VALID % (1, "inf", 5)])
    assert st.diverged_at == 5
    st = LogState()
    st.feed('    raise FloatingPointError("gradients are Nan/Inf")')
    assert st.fatal_fp and st.diverged_at is None
    # above the first loss for 3 logged updates in a row: diverged where that began; a dip resets it
    st = LogState(patience=3)
    feed(st, [T % ("6.0", 1), T % ("6.5", 2), T % ("6.6", 3), T % ("5.0", 4), T % ("6.1", 5), T % ("6.2", 6)])
    assert st.diverged_at is None
    st.feed(T % ("9.9", 7))
    assert st.diverged_at == 5
    assert LogState(patience=0).feed(T % ("1e9", 1)) == "train_inner"


def test_tail_feeds_only_complete_lines(tmp_path):
    log = tmp_path / "train.log"
    st = LogState()
    tail = LogTail(log, st)
    assert tail.poll() == []  # no file yet
    log.write_text(T % ("6.4", 1) + "\n" + SAVED % ("checkpoint1.pt", 1, 8) + "\n" + "# fairseq-train ran 12.5 s\n"
                   + (T % ("5.0", 2))[:40])
    # epoch 1 is saved, but its training statistics (logged just after the save) are not in yet
    assert tail.poll() == [] and st.updates == 1 and st.train_seconds == 12.5
    with open(log, "a") as f:
        f.write((T % ("5.0", 2))[40:] + "\n" + TRAIN[:30])
    assert tail.poll() == [] and st.updates == 2 and st.loss == "5.0"
    with open(log, "a") as f:
        f.write(TRAIN[30:] + "\n")
    assert tail.poll() == [1] and st.train[1]["train_loss"] == "5.576"
    assert tail.poll() == []  # given once


def test_tail_gives_a_saved_epoch_without_statistics_once_the_process_ended(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(SAVED % ("checkpoint1.pt", 1, 8) + "\n")
    tail = LogTail(log, LogState())
    assert tail.poll() == [] and tail.poll(ended=True) == [1] and tail.poll(ended=True) == []


def test_sweep_expansion_is_deterministic_complete_and_unique():
    axes = S.parse_axes("postln,preln,deepnorm,keel", "1e-4,3e-4,1e-3,3e-3,1e-2", "1,100,1000", "6,12")
    runs = S.expand(*axes, max_update=300)
    assert len(runs) == 4 * 5 * 3 * 2 == len({r.name for r in runs})
    assert [r.name for r in runs] == [r.name for r in S.expand(*axes, max_update=300)]
    r = next(r for r in runs if r.name == "sweep-keel-L12-lr0.003-wu1")
    assert (r.ln, r.layers, r.lr, r.warmup, r.max_update, r.dataset) == ("keel", 12, 3e-3, 0, 300, "synthetic")
    assert next(r for r in runs if r.name == "sweep-preln-L6-lr0.0001-wu1000").warmup == 1000
    assert all(r.decay_anchor >= 10 ** 9 and r.optimizer == "adam" for r in runs)  # constant after warm-up
    for bad in (("midln", "1e-3", "1", "6"), ("postln", "0", "1", "6"), ("postln", "1e-3", "0", "6"),
                ("postln", "1e-3", "1", "0"), ("postln", "x", "1", "6"), ("postln", "1e-3,1e-3", "1", "6")):
        with pytest.raises(LnposError):
            S.parse_axes(*bad)


def test_sweep_dry_run_names_and_budget(capsys, tmp_path):
    argv = ["sweep", "--dry-run", "--archs", "postln,preln", "--lr", "1e-3,1e-2", "--warmup", "1,100",
            "--layers", "6,12", "--max-update", "300", "--seeds", "1", "--out", str(tmp_path / "s")]
    assert run_main("grid", G.main, argv) == 0
    out = capsys.readouterr().out
    trains = [line for line in out.splitlines() if line.startswith("fairseq-train ")]
    assert len(trains) == 16 and all("--max-update 300" in t and "--arch transformer_" in t for t in trains)
    assert sum("--encoder-layers 12 --decoder-layers 12" in t for t in trains) == 8
    assert out.count("# no test BLEU") == 16 and not (tmp_path / "s").exists()
    assert "sweep-preln-L12-lr0.01-wu100" in out and "_tiny" in trains[0]
    assert run_main("grid", G.main, ["sweep", "--dry-run", "--real", "--archs", "keel", "--lr", "1e-3",
                                     "--warmup", "1", "--out", str(tmp_path / "r")]) == 0
    assert "transformer_keel_iwslt_de_en" in capsys.readouterr().out
    assert run_main("grid", G.main, ["sweep", "--dry-run", "--archs", "nope"]) == 2
    assert "--archs: 'nope' is not a variant: choose from postln, preln," in capsys.readouterr().err
    (cell,) = S.expand(["preln"], [3e-3], [1], [12], 10)  # warm-up 1 is the paper's T_warmup = 1: none
    assert (cell.name, cell.ln, cell.lr, cell.warmup, cell.layers, cell.max_update) == (
        "sweep-preln-L12-lr0.003-wu1", "preln", 3e-3, 0, 12, 10)


def sweep_job(tmp_path, *flags):
    """The one Job of a one-cell sweep (Post-LN, 2 layers, 30 updates, seed 1) with ``flags``, planned as
    ``grid.sh sweep --dry-run`` plans it."""
    from fairseq_lnpos.experiments.options import SweepOptions
    from fairseq_lnpos.experiments.plan import make_jobs

    ns = G.build_parser().parse_args(["sweep", "--archs", "postln", "--lr", "1e-3", "--warmup", "1", "--layers", "2",
                                      "--max-update", "30", "--seeds", "1", "--out", str(tmp_path / "s"), *flags])
    opts = SweepOptions.from_namespace(ns)
    (j,), _ = make_jobs(opts, S.sweep_runs(opts), dry_run=True)
    return j


def test_a_sweep_validates_at_its_last_update_only_unless_asked(tmp_path):
    """A map reads a cell's last validation only: fairseq validates at --max-update, not at the epoch
    ends before it; the config (and its hash) is that of a cell validated every epoch.
    --validate-each-epoch and --bleu validate every epoch; grid.sh run never skips one."""
    from dataclasses import replace

    from fairseq_lnpos.experiments.options import RunOptions

    def job(*flags):
        return sweep_job(tmp_path, *flags)

    def validate_after(j):
        cmd = j.train_cmd()
        return cmd[cmd.index("--validate-after-updates") + 1] if "--validate-after-updates" in cmd else None

    final_only, each, bleu = job(), job("--validate-each-epoch"), job("--bleu")
    assert validate_after(final_only) == "30" and validate_after(each) is None and validate_after(bleu) is None
    assert final_only.config_hash() == each.config_hash() and final_only.config() == each.config()
    assert validate_after(replace(final_only, opts=RunOptions(no_bleu=True))) is None


def test_sweep_help_states_the_sweeps_own_defaults(capsys):
    with pytest.raises(SystemExit):
        G.main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "output folder (default sweep-out)" in text and "default 50)" in text
    with pytest.raises(SystemExit):
        G.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "output folder (default grid-out)" in text and "default 0)" in text


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_and_records_divergence(tmp_path):
    """A real sweep on the toy corpus, stopped by Ctrl-C after its first run finished: exit 130, and
    the same command finishes the rest without redoing that run; lr 1e30 stops early, recorded as
    diverged; the stability map counts every run."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from toydata import make_toy_data

    repo = Path(__file__).resolve().parents[1]
    data, out = make_toy_data(tmp_path / "toy"), tmp_path / "sweep"
    argv = [str(repo / "scripts" / "grid.sh"), "sweep", "--archs", "postln,preln", "--lr", "1e-3,1e30",
            "--warmup", "1", "--layers", "2", "--max-update", "30", "--patience", "5", "--seeds", "1", "--jobs", "1",
            "--data", str(data), "--out", str(out), "--set", "max_tokens=512", "--set", "batch_tokens=512"]
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    first = out / "sweep-postln-L2-lr0.001-wu1" / "seed1" / "DONE.json"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    deadline = time.time() + 300
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert first.exists(), proc.communicate()[1][-2000:]
    stamp = first.stat().st_mtime_ns
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted; run the same command again to resume" in err, err[-2000:]
    assert sum(1 for _ in out.glob("*/seed1/DONE.json")) < 4

    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "sweep-postln-L2-lr0.001-wu1 seed 1: already finished, not redone" in res.stdout
    assert first.stat().st_mtime_ns == stamp
    assert f"all runs processed; stability map: scripts/stability_map.sh {out}" in res.stdout
    done = {p.parent.parent.name: json.loads(p.read_text()) for p in out.glob("*/seed1/DONE.json")}
    assert sorted(done) == ["sweep-postln-L2-lr0.001-wu1", "sweep-postln-L2-lr1e+30-wu1",
                            "sweep-preln-L2-lr0.001-wu1", "sweep-preln-L2-lr1e+30-wu1"]
    for name, d in done.items():
        if "1e+30" in name:
            assert d["status"].startswith("diverged") and d["diverged_at"] < 30, (name, d)
        else:
            assert d["status"] == "finished" and d["final_valid_loss"] < d["initial_loss"], (name, d)
            # epochs of 8 updates, each saved to resume from, validated at update 30 only
            state = LogState.of((out / name / "seed1" / "train.log").read_text())
            assert sorted(state.saved) == [1, 2, 3] and len(state.valid) == 1, (name, state.valid)
            assert state.valid[4]["valid_num_updates"] == "30" and d["final_valid_nll"] == float(
                state.valid[4]["valid_nll_loss"])
    smap = subprocess.run([str(repo / "scripts" / "stability_map.sh"), str(out), "--no-figures"],
                          capture_output=True, text=True, env=env)
    assert smap.returncode == 0 and "4 runs: 2 finished, 2 diverged" in smap.stdout, smap.stderr


def swept_cell(tmp_path, name, *flags):
    """Sweep one cell (Post-LN, 2 layers, 30 updates of 512 tokens, seed 1) on the toy corpus into
    ``tmp_path/name`` with ``scripts/grid.sh sweep`` and ``flags``; its run folder."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from toydata import make_toy_data

    repo = Path(__file__).resolve().parents[1]
    data = tmp_path / "toy" / "bin" if (tmp_path / "toy" / "bin").is_dir() else make_toy_data(tmp_path / "toy")
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    res = subprocess.run([str(repo / "scripts" / "grid.sh"), "sweep", "--archs", "postln", "--lr", "1e-3",
                          "--warmup", "1", "--layers", "2", "--max-update", "30", "--seeds", "1", "--data", str(data),
                          "--out", str(tmp_path / name), "--set", "max_tokens=512", "--set", "batch_tokens=512", *flags],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return tmp_path / name / "sweep-postln-L2-lr0.001-wu1" / "seed1"


@pytest.mark.slow
def test_validating_each_epoch_changes_no_number(tmp_path):
    """One cell swept as the map runs it (validated at its last update only) and with
    --validate-each-epoch: the same training loss at every update and the same final validation."""
    import json

    states, done = {}, {}
    for name, flags in (("last", []), ("each", ["--validate-each-epoch"])):
        run = swept_cell(tmp_path, name, *flags)
        states[name] = LogState.of((run / "train.log").read_text())
        done[name] = json.loads((run / "DONE.json").read_text())
    assert (len(states["last"].valid), len(states["each"].valid)) == (1, 4)  # epochs of 8 updates, then update 30
    assert states["last"].losses == states["each"].losses and len(states["last"].losses) == 30
    assert done["last"]["final_valid_nll"] == done["each"]["final_valid_nll"] is not None
    assert done["last"]["final_valid_loss"] == done["each"]["final_valid_loss"]


def test_cpu_bf16_trains_under_autocast_and_is_a_setting_of_its_own(tmp_path, monkeypatch):
    """--cpu-bf16: the task's --cpu-autocast-bf16 on the plugin's task; the config records the precision
    (so a map refuses to mix the two), and a float32 cell keeps the config and hash it had before the
    option existed."""
    from fairseq_lnpos import precision
    from fairseq_lnpos.analysis.frame import settings

    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ("amx_bf16",))
    f32, bf16 = sweep_job(tmp_path), sweep_job(tmp_path, "--cpu-bf16")
    cmd = bf16.train_cmd()
    assert "--cpu-autocast-bf16" in cmd and cmd[cmd.index("--task") + 1] == "translation_lnpos"
    assert "--cpu-autocast-bf16" not in f32.train_cmd() and "precision" not in f32.config()
    assert bf16.config()["precision"] == "bf16-autocast" and bf16.config_hash() != f32.config_hash()
    assert dict(settings({**bf16.config(), "hash": "h"}))["precision"] == "bf16-autocast"
    # a float32 cell's config has the keys it had before --cpu-bf16 existed: existing run folders keep their hash
    assert set(f32.config()) == {"run", "seed", "data", "arch", "fp16", "fairseq_args", "beam", "lenpen", "gen_args"}


@pytest.mark.parametrize("flags, message", [
    (["--fp16"], "two kinds of mixed precision"),
    (["--gpus", "0"], "this grid trains on GPUs"),
    (["--task", "multilingual_translation"], "not of --task multilingual_translation"),
    ([], "this CPU has no bfloat16 instructions"),
])
def test_cpu_bf16_is_refused_where_it_cannot_apply(tmp_path, monkeypatch, capsys, flags, message):
    from fairseq_lnpos import precision

    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ())
    argv = ["sweep", "--archs", "postln", "--lr", "1e-3", "--warmup", "1", "--layers", "2", "--max-update", "30",
            "--out", str(tmp_path / "s"), "--cpu-bf16", *flags]
    assert G.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not (tmp_path / "s").exists()


def test_a_float32_run_folder_met_by_a_bfloat16_command_names_the_flag_that_continues_it(tmp_path, monkeypatch):
    from fairseq_lnpos import precision

    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ("amx_bf16",))
    f32, bf16 = sweep_job(tmp_path), sweep_job(tmp_path, "--cpu-bf16")  # float32 unless asked
    assert "precision" not in f32.config() and bf16.config()["precision"] == "bf16-autocast"
    f32.dir.claim(f32.config(), f32.config_hash())
    with pytest.raises(LnposError, match="trained in float32 and this command would train it in bf16-autocast: "
                                         "drop --cpu-bf16 to continue it"):
        bf16.dir.check_config(bf16.config_hash(), bf16.config())
    f32.dir.check_config(f32.config_hash(), f32.config())  # the same config: nothing to say



@pytest.mark.slow
def test_a_bfloat16_cell_records_its_precision_and_is_not_mapped_with_float32(tmp_path):
    """Where the CPU has bfloat16 instructions: a cell swept with --cpu-bf16 trains under autocast
    (DONE.json and runs.csv say bf16-autocast), learns as the float32 cell does, and a map of both
    folders is refused (they differ in precision)."""
    import json

    from fairseq_lnpos import precision
    from fairseq_lnpos.analysis import stability
    from fairseq_lnpos.analysis.frame import runs_frame

    if not precision.cpu_bf16_instructions():
        pytest.skip("this CPU has no bfloat16 instructions (AVX-512 BF16 or AMX): --cpu-bf16 is refused here")
    runs = {name: swept_cell(tmp_path, name, *flags) for name, flags in (("f32", []), ("bf16", ["--cpu-bf16"]))}
    done = {name: json.loads((run / "DONE.json").read_text()) for name, run in runs.items()}
    assert (done["f32"]["precision"], done["bf16"]["precision"]) == ("float32", "bf16-autocast")
    assert list(runs_frame(tmp_path / "bf16")["precision"]) == ["bf16-autocast"]
    assert done["bf16"]["final_valid_nll"] < done["bf16"]["initial_loss"]  # it learned in 30 updates
    assert abs(done["bf16"]["final_valid_nll"] - done["f32"]["final_valid_nll"]) < 0.1 * done["f32"]["final_valid_nll"]
    assert stability.main([str(tmp_path / "f32"), str(tmp_path / "bf16"), "--out-dir", str(tmp_path / "map"),
                           "--no-figures"]) == 2
