"""Does a trained model use its source? Its validation NLL with the true sources, and with the sources
permuted across the validation sentences.

    python -m fairseq_lnpos.experiments.source_use OUT [--subset valid] [--seed 1]

A decoder that stalled no longer reads the source: permuting the sources barely changes its NLL, while a
model that learned to translate loses several bits a token. For every finished run of the grid folder OUT
with its final checkpoint (``checkpoints/checkpoint_last.pt``), this loads the checkpoint with fairseq, runs
the validation set twice (fairseq's own dataset, batches and collater; the model in eval mode) and writes
``source_use.json`` into the run folder: ``nll`` (bits a target token, as fairseq's ``valid_nll_loss``),
``nll_permuted``, ``gain`` = nll_permuted - nll, the subset, its sentences and tokens (those fairseq's own
validation scores: longer ones than the model's positions are skipped, as fairseq skips them, and counted),
and the permutation's seed. The permutation is a derangement (one cycle through a random order): no
sentence keeps its source. On a split whose size is a multiple of 8 the true-source NLL is fairseq-validate's
to the third decimal (tests/test_source_use.py); on Multi30k's 1014 validation sentences fairseq's validation
reports 1008 sentences and an NLL up to 0.04 bit lower than this pass over all 1014 (fairseq's criterion on
the same batches gives this one's).
A run already measured from the same checkpoint is skipped, so an interrupted pass resumes.
The table of every run (:mod:`~fairseq_lnpos.analysis.frame`) reads the file into ``nll_permuted`` and
``source_gain``; :mod:`~fairseq_lnpos.analysis.outcome` judges "trains" by the gain.
"""
import json
import math
import sys
from pathlib import Path

from ..cli import CommandParser, whole_number
from ..common import write_text
from ..errors import LnposError, StateError, run_main
from .records import Outcome
from .rundir import grid_run_dirs

FILE = "source_use.json"
LAST = "checkpoint_last.pt"


def derangement(n, seed):
    """perm[i]: the sentence whose source sentence i is given; no i maps to itself (n >= 2)."""
    import numpy as np

    order = np.random.RandomState(seed).permutation(n)
    perm = np.empty(n, dtype=np.int64)
    perm[order] = np.roll(order, -1)
    return perm


def measure(checkpoint, data, subset="valid", seed=1, max_tokens=4096):
    """{nll, nll_permuted, gain, subset, sentences, skipped, tokens, seed} of ``checkpoint`` on ``data``'s
    ``subset`` (bits a target token)."""
    import torch
    from fairseq import checkpoint_utils, utils

    from .. import register
    from ..checkpoint import guard_checkpoint_loading

    register()  # the plugin's architectures, which the checkpoint names
    guard_checkpoint_loading()
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)],
                                                                     arg_overrides={"data": str(data)})
    model = models[0].float().eval()
    try:
        task.load_dataset(subset, combine=False, epoch=1)
    except FileNotFoundError as e:
        raise LnposError(f"{data}: no {subset} split to measure ({e}): give the data folder the run trained on") from None
    ds = task.dataset(subset)
    # the sentences fairseq's own validation scores: those within the model's and the task's positions
    kept, skipped = ds.filter_indices_by_size(
        ds.ordered_indices(), utils.resolve_max_positions(task.max_positions(), model.max_positions()))
    if len(kept) < 2:
        raise LnposError(f"{data}: the {subset} split has {len(kept)} sentence to score: permuting sources needs two "
                         f"or more")
    order = sorted(int(i) for i in kept)
    source_of = dict(zip(order, (order[j] for j in derangement(len(order), seed))))
    pad = task.target_dictionary.pad()
    nll = {"true": 0.0, "permuted": 0.0}
    tokens = 0
    with torch.no_grad():
        for batch in ds.batch_by_size(kept, max_tokens=max_tokens):
            items = [ds[int(i)] for i in batch]
            for name, samples in (("true", items),
                                  ("permuted", [{**it, "source": ds[source_of[it["id"]]]["source"]} for it in items])):
                sample = ds.collater(samples)
                lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
                target = sample["target"]
                keep = target.ne(pad)
                nll[name] -= float(lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[keep].sum())
            tokens += int(keep.sum())  # the targets are the same in both passes
    bits = {k: v / tokens / math.log(2) for k, v in nll.items()}
    return {"nll": bits["true"], "nll_permuted": bits["permuted"], "gain": bits["permuted"] - bits["true"],
            "subset": subset, "sentences": len(order), "skipped": len(skipped), "tokens": tokens, "seed": seed}


def read(run_path):
    """The run folder's source-use record (a dict), or None where it was not measured."""
    path = Path(run_path) / FILE
    if not path.is_file():
        return None
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
        return {k: float(got[k]) for k in ("nll", "nll_permuted", "gain")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StateError(f"{path}: cannot read it ({type(e).__name__}: {e}): delete it and measure the run "
                         f"again (python -m fairseq_lnpos.experiments.source_use OUT)") from None


def pending(out, subset="valid", seed=1):
    """(run folder, checkpoint, data) of the finished runs of ``out`` not yet measured from their final
    checkpoint; and the finished runs that have no checkpoint (kept apart: nothing to measure)."""
    todo, without = [], []
    for rd in grid_run_dirs(out, "the output folder of a grid or sweep (OUT/NAME/seedS/)"):
        if rd.outcome() is not Outcome.FINISHED:
            continue
        ckpt = rd.save_dir / LAST
        if not ckpt.is_file():
            without.append(rd.path)
            continue
        old = rd.path / FILE
        if old.is_file():
            try:
                rec = json.loads(old.read_text(encoding="utf-8"))
                if (rec.get("checkpoint_mtime") == ckpt.stat().st_mtime and rec.get("subset") == subset
                        and rec.get("seed") == seed):
                    continue
            except (OSError, ValueError):
                pass
        todo.append((rd.path, ckpt, rd.config()["data"]))
    return todo, without


def _main(argv):
    p = CommandParser(prog="python -m fairseq_lnpos.experiments.source_use", description=__doc__.split("\n\n")[0])
    p.add_argument("out", metavar="OUT", help="a grid's or sweep's output folder (OUT/NAME/seedS/)")
    p.add_argument("--subset", default="valid", help="the split to measure on (default: %(default)s)")
    p.add_argument("--seed", type=whole_number(0), default=1, help="the permutation's seed (default: %(default)s)")
    args = p.parse_args(argv)
    todo, without = pending(args.out, args.subset, args.seed)
    for path in without:
        print(f"{path}: no {LAST} (its checkpoints were removed): not measured", file=sys.stderr)
    for i, (path, ckpt, data) in enumerate(todo, 1):
        got = measure(ckpt, data, args.subset, args.seed)
        got.update(checkpoint=LAST, checkpoint_mtime=ckpt.stat().st_mtime)
        write_text(path / FILE, json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"[{i}/{len(todo)}] {path}: NLL {got['nll']:.3f} bits, sources permuted {got['nll_permuted']:.3f}, "
              f"gain {got['gain']:.3f}", flush=True)
    print(f"measured {len(todo)} runs; {len(without)} finished runs without a checkpoint")
    return 0


def main(argv=None):
    return run_main("source_use", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
