"""WMT14 English-German as fairseq's examples/translation/prepare-wmt14en2de.sh --icml17, with
newstest2013 as validation set (as the paper; fairseq's script holds out every 100th training line).

    python -m fairseq_lnpos.data.wmt [--archive FILE.tgz ...] [--orig DIR] [--out DIR] [--bin DIR]

Training text: europarl v7, commoncrawl, news-commentary v9 (WMT14's), each line through
normalize-punctuation, remove-non-printing-char and the Moses tokenizer with aggressive hyphen
splitting (-a); no lowercasing. newstest2013 (valid) and newstest2014 (test, the full 3003-line
set) come from the official SGML: the <seg id=...> lines, seg tags and surrounding spaces
removed, typographic apostrophe mapped to ', tokenized with -a (fairseq does not normalise them).
Joint sentencepiece BPE (default 37000 pieces: the paper's 37K joint vocabulary) learned on the
tokenized training text; then the training pairs are cleaned on BPE pieces (ratio 1.5, 1..250
pieces; fairseq's order) and binarized with fairseq-preprocess --joined-dictionary.
"""
import sys
from functools import partial
from pathlib import Path

from fairseq_lnpos.common import open_log
from fairseq_lnpos.data import BIN_DIRS, bpe, moses, text_dir
from fairseq_lnpos.data.download import DataError, download, extract_once
from fairseq_lnpos.data.pipeline import (
    add_folder_options,
    check_parallel, count_lines, log, map_lines, raw_segments, read_lines, run_dataset,
    run_stage, write_lines, xml_segments,
)
from fairseq_lnpos.cli import CommandParser, at_least
from fairseq_lnpos.errors import run_main

SRC, TGT = "en", "de"
ARCHIVES = {  # file name -> address (fairseq's prepare-wmt14en2de.sh --icml17)
    "training-parallel-europarl-v7.tgz": "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v9.tgz": "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",
    "dev.tgz": "http://data.statmt.org/wmt17/translation-task/dev.tgz",
    "test-full.tgz": "http://statmt.org/wmt14/test-full.tgz",
}
CORPORA = ("europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en")  # .{en,de}
VALID = {SRC: "newstest2013-src.en.sgm", TGT: "newstest2013-ref.de.sgm"}
VALID_PLAIN = {SRC: "newstest2013.en", TGT: "newstest2013.de"}
TEST = {SRC: "newstest2014-deen-src.en.sgm", TGT: "newstest2014-deen-ref.de.sgm"}


def find(orig, name):
    """The file called ``name`` anywhere under ``orig`` (archives differ in their folder layout)."""
    direct = Path(orig) / name
    if direct.is_file():
        return direct
    hits = sorted(p for p in Path(orig).rglob(name) if p.is_file())
    return hits[0] if hits else None


def input_files(orig):
    files, missing = {}, []
    for corpus in CORPORA:
        for lang in (SRC, TGT):
            files[f"{corpus}.{lang}"] = find(orig, f"{corpus}.{lang}")
    for lang in (SRC, TGT):
        files[f"valid.{lang}"] = find(orig, VALID[lang]) or find(orig, VALID_PLAIN[lang])
        files[f"test.{lang}"] = find(orig, TEST[lang])
    missing = [k for k, v in files.items() if v is None]
    if missing:
        want = {**{f"valid.{l}": VALID[l] for l in (SRC, TGT)}, **{f"test.{l}": TEST[l] for l in (SRC, TGT)}}
        raise DataError(f"{orig}: no file {want.get(missing[0], missing[0])} in it"
                        + (f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else "")
                        + ": pass the folder where the WMT14 archives are extracted")
    return files


def locate_orig(out, archives=(), orig=None):
    if orig:
        orig = Path(orig)
        if not orig.is_dir():
            raise DataError(f"--orig {orig}: not a folder: pass the folder with the extracted WMT14 archives")
        return orig
    given = {Path(a).name: Path(a) for a in archives or []}
    for name, path in given.items():
        if name not in ARCHIVES:
            raise DataError(f"--archive {path}: unknown file name; expected one of {', '.join(ARCHIVES)}")
        if not path.is_file():
            raise DataError(f"--archive {path}: no such file")
    orig = out / "orig"
    for name, url in ARCHIVES.items():
        dest = orig / name.replace(".tgz", "")
        archive = given.get(name, orig / name)
        if name not in given:
            download(url, archive, name)  # verified; a complete file is not fetched again
        extract_once(archive, dest, name, check=name in given)
    return orig


def train_line(line, lang):
    return moses.tokenize(moses.remove_non_printing(moses.normalize_punctuation(line, lang)), lang, aggressive=True)


def test_segments(path):
    lines = read_lines(path)
    return xml_segments(lines) if path.suffix == ".sgm" else [l.strip().replace("\u2019", "'") for l in lines]


