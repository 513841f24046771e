"""A tiny parallel corpus in the project's data layout (text/tok, text/raw, bin/ + manifest), for tests."""
import random
import subprocess
import sys
from pathlib import Path

from fairseq_lnpos.data.manifest import write_manifest

SRC = "haus katze hund baum auto buch tisch stuhl fenster tuer garten blume vogel fisch brot".split()
TGT = "house cat dog tree car book table chair window door garden flower bird fish bread".split()


def _pair(rng):
    n = rng.randint(3, 7)
    idx = [rng.randrange(len(SRC)) for _ in range(n)]
    src = [SRC[i] for i in idx]
    tgt = [TGT[i] for i in idx]
    if n > 4:  # a local reordering, so that the model needs attention
        tgt[0], tgt[1] = tgt[1], tgt[0]
    return " ".join(src) + " .", " ".join(tgt) + " ."


def _raw(tok):
    """Untokenized, cased form of a tokenized line: 'house cat .' -> 'House cat.'"""
    text = tok[:-2] + "."
    return text[0].upper() + text[1:]


def make_toy_data(root, n_train=300, n_valid=20, n_test=20, seed=0):
    """Write root/text/{tok,raw}, root/spm, root/bin (fairseq-preprocess) and the manifest; return bin."""
    import sentencepiece as spm

    root = Path(root)
    rng = random.Random(seed)
    splits = {"train": n_train, "valid": n_valid, "test": n_test}
    tok, raw, sp = root / "text" / "tok", root / "text" / "raw", root / "spm"
    for d in (tok, raw, sp):
        d.mkdir(parents=True, exist_ok=True)
    for split, n in splits.items():
        pairs = [_pair(rng) for _ in range(n)]
        (tok / f"{split}.de").write_text("".join(s + "\n" for s, _ in pairs))
        (tok / f"{split}.en").write_text("".join(t + "\n" for _, t in pairs))
        if split == "test":
            (raw / "test.de").write_text("".join(_raw(s) + "\n" for s, _ in pairs))
            (raw / "test.en").write_text("".join(_raw(t) + "\n" for _, t in pairs))
    spm.SentencePieceTrainer.train(
        input=f"{tok / 'train.de'},{tok / 'train.en'}", model_prefix=str(sp / "spm"), vocab_size=100,
        model_type="bpe", character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    model = spm.SentencePieceProcessor(model_file=str(sp / "spm.model"))
    for split in splits:
        for lang in ("de", "en"):
            lines = (tok / f"{split}.{lang}").read_text().splitlines()
            (sp / f"{split}.{lang}").write_text(
                "".join(" ".join(model.encode(line, out_type=str)) + "\n" for line in lines))
    bin_dir = root / "bin"
    subprocess.run(
        [str(Path(sys.executable).parent / "fairseq-preprocess"), "--source-lang", "de", "--target-lang", "en",
         "--trainpref", str(sp / "train"), "--validpref", str(sp / "valid"), "--testpref", str(sp / "test"),
         "--destdir", str(bin_dir), "--joined-dictionary", "--workers", "1"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    write_manifest(bin_dir, dataset="synthetic", source_lang="de", target_lang="en",
                   post_process="sentencepiece", lowercase=True, compound_split=False,
                   refs={"tok": {"valid": tok / "valid.en", "test": tok / "test.en"},
                         "raw": {"test": raw / "test.en"}},
                   counts=splits)
    return bin_dir
