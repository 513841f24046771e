"""The README and docs/: every relative link and anchor resolves, the counts the README states
(architectures, sizes) are the registry's (fairseq_lnpos/variants.py), the numbers README and findings
quote are on the pages they link, and the study pages that can be written again from the repository's
own per-seed data are what their commands write now."""
import re
from pathlib import Path

import pytest

from conftest import page_argv
from fairseq_lnpos.variants import SIZES, VARIANTS

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def prose(text):
    """The lines of ``text`` that Markdown renders as text, where links and headings are: without
    fenced code blocks, indented code blocks (after a blank line) and inline code (of a heading,
    only its backticks)."""
    lines, fenced, code = [], False, False
    previous = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            code = line.startswith("    ") and (code or not previous.strip())
            if not code:
                lines.append(line.replace("`", "") if line.startswith("#") else re.sub(r"`[^`]*`", "", line))
        previous = line
    return lines


def slug(heading):
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page):
    seen, out = {}, set()
    for line in prose(page.read_text(encoding="utf-8")):
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def links(page):
    for line in prose(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if not re.match(r"[a-z]+:", target):
                yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page):
    bad = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not bad, "\n".join(bad)


def test_every_figure_the_docs_show_is_one_a_results_page_holds():
    """A figure in README.md or docs/ is one a command of the lab wrote into a results page (with its
    command, data and code), never an image kept beside the code."""
    shown = [(page, target) for page in PAGES
             for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))]
    assert shown  # the README's demo figure at least
    results = (REPO / "docs" / "results").resolve()
    for page, target in shown:
        figure = (page.parent / target).resolve()
        assert figure.parent.parent == results and (figure.parent / "index.md").is_file(), (page.name, target)


def test_the_link_check_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "data.md").write_text("# Data\n\n## The synthetic corpus (`make-synthetic.sh`)\n")
    page = tmp_path / "README.md"
    page.write_text("[a](docs/data.md#the-synthetic-corpus) [b](docs/nope.md) [c](docs/data.md#the-synthetic-"
                    "corpus-make-syntheticsh) [d](https://example.org/x) `[e](docs/in-code.md)`\n\n"
                    "    [f](docs/in-a-code-block.md)\n")
    assert list(links(page)) == ["docs/data.md#the-synthetic-corpus", "docs/nope.md",
                                 "docs/data.md#the-synthetic-corpus-make-syntheticsh"]
    assert anchors(tmp_path / "docs" / "data.md") == {"data", "the-synthetic-corpus-make-syntheticsh"}


def test_the_readme_counts_come_from_the_registry():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    count = lambda word: int(word) if word.isdigit() else NUMBERS[word]  # noqa: E731
    archs = [count(n) for n in re.findall(r"\b(\d+|two|three|four|five|six) architectures\b", text)]
    sizes = [count(n) for n in re.findall(r"\b(\d+|two|three|four|five|six) sizes\b", text)]
    assert archs and set(archs) == {len(VARIANTS)}, archs
    assert sizes and set(sizes) == {len(SIZES)}, sizes
    # the architecture table names every variant of the registry, and nothing else
    table = re.findall(r"`transformer_(\w+)\*`", text)
    assert sorted(table) == sorted(VARIANTS)


def test_the_architecture_page_lists_every_variant():
    text = (REPO / "docs" / "architectures.md").read_text(encoding="utf-8")
    assert sorted(re.findall(r"^\| `transformer_(\w+)` \|", text, re.M)) == sorted(VARIANTS)


def readme_drift(text, root):
    """(numbers a paragraph of ``text`` quotes that the results pages it links do not state, how many
    numbers were checked). A paragraph that links docs/results/NAME/index.md quotes only what that page
    or its per-seed runs.csv states: decimals, and counts of CPU-s."""
    missing, checked = [], 0
    for paragraph in text.split("\n\n"):
        pages = set(re.findall(r"\(((?:docs/)?results/[\w.-]+/index\.md)\)", paragraph))
        if not pages:
            continue
        numbers = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])|(?<![\w.-])\d+(?= CPU-s)", paragraph))
        page_text = " ".join(f.read_text(encoding="utf-8") for p in pages
                             for f in (Path(root) / p, (Path(root) / p).parent / "runs.csv") if f.exists())
        missing += sorted(n for n in numbers if n not in page_text)
        checked += len(numbers)
    return missing, checked


