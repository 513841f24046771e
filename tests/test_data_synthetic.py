"""The synthetic corpus: deterministic, the translation rules hold, disjoint splits, IWSLT layout and manifest."""
import contextlib
import io
import random
from pathlib import Path

import pytest

from fairseq_lnpos.data import moses, synthetic as syn
from fairseq_lnpos.data.manifest import read_manifest


def lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def test_lexicon_is_fixed_and_one_to_one():
    lex, pos = syn.lexicon()
    assert syn.lexicon() == (lex, pos)
    assert len(set(lex.values())) == len(lex) and not set(lex.values()) & set(lex)
    assert 150 <= len(lex) <= 400  # "a few hundred words" per side, both sides together under 1000


def test_same_seed_same_corpus_other_seed_other():
    a, b, c = syn.generate(300, 20, 20, 5), syn.generate(300, 20, 20, 5), syn.generate(300, 20, 20, 6)
    assert a == b and a != c


def test_rules_lengths_and_disjoint_splits():
    lex, pos = syn.lexicon()
    inv = {v: k for k, v in lex.items()}
    data = syn.generate(2000, 200, 200, 3)
    sub = 0
    for src, tgt in data["train"]:
        assert 4 <= len(tgt) <= 12 and len(src) == len(tgt)
        back = [inv[w] for w in src]
        assert sorted(back) == sorted(tgt)  # word by word, only reordered
        for i in range(len(tgt) - 1):  # adjective before noun in English -> after it in the source
            if pos[tgt[i]] == "A":
                assert pos[tgt[i + 1]] == "N"
        assert not any(pos[back[i]] == "A" and pos[back[i + 1]] == "N" for i in range(len(back) - 1))
        if syn.THAT in tgt:  # subordinate clause: its verb last in the source
            sub += 1
            assert pos[back[-1]] == "V" and pos[tgt[-1]] != "V"
    assert 0.2 < sub / len(data["train"]) < 0.5
    train = {" ".join(t) for _, t in data["train"]}
    valid = {" ".join(t) for _, t in data["valid"]}
    test = {" ".join(t) for _, t in data["test"]}
    assert not (train & valid) and not (train & test) and not (valid & test)


def test_translation_is_a_function_of_the_source():
    lex, pos = syn.lexicon()
    g = syn.Grammar(random.Random(0))
    seen = {}
    for _ in range(3000):
        tgt = g.sentence()
        src = tuple(syn.to_source(tgt, lex, pos))
        assert seen.setdefault(src, tgt) == tgt


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    argv = ["--out", str(root / "text"), "--bin", str(root / "bin"), "--seed", "7", "--train", "500",
            "--valid", "50", "--test", "60", "--workers", "1"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert syn.main(argv) == 0, buf.getvalue()
    return root / "text", root / "bin", argv


def test_layout_refs_and_manifest(made):
    out, bin_dir, _ = made
    for split, n in (("train", 500), ("valid", 50), ("test", 60)):
        for lang in ("de", "en"):
            assert len(lines(out / "tok" / f"{split}.{lang}")) == n
            assert (bin_dir / f"{split}.de-en.{lang}.bin").is_file()
    raw, tok = lines(out / "raw" / "test.en"), lines(out / "tok" / "test.en")
    # the raw references through the IWSLT steps (Moses tokenizer, lowercase) give the tokenized ones
    assert [moses.lowercase(moses.tokenize(l, "en")) for l in raw] == tok
    assert raw[0][0].isupper() and raw[0].endswith(".") and not raw[0].endswith(" .")
    # every word is one BPE piece
    assert all(len(b.split()) == len(t.split()) for b, t in zip(lines(out / "bpe" / "train.en"),
                                                                lines(out / "tok" / "train.en")))
    m = read_manifest(bin_dir)
    assert (m["dataset"], m["lowercase"], m["post_process"]) == ("synthetic", True, "sentencepiece")
    assert m["counts"] == {"train": 500, "valid": 50, "test": 60}
    assert Path(m["refs"]["tok"]["test"]) == (out / "tok" / "test.en").resolve()


def test_rerun_skips_and_new_seed_rebuilds(made, capsys):
    out, bin_dir, argv = made
    assert syn.main(argv) == 0
    assert capsys.readouterr().out.count("skipped") == 4
    first = lines(out / "tok" / "train.en")
    assert syn.main(argv[:5] + ["8"] + argv[6:]) == 0
    assert lines(out / "tok" / "train.en") != first
    assert read_manifest(bin_dir)["counts"]["train"] == 500


def test_bad_size_is_one_line_error(tmp_path, capsys):
    assert syn.main(["--out", str(tmp_path / "o"), "--bin", str(tmp_path / "b"), "--train", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "make-synthetic.sh: error: --train 0: give at least 1 sentence pair"
    assert not (tmp_path / "o").exists() and not (tmp_path / "b").exists()


# fairseq-train 0.12's per-epoch records with --log-format json (the check reads them)
VALID = ('2026-11-30 22:09:02 | INFO | valid | {"epoch": %d, "valid_loss": "%s", "valid_nll_loss": "4.863", '
         '"valid_num_updates": "%d"}')
TRAIN = ('2026-11-30 22:09:03 | INFO | train | {"epoch": %d, "train_loss": "5.576", "train_num_updates": "%d", '
         '"train_train_wall": "%d", "train_wall": "99"}')


def test_check_reports_from_fairseq_logs():
    from conftest import tool
    from fairseq_lnpos.fairseq_log import LogState

    report = tool("synthetic_check").report

    log = "\n".join([VALID % (1, "5.1", 100), TRAIN % (1, 100, 20), "other line", VALID % (2, "4.2", 150),
                     TRAIN % (2, 150, 10)])
    line = report(LogState.of(log), 31.16, 40.4, 5.2, "transformer_preln_tiny", 0.001, 100, 150, 1)
    # seconds per update: the epochs' own training time (train_train_wall), not the time since start
    assert line == ("transformer_preln_tiny lr 0.001 warmup 100 updates 150 epochs 2: valid loss 4.2 (per epoch: "
                    "5.1, 4.2), test BLEU 31.16, 0.20 s/update (train_wall), train 40 s, generate 5 s, threads 1")
    assert "valid loss ? (per epoch: ), test BLEU ?, nan s/update" in report(LogState(), None, 1, 1, "a", 1, 1, 1, 1)


@pytest.mark.slow
def test_check_trains_translates_every_test_sentence_and_reports(made, tmp_path, capsys):
    from conftest import tool
    from fairseq_lnpos.fairseq_log import bleu4

    synthetic_check = tool("synthetic_check")
    _, bin_dir, _ = made
    work = tmp_path / "work"
    assert synthetic_check.main(["--bin", str(bin_dir), "--work", str(work), "--updates", "3", "--warmup", "1"]) == 0
    line = capsys.readouterr().out.strip()
    generated = (work / "generate.log").read_text()
    assert sum(x.startswith("H-") for x in generated.splitlines()) == 60  # the whole test set
    bleu = bleu4(generated)
    assert 0 <= bleu <= 100 and f"test BLEU {bleu:.2f}," in line
    assert "updates 3 epochs 1: valid loss " in line and "nan s/update" not in line, line
