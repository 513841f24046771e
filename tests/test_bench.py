"""The benchmark (scripts/tools/bench.py): its fairseq baselines match the plugin's archs, its statistics and verdicts give
known answers on hand-made timings, and its quick mode writes exact work counts."""
import json
import subprocess
import sys
import types

import pytest

from conftest import REPO, build_model, same_state, tool, toy_data  # noqa: F401
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.variants import VARIANTS, arch_name

B = tool("bench")  # scripts/tools/bench.py


def bench(*args):
    return subprocess.run([str(REPO / "scripts" / "bench.sh"), *map(str, args)], capture_output=True, text=True,
                          env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_quick_benchmark_writes_ratios_for_every_arch(toy_data, tmp_path):
    out = tmp_path / "bench.json"
    result = bench("--quick", "--data", toy_data, "--max-tokens", 400, "--out", out,
                   "--variants", "postln,preln,deepnorm,keel", "--publish", tmp_path / "page")
    assert result.returncode == 0, result.stderr[-3000:]
    page = (tmp_path / "page" / "index.md").read_text()
    assert "- Command: `scripts/bench.sh --quick --data " in page and "| tiny | keel |" in page
    assert (tmp_path / "page" / "bench.json").read_bytes() == out.read_bytes()
    data = json.loads(out.read_text())
    assert set(data["throughput"]) == {"tiny"}
    for arch in ("postln", "preln", "deepnorm", "keel"):
        r = data["throughput"]["tiny"][arch]
        # 2 reps x 2 updates, each paired with fairseq's update on the same batch
        assert r["n"] == 4 and r["ci95"][0] <= r["median"] <= r["ci95"][1] and r["seconds_per_update"] > 0
        assert ("target" in r) == ("verdict" in r) == (arch != "keel")  # Keel has no target
    assert data["throughput"]["tiny"]["preln"]["baseline"] == \
        "fairseq transformer --encoder-normalize-before --decoder-normalize-before"
    assert data["throughput"]["tiny"]["keel"]["baseline"] == "fairseq transformer"
    # the work counts are exact: Post-LN and Pre-LN are fairseq's model, DeepNorm adds residual
    # multiplies, Keel adds LayerNorms; none of them adds a matmul
    work = {a: data["throughput"]["tiny"][a]["work_ratio"] for a in ("postln", "preln", "deepnorm", "keel")}
    assert work["postln"] == work["preln"] == {"aten_calls": 1.0, "output_elements": 1.0, "matmul_flops": 1.0}
    assert work["deepnorm"]["matmul_flops"] == work["keel"]["matmul_flops"] == 1.0
    assert 1.0 < work["deepnorm"]["output_elements"] < work["keel"]["output_elements"] < 1.1
    assert set(data["grad_norm_overhead"]) == {"interval_1", "interval_100"}
    hook = {k: v["hook_percent"] for k, v in data["grad_norm_overhead"].items()}
    assert hook["interval_1"] > 0 and hook["interval_100"] == 0  # 4 updates: never a 100th
    # --log-diagnostics on every update and as the real-text studies log: the 4 timed updates (2 to 5)
    # are diagnosed in both settings, reported without a verdict
    diagnostics = data["diagnostics_overhead"]
    assert set(diagnostics) == {"interval_1", "first_20_interval_50"}
    assert all(r["time_ratio"]["n"] == r["logged_updates"] == r["timed_updates"] == 4 and r["inside_percent"] > 0
               and "verdict" not in r for r in diagnostics.values())
    assert "- --log-diagnostics --diagnostics-first 20 --diagnostics-interval 50: " in page
    assert "| tiny | keel |" in result.stdout
    # --cpu-autocast-bf16 against float32, Post-LN and Pre-LN, on 1024-token batches; emulated where
    # the CPU has no bfloat16 instructions
    from fairseq_lnpos.precision import cpu_bf16_instructions

    autocast = data["autocast"]
    assert autocast["emulated"] == (not cpu_bf16_instructions()) and autocast["max_tokens"] == 1024
    assert set(autocast["sizes"]["tiny"]) == {"postln", "preln"}
    assert all(r["n"] == 4 and r["target"] == 1.4 for r in autocast["sizes"]["tiny"].values())
    assert "--cpu-autocast-bf16 tiny preln (1024 tokens, " in result.stdout


@pytest.mark.slow
def test_bad_size_is_a_one_line_error(toy_data, tmp_path):
    result = bench("--sizes", "huge", "--data", toy_data, "--out", tmp_path / "b.json")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "bench.sh: error: --sizes: 'huge' is not a size: choose from base, iwslt_de_en, wmt_en_de, tiny"]
    assert not (tmp_path / "b.json").exists()


