"""The data manifest: how evaluation finds the references that belong to a binarized data dir.

Every data-prep script writes ``lnpos-data.json`` next to fairseq's ``dict.*.txt`` files.
Paths inside it are relative to the manifest's folder (so a data dir can be moved with its
text folders) or absolute.

    {
      "dataset": "iwslt14.de-en",          # or "wmt14.en-de", "synthetic"
      "source_lang": "de", "target_lang": "en",
      "post_process": "sentencepiece",     # value for fairseq-generate --post-process
      "lowercase": true,                   # references are lowercased (IWSLT)
      "compound_split": false,             # WMT: split compounds ("##AT##-##AT##") before tokenized BLEU
      "refs": {
        "tok": {"valid": "../text/tok/valid.en", "test": "../text/tok/test.en"},
        "raw": {"test": "../text/raw/test.en"}
      },
      "counts": {"train": 160239, "valid": 7283, "test": 6750}
    }

``tok`` references are Moses-tokenized (and lowercased where ``lowercase``): the paper's
tokenized BLEU. ``raw`` references are untokenized sentences: sacreBLEU's input.
"""
import os
from pathlib import Path

from fairseq_lnpos.common import read_json, write_json
from fairseq_lnpos.errors import StateError

FILENAME = "lnpos-data.json"
REQUIRED = ("dataset", "source_lang", "target_lang", "post_process", "refs")
REDO = "re-run the data preparation (data-prep/*.sh), which writes it next to dict.*.txt"


class ManifestError(StateError):
    """A data folder's manifest is missing, unreadable or incomplete."""


def write_manifest(bin_dir, **fields):
    """Write the manifest into ``bin_dir``; reference paths are stored relative to it."""
    bin_dir = Path(bin_dir)
    missing = [k for k in REQUIRED if k not in fields]
    if missing:
        raise ManifestError(f"manifest for {bin_dir} lacks {', '.join(missing)}")
    refs = {
        kind: {split: os.path.relpath(Path(p).resolve(), bin_dir.resolve()) for split, p in files.items()}
        for kind, files in fields["refs"].items()
    }
    data = dict(fields, refs=refs)
    data.setdefault("lowercase", False)
    data.setdefault("compound_split", False)
    return write_json(bin_dir / FILENAME, data)


def read_manifest(bin_dir):
    """Read a data dir's manifest; reference paths come back absolute."""
    bin_dir = Path(bin_dir)
    path = bin_dir / FILENAME
    try:
        data = read_json(path, what_to_do=REDO)
    except StateError as e:
        raise ManifestError(str(e)) from None
    missing = [k for k in REQUIRED if k not in data] if isinstance(data, dict) else list(REQUIRED)
    if missing:
        raise ManifestError(f"{path} lacks {', '.join(missing)}: {REDO}")
    data["refs"] = {
        kind: {split: str((bin_dir / p).resolve()) for split, p in files.items()}
        for kind, files in data["refs"].items()
    }
    return data
