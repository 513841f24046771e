"""Fig. 3 at initialization: the depth trend, the JSON layout, the figures, resuming, bad input."""
import json
import os
import sys

import pytest

from conftest import REPO, USER_DIR, fairseq_cmd, run

SMALL = ["--model-args", "--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-ffn-embed-dim 64 "
         "--decoder-ffn-embed-dim 64 --encoder-attention-heads 2 --decoder-attention-heads 2",
         "--size", "", "--vocab", "500", "--tokens", "256", "--batches", "2", "--dropout", "0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def analysis(*args):
    return run([str(REPO / "scripts" / "init_grad_analysis.sh"), *map(str, args)],
               env=dict(ENV, PYTHON=sys.executable))


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig3")
    result = analysis(*SMALL, "--depths", "6,14", "--seeds", 3, "--spectral", "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


@pytest.mark.slow
def test_pre_ln_last_w2_falls_with_depth_post_ln_does_not(small_run):
    out, _ = small_run
    ratio = json.loads((out / "fig3.json").read_text())["ratio_last_w2"]
    for stack in ("encoder", "decoder"):  # measured here: Pre-LN 0.46/0.49, Post-LN 0.88/0.75
        assert ratio["Pre-LN"][stack] < ratio["Post-LN"][stack] - 0.15, (stack, ratio)
        assert ratio["Pre-LN"][stack] < 0.7, (stack, ratio)  # Theorem 1: falls like 1/sqrt(L)


@pytest.mark.slow
def test_json_fields_figures_and_progress(small_run):
    out, result = small_run
    fig3 = json.loads((out / "fig3.json").read_text())
    assert {"paper", "settings", "per_layer", "last_w2", "ratio_last_w2", "lemma2", "models", "seconds"} <= set(fig3)
    assert fig3["settings"]["depths"] == [6, 14] and fig3["settings"]["seeds"] == 3
    for label in ("Post-LN", "Pre-LN"):
        for stack in ("encoder", "decoder"):
            for w in ("fc1", "fc2"):
                e = fig3["per_layer"][label][stack][w]
                assert len(e["mean"]) == len(e["std"]) == len(e["batch_norm_mean"]) == 6
                assert all(v > 0 for v in e["mean"]) and e["seeds"] == 3
                # averaging over batches before the norm can only shrink it (triangle inequality)
                assert all(m <= b * (1 + 1e-6) for m, b in zip(e["mean"], e["batch_norm_mean"]))
            last = fig3["last_w2"][label][stack]
            assert last["depths"] == [6, 14] and last["seeds"] == [3, 3]
            assert last["mean"][0] == pytest.approx(fig3["per_layer"][label][stack]["fc2"]["mean"][-1])
    pre, post = fig3["lemma2"]["Pre-LN"]["encoder"], fig3["lemma2"]["Post-LN"]["encoder"]
    assert pre["depth"] == 14 and len(pre["stream"]["mean"]) == 15
    s = pre["stream"]["mean"]
    assert all(b > a for a, b in zip(s, s[1:]))  # Pre-LN: the residual stream grows with depth
    assert pre["stream"]["lemma_lower"][14] == 8.0 and pre["stream"]["lemma_upper"][14] == 22.0
    assert len(post["before_ffn_ln"]["mean"]) == 14
    assert max(post["before_ffn_ln"]["mean"]) < min(s[-3:])  # Post-LN: renormalized at every layer
    assert len(fig3["models"]) == 2 * 2 * 3
    for rec in fig3["models"]:  # the spectral norm: at most the Frobenius norm, at least it / sqrt(rank <= 32)
        pairs = [(f, s) for st, ws in rec["mean_grad"].items() for w, fro in ws.items()
                 for f, s in zip(fro, rec["mean_grad_spectral"][st][w]) if f is not None]
        assert pairs and all(f / 32 ** 0.5 <= s < f for f, s in pairs)
    for name in ("fig3.png", "fig3_per_batch.png", "lemma2.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 200_000
    progress = [line for line in result.stdout.splitlines() if line.startswith("[") and ": measuring (" not in line]
    assert len(progress) == 12 and progress[-1].startswith("[12/12]") and "ETA" in progress[-1]
    assert "time taken:" in result.stdout


@pytest.mark.slow
def test_rerun_resumes_from_records(small_run, capsys):
    from fairseq_lnpos.analysis import init_grad

    out, _ = small_run
    before = json.loads((out / "fig3.json").read_text())
    (out / "fig3.json").unlink()
    init_grad.main([*SMALL, "--depths", "6,14", "--seeds", "3", "--spectral", "--out", str(out)])  # the settings of small_run
    assert capsys.readouterr().out.count("done earlier") == 12
    after = json.loads((out / "fig3.json").read_text())
    assert after["last_w2"] == before["last_w2"] and after["lemma2"] == before["lemma2"]


@pytest.mark.parametrize("args, message", [
    (["--depths", "6,8", "--layers-depth", "7"], "--layers-depth 7 is not in --depths"),
    (["--checkpoint", "x.pt"], "--checkpoint needs --data"),
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["--depths", "6,x"], "--depths: 'x' is not a whole number"),
    (["--depths", "6,8,6"], "--depths: '6' is listed twice"),
    (["--data", "/nonexistent/bin"], "data folder /nonexistent/bin does not exist"),
    (["--width", "90"], "--width 90: give a multiple of 4 (the attention heads)"),
])
def test_bad_input_one_line_error(tmp_path, capsys, args, message):
    from fairseq_lnpos.analysis import init_grad

    try:
        status = init_grad.main([*args, "--out", str(tmp_path)])
    except SystemExit as e:  # the parser's own errors (a value of the wrong type) exit there
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].split(":")[0] in ("init_grad_analysis", "init_grad_analysis.sh"), err
    assert "error:" in err[0] and message in err[0], err
    assert not (tmp_path / "fig3.json").exists()


@pytest.mark.slow
def test_unknown_arch_through_the_script(tmp_path):
    result = analysis("--archs", "postln,nosuch", "--out", tmp_path)
    assert result.returncode == 2
    assert "init_grad_analysis: error: unknown architecture 'nosuch' in --archs: use postln, preln" in result.stderr


@pytest.mark.slow
def test_data_dir_and_checkpoint(toy_data, tmp_path):
    """A binarized data dir, plus a trained checkpoint as the third line of Fig. 3a/b."""
    ckpt = tmp_path / "ckpt"
    train = run(fairseq_cmd(
        "fairseq-train", toy_data, "--user-dir", USER_DIR, "--arch", "transformer",
        "--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 32, "--decoder-embed-dim", 32,
        "--encoder-ffn-embed-dim", 64, "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", 2,
        "--decoder-attention-heads", 2, "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 300,
        "--max-update", 3, "--cpu", "--save-dir", ckpt, "--no-epoch-checkpoints", "--disable-validation",
        "--num-workers", 0), env=ENV)
    assert train.returncode == 0, train.stderr[-2000:]
    from fairseq_lnpos.analysis import init_grad

    out = tmp_path / "out"
    init_grad.main([*SMALL[:2], "--size", "", "--data", str(toy_data), "--depths", "2", "--layers-depth", "2",
                    "--seeds", "1", "--tokens", "200", "--checkpoint", str(ckpt / "checkpoint_last.pt"),
                    "--checkpoint-label", "trained", "--no-lemma2", "--out", str(out), "--threads", "1"])
    fig3 = json.loads((out / "fig3.json").read_text())
    assert set(fig3["per_layer"]) == {"Post-LN", "Pre-LN", "trained"}
    assert set(fig3["last_w2"]) == {"Post-LN", "Pre-LN"}  # the checkpoint is not part of the depth sweep
    assert len(fig3["per_layer"]["trained"]["decoder"]["fc2"]["mean"]) == 2
    assert "train]" in fig3["settings"]["data_desc"] and fig3["lemma2"] == {}


def test_train_curves_reads_resumed_jsonl_and_plots(tmp_path):
    from fairseq_lnpos.analysis.train_curves import plot, read_jsonl

    path = tmp_path / "grad_norms.jsonl"
    rows = [{"update": 10, "norms": {"encoder/0": 1.0, "encoder/1": 2.0, "decoder/0": 3.0, "total": 4.0}},
            {"update": 20, "norms": {"encoder/0": 1.5, "encoder/1": 2.5, "decoder/0": None, "total": 5.0}},
            {"update": 20, "norms": {"encoder/0": 9.0, "encoder/1": 9.0, "decoder/0": 9.0, "total": 9.0}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"update": 30, "no')  # resumed, then cut
    updates, series = read_jsonl(path)
    assert updates == [10, 20] and series["encoder/0"] == [1.0, 9.0]  # the later record of update 20 wins
    png = plot(path, tmp_path / "curves.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    from fairseq_lnpos.errors import LnposError

    with pytest.raises(LnposError, match="no group matches"):
        plot(path, tmp_path / "x.png", groups_regex="fc9")


def test_an_interrupted_run_resumes_without_measuring_again_what_it_recorded(tmp_path, monkeypatch, capsys):
    """Each model's record is its own file, written whole; a rerun measures only the models without one
    (or with one of other settings) and writes the same outputs."""
    from fairseq_lnpos.analysis import init_grad

    argv = [*SMALL, "--depths", "2,3", "--layers-depth", "2", "--seeds", "1", "--threads", "1", "--out", str(tmp_path)]
    measured = []
    real_measure = init_grad.measure

    def counting(job, *args):
        measured.append(str(job))
        return real_measure(job, *args)

    monkeypatch.setattr(init_grad, "measure", counting)
    assert init_grad.main(argv) == 0
    assert len(measured) == 4
    files = sorted((tmp_path / "models").glob("*.json"))
    assert [f.name for f in files] == ["Post-LN-depth2-seed1.json", "Post-LN-depth3-seed1.json",
                                       "Pre-LN-depth2-seed1.json", "Pre-LN-depth3-seed1.json"]
    before = json.loads((tmp_path / "fig3.json").read_text())
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert [{k: v for k, v in json.loads(line).items() if k != "settings_key"} for line in lines] == before["models"]

    # interrupted after two models: the others' records are missing, and one was made with other settings
    (tmp_path / "models" / "Pre-LN-depth2-seed1.json").unlink()
    stale = tmp_path / "models" / "Post-LN-depth3-seed1.json"
    stale.write_text(json.dumps({**json.loads(stale.read_text()), "settings_key": "other"}))
    for name in ("fig3.json", "records.jsonl"):
        (tmp_path / name).unlink()
    measured.clear()
    capsys.readouterr()
    assert init_grad.main(argv) == 0
    assert measured == ["Post-LN depth 3 seed 1", "Pre-LN depth 2 seed 1"]
    assert capsys.readouterr().out.count("done earlier") == 2
    after = json.loads((tmp_path / "fig3.json").read_text())
    assert after["last_w2"] == before["last_w2"] and after["per_layer"] == before["per_layer"]
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 4

    measured.clear()
    assert init_grad.main([*argv, "--fresh"]) == 0 and len(measured) == 4


def test_a_damaged_model_record_is_an_error_naming_it(tmp_path, capsys):
    from fairseq_lnpos.analysis import init_grad

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "Post-LN-depth2-seed1.json").write_text("{")
    argv = [*SMALL, "--depths", "2", "--layers-depth", "2", "--seeds", "1", "--out", str(tmp_path)]
    assert init_grad.main(argv) == 2
    err = capsys.readouterr().err
    assert "Post-LN-depth2-seed1.json is damaged" in err and "delete it to measure that model again" in err


def test_fig3_records_the_settings_it_was_given():
    from fairseq_lnpos.analysis.summary import summarize

    def record(label, depth, requested):
        grads = {stack: {"fc1": [1.0] * depth, "fc2": [2.0] * depth} for stack in ("encoder", "decoder")}
        return dict(label=label, full=False, depth=depth, depth_requested=requested, mean_grad=grads, batch_norm=grads)

    # Pre-LN measured at one depth only, and no Lemma 2 records: the settings are still the arguments
    records = [record("Post-LN", 6, 6), record("Post-LN", 14, 14), record("Pre-LN", 6, 6)]
    for lemma2 in (True, False):
        result = summarize(records, {"batches": 2}, depths=(6, 14), layers_depth=6, seeds=1, lemma2=lemma2)
        assert result["settings"] == {"batches": 2, "archs": ["Post-LN", "Pre-LN"], "depths": [6, 14],
                                      "layers_depth": 6, "seeds": 1, "lemma2": lemma2}
        assert result["last_w2"]["Pre-LN"]["encoder"]["depths"] == [6] and result["lemma2"] == {}
        assert result["ratio_last_w2"]["Post-LN"]["decoder"] == 1.0


def test_width_builds_the_sweeps_model_size():
    """--width gives the models the sweeps' width flags (d, FFN 4d), and is a setting of the records
    only when given (records of earlier versions still resume)."""
    from fairseq_lnpos.analysis import init_grad
    from fairseq_lnpos.experiments.sweep import width_args

    opts = init_grad.parse_args(["--size", "tiny", "--width", "96"])
    argv = init_grad.fairseq_argv("transformer_postln_tiny", 6, opts)
    assert " ".join(width_args(96)) in " ".join(argv)
    assert argv[argv.index("--encoder-ffn-embed-dim") + 1] == "384"
    assert init_grad.settings_of(opts, "d")["width"] == 96
    assert "width" not in init_grad.settings_of(init_grad.parse_args([]), "d")


def test_the_start_line_quotes_the_benchmark_pages_time_only_for_the_settings_it_measured(tmp_path):
    """The expected time is the benchmark page's (bench.json), never a number typed into the code."""
    from fairseq_lnpos.analysis import init_grad

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"fig3_analysis_seconds": 137.6, "cpu_count": 2}))
    measured = "138 s on 2 cores in the last benchmark (docs/results/benchmarks)"
    defaults = init_grad.Options().validate()
    assert init_grad.expected_time(defaults, 20, bench) == f"{measured} for these 20 models (the defaults)"
    demo = init_grad.Options(size="tiny", archs="postln,preln,deepnorm").validate()  # make demo's Fig. 3 step
    assert init_grad.expected_time(demo, 30, bench) == (f"not measured for these 30 models (--size tiny); the 20 models "
                                                        f"of the defaults at d 512 took {measured}")
    assert init_grad.expected_time(init_grad.Options(seeds=10).validate(), 100, bench).startswith("not measured")
    for page in (tmp_path / "absent.json", tmp_path / "broken.json"):  # an installed copy; a page cut short
        page.write_text("{") if page.name == "broken.json" else None
        assert init_grad.expected_time(defaults, 20, page).startswith("not measured for these 20 models (no benchmark")
    published = json.loads((REPO / "docs" / "results" / "benchmarks" / "bench.json").read_text())
    assert f"{published['fig3_analysis_seconds']:.0f} s on" in init_grad.expected_time(defaults, 20)