def test_each_variant_is_compared_with_fairseqs_model_of_its_layernorm_placement():
    assert B.baseline("preln") == ("fairseq_preln", ["--encoder-normalize-before", "--decoder-normalize-before"])
    for v in ("postln", "deepnorm", "keel"):
        assert B.baseline(v) == ("fairseq_postln", [])
    assert {B.baseline(v)[0] for v, spec in VARIANTS.items() if not spec.normalize_before} == {"fairseq_postln"}
    assert B.fairseq_size("iwslt_de_en") == ("transformer_iwslt_de_en", [])


@pytest.mark.parametrize("size", ["tiny", "iwslt_de_en"])
def test_fairseq_baseline_is_the_plugins_post_ln_model_parameter_for_parameter(toy_data, size):
    fairseq_arch, flags = B.fairseq_size(size)
    theirs, _, _ = build_model(toy_data, fairseq_arch, *flags, seed=5)
    ours, _, _ = build_model(toy_data, arch_name("postln", size), seed=5)
    a, b = theirs.state_dict(), ours.state_dict()
    assert same_state(a, b)


def test_verdict_needs_the_whole_interval_on_one_side():
    assert B.target_reached([0.991, 1.02], 0.99, at_least=True) == "met"
    assert B.target_reached([0.95, 0.989], 0.99, at_least=True) == "missed"
    assert B.target_reached([0.98, 1.02], 0.99, at_least=True) == "unresolved"
    assert B.target_reached([-1.0, 0.9], 1.0, at_least=False) == "met"
    assert B.target_reached([1.1, 3.0], 1.0, at_least=False) == "missed"
    assert B.target_reached([0.5, 1.5], 1.0, at_least=False) == "unresolved"


def test_paired_ratios_pair_update_by_update():
    # a slow machine phase (x3) hits both partners of a pair alike and cancels
    base = [1.0, 3.0, 1.0, 3.0, 1.0]
    other = [0.5, 1.5, 0.5, 1.5, 0.5]
    r = B.paired(base, other)
    assert r["median"] == 2.0 and r["ci95"] == [2.0, 2.0] and r["n"] == 5


