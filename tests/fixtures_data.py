"""Small corpora in the real formats, built by the data-prep tests themselves.

- ``make_iwslt_orig``: the de-en folder of fairseq's de-en.tgz: train.tags.de-en.{de,en} (talk
  metadata lines mixed with sentences, as in the real files) and the ten IWSLT14 XML files.
- ``make_tgz``: that folder packed as de-en.tgz.
- ``make_wmt_orig``: the WMT14 archives' files (europarl, commoncrawl, news-commentary, SGML dev/test).
"""
import hashlib
import tarfile
from pathlib import Path

# Tricky lines and their Moses tokenization (tokenizer.perl -l LANG, default escaping, not -a),
# as produced by mosesdecoder's scripts/tokenizer/tokenizer.perl.
TRICKY = {
    "en": [
        ('He said "It\'s fine" -- and left.', 'He said &quot; It &apos;s fine &quot; -- and left .'),
        ("The state-of-the-art model costs $1,000.50 (or 3.5%).",
         "The state-of-the-art model costs $ 1,000.50 ( or 3.5 % ) ."),
        ("Visit http://www.ted.com/talks for more.", "Visit http : / / www.ted.com / talks for more ."),
        ("Tom & Jerry's friends aren't here...", "Tom &amp; Jerry &apos;s friends aren &apos;t here ..."),
        ("It's the U.S.", "It &apos;s the U.S ."),
        ("[Laughter] <b>bold</b> a|b", "&#91; Laughter &#93; &lt; b &gt; bold &lt; / b &gt; a &#124; b"),
    ],
    "de": [
        ('Er sagte "Es ist gut" -- und ging.', "Er sagte &quot; Es ist gut &quot; -- und ging ."),
        ("Das Modell nach dem Stand der Technik kostet 1.000,50 $ (oder 3,5 %).",
         "Das Modell nach dem Stand der Technik kostet 1.000,50 $ ( oder 3,5 % ) ."),
        ("Besuchen Sie http://www.ted.com/talks für mehr.", "Besuchen Sie http : / / www.ted.com / talks für mehr ."),
        ("Tom & Jerrys Freunde sind nicht hier...", "Tom &amp; Jerrys Freunde sind nicht hier ..."),
        ("Das sind die USA, z.B. Texas usw.", "Das sind die USA , z.B. Texas usw ."),
        ("[Gelächter] <b>fett</b> a|b", "&#91; Gelächter &#93; &lt; b &gt; fett &lt; / b &gt; a &#124; b"),
    ],
}
# tokenizer.perl -a (aggressive hyphen splitting), English line 2
AGGRESSIVE_EN = ("The state-of-the-art model costs $1,000.50 (or 3.5%).",
                 "The state @-@ of @-@ the @-@ art model costs $ 1,000.50 ( or 3.5 % ) .")

TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
             "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")
TEST_SIZES = (3, 2, 4, 2, 3)  # segments per file in the fixture