@pytest.mark.parametrize("page, least", [("README.md", 8), ("docs/findings.md", 40)])
def test_every_number_the_readme_quotes_is_on_the_results_page_it_links(page, least):
    """README.md, docs/findings.md and the pages the lab's commands wrote cannot drift apart."""
    path = REPO / page
    missing, checked = readme_drift(path.read_text(encoding="utf-8"), path.parent)
    assert missing == [] and checked >= least  # the demo's numbers at least; every finding's


def test_the_readme_check_finds_a_number_the_page_does_not_state(tmp_path):
    (tmp_path / "docs" / "results" / "x").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "x" / "index.md").write_text("| Pre-LN | 98.72 |\n| cost | 792 CPU-s |\n")
    text = "Pre-LN 98.71 and 98.72 in 792 CPU-s ([the page](docs/results/x/index.md)).\n\nElsewhere 1.5."
    assert readme_drift(text, tmp_path) == (["98.71"], 3)


def test_every_output_folder_the_docs_name_is_ignored_by_git():
    """A folder a command of README.md or docs/ writes into (``--out all-out``, ``demo-out/``) is in
    .gitignore, so that following the docs leaves ``git status`` clean."""
    phrases = {"leave-one-out"}  # English, not a folder
    named = {m for page in PAGES
             for m in re.findall(r"(?<![\w/.-])([a-z0-9]+(?:-[a-z0-9]+)*-out)(?![\w-])", page.read_text(encoding="utf-8"))
             } - phrases
    ignored = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()}
    assert {"demo-out", "demo-real-out", "all-out", "grid-out"} <= named
    assert named <= ignored, f"not in .gitignore: {sorted(named - ignored)}"


def page_command(page, out, module):
    """The arguments of the command line ``page`` records (``python -m module ...``), without --publish and
    writing into ``out`` instead of its --out-dir (or --out)."""
    argv = page_argv(page)
    assert argv[:3] == ["python", "-m", module], argv[:3]
    argv = argv[3:]
    del argv[argv.index("--publish"):argv.index("--publish") + 2]
    argv[argv.index("--out-dir" if "--out-dir" in argv else "--out") + 1] = str(out)
    return argv


REPORT_PAGES = {"why-warmup": ("fairseq_lnpos.analysis.why", "why.md"),
                "source-use": ("fairseq_lnpos.analysis.source_basis", "basis.md"),
                "real-text-epochs": ("fairseq_lnpos.analysis.curves", "curves.md"),
                "warmup-control": ("fairseq_lnpos.analysis.curves", "curves.md")}


@pytest.mark.parametrize("name", sorted(REPORT_PAGES))
def test_a_study_page_is_what_its_command_writes_now_from_the_page_itself(name, tmp_path, monkeypatch, capsys):
    """The warm-up study's and the curves' pages read their own published per-seed data (runs.csv and the
    study's tables); their command line run again now, into another folder, writes the page's Markdown."""
    import importlib

    module, md = REPORT_PAGES[name]
    page = REPO / "docs" / "results" / name
    argv = page_command(page, tmp_path / "out", module)
    monkeypatch.chdir(REPO)
    assert importlib.import_module(module).main(argv) == 0
    capsys.readouterr()
    assert (tmp_path / "out" / md).read_text(encoding="utf-8") == (page / md).read_text(encoding="utf-8")


# the agreement pages: how each page's runs.csv splits into the command's two sources (the first: A)
AGREEMENT_PAGES = {"all-archs-replication": lambda runs: runs["seed"] <= 3,
                   "all-archs-second-machine": lambda runs: runs["cpu"] == "AMD EPYC",
                   "precision-all-archs": lambda runs: runs["precision"] == "float32",
                   "precision-demo": lambda runs: runs["precision"] == "float32",
                   "precision-demo-real": lambda runs: runs["precision"] == "float32",
                   "why-warmup-second-machine": lambda runs: runs["cpu"] == "AMD EPYC",
                   "why-warmup-same-machine": lambda runs: ~runs["path"].str.contains("whyx-same/")}


