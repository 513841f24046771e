"""docs/contributing.md's "Add a variant", followed on a copy of the package: a model module and one
registry entry (in its group), and the tests that go over every variant pass with no other edit."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# step 1: a model module, its layers those of models/variant.py
TOY_MODULE = '''from fairseq.models import register_model

from .variant import DecoderLayer, EncoderLayer, VariantTransformerModel


@register_model("transformer_toyln")
class ToyTransformerModel(VariantTransformerModel):
    encoder_layer_cls = EncoderLayer
    decoder_layer_cls = DecoderLayer
'''
# the tests that go over VARIANTS or GROUPS (tests/test_docs.py checks step 3's pages)
TESTS = [
    "tests/test_registry.py",
    "tests/test_depth.py::test_the_all_archs_preset_is_every_variant_on_the_stability_grid_at_width_96",
    "tests/test_runs.py::test_multi30k_rows_mirror_the_iwslt_adam_rows_on_the_iwslt_model",
    "tests/test_runs.py::test_every_architecture_on_real_text_plan",
    "tests/test_gpu_check.py::test_plan_of_every_step",
    "tests/test_bench.py::test_each_variant_is_compared_with_fairseqs_model_of_its_layernorm_placement",
    "tests/test_models.py::test_a_reloaded_model_computes_what_the_saved_one_did[toyln-translation_lnpos]",
    "tests/test_init.py::test_default_is_fairseq_012_and_the_option_changes_the_model[toyln]",
]

TESTS_IN_REGISTRY = len(re.findall(r"^def test_", (REPO / TESTS[0]).read_text(), re.M))


def add_variant(repo):
    """The steps 1 and 2 of "Add a variant" on the copy ``repo``: a new further placement."""
    (repo / "fairseq_lnpos/models/toyln.py").write_text(TOY_MODULE)
    registry = repo / "fairseq_lnpos/variants.py"
    text, n = re.subn(r"\n}\n# The named groups", '\n    "toyln": Variant("Toy-LN", "transformer_toyln", True),\\g<0>',
                      registry.read_text())
    text, m = re.subn(r'("placements": \([^)]*)\)', r'\1, "toyln")', text)
    assert (n, m) == (1, 1), "variants.py changed: update the steps this test follows"
    registry.write_text(text)


@pytest.mark.slow  # runs the tests above again in a child process: about a minute
def test_a_variant_added_as_the_contributing_page_says_needs_no_other_edit(tmp_path):
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("fairseq_lnpos", "scripts", "tests"):
        shutil.copytree(REPO / folder, repo / folder, ignore=ignore)
    shutil.copy(REPO / "pytest.ini", repo)
    add_variant(repo)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *TESTS],
                            cwd=repo, env={"PYTHONPATH": str(repo), "PATH": str(Path(sys.executable).parent)},
                            capture_output=True, text=True)
    # the [toyln] tests exist only where the copy registers the variant (pytest exits 4 on an unknown test)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"{len(TESTS) - 1 + TESTS_IN_REGISTRY} passed" in result.stdout, result.stdout[-3000:]
