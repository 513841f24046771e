"""Multi30k task 1 German-English (Elliott et al. 2016: image captions), prepared like IWSLT14.

    python -m fairseq_lnpos.data.multi30k [--orig DIR] [--out DIR] [--bin DIR] [--bpe-size N]

Input: the six gzip files ``{train,val,test_2016_flickr}.{de,en}.gz`` of ``data/task1/raw/`` in the
dataset's official repository (multi30k/dataset), downloaded from it at a fixed commit into
``OUT/orig/`` or taken from ``--orig DIR``; every file is checked against the sha256 recorded in
SHA256SUMS before it is read, and the stages are keyed on those hashes (the same files give the same
output wherever they lie).

Splits as published, no pair dropped: train = train (29,000 pairs), valid = val (1,014),
test = test_2016_flickr (1,000). ``raw/``: the six files decompressed, line for line as published
(``raw/test.en`` is sacreBLEU's reference). ``tok/``: the text steps of ``iwslt.py`` (Moses
tokenizer per language, then lowercase; the references of tokenized BLEU). Then joint sentencepiece
BPE and fairseq-preprocess --joined-dictionary, with the manifest, as for every dataset.
(The dataset's own ``data/task1/tok`` files are made in another order, lowercase ->
normalize-punctuation -> tokenizer; we keep the IWSLT steps so that both datasets are scored alike.)

BPE size: 8,000 joint pieces by default instead of the 10,000 of fairseq's IWSLT14 recipe. Multi30k
has about a tenth of IWSLT14's training text (29,000 short captions, about 370k words per side by the
dataset's own statistics, against about 160k TED sentences), and smaller subword vocabularies serve
small corpora better: each piece is seen often enough to learn its embedding (Sennrich & Zhang 2019,
"Revisiting Low-Resource Neural Machine Translation"; Ding et al. 2019, "A Call for Prudent Choice of
Subword Merge Operations in Neural Machine Translation"). The step down is moderate, not a tuned
optimum: sequences stay close to their length in words, and the ``_iwslt_de_en`` models keep an
embedding table of the same order as on IWSLT14. ``--bpe-size`` changes it (BPE and
binarization are redone, the tokenized text is kept).
"""
import gzip
import sys
import zlib
from functools import partial
from pathlib import Path

from fairseq_lnpos.data import BIN_DIRS, bpe, text_dir
from fairseq_lnpos.data.download import DataError, download, sha256_of, verify
from fairseq_lnpos.data.iwslt import tok_lc
from fairseq_lnpos.cli import CommandParser, at_least
from fairseq_lnpos.errors import run_main
from fairseq_lnpos.data.pipeline import (
    add_folder_options,
    check_parallel, counts_of, log, map_lines, read_lines, require_files, run_dataset, run_stage,
    write_lines,
)

REPOSITORY = "multi30k/dataset"
# the six files were added in c9be912 (2018-01-17) and are unchanged since (checked with `git log`)
COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
URL = f"https://raw.githubusercontent.com/{REPOSITORY}/{COMMIT}/data/task1/raw/"
SRC, TGT = "de", "en"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # our split -> the dataset's file stem
FILES = tuple(f"{stem}.{lang}.gz" for stem in SPLITS.values() for lang in (SRC, TGT))


def locate_files(orig, out):
    """{file name: (path, sha256)} of the six verified input files: from ``orig``, or downloaded."""
    if orig:
        orig = Path(orig)
        if not orig.is_dir():
            raise DataError(f"--orig {orig}: not a folder: pass the folder holding {', '.join(FILES)}")
        paths = {name: orig / name for name in FILES}
        require_files(paths.values(), f"--orig should hold the six files {', '.join(FILES)} "
                                      f"of data/task1/raw/ in the {REPOSITORY} repository")
        return {name: (path, verify(path, name, log=log)) for name, path in paths.items()}
    offline = (f"download the six files {', '.join(FILES)} of {URL} yourself and pass their folder with --orig")
    paths = {name: download(URL + name, out / "orig" / name, name, log=log, offline=offline) for name in FILES}
    return {name: (path, sha256_of(path)) for name, path in paths.items()}


def gunzip_lines(path):
    """The lines of a gzip file of UTF-8 text, split on '\\n' only."""
    try:
        text = gzip.decompress(Path(path).read_bytes()).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a gzip file of UTF-8 text ({type(e).__name__}: {e}): "
                        f"delete it and download it again") from None
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def build_raw(files, tmp):
    """raw/{train,valid,test}.{de,en}: the published files decompressed, checked line-aligned."""
    for split, stem in SPLITS.items():
        side = {lang: gunzip_lines(files[f"{stem}.{lang}.gz"][0]) for lang in (SRC, TGT)}
        check_parallel(side[SRC], side[TGT], str(files[f"{stem}.{SRC}.gz"][0]), str(files[f"{stem}.{TGT}.gz"][0]))
        for lang in (SRC, TGT):
            write_lines(tmp / f"{split}.{lang}", side[lang])
        log(f"  raw/{split}: {len(side[SRC])} pairs ({stem})")


def build_tok(raw_dir, tmp, workers):
    """tok/{split}.{lang}: Moses-tokenized, lowercased."""
    for split in SPLITS:
        for lang in (SRC, TGT):
            lines = read_lines(raw_dir / f"{split}.{lang}")
            write_lines(tmp / f"{split}.{lang}", map_lines(partial(tok_lc, lang=lang), lines, workers,
                                                           label=f"tokenize {split}.{lang}"))


def stages(out, orig=None, workers=1, bpe_size=8000):
    """The text stages (raw, tok, bpe) in ``out``: (raw fingerprint, bpe fingerprint, pair counts)."""
    out.mkdir(parents=True, exist_ok=True)
    files = locate_files(orig, out)
    p_raw = run_stage(out / "raw", {"inputs": {name: digest for name, (_, digest) in files.items()}, "v": 1},
                      partial(build_raw, files))
    p_tok = run_stage(out / "tok", {"raw": p_raw, "v": 1}, lambda tmp: build_tok(out / "raw", tmp, workers))
    p_bpe = run_stage(out / "bpe", {"tok": p_tok, "vocab": bpe_size, "v": 1},
                      lambda tmp: bpe.build(out / "tok", tmp, bpe_size, workers, SRC, TGT))
    return p_raw, p_bpe, counts_of(out / "tok", TGT)


def prepare(out=text_dir("multi30k"), bin_dir=BIN_DIRS["multi30k"], orig=None, workers=1,
            bpe_size=8000):
    """Text stages in ``out``, fairseq's binarized data and the manifest in ``bin_dir``; returns the
    pair counts per split. ``orig``: a folder with the six files, else they are downloaded. Raises
    :class:`DataError` for bad input."""
    at_least(1, "--bpe-size", bpe_size)
    return run_dataset(out, bin_dir, workers, "multi30k.de-en", (SRC, TGT),
                       partial(stages, orig=orig, workers=workers, bpe_size=bpe_size), lowercase=True,
                       compound_split=False)


def parser():
    p = CommandParser(prog="prepare-multi30k.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--orig", help=f"a folder holding {', '.join(FILES)} (no download)")
    add_folder_options(p, "multi30k", bpe_size=8000)
    return p


def main(argv=None):
    def command(argv):
        a = parser().parse_args(argv)
        prepare(a.out, a.bin, a.orig, a.workers, a.bpe_size)

    return run_main("prepare-multi30k.sh", command, argv)


if __name__ == "__main__":
    sys.exit(main())
