"""The one parser of comma-separated option values (cli.comma_list) and the commands that use it."""
import argparse

import pytest

from fairseq_lnpos.cli import comma_list, comma_list_type
from fairseq_lnpos.errors import LnposError


def test_spaces_and_empty_items_are_dropped_and_items_read_in_order():
    assert comma_list(" 3, 1,,2 ,", "--seeds", int) == [3, 1, 2]
    assert comma_list("postln, preln", "--archs", choices=("postln", "preln")) == ["postln", "preln"]
    assert comma_list((6, "8"), "--depths", int) == [6, 8]  # a Python caller's list reads the same way
    assert comma_list("1e-3,3e-3", "--lr", float) == [1e-3, 3e-3]


@pytest.mark.parametrize("value, kw, message", [
    ("", {}, "--x: '' lists nothing: give one or more, separated by commas"),
    (" , ,", {}, "--x: ' , ,' lists nothing"),
    ("1,x", dict(item=int), "--x: 'x' is not a whole number"),
    ("1e-3,y", dict(item=float), "--x: 'y' is not a number"),
    ("1,2,1", dict(item=int), "--x: '1' is listed twice"),
    ("1e-3,0.001", dict(item=float), "--x: '0.001' is listed twice"),  # the same number written twice
    ("a,c", dict(choices=("a", "b"), what="a variant"), "--x: 'c' is not a variant: choose from a, b"),
])
def test_a_bad_list_is_one_line_naming_the_option(value, kw, message):
    with pytest.raises(LnposError) as e:
        comma_list(value, "--x", **kw)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_argparse_type_reads_the_same_and_lets_argparse_name_the_option():
    parse = comma_list_type(int)
    assert parse(" 1, 2,") == "1,2"
    with pytest.raises(argparse.ArgumentTypeError, match="^'2' is listed twice$"):
        parse("2,2")


@pytest.mark.parametrize("argv, message", [
    (["run", "--only", "iwslt-*,,iwslt-*", "--dry-run"], "--only: 'iwslt-*' is listed twice"),
    (["run", "--only", "demo-postln-nowu", "--seeds", "1,x", "--dry-run"], "--seeds: 'x' is not a whole number"),
    (["sweep", "--archs", "postln,postln", "--dry-run"], "--archs: 'postln' is listed twice"),
    (["sweep", "--archs", "postln", "--layers", "6,", "--warmup", "1 ,100", "--lr", "1e-3,x", "--dry-run"],
     "--lr: 'x' is not a number"),
])
def test_the_grid_commands_read_their_lists_with_it(argv, message, capsys, tmp_path):
    from fairseq_lnpos.errors import run_main
    from fairseq_lnpos.experiments import grid

    assert run_main("grid", grid.main, [*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_bench_and_the_demo_read_their_lists_with_it(capsys, tmp_path):
    from conftest import tool
    from fairseq_lnpos import demo
    from fairseq_lnpos.errors import run_main

    bench = tool("bench")

    assert run_main("bench.sh", bench.main, ["--sizes", "tiny, tiny", "--no-analysis"]) == 2
    assert "--sizes: 'tiny' is listed twice" in capsys.readouterr().err
    assert run_main("demo", demo.main, ["--seeds", "1,one", "--out", str(tmp_path / "demo")]) == 2
    assert "--seeds: 'one' is not a whole number" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()  # refused before anything is prepared