def sha256(text):
    """The digest a test compares a line of the real data (conftest.REALDATA) with: the corpus text
    itself is not kept in the repository."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

def sentence(lang, i):
    """The i-th filler sentence pair: same number of words on both sides (survives cleaning)."""
    words = {"de": ["Das", "ist", "Satz", "Nummer"], "en": ["This", "is", "sentence", "number"]}[lang]
    return " ".join(words) + f" {i} Wort{i % 7}." if lang == "de" else " ".join(words) + f" {i} word{i % 7}."


def train_talk(lang, talk, sentences):
    title = {"de": f"Vortrag {talk} über Dinge", "en": f"Talk {talk} about things"}[lang]
    desc = {"de": f"Beschreibung des Vortrags {talk}.", "en": f"Description of talk {talk}."}[lang]
    return ([f"<url>http://www.ted.com/talks/lang/{lang}/talk_{talk}.html</url>",
             f"<keywords>talks, things, {talk}</keywords>",
             f"<speaker>Speaker {talk}</speaker>",
             f"<talkid>{talk}</talkid>",
             f"<title>{title}</title>",
             f"<description>{desc}</description>"] + sentences)


def train_lines(lang, n_filler=60):
    """Three talks; the filler sentences, the tricky lines, one pair cleaning drops (ratio) and one empty pair."""
    filler = [sentence(lang, i) for i in range(1, n_filler + 1)]
    tricky = [raw for raw, _ in TRICKY[lang]]
    ratio = {"de": "Ja.", "en": "Yes, yes, yes, yes, yes, I said yes."}[lang]
    return (train_talk(lang, 1, filler[:20] + tricky)
            + train_talk(lang, 2, filler[20:40] + [ratio, ""])
            + train_talk(lang, 3, filler[40:]))


def xml_file(lang, name, n):
    segs = []
    for i in range(1, n + 1):
        text = {"de": f"{name} Satz {i} mit Tom &amp; Jerry\u2019s Haus.",
                "en": f"{name} sentence {i} with Tom &amp; Jerry\u2019s house."}[lang]
        segs.append(f'<seg id="{i}"> {text} </seg>')
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>', "<mteval>",
        f'<srcset setid="{name}" srclang="{lang}">', '<doc docid="1" genre="lectures">',
        "<url>http://www.ted.com/talks/x.html</url>", "<description>A talk.</description>",
        "<keywords>x</keywords>", "<talkid>1</talkid>", "<title>Title</title>",
        *segs, "</doc>", "</srcset>", "</mteval>", ""])


def make_iwslt_orig(root, n_filler=60):
    """Write the de-en folder under ``root``; return its path."""
    d = Path(root) / "de-en"
    d.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        (d / f"train.tags.de-en.{lang}").write_text("\n".join(train_lines(lang, n_filler)) + "\n", encoding="utf-8")
        for name, n in zip(TEST_SETS, TEST_SIZES):
            (d / f"{name}.de-en.{lang}.xml").write_text(xml_file(lang, name, n), encoding="utf-8")
    (d / "README").write_text("IWSLT 2014 fixture\n")
    return d


def make_tgz(orig_dir, path):
    with tarfile.open(path, "w:gz") as tar:
        tar.add(orig_dir, arcname=Path(orig_dir).name)
    return Path(path)


def sgm(lines, setid, lang, kind):
    head = f'<{kind}set setid="{setid}" srclang="any"{" trglang=%s" % chr(34) + lang + chr(34) if kind == "ref" else ""}>'
    body = [f'<doc docid="d1" genre="news" origlang="de">'] + [f'<seg id="{i}">{t}</seg>' for i, t in enumerate(lines, 1)]
    return "\n".join([head] + body + ["</doc>", f"</{kind}set>", ""])


WMT_TEST = {
    "en": ["Gutach: Increased safety for pedestrians", "A well-known state-of-the-art design &amp; more.",
           "It\u2019s 100 metres apart."],
    "de": ["Gutach: Noch mehr Sicherheit für Fußgänger", "Ein bekanntes Design nach dem Stand der Technik &amp; mehr.",
           "Es sind 100 Meter.",
           ],
}


def make_wmt_orig(root, n=40):
    """The files of the five WMT14 archives (fairseq --icml17 set) under ``root``, as extracted."""
    root = Path(root)
    corpora = {"training/europarl-v7.de-en": n, "commoncrawl.de-en": n // 2, "training/news-commentary-v9.de-en": n // 4}
    for corpus, k in corpora.items():
        (root / corpus).parent.mkdir(parents=True, exist_ok=True)
        en = [f"The well-known house number {i} is \u201cbig\u201d." for i in range(k)]
        de = [f"Das bekannte Haus Nummer {i} ist \u201egroß\u201c." for i in range(k)]
        if corpus == "commoncrawl.de-en":  # one pair the BPE-level cleaning drops (ratio)
            en[0], de[0] = "Yes, yes, yes, yes, yes, yes, yes, yes, yes.", "Ja."
        (root / f"{corpus}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
        (root / f"{corpus}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "newstest2013-src.en.sgm").write_text(sgm(["One house.", "Two houses."], "newstest2013", "en", "src"))
    (root / "dev" / "newstest2013-ref.de.sgm").write_text(sgm(["Ein Haus.", "Zwei Häuser."], "newstest2013", "de", "ref"))
    (root / "test-full").mkdir(exist_ok=True)
    (root / "test-full" / "newstest2014-deen-src.en.sgm").write_text(sgm(WMT_TEST["en"], "newstest2014", "en", "src"))
    (root / "test-full" / "newstest2014-deen-ref.de.sgm").write_text(sgm(WMT_TEST["de"], "newstest2014", "de", "ref"))
    return root
