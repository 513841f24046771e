"""Score one checkpoint on the test set: tokenized BLEU (the paper's) and sacreBLEU, both labelled.

- ``fairseq-generate DATA --user-dir ... --path checkpointN.pt --gen-subset test --beam 5 --lenpen 1.2
  --post-process <manifest post_process>`` gives hypotheses in the data's tokenized form (the
  sentencepiece pieces are joined back; for IWSLT/WMT that is Moses-tokenized text).
- Tokenized BLEU: fairseq's own scorer (``fairseq.scoring.bleu.Scorer``, used exactly as
  ``fairseq-score`` uses it) on the hypotheses against the manifest's ``tok`` references; both
  sides lowercased when the manifest says ``lowercase`` (IWSLT), both compound-split as fairseq's
  ``compound_split_bleu.sh`` does when it says ``compound_split`` (WMT). With ``compound_split``
  (a row's ``compound_split_bleu``) also ``bleu_tok_cs``: the same with the compounds split, what
  T-Fixup's ``compound_split_bleu.sh`` scores beside the plain BLEU (on WMT the two are one).
- sacreBLEU: hypotheses detokenized with sacremoses' Moses detokenizer against the ``raw``
  references, lowercase-insensitive when the data is lowercased (the signature then says ``case:lc``).

Generation runs fairseq-generate's own ``main()`` (``run_generate``), in this process: the grid's
evaluator (evaluator.py) imports fairseq once and scores every checkpoint of a grid with it.

CLI: ``python -m fairseq_lnpos.experiments.evaluate checkpoint --data DIR --path ckpt.pt``
or ``... score --hyp FILE --ref-tok FILE [--ref-raw FILE] [--lowercase] [--compound-split]``.
"""
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from ..common import read_lines, write_text
from ..cli import CommandParser, finite_float, whole_number
from ..errors import LnposError, run_main
from ..launch import generate_cmd
from .records import Scores

LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq's own

COMPOUND = re.compile(r"(\S)-(\S)")  # fairseq examples/translation/compound_split_bleu.sh


