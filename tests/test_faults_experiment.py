"""Fault injection: no experiment silently substituted for another, no option dropped without a word,
no result lost to fairseq's own options.

- an option that another would override is refused (a sweep's ``--arch``, ``--arch-size``);
- a checkpoint of another experiment is not resumed (fairseq-train, any task) unless
  ``--reset-optimizer`` says that training starts over from its weights;
- fairseq-train flags that would delete or never write a checkpoint the grid scores are refused
  before training; ``--fairseq-args`` takes one flag or many, on every command and in SLURM tasks;
- every ``--set`` number is range-checked (runs.RANGES); the normalization's options say when they
  would do nothing; averaging checkpoints of other shapes is the checkpoint error.
Rows run as in tests/test_faults.py (one error line, the exit status, nothing changed outside the
output folders); the cases with more to check are tests of their own."""
import shutil

import pytest

from conftest import USER_DIR, build_model, fairseq_cmd, run, toy_data  # noqa: F401
from test_faults import GRID, ROW, Case, check_case
from test_slurm import BASE, TINY, unit_options

from fairseq_lnpos.checkpoint import CheckpointError, average_checkpoints
from fairseq_lnpos.errors import LnposError
from fairseq_lnpos.experiments import grid as G

DRY_RUN = (GRID, "run", "--only", ROW, "--dry-run", "--data", "{S}/B", "--out", "{S}/out")
SWEEP = (GRID, "sweep", "--dry-run", "--archs", "postln,deepnorm", "--lr", "1e-3", "--warmup", "1", "--data", "{S}/B",
         "--out", "{S}/out")
SLURM = (GRID, "slurm", "--only", ROW, "--partition", "gpu", "--time", "1:00:00", "--gpus-per-run", "0",
         "--data", "{S}/B", "--out", "{S}/out", "--dry-run")
KEEP = r"and the grid needs every checkpoint it has not scored yet: drop it"


def set_case(assign, message):
    return Case(f"set-{assign}", DRY_RUN + ("--set", assign), message, writes=())