def build_tok(files, tmp, workers):
    for corpus in CORPORA:  # line-aligned? (checked before hours of tokenization)
        a, b = files[f"{corpus}.{SRC}"], files[f"{corpus}.{TGT}"]
        na, nb = count_lines(a), count_lines(b)
        if na != nb:
            raise DataError(f"{b} has {nb} lines but {a} has {na}: the two sides must be line-aligned; "
                            f"extract the original archive again")
    for lang in (SRC, TGT):
        n = 0
        with open_log(tmp / f"train.{lang}", truncate=True) as f:
            for corpus in CORPORA:
                lines = read_lines(files[f"{corpus}.{lang}"])
                for line in map_lines(partial(train_line, lang=lang), lines, workers, label=f"{corpus}.{lang}"):
                    f.write(line + "\n")
                n += len(lines)
        log(f"  tok/train.{lang}: {n} lines")
    for split in ("valid", "test"):
        segs = {lang: test_segments(files[f"{split}.{lang}"]) for lang in (SRC, TGT)}
        check_parallel(segs[SRC], segs[TGT], str(files[f"{split}.{SRC}"]), str(files[f"{split}.{TGT}"]))
        for lang in (SRC, TGT):
            write_lines(tmp / f"{split}.{lang}",
                        map_lines(partial(moses.tokenize, lang=lang, aggressive=True), segs[lang], workers))
        log(f"  tok/{split}: {len(segs[SRC])} lines")


def build_raw(files, tmp):
    for lang in (SRC, TGT):
        lines = raw_segments(read_lines(files[f"test.{lang}"]))
        write_lines(tmp / f"test.{lang}", lines)
        log(f"  raw/test.{lang}: {len(lines)} lines")


def build_bpe(tok_dir, tmp, vocab_size, workers, sample, max_len=250, ratio=1.5):
    bpe.build(tok_dir, tmp, vocab_size, workers, SRC, TGT, sample=sample)
    src, tgt = read_lines(tmp / f"train.{SRC}"), read_lines(tmp / f"train.{TGT}")
    keep = [moses.keep_pair(moses.squeeze(s), moses.squeeze(t), 1, max_len, ratio) for s, t in zip(src, tgt)]
    for lang, lines in ((SRC, src), (TGT, tgt)):
        write_lines(tmp / f"train.{lang}", (moses.squeeze(l) for l, k in zip(lines, keep) if k))
    log(f"  clean-corpus-n on BPE pieces (ratio {ratio}, 1..{max_len}): {sum(keep)} of {len(keep)} pairs kept")


def parser():
    p = CommandParser(prog="prepare-wmt14en2de.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--archive", action="append", metavar="FILE",
                   help=f"a local copy of one of {', '.join(ARCHIVES)} (repeat; the others are downloaded)")
    p.add_argument("--orig", help="a folder with all archives extracted (no download)")
    add_folder_options(p, "wmt14", bpe_size=37000)
    p.add_argument("--bpe-sample", type=int, default=2000000,
                   help="lines sampled to learn the BPE, 0 = all (default: %(default)s)")
    return p


def prepare(out=text_dir("wmt14"), bin_dir=BIN_DIRS["wmt14"], archives=(), orig=None, workers=1,
            bpe_size=37000, bpe_sample=2000000):
    """Text stages in ``out``, fairseq's binarized data and the manifest in ``bin_dir``; returns the
    pair counts per split. ``archives``: local copies of some of :data:`ARCHIVES` (the others are
    downloaded); ``orig``: a folder with all of them extracted. Raises :class:`DataError`."""
    if orig and archives:
        raise DataError("give either --orig or --archive, not both")
    at_least(1, "--bpe-size", bpe_size)
    at_least(0, "--bpe-sample", bpe_sample)

    def stages(out):
        files = input_files(locate_orig(out, archives, orig))
        inputs = {k: (str(v), v.stat().st_size, int(v.stat().st_mtime)) for k, v in files.items()}
        p_raw = run_stage(out / "raw", {"inputs": inputs, "v": 1}, partial(build_raw, files))
        p_tok = run_stage(out / "tok", {"inputs": inputs, "v": 1}, lambda tmp: build_tok(files, tmp, workers))
        p_bpe = run_stage(out / "bpe", {"tok": p_tok, "vocab": bpe_size, "sample": bpe_sample, "v": 1},
                          lambda tmp: build_bpe(out / "tok", tmp, bpe_size, workers, bpe_sample))
        return p_raw, p_bpe, {split: count_lines(out / "bpe" / f"{split}.{TGT}") for split in ("train", "valid", "test")}

    return run_dataset(out, bin_dir, workers, "wmt14.en-de", (SRC, TGT), stages, lowercase=False, compound_split=True)


def main(argv=None):
    def command(argv):
        a = parser().parse_args(argv)
        prepare(a.out, a.bin, a.archive or (), a.orig, a.workers, a.bpe_size, a.bpe_sample)

    return run_main("prepare-wmt14en2de.sh", command, argv)


if __name__ == "__main__":
    sys.exit(main())
