"""Tasks registered by the plugin (fairseq also imports this folder for --user-dir)."""
from . import translation_lnpos  # noqa: F401
