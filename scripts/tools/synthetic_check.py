"""Measure that the synthetic corpus is learnable: train a tiny Transformer on it and translate its test set.

    data-prep/check-synthetic.sh --bin DIR --work DIR [--arch transformer_preln_tiny]
        [--updates 400] [--threads 1] [--seed 1] [--warmup 100] [--lr 1e-3]

Runs fairseq-train (Adam (0.9, 0.98), lr 1e-3, inverse_sqrt warm-up, label smoothing 0.1, dropout
0.1, max-tokens 2048) and fairseq-generate (beam 5, every test sentence) as subprocesses, and prints
one line: valid loss (base 2, fairseq's), test BLEU, seconds per update, generation seconds. The numbers in the README's synthetic-corpus table come from this command.
"""
import subprocess
import sys
import time
from pathlib import Path

from fairseq_lnpos.common import open_log
from fairseq_lnpos.data.manifest import read_manifest
from fairseq_lnpos.cli import CommandParser, Range, at_least
from fairseq_lnpos.errors import MAX_SEED, LnposError, check, run_main
from fairseq_lnpos.fairseq_log import LogState, bleu4, number
from fairseq_lnpos.launch import adam, child_env, generate_cmd, train_cmd


def run(cmd, env, log_path):
    t0 = time.time()
    with open_log(log_path, truncate=True) as log:
        res = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if res.returncode != 0:
        raise LnposError(f"{Path(cmd[0]).name} failed (exit {res.returncode}): see {log_path}")
    return time.time() - t0, Path(log_path).read_text()


def parser():
    p = CommandParser(prog="check-synthetic.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True, help="binarized synthetic data (make-synthetic.sh --bin)")
    p.add_argument("--work", required=True, help="folder for checkpoints and logs")
    p.add_argument("--arch", default="transformer_preln_tiny")
    p.add_argument("--updates", type=int, default=400)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for training and generation")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=2048)
    return p


def measure(bin_dir, work, arch="transformer_preln_tiny", updates=400, lr=1e-3, warmup=100, threads=1, seed=1,
            max_tokens=2048):
    """Train and translate as the module docstring says; return the one-line report."""
    at_least(1, "--updates", updates)
    check(lr > 0, f"--lr must be positive, got {lr}")
    at_least(0, "--warmup", warmup)
    at_least(1, "--threads", threads)
    Range(0, MAX_SEED, high_open=False).check("--seed", seed)
    at_least(1, "--max-tokens", max_tokens)
    check(Path(bin_dir).is_dir(), f"--bin {bin_dir} is not a folder: give make-synthetic.sh's --bin")
    work = Path(work)
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LnposError(f"--work {work}: cannot create the folder ({e.strerror}): choose a writable folder") from None
    manifest = read_manifest(bin_dir)
    env = child_env(threads)
    train = train_cmd(
        bin_dir, arch, max_tokens=max_tokens, task="translation_lnpos", model=["--dropout", "0.1"],
        optim=[*adam(lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup),
               "--warmup-init-lr", "1e-7"],
        budget=["--max-update", str(updates)], seed=seed, save_dir=work / "ckpt", log_format="json", log_interval=50,
        extra=["--no-epoch-checkpoints", "--no-last-checkpoints", "--num-workers", "0", "--cpu"])
    t_train, out = run(train, env, work / "train.log")
    gen = generate_cmd(bin_dir, work / "ckpt" / "checkpoint_best.pt", manifest, beam=5, lenpen=1, extra=["--cpu"])
    t_gen, gout = run(gen, env, work / "generate.log")
    return report(LogState.of(out), bleu4(gout), t_train, t_gen, arch, lr, warmup, updates, threads)


def report(state, bleu, t_train, t_gen, arch, lr, warmup, updates, threads):
    """The one line of :func:`measure`: fairseq-train's log (a :class:`LogState`), the test BLEU and
    the wall times of training and generation."""
    losses = [state.valid[e]["valid_loss"] for e in sorted(state.valid)]
    walls = [number(rec.get("train_train_wall")) for rec in state.train.values()]  # per epoch
    done = number(state.train[max(state.train)].get("train_num_updates")) if state.train else None
    per_update = sum(walls) / done if done and None not in walls else float("nan")
    return (f"{arch} lr {lr} warmup {warmup} updates {updates} epochs {len(state.train)}: "
            f"valid loss {losses[-1] if losses else '?'} (per epoch: {', '.join(losses)}), test BLEU "
            f"{'?' if bleu is None else f'{bleu:.2f}'}, {per_update:.2f} s/update (train_wall), train {t_train:.0f} s, "
            f"generate {t_gen:.0f} s, threads {threads}")


def main(argv=None):
    def command(argv):
        a = parser().parse_args(argv)
        print(measure(a.bin, a.work, a.arch, a.updates, a.lr, a.warmup, a.threads, a.seed, a.max_tokens))

    return run_main("check-synthetic.sh", command, argv)


if __name__ == "__main__":
    sys.exit(main())
