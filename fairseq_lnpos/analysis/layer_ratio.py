"""First-layer / last-layer gradient-norm ratio at initialization, from fig3.json files.

    python -m fairseq_lnpos.analysis.layer_ratio OUT6/fig3.json OUT24/fig3.json [--weight fc2]

The Keel paper predicts that Post-LN's ratio shrinks with depth (gradients vanish towards the
input) and Keel's does not. Uses the paper's statistic (norm of the batch-averaged gradient) of
the per-layer models (``--layers-depth``) of each file.
"""
import argparse
import json


def ratios(fig3, weight="fc2"):
    """{arch: {stack: (depth, first / last)}} for one fig3.json."""
    out = {}
    for arch, stacks in fig3["per_layer"].items():
        for stack, weights in stacks.items():
            norms = weights[weight]["mean"]
            out.setdefault(arch, {})[stack] = (len(norms), norms[0] / norms[-1])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="layer_ratio", description=__doc__.split("\n\n")[0])
    p.add_argument("fig3_json", nargs="+")
    p.add_argument("--weight", default="fc2", choices=("fc1", "fc2"))
    args = p.parse_args(argv)
    print(f"| arch | stack | depth | first / last layer {args.weight} gradient norm |")
    print("|---|---|---|---|")
    for path in args.fig3_json:
        with open(path) as f:
            for arch, stacks in ratios(json.load(f), args.weight).items():
                for stack, (depth, r) in stacks.items():
                    print(f"| {arch} | {stack} | {depth} | {r:.3f} |")


if __name__ == "__main__":
    main()