def test_throughput_verdicts_on_hand_made_timings():
    work = {"aten_calls": 100, "output_elements": 1000, "matmul_flops": 10}
    seconds = {
        "fairseq_postln": [1.0, 2.0, 1.0, 2.0],
        "postln": [1.0, 2.0, 1.0, 2.0],                     # ratio 1.0 every update: met (>= 0.99)
        "deepnorm": [1 / 0.9, 2 / 0.9, 1 / 0.9, 2 / 0.9],   # ratio 0.9 every update: missed (>= 0.97)
        "keel": [1 / 0.8, 2 / 0.8, 1 / 0.8, 2 / 0.8],        # ratio 0.8: no target
        "fairseq_preln": [1.0, 1.0, 1.0, 1.0],
        "preln": [1 / 0.9, 1 / 0.9, 1 / 1.1, 1 / 1.1],       # ratios 0.9, 0.9, 1.1, 1.1: CI [0.9, 1.1]
    }
    works = {name: dict(work) for name in seconds}
    works["keel"] = {"aten_calls": 110, "output_elements": 1000, "matmul_flops": 10}
    r = B.throughput_results(seconds, works, ["postln", "preln", "deepnorm", "keel"], "transformer", min_pairs=4)
    assert (r["postln"]["median"], r["postln"]["verdict"]) == (1.0, "met")
    assert r["deepnorm"]["median"] == pytest.approx(0.9) and r["deepnorm"]["verdict"] == "missed"
    assert r["preln"]["median"] == pytest.approx(1.0) and r["preln"]["ci95"] == pytest.approx([0.9, 1.1])
    assert r["preln"]["verdict"] == "unresolved"
    assert r["keel"]["median"] == pytest.approx(0.8) and "verdict" not in r["keel"]
    assert r["keel"]["work_ratio"] == {"aten_calls": 1.1, "output_elements": 1.0, "matmul_flops": 1.0}
    assert r["keel"]["seconds_per_update"] == pytest.approx((1 / 0.8 + 2 / 0.8) / 2)
    assert r["preln"]["baseline"] == "fairseq transformer --encoder-normalize-before --decoder-normalize-before"
    # every variant also against fairseq's Post-LN, update by update: Pre-LN's ratios 0.9, 1.8, 1.1, 2.2
    assert r["preln"]["to_postln"]["median"] == pytest.approx((1.1 + 1.8) / 2)
    assert r["keel"]["to_postln"]["median"] == pytest.approx(0.8)


def test_grad_norm_overhead_on_hand_made_timings():
    seconds = {"off": [1.0] * 4, "interval_1": [1.02] * 4, "interval_100": [1.03] * 4}
    r = B.overhead_results(seconds, {"interval_1": 0.08, "interval_100": 0.0}, min_pairs=4)
    assert r["interval_1"]["overhead_percent"] == pytest.approx(2.0)
    assert r["interval_1"]["verdict"] == "met"        # 2 % <= 5 %
    assert r["interval_100"]["verdict"] == "missed"   # 3 % > 1 %
    assert r["interval_1"]["hook_percent"] == pytest.approx(100 * 0.08 / 4.0)  # 0.08 s of 4.08 s
    assert r["interval_100"]["hook_percent"] == 0


def test_too_few_pairs_give_no_verdict():
    """--quick times 4 updates per configuration: an interval of 4 ratios, one of them 11.9 from an
    update slowed by another process, spans about 0.93-11.9 and decides nothing."""
    seconds = {"fairseq_postln": [1.0, 1.0, 11.9, 1.0], "postln": [1.07, 1.0, 1.0, 1.0]}
    work = {name: {"aten_calls": 1, "output_elements": 1, "matmul_flops": 1} for name in seconds}
    r = B.throughput_results(seconds, work, ["postln"], "transformer")["postln"]
    assert r["n"] == 4 and r["verdict"] == f"not judged: 4 pairs (< {B.MIN_PAIRS})"
    assert r["ci95"][1] - r["ci95"][0] > 1  # the interval is wide indeed
    over = B.overhead_results({"off": [1.0] * 4, "interval_1": [1.0] * 4, "interval_100": [1.0] * 4},
                              {"interval_1": 0.0, "interval_100": 0.0})
    assert over["interval_1"]["verdict"].startswith("not judged")
    text = B.summary({"throughput": {"tiny": {"postln": {**r, "work_ratio": {k: 1.0 for k in work["postln"]}}}},
                      "grad_norm_overhead": over})
    assert "4 paired updates per configuration: too few for the intervals to say anything" in text
    seconds = {"fairseq_postln": [1.0] * B.MIN_PAIRS, "postln": [1.0] * B.MIN_PAIRS}
    assert B.throughput_results(seconds, work, ["postln"], "transformer")["postln"]["verdict"] == "met"


