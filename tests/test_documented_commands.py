"""Every command the README, docs/, the results pages and the modules' docstrings show is one this
checkout runs: its program exists and takes every option the text gives it (each program's --help lists
them). Renaming or moving a command, or dropping an option, fails here until the docs follow."""
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import REPO

# a command: scripts/X.sh (or X.sh as a page's command line names it), data-prep/X.sh, python -m
# fairseq_lnpos..., python scripts/tools/X.py; a Python or variables may precede it
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.sh") if not p.name.startswith("_"))
PROGRAM = re.compile(r"^(?:\.venv/bin/python |python3? |\$PY )?(scripts/[a-z][\w-]*\.sh|data-prep/[a-z][\w-]*\.sh|"
                     r"-m fairseq_lnpos[a-z_.]*|scripts/tools/[a-z_]+\.py|(?:%s))(?=\s|$)" % "|".join(map(re.escape, SCRIPTS)))
ENV = re.compile(r"^(?:[A-Z_]+=\S+ |env (?:[A-Z_]+=\S+ )+)+")
FLAGS_OPTIONS = {"--fairseq-args", "--gen-args"}  # their value is another command's flags
END = {"|", "||", "&&", ";", ">", "2>&1", "&"}


def pages():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "results").glob("*/index.md"))]


def commands(text, program=PROGRAM):
    """The commands (of ``program``) of a Markdown text: in code blocks (fenced or indented, a line ending
    in \\ joined with the next) and in `code` spans."""
    found, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        spans = re.findall(r"`([^`]+)`", line)
        if fenced or line.startswith("    "):
            pending += line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip() + " "
                continue
            spans.append(pending)
            pending = ""
        for span in spans:
            span = ENV.sub("", span.strip())
            if program.match(span):
                found.append(span)
    return found


INTERNAL = {"-m fairseq_lnpos.forkserver"}  # a server the grid starts, reading requests on stdin: no options


def documented():
    seen = {}
    sources = [*pages(), *sorted((REPO / "fairseq_lnpos").rglob("*.py")), *sorted((REPO / "scripts" / "tools").glob("*.py"))]
    for page in sources:  # the docs, and the usage lines of the modules' docstrings
        for command in commands(page.read_text(encoding="utf-8")):
            if PROGRAM.match(command).group(1) not in INTERNAL:
                seen.setdefault(command, page.relative_to(REPO))
    return sorted(seen.items(), key=lambda kv: (str(kv[1]), kv[0]))


