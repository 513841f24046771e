"""Keel: LN_a(alpha * x + F(LN_b(x))), the first-layer exceptions, alpha, training and decoding."""
import re

import pytest
import torch

from conftest import USER_DIR, build_model, fairseq_cmd, run, toy_data  # noqa: F401
from helpers import decode_both_ways, ffn, generated_bleu


def attn(module, q, kv, **kw):
    """The attention module on already-normalised inputs (bypassing the branch-norm hook)."""
    return module.__class__.forward(module, query=q, key=kv, value=kv, need_weights=False, **kw)[0]


@pytest.fixture(scope="module")
def keel(toy_data):
    return build_model(toy_data, "transformer_keel_tiny", "--encoder-layers", 3, "--decoder-layers", 4)


def test_alpha_is_the_number_of_sublayers_except_in_the_first_layer(keel):
    model, _, _ = keel
    assert [layer.alpha for layer in model.encoder.layers] == [1.0, 6.0, 6.0]
    assert [layer.alpha for layer in model.decoder.layers] == [1.0, 12.0, 12.0, 12.0]


def test_keel_alpha_overrides(toy_data):
    model, _, _ = build_model(toy_data, "transformer_keel_tiny", "--keel-alpha", 2.5)
    assert [layer.alpha for layer in model.encoder.layers] == [1.0] + [2.5] * 5


def test_layernorms_have_no_bias_unless_asked(keel, toy_data):
    model, _, _ = keel
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(m.bias is None for m in norms)
    biased, _, _ = build_model(toy_data, "transformer_keel_tiny", "--keel-ln-bias")
    assert all(m.bias is not None for m in biased.modules() if isinstance(m, torch.nn.LayerNorm))


@pytest.mark.parametrize("index", [0, 2])
def test_encoder_layer_formula(keel, index):
    model, _, _ = keel
    layer = model.encoder.layers[index]
    a = 1.0 if index == 0 else 6.0
    x = torch.randn(6, 2, 128) * 3
    with torch.no_grad():
        h = a * x + attn(layer.self_attn, layer.self_attn_branch_norm(x), layer.self_attn_branch_norm(x))
        if index > 0:
            h = layer.self_attn_layer_norm(h)
        else:
            assert isinstance(layer.self_attn_layer_norm, torch.nn.Identity)  # first attention: no post-LN
        expected = layer.final_layer_norm(a * h + ffn(layer, layer.ffn_branch_norm(h)))
        got = layer(x, encoder_padding_mask=None)
    assert torch.allclose(got, expected, atol=1e-4)


@pytest.mark.parametrize("index", [0, 3])
def test_decoder_layer_formula(keel, index):
    model, _, _ = keel
    layer = model.decoder.layers[index]
    a = 1.0 if index == 0 else 12.0
    x, enc = torch.randn(5, 2, 128), torch.randn(7, 2, 128)
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    with torch.no_grad():
        n = layer.self_attn_branch_norm(x)
        h = a * x + attn(layer.self_attn, n, n, attn_mask=mask)
        h = h if index == 0 else layer.self_attn_layer_norm(h)
        h = layer.encoder_attn_layer_norm(a * h + attn(layer.encoder_attn, layer.encoder_attn_branch_norm(h), enc))
        expected = layer.final_layer_norm(a * h + ffn(layer, layer.ffn_branch_norm(h)))
        got = layer(x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=mask)[0]
    assert torch.allclose(got, expected, atol=1e-4)


def test_incremental_decoding_equals_the_full_forward(keel):
    model, task, _ = keel
    full, stepwise = decode_both_ways(model, task)
    assert torch.allclose(stepwise, full, atol=1e-5)


@pytest.mark.slow
def test_keel_trains_and_decodes_with_fairseq(toy_data, tmp_path):
    common = ["--user-dir", USER_DIR, "--cpu"]
    train = run(fairseq_cmd(
        "fairseq-train", toy_data, *common, "--arch", "transformer_keel_tiny", "--optimizer", "adam",
        "--lr", "5e-4", "--lr-scheduler", "warmup_inverse_sqrt", "--warmup-updates", "0", "--max-tokens", "1000",
        "--max-update", "2", "--save-dir", tmp_path, "--no-progress-bar", "--log-interval", "1",
    ))
    log = train.stdout + train.stderr
    assert train.returncode == 0, log[-3000:]
    assert "Keel 6-6: encoder alpha 12, decoder alpha 18" in log
    assert re.findall(r"num_updates=(\d+)", log) == ["1", "2"]
    gen = run(fairseq_cmd("fairseq-generate", toy_data, *common, "--path", tmp_path / "checkpoint_last.pt",
                          "--beam", "2", "--max-len-a", "1", "--max-len-b", "3", "--batch-size", "64"))
    assert gen.returncode == 0, gen.stderr[-3000:]
    generated_bleu(gen.stdout)
