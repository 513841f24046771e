"""Benchmarks, measured side by side in one process (``scripts/bench.sh``, ``make bench``).

* training throughput (target tokens/s through fairseq's own ``Trainer.train_step``) of each
  plugin architecture as a ratio to fairseq's ``transformer`` with the same sizes and flags
  (Pre-LN is compared with ``--encoder-normalize-before --decoder-normalize-before``);
* the overhead of ``--log-grad-norms`` at intervals 1 and 100, as a ratio to the same run
  without it;
* the wall time of the Fig. 3 analysis (``scripts/init_grad_analysis.sh``) with its defaults.

Configurations are interleaved within each repetition so that a machine getting slower or
faster affects all of them alike; each ratio is computed within one repetition, then the
median and the spread (min, max) over repetitions are reported. Results go to a JSON file.
"""
import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

from .errors import LnposError, check

USER_DIR = str(Path(__file__).resolve().parent)
BASELINE_FLAGS = {"postln": [], "preln": ["--encoder-normalize-before", "--decoder-normalize-before"],
                  "deepnorm": [], "keel": []}


def baseline_name(variant):
    return "fairseq_preln" if BASELINE_FLAGS[variant] else "fairseq_postln"


FAIRSEQ_SIZE = {"tiny": ("transformer", ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim",
                                         "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
                                         "--decoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4",
                                         "--decoder-attention-heads", "4"]),
                "iwslt_de_en": ("transformer_iwslt_de_en", [])}


