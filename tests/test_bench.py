"""The benchmark's quick mode writes its JSON (no timing assertions: timings are not tested)."""
import json
import subprocess
import sys

from conftest import REPO, toy_data  # noqa: F401


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
        assert len(r["per_rep"]) == 2 and r["min"] <= r["median"] <= r["max"] and r["tokens_per_s"] > 0
        assert r["baseline"].startswith("fairseq transformer")
    assert "--encoder-normalize-before" in data["throughput"]["tiny"]["preln"]["baseline"]
    assert set(data["grad_norm_overhead"]) == {"interval_1", "interval_100"}
    assert "| tiny | keel |" in result.stdout


def test_bad_size_is_a_one_line_error(toy_data, tmp_path):
    result = bench("--sizes", "huge", "--data", toy_data, "--out", tmp_path / "b.json")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("bench.sh: error: unknown size or variant ['huge']")
    assert not (tmp_path / "b.json").exists()
