"""The benchmark's quick mode writes its JSON (no timing assertions: timings are not tested)."""
import json
import subprocess
import sys

from conftest import REPO, toy_data  # noqa: F401
from fairseq_lnpos.bench import paired, verdict


def bench(*args):
    return subprocess.run([str(REPO / "scripts" / "bench.sh"), *map(str, args)], capture_output=True, text=True,
                          env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})


def test_quick_benchmark_writes_ratios_for_every_arch(toy_data, tmp_path):
    out = tmp_path / "bench.json"
    result = bench("--quick", "--data", toy_data, "--max-tokens", 400, "--out", out)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["throughput"]) == {"tiny"}
    for arch in ("postln", "preln", "deepnorm", "keel"):
        r = data["throughput"]["tiny"][arch]
        # 2 reps x 2 updates, each paired with fairseq's update on the same batch
        assert r["n"] == 4 and r["ci95"][0] <= r["median"] <= r["ci95"][1] and r["seconds_per_update"] > 0
        assert r["baseline"].startswith("fairseq transformer")
        if arch == "keel":  # the issue sets no target for Keel
            assert "target" not in r and "verdict" not in r
        else:
            assert r["target"] == (0.97 if arch == "deepnorm" else 0.99)
            assert r["verdict"] == verdict(r["ci95"], r["target"], True)
    assert "--encoder-normalize-before" in data["throughput"]["tiny"]["preln"]["baseline"]
    # the work counts are exact: Post-LN and Pre-LN are fairseq's model, DeepNorm adds residual
    # multiplies, Keel adds LayerNorms; none of them adds a matmul
    work = {a: data["throughput"]["tiny"][a]["work_ratio"] for a in ("postln", "preln", "deepnorm", "keel")}
    assert work["postln"] == work["preln"] == {"aten_calls": 1.0, "output_elements": 1.0, "matmul_flops": 1.0}
    assert work["deepnorm"]["matmul_flops"] == work["keel"]["matmul_flops"] == 1.0
    assert 1.0 < work["deepnorm"]["output_elements"] < work["keel"]["output_elements"] < 1.1
    assert set(data["grad_norm_overhead"]) == {"interval_1", "interval_100"}
    hook = {k: v["hook_percent"] for k, v in data["grad_norm_overhead"].items()}
    assert hook["interval_1"] > 0 and hook["interval_100"] == 0  # 4 updates: never a 100th
    assert "| tiny | keel |" in result.stdout


def test_bad_size_is_a_one_line_error(toy_data, tmp_path):
    result = bench("--sizes", "huge", "--data", toy_data, "--out", tmp_path / "b.json")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("bench.sh: error: unknown size or variant ['huge']")
    assert not (tmp_path / "b.json").exists()


def test_verdict_needs_the_whole_interval_on_one_side():
    assert verdict([0.991, 1.02], 0.99, at_least=True) == "met"
    assert verdict([0.95, 0.989], 0.99, at_least=True) == "missed"
    assert verdict([0.98, 1.02], 0.99, at_least=True) == "unresolved"
    assert verdict([-1.0, 0.9], 1.0, at_least=False) == "met"
    assert verdict([1.1, 3.0], 1.0, at_least=False) == "missed"
    assert verdict([0.5, 1.5], 1.0, at_least=False) == "unresolved"


def test_paired_ratios_pair_update_by_update():
    # a slow machine phase (x3) hits both partners of a pair alike and cancels
    base = [1.0, 3.0, 1.0, 3.0, 1.0]
    other = [0.5, 1.5, 0.5, 1.5, 0.5]
    r = paired(base, other)
    assert r["median"] == 2.0 and r["ci95"] == [2.0, 2.0] and r["n"] == 5
