"""First-layer / last-layer gradient-norm ratio at initialization, from fig3.json files.

    python scripts/tools/layer_ratio.py OUT6/fig3.json OUT24/fig3.json [--weight fc2]

The Keel paper predicts that Post-LN's ratio shrinks with depth (gradients vanish towards the
input) and Keel's does not. Uses the paper's statistic (norm of the batch-averaged gradient) of
the per-layer models (``--layers-depth``) of each file.
"""
import sys

from fairseq_lnpos.common import read_json
from fairseq_lnpos.cli import CommandParser
from fairseq_lnpos.errors import StateError, run_main


def ratios(fig3, weight="fc2"):
    """{arch: {stack: (depth, first / last)}} for one fig3.json."""
    out = {}
    if not isinstance(fig3, dict) or "per_layer" not in fig3:
        raise StateError("not a fig3.json of scripts/init_grad_analysis.sh (no per_layer): pass that file")
    for arch, stacks in fig3["per_layer"].items():
        for stack, weights in stacks.items():
            norms = weights[weight]["mean"]
            out.setdefault(arch, {})[stack] = (len(norms), norms[0] / norms[-1])
    return out


def main(argv=None):
    def command(argv):
        p = CommandParser(prog="layer_ratio", description=__doc__.split("\n\n")[0])
        p.add_argument("fig3_json", nargs="+")
        p.add_argument("--weight", default="fc2", choices=("fc1", "fc2"))
        a = p.parse_args(argv)
        table = []
        for path in a.fig3_json:  # every file is read before anything is printed
            fig3 = read_json(path, what_to_do="pass a fig3.json written by scripts/init_grad_analysis.sh")
            try:
                table.append(ratios(fig3, a.weight))
            except StateError as e:
                raise StateError(f"{path}: {e}") from None
        print(f"| arch | stack | depth | first / last layer {a.weight} gradient norm |")
        print("|---|---|---|---|")
        for r in table:
            for arch, stacks in r.items():
                for stack, (depth, ratio) in stacks.items():
                    print(f"| {arch} | {stack} | {depth} | {ratio:.3f} |")

    return run_main("layer_ratio", command, argv)


if __name__ == "__main__":
    sys.exit(main())
