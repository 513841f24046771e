"""Architectures. fairseq's --user-dir also imports every module here by itself."""
