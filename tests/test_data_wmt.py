"""WMT14 En-De preparation on small files in the archives' layout, and on the real newstest2014 SGML."""
import contextlib
import io
from pathlib import Path

import pytest

from fairseq_lnpos.data import wmt
from fairseq_lnpos.data.manifest import read_manifest
from fairseq_lnpos.data.pipeline import raw_segments, read_lines
from conftest import REALDATA, needs_realdata
from fixtures_data import make_wmt_orig


def lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("wmt")
    orig = make_wmt_orig(root / "orig")
    out, bin_dir = root / "text", root / "bin"
    argv = ["--orig", str(orig), "--out", str(out), "--bin", str(bin_dir), "--workers", "1",
            "--bpe-size", "200", "--bpe-sample", "0"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert wmt.main(argv) == 0, buf.getvalue()
    return out, bin_dir, argv


def test_training_text_normalized_aggressive_not_lowercased(prepared):
    out, _, _ = prepared
    en, de = lines(out / "tok" / "train.en"), lines(out / "tok" / "train.de")
    assert len(en) == len(de) == 40 + 20 + 10  # europarl, commoncrawl, news-commentary in that order
    # normalize-punctuation (curly quotes -> ", English period moved inside the quote), -a, escaping, case kept
    assert en[0] == "The well @-@ known house number 0 is &quot; big . &quot;"
    assert de[0] == "Das bekannte Haus Nummer 0 ist &quot; groß &quot; ."
    assert en[40] == "Yes , yes , yes , yes , yes , yes , yes , yes , yes ."


def test_valid_is_newstest2013_and_test_newstest2014(prepared):
    out, _, _ = prepared
    assert lines(out / "tok" / "valid.en") == ["One house .", "Two houses ."]
    assert lines(out / "tok" / "valid.de") == ["Ein Haus .", "Zwei Häuser ."]
    assert lines(out / "tok" / "test.en")[1:] == [
        "A well @-@ known state @-@ of @-@ the @-@ art design &amp; amp ; more .",  # as fairseq: entity not decoded
        "It &apos;s 100 metres apart ."]  # typographic apostrophe mapped before tokenization
    assert lines(out / "raw" / "test.de") == [
        "Gutach: Noch mehr Sicherheit für Fußgänger", "Ein bekanntes Design nach dem Stand der Technik & mehr.",
        "Es sind 100 Meter."]


def test_bpe_level_cleaning_and_manifest(prepared):
    out, bin_dir, _ = prepared
    assert len(lines(out / "bpe" / "train.en")) == 69  # the "yes , yes ..." / "ja ." pair is gone
    assert not any(l.startswith("\u2581Ja") for l in lines(out / "bpe" / "train.de"))
    m = read_manifest(bin_dir)
    assert (m["source_lang"], m["target_lang"], m["lowercase"], m["compound_split"]) == ("en", "de", False, True)
    assert m["counts"] == {"train": 69, "valid": 2, "test": 3}
    assert Path(m["refs"]["raw"]["test"]) == (out / "raw" / "test.de").resolve()


def test_rerun_skips_everything(prepared, capsys):
    out, bin_dir, argv = prepared
    before = (bin_dir / "train.en-de.en.bin").stat().st_mtime_ns
    assert wmt.main(argv) == 0
    assert capsys.readouterr().out.count("skipped") == 4  # raw, tok, bpe, binarize
    assert (bin_dir / "train.en-de.en.bin").stat().st_mtime_ns == before


def test_bad_inputs(tmp_path, capsys):
    orig = make_wmt_orig(tmp_path / "orig", n=8)
    (orig / "test-full" / "newstest2014-deen-ref.de.sgm").unlink()
    assert wmt.main(["--orig", str(orig), "--out", str(tmp_path / "o"), "--bin", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "newstest2014-deen-ref.de.sgm" in err and "\n" not in err
    orig = make_wmt_orig(tmp_path / "orig2", n=8)
    cc = orig / "commoncrawl.de-en.de"
    cc.write_text(cc.read_text() + "Eine Zeile zu viel.\n")
    assert wmt.main(["--orig", str(orig), "--out", str(tmp_path / "o"), "--bin", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "commoncrawl.de-en.de has 5 lines" in err and "commoncrawl.de-en.en has 4" in err
    assert not (tmp_path / "o" / "tok").exists() and not (tmp_path / "b").exists()
    assert wmt.main(["--archive", str(tmp_path / "x.tgz"), "--out", str(tmp_path / "o")]) == 2
    assert "unknown file name" in capsys.readouterr().err


NEWSTEST = REALDATA / "wmt14-newstest"


@needs_realdata("wmt14-newstest")
def test_real_newstest2014_sgml():
    ref = raw_segments(read_lines(NEWSTEST / "newstest2014-deen-ref.de.sgm"))
    assert len(ref) == 3003
    assert ref == read_lines(NEWSTEST / "newstest2014.de")  # the official plain-text reference, line for line
    src = wmt.test_segments(NEWSTEST / "newstest2014-deen-src.en.sgm")
    assert len(src) == 3003 and src[0] == "Gutach: Increased safety for pedestrians"
