"""Shared fixtures: a toy parallel corpus binarized by fairseq, and in-process model building
through fairseq's own command-line parser (the path fairseq-train takes)."""
import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "fairseq_lnpos")
TOOLS = REPO / "scripts" / "tools"  # the maintainers' measurement scripts: not part of the package
# real corpora some data tests compare with (docs/data.md); those tests skip where it is absent
REALDATA = REPO / os.environ.get("LNPOS_REALDATA", "../shared/realdata")
BIN = Path(sys.executable).parent


def needs_realdata(name):
    """Skip a test unless the real-data folder (LNPOS_REALDATA) holds ``name``; ``REALDATA / name`` then."""
    return pytest.mark.skipif(not (REALDATA / name).is_dir(), reason=f"{name} is absent from {REALDATA} (LNPOS_REALDATA)")


def page_argv(page):
    """The command line a results page ``page`` (its folder) records (``- Command: `...```), as argv."""
    import re
    import shlex

    return shlex.split(re.search(r"^- Command: `(.*)`$", (Path(page) / "index.md").read_text(), re.M).group(1))


def tool(name):
    """The script ``scripts/tools/<name>.py`` as a module (``tool("bench").summary``), loaded from its
    file once; it imports the package as any other code does."""
    key = f"scripts.tools.{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # before running it: its dataclasses look their module up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]


def fairseq_cmd(tool, *args):
    """Command line for a fairseq console script of this interpreter's environment."""
    return [str(BIN / tool), *map(str, args)]


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, **kw)


def write_toy_corpus(folder, n_train=400, seed=0):
    """Source: random words; target: the same sentence word-mapped and reversed."""
    rng = random.Random(seed)
    src_vocab = [f"s{i}" for i in range(40)]
    mapping = {w: f"t{i}" for i, w in enumerate(src_vocab)}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", 40), ("test", 40)):
        src, tgt = [], []
        for _ in range(n):
            words = [rng.choice(src_vocab) for _ in range(rng.randint(3, 8))]
            src.append(" ".join(words))
            tgt.append(" ".join(mapping[w] for w in reversed(words)))
        (folder / f"{split}.de").write_text("\n".join(src) + "\n")
        (folder / f"{split}.en").write_text("\n".join(tgt) + "\n")
    return folder


def binarize(text_dir, bin_dir):
    text_dir = Path(text_dir)
    result = run(fairseq_cmd(
        "fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
        "--trainpref", text_dir / "train", "--validpref", text_dir / "valid", "--testpref", text_dir / "test",
        "--destdir", bin_dir, "--joined-dictionary", "--workers", "1",
    ))
    assert result.returncode == 0, result.stderr
    return Path(bin_dir)


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    return binarize(write_toy_corpus(root / "text"), root / "bin")


def two_layers(arch):
    """Flags for ``arch`` (a plugin arch name) with 2 encoder and 2 decoder layers. Mix-LN's default
    ratio (0.25) would leave no Post-LN layer in such a stack, which is refused: it gets 0.5."""
    mixln = arch.startswith("transformer_mixln")
    return ("--encoder-layers", 2, "--decoder-layers", 2) + (("--mixln-post-ratio", 0.5) if mixln else ())


def train_argv(data, arch, *extra):
    return [data, "--user-dir", USER_DIR, "--task", "translation", "-s", "de", "-t", "en", "--arch", arch, *extra]


def build_model(data, arch, *extra, seed=1):
    """Build a model exactly as fairseq-train does, seeded (fairseq_lnpos.fairseq_build)."""
    from fairseq_lnpos import fairseq_build

    built = fairseq_build.build(train_argv(data, arch, *extra), seed=seed)
    built.model.eval()
    return built.model, built.task, built.args


def same_state(a, b):
    """Two state dicts hold the same names in the same order and equal tensors. Only
    ``embed_positions._float_tensor`` is left out: it carries a dtype and a device, and upstream
    fairseq 0.12.2 leaves its one value uninitialised."""
    return list(a) == list(b) and all(
        a[k].shape == b[k].shape and (k.endswith("._float_tensor") or a[k].equal(b[k])) for k in a)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts fairseq or data-prep processes (deselect with -m 'not slow')")