def test_a_results_page_holds_the_tables_of_fig3_json_and_its_records(tmp_path, capsys):
    from fairseq_lnpos.analysis import init_grad

    page = tmp_path / "page"
    argv = [*SMALL, "--depths", "2,3", "--layers-depth", "2", "--seeds", "2", "--threads", "1", "--out",
            str(tmp_path / "out"), "--publish", str(page)]
    assert init_grad.main(argv) == 0
    fig3 = json.loads((tmp_path / "out" / "fig3.json").read_text())
    index = (page / "index.md").read_text()
    assert "- Command: `scripts/init_grad_analysis.sh " in index and f"--publish {page}`" in index
    assert (page / "records.jsonl").read_text() == (tmp_path / "out" / "records.jsonl").read_text()
    assert {"fig3.json", "fig3.png", "lemma2.png"} <= {p.name for p in page.iterdir()}
    e = fig3["last_w2"]["Pre-LN"]["decoder"]  # the table's row is fig3.json's numbers
    row = (f"| Pre-LN | decoder | {e['mean'][0]:.3f} ± {e['std'][0]:.3f} (n=2) | {e['mean'][1]:.3f} ± "
           f"{e['std'][1]:.3f} (n=2) | {fig3['ratio_last_w2']['Pre-LN']['decoder']:.2f} |")
    assert row in index and row in (tmp_path / "out" / "fig3.md").read_text()
    w2 = fig3["per_layer"]["Post-LN"]["encoder"]["fc2"]["mean"]
    assert f"| Post-LN | encoder | W2 | {w2[0]:.3f}, {w2[1]:.3f} |" in index
    s = fig3["lemma2"]["Pre-LN"]["encoder"]["stream"]
    assert f"to {s['mean'][-1]:.2f} (l = 3) | between 2.5 and 5.5 at l = 3 |" in index
