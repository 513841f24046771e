"""Fig. 3 at initialization against warm-up need: the join of init_grad's records with a map's runs.csv,
the two definitions of warm-up need on cells built for them, the rank statistics, the outputs and bad input."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from fairseq_lnpos.analysis import predictor as P
from fairseq_lnpos.analysis.frame import RUN_COLUMNS, write_runs_csv
from fairseq_lnpos.errors import LnposError

UNIGRAM = 6.0
WIDTH = ["--encoder-embed-dim", "96", "--encoder-ffn-embed-dim", "384", "--decoder-embed-dim", "96",
         "--decoder-ffn-embed-dim", "384"]
SETTINGS = json.dumps({"model size": "tiny", "extra": WIDTH, "dataset": "synthetic", "data": "/maps/syn/bin"})
SPREAD = (-0.01, 0.0, 0.01)  # the three seeds of a cell around its mean


def run_row(variant, warmup, lr, seed, nll, outcome="finished", layers=6):
    row = dict.fromkeys(RUN_COLUMNS, math.nan)
    row.update(run=f"sweep-{variant}-L{layers}-lr{lr:g}-wu{warmup or 1}", variant=variant, arch=f"transformer_{variant}_tiny",
               layers=layers, warmup=warmup, lr=lr, seed=seed, optimizer="adam", max_update=200, outcome=outcome,
               final_valid_nll=nll if outcome == "finished" else math.nan, unigram_bits=UNIGRAM, initial_loss=9.0,
               code="f" * 10, model_code="abc", python="3.11", torch="2", fairseq="0.12", cpu="a CPU", cores=2,
               gpu="", load=1.0, hash=f"{variant}{warmup}{lr}{seed}", settings=SETTINGS,
               path=f"/maps/m/{variant}-{warmup}-{lr}/seed{seed}")
    row["nll_ratio"] = row["final_valid_nll"] / UNIGRAM
    return row


def write_map(path, cells):
    """A map's runs.csv: ``cells`` {(variant, warmup, lr): mean NLL of its three seeds, or "diverged"}."""
    rows = [run_row(v, w, lr, seed, math.nan if nll == "diverged" else nll + d,
                    outcome="diverged" if nll == "diverged" else "finished")
            for (v, w, lr), nll in cells.items() for seed, d in zip((1, 2, 3), SPREAD)]
    write_runs_csv(pd.DataFrame(rows, columns=RUN_COLUMNS), path)
    return path


def record(variant, seed, first, last, depth=6, d=96, size="tiny", full=True, requested=6):
    """One model's record as init_grad writes it (analysis/init_grad.py, measure): W2 norms from
    ``first`` (layer 1) to ``last`` (layer ``depth``), per stack (the decoder's twice the encoder's)."""
    arch = f"transformer_{variant}" + ("_tiny" if size == "tiny" else "")
    w2 = list(np.linspace(first, last, depth))
    grads = {"encoder": {"fc1": [1.0] * depth, "fc2": w2}, "decoder": {"fc1": [1.0] * depth, "fc2": [2 * g for g in w2]}}
    return {"settings_key": "k", "label": variant, "arch": arch, "depth": depth, "depth_requested": requested,
            "seed": seed, "full": full, "d": d, "normalize_before": False, "tokens": [500] * 8,
            "mean_grad": grads, "batch_norm": grads, "seconds": 1.0}


