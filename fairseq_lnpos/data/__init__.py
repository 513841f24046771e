"""Data preparation. ``BIN_DIRS``: where each dataset's preparation writes its binarized data by
default (its text folder is beside it, ``<folder>.text``); the grid's rows read the same folders."""

BIN_DIRS = {
    "iwslt14": "data-bin/iwslt14.de-en",
    "multi30k": "data-bin/multi30k.de-en",
    "wmt14": "data-bin/wmt14.en-de",
    "synthetic": "data-bin/synthetic",
}


def text_dir(dataset):
    """The default text folder of ``dataset``'s preparation."""
    return BIN_DIRS[dataset] + ".text"
