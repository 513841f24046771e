"""Results of a grid: Markdown table, results.csv and Fig. 2-style figures.

    scripts/make_table.sh OUT_DIR [--no-figures]

Writes OUT_DIR/results.md, OUT_DIR/results.csv and OUT_DIR/fig_<figure>.png (one per `figure`
group of runs.py, and fig_all.png with every run when there are several groups: BLEU and
validation loss per epoch, one column per optimizer, warm-up as line styles). "best" is the best epoch on the test set, as the paper's per-epoch curves show it.
"""
import argparse
import csv
import fcntl
import io
import json
import os
import sys
from pathlib import Path

from . import runs as R

CSV_COLUMNS = ["run", "arch", "optimizer", "lr", "warmup", "schedule", "seed", "status", "paper_bleu",
               "paper_valid_loss", "paper_note", "best_bleu_tok", "best_epoch", "last_bleu_tok", "last_epoch",
               "sacrebleu", "last_sacrebleu", "best_valid_loss", "epochs"]
TOK_LABEL = "tok BLEU"
NOTE = ("tok BLEU: fairseq's BLEU scorer on the data's Moses tokens (lowercased for IWSLT, compound-split "
        "for WMT), the paper's metric; sacreBLEU: detokenized output against the raw references, at the "
        "epoch of best tok BLEU. Best = best epoch on the test set (the paper's per-epoch curves).")


def _read(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _locked(run_dir):
    lock = run_dir / ".lock"
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def collect(out_dir):
    """One dict per run dir (OUT/NAME/seedS), in the order of the run table."""
    order = {r.name: i for i, r in enumerate(R.RUNS)}
    rows = []
    for cfg_path in sorted(Path(out_dir).glob("*/seed*/config.json")):
        run_dir = cfg_path.parent
        cfg = _read(cfg_path)
        if cfg is None:
            continue
        run = cfg["run"]
        epochs = sorted((e for e in (_read(p) for p in (run_dir / "eval").glob("epoch*.json")) if e),
                        key=lambda e: e["epoch"])
        done = _read(run_dir / "DONE.json")
        if done:
            status = done["status"]
        elif _locked(run_dir):
            status = "running"
        else:
            status = f"interrupted after epoch {epochs[-1]['epoch']}" if epochs else "not started"
        row = {"run": run["name"], "arch": cfg["arch"], "optimizer": run["optimizer"], "lr": run["lr"],
               "warmup": run["warmup"], "schedule": run["schedule"], "seed": cfg["seed"], "status": status,
               "paper_bleu": run.get("paper_bleu"), "paper_valid_loss": run.get("paper_valid_loss"),
               "paper_note": run.get("paper_note", ""), "figure": run.get("figure", "misc"),
               "ln": run["ln"], "max_epoch": run["max_epoch"], "curve": epochs, "epochs": len(epochs)}
        scored = [e for e in epochs if e.get("bleu_tok") is not None]
        if scored:
            best = max(scored, key=lambda e: (e["bleu_tok"], -e["epoch"]))
            row.update(best_bleu_tok=best["bleu_tok"], best_epoch=best["epoch"],
                       last_bleu_tok=scored[-1]["bleu_tok"], last_epoch=scored[-1]["epoch"],
                       sacrebleu=best.get("sacrebleu"), last_sacrebleu=scored[-1].get("sacrebleu"),
                       signature=best.get("sacrebleu_signature"))
        losses = [e["valid_loss"] for e in epochs if e.get("valid_loss") is not None]
        row["best_valid_loss"] = min(losses) if losses else None
        rows.append(row)
    rows.sort(key=lambda r: (order.get(r["run"], len(order)), r["run"], r["seed"]))
    return rows


def _fmt(v, nd=2):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}" if nd is not None else f"{v:g}"
    return str(v)


def write_csv(rows, path):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else (f"{r[k]:g}" if k == "lr" else r[k])) for k in CSV_COLUMNS})
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    os.replace(tmp, path)