def write_init(folder, records, fig3=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if fig3 is not None:
        (folder / "fig3.json").write_text(json.dumps(fig3))
    return folder


# the cells of four architectures, each a case of the definitions (3 seeds a cell, spread 0.01)
CASES = {
    # Post-LN: no cell without warm-up trains (one diverged, one stalled), warm-up trains: needs it
    ("postln", 0, 1e-3): "diverged", ("postln", 0, 3e-4): 4.0, ("postln", 100, 1e-3): 1.2, ("postln", 100, 3e-4): 1.5,
    # Pre-LN: good without warm-up: does not need it
    ("preln", 0, 1e-3): 1.0, ("preln", 0, 3e-4): 1.3, ("preln", 100, 1e-3): 1.05, ("preln", 100, 3e-4): 1.35,
    # DeepNorm: trains without warm-up but is poor against its warm-up cell: needs it
    ("deepnorm", 0, 1e-3): 2.0, ("deepnorm", 100, 1e-3): 1.0,
    # Keel: nothing trains
    ("keel", 0, 1e-3): 5.0, ("keel", 100, 1e-3): "diverged",
}


@pytest.fixture
def study(tmp_path):
    runs = write_map(tmp_path / "runs.csv", CASES)
    # seeds 1 and 2 with different first/last norms: the ratio is of the seed means, not the mean of ratios
    init = write_init(tmp_path / "init", [record(v, s, first, last) for v, (a, b) in {
        "postln": ((0.2, 1.0), (0.6, 3.0)), "preln": ((0.8, 0.5), (0.8, 0.7)), "deepnorm": ((0.3, 0.9), (0.5, 1.1)),
        "keel": ((0.4, 0.4), (0.4, 0.4)), "admin": ((1, 1), (1, 1))}.items() for s, (first, last) in ((1, a), (2, b))]
        + [record("postln", 1, 9.0, 9.0, depth=12, requested=12)])  # another depth: not this map's
    return runs, init


def test_the_join_and_both_definitions_on_cells_built_for_them(study):
    runs, init = study
    frame = P.analyse(runs, init)["frame"]
    assert list(frame.index) == ["postln", "preln", "deepnorm", "keel"]  # the map's variants, not admin
    assert frame["verdict"].to_dict() == {"postln": "needs warm-up", "preln": "does not", "deepnorm": "needs warm-up",
                                          "keel": "no good cell"}
    assert frame["needs_warmup"].tolist() == [True, False, True, False]
    # gap: best without minus best with; a cell that does not train counts the unigram bits
    assert frame.loc["postln", "best_nll_without"] == UNIGRAM and frame.loc["postln", "best_nll_with"] == pytest.approx(1.2)
    assert frame["gap"].to_dict() == pytest.approx({"postln": UNIGRAM - 1.2, "preln": -0.05, "deepnorm": 1.0, "keel": 0.0})
    assert (frame.loc["preln", "best_lr_without"], frame.loc["preln", "best_warmup_with"]) == (1e-3, 100)
    # statistics: seed means per layer, then the ratio
    assert frame.loc["postln", "last_w2_encoder"] == pytest.approx(2.0)
    assert frame.loc["postln", "last_w2_decoder"] == pytest.approx(4.0)
    assert frame.loc["postln", "ratio_encoder"] == pytest.approx(0.4 / 2.0)
    assert frame.loc["preln", "ratio_encoder"] == pytest.approx(0.8 / 0.6)  # mean of ratios would be 1.37
    assert frame.loc["preln", "ratio_decoder"] == pytest.approx(0.8 / 0.6)
    assert frame["init_seeds"].tolist() == [2, 2, 2, 2]


def test_a_perfectly_monotone_study_gives_rank_correlation_one(tmp_path):
    variants = ["postln", "preln", "deepnorm", "keel", "admin", "tfixup"]
    gaps = [0.0, 0.05, 0.3, 0.6, 1.0, 2.0]  # the first two within the margin: do not need warm-up
    cells = {}
    for v, g in zip(variants, gaps):
        cells[v, 0, 1e-3], cells[v, 100, 1e-3] = 1.0 + g, 1.0
    runs = write_map(tmp_path / "runs.csv", cells)
    init = write_init(tmp_path / "init", [record(v, s, 1.0 / (i + 1), 0.5 + i) for i, v in enumerate(variants)
                                          for s in (1, 2, 3)])
    result = P.analyse(runs, init)
    frame, corr = result["frame"], result["corr"].set_index("statistic")
    assert frame["gap"].tolist() == pytest.approx(gaps)
    assert frame["needs_warmup"].tolist() == [False, False, True, True, True, True]
    for stat, sign in (("last_w2_encoder", 1), ("last_w2_decoder", 1), ("ratio_encoder", -1), ("ratio_decoder", -1)):
        r = corr.loc[stat]
        assert r["rho"] == pytest.approx(sign) and r["n"] == 6
        assert r["low"] <= r["rho"] <= r["high"]
        assert r["auc"] == (1.0 if sign > 0 else 0.0) and (r["n_needs"], r["n_not"]) == (4, 2)
    assert "n = 6 architectures" in result["md"]


def test_the_interval_is_fisher_z_with_bonett_wrights_error_and_holds_the_estimate():
    from scipy.stats import spearmanr

    x = [0.1, 0.4, 0.2, 0.9, 0.5, 0.7, 0.3, 1.2]
    y = [0.0, 0.3, 0.5, 0.8, 0.1, 0.9, 0.2, 0.4]
    rho, p, low, high, n = P.spearman(x + [math.nan], y + [1.0])  # a pair without a statistic is left out
    assert n == 8 and rho == pytest.approx(spearmanr(x, y).statistic) and p == pytest.approx(spearmanr(x, y).pvalue)
    half = 1.959964 * math.sqrt((1 + rho ** 2 / 2) / (n - 3))
    assert (low, high) == pytest.approx((math.tanh(math.atanh(rho) - half), math.tanh(math.atanh(rho) + half)))
    assert low < rho < high
    assert all(math.isnan(v) for v in P.spearman([1, 2, 3], [1, 2, 3])[:4])  # too few to say


def test_the_auc_counts_ties_half():
    auc, p, n_needs, n_not = P.separation([3.0, 2.0, 2.0, 1.0], [True, True, False, False])
    assert (auc, n_needs, n_not) == (pytest.approx((1 + 1 + 0.5 + 1) / 4), 2, 2) and 0 < p <= 1
    assert math.isnan(P.separation([1.0, 2.0], [True, True])[0])


def test_outputs_page_and_a_statistic_a_log_axis_cannot_show(study, tmp_path, capsys):
    runs, init = study
    # ReZero's W2 receives no gradient at initialization (its residual scale starts at 0)
    records = [json.loads(line) for line in (init / "records.jsonl").read_text().splitlines()]
    write_init(init, records + [record("rezero", s, 0.0, 0.0) for s in (1, 2)],
               fig3={"settings": {"batches": 8, "tokens": 512, "data_desc": "/maps/syn/bin [train]", "dropout": 0.1,
                                  "label_smoothing": 0.1}, "cpu_seconds": 321.0})
    cells = {**CASES, ("rezero", 0, 1e-3): 1.0, ("rezero", 100, 1e-3): 1.0}
    write_map(runs, cells)
    out, page = tmp_path / "out", tmp_path / "page"
    assert P.main(["--map", str(runs), "--init", str(init), "--out", str(out), "--publish", str(page)]) == 0
    printed = capsys.readouterr().out
    assert "| ReZero | does not |" in printed and "321 CPU-s" in printed and "K = 8 mini-batches of at most 512" in printed
    frame = pd.read_csv(out / "predictor.csv")
    assert len(frame) == 5 and frame.set_index("variant").loc["rezero", "last_w2_encoder"] == 0
    assert math.isnan(frame.set_index("variant").loc["rezero", "ratio_encoder"])  # 0 / 0: no ratio
    corr = P.correlations(frame.set_index("variant"))
    assert corr.set_index("statistic")["n"].to_dict() == {"last_w2_encoder": 5, "last_w2_decoder": 5,
                                                         "ratio_encoder": 4, "ratio_decoder": 4}
    assert len(pd.read_csv(out / "predictor_seeds.csv")) == 10
    assert (out / "predictor.png").stat().st_size > 10000
    index = (page / "index.md").read_text()
    assert "- Command: `python -m fairseq_lnpos.analysis.predictor --map" in index and "- Written: " in index
    assert "- Code: runs trained by code" in index and "![predictor.png](predictor.png)" in index
    assert "[predictor_seeds.csv](predictor_seeds.csv)" in index and (page / "runs.csv").is_file()


@pytest.mark.parametrize("case, message", [
    ("missing variant", "--init {init}: no records of keel: run init_grad with --archs postln,preln,deepnorm,keel"),
    ("no warm-up cells", "the map has no counted cell with warm-up for Post-LN: map each architecture with warm-up 1"),
    ("no such map", "{tmp}/nowhere.csv: no such folder or file"),
    ("no records", "--init {tmp}/empty: no records.jsonl there: give the --out folder of python -m "
                   "fairseq_lnpos.analysis.init_grad"),
    ("another width", "--init {init}: measured with d 128, the map's models have d 96: run init_grad with --width 96"),
    ("another depth", "--init {init}: no per-layer records of 6-layer models: run init_grad with --depths 6 "
                      "--layers-depth 6 --size tiny --width 96"),
])
def test_bad_input_is_one_line_and_exit_2(study, tmp_path, capsys, case, message):
    runs, init = study
    records = [json.loads(line) for line in (init / "records.jsonl").read_text().splitlines()]
    if case == "missing variant":
        write_init(init, [r for r in records if r["arch"] != "transformer_keel_tiny"])
    elif case == "no warm-up cells":
        write_map(runs, {k: v for k, v in CASES.items() if k[1] == 0})
    elif case == "no such map":
        runs = tmp_path / "nowhere.csv"
    elif case == "no records":
        init = tmp_path / "empty"
        init.mkdir()
    elif case == "another width":
        write_init(init, [dict(r, d=128) for r in records])
    elif case == "another depth":
        write_init(init, [r for r in records if r["depth"] != 6])
    assert P.main(["--map", str(runs), "--init", str(init), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("predictor: error: "), err
    assert message.format(init=init, tmp=tmp_path) in err[0]
    with pytest.raises(LnposError):
        P.analyse(runs, init)


def test_a_map_folder_of_the_tiny_size_needs_records_at_its_own_width(tmp_path):
    from test_stability import write_run

    for seed, d in zip((1, 2, 3), SPREAD):
        write_run(tmp_path / "map", "postln", 1e-3, 0, seed, final=3.0 + d, unigram=UNIGRAM)
        write_run(tmp_path / "map", "postln", 1e-3, 100, seed, final=1.0 + d, unigram=UNIGRAM)
    init = write_init(tmp_path / "init", [record("postln", s, 0.5, 1.5, d=128) for s in (1, 2)])
    frame = P.analyse(tmp_path / "map", init)["frame"]
    assert frame.loc["postln", "verdict"] == "needs warm-up" and frame.loc["postln", "gap"] == pytest.approx(2.0)
    write_init(init, [record("postln", s, 0.5, 1.5, d=96) for s in (1, 2)])
    with pytest.raises(LnposError, match="the map's models have d 128: run init_grad with --width 128"):
        P.analyse(tmp_path / "map", init)