CASES = [
    # --- an option that another would override
    Case("sweep-arch-replaces-archs", SWEEP + ("--arch", "transformer_preln_tiny"),
         r"^grid: error: --arch transformer_preln_tiny: a sweep trains the architectures of --archs, and --arch "
         r"would replace every one of them: drop --arch", writes=()),
    Case("sweep-arch-size-replaced-by-the-preset", SWEEP + ("--arch-size", "paper"),
         r"^grid: error: --arch-size paper: this sweep's cells are of size tiny \(without --real\): drop --arch-size",
         writes=()),
    *[Case(f"sweep-set-{key}-replaces-its-axis", SWEEP + ("--set", f"{key}={value}"),
           rf"^grid: error: --set {key}={value}: a sweep's cells take {key} from its option {option} \(their folders are "
           rf"named for it\): give the values with {option}, not --set$", writes=())
      for key, value, option in (("ln", "postln", "--archs"), ("lr", "0.1", "--lr"), ("layers", "2", "--layers"),
                                 ("warmup", "4000", "--warmup"), ("max_update", "0", "--max-update"))],
    *[Case(f"sweep-fairseq-args-{flag.lstrip('-')}-replaces-its-axis", SWEEP + ("--fairseq-args", flags),
           rf"^grid: error: --fairseq-args: {flag} would replace the sweep's {key} axis in every cell "
           rf"\(their folders are named for it\): give the values with {option}$", writes=())
      for flags, flag, key, option in (
          ("--arch transformer_preln_tiny", "--arch", "ln", "--archs"), ("-a transformer_preln_tiny", "-a", "ln", "--archs"),
          ("--lr 0.1", "--lr", "lr", "--lr"), ("--dropout 0.2 --encoder-layers 12", "--encoder-layers", "layers", "--layers"),
          ("--decoder-layers=12", "--decoder-layers", "layers", "--layers"),
          ("--warmup-updates 4000", "--warmup-updates", "warmup", "--warmup"),
          ("--max-update 5", "--max-update", "max_update", "--max-update"))],
    Case("sweep-set-extra-replaces-an-axis", SWEEP + ("--set", "extra=--lr 0.1"),
         r"^grid: error: --set extra=--lr 0\.1: --lr would replace the sweep's lr axis in every cell", writes=()),
    *[Case(f"early-stop-without-a-budget-{argv[1]}", argv + ("--early-stop",),
           rf"^grid: error: --early-stop: 1 of the 1 runs \({ROW}\) have no budget in updates, and early "
           r"stopping judges a run at a fraction of its budget: give one with --set max_update=N, or drop --early-stop$",
           writes=()) for argv in (DRY_RUN, SLURM)],
    # --- fairseq's own options that would lose a checkpoint the grid still scores
    Case("keep-last-epochs", DRY_RUN + ("--fairseq-args=--keep-last-epochs 1",),
         rf"^grid: error: --fairseq-args: --keep-last-epochs deletes epoch checkpoints before they are scored or "
         rf"averaged, {KEEP}", writes=()),
    Case("keep-last-abbreviated", DRY_RUN + ("--fairseq-args", "--keep-last 1"),
         r"^grid: error: --fairseq-args: --keep-last deletes epoch checkpoints", writes=()),
    Case("no-epoch-checkpoints-one-flag", DRY_RUN + ("--fairseq-args", "--no-epoch-checkpoints"),
         rf"^grid: error: --fairseq-args: --no-epoch-checkpoints writes no epoch checkpoint to score, {KEEP}",
         writes=()),
    Case("no-save-in-a-rows-extra", DRY_RUN + ("--set", "extra=--no-save"),
         rf"^grid: error: {ROW}: extra: --no-save writes no checkpoint", writes=()),
    Case("save-interval-on-a-sweep", SWEEP + ("--fairseq-args=--save-interval=2",),
         r"^grid: error: --fairseq-args: --save-interval writes no checkpoint of the epochs in between", writes=()),
    Case("save-dir-on-slurm", SLURM + ("--fairseq-args", "--save-dir /tmp/elsewhere"),
         r"^grid: error: --fairseq-args: --save-dir moves the checkpoints out of the run folder", writes=()),
    Case("fairseq-args-unbalanced-quote", DRY_RUN + ("--fairseq-args", '--eval-bleu-args "{'),
         r"^grid: error: --fairseq-args --eval-bleu-args \"\{: No closing quotation: quote the flags as a shell does",
         writes=()),
    # --- --set numbers: range-checked where parsed (runs.RANGES), as the grid's own options
    set_case("dropout=1.5", r"^grid: error: --set dropout must be in \[0, 1\), got 1\.5$"),
    set_case("attention_dropout=1", r"^grid: error: --set attention_dropout must be in \[0, 1\), got 1\.0$"),
    set_case("label_smoothing=-1", r"^grid: error: --set label_smoothing must be in \[0, 1\), got -1\.0$"),
    set_case("lenpen=-3", r"^grid: error: --set lenpen must be at least 0, got -3\.0$"),
    set_case("weight_decay=-1", r"^grid: error: --set weight_decay must be at least 0, got -1\.0$"),
    set_case("momentum=1", r"^grid: error: --set momentum must be in \[0, 1\), got 1\.0$"),
    set_case("adam_eps=0", r"^grid: error: --set adam_eps must be positive, got 0\.0$"),
    set_case("clip_norm=-1", r"^grid: error: --set clip_norm must be at least 0, got -1\.0$"),
    set_case("adam_betas=garbage", r"^grid: error: --set adam_betas must be two numbers in \[0, 1\) written as "
                                   r"\"\(b1, b2\)\", e\.g\. \"\(0\.9, 0\.98\)\", got 'garbage'$"),
    set_case("adam_betas=(0.9, 1.5)", r"--set adam_betas must be two numbers in \[0, 1\) .*got '\(0\.9, 1\.5\)'$"),
    set_case("adam_betas=__import__('os')", r"--set adam_betas must be two numbers"),
    Case("lenpen-option-negative", DRY_RUN + ("--lenpen", "-3"), r"^grid: error: --lenpen must be at least 0, got -3\.0$",
         writes=()),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_fault(case, tmp_path, monkeypatch, capsys, request):
    check_case(case, tmp_path, monkeypatch, capsys, request)


def test_a_sweeps_max_epoch_given_with_set_wins(capsys):
    assert G.main(["sweep", "--dry-run", "--archs", "postln", "--lr", "1e-3", "--warmup", "1", "--layers", "2",
                   "--seeds", "1", "--set", "max_epoch=2", "--data", "nowhere", "--out", "nowhere"]) == 0
    (train,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fairseq-train")]
    assert " --max-epoch 2 --max-update 200" in train


def test_early_stop_runs_where_every_run_has_a_budget(capsys):
    assert G.main(["run", "--dry-run", "--only", ROW, "--early-stop", "--set", "max_update=100", "--data", "nowhere",
                   "--out", "nowhere"]) == 0
    assert "--max-update 100" in capsys.readouterr().out


def test_every_row_of_the_table_is_in_range():
    """The ranges are those of the table's own values (a row outside one would be refused by --set)."""
    from dataclasses import fields

    from fairseq_lnpos.experiments import runs as R

    numbers = {f.name for f in fields(R.Run) if f.type in ("int", "float", int, float)}
    assert numbers == set(R.RANGES) | set(R.FREE_NUMBERS)  # a new number field needs its range
    for r in (x.with_defaults() for x in R.RUNS):
        for key, allowed in R.RANGES.items():
            assert getattr(r, key) is None or getattr(r, key) in allowed, (r.name, key)  # None: the arch's own
        R.adam_betas(r.adam_betas, r.name)


# ---------------------------------------------------------------- --fairseq-args: one flag or many

@pytest.mark.parametrize("argv,expected", [
    (["--fairseq-args", "--log-grad-norms"], ("--log-grad-norms", "")),
    (["--fairseq-args=--log-grad-norms"], ("--log-grad-norms", "")),
    (["--fairseq-args", "--fp16 --log-grad-norms", "--gen-args", "--quiet"], ("--fp16 --log-grad-norms", "--quiet")),
    (["--gen-args", "-s", "--fairseq-args", ""], ("", "-s")),
])
@pytest.mark.parametrize("cmd", [["run"], ["sweep"], ["slurm", "--partition", "p", "--time", "1:00:00"]])
def test_fairseq_args_take_one_flag_or_many(argv, expected, cmd):
    ns = G.build_parser().parse_args([*cmd, *argv])
    assert (ns.fairseq_args, ns.gen_args) == expected


def test_a_missing_value_is_still_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        G.build_parser().parse_args(["run", "--fairseq-args"])
    assert e.value.code == 2 and "argument --fairseq-args: expected one argument" in capsys.readouterr().err


def test_bench_and_the_fig3_analysis_take_one_flag_too():
    from conftest import tool
    from fairseq_lnpos.analysis import init_grad
    from fairseq_lnpos.cli import CommandParser

    bench = tool("bench")

    assert bench.parse_args(["--fairseq-args", "--fp16"]).fairseq_args == "--fp16"
    parser = init_grad.Options.add_to(CommandParser())
    assert parser.parse_args(["--model-args", "--encoder-layers 2"]).model_args == "--encoder-layers 2"


def test_a_slurm_task_gets_a_one_flag_fairseq_args(tmp_path):
    """The array task passes it to the per-run unit, which parses it."""
    from fairseq_lnpos.experiments import slurm

    ns = G.build_parser().parse_args([*BASE, "--out", str(tmp_path / "out"), "--dry-run", "--gpus-per-run", "0", *TINY,
                                      "--fairseq-args=--log-grad-norms", "--gen-args", "--quiet"])
    _, tasks, _, _ = slurm.plan(ns.options.from_namespace(ns))
    unit = unit_options(tasks[0])
    assert (unit.fairseq_args, unit.gen_args) == ("--log-grad-norms", "--quiet")


# ---------------------------------------------------------------- the normalization's options

@pytest.mark.parametrize("arch,extra,message", [
    ("transformer_scalenorm_tiny", ("--lnpos-norm", "rmsnorm"),
     r"^--lnpos-norm rmsnorm: transformer_scalenorm_tiny has its own normalization \(scalenorm\), which the option "
     r"would not change: drop --lnpos-norm"),
    ("transformer_dyt_tiny", ("--lnpos-norm", "derf"), r"^--lnpos-norm derf: transformer_dyt_tiny has its own"),
    ("transformer_preln_tiny", ("--lnpos-norm-alpha", "0.3"),
     r"^--lnpos-norm-alpha 0\.3: transformer_preln_tiny normalizes with layernorm, which has no alpha \(only dyt and "
     r"derf have one\): drop --lnpos-norm-alpha"),
    ("transformer_scalenorm_tiny", ("--lnpos-norm-alpha", "2"), r"normalizes with scalenorm, which has no alpha"),
    ("transformer_derf_tiny", ("--lnpos-norm-alpha", "1e39"), r"^--lnpos-norm-alpha must be in \(0, 65504\], got 1e\+39"),
])
def test_a_normalization_option_without_effect_is_refused(toy_data, arch, extra, message):
    with pytest.raises(LnposError, match=message):
        build_model(toy_data, arch, *extra)


def test_the_options_that_do_apply_are_taken(toy_data):
    model, _, _ = build_model(toy_data, "transformer_preln_tiny", "--lnpos-norm", "dyt", "--lnpos-norm-alpha", "0.3")
    assert float(model.encoder.layers[0].self_attn_layer_norm.alpha) == pytest.approx(0.3)
    model, _, _ = build_model(toy_data, "transformer_scalenorm_tiny", "--lnpos-norm", "scalenorm")
    assert type(model.encoder.layer_norm).__name__ == "ScaleNorm"


# ---------------------------------------------------------------- averaging checkpoints of other shapes

def test_averaging_weights_of_other_shapes_is_the_checkpoint_error(tmp_path):
    from test_checkpoint import save

    a = save(tmp_path / "checkpoint1.pt", [[1.0, 2.0]], [0.5, -1.0, 4.0], [1.0, 2.0], [3], 1)
    b = save(tmp_path / "checkpoint2.pt", [[1.0, 2.0, 3.0]], [0.5, -1.0, 4.0], [1.0, 2.0], [3], 2)
    with pytest.raises(CheckpointError) as e:
        average_checkpoints([a, b])
    assert str(e.value) == (f"{b} holds other weights than {a} (encoder.embed_tokens.weight of shape [1, 3], not "
                            f"[1, 2]): average checkpoints of one run")


# ---------------------------------------------------------------- resuming another experiment

TRAIN = ("--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500", "--num-workers", "0",
         "--encoder-layers", "2", "--decoder-layers", "2", "-s", "de", "-t", "en")
OTHER = r"is a checkpoint of another experiment \(%s\): give another --save-dir \(or --restore-file\) to start this " \
        r"one, or add --reset-optimizer to train from its weights all the same$"


def train(data, save_dir, arch, *extra, updates=1, task="translation"):
    return run(fairseq_cmd("fairseq-train", data, "--user-dir", USER_DIR, "--task", task, "--arch", arch, *TRAIN,
                           "--max-update", updates, "--save-dir", save_dir, "--no-epoch-checkpoints", *extra))


@pytest.fixture(scope="module")
def trained(toy_data, tmp_path_factory):
    """checkpoint_last.pt of three experiments, one update each."""
    root = tmp_path_factory.mktemp("experiments")
    made = {}
    for name, arch, extra in (("postln", "transformer_postln_tiny", ()), ("preln", "transformer_preln_tiny", ()),
                              ("mixln", "transformer_mixln_tiny", ("--encoder-layers", "4", "--decoder-layers", "4"))):
        res = train(toy_data, root / name, arch, *extra)
        assert res.returncode == 0, res.stderr[-2000:]
        made[name] = root / name
    return made


RESUMED = [
    # (base, arch, extra, task, refused: the differing options as the message names them)
    ("postln", "transformer_deepnorm_tiny", (), "translation",
     "--arch transformer_postln_tiny there, transformer_deepnorm_tiny here"),
    ("postln", "transformer_postln_tiny", ("--lnpos-init", "fairseq-0.8"), "translation_lnpos",
     "--lnpos-init fairseq-0.12 there, fairseq-0.8 here"),
    ("preln", "transformer_lnscaling_tiny", (), "translation",
     "--arch transformer_preln_tiny there, transformer_lnscaling_tiny here"),
    ("mixln", "transformer_mixln_tiny", ("--encoder-layers", "4", "--decoder-layers", "4", "--mixln-post-ratio", "0.5"),
     "translation_lnpos", "--mixln-post-ratio 0.25 there, 0.5 here"),
]


@pytest.mark.slow
@pytest.mark.parametrize("base,arch,extra,task,differ", RESUMED, ids=[f"{r[0]}-as-{r[1]}-{len(r[2])}" for r in RESUMED])
def test_a_checkpoint_of_another_experiment_is_not_resumed(trained, toy_data, tmp_path, base, arch, extra, task,
                                                           differ):
    import re

    save = tmp_path / "save"
    shutil.copytree(trained[base], save)
    before = (save / "checkpoint_last.pt").read_bytes()
    res = train(toy_data, save, arch, *extra, updates=2, task=task)
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert len(errors) == 1 and re.search(r"^fairseq-train: error: \S*checkpoint_last\.pt " + OTHER % re.escape(differ),
                                          errors[0]), errors
    assert (save / "checkpoint_last.pt").read_bytes() == before  # nothing trained, nothing overwritten


@pytest.mark.slow
def test_restore_file_into_another_variant_is_refused_and_reset_optimizer_means_it(trained, toy_data, tmp_path):
    ckpt = trained["postln"] / "checkpoint_last.pt"
    res = train(toy_data, tmp_path / "b2t", "transformer_b2t_tiny", "--restore-file", ckpt)
    assert res.returncode == 2 and "--arch transformer_postln_tiny there, transformer_b2t_tiny here" in res.stderr, \
        res.stderr[-3000:]
    res = train(toy_data, tmp_path / "b2t", "transformer_b2t_tiny", "--restore-file", ckpt, "--reset-optimizer")
    assert res.returncode == 0 and "Loaded checkpoint" in res.stderr + res.stdout, res.stderr[-3000:]


@pytest.mark.slow
def test_the_same_experiment_resumes(trained, toy_data, tmp_path):
    save = tmp_path / "save"
    shutil.copytree(trained["postln"], save)
    res = train(toy_data, save, "transformer_postln_tiny", updates=2, task="translation_lnpos")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Loaded checkpoint" in res.stderr + res.stdout and "(epoch 1 @ 1 updates)" in res.stderr + res.stdout