def test_autocast_speedup_on_hand_made_timings():
    seconds = {"postln_float32": [1.5] * 4, "postln_bf16": [1.0] * 4,   # 1.5x faster: met (>= 1.4)
               "preln_float32": [1.0, 2.0] * 2, "preln_bf16": [2.0, 4.0] * 2}  # twice as slow: missed
    r = B.autocast_results(seconds, ["postln", "preln"], B.AUTOCAST_TARGETS["tiny"], min_pairs=4)
    assert (r["postln"]["median"], r["postln"]["verdict"]) == (1.5, "met")
    assert (r["preln"]["median"], r["preln"]["verdict"]) == (0.5, "missed")
    assert (r["preln"]["seconds_per_update_float32"], r["preln"]["seconds_per_update_bf16"]) == (1.5, 3.0)
    assert "target" not in B.autocast_results(seconds, ["postln"])["postln"]  # a size without a target
    text = B.summary({"throughput": {}, "grad_norm_overhead": {}, "autocast": {
        "cpu_bf16_instructions": [], "emulated": True, "max_tokens": 1024, "sizes": {"tiny": r}}})
    assert ("--cpu-autocast-bf16 tiny preln (1024 tokens, emulated: this CPU has no bfloat16 instructions): "
            "float32 / bf16 time 0.500 [0.500, 0.500] (1.500 / 3.000 s/update) (target >= 1.4: missed)") in text
    assert "4 paired updates per configuration: too few" in text


def test_fork_server_saving_in_the_summary():
    startup = {"runs": 3, "updates": 2, "server_start_seconds": 5.0, "wall_ratio": 1.8, "cpu_ratio": 1.6,
               "per_run": B.paired([10.0, 10.0, 10.0], [4.0, 5.0, 5.0])}
    text = B.summary({"throughput": {}, "grad_norm_overhead": {}, "startup": startup})
    assert ("fork server, 3 runs of 2 updates: fresh processes / forked (the server's 5.0 s start included): "
            "wall time 1.80x, CPU time 1.60x; per run 2.00x [2.00, 2.50]") in text


def test_sweep_cells_saving_on_its_own_page():
    every = [{"cpu_seconds": c, "validations": 3, "final_valid_nll": 3.878} for c in (41.6, 40.0)]
    last = [{"cpu_seconds": c, "validations": 1, "final_valid_nll": 3.878} for c in (40.0, 40.0)]
    cells = {"runs": 2, "arms": {"every_epoch": every, "last_update": last}, "cpu_ratio": 81.6 / 80.0,
             "per_run": B.paired([41.6, 40.0], [40.0, 40.0]), "same_final_nll": True}
    result = {"data": "/x/synthetic-bin", "steps": 20, "reps": 5, "max_tokens": 2048, "device": "cpu",
              "torch_threads": 2, "cpu_count": 2, "fairseq_args": [], "throughput": {}, "grad_norm_overhead": {},
              "diagnostics_overhead": {}, "sweep_cells": cells, "total_seconds": 170.0}
    md = B.page_markdown(result).split("\n")
    assert md[0] == "device cpu, 2 torch threads on 2 cores; 170 s in all."  # no timed updates, no batches
    assert md[2] == ("- sweep cells (the all-architecture map's, Post-LN lr 1e-3), 2 runs of each: validated at every "
                     "epoch's end (3 validations) / at the last update only (1): CPU time 1.020x; per run 1.020x "
                     "[1.000, 1.040]; final validation NLL the same in every pair")
    cells["same_final_nll"] = False
    assert B.summary(result).endswith("final validation NLL DIFFERS")


def test_the_results_page_gives_settings_load_table_and_one_item_per_measurement():
    r = B.throughput_results({"fairseq_postln": [1.0] * 4, "postln": [1.0] * 4},
                             {n: {"aten_calls": 1, "output_elements": 1, "matmul_flops": 1} for n in ("fairseq_postln", "postln")},
                             ["postln"], "transformer", min_pairs=4)
    result = {"data": "/x/synthetic-bin", "steps": 2, "reps": 2, "max_tokens": 400, "device": "cpu", "torch_threads": 2,
              "cpu_count": 2, "fairseq_args": [], "throughput": {"tiny": r}, "grad_norm_overhead": {},
              "load_average": {"start": 1.5, "end": 2.25}, "total_seconds": 61.4, "fig3_analysis_seconds": 70.2}
    md = B.page_markdown(result).split("\n")
    assert md[0] == ("2 x 2 timed updates per configuration, batches of 400 tokens, data `synthetic-bin`, device cpu, "
                     "2 torch threads on 2 cores; load (1-minute average) 1.50 at the start, 2.25 at the end; 61 s in all.")
    assert md[2].startswith("| size | arch |") and md[4].startswith("| tiny | postln | 1.000 | 1.000 [1.000, 1.000] |")
    assert md[5] == "" and md[6].startswith("- 4 paired updates per configuration: too few")
    assert md[7:] == ["- Fig. 3 analysis (defaults): 70 s", ""]


