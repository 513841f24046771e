"""The Moses steps: sacremoses plus the one fix-up must give tokenizer.perl's output; cleaning as clean-corpus-n."""
import pytest

from fairseq_lnpos.data import moses
from fixtures_data import AGGRESSIVE_EN, TRICKY


@pytest.mark.parametrize("lang", ["de", "en"])
def test_tokenize_matches_perl_on_tricky_lines(lang):
    for raw, expected in TRICKY[lang]:
        assert moses.tokenize(raw, lang) == expected, raw


def test_aggressive_hyphen_splitting_only_with_flag():
    raw, expected = AGGRESSIVE_EN
    assert moses.tokenize(raw, "en", aggressive=True) == expected
    assert "@-@" not in moses.tokenize(raw, "en")


def test_final_abbreviation_split_like_perl():
    # tokenizer.perl always splits the period off the last word; sacremoses alone keeps "U.S." whole
    assert moses.tokenize("They live in the U.S.", "en") == "They live in the U.S ."
    assert moses.tokenize("Mr. Smith lives in the U.S. today.", "en") == "Mr. Smith lives in the U.S. today ."
    assert moses.tokenize("Wait...", "en") == "Wait ..."
    assert moses.tokenize("   ", "en") == ""


def test_lowercase_and_squeeze():
    assert moses.lowercase("Über ÄRGER") == "über ärger"
    assert moses.squeeze("  a \t b  |c ") == "a b c"


@pytest.mark.parametrize("src,tgt,keep", [
    ("a b c", "x y z", True),
    ("a", "x y", False),            # ratio 2 > 1.5
    ("a b", "x y z", True),         # ratio 1.5 is allowed
    ("", "x", False),               # empty side
    (" ".join(["w"] * 175), " ".join(["v"] * 175), True),
    (" ".join(["w"] * 176), " ".join(["v"] * 176), False),  # longer than 175
    ("a " + "b" * 1001, "x y", False),  # a word over 1000 characters
])
def test_keep_pair_like_clean_corpus_n(src, tgt, keep):
    assert moses.keep_pair(src, tgt, 1, 175, 1.5) is keep


def test_normalize_and_remove_non_printing():
    assert moses.remove_non_printing("a\u200bb\u0007c") == "a b c"
    assert moses.normalize_punctuation("\u201eGroß\u201c \u2013 ja", "de") == '"Groß" - ja'
