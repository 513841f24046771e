"""A generated German-to-English-like corpus for machines without internet or GPU.

    python -m fairseq_lnpos.data.synthetic --out DIR --bin DIR --seed S [--train N]

The target side ("en") is English from a small grammar: a clause is subject, verb, object and an
optional adverb or prepositional phrase; a noun phrase is determiner, optional adjective, noun;
a sentence may add a subordinate clause ("... that the cat sees a dog"). The source side ("de")
is the same sentence word by word in an invented lexicon (one fixed pseudo-word per English
word) with two German-like reorderings that make the model look at the source, not copy by
position: adjectives follow their noun, and the verb of a subordinate clause goes to its end.
A source sentence therefore has exactly one translation, about 200 words per language, 4 to 12
words per sentence. The lexicon is fixed; ``--seed`` chooses the sentences. Valid and test
sentences do not occur in train. The corpus is generated in memory: at most ``MAX_PAIRS`` (one
million) pairs per split.

Output is the IWSLT layout: <out>/tok (lowercased, tokenized: here the generated tokens),
<out>/raw/test.* (capitalised sentences with attached final period), <out>/bpe, and <bin> from
fairseq-preprocess --joined-dictionary with the lnpos-data.json manifest.
"""
import random
import sys
import time

from fairseq_lnpos.data import BIN_DIRS, bpe, text_dir
from fairseq_lnpos.data.download import DataError
from fairseq_lnpos.data.pipeline import log, run_dataset, run_stage, write_lines
from fairseq_lnpos.cli import CommandParser, at_least
from fairseq_lnpos.errors import run_main

SRC, TGT = "de", "en"
LEXICON_SEED = 20200212  # the invented source lexicon is the same for every --seed

NOUNS = """dog cat bird horse cow fish mouse lion tiger bear wolf fox rabbit duck goat sheep farmer teacher
doctor student child woman man girl boy king queen soldier baker driver singer painter writer pilot
nurse judge friend neighbour stranger artist house tree river garden city village school market
church bridge road forest mountain lake island castle kitchen table chair door window book letter
song story picture car boat train ship apple bread cake flower stone key ball hat box cup""".split()
ADJECTIVES = """big small old young happy sad tall short red green blue black white quick slow
strong weak rich poor quiet loud kind angry brave clever lazy busy tired hungry famous strange
beautiful ugly dark bright warm cold new""".split()
VERBS = """sees likes knows finds helps follows calls watches meets visits paints draws builds
buys sells carries opens closes brings takes loves hates needs wants remembers forgets feeds
teaches chases catches holds pushes pulls reads writes cleans fixes""".split()
ADVERBS = "today yesterday quickly slowly often rarely again together quietly loudly early late".split()
PREPOSITIONS = "in near behind under over beside with without".split()
DETERMINERS = "the a this every".split()
THAT = "that"
SAYS = "says thinks believes hopes knows".split()  # verbs that take a subordinate clause
MAX_PAIRS = 1_000_000  # per split; about 0.5 GB of memory while the corpus is generated


def pseudo_words(n, rng, taken):
    """``n`` distinct invented words of two or three syllables (not in ``taken``)."""
    onsets = "b d f g k l m n p r s t v w z sch st tr kr fl gr br".split()
    vowels = "a e i o u ei au ie".split()
    codas = ["", "", "n", "r", "l", "s", "t", "ng", "ch"]
    words = []
    while len(words) < n:
        w = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.choice((2, 2, 3))))
        w += rng.choice(codas)
        if w not in taken and w not in words:
            words.append(w)
    return words


def lexicon():
    """{english word: source word} and {english word: part of speech}; the same on every call."""
    pos = {}
    for words, tag in ((NOUNS, "N"), (ADJECTIVES, "A"), (VERBS, "V"), (ADVERBS, "R"), (PREPOSITIONS, "P"),
                       (DETERMINERS, "D"), ([THAT], "C"), (SAYS, "S")):
        for w in words:
            pos.setdefault(w, tag)
    english = list(pos)
    rng = random.Random(LEXICON_SEED)
    return dict(zip(english, pseudo_words(len(english), rng, set(english)))), pos


class Grammar:
    def __init__(self, rng):
        self.rng = rng

    def np(self):
        r = self.rng
        words = [r.choice(DETERMINERS)]
        if r.random() < 0.5:
            words.append(r.choice(ADJECTIVES))
        return words + [r.choice(NOUNS)]

    def clause(self):
        r = self.rng
        words = self.np() + [r.choice(VERBS)] + self.np()
        x = r.random()
        if x < 0.3:
            words.append(r.choice(ADVERBS))
        elif x < 0.55:
            words += [r.choice(PREPOSITIONS)] + self.np()
        return words

    def sentence(self, max_words=12):
        while True:
            if self.rng.random() < 0.35:
                words = self.np() + [self.rng.choice(SAYS), THAT] + self.clause()
            else:
                words = self.clause()
            if 4 <= len(words) <= max_words:
                return words


