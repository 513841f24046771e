"""The one seed estimator (analysis/seeds.py) and the one Markdown table (analysis/map_common.py), by hand."""
import math

import pandas as pd
import pytest

from fairseq_lnpos.analysis.map_common import markdown_table, pivot
from fairseq_lnpos.analysis.seeds import Spread, over_seeds, spread


def test_over_seeds_by_hand():
    """BLEU 20, 22, 27: mean 23, sd sqrt(13), half-width t(0.975, 2) = 4.303 x sd / sqrt(3) = 8.957; BLEU
    0, 1, 90 clipped to 0-100; one seed: no spread; None, NaN and inf left out; groups in first-seen order."""
    runs = pd.DataFrame({"run": ["b", "b", "b", "a", "c", "c", "c", "c"],
                         "bleu": [20.0, 22.0, 27.0, 30.0, 0.0, 1.0, 90.0, math.inf],
                         "loss": [None, 4.0, math.nan, 2.0, 3.0, 3.0, 3.0, 3.0]})
    out = over_seeds(runs, "run", {"bleu": (0.0, 100.0), "loss": (None, None)})
    assert list(zip(out["run"], out["metric"], out["n"])) == [("b", "bleu", 3), ("b", "loss", 1), ("a", "bleu", 1),
                                                              ("a", "loss", 1), ("c", "bleu", 3), ("c", "loss", 4)]
    b = out.iloc[0]
    assert (b["mean"], b["sd"]) == (23.0, pytest.approx(math.sqrt(13)))
    assert (b["ci95_low"], b["ci95_high"]) == (pytest.approx(14.0433, abs=1e-4), pytest.approx(31.9567, abs=1e-4))
    c = out.iloc[4]
    assert (c["min"], c["max"], c["ci95_low"], c["ci95_high"]) == (0.0, 90.0, 0.0, 100.0)
    assert math.isnan(out.iloc[2]["sd"]) and math.isnan(out.iloc[2]["ci95_low"])
    assert out.iloc[5]["sd"] == 0.0 and out.iloc[5]["ci95_low"] == out.iloc[5]["ci95_high"] == 3.0
    assert Spread.of(b) == spread([20.0, None, 22.0, 27.0], (0.0, 100.0))


def test_a_spread_says_what_its_seeds_allow():
    assert spread([None, math.nan]) is None and spread([]) is None
    assert spread([3.0]).text() == "3.00 (1 seed)" and spread([3.0]).sd is None
    assert spread([1.4, 2.4]).text() == "1.90 (1.40 to 2.40, n=2; no interval from 2 seeds)"
    assert spread([20.0, 22.0, 27.0]).text(".1f") == "23.0 (20.0 to 27.0, CI 14.0 to 32.0, n=3)"
    assert spread([0.0, 1.0, 90.0], (0.0, 100.0)).as_dict()["ci95_low"] == 0.0


def test_a_table_keeps_its_rows_order_sorts_its_columns_and_escapes_bars():
    cells = pd.DataFrame({"arch": ["Pre-LN", "Pre-LN", "Post-LN"], "layers": [12, 6, 6],
                          "text": ["a|b", None, "c"]})
    assert pivot(cells, "arch", "layers", "text", "arch \\ layers") == [
        "| arch \\ layers | 6 | 12 |", "|---|---|---|", "| Pre-LN |  | a/b |", "| Post-LN | c |  |"]
    assert markdown_table(cells.head(1)) == ["| arch | layers | text |", "|---|---|---|", "| Pre-LN | 12 | a/b |"]
