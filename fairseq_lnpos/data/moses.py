"""The Moses text steps of fairseq's recipes, with sacremoses instead of the perl scripts.

- ``tokenize``: tokenizer.perl's default path (escaping on; ``aggressive`` = its ``-a``). sacremoses
  differs from the perl script in one rule, fixed here: perl always splits the period off the
  last word of a line (``... the U.S.`` -> ``... the U.S .``); sacremoses keeps it on abbreviations.
- ``normalize_punctuation`` / ``remove_non_printing``: normalize-punctuation.perl and
  remove-non-printing-char.perl (WMT).
- ``squeeze`` / ``keep_pair``: clean-corpus-n.perl (whitespace squeezed; pairs with an empty side, a side
  outside [min, max] tokens, a length ratio above ``ratio``, or a word over 1000 characters dropped).
- ``lowercase``: lowercase.perl (Perl's ``lc``; Python's ``str.lower`` agrees on German and English).
"""
import re
import sys
import unicodedata
from functools import lru_cache

_WS = re.compile(r"\s+")


@lru_cache(maxsize=None)
def _tokenizer(lang):
    from sacremoses import MosesTokenizer  # imported on first use: it takes about a second

    return MosesTokenizer(lang=lang)


@lru_cache(maxsize=None)
def _normalizer(lang):
    from sacremoses import MosesPunctNormalizer

    return MosesPunctNormalizer(lang=lang)


def tokenize(line, lang, aggressive=False):
    """One line through ``tokenizer.perl -l lang [-a]`` (blank lines stay blank)."""
    if not line.strip():
        return ""
    out = _tokenizer(lang).tokenize(line, aggressive_dash_splits=aggressive, return_str=True, escape=True)
    # tokenizer.perl: "split last words independently as they are unlikely to be non-breaking prefixes"
    last = out.rsplit(" ", 1)[-1]
    if len(last) > 1 and last.endswith(".") and not last.endswith(".."):
        out = out[:-1] + " ."
    return out


def normalize_punctuation(line, lang):
    return _normalizer(lang).normalize(line)


@lru_cache(maxsize=1)
def _non_printing():
    # every code point of Unicode category C (Cc, Cf, Cs, Co, Cn): remove-non-printing-char.perl's \p{C}
    ranges, start = [], None
    for cp in range(sys.maxunicode + 2):
        inside = cp <= sys.maxunicode and unicodedata.category(chr(cp)).startswith("C")
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(cp - 1))}")
            start = None
    return re.compile("[" + "".join(ranges) + "]")


def remove_non_printing(line):
    """remove-non-printing-char.perl: every character of Unicode category C becomes a space."""
    return _non_printing().sub(" ", line)


def lowercase(line):
    return line.lower()


def squeeze(line):
    """Whitespace as clean-corpus-n.perl leaves it (also removes '|', its factor separator)."""
    return _WS.sub(" ", line.replace("|", "")).strip()


def keep_pair(src, tgt, min_len=1, max_len=175, ratio=1.5, max_word_length=1000):
    """clean-corpus-n.perl's test on two squeezed lines."""
    if not src or not tgt:
        return False
    ns, nt = src.count(" ") + 1, tgt.count(" ") + 1
    if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
        return False
    if ns / nt > ratio or nt / ns > ratio:
        return False
    return max(map(len, src.split(" "))) <= max_word_length and max(map(len, tgt.split(" "))) <= max_word_length
