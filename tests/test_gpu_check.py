"""The GPU check (scripts/gpu_check.sh, scripts/tools/gpu_check.py) without a GPU: the commands each
step would run, its refusals (what is not installed, no GPU), a step that resumes, a training that fails,
and the timing of a grid it runs."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TOOLS, tool
from fairseq_lnpos.experiments import runs as R
from fairseq_lnpos.variants import VARIANTS

G = tool("gpu_check")


def steps(todo):
    """{step number: its items} of a plan (the titles start with the number)."""
    return {int(title.split(".")[0]): items for title, items in todo if title and title[0].isdigit() and "." in title}


def commands(items):
    return [i for i in items if isinstance(i, G.Command)]


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_step_five_runs_the_table_rows_the_paper_compares():
    rows = [R.BY_NAME[n] for n in G.m30k_rows()]
    assert {(r.ln, r.optimizer, r.warmup, r.schedule) for r in rows} == {
        ("postln", "adam", 0, "inverse_sqrt"), ("postln", "adam", 500, "inverse_sqrt"),
        ("preln", "adam", 0, "inverse_sqrt"), ("postln", "radam", 0, "linear"),
        ("deepnorm", "adam", 0, "inverse_sqrt"), ("keel", "adam", 0, "inverse_sqrt"),
        ("admin", "adam", 0, "inverse_sqrt")}
    assert all(r.dataset == "multi30k" and r.lr == 5e-4 for r in rows) and len(rows) == 7
    assert R.BY_NAME[G.alone_row()].ln == "preln" and G.alone_row() in G.m30k_rows()
    assert all(name in R.BY_NAME for name in G.GRID_ROWS)


def test_plan_of_every_step(tmp_path):
    out = tmp_path / "out"
    todo = G.plan(out, range(1, 8), m30k_orig="/orig", runs_per_gpu="3", evaluators="2", eval_every="3")
    by_step = steps(todo)
    assert sorted(by_step) == [1, 2, 3, 4, 5, 6, 7]
    # every command is a fairseq console script, a module of this package or a script of scripts/tools/
    # that exists
    for _, items in todo:
        for c in commands(items):
            if c.argv[0] == sys.executable and c.argv[1] == "-m":
                assert importlib.util.find_spec(c.argv[2]) is not None, c.argv
            elif c.argv[0] == sys.executable:
                assert Path(c.argv[1]).parent == TOOLS and Path(c.argv[1]).is_file(), c.argv
            else:
                assert Path(c.argv[0]).name == "fairseq-train", c.argv
    one = commands(by_step[1])
    assert [c.argv.count("--fp16") + 2 * c.argv.count("--amp") for c in one] == [0, 1, 2] * 2
    assert all(not c.check and c.log.parent == out and flag(c.argv, "--save-dir").startswith(str(out)) for c in one)
    assert [i.args[1] for i in by_step[1] if isinstance(i, G.Call)] == ["transformer_postln_tiny", "transformer_keel_tiny"]
    two = commands(by_step[2])
    assert [flag(c.argv, "--arch") for c in two] == [f"transformer_{v}_tiny" for v in VARIANTS]
    assert all(flag(c.argv, "--optimizer") == "radam" and "--fp16" in c.argv and flag(c.argv, "--max-update") == "300"
               and flag(c.argv, "--log-format") == "json" for c in two)
    four = commands(by_step[4])
    assert [Path(c.argv[1]) for c in four] == [TOOLS / "bench.py"] * 2 and all(flag(c.argv, "--device") == "cuda"
                                                                               for c in four)
    grid5 = commands(by_step[5])[0]
    assert flag(grid5.argv, "--only").split(",") == G.m30k_rows() and grid5.timed == out / "m30k-grid"
    assert (flag(grid5.argv, "--runs-per-gpu"), flag(grid5.argv, "--evaluators")) == ("3", "2")
    assert (flag(grid5.argv, "--seeds"), flag(grid5.argv, "--eval-every")) == ("1,2", "3")
    assert flag(commands(by_step[6])[0].argv, "--only") == G.alone_row()
    assert commands(by_step[7])[0].argv[3:6] == ["sweep", "--depth-map", "--real"]
    # the Multi30k data is prepared once, from MULTI30K_ORIG, before steps 5 to 7
    prep = [c for _, items in todo for c in commands(items) if "fairseq_lnpos.data.multi30k" in c.argv]
    assert len(prep) == 1 and flag(prep[0].argv, "--orig") == "/orig"


def test_training_commands_parse_with_fairseq(tmp_path):
    from fairseq_lnpos import fairseq_build

    by_step = steps(G.plan(tmp_path, [1, 2]))
    for c in (commands(by_step[1])[2], commands(by_step[2])[0]):  # amp Post-LN; RAdam without warm-up
        args = fairseq_build.parse(c.argv[1:])
        assert args.max_tokens == 4096 and args.user_dir is not None
    assert args.optimizer == "radam" and args.lr_scheduler == "warmup_inverse_sqrt" and args.fp16


def test_without_multi30k_steps_five_to_seven_are_skipped(tmp_path):
    todo = G.plan(tmp_path, [5, 6])
    assert [title for title, _ in todo] == ["5, 6, 7: skipped: set MULTI30K_ORIG=DIR to run the Multi30k grid"]
    assert G.plan(tmp_path, [1])[0][0] == "synthetic corpus" and len(steps(G.plan(tmp_path, [1]))) == 1


def test_no_gpu_is_one_line(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert G.main([str(tmp_path / "out"), "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check.sh: error: torch ") and "sees no GPU here" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_step_is_given_each_call(tmp_path, capsys):
    assert G.main([str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("gpu_check.sh: error: give the step to run, 1 to 7 (each is its own call and "
                                       "resumes: gpu_check.sh OUT 1, then gpu_check.sh OUT 2, ...)\n")


def test_what_is_not_installed_is_named_in_one_line(tmp_path, capsys):
    absent = {"fairseq", "pandas", "matplotlib"}
    find = lambda name: None if name in absent else object()  # noqa: E731
    assert G.missing([1], find=find, program=lambda name: True) == [G.FAIRSEQ_PIP]
    assert G.missing([3], find=find, program=lambda name: True) == [G.FAIRSEQ_PIP, "pandas", "matplotlib"]
    assert G.missing([7], find=lambda name: object(), program=lambda name: False) == ["fairseq-train"]
    with pytest.raises(G.LnposError) as e:
        G.check_installed([5], find=find, program=lambda name: True)
    assert str(e.value) == (f"{G.FAIRSEQ_PIP}, pandas, matplotlib are not installed for {sys.executable}: install with "
                            f"{sys.executable} -m pip install '{G.FAIRSEQ_PIP}' pandas matplotlib (or everything the "
                            f"project needs: {sys.executable} -m pip install -e . in the repository)")


def test_a_bare_python_is_told_what_to_install(tmp_path):
    """A Python with none of the project's requirements (no site-packages: ``-S``): one line, exit 2, nothing
    written, before any step starts."""
    res = subprocess.run([sys.executable, "-S", str(TOOLS / "gpu_check.py"), str(tmp_path / "out"), "3"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    head = f"gpu_check.sh: error: torch, {G.FAIRSEQ_PIP}, sentencepiece, sacrebleu, sacremoses, pandas, scipy, "
    assert res.stderr.startswith(head + "matplotlib are not installed for ") and " -m pip install torch " in res.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_step_through_the_script(tmp_path):
    res = subprocess.run([str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "out"), "1", "9"],
                         capture_output=True, text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "gpu_check.sh: error: unknown step '9'; the steps are 1 to 7\n"


def test_a_new_grid_is_timed_a_resumed_one_is_not(tmp_path, capsys):
    grid = tmp_path / "grid"
    cmd = G.Command([sys.executable, "-c", f"import os; os.makedirs({str(grid)!r}); print('a\\nb\\nc')"],
                    show=("tail", 2), timed=grid)
    G.execute(cmd)
    assert capsys.readouterr().out == "b\nc\n" and G.seconds_of(grid) >= 0
    G.execute(G.Command([sys.executable, "-c", "pass"], timed=grid))
    assert capsys.readouterr().out == f"{grid} exists: resuming it, not timing it\n" and G.seconds_of(grid) is None
    with pytest.raises(G.LnposError, match=r"failed \(exit 3\)"):
        G.execute(G.Command([sys.executable, "-c", "import sys; sys.exit(3)"]))


def test_a_training_resumes_and_a_failed_one_is_reported_with_its_log(tmp_path, capsys):
    """Steps 1, 2 and 4: a command that ended well is skipped by the next call; one that failed is said
    with its log (the others go on) and runs again in the next call."""
    count = tmp_path / "count"
    ok = G.Command([sys.executable, "-c", f"open({str(count)!r}, 'a').write('x')"], log=tmp_path / "ok.log",
                   check=False, stamp=tmp_path / "ok.done")
    bad = G.Command([sys.executable, "-c", "import sys; sys.exit(3)"], log=tmp_path / "bad.log", check=False,
                    stamp=tmp_path / "bad.done")
    assert G.execute(ok) is True and G.execute(bad) is False
    out = capsys.readouterr().out
    assert out == f"FAILED: {sys.executable} -c import sys; sys.exit(3) ... failed (exit 3): see {tmp_path / 'bad.log'}\n"
    assert G.execute(ok) is True and count.read_text() == "x"  # not run again
    assert capsys.readouterr().out == f"ok: done before, skipped ({tmp_path / 'ok.done'} exists)\n"
    assert G.execute(bad) is False and not bad.stamp.exists()


def test_step_one_reports_a_failed_training_as_a_failure(tmp_path, capsys):
    """No gradient norms because fairseq-train failed is a failure with its log, not a skipped update."""
    arch = "transformer_postln_tiny"
    for prec, total in (("fp32", 2.0), ("fp16", 2.01)):
        (tmp_path / f"gn-{arch}-{prec}").mkdir()
        (tmp_path / f"gn-{arch}-{prec}" / G.GRAD_NORMS_JSONL).write_text(
            json.dumps({"norms": {"total": total, "encoder/0": total / 2}}) + "\n")
        (tmp_path / f"gn-{arch}-{prec}.done").write_text("exit 0\n")
    G.compare_norms(tmp_path, arch)  # amp: it failed, no stamp
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{arch} amp: FAILED: its training did not end well (see {tmp_path / f'gn-{arch}-amp.log'})"
    assert out[1].startswith(f"{arch} fp16: 2 groups, total 2.0100 vs fp32 2.0000, max rel diff 0.0050") and \
        out[1].endswith("-> OK") and len(out) == 2
    G.losses("postln", tmp_path / "train-postln.log")
    assert capsys.readouterr().out == f"postln: FAILED: see {tmp_path / 'train-postln.log'}\n"


def test_step_six_counts_the_words_with_the_throughput_script(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(G, "execute", ran.append)
    (tmp_path / "grid.seconds").write_text("300\n")
    (tmp_path / "alone.seconds").write_text("100\n")
    G.throughput(tmp_path / "grid", tmp_path / "alone")
    assert [c.argv for c in ran] == [[sys.executable, str(TOOLS / "throughput.py"), str(tmp_path / "grid"), "300",
                                      "--alone", str(tmp_path / "alone"), "100"]]


def test_shown_lines():
    text = "a\n## Largest trainable depth\nx\ny\n"
    assert G.shown(text, ("head", 1)) == "a\n" and G.shown(text, ("tail", 1)) == "y\n"
    assert G.shown(text, ("from", "## Largest")) == "## Largest trainable depth\nx\ny\n"