def compound_split(line):
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def tok_bleu(hyps, refs, lowercase=False, split_compounds=False):
    """Tokenized corpus BLEU (0-100) with fairseq's C scorer, as ``fairseq-score --sys --ref`` does."""
    from fairseq.data import dictionary
    from fairseq.scoring import bleu

    if len(hyps) != len(refs):
        raise LnposError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not refs:  # BLEU of no sentence is undefined (fairseq's scorer divides by zero)
        raise LnposError("no sentence to score: the hypotheses and references are empty; give one sentence a line")
    d = dictionary.Dictionary()
    scorer = bleu.Scorer(bleu.BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    for h, r in zip(hyps, refs):
        if lowercase:
            h, r = h.lower(), r.lower()
        if split_compounds:
            h, r = compound_split(h), compound_split(r)
        scorer.add(d.encode_line(r), d.encode_line(h))
    return scorer.score(order=4)


def detokenize(lines, lang):
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    # aggressive hyphen splitting (WMT) writes "@-@"; the Moses detokenizer does not undo it
    return [md.detokenize(re.sub(r" @(\S)@ ", r"\1", line).split()) for line in lines]


def sacre_bleu(detok_hyps, raw_refs, lowercase=False):
    """(score, signature) of sacreBLEU on detokenized hypotheses against raw references."""
    from sacrebleu.metrics import BLEU

    if len(detok_hyps) != len(raw_refs):
        raise LnposError(f"{len(detok_hyps)} hypotheses but {len(raw_refs)} references")
    metric = BLEU(lowercase=lowercase)
    return metric.corpus_score(detok_hyps, [raw_refs]).score, str(metric.get_signature())


def parse_generate(text):
    """(sentence ids seen, {id: hypothesis}) from fairseq-generate's ``S-<id>`` and ``D-<id>`` lines.

    fairseq-generate prints no ``D-`` line for a sentence whose beam finalised no hypothesis
    (seen with untrained models); such a sentence scores as an empty output."""
    seen, hyps = set(), {}
    for line in text.splitlines():
        if line.startswith(("S-", "D-")):
            head, *rest = line.split("\t")
            sid = int(head[2:])
            if line[0] == "S":
                seen.add(sid)
            else:
                hyps[sid] = rest[1] if len(rest) > 1 else ""
    return seen, hyps


def score_hyps(hyps, manifest, subset="test", seen=None, compound_split=False):
    """Both BLEUs of tokenized hypotheses, with the settings the manifest prescribes, and with
    ``compound_split`` the tokenized BLEU of compound-split hypotheses and references (``bleu_tok_cs``);
    a :class:`~.records.Scores`.

    ``hyps`` is a list in sentence order or a dict {sentence id: hypothesis} (missing ids score as
    empty outputs); ``seen`` the sentence ids fairseq-generate read."""
    refs_tok = read_lines(manifest["refs"]["tok"][subset])
    n_seen = len(seen) if seen is not None else len(hyps)
    if n_seen != len(refs_tok) or (isinstance(hyps, dict) and any(i >= len(refs_tok) for i in hyps)):
        raise LnposError(
            f"fairseq-generate read {n_seen} sentences but {manifest['refs']['tok'][subset]} has "
            f"{len(refs_tok)} references: the data dir and its text files do not match"
        )
    missing = 0
    if isinstance(hyps, dict):
        missing = len(refs_tok) - len(hyps)
        hyps = [hyps.get(i, "") for i in range(len(refs_tok))]
    lc, cs = bool(manifest.get("lowercase")), bool(manifest.get("compound_split"))
    bleu = round(tok_bleu(hyps, refs_tok, lc, cs), 2)
    split = None
    if compound_split:
        split = bleu if cs else round(tok_bleu(hyps, refs_tok, lc, True), 2)
    raw = manifest["refs"].get("raw", {}).get(subset)
    return Scores(bleu_tok=bleu, n_sentences=len(hyps), bleu_tok_settings=f"fairseq bleu, lowercase={lc}, "
                  f"compound_split={cs}", no_hypothesis=missing, bleu_tok_cs=split, **output_shape(hyps, refs_tok),
                  **(_sacre(hyps, read_lines(raw), manifest["target_lang"], lc) if raw else {}))


def output_shape(tok_hyps, tok_refs, n=4):
    """Whether outputs are degenerate, in two numbers (of :class:`~.records.Scores`): ``length_ratio``,
    the hypotheses' tokens over the references' (BLEU's brevity penalty reads the same ratio), and
    ``repeat_4gram``, the mean over hypotheses of at least ``n`` tokens of 1 - distinct n-grams / n-grams
    (seq-rep-n of Welleck et al. 2019, "Neural text generation with unlikelihood training"): 0 when no
    4-gram repeats within a sentence, near 1 for a loop; None when no hypothesis is that long."""
    hyp_tokens = [h.split() for h in tok_hyps]
    ref_len = sum(len(r.split()) for r in tok_refs)
    reps = []
    for toks in hyp_tokens:
        grams = [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]
        if grams:
            reps.append(1 - len(set(grams)) / len(grams))
    return {"length_ratio": round(sum(map(len, hyp_tokens)) / ref_len, 4) if ref_len else None,
            "repeat_4gram": round(sum(reps) / len(reps), 4) if reps else None}


def _sacre(tok_hyps, raw_refs, lang, lowercase):
    """sacrebleu and sacrebleu_signature (of :class:`~.records.Scores`) of tokenized hypotheses."""
    score, sig = sacre_bleu(detokenize(tok_hyps, lang), raw_refs, lowercase)
    return {"sacrebleu": round(score, 2), "sacrebleu_signature": sig}


def run_generate(argv):
    """fairseq-generate's own ``main()`` on ``argv`` (a command line without the program name), in
    this process; returns what fairseq-generate prints (S-/H-/D-/P- lines, then its BLEU line)."""
    import logging

    from .. import register

    register()  # fairseq does not import a --user-dir package that is imported already
    from fairseq import options
    from fairseq_cli import generate

    if not logging.getLogger().handlers:
        # generate's logging.basicConfig would otherwise log into its results file
        logging.basicConfig(format=LOG_FORMAT,
                            level=logging.INFO, stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="lnpos-generate-") as tmp:
        cfg = _generation_config(list(argv), options)
        cfg.common_eval.results_path = tmp
        generate.main(cfg)
        return (Path(tmp) / f"generate-{cfg.dataset.gen_subset}.txt").read_text(encoding="utf-8")


_CONFIGS = {}  # a command line without its --path value -> fairseq's configuration of it


def _generation_config(argv, options):
    """fairseq-generate's configuration of ``argv``, as its ``main()`` builds it from the command
    line (``convert_namespace_to_omegaconf``: a Hydra compose, about 2 s); composed once per
    command line that differs only in ``--path``, then copied with the checkpoint set."""
    import copy

    from ..fairseq_build import to_config

    def compose():
        return to_config(options.parse_args_and_arch(options.get_generation_parser(), argv))

    if "--path" not in argv[:-1]:
        return compose()
    i = argv.index("--path")
    key = tuple(argv[:i] + argv[i + 2:])
    if key not in _CONFIGS:
        _CONFIGS[key] = compose()
    cfg = copy.deepcopy(_CONFIGS[key])
    cfg.common_eval.path = argv[i + 1]
    return cfg


def evaluate_checkpoint(data_dir, checkpoint, manifest, beam=5, lenpen=1.2, extra=(), hyp_out=None):
    """Generate with ``checkpoint`` on the test set and score it (:class:`~.records.Scores`, see score_hyps)."""
    if not Path(checkpoint).is_file():
        raise LnposError(f"checkpoint {checkpoint} not found")
    cmd = generate_cmd(data_dir, checkpoint, manifest, beam, lenpen, extra=extra)
    return generate_and_score(cmd[1:], manifest, hyp_out)


def generate_and_score(argv, manifest, hyp_out=None, compound_split=False, phases=None):
    """fairseq-generate ``argv`` in this process, its hypotheses written to ``hyp_out`` (one a
    line, in sentence order), scored with the manifest's settings (see score_hyps). ``phases``: a
    dict that receives the seconds of fairseq-generate (loading included) and of the scoring."""
    t0 = time.time()
    seen, hyps = parse_generate(run_generate(argv))
    t1 = time.time()
    if hyp_out is not None:
        write_text(hyp_out, "".join(hyps.get(i, "") + "\n" for i in range(len(seen))))
    scores = score_hyps(hyps, manifest, seen=seen, compound_split=compound_split)
    if phases is not None:
        phases.update(generate=t1 - t0, score=time.time() - t1)
    return scores


def command(argv=None):
    """Print the scores of a checkpoint or of a hypothesis file as JSON."""
    p = CommandParser(prog="evaluate", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("checkpoint", help="generate with a checkpoint and score it")
    c.add_argument("--data", required=True)
    c.add_argument("--path", required=True)
    c.add_argument("--beam", type=whole_number(1), default=5)
    c.add_argument("--lenpen", type=finite_float, default=1.2)
    c.add_argument("--hyp-out")
    s = sub.add_parser("score", help="score a file of tokenized hypotheses")
    s.add_argument("--hyp", required=True)
    s.add_argument("--ref-tok", required=True)
    s.add_argument("--ref-raw")
    s.add_argument("--lang", default="en", help="target language for the Moses detokenizer")
    s.add_argument("--lowercase", action="store_true")
    s.add_argument("--compound-split", action="store_true")
    a = p.parse_args(argv)
    try:
        if a.cmd == "checkpoint":
            from ..data.manifest import read_manifest

            res = evaluate_checkpoint(a.data, a.path, read_manifest(a.data), a.beam, a.lenpen,
                                      hyp_out=a.hyp_out)
        else:
            hyps = read_lines(a.hyp)
            res = Scores(bleu_tok=round(tok_bleu(hyps, read_lines(a.ref_tok), a.lowercase, a.compound_split), 2),
                         **(_sacre(hyps, read_lines(a.ref_raw), a.lang, a.lowercase) if a.ref_raw else {}))
    except OSError as e:
        raise LnposError(str(e)) from None
    print(json.dumps(res.to_json(), indent=1))
    return 0


def main(argv=None):
    """The command: one line and exit 2 for bad input, 130 when interrupted."""
    return run_main("evaluate", command, argv)


if __name__ == "__main__":
    sys.exit(main())