@pytest.mark.parametrize("name", sorted(AGREEMENT_PAGES))
def test_an_agreement_page_is_what_its_command_writes_now_from_the_pages_own_runs(name, tmp_path, capsys):
    """Two runs of a map (other seeds, another machine, another precision) compared: the page's runs.csv
    split back into its two sources and given to its command line again writes its agreement.md (the
    sources' paths aside)."""
    from fairseq_lnpos.analysis import agreement
    from fairseq_lnpos.analysis.frame import read_runs_csv, write_runs_csv

    page = REPO / "docs" / "results" / name
    argv = page_command(page, tmp_path / "out", "fairseq_lnpos.analysis.agreement")
    (a, b), options = argv[:2], argv[2:]
    runs = read_runs_csv(page / "runs.csv")
    first = AGREEMENT_PAGES[name](runs)
    assert 0 < first.sum() < len(runs)
    sources = [write_runs_csv(part.reset_index(drop=True), tmp_path / f"{x}.csv")
               for x, part in (("a", runs[first]), ("b", runs[~first]))]
    assert agreement.main([*map(str, sources), *options]) == 0
    capsys.readouterr()
    written = (tmp_path / "out" / "agreement.md").read_text(encoding="utf-8")
    assert written.replace(str(sources[0]), a).replace(str(sources[1]), b) == (page / "agreement.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "docs" / "results").glob("fig3-*")))
def test_a_fig3_page_is_the_summary_of_its_own_per_model_records(name):
    """Fig. 3 pages: the means and spreads over seeds of fig3.json are summarize() of the page's
    records.jsonl (one record per model and seed), and every line of the page's tables is fig3.json's
    (fig3.json keeps its keys sorted, so a table's rows may come in another order)."""
    import json

    from fairseq_lnpos.analysis import summary

    page = REPO / "docs" / "results" / name
    result = json.loads((page / "fig3.json").read_text())
    records = [json.loads(line) for line in (page / "records.jsonl").read_text().splitlines()]
    given = dict(result["settings"])
    again = summary.summarize(records, {k: v for k, v in given.items()
                                        if k not in ("archs", "depths", "layers_depth", "seeds", "lemma2")},
                              depths=given["depths"], layers_depth=given["layers_depth"], seeds=given["seeds"],
                              lemma2=given["lemma2"])
    assert json.loads(json.dumps(again)) == {k: v for k, v in result.items() if k not in ("seconds", "cpu_seconds")}
    text = (page / "index.md").read_text()
    assert [line for line in summary.markdown(result).splitlines() if line.strip() and line not in text] == []


def test_the_warmup_predictor_page_is_what_its_command_writes_now_from_the_pages_own_data(tmp_path, monkeypatch, capsys):
    """The predictor page publishes both sides' per-seed data (the map's runs.csv, the Fig. 3 side's
    records.jsonl and fig3.json): its command run again with --init the page itself writes the same
    tables and Markdown (the --init folder's name aside)."""
    from fairseq_lnpos.analysis import predictor

    page = REPO / "docs" / "results" / "warmup-predictor"
    argv = page_command(page, tmp_path / "out", "fairseq_lnpos.analysis.predictor")
    init = argv[argv.index("--init") + 1]
    argv[argv.index("--init") + 1] = str(page)
    monkeypatch.chdir(REPO)
    assert predictor.main(argv) == 0
    capsys.readouterr()
    for table in ("predictor.csv", "predictor_seeds.csv"):
        assert (tmp_path / "out" / table).read_text() == (page / table).read_text(), table
    body = (tmp_path / "out" / "predictor.md").read_text().replace(str(page), init).split("\n", 1)[1]  # its title: the page's
    assert body.strip() in (page / "index.md").read_text()
