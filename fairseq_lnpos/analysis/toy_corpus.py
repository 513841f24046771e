"""A small generated parallel corpus, in memory, for gradient statistics without a data dir.

Source sentences come from a first-order Markov chain over ``vocab`` word types with a
Zipf-like unigram skew; the target is a deterministic "translation" of the source (a fixed
word-to-word map, local reordering of adjacent pairs, an occasional inserted function word),
so targets depend on sources as in real data. At initialization only the shapes and token
statistics matter; the point is that the analysis runs anywhere, with no files.
"""
import itertools
import random

import torch
from fairseq.data import Dictionary, LanguagePairDataset


def _dictionary(prefix, n):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"{prefix}{i}")
    d.finalize(padding_factor=8)
    return d


def make_corpus(n_sentences=2000, vocab=8000, min_len=5, max_len=40, seed=0):
    """Return ``(src_dict, tgt_dict, LanguagePairDataset)``."""
    rng = random.Random(seed)
    src_dict, tgt_dict = _dictionary("s", vocab), _dictionary("t", vocab)
    s0, t0 = src_dict.index("s0"), tgt_dict.index("t0")  # word i has index s0 + i
    types = list(range(vocab))
    cum = list(itertools.accumulate(1.0 / (i + 1) for i in types))  # Zipf-like unigram weights
    # Markov chain: every word has 16 likely successors, drawn Zipf-like
    flat = rng.choices(types, cum_weights=cum, k=16 * vocab)
    succ = [flat[16 * i:16 * (i + 1)] for i in types]
    word_map = rng.sample(types, vocab)
    n_func = max(1, vocab // 100)
    src, tgt = [], []
    for _ in range(n_sentences):
        n = rng.randint(min_len, max_len)
        w = rng.choices(types, cum_weights=cum, k=1)
        for _ in range(n - 1):
            w.append(rng.choice(succ[w[-1]]))
        t = [word_map[x] for x in w]
        for i in range(0, len(t) - 1, 4):  # swap every other adjacent pair
            t[i], t[i + 1] = t[i + 1], t[i]
        if len(t) > 3 and t[0] % 3 == 0:  # an inserted function word
            t.insert(2, rng.randrange(n_func))
        src.append(torch.tensor([s0 + x for x in w] + [src_dict.eos()]))
        tgt.append(torch.tensor([t0 + x for x in t] + [tgt_dict.eos()]))
    ds = LanguagePairDataset(
        src, torch.tensor([len(s) for s in src]), src_dict,
        tgt, torch.tensor([len(t) for t in tgt]), tgt_dict,
        left_pad_source=True, left_pad_target=False, shuffle=True,
    )
    return src_dict, tgt_dict, ds