def markdown(rows):
    head = ["run", "arch", "opt", "lr", "warm-up", "seed", "status", "paper",
            f"{TOK_LABEL} best (epoch)", f"{TOK_LABEL} last", "sacreBLEU", "best valid loss"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        paper = _fmt(r["paper_bleu"]) if r["paper_bleu"] is not None else r["paper_note"]
        best = f"{_fmt(r.get('best_bleu_tok'))} ({r['best_epoch']})" if r.get("best_bleu_tok") is not None else ""
        warm = str(r["warmup"]) if r["warmup"] > 1 else "none"
        cells = [r["run"], r["arch"], r["optimizer"], f"{r['lr']:g}", warm, str(r["seed"]), r["status"], paper,
                 best, _fmt(r.get("last_bleu_tok")), _fmt(r.get("sacrebleu")), _fmt(r.get("best_valid_loss"), 3)]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    sigs = sorted({r["signature"] for r in rows if r.get("signature")})
    lines.append("")
    lines += [f"sacreBLEU signature: {s}" for s in sigs] or ["sacreBLEU signature: (no run evaluated yet)"]
    lines.append("")
    lines.append(NOTE)
    return "\n".join(lines) + "\n"


LINESTYLES = {"none": "-", "500": "--", "4000": ":"}


def figures(rows, out_dir):
    import logging

    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    groups = sorted({r["figure"] for r in rows})
    for fig_name in groups + (["all"] if len(groups) > 1 else []):
        group = [r for r in rows if fig_name in ("all", r["figure"]) and r["curve"]]
        if not group:
            continue
        opts = sorted({r["optimizer"] for r in group})
        fig, axes = plt.subplots(2, len(opts), figsize=(5 * len(opts), 7), squeeze=False)
        colors = {}
        for r in group:
            key = (r["ln"], r["lr"], r["schedule"])
            color = colors.setdefault(key, f"C{len(colors) % 10}")
            warm = str(r["warmup"]) if r["warmup"] > 1 else "none"
            col = opts.index(r["optimizer"])
            label = f"{r['ln']} lr {r['lr']:g} warm-up {warm}" + (
                f" {r['schedule']}" if r["schedule"] != "inverse_sqrt" else "") + (
                f" seed {r['seed']}" if len({x['seed'] for x in group}) > 1 else "")
            ep = [e["epoch"] for e in r["curve"]]
            style = dict(color=color, linestyle=LINESTYLES.get(warm, "-."), marker=".", label=label)
            axes[0][col].plot(ep, [e.get("bleu_tok") for e in r["curve"]], **style)
            axes[1][col].plot(ep, [e.get("valid_loss") for e in r["curve"]], **style)
        for col, opt in enumerate(opts):
            axes[0][col].set_title(f"{fig_name}: {opt}")
            axes[0][col].set_ylabel(f"test {TOK_LABEL}")
            axes[1][col].set_ylabel("validation loss")
            for row in (0, 1):
                axes[row][col].set_xlabel("epoch")
                axes[row][col].xaxis.set_major_locator(MaxNLocator(integer=True))
                axes[row][col].grid(alpha=0.3)
            axes[0][col].legend(fontsize=7)
        fig.tight_layout()
        path = Path(out_dir) / f"fig_{fig_name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None):
    p = argparse.ArgumentParser(prog="make_table.sh", description=__doc__.split("\n")[0])
    p.add_argument("out_dir", help="the --out folder of scripts/grid.sh run")
    p.add_argument("--no-figures", action="store_true")
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    if not out.is_dir():
        sys.exit(f"make_table: {out} is not a folder: give the --out folder of `scripts/grid.sh run`")
    rows = collect(out)
    if not rows:
        sys.exit(f"make_table: no runs in {out} (expected {out}/NAME/seedS/config.json): run scripts/grid.sh run first")
    md = markdown(rows)
    (out / "results.md").write_text(md, encoding="utf-8")
    write_csv(rows, out / "results.csv")
    print(md, end="")
    print(f"\nwrote {out / 'results.md'}, {out / 'results.csv'}")
    if not a.no_figures:
        for path in figures(rows, out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