def to_source(words, lex, pos):
    """English words -> source words: adjective after its noun; subordinate-clause verb last."""
    out = list(words)
    i = 0
    while i < len(out) - 1:  # adjective-noun swap
        if pos[out[i]] == "A" and pos[out[i + 1]] == "N":
            out[i], out[i + 1] = out[i + 1], out[i]
            i += 2
        else:
            i += 1
    if THAT in out:  # verb-final subordinate clause: the first main verb after "that" moves to the end
        k = out.index(THAT)
        v = next(j for j in range(k + 1, len(out)) if pos[out[j]] == "V")
        out.append(out.pop(v))
    return [lex[w] for w in out]


def detokenize(words):
    s = " ".join(words)
    return s[0].upper() + s[1:] + "."


def generate(n_train, n_valid, n_test, seed):
    """{split: [(source words, target words)]} with valid/test disjoint from train and each other."""
    lex, pos = lexicon()
    g = Grammar(random.Random(seed))
    seen, data = set(), {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        pairs = []
        while len(pairs) < n:
            tgt = g.sentence()
            key = " ".join(tgt)
            if split != "train" and key in seen:
                continue
            seen.add(key)
            pairs.append((to_source(tgt, lex, pos), tgt))
        data[split] = pairs
    return data


def parser():
    p = CommandParser(prog="make-synthetic.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=text_dir("synthetic"), help="text folder (default: %(default)s)")
    p.add_argument("--bin", default=BIN_DIRS["synthetic"], help="binarized folder (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="chooses the sentences (default: %(default)s)")
    p.add_argument("--train", type=int, default=24000,
                   help=f"training pairs (default: %(default)s; at most {MAX_PAIRS} per split)")
    p.add_argument("--valid", type=int, default=1000, help="validation pairs (default: %(default)s)")
    p.add_argument("--test", type=int, default=1000, help="test pairs (default: %(default)s)")
    p.add_argument("--bpe-size", type=int, default=2000,
                   help="joint BPE vocabulary; 2000 keeps every word one piece (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="processes (default: %(default)s; the corpus is small)")
    return p


def prepare(out=text_dir("synthetic"), bin_dir=BIN_DIRS["synthetic"], seed=1, train=24000, valid=1000,
            test=1000, bpe_size=2000, workers=1):
    """Generate the corpus: text stages in ``out``, binarized data and manifest in ``bin_dir``;
    returns the pair counts per split. Raises :class:`DataError` for bad values."""
    t0 = time.time()
    for name, n in (("--train", train), ("--valid", valid), ("--test", test)):
        if n < 1:
            raise DataError(f"{name} {n}: give at least 1 sentence pair")
        if n > MAX_PAIRS:
            raise DataError(f"{name} {n}: at most {MAX_PAIRS} sentence pairs (the corpus is generated in memory)")
    at_least(0, "--seed", seed)
    at_least(1, "--bpe-size", bpe_size)
    sizes = {"train": train, "valid": valid, "test": test}
    gen = dict(sizes, seed=seed, v=1)
    data = {}

    def pairs():
        if not data:
            data.update(generate(train, valid, test, seed))
        return data

    def write_raw(tmp):
        write_lines(tmp / f"test.{SRC}", (detokenize(s) for s, _ in pairs()["test"]))
        write_lines(tmp / f"test.{TGT}", (detokenize(t) for _, t in pairs()["test"]))

    def write_tok(tmp):
        for split, split_pairs in pairs().items():
            write_lines(tmp / f"{split}.{SRC}", (" ".join(s + ["."]) for s, _ in split_pairs))
            write_lines(tmp / f"{split}.{TGT}", (" ".join(t + ["."]) for _, t in split_pairs))
            log(f"  tok/{split}.{{{SRC},{TGT}}}: {len(split_pairs)} lines")

    def stages(out):
        p_raw = run_stage(out / "raw", gen, write_raw)
        p_tok = run_stage(out / "tok", gen, write_tok)
        p_bpe = run_stage(out / "bpe", {"tok": p_tok, "vocab": bpe_size, "v": 1},
                          lambda tmp: bpe.build(out / "tok", tmp, bpe_size, workers, SRC, TGT))
        return p_raw, p_bpe, sizes

    counts = run_dataset(out, bin_dir, workers, "synthetic", (SRC, TGT), stages, lowercase=True,
                         compound_split=False, label=f"synthetic (seed {seed})")
    log(f"   total {time.time() - t0:.1f} s")
    return counts


def main(argv=None):
    def command(argv):
        a = parser().parse_args(argv)
        prepare(a.out, a.bin, a.seed, a.train, a.valid, a.test, a.bpe_size, a.workers)

    return run_main("make-synthetic.sh", command, argv)


if __name__ == "__main__":
    sys.exit(main())
