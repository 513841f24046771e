"""Joint sentencepiece BPE: learned on the tokenized training text of both languages, applied to
every split. Encoded lines are space-separated pieces with sentencepiece's '\u2581' word marker,
which ``fairseq-generate --post-process sentencepiece`` turns back into the tokenized text.

Normalisation is off (``identity``) so that decoding gives back exactly the tokenized references,
and every character of the training text is kept (``character_coverage=1``).
"""

from fairseq_lnpos.data.download import DataError
from fairseq_lnpos.data.pipeline import log, read_lines, write_lines


def learn(train_files, model_prefix, vocab_size, workers=1, sample=0, seed=1):
    """Train ``<model_prefix>.model``; ``sample`` > 0 learns on that many randomly chosen lines."""
    import sentencepiece as spm

    for f in train_files:
        with open(f, "rb") as text:
            if not any(line.strip() for line in text):
                raise DataError(f"{f} has no text to learn the BPE from: the training data is empty; "
                                "pass the original files")

    log(f"  learning joint BPE ({vocab_size} pieces) on {', '.join(str(f) for f in train_files)}")
    spm.set_random_generator_seed(seed)
    options = dict(
        input=[str(f) for f in train_files],
        model_prefix=str(model_prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        normalization_rule_name="identity",
        input_sentence_size=sample,
        shuffle_input_sentence=True,
        max_sentence_length=1 << 16,
        num_threads=workers,
        hard_vocab_limit=False,  # small corpora (tests, synthetic) may have fewer pieces than asked
        bos_id=-1,
        eos_id=-1,
        minloglevel=2,
    )
    try:
        spm.SentencePieceTrainer.train(**options)
    except RuntimeError as e:  # e.g. --bpe-size below the number of distinct characters
        raise DataError(f"sentencepiece cannot learn a {vocab_size}-piece BPE on {', '.join(map(str, train_files))} "
                        f"({(str(e).strip().splitlines() or ['?'])[-1]}): choose another --bpe-size") from None
    return f"{model_prefix}.model"


def apply(model, in_path, out_path, workers=1):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    lines = read_lines(in_path)
    pieces = sp.encode(lines, out_type=str, num_threads=workers)
    write_lines(out_path, (" ".join(p) for p in pieces))
    return len(lines)


def decode_pieces(line):
    """What fairseq's ``--post-process sentencepiece`` does to an output line."""
    return line.replace(" ", "").replace("\u2581", " ").strip()


def build(tok_dir, tmp, vocab_size, workers, src, tgt, sample=0):
    """bpe/: the model learned on tok/train.{src,tgt}, and every tok/ split encoded with it."""
    model = learn([tok_dir / f"train.{src}", tok_dir / f"train.{tgt}"], tmp / "spm", vocab_size, workers,
                  sample=sample)
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            n = apply(model, tok_dir / f"{split}.{lang}", tmp / f"{split}.{lang}", workers)
            log(f"  bpe/{split}.{lang}: {n} lines")
    return model