def test_diagnostics_overhead_on_hand_made_timings():
    seconds = {"off": [1.0, 2.0, 1.0, 2.0],
               "diagnostics_interval_1": [1.5, 3.0, 1.5, 3.0],             # 1.5 times every update
               "diagnostics_first_20_interval_50": [1.0, 2.0, 1.2, 2.4]}   # ratios 1, 1, 1.2, 1.2
    inside = {"diagnostics_interval_1": 2.7, "diagnostics_first_20_interval_50": 0.66}
    logged = {"diagnostics_interval_1": 4, "diagnostics_first_20_interval_50": 2}
    r = B.diagnostics_overhead_results(seconds, inside, logged)
    every, study = r["interval_1"], r["first_20_interval_50"]
    assert every["flags"] == "--log-diagnostics --diagnostics-interval 1"
    assert study["flags"] == "--log-diagnostics --diagnostics-first 20 --diagnostics-interval 50"
    assert every["time_ratio"]["median"] == pytest.approx(1.5)
    assert every["time_ratio"]["ci95"] == pytest.approx([1.5, 1.5])
    assert every["overhead_percent"] == pytest.approx(50.0)
    assert study["time_ratio"]["median"] == pytest.approx(1.1)
    assert study["overhead_percent_ci95"] == pytest.approx([0, 20])
    # the share of the time with the diagnostics spent inside them: 2.7 s of 9 s, 0.66 s of 6.6 s
    assert every["inside_percent"] == pytest.approx(30.0) and study["inside_percent"] == pytest.approx(10.0)
    assert (study["logged_updates"], study["timed_updates"]) == (2, 4)
    assert not {"target_percent", "verdict"} & set(every)  # no target: reported, not judged
    text = B.summary({"throughput": {}, "grad_norm_overhead": {}, "diagnostics_overhead": r})
    assert ("--log-diagnostics --diagnostics-interval 1: +50.0 % time [+50.0, +50.0] (time with / without 1.500; "
            "no target); 4 of 4 timed updates diagnosed; inside the diagnostics' own work: 30.00 % of the time") in text
    assert "4 paired updates per configuration: too few" in text


def test_the_results_page_of_the_overheads_alone_has_no_table():
    r = B.diagnostics_overhead_results({"off": [1.0] * 4, "diagnostics_interval_1": [1.2] * 4,
                                        "diagnostics_first_20_interval_50": [1.0] * 4},
                                       {"diagnostics_interval_1": 0.8, "diagnostics_first_20_interval_50": 0.0},
                                       {"diagnostics_interval_1": 4, "diagnostics_first_20_interval_50": 4})
    result = {"data": "/x/synthetic-bin", "steps": 2, "reps": 2, "max_tokens": 400, "device": "cpu", "torch_threads": 2,
              "cpu_count": 2, "fairseq_args": [], "throughput": {}, "grad_norm_overhead": {}, "diagnostics_overhead": r,
              "total_seconds": 30.0}
    md = B.page_markdown(result).split("\n")
    assert md[0].startswith("2 x 2 timed updates per configuration") and md[1] == ""
    assert md[2].startswith("- --log-diagnostics --diagnostics-interval 1: +20.0 % time [+20.0, +20.0] (time with / "
                            "without 1.200; no target); 4 of 4 timed updates diagnosed; inside the diagnostics' own "
                            "work: 16.67 % of the time")
    assert md[3].startswith("- --log-diagnostics --diagnostics-first 20 --diagnostics-interval 50: +0.0 % time")
    assert not any(line.startswith("|") for line in md)


