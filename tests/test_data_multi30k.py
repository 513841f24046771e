"""Multi30k preparation: a small gzip fixture in the published format (no real data needed), the
checksum refusal, the download addresses, and the real task 1 files where the real data (LNPOS_REALDATA)
has them."""
import contextlib
import json
import gzip
import hashlib
import io
import shutil
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from fairseq_lnpos.data import download, multi30k
from fairseq_lnpos.data.bpe import decode_pieces
from fairseq_lnpos.data.manifest import read_manifest
from conftest import REALDATA, needs_realdata
from fixtures_data import sha256

REAL = REALDATA / "multi30k-de-en" / "raw"
needs_real = needs_realdata("multi30k-de-en/raw")
SIZES = {"train": 300, "val": 20, "test_2016_flickr": 20}
# a caption of each side with the tokenizer's edge cases (apostrophe, quotes, umlaut, hyphen)
TRICKY = {"en": ("A small girl playing chess at her friend's house.",
                 "a small girl playing chess at her friend &apos;s house ."),
          "de": ('Eine Frau mit "Hut" fährt ein Seifenkisten-Rennen.',
                 "eine frau mit &quot; hut &quot; fährt ein seifenkisten-rennen .")}


def lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def caption(lang, i):
    people = [("man", "Mann"), ("woman", "Frau"), ("girl", "Mädchen"), ("dog", "Hund"), ("boy", "Junge")]
    acts = [("running", "rennt"), ("sitting", "sitzt"), ("jumping", "springt"), ("smiling", "lächelt")]
    places = [("on the grass", "auf dem Gras"), ("in the street", "auf der Straße"), ("near a tree", "neben einem Baum")]
    who, act, where = people[i % 5], acts[i // 5 % 4], places[i // 20 % 3]
    if lang == "en":
        return f"A {who[0]} is {act[0]} {where[0]} number {i}."
    return f"Ein {who[1]} {act[1]} {where[1]} Nummer {i}. " if i % 50 == 7 else f"Ein {who[1]} {act[1]} {where[1]} Nummer {i}."


def make_orig(root):
    """The six .gz files: captions (German lines with a trailing space now and then, as the real
    train.de), the tricky pair first in every split."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stem, n in SIZES.items():
        for lang in ("de", "en"):
            text = [TRICKY[lang][0]] + [caption(lang, i) for i in range(1, n)]
            (root / f"{stem}.{lang}.gz").write_bytes(gzip.compress(("\n".join(text) + "\n").encode(), mtime=0))
    return root


def sums_for(folder, dest):
    dest.write_text("".join(f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n" for n in multi30k.FILES))
    return dest


@contextlib.contextmanager
def recorded(sums):
    """SHA256SUMS replaced by ``sums`` (the fixture's hashes) for the duration."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(download, "CHECKSUMS", sums)
        mp.setattr(download.recorded_sha256, "__defaults__", (sums,))
        yield


@pytest.fixture(scope="module")
def orig(tmp_path_factory):
    root = tmp_path_factory.mktemp("m30k-orig")
    folder = make_orig(root / "raw")
    return folder, sums_for(folder, root / "SHA256SUMS")


@pytest.fixture(scope="module")
def text(orig, tmp_path_factory):
    """The text stages (raw, tok, bpe) on the fixture, without fairseq: (out folder, counts)."""
    folder, sums = orig
    out = tmp_path_factory.mktemp("m30k-text") / "text"
    with recorded(sums), contextlib.redirect_stdout(io.StringIO()):
        _, _, counts = multi30k.stages(out, orig=folder, workers=1, bpe_size=200)
    return out, counts


def test_splits_are_the_published_files(orig, text):
    folder, _ = orig
    out, counts = text
    assert counts == {"train": 300, "valid": 20, "test": 20}
    for split, stem in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("de", "en"):  # raw: the published lines, trailing spaces and all
            assert (out / "raw" / f"{split}.{lang}").read_bytes() == gzip.decompress((folder / f"{stem}.{lang}.gz").read_bytes())


@pytest.mark.parametrize("lang", ["de", "en"])
def test_tokenized_lowercased(text, lang):
    out, _ = text
    tok = lines(out / "tok" / f"test.{lang}")
    assert tok[0] == TRICKY[lang][1]
    assert tok[1] == {"en": "a woman is running on the grass number 1 .",
                      "de": "ein frau rennt auf dem gras nummer 1 ."}[lang]
    train = lines(out / "tok" / f"train.{lang}")
    assert len(train) == 300 and all(l == l.lower() and l == l.strip() for l in train)


def test_bpe_decodes_to_the_tokenized_text(text):
    out, _ = text
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert [decode_pieces(l) for l in lines(out / "bpe" / f"{split}.{lang}")] == lines(out / "tok" / f"{split}.{lang}")


def serve(monkeypatch, folder, asked, corrupt=None, offline=False):
    """Downloads answered from ``folder`` (the file the address names), their addresses appended to
    ``asked``; the file ``corrupt`` served with one byte changed; ``offline``: no network."""
    def opener(req):
        asked.append(req.full_url)
        if offline:
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        name = req.full_url.rsplit("/", 1)[1]
        data = bytearray((folder / name).read_bytes())
        if name == corrupt:
            data[len(data) // 2] ^= 0x01
        resp = io.BytesIO(bytes(data))
        resp.status, resp.headers = 200, {"Content-Length": str(len(data))}
        return resp

    real = download.download
    monkeypatch.setattr(multi30k, "download", lambda *a, **kw: real(*a, **kw, opener=opener))


def test_downloads_the_six_files_at_the_pinned_commit(orig, tmp_path, monkeypatch):
    folder, sums = orig
    asked = []
    serve(monkeypatch, folder, asked)
    out = tmp_path / "text"
    with recorded(sums), contextlib.redirect_stdout(io.StringIO()):
        files = multi30k.locate_files(None, out)
        assert multi30k.locate_files(None, out) == files  # a second call finds them in place
    assert asked == [f"https://raw.githubusercontent.com/multi30k/dataset/{multi30k.COMMIT}/data/task1/raw/{n}"
                     for n in multi30k.FILES]
    assert {n: p for n, (p, _) in files.items()} == {n: out / "orig" / n for n in multi30k.FILES}
    assert all(p.read_bytes() == (folder / n).read_bytes() for n, (p, _) in files.items())


def test_download_without_network_says_where_the_files_are_and_how_to_pass_them(orig, tmp_path, monkeypatch, capsys):
    folder, sums = orig
    serve(monkeypatch, folder, asked := [], offline=True)
    with recorded(sums):
        msg = one_line_error(["--out", str(tmp_path / "o"), "--bin", str(tmp_path / "b")], capsys)
    assert msg.startswith(f"prepare-multi30k.sh: error: cannot download {multi30k.URL}train.de.gz (")
    assert f"download the six files {', '.join(multi30k.FILES)} of {multi30k.URL} yourself and pass their " \
           f"folder with --orig" in msg
    assert len(asked) == 1 and not (tmp_path / "o" / "raw").exists() and not (tmp_path / "b").exists()


def test_corrupt_download_is_kept_aside_and_the_next_run_fetches_only_it(orig, tmp_path, monkeypatch, capsys):
    folder, sums = orig
    out = tmp_path / "o"
    serve(monkeypatch, folder, asked := [], corrupt="val.en.gz")
    with recorded(sums):
        msg = one_line_error(["--out", str(out), "--bin", str(tmp_path / "b")], capsys)
    assert f"{multi30k.URL}val.en.gz: downloaded file's sha256 does not match the recorded one" in msg
    assert (out / "orig" / "val.en.gz.part.bad").is_file() and not (out / "orig" / "val.en.gz").exists()
    assert sorted(p.name for p in (out / "orig").glob("*.gz")) == ["train.de.gz", "train.en.gz", "val.de.gz"]
    assert not (out / "raw").exists()
    serve(monkeypatch, folder, again := [])  # the next run: the three verified files are not fetched again
    with recorded(sums), contextlib.redirect_stdout(io.StringIO()):
        multi30k.locate_files(None, out)
    assert again == [multi30k.URL + n for n in multi30k.FILES[3:]]


def one_line_error(argv, capsys):
    rc = multi30k.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("prepare-multi30k.sh: error: "), err
    return err[0]


def corrupted_copy(src_dir, dest_dir, name):
    shutil.copytree(src_dir, dest_dir)
    data = bytearray((dest_dir / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (dest_dir / name).write_bytes(bytes(data))
    return dest_dir


def test_fixture_checksum_refused_with_one_line(orig, tmp_path, capsys):
    folder, sums = orig
    bad = corrupted_copy(folder, tmp_path / "bad", "val.en.gz")
    with recorded(sums):
        msg = one_line_error(["--orig", str(bad), "--out", str(tmp_path / "o"), "--bin", str(tmp_path / "b")], capsys)
    assert str(bad / "val.en.gz") in msg and "does not match the recorded" in msg
    assert not (tmp_path / "o" / "raw").exists() and not (tmp_path / "b").exists()


def test_missing_file_and_not_a_folder(orig, tmp_path, capsys):
    folder, sums = orig
    partial_dir = tmp_path / "partial"
    shutil.copytree(folder, partial_dir)
    (partial_dir / "test_2016_flickr.de.gz").unlink()
    with recorded(sums):
        msg = one_line_error(["--orig", str(partial_dir), "--out", str(tmp_path / "o")], capsys)
        assert "test_2016_flickr.de.gz" in msg and "--orig should hold the six files" in msg
        msg = one_line_error(["--orig", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")], capsys)
        assert "nowhere" in msg and "not a folder" in msg


def test_unaligned_sides_refused(tmp_path, capsys):
    folder = make_orig(tmp_path / "raw")
    short = gzip.decompress((folder / "val.de.gz").read_bytes()).split(b"\n")
    (folder / "val.de.gz").write_bytes(gzip.compress(b"\n".join(short[:-2]) + b"\n"))
    with recorded(sums_for(folder, tmp_path / "SHA256SUMS")):
        msg = one_line_error(["--orig", str(folder), "--out", str(tmp_path / "o")], capsys)
    assert "val.de.gz has 19 lines" in msg and "val.en.gz" in msg
    assert not (tmp_path / "o" / "raw").exists()


def test_wrapper_refuses_files_that_are_not_the_official_ones(orig, tmp_path):
    """Through data-prep/prepare-multi30k.sh with the recorded SHA256SUMS: the fixture's files are
    not the published ones, so the first of them is refused with one line and exit status 2."""
    folder, _ = orig
    script = Path(__file__).resolve().parents[1] / "data-prep" / "prepare-multi30k.sh"
    res = subprocess.run([str(script), "--orig", str(folder), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert (res.returncode, res.stderr.count("\n")) == (2, 1), res.stderr
    assert res.stderr.startswith(f"prepare-multi30k.sh: error: {folder / 'train.de.gz'}: sha256 ")
    assert "does not match the recorded 726e39b2" in res.stderr and not (tmp_path / "o" / "raw").exists()


@pytest.mark.slow
def test_fixture_end_to_end_manifest(orig, tmp_path):
    folder, sums = orig
    out, bin_dir = tmp_path / "text", tmp_path / "bin"
    with recorded(sums), contextlib.redirect_stdout(io.StringIO()):
        assert multi30k.main(["--orig", str(folder), "--out", str(out), "--bin", str(bin_dir), "--workers", "1",
                              "--bpe-size", "200"]) == 0
    check_manifest(out, bin_dir, {"train": 300, "valid": 20, "test": 20})
    # every multi30k row of the grid on it, at the tiny size, one epoch, scored by the evaluator
    from fairseq_lnpos.experiments import grid, options, plan, runs

    rows = [r.name for r in runs.select(["multi30k-*"])]
    assert rows and all(runs.BY_NAME[r].dataset == "multi30k" for r in rows)
    opts = options.RunOptions(only="multi30k-*", data=[str(bin_dir)], out=str(tmp_path / "grid"), arch_size="tiny",
                              max_epoch=1, set=["max_tokens=512", "batch_tokens=512"], jobs=2)
    with contextlib.redirect_stdout(io.StringIO()):
        assert grid.run_grid(opts, plan.select_runs(opts)) == 0
    for name in rows:
        run_dir = tmp_path / "grid" / name / "seed1"
        done, cfg = (json.loads((run_dir / f).read_text()) for f in ("DONE.json", "config.json"))
        assert done["status"] == "finished" or done["status"].startswith("diverged"), (name, done)
        assert cfg["arch"].endswith("_tiny") and cfg["run"]["dataset"] == "multi30k"
        if done["status"] == "finished":
            rec = json.loads((run_dir / "eval" / "epoch1.json").read_text())
            assert rec["n_sentences"] == 20 and rec["bleu_tok"] >= 0 and rec["sacrebleu_signature"]


def check_manifest(out, bin_dir, counts):
    m = read_manifest(bin_dir)
    assert (m["dataset"], m["source_lang"], m["target_lang"]) == ("multi30k.de-en", "de", "en")
    assert m["post_process"] == "sentencepiece" and m["lowercase"] is True and m["compound_split"] is False
    assert m["refs"] == {"tok": {"valid": str((out / "tok" / "valid.en").resolve()),
                                 "test": str((out / "tok" / "test.en").resolve())},
                         "raw": {"test": str((out / "raw" / "test.en").resolve())}}
    assert m["counts"] == counts
    assert (bin_dir / "dict.de.txt").read_text() == (bin_dir / "dict.en.txt").read_text()  # joined
    for split in ("train", "valid", "test"):
        assert (bin_dir / f"{split}.de-en.en.bin").is_file() and (bin_dir / f"{split}.de-en.de.idx").is_file()


# ---------------------------------------------------------------- the real task 1 files

@needs_real
def test_recorded_checksums_are_those_of_the_published_files():
    """SHA256SUMS holds the hashes of the six files of multi30k/dataset at COMMIT (the real-data
    folder's copies are byte-identical to them)."""
    assert {n: download.recorded_sha256(n) for n in multi30k.FILES} == {n: download.sha256_of(REAL / n) for n in multi30k.FILES}


@needs_real
def test_real_checksum_refused_with_one_line(tmp_path, capsys):
    bad = corrupted_copy(REAL, tmp_path / "raw", "train.de.gz")
    msg = one_line_error(["--orig", str(bad), "--out", str(tmp_path / "o"), "--bin", str(tmp_path / "b")], capsys)
    assert str(bad / "train.de.gz") in msg and "does not match the recorded 726e39b2" in msg
    assert not (tmp_path / "o" / "raw").exists()


def real_run(root):
    out, bin_dir = root / "text", root / "bin"
    t0 = time.time()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = multi30k.main(["--orig", str(REAL), "--out", str(out), "--bin", str(bin_dir), "--workers", "2"])
    assert rc == 0, buf.getvalue()
    return out, bin_dir, buf.getvalue(), time.time() - t0


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return real_run(tmp_path_factory.mktemp("m30k-real"))


def tree(root):
    """Every file under ``root`` (relative path -> bytes); files that record absolute paths or times
    (fairseq's preprocess.log, the binarization stamp, the sentencepiece model's training options)
    stand for what matters in them: the model by its pieces and their scores."""
    import sentencepiece as spm

    files = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and p.name not in ("preprocess.log", "lnpos-stage.json"):
            files[str(p.relative_to(root))] = p.read_bytes()
        if p.name == "spm.model":
            sp = spm.SentencePieceProcessor(model_file=str(p))
            files[str(p.relative_to(root))] = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    return files


@needs_real
@pytest.mark.slow
def test_real_counts_and_manifest(real):
    out, bin_dir, log, seconds = real
    print(f"prepared the real Multi30k in {seconds:.1f} s")
    counts = {"train": 29000, "valid": 1014, "test": 1000}
    check_manifest(out, bin_dir, counts)
    for split, n in counts.items():
        for kind in ("raw", "tok", "bpe"):
            assert len(lines(out / kind / f"{split}.de")) == len(lines(out / kind / f"{split}.en")) == n
    assert (out / "raw" / "test.en").read_bytes() == gzip.decompress((REAL / "test_2016_flickr.en.gz").read_bytes())
    # known lines, by digest: the second test caption raw and tokenized, the first training caption
    assert sha256(lines(out / "raw" / "test.en")[1]) == "9bb922db07202ad5f0c37cd0a2c2e05311024bfe3da0ca7cf8888cf9a8ab11dd"
    assert sha256(lines(out / "tok" / "test.en")[1]) == "4736bff1e30a754561522e70b0c7df5582a1459ac7c0629b1c7930aa9915183c"
    assert sha256(lines(out / "tok" / "train.en")[0]) == "f51e9f020a36d71b176177b888443ab9caad1ba591608df21f9a864bfaef08f6"
    assert "== multi30k.de-en: train 29000 pairs, valid 1014 pairs, test 1000 pairs" in log


@needs_real
@pytest.mark.slow
def test_real_rerun_skips_and_interrupted_run_resumes_to_identical_files(real, tmp_path, monkeypatch):
    out, bin_dir, _, _ = real
    before = {p: p.stat().st_mtime_ns for p in (out / "tok" / "train.de", out / "bpe" / "spm.model",
                                                 bin_dir / "train.de-en.de.bin")}
    _, _, log, _ = real_run(out.parent)
    assert log.count("(same parameters): skipped") == 4, log  # raw, tok, bpe, binarize
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    # a second copy, interrupted while learning the BPE, then resumed: the same bytes as the first
    original = multi30k.bpe.build

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(multi30k.bpe, "build", interrupted)
    with contextlib.redirect_stdout(io.StringIO()):  # Ctrl-C: one line, exit 130
        assert multi30k.main(["--orig", str(REAL), "--out", str(tmp_path / "text"), "--bin", str(tmp_path / "bin")]) == 130
    assert (tmp_path / "text" / "tok" / ".stage.json").is_file() and not (tmp_path / "text" / "bpe").exists()
    monkeypatch.setattr(multi30k.bpe, "build", original)
    _, _, log, _ = real_run(tmp_path)
    assert "[tok] complete" in log and "[bpe] building" in log
    for sub in ("text", "bin"):
        first, second = tree(out.parent / sub), tree(tmp_path / sub)
        assert sorted(first) == sorted(second) and len(first) > 10
        assert [k for k in first if first[k] != second[k]] == []
