"""Provenance (provenance.py): a run records the code it was started with."""
import shutil

from fairseq_lnpos import provenance as P


def test_the_code_read_at_the_start_is_what_the_runs_record(tmp_path, monkeypatch):
    """After :func:`~fairseq_lnpos.provenance.pin` (the grid calls it before its workers start), an edit of
    the model code does not change the model code a run records when it ends; without the pin it would."""
    package = tmp_path / "pkg"
    for part in P.MODEL_CODE:
        src = P.PACKAGE / part
        (shutil.copytree(src, package / part) if src.is_dir() else shutil.copy(src, package / part))
    monkeypatch.setattr(P, "PACKAGE", package)
    P.model_code_hash.cache_clear()
    P.code_version.cache_clear()
    try:
        P.pin()
        before = P.provenance()["model_code"]
        with open(package / "variants.py", "a") as f:
            f.write("# edited while the runs go on\n")
        assert P.provenance()["model_code"] == before
        P.model_code_hash.cache_clear()
        assert P.model_code_hash() != before
    finally:
        P.model_code_hash.cache_clear()
        P.code_version.cache_clear()
