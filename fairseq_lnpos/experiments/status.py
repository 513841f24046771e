"""``grid.sh status OUT``: one line per run of a grid's folder (local or SLURM) and the counts.

    scripts/grid.sh status grid-out

The run folders are read as the results table reads them (report.collect); a task of a SLURM task
list (``OUT/slurm-ID.tasks``) that has no folder yet is ``queued``. An unreadable folder is marked
and the command exits 2 after the lines; so is a copied run folder (``seed2`` whose config.json says
seed 1): listed under its own folder as a copy, not as a second run of that seed.
"""
import sys
from pathlib import Path

from ..common import n_runs
from ..errors import StateError
from .report import collect
from .rundir import grid_run_dirs, read_tasks


def mark_copies(rows):
    """Mark (``copy``: the one-line error) each readable row of :func:`~.report.collect` that holds the same
    run and seed as another: the one whose folder is not ``NAME/seedS`` of its record (else all but the
    first), which is then listed under its folder's name."""
    by = {}
    for r in rows:
        if "record" in r:
            by.setdefault((r["run"], r["seed"]), []).append(r)
    for (name, seed), group in by.items():
        if len(group) < 2:
            continue
        paths = sorted(str(r["record"].dir.path) for r in group)
        message = (f"{paths[0]} and {paths[1]} hold the same run ({name} seed {seed}): a run's seeds must be "
                   f"distinct runs; move the copies away")
        odd = [r for r in group if (r["record"].dir.path.parent.name, r["record"].dir.path.name) != (name, f"seed{seed}")]
        for r in odd or sorted(group, key=lambda r: str(r["record"].dir.path))[1:]:
            path = r["record"].dir.path
            r.update(copy=message, outcome="copy", seed=path.name[4:] if path.name.startswith("seed") else path.name,
                     status=f"a copy of {name} seed{seed}")
    return rows


def status_lines(out_dir):
    """(lines, counts, first unreadable or None) for the run folders of ``out_dir`` and the SLURM tasks
    listed there that have no folder yet."""
    out = Path(out_dir)
    queued = [(name, str(seed), tasks.stem) for tasks in sorted(out.glob("slurm-*.tasks")) for name, seed, _ in read_tasks(tasks)]
    rows = mark_copies(collect(grid_run_dirs(out, "the --out folder of scripts/grid.sh run or slurm", queued=queued)))
    seen = {(r["run"], str(r["seed"])) for r in rows}
    for name, seed, grid_id in queued:
        if (name, seed) not in seen:
            seen.add((name, seed))
            rows.append({"run": name, "seed": seed, "status": f"queued ({grid_id})", "outcome": "queued", "epochs": 0})
    lines, counts = [], {}
    width = max(len(f"{r['run']} seed{r['seed']}") for r in rows)
    for r in rows:
        status = "unreadable" if r.get("unreadable") else r["status"]
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        epochs = f"{r['epochs']}/{r['max_epoch']}" if r.get("max_epoch") else str(r["epochs"])
        best = (f"best BLEU {r['best_bleu_tok']:.2f} (epoch {r['best_epoch']})"
                if r.get("best_bleu_tok") is not None else "best BLEU -")
        lines.append(f"{r['run'] + ' seed' + str(r['seed']):<{width}}  {status:<28}  epochs {epochs:<7}  {best}")
    bad = next((r.get("unreadable") or r["copy"] for r in rows if r.get("unreadable") or r.get("copy")), None)
    return lines, counts, bad


def cmd_status(opts):
    lines, counts, bad = status_lines(opts.out_dir)
    print("\n".join(lines))
    print(f"{n_runs(sum(counts.values()))}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if bad:
        sys.stdout.flush()
        raise StateError(bad)
    return 0
