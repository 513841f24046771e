"""The fork server: a forked run is fairseq-train as a fresh process would be (its argv, environment,
process group, log, exit status), one failing or killed run does not stop the server, and the grid
gives the same results with it as without it."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_lnpos import forkserver
from fairseq_lnpos.common import USER_DIR
from fairseq_lnpos.errors import LnposError, _excepthook

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toydata import make_toy_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUN = "iwslt-preln-adam-lr5e-4-step8"


def serve(tmp_path, monkeypatch, *behaviours, env=None):
    """Serve one request per behaviour (a stand-in for fairseq-train's ``cli_main``), in order, from
    a server forked off this process; (answers, log texts)."""
    fairseq_cli_train = pytest.importorskip("fairseq_cli.train")
    # request i runs "--seed i": each forked process is a copy of the server, which calls nothing
    monkeypatch.setattr(fairseq_cli_train, "cli_main", lambda: behaviours[int(sys.argv[-1])]())
    monkeypatch.setattr(sys, "excepthook", _excepthook)  # the plugin's, as the server installs it
    requests, logs = [], []
    for i, _ in enumerate(behaviours):
        logs.append(tmp_path / f"run{i}.log")
        logs[-1].write_text("# grid: earlier launch\n")
        requests.append(json.dumps({"argv": ["DATA", "--seed", str(i)], "log": str(logs[-1]),
                                    "env": env or {"OMP_NUM_THREADS": "1", "ONLY": "this"}}) + "\n")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server: serves, then ends without running this process's clean-ups
        os.close(r)
        try:  # the standard streams of a process of its own, not pytest's capture
            sys.stdout, sys.stderr = (open(fd, "w", closefd=False) for fd in (1, 2))
            forkserver.serve(requests, w)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        answers = [json.loads(line) for line in f]
    os.waitpid(pid, 0)
    return answers, [log.read_text() for log in logs]


def test_a_forked_run_has_fairseq_trains_argv_environment_group_and_log(tmp_path, monkeypatch):
    def train():
        import torch

        print(sys.argv, sorted(os.environ.items()), os.getpgid(0) == os.getpid(), torch.get_num_threads())
        print("to stderr", file=sys.stderr)

    answers, logs = serve(tmp_path, monkeypatch, train)
    ready, started, ended = answers
    assert ready["ready"] != started["started"] == ended["ended"]
    assert ended["returncode"] == 0 and ended["cpu_seconds"] >= 0 and ended["peak_rss_mb"] > 0
    first, *printed = logs[0].splitlines()  # stdout is buffered, stderr is not: either may come first
    assert first == "# grid: earlier launch"
    argv, env = ['fairseq-train', 'DATA', '--seed', '0'], [('OMP_NUM_THREADS', '1'), ('ONLY', 'this')]
    assert sorted(printed) == [f"{argv} {env} True 1", "to stderr"]


def test_each_run_ends_alone_with_the_exit_status_of_a_fresh_process(tmp_path, monkeypatch):
    def usage():
        sys.exit(3)

    def plugin_error():
        raise LnposError("--thing must be at least 1")

    def crash():
        raise RuntimeError("boom")

    def killed():
        os.kill(os.getpid(), signal.SIGKILL)

    def interrupted():
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: KeyboardInterrupt, as in a fresh process

    answers, logs = serve(tmp_path, monkeypatch, usage, plugin_error, crash, killed, interrupted, lambda: None)
    assert [a["returncode"] for a in answers if "ended" in a] == [3, 2, 1, -signal.SIGKILL, 1, 0]
    assert logs[1].endswith("fairseq-train: error: --thing must be at least 1\n")
    assert "Traceback" in logs[2] and logs[2].endswith("RuntimeError: boom\n")
    assert "KeyboardInterrupt" in logs[4]
    assert logs[5] == "# grid: earlier launch\n"


def test_only_fairseq_train_on_the_cpu_is_forked():
    train = [str(Path(sys.executable).parent / "fairseq-train"), "DATA"]
    assert forkserver.forkable(train, None)
    assert not forkserver.forkable(train, "0")  # a GPU slot
    assert not forkserver.forkable([sys.executable, "-c", "pass"], None)


@pytest.mark.slow
def test_the_server_forks_fairseq_train_and_outlives_a_failing_or_killed_run(tmp_path):
    data = make_toy_data(tmp_path / "toy")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = [data, "--user-dir", USER_DIR, "--task", "translation_lnpos", "--arch", "transformer_tiny", "--cpu",
            "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300", "--num-workers", "0"]
    procs = []

    def popen(cmd, env, **kw):
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True, **kw))
        return procs[-1]

    with open(tmp_path / "server.log", "wb") as errors:
        server = forkserver.ForkServer(popen, env, errors)
    try:
        done = server.spawn([*argv, "--max-update", 2, "--save-dir", tmp_path / "a"], env, tmp_path / "a.log")
        assert done.wait() == 0 and done.peak_rss_mb > 0
        assert (tmp_path / "a" / "checkpoint_last.pt").exists()
        bad = server.spawn([*argv, "--log-grad-norms", "--grad-norm-interval", -1, "--save-dir", tmp_path / "b"],
                           env, tmp_path / "b.log")
        assert bad.wait() == 2
        assert (tmp_path / "b.log").read_text().splitlines()[-1] == \
            "fairseq-train: error: --grad-norm-interval must be at least 1 (got -1); 0 means --log-interval"
        long = server.spawn([*argv, "--max-update", 10 ** 6, "--save-dir", tmp_path / "c"], env, tmp_path / "c.log")
        os.killpg(long.pid, signal.SIGTERM)  # its group exists once the server says it started
        assert long.wait() == -signal.SIGTERM and server.alive
        again = server.spawn([*argv, "--max-update", 3, "--save-dir", tmp_path / "a"], env, tmp_path / "a.log")
        assert again.wait() == 0
        assert "Loaded checkpoint" in (tmp_path / "a.log").read_text()  # resumed from checkpoint_last.pt
        server.proc.kill()  # a run outlives no server: it ends with it
        with pytest.raises(forkserver.ServerGone):
            server.spawn([*argv, "--save-dir", tmp_path / "d"], env, tmp_path / "d.log")
    finally:
        server.close()


def grid(*args):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    return subprocess.run([str(REPO / "scripts" / "grid.sh"), "run", "--only", RUN, "--arch-size", "tiny",
                           "--max-epoch", "2", "--set", "max_tokens=512", "--set", "batch_tokens=512", "--no-bleu",
                           *map(str, args)], capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_the_grid_gives_the_same_records_with_and_without_the_fork_server(tmp_path):
    data = make_toy_data(tmp_path / "toy")
    records = {}
    for name, flags in (("forked", []), ("fresh", ["--no-fork-server"])):
        out = tmp_path / name
        result = grid("--data", data, "--out", out, *flags)
        assert result.returncode == 0, result.stderr[-2000:]
        run = out / RUN / "seed1"
        done = json.loads((run / "DONE.json").read_text())
        assert done["status"] == "finished" and done["precision"] == "float32" and done["peak_rss_mb"] > 0
        evals = [json.loads((run / "eval" / f"epoch{e}.json").read_text()) for e in (1, 2)]
        records[name] = (done["initial_loss"], done["final_valid_loss"], done["updates"], evals)
    assert records["forked"] == records["fresh"]
