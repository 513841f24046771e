"""IWSLT14 German-English, step for step as fairseq's examples/translation/prepare-iwslt14.sh.

    python -m fairseq_lnpos.data.iwslt [--archive de-en.tgz | --orig DIR] [--out DIR] [--bin DIR]

Steps (fairseq's order): train.tags.de-en.{de,en}: drop lines containing <url>, <talkid> or
<keywords>, strip the <title>/<description> tags (their text stays as a training line); Moses
tokenizer per language; clean-corpus-n (ratio 1.5, 1..175 tokens); lowercase; valid = every 23rd
line, train = the rest. Dev/test XML: the <seg id=...> lines without the seg tags and the spaces
around them, the typographic apostrophe mapped to ', tokenized and lowercased; test = TED
dev2010 + TEDX dev2012 + TED tst2010..2012. Then joint BPE (sentencepiece instead of subword-nmt)
and fairseq-preprocess --joined-dictionary.
"""
import re
import sys
from functools import partial
from pathlib import Path

from fairseq_lnpos.data import BIN_DIRS, bpe, moses, text_dir
from fairseq_lnpos.data.download import DataError, download, extract_once
from fairseq_lnpos.data.pipeline import (
    add_folder_options,
    check_parallel, counts_of, log, map_lines, raw_segments, read_lines, require_files,
    run_dataset, run_stage, write_lines, xml_segments,
)
from fairseq_lnpos.cli import CommandParser, at_least
from fairseq_lnpos.errors import run_main

URL = "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"
ARCHIVE = "de-en.tgz"
SRC, TGT, PAIR = "de", "en", "de-en"
TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
             "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")  # concatenated in this order
DROP_TAGS = ("<url>", "<talkid>", "<keywords>")
STRIP_TAGS = re.compile(r"</?(title|description)>")


def train_tag_filter(lines):
    """grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' | sed (strip title/description tags)."""
    return [STRIP_TAGS.sub("", l) for l in lines if not any(t in l for t in DROP_TAGS)]


def tok_lc(line, lang):
    return moses.lowercase(moses.tokenize(line, lang))


def orig_files(orig):
    train = [orig / f"train.tags.{PAIR}.{l}" for l in (SRC, TGT)]
    xml = [orig / f"{name}.{PAIR}.{l}.xml" for name in TEST_SETS for l in (SRC, TGT)]
    return train, xml


def locate_orig(out, archive=None, orig=None):
    """The folder holding train.tags.* and the XML files: --orig, an extracted --archive, or a download."""
    if orig:
        orig = Path(orig)
        if not orig.is_dir():
            raise DataError(f"--orig {orig}: not a folder: pass the extracted de-en folder of {ARCHIVE}")
        if (orig / PAIR).is_dir() and not (orig / f"train.tags.{PAIR}.{SRC}").exists():
            orig = orig / PAIR
    else:
        given = archive is not None
        archive = Path(archive) if given else out / "orig" / ARCHIVE
        dest = out / "orig" / "extracted"
        if given and not archive.is_file():
            raise DataError(f"--archive {archive}: no such file: pass a local copy of {URL}")
        if not given:
            download(URL, archive, ARCHIVE)  # verified; a complete file is not fetched again
        extract_once(archive, dest, ARCHIVE, check=given)
        orig = dest / PAIR if (dest / PAIR).is_dir() else dest
    train, xml = orig_files(orig)
    require_files(train + xml, f"{orig} should be the de-en folder of fairseq's {ARCHIVE} "
                               f"(train.tags.de-en.{{de,en}} and the ten IWSLT14.TED*.xml files)")
    return orig


def build_raw(orig, tmp):
    """raw/test.{de,en}: the untokenized test sentences (sacreBLEU references)."""
    n = None
    for lang in (SRC, TGT):
        lines = []
        for name in TEST_SETS:
            lines += raw_segments(read_lines(orig / f"{name}.{PAIR}.{lang}.xml"))
        write_lines(tmp / f"test.{lang}", lines)
        log(f"  raw/test.{lang}: {len(lines)} lines")
        n = len(lines) if n is None else n
    return n