class _Clock:
    """A stand-in for the time module: each reading of perf_counter is one second after the last."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 1.0
        return self.now

    def time(self):
        return self.now


class _Trainer:
    """A trainer whose task logs on every update: the diagnostics (0.25 s of their own per update, as
    ``Diagnostics.overhead`` sums it) or the grad-norm logger."""

    def __init__(self, extra):
        diagnostics = gradnorm = None
        if "--log-diagnostics" in extra:
            diagnostics = types.SimpleNamespace(overhead=0.0, write=lambda rec: None)
        if "--log-grad-norms" in extra:
            gradnorm = types.SimpleNamespace(measure=lambda: None, record=lambda norms: None)
        self.task = types.SimpleNamespace(diagnostics=diagnostics, grad_norm_logger=gradnorm)

    def train_step(self, samples):
        if self.task.diagnostics:
            self.task.diagnostics.overhead = 0.25
            self.task.diagnostics.write({})
        if self.task.grad_norm_logger:
            self.task.grad_norm_logger.record(self.task.grad_norm_logger.measure())


def test_the_seconds_inside_the_logging_are_those_of_the_timed_updates(monkeypatch, tmp_path):
    monkeypatch.setattr(B, "time", _Clock())
    monkeypatch.setattr(B, "make_trainer",
                        lambda data, arch, extra, *args: (_Trainer(extra), iter([{"ntokens": 8}] * 3)))
    monkeypatch.setattr(B, "work_counts", lambda trainer, batch: trainer.train_step([batch]) or {})  # a 6th update
    configs = {"off": ("a", []), "diag": ("a", ["--log-diagnostics"]), "gnorm": ("a", ["--log-grad-norms"])}
    seconds, inside, _, logged = B.measure(configs, "d", 2, 2, lambda msg: None, 8, "cpu", tmp_path)
    # 4 timed updates of the 6 (the first warms up, the last counts the work): in each, the task's own
    # 0.25 s and the 1 s that writing the record took on this clock; the grad-norm hook's two calls, 1 s each
    assert inside == {"off": 0.0, "diag": 4 * 1.25, "gnorm": 4 * 2.0}
    assert logged == {"off": 0, "diag": 4, "gnorm": 4}
    assert seconds["diag"] == [3.0] * 4 and seconds["off"] == [1.0] * 4


def test_no_throughput_and_no_overhead_leave_their_measurements_out(monkeypatch, tmp_path, capsys):
    calls = []

    def measure(configs, data, steps, reps, log, max_tokens, device, save_dir, prepare=None):
        calls.append(configs)
        work = {"aten_calls": 1, "output_elements": 1, "matmul_flops": 1}
        return ({n: [2.0 if n.startswith("diagnostics") else 1.0] * steps * reps for n in configs},
                {n: 0.0 for n in configs}, {n: dict(work) for n in configs}, {n: steps * reps for n in configs})

    monkeypatch.setattr(B, "measure", measure)
    monkeypatch.setattr(B.logging, "disable", lambda level: None)  # main's, process-wide
    data = tmp_path / "bin"
    data.mkdir()
    (data / "dict.de.txt").write_text("")

    def bench_json(*flags):
        calls.clear()
        out = tmp_path / "bench.json"
        assert B.main(["--data", str(data), "--out", str(out), "--sizes", "tiny", "--no-autocast", "--no-analysis",
                       "--steps", "2", "--reps", "2", *flags]) == 0
        return json.loads(out.read_text())

    result = bench_json("--no-throughput")
    assert [set(c) for c in calls] == [{"off", "interval_1", "interval_100", "diagnostics_interval_1",
                                        "diagnostics_first_20_interval_50"}]
    task = ["--task", "translation_lnpos"]
    assert calls[0]["off"] == ("transformer_preln_tiny", task)
    assert calls[0]["diagnostics_first_20_interval_50"] == ("transformer_preln_tiny", task + [
        "--log-diagnostics", "--diagnostics-first", "20", "--diagnostics-interval", "50"])
    assert result["throughput"] == {} and set(result["grad_norm_overhead"]) == {"interval_1", "interval_100"}
    assert result["diagnostics_overhead"]["interval_1"]["time_ratio"]["median"] == 2.0
    result = bench_json("--no-overhead", "--variants", "preln")
    assert [set(c) for c in calls] == [{"fairseq_postln", "fairseq_preln", "preln"}]
    assert result["grad_norm_overhead"] == result["diagnostics_overhead"] == {}
    assert set(result["throughput"]) == {"tiny"}
    with pytest.raises(LnposError, match="nothing to measure: every measurement is turned off"):
        bench_json("--no-throughput", "--no-overhead")  # and --no-autocast --no-analysis, no --startup
    assert calls == []
    with pytest.raises(SystemExit):
        B.parse_args(["--help"])
    assert "--no-overhead skip measuring the overheads of --log-grad-norms and of --log-diagnostics" in \
        " ".join(capsys.readouterr().out.split())


def test_the_matmul_flop_count_is_the_hand_count():
    """One update of two linear layers, x (5 x 3) -> 4 -> 2, each matmul 2 m k n FLOPs: forward 5x3 by 3x4
    (120) and 5x4 by 4x2 (80); backward the second layer's weight gradient (2x5 by 5x4: 80) and its input's
    (5x2 by 2x4: 80), the first layer's weight gradient (4x5 by 5x3: 120); not the input's gradient (the
    data needs none, as a batch's tokens need none). 480 in all; biases, loss and step add no matmul."""
    import torch

    assert B.mm_flops(5, 3, 4) == 2 * 5 * 3 * 4 == 120
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(batches):
        opt.zero_grad()
        model(batches[0]).square().sum().backward()
        opt.step()

    counted = B.work_counts(types.SimpleNamespace(train_step=train_step), torch.randn(5, 3))
    hand = (B.mm_flops(5, 3, 4) + B.mm_flops(5, 4, 2)  # forward
            + B.mm_flops(2, 5, 4) + B.mm_flops(5, 2, 4) + B.mm_flops(4, 5, 3))  # backward
    assert counted["matmul_flops"] == hand == 480


def test_achieved_flops_against_the_measured_peak():
    assert B.achieved({"matmul_flops": 10 ** 9}, 0.5, 4e9) == {"flops_per_second": 2e9, "peak_fraction": 0.5}
    assert B.achieved({"matmul_flops": 10 ** 9}, 0.5, None)["peak_fraction"] is None
    peak = B.matmul_peak(n=64, reps=3)
    assert peak["flops_per_second"] == B.mm_flops(64, 64, 64) / peak["best_seconds"] and peak["dtype"] == "float32"
    work = {"aten_calls": 1, "output_elements": 1, "matmul_flops": 3 * 10 ** 9}
    r = B.throughput_results({"fairseq_postln": [1.0] * 4, "postln": [1.5] * 4}, {"fairseq_postln": work, "postln": work},
                             ["postln"], "transformer", min_pairs=4, peak=1e10)
    assert r["postln"]["achieved"] == {"flops_per_second": 2e9, "peak_fraction": 0.2}
    result = {"throughput": {"tiny": r}, "grad_norm_overhead": {},
              "matmul_peak": {"n": 1024, "reps": 20, "device": "cpu", "threads": 2, "flops_per_second": 1e10}}
    lines = B.summary(result).split("\n")
    assert lines[0].endswith("| matmul FLOPs | matmul GFLOP/s (of peak) |")
    assert lines[2].startswith("| tiny | postln | 1.500 |") and lines[2].endswith("| 2.0 (20 %) |")
    assert lines[3].startswith("matmul GFLOP/s: each update's matmul FLOPs") and "10.0 GFLOP/s" in lines[3]
