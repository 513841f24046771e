"""BLEU both ways on fixed files: tokenized BLEU = fairseq-score, sacreBLEU = the sacrebleu command line."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_lnpos.experiments import evaluate as E
from fairseq_lnpos.fairseq_log import bleu4

BIN = Path(sys.executable).parent
REFS = [
    "the cat sat on the mat .",
    "a well @-@ known man , who lived in new york , said \" no \" .",
    "it 's a long @-@ term plan for 2020 .",
    "we saw the dog ; it ran away .",
    "Die Katze schläft im Haus .",
    "this one has no overlap at all",
]
HYPS = [
    "the cat sat on a mat .",
    "a well @-@ known man who lived in new york said \" no \" .",
    "it is a long @-@ term plan for 2020 .",
    "we saw a dog ; it ran away quickly .",
    "die katze schläft im haus .",
    "nothing in common here",
]
RAW = [
    "The cat sat on the mat.",
    "A well-known man, who lived in New York, said \"no\".",
    "It's a long-term plan for 2020.",
    "We saw the dog; it ran away.",
    "Die Katze schläft im Haus.",
    "This one has no overlap at all",
]


@pytest.fixture
def files(tmp_path):
    paths = {}
    for name, lines in (("hyp", HYPS), ("ref", REFS), ("raw", RAW)):
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return paths


def fairseq_score(sys_path, ref_path, *extra):
    out = subprocess.run([str(BIN / "fairseq-score"), "--sys", str(sys_path), "--ref", str(ref_path), *extra],
                         capture_output=True, text=True, check=True).stdout
    return bleu4(out)


@pytest.mark.slow
def test_tok_bleu_equals_fairseq_score(files, tmp_path):
    ours = E.tok_bleu(HYPS, REFS)
    assert 20 < ours < 80  # a non-trivial value, so the comparison means something
    assert round(ours, 2) == fairseq_score(files["hyp"], files["ref"])
    # IWSLT: lowercase both sides = fairseq-score --ignore-case
    lc = E.tok_bleu(HYPS, REFS, lowercase=True)
    assert lc > ours and round(lc, 2) == fairseq_score(files["hyp"], files["ref"], "--ignore-case")


@pytest.mark.slow
def test_compound_split_as_fairseq_recipe(files, tmp_path):
    line = "a well @-@ known long-term x-y-z -"
    assert E.compound_split(line) == "a well @ ##AT##-##AT## @ known long ##AT##-##AT## term x ##AT##-##AT## y-z -"
    if shutil.which("perl"):  # the recipe's own one-liner, when perl is there
        perl = subprocess.run(["perl", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"], input=line + "\n",
                              capture_output=True, text=True, check=True).stdout.strip()
        assert E.compound_split(line) == perl
    split = {}
    for name, lines in (("hyp", HYPS), ("ref", REFS)):
        split[name] = tmp_path / f"{name}.split"
        split[name].write_text("".join(E.compound_split(x) + "\n" for x in lines), encoding="utf-8")
    cs = E.tok_bleu(HYPS, REFS, split_compounds=True)
    assert cs != E.tok_bleu(HYPS, REFS)
    assert round(cs, 2) == fairseq_score(split["hyp"], split["ref"])


def sacrebleu_cli(ref, hyp, *extra):
    out = subprocess.run([str(BIN / "sacrebleu"), str(ref), "-i", str(hyp), "-m", "bleu", "-b", "-w", "4", *extra],
                         capture_output=True, text=True, check=True).stdout
    return float(out.strip())


def test_detokenize_then_sacrebleu_equals_cli(files, tmp_path):
    detok = E.detokenize(HYPS, "en")
    assert detok[1] == "a well-known man who lived in new york said \"no\"."
    assert detok[3] == "we saw a dog; it ran away quickly."
    (tmp_path / "detok.txt").write_text("".join(x + "\n" for x in detok), encoding="utf-8")
    score, sig = E.sacre_bleu(detok, RAW)
    assert round(score, 4) == sacrebleu_cli(files["raw"], tmp_path / "detok.txt")
    assert sig.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    lc, lc_sig = E.sacre_bleu(detok, RAW, lowercase=True)
    assert lc > score and "|case:lc|" in lc_sig
    assert round(lc, 4) == sacrebleu_cli(files["raw"], tmp_path / "detok.txt", "-lc")


def test_parse_generate_and_missing_hypotheses(tmp_path):
    out = "\n".join(["S-2\tsrc two", "H-2\t-0.1\tb", "D-2\t-0.1\tthe cat sat on the mat .", "S-0\tsrc zero",
                     "D-0\t-0.2\ta well @-@ known man", "S-1\tsrc one", "P-1\t-1 -1", "noise"])
    seen, hyps = E.parse_generate(out)
    assert seen == {0, 1, 2} and hyps == {2: "the cat sat on the mat .", 0: "a well @-@ known man"}
    ref = tmp_path / "ref.txt"
    ref.write_text("a well @-@ known man\nsomething\nthe cat sat on the mat .\n", encoding="utf-8")
    manifest = {"refs": {"tok": {"test": str(ref)}}, "target_lang": "en"}
    res = E.score_hyps(hyps, manifest, seen=seen)
    assert res.no_hypothesis == 1 and res.n_sentences == 3
    assert res.bleu_tok == round(E.tok_bleu(["a well @-@ known man", "", "the cat sat on the mat ."],
                                               read(ref)), 2)
    with pytest.raises(ValueError, match="do not match"):
        E.score_hyps(hyps, manifest, seen={0, 1})


def read(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def test_score_cli_one_line_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fairseq_lnpos.experiments.evaluate", "score", "--hyp",
                        str(tmp_path / "none.txt"), "--ref-tok", str(tmp_path / "none.txt")],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    # (fairseq itself may log a line about tensorboardX when it is imported)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("evaluate: error: ") and "none.txt" in last


def test_compound_split_bleu_beside_the_plain_one(tmp_path):
    """A row's compound_split_bleu: bleu_tok_cs is tok BLEU of compound-split hypotheses and references
    (IWSLT's tokens keep "long-term" whole, so the two differ); on data that is compound-split already
    (WMT's manifest) it is the plain one; without the option there is none."""
    hyps = ["it is a long-term plan .", "a well-known man said no .", "we saw the dog ; it ran ."]
    refs = ["it is a long-run plan .", "a well-known man said no !", "we saw a dog ; it ran away ."]
    ref = tmp_path / "ref.txt"
    ref.write_text("".join(x + "\n" for x in refs), encoding="utf-8")
    iwslt = {"refs": {"tok": {"test": str(ref)}}, "target_lang": "en", "lowercase": True}
    plain = E.score_hyps(hyps, iwslt)
    assert plain.bleu_tok_cs is None and "bleu_tok_cs" not in plain.to_json()
    both = E.score_hyps(hyps, iwslt, compound_split=True)
    assert both.bleu_tok == plain.bleu_tok == round(E.tok_bleu(hyps, refs, lowercase=True), 2)
    split = [E.compound_split(x) for x in hyps], [E.compound_split(x) for x in refs]
    assert both.bleu_tok_cs == round(E.tok_bleu(*split, lowercase=True), 2) != both.bleu_tok
    wmt = E.score_hyps(hyps, {**iwslt, "compound_split": True}, compound_split=True)
    assert wmt.bleu_tok_cs == wmt.bleu_tok == both.bleu_tok_cs


def test_the_table_labels_the_compound_split_column():
    from fairseq_lnpos.experiments import report

    base = dict(arch="a", optimizer="radam", lr=5e-4, warmup=0, seed=1, status="finished", paper_note="",
                best_bleu_tok=30.0, best_epoch=3, avg_bleu_tok=31.0, avg_epochs="2-3", last_bleu_tok=29.0,
                source="")
    rows = [dict(base, run="ref-iwslt-tfixup", paper_bleu=35.73, best_bleu_tok_cs=30.5, avg_bleu_tok_cs=31.6),
            dict(base, run="ref-iwslt-clinic-postln", paper_bleu=35.64)]
    lines = report.markdown(rows).splitlines()
    head = [c.strip() for c in lines[2].strip("|").split("|")]
    cells = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")] for ln in lines[4:6]}
    col = head.index("tok BLEU compound-split best / avg")
    assert head[col - 1] == "tok BLEU avg (epochs)" and len(cells["ref-iwslt-tfixup"]) == len(head)
    assert cells["ref-iwslt-tfixup"][col] == "30.50 / 31.60" and cells["ref-iwslt-tfixup"][col - 1] == "31.00 (2-3)"
    assert cells["ref-iwslt-clinic-postln"][col] == ""
    assert any(ln.startswith("tok BLEU:") and "the paper column is always compared with the plain tok BLEU" in ln for ln in lines)
    # a table without compound-split scores has no such column
    assert "compound-split best" not in report.markdown(rows[1:]).splitlines()[2]


def test_the_evaluator_logs_each_scoring_and_its_phases(monkeypatch, caplog, tmp_path):
    """Each request gets a line when it starts and one when it ends, with the seconds of fairseq-generate
    and of the scoring (or the failure), so a slow evaluator can be told from a slow generation."""
    import io
    import json
    import logging
    import re

    from fairseq_lnpos.data import manifest as M
    from fairseq_lnpos.experiments import evaluator
    from fairseq_lnpos.experiments.records import ScoreRequest, Scores

    def generate(argv):
        if "bad" in argv:
            raise OSError("Model file not found: /c/bad.pt")
        return "S-0\tein haus\nD-0\t-0.1\ta house\n"

    monkeypatch.setattr(E, "run_generate", generate)
    monkeypatch.setattr(E, "score_hyps", lambda hyps, manifest, **kw: Scores(bleu_tok=50.0, n_sentences=len(hyps)))
    monkeypatch.setattr(M, "read_manifest", lambda data: {})
    good = ScoreRequest(argv=("--path", "/c/checkpoint3.pt"), data=str(tmp_path), hyp_out=str(tmp_path / "h.txt"),
                        checkpoint="/c/checkpoint3.pt")
    bad = ScoreRequest(argv=("bad",), data=str(tmp_path), hyp_out=str(tmp_path / "b.txt"), checkpoint="/c/bad.pt")
    answers = io.StringIO()
    with caplog.at_level(logging.INFO, logger="fairseq_lnpos.evaluator"):
        evaluator.serve([json.dumps(r.to_json()) + "\n" for r in (good, bad)], answers)
    first, second = map(json.loads, answers.getvalue().splitlines())
    assert first["result"]["bleu_tok"] == 50.0 and first["result"]["eval_seconds"] >= 0
    assert second == {"error": "scoring /c/bad.pt failed: Model file not found: /c/bad.pt"}
    assert (tmp_path / "h.txt").read_text() == "a house\n"
    lines = [r.getMessage() for r in caplog.records if r.name == "fairseq_lnpos.evaluator"]
    assert lines[0] == "scoring /c/checkpoint3.pt" and lines[2] == "scoring /c/bad.pt"
    assert re.fullmatch(r"scored /c/checkpoint3\.pt in \d+\.\d s \(generate \d+\.\d s, score \d+\.\d s\)", lines[1])
    assert re.fullmatch(r"scoring /c/bad\.pt failed: Model file not found: /c/bad\.pt, after \d+\.\d s", lines[3])


def test_output_shape_tells_a_loop_and_a_short_output_from_a_translation(tmp_path):
    refs = ["a b c d e f", "the cat sat on the mat ."]
    assert E.output_shape(refs, refs) == {"length_ratio": 1.0, "repeat_4gram": 0.0}
    loop = ["a a a a a a", "the cat"]  # 3 four-grams, 1 distinct; the second is too short to count
    assert E.output_shape(loop, refs) == {"length_ratio": round(8 / 13, 4), "repeat_4gram": round(1 - 1 / 3, 4)}
    assert E.output_shape(["", "x"], refs) == {"length_ratio": round(1 / 13, 4), "repeat_4gram": None}
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    res = E.score_hyps(loop, {"refs": {"tok": {"test": str(ref)}}, "target_lang": "en"})
    assert (res.length_ratio, res.repeat_4gram) == (round(8 / 13, 4), round(2 / 3, 4))