@lru_cache(maxsize=None)
def help_text(*argv):
    """What ``argv --help`` (a program and its subcommand) prints: a usage, else an AssertionError."""
    res = subprocess.run([*argv, "--help"], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert res.returncode == 0 and "usage:" in res.stdout.lower(), (
        f"{' '.join(argv)} --help: exit {res.returncode}, no usage: {res.stderr[-500:]}")
    return res.stdout


def help_options(*argv):
    """The long options the --help of ``argv`` lists."""
    return frozenset(re.findall(r"--[a-z][\w-]*", help_text(*argv)))


def program(name):
    """The argv that runs a program named as the docs name it."""
    if name.startswith("-m "):
        return (sys.executable, "-m", name[3:])
    if name.startswith("scripts/tools/"):
        return (sys.executable, name)
    return (str(REPO / (name if "/" in name else f"scripts/{name}")),)


def parts(command):
    """[(argv of the program's --help, the options given to it)] of one documented command."""
    name = PROGRAM.match(command).group(1)
    rest = re.split(r"\s{2,}\(", command[PROGRAM.match(command).end():])[0]  # a docstring's "cmd    (a note)"
    try:
        split = shlex.split(rest, comments=True)
    except ValueError:  # an apostrophe in a comment
        split = rest.split("#")[0].split()
    words = []
    for word in split:
        if word in END:
            break
        words.append(word.strip("[]"))
    if name.endswith("why_study.sh"):  # the grid's options, then after "--" the report's
        cut = words.index("--") if "--" in words else len(words)
        return [(program("grid.sh") + ("run",), words[:cut]), (program("-m fairseq_lnpos.analysis.why"), words[cut + 1:])]
    argv = program(name)
    if words and re.search(r"\{[\w,-]*\b%s\b[\w,-]*\}" % re.escape(words[0]), help_text(*argv)):  # a subcommand
        argv, words = argv + (words[0],), words[1:]
    return [(argv, words)]


def options(words):
    """The long options among ``words`` (not placeholders such as --with-NAME, not another command's flags)."""
    out, skip = [], False
    for word in words:
        if not skip and word.startswith("--") and word != "--":
            option = word.split("=", 1)[0]
            if option == option.lower() and "..." not in option:
                out.append(option)
        skip = word.split("=", 1)[0] in FLAGS_OPTIONS and "=" not in word
    return out


@pytest.mark.parametrize("command, page", documented(), ids=lambda v: str(v)[:60])
def test_every_documented_command_runs_here_with_the_options_it_is_given(command, page):
    for argv, words in parts(command):
        if argv[0].endswith(".sh") or argv[-1].endswith(".py"):
            assert Path(argv[-1] if argv[-1].endswith(".py") else argv[0]).exists(), f"{page}: {command}"
        known = help_options(*argv)
        unknown = [o for o in options(words) if o not in known]
        assert not unknown, f"{page}: `{command}`: {' '.join(argv[1:] if argv[0] == sys.executable else argv)} takes no {', '.join(unknown)}"


def test_the_check_finds_a_command_that_is_gone_and_an_option_that_is_not_taken():
    """Not a check that cannot fail: a moved module, and an option its program does not have."""
    (argv, words), = parts("python -m fairseq_lnpos.analysis.stability OUT --no-such-option")
    assert options(words) == ["--no-such-option"] and "--no-such-option" not in help_options(*argv)
    for gone in ("fairseq_lnpos.analysis.no_such_module", "fairseq_lnpos.analysis.verdict"):  # absent; no command
        with pytest.raises(AssertionError, match="no usage"):
            help_options(sys.executable, "-m", gone)
    assert commands("    scripts/grid.sh run --only 'a-*' \\\n        --jobs 2   # two\n") == ["scripts/grid.sh run --only 'a-*' --jobs 2   # two"]


def test_every_make_target_the_docs_name_is_in_the_makefile():
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    named = set()
    for page in pages():
        text = page.read_text(encoding="utf-8")
        named |= set(re.findall(r"`make ([a-z][\w-]*)", text) + re.findall(r"^\s+make ([a-z][\w-]*)", text, re.M))
    assert {"demo", "test"} <= named and named <= targets, sorted(named - targets)


FAIRSEQ = re.compile(r"^(?:\.venv/bin/)?(fairseq-(?:train|generate|preprocess))(?=\s|$)")


def fairseq_commands():
    """The whole fairseq-train, fairseq-generate and fairseq-preprocess commands of the docs (a data
    folder first; a mention such as `fairseq-generate --beam 5` is not one), without `--user-dir`."""
    found = []
    for page in pages():
        for command in commands(page.read_text(encoding="utf-8"), FAIRSEQ):
            words = []
            for word in shlex.split(command[FAIRSEQ.match(command).end():], comments=True):
                if word in END:
                    break
                words.append(word)
            if words and (not words[0].startswith("-") or command.startswith("fairseq-preprocess")):
                if "--user-dir" in words:
                    del words[words.index("--user-dir"):words.index("--user-dir") + 2]
                found.append((page.relative_to(REPO), FAIRSEQ.match(command).group(1), [w for w in words if w != "..."]))
    return found


def fairseq_parse(name, words):
    """``words`` parsed by fairseq's own parser of ``name`` (the plugin registered): SystemExit on an
    option fairseq or the plugin does not have."""
    from fairseq import options

    from fairseq_lnpos import register

    register()
    if name == "fairseq-preprocess":
        return options.get_preprocessing_parser().parse_args(words)
    parser = options.get_training_parser() if name == "fairseq-train" else options.get_generation_parser()
    return options.parse_args_and_arch(parser, words)


def test_every_documented_fairseq_command_parses_with_fairseqs_parser_and_the_plugin(capsys):
    """The README's first run and the docs' fairseq commands use only options fairseq and the plugin
    have (a plugin option renamed fails here); an option neither has is refused."""
    found = fairseq_commands()
    assert {("README.md", "fairseq-train"), ("README.md", "fairseq-generate")} <= {(str(p), n) for p, n, _ in found}
    for page, name, words in found:
        try:
            fairseq_parse(name, words)
        except SystemExit:
            pytest.fail(f"{page}: {name} {' '.join(words)}: {capsys.readouterr().err.strip()[-300:]}")
    with pytest.raises(SystemExit):
        fairseq_parse("fairseq-train", ["data", "--arch", "transformer_preln_tiny", "--no-such-flag"])
