"""Shared machinery of the data-prep scripts: stages that are done once, line files, parallel maps,
fairseq-preprocess and the manifest.

A stage builds its output folder under a temporary name and renames it when complete, with a
``.stage.json`` stamp of its parameters: a re-run with the same parameters skips it, a re-run with
other parameters rebuilds it (and every later stage, whose parameters include the earlier ones).
A stage that fails or is interrupted (Ctrl-C, SIGTERM) removes its temporary folder; the stages
finished before it stay, so that a re-run resumes there. While a command works, it holds a lock on
each output folder (``.NAME.lock`` beside it, since a stage folder is replaced by a rename): a
second command on the same folder is refused.
"""
import contextlib
import html
import json
import multiprocessing
import os
import re
import shutil
import signal
import time
from pathlib import Path

from fairseq_lnpos.common import hold_lock, open_log, release_lock, write_json
from fairseq_lnpos.common import read_lines  # noqa: F401  (the data modules import it from here)
from fairseq_lnpos.data import BIN_DIRS, text_dir
from fairseq_lnpos.data.download import DataError
from fairseq_lnpos.data.manifest import write_manifest
from fairseq_lnpos.cli import at_least
from fairseq_lnpos.errors import interrupt_handler
from fairseq_lnpos.launch import config_hash

STAMP = ".stage.json"
BIN_STAMP = "lnpos-stage.json"


def log(msg):
    print(msg, flush=True)


