"""Fault injection: bad input and faults against every command, one table row per case.

Each row runs one command in a fresh sandbox folder (the command's working directory, holding its
inputs) and asserts: the exit status, that the error is ONE line matching the row's regular
expression (no traceback), and that nothing in the sandbox changed outside the paths the row lets
the command write (its output folders). Commands of the package run in this process (their
``main(argv)``); fairseq's commands and the shell entry points run as subprocesses (marked slow).
"""
import importlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

import pytest

from conftest import BIN, REPO, USER_DIR, fairseq_cmd, run, tool, toy_data  # noqa: F401
from fixtures_data import make_iwslt_orig, make_tgz

INTERRUPTED = r"interrupted; run the same command again to resume"


@dataclass(frozen=True)
class Case:
    """One row: ``argv[0]`` is a module of the package or a script of ``scripts/tools/`` (either run
    in-process), a fairseq console script or a script of the repository; ``{S}`` in an argument is
    the sandbox, ``{DATA}`` a copy of the toy data folder, ``{CKPT}`` a checkpoint of
    ``transformer_postln_tiny`` trained on it."""
    name: str
    argv: Tuple[str, ...]
    message: str                                 # regular expression the one error line must match
    setup: Optional[Callable] = None             # setup(sandbox) writes the inputs
    code: int = 2
    writes: Tuple[str, ...] = ("out", "bin")     # sandbox paths the command may create or change
    patch: Optional[Callable] = None             # patch(monkeypatch) before an in-process run
    needs: Tuple[str, ...] = ()                  # "data": {DATA} (the toy data folder); "ckpt": {CKPT}
    slow: bool = False


# ---------------------------------------------------------------- inputs

def iwslt_orig(sandbox, n_filler=30):
    return make_iwslt_orig(sandbox / "orig", n_filler=n_filler)


def iwslt_archive(sandbox):
    make_tgz(iwslt_orig(sandbox), sandbox / "de-en.tgz")
    shutil.rmtree(sandbox / "orig")


