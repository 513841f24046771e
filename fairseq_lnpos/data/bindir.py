"""Checks of a binarized data folder (fairseq-preprocess output) before fairseq reads it.

fairseq's translation task meets a missing folder, a missing language pair or a missing, empty
or damaged ``dict.*.txt`` with a traceback, or (an empty dictionary) trains until the first
batch fails; :func:`check_data_dir` turns each into a :class:`DataError` that names the path.
"""
from pathlib import Path

from fairseq_lnpos.data.download import DataError

REBUILD = "binarize the data again (data-prep/*.sh, or fairseq-preprocess)"


def check_data_dir(data, source_lang=None, target_lang=None):
    """``(source_lang, target_lang)`` of the data folder ``data`` (fairseq's ``DATA`` argument;
    several folders are separated by ':'), inferred from its file names when not given."""
    from fairseq.data import Dictionary, data_utils

    data = str(data)
    if "://" in data:  # a remote path: fairseq's PathManager reads it
        return source_lang, target_lang
    first = Path(data.split(":")[0])
    if not first.is_dir():
        raise DataError(f"data folder {first} {'is not a folder' if first.exists() else 'does not exist'}: "
                        f"give the folder that fairseq-preprocess or data-prep/*.sh wrote (--bin)")
    if source_lang is None or target_lang is None:
        source_lang, target_lang = data_utils.infer_language_pair(str(first))
        if source_lang is None or target_lang is None:
            raise DataError(f"{first}: cannot tell the language pair (no <split>.<src>-<tgt>.<lang>.idx files): "
                            f"pass --source-lang and --target-lang, or {REBUILD}")
    for lang in (source_lang, target_lang):
        path = first / f"dict.{lang}.txt"
        if not path.is_file():
            found = sorted(p.name for p in first.glob("dict.*.txt"))
            raise DataError(f"{path} is missing ({'found ' + ', '.join(found) if found else 'no dict.*.txt in the folder'}): "
                            f"pass the --source-lang/--target-lang of this folder, or {REBUILD}")
        try:
            d = Dictionary.load(str(path))
        except Exception as e:  # fairseq raises ValueError or a plain Exception for a bad line or encoding
            reason = (str(e).splitlines() or [type(e).__name__])[0]
            raise DataError(f"{path} is not a fairseq dictionary ({reason}): {REBUILD}") from None
        if len(d) <= d.nspecial:
            raise DataError(f"{path} is empty: {REBUILD}")
    return source_lang, target_lang
