"""Measure that the synthetic corpus is learnable: train a tiny Transformer on it and translate its test set.

    python -m fairseq_lnpos.data.synthetic_check --bin DIR --work DIR [--arch transformer_preln_tiny]
        [--updates 400] [--threads 1] [--seed 1] [--warmup 100] [--lr 1e-3]

Runs fairseq-train (Adam (0.9, 0.98), lr 1e-3, inverse_sqrt warm-up, label smoothing 0.1, dropout
0.1, max-tokens 2048) and fairseq-generate (--beam 5 --post-process sentencepiece) as
subprocesses, and prints one line: valid loss (base 2, fairseq's), test BLEU, seconds per update,
generation seconds. The numbers in the README's synthetic-corpus table come from this command.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fairseq_lnpos.common import USER_DIR
from fairseq_lnpos.errors import CommandParser, LnposError, at_least, check, run_main


def run(cmd, env, log_path):
    t0 = time.time()
    with open(log_path, "w") as log:
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
    at_least(0, "--seed", seed)
    at_least(1, "--max-tokens", max_tokens)
    check(Path(bin_dir).is_dir(), f"--bin {bin_dir} is not a folder: give make-synthetic.sh's --bin")
    bindir = Path(sys.executable).parent
    work = Path(work)
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LnposError(f"--work {work}: cannot create the folder ({e.strerror}): choose a writable folder") from None
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    train = [str(bindir / "fairseq-train"), str(bin_dir), "--user-dir", str(USER_DIR), "--arch", arch,
             "--task", "translation_lnpos", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", str(lr),
             "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup), "--warmup-init-lr", "1e-7",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
             "--max-tokens", str(max_tokens), "--max-update", str(updates), "--seed", str(seed),
             "--save-dir", str(work / "ckpt"), "--no-epoch-checkpoints", "--no-last-checkpoints",
             "--log-format", "simple", "--log-interval", "50", "--num-workers", "0", "--cpu"]
    t_train, out = run(train, env, work / "train.log")
    losses = re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", out)
    epochs = re.findall(r"end of epoch (\d+) \(average epoch stats below\)", out)
    ups = re.findall(r"\| num_updates (\d+)", out)
    wall = re.findall(r"\| train \| epoch \d+ \|.*\| train_wall (\d+)", out)  # per epoch
    gen = [str(bindir / "fairseq-generate"), str(bin_dir), "--user-dir", str(USER_DIR), "--task", "translation_lnpos",
           "--path", str(work / "ckpt" / "checkpoint_best.pt"), "--gen-subset", "test", "--beam", "5",
           "--post-process", "sentencepiece", "--max-tokens", "4096", "--cpu", "--num-workers", "0"]
    t_gen, gout = run(gen, env, work / "generate.log")
    bleu = re.findall(r"BLEU4 = ([0-9.]+)", gout)
    per_update = sum(map(float, wall)) / int(ups[-1]) if wall and ups else float("nan")
    return (f"{arch} lr {lr} warmup {warmup} updates {updates} epochs {len(epochs)}: "
            f"valid loss {losses[-1] if losses else '?'} (per epoch: {', '.join(losses)}), test BLEU "
            f"{bleu[-1] if bleu else '?'}, {per_update:.2f} s/update (train_wall), train {t_train:.0f} s, "
            f"generate {t_gen:.0f} s, threads {threads}")


def main(argv=None):
    def command(argv):
        a = parser().parse_args(argv)
        print(measure(a.bin, a.work, a.arch, a.updates, a.lr, a.warmup, a.threads, a.seed, a.max_tokens))

    return run_main("check-synthetic.sh", command, argv)


if __name__ == "__main__":
    sys.exit(main())