def truncated_archive(sandbox):
    iwslt_archive(sandbox)
    data = (sandbox / "de-en.tgz").read_bytes()
    (sandbox / "de-en.tgz").write_bytes(data[: len(data) // 2])


def evil_archive(*members):
    """An archive of ``members``: (name, kind, link target or text); ``{S}`` is the sandbox."""
    def setup(sandbox):
        (sandbox / "outside").mkdir()
        with tarfile.open(sandbox / "de-en.tgz", "w:gz") as tar:
            for name, kind, value in members:
                info = tarfile.TarInfo(name.replace("{S}", str(sandbox)))
                if kind == "file":
                    data = value.encode()
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                else:
                    info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                    info.linkname = value.replace("{S}", str(sandbox))
                    tar.addfile(info)
    return setup


def edit_orig(edit):
    def setup(sandbox):
        edit(iwslt_orig(sandbox))
    return setup


def drop_xml(orig):
    (orig / "IWSLT14.TED.tst2011.de-en.en.xml").unlink()


def extra_train_line(orig):
    path = orig / "train.tags.de-en.de"
    path.write_text(path.read_text(encoding="utf-8") + "Eine Zeile zu viel.\n", encoding="utf-8")


def latin1_train(orig):
    path = orig / "train.tags.de-en.de"
    path.write_bytes(path.read_bytes() + "Gr\u00fc\u00dfe aus K\u00f6ln.\n".encode("latin-1"))


def empty_train(orig):
    for lang in ("de", "en"):
        (orig / f"train.tags.de-en.{lang}").write_text("")


def file_at(name):
    def setup(sandbox):
        iwslt_orig(sandbox)
        (sandbox / name).write_text("a file, not a folder\n")
    return setup


def read_only_folder(sandbox):
    iwslt_orig(sandbox)
    if os.geteuid() != 0:
        (sandbox / "ro").mkdir()
        os.chmod(sandbox / "ro", 0o555)


# root writes anywhere: a read-only file system instead (/sys in containers)
READ_ONLY_OUT = "/sys/lnpos-faults/out" if os.geteuid() == 0 else "{S}/ro/out"


def interrupt_in(target):
    """A patch that makes ``target`` (module path, attribute) raise KeyboardInterrupt, as Ctrl-C does."""
    def patch(monkeypatch):
        def stop(*args, **kwargs):
            raise KeyboardInterrupt
        monkeypatch.setattr(target, stop)
    return patch


def data_dir_without_dict(sandbox):
    d = sandbox / "bin"
    d.mkdir()
    (d / "train.de-en.de.idx").write_bytes(b"")  # the language pair can be told, the dictionaries are missing


def toy_copy(edit=None):
    """{DATA}: a copy of the toy data folder; ``edit(folder)`` damages it."""
    def setup(sandbox):
        dest = sandbox / "data"
        shutil.copytree(TOY["data"], dest)
        if edit:
            edit(dest)
    return setup


def empty_dict(data):
    (data / "dict.de.txt").write_text("")


def no_target_dict(data):
    (data / "dict.en.txt").unlink()


def truncated_checkpoint(sandbox):
    toy_copy()(sandbox)
    data = Path(TOY["ckpt"]).read_bytes()
    (sandbox / "ckpt.pt").write_bytes(data[: len(data) // 3])


def write(name, text):
    def setup(sandbox):
        (sandbox / name).parent.mkdir(parents=True, exist_ok=True)
        (sandbox / name).write_text(text)
    return setup


SYN = "fairseq_lnpos.data.synthetic"
IWSLT = "fairseq_lnpos.data.iwslt"
WMT = "fairseq_lnpos.data.wmt"
FIG3 = "fairseq_lnpos.analysis.init_grad"
OUT = ("--out", "{S}/out", "--bin", "{S}/bin")
ORIG = ("--orig", "{S}/orig", "--workers", "1", "--bpe-size", "200") + OUT
IWSLT_ORIG = (IWSLT,) + ORIG
TRAIN = ("fairseq-train", "{DATA}", "--user-dir", USER_DIR, "--cpu", "--max-tokens", "500", "--max-update", "1",
         "--task", "translation_lnpos", "--arch", "transformer_preln_tiny", "--optimizer", "adam", "--lr", "1e-3",
         "--save-dir", "{S}/out", "--no-save", "--num-workers", "0")

GRID = "fairseq_lnpos.experiments.grid"
TABLE = "fairseq_lnpos.experiments.report"
ROW = "iwslt-preln-adam-lr5e-4-step8"
GRID_RUN = (GRID, "run", "--only", ROW, "--arch-size", "tiny", "--data", "{DATA}", "--out", "{S}/out")


def grid_data(sandbox):
    """{DATA} with the manifest the grid reads."""
    from fairseq_lnpos.data.manifest import write_manifest

    toy_copy()(sandbox)
    (sandbox / "test.en").write_text("a\n")
    write_manifest(sandbox / "data", dataset="synthetic", source_lang="de", target_lang="en",
                   post_process="sentencepiece", lowercase=True, compound_split=False,
                   refs={"tok": {"test": sandbox / "test.en"}}, counts={"test": 1})


def run_folder(**files):
    """A grid output folder with one run whose files are ``files`` (name -> text)."""
    def setup(sandbox):
        grid_data(sandbox)
        d = sandbox / "out" / ROW / "seed1"
        (d / "eval").mkdir(parents=True)
        for name, text in files.items():
            (d / name.replace("__", "/")).write_text(text)
    return setup


GOOD_CONFIG = ('{"hash": "0", "seed": 1, "arch": "transformer_preln_tiny", "run": {"name": "%s", "dataset": '
               '"iwslt14", "ln": "preln", "optimizer": "adam", "lr": 0.0005}}' % ROW)

CASES = [
    # --- the grid and the results table
    Case("grid-unknown-run", (GRID, "run", "--only", "nope", "--data", "{S}/data", "--out", "{S}/out"),
         r"^grid: error: unknown run 'nope'", writes=()),
    Case("grid-max-epoch-0", GRID_RUN + ("--max-epoch", "0"), r"--max-epoch: 0 is too small", writes=(),
         setup=toy_copy(), needs=("data",)),
    Case("grid-seeds-x", GRID_RUN + ("--seeds", "x"), r"^grid: error: --seeds: 'x' is not a whole number", writes=(),
         setup=toy_copy(), needs=("data",)),
    Case("grid-jobs-0", GRID_RUN + ("--jobs", "0"), r"--jobs: 0 is too small", writes=(), setup=toy_copy(),
         needs=("data",)),
    Case("grid-set-layers-0", GRID_RUN + ("--set", "layers=0"), r"--set layers must be at least 1, got 0", writes=(),
         setup=toy_copy(), needs=("data",)),
    Case("grid-out-is-a-file", GRID_RUN, r"^grid: error: --out \S*/out is a file",
         setup=lambda s: (toy_copy()(s), file_at("out")(s)), writes=(), needs=("data",)),
    Case("grid-out-read-only", GRID_RUN[:-1] + (READ_ONLY_OUT,), r"^grid: error: --out \S*/out: cannot create it",
         setup=lambda s: (grid_data(s), read_only_folder(s)), writes=(), needs=("data",)),
    Case("grid-missing-data", (GRID, "run", "--only", ROW, "--data", "{S}/nowhere", "--out", "{S}/out"),
         r"^grid: error: data dir \S*nowhere not found", writes=()),
    Case("grid-unreadable-config", GRID_RUN, r"^grid: error: \S*/seed1/config\.json is damaged .*delete",
         setup=run_folder(**{"config.json": '{"hash": "ab'}), writes=("out",), needs=("data",)),
    Case("table-unreadable-eval", (TABLE, "{S}/out", "--no-figures"),
         r"^make_table: error: 1 run folder\(s\) unreadable, .*eval/epoch1\.json is damaged",
         setup=run_folder(**{"config.json": GOOD_CONFIG, "eval__epoch1.json": '{"epoch": 1, "bleu'}),
         writes=("out",), needs=("data",)),
    Case("table-unreadable-done", (TABLE, "{S}/out", "--no-figures"),
         r"^make_table: error: .*DONE\.json is damaged",
         setup=run_folder(**{"config.json": GOOD_CONFIG, "DONE.json": ""}),
         writes=("out",), needs=("data",)),
    Case("table-not-a-folder", (TABLE, "{S}/nowhere"), r"^make_table: error: \S*nowhere is not a folder", writes=()),
    # --- archives: missing, truncated, members and links that leave the extraction folder
    Case("archive-missing", (IWSLT, "--archive", "{S}/nope.tgz") + OUT, r"--archive \S*nope\.tgz: no such file"),
    Case("archive-truncated", (IWSLT, "--archive", "{S}/de-en.tgz") + OUT,
         r"de-en\.tgz: not a readable tar archive", setup=truncated_archive),
    Case("archive-dotdot-member", (IWSLT, "--archive", "{S}/de-en.tgz") + OUT,
         r"de-en\.tgz: refusing to extract it: .*\.\./\.\./\.\./outside/evil", setup=evil_archive(
             ("de-en/../../../outside/evil", "file", "x"))),
    Case("archive-absolute-member", (IWSLT, "--archive", "{S}/de-en.tgz") + OUT,
         r"de-en\.tgz: refusing to extract it", setup=evil_archive(("{S}/outside/evil", "file", "x"))),
    Case("archive-symlink-out-then-through-it", (IWSLT, "--archive", "{S}/de-en.tgz") + OUT,
         r"de-en\.tgz: refusing to extract it: .*lnk", setup=evil_archive(
             ("lnk", "symlink", "../../../outside"), ("lnk/file", "file", "written outside"))),
    Case("archive-absolute-symlink", (IWSLT, "--archive", "{S}/de-en.tgz") + OUT,
         r"de-en\.tgz: refusing to extract it: .*lnk", setup=evil_archive(
             ("lnk", "symlink", "{S}/outside"), ("lnk/file", "file", "written outside"))),
    Case("archive-hardlink-out", (IWSLT, "--archive", "{S}/de-en.tgz") + OUT,
         r"de-en\.tgz: refusing to extract it: .*hard", setup=evil_archive(("hard", "hardlink", "../../outside/x"))),
    # --- the extracted text
    Case("orig-missing-folder", (IWSLT, "--orig", "{S}/nowhere") + OUT, r"--orig \S*nowhere: not a folder"),
    Case("orig-missing-xml", IWSLT_ORIG, r"missing \S*IWSLT14\.TED\.tst2011\.de-en\.en\.xml",
         setup=edit_orig(drop_xml)),
    Case("orig-unequal-line-counts", IWSLT_ORIG, r"train\.tags\.de-en\.de \(without tag lines\) has \d+ lines but "
         r"\S*train\.tags\.de-en\.en \(without tag lines\) has \d+", setup=edit_orig(extra_train_line)),
    Case("orig-not-utf8", IWSLT_ORIG, r"train\.tags\.de-en\.de: not UTF-8 text", setup=edit_orig(latin1_train)),
    Case("orig-empty-training-files", IWSLT_ORIG, r"train\.tags\.de-en\.de and its en side hold no sentence pair",
         setup=edit_orig(empty_train)),
    # --- output folders
    Case("out-is-a-file", IWSLT_ORIG, r"--out \S*/out is a file, not a folder", setup=file_at("out")),
    Case("bin-is-a-file", IWSLT_ORIG, r"--bin \S*/bin is a file, not a folder", setup=file_at("bin")),
    Case("out-read-only", (IWSLT, "--orig", "{S}/orig", "--out", READ_ONLY_OUT, "--bin", "{S}/bin"),
         r"(not writable|Operation not permitted|Permission denied|Read-only file system)",
         setup=read_only_folder),
    # --- Ctrl-C: one line, 130 (a re-run resumes: test_interrupted_preparation_resumes)
    Case("ctrl-c-while-learning-bpe", IWSLT_ORIG, INTERRUPTED, setup=edit_orig(lambda o: None), code=130,
         patch=interrupt_in("fairseq_lnpos.data.bpe.learn")),
    Case("ctrl-c-while-extracting", (IWSLT, "--archive", "{S}/de-en.tgz") + OUT, INTERRUPTED, setup=iwslt_archive,
         code=130, patch=interrupt_in("tarfile.TarFile.extractall")),
    # --- numbers of the data commands
    Case("synthetic-train-0", (SYN, "--train", "0") + OUT, r"--train 0: give at least 1 sentence pair"),
    Case("synthetic-seed-negative", (SYN, "--seed", "-1") + OUT, r"--seed must be at least 0, got -1"),
    Case("synthetic-bpe-size-0", (SYN, "--bpe-size", "0") + OUT, r"--bpe-size must be at least 1, got 0"),
    Case("synthetic-workers-0", (SYN, "--workers", "0") + OUT, r"--workers must be at least 1, got 0"),
    Case("synthetic-train-not-a-number", (SYN, "--train", "x") + OUT, r"argument --train: invalid int value: 'x'"),
    Case("iwslt-workers-0", (IWSLT, "--orig", "{S}/orig", "--workers", "0") + OUT,
         r"--workers must be at least 1, got 0", setup=iwslt_orig),
    Case("iwslt-bpe-size-negative", (IWSLT, "--orig", "{S}/orig", "--bpe-size", "-5") + OUT,
         r"--bpe-size must be at least 1, got -5", setup=iwslt_orig),
    Case("wmt-bpe-sample-negative", (WMT, "--orig", "{S}/orig", "--bpe-sample", "-1") + OUT,
         r"--bpe-sample must be at least 0, got -1", setup=iwslt_orig),
    Case("wmt-unknown-archive", (WMT, "--archive", "{S}/x.tgz") + OUT, r"--archive \S*x\.tgz: unknown file name"),
    Case("check-synthetic-updates-0", ("scripts/tools/synthetic_check.py", "--bin", "{S}/bin", "--work", "{S}/out",
                                       "--updates", "0"), r"--updates must be at least 1, got 0"),
    # --- the Fig. 3 analysis
    Case("fig3-seeds-0", (FIG3, "--seeds", "0", "--out", "{S}/out"), r"--seeds must be at least 1, got 0"),
    Case("fig3-tokens-0", (FIG3, "--tokens", "0", "--out", "{S}/out"), r"--tokens must be at least 1, got 0"),
    Case("fig3-batches-0", (FIG3, "-K", "0", "--out", "{S}/out"), r"--batches must be at least 1, got 0"),
    Case("fig3-vocab-0", (FIG3, "--vocab", "0", "--out", "{S}/out"), r"--vocab must be at least 1, got 0"),
    Case("fig3-threads-0", (FIG3, "--threads", "0", "--out", "{S}/out"), r"--threads must be at least 1, got 0"),
    Case("fig3-first-seed-negative", (FIG3, "--first-seed", "-3", "--out", "{S}/out"),
         r"--first-seed must be in \[0, 4294967294\], got -3"),
    Case("fig3-dropout-above-1", (FIG3, "--dropout", "1.5", "--out", "{S}/out"), r"--dropout must be in \[0, 1\)"),
    Case("fig3-depths-not-numbers", (FIG3, "--depths", "6,x", "--out", "{S}/out"),
         r"--depths: 'x' is not a whole number"),
    Case("fig3-depth-0", (FIG3, "--depths", "0,6", "--out", "{S}/out"), r"--depths must list positive layer counts"),
    Case("fig3-layers-depth-not-swept", (FIG3, "--depths", "6,8", "--layers-depth", "7", "--out", "{S}/out"),
         r"--layers-depth 7 is not in --depths \[6, 8\]"),
    Case("fig3-unknown-size", (FIG3, "--size", "huge", "--out", "{S}/out"), r"--size 'huge': one of base"),
    Case("fig3-unknown-arch", (FIG3, "--archs", "postln,nosuch", "--out", "{S}/out"),
         r"unknown architecture 'nosuch' in --archs: use postln, preln, deepnorm, keel"),
    Case("fig3-data-missing", (FIG3, "--data", "{S}/nowhere", "--out", "{S}/out"),
         r"data folder \S*nowhere does not exist"),
    Case("fig3-data-without-dictionary", (FIG3, "--data", "{S}/bin", "--source-lang", "de", "--target-lang", "en",
                                          "--out", "{S}/out"),
         r"\S*/bin/dict\.de\.txt is missing \(no dict\.\*\.txt in the folder\)", setup=data_dir_without_dict,
         writes=("out",)),
    Case("fig3-data-without-dictionary-inferred-pair", (FIG3, "--data", "{S}/bin", "--out", "{S}/out"),
         r"\S*/bin/dict\.de\.txt is missing", setup=data_dir_without_dict, writes=("out",)),
    Case("fig3-out-is-a-file", (FIG3, "--archs", "postln", "--depths", "6", "--out", "{S}/out"),
         r"--out \S*/out is a file, not a folder", setup=write("out", "x")),
    # --- other analyses: unreadable inputs
    Case("layer-ratio-truncated-json", ("scripts/tools/layer_ratio.py", "{S}/fig3.json"),
         r"\S*fig3\.json is damaged \(not JSON", setup=write("fig3.json", '{"per_layer": {"Post')),
    Case("train-curves-missing-jsonl", ("fairseq_lnpos.analysis.train_curves", "{S}/grad_norms.jsonl"),
         r"\S*grad_norms\.jsonl not found: pass <save-dir>/grad_norms\.jsonl"),
    Case("train-curves-bad-regex", ("fairseq_lnpos.analysis.train_curves", "{S}/g.jsonl", "--groups", "fc(",
                                    "--out", "{S}/out/x.png"),
         r"--groups 'fc\(' is not a regular expression", setup=write("g.jsonl", '{"update": 1, "norms": {}}\n')),
    # --- shell entry points (the same code in a new process)
    Case("script-prepare-iwslt14-out-is-a-file", ("data-prep/prepare-iwslt14.sh",) + ORIG,
         r"^prepare-iwslt14\.sh: error: --out \S*/out is a file", setup=file_at("out"), slow=True),
    Case("script-init-grad-data-without-dictionary",
         ("scripts/init_grad_analysis.sh", "--data", "{S}/bin", "--source-lang", "de", "--target-lang", "en",
          "--out", "{S}/out"),
         r"^init_grad_analysis: error: \S*/bin/dict\.de\.txt is missing", setup=data_dir_without_dict,
         writes=("out",), slow=True),
    # --- fairseq's commands with --task translation_lnpos
    Case("train-missing-data-folder", TRAIN[:1] + ("{S}/nowhere",) + TRAIN[2:],
         r"^fairseq-train: error: data folder \S*nowhere does not exist", writes=("out",), slow=True),
    # fairseq's default --save-dir ./checkpoints, where it saved crash.pt despite --no-save: nothing may appear
    Case("train-empty-dict", tuple(a for a in TRAIN if a not in ("--save-dir", "{S}/out")),
         r"^fairseq-train: error: \S*data/dict\.de\.txt is empty", setup=toy_copy(empty_dict), writes=(),
         needs=("data",), slow=True),
    Case("train-missing-dict", TRAIN, r"^fairseq-train: error: \S*data/dict\.en\.txt is missing \(found dict\.de\.txt\)",
         setup=toy_copy(no_target_dict), writes=("out",), needs=("data",), slow=True),
    Case("train-restore-file-of-another-arch", TRAIN + ("--restore-file", "{CKPT}", "--arch",
                                                          "transformer_preln_iwslt_de_en"),
         r"^fairseq-train: error: the checkpoint's weights do not fit --arch transformer_preln_iwslt_de_en",
         setup=toy_copy(), writes=("out",), needs=("data", "ckpt"), slow=True),
    Case("train-bad-grad-norm-interval", TRAIN + ("--log-grad-norms", "--grad-norm-interval", "-1"),
         r"^fairseq-train: error: --grad-norm-interval must be at least 1", setup=toy_copy(), writes=("out",),
         needs=("data",), slow=True),
    Case("generate-truncated-checkpoint", ("fairseq-generate", "{S}/data", "--user-dir", USER_DIR, "--cpu",
                                           "--task", "translation_lnpos", "--path", "{S}/ckpt.pt"),
         r"^fairseq-generate: error: cannot load checkpoint \S*ckpt\.pt \(.*\): the file is damaged",
         setup=truncated_checkpoint, writes=(), needs=("data", "ckpt"), slow=True),
]
CASES = [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else []) for c in CASES]

TOY = {}  # the toy data folder and a checkpoint, made once for the rows that use them


@pytest.fixture(scope="module")
def toy_checkpoint(toy_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("faults-ckpt")
    res = run(fairseq_cmd("fairseq-train", toy_data, "--user-dir", USER_DIR, "--cpu", "--arch",
                          "transformer_postln_tiny", "--encoder-layers", 1, "--decoder-layers", 1,
                          "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", 500, "--max-update", 1,
                          "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", 0))
    assert res.returncode == 0, res.stderr[-2000:]
    return save / "checkpoint_last.pt"


def snapshot(root):
    """Every path under ``root`` with its type, size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def changed_outside(before, after, writes):
    def allowed(path):
        return any(path == w or path.startswith(w + "/") for w in writes)
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p) and not allowed(p))


def in_process(program):
    """The module whose ``main`` runs a row in-process: a module of the package or a script of
    ``scripts/tools/`` (None: the row runs as a process of its own)."""
    if program.startswith("fairseq_lnpos."):
        return importlib.import_module(program)
    if program.startswith("scripts/tools/"):
        return tool(Path(program).stem)
    return None


def run_case(case, sandbox, monkeypatch, capsys):
    """``(exit status, stderr)`` of the row's command, run in ``sandbox``."""
    argv = [a.replace("{S}", str(sandbox)).replace("{DATA}", str(sandbox / "data"))
            .replace("{CKPT}", str(TOY.get("ckpt", ""))) for a in map(str, case.argv)]
    module = in_process(argv[0])
    if module is not None:
        monkeypatch.chdir(sandbox)
        if case.patch:
            case.patch(monkeypatch)
        capsys.readouterr()
        try:
            code = module.main(argv[1:])
        except SystemExit as e:  # argparse
            code = e.code
        return code, capsys.readouterr().err
    exe = str(BIN / argv[0]) if argv[0].startswith("fairseq-") else str(REPO / argv[0])
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    res = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, cwd=sandbox, env=env)
    return res.returncode, res.stderr


@pytest.mark.parametrize("case", CASES)
def test_fault(case, tmp_path, monkeypatch, capsys, request):
    check_case(case, tmp_path, monkeypatch, capsys, request)


def check_case(case, tmp_path, monkeypatch, capsys, request):
    """Run one row in a new sandbox; assert its exit status, its one error line, and that nothing
    changed outside the paths it may write."""
    for need, fixture in (("data", "toy_data"), ("ckpt", "toy_checkpoint")):
        if need in case.needs:
            TOY[need] = request.getfixturevalue(fixture)
    if case.name.endswith("out-read-only") and os.geteuid() == 0 and not Path("/sys").is_dir():
        pytest.skip("no read-only location to write to as root")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    if case.setup:
        case.setup(sandbox)
    before = snapshot(sandbox)
    try:
        code, err = run_case(case, sandbox, monkeypatch, capsys)
        after = snapshot(sandbox)
    finally:
        if (sandbox / "ro").exists():
            os.chmod(sandbox / "ro", 0o755)
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert code == case.code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    own = in_process(str(case.argv[0])) is not None
    errors = lines if own else [l for l in lines if "error:" in l or "interrupted" in l]
    assert len(errors) == 1 and (own or errors[0] == lines[-1]), lines[-5:]
    assert re.search(case.message, errors[0]), errors[0]
    assert changed_outside(before, after, case.writes) == []
    assert not (sandbox / "checkpoints").exists()  # fairseq's crash.pt goes to ./checkpoints


# ---------------------------------------------------------------- faults with more to check than one row

def test_interrupted_preparation_resumes_and_gives_the_same_files(tmp_path, monkeypatch, capsys):
    from fairseq_lnpos.data import bpe, iwslt

    orig = make_iwslt_orig(tmp_path / "orig", n_filler=30)
    argv = ["--orig", str(orig), "--workers", "1", "--bpe-size", "200"]
    learn = bpe.learn
    calls = []

    def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return learn(*args, **kwargs)

    monkeypatch.setattr(bpe, "learn", interrupted_once)
    out, bin_dir = tmp_path / "out", tmp_path / "bin"
    assert iwslt.main(argv + ["--out", str(out), "--bin", str(bin_dir)]) == 130
    assert capsys.readouterr().err.strip() == f"prepare-iwslt14.sh: {INTERRUPTED}"
    assert (out / "tok" / ".stage.json").is_file() and not (out / ".bpe.tmp").exists() and not bin_dir.exists()
    assert iwslt.main(argv + ["--out", str(out), "--bin", str(bin_dir)]) == 0
    log = capsys.readouterr().out
    assert "[tok] complete" in log and "[bpe] building" in log
    # the same files as a run that was never interrupted
    ref_out, ref_bin = tmp_path / "ref-out", tmp_path / "ref-bin"
    assert iwslt.main(argv + ["--out", str(ref_out), "--bin", str(ref_bin)]) == 0
    for name in ("bpe/train.de", "bpe/test.en", "tok/valid.en", "raw/test.de"):
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), name
    for name in ("train.de-en.de.bin", "dict.de.txt", "test.de-en.en.idx"):
        assert (bin_dir / name).read_bytes() == (ref_bin / name).read_bytes(), name


@pytest.mark.parametrize("with_filter", [True, False], ids=["tarfile-filter", "checked-by-hand"])
def test_extraction_refuses_the_same_members_with_and_without_tarfiles_filter(tmp_path, monkeypatch, with_filter):
    from fairseq_lnpos.data.download import DataError, UnsafeMember, extract

    if not with_filter:  # a Python whose tarfile has no extraction filters (before 3.8.17 / 3.11.4)
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
        monkeypatch.delattr(tarfile, "FilterError", raising=False)
    bad = [
        [("../evil", "file", "x")],
        [("{S}/outside/evil", "file", "x")],
        [("lnk", "symlink", "../outside"), ("lnk/evil", "file", "x")],
        [("lnk", "symlink", "{S}/outside")],
        [("d", "symlink", "."), ("d/e", "symlink", ".."), ("d/e/evil", "file", "x")],  # a chain of links
        [("hard", "hardlink", "../outside/x")],
    ]
    for i, members in enumerate(bad):
        sandbox = tmp_path / f"s{i}"
        sandbox.mkdir()
        evil_archive(*members)(sandbox)
        with pytest.raises(DataError, match="refusing to extract it") as e:
            extract(sandbox / "de-en.tgz", sandbox / "x" / "extracted", log=lambda m: None)
        assert isinstance(e.value, UnsafeMember) and "\n" not in str(e.value)
        assert list((sandbox / "outside").iterdir()) == [] and not (sandbox / "evil").exists()
        assert not (sandbox / "x" / "extracted").exists() and not (sandbox / "x" / ".extracted.extracting").exists()
    good = tmp_path / "good"
    good.mkdir()
    evil_archive(("de-en/a.txt", "file", "text"), ("de-en/lnk", "symlink", "a.txt"))(good)
    dest = extract(good / "de-en.tgz", good / "extracted", log=lambda m: None)
    assert (dest / "de-en" / "lnk").read_text() == "text"


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["tok", "binarize"])
def test_ctrl_c_on_the_script_is_one_line_130_and_a_rerun_resumes(tmp_path, stage):
    """A real SIGINT to the whole process group (as a terminal's Ctrl-C) while a stage is building,
    held there by tests/hold (tok: its files written, not yet complete; binarize: in a worker of
    fairseq-preprocess): one line from the command, none from the workers, nothing half-built left."""
    import signal
    import time

    script = REPO / "data-prep" / "make-synthetic.sh"
    argv = [str(script), "--out", str(tmp_path / "out"), "--bin", str(tmp_path / "bin"), "--train", "3000",
            "--valid", "50", "--test", "50", "--workers", "2"]
    env = dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    marker = tmp_path / "held"
    held = dict(env, LNPOS_TEST_HOLD_STAGE=stage, LNPOS_TEST_HOLD_MARKER=str(marker),
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "tests" / "hold"), env.get("PYTHONPATH")])))
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(argv, stdout=o, stderr=e, text=True, env=held, start_new_session=True)
    deadline = time.monotonic() + 600  # a bound on a hung command, not on its speed
    while not marker.exists() and proc.poll() is None:
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"stage {stage} not reached: {out.read_text()[-2000:]}")
        time.sleep(0.1)
    assert proc.poll() is None, f"exit {proc.returncode} before stage {stage} held: {err.read_text()[-3000:]}"
    before = err.read_text()  # fairseq-preprocess's log so far
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert f"[{stage}] building" in out.read_text() and f"[{stage}] done" not in out.read_text()
    after = err.read_text()
    lines = [line for line in after[len(before):].splitlines() if line.strip()]
    assert proc.returncode == 130 and after.startswith(before), after[-3000:]
    assert lines == [f"make-synthetic.sh: {INTERRUPTED}"], after[-3000:]
    assert not list(tmp_path.glob("out/.*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[raw] complete" in res.stdout and (tmp_path / "bin" / "lnpos-data.json").is_file()


def test_an_error_that_follows_ctrl_c_is_reported_as_the_interruption():
    """A KeyboardInterrupt raised inside an ``import`` can leave a library half-imported, and the
    next use fails with an unrelated error (numpy: RecursionError): after a Ctrl-C that error is the
    interruption (one line, 130, resumable); without one an error stays itself."""
    import signal
    import time

    from fairseq_lnpos.data.pipeline import interrupt_main_process_only

    before = signal.getsignal(signal.SIGINT)  # Python's default_int_handler, or SIG_IGN in a background job
    with pytest.raises(KeyboardInterrupt) as info:
        with interrupt_main_process_only():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                raise RecursionError("maximum recursion depth exceeded")
    assert isinstance(info.value.__cause__, RecursionError)
    with pytest.raises(ValueError):
        with interrupt_main_process_only():
            raise ValueError("not an interruption")
    assert signal.getsignal(signal.SIGINT) is before  # restored


@pytest.mark.parametrize("upstream_layer", [False, True])
def test_weights_of_another_model_are_one_checkpoint_error(upstream_layer):
    """torch reports a missing weight as a RuntimeError; upstream fairseq 0.12.2's encoder layer reads
    its attention weights out of the state dict itself and raises KeyError. Both name the weight."""
    import torch

    from fairseq_lnpos.checkpoint import CheckpointError, guard_state_loading

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

        def _load_from_state_dict(self, state_dict, prefix, *args):
            if upstream_layer:
                state_dict[prefix + "w"]  # what upstream's TransformerEncoderLayer does for q_proj
            super()._load_from_state_dict(state_dict, prefix, *args)

    model = guard_state_loading(torch.nn.Sequential(Layer(), Layer()), "an_arch")
    model.load_state_dict({"0.w": torch.ones(2), "1.w": torch.ones(2)})  # fits: loads
    assert model[1].w.tolist() == [1.0, 1.0]
    with pytest.raises(CheckpointError) as e:
        model.load_state_dict({"0.w": torch.ones(2)})
    msg = str(e.value)
    assert msg.startswith("the checkpoint's weights do not fit --arch an_arch (") and '"1.w"' in msg, msg
    assert len(msg.splitlines()) == 1


def test_a_scalenorm_checkpoint_without_its_later_parameters_says_so(toy_data):
    from conftest import build_model
    from fairseq_lnpos.checkpoint import CheckpointError, guard_state_loading

    model = guard_state_loading(build_model(toy_data, "transformer_scalenorm_tiny")[0], "transformer_scalenorm_tiny")
    state = model.state_dict()
    model.load_state_dict(state)  # a checkpoint of this version: loads
    old = {k: v for k, v in state.items() if k not in ("lang_embedding", "decoder.output_projection.bias")}
    with pytest.raises(CheckpointError) as e:
        model.load_state_dict(old)
    assert str(e.value) == (
        "the checkpoint predates --arch transformer_scalenorm_tiny's language embedding and output bias "
        "(lang_embedding, decoder.output_projection.bias): it cannot be read by this version of the architecture: "
        "train the model again (the grid: remove its run folder)")
