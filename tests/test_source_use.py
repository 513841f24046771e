"""Source use (fairseq_lnpos.experiments.source_use): the validation NLL with the true and the permuted
sources, against fairseq's own validation, and the run folders it measures."""
import json
import re
import shutil

import numpy as np
import pytest

from conftest import USER_DIR, fairseq_cmd, run
from fairseq_lnpos.experiments import source_use as U


@pytest.mark.parametrize("n,seed", [(2, 1), (3, 0), (300, 1), (1014, 7)])
def test_the_permutation_gives_no_sentence_its_own_source(n, seed):
    perm = U.derangement(n, seed)
    assert sorted(perm) == list(range(n)) and not (perm == np.arange(n)).any()
    assert (U.derangement(n, seed) == perm).all()  # the seed fixes it


@pytest.fixture(scope="module")
def trained(toy_data, tmp_path_factory):
    """A tiny Post-LN trained 40 updates on the toy corpus (cross-entropy: its loss is the NLL in bits)."""
    from helpers import fairseq_train

    save = tmp_path_factory.mktemp("trained")
    fairseq_train(toy_data, save, "transformer_postln_tiny", updates=40)
    return toy_data, save / "checkpoint_last.pt"


@pytest.mark.slow
def test_the_true_source_nll_is_fairseqs_own_validation_loss(trained):
    data, ckpt = trained
    got = U.measure(ckpt, data)
    valid = run(fairseq_cmd("fairseq-validate", data, "--user-dir", USER_DIR, "--cpu", "--path", ckpt,
                            "--task", "translation", "--valid-subset", "valid", "--max-tokens", "1000"))
    assert valid.returncode == 0, valid.stderr[-2000:]
    loss = float(re.findall(r"\| loss ([0-9.]+)", valid.stdout + valid.stderr)[-1])
    assert got["nll"] == pytest.approx(loss, abs=0.002)
    assert got["gain"] == pytest.approx(got["nll_permuted"] - got["nll"])
    assert got["gain"] > 0  # 40 updates already read the source
    lines = (data.parent / "text" / "valid.en").read_text().splitlines()
    assert (got["sentences"], got["tokens"]) == (40, sum(len(l.split()) + 1 for l in lines))  # + end of sentence


@pytest.mark.slow
def test_a_grid_folder_is_measured_once_and_read_into_the_table_of_every_run(trained, tmp_path, capsys):
    from test_stability import write_run

    from fairseq_lnpos.analysis.frame import runs_frame

    data, ckpt = trained
    measured = write_run(tmp_path, "postln", 1e-3, 0, 1, final=3.0)
    no_checkpoint = write_run(tmp_path, "postln", 1e-3, 0, 2, final=3.1)
    write_run(tmp_path, "postln", 1e-2, 0, 1, status="diverged at update 40")
    for d in (measured, no_checkpoint):
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "data": str(data)}))
    (measured / "checkpoints").mkdir()
    shutil.copy(ckpt, measured / "checkpoints" / "checkpoint_last.pt")
    assert U.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "measured 1 runs; 1 finished runs without a checkpoint" in out
    assert f"{no_checkpoint}: no checkpoint_last.pt" in err
    got = json.loads((measured / "source_use.json").read_text())
    runs = runs_frame(tmp_path).set_index("path")
    row = runs.loc[str(measured)]
    assert (row["nll_permuted"], row["source_gain"]) == pytest.approx((got["nll_permuted"], got["gain"]))
    assert runs.loc[str(no_checkpoint), ["nll_permuted", "source_gain"]].isna().all()
    assert U.main([str(tmp_path)]) == 0  # measured already, from the same checkpoint: nothing to do
    assert "measured 0 runs" in capsys.readouterr().out


def test_a_damaged_record_is_one_line_that_says_what_to_do(tmp_path):
    from fairseq_lnpos.errors import StateError

    (tmp_path / U.FILE).write_text("{not json")
    with pytest.raises(StateError, match="delete it and measure the run again"):
        U.read(tmp_path)
    assert U.read(tmp_path / "absent") is None


def _measured(rows):
    """A table of every run of measured runs: (corpus, NLL fraction, source gain) a row."""
    import pandas as pd

    return pd.DataFrame([{"run": f"r{i}", "variant": "postln", "seed": 1, "updates": 100, "outcome": "finished",
                          "settings": json.dumps({"dataset": corpus}), "nll_ratio": ratio, "final_valid_nll": ratio * 6,
                          "nll_permuted": ratio * 6 + gain, "source_gain": gain}
                         for i, (corpus, ratio, gain) in enumerate(rows)])


def test_the_basis_table_by_hand():
    from fairseq_lnpos.analysis import source_basis as B

    runs = _measured([("synthetic", 0.60, 0.8), ("synthetic", 0.61, 1.0), ("synthetic", 0.02, 8.5),
                      ("synthetic", 0.14, 6.5), ("multi30k_cpu", 0.62, 0.9), ("multi30k_cpu", 0.66, 2.5)])
    t = B.corpus_table(runs, gain=1.5, trains={"synthetic": 0.5, "multi30k": 0.8}).set_index("corpus")
    syn = t.loc["synthetic"]
    assert (syn["runs"], syn["use the source"]) == (4, 2)
    assert (syn["largest gain not using"], syn["smallest gain using"]) == (1.0, 6.5)
    assert syn["thresholds that agree"] == (0.14, 0.60) and syn["runs the rule's threshold misjudges"] == 0
    # Multi30k: the run that uses its source ends above the one that does not: no NLL threshold agrees, and
    # the rule's 0.8 calls both trained
    m30k = t.loc["multi30k"]
    assert m30k["thresholds that agree"] is None and m30k["runs the rule's threshold misjudges"] == 1


def test_the_rules_numbers_lie_where_the_published_basis_puts_them():
    """outcome.SOURCE_GAIN lies between the gains of the runs that do not use their source and of those that do,
    on every corpus of docs/results/source-use, and each corpus's NLL fraction among the fractions that agree
    with the gain on every run there (test_docs rebuilds that page from its runs.csv)."""
    import pandas as pd

    from conftest import REPO
    from fairseq_lnpos.analysis import outcome as O

    corpora = pd.read_csv(REPO / "docs" / "results" / "source-use" / "corpora.csv").set_index("corpus")
    assert {"synthetic", "multi30k"} <= set(corpora.index)
    for corpus, row in corpora.iterrows():
        assert row["largest gain not using"] < O.SOURCE_GAIN < row["smallest gain using"]
        assert row["NLL fraction, users (max)"] < O.TRAINS[corpus] < row["NLL fraction, others (min)"]
