"""fairseq-train -> checkpoint -> fairseq-generate / resume, with the plugin, on torch >= 2.6."""
import argparse
import math
import re

import pytest
import torch

from conftest import USER_DIR, fairseq_cmd, run, toy_data  # noqa: F401
from fairseq_lnpos.variants import GROUPS, arch_name

pytestmark = pytest.mark.slow  # every test here runs fairseq-train or fairseq-generate

TRAIN = ["--user-dir", USER_DIR, "--cpu", "--no-progress-bar", "--log-interval", "1", "--max-tokens", "1000",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--seed", "3"]


@pytest.fixture(scope="module")
def trained(toy_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("ckpt")
    result = run(fairseq_cmd(
        "fairseq-train", toy_data, *TRAIN, "--arch", "transformer_deepnorm_tiny", "--optimizer", "radam",
        "--lr", "1e-3", "--lr-scheduler", "warmup_inverse_sqrt", "--warmup-updates", "0",
        "--max-update", "3", "--save-dir", save,
    ))
    assert result.returncode == 0, result.stderr[-3000:]
    return save, result.stderr + result.stdout


@pytest.mark.slow
def test_training_logs_deepnorm_coefficients_and_the_schedule(trained):
    _, log = trained
    assert "DeepNorm 6-6: encoder alpha 1.4179 beta 0.4970, decoder alpha 2.0598 beta 0.3433" in log
    lrs = [float(x) for x in re.findall(r"num_updates=\d+, lr=([\d.e-]+)", log)]
    # the logged lr is the one set for the next update: lr_max / sqrt(t + 1) without warm-up
    assert lrs == pytest.approx([1e-3 / 2 ** 0.5, 1e-3 / 3 ** 0.5, 1e-3 / 2])


@pytest.mark.slow
def test_checkpoint_needs_only_argparse_namespace_beyond_torch_safe_globals(trained):
    if not hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint"):
        pytest.skip(f"torch {torch.__version__} has no safe loader to configure (before 2.6 torch.load unpickles all)")
    save, _ = trained
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(save / "checkpoint_last.pt"))
    assert set(unsafe) <= {"argparse.Namespace"}
    import fairseq_lnpos

    fairseq_lnpos.register()  # what fairseq's --user-dir import does: argparse.Namespace allow-listed
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu")  # weights_only=True, the default
    assert isinstance(state["args"], (argparse.Namespace, type(None)))
    assert state["cfg"]["model"].arch == "transformer_deepnorm_tiny"


@pytest.mark.slow
def test_generate_loads_plugin_checkpoint_and_prints_bleu(toy_data, trained):
    from helpers import generated_bleu

    save, _ = trained
    result = run(fairseq_cmd(
        "fairseq-generate", toy_data, "--user-dir", USER_DIR, "--cpu", "--path", save / "checkpoint_last.pt",
        "--beam", "5", "--max-len-a", "1", "--max-len-b", "4", "--batch-size", "64",
    ))
    assert result.returncode == 0, result.stderr[-3000:]
    generated_bleu(result.stdout)
    assert len(re.findall(r"^H-\d+", result.stdout, flags=re.M)) == 40


@pytest.mark.slow
def test_restore_file_resumes_from_checkpoint_last(toy_data, trained):
    save, _ = trained
    result = run(fairseq_cmd(
        "fairseq-train", toy_data, *TRAIN, "--arch", "transformer_deepnorm_tiny", "--optimizer", "radam",
        "--lr", "1e-3", "--lr-scheduler", "warmup_inverse_sqrt", "--warmup-updates", "0",
        "--max-update", "5", "--save-dir", save,
    ))
    log = result.stderr + result.stdout
    assert result.returncode == 0, log[-3000:]
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 3 updates\)", log)
    assert re.findall(r"num_updates=(\d+)", log) == ["4", "5"]


@pytest.mark.parametrize("extra,message", [
    (["--optimizer", "radam", "--radam-nonsense", "1"], "unrecognized arguments: --radam-nonsense"),
    (["--optimizer", "radam", "--lr-scheduler", "warmup_inverse_sqrt", "--warmup-updates", "-5"],
     "--warmup-updates must be >= 0"),
    (["--optimizer", "radam", "--adam-betas", "(0.9, 2)"], "--adam-betas must be two numbers"),
    (["--arch", "transformer_nonsense"], "--arch transformer_nonsense is not a registered architecture: did you mean"),
])
@pytest.mark.slow
def test_bad_input_is_a_one_line_error(toy_data, tmp_path, extra, message):
    args = ["--arch", "transformer_preln_tiny", *extra] if "--arch" not in extra else extra
    result = run(fairseq_cmd("fairseq-train", toy_data, *TRAIN, "--max-update", "1", "--save-dir", tmp_path, *args))
    assert result.returncode != 0
    assert message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.pt"))


@pytest.mark.parametrize("variant", GROUPS["placements"])
@pytest.mark.slow
def test_each_further_placement_trains_and_generates(toy_data, tmp_path, variant):
    from helpers import fairseq_generate, fairseq_train

    log = fairseq_train(toy_data, tmp_path, arch_name(variant, "tiny"))
    losses = [float(x) for x in re.findall(r" loss=([^,]+), .*num_updates=\d+", log)]
    assert re.findall(r"num_updates=(\d+)", log) == ["1", "2"]
    assert len(losses) == 2 and all(map(math.isfinite, losses))
    fairseq_generate(toy_data, tmp_path)


def readme_generate_line():
    """The README's first-run fairseq-generate command, its continuation lines joined (as the check of
    every documented command reads the docs' code blocks)."""
    from conftest import REPO
    from test_documented_commands import FAIRSEQ, commands

    text = (REPO / "README.md").read_text(encoding="utf-8")
    return next(c for c in commands(text, FAIRSEQ) if c.startswith(".venv/bin/fairseq-generate"))


@pytest.mark.slow
def test_the_readme_generate_line_prints_the_bleu_line_only_or_the_error(toy_data, trained):
    """As typed in the README (the toy corpus and checkpoint for its own): one line, the BLEU; without
    --user-dir, fairseq's error instead of nothing (docs/errors.md)."""
    import sys
    from pathlib import Path

    from conftest import REPO

    save, _ = trained
    line = readme_generate_line()
    assert "data-bin/synthetic" in line and "checkpoints/preln-tiny/checkpoint_last.pt" in line
    line = (line.replace("data-bin/synthetic", str(toy_data)).replace(".venv/bin/", f"{Path(sys.executable).parent}/")
            .replace("checkpoints/preln-tiny/checkpoint_last.pt", str(save / "checkpoint_last.pt")))
    shown = run(["bash", "-c", line], cwd=REPO)
    assert shown.stderr == "" and len(shown.stdout.splitlines()) == 1, shown.stdout[-3000:]
    assert shown.stdout.startswith("Generate test with beam=5: BLEU4 = ")
    failed = run(["bash", "-c", line.replace(" --user-dir fairseq_lnpos", "")], cwd=REPO)
    assert "Generate" not in failed.stdout
    assert any(out.startswith("fairseq-generate: error: argument --task: invalid choice: 'translation_lnpos'")
               for out in failed.stdout.splitlines()), failed.stdout[-3000:]