def make_trainer(data, arch, extra=(), max_tokens=2048, device="cpu"):
    """A fairseq Trainer built exactly as fairseq-train builds it, and a list of its batches."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    argv = [str(data), "--user-dir", USER_DIR, "--arch", arch, "--optimizer", "adam",
            "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4", "--lr-scheduler", "warmup_inverse_sqrt",
            "--warmup-updates", "1", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", str(max_tokens), "--seed", "1", "--no-progress-bar", *extra]
    if "--task" not in extra:
        argv += ["--task", "translation"]
    if device == "cpu":
        argv += ["--cpu"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    itr = task.get_batch_iterator(dataset=task.dataset("train"), max_tokens=max_tokens, seed=1,
                                  max_positions=(1024, 1024)).next_epoch_itr(shuffle=False)
    return trainer, itr


def throughput(trainer, batches):
    """Target tokens per second over ``batches`` (one warm-up step first, not timed)."""
    import torch

    sync = torch.cuda.synchronize if trainer.cuda else (lambda: None)
    trainer.train_step([batches[0]])
    sync()
    start, tokens = time.perf_counter(), 0
    for b in batches[1:]:
        trainer.train_step([b])
        tokens += b["ntokens"]
    sync()
    return tokens / (time.perf_counter() - start)


def measure(configs, data, steps, reps, log, max_tokens, device):
    """``configs``: name -> (arch, extra flags). Returns name -> list of tokens/s, one per rep."""
    built = {}
    for name, (arch, extra) in configs.items():
        trainer, itr = make_trainer(data, arch, extra, max_tokens, device)
        batches = list(islice(itr, steps + 1))
        check(len(batches) == steps + 1, f"{data} has fewer than {steps + 1} training batches: use --steps")
        built[name] = (trainer, batches)
    out = {name: [] for name in configs}
    for r in range(reps):
        for name, (trainer, batches) in built.items():
            out[name].append(throughput(trainer, batches))
        log(f"  rep {r + 1}/{reps}: " + ", ".join(f"{n} {v[-1]:.0f} tok/s" for n, v in out.items()))
    return out


def ratios(values, baseline):
    r = [a / b for a, b in zip(values, baseline)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r), "per_rep": r}


def default_data(out_dir, log):
    """The project's synthetic corpus (generated once under out_dir)."""
    bin_dir = Path(out_dir) / "synthetic-bin"
    if not (bin_dir / "lnpos-data.json").exists():
        log(f"generating the synthetic corpus in {bin_dir}")
        from .data import synthetic
        status = synthetic.main(["--out", str(Path(out_dir) / "synthetic-text"), "--bin", str(bin_dir), "--seed", "1"])
        check(status == 0, "generating the synthetic corpus failed (see above)")
    return bin_dir


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="binarized data dir (default: the synthetic corpus, generated)")
    p.add_argument("--out", default="bench-out/bench.json", help="JSON result file")
    p.add_argument("--sizes", default="tiny,iwslt_de_en", help="comma list of: tiny, iwslt_de_en")
    p.add_argument("--variants", default="postln,preln,deepnorm,keel")
    p.add_argument("--steps", type=int, default=8, help="timed updates per repetition")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: fairseq's GPU training (fp32; add flags with --fairseq-args)")
    p.add_argument("--fairseq-args", default="", help="extra fairseq-train flags for every configuration, e.g. --fp16")
    p.add_argument("--reps", type=int, default=5, help="repetitions")
    p.add_argument("--no-analysis", action="store_true", help="skip timing the Fig. 3 analysis")
    p.add_argument("--quick", action="store_true", help="CI mode: tiny size, 2 reps of 2 steps, no analysis")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.steps, args.reps, args.no_analysis = "tiny", 2, 2, True
    check(args.steps >= 1 and args.reps >= 1, "--steps and --reps must be at least 1")
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in FAIRSEQ_SIZE] + [v for v in args.variants.split(",") if v not in BASELINE_FLAGS]
    check(not unknown, f"unknown size or variant {unknown}: sizes are {list(FAIRSEQ_SIZE)}, variants {list(BASELINE_FLAGS)}")
    logging.disable(logging.WARNING)  # fairseq's per-model INFO lines would drown the progress
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    data = Path(args.data) if args.data else default_data(out.parent, log)
    check(data.is_dir() and any(data.glob("dict.*.txt")), f"{data} is not a binarized data dir (no dict.*.txt)")
    if args.device == "cuda":
        import torch
        check(torch.cuda.is_available(), "--device cuda: torch sees no GPU here")
    extra = args.fairseq_args.split()
    result = {"data": str(data), "steps": args.steps, "reps": args.reps, "cpu_count": os.cpu_count(),
              "device": args.device, "fairseq_args": extra, "max_tokens": args.max_tokens,
              "throughput": {}, "grad_norm_overhead": {}}
    t0 = time.time()
    for size in sizes:
        fairseq_arch, size_flags = FAIRSEQ_SIZE[size]
        configs = {}
        for v in args.variants.split(","):
            # one fairseq baseline per LayerNorm placement: DeepNorm and Keel share Post-LN's
            configs[baseline_name(v)] = (fairseq_arch, size_flags + BASELINE_FLAGS[v] + extra)
            configs[v] = (f"transformer_{v}_{size}", extra)
        log(f"throughput at size {size} ({len(configs)} configurations, {args.reps} reps x {args.steps} updates)")
        tps = measure(configs, data, args.steps, args.reps, log, args.max_tokens, args.device)
        result["throughput"][size] = {
            v: dict(ratios(tps[v], tps[baseline_name(v)]), tokens_per_s=statistics.median(tps[v]),
                    baseline=f"fairseq {fairseq_arch} {' '.join(BASELINE_FLAGS[v])}".strip())
            for v in args.variants.split(",")
        }
    size = sizes[0]
    arch = f"transformer_preln_{size}"
    log(f"--log-grad-norms overhead ({arch})")
    task = ["--task", "translation_lnpos", *extra]
    tps = measure({"off": (arch, task), "interval_1": (arch, task + ["--log-grad-norms", "--grad-norm-interval", "1"]),
                   "interval_100": (arch, task + ["--log-grad-norms", "--grad-norm-interval", "100"])},
                  data, args.steps, args.reps, log, args.max_tokens, args.device)
    for k in ("interval_1", "interval_100"):
        r = ratios(tps["off"], tps[k])  # time with / time without = tps_off / tps_with
        result["grad_norm_overhead"][k] = {"time_ratio": r, "overhead_percent": 100 * (r["median"] - 1)}
    if not args.no_analysis:
        log("Fig. 3 analysis with its default settings (scripts/init_grad_analysis.sh)")
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "fairseq_lnpos.analysis.init_grad", "--out", tmp],
                           check=True, stdout=subprocess.DEVNULL)
            result["fig3_analysis_seconds"] = time.perf_counter() - start
    result["total_seconds"] = time.time() - t0
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)
    log(summary(result))
    log(f"written {out}")
    return result


def summary(result):
    lines = ["| size | arch | tokens/s | ratio to fairseq (median, min-max) |", "|---|---|---|---|"]
    for size, archs in result["throughput"].items():
        for v, r in archs.items():
            lines.append(f"| {size} | {v} | {r['tokens_per_s']:.0f} | {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}) |")
    for k, r in result["grad_norm_overhead"].items():
        lines.append(f"--log-grad-norms {k.replace('_', ' ')}: {r['overhead_percent']:+.1f} % time "
                     f"({r['time_ratio']['min']:.3f}-{r['time_ratio']['max']:.3f})")
    if "fig3_analysis_seconds" in result:
        lines.append(f"Fig. 3 analysis (defaults): {result['fig3_analysis_seconds']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        main()
    except LnposError as e:
        sys.exit(f"bench.sh: error: {e}")