def build_tok(orig, tmp, workers, max_len=175, ratio=1.5, valid_every=23):
    """tok/{train,valid,test}.{de,en}: tokenized, lowercased text (the references of tokenized BLEU)."""
    # training text
    side = {}
    for lang in (SRC, TGT):
        path = orig / f"train.tags.{PAIR}.{lang}"
        lines = read_lines(path)
        kept = train_tag_filter(lines)
        log(f"  {path.name}: {len(lines)} lines, {len(lines) - len(kept)} tag lines dropped")
        side[lang] = map_lines(partial(moses.tokenize, lang=lang), kept, workers, label=f"tokenize {lang}")
    check_parallel(side[SRC], side[TGT], str(orig / f"train.tags.{PAIR}.{SRC}") + " (without tag lines)",
                   str(orig / f"train.tags.{PAIR}.{TGT}") + " (without tag lines)")
    pairs = [(moses.squeeze(s), moses.squeeze(t)) for s, t in zip(side[SRC], side[TGT])]
    pairs = [(s, t) for s, t in pairs if moses.keep_pair(s, t, 1, max_len, ratio)]
    log(f"  clean-corpus-n (ratio {ratio}, 1..{max_len}): {len(pairs)} of {len(side[SRC])} pairs kept")
    if not pairs:
        raise DataError(f"{orig / f'train.tags.{PAIR}.{SRC}'} and its {TGT} side hold no sentence pair to train on "
                        f"(empty, or only tag lines): pass the original files of {ARCHIVE}")
    counts = {}
    for i, lang in enumerate((SRC, TGT)):
        text = [moses.lowercase(p[i]) for p in pairs]
        valid = [l for n, l in enumerate(text, 1) if n % valid_every == 0]
        train = [l for n, l in enumerate(text, 1) if n % valid_every != 0]
        write_lines(tmp / f"train.{lang}", train)
        write_lines(tmp / f"valid.{lang}", valid)
        counts["train"], counts["valid"] = len(train), len(valid)
    # dev/test text
    test = {SRC: [], TGT: []}
    for name in TEST_SETS:
        segs = {}
        for lang in (SRC, TGT):
            segs[lang] = map_lines(partial(tok_lc, lang=lang),
                                   xml_segments(read_lines(orig / f"{name}.{PAIR}.{lang}.xml")), workers)
            test[lang] += segs[lang]
        check_parallel(segs[SRC], segs[TGT], str(orig / f"{name}.{PAIR}.{SRC}.xml"),
                       str(orig / f"{name}.{PAIR}.{TGT}.xml"))
        log(f"  {name}: {len(segs[SRC])} segments")
    for lang in (SRC, TGT):
        write_lines(tmp / f"test.{lang}", test[lang])
    counts["test"] = len(test[SRC])
    log("  tok: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return counts


def parser():
    p = CommandParser(prog="prepare-iwslt14.sh", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--archive", help=f"a local copy of {ARCHIVE} (no download)")
    src.add_argument("--orig", help=f"the extracted de-en folder of {ARCHIVE} (no download)")
    add_folder_options(p, "iwslt14", bpe_size=10000)
    return p


def prepare(out=text_dir("iwslt14"), bin_dir=BIN_DIRS["iwslt14"], archive=None, orig=None,
            workers=1, bpe_size=10000):
    """Text stages in ``out``, fairseq's binarized data and the manifest in ``bin_dir``; returns the
    pair counts per split. ``archive`` (a local de-en.tgz) or ``orig`` (its extracted folder), else
    downloaded. Raises :class:`DataError` for bad input."""
    if archive and orig:
        raise DataError("give either --orig or --archive, not both")
    at_least(1, "--bpe-size", bpe_size)

    def stages(out):
        where = locate_orig(out, archive, orig)
        files = [str(p) for group in orig_files(where) for p in group]
        inputs = {Path(f).name: (Path(f).stat().st_size, int(Path(f).stat().st_mtime)) for f in files}
        p_raw = run_stage(out / "raw", {"inputs": inputs, "v": 1}, partial(build_raw, where))
        p_tok = run_stage(out / "tok", {"inputs": inputs, "v": 1}, lambda tmp: build_tok(where, tmp, workers))
        p_bpe = run_stage(out / "bpe", {"tok": p_tok, "vocab": bpe_size, "v": 1},
                          lambda tmp: bpe.build(out / "tok", tmp, bpe_size, workers, SRC, TGT))
        return p_raw, p_bpe, counts_of(out / "tok", TGT)

    return run_dataset(out, bin_dir, workers, "iwslt14.de-en", (SRC, TGT), stages, lowercase=True,
                       compound_split=False)


def main(argv=None):
    def command(argv):
        a = parser().parse_args(argv)
        prepare(a.out, a.bin, a.archive, a.orig, a.workers, a.bpe_size)

    return run_main("prepare-iwslt14.sh", command, argv)


if __name__ == "__main__":
    sys.exit(main())
