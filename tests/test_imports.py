"""Light imports: the data, analysis and experiment modules (and the scripts of scripts/tools/) load
without fairseq or torch and change nothing in the process; only fairseq's --user-dir import (or
register()) registers the plugin."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TOOLS

LIGHT = ["fairseq_lnpos", "fairseq_lnpos.common", "fairseq_lnpos.errors", "fairseq_lnpos.variants",
         "fairseq_lnpos.fairseq_build", "fairseq_lnpos.checkpoint", "fairseq_lnpos.fairseq_log"]
LIGHT += sorted(f"fairseq_lnpos.{p.parent.name}.{p.stem}" for d in ("data", "analysis", "experiments")
                for p in (REPO / "fairseq_lnpos" / d).glob("*.py") if p.stem != "__init__")
# these need torch (and fairseq) themselves: building models, in-memory corpora
HEAVY = {"fairseq_lnpos.analysis.toy_corpus"}
# the maintainers' measurement scripts (not part of the package): light as well
LIGHT_TOOLS = sorted(str(p) for p in TOOLS.glob("*.py"))


def import_graph(package_dir):
    """{module: the modules of the package it imports}, for every module of ``package_dir``: imports at
    module level and inside functions alike (an import inside a function only delays a cycle)."""
    package_dir = Path(package_dir)
    files = {}
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found |= {module} | {f"{module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_the_package():
    graph = import_graph(REPO / "fairseq_lnpos")
    assert "fairseq_lnpos.experiments.plan" in graph["fairseq_lnpos.experiments.slurm"]
    assert cycles(graph) == []


def test_the_data_modules_import_nothing_of_the_experiments():
    graph = import_graph(REPO / "fairseq_lnpos")
    upward = {m: sorted(d for d in deps if d.startswith("fairseq_lnpos.experiments"))
              for m, deps in graph.items() if m.startswith("fairseq_lnpos.data")}
    assert "fairseq_lnpos.cli" in graph["fairseq_lnpos.data.synthetic"]  # an absolute import is seen
    assert {m: d for m, d in upward.items() if d} == {}


def test_the_cycle_check_sees_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "cli.py").write_text("from . import lib\n")
    (pkg / "sub" / "lib.py").write_text("def f():\n    from .cli import main\n")
    (pkg / "other.py").write_text("from .sub import lib\n")
    graph = import_graph(pkg)
    assert graph["pkg.other"] == {"pkg.sub", "pkg.sub.lib"}
    assert cycles(graph) == [["pkg.sub.cli", "pkg.sub.lib"]]


def python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_light_modules_import_neither_fairseq_nor_torch_and_keep_the_excepthook():
    modules = [m for m in LIGHT if m not in HEAVY]
    assert len(LIGHT_TOOLS) >= 6, LIGHT_TOOLS
    res = python("import importlib, importlib.util, sys\n"
                 f"for m in {modules!r}: importlib.import_module(m)\n"
                 f"for i, p in enumerate({LIGHT_TOOLS!r}):\n"
                 "    spec = importlib.util.spec_from_file_location(f'tool{i}', p)\n"
                 "    sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
                 "    spec.loader.exec_module(sys.modules[spec.name])\n"
                 "print(sorted(m for m in ('fairseq', 'torch', 'sentencepiece', 'sacremoses', 'matplotlib') "
                 "if m in sys.modules), sys.excepthook is sys.__excepthook__)")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[0] == "[] True", res.stdout


def test_register_on_request_and_under_fairseq_only():
    res = python("import sys, fairseq_lnpos\n"
                 "from fairseq.models import ARCH_MODEL_REGISTRY\n"
                 "before = 'transformer_keel_tiny' in ARCH_MODEL_REGISTRY\n"
                 "fairseq_lnpos.register()\n"
                 "from fairseq.optim import OPTIMIZER_REGISTRY\n"
                 "from fairseq.tasks import TASK_REGISTRY\n"
                 "print(before, 'transformer_keel_tiny' in ARCH_MODEL_REGISTRY, 'radam' in OPTIMIZER_REGISTRY,"
                 " 'translation_lnpos' in TASK_REGISTRY, sys.excepthook is sys.__excepthook__)")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", "True", "True", "True", "True"]


@pytest.mark.slow
def test_fairseq_user_dir_registers_and_installs_one_line_errors(tmp_path):
    # fairseq's own import of --user-dir: archs registered (the arch choice parses), and a
    # project error raised while fairseq builds the model is one line
    res = subprocess.run([str(Path(sys.executable).parent / "fairseq-train"), str(tmp_path / "nodata"),
                          "--user-dir", str(REPO / "fairseq_lnpos"), "--task", "translation_lnpos",
                          "--arch", "transformer_preln_iwslt_de_en", "--cpu", "--max-tokens", "1000"], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1].startswith(f"fairseq-train: error: data folder {tmp_path / 'nodata'}")
    assert "Traceback" not in res.stderr


def test_a_misspelt_arch_names_the_closest_registered_ones():
    from fairseq_lnpos.errors import LnposError, check_arch

    archs = ["transformer_preln_iwslt_de_en", "transformer_postln_iwslt_de_en", "transformer_preln_tiny", "lstm"]
    check_arch(["data", "--arch", "lstm"], archs)
    check_arch(["data", "--task", "translation"], archs)  # no --arch: fairseq's own default
    with pytest.raises(LnposError, match=r"did you mean transformer_preln_iwslt_de_en or transformer_postln_iwslt_de_en or transformer_preln_tiny\? "):
        check_arch(["data", "-a", "transformer_preln_iwslt_de_e"], archs)
    with pytest.raises(LnposError, match="no registered arch has a similar name"):
        check_arch(["data", "--arch=zzz"], archs)


@pytest.mark.slow
def test_fairseq_train_with_a_misspelt_arch_says_one_line(tmp_path):
    res = subprocess.run([str(Path(sys.executable).parent / "fairseq-train"), str(tmp_path),
                          "--user-dir", str(REPO / "fairseq_lnpos"), "--arch", "transformer_preln_iwslt_de_e", "--cpu"],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "fairseq-train: error: --arch transformer_preln_iwslt_de_e is not a registered architecture: did you mean "
        "transformer_preln_iwslt_de_en or transformer_periln_iwslt_de_en or transformer_postln_iwslt_de_en? "
        "(docs/architectures.md lists the plugin's)"]


@pytest.mark.slow
def test_fairseq_train_with_the_plugin_shows_no_known_deprecation_warning(toy_data, tmp_path):
    from conftest import train_argv, two_layers
    from fairseq_lnpos.errors import THIRD_PARTY_WARNINGS

    res = subprocess.run([str(Path(sys.executable).parent / "fairseq-train"),
                          *map(str, train_argv(toy_data, "transformer_preln_tiny", *two_layers("transformer_preln_tiny"))),
                          "--cpu", "--max-update", "1", "--max-tokens", "500", "--optimizer", "adam", "--lr", "1e-4",
                          "--no-save", "--save-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert res.returncode == 0, res.stdout[-2000:]
    assert "num_updates 1" in res.stdout
    assert "Warning:" not in res.stdout, res.stdout[:3000]
    # the filters are narrow: a warning of the plugin's own modules still shows
    from fairseq_lnpos import errors
    import warnings
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        errors.quiet_warnings()
        warnings.warn("anything else", UserWarning)
    assert [str(w.message) for w in shown] == ["anything else"] and len(THIRD_PARTY_WARNINGS) >= 4


def test_prepare_iwslt14_help_answers_without_loading_fairseq_or_torch():
    """--help of a data script is quick because it loads none of the heavy libraries (their import
    takes seconds): the script's own Python, with its imports listed (PYTHONPROFILEIMPORTTIME)."""
    script = REPO / "data-prep" / "prepare-iwslt14.sh"
    res = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                         env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONPROFILEIMPORTTIME": "1"})
    assert res.returncode == 0 and "--archive" in res.stdout, res.stderr
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in res.stderr.splitlines()
              if line.startswith("import time:")}
    assert "fairseq_lnpos" in loaded, res.stderr[-2000:]  # the listing is of the script's process
    assert not loaded & {"fairseq", "torch", "sentencepiece", "sacremoses"}, sorted(loaded)
