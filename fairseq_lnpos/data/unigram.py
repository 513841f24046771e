"""What a trivial model reaches on a corpus: the reference the verdicts' "trains" is stated against.

A model that ignores the source sentence and the context and predicts every target token from its
frequency alone reaches the unigram cross-entropy of the target side; a Transformer that stalls on
its plateau sits near it. Stating "trains" as a fraction of it (the validation NLL at most that
fraction of the unigram bits) gives one threshold that means the same on every corpus.
"""
import functools
from pathlib import Path


@functools.lru_cache(maxsize=None)
def unigram_bits(data_dir):
    """The cross-entropy (bits per target token, end-of-sentence included, as fairseq's validation NLL
    counts them) of the target side of ``data_dir``'s valid split under the unigram model of its
    train split (add-one smoothed over the target dictionary): what a model that ignores the source
    and the context reaches. None when ``data_dir`` holds no binarized train and valid split."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        return None
    import numpy as np
    from fairseq.data import data_utils, indexed_dataset

    src, tgt = data_utils.infer_language_pair(str(data_dir))
    if src is None:
        return None
    counts = {}
    for split in ("train", "valid"):
        prefix = str(data_dir / f"{split}.{src}-{tgt}.{tgt}")
        if not indexed_dataset.dataset_exists(prefix, impl="mmap"):
            return None
        ds = indexed_dataset.MMapIndexedDataset(prefix)
        tokens = np.concatenate([np.asarray(ds[i]) for i in range(len(ds))]) if len(ds) else np.zeros(0, int)
        counts[split] = np.bincount(tokens)
    vocab = sum(1 for _ in open(data_dir / f"dict.{tgt}.txt", encoding="utf-8")) + 4  # + fairseq's 4 specials
    size = max(vocab, len(counts["train"]), len(counts["valid"]))
    train = np.pad(counts["train"], (0, size - len(counts["train"]))) + 1.0
    valid = np.pad(counts["valid"], (0, size - len(counts["valid"])))
    if valid.sum() == 0:
        return None
    return float(-(valid * np.log2(train / train.sum())).sum() / valid.sum())
