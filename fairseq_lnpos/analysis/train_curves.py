"""Per-layer gradient-norm curves of a training run, from ``<save-dir>/grad_norms.jsonl``, and the
same figure of any per-group value of ``<save-dir>/diagnostics.jsonl`` (``--metric``).

    python -m fairseq_lnpos.analysis.train_curves CKPT_DIR/grad_norms.jsonl [--groups REGEX] [--out PNG]
    python -m fairseq_lnpos.analysis.train_curves CKPT_DIR/diagnostics.jsonl --metric update_ratio

The JSONL file is written by ``--task translation_lnpos --log-grad-norms``; a resumed run appends
to it, so when an update appears twice the later record wins. By default one panel per stack
shows every layer's total norm (colour = depth), and a third panel the embeddings, output
projection and total; ``--groups`` picks any other group names by regular expression
(e.g. ``'decoder/\\d+/fc2$'``). ``--metric`` picks the key of the records to draw (``norms``, the
default, for grad_norms.jsonl; ``update_ratio``, ``adaptive_lr_median``, ``attn_max_logit``,
``attn_entropy``, ``output_logits``, ``hessian_top`` ... for diagnostics.jsonl: docs/gradnorms.md).
Where a metric has no whole-layer values (``encoder/3``) the stack panels show its sub-layers.
"""
import json
import re
import sys
from pathlib import Path

from fairseq_lnpos.common import plain_name, write_figure
from fairseq_lnpos.cli import CommandParser
from fairseq_lnpos.errors import LnposError, run_main


UPDATE = re.compile(r'^\{"update": (\d+)')  # how the task starts a record


def read_records(path, max_update=None):
    """The records of a JSONL file of the task, in file order (a resumed run appends, so an update can
    come twice); with ``max_update``, only the updates up to it (later records are not parsed); a line
    cut by an interruption is left out."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = UPDATE.match(line)
            if max_update is not None and m and int(m.group(1)) > max_update:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_jsonl(path, max_update=None, metric="norms"):
    """``(updates, {group: [value or None per update]})`` of the records' ``metric`` (a dict of groups,
    or one number, named by the metric), sorted by update, last record per update, updates without
    it left out; with ``max_update``, only the updates up to it (later records are not parsed)."""
    by_update = {rec["update"]: rec[metric] if isinstance(rec[metric], dict) else {metric: rec[metric]}
                 for rec in read_records(path, max_update) if metric in rec}
    updates = sorted(by_update)
    groups = []
    for u in updates:
        for g in by_update[u]:
            if g not in groups:
                groups.append(g)
    return updates, {g: [by_update[u].get(g) for u in updates] for g in groups}


def _layer_groups(series, stack):
    pat = re.compile(rf"^{stack}/(\d+)$")
    layers = sorted((int(m.group(1)), g) for g in series if (m := pat.match(g)))
    if layers:
        return [(f"layer {i + 1}", g) for i, g in layers]
    pat = re.compile(rf"^{stack}/(\d+)/(.+)$")  # a metric of sub-layers only (Adam's step sizes)
    subs = sorted((int(m.group(1)), m.group(2), g) for g in series if (m := pat.match(g)))
    return [(f"layer {i + 1} {sub}", g) for i, sub, g in subs]


def plot(path, out, groups_regex=None, metric="norms"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    updates, series = read_jsonl(path, metric=metric)
    if not updates:
        raise LnposError(f"{path} has no records of {metric!r}: train with --task translation_lnpos "
                         f"{'--log-grad-norms' if metric == 'norms' else '--log-diagnostics, or pick another --metric'}")
    label = "gradient norm" if metric == "norms" else metric.replace("_", " ")
    linear = metric.startswith("attn_entropy") or metric == "hessian_top"  # may be 0 or negative
    if groups_regex:
        pat = re.compile(groups_regex)
        chosen = [g for g in series if pat.search(g)]
        if not chosen:
            raise LnposError(f"no group matches {groups_regex!r}; groups look like {', '.join(list(series)[:5])}")
        panels = [("selected groups", [(g, g) for g in chosen])]
    else:
        panels = [(stack, _layer_groups(series, stack)) for stack in ("encoder", "decoder")]
        shown = {g for _, lines in panels for _, g in lines}
        other = [g for g in ("embed", "output_projection", "total") if g in series]
        if not shown and not other:  # a metric without groups (output_logits, hessian_top)
            other = list(series)
        panels = [p for p in panels if p[1]] + [("other", [(g, g) for g in other])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, (title, lines) in zip(axes[0], panels):
        for i, (name, g) in enumerate(lines):
            color = cmap(i / max(1, len(lines) - 1)) if title in ("encoder", "decoder") else None
            ys = [float("nan") if v is None else v for v in series[g]]
            ax.plot(updates, ys, label=name, color=color, lw=1, marker="." if len(updates) < 20 else None)
        if not linear:
            ax.set_yscale("log")
        ax.set_xlabel("update")
        ax.set_title(f"{label}: {title}", fontsize=9)
        if lines:
            ax.legend(fontsize=6, ncol=2)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.15, top=0.9, wspace=0.25)
    write_figure(fig, out, dpi=80)
    plt.close(fig)
    return out


def main(argv=None):
    def command(argv):
        p = CommandParser(prog="train_curves", description=__doc__.split("\n\n")[0])
        p.add_argument("jsonl", help="grad_norms.jsonl from a --log-grad-norms run (or diagnostics.jsonl: --metric)")
        p.add_argument("--metric", default="norms",
                       help="the records' key to draw (default norms; diagnostics.jsonl: update_ratio, "
                            "adaptive_lr_median, attn_max_logit, attn_entropy, output_logits, hessian_top ...)")
        p.add_argument("--groups", help="regular expression over group names (default: per-layer totals)")
        p.add_argument("--out", help="PNG to write (default: next to the JSONL, grad_norms.png or "
                                     "diagnostics_<metric>.png)")
        a = p.parse_args(argv)
        src = Path(a.jsonl)
        if not src.is_file():
            raise LnposError(f"{src} not found: pass <save-dir>/grad_norms.jsonl of a run trained with "
                             "--task translation_lnpos --log-grad-norms")
        try:
            re.compile(a.groups or "")
        except re.error as e:
            raise LnposError(f"--groups {a.groups!r} is not a regular expression ({e})") from None
        default = "grad_norms.png" if a.metric == "norms" else f"{src.stem}_{plain_name(a.metric, '--metric')}.png"
        print(plot(src, Path(a.out) if a.out else src.with_name(default), a.groups, a.metric))

    return run_main("train_curves", command, argv)


if __name__ == "__main__":
    sys.exit(main())