def read_stamp(folder, name=STAMP):
    try:
        return json.loads((Path(folder) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def run_stage(final, params, build, stamp_name=STAMP, label=None):
    """Build folder ``final`` with ``build(tmp_folder)`` unless it is complete with the same ``params``.

    Returns the fingerprint of ``params`` (feed it into the next stage's params).
    """
    final = Path(final)
    label = label or final.name
    fp = config_hash(params)
    stamp = read_stamp(final, stamp_name)
    if stamp is not None and stamp.get("fingerprint") == fp:
        log(f"[{label}] complete in {final} (same parameters): skipped")
        return fp
    if final.exists():
        if stamp is None and any(final.iterdir()):
            raise DataError(f"{final} exists but was not written by this script: choose another folder or delete it")
        log(f"[{label}] {final} was built with other parameters or by an older run: rebuilding it")
    tmp = final.with_name("." + final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.time()
    log(f"[{label}] building {final}")
    try:
        build(tmp)
    except BaseException:  # an error or Ctrl-C: nothing half-built stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_json(tmp / stamp_name, {"fingerprint": fp, "params": params})
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)
    log(f"[{label}] done in {time.time() - t0:.1f} s")
    return fp


# ---------------------------------------------------------------- line files

def write_lines(path, lines):
    with open_log(path, truncate=True) as f:
        for line in lines:
            f.write(line + "\n")


def count_lines(path):
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def require_files(paths, hint):
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise DataError(f"missing {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                        + f": {hint}")


def check_parallel(a_lines, b_lines, a_name, b_name):
    if len(a_lines) != len(b_lines):
        raise DataError(f"{a_name} has {len(a_lines)} lines but {b_name} has {len(b_lines)}: "
                        f"the two sides must be line-aligned; pass the original files")


# ---------------------------------------------------------------- parallel map

def _apply_chunk(args):
    fn, chunk = args
    return [fn(x) for x in chunk]


def map_lines(fn, lines, workers=1, label="", chunk=2000):
    """``[fn(x) for x in lines]`` over ``workers`` processes, logging progress; order kept."""
    lines = list(lines)
    n, t0, out = len(lines), time.time(), []
    chunks = [(fn, lines[i:i + chunk]) for i in range(0, n, chunk)]
    report_every = max(1, len(chunks) // 10)
    if workers <= 1 or len(chunks) <= 1:
        results = map(_apply_chunk, chunks)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap(_apply_chunk, chunks)
    try:
        for i, res in enumerate(results, 1):
            out.extend(res)
            if label and (i % report_every == 0 or i == len(chunks)) and n >= 10 * chunk:
                log(f"  {label}: {len(out)}/{n} lines ({len(out) / max(time.time() - t0, 1e-9):.0f} lines/s)")
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    if pool is not None:
        pool.close()
        pool.join()
    if label:
        log(f"  {label}: {n} lines in {time.time() - t0:.1f} s")
    return out


# ---------------------------------------------------------------- binarize + manifest

def binarize(bpe_dir, bin_dir, src, tgt, workers, params, manifest, splits=("train", "valid", "test")):
    """fairseq-preprocess --joined-dictionary of ``bpe_dir/{split}.{lang}`` into ``bin_dir`` + manifest."""

    def build(tmp):
        argv = ["--source-lang", src, "--target-lang", tgt, "--joined-dictionary", "--destdir", str(tmp),
                "--workers", str(workers)]
        for split in splits:
            argv += [f"--{split}pref", str(Path(bpe_dir) / split)]
        log("  fairseq-preprocess " + " ".join(argv))
        # in this process: fairseq is imported already (importing it again costs 10-15 s)
        from fairseq import options
        from fairseq_cli import preprocess

        try:
            preprocess.main(options.get_preprocessing_parser().parse_args(argv))
        except Exception as e:  # fairseq raises plain exceptions (FileNotFoundError, AssertionError ...)
            raise DataError(f"fairseq-preprocess failed on {bpe_dir}/*: {type(e).__name__}: {e}") from e
        write_manifest(tmp, **manifest)
        # write_manifest stores paths relative to tmp, a sibling of bin_dir: the same relative paths

    Path(bin_dir).parent.mkdir(parents=True, exist_ok=True)
    return run_stage(bin_dir, params, build, stamp_name=BIN_STAMP, label="binarize")


@contextlib.contextmanager
def interrupt_main_process_only():
    """Ctrl-C (SIGINT, sent to every process of the terminal's group) and SIGTERM stop this process
    with KeyboardInterrupt; worker processes forked meanwhile (ours, fairseq-preprocess's) ignore
    Ctrl-C instead of printing a traceback each, and are ended with this process
    (errors.interrupt_handler). Whatever error follows an interruption is its consequence (a
    KeyboardInterrupt raised inside an ``import`` can leave a library half-imported, and the next
    use of it fails with an unrelated error): it is reported as the interruption it is."""
    interrupted = []
    handler = interrupt_handler(interrupted.append)
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except Exception as e:
        if interrupted:
            raise KeyboardInterrupt from e
        raise
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)


def add_folder_options(parser, dataset, bpe_size, workers=None):
    """--out, --bin, --workers and --bpe-size of a data-prep command, with the dataset's defaults."""
    parser.add_argument("--out", default=text_dir(dataset), help="text folder (default: %(default)s)")
    parser.add_argument("--bin", default=BIN_DIRS[dataset], help="binarized folder (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=workers or default_workers(),
                        help="processes (default: %(default)s)")
    parser.add_argument("--bpe-size", type=int, default=bpe_size, help="joint BPE vocabulary (default: %(default)s)")
    return parser


def check_writable_folder(path, option):
    """Raise :class:`DataError` unless folder ``path`` exists and is writable, or can be created;
    creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DataError(f"{option} {path} is a file, not a folder: give a folder (it is created if missing)")
    existing = path
    while not existing.exists():  # the nearest ancestor that exists is where the folder gets created
        existing = existing.parent
    if not existing.is_dir():
        raise DataError(f"{option} {path}: {existing} is a file, not a folder: give another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DataError(f"{option} {path}: {existing} is not writable: give a folder you can write to")


def lock_path(folder):
    """The lock file of output folder ``folder``: beside it (a stage folder is replaced whole)."""
    folder = Path(folder).resolve()
    return folder.parent / f".{folder.name}.lock"


@contextlib.contextmanager
def folder_lock(folder, option):
    """Hold the lock of output folder ``folder`` (option ``option``), or raise :class:`LnposError`
    when another command holds it."""
    path = lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = hold_lock(path, f"{option} {folder} is in use by another command (lock {path}): wait for it to "
                         f"finish or stop it, or give another folder")
    try:
        yield
    finally:
        release_lock(fd, path)


def run_dataset(out, bin_dir, workers, dataset, langs, stages, lowercase, compound_split, label=None):
    """The body of a data-prep command: ``stages(out)`` builds the text stages (raw, tok, bpe) in
    ``out`` and returns (raw fingerprint, bpe fingerprint, pair counts per split); then
    fairseq-preprocess into ``bin_dir`` with the manifest, and a summary. Raises
    :class:`DataError` (bad input) or KeyboardInterrupt; finished stages stay for the next run, and
    a folder this call created stays only if something was finished in it. Both folders are
    locked meanwhile (:func:`folder_lock`)."""
    out, bin_dir = Path(out), Path(bin_dir)
    at_least(1, "--workers", workers)
    check_writable_folder(out, "--out")
    check_writable_folder(bin_dir, "--bin")
    if out.resolve() == bin_dir.resolve() or bin_dir.resolve() in out.resolve().parents:
        raise DataError(f"--out {out} is {'--bin' if out.resolve() == bin_dir.resolve() else 'inside --bin'} "
                        f"{bin_dir}, which is replaced whole when the data is binarized: give the text and the "
                        f"binarized data folders of their own")
    src, tgt = langs
    created = [p for p in (out, bin_dir) if not p.exists()]
    try:
        with interrupt_main_process_only(), folder_lock(out, "--out"), folder_lock(bin_dir, "--bin"):
            out.mkdir(parents=True, exist_ok=True)
            p_raw, p_bpe, counts = stages(out)
            binarize(out / "bpe", bin_dir, src, tgt, workers,
                     {"bpe": p_bpe, "raw": p_raw, "out": str(out.resolve()), "v": 1},
                     manifest_fields(dataset, out, src, tgt, counts, lowercase=lowercase,
                                     compound_split=compound_split))
    except BaseException as e:
        for p in created:
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        if isinstance(e, OSError):  # a folder that cannot be written, a full disk, an unreadable input
            where = f"{e.filename}: " if e.filename else ""
            raise DataError(f"{where}{e.strerror or e}: check that the path exists, is readable and its folder "
                            f"writable (and the free disk space), then run again") from None
        raise
    summary(label or dataset, counts, out, bin_dir)
    return counts


def summary(name, counts, out_dir, bin_dir):
    log(f"== {name}: " + ", ".join(f"{split} {n} pairs" for split, n in counts.items()))
    log(f"   text: {out_dir}   binarized: {bin_dir}")


def default_workers():
    return max(1, min(8, os.cpu_count() or 1))


# ---------------------------------------------------------------- XML/SGML test sets

SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
SEG_CLOSE = re.compile(r"\s*</seg>\s*")


def xml_segments(lines, apostrophe=True):
    """fairseq's extraction: grep '<seg id' | sed 's/<seg id="[0-9]*">\\s*//g' | sed 's/\\s*<\\/seg>\\s*//g'
    | sed "s/’/'/g" (the last step only with ``apostrophe``). XML entities stay as they are."""
    segs = [SEG_CLOSE.sub("", SEG_OPEN.sub("", l)) for l in lines if "<seg id" in l]
    return [s.replace("\u2019", "'") for s in segs] if apostrophe else segs


def raw_segments(lines):
    """Untokenized reference sentences: the segments as written, XML entities (&amp; ...) decoded."""
    return [html.unescape(s).strip() for s in xml_segments(lines, apostrophe=False)]


def counts_of(tok_dir, lang):
    return {split: count_lines(Path(tok_dir) / f"{split}.{lang}") for split in ("train", "valid", "test")}


def manifest_fields(dataset, out, src, tgt, counts, lowercase, compound_split):
    out = Path(out)
    return dict(
        dataset=dataset, source_lang=src, target_lang=tgt, post_process="sentencepiece",
        lowercase=lowercase, compound_split=compound_split,
        refs={"tok": {"valid": out / "tok" / f"valid.{tgt}", "test": out / "tok" / f"test.{tgt}"},
              "raw": {"test": out / "raw" / f"test.{tgt}"}},
        counts=counts,
    )
