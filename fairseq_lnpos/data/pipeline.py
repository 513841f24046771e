"""Shared machinery of the data-prep scripts: stages that are done once, line files, parallel maps,
fairseq-preprocess and the manifest.

A stage builds its output folder under a temporary name and renames it when complete, with a
``.stage.json`` stamp of its parameters: a re-run with the same parameters skips it, a re-run with
other parameters rebuilds it (and every later stage, whose parameters include the earlier ones).
An interrupted stage leaves only its temporary folder, which the next run deletes.
"""
import hashlib
import html
import json
import multiprocessing
import os
import re
import shutil
import sys
import time
from pathlib import Path

from fairseq_lnpos.data.download import DataError
from fairseq_lnpos.data.manifest import write_manifest

STAMP = ".stage.json"
BIN_STAMP = "lnpos-stage.json"


def log(msg):
    print(msg, flush=True)


def fingerprint(params):
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
    fp = fingerprint(params)
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
    build(tmp)
    (tmp / stamp_name).write_text(json.dumps({"fingerprint": fp, "params": params}, indent=1, default=str) + "\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)
    log(f"[{label}] done in {time.time() - t0:.1f} s")
    return fp


# ---------------------------------------------------------------- line files

def read_lines(path):
    """Lines split on '\\n' only (as perl and grep do), without the newline."""
    with open(path, encoding="utf-8", newline="\n", errors="strict") as f:
        try:
            return [line[:-1] if line.endswith("\n") else line for line in f]
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text ({e}): pass the original file") from None


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
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
    finally:
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


def run_dataset(args, dataset, langs, stages, lowercase, compound_split, label=None):
    """The body of a data-prep command: ``stages(out)`` builds the text stages (raw, tok, bpe) in
    ``args.out`` and returns (raw fingerprint, bpe fingerprint, pair counts per split); then
    fairseq-preprocess into ``args.bin`` with the manifest, and a summary. A ``DataError`` anywhere
    is one line on stderr and exit status 1; finished stages stay for the next run."""
    out, bin_dir = Path(args.out), Path(args.bin)
    src, tgt = langs
    try:
        p_raw, p_bpe, counts = stages(out)
        binarize(out / "bpe", bin_dir, src, tgt, args.workers,
                 {"bpe": p_bpe, "raw": p_raw, "out": str(out.resolve()), "v": 1},
                 manifest_fields(dataset, out, src, tgt, counts, lowercase=lowercase, compound_split=compound_split))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    summary(label or dataset, counts, out, bin_dir)
    return 0


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
